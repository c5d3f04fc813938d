"""MS-COCO (Lin et al., 2014) instances read as distributed, for multi-label image recognition: the ``coco``
dataset.

Layout of a COCO folder (the official ``annotations_trainval2017.zip`` and ``train2017.zip`` /
``val2017.zip`` extracted side by side; the shared 128-image subset ``coco_train2017_subset128`` has the
same layout with ``train2017`` only)::

    annotations/instances_train2017.json   annotations/instances_val2017.json   (optional)
    train2017/<file_name>                  val2017/<file_name>

An instances json is an object with (among others) the lists ``images`` (each with ``id`` and
``file_name``), ``annotations`` (each with ``image_id`` and ``category_id``; boxes and masks are not used
here) and ``categories`` (each with ``id`` and ``name``).

Labels: an image's label set is the set of categories of its annotations (crowd annotations included). The
categories are mapped to contiguous class ids ``0..K-1`` in increasing order of their COCO category id
(COCO ids run 1..90 with gaps; the 80 instance categories become 0..79, ``person`` = 0 and ``toothbrush``
= 79). Targets are float32 multi-hot ``(N, K)`` in ``{0, 1}`` (COCO has no 'difficult' flag, so no ``-1``).
Images without any annotation are kept, with an all-zero target; they
count as negatives for every class (the 128-image subset has two: ids 250 and 508). Images are ordered by
image id.

Images are resized to ``image_size x image_size`` RGB uint8 ``(N, 3, S, S)`` and held in memory: about
0.6 GB per 4,000 images at 224, so the full train2017 (118k images) needs ``num_train`` or a smaller
``image_size`` on most machines. Nothing is cached on disk.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlattention.data import limits
from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.limits import check_count, check_name_inside, check_side
from rlattention.data.photos import holdout_split, load_resized_images
from rlattention.data.registry import register_dataset
from rlattention.data.splits import split_seed, train_val_split

__all__ = [
    "COCO_SPLITS",
    "CocoFormatError",
    "CocoInstances",
    "build_coco",
    "cv_fold_split",
    "find_coco_dir",
    "instances_path",
    "load_coco",
    "read_coco_instances",
]

#: Instances splits with public annotations: training and validation (the papers' test set).
COCO_SPLITS: tuple[str, ...] = ("train2017", "val2017")

_MISSING_DIR_MSG = (
    "coco needs the COCO instances files: pass --data-dir or set RLATTENTION_DATA (a folder holding "
    "annotations/instances_train2017.json and train2017/, e.g. ../shared/data/coco_train2017_subset128)"
)


class CocoFormatError(ValueError):
    """A malformed COCO json file; the message names the file, the missing or wrong key and the entry."""


class CocoInstances(NamedTuple):
    """The labels of one instances json: images ordered by id, classes ordered by category id."""

    image_ids: list[int]
    file_names: list[str]
    targets: Tensor  # (N, K) float32 multi-hot
    category_ids: list[int]  # class id k -> COCO category id
    category_names: list[str]  # class id k -> category name


def instances_path(coco_dir: str | os.PathLike, split: str) -> Path:
    """``coco_dir/annotations/instances_<split>.json``."""
    return Path(coco_dir) / "annotations" / f"instances_{split}.json"


def _search_dirs(root: Path) -> list[Path]:
    return [root] + [root / name for name in ("coco", "COCO", "coco2017", "coco_train2017_subset128")]


def find_coco_dir(root: str | os.PathLike, split: str = "train2017") -> Path:
    """The COCO folder under ``root``: ``root`` itself or ``root/{coco, COCO, coco2017,
    coco_train2017_subset128}``, the first holding ``annotations/instances_<split>.json``. Raises
    ``FileNotFoundError`` naming the expected file and every folder searched."""
    root = Path(root).expanduser()
    folders = _search_dirs(root)
    for folder in folders:
        if instances_path(folder, split).is_file():
            return folder
    raise FileNotFoundError(
        f"COCO instances file not found: expected annotations/instances_{split}.json (and the images in "
        f"{split}/) in one of: {', '.join(str(f) for f in folders)}"
    )


def _entries(data: dict, key: str, fields: tuple[str, ...], path: Path) -> list[dict]:
    """``data[key]``, checked to be a list of objects that all hold ``fields``."""
    if key not in data:
        raise CocoFormatError(
            f"{path}: missing top-level key {key!r} (an instances json has images, annotations and categories)"
        )
    entries = data[key]
    if not isinstance(entries, list):
        raise CocoFormatError(f"{path}: {key!r} must be a list, found {type(entries).__name__}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise CocoFormatError(f"{path}: {key}[{i}] must be an object, found {type(entry).__name__}")
        for field in fields:
            if field not in entry:
                raise CocoFormatError(f"{path}: {key}[{i}] has no key {field!r} (expected keys {list(fields)})")
    return entries


def _unique_ids(entries: list[dict], key: str, path: Path) -> list[int]:
    """The integer ``id`` of every entry of ``key``, checked to be distinct."""
    ids = []
    for i, entry in enumerate(entries):
        value = entry["id"]
        if not isinstance(value, int) or isinstance(value, bool):
            raise CocoFormatError(f"{path}: {key}[{i}]['id'] must be an integer, found {value!r}")
        ids.append(value)
    duplicates = sorted(v for v, count in Counter(ids).items() if count > 1)
    if duplicates:
        raise CocoFormatError(f"{path}: {key} ids appear more than once: {duplicates[:10]}")
    return ids


def read_coco_instances(path: str | os.PathLike) -> CocoInstances:
    """Read the image-level labels of one instances json (see the module docstring).

    Raises ``FileNotFoundError`` if the file is missing and :class:`CocoFormatError` naming the file for
    invalid json, a missing key (top-level ``images`` / ``annotations`` / ``categories``, an image's ``id`` /
    ``file_name``, an annotation's ``image_id`` / ``category_id``, a category's ``id`` / ``name``), duplicate
    ids, or an annotation that refers to an unknown image or category.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"COCO instances file not found: {path}")
    limits.check_file_size(path, limits.MAX_JSON_BYTES, "instances json", CocoFormatError)
    try:
        with path.open("rb") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CocoFormatError(f"{path}: not valid json ({err})") from err
    except RecursionError:
        raise CocoFormatError(f"{path}: not valid instances json (nested too deeply to parse)") from None
    if not isinstance(data, dict):
        raise CocoFormatError(f"{path}: expected a json object at the top level, found {type(data).__name__}")
    images = _entries(data, "images", ("id", "file_name"), path)
    annotations = _entries(data, "annotations", ("image_id", "category_id"), path)
    categories = _entries(data, "categories", ("id", "name"), path)
    if not categories:
        raise CocoFormatError(f"{path}: 'categories' is empty")
    check_count(str(path), "categories", len(categories), limits.MAX_CATEGORIES, CocoFormatError)
    check_count(str(path), "images", len(images), limits.MAX_IMAGES, CocoFormatError)
    check_count(
        str(path),
        f"target entries ({len(images):,} images x {len(categories):,} categories)",
        len(images) * len(categories),
        limits.MAX_TARGET_ELEMENTS,
        CocoFormatError,
    )

    category_ids = sorted(_unique_ids(categories, "categories", path))
    names_by_id = {c["id"]: str(c["name"]) for c in categories}
    class_of = {cat_id: k for k, cat_id in enumerate(category_ids)}
    _unique_ids(images, "images", path)
    images = sorted(images, key=lambda im: im["id"])
    image_ids = [im["id"] for im in images]
    row_of = {image_id: n for n, image_id in enumerate(image_ids)}

    rows, cols = [], []
    for i, ann in enumerate(annotations):
        image_id, category_id = ann["image_id"], ann["category_id"]
        if isinstance(image_id, list | dict) or image_id not in row_of:  # a json list/dict is unhashable
            raise CocoFormatError(f"{path}: annotations[{i}] refers to image_id {image_id!r}, not in 'images'")
        if isinstance(category_id, list | dict) or category_id not in class_of:
            raise CocoFormatError(
                f"{path}: annotations[{i}] refers to category_id {category_id!r}, not in 'categories'"
            )
        rows.append(row_of[image_id])
        cols.append(class_of[category_id])
    targets = torch.zeros(len(image_ids), len(category_ids), dtype=torch.float32)
    targets[torch.tensor(rows, dtype=torch.int64), torch.tensor(cols, dtype=torch.int64)] = 1.0
    return CocoInstances(
        image_ids=image_ids,
        file_names=[
            check_name_inside(str(path), f"images[{i}].file_name", im["file_name"], CocoFormatError)
            for i, im in enumerate(images)
        ],
        targets=targets,
        category_ids=category_ids,
        category_names=[names_by_id[c] for c in category_ids],
    )


