"""Instance-level (fine-grained) sketch -> photo retrieval from partial sketches, as in DARP-SBIR: the
``qmul_chairv2`` and ``omniglot_sketch`` datasets.

Layout of every split (the contract with the ``darp`` method). With ``S = cfg.completion_steps`` (default 17)
and ``H = W = cfg.image_size``:

* ``images``: uint8 ``(N, S + 3, H, W)``, one row per query sketch. Channels ``0 .. S-1`` are the ``S``
  partial renders of the sketch (:func:`rlattention.data.readers.strokes.render_partials`: channel ``s - 1`` shows
  the first ``ceil(s * P / S)`` of its ``P`` points; ink 255 on background 0, line width ``cfg.line_width``
  output pixels; the ink of channel ``s`` contains that of channel ``s - 1`` and channel ``S - 1`` is the
  complete sketch). Channels ``S .. S+2`` are the query's true photo as RGB, resized to ``H x W``.
* ``targets``: int64 ``(N,)``, the index of the true photo in the dataset's photo list.
* ``num_classes``: the length of that list. It covers the photos of *all* splits, sorted by photo id, so an
  index means the same photo in every split and every run (``load_*_index(...).photo_ids``). Every photo of
  the list is the true photo of at least one sketch, so the gallery of a split is the set of its distinct
  targets (:func:`gallery_photos`). With ``num_train`` / ``num_test`` > 0 only the first sketches are kept,
  and the galleries shrink with them.

Memory: ``N * (S + 3) * H * W`` bytes, about 104 MB for the 1275 ChairV2 sketches at 64 px (1.3 GB at 224).
The renders (and the ChairV2 photos) are cached on disk by :func:`rlattention.data.readers.strokes.cached_render_stack`
in ``cfg.render_cache`` (``null``: ``$RLATTENTION_CACHE`` or ``~/.cache/rlattention``; ``""`` / ``"none"``:
no cache); a build announces its size first and stops over ``$RLATTENTION_CACHE_LIMIT`` (default 2 GB, see
:mod:`rlattention.cache_limit`); the split settings are checked before anything is rendered.
``rlattention data info`` (:mod:`rlattention.data.readers.sketch_info`) counts sketches,
photos and renders per split and the cache files' sizes from the files alone: nothing is rendered or written.

``qmul_chairv2`` (QMUL-Chair-V2, Yu et al. CVPR 2016; coordinates of Bhunia et al. CVPR 2020). Folder
``qmul_chairv2/`` holding ``ChairV2_Coordinate`` (the coordinate pickle, see :mod:`rlattention.data.readers.strokes`;
1275 sketches: 952 under ``/train``, 323 under ``/test``) and ``photo/<photo_id>.png`` (400 photos: 300 of
training sketches, 100 of test sketches; RGB, 256 x 256 or 500 x 500). ``/train`` sketches are split into
train and validation *by photo*: ``cfg.val_size`` of the training photos (seeded by ``cfg.seed``, with
:func:`rlattention.data.photos.holdout_split`) and all their sketches form the validation split, so its
gallery is disjoint from the training photos (``val_size = 0``: train on all of them, with an overlapping
monitoring split of 10 % of the photos, not for model selection). ``/test`` sketches are the test split.
Render frame: the fixed square ``(0, 0, 256, 256)``, the frame of the 256 x 256 photos the sketches were
drawn over (upstream rasterises them on a 256 canvas). The coordinates lie in 33..223 and every sketch is
already normalised so that its longer side spans exactly 190 units, centred at 128, so the sketch's own
bounding box would only zoom by about 1.2; the fixed frame keeps the sketch aligned with its photo and every
partial in the same place.

``omniglot_sketch`` (Omniglot, Lake et al. Science 2015, small background sets): a stand-in retrieval task with
strokes. The folder ``omniglot/`` holds ``images_background_small{k}.zip`` and ``strokes_background_small{k}.zip``
(read in place) for the subsets ``k`` of ``cfg.omniglot_subsets`` (default ``[1]``: 136 characters; ``[1, 2]``:
242, since small2's Greek and Latin characters (50) are small1's, with byte-identical drawings, and are read once,
from small1). A character, keyed by ``(subset, alphabet, character)``, was drawn by 20 drawers. Its gallery "photo"
is the PNG of its *first* drawer (lowest drawing name, ``..._01``); the queries are the strokes of the 19 other
drawers. The first drawer's own strokes are not used: the PNG is a rendering of exactly those strokes, so matching
them would be trivial, while another person's drawing of the same character is a genuine fine-grained match. The
PNG (black ink on white) is kept as a grayscale photo replicated to 3 channels; the sketches are rendered in the
PNG's frame, :data:`rlattention.data.readers.strokes.OMNIGLOT_FRAME`. Splits are by character: a seeded
``cfg.test_fraction`` of the characters is the test split, ``cfg.val_size`` characters of the rest (seeded, as
above) the validation split. Photo ids are ``small{k}/<alphabet>/<character>/<drawing>``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.cache import resolve_cache_dir
from rlattention.data.limits import check_archive, check_side, read_member
from rlattention.data.photos import ImageDecodeError, holdout_split, load_resized_images
from rlattention.data.readers.strokes import (
    OMNIGLOT_FRAME,
    SketchFormatError,
    cached_render_stack,
    file_fingerprint,
    parse_omniglot_strokes,
    parse_qmul_key,
    read_qmul_coordinates,
    render_partials_batch,
)
from rlattention.data.registry import register_dataset
from rlattention.data.splits import split_seed, train_val_split

__all__ = [
    "CHAIRV2_COORDINATES",
    "OMNIGLOT_SUBSETS",
    "QMUL_CHAIRV2_DIR",
    "QMUL_FRAME",
    "OmniglotSketchIndex",
    "QmulChairV2Index",
    "build_omniglot_sketch",
    "build_qmul_chairv2",
    "find_omniglot_dir",
    "find_qmul_chairv2_dir",
    "gallery_photos",
    "load_omniglot_sketch_index",
    "load_qmul_chairv2_index",
]

QMUL_CHAIRV2_DIR = "qmul_chairv2"
CHAIRV2_COORDINATES = "ChairV2_Coordinate"
PHOTO_DIR = "photo"
#: Render frame of the QMUL sketches: the 256 x 256 photo they were drawn over.
QMUL_FRAME: tuple[float, float, float, float] = (0.0, 0.0, 256.0, 256.0)
#: subset k -> (images zip, strokes zip) of the Omniglot small background sets.
OMNIGLOT_SUBSETS: dict[int, tuple[str, str]] = {
    k: (f"images_background_small{k}.zip", f"strokes_background_small{k}.zip") for k in (1, 2)
}

_MISSING_DIR_MSG = (
    "{name} needs its data files: pass --data-dir or set RLATTENTION_DATA (a folder holding {what}, e.g. "
    "../shared/data)"
)


# --------------------------------------------------------------------------------------------- QMUL ChairV2


class QmulChairV2Index(NamedTuple):
    """The sketches of ``ChairV2_Coordinate`` in key order and their photos (sorted by photo id)."""

    coordinates: Path  # the pickle
    keys: list[str]  # sorted sketch keys, e.g. "/train/<photo_id>_<n>"
    sketches: list[np.ndarray]  # float32 (P, 3), in key order
    splits: list[str]  # "train" or "test", per sketch
    targets: np.ndarray  # int64 (N,): index of the sketch's photo in photo_ids
    photo_ids: list[str]  # sorted
    photo_paths: list[Path]  # photo/<photo_id>.png, per photo id


def find_qmul_chairv2_dir(root: str | os.PathLike) -> Path:
    """The ChairV2 folder: ``root`` itself or ``root/qmul_chairv2``, the first holding ``ChairV2_Coordinate``.
    Raises ``FileNotFoundError`` naming the expected file and every folder searched."""
    root = Path(root).expanduser()
    folders = [root, root / QMUL_CHAIRV2_DIR]
    for folder in folders:
        if (folder / CHAIRV2_COORDINATES).is_file():
            return folder
    raise FileNotFoundError(
        f"QMUL-Chair-V2 not found: expected {CHAIRV2_COORDINATES} and {PHOTO_DIR}/<photo_id>.png in one of: "
        f"{', '.join(str(f) for f in folders)}"
    )


def load_qmul_chairv2_index(root: str | os.PathLike) -> QmulChairV2Index:
    """Read ``ChairV2_Coordinate`` under ``root`` (see :func:`find_qmul_chairv2_dir`) and check that the photo
    ``photo/<photo_id>.png`` of every sketch exists (``FileNotFoundError`` naming the first missing file and a
    sketch that needs it). Format errors are :class:`rlattention.data.readers.strokes.SketchFormatError`."""
    folder = find_qmul_chairv2_dir(root)
    path = folder / CHAIRV2_COORDINATES
    data = read_qmul_coordinates(path)
    keys = sorted(data)
    parsed = [parse_qmul_key(key) for key in keys]
    photo_ids = sorted({photo for _, photo in parsed})
    photo_dir = folder / PHOTO_DIR
    if not photo_dir.is_dir():
        raise FileNotFoundError(
            f"QMUL-Chair-V2 photo folder not found: {photo_dir} (expected {PHOTO_DIR}/<photo_id>.png next to {path})"
        )
    photo_paths = [photo_dir / f"{photo}.png" for photo in photo_ids]
    for photo, photo_path in zip(photo_ids, photo_paths, strict=True):
        if not photo_path.is_file():
            key = next(k for k, (_, p) in zip(keys, parsed, strict=True) if p == photo)
            raise FileNotFoundError(f"photo not found: {photo_path} (the true photo of sketch {key!r} in {path})")
    row_of = {photo: i for i, photo in enumerate(photo_ids)}
    return QmulChairV2Index(
        coordinates=path,
        keys=keys,
        sketches=[data[key] for key in keys],
        splits=[split for split, _ in parsed],
        targets=np.array([row_of[photo] for _, photo in parsed], dtype=np.int64),
        photo_ids=photo_ids,
        photo_paths=photo_paths,
    )


# -------------------------------------------------------------------------------------------------- Omniglot


class OmniglotSketchIndex(NamedTuple):
    """The Omniglot characters of some subsets: one gallery PNG each, and the query stroke files."""

    folder: Path
    subsets: list[int]
    photo_ids: list[str]  # sorted "small{k}/<alphabet>/<character>/<drawing>", one per character
    photo_members: list[tuple[int, str]]  # (subset, member of the images zip), per photo id
    keys: list[str]  # "small{k}/<alphabet>/<character>/<drawing>" of every query, sorted
    query_members: list[tuple[int, str]]  # (subset, member of the strokes zip), per query
    targets: np.ndarray  # int64 (N,): index of the query's character (gallery photo) in photo_ids


def find_omniglot_folder(root: str | os.PathLike, needed: Sequence[str]) -> Path:
    """``root`` itself or ``root/omniglot``, the first holding every file of ``needed``. Raises
    ``FileNotFoundError`` naming the files and every folder searched."""
    root = Path(root).expanduser()
    folders = [root, root / "omniglot"]
    for folder in folders:
        if all((folder / name).is_file() for name in needed):
            return folder
    raise FileNotFoundError(
        f"Omniglot zips not found: need {', '.join(needed)} in one folder; searched: "
        f"{', '.join(str(f) for f in folders)}"
    )


def find_omniglot_dir(root: str | os.PathLike, subsets: Sequence[int] = (1,)) -> Path:
    """The Omniglot folder (:func:`find_omniglot_folder`) holding the images and strokes zips of every subset in
    ``subsets``."""
    return find_omniglot_folder(root, [name for k in subsets for name in OMNIGLOT_SUBSETS[k]])


def _check_subsets(subsets: Any) -> list[int]:
    try:
        values = sorted({int(k) for k in subsets})
    except (TypeError, ValueError):
        values = []
    if not values or any(k not in OMNIGLOT_SUBSETS for k in values):
        raise ValueError(
            f"omniglot_subsets must be a non-empty list of {sorted(OMNIGLOT_SUBSETS)} (the small background "
            f"sets), got {subsets!r}"
        )
    return values


def _drawings(zip_path: Path, suffix: str) -> dict[tuple[str, str], list[str]]:
    """``(alphabet, character) -> sorted member names`` of the files ending in ``suffix`` of one zip
    (``<top>/<alphabet>/<character>/<drawing><suffix>``; macOS metadata is skipped)."""
    try:
        with zipfile.ZipFile(zip_path) as archive:
            check_archive(archive, zip_path, SketchFormatError)
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as err:
        raise SketchFormatError(f"{zip_path}: not a readable zip ({err})") from err
    out: dict[tuple[str, str], list[str]] = {}
    for name in names:
        parts = name.split("/")
        if name.startswith(("/", "\\")) or ".." in parts or ".." in name.split("\\"):
            raise SketchFormatError(
                f"{zip_path}: refused: member {name!r} has an absolute or '..' path (not an Omniglot archive)"
            )
        if not name.endswith(suffix) or parts[0] == "__MACOSX" or parts[-1].startswith("."):
            continue
        if len(parts) != 4:
            raise SketchFormatError(
                f"{zip_path}: member {name!r} is not <folder>/<alphabet>/<character>/<drawing>{suffix}"
            )
        out.setdefault((parts[1], parts[2]), []).append(name)
    if not out:
        raise SketchFormatError(f"{zip_path}: no <folder>/<alphabet>/<character>/<drawing>{suffix} members")
    return {key: sorted(members) for key, members in out.items()}


def _drawing_name(member: str) -> str:
    return member.rsplit("/", 1)[1].rsplit(".", 1)[0]


def load_omniglot_sketch_index(root: str | os.PathLike, subsets: Sequence[int] = (1,)) -> OmniglotSketchIndex:
    """List the characters of the Omniglot small background ``subsets`` under ``root`` (see
    :func:`find_omniglot_dir`) without decoding anything: per character the gallery PNG (first drawer) and
    the stroke files of the other drawers. Raises :class:`rlattention.data.readers.strokes.SketchFormatError` naming
    the zip for an unreadable zip, a character with fewer than 2 drawings, or a drawing without its stroke file.
    """
    subsets = _check_subsets(subsets)
    folder = find_omniglot_dir(root, subsets)
    characters: list[tuple[str, int, str, list[str]]] = []  # (photo id, subset, png member, stroke members)
    seen: set[tuple[str, str]] = set()
    for k in subsets:
        images_zip, strokes_zip = (folder / name for name in OMNIGLOT_SUBSETS[k])
        pngs, strokes = _drawings(images_zip, ".png"), _drawings(strokes_zip, ".txt")
        for (alphabet, character), members in sorted(pngs.items()):
            if (alphabet, character) in seen:  # small2 repeats small1's Greek and Latin (identical drawings)
                continue
            seen.add((alphabet, character))
            if len(members) < 2:
                raise SketchFormatError(
                    f"{images_zip}: character {alphabet}/{character} has {len(members)} drawing(s); need >= 2 "
                    "(a gallery drawing and at least one query)"
                )
            available = {_drawing_name(m): m for m in strokes.get((alphabet, character), [])}
            queries = []
            for member in members[1:]:
                drawing = _drawing_name(member)
                if drawing not in available:
                    raise SketchFormatError(
                        f"{strokes_zip}: no stroke file {alphabet}/{character}/{drawing}.txt for the drawing "
                        f"{member} of {images_zip}"
                    )
                queries.append(available[drawing])
            photo_id = f"small{k}/{alphabet}/{character}/{_drawing_name(members[0])}"
            characters.append((photo_id, k, members[0], queries))
    characters.sort(key=lambda c: c[0])
    keys, query_members, targets = [], [], []
    for row, (_, k, _, queries) in enumerate(characters):
        for member in queries:
            _, alphabet, character, _ = member.split("/")
            keys.append(f"small{k}/{alphabet}/{character}/{_drawing_name(member)}")
            query_members.append((k, member))
            targets.append(row)
    return OmniglotSketchIndex(
        folder=folder,
        subsets=subsets,
        photo_ids=[c[0] for c in characters],
        photo_members=[(c[1], c[2]) for c in characters],
        keys=keys,
        query_members=query_members,
        targets=np.array(targets, dtype=np.int64),
    )


def _read_omniglot_queries(index: OmniglotSketchIndex) -> list[np.ndarray]:
    """The query sketches of ``index``, in its order (one pass over each strokes zip)."""
    sketches: list[np.ndarray | None] = [None] * len(index.query_members)
    for k in index.subsets:
        zip_path = index.folder / OMNIGLOT_SUBSETS[k][1]
        with zipfile.ZipFile(zip_path) as archive:
            for row, (subset, member) in enumerate(index.query_members):
                if subset == k:
                    sketches[row] = parse_omniglot_strokes(
                        read_member(archive, member, zip_path, SketchFormatError), f"{zip_path}:{member}"
                    )
    return sketches  # type: ignore[return-value]  # every row belongs to one of index.subsets


def _decode_png(data: bytes, size: int, source: str) -> np.ndarray:
    """An image file's bytes as ``(3, size, size)`` uint8 RGB (converted and resized as in
    :func:`rlattention.data.photos.read_resized_image`)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            rgb = img.convert("RGB")
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ImageDecodeError(f"{source}: cannot decode the image ({type(err).__name__}: {err})") from err
    return np.array(rgb, dtype=np.uint8).transpose(2, 0, 1)


