"""What the readers of a user's own folders share: their options file, image decoding, labels and captions files,
splits. One module per layout: ``image_folder`` (classification, :mod:`rlattention.data.readers.image_folder`),
``multilabel_csv`` (multi-label, :mod:`rlattention.data.readers.multilabel_csv`) and ``image_captions`` (image-text
matching, region features from a frozen pretrained backbone, :mod:`rlattention.data.readers.image_captions`), and
``reid_folder`` (person re-id, identity and camera in the file names, :mod:`rlattention.data.readers.reid_folder`).
``docs/own-data.md`` shows each layout with the config that trains on it. ``sketchy`` (sketch-photo pairs;
:mod:`rlattention.data.readers.sketchy`) reads its folders on its own.

``data_dir`` (``--data-dir``, ``data.data_dir`` or ``$RLATTENTION_DATA``) is the folder ROOT below::

    image_folder    ROOT/train/<class>/<image>   (+ optional ROOT/val/<class>/..., ROOT/test/<class>/...)
                    or ROOT/<class>/<image>      (validation and test carved from it)
    multilabel_csv  ROOT/labels.csv or ROOT/labels.json, ROOT/images/<image>   (+ optional ROOT/classes.txt)
    image_captions  ROOT/captions.csv or ROOT/captions.json, ROOT/images/<image>

Rules shared by the readers:

* Images: files whose suffix is one of :data:`IMAGE_SUFFIXES` (any case), decoded with Pillow (any mode: palette
  through its palette, transparency composited on white, 16-bit grey scaled by its maximum; as
  :func:`rlattention.vision.transforms.image_to_tensor`) and resized to ``data.image_size`` x ``data.image_size``
  (bicubic, the aspect ratio is not kept). Hidden entries (``.*``), ``Thumbs.db`` and ``desktop.ini`` are ignored.
* Channels (``image_folder``, ``multilabel_csv``): 1 (grey) if every image read is grey, i.e. has R = G = B at
  every pixel once decoded (a grey PNG or JPEG is, and so is an RGB file of grey pixels), else 3 (RGB). The
  optional ``ROOT/dataset.yaml`` key ``channels: 1`` or ``3`` fixes it (1 from colour images: the luma
  ``(299 R + 587 G + 114 B) / 1000``, as Pillow's ``L``). ``image_captions`` always feeds RGB to its backbone.
* Order: rows are sorted by file name (and class), whatever the order of the file system or of a labels file.
* Splits: a split given by the data (a ``val/`` or ``test/`` folder, a ``split`` column, ``val`` / ``test`` lists)
  is used as it is. Otherwise the test split is a seeded ``data.test_fraction`` of the rest (at least one, at most
  all but one; seed ``split_seed(data.seed, "test")``), and then validation ``data.val_size`` of what remains
  (:func:`rlattention.data.photos.holdout_split`, seeded by ``data.seed``; ``val_size: 0`` trains on everything with
  an overlapping 10 % monitoring split, ``meta["val_overlaps_train"]``, not for model selection). Splits are not
  stratified. The engine selects models on validation only and evaluates the test split once, at the end.
  ``image_captions`` splits whole images (with all their captions).
* ``data.num_train`` / ``data.num_test`` > 0 keep the first training rows / the first validation and test rows
  (smoke runs): only those images are decoded.
* Nothing is written: no cache, no file in ROOT. Everything is decoded again each time the dataset is built.
* Bad input stops the build with one line naming the file (and line or key) and what was expected: a missing
  folder or file (an image listed but missing too) is a ``FileNotFoundError``, an unreadable image an
  :class:`~rlattention.data.photos.ImageDecodeError`, anything else a :class:`FolderFormatError` (a ``ValueError``):
  an unknown class, a row listed twice, a name escaping its folder (:func:`rlattention.data.limits.check_name_inside`),
  a file over a cap.
* Caps (:mod:`rlattention.data.limits`): labels and captions files ``MAX_JSON_BYTES`` (before reading),
  ``dataset.yaml`` ``MAX_YAML_BYTES``, images ``MAX_IMAGES``, classes ``MAX_CATEGORIES``, multi-label targets
  ``MAX_TARGET_ELEMENTS``, ``data.image_size`` ``MAX_IMAGE_SIDE``.

``ROOT/dataset.yaml`` (optional) is a flat mapping of the reader's own options, no other key allowed:
``channels`` (``image_folder``, ``multilabel_csv``); ``backbone``, ``weights``, ``grid`` (``image_captions``).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import yaml
from PIL import Image
from torch import Tensor

from rlattention.data import limits
from rlattention.data.limits import check_name_inside, check_side
from rlattention.data.photos import ImageDecodeError, holdout_split
from rlattention.data.splits import split_seed, train_val_split

__all__ = [
    "IMAGE_SUFFIXES",
    "OPTIONS_FILE",
    "FolderFormatError",
    "read_folder_image",
    "read_folder_options",
]

#: Suffixes of the files read as images (compared in lower case).
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
#: The optional options file inside a data folder.
OPTIONS_FILE = "dataset.yaml"
#: Split names of folders, ``split`` columns and json lists.
SPLITS: tuple[str, str, str] = ("train", "val", "test")

_IGNORED = frozenset({"thumbs.db", "desktop.ini"})


class FolderFormatError(ValueError):
    """A file or folder of a user's dataset that is not as the reader expects; the message names it (with the
    line or key) and what was expected."""


# --------------------------------------------------------------------------------------------- shared parts


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


def _ignored(name: str) -> bool:
    return name.startswith(".") or name.lower() in _IGNORED


def _is_image(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_SUFFIXES


def _suffixes() -> str:
    return ", ".join(sorted(IMAGE_SUFFIXES))


def _root(data_dir: Path | None, name: str, layout: str) -> Path:
    if data_dir is None:
        raise ValueError(f"{name} reads a folder of your own: pass --data-dir or set RLATTENTION_DATA ({layout})")
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{name}: data folder not found: {root} (expected {layout})")
    return root


def _image_size(cfg: Any) -> int:
    size = int(_option(cfg, "image_size", 224))
    if size < 1:
        raise ValueError(f"data.image_size must be >= 1, got {size}")
    check_side("data.image_size", size)
    return size


def read_folder_options(root: str | os.PathLike, allowed: dict[str, type | tuple[type, ...]], name: str) -> dict:
    """The options of ``root/dataset.yaml`` (``{}`` without the file): a flat mapping whose keys are those of
    ``allowed`` (key -> accepted types). Raises :class:`FolderFormatError` naming the file and the key."""
    path = Path(root) / OPTIONS_FILE
    if not path.is_file():
        return {}
    limits.check_file_size(path, limits.MAX_YAML_BYTES, "options file", FolderFormatError)
    try:
        data = limits.safe_load_limited(path.read_text(encoding="utf-8"))  # no anchors or aliases, bounded depth
    except UnicodeDecodeError as err:
        raise FolderFormatError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except limits.YamlLimitError as err:
        raise FolderFormatError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise FolderFormatError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FolderFormatError(f"{path}: expected a mapping of options (key: value), got {type(data).__name__}")
    for key, value in data.items():
        if key not in allowed:
            valid = ", ".join(sorted(allowed)) or "none"
            raise FolderFormatError(f"{path}: unknown key {key!r} for {name} (its keys: {valid})")
        types = _types(allowed[key])
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            expected = " or ".join(t.__name__ for t in types)
            raise FolderFormatError(f"{path}: {key}: {value!r}, expected {expected}")
    return data


def _types(spec: type | tuple[type, ...]) -> tuple[type, ...]:
    return spec if isinstance(spec, tuple) else (spec,)


def _channels_option(options: dict, root: Path) -> int | None:
    channels = options.get("channels")
    if channels is not None and channels not in (1, 3):
        raise FolderFormatError(f"{root / OPTIONS_FILE}: channels must be 1 or 3, got {channels!r}")
    return channels


def read_folder_image(path: str | os.PathLike, size: int) -> Tensor:
    """One image file as ``(3, size, size)`` uint8 RGB (see the module docstring for modes and resizing).

    Raises ``FileNotFoundError`` naming the file if it is missing and ``ImageDecodeError`` naming it if Pillow
    cannot decode it."""
    from rlattention.vision.transforms import image_to_tensor

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as img:
            img.draft("RGB", (size, size))  # JPEG: decode at 1/2, 1/4 or 1/8 scale when still >= size
            pixels = image_to_tensor(img, size, crop_fraction=1.0)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ImageDecodeError(f"{path}: cannot decode the image ({type(err).__name__}: {err})") from err
    return pixels.mul_(255.0).round_().to(torch.uint8)


def _decode(paths: Sequence[Path], size: int, workers: int | None = None) -> Tensor:
    """``paths`` (in order) as ``(N, 3, size, size)`` uint8, decoded by a thread pool (Pillow releases the GIL)."""
    out = torch.empty(len(paths), 3, size, size, dtype=torch.uint8)
    workers = workers or min(8, os.cpu_count() or 1)

    def decode(item: tuple[int, Path]) -> None:
        i, path = item
        out[i] = read_folder_image(path, size)

    if paths:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for _ in pool.map(decode, enumerate(paths)):  # re-raises the first error, in order
                pass
    return out


def _to_channels(images: Tensor, channels: int | None) -> Tensor:
    """RGB ``(N, 3, H, W)`` -> 1 channel if ``channels == 1``, or if ``None`` and every image is grey."""
    grey = bool((images[:, 0] == images[:, 1]).all() and (images[:, 1] == images[:, 2]).all())
    if channels == 3 or (channels is None and not grey):
        return images
    if grey:
        return images[:, :1].clone()
    weights = torch.tensor([299, 587, 114], dtype=torch.int32).view(1, 3, 1, 1)
    return ((images.to(torch.int32) * weights).sum(1, keepdim=True) + 500).div(1000, rounding_mode="floor").byte()


def _carve(
    n: int, given_val: bool, given_test: bool, cfg: Any, source: str
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, bool]:
    """Indices into ``n`` pooled training rows: ``(train, val or None, test or None, val_overlaps_train)``; ``val``
    / ``test`` are None when the data give them. Test first (``test_fraction``), then validation (``val_size``)."""
    seed = int(_option(cfg, "seed", 0))
    rest = np.arange(n)
    test = None
    if not given_test:
        fraction = float(_option(cfg, "test_fraction", 0.25))
        if not 0.0 < fraction < 1.0:
            raise ValueError(
                f"data.test_fraction must be in (0, 1) to carve a test split from {source}, got {fraction}"
            )
        if n < 2:
            raise ValueError(f"{source}: {n} item(s) cannot be split into train and test (add a test split)")
        keep, held = train_val_split(n, min(max(1, round(n * fraction)), n - 1), split_seed(seed, "test"))
        rest, test = keep.numpy(), held.numpy()
    val, overlap = None, False
    if not given_val:
        val_size = int(_option(cfg, "val_size", 0))
        train_idx, val_idx = holdout_split(len(rest), val_size, seed, f"{source} ({len(rest)} train + val items)")
        rest, val, overlap = rest[train_idx.numpy()], rest[val_idx.numpy()], val_size == 0
    return rest, val, test, overlap


def _head(rows: Sequence[Any], count: int) -> list[Any]:
    return list(rows[:count]) if count > 0 else list(rows)


def _read_text(path: Path, what: str) -> str:
    limits.check_file_size(path, limits.MAX_JSON_BYTES, what, FolderFormatError)
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise FolderFormatError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def _read_json(path: Path, what: str) -> dict:
    text = _read_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise FolderFormatError(f"{path}: not valid json ({err})") from None
    except RecursionError:
        raise FolderFormatError(f"{path}: not valid json (nested too deeply to parse)") from None
    if not isinstance(data, dict):
        raise FolderFormatError(f"{path}: expected a json object at the top level, found {type(data).__name__}")
    return data


def _read_csv(path: Path, what: str, expected: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """``(header, [(line, fields)])`` of a CSV file with a header; blank rows skipped; every row as wide as the
    header."""
    reader = csv.reader(io.StringIO(_read_text(path, what), newline=""))
    try:
        header = [h.strip() for h in next(reader, [])]
        rows = []
        for fields in reader:
            if not any(f.strip() for f in fields):
                continue
            if len(fields) != len(header):
                raise FolderFormatError(
                    f"{path}:{reader.line_num}: {len(fields)} field(s), expected {len(header)} as in the header "
                    f"({', '.join(header)})"
                )
            rows.append((reader.line_num, [f.strip() for f in fields]))
    except csv.Error as err:
        raise FolderFormatError(f"{path}:{reader.line_num}: not valid CSV ({err})") from None
    if not header or "image" not in header:
        raise FolderFormatError(f"{path}: line 1 must be a header with an 'image' column ({expected})")
    if len(set(header)) != len(header):
        raise FolderFormatError(f"{path}: line 1: a column name is repeated ({', '.join(header)})")
    return header, rows


def _split_value(value: str, where: str) -> str:
    split = value or "train"
    if split not in SPLITS:
        raise FolderFormatError(f"{where}: split {value!r}, expected train, val or test (or empty: train)")
    return split


def _split_lists(data: dict, names: set[str], path: Path) -> dict[str, str]:
    """``{image: "val" | "test"}`` from the optional json lists ``val`` and ``test`` (names of ``images``)."""
    out: dict[str, str] = {}
    for split in ("val", "test"):
        listed = data.get(split, [])
        if not isinstance(listed, list):
            raise FolderFormatError(f"{path}: '{split}' must be a list of image names, got {type(listed).__name__}")
        for i, name in enumerate(listed):
            if not isinstance(name, str) or name not in names:
                raise FolderFormatError(f"{path}: {split}[{i}] = {name!r} is not an image listed in 'images'")
            if name in out:
                raise FolderFormatError(f"{path}: {split}[{i}] = {name!r} is already in '{out[name]}'")
            out[name] = split
    return out


def _images_dir(root: Path, listing: Path) -> Path:
    folder = root / "images"
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder not found: {folder} (the images named in {listing.name} live there)")
    return folder


def _image_path(folder: Path, name: Any, where: str) -> Path:
    """``folder/name`` of an image listed at ``where``: inside ``folder`` and present."""
    name = check_name_inside(where, "image", name, FolderFormatError)
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"{where}: image {name!r} is listed but missing: {path}")
    return path


class _Listed(NamedTuple):
    """The rows of a labels or captions file, sorted by image name."""

    names: list[str]
    paths: list[Path]
    splits: list[str]  # "train" | "val" | "test" per row


def _assign(listed: _Listed, cfg: Any, source: str) -> tuple[list[int], list[int], list[int], bool]:
    """Row indices of train, val and test: the given splits, the missing ones carved from the train rows."""
    pool = [i for i, s in enumerate(listed.splits) if s == "train"]
    if not pool:
        raise FolderFormatError(f"{source}: no training images (every image is in the val or test split)")
    given = {s: [i for i, t in enumerate(listed.splits) if t == s] for s in ("val", "test")}
    train, val, test, overlap = _carve(len(pool), bool(given["val"]), bool(given["test"]), cfg, source)
    rows = np.array(pool, dtype=np.int64)
    return (
        rows[train].tolist(),
        given["val"] if val is None else rows[val].tolist(),
        given["test"] if test is None else rows[test].tolist(),
        overlap,
    )


def _sorted_records(records: dict[str, tuple[Path, str, Any]]) -> tuple[_Listed, Any]:
    names = sorted(records)
    listed = _Listed(names, [records[n][0] for n in names], [records[n][1] for n in names])
    values = [records[n][2] for n in names]
    return listed, torch.stack(values) if values and isinstance(values[0], Tensor) else values


def _one_of(root: Path, stem: str, layout: str) -> Path:
    found = [root / f"{stem}.{ext}" for ext in ("csv", "json") if (root / f"{stem}.{ext}").is_file()]
    if not found:
        raise FileNotFoundError(f"{root}: no {stem}.csv or {stem}.json (expected {layout})")
    if len(found) > 1:
        raise FolderFormatError(f"{root}: both {stem}.csv and {stem}.json; keep one")
    return found[0]


def _listed_splits(
    listed: _Listed, cfg: Any, source: str, decode: Any
) -> tuple[list[list[int]], bool, dict[str, Tensor]]:
    """Rows of train / val / test (cut to ``num_train`` / ``num_test``) and the decoded images of each."""
    train, val, test, overlap = _assign(listed, cfg, source)
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    rows = [_head(train, num_train), _head(val, num_test), _head(test, num_test)]
    return rows, overlap, decode([listed.paths[i] for part in rows for i in part])
