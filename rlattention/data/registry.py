"""Dataset registry: ``name -> builder(cfg, data_dir) -> DataSplits``.

A reader or generator registers itself with ``@register_dataset(name)`` when its module is imported; the engine
only calls :func:`build_dataset`, so a new dataset is one function and one decorator. This module imports no reader
(imports point downwards only): the built-in ones are imported by ``rlattention/data/__init__.py``, which runs before
any module of ``rlattention.data``, this one included (as ``timm.models`` imports its models). A user's own
datasets register the same way from a plugin module (package entry points of the group ``rlattention.datasets`` or
``$RLATTENTION_IMPORT``: :mod:`rlattention.plugins`, ``docs/own-data.md``), imported when names are first resolved
or listed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlattention.data.base import DataSplits
from rlattention.plugins import load_plugins

Builder = Callable[[Any, "Path | None"], DataSplits]
_DATASETS: dict[str, Builder] = {}

DATA_ENV = "RLATTENTION_DATA"


def register_dataset(name: str) -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        if name in _DATASETS:
            raise ValueError(f"dataset {name!r} is registered twice")
        _DATASETS[name] = fn
        return fn

    return deco


def available_datasets() -> list[str]:
    _import_all()
    return sorted(_DATASETS)


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """``--data-dir`` wins, then ``$RLATTENTION_DATA``; ``None`` if neither is set."""
    if data_dir:
        return Path(data_dir).expanduser()
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else None


def build_dataset(name: str, cfg: Any, data_dir: str | os.PathLike | None = None) -> DataSplits:
    _import_all()
    if name not in _DATASETS:
        raise KeyError(
            f"unknown dataset {name!r}; registered datasets: {', '.join(sorted(_DATASETS))} (a dataset of your own: "
            "docs/own-data.md)"
        )
    return _DATASETS[name](cfg, resolve_data_dir(data_dir))


def _import_all() -> None:
    load_plugins("datasets")  # the user's own datasets; the built-in ones came with rlattention/data/__init__.py
