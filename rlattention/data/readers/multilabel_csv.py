"""``multilabel_csv``: multi-label recognition from a user's labels file, ``ROOT/labels.csv`` or
``ROOT/labels.json`` with ``ROOT/images/<image>`` (+ optional ``ROOT/classes.txt``). The rules every folder reader
follows (images, channels, order, splits, caps, errors) are in :mod:`rlattention.data.readers.folders`;
``docs/own-data.md`` shows the layout with the config that trains on it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlattention.data import limits
from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.limits import check_count
from rlattention.data.readers.folders import (
    FolderFormatError,
    _channels_option,
    _decode,
    _image_path,
    _image_size,
    _images_dir,
    _Listed,
    _listed_splits,
    _one_of,
    _read_csv,
    _read_json,
    _read_text,
    _root,
    _sorted_records,
    _split_lists,
    _split_value,
    _to_channels,
    read_folder_options,
)
from rlattention.data.registry import register_dataset

__all__ = ["build_multilabel_csv"]

_LABEL_SEPARATOR = re.compile(r"[;|]")
_TARGET_VALUES = {"1": 1.0, "0": 0.0, "-1": -1.0}


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
