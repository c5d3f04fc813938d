"""Method registry: ``name -> AttentionMethod subclass``.

Methods live above the engine (``rlattention.methods``) and register themselves on import; the engine
looks them up by name, so a new method is one module and one config, not a new trainer. A user's own methods
register the same way from a plugin module (package entry points of the group ``rlattention.methods`` or
``$RLATTENTION_IMPORT``: :mod:`rlattention.plugins`, ``docs/own-data.md``), imported when names are first resolved
or listed.
"""

from __future__ import annotations

import importlib
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
    importlib.import_module("rlattention.methods")  # runs every @register_method
    load_plugins("methods")  # then the user's own (entry points, $RLATTENTION_IMPORT)


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