def _image_paths(coco_dir: Path, split: str, file_names: list[str]) -> list[Path]:
    folder = coco_dir / split
    if not folder.is_dir():
        raise FileNotFoundError(f"COCO image folder not found: {folder} (expected {split}/<file_name> images)")
    return [folder / name for name in file_names]


def load_coco(
    root: str | os.PathLike,
    split: str = "train2017",
    image_size: int = 224,
    limit: int = 0,
) -> tuple[Tensor, Tensor, CocoInstances]:
    """Load one COCO split: ``(images uint8 (N, 3, S, S), targets float32 (N, K), instances)``.

    root: the COCO folder or a parent of it (see :func:`find_coco_dir`).
    split: ``"train2017"`` or ``"val2017"`` (any ``instances_<split>.json`` with a ``<split>/`` folder works).
    limit: load only the first ``limit`` images (by image id) when > 0.
    """
    coco_dir = find_coco_dir(root, split)
    instances = read_coco_instances(instances_path(coco_dir, split))
    count = limit if limit > 0 else len(instances.image_ids)
    paths = _image_paths(coco_dir, split, instances.file_names[:count])
    return load_resized_images(paths, image_size), instances.targets[:count], instances


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


def _head(index: Tensor, count: int) -> Tensor:
    return index[:count] if count > 0 else index


