"""How much a cache build may write unasked.

Every cache build says, before it writes, what it builds, where, and about how many bytes (one line on stderr,
e.g. ``rendering 1,275 sketches x 17 partials at 224 px into ~/.cache/rlattention/renders-....safetensors (about
1.1 GB)``); the size is estimated from the shapes and dtypes to be stored. A build larger than the cache limit
writes nothing and fails with one line (:class:`CacheTooLarge`, a ``ValueError``: exit code 2 from the CLI)
naming the size, the file or folder, and how to allow it or to turn that cache off. Reading a cache that exists
is never limited.

The builds: the render cache of sketch partials, photos and decoded images
(:func:`rlattention.data.readers.strokes.cached_render_stack`), the frozen-feature cache
(:class:`rlattention.vision.feature_cache.FeatureCache`) and the digit-scenes folder
(:func:`rlattention.data.synthetic.digit_scenes.generate_digit_scenes`).

The limit: ``$RLATTENTION_CACHE_LIMIT``, read at every build: a size (``2GB``, ``500MB``, ``1.5GiB``, a byte
count) or ``unlimited``; default :data:`DEFAULT_CACHE_LIMIT`, 2 GB (decimal units: 1 GB = 10^9 bytes). The
default lets the project's configs, tests and benchmarks run unchanged; their largest builds are the QMUL-Chair-V2
render cache (1,275 sketches x 17 partials: 1.09 GB at 224 px, 1.47 GB at 260 px for EfficientNet-Lite2 in
``benchmarks/sbir_backbones.py``) and the frozen Lite0 features (about 0.28 GB for ChairV2's partials, 0.25 GB for
``configs/rarl_clutter.yaml``).
"""

from __future__ import annotations

import math
import os
import re
import sys

__all__ = [
    "CACHE_LIMIT_ENV",
    "DEFAULT_CACHE_LIMIT",
    "CacheTooLarge",
    "announce_cache_build",
    "cache_limit",
    "format_bytes",
    "parse_size",
]

#: Environment variable holding the cache limit.
CACHE_LIMIT_ENV = "RLATTENTION_CACHE_LIMIT"
#: Bytes a single cache build may write without being asked: 2 GB.
DEFAULT_CACHE_LIMIT = 2 * 10**9

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


class CacheTooLarge(ValueError):
    """A cache build over the cache limit: nothing was written; the message names the size, where, and how to
    allow it."""


def parse_size(text: str, source: str = f"${CACHE_LIMIT_ENV}") -> int | None:
    """``"2GB"`` -> 2,000,000,000; ``"1.5GiB"``, ``"500MB"``, ``"123456"`` (bytes) likewise; ``"unlimited"`` ->
    ``None``. A ``ValueError`` naming ``source`` and the value otherwise."""
    clean = str(text).strip().lower().replace("_", "").replace(",", "").replace(" ", "")
    if clean == "unlimited":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d*)?)([a-z]*)", clean)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"{source}={text!r}: expected a size such as 2GB, 500MB, 1.5GiB or a byte count, or unlimited")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def cache_limit() -> int | None:
    """The bytes one cache build may write: ``$RLATTENTION_CACHE_LIMIT`` (``None``: unlimited), else
    :data:`DEFAULT_CACHE_LIMIT`."""
    value = os.environ.get(CACHE_LIMIT_ENV, "").strip()
    return parse_size(value) if value else DEFAULT_CACHE_LIMIT


def format_bytes(n: float) -> str:
    """``1.1 GB``, ``281.3 MB``, ``12.0 kB``, ``800 bytes`` (decimal units)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def _allowance(nbytes: int) -> str:
    """A value of the limit that allows ``nbytes``: the size rounded up to a whole GB (or MB)."""
    if nbytes >= 10**9:
        return f"{math.ceil(nbytes / 1e9)}GB"
    return f"{max(1, math.ceil(nbytes / 1e6))}MB"


def announce_cache_build(what: str, target: str | os.PathLike, nbytes: int, disable: str) -> None:
    """Before a cache build writes about ``nbytes`` bytes to ``target`` (a file or folder): one line on stderr,
    ``<what> into <target> (about <size>)``; or, when ``nbytes`` is over :func:`cache_limit`, a
    :class:`CacheTooLarge` whose message ends with ``disable`` (how to do without this cache, e.g. ``turn the
    render cache off with data.render_cache=none``)."""
    limit = cache_limit()
    size = format_bytes(nbytes)
    if limit is not None and nbytes > limit:
        raise CacheTooLarge(
            f"{what} would write about {size} ({nbytes:,} bytes) into {target}, over the cache limit of "
            f"{format_bytes(limit)}; nothing was written: allow it with {CACHE_LIMIT_ENV}={_allowance(nbytes)} "
            f"(or {CACHE_LIMIT_ENV}=unlimited), or {disable}"
        )
    print(f"{what} into {target} (about {size})", file=sys.stderr, flush=True)
