"""Stroke sketches: reading them (QMUL coordinate pickles, Omniglot stroke files), rendering their partial
versions, and a checked on-disk cache of the renders.

Convention. A sketch is a float32 numpy array ``(N, 3)`` of points in drawing order: ``x``, ``y`` (``x`` to
the right, ``y`` downwards, as image columns and rows) and ``pen_up`` (1 when the stroke ends at this point,
so the next point starts a new stroke; 0 otherwise). A stroke of one point is a dot.

QMUL coordinate pickles (``ChairV2_Coordinate``, Bhunia et al., CVPR 2020; the Shoe-V2 file has the same
layout): a protocol-3 pickle of a dict ``{"/train/<photo_id>_<n>": array, "/test/<photo_id>_<n>": array}``;
each array is float64 ``(N, 3)`` ``[x, y, pen_up]`` in the frame of the 256 x 256 photo (ChairV2 coordinates
lie in 33..223), ``<photo_id>`` is the photo's file name without ``.png`` (it may itself hold ``_``; the
suffix after the last ``_`` tells the sketches of one photo apart). It is read only through the restricted
unpickler of :mod:`rlattention.data.safe_pickle`.

Omniglot stroke files (Lake et al., Science 2015; ``strokes_background*/<alphabet>/<character>/<id>_<drawer>.txt``):
a line ``START``, then for every stroke its points as ``x,y,t_ms`` lines (floats; ``t_ms`` the time in
milliseconds) followed by a line ``BREAK``. The coordinates are those of the 105 x 105 PNG of the same
drawing with ``y`` negated (``y`` runs from about -118 to -2): the point ``(x, y)`` lies at the centre of the
0-based PNG pixel ``(row, column) = (-y, x)``. :func:`parse_omniglot_strokes` converts them to this module's
frame, ``(x + 0.5, -y + 0.5)``, in which the PNG covers the square ``(0, 0, 105, 105)`` exactly (pixel
``(r, c)`` spans ``[c, c + 1) x [r, r + 1)``; see :data:`OMNIGLOT_FRAME`). This was checked on the real files:
rendered with a 5-pixel line, the strokes overlap the ink of their PNG with a median IoU of about 0.93
(about 0.36 of the rendered pixels are ink when ``y`` is not negated, and shifting by half a pixel or more
lowers the IoU). Times are dropped. Some drawings reach a little outside the canvas (``x`` up to about 113).

Partial renders (:func:`render_partials`). Completion step ``s = 1..S`` shows the first ``ceil(s * N / S)``
points (at least one), so step ``S`` is the complete sketch: partial sketches by stroke-point count, as in
the DARP paper (17 partials). A pixel is ink (255; background 0) when its centre lies within
``line_width / 2`` output pixels of the drawn polyline: consecutive points of one stroke are joined, a pen-up
breaks the line, every point is a round dot (round joints and caps; a one-point stroke is a dot). This is
computed once per sketch as "the first step that inks each pixel", so the partials are monotone (the ink of
step ``s + 1`` contains that of step ``s``) and the last one is exactly the complete render. ``frame = (x0,
y0, x1, y1)`` is the source rectangle mapped onto the raster (default :func:`sketch_frame`: the bounding box
of the complete sketch, padded to a square with a margin, the same for all its partials).

Render cache (:func:`cached_render_stack`). Rendering a dataset takes seconds, so the stacks are stored in
one safetensors file per key (the source file's path, size and modification time, every render parameter and
:data:`CACHE_FORMAT_VERSION`), named by the sha256 of the key. The file also stores the key and a sha256 of
the array's bytes, shape and dtype; both are checked on load, and a corrupt, truncated or mismatching file is
reported with a warning naming it and rebuilt. Writes go to a temporary file in the same folder and are
renamed into place (``os.replace``), so a reader never sees half a file. Cache folder: the ``render_cache``
config value, else ``$RLATTENTION_CACHE``, else ``~/.cache/rlattention``; ``""`` / ``"none"`` disables it
(:func:`rlattention.data.cache.resolve_cache_dir`). Before a file is built, one line on stderr says what, where and
about how many bytes; a file larger than ``$RLATTENTION_CACHE_LIMIT`` (default 2 GB) is neither built nor written:
one line says how to allow it (:mod:`rlattention.cache_limit`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from rlattention.data.safe_pickle import PickleReadError, load_restricted_pickle

__all__ = [
    "CACHE_FORMAT_VERSION",
    "OMNIGLOT_FRAME",
    "QMUL_KEY_PATTERN",
    "SketchFormatError",
    "cache_file",
    "cached_render_stack",
    "check_sketch",
    "file_fingerprint",
    "parse_omniglot_strokes",
    "parse_qmul_key",
    "partial_counts",
    "read_omniglot_strokes",
    "read_qmul_coordinates",
    "render_partials",
    "render_partials_batch",
    "sketch_frame",
]

#: ``/<split>/<photo_id>_<suffix>``: the keys of a QMUL coordinate pickle.
QMUL_KEY_PATTERN = re.compile(r"^/(train|test)/([^/]+)_([A-Za-z0-9]+)$")
#: The source rectangle of an Omniglot drawing (after :func:`parse_omniglot_strokes`): its 105 x 105 PNG.
OMNIGLOT_FRAME: tuple[float, float, float, float] = (0.0, 0.0, 105.0, 105.0)
#: Bumped whenever the renderer or the cache file layout changes, so that old files are never reused.
CACHE_FORMAT_VERSION = 1

_ARRAY_NAME = "array"


class SketchFormatError(ValueError):
    """A malformed sketch or sketch file; the message names the file (and key or line) and what was expected."""


# ------------------------------------------------------------------------------------------------- sketches


def check_sketch(sketch: Any, what: str = "sketch") -> np.ndarray:
    """``sketch`` as a C-contiguous float32 ``(N, 3)`` array, checked: 2-D, 3 columns, ``N >= 1``, finite.

    Raises :class:`SketchFormatError` starting with ``what`` (e.g. a file and key) otherwise.
    """
    array = np.asarray(sketch)
    if array.dtype.kind not in "iuf" or array.ndim != 2 or array.shape[1] != 3:
        raise SketchFormatError(
            f"{what}: a sketch must be a numeric (N, 3) array [x, y, pen_up], found {array.dtype} {array.shape}"
        )
    if len(array) == 0:
        raise SketchFormatError(f"{what}: a sketch must have at least one point, found shape {array.shape}")
    if not np.isfinite(array).all():
        row = int(np.argmax(~np.isfinite(array).all(axis=1)))
        raise SketchFormatError(f"{what}: coordinates must be finite, found {array[row].tolist()} at point {row}")
    return np.ascontiguousarray(array, dtype=np.float32)


def parse_qmul_key(key: str) -> tuple[str, str]:
    """``"/train/<photo_id>_<n>"`` -> ``("train", "<photo_id>")``; raises ``ValueError`` for other keys."""
    match = QMUL_KEY_PATTERN.match(key) if isinstance(key, str) else None
    if match is None:
        raise ValueError(f"key {key!r} does not look like '/train/<photo_id>_<n>' or '/test/<photo_id>_<n>'")
    return match.group(1), match.group(2)


def read_qmul_coordinates(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a QMUL coordinate pickle (see the module docstring): ``{key: float32 (N, 3) sketch}``.

    The keys keep the file's order. Raises ``FileNotFoundError`` if the file is missing,
    :class:`rlattention.data.safe_pickle.UnsafePickleError` naming the file and the global if it references
    anything but numpy arrays, and :class:`SketchFormatError` naming the file (and key) for an unreadable
    pickle, a top level that is not a dict, a key not of the form ``/train|test/<photo_id>_<n>``, or a value
    that is not a finite ``(N, 3)`` array with ``N >= 1`` and pen flags 0 or 1.
    """
    path = Path(path)
    try:
        data = load_restricted_pickle(path, "QMUL coordinate pickle", hint="fetch an intact copy of the file")
    except FileNotFoundError:
        raise
    except PickleReadError as err:
        if type(err) is not PickleReadError:  # UnsafePickleError: keep its type
            raise
        raise SketchFormatError(str(err)) from err
    if not isinstance(data, dict):
        raise SketchFormatError(f"{path}: expected a pickled dict of sketches, found {type(data).__name__}")
    sketches: dict[str, np.ndarray] = {}
    for key, value in data.items():
        try:
            parse_qmul_key(key)
        except ValueError as err:
            raise SketchFormatError(f"{path}: {err}") from None
        if not isinstance(value, np.ndarray):
            raise SketchFormatError(f"{path}: key {key!r}: expected a numpy array, found {type(value).__name__}")
        sketch = check_sketch(value, f"{path}: key {key!r}")
        pen = sketch[:, 2]
        if not np.isin(pen, (0.0, 1.0)).all():
            row = int(np.argmax(~np.isin(pen, (0.0, 1.0))))
            raise SketchFormatError(
                f"{path}: key {key!r}: the third column (pen_up) must be 0 or 1, found {pen[row]} at point {row}"
            )
        sketches[key] = sketch
    if not sketches:
        raise SketchFormatError(f"{path}: the dict holds no sketches")
    return sketches