def cv_fold_split(n: int, folds: int, fold: int, seed: int, source: str = "the dataset") -> tuple[Tensor, Tensor]:
    """``(rest_idx, test_idx)`` of fold ``fold`` of ``folds``-fold cross-validation over ``range(n)``.

    ``range(n)`` is permuted once, seeded by ``split_seed(seed, "cv")`` (the same permutation for every
    ``fold``), and cut into ``folds`` contiguous parts whose sizes differ by at most one; part ``fold`` is
    ``test_idx``, the others are ``rest_idx`` (both int64, sorted ascending). Over ``fold = 0..folds-1`` the test
    parts are disjoint and cover ``range(n)``. Raises ``ValueError`` naming ``data.cv_folds`` /
    ``data.cv_fold`` and the bad value for ``folds < 2``, ``folds > n`` or ``fold`` outside ``0..folds-1``.
    """
    if folds < 2:
        raise ValueError(f"data.cv_folds={folds}: cross-validation needs at least 2 folds (0 turns it off)")
    if folds > n:
        raise ValueError(f"data.cv_folds={folds}: more folds than the {n} image(s) of {source}")
    if not 0 <= fold < folds:
        raise ValueError(f"data.cv_fold={fold} must be in 0..{folds - 1} (data.cv_folds={folds})")
    generator = torch.Generator().manual_seed(split_seed(seed, "cv"))
    parts = torch.tensor_split(torch.randperm(n, generator=generator), folds)
    test_idx = parts[fold].sort().values
    rest_idx = torch.cat([p for k, p in enumerate(parts) if k != fold]).sort().values
    return rest_idx, test_idx


def _fraction_test_split(cfg: Any, n: int, seed: int, train_json: Path) -> tuple[Tensor, Tensor]:
    """``(rest, test)`` indices of the ``n`` train2017 images: a seeded ``cfg.test_fraction`` of them is the test
    split (train2017 only, no folds)."""
    fraction = float(_option(cfg, "test_fraction", 0.25))
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {fraction}")
    num_held = min(max(1, round(n * fraction)), n - 1) if n > 1 else 0
    if num_held == 0:
        raise ValueError(f"{train_json}: {n} image(s) cannot be split into train and test")
    return train_val_split(n, num_held, split_seed(seed, "test"))


