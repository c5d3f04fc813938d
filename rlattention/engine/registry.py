"""Method registry: ``name -> AttentionMethod subclass``.

Methods live above the engine (``rlattention.methods``) and register themselves on import; the engine
looks them up by name, so a new method is one module and one config, not a new trainer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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


def available_methods() -> list[str]:
    _load_all()
    return sorted(_METHODS)


def get_method(name: str) -> type[AttentionMethod]:
    _load_all()
    if name not in _METHODS:
        raise KeyError(f"unknown method {name!r}; registered methods: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]