def parse_omniglot_strokes(text: str | bytes, source: str = "<text>") -> np.ndarray:
    """Parse the text of one Omniglot stroke file (see the module docstring) into a float32 ``(N, 3)``
    sketch in the PNG pixel frame (:data:`OMNIGLOT_FRAME`).

    source: names the file in errors. Raises :class:`SketchFormatError` naming ``source`` and the line for a
    missing ``START``, a point line that is not three numbers, a stroke without points, points after the
    last ``BREAK`` or a file without points.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError as err:
            raise SketchFormatError(f"{source}: not an ASCII stroke file ({err})") from None
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None or lines[first].strip() != "START":
        found = "an empty file" if first is None else repr(lines[first][:40])
        raise SketchFormatError(f"{source}: an Omniglot stroke file starts with a line 'START', found {found}")
    points: list[tuple[float, float, float]] = []
    stroke_start = 0
    for number, line in enumerate(lines[first + 1 :], start=first + 2):
        line = line.strip()
        if not line:
            continue
        if line == "BREAK":
            if len(points) == stroke_start:
                raise SketchFormatError(f"{source}: line {number}: 'BREAK' ends a stroke without points")
            x, y, _ = points[-1]
            points[-1] = (x, y, 1.0)
            stroke_start = len(points)
            continue
        parts = line.split(",")
        try:
            if len(parts) != 3:
                raise ValueError
            x, y = float(parts[0]), float(parts[1])
            float(parts[2])
        except ValueError:
            raise SketchFormatError(
                f"{source}: line {number}: expected 'x,y,t_ms' (three numbers), 'BREAK' or 'START', found {line[:60]!r}"
            ) from None
        if not (math.isfinite(x) and math.isfinite(y)):
            raise SketchFormatError(f"{source}: line {number}: coordinates must be finite, found {line[:60]!r}")
        points.append((x + 0.5, -y + 0.5, 0.0))  # centre of pixel (row, col) = (-y, x) -> this module's frame
    if not points:
        raise SketchFormatError(f"{source}: no points between 'START' and the end of the file")
    if stroke_start != len(points):
        raise SketchFormatError(f"{source}: the last stroke is not closed by a 'BREAK' line (truncated file?)")
    return np.asarray(points, dtype=np.float32)


def read_omniglot_strokes(source: str | bytes | os.PathLike) -> np.ndarray:
    """One Omniglot stroke file as a float32 ``(N, 3)`` sketch (see :func:`parse_omniglot_strokes`).

    source: a path (``os.PathLike``, or a ``str`` without a line break), or the file's content (``bytes``, or a
    ``str`` holding a line break). Raises ``FileNotFoundError`` naming a missing file.
    """
    if isinstance(source, bytes) or (isinstance(source, str) and ("\n" in source or "\r" in source)):
        return parse_omniglot_strokes(source)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"Omniglot stroke file not found: {path}")
    return parse_omniglot_strokes(path.read_bytes(), str(path))


# -------------------------------------------------------------------------------------------------- renders


def partial_counts(num_points: int, steps: int) -> np.ndarray:
    """int64 ``(steps,)``: how many points completion step ``s = 1..steps`` shows, ``max(1, ceil(s * N / S))``."""
    if num_points < 1 or steps < 1:
        raise ValueError(f"need num_points >= 1 and steps >= 1, got num_points={num_points}, steps={steps}")
    s = np.arange(1, steps + 1, dtype=np.int64)
    return np.maximum(1, (s * num_points + steps - 1) // steps)


def sketch_frame(sketch: np.ndarray, margin: float = 0.05) -> tuple[float, float, float, float]:
    """The default render frame: the bounding box of ``sketch`` padded to a square centred on it, widened by
    ``margin`` times its side on every side (a single point gets a side of 1)."""
    xy = check_sketch(sketch)[:, :2].astype(np.float64)
    low, high = xy.min(axis=0), xy.max(axis=0)
    side = float((high - low).max()) or 1.0
    cx, cy = (low + high) / 2
    half = side * (0.5 + margin)
    return (float(cx - half), float(cy - half), float(cx + half), float(cy + half))


def _check_render_args(steps: int, size: int, line_width: float, frame: Sequence[float] | None) -> None:
    if int(steps) < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if int(size) < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if not (math.isfinite(line_width) and line_width >= 1.0):
        raise ValueError(f"line_width must be >= 1 output pixel (thinner lines break up), got {line_width}")
    if frame is not None:
        if len(frame) != 4 or not all(math.isfinite(float(v)) for v in frame):
            raise ValueError(f"frame must be 4 finite numbers (x0, y0, x1, y1), got {frame}")
        x0, y0, x1, y1 = (float(v) for v in frame)
        if not (x1 > x0 and y1 > y0):
            raise ValueError(f"frame (x0, y0, x1, y1) needs x1 > x0 and y1 > y0, got {tuple(frame)}")


def _clip_segments(start: np.ndarray, delta: np.ndarray, low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    """Liang-Barsky: the parameter range ``[t_in, t_out]`` of each segment ``start + t * delta`` (``t`` in
    0..1) inside the square ``[low, high]^2``; empty where ``t_in > t_out``."""
    t_in, t_out = np.zeros(len(start)), np.ones(len(start))
    for axis in range(2):
        p, d = start[:, axis], delta[:, axis]
        moving = d != 0
        safe = np.where(moving, d, 1.0)
        t1, t2 = (low - p) / safe, (high - p) / safe
        t_in = np.where(moving, np.maximum(t_in, np.minimum(t1, t2)), t_in)
        t_out = np.where(moving, np.minimum(t_out, np.maximum(t1, t2)), t_out)
        outside = ~moving & ((p < low) | (p > high))
        t_out = np.where(outside, -1.0, t_out)
    return t_in, t_out


def _first_ink_step(sketch: np.ndarray, steps: int, size: int, line_width: float, frame: Sequence[float]) -> np.ndarray:
    """int32 ``(size * size,)``: for every pixel the first completion step (0-based) that inks it, ``steps``
    for a pixel that stays blank. The polyline is sampled densely (every ``line_width / 4`` pixels at most) and
    every pixel whose centre lies within ``line_width / 2`` of a sample is ink from the sample's step on."""
    n = len(sketch)
    x0, y0, x1, y1 = (float(v) for v in frame)
    xy = np.empty((n, 2), dtype=np.float64)
    xy[:, 0] = (sketch[:, 0] - x0) * (size / (x1 - x0))
    xy[:, 1] = (sketch[:, 1] - y0) * (size / (y1 - y0))
    point_step = np.searchsorted(partial_counts(n, steps), np.arange(1, n + 1), side="left")

    # interior samples of the segments i -> i + 1 that do not cross a pen-up (the end points are samples anyway),
    # each first clipped to the raster widened by radius + 1 (where a sample can still ink a pixel), so that a
    # far-away point costs nothing
    radius = line_width / 2.0
    spacing = radius / 2.0
    seg = np.flatnonzero(sketch[:-1, 2] <= 0.5)
    start, delta = xy[seg], xy[seg + 1] - xy[seg]
    t_in, t_out = _clip_segments(start, delta, -radius - 1.0, size + radius + 1.0)
    keep = t_in <= t_out
    seg, start, delta, t_in, t_out = seg[keep], start[keep], delta[keep], t_in[keep, None], t_out[keep, None]
    start, delta = start + t_in * delta, (t_out - t_in) * delta
    pieces = np.maximum(1, np.ceil(np.hypot(delta[:, 0], delta[:, 1]) / spacing).astype(np.int64))
    inner = pieces - 1
    owner = np.repeat(np.arange(len(seg)), inner)
    k = np.arange(len(owner)) - np.repeat(np.cumsum(inner) - inner, inner) + 1
    t = (k / pieces[owner])[:, None]
    samples = np.concatenate([xy, start[owner] + t * delta[owner]])
    sample_step = np.concatenate([point_step, point_step[seg + 1][owner]])
    order = np.argsort(sample_step, kind="stable")
    samples, sample_step = samples[order], sample_step[order]

    # pixel centres (c + 0.5, r + 0.5) within the radius of each sample
    reach = int(math.floor(2 * radius)) + 2
    offsets = np.arange(reach)
    col0 = np.ceil(samples[:, 0] - radius - 0.5).astype(np.int64)
    row0 = np.ceil(samples[:, 1] - radius - 0.5).astype(np.int64)
    cols = col0[:, None, None] + offsets[None, None, :]  # (M, 1, reach)
    rows = row0[:, None, None] + offsets[None, :, None]  # (M, reach, 1)
    dist2 = (cols + 0.5 - samples[:, 0, None, None]) ** 2 + (rows + 0.5 - samples[:, 1, None, None]) ** 2
    hit = (dist2 <= radius * radius + 1e-9) & (cols >= 0) & (cols < size) & (rows >= 0) & (rows < size)
    flat = (rows * size + cols)[hit]  # ordered by sample, hence by step
    step_of_hit = np.broadcast_to(sample_step[:, None, None], hit.shape)[hit]
    first = np.full(size * size, steps, dtype=np.int32)
    pixels, first_index = np.unique(flat, return_index=True)
    first[pixels] = step_of_hit[first_index]
    return first