@register_dataset("coco")
def build_coco(cfg: Any, data_dir: Path | None) -> DataSplits:
    """COCO multi-label recognition, K = 80 classes (the categories of the json), multi-hot targets.

    With ``annotations/instances_val2017.json`` present: train / val come from train2017 by
    :func:`rlattention.data.photos.holdout_split` (``cfg.val_size`` held out, seeded by ``cfg.seed``; 0 =
    train on all of it with an overlapping 10 % monitoring split) and test is val2017, as in the papers
    (COCO's test labels are not public). With train2017 only (the shared 128-image subset): a seeded
    ``cfg.test_fraction`` (default 0.25) of its images is the test split and the rest is split into train /
    val the same way. ``cfg.image_size`` (default 224) is the square image side; ``cfg.num_train > 0`` keeps
    the first ``num_train`` training images and ``cfg.num_test > 0`` the first ``num_test`` of val and test
    (only those images are decoded).

    Cross-validation (train2017 only): ``cfg.cv_folds = k > 0`` (default 0, off) with ``cfg.cv_fold`` in
    ``0..k-1`` makes part ``cv_fold`` of :func:`cv_fold_split` (one seeded permutation of the images that does
    not depend on the fold, cut into ``k`` near-equal contiguous parts) the test split; over the ``k`` folds
    every image is tested exactly once. The other images are split into train / val as above (``val_size``,
    seeded by ``cfg.seed``). ``cfg.test_fraction`` is ignored when folds are on. Folds with a val2017 present
    are refused (val2017 is then the test split).
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG)
    coco_dir = find_coco_dir(data_dir, "train2017")
    size = int(_option(cfg, "image_size", 224))
    check_side("data.image_size", size)
    seed = int(_option(cfg, "seed", 0))
    val_size = int(_option(cfg, "val_size", 0))
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    train_json = instances_path(coco_dir, "train2017")
    train = read_coco_instances(train_json)
    n = len(train.image_ids)
    train_paths = _image_paths(coco_dir, "train2017", train.file_names)

    cv_folds, cv_fold = int(_option(cfg, "cv_folds", 0)), int(_option(cfg, "cv_fold", 0))
    if cv_folds < 0:
        raise ValueError(f"data.cv_folds={cv_folds} must be >= 2 (k-fold cross-validation) or 0 (off)")
    val_json = instances_path(coco_dir, "val2017")
    if cv_folds > 0 and val_json.is_file():
        raise ValueError(
            f"data.cv_folds={cv_folds}: cross-validation folds apply to a train2017-only folder (such as the "
            f"128-image subset), but {val_json} is present and its images are the test split; set data.cv_folds=0"
        )
    if cv_folds > 0:
        rest, test_idx = cv_fold_split(n, cv_folds, cv_fold, seed, source=str(train_json))
        test_paths = [train_paths[i] for i in test_idx.tolist()]
        test_targets = train.targets[test_idx]
    elif cv_fold != 0:
        raise ValueError(f"data.cv_fold={cv_fold} needs data.cv_folds > 0 (cross-validation is off: cv_folds=0)")
    elif val_json.is_file():
        test = read_coco_instances(val_json)
        if test.category_ids != train.category_ids:
            raise CocoFormatError(
                f"{val_json}: its categories differ from those of {train_json}; both must list the same categories"
            )
        test_paths, test_targets = _image_paths(coco_dir, "val2017", test.file_names), test.targets
        rest = torch.arange(n)
    else:
        rest, test_idx = _fraction_test_split(cfg, n, seed, train_json)
        test_paths = [train_paths[i] for i in test_idx.tolist()]
        test_targets = train.targets[test_idx]
    train_idx, val_idx = holdout_split(len(rest), val_size, seed, f"{train_json} (train + val part)")
    train_idx, val_idx = _head(rest[train_idx], num_train), _head(rest[val_idx], num_test)
    if num_test > 0:
        test_paths, test_targets = test_paths[:num_test], test_targets[:num_test]

    def dataset(paths: list[Path], targets: Tensor) -> ArrayDataset:
        return ArrayDataset(load_resized_images(paths, size), targets)

    return DataSplits(
        dataset([train_paths[i] for i in train_idx.tolist()], train.targets[train_idx]),
        dataset([train_paths[i] for i in val_idx.tolist()], train.targets[val_idx]),
        dataset(test_paths, test_targets),
        num_classes=len(train.category_ids),
        name="coco",
    )
