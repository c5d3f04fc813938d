"""Method registry: ``name -> AttentionMethod subclass``.

Methods live above the engine (``rlattention.methods``) and register themselves with ``@register_method(name)``
when their module is imported; the engine looks them up by name, so a new method is one module and one config, not
a new trainer. This module imports no method (imports point downwards only): the built-in ones are imported by
``rlattention/methods/__init__.py``, which ``import rlattention`` runs (as ``import timm`` registers every timm
model). A user's own methods register the same way from a plugin module (package entry points of the group
``rlattention.methods`` or ``$RLATTENTION_IMPORT``: :mod:`rlattention.plugins`, ``docs/own-data.md``), imported when
names are first resolved or listed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlattention.plugins import load_plugins

if TYPE_CHECKING:
    from rlattention.engine.method import AttentionMethod

_METHODS: dict[str, type[AttentionMethod]] = {}


def register_method(name: str):
    def deco(cls):
        if name in _METHODS and _METHODS[name] is not cls:
            raise ValueError(f"method {name!r} is registered twice")
        cls.name = name
        _METHODS[name] = cls
        return cls

    return deco


def _load_all() -> None:
    load_plugins("methods")  # the user's own methods; the built-in ones came with `import rlattention`


def available_methods() -> list[str]:
    _load_all()
    return sorted(_METHODS)


def get_method(name: str) -> type[AttentionMethod]:
    _load_all()
    if name not in _METHODS:
        raise KeyError(
            f"unknown method {name!r}; registered methods: {', '.join(sorted(_METHODS))} (a method of your own: "
            "docs/own-data.md)"
        )
    return _METHODS[name]
