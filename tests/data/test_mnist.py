"""MNIST IDX reading (real, plain and corrupted files), the train/val split and the registered builders."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from rlattention.data.config import DataConfig
from rlattention.data.readers.mnist import (
    MNIST_FILES,
    IdxFormatError,
    build_mnist,
    load_mnist,
    read_idx,
)
from rlattention.data.registry import available_datasets
from rlattention.data.splits import split_seed, train_val_split
from rlattention.data.synthetic.cluttered import build_cluttered_mnist

TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
ALL_NAMES = [name for pair in MNIST_FILES.values() for name in pair]


def idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    """Serialise ``array`` as IDX: magic ``0x0000TTDD``, big-endian uint32 sizes, big-endian values."""
    dtype = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}[code]
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=dtype).tobytes()


def write(path: Path, payload: bytes, gz: bool) -> Path:
    path = path.with_name(path.name + ".gz") if gz else path
    path.write_bytes(gzip.compress(payload, mtime=0) if gz else payload)
    return path


@pytest.fixture(scope="module")
def mnist_dir(require_data: Callable[[str], Path]) -> Path:
    return require_data("mnist")


@pytest.fixture(scope="module")
def real_test(mnist_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    return load_mnist(mnist_dir, "test")


@pytest.fixture
def tiny_mnist(tmp_path: Path) -> Path:
    """A folder with four small, valid gzipped MNIST-format files (20 train, 10 test images)."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 20), ("test", 10)):
        images_name, labels_name = MNIST_FILES[split]
        write(tmp_path / images_name, idx_bytes(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)), gz=True)
        write(tmp_path / labels_name, idx_bytes(rng.integers(0, 10, n, dtype=np.uint8)), gz=True)
    return tmp_path


# ------------------------------------------------------------------------------------------- real files


def test_real_train_split(mnist_dir: Path) -> None:
    images, labels = load_mnist(mnist_dir, "train")
    assert images.shape == (60000, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (60000,) and labels.dtype == torch.int64
    assert labels[:5].tolist() == [5, 0, 4, 1, 9]
    assert torch.bincount(labels, minlength=10).tolist() == TRAIN_COUNTS
    assert images.max() == 255 and images.min() == 0
    assert images[:, :, 0, :].float().mean() < 1.0  # MNIST digits are centred: the top row is nearly empty


def test_real_test_split(real_test: tuple[torch.Tensor, torch.Tensor]) -> None:
    images, labels = real_test
    assert images.shape == (10000, 1, 28, 28) and images.dtype == torch.uint8
    assert labels[:5].tolist() == [7, 2, 1, 0, 4]
    assert torch.bincount(labels, minlength=10).tolist() == TEST_COUNTS


def test_parent_folder_with_mnist_subfolder(mnist_dir: Path, real_test: tuple[torch.Tensor, torch.Tensor]) -> None:
    images, labels = load_mnist(mnist_dir.parent, "test")
    assert torch.equal(images, real_test[0]) and torch.equal(labels, real_test[1])


def test_uncompressed_copies(mnist_dir: Path, tmp_path: Path, real_test: tuple[torch.Tensor, torch.Tensor]) -> None:
    for name in MNIST_FILES["test"]:
        (tmp_path / name).write_bytes(gzip.decompress((mnist_dir / f"{name}.gz").read_bytes()))
    images, labels = load_mnist(tmp_path, "test")
    assert torch.equal(images, real_test[0]) and torch.equal(labels, real_test[1])
    # A plain file that is (wrongly) named .gz is recognised by its content, not by its name.
    mislabelled = tmp_path / "labels.gz"
    mislabelled.write_bytes((tmp_path / MNIST_FILES["test"][1]).read_bytes())
    assert np.array_equal(read_idx(mislabelled), real_test[1].numpy())


def test_read_idx_all_types(tmp_path: Path) -> None:
    for code, dtype in (
        (0x09, np.int8),
        (0x0B, np.int16),
        (0x0C, np.int32),
        (0x0D, np.float32),
        (0x0E, np.float64),
    ):
        array = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
        out = read_idx(write(tmp_path / f"a{code}", idx_bytes(array, code), gz=code % 2 == 0))
        assert out.dtype == np.dtype(dtype) and out.dtype.isnative and out.flags.writeable
        assert np.array_equal(out, array)


# ------------------------------------------------------------------------------------------- corrupted files


def test_wrong_magic_names_file_and_expectation(tiny_mnist: Path) -> None:
    labels = tiny_mnist / "train-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(idx_bytes(np.zeros((20, 1, 1), np.int8), code=0x09)))
    with pytest.raises(IdxFormatError) as err:
        load_mnist(tiny_mnist, "train")
    message = str(err.value)
    assert str(labels) in message
    assert "wrong magic number 0x00000903" in message and "expected 0x00000801 (idx1, uint8)" in message


def test_invalid_magic_generic(tmp_path: Path) -> None:
    path = write(tmp_path / "junk-idx1-ubyte", b"\x12\x34\x56\x78" + bytes(10), gz=False)
    with pytest.raises(IdxFormatError, match="wrong magic number 0x12345678") as err:
        read_idx(path)
    assert "junk-idx1-ubyte" in str(err.value) and "0x08 uint8" in str(err.value)
    html = write(tmp_path / "page-idx3-ubyte", b"<!DOCTYPE html><html>not found</html>", gz=True)
    with pytest.raises(IdxFormatError, match="HTML") as err:
        read_idx(html)
    assert "page-idx3-ubyte.gz" in str(err.value)


def test_truncated_payload(tiny_mnist: Path) -> None:
    path = tiny_mnist / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:-100]))
    with pytest.raises(IdxFormatError, match="truncated payload") as err:
        load_mnist(tiny_mnist, "test")
    assert str(path) in str(err.value) and "10x28x28" in str(err.value) and "-100" in str(err.value)


