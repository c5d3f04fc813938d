"""SVHN (Netzer et al., 2011) read as distributed: the ``svhn_cropped`` and ``svhn_sequences`` datasets.

Two formats:

* **Format 1, full numbers**: a folder per split (``train/``, ``test/``, ``extra/``) holding the house-number
  PNGs ``1.png, 2.png, ...`` and ``digitStruct.mat``, a MATLAB v7.3 (HDF5) file: group ``digitStruct`` with
  datasets ``name`` and ``bbox`` of object references, one per image. ``name`` points to the file name as
  uint16 characters; ``bbox`` points to a group with fields ``label``, ``left``, ``top``, ``width``,
  ``height``. Each field holds the value itself (a ``1x1`` array) when the image has one digit, and an array
  of references to ``1x1`` values when it has several.
* **Format 2, cropped digits**: ``train_32x32.mat`` / ``test_32x32.mat`` / ``extra_32x32.mat``, MATLAB v5
  files with ``X`` uint8 ``(32, 32, 3, N)`` (height, width, RGB, image) and ``y`` ``(N, 1)``.

In both, label 10 means the digit 0; labels come out as 0..9.

Full numbers are preprocessed as in Goodfellow et al. (2014): the union box of the digits' boxes is expanded
by 30 % in x and in y (about its centre, clipped to the image), cropped and resized to 64x64, and a 54x54
window is kept. Here the window is the deterministic centre crop, taken at load time; the random 54x54
crops of the paper are augmentation (:func:`random_crop`; load with ``crop=None`` to keep the 64x64).
Targets of full numbers are int64 ``(N, max_digits + 1)``: the digits left to right, the end token 10, then
-1 padding (:func:`rlattention.data.sequence_targets.encode_sequences`). Nothing is cached on disk.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.registry import register_dataset
from rlattention.data.sequence_targets import END_TOKEN, encode_sequences
from rlattention.data.splits import train_val_split

if TYPE_CHECKING:
    import h5py

__all__ = [
    "BBOX_FIELDS",
    "CROPPED_FILES",
    "DigitStructEntry",
    "SvhnFormatError",
    "SvhnSequences",
    "build_svhn_cropped",
    "build_svhn_sequences",
    "center_crop",
    "crop_union_box",
    "find_svhn_file",
    "load_svhn_cropped",
    "load_svhn_sequences",
    "random_crop",
    "read_cropped_mat",
    "read_digit_struct",
]

log = logging.getLogger(__name__)

#: split -> cropped-digit (format 2) file name.
CROPPED_FILES: dict[str, str] = {"train": "train_32x32.mat", "test": "test_32x32.mat", "extra": "extra_32x32.mat"}
#: Fields of each ``digitStruct/bbox`` entry, in the order of :attr:`DigitStructEntry.boxes` after ``label``.
BBOX_FIELDS: tuple[str, ...] = ("label", "left", "top", "width", "height")
DIGIT_STRUCT = "digitStruct.mat"

_CROPPED_SIDE = 32
_EXPAND = 0.3
_RESIZE = 64
_CROP = 54
_MISSING_DIR_MSG = "{name} needs the SVHN files: pass --data-dir or set RLATTENTION_DATA (a folder holding {what})"


class SvhnFormatError(ValueError):
    """A malformed SVHN file; the message names the file, what was expected and what was found."""


# ----------------------------------------------------------------------------------------------- helpers


def _search_dirs(root: Path) -> list[Path]:
    """Folders that may hold the SVHN files: ``root`` and ``root/svhn``."""
    return [root, root / "svhn"]


def find_svhn_file(root: str | os.PathLike, relative: str) -> Path:
    """``root/relative`` or ``root/svhn/relative``, the first that exists; ``FileNotFoundError`` naming both."""
    root = Path(root).expanduser()
    candidates = [folder / relative for folder in _search_dirs(root)]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"SVHN file {relative} not found; searched: {', '.join(str(c) for c in candidates)}")


def _labels_to_digits(values: np.ndarray, where: str) -> np.ndarray:
    """SVHN labels 1..10 (10 = digit 0) -> int64 digits 0..9; ``SvhnFormatError`` naming ``where`` otherwise."""
    values = np.asarray(values)
    if values.dtype.kind not in "uif":
        raise SvhnFormatError(f"{where}: labels must be numbers 1..10, found dtype {values.dtype}")
    as_int = np.rint(values).astype(np.int64) if values.dtype.kind == "f" else values.astype(np.int64)
    bad = (as_int < 1) | (as_int > 10) | (as_int != values)
    if bad.any():
        first = int(np.argmax(bad.ravel()))
        raise SvhnFormatError(
            f"{where}: labels must be integers in 1..10 (10 means digit 0), found {values.ravel()[first].item()!r} "
            f"at index {first}"
        )
    return as_int % 10


# ----------------------------------------------------------------------------------------------- format 2


def read_cropped_mat(path: str | os.PathLike) -> tuple[Tensor, Tensor]:
    """Read one cropped-digit file (``train_32x32.mat`` ...), MATLAB v5.

    Returns ``images`` uint8 ``(N, 3, 32, 32)`` (RGB, 0..255) and ``labels`` int64 ``(N,)`` in 0..9 (the file's
    10 becomes 0). Raises ``FileNotFoundError`` if the file is missing and :class:`SvhnFormatError` if it is
    not a MATLAB v5 file, lacks ``X`` or ``y``, or has the wrong shapes, dtype, counts or labels.
    """
    import scipy.io  # imported on use: only the SVHN readers need scipy

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SVHN cropped-digit file not found: {path} (expected e.g. {CROPPED_FILES['train']})")
    try:
        mat = scipy.io.loadmat(path, variable_names=["X", "y"])
    except NotImplementedError as err:  # scipy's answer to a v7.3 (HDF5) file
        raise SvhnFormatError(f"{path}: a MATLAB v7.3 (HDF5) file; expected the MATLAB v5 .mat as distributed") from err
    except Exception as err:  # scipy raises ValueError, OSError, MatReadError, ... for corrupt files
        raise SvhnFormatError(
            f"{path}: not a readable MATLAB v5 .mat file ({type(err).__name__}: {err}); expected X and y"
        ) from err
    missing = [key for key in ("X", "y") if key not in mat]
    if missing:
        found = sorted(key for key in mat if not key.startswith("__"))
        raise SvhnFormatError(f"{path}: missing variable(s) {missing}; expected X and y, found {found}")
    x, y = mat["X"], mat["y"]
    side = _CROPPED_SIDE
    if x.ndim != 4 or x.shape[:3] != (side, side, 3):
        raise SvhnFormatError(f"{path}: X must be ({side}, {side}, 3, N) (height, width, RGB, image), found {x.shape}")
    if x.dtype != np.uint8:
        raise SvhnFormatError(f"{path}: X must be uint8, found {x.dtype}")
    if y.ndim not in (1, 2) or (y.ndim == 2 and 1 not in y.shape):
        raise SvhnFormatError(f"{path}: y must be (N, 1), found {y.shape}")
    y = y.reshape(-1)
    if len(y) != x.shape[3]:
        raise SvhnFormatError(f"{path}: X holds {x.shape[3]} images but y holds {len(y)} labels")
    labels = _labels_to_digits(y, f"{path}: y")
    images = np.ascontiguousarray(x.transpose(3, 2, 0, 1))  # (H, W, C, N) -> (N, C, H, W)
    return torch.from_numpy(images), torch.from_numpy(labels)


def load_svhn_cropped(root: str | os.PathLike, split: str) -> tuple[Tensor, Tensor]:
    """Load the cropped digits of ``split`` (``"train"`` 73257, ``"test"`` 26032 or ``"extra"`` 531131 images)
    from ``root`` or ``root/svhn``. Returns uint8 ``(N, 3, 32, 32)`` and int64 ``(N,)`` 0..9 (see
    :func:`read_cropped_mat`).
    """
    if split not in CROPPED_FILES:
        raise ValueError(f"SVHN split must be one of {sorted(CROPPED_FILES)}, got {split!r}")
    return read_cropped_mat(find_svhn_file(root, CROPPED_FILES[split]))


# ----------------------------------------------------------------------------------------------- format 1


@dataclass(frozen=True)
class DigitStructEntry:
    """One image of a ``digitStruct.mat``.

    name: the PNG file name (``"1.png"``), relative to the digitStruct's folder.
    labels: int64 ``(k,)`` digits 0..9, left to right as annotated.
    boxes: float64 ``(k, 4)`` ``(left, top, width, height)`` of each digit, in image pixels.
    """

    name: str
    labels: np.ndarray
    boxes: np.ndarray

    @property
    def union_box(self) -> tuple[float, float, float, float]:
        """``(x0, y0, x1, y1)``: the smallest box holding every digit box."""
        left, top = self.boxes[:, 0], self.boxes[:, 1]
        right, bottom = left + self.boxes[:, 2], top + self.boxes[:, 3]
        return float(left.min()), float(top.min()), float(right.max()), float(bottom.max())


def _is_refs(dataset: h5py.Dataset) -> bool:
    import h5py

    return h5py.check_dtype(ref=dataset.dtype) is h5py.Reference


def _deref(file: h5py.File, ref: Any, path: Path, what: str) -> Any:
    try:
        return file[ref]
    except (ValueError, KeyError, TypeError) as err:
        raise SvhnFormatError(f"{path}: {what}: invalid object reference ({err})") from err


def _read_name(file: h5py.File, ref: Any, path: Path, index: int) -> str:
    import h5py

    node = _deref(file, ref, path, f"digitStruct/name[{index}]")
    if not isinstance(node, h5py.Dataset) or node.dtype.kind not in "ui":
        raise SvhnFormatError(f"{path}: digitStruct/name[{index}] must point to uint16 characters, found {node!r}")
    return "".join(map(chr, np.asarray(node[()]).ravel().tolist()))


def _read_field(file: h5py.File, group: h5py.Group, field: str, path: Path, where: str) -> np.ndarray:
    """One bbox field as float64 ``(k,)``: the values themselves, or references to ``1x1`` values."""
    import h5py

    if field not in group:
        raise SvhnFormatError(
            f"{path}: {where} has no field {field!r}; expected {list(BBOX_FIELDS)}, found {list(group)}"
        )
    node = group[field]
    if not isinstance(node, h5py.Dataset):
        raise SvhnFormatError(f"{path}: {where}/{field} must be a dataset, found {node!r}")
    raw = np.asarray(node[()])
    if not _is_refs(node):
        if raw.dtype.kind not in "uif":
            raise SvhnFormatError(f"{path}: {where}/{field} must be numbers or references, found dtype {raw.dtype}")
        return raw.astype(np.float64).ravel()
    values = []
    for j, ref in enumerate(raw.ravel()):
        value = _deref(file, ref, path, f"{where}/{field}[{j}]")
        data = np.asarray(value[()]) if isinstance(value, h5py.Dataset) else None
        if data is None or data.size != 1 or data.dtype.kind not in "uif":
            raise SvhnFormatError(f"{path}: {where}/{field}[{j}] must point to one number, found {value!r}")
        values.append(float(data.ravel()[0]))
    return np.asarray(values, dtype=np.float64)


def read_digit_struct(path: str | os.PathLike, limit: int | None = None) -> list[DigitStructEntry]:
    """Read a format 1 ``digitStruct.mat`` (MATLAB v7.3 / HDF5), both bbox layouts (see the module docstring).

    path: the file. limit: read only the first ``limit`` images (all when None).
    Returns one :class:`DigitStructEntry` per image, in file order. Raises ``FileNotFoundError`` if the file is
    missing and :class:`SvhnFormatError` (naming the file, the image index and what was expected) if it is not
    HDF5, lacks ``digitStruct``, ``name``, ``bbox`` or a bbox field, has a name/bbox count mismatch, fields of
    different lengths in one image, or a label outside 1..10.
    """
    import h5py  # imported on use: only the format 1 reader needs h5py

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SVHN {DIGIT_STRUCT} not found: {path}")
    try:
        file = h5py.File(path, "r")
    except OSError as err:
        raise SvhnFormatError(
            f"{path}: not an HDF5 file ({err}); expected the SVHN format 1 {DIGIT_STRUCT} (MATLAB v7.3)"
        ) from err
    with file:
        if "digitStruct" not in file or not isinstance(file["digitStruct"], h5py.Group):
            raise SvhnFormatError(
                f"{path}: no group 'digitStruct'; expected digitStruct/name and digitStruct/bbox, "
                f"found top-level keys {sorted(file.keys())}"
            )
        group = file["digitStruct"]
        for key in ("name", "bbox"):
            if key not in group or not isinstance(group[key], h5py.Dataset) or not _is_refs(group[key]):
                raise SvhnFormatError(
                    f"{path}: digitStruct/{key} must be a dataset of object references; "
                    f"found keys {sorted(group.keys())}" + (f", {key} = {group[key]!r}" if key in group else "")
                )
        name_refs, bbox_refs = group["name"][()].ravel(), group["bbox"][()].ravel()
        if len(name_refs) != len(bbox_refs):
            raise SvhnFormatError(
                f"{path}: digitStruct/name has {len(name_refs)} entries but digitStruct/bbox has {len(bbox_refs)}"
            )
        count = len(name_refs) if limit is None else min(int(limit), len(name_refs))
        entries = []
        for i in range(count):
            name = _read_name(file, name_refs[i], path, i)
            where = f"digitStruct/bbox[{i}] ({name})"
            box_group = _deref(file, bbox_refs[i], path, where)
            if not isinstance(box_group, h5py.Group):
                raise SvhnFormatError(
                    f"{path}: {where} must point to a group of {list(BBOX_FIELDS)}, found {box_group!r}"
                )
            fields = {field: _read_field(file, box_group, field, path, where) for field in BBOX_FIELDS}
            lengths = {field: len(values) for field, values in fields.items()}
            if len(set(lengths.values())) != 1 or lengths["label"] == 0:
                raise SvhnFormatError(
                    f"{path}: {where}: every field must hold the same number (>= 1) of digits, found {lengths}"
                )
            labels = _labels_to_digits(fields["label"], f"{path}: {where}/label")
            boxes = np.stack([fields[f] for f in BBOX_FIELDS[1:]], axis=1)
            entries.append(DigitStructEntry(name, labels, boxes))
    return entries


def crop_union_box(
    image: Image.Image,
    union: tuple[float, float, float, float],
    *,
    expand: float = _EXPAND,
    size: int = _RESIZE,
) -> np.ndarray:
    """The union box expanded by ``expand`` (a fraction of its width and of its height, half on each side),
    clipped to the image, resized to ``size x size`` (bilinear, anti-aliased when shrinking).

    image: an RGB PIL image. union: ``(x0, y0, x1, y1)`` in pixels. Returns uint8 ``(size, size, 3)``.
    Raises ``ValueError`` if the clipped box is empty (the digits lie outside the image).
    """
    x0, y0, x1, y1 = union
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    half_w, half_h = (x1 - x0) * (1 + expand) / 2, (y1 - y0) * (1 + expand) / 2
    width, height = image.size
    box = (max(cx - half_w, 0.0), max(cy - half_h, 0.0), min(cx + half_w, width), min(cy + half_h, height))
    if not (box[2] > box[0] and box[3] > box[1]):
        raise ValueError(f"the expanded digit box {union} -> {box} is empty inside the {width}x{height} image")
    return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR, box=box), dtype=np.uint8)


def center_crop(images: Tensor, size: int) -> Tensor:
    """The central ``size x size`` window of ``(N, C, H, W)`` images (offsets ``(H - size) // 2``, ...)."""
    height, width = images.shape[-2:]
    if not (0 < size <= height and size <= width):
        raise ValueError(f"crop size must be in 1..{min(height, width)}, got {size}")
    top, left = (height - size) // 2, (width - size) // 2
    return images[..., top : top + size, left : left + size]


def random_crop(images: Tensor, size: int, generator: torch.Generator | None = None) -> Tensor:
    """An independent uniformly placed ``size x size`` window of each of the ``(N, C, H, W)`` images (the random
    54x54 of 64x64 crops of Goodfellow et al.), gathered in one indexing operation; ``(N, C, size, size)``.
    """
    n, _, height, width = images.shape
    if not (0 < size <= height and size <= width):
        raise ValueError(f"crop size must be in 1..{min(height, width)}, got {size}")
    channels = images.shape[1]
    top = torch.randint(height - size + 1, (n,), generator=generator).to(images.device)
    left = torch.randint(width - size + 1, (n,), generator=generator).to(images.device)
    span = torch.arange(size, device=images.device)
    rows = (top.view(-1, 1) + span).view(n, 1, size, 1).expand(n, channels, size, width)
    cols = (left.view(-1, 1) + span).view(n, 1, 1, size).expand(n, channels, size, size)
    return images.gather(2, rows).gather(3, cols)


class SvhnSequences(NamedTuple):
    """What :func:`load_svhn_sequences` returns.

    images: uint8 ``(N, 3, crop, crop)`` RGB crops around each house number.
    targets: int64 ``(N, max_digits + 1)``: digits, end token 10, padding -1.
    names: the N PNG file names, in the same order.
    """

    images: Tensor
    targets: Tensor
    names: list[str]


def _load_crop(folder: Path, digit_struct: Path, entry: DigitStructEntry, expand: float, size: int) -> np.ndarray:
    image_path = folder / entry.name
    if not image_path.is_file():
        raise FileNotFoundError(f"SVHN image {image_path} listed in {digit_struct} not found")
    try:
        with Image.open(image_path) as image:
            return crop_union_box(image.convert("RGB"), entry.union_box, expand=expand, size=size)
    except ValueError as err:
        raise SvhnFormatError(f"{image_path} (from {digit_struct}): {err}") from err
    except OSError as err:
        raise SvhnFormatError(f"{image_path} (from {digit_struct}): not a readable image ({err})") from err


def load_svhn_sequences(
    folder: str | os.PathLike,
    *,
    max_digits: int = 5,
    limit: int | None = None,
    expand: float = _EXPAND,
    resize: int = _RESIZE,
    crop: int | None = _CROP,
    workers: int | None = None,
) -> SvhnSequences:
    """Load one format 1 split: ``folder/digitStruct.mat`` and the PNGs beside it.

    max_digits: images with more digits are dropped (Goodfellow et al. drop the few > 5; the train split has
        one 6-digit number); targets have ``max_digits + 1`` positions.
    limit: read only the first ``limit`` images of the file (before dropping), all when None.
    expand / resize / crop: the union box grows by ``expand`` and is resized to ``resize x resize``; the
        central ``crop x crop`` is kept (``None``: keep the whole ``resize x resize``).
    workers: threads decoding the PNGs (PIL releases the GIL), default ``min(8, cpu count)``.

    Returns :class:`SvhnSequences` ``(images, targets, names)``: uint8 ``(N, 3, crop, crop)``, int64
    ``(N, max_digits + 1)`` and the file names.
    """
    folder = Path(folder)
    digit_struct = folder / DIGIT_STRUCT
    entries = read_digit_struct(digit_struct, limit=limit)
    kept = [e for e in entries if len(e.labels) <= max_digits]
    if len(kept) < len(entries):
        log.info("%s: dropped %d images with more than %d digits", digit_struct, len(entries) - len(kept), max_digits)
    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        crops = list(pool.map(lambda e: _load_crop(folder, digit_struct, e, expand, resize), kept))
    stacked = np.stack(crops) if crops else np.zeros((0, resize, resize, 3), dtype=np.uint8)
    images = torch.from_numpy(stacked).permute(0, 3, 1, 2)  # (N, H, W, 3) -> (N, 3, H, W)
    if crop is not None:
        images = center_crop(images, crop)
    targets = encode_sequences([e.labels.tolist() for e in kept], max_digits)
    return SvhnSequences(images.contiguous(), targets, [e.name for e in kept])


# ----------------------------------------------------------------------------------------------- datasets


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


def _head(dataset: ArrayDataset, count: int) -> ArrayDataset:
    """The first ``count`` examples when ``count > 0``, else the whole dataset."""
    return dataset.subset(torch.arange(min(count, len(dataset)))) if count > 0 else dataset


def _cat(parts: Sequence[ArrayDataset]) -> ArrayDataset:
    return ArrayDataset(torch.cat([p.images for p in parts]), torch.cat([p.targets for p in parts]))


@register_dataset("svhn_cropped")
def build_svhn_cropped(cfg: Any, data_dir: Path | None) -> DataSplits:
    """SVHN cropped digits, 3x32x32 uint8, 10 classes.

    Validation: ``cfg.val_size`` images of ``train_32x32.mat`` held out by ``train_val_split(N, val_size,
    seed)``; test: ``test_32x32.mat``; ``cfg.svhn_extra`` appends ``extra_32x32.mat`` to training.
    ``cfg.num_train > 0`` keeps the first ``num_train`` training images, ``cfg.num_test > 0`` the first
    ``num_test`` of val and test.
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG.format(name="svhn_cropped", what=", ".join(CROPPED_FILES.values())))
    images, labels = load_svhn_cropped(data_dir, "train")
    train_idx, val_idx = train_val_split(len(images), int(_option(cfg, "val_size", 6000)), int(_option(cfg, "seed", 0)))
    train = ArrayDataset(images[train_idx], labels[train_idx])
    val = ArrayDataset(images[val_idx], labels[val_idx])
    if bool(_option(cfg, "svhn_extra", False)):
        train = _cat([train, ArrayDataset(*load_svhn_cropped(data_dir, "extra"))])
    test = ArrayDataset(*load_svhn_cropped(data_dir, "test"))
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    return DataSplits(_head(train, num_train), _head(val, num_test), _head(test, num_test), 10, name="svhn_cropped")


@register_dataset("svhn_sequences")
def build_svhn_sequences(cfg: Any, data_dir: Path | None) -> DataSplits:
    """SVHN house numbers (format 1), 3x54x54 uint8 centre crops, 11 classes (digits + end token 10).

    ``train/`` and ``test/`` folders (each with ``digitStruct.mat`` and PNGs) under ``data_dir`` or
    ``data_dir/svhn``; ``cfg.svhn_extra`` appends ``extra/`` to training. Validation: ``cfg.val_size`` images
    of ``train`` held out by ``train_val_split``. Numbers with more than ``cfg.max_digits`` (5) digits are
    dropped. Targets: int64 ``(N, max_digits + 1)``. Smoke runs: ``cfg.num_train > 0`` reads only the first
    ``num_train + val_size`` train images (and no extra), ``cfg.num_test > 0`` caps val and reads only the first
    ``num_test`` test images.
    """
    if data_dir is None:
        raise ValueError(
            _MISSING_DIR_MSG.format(name="svhn_sequences", what=f"train/{DIGIT_STRUCT}, test/{DIGIT_STRUCT}")
        )
    max_digits = int(_option(cfg, "max_digits", 5))
    val_size, seed = int(_option(cfg, "val_size", 6000)), int(_option(cfg, "seed", 0))
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))

    def load(split: str, limit: int | None) -> ArrayDataset:
        folder = find_svhn_file(data_dir, f"{split}/{DIGIT_STRUCT}").parent
        images, targets, _ = load_svhn_sequences(folder, max_digits=max_digits, limit=limit)
        return ArrayDataset(images, targets)

    full = load("train", num_train + val_size if num_train > 0 else None)
    train_idx, val_idx = train_val_split(len(full), val_size, seed)
    train, val = full.subset(train_idx), full.subset(val_idx)
    if bool(_option(cfg, "svhn_extra", False)) and num_train == 0:
        train = _cat([train, load("extra", None)])
    test = load("test", num_test if num_test > 0 else None)
    return DataSplits(
        _head(train, num_train), _head(val, num_test), test, num_classes=END_TOKEN + 1, name="svhn_sequences"
    )
