"""MNIST read from its IDX files (plain or ``.gz``); the ``mnist`` dataset (``cluttered_mnist``, its digits on
cluttered canvases: :mod:`rlattention.data.synthetic.cluttered`).

The IDX format (LeCun et al.): a 4-byte big-endian magic number ``0x0000TTDD`` (two zero bytes, a
type code ``TT``, the number of dimensions ``DD``), then ``DD`` big-endian uint32 sizes, then the
values in row-major order, big-endian. Nothing is cached on disk: the four files are read in place.
"""

from __future__ import annotations

import math
import os
import zlib
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from rlattention.data import limits
from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.limits import InputLimitError, gunzip_limited
from rlattention.data.registry import register_dataset
from rlattention.data.splits import train_val_split

__all__ = [
    "IDX_DTYPES",
    "MNIST_FILES",
    "IdxFormatError",
    "build_mnist",
    "find_mnist_files",
    "load_mnist",
    "mnist_splits",
    "read_idx",
]

#: IDX type code -> numpy dtype (big-endian as stored on disk).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

#: split -> (images file, labels file), as distributed; each may also carry a ``.gz`` suffix.
MNIST_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

_GZIP_MAGIC = b"\x1f\x8b"
_IMAGE_SIDE = 28
_NUM_CLASSES = 10
_MISSING_DIR_MSG = (
    "mnist needs the four MNIST idx files: pass --data-dir or set RLATTENTION_DATA (e.g. ../shared/data/mnist)"
)


class IdxFormatError(ValueError):
    """A malformed IDX file (or gzip wrapper); the message names the file, what was expected and found."""


# ----------------------------------------------------------------------------------------------- IDX reader


def _type_name(code: int) -> str:
    return IDX_DTYPES[code].name if code in IDX_DTYPES else "unknown type"


def _describe_magic(code: int, ndim: int) -> str:
    return f"0x{(code << 8) | ndim:08x} (idx{ndim}, {_type_name(code)})"


def _magic_hint(head: bytes) -> str:
    """A short guess at what a file with a wrong magic number really is ('' if no guess)."""
    lowered = head[:64].lstrip().lower()
    if lowered.startswith((b"<!doctype", b"<html", b"<?xml")):
        return " (the file looks like an HTML/XML page: a failed download?)"
    if head.startswith(b"PK"):
        return " (the file looks like a zip archive: extract it first)"
    if len(head) >= 4 and head[2] == 0 and head[3] == 0 and head[1] in IDX_DTYPES:
        return " (the header looks byte-swapped: IDX is big-endian)"
    return ""


def _decompress(path: Path, raw: bytes) -> bytes:
    try:
        return gunzip_limited(path, raw, IdxFormatError)
    except InputLimitError:
        raise
    except (OSError, EOFError, zlib.error) as err:
        raise IdxFormatError(
            f"{path}: corrupt gzip stream ({type(err).__name__}: {err}); expected a complete gzip file "
            f"({len(raw)} bytes read); re-download or re-extract it"
        ) from err


def _check_magic(path: Path, head: bytes, expect_code: int | None, expect_ndim: int | None) -> tuple[int, int]:
    """Validate the 4 magic bytes; returns ``(type code, ndim)``."""
    if len(head) < 4:
        raise IdxFormatError(f"{path}: file too short for an IDX header: expected >= 4 bytes, found {len(head)}")
    magic = int.from_bytes(head[:4], "big")
    code, ndim = head[2], head[3]
    if expect_code is not None and expect_ndim is not None:
        expected = f"expected {_describe_magic(expect_code, expect_ndim)}"
    elif expect_code is not None:
        expected = f"expected 0x0000{expect_code:02x}DD ({_type_name(expect_code)}, DD dimensions >= 1)"
    elif expect_ndim is not None:
        expected = f"expected 0x0000TT{expect_ndim:02x} (idx{expect_ndim}, TT an IDX type code)"
    else:
        codes = ", ".join(f"0x{c:02x} {dt.name}" for c, dt in IDX_DTYPES.items())
        expected = (
            f"expected 0x0000TTDD: two zero bytes, a type code TT among ({codes}) and the number of dimensions DD >= 1"
        )
    valid = head[0] == 0 and head[1] == 0 and code in IDX_DTYPES and ndim >= 1
    matches = (expect_code is None or code == expect_code) and (expect_ndim is None or ndim == expect_ndim)
    if not (valid and matches):
        found = _describe_magic(code, ndim) if head[0] == 0 and head[1] == 0 else f"0x{magic:08x}"
        raise IdxFormatError(f"{path}: wrong magic number {found}, {expected}{_magic_hint(head)}")
    return code, ndim