def test_truncated_header(tmp_path: Path) -> None:
    path = write(tmp_path / "t10k-images-idx3-ubyte", bytes([0, 0, 8, 3, 0, 0]), gz=False)
    with pytest.raises(IdxFormatError, match="truncated header") as err:
        read_idx(path)
    assert "t10k-images-idx3-ubyte" in str(err.value)


def test_trailing_bytes(tiny_mnist: Path) -> None:
    path = tiny_mnist / "train-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()) + b"xyz"))
    with pytest.raises(IdxFormatError, match="trailing bytes") as err:
        load_mnist(tiny_mnist, "train")
    assert str(path) in str(err.value) and "+3" in str(err.value)


def test_count_mismatch_names_both_files(tiny_mnist: Path) -> None:
    labels = write(tiny_mnist / "train-labels-idx1-ubyte", idx_bytes(np.zeros(19, np.uint8)), gz=True)
    with pytest.raises(IdxFormatError, match="counts differ") as err:
        load_mnist(tiny_mnist, "train")
    message = str(err.value)
    assert str(labels) in message and "train-images-idx3-ubyte.gz" in message
    assert "20 images" in message and "19 labels" in message


def test_labels_out_of_range_and_wrong_image_size(tiny_mnist: Path) -> None:
    labels = write(tiny_mnist / "t10k-labels-idx1-ubyte", idx_bytes(np.full(10, 10, np.uint8)), gz=True)
    with pytest.raises(IdxFormatError, match=r"labels must be in 0\.\.9, found 10") as err:
        load_mnist(tiny_mnist, "test")
    assert str(labels) in str(err.value)
    images = write(tiny_mnist / "train-images-idx3-ubyte", idx_bytes(np.zeros((20, 27, 28), np.uint8)), gz=True)
    with pytest.raises(IdxFormatError, match="expected 28x28 images, found 27x28") as err:
        load_mnist(tiny_mnist, "train")
    assert str(images) in str(err.value)


def test_missing_file_names_all_files_and_folders(tiny_mnist: Path) -> None:
    (tiny_mnist / "train-labels-idx1-ubyte.gz").unlink()
    load_mnist(tiny_mnist, "test")  # the other split is still complete
    with pytest.raises(FileNotFoundError) as err:
        load_mnist(tiny_mnist, "train")
    message = str(err.value)
    assert all(name in message for name in ALL_NAMES)
    assert str(tiny_mnist) in message and str(tiny_mnist / "mnist") in message


