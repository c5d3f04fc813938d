"""CIFAR-10 (Krizhevsky, 2009) read from its python pickles: the ``cifar10`` dataset.

The distributed ``cifar-10-python.tar.gz`` extracts to ``cifar-10-batches-py/`` holding ``data_batch_1`` ..
``data_batch_5`` (10000 training images each), ``test_batch`` (10000) and ``batches.meta``. Each batch is a
Python 2 pickle of a dict with byte-string keys: ``b"data"`` uint8 ``(10000, 3072)`` (each row the 1024 red,
then green, then blue values of a 32x32 image, row-major), ``b"labels"`` a list of ints 0..9, plus
``b"batch_label"`` and ``b"filenames"``. ``batches.meta`` holds ``b"label_names"``.

A pickle can run arbitrary code when loaded, so the files are read with the restricted unpickler of
:mod:`rlattention.data.safe_pickle`, which only resolves the globals a numpy array needs (``_reconstruct``,
``ndarray``, ``dtype``) and refuses any other (:class:`UnsafePickleError`). Nothing is cached on disk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlattention.data import safe_pickle
from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.registry import register_dataset
from rlattention.data.safe_pickle import PickleReadError, load_restricted_pickle
from rlattention.data.splits import train_val_split

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10_DIR",
    "META_FILE",
    "TEST_BATCH",
    "TRAIN_BATCHES",
    "CifarFormatError",
    "UnsafePickleError",
    "build_cifar10",
    "find_cifar10_dir",
    "load_cifar10",
    "read_cifar_batch",
    "read_cifar_meta",
    "read_cifar_pickle",
]

#: Folder that ``cifar-10-python.tar.gz`` extracts to.
CIFAR10_DIR = "cifar-10-batches-py"
TRAIN_BATCHES: tuple[str, ...] = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META_FILE = "batches.meta"
#: ``label_names`` of ``batches.meta``, in label order.
CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

_BATCH_SIZE = 10000
_SIDE = 32
_ROW = 3 * _SIDE * _SIDE  # 3072 values per image
_NUM_CLASSES = 10
_MISSING_DIR_MSG = (
    f"cifar10 needs the CIFAR-10 python batches: pass --data-dir or set RLATTENTION_DATA (a folder holding "
    f"{CIFAR10_DIR}/ or its files)"
)


class CifarFormatError(ValueError):
    """A malformed CIFAR file; the message names the file, what was expected and what was found."""


class UnsafePickleError(safe_pickle.UnsafePickleError, CifarFormatError):
    """A pickle that references a global other than the numpy array reconstruction ones (both a
    :class:`rlattention.data.safe_pickle.UnsafePickleError` and a :class:`CifarFormatError`)."""


def _text(value: Any) -> Any:
    """Bytes -> str (latin-1, lossless); anything else unchanged."""
    return value.decode("latin-1") if isinstance(value, bytes) else value


def read_cifar_pickle(path: str | os.PathLike) -> dict[str, Any]:
    """Load one CIFAR pickle safely (see :class:`UnsafePickleError`); top-level byte keys become str.

    Returns the dict, e.g. ``{"data": ndarray, "labels": [...], "batch_label": b"...", "filenames": [...]}``
    (values keep the bytes of the Python 2 file). Raises ``FileNotFoundError`` if the file is missing,
    :class:`UnsafePickleError` for a refused global and :class:`CifarFormatError` for a truncated or corrupt
    pickle or one whose top level is not a dict.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR file not found: {path}")
    try:
        obj = load_restricted_pickle(
            path, "CIFAR pickle", encoding="bytes", hint="re-download or re-extract cifar-10-python.tar.gz"
        )
    except safe_pickle.UnsafePickleError as err:
        raise UnsafePickleError(str(err)) from None
    except PickleReadError as err:
        raise CifarFormatError(str(err)) from err
    if not isinstance(obj, dict):
        raise CifarFormatError(f"{path}: expected a pickled dict, found {type(obj).__name__}")
    return {_text(key): value for key, value in obj.items()}


