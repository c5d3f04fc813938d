"""What ``rlattention data info qmul_chairv2`` / ``omniglot_sketch`` print (the datasets of
:mod:`rlattention.data.readers.sketch_retrieval`): sketches, photos or characters and partial renders per split,
counted from the files' listings alone. Nothing is rendered, decoded or written; the sizes of the render cache files
and of the splits in memory are computed from the counts and shapes, and each cache file is reported present or not.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlattention.data.readers.sketch_retrieval import (
    _MISSING_DIR_MSG,
    CHAIRV2_COORDINATES,
    QMUL_CHAIRV2_DIR,
    _omniglot_render_key,
    _omniglot_rows,
    _option,
    _qmul_photo_key,
    _qmul_render_key,
    _qmul_rows,
    _render_bytes,
    _render_options,
    _RenderOptions,
    load_omniglot_sketch_index,
    load_qmul_chairv2_index,
)

__all__ = ["describe_omniglot_sketch", "describe_qmul_chairv2"]


def _split_line(targets: np.ndarray, rows: Sequence[np.ndarray], gallery: str) -> str:
    parts = [
        f"{name} {len(r):,} sketches of {len(np.unique(targets[r])):,} {gallery}"
        for name, r in zip(("train", "val", "test"), rows, strict=True)
    ]
    return ", ".join(parts)


def _cache_lines(opts: _RenderOptions, entries: Sequence[tuple[str, dict[str, Any], int]]) -> list[str]:
    """One line per cache file a build would use: ``(label, key, bytes)``; says whether it is there already,
    or how much the first fit / eval would write and whether that is over the cache limit."""
    from rlattention.cache_limit import CACHE_LIMIT_ENV, cache_limit, format_bytes
    from rlattention.data.readers.strokes import cache_file

    if opts.cache_dir is None:
        return ["  render cache: off (data.render_cache): every fit / eval renders in memory, writes nothing"]
    limit = cache_limit()
    lines = []
    for label, key, nbytes in entries:
        path = cache_file(key, opts.cache_dir)
        if path.is_file():
            state = "present (its checksum is checked when it is read)"
        elif limit is not None and nbytes > limit:
            state = (
                f"not written yet; over the cache limit of {format_bytes(limit)}: a fit or eval stops before writing "
                f"it unless {CACHE_LIMIT_ENV} allows it (or data.render_cache=none)"
            )
        else:
            state = "not written yet: the first fit or eval writes it"
        lines.append(f"  {label}: {path} (about {format_bytes(nbytes)}), {state}")
    return lines


def describe_qmul_chairv2(cfg: Any, data_dir: str | os.PathLike | None) -> list[str]:
    """The lines ``rlattention data info qmul_chairv2`` prints: sketches, photos and partial renders per split,
    from the coordinate pickle and the photo folder's listing alone. Nothing is rendered, decoded or written: the
    sizes of the render cache files (and of the dataset in memory) are computed from the counts and shapes, and
    each file is reported present or not."""
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG.format(name="qmul_chairv2", what=f"{QMUL_CHAIRV2_DIR}/{CHAIRV2_COORDINATES}"))
    index = load_qmul_chairv2_index(data_dir)
    opts = _render_options(cfg)
    is_train = np.array(index.splits) == "train"
    n, photos = len(index.keys), len(index.photo_ids)
    lines = [
        f"qmul_chairv2: {index.coordinates.parent}",
        f"  {n:,} sketches ({int(is_train.sum()):,} /train, {int((~is_train).sum()):,} /test) of {photos:,} photos "
        f"({len(np.unique(index.targets[is_train])):,} of /train sketches, "
        f"{len(np.unique(index.targets[~is_train])):,} of /test)",
    ]
    val_size = int(_option(cfg, "val_size", 0))
    try:
        rows = _qmul_rows(index, cfg)
    except ValueError as err:
        lines.append(f"  splits: not computed: {err}")
    else:
        lines.append(f"  splits (by photo, data.val_size={val_size}): {_split_line(index.targets, rows, 'photos')}")
    lines += _sizes_lines(n, opts, 3 * photos * opts.size * opts.size)
    lines += _cache_lines(
        opts,
        [
            ("render cache, partials", _qmul_render_key(index, opts), _render_bytes(n, opts)),
            ("render cache, photos", _qmul_photo_key(index, opts), photos * 3 * opts.size * opts.size),
        ],
    )
    lines.append("  (counted from the files: nothing was rendered, decoded or written)")
    return lines


def describe_omniglot_sketch(cfg: Any, data_dir: str | os.PathLike | None) -> list[str]:
    """The lines ``rlattention data info omniglot_sketch`` prints: characters and query sketches per split, from
    the zips' member lists alone (no stroke file is parsed and nothing is rendered or written; sizes are computed
    from the counts and shapes)."""
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG.format(name="omniglot_sketch", what="omniglot/*_background_small1.zip"))
    index = load_omniglot_sketch_index(data_dir, _option(cfg, "omniglot_subsets", [1]))
    opts = _render_options(cfg)
    n, chars = len(index.keys), len(index.photo_ids)
    lines = [
        f"omniglot_sketch: {index.folder} (subsets {index.subsets})",
        f"  {n:,} query sketches of {chars:,} characters (each character's first drawing is its gallery photo)",
    ]
    try:
        rows = _omniglot_rows(index, cfg)
    except ValueError as err:
        lines.append(f"  splits: not computed: {err}")
    else:
        lines.append(
            f"  splits (by character, data.val_size={int(_option(cfg, 'val_size', 0))}, data.test_fraction="
            f"{float(_option(cfg, 'test_fraction', 0.25)):g}): {_split_line(index.targets, rows, 'characters')}"
        )
    lines += _sizes_lines(n, opts, 3 * chars * opts.size * opts.size)
    lines += _cache_lines(opts, [("render cache, partials", _omniglot_render_key(index, opts), _render_bytes(n, opts))])
    lines.append("  (counted from the zips' listings: nothing was rendered, decoded or written)")
    return lines


def _sizes_lines(num_sketches: int, opts: _RenderOptions, photo_bytes: int) -> list[str]:
    from rlattention.cache_limit import format_bytes

    memory = num_sketches * (opts.steps + 3) * opts.size * opts.size  # every split's images: (N, S + 3, H, W) uint8
    renders = format_bytes(_render_bytes(num_sketches, opts))
    return [
        f"  each sketch: {opts.steps} partial renders (data.completion_steps) at {opts.size} x {opts.size} px "
        f"(data.image_size): {num_sketches * opts.steps:,} renders, about {renders}; photos about "
        f"{format_bytes(photo_bytes)}; the splits in memory about {format_bytes(memory)}"
    ]