def render_partials(
    sketch: np.ndarray,
    steps: int = 17,
    size: int = 64,
    line_width: float = 2.0,
    frame: Sequence[float] | None = None,
) -> np.ndarray:
    """Render the ``steps`` partial sketches of ``sketch`` (see the module docstring).

    sketch: ``(N, 3)`` ``[x, y, pen_up]``. steps: completion steps ``S``; step ``s`` shows the first
    ``ceil(s * N / S)`` points. size: side of the square raster. line_width: stroke thickness in output pixels
    (>= 1). frame: ``(x0, y0, x1, y1)`` source rectangle mapped onto the raster (``None``: :func:`sketch_frame`
    of the complete sketch); ink outside it is clipped.

    Returns uint8 ``(steps, size, size)``, ink 255 on 0; monotone in ``s``; the last is the complete sketch.
    """
    _check_render_args(steps, size, line_width, frame)
    out = np.empty((int(steps), int(size), int(size)), dtype=np.uint8)
    _render_into(out, check_sketch(sketch), float(line_width), frame)
    return out


def _render_into(out: np.ndarray, sketch: np.ndarray, line_width: float, frame: Sequence[float] | None) -> None:
    """Write the partial renders of a checked ``sketch`` into the uint8 ``(steps, size, size)`` array ``out``."""
    steps, size = out.shape[0], out.shape[1]
    frame = sketch_frame(sketch) if frame is None else frame
    first = _first_ink_step(sketch, steps, size, line_width, frame).reshape(1, size, size)
    np.less_equal(first, np.arange(steps, dtype=np.int32)[:, None, None], out=out.view(np.bool_))
    out *= np.uint8(255)


