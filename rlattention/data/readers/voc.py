"""Pascal VOC 2007 (Everingham et al., 2010) read as distributed, for multi-label image recognition: the
``voc2007`` dataset.

Layout: ``VOCdevkit/VOC2007/`` (what ``VOCtrainval_06-Nov-2007.tar`` and ``VOCtest_06-Nov-2007.tar``
extract to, merged) holding

* ``ImageSets/Main/trainval.txt`` and ``ImageSets/Main/test.txt``: one image id (e.g. ``000005``) per line;
* ``Annotations/<id>.xml``: ``<annotation>`` with one ``<object>`` per object, each with ``<name>`` (one of
  the 20 classes of :data:`VOC_CLASSES`) and ``<difficult>`` (0 or 1; missing means 0);
* ``JPEGImages/<id>.jpg``.

Targets are float32 ``(N, 20)`` with, per image and class, the VOC classification ground truth (the
``<class>_<split>.txt`` files of the devkit, re-encoded):

* ``1``: the class is present (at least one object of it not marked difficult);
* ``0``: the class is absent;
* ``-1``: the class is present only as difficult objects: ignored by the metrics
  (:mod:`rlattention.metrics.multilabel`), as the VOC protocol ignores them. (The devkit files use ``1``,
  ``-1`` and ``0`` for these three cases; the encoding here puts ``0`` on "absent" so that
  ``targets.clamp(min=0)`` is a multi-hot vector of the present classes.) A loss should skip ``-1``
  entries or treat them as present, as the method prefers.

Images are resized to ``image_size x image_size`` RGB uint8 ``(N, 3, S, S)`` and held in memory: about
1.5 GB for the 9,963 VOC07 images at 224 (``num_train`` / ``num_test`` load only the first images, for smoke
runs). Nothing is cached on disk.

The annotation files are parsed with :mod:`xml.etree.ElementTree`. They are local files, but a DOCTYPE or
ENTITY declaration (never present in VOC files) could still be used for entity-expansion ("billion laughs")
attacks, so any file containing one is refused before parsing.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.limits import check_name_inside, check_side
from rlattention.data.photos import holdout_split, load_resized_images
from rlattention.data.registry import register_dataset

__all__ = [
    "VOC_CLASSES",
    "VOC_SPLITS",
    "VocFormatError",
    "VocObject",
    "annotation_targets",
    "build_voc2007",
    "find_voc2007_dir",
    "load_voc2007",
    "parse_annotation",
    "read_image_set",
    "voc_targets",
]

#: The 20 VOC classes, in the devkit's order (class id = index).
VOC_CLASSES: tuple[str, ...] = (
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)
VOC_SPLITS: tuple[str, ...] = ("train", "val", "trainval", "test")

_CLASS_INDEX = {name: i for i, name in enumerate(VOC_CLASSES)}
_DECLARATION = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)
_MISSING_DIR_MSG = (
    "voc2007 needs the Pascal VOC 2007 files: pass --data-dir or set RLATTENTION_DATA (a folder holding "
    "VOCdevkit/VOC2007 with Annotations/, ImageSets/Main/ and JPEGImages/)"
)


class VocFormatError(ValueError):
    """A malformed VOC file; the message names the file, what was expected and what was found."""


class VocObject(NamedTuple):
    """One ``<object>`` of an annotation file."""

    name: str
    difficult: bool


def _search_dirs(root: Path) -> list[Path]:
    """Folders that may be the VOC2007 folder, given the folder passed by the user."""
    return [
        root,
        root / "VOC2007",
        root / "VOCdevkit" / "VOC2007",
        root / "voc2007",
        root / "voc2007" / "VOCdevkit" / "VOC2007",
        root / "voc2007" / "VOC2007",
    ]


def find_voc2007_dir(root: str | os.PathLike) -> Path:
    """The ``VOC2007`` folder under ``root``: ``root`` itself, ``root/VOC2007``, ``root/VOCdevkit/VOC2007``,
    or the same under ``root/voc2007``; the first that holds both ``Annotations/`` and ``ImageSets/Main/``.
    Raises ``FileNotFoundError`` naming the expected folders and every folder searched."""
    root = Path(root).expanduser()
    folders = _search_dirs(root)
    for folder in folders:
        if (folder / "Annotations").is_dir() and (folder / "ImageSets" / "Main").is_dir():
            return folder
    raise FileNotFoundError(
        "Pascal VOC 2007 folder not found: expected a VOC2007 folder holding Annotations/, ImageSets/Main/ and "
        f"JPEGImages/ (as extracted from VOCtrainval_06-Nov-2007.tar / VOCtest_06-Nov-2007.tar); searched: "
        f"{', '.join(str(f) for f in folders)}"
    )


def read_image_set(voc_dir: str | os.PathLike, split: str) -> list[str]:
    """The image ids listed in ``ImageSets/Main/<split>.txt`` (one per line, blank lines skipped)."""
    if split not in VOC_SPLITS:
        raise ValueError(f"VOC split must be one of {list(VOC_SPLITS)}, got {split!r}")
    path = Path(voc_dir) / "ImageSets" / "Main" / f"{split}.txt"
    if not path.is_file():
        raise FileNotFoundError(
            f"VOC image set file not found: {path} (expected one image id per line; the {split!r} list ships "
            f"with {'VOCtest_06-Nov-2007.tar' if split == 'test' else 'VOCtrainval_06-Nov-2007.tar'})"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise VocFormatError(
            f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); expected one image id per line"
        ) from None
    ids = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 1:
            raise VocFormatError(f"{path}:{lineno}: expected one image id per line, found {line.strip()!r}")
        ids.append(check_name_inside(f"{path}:{lineno}", "image id", fields[0], VocFormatError))
    if not ids:
        raise VocFormatError(f"{path}: no image ids (expected one image id per line)")
    return ids


def parse_annotation(path: str | os.PathLike) -> list[VocObject]:
    """The objects of one ``Annotations/<id>.xml`` file, in file order.

    Raises ``FileNotFoundError`` if the file is missing and :class:`VocFormatError` naming the file for: a
    DOCTYPE/ENTITY declaration (refused, see the module docstring), malformed XML, a root that is not
    ``<annotation>``, no ``<object>``, an object without ``<name>``, an unknown class name, or a
    ``<difficult>`` that is not 0 or 1.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"VOC annotation file not found: {path} (expected Annotations/<image id>.xml)")
    data = path.read_bytes()
    if _DECLARATION.search(data):
        raise VocFormatError(
            f"{path}: refused: the file contains a DOCTYPE/ENTITY declaration (VOC annotations have none, and "
            "entity declarations allow entity-expansion attacks)"
        )
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
        raise VocFormatError(f"{path}: malformed XML ({err})") from err
    if root.tag != "annotation":
        raise VocFormatError(f"{path}: expected the root element <annotation>, found <{root.tag}>")
    elements = root.findall("object")
    if not elements:
        raise VocFormatError(f"{path}: no <object> element (every VOC2007 annotation lists at least one object)")
    objects = []
    for i, element in enumerate(elements):
        name = (element.findtext("name") or "").strip()
        if not name:
            raise VocFormatError(f"{path}: <object> #{i} has no <name> (expected one of the 20 VOC classes)")
        if name not in _CLASS_INDEX:
            raise VocFormatError(
                f"{path}: <object> #{i} has unknown class name {name!r}; expected one of: {', '.join(VOC_CLASSES)}"
            )
        difficult_text = (element.findtext("difficult") or "0").strip()
        if difficult_text not in ("0", "1"):
            raise VocFormatError(f"{path}: <object> #{i} ({name}) has <difficult> {difficult_text!r}, expected 0 or 1")
        objects.append(VocObject(name, difficult_text == "1"))
    return objects