def _omniglot_photos(index: OmniglotSketchIndex, size: int) -> np.ndarray:
    photos = np.empty((len(index.photo_ids), 3, size, size), dtype=np.uint8)
    for k in index.subsets:
        zip_path = index.folder / OMNIGLOT_SUBSETS[k][0]
        with zipfile.ZipFile(zip_path) as archive:
            for row, (subset, member) in enumerate(index.photo_members):
                if subset == k:
                    photos[row] = _decode_png(
                        read_member(archive, member, zip_path, SketchFormatError), size, f"{zip_path}:{member}"
                    )
    return photos


# ----------------------------------------------------------------------------------------------- assembling


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


class _RenderOptions(NamedTuple):
    steps: int
    size: int
    line_width: float
    cache_dir: Path | None


def _render_options(cfg: Any) -> _RenderOptions:
    steps, size = int(_option(cfg, "completion_steps", 17)), int(_option(cfg, "image_size", 224))
    if steps < 1:
        raise ValueError(f"completion_steps must be >= 1, got {steps}")
    if size < 1:
        raise ValueError(f"image_size must be >= 1, got {size}")
    check_side("data.image_size", size)
    return _RenderOptions(
        steps, size, float(_option(cfg, "line_width", 2.0)), resolve_cache_dir(_option(cfg, "render_cache", None))
    )