def render_partials_batch(
    sketches: Sequence[np.ndarray],
    steps: int = 17,
    size: int = 64,
    line_width: float = 2.0,
    frame: Sequence[float] | None = None,
    progress: str | None = None,
) -> np.ndarray:
    """:func:`render_partials` of every sketch: uint8 ``(len(sketches), steps, size, size)``.

    frame: one fixed frame for all sketches, or ``None`` for each sketch's own :func:`sketch_frame`.
    progress: the label of a progress bar over the sketches (:func:`rlattention.progress.progress_bar`: rank 0,
    on a terminal); ``None``: no bar.
    """
    from rlattention.progress import progress_bar

    _check_render_args(steps, size, line_width, frame)
    out = np.empty((len(sketches), int(steps), int(size), int(size)), dtype=np.uint8)
    with progress_bar(total=len(sketches), desc=progress or "", unit="sketch", enabled=progress is not None) as bar:
        for i, sketch in enumerate(sketches):
            _render_into(out[i], check_sketch(sketch, f"sketch {i}"), float(line_width), frame)
            bar.update(1)
    return out


# ---------------------------------------------------------------------------------------------------- cache


def file_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """``{"path", "size", "mtime_ns"}`` of a file: a cache key part that changes when the file is replaced."""
    path = Path(path).resolve()
    stat = path.stat()
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _canonical_key(key: Mapping[str, Any]) -> str:
    return json.dumps({"key": key, "format": CACHE_FORMAT_VERSION}, sort_keys=True, default=str, separators=(",", ":"))


