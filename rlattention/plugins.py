"""Plugins: a user's own datasets and methods, registered by importing the modules that define them.

A plugin is an ordinary module whose import runs ``@register_dataset(name)``
(:mod:`rlattention.data.registry`) and/or ``@register_method(name)`` (:mod:`rlattention.engine.registry`). Three
ways to have it imported (``docs/own-data.md``):

* package entry points in the groups ``rlattention.datasets`` and ``rlattention.methods`` (``pyproject.toml``:
  ``[project.entry-points."rlattention.datasets"] my_data = "my_package.my_data"``). Each names a module, or an
  object in one (``"my_package.my_data:register"``): the module is imported, and a function so named is then
  called with no arguments (a class so named is only imported: its decorator registers it);
* ``RLATTENTION_IMPORT=module1,module2`` in the environment: dotted module names, or paths of ``.py`` files
  (imported under their file name's stem). A module name that is not found on ``sys.path`` is looked for in the
  current working directory, which is then appended to ``sys.path``, so a ``my_data.py`` next to the command
  works without packaging (processes launched for several devices inherit the variable);
* :func:`import_plugins` from Python (the same rules as ``RLATTENTION_IMPORT``; a command-line ``--import``
  flag is meant to call it).

The registries load these lazily: the dataset registry loads the ``rlattention.datasets`` entry points and the
``RLATTENTION_IMPORT`` modules the first time it resolves or lists a name (after the built-in readers), the method
registry the ``rlattention.methods`` entry points and the same modules. Each entry point and module is imported
once; one that fails to import raises :class:`PluginError`, one line naming it and the exception (the original
exception is chained), and is tried again at the next look-up. This module imports nothing of ``rlattention``:
the registries call it, never the reverse.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from types import ModuleType

__all__ = ["ENTRY_POINT_GROUPS", "IMPORT_ENV", "PluginError", "import_plugins", "load_plugins"]

#: registry kind -> the entry-point group it loads.
ENTRY_POINT_GROUPS: dict[str, str] = {"datasets": "rlattention.datasets", "methods": "rlattention.methods"}
#: Environment variable naming modules (or ``.py`` files) to import, separated by commas.
IMPORT_ENV = "RLATTENTION_IMPORT"

_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_scanned: set[str] = set()  # entry-point groups whose entry points have all been loaded
_imported: set[str] = set()  # names given to import_plugins / RLATTENTION_IMPORT that imported


class PluginError(ImportError, ValueError):
    """A plugin that could not be imported (or registered a name twice); one line naming the plugin and the
    exception. A ``ValueError`` too, so that the command line reports it in one line."""


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _import_file(path: Path) -> ModuleType:
    """Import the ``.py`` file ``path`` as the module named by its stem (once: a second call returns it)."""
    path = path.expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    name = path.stem
    if not _MODULE_NAME.match(name):
        raise ValueError(f"{path.name}: the file name is not a module name (letters, digits and '_')")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise ValueError(f"a module named {name!r} is already imported from {getattr(loaded, '__file__', None)}")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _in_working_dir(top: str) -> bool:
    cwd = Path.cwd()
    return (cwd / f"{top}.py").is_file() or (cwd / top / "__init__.py").is_file()


def _import_name(name: str) -> ModuleType:
    """A dotted module name (found on ``sys.path``, then in the working directory) or a ``.py`` file path."""
    if name.endswith(".py") or "/" in name or os.sep in name:
        return _import_file(Path(name))
    if not _MODULE_NAME.match(name):
        raise ValueError("expected a dotted module name (my_data, my_package.my_data) or the path of a .py file")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        top = name.split(".")[0]
        cwd = os.getcwd()
        if err.name != top or cwd in sys.path or "" in sys.path or not _in_working_dir(top):
            raise
        sys.path.append(cwd)  # as `python -m` would, but after the installed packages
        return importlib.import_module(name)


def import_plugins(names: Iterable[str], source: str = "import_plugins") -> list[str]:
    """Import the modules ``names`` (dotted names or ``.py`` paths; see the module docstring), each once.

    Returns the names imported by this call. Raises :class:`PluginError` naming ``source`` and the module at the
    first one that fails (the names before it stay imported)."""
    done = []
    for raw in names:
        name = str(raw).strip()
        if not name or name in _imported:
            continue
        try:
            _import_name(name)
        except Exception as err:
            raise PluginError(f"{source}: plugin module {name!r} failed to import: {_first_line(err)}") from err
        _imported.add(name)
        done.append(name)
    return done


def _env_names() -> list[str]:
    return [part.strip() for part in os.environ.get(IMPORT_ENV, "").split(",") if part.strip()]


def _describe(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    package = f", package {dist.name} {dist.version}" if dist is not None else ""
    return f"plugin entry point '{ep.name} = {ep.value}' (group {ep.group}{package})"


def _load_entry_point(ep: metadata.EntryPoint) -> None:
    try:
        obj = ep.load()
        if ep.attr and inspect.isfunction(obj):
            obj()
    except Exception as err:
        raise PluginError(f"{_describe(ep)} failed to import: {_first_line(err)}") from err


def load_plugins(kind: str) -> None:
    """Import the plugins of one registry (``"datasets"`` or ``"methods"``): the entry points of its group (all
    of them once; after a failure, the next call tries again) and the modules of ``$RLATTENTION_IMPORT`` not yet
    imported. Called by the registries before they resolve or list names."""
    group = ENTRY_POINT_GROUPS[kind]
    if group not in _scanned:
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: (e.name, e.value)):
            if ep.value not in _imported:
                _load_entry_point(ep)
                _imported.add(ep.value)
        _scanned.add(group)
    names = _env_names()
    if names:
        import_plugins(names, f"${IMPORT_ENV}")
