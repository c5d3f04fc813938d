"""Person re-id datasets: the Market-1501 / DukeMTMC-reID reader on tiny hand-made folders (file names, junk and
distractors, relabelling, query/gallery roles, the identity hold-out, smoke-run limits, clear errors) and
``omniglot_reid`` on the real Omniglot zips (counts, disjoint identities, cameras, bright ink)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rlattention.data.config import DataConfig
from rlattention.data.photos import ImageDecodeError
from rlattention.data.readers.reid import (
    ROLE_GALLERY,
    ROLE_QUERY,
    ROLE_TRAIN,
    ReidFormatError,
    build_market1501,
    find_reid_dir,
    list_reid_images,
    parse_reid_name,
    split_query_gallery,
)
from rlattention.data.registry import available_datasets, build_dataset

SIZE = [16, 8]
TRAIN_IDS = [2, 7, 11, 20, 33]
TEST_IDS = [40, 41, 42]


def write_image(path: Path, pid: int, cam: int) -> None:
    """A flat 16 x 8 JPEG whose red channel encodes the pid and green channel the camera."""
    color = (max(pid, 0) * 5, cam * 60, 128)
    Image.new("RGB", (8, 16), color).save(path, quality=95)


def name(pid: int, cam: int, n: int, style: str) -> str:
    if style == "duke":
        return f"{pid:04d}_c{cam}_f{n:07d}.jpg"
    return f"{'-1' if pid < 0 else f'{pid:04d}'}_c{cam}s1_{n:06d}_01.jpg"


def make_reid_folder(root: Path, folder: str = "market1501", style: str = "market") -> Path:
    """5 training identities x 2 cameras x 2 images (+ 1 junk), 3 test identities with one query per camera,
    a gallery of one image per (identity, camera) plus 2 distractors, 2 junk and one gallery-only identity."""
    base = root / folder
    subs = {sub: base / sub for sub in ("bounding_box_train", "query", "bounding_box_test")}
    for sub in subs.values():
        sub.mkdir(parents=True)
    n = 0
    for pid in TRAIN_IDS:
        for cam in (1, 2):
            for _ in range(2):
                n += 1
                write_image(subs["bounding_box_train"] / name(pid, cam, n, style), pid, cam)
    (subs["bounding_box_train"] / "Thumbs.db").write_bytes(b"\x00junk")
    for pid in TEST_IDS:
        for cam in (1, 2):
            n += 1
            write_image(subs["query"] / name(pid, cam, n, style), pid, cam)
            n += 1
            write_image(subs["bounding_box_test"] / name(pid, cam, n, style), pid, cam)
    for pid, cam in ((0, 1), (0, 2), (50, 1)) + (((-1, 1), (-1, 2)) if style == "market" else ()):
        n += 1
        write_image(subs["bounding_box_test"] / name(pid, cam, n, style), pid, cam)
    if style == "market":
        write_image(subs["bounding_box_train"] / name(-1, 1, 999, style), -1, 1)
    return base


def cfg(**kw) -> DataConfig:
    return DataConfig(**{"reid_size": SIZE, "reid_val_ids": 2, "seed": 0, **kw})


def check_layout(splits, channels: int, size: list[int]) -> None:
    for part in (splits.train, splits.val, splits.test):
        assert part.images.dtype == torch.uint8 and part.images.shape[1:] == (channels, *size)
        assert part.targets.dtype == torch.int64 and part.targets.shape == (len(part), 3)
    assert (splits.train.targets[:, 2] == ROLE_TRAIN).all()
    k = splits.num_classes
    assert set(splits.train.targets[:, 0].tolist()) == set(range(k)) and splits.meta["train_ids"] == k
    assert splits.meta["reid"] is True
    for part in (splits.val, splits.test):
        roles = part.targets[:, 2]
        assert set(roles.tolist()) <= {ROLE_QUERY, ROLE_GALLERY}
        nq = int((roles == ROLE_QUERY).sum())
        assert (roles[:nq] == ROLE_QUERY).all() and (roles[nq:] == ROLE_GALLERY).all()  # queries first


def check_matches(part) -> None:
    """Every query has a gallery image of its identity from another camera."""
    pid, cam, role = part.targets.T
    gallery = role == ROLE_GALLERY
    for q in torch.nonzero(role == ROLE_QUERY).flatten().tolist():
        assert (gallery & (pid == pid[q]) & (cam != cam[q])).any(), f"query row {q} has no valid match"


def red_pids(images: torch.Tensor) -> list[int]:
    return [round(v / 5) for v in images[:, 0].float().mean(dim=(1, 2)).tolist()]


# ---------------------------------------------------------------------------------------- Market / Duke


def test_registered() -> None:
    assert {"market1501", "dukemtmc", "omniglot_reid"} <= set(available_datasets())


def test_parse_reid_name() -> None:
    assert parse_reid_name("0002_c1s1_000451_03.jpg") == (2, 0)
    assert parse_reid_name("-1_c3s2_000100_01.jpg") == (-1, 2)
    assert parse_reid_name("0000_c6s4_002202_02.jpg") == (0, 5)
    assert parse_reid_name("0005_c2_f0046985.jpg") == (5, 1)
    for bad in ("0002_c0s1_000451_03.jpg", "0002_1s1_000451_03.jpg", "abc.jpg", "0002_c1.jpg"):
        with pytest.raises(ReidFormatError, match=bad.split(".")[0]):
            parse_reid_name(bad)


def test_split_query_gallery() -> None:
    # a normal identity (2 cams x 2 images): one query per camera
    assert split_query_gallery([1, 1, 1, 1], [0, 0, 1, 1]).tolist() == [1, 2, 1, 2]
    # seen once by each of 3 cameras: the first camera's image becomes the others' match
    assert split_query_gallery([3, 3, 3], [0, 1, 2]).tolist() == [2, 1, 1]
    # seen by a single camera: no valid match, so no query
    assert split_query_gallery([4, 4], [1, 1]).tolist() == [2, 2]


def test_market_splits(tmp_path: Path) -> None:
    make_reid_folder(tmp_path)
    splits = build_dataset("market1501", cfg(), tmp_path)
    assert splits.name == "market1501" and splits.num_classes == 3
    check_layout(splits, 3, SIZE)
    train, val, test = splits.train, splits.val, splits.test
    # training: 3 identities x 4 images, junk dropped, Thumbs.db ignored, relabelled in the order of the ids
    val_ids = sorted(set(val.targets[:, 0].tolist()))
    train_ids = sorted(set(TRAIN_IDS) - set(val_ids))
    assert len(val_ids) == 2 and set(val_ids) <= set(TRAIN_IDS)
    assert len(train) == 12 and splits.meta["dropped_train"] == 1
    assert red_pids(train.images) == [train_ids[k] for k in train.targets[:, 0].tolist()]
    assert set(train.targets[:, 1].tolist()) == {0, 1}
    # validation: one query per (identity, camera), the other image of that camera in the gallery
    assert (splits.meta["val_query"], splits.meta["val_gallery"]) == (4, 4)
    assert sorted(map(tuple, val.targets[:4, :2].tolist())) == [(p, c) for p in val_ids for c in (0, 1)]
    assert red_pids(val.images) == val.targets[:, 0].tolist()
    check_matches(val)
    # test: query/ then bounding_box_test/, original pids, junk -1 and distractors 0 kept in the gallery
    pids, cams = test.targets[:, 0].tolist(), test.targets[:, 1].tolist()
    assert (splits.meta["test_query"], splits.meta["test_gallery"]) == (6, 11)
    assert pids[:6] == [40, 40, 41, 41, 42, 42] and cams[:6] == [0, 1] * 3
    assert sorted(pids[6:]) == [-1, -1, 0, 0, 40, 40, 41, 41, 42, 42, 50]
    assert splits.meta["test_junk"] == 2 and splits.meta["test_distractors"] == 2
    assert set(cams) == {0, 1} and splits.meta["num_cameras"] == 2
    assert not set(pids) & set(TRAIN_IDS)
    check_matches(test)
    # seeded: the same hold-out again, another one for another seed (5 choose 2 = 10 possibilities)
    again = build_dataset("market1501", cfg(), tmp_path)
    assert torch.equal(again.val.targets, val.targets) and torch.equal(again.train.images, train.images)
    others = [build_dataset("market1501", cfg(seed=s), tmp_path).val.targets[:, 0] for s in range(1, 4)]
    assert {tuple(sorted(set(o.tolist()))) for o in others} - {tuple(val_ids)}


def test_market_smoke_limits_and_all_ids(tmp_path: Path) -> None:
    make_reid_folder(tmp_path, "Market-1501-v15.09.15")
    small = build_dataset("market1501", cfg(num_train=1, num_test=1), tmp_path)
    assert small.num_classes == 1 and len(small.train) == 4
    assert len(set(small.val.targets[:, 0].tolist())) == 1 and len(small.val) == 4
    assert small.test.targets[:, 0].tolist() == [40] * 4  # first test identity, no junk or distractors
    assert small.test.targets[:, 2].tolist() == [ROLE_QUERY] * 2 + [ROLE_GALLERY] * 2
    full = build_dataset("market1501", cfg(reid_val_ids=0), tmp_path)
    assert full.num_classes == 5 and len(full.train) == 20 and full.meta["val_overlaps_train"] is True
    assert len(set(full.val.targets[:, 0].tolist())) == 1  # 10 % of 5 identities, at least one
    with pytest.raises(ValueError, match="reid_val_ids=5"):
        build_dataset("market1501", cfg(reid_val_ids=5), tmp_path)


def test_duke_names(tmp_path: Path) -> None:
    make_reid_folder(tmp_path, "DukeMTMC-reID", style="duke")
    splits = build_dataset("dukemtmc", cfg(), tmp_path)
    assert splits.name == "dukemtmc" and splits.num_classes == 3 and len(splits.train) == 12
    assert (splits.meta["test_query"], splits.meta["test_gallery"]) == (6, 9)
    check_layout(splits, 3, SIZE)


def test_bad_file_name(tmp_path: Path) -> None:
    base = make_reid_folder(tmp_path)
    bad = base / "query" / "0040-c1-0001.jpg"
    write_image(bad, 40, 1)
    with pytest.raises(ReidFormatError, match="0040-c1-0001.jpg"):
        build_dataset("market1501", cfg(), tmp_path)
    with pytest.raises(ReidFormatError, match="0040-c1-0001.jpg"):
        list_reid_images(base / "query")


def test_undecodable_image(tmp_path: Path) -> None:
    base = make_reid_folder(tmp_path)
    broken = base / "bounding_box_test" / "0041_c1s1_009999_01.jpg"
    broken.write_bytes(b"not a jpeg at all")
    with pytest.raises(ImageDecodeError, match="0041_c1s1_009999_01.jpg"):
        build_dataset("market1501", cfg(), tmp_path)


def test_missing_folders(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="bounding_box_train"):
        build_dataset("market1501", cfg(), tmp_path)
    with pytest.raises(ValueError, match="--data-dir"):
        build_market1501(cfg(), None)
    base = make_reid_folder(tmp_path)
    assert find_reid_dir(tmp_path) == base and find_reid_dir(base) == base
    (base / "query").rename(base / "queries")
    with pytest.raises(FileNotFoundError, match="query/"):
        build_dataset("market1501", cfg(), tmp_path)


def test_train_test_overlap(tmp_path: Path) -> None:
    base = make_reid_folder(tmp_path)
    write_image(base / "bounding_box_test" / name(TRAIN_IDS[0], 1, 777, "market"), TRAIN_IDS[0], 1)
    with pytest.raises(ReidFormatError, match="disjoint"):
        build_dataset("market1501", cfg(), tmp_path)


# ---------------------------------------------------------------------------------------------- Omniglot


@pytest.fixture(scope="module")
def omniglot_dir(require_data) -> Path:
    return require_data("omniglot")


@pytest.fixture(scope="module")
def omniglot(omniglot_dir: Path):
    return build_dataset("omniglot_reid", DataConfig(reid_size=[32, 32]), omniglot_dir.parent)


def digests(images: torch.Tensor) -> list[str]:
    return [hashlib.sha1(image.numpy().tobytes()).hexdigest() for image in images]


def test_omniglot_reid_counts(omniglot) -> None:
    check_layout(omniglot, 1, [32, 32])
    assert omniglot.num_classes == 36 and omniglot.name == "omniglot_reid"
    meta = omniglot.meta
    assert (meta["train_images"], meta["val_query"], meta["val_gallery"]) == (720, 400, 1600)
    assert (meta["test_ids"], meta["test_query"], meta["test_gallery"]) == (106, 424, 1696)
    assert meta["num_cameras"] == 4 and meta["val_overlaps_train"] is False
    assert set(omniglot.train.targets[:, 1].tolist()) == {0, 1, 2, 3}
    for part, lo, hi in ((omniglot.val, 1, 136), (omniglot.test, 137, 242)):
        pid = part.targets[:, 0]
        assert lo <= int(pid.min()) and int(pid.max()) <= hi
        for p in pid.unique().tolist():
            rows = part.targets[pid == p]
            queries = rows[rows[:, 2] == ROLE_QUERY]
            assert sorted(queries[:, 1].tolist()) == [0, 1, 2, 3] and len(rows) == 20
        check_matches(part)
    assert omniglot.test.targets[:, 0].unique().tolist() == list(range(137, 243))


def test_omniglot_reid_identities_disjoint(omniglot, omniglot_dir: Path) -> None:
    # with no hold-out, training pid k is character k (pid k + 1): map the default training images back to it
    full = build_dataset("omniglot_reid", DataConfig(reid_size=[32, 32], reid_val_ids=0), omniglot_dir.parent)
    assert full.num_classes == 136 and len(full.train) == 2720
    character = dict(zip(digests(full.train.images), (full.train.targets[:, 0] + 1).tolist(), strict=True))
    originals = [character[d] for d in digests(omniglot.train.images)]
    train_ids = sorted(set(originals))
    assert [train_ids[k] for k in omniglot.train.targets[:, 0].tolist()] == originals  # relabelled in id order
    val_ids = set(omniglot.val.targets[:, 0].tolist())
    assert len(train_ids) == 36 and len(val_ids) == 100 and not set(train_ids) & val_ids
    assert not (set(train_ids) | val_ids) & set(omniglot.test.targets[:, 0].tolist())
    # small2 repeats small1's Greek and Latin characters: none of those drawings is in the test split
    assert omniglot.meta["shared_characters_dropped"] == 50
    assert not set(character) & set(digests(omniglot.test.images))
    # the val images are those of their characters in the full build
    val_pairs = zip(digests(omniglot.val.images), omniglot.val.targets[:, 0].tolist(), strict=True)
    assert all(character[d] == p for d, p in val_pairs)


def test_omniglot_reid_ink(omniglot) -> None:
    images = omniglot.test.images.float()
    assert (images.amax(dim=(1, 2, 3)) >= 150).all()  # ink is bright (thin strokes lose some at 32 px)
    assert float(images.mean()) < 60 and (omniglot.test.images[:, 0, 0, 0] == 0).float().mean() > 0.9


def test_omniglot_reid_options(omniglot_dir: Path, tmp_path: Path) -> None:
    small = build_dataset(
        "omniglot_reid", DataConfig(reid_size=[24, 16], reid_cameras=5, num_train=3, num_test=2), omniglot_dir.parent
    )
    assert small.image_shape == (1, 24, 16) and small.num_classes == 3 and len(small.train) == 60
    assert small.test.targets[:, 0].unique().tolist() == [137, 138]
    assert (small.meta["test_query"], small.meta["test_gallery"]) == (10, 30)
    with pytest.raises(ValueError, match="reid_cameras=3"):
        build_dataset("omniglot_reid", DataConfig(reid_cameras=3), omniglot_dir.parent)
    with pytest.raises(FileNotFoundError, match="images_background_small1.zip"):
        build_dataset("omniglot_reid", DataConfig(), tmp_path)
    assert np.array_equal(
        split_query_gallery([1] * 20, [i // 5 for i in range(20)]) == ROLE_QUERY, np.arange(20) % 5 == 0
    )