def annotation_targets(objects: list[VocObject]) -> Tensor:
    """``(20,)`` float32 target of one image: 1 present, 0 absent, -1 present only as difficult objects."""
    present = torch.zeros(len(VOC_CLASSES), dtype=torch.bool)
    difficult = torch.zeros(len(VOC_CLASSES), dtype=torch.bool)
    for obj in objects:
        (difficult if obj.difficult else present)[_CLASS_INDEX[obj.name]] = True
    target = present.float()
    target[difficult & ~present] = -1.0
    return target


def voc_targets(voc_dir: str | os.PathLike, ids: list[str]) -> Tensor:
    """``(len(ids), 20)`` float32 targets read from ``Annotations/<id>.xml`` (see :func:`annotation_targets`)."""
    annotations = Path(voc_dir) / "Annotations"
    rows = [annotation_targets(parse_annotation(annotations / f"{image_id}.xml")) for image_id in ids]
    return torch.stack(rows) if rows else torch.zeros(0, len(VOC_CLASSES))


def _image_paths(voc_dir: Path, ids: list[str]) -> list[Path]:
    folder = voc_dir / "JPEGImages"
    if not folder.is_dir():
        raise FileNotFoundError(f"VOC image folder not found: {folder} (expected JPEGImages/<image id>.jpg)")
    return [folder / f"{image_id}.jpg" for image_id in ids]


