"""``reid_folder``: person re-id from a user's own folder, ``ROOT/train/`` and optionally ``ROOT/query/`` +
``ROOT/gallery/``, files named ``<pid>_c<cam>[_<anything>].<ext>``
(:func:`rlattention.data.readers.reid.parse_person_name`). The splits have the layout of ``market1501``
(:mod:`rlattention.data.readers.reid`); ``docs/own-data.md`` shows the layout with the config that trains on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rlattention.data import limits
from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.limits import check_count
from rlattention.data.readers.reid import (
    ROLE_GALLERY,
    ROLE_QUERY,
    ROLE_TRAIN,
    ReidFormatError,
    ReidImage,
    _first_ids,
    _held_out_ids,
    _load_files,
    _meta,
    _option,
    _query_first,
    _reid_size,
    _targets,
    list_reid_images,
    parse_person_name,
    split_query_gallery,
)
from rlattention.data.registry import register_dataset

__all__ = ["build_reid_folder"]
from rlattention.data.splits import split_seed, train_val_split

_REID_FOLDER_LAYOUT = "ROOT/train/<pid>_c<cam>_<...>.jpg, optional ROOT/query/ and ROOT/gallery/ with the same names"


class _TestSplit(NamedTuple):
    """The test rows of a reid folder: image paths, pids, camera ids and roles (queries first), the test identities,
    and every record read (for the camera count)."""

    paths: list[Path]
    pids: np.ndarray
    cams: np.ndarray
    roles: np.ndarray
    ids: np.ndarray
    all_recs: list[ReidImage]


def _folder_root(data_dir: Path | None) -> Path:
    if data_dir is None:
        raise ValueError(
            f"reid_folder reads a folder of your own: pass --data-dir or set RLATTENTION_DATA ({_REID_FOLDER_LAYOUT})"
        )
    root = Path(data_dir).expanduser()
    if not (root / "train").is_dir():
        raise FileNotFoundError(f"reid_folder: no train/ folder in {root} (expected {_REID_FOLDER_LAYOUT})")
    return root


def _has_query_gallery(root: Path) -> bool:
    """Whether ``root`` holds ``query/`` and ``gallery/`` (one without the other is an error)."""
    given = [(root / sub).is_dir() for sub in ("query", "gallery")]
    if any(given) and not all(given):
        there, missing = ("query", "gallery") if given[0] else ("gallery", "query")
        raise FileNotFoundError(f"{root}: has {there}/ but no {missing}/ (expected {_REID_FOLDER_LAYOUT})")
    return all(given)


def _query_gallery(rows: np.ndarray, rec_pids: np.ndarray, rec_cams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` reordered queries first, and their roles."""
    return _query_first(rows, split_query_gallery(rec_pids[rows], rec_cams[rows]))


def _given_test(root: Path, train_all: list[ReidImage], ids: np.ndarray, num_test: int) -> _TestSplit:
    """The test split as given: ``query/`` then ``gallery/``, as Market's."""
    query_all = list_reid_images(root / "query", parse_person_name)
    gallery_all = list_reid_images(root / "gallery", parse_person_name)
    check_count(
        str(root), "images", len(train_all) + len(query_all) + len(gallery_all), limits.MAX_IMAGES, ReidFormatError
    )
    queries = [r for r in query_all if r.pid > 0]
    if not queries:
        raise ReidFormatError(f"{root / 'query'}: no query images (person ids >= 1)")
    shared = set(ids.tolist()) & {r.pid for r in query_all + gallery_all if r.pid > 0}
    if shared:
        raise ReidFormatError(
            f"{root}: {len(shared)} identities (e.g. {min(shared)}) are in train/ and in query/ or gallery/; "
            "train and test identities must be disjoint"
        )
    test_ids = _first_ids(np.array(sorted({r.pid for r in queries}), dtype=np.int64), num_test)
    kept = set(test_ids.tolist())
    queries = [r for r in queries if r.pid in kept]
    gallery = gallery_all if num_test <= 0 else [r for r in gallery_all if r.pid in kept]
    test_recs = queries + gallery
    return _TestSplit(
        [r.path for r in test_recs],
        np.array([r.pid for r in test_recs], dtype=np.int64),
        np.array([r.camid for r in test_recs], dtype=np.int64),
        np.array([ROLE_QUERY] * len(queries) + [ROLE_GALLERY] * len(gallery), dtype=np.int64),
        test_ids,
        train_all + query_all + gallery_all,
    )


