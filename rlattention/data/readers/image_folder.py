"""``image_folder``: classification from a user's class folders, ``ROOT/train/<class>/<image>`` (+ optional
``val/`` and ``test/`` folders of the same classes) or ``ROOT/<class>/<image>`` (validation and test carved from
it). The rules every folder reader follows (images, channels, order, splits, caps, errors) are in
:mod:`rlattention.data.readers.folders`; ``docs/own-data.md`` shows the layout with the config that trains on it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from rlattention.data import limits
from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.limits import check_count
from rlattention.data.readers.folders import (
    SPLITS,
    FolderFormatError,
    _carve,
    _channels_option,
    _decode,
    _head,
    _ignored,
    _image_size,
    _is_image,
    _option,
    _root,
    _suffixes,
    _to_channels,
    read_folder_options,
)
from rlattention.data.registry import register_dataset

__all__ = ["build_image_folder"]


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