def load_voc2007(
    root: str | os.PathLike,
    split: str,
    image_size: int = 224,
    limit: int = 0,
) -> tuple[Tensor, Tensor, list[str]]:
    """Load one VOC2007 split.

    root: the VOC2007 folder or a parent of it (see :func:`find_voc2007_dir`).
    split: ``"trainval"``, ``"test"``, ``"train"`` or ``"val"`` (an ``ImageSets/Main`` list).
    image_size: side of the square the images are resized to.
    limit: load only the first ``limit`` images of the list when > 0.

    Returns ``(images uint8 (N, 3, S, S), targets float32 (N, 20) in {1, 0, -1}, ids)``.
    """
    voc_dir = find_voc2007_dir(root)
    ids = read_image_set(voc_dir, split)
    if limit > 0:
        ids = ids[:limit]
    targets = voc_targets(voc_dir, ids)
    images = load_resized_images(_image_paths(voc_dir, ids), image_size)
    return images, targets, ids


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


def _dataset(voc_dir: Path, ids: list[str], targets: Tensor, size: int) -> ArrayDataset:
    return ArrayDataset(load_resized_images(_image_paths(voc_dir, ids), size), targets)


def _head(index: Tensor, count: int) -> Tensor:
    return index[:count] if count > 0 else index


@register_dataset("voc2007")
def build_voc2007(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Pascal VOC 2007 multi-label recognition, 20 classes, targets in ``{1, 0, -1}`` (module docstring).

    train / val: ``trainval`` split by :func:`rlattention.data.photos.holdout_split`: ``cfg.val_size > 0``
    images held out (seeded by ``cfg.seed``) for validation, the rest for training; ``cfg.val_size == 0``
    trains on all of ``trainval`` (the paper's protocol) with an overlapping 10 % monitoring split.
    test: the ``test`` list. ``cfg.image_size`` (default 224) is the square image side; ``cfg.num_train > 0``
    keeps the first ``num_train`` training images and ``cfg.num_test > 0`` the first ``num_test`` of val and
    test (only those images are decoded).
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG)
    voc_dir = find_voc2007_dir(data_dir)
    size = int(_option(cfg, "image_size", 224))
    check_side("data.image_size", size)
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    trainval_ids = read_image_set(voc_dir, "trainval")
    test_ids = read_image_set(voc_dir, "test")
    trainval_targets = voc_targets(voc_dir, trainval_ids)
    train_idx, val_idx = holdout_split(
        len(trainval_ids), int(_option(cfg, "val_size", 0)), int(_option(cfg, "seed", 0)), f"{voc_dir} trainval"
    )
    train_idx, val_idx = _head(train_idx, num_train), _head(val_idx, num_test)
    if num_test > 0:
        test_ids = test_ids[:num_test]
    parts = [
        _dataset(voc_dir, [trainval_ids[i] for i in index.tolist()], trainval_targets[index], size)
        for index in (train_idx, val_idx)
    ]
    test = _dataset(voc_dir, test_ids, voc_targets(voc_dir, test_ids), size)
    return DataSplits(parts[0], parts[1], test, num_classes=len(VOC_CLASSES), name="voc2007")