def _parse_idx(path: Path, data: bytes, expect_code: int | None, expect_ndim: int | None) -> np.ndarray:
    code, ndim = _check_magic(path, data[:64], expect_code, expect_ndim)
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IdxFormatError(f"{path}: truncated header: idx{ndim} needs {header} header bytes, found {len(data)}")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = IDX_DTYPES[code]
    expected = math.prod(dims) * dtype.itemsize
    found = len(data) - header
    if found != expected:
        what = "truncated payload" if found < expected else "trailing bytes after the payload"
        shape = "x".join(map(str, dims))
        raise IdxFormatError(
            f"{path}: {what}: header declares {shape} {dtype.name} = {expected} payload bytes, "
            f"found {found} ({found - expected:+d})"
        )
    array = np.frombuffer(data, dtype=dtype, count=math.prod(dims), offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)  # native byte order, writable


def read_idx(
    path: str | os.PathLike,
    *,
    expect_dtype: np.dtype | type | str | None = None,
    expect_ndim: int | None = None,
) -> np.ndarray:
    """Read one IDX file, gzip-compressed or not (detected by the gzip magic bytes, whatever the name).

    path: the file.
    expect_dtype / expect_ndim: if given, the magic number must declare exactly this type / this many
        dimensions (e.g. ``np.uint8`` and ``1`` for a label file); otherwise any valid IDX header is accepted.

    Returns an ndarray of the declared shape, in native byte order, writable (e.g. ``(60000, 28, 28)``
    uint8 for the MNIST training images). Raises :class:`IdxFormatError` for a corrupt gzip stream, a
    wrong magic number, or a payload that is shorter or longer than the declared dimensions.
    """
    path = Path(path)
    limits.check_file_size(path, limits.MAX_DECOMPRESSED_BYTES, "IDX file", IdxFormatError)
    raw = path.read_bytes()
    data = _decompress(path, raw) if raw[:2] == _GZIP_MAGIC else raw
    expect_code = None
    if expect_dtype is not None:
        wanted = np.dtype(expect_dtype)
        codes = [c for c, dt in IDX_DTYPES.items() if dt.newbyteorder("=") == wanted.newbyteorder("=")]
        if not codes:
            raise ValueError(f"expect_dtype {wanted} is not an IDX type; IDX types: {list(IDX_DTYPES.values())}")
        expect_code = codes[0]
    return _parse_idx(path, data, expect_code, expect_ndim)


# ----------------------------------------------------------------------------------------------- MNIST files


def _search_dirs(root: Path) -> list[Path]:
    """Folders that may hold the files: ``root``, ``root/mnist`` and torchvision's ``root/MNIST/raw``."""
    return [root, root / "mnist", root / "MNIST" / "raw"]