def read_cifar_batch(path: str | os.PathLike, expect_count: int | None = _BATCH_SIZE) -> tuple[Tensor, Tensor]:
    """Read one CIFAR-10 batch file (``data_batch_i`` or ``test_batch``).

    expect_count: the number of images the batch must hold (10000 in the real files); ``None`` accepts any.
    Returns ``images`` uint8 ``(N, 3, 32, 32)`` (RGB, 0..255) and ``labels`` int64 ``(N,)`` in 0..9. Raises
    :class:`CifarFormatError` naming the file for missing keys, a ``data`` array that is not uint8
    ``(N, 3072)``, a wrong count, a label count mismatch or labels outside 0..9.
    """
    path = Path(path)
    batch = read_cifar_pickle(path)
    missing = [key for key in ("data", "labels") if key not in batch]
    if missing:
        hint = " (fine_labels: a CIFAR-100 file?)" if "fine_labels" in batch else ""
        raise CifarFormatError(
            f"{path}: missing key(s) {missing}; expected data and labels, found {sorted(batch)}{hint}"
        )
    data = batch["data"]
    expected_rows = "N" if expect_count is None else str(expect_count)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _ROW:
        found = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise CifarFormatError(f"{path}: data must be uint8 ({expected_rows}, {_ROW}), found {found}")
    if expect_count is not None and len(data) != expect_count:
        raise CifarFormatError(
            f"{path}: data must hold {expect_count} images ({expect_count}, {_ROW}), found {data.shape}"
        )
    try:
        labels = np.asarray(batch["labels"])
    except (TypeError, ValueError) as err:
        raise CifarFormatError(
            f"{path}: labels must be a list of ints, found {type(batch['labels']).__name__}"
        ) from err
    if labels.ndim != 1 or labels.dtype.kind not in "ui":
        raise CifarFormatError(f"{path}: labels must be a list of ints, found {labels.dtype} {labels.shape}")
    if len(labels) != len(data):
        raise CifarFormatError(f"{path}: {len(data)} images but {len(labels)} labels")
    bad = (labels < 0) | (labels >= _NUM_CLASSES)
    if bad.any():
        index = int(np.argmax(bad))
        raise CifarFormatError(
            f"{path}: labels must be in 0..{_NUM_CLASSES - 1}, found {labels[index]} at index {index}"
        )
    images = np.ascontiguousarray(data).reshape(len(data), 3, _SIDE, _SIDE)
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))


def read_cifar_meta(path: str | os.PathLike) -> list[str]:
    """The class names of ``batches.meta`` (``label_names``, 10 strings, in label order)."""
    path = Path(path)
    meta = read_cifar_pickle(path)
    names = meta.get("label_names")
    if not isinstance(names, list | tuple) or len(names) != _NUM_CLASSES:
        found = f"{type(names).__name__} of {len(names)}" if isinstance(names, list | tuple) else repr(names)[:80]
        raise CifarFormatError(f"{path}: label_names must be a list of {_NUM_CLASSES} names, found {found}")
    return [str(_text(name)) for name in names]


def find_cifar10_dir(root: str | os.PathLike) -> Path:
    """The folder holding the batches: ``root``, ``root/cifar-10-batches-py`` or
    ``root/cifar10[/cifar-10-batches-py]``, the first with ``test_batch`` and all five ``data_batch_i``.
    Raises ``FileNotFoundError`` naming the expected files and every folder searched.
    """
    root = Path(root).expanduser()
    folders = [root, root / CIFAR10_DIR, root / "cifar10", root / "cifar10" / CIFAR10_DIR]
    for folder in folders:
        if all((folder / name).is_file() for name in (*TRAIN_BATCHES, TEST_BATCH)):
            return folder
    archives = [str(f / "cifar-10-python.tar.gz") for f in folders if (f / "cifar-10-python.tar.gz").is_file()]
    hint = f" (found {archives[0]}: extract it first)" if archives else ""
    raise FileNotFoundError(
        f"CIFAR-10 batches not found: need {', '.join(TRAIN_BATCHES)}, {TEST_BATCH} in one folder; "
        f"searched: {', '.join(str(f) for f in folders)}{hint}"
    )


def load_cifar10(root: str | os.PathLike, split: str, *, batch_size: int | None = _BATCH_SIZE) -> tuple[Tensor, Tensor]:
    """Load one CIFAR-10 split: ``"train"`` (the five data batches, 50000 images) or ``"test"`` (10000).

    root: see :func:`find_cifar10_dir`. batch_size: images per batch file (``None``: any).
    Returns uint8 ``(N, 3, 32, 32)`` and int64 ``(N,)`` labels 0..9.
    """
    if split not in ("train", "test"):
        raise ValueError(f"CIFAR-10 split must be 'train' or 'test', got {split!r}")
    folder = find_cifar10_dir(root)
    names = TRAIN_BATCHES if split == "train" else (TEST_BATCH,)
    parts = [read_cifar_batch(folder / name, expect_count=batch_size) for name in names]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


# ----------------------------------------------------------------------------------------------- dataset


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


def _head(dataset: ArrayDataset, count: int) -> ArrayDataset:
    """The first ``count`` examples when ``count > 0``, else the whole dataset."""
    return dataset.subset(torch.arange(min(count, len(dataset)))) if count > 0 else dataset


@register_dataset("cifar10")
def build_cifar10(cfg: Any, data_dir: Path | None) -> DataSplits:
    """CIFAR-10, 3x32x32 uint8 RGB, 10 classes. Validation: ``cfg.val_size`` of the 50000 training images held
    out by ``train_val_split(50000, val_size, seed)``; test: ``test_batch``. ``cfg.num_train > 0`` keeps the
    first ``num_train`` training images, ``cfg.num_test > 0`` the first ``num_test`` of val and test.
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG)
    images, labels = load_cifar10(data_dir, "train", batch_size=_BATCH_SIZE)
    train_idx, val_idx = train_val_split(len(images), int(_option(cfg, "val_size", 6000)), int(_option(cfg, "seed", 0)))
    train = ArrayDataset(images[train_idx], labels[train_idx])
    val = ArrayDataset(images[val_idx], labels[val_idx])
    test = ArrayDataset(*load_cifar10(data_dir, "test", batch_size=_BATCH_SIZE))
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    return DataSplits(_head(train, num_train), _head(val, num_test), _head(test, num_test), _NUM_CLASSES, "cifar10")
