"""The ``precomp`` layout: the real Flickr30k caption files (captions only, so the split reader must say the
features are missing) and tiny written folders (round trip, memory map, 2-D features, malformed files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlattention.data.readers import precomp
from rlattention.data.readers.precomp import (
    PrecompFormatError,
    available_splits,
    read_captions,
    read_precomp_split,
    write_precomp_split,
)

# ---------------------------------------------------------------------------------------------- real captions


def test_real_f30k_caption_files(require_data) -> None:
    folder = require_data("f30k_precomp")
    dev = read_captions(folder / "dev_caps.txt")
    test = read_captions(folder / "test_caps.txt")
    assert len(dev) == 5070 == 1014 * 5
    assert len(test) == 5000 == 1000 * 5  # its last line has no final line break
    assert all(type(caption) is str for caption in dev + test)  # text, not bytes
    assert dev[0] == "A group of people stand in the back of a truck filled with cotton ."
    assert dev[121] == "Two Rubbish men standing on they\u2019re truck loading trash ."  # the one non-ASCII line
    assert dev[-1] == "A person is coming out of a portable toilet ."
    assert test[-1] == "A child playing in the ocean ."
    assert not any(caption.endswith(("\n", "\r")) for caption in dev + test)


def test_real_f30k_folder_has_captions_only(require_data) -> None:
    folder = require_data("f30k_precomp")
    assert available_splits(folder) == []
    assert available_splits(folder, need_features=False) == ["dev", "test"]
    with pytest.raises(FileNotFoundError, match=r"missing: dev_ims\.npy \(complete splits here: none; captions only"):
        read_precomp_split(folder, "dev")
    with pytest.raises(FileNotFoundError, match=r"missing: train_ims\.npy, train_caps\.txt"):
        read_precomp_split(folder, "train")


# ------------------------------------------------------------------------------------------------ tiny folders


def _captions(images: int, per_image: int = 5) -> list[str]:
    return [f"image {i} caption {k} café" for i in range(images) for k in range(per_image)]


def _features(images: int, regions: int = 3, dim: int = 4) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((images, regions, dim)).astype(np.float32)


def test_write_read_round_trip_memmap(tmp_path: Path) -> None:
    features, captions = _features(4), _captions(4)
    ims, caps = write_precomp_split(tmp_path / "toy_precomp", "train", features, captions)
    assert (ims.name, caps.name) == ("train_ims.npy", "train_caps.txt")
    assert sorted(p.name for p in ims.parent.iterdir()) == ["train_caps.txt", "train_ims.npy"]  # no temp files
    split = read_precomp_split(tmp_path / "toy_precomp", "train")
    assert isinstance(split.features, np.memmap) and not split.features.flags.writeable
    assert split.features.dtype == np.float32 and split.features.shape == (4, 3, 4)
    np.testing.assert_array_equal(split.features, features)
    assert split.captions == captions
    assert split.caption_to_image.dtype == np.int64
    assert split.caption_to_image.tolist() == [j // 5 for j in range(20)]
    assert split.num_images == 4 and split.captions_per_image == 5
    in_memory = read_precomp_split(tmp_path / "toy_precomp", "train", mmap=False)
    assert not isinstance(in_memory.features, np.memmap)
    np.testing.assert_array_equal(in_memory.features, features)
    write_precomp_split(tmp_path / "toy_precomp", "testall", features[:2], captions[:10])
    write_precomp_split(tmp_path / "toy_precomp", "dev", features[:1], captions[:5])
    assert available_splits(tmp_path / "toy_precomp") == ["train", "dev", "testall"]


def test_two_dimensional_features_are_one_region(tmp_path: Path) -> None:
    vectors = np.arange(6, dtype=np.float64).reshape(2, 3)  # float64 in: stored as float32
    write_precomp_split(tmp_path, "test", vectors, _captions(2, per_image=2), captions_per_image=2)
    assert np.load(tmp_path / "test_ims.npy").shape == (2, 3)  # written as given
    split = read_precomp_split(tmp_path, "test", captions_per_image=2)
    assert split.features.shape == (2, 1, 3) and split.features.dtype == np.float32
    np.testing.assert_array_equal(split.features[:, 0], vectors)
    assert split.caption_to_image.tolist() == [0, 0, 1, 1]


def test_wrong_caption_count_per_image(tmp_path: Path) -> None:
    with pytest.raises(PrecompFormatError, match=r"wrong caption count per image: .*train_caps\.txt \(writing\)"):
        write_precomp_split(tmp_path, "train", _features(3), _captions(3)[:-1])
    assert list(tmp_path.iterdir()) == []  # nothing written
    np.save(tmp_path / "train_ims.npy", _features(3))
    (tmp_path / "train_caps.txt").write_text("\n".join(_captions(3)[:14]) + "\n", encoding="utf-8")
    message = (
        r"wrong caption count per image: .*train_caps\.txt has 14 captions and .*train_ims\.npy has 3 images; "
        r"expected captions_per_image x images = 5 x 3 = 15 captions \(found 4\.667 per image\)"
    )
    with pytest.raises(PrecompFormatError, match=message):
        read_precomp_split(tmp_path, "train")
    (tmp_path / "train_caps.txt").write_text("\n".join(_captions(3)[:3]) + "\n", encoding="utf-8")
    with pytest.raises(PrecompFormatError, match=r"repeated once per caption .*features\[::5\]"):
        read_precomp_split(tmp_path, "train")


def test_caption_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "dev_caps.txt"
    with pytest.raises(FileNotFoundError, match=r"dev_caps\.txt"):
        read_captions(path)
    path.write_bytes("a café\nsecond line\nthird \xe9 line\n".encode("latin-1"))
    with pytest.raises(PrecompFormatError, match=r"dev_caps\.txt: not UTF-8 text: byte offset 5 \(line 1, byte 6"):
        read_captions(path)
    path.write_bytes(b"first\nsecond\nthi\xffrd\n")
    with pytest.raises(PrecompFormatError, match=r"byte offset 16 \(line 3, byte 4 of the line\) holds b'\\xff'"):
        read_captions(path)
    path.write_text("first\n\nthird\n", encoding="utf-8")
    with pytest.raises(PrecompFormatError, match=r"dev_caps\.txt: line 2 is blank"):
        read_captions(path)
    path.write_text("first\nsecond\n   \n", encoding="utf-8")
    with pytest.raises(PrecompFormatError, match="line 3 is blank"):
        read_captions(path)
    path.write_text("first\nsecond\n\n", encoding="utf-8")  # one line break too many at the end
    with pytest.raises(PrecompFormatError, match="line 3 is blank"):
        read_captions(path)
    path.write_bytes(b"")
    with pytest.raises(PrecompFormatError, match="no captions"):
        read_captions(path)


def test_caption_line_ends(tmp_path: Path) -> None:
    path = tmp_path / "dev_caps.txt"
    path.write_bytes("\ufeff A dog .\r\nA cat\u2028 sits  \nlast".encode())
    assert read_captions(path) == [" A dog .", "A cat\u2028 sits  ", "last"]  # only the line break is removed


def test_feature_file_errors(tmp_path: Path) -> None:
    (tmp_path / "test_caps.txt").write_text("\n".join(_captions(2)) + "\n", encoding="utf-8")
    ims = tmp_path / "test_ims.npy"
    bad = _features(2)
    bad[1, 2, 3] = np.nan
    np.save(ims, bad)
    with pytest.raises(PrecompFormatError, match=r"test_ims\.npy: .*finite, found nan at image 1, region 2, value 3"):
        read_precomp_split(tmp_path, "test")
    assert read_precomp_split(tmp_path, "test", check_finite="off").features.shape == (2, 3, 4)
    with pytest.raises(PrecompFormatError, match="must be finite"):
        write_precomp_split(tmp_path / "out", "test", bad, _captions(2))
    np.save(ims, np.zeros((2, 3, 4, 5), dtype=np.float32))
    with pytest.raises(PrecompFormatError, match=r"\(N, R, D\) regions or \(N, D\) vectors, found 4-D"):
        read_precomp_split(tmp_path, "test")
    np.save(ims, np.zeros((2, 3), dtype=np.float64))
    with pytest.raises(PrecompFormatError, match="must be float32, found float64"):
        read_precomp_split(tmp_path, "test")
    np.save(ims, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(PrecompFormatError, match=r"test_ims\.npy: not a readable \.npy array"):
        read_precomp_split(tmp_path, "test")
    np.save(ims, _features(2))
    ims.write_bytes(ims.read_bytes()[:-10])  # truncated
    for mmap in (True, False):
        with pytest.raises(PrecompFormatError, match=r"test_ims\.npy: not a readable \.npy array"):
            read_precomp_split(tmp_path, "test", mmap=mmap)


def test_sampled_finite_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    features = _features(1000, regions=2, dim=2)
    features[0, 1, 1] = np.inf  # the first image is always in the sample
    features[500, 0, 0] = np.nan  # between sampled images
    np.save(tmp_path / "train_ims.npy", features[1:])
    (tmp_path / "train_caps.txt").write_text("\n".join(_captions(999)), encoding="utf-8")
    monkeypatch.setattr(precomp, "FULL_CHECK_BYTES", 0)  # "auto" samples every array now
    with pytest.raises(PrecompFormatError, match="found nan at image 499"):
        read_precomp_split(tmp_path, "train", check_finite="all")
    assert read_precomp_split(tmp_path, "train").num_images == 999  # the sample misses image 499
    np.save(tmp_path / "train_ims.npy", features[:999])
    with pytest.raises(PrecompFormatError, match="found inf at image 0, region 1, value 1"):
        read_precomp_split(tmp_path, "train", check_finite="sample")


def test_write_checks_captions(tmp_path: Path) -> None:
    features = _features(1)
    with pytest.raises(PrecompFormatError, match="caption 2 holds a line break"):
        write_precomp_split(tmp_path, "train", features, ["a", "b\nc", "d", "e", "f"])
    with pytest.raises(PrecompFormatError, match="caption 5 is blank"):
        write_precomp_split(tmp_path, "train", features, ["a", "b", "c", "d", " "])
    with pytest.raises(ValueError, match="split name"):
        write_precomp_split(tmp_path, "../train", features, _captions(1))
    assert list(tmp_path.iterdir()) == []
