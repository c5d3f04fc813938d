"""Instance-level sketch -> photo retrieval from *raster* sketches in the Sketchy folder layout: the ``sketchy``
dataset (Sangkloy et al., "The Sketchy Database", SIGGRAPH 2016, and the many sketch sets released the same way).

Folder layout (``data_dir`` itself or ``data_dir/sketchy``, the first holding ``sketch/``)::

    sketch[/<variant>]/<class>/<photo_stem>-<k>.png      k = 1, 2, ...: the sketches drawn of one photo
    photo[/<variant>]/<class>/<photo_stem>.jpg           or image[/<variant>]/...; photo/ wins if both exist

A sketch is paired with the photo of the same class and stem. Image files are recognised by their extension,
``.png``, ``.jpg`` or ``.jpeg`` in any case (for sketches and photos alike). Hidden entries (``.DS_Store``,
``._*``, ``.git``) and ``Thumbs.db`` / ``desktop.ini`` are ignored everywhere.

Variants: a ``sketch/`` (or photo) folder whose sub-folders hold no images but folders is read as a variant level
(Sketchy's augmentations ``tx_000000000000``, ``tx_000100000000``, ...). One variant is used: ``cfg.sketchy_variant``
for the sketches, default the *first in sorted order* (``tx_000000000000`` in Sketchy: the non-augmented
sketches); ``cfg.sketchy_photo_variant`` for the photos, default the sketch variant's name when the photo folder
has it, else its first in sorted order. Naming a variant of a tree without that level is an error.

Layout of every split (the contract of :mod:`rlattention.data.readers.sketch_retrieval` with ``S = 1``; ``H = W =
cfg.image_size``):

* ``images``: uint8 ``(N, 1 + 3, H, W)``, one row per sketch. Channel 0 is the complete sketch, ink 255 on
  background 0: the file is converted to grayscale (``L``, ``1``, ``P``, ``RGB``, ...: Pillow's ``convert("L")``;
  modes with transparency (``RGBA``, ``LA``, ``P``/``L``/``RGB`` with a transparent colour) are first composited on
  white; 16-bit grayscale is scaled by 1/257), resized to ``H x W`` with Pillow's antialiased bilinear filter and
  inverted (``255 - gray``: Sketchy sketches are black ink on white). Thin lines therefore become grey, not
  binary, when the sketch is scaled down (the stroke datasets render binary lines). Channels 1..3 are the
  sketch's photo as RGB, resized to ``H x W`` exactly like the ChairV2 photos
  (:func:`rlattention.data.photos.read_resized_image`).
* ``targets``: int64 ``(N,)``, the index of the sketch's photo in the sorted list of photo ids
  ``<class>/<photo_stem>`` of the whole folder (all splits); ``num_classes`` is its length. Rows are sorted by
  photo id, then ``k``.

There is only one protocol: complete sketches. A raster sketch has no stroke order, so the partial renders of the
stroke datasets cannot be made: ``cfg.completion_steps`` must be 1 (or ``null``, the default).

Splits (``cfg.sketchy_split``): ``by_photo`` (default): a seeded ``cfg.test_fraction`` of the photos, with all
their sketches, is the test split and ``cfg.val_size`` photos of the rest (seeded,
:func:`rlattention.data.photos.holdout_split`; 0: an overlapping 10 % monitoring split) the validation split; the
split is not stratified by class. Split lists shipped with a release are not read. ``all_test``: every sketch is
in the test split and train and validation are empty, to evaluate a model trained elsewhere (``rlattention eval
CKPT --data sketchy --data-dir ROOT data.sketchy_split=all_test``). ``num_train`` / ``num_test`` > 0 keep the
first sketches of a split.

Bad input: sketches whose photo is missing, photos without a sketch, sketch files not named ``<stem>-<k>``,
photos sharing a stem in one class (``a.jpg`` and ``a.png``), files that are not images (or not inside a class
folder) and unreadable images stop the build with a :class:`SketchyInputError` naming the folder, each kind's
count and its first offenders. With ``cfg.skip_bad`` they are left out with a ``UserWarning`` counting each kind
(a photo that cannot be decoded takes its sketches with it). A missing ``sketch/`` or ``photo/`` / ``image/``
folder is a ``FileNotFoundError`` and a folder without sketches or photos a ``ValueError``, both naming the path.

Cache: the decoded sketches and photos are cached like the ChairV2 photos
(:func:`rlattention.data.readers.strokes.cached_render_stack` in ``cfg.render_cache``), keyed by every file's path, size
and modification time; a build that met unreadable files writes no cache. :func:`scan_sketchy` (``rlattention data
info sketchy``) only lists the folders: it decodes nothing and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from rlattention.data.base import DataSplits
from rlattention.data.cache import resolve_cache_dir
from rlattention.data.limits import check_side
from rlattention.data.photos import ImageDecodeError, holdout_split, read_resized_image
from rlattention.data.readers.sketch_retrieval import _dataset, _option, _rows
from rlattention.data.readers.strokes import cached_render_stack
from rlattention.data.registry import register_dataset
from rlattention.data.splits import split_seed, train_val_split
from rlattention.progress import progress_bar

__all__ = [
    "IMAGE_SUFFIXES",
    "PHOTO_DIRS",
    "SKETCHY_SPLITS",
    "SKETCH_DIR",
    "SketchyIndex",
    "SketchyInputError",
    "build_sketchy",
    "describe_sketchy",
    "find_sketchy_dir",
    "load_sketchy_index",
    "read_sketch",
    "scan_sketchy",
]

SKETCHY_DIR = "sketchy"
SKETCH_DIR = "sketch"
PHOTO_DIRS = ("photo", "image")  # the first present is used
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")  # compared in lower case
SKETCHY_SPLITS = ("by_photo", "all_test")
_IGNORED_NAMES = {"thumbs.db", "desktop.ini", "__macosx"}
_LISTED = 5  # offenders named per kind in an error

#: kind of bad input -> how an error or a warning names it (after its count)
BAD_KINDS: dict[str, str] = {
    "no_photo": "sketch(es) without a photo",
    "bad_name": "sketch file(s) not named <photo_stem>-<k>",
    "no_sketch": "photo(s) without a sketch",
    "duplicate_photo": "photo(s) sharing their class and stem with another photo",
    "not_image": "non-image file(s) or folder(s) (not .png/.jpg/.jpeg in a class folder)",
    "unreadable": "unreadable image(s)",
    "photo_unreadable": "sketch(es) whose photo is unreadable",
}


class SketchyInputError(ValueError):
    """Bad files in a Sketchy-layout folder; ``bad`` maps a kind of :data:`BAD_KINDS` to its offending paths."""

    def __init__(self, message: str, bad: dict[str, list[Path]]) -> None:
        super().__init__(message)
        self.bad = bad


class SketchyIndex(NamedTuple):
    """The sketch-photo pairs of a Sketchy-layout folder, found without decoding anything."""

    folder: Path  # the dataset folder (resolved), holding sketch/ and photo/ or image/
    sketch_dir: Path  # the folder of the sketch class folders: sketch/ or sketch/<variant>/
    photo_dir: Path  # photo/, image/ or one of their <variant>/ folders
    sketch_variant: str | None  # None: no variant level
    photo_variant: str | None
    sketch_variants: list[str]  # every variant of sketch/, sorted ([] without that level)
    photo_variants: list[str]
    classes: list[str]  # sorted classes of the paired photos
    photo_ids: list[str]  # sorted "<class>/<photo_stem>", every one the photo of at least one sketch
    photo_paths: list[Path]  # per photo id
    sketch_paths: list[Path]  # sorted by (photo id, k, file name)
    targets: np.ndarray  # int64 (N,): index of each sketch's photo in photo_ids
    bad: dict[str, list[Path]]  # bad input met by the scan, per kind of BAD_KINDS (sorted paths; no empty kinds)


# ------------------------------------------------------------------------------------------------- scanning


def _ignored(name: str) -> bool:
    return name.startswith(".") or name.lower() in _IGNORED_NAMES


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES


def _list_dir(folder: Path) -> tuple[list[Path], list[Path]]:
    """``(sub-folders, files)`` of ``folder``, sorted, without ignored entries (symlinks are followed)."""
    dirs, files = [], []
    with os.scandir(folder) as entries:
        for entry in entries:
            if not _ignored(entry.name):
                (dirs if entry.is_dir() else files).append(Path(entry.path))
    return sorted(dirs), sorted(files)


def find_sketchy_dir(root: str | os.PathLike) -> Path:
    """The dataset folder: ``root`` itself or ``root/sketchy``, the first holding a ``sketch/`` folder. Raises
    ``FileNotFoundError`` naming the folders expected."""
    root = Path(root).expanduser()
    folders = [root, root / SKETCHY_DIR]
    for folder in folders:
        if (folder / SKETCH_DIR).is_dir():
            return folder
    raise FileNotFoundError(
        f"Sketchy layout not found: expected a {SKETCH_DIR}/ folder (next to {PHOTO_DIRS[0]}/ or {PHOTO_DIRS[1]}/) "
        f"in one of: {', '.join(str(f) for f in folders)}"
    )


def _photo_top(folder: Path) -> Path:
    for name in PHOTO_DIRS:
        if (folder / name).is_dir():
            return folder / name
    raise FileNotFoundError(
        f"Sketchy layout: photo folder not found: expected {folder / PHOTO_DIRS[0]} or {folder / PHOTO_DIRS[1]} "
        f"(<class>/<photo_stem>.jpg, paired with {folder / SKETCH_DIR}/<class>/<photo_stem>-<k>.png)"
    )


class _Tree(NamedTuple):
    classes_dir: Path  # top or top/<variant>
    variant: str | None
    variants: list[str]
    files: dict[str, list[Path]]  # class -> its image files, sorted
    not_image: list[Path]


def _read_tree(top: Path, requested: str | None, fallback: str | None, key: str, example: str) -> _Tree:
    """List ``top[/<variant>]/<class>/<files>``: detect the variant level, choose the variant, and sort the
    entries into image files per class and entries that are not (``not_image``)."""
    dirs, stray = _list_dir(top)
    if not dirs:
        raise ValueError(f"no class folders in {top}: expected {top}/[<variant>/]<class>/{example}")
    children = {d: _list_dir(d) for d in dirs}
    has_images = any(_is_image(f) for sub_dirs, files in children.values() for f in files)
    variant_level = bool(children) and not has_images and any(sub_dirs for sub_dirs, _ in children.values())
    variants = [d.name for d in dirs] if variant_level else []
    variant = None
    if variant_level:
        if requested is not None and requested not in variants:
            raise ValueError(f"data.{key}={requested!r}: no such variant in {top} (variants: {', '.join(variants)})")
        variant = requested or (fallback if fallback in variants else variants[0])
        classes_dir = top / variant
        dirs, more = _list_dir(classes_dir)
        stray += more
        children = {d: _list_dir(d) for d in dirs}
    elif requested is not None:
        raise ValueError(
            f"data.{key}={requested!r}, but {top} has no variant level (its folders are classes); set it to null"
        )
    else:
        classes_dir = top
    files: dict[str, list[Path]] = {}
    not_image = list(stray)  # files outside any class folder
    for class_dir, (sub_dirs, entries) in children.items():
        not_image += sub_dirs
        images = [f for f in entries if _is_image(f)]
        not_image += [f for f in entries if not _is_image(f)]
        if images:
            files[class_dir.name] = images
    if not files:
        raise ValueError(f"no images found under {classes_dir}: expected {classes_dir}/<class>/{example}")
    return _Tree(classes_dir, variant, variants, files, sorted(not_image))


def _sketch_name(path: Path) -> tuple[str, int] | None:
    """``(photo_stem, k)`` of ``<photo_stem>-<k>.<ext>``, or ``None``."""
    stem, sep, k = path.stem.rpartition("-")
    return (stem, int(k)) if sep and stem and k.isdigit() else None


def scan_sketchy(
    root: str | os.PathLike, sketch_variant: str | None = None, photo_variant: str | None = None
) -> SketchyIndex:
    """List and pair the sketches and photos under ``root`` (see :func:`find_sketchy_dir` and the module
    docstring) without decoding or writing anything. Bad input is *not* an error here: it is left out of the
    pairs and reported in ``bad``. Raises ``FileNotFoundError`` for a missing folder and ``ValueError`` for a
    folder without images or an unknown variant."""
    folder = find_sketchy_dir(root).resolve()
    photo_top = _photo_top(folder)
    sketches = _read_tree(folder / SKETCH_DIR, sketch_variant, None, "sketchy_variant", "<photo_stem>-<k>.png")
    photos = _read_tree(photo_top, photo_variant, sketches.variant, "sketchy_photo_variant", "<photo_stem>.jpg")
    bad: dict[str, list[Path]] = {kind: [] for kind in BAD_KINDS}
    bad["not_image"] = sorted(sketches.not_image + photos.not_image)

    photo_of: dict[tuple[str, str], Path] = {}
    stems: dict[tuple[str, str], list[Path]] = {}
    for cls, paths in photos.files.items():
        for path in paths:
            stems.setdefault((cls, path.stem), []).append(path)
    for key, paths in stems.items():
        if len(paths) == 1:
            photo_of[key] = paths[0]
        else:
            bad["duplicate_photo"] += paths

    pairs: list[tuple[str, str, int, str, Path]] = []  # (class, stem, k, file name, sketch path)
    for cls, paths in sketches.files.items():
        for path in paths:
            name = _sketch_name(path)
            if name is None:
                bad["bad_name"].append(path)
            elif (cls, name[0]) not in photo_of:
                bad["no_photo"].append(path)
            else:
                pairs.append((cls, name[0], name[1], path.name, path))
    pairs.sort(key=lambda p: (f"{p[0]}/{p[1]}", p[2], p[3]))  # by photo id as a string ("a/x" < "a-b/x" is not)
    used = {(cls, stem) for cls, stem, *_ in pairs}
    bad["no_sketch"] = [path for key, path in photo_of.items() if key not in used]

    photo_keys = sorted(used, key=lambda key: f"{key[0]}/{key[1]}")
    row_of = {key: i for i, key in enumerate(photo_keys)}
    return SketchyIndex(
        folder=folder,
        sketch_dir=sketches.classes_dir,
        photo_dir=photos.classes_dir,
        sketch_variant=sketches.variant,
        photo_variant=photos.variant,
        sketch_variants=sketches.variants,
        photo_variants=photos.variants,
        classes=sorted({cls for cls, _ in photo_keys}),
        photo_ids=[f"{cls}/{stem}" for cls, stem in photo_keys],
        photo_paths=[photo_of[key] for key in photo_keys],
        sketch_paths=[p[4] for p in pairs],
        targets=np.array([row_of[(cls, stem)] for cls, stem, *_ in pairs], dtype=np.int64),
        bad={kind: sorted(paths) for kind, paths in bad.items() if paths},
    )


def _bad_error(folder: Path, bad: dict[str, list[Path]]) -> SketchyInputError:
    total = sum(len(paths) for paths in bad.values())
    lines = [f"{folder}: {total} bad input file(s) in the Sketchy layout:"]
    for kind, paths in bad.items():
        shown = ", ".join(str(p) for p in paths[:_LISTED])
        more = f", ... ({len(paths) - _LISTED} more)" if len(paths) > _LISTED else ""
        lines.append(f"  {len(paths)} {BAD_KINDS[kind]}: {shown}{more}")
    lines.append("fix or remove them, or set data.skip_bad=true to skip them (with a warning)")
    return SketchyInputError("\n".join(lines), bad)


def _counts(bad: dict[str, list[Path]]) -> str:
    return ", ".join(f"{len(paths)} {BAD_KINDS[kind]}" for kind, paths in bad.items())


def _warn_skipped(folder: Path, bad: dict[str, list[Path]]) -> None:
    warnings.warn(f"sketchy: skipped bad input under {folder} (data.skip_bad): {_counts(bad)}", stacklevel=3)


def load_sketchy_index(
    root: str | os.PathLike,
    sketch_variant: str | None = None,
    photo_variant: str | None = None,
    skip_bad: bool = False,
) -> SketchyIndex:
    """:func:`scan_sketchy`, then: bad input raises :class:`SketchyInputError` (listing it), or with ``skip_bad``
    is left out with a warning counting each kind. ``ValueError`` if no sketch has a photo."""
    index = scan_sketchy(root, sketch_variant, photo_variant)
    if index.bad:
        if not skip_bad:
            raise _bad_error(index.folder, index.bad)
        _warn_skipped(index.folder, index.bad)
    if not index.sketch_paths:
        raise ValueError(
            f"{index.folder}: no sketch has its photo (sketches {index.sketch_dir}/<class>/<photo_stem>-<k>.png, "
            f"photos {index.photo_dir}/<class>/<photo_stem>.jpg)"
        )
    return index


# ------------------------------------------------------------------------------------------------- decoding


def _grayscale(img: Image.Image) -> Image.Image:
    """Any Pillow image as mode ``L``; transparent pixels become white (the paper under the ink)."""
    if img.mode in ("RGBA", "LA", "PA", "P", "RGBa", "La") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("L")
    if img.mode == "I" or img.mode.startswith("I;16"):  # 16-bit grayscale PNG: scale, convert("L") would clip
        values = np.asarray(img, dtype=np.float64) / 257.0
        return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8))
    return img.convert("L")


def read_sketch(path: str | os.PathLike, size: int) -> np.ndarray:
    """One raster sketch (black ink on white) as ``(size, size)`` uint8, ink 255 on background 0 (see the module
    docstring). Raises ``FileNotFoundError`` or :class:`rlattention.data.photos.ImageDecodeError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as img:
            img.draft("L", (size, size))  # JPEG: decode at a reduced scale when still >= size
            gray = _grayscale(img)
        gray = gray.resize((size, size), Image.Resampling.BILINEAR)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ImageDecodeError(f"{path}: cannot decode the image ({type(err).__name__}: {err})") from err
    return np.subtract(255, np.asarray(gray, dtype=np.uint8), dtype=np.uint8)


class _Unreadable(Exception):
    """Raised out of a cache build so that a partial stack is not cached; carries it and its failed rows."""

    def __init__(self, array: np.ndarray, rows: list[int]) -> None:
        super().__init__(f"{len(rows)} unreadable image(s)")
        self.array, self.rows = array, rows


def _files_digest(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        stat = path.stat()
        h.update(json.dumps([str(path), stat.st_size, stat.st_mtime_ns]).encode())
    return h.hexdigest()


def _decoded_stack(
    what: str, paths: Sequence[Path], shape: tuple[int, ...], read: Callable[[Path], np.ndarray], cache_dir: Any
) -> tuple[np.ndarray, list[int]]:
    """``(stack, failed rows)``: uint8 ``(len(paths), *shape)`` of ``read(path)`` (decoded in threads, with a
    progress bar), taken from or stored in the render cache when every file decodes (announced first; refused
    over the cache limit)."""
    out_shape = (len(paths), *shape)
    noun = what.removeprefix("sketchy_")  # "photos", "sketches"

    def build() -> np.ndarray:
        out = np.zeros(out_shape, dtype=np.uint8)

        def decode(i: int) -> bool:
            try:
                out[i] = read(paths[i])
            except (ImageDecodeError, OSError):  # OSError: a file removed or unreadable since the scan
                return False
            return True

        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            done = pool.map(decode, range(len(paths)))
            ok = list(progress_bar(done, desc=f"decoding {noun}", total=len(paths), unit="img"))
        failed = [i for i, good in enumerate(ok) if not good]
        if failed:
            raise _Unreadable(out, failed)
        return out

    key = {"what": what, "shape": list(out_shape), "files": _files_digest(paths)}
    side = "x".join(map(str, shape[1:]))
    try:
        stack = cached_render_stack(
            key, build, cache_dir, what=f"decoding {len(paths):,} {noun} at {side} px", nbytes=math.prod(out_shape)
        )
        return stack, []
    except _Unreadable as err:
        return err.array, err.rows


class _Decoded(NamedTuple):
    sketches: np.ndarray  # uint8 (N, 1, H, W)
    photos: np.ndarray  # uint8 (P, 3, H, W)
    targets: np.ndarray  # int64 (N,)
    num_photos: int


def _decode(index: SketchyIndex, size: int, cache_dir: Any, skip_bad: bool) -> _Decoded:
    """Decode the pairs of ``index``; unreadable files raise :class:`SketchyInputError`, or with ``skip_bad``
    are dropped (with the sketches of an unreadable photo, and the photos left without a sketch)."""

    def photo(path: Path) -> np.ndarray:
        return read_resized_image(path, size).transpose(2, 0, 1)

    def sketch(path: Path) -> np.ndarray:
        return read_sketch(path, size)[None]

    photos, bad_photos = _decoded_stack("sketchy_photos", index.photo_paths, (3, size, size), photo, cache_dir)
    sketches, bad_sketches = _decoded_stack("sketchy_sketches", index.sketch_paths, (1, size, size), sketch, cache_dir)
    targets = index.targets
    if not bad_photos and not bad_sketches:
        return _Decoded(sketches, photos, targets, len(index.photo_ids))
    unreadable = sorted([index.photo_paths[i] for i in bad_photos] + [index.sketch_paths[i] for i in bad_sketches])
    if not skip_bad:
        raise _bad_error(index.folder, {"unreadable": unreadable})
    photo_ok = np.ones(len(index.photo_ids), dtype=bool)
    photo_ok[bad_photos] = False
    sketch_ok = np.ones(len(targets), dtype=bool)
    sketch_ok[bad_sketches] = False
    keep = sketch_ok & photo_ok[targets]
    bad = {"unreadable": unreadable}
    orphans = sketch_ok & ~photo_ok[targets]
    if orphans.any():
        bad["photo_unreadable"] = [index.sketch_paths[i] for i in np.flatnonzero(orphans)]
    has_sketch = np.zeros(len(index.photo_ids), dtype=bool)
    has_sketch[targets[keep]] = True
    lonely = photo_ok & ~has_sketch
    if lonely.any():
        bad["no_sketch"] = [index.photo_paths[i] for i in np.flatnonzero(lonely)]
    _warn_skipped(index.folder, bad)
    if not keep.any():
        raise ValueError(f"{index.folder}: no readable sketch with a readable photo is left")
    new_row = np.cumsum(has_sketch) - 1  # kept photos keep their sorted order
    return _Decoded(sketches[keep], photos[has_sketch], new_row[targets[keep]].astype(np.int64), int(has_sketch.sum()))


# ----------------------------------------------------------------------------------------------- assembling


def _check_options(cfg: Any) -> tuple[int, str]:
    steps = _option(cfg, "completion_steps", None)
    if steps is not None and int(steps) != 1:
        raise ValueError(
            f"sketchy: data.completion_steps must be 1 (or null), got {steps}: raster sketches have no stroke "
            "order, so only complete sketches can be used; a partial-sketch protocol needs stroke data "
            "(qmul_chairv2, omniglot_sketch)"
        )
    size = int(_option(cfg, "image_size", 224))
    if size < 1:
        raise ValueError(f"image_size must be >= 1, got {size}")
    check_side("data.image_size", size)
    split = str(_option(cfg, "sketchy_split", "by_photo"))
    if split not in SKETCHY_SPLITS:
        raise ValueError(f"data.sketchy_split must be one of {', '.join(SKETCHY_SPLITS)}, got {split!r}")
    return size, split


def _missing_dir() -> ValueError:
    return ValueError(
        "sketchy needs its data files: pass --data-dir or set RLATTENTION_DATA (a folder holding sketch/ and photo/ "
        "or image/, or a sketchy/ folder holding them)"
    )


@register_dataset("sketchy")
def build_sketchy(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Raster sketch -> photo retrieval in the Sketchy layout (see the module docstring for the layout, splits,
    bad input and cache).

    Config: ``image_size``, ``completion_steps`` (1 or null only), ``sketchy_split`` (``by_photo`` |
    ``all_test``), ``sketchy_variant``, ``sketchy_photo_variant``, ``skip_bad``, ``test_fraction`` (share of the
    photos held out as test), ``val_size`` (photos of the rest held out for validation), ``seed``, ``render_cache``,
    ``num_train`` / ``num_test`` (first sketches only, when > 0).
    """
    size, split = _check_options(cfg)
    if data_dir is None:
        raise _missing_dir()
    skip_bad = bool(_option(cfg, "skip_bad", False))
    index = load_sketchy_index(
        data_dir, _option(cfg, "sketchy_variant", None), _option(cfg, "sketchy_photo_variant", None), skip_bad
    )
    cache_dir = resolve_cache_dir(_option(cfg, "render_cache", None))
    data = _decode(index, size, cache_dir, skip_bad)
    n, targets = data.num_photos, data.targets
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    if split == "all_test":
        none = np.empty(0, dtype=np.int64)
        train_rows, val_rows = none, none
        test_rows = _rows(targets, np.arange(n), num_test)
    else:
        fraction = float(_option(cfg, "test_fraction", 0.25))
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {fraction}")
        if n < 2:
            raise ValueError(
                f"{index.folder}: {n} photo(s) cannot be split into train and test (data.sketchy_split=all_test "
                "uses the whole folder as test)"
            )
        num_held = min(max(1, round(n * fraction)), n - 1)
        seed = int(_option(cfg, "seed", 0))
        rest, test_photos = train_val_split(n, num_held, split_seed(seed, "test"))
        train_idx, val_idx = holdout_split(
            len(rest), int(_option(cfg, "val_size", 0)), seed, f"{index.folder} ({len(rest)} train + val photos)"
        )
        train_rows = _rows(targets, rest[train_idx].numpy(), num_train)
        val_rows = _rows(targets, rest[val_idx].numpy(), num_test)
        test_rows = _rows(targets, test_photos.numpy(), num_test)
    return DataSplits(
        _dataset(data.sketches, data.photos, targets, train_rows),
        _dataset(data.sketches, data.photos, targets, val_rows),
        _dataset(data.sketches, data.photos, targets, test_rows),
        num_classes=n,
        name="sketchy",
    )


def describe_sketchy(cfg: Any, data_dir: str | os.PathLike | None) -> list[str]:
    """The lines ``rlattention data info sketchy`` prints: counts of the paired sketches, photos and classes,
    the variants used, and the bad input found, from :func:`scan_sketchy` alone (nothing is decoded or cached,
    so unreadable images are not detected here)."""
    if data_dir is None:
        raise _missing_dir()
    index = scan_sketchy(data_dir, _option(cfg, "sketchy_variant", None), _option(cfg, "sketchy_photo_variant", None))

    def variant(name: str | None, variants: list[str]) -> str:
        if name is None:
            return "no variant level"
        return f"variant {name}, of {len(variants)}: {', '.join(variants)}"

    lines = [
        f"sketchy: {index.folder}",
        f"  {len(index.sketch_paths)} sketches, {len(index.photo_ids)} photos, {len(index.classes)} classes "
        f"(paired; split {_option(cfg, 'sketchy_split', 'by_photo')})",
        f"  sketches: {index.sketch_dir} ({variant(index.sketch_variant, index.sketch_variants)})",
        f"  photos: {index.photo_dir} ({variant(index.photo_variant, index.photo_variants)})",
    ]
    if index.bad:
        lines.append(
            f"  bad input, left out of the counts: {_counts(index.bad)} (building the dataset stops on it unless "
            "data.skip_bad=true; images are not decoded here)"
        )
        for kind, paths in index.bad.items():
            more = ", ..." if len(paths) > _LISTED else ""
            lines.append(f"    {kind}: {', '.join(str(p) for p in paths[:_LISTED])}{more}")
    return lines