def _carved_test(
    cfg: Any, root: Path, train_all: list[ReidImage], train_recs: list[ReidImage], ids: np.ndarray, num_test: int
) -> tuple[_TestSplit, np.ndarray]:
    """Test identities carved from ``train/`` (before the validation identities): the test split and the
    identities left for training and validation."""
    fraction = float(_option(cfg, "test_fraction", 0.25))
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"data.test_fraction must be in (0, 1) to carve test identities, got {fraction}")
    if len(ids) < 2:
        raise ReidFormatError(f"{root / 'train'}: {len(ids)} identity cannot be split into train and test")
    held = min(max(1, round(len(ids) * fraction)), len(ids) - 1)
    keep, test_idx = train_val_split(len(ids), held, split_seed(int(_option(cfg, "seed", 0)), "test"))
    test_ids, ids = _first_ids(ids[test_idx.numpy()], num_test), ids[keep.numpy()]
    rec_pids = np.array([r.pid for r in train_recs], dtype=np.int64)
    rec_cams = np.array([r.camid for r in train_recs], dtype=np.int64)
    rows, roles = _query_gallery(np.flatnonzero(np.isin(rec_pids, test_ids)), rec_pids, rec_cams)
    paths = [train_recs[i].path for i in rows]
    return _TestSplit(paths, rec_pids[rows], rec_cams[rows], roles, test_ids, train_all), ids


@register_dataset("reid_folder")
def build_reid_folder(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Person re-id from a folder of one's own: ``train/`` and, optionally, ``query/`` + ``gallery/``, files named
    ``<pid>_c<cam>[_<anything>].<ext>`` (module docstring). The splits have ``market1501``'s layout; without
    ``query/`` and ``gallery/`` the test identities are a seeded ``test_fraction`` of the training identities.

    Config: ``reid_size``, ``reid_val_ids``, ``test_fraction``, ``seed``, ``num_train`` / ``num_test`` (first
    identities).
    """
    root = _folder_root(data_dir)
    size = _reid_size(cfg)
    given = _has_query_gallery(root)
    train_all = list_reid_images(root / "train", parse_person_name)
    check_count(str(root / "train"), "images", len(train_all), limits.MAX_IMAGES, ReidFormatError)
    train_recs = [r for r in train_all if r.pid > 0]
    if not train_recs:
        raise ReidFormatError(f"{root / 'train'}: no training images (person ids >= 1; expected {_REID_FOLDER_LAYOUT})")
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    ids = np.array(sorted({r.pid for r in train_recs}), dtype=np.int64)
    rec_pids = np.array([r.pid for r in train_recs], dtype=np.int64)
    rec_cams = np.array([r.camid for r in train_recs], dtype=np.int64)
    if given:
        test_split = _given_test(root, train_all, ids, num_test)
    else:
        test_split, ids = _carved_test(cfg, root, train_all, train_recs, ids, num_test)
    train_ids, val_ids, overlap = _held_out_ids(ids, cfg, str(root / "train"))
    train_ids, val_ids = _first_ids(train_ids, num_train), _first_ids(val_ids, num_test)
    train_rows = np.flatnonzero(np.isin(rec_pids, train_ids))
    val_rows, val_roles = _query_gallery(np.flatnonzero(np.isin(rec_pids, val_ids)), rec_pids, rec_cams)

    paths = [train_recs[i].path for i in train_rows] + [train_recs[i].path for i in val_rows] + test_split.paths
    images = _load_files(paths, size)
    n_train, n_val = len(train_rows), len(val_rows)
    relabel = np.searchsorted(train_ids, rec_pids[train_rows])  # train_ids is sorted
    train = ArrayDataset(
        images[:n_train], _targets(relabel, rec_cams[train_rows], np.full(n_train, ROLE_TRAIN, dtype=np.int64))
    )
    val = ArrayDataset(images[n_train : n_train + n_val], _targets(rec_pids[val_rows], rec_cams[val_rows], val_roles))
    test = ArrayDataset(images[n_train + n_val :], _targets(test_split.pids, test_split.cams, test_split.roles))
    meta = _meta(train, val, test, len(train_ids), len(val_ids), len(test_split.ids), overlap, 3)
    meta.update(num_cameras=max(r.camid for r in test_split.all_recs) + 1, folder=str(root))
    return DataSplits(train, val, test, num_classes=len(train_ids), name="reid_folder", meta=meta)
