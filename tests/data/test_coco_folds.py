"""k-fold cross-validation of a train2017-only COCO folder (``data.cv_folds`` / ``data.cv_fold``), on tiny files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from test_coco import tiny_instances, write_coco  # the tiny instances json + images of tests/data/test_coco.py

from rlattention.data.readers.coco import build_coco, cv_fold_split
from rlattention.engine.config import load_config

N = 10


def _folder(tmp_path: Path, n: int = N) -> Path:
    """A train2017-only folder of ``n`` flat images; image ``i`` (``t{i}.jpg``) has red level ``20 * i``."""
    write_coco(tmp_path, "train2017", tiny_instances([f"t{i}.jpg" for i in range(n)]))
    for i in range(n):
        Image.new("RGB", (20, 10), (20 * i, 0, 0)).save(tmp_path / "train2017" / f"t{i}.jpg")
    return tmp_path


def _indices(dataset) -> list[int]:
    """The image indices of a split, read back from the red level of its images."""
    return sorted(round(float(dataset.images[j, 0].float().mean()) / 20) for j in range(len(dataset)))


def _splits(folds: int, fold: int, seed: int = 0, val_size: int = 2) -> tuple[list[int], list[int], list[int]]:
    """(train, val, test) image indices of one fold, as build_coco composes them."""
    from rlattention.data.photos import holdout_split

    rest, test = cv_fold_split(N, folds, fold, seed)
    train_idx, val_idx = holdout_split(len(rest), val_size, seed, "tiny")
    return rest[train_idx].tolist(), rest[val_idx].tolist(), test.tolist()


def test_test_folds_partition_the_images():
    tests = [cv_fold_split(N, 5, k, seed=0)[1].tolist() for k in range(5)]
    assert [len(t) for t in tests] == [2] * 5
    assert sorted(i for t in tests for i in t) == list(range(N))  # disjoint and covering
    for k in range(5):
        rest, test = cv_fold_split(N, 5, k, seed=0)
        assert sorted(rest.tolist() + test.tolist()) == list(range(N))
        train, val, test_ = _splits(5, k)
        assert not set(train) & set(val) and not set(train) & set(test_) and not set(val) & set(test_)
        assert sorted(train + val + test_) == list(range(N))


def test_near_equal_parts():
    sizes = sorted(len(cv_fold_split(128, 5, k, seed=3)[1]) for k in range(5))
    assert sizes == [25, 25, 26, 26, 26]
    assert sum(len(cv_fold_split(7, 3, k, 0)[1]) for k in range(3)) == 7


def test_permutation_is_fold_independent_and_seeded():
    # the folds of one seed are the parts of one permutation: the concatenation of the test parts, in fold order,
    # is a permutation of range(n) that is the same whichever fold is asked first
    first = [cv_fold_split(N, 5, k, seed=0)[1] for k in range(5)]
    again = [cv_fold_split(N, 5, k, seed=0)[1] for k in reversed(range(5))][::-1]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    other = [cv_fold_split(N, 5, k, seed=1)[1].tolist() for k in range(5)]
    assert other != [t.tolist() for t in first]
    assert sorted(i for t in other for i in t) == list(range(N))


def test_build_coco_folds(tmp_path: Path):
    root = _folder(tmp_path)
    seen = []
    for k in range(5):
        cfg = SimpleNamespace(image_size=8, val_size=2, seed=0, cv_folds=5, cv_fold=k, test_fraction=0.9)
        splits = build_coco(cfg, root)
        train, val, test = (_indices(d) for d in (splits.train, splits.val, splits.test))
        assert (len(train), len(val), len(test)) == (6, 2, 2)  # test_fraction is ignored
        assert (train, val, test) == tuple(sorted(x) for x in _splits(5, k))
        assert sorted(train + val + test) == list(range(N))
        seen += test
    assert sorted(seen) == list(range(N))  # every image tested exactly once
    # the targets follow the images: image 0 (id 1) is the only one with labels in the tiny json
    holder = next(k for k in range(5) if 0 in cv_fold_split(N, 5, k, 0)[1].tolist())
    splits = build_coco(SimpleNamespace(image_size=8, val_size=2, seed=0, cv_folds=5, cv_fold=holder), root)
    assert splits.test.targets.sum().item() == 2 and splits.train.targets.sum().item() == 0
    assert splits.val.targets.sum().item() == 0

    def tests(seed: int) -> list[list[int]]:
        cfgs = [SimpleNamespace(image_size=8, val_size=2, seed=seed, cv_folds=5, cv_fold=k) for k in range(5)]
        return [_indices(build_coco(cfg, root).test) for cfg in cfgs]

    assert tests(0) == [sorted(cv_fold_split(N, 5, k, 0)[1].tolist()) for k in range(5)]
    assert tests(1) != tests(0)  # another seed, another assignment


@pytest.mark.parametrize(
    ("folds", "fold", "message"),
    [
        (5, 5, r"data\.cv_fold=5 must be in 0\.\.4"),
        (5, -1, r"data\.cv_fold=-1"),
        (1, 0, r"data\.cv_folds=1: .*at least 2 folds"),
        (11, 0, r"data\.cv_folds=11: more folds than the 10 image"),
        (-2, 0, r"data\.cv_folds=-2"),
        (0, 3, r"data\.cv_fold=3 needs data\.cv_folds > 0"),
    ],
)
def test_bad_fold_values(tmp_path: Path, folds: int, fold: int, message: str):
    root = _folder(tmp_path)
    with pytest.raises(ValueError, match=message):
        build_coco(SimpleNamespace(image_size=8, val_size=2, cv_folds=folds, cv_fold=fold), root)


def test_folds_refused_with_val2017(tmp_path: Path):
    root = _folder(tmp_path)
    write_coco(root, "val2017", tiny_instances(["v0.jpg", "v1.jpg"], first_id=50))
    with pytest.raises(ValueError, match=r"data\.cv_folds=5: .*train2017-only folder"):
        build_coco(SimpleNamespace(image_size=8, val_size=2, cv_folds=5, cv_fold=0), root)
    assert len(build_coco(SimpleNamespace(image_size=8, val_size=2), root).test) == 2  # folds off: val2017 is test


def test_config_accepts_fold_options():
    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs/rarl_coco_subset_lite0.yaml", ["data.cv_folds=5", "data.cv_fold=4"])
    assert (cfg.data.cv_folds, cfg.data.cv_fold) == (5, 4)
    assert load_config(root / "configs/rarl_coco_subset_lite0.yaml", []).data.cv_folds == 0