def cache_file(key: Mapping[str, Any], cache_dir: str | os.PathLike) -> Path:
    """The cache file of ``key``: ``<cache_dir>/renders-<sha256 of the key and format version>.safetensors``."""
    digest = hashlib.sha256(_canonical_key(key).encode()).hexdigest()[:40]
    return Path(cache_dir) / f"renders-{digest}.safetensors"


def _array_digest(array: np.ndarray) -> str:
    h = hashlib.sha256(f"{array.dtype.str}|{array.shape}|".encode())
    h.update(memoryview(np.ascontiguousarray(array)).cast("B"))
    return h.hexdigest()


def _load_cached(path: Path, canonical: str) -> np.ndarray:
    """The array of a cache file, after checking its key and checksum; raises ``ValueError`` when they fail."""
    blob = path.read_bytes()
    if len(blob) < 8:
        raise ValueError(f"{len(blob)} bytes, shorter than a safetensors header")
    header_len = int.from_bytes(blob[:8], "little")
    if header_len > len(blob) - 8:
        raise ValueError(f"header of {header_len} bytes in a file of {len(blob)} bytes (truncated)")
    metadata = json.loads(blob[8 : 8 + header_len]).get("__metadata__") or {}
    if metadata.get("key") != canonical:
        raise ValueError("stored key differs from the requested one")
    array = load_safetensors(blob)[_ARRAY_NAME]
    if metadata.get("shape") != json.dumps(list(array.shape)) or metadata.get("dtype") != array.dtype.str:
        raise ValueError(f"stored shape/dtype {metadata.get('shape')} {metadata.get('dtype')} differ from the data")
    if metadata.get("sha256") != _array_digest(array):
        raise ValueError("checksum mismatch (corrupt data)")
    return array


