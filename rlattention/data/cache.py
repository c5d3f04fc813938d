"""The data cache folder: where generated or rendered data is kept between runs.

``$RLATTENTION_CACHE`` names it (``~/.cache/rlattention`` when unset); a config's ``data.render_cache`` overrides
it. The stroke renders (:mod:`rlattention.data.readers.strokes`), the decoded Sketchy images
(:mod:`rlattention.data.readers.sketchy`) and the digit-scenes folders
(:mod:`rlattention.data.synthetic.digit_scenes`) are written there.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "default_cache_dir", "resolve_cache_dir"]

#: Environment variable naming the cache folder.
CACHE_ENV = "RLATTENTION_CACHE"

_DISABLED = ("", "none", "off", "false", "0")


def default_cache_dir() -> Path | None:
    """``$RLATTENTION_CACHE`` (``""`` / ``"none"``: disabled) if set, else ``~/.cache/rlattention``."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return None if env.strip().lower() in _DISABLED else Path(env).expanduser()
    return Path("~/.cache/rlattention").expanduser()


def resolve_cache_dir(setting: str | os.PathLike | None) -> Path | None:
    """The cache folder for a ``render_cache`` config value: ``None`` -> :func:`default_cache_dir`;
    ``""``, ``"none"``, ``"off"``, ``"false"`` or ``"0"`` (any case) -> ``None`` (no cache); else that folder."""
    if setting is None:
        return default_cache_dir()
    text = os.fspath(setting)
    if text.strip().lower() in _DISABLED:
        return None
    return Path(text).expanduser()