def _rendering(num_sketches: int, opts: _RenderOptions) -> str:
    """What a render-cache build of ``num_sketches`` sketches does, for its announcement."""
    return f"rendering {num_sketches:,} sketches x {opts.steps} partials at {opts.size} px"


def _render_bytes(num_sketches: int, opts: _RenderOptions) -> int:
    """Bytes of the uint8 ``(N, S, H, W)`` renders of ``num_sketches`` sketches."""
    return num_sketches * opts.steps * opts.size * opts.size


def _qmul_render_key(index: QmulChairV2Index, opts: _RenderOptions) -> dict[str, Any]:
    return {
        "what": "qmul_partials",
        "source": file_fingerprint(index.coordinates),
        "steps": opts.steps,
        "size": opts.size,
        "line_width": opts.line_width,
        "frame": list(QMUL_FRAME),
    }


def _qmul_photo_key(index: QmulChairV2Index, opts: _RenderOptions) -> dict[str, Any]:
    return {
        "what": "qmul_photos",
        "size": opts.size,
        "photos": _digest([(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in index.photo_paths]),
    }


def _omniglot_render_key(index: OmniglotSketchIndex, opts: _RenderOptions) -> dict[str, Any]:
    return {
        "what": "omniglot_partials",
        "sources": [file_fingerprint(index.folder / OMNIGLOT_SUBSETS[k][1]) for k in index.subsets],
        "queries": _digest(index.keys),
        "steps": opts.steps,
        "size": opts.size,
        "line_width": opts.line_width,
        "frame": list(OMNIGLOT_FRAME),
    }


def _rows(targets: np.ndarray, selected: np.ndarray, count: int, mask: np.ndarray | None = None) -> np.ndarray:
    """Indices of the sketches whose photo is in ``selected`` (and ``mask``), the first ``count`` if > 0."""
    keep = np.isin(targets, selected)
    if mask is not None:
        keep &= mask
    rows = np.flatnonzero(keep)
    return rows[:count] if count > 0 else rows


def _dataset(renders: np.ndarray, photos: np.ndarray, targets: np.ndarray, rows: np.ndarray) -> ArrayDataset:
    """The rows ``rows`` in the module's layout: renders of the sketch, then its photo."""
    steps, size = renders.shape[1], renders.shape[-1]
    images = np.empty((len(rows), steps + 3, size, size), dtype=np.uint8)  # numpy: faster than a torch copy here
    images[:, :steps] = renders[rows]
    images[:, steps:] = photos[targets[rows]]
    return ArrayDataset(torch.from_numpy(images), torch.from_numpy(targets[rows].astype(np.int64)))


def gallery_photos(dataset: ArrayDataset, completion_steps: int) -> tuple[Tensor, Tensor]:
    """The gallery of one split: ``(photo indices, photos)``, the distinct targets (sorted, int64 ``(K,)``)
    and their photos uint8 ``(K, 3, H, W)`` taken from channels ``completion_steps ..`` of the images."""
    indices, first = np.unique(dataset.targets.numpy(), return_index=True)
    photos = dataset.images[torch.from_numpy(first), completion_steps : completion_steps + 3]
    return torch.from_numpy(indices.astype(np.int64)), photos.clone()


def _digest(items: Sequence[Any]) -> str:
    return hashlib.sha256(json.dumps(list(items), default=str).encode()).hexdigest()


def _qmul_rows(index: QmulChairV2Index, cfg: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sketch rows of the train, val and test splits (see the module docstring): ``val_size`` of the
    /train photos held out (seeded), /test sketches as test; the first ``num_train`` / ``num_test`` if > 0."""
    is_train = np.array(index.splits) == "train"
    train_photos = np.unique(index.targets[is_train])
    source = f"{index.coordinates} (training photos)"
    val_size, seed = int(_option(cfg, "val_size", 0)), int(_option(cfg, "seed", 0))
    train_idx, val_idx = holdout_split(len(train_photos), val_size, seed, source)
    test_photos = np.unique(index.targets[~is_train])
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    return (
        _rows(index.targets, train_photos[train_idx.numpy()], num_train, is_train),
        _rows(index.targets, train_photos[val_idx.numpy()], num_test, is_train),
        _rows(index.targets, test_photos, num_test, ~is_train),
    )


def _omniglot_rows(index: OmniglotSketchIndex, cfg: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The query rows of the train, val and test splits, by character (see the module docstring)."""
    n = len(index.photo_ids)
    fraction = float(_option(cfg, "test_fraction", 0.25))
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {fraction}")
    if n < 2:
        raise ValueError(f"{index.folder}: {n} character(s) cannot be split into train and test")
    num_held = min(max(1, round(n * fraction)), n - 1)
    seed = int(_option(cfg, "seed", 0))
    rest, test_chars = train_val_split(n, num_held, split_seed(seed, "test"))
    train_idx, val_idx = holdout_split(
        len(rest), int(_option(cfg, "val_size", 0)), seed, f"{index.folder} ({len(rest)} train + val characters)"
    )
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    return (
        _rows(index.targets, rest[train_idx].numpy(), num_train),
        _rows(index.targets, rest[val_idx].numpy(), num_test),
        _rows(index.targets, test_chars.numpy(), num_test),
    )


@register_dataset("qmul_chairv2")
def build_qmul_chairv2(cfg: Any, data_dir: Path | None) -> DataSplits:
    """QMUL-Chair-V2 partial-sketch -> photo retrieval (see the module docstring for the layout and splits).

    Config: ``image_size`` (render and photo side; the darp configs use 64), ``completion_steps``,
    ``line_width``, ``render_cache``, ``val_size`` (training *photos* held out for validation, 0..299),
    ``seed``, ``num_train`` / ``num_test`` (first sketches only, when > 0).
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG.format(name="qmul_chairv2", what=f"{QMUL_CHAIRV2_DIR}/{CHAIRV2_COORDINATES}"))
    index = load_qmul_chairv2_index(data_dir)
    opts = _render_options(cfg)
    train_rows, val_rows, test_rows = _qmul_rows(index, cfg)  # a bad val_size fails before anything is rendered
    renders = cached_render_stack(
        _qmul_render_key(index, opts),
        lambda: render_partials_batch(
            index.sketches, opts.steps, opts.size, opts.line_width, QMUL_FRAME, progress="rendering partials"
        ),
        opts.cache_dir,
        what=_rendering(len(index.keys), opts),
        nbytes=_render_bytes(len(index.keys), opts),
    )
    photos = cached_render_stack(
        _qmul_photo_key(index, opts),
        lambda: load_resized_images(index.photo_paths, opts.size).numpy(),
        opts.cache_dir,
        what=f"resizing {len(index.photo_paths):,} photos to {opts.size} px",
        nbytes=len(index.photo_paths) * 3 * opts.size * opts.size,
    )
    return DataSplits(
        _dataset(renders, photos, index.targets, train_rows),
        _dataset(renders, photos, index.targets, val_rows),
        _dataset(renders, photos, index.targets, test_rows),
        num_classes=len(index.photo_ids),
        name="qmul_chairv2",
    )


@register_dataset("omniglot_sketch")
def build_omniglot_sketch(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Omniglot instance-level sketch -> drawing retrieval (see the module docstring for the layout and splits).

    Config: ``omniglot_subsets`` (default ``[1]``), ``image_size``, ``completion_steps``, ``line_width``,
    ``render_cache``, ``test_fraction`` (share of characters held out as test, default 0.25), ``val_size``
    (characters of the rest held out for validation), ``seed``, ``num_train`` / ``num_test``.
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG.format(name="omniglot_sketch", what="omniglot/*_background_small1.zip"))
    index = load_omniglot_sketch_index(data_dir, _option(cfg, "omniglot_subsets", [1]))
    opts = _render_options(cfg)
    train_rows, val_rows, test_rows = _omniglot_rows(index, cfg)  # bad split settings fail before any rendering
    renders = cached_render_stack(
        _omniglot_render_key(index, opts),
        lambda: render_partials_batch(
            _read_omniglot_queries(index),
            opts.steps,
            opts.size,
            opts.line_width,
            OMNIGLOT_FRAME,
            progress="rendering partials",
        ),
        opts.cache_dir,
        what=_rendering(len(index.keys), opts),
        nbytes=_render_bytes(len(index.keys), opts),
    )
    photos = _omniglot_photos(index, opts.size)
    return DataSplits(
        _dataset(renders, photos, index.targets, train_rows),
        _dataset(renders, photos, index.targets, val_rows),
        _dataset(renders, photos, index.targets, test_rows),
        num_classes=len(index.photo_ids),
        name="omniglot_sketch",
    )