@pytest.mark.parametrize("damage", ["flip", "cut"])
def test_corrupt_gzip(tiny_mnist: Path, damage: str) -> None:
    path = tiny_mnist / "train-images-idx3-ubyte.gz"
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        middle = len(raw) // 2
        raw[middle : middle + 16] = bytes(b ^ 0xFF for b in raw[middle : middle + 16])
    else:
        raw = raw[: len(raw) // 2]
    path.write_bytes(bytes(raw))
    with pytest.raises(IdxFormatError, match="corrupt gzip stream") as err:
        load_mnist(tiny_mnist, "train")
    assert str(path) in str(err.value)


# ------------------------------------------------------------------------------------------- splits


def test_train_val_split_mnist_sizes() -> None:
    train, val = train_val_split(60000, 6000, seed=0)
    assert train.shape == (54000,) and val.shape == (6000,)
    assert train.dtype == val.dtype == torch.int64
    assert torch.equal(torch.sort(torch.cat([train, val])).values, torch.arange(60000))  # disjoint and covering
    assert bool((train[1:] > train[:-1]).all()) and bool((val[1:] > val[:-1]).all())  # sorted
    again_train, again_val = train_val_split(60000, 6000, seed=0)
    assert torch.equal(train, again_train) and torch.equal(val, again_val)
    assert not torch.equal(val, train_val_split(60000, 6000, seed=1)[1])


def test_train_val_split_edges() -> None:
    train, val = train_val_split(5, 0, seed=3)
    assert train.tolist() == [0, 1, 2, 3, 4] and val.numel() == 0
    for bad in (-1, 5, 6):
        with pytest.raises(ValueError, match="val_size"):
            train_val_split(5, bad, seed=0)


# ------------------------------------------------------------------------------------------- builders


def test_registered() -> None:
    assert {"mnist", "cluttered_mnist", "digits"} <= set(available_datasets())


def test_build_mnist(mnist_dir: Path) -> None:
    splits = build_mnist(DataConfig(name="mnist"), mnist_dir)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (54000, 6000, 10000)
    assert splits.num_classes == 10 and splits.image_shape == (1, 28, 28)
    small = build_mnist(DataConfig(name="mnist", num_train=100, num_test=30), mnist_dir.parent)
    assert (len(small.train), len(small.val), len(small.test)) == (100, 30, 30)
    assert torch.equal(small.train.images, splits.train.images[:100])
    assert torch.equal(small.test.targets, splits.test.targets[:30])


def test_build_cluttered_mnist(mnist_dir: Path) -> None:
    cfg = DataConfig(name="cluttered_mnist", num_train=64, num_test=32, seed=5)
    splits = build_cluttered_mnist(cfg, mnist_dir)
    assert splits.image_shape == (1, 60, 60) and splits.train.images.dtype == torch.uint8
    assert (len(splits.train), len(splits.val), len(splits.test)) == (64, 32, 32)
    plain = build_mnist(cfg, mnist_dir)
    assert torch.equal(splits.test.targets, plain.test.targets)
    again = build_cluttered_mnist(cfg, mnist_dir)
    assert torch.equal(splits.train.images, again.train.images)
    big = build_cluttered_mnist(DataConfig(num_train=8, num_test=8, canvas_size=100, num_clutter=10), mnist_dir)
    assert big.image_shape == (1, 100, 100)


def test_split_seeds_differ_per_split_and_seed() -> None:
    seeds = {split_seed(seed, split) for seed in (0, 1) for split in ("train", "val", "test")}
    assert len(seeds) == 6 and split_seed(3, "val") == split_seed(3, "val")


def test_builders_need_a_data_dir() -> None:
    for builder in (build_mnist, build_cluttered_mnist):
        with pytest.raises(ValueError, match="pass --data-dir or set RLATTENTION_DATA"):
            builder(DataConfig(), None)