def _find_in(folder: Path, name: str) -> Path | None:
    """``folder/name`` if it exists, else ``folder/name.gz``, else None (the plain file is faster to read)."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def find_mnist_files(root: str | os.PathLike, split: Literal["train", "test"]) -> tuple[Path, Path]:
    """Locate ``(images file, labels file)`` of ``split`` under ``root`` (see :func:`load_mnist`).

    Both files are taken from the first searched folder that holds both. Raises ``FileNotFoundError``
    naming the four expected files and every folder searched.
    """
    if split not in MNIST_FILES:
        raise ValueError(f"MNIST split must be one of {sorted(MNIST_FILES)}, got {split!r}")
    root = Path(root).expanduser()
    folders = _search_dirs(root)
    for folder in folders:
        found = [_find_in(folder, name) for name in MNIST_FILES[split]]
        if all(found):
            return found[0], found[1]  # type: ignore[return-value]
    all_names = ", ".join(name for pair in MNIST_FILES.values() for name in pair)
    missing = ", ".join(f"{name}[.gz]" for name in MNIST_FILES[split])
    raise FileNotFoundError(
        f"MNIST {split} files not found: need {missing}. MNIST is the four files {all_names} "
        f"(each plain or .gz) in one folder; searched: {', '.join(str(f) for f in folders)}"
    )


def load_mnist(root: str | os.PathLike, split: Literal["train", "test"]) -> tuple[Tensor, Tensor]:
    """Load one MNIST split from its IDX files.

    root: the folder holding ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
        ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte`` (each plain or ``.gz``), or a parent
        folder with a ``mnist/`` (or torchvision ``MNIST/raw/``) subfolder holding them.
    split: ``"train"`` (60000 images) or ``"test"`` (the 10000 ``t10k`` images).

    Returns ``images`` uint8 ``(N, 1, 28, 28)`` in 0..255 and ``labels`` int64 ``(N,)`` in 0..9.
    Raises ``FileNotFoundError`` if a file is missing and :class:`IdxFormatError` if a file is not the
    expected IDX (idx3 28x28 uint8 images, idx1 uint8 labels in 0..9, equal counts).
    """
    images_path, labels_path = find_mnist_files(root, split)
    images = read_idx(images_path, expect_dtype=np.uint8, expect_ndim=3)
    if images.shape[1:] != (_IMAGE_SIDE, _IMAGE_SIDE):
        raise IdxFormatError(
            f"{images_path}: expected {_IMAGE_SIDE}x{_IMAGE_SIDE} images, found "
            f"{images.shape[1]}x{images.shape[2]} (shape {images.shape})"
        )
    labels = read_idx(labels_path, expect_dtype=np.uint8, expect_ndim=1)
    if len(images) != len(labels):
        raise IdxFormatError(
            f"image and label counts differ: {images_path} has {len(images)} images, "
            f"{labels_path} has {len(labels)} labels"
        )
    if labels.size and int(labels.max()) >= _NUM_CLASSES:
        bad = int(np.argmax(labels >= _NUM_CLASSES))
        raise IdxFormatError(
            f"{labels_path}: labels must be in 0..{_NUM_CLASSES - 1}, found {int(labels[bad])} at index {bad}"
        )
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels).long()


# ----------------------------------------------------------------------------------------------- datasets


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


def _head(dataset: ArrayDataset, count: int) -> ArrayDataset:
    """The first ``count`` examples when ``count > 0``, else the whole dataset."""
    return dataset.subset(torch.arange(min(count, len(dataset)))) if count > 0 else dataset


def mnist_splits(cfg: Any, data_dir: Path | None) -> tuple[ArrayDataset, ArrayDataset, ArrayDataset]:
    """Real MNIST ``(train, val, test)``: val is ``cfg.val_size`` training images held out with
    ``train_val_split(60000, cfg.val_size, cfg.seed)``; test is the t10k file. ``cfg.num_train > 0`` keeps
    the first ``num_train`` training images, ``cfg.num_test > 0`` the first ``num_test`` of val and test.
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG)
    images, labels = load_mnist(data_dir, "train")
    train_idx, val_idx = train_val_split(len(images), int(_option(cfg, "val_size", 6000)), int(_option(cfg, "seed", 0)))
    train = ArrayDataset(images[train_idx], labels[train_idx])
    val = ArrayDataset(images[val_idx], labels[val_idx])
    test = ArrayDataset(*load_mnist(data_dir, "test"))
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    return _head(train, num_train), _head(val, num_test), _head(test, num_test)


@register_dataset("mnist")
def build_mnist(cfg: Any, data_dir: Path | None) -> DataSplits:
    """MNIST, 1x28x28 uint8 images, 10 classes (see :func:`mnist_splits` for the splits)."""
    train, val, test = mnist_splits(cfg, data_dir)
    return DataSplits(train, val, test, num_classes=_NUM_CLASSES, name="mnist")