def _store(path: Path, array: np.ndarray, canonical: str) -> None:
    metadata = {
        "key": canonical,
        "shape": json.dumps(list(array.shape)),
        "dtype": array.dtype.str,
        "sha256": _array_digest(array),
    }
    blob = save_safetensors({_ARRAY_NAME: np.ascontiguousarray(array)}, metadata=metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached_render_stack(
    key: Mapping[str, Any],
    build: Callable[[], np.ndarray],
    cache_dir: str | os.PathLike | None,
    *,
    what: str | None = None,
    nbytes: int | None = None,
) -> np.ndarray:
    """``build()``'s array, stored in and reused from ``cache_dir`` under ``key`` (see the module docstring).

    key: JSON-able description of everything the array depends on (source :func:`file_fingerprint`, render
    parameters, ...); :data:`CACHE_FORMAT_VERSION` is added. cache_dir: the folder, or ``None`` to just call
    ``build``. A cache file that cannot be read or fails its key or checksum check is reported with a
    ``UserWarning`` naming it and rebuilt; a cache that cannot be written is reported and skipped. Never
    raises for cache problems (``build``'s own errors propagate), except the cache limit:

    what / nbytes: what is built (``rendering 1,275 sketches x 17 partials at 224 px``) and the bytes of the
    array it returns. When the file has to be built, :func:`rlattention.cache_limit.announce_cache_build` says so
    before ``build`` runs (``nbytes=None``: after it, from the array), or raises
    :class:`~rlattention.cache_limit.CacheTooLarge` over the cache limit, before anything is built or written.
    """
    if cache_dir is None:
        return build()
    from rlattention.cache_limit import announce_cache_build

    canonical = _canonical_key(key)
    path = cache_file(key, cache_dir)
    if path.is_file():
        try:
            return _load_cached(path, canonical)
        except Exception as err:  # truncated, flipped bytes, bad json, another key: rebuild
            warnings.warn(f"render cache file {path} is invalid ({err}); rebuilding it", stacklevel=2)
    what = what or f"building the render cache ({key.get('what', 'arrays')})"
    off = "turn the render cache off with data.render_cache=none (the arrays are then kept in memory only)"
    if nbytes is not None:
        announce_cache_build(what, path, int(nbytes), off)
    array = np.asarray(build())
    if nbytes is None:
        announce_cache_build(what, path, int(array.nbytes), off)
    try:
        _store(path, array, canonical)
    except OSError as err:
        warnings.warn(f"cannot write the render cache file {path} ({err}); continuing without it", stacklevel=2)
    return array
