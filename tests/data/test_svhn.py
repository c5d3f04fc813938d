"""SVHN: format 1 (digitStruct.mat, MATLAB v7.3 / HDF5, both bbox layouts + PNGs) and format 2 (cropped
32x32 digits, MATLAB v5), written here in the real layouts, read back, and every error."""

from __future__ import annotations

import itertools
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image

from rlattention.data.config import DataConfig
from rlattention.data.readers.svhn import (
    SvhnFormatError,
    build_svhn_cropped,
    center_crop,
    load_svhn_cropped,
    load_svhn_sequences,
    random_crop,
    read_cropped_mat,
    read_digit_struct,
)
from rlattention.data.registry import available_datasets, build_dataset

FIELDS = ("label", "left", "top", "width", "height")
BLUE, GREEN, RED, YELLOW = (0, 0, 255), (0, 255, 0), (255, 0, 0), (255, 255, 0)

# name -> per-digit (label, left, top, width, height); label 10 is the digit 0
MULTI = ("1.png", [(1, 20, 10, 12, 20), (10, 33, 12, 12, 18), (5, 48, 10, 12, 20)])  # union x 20..60, y 10..30
SINGLE = ("2.png", [(7, 2, 1, 10, 20)])  # union x 2..12, y 1..21: the expanded box leaves the image
LONG = ("3.png", [(d, 5 + 12 * i, 10, 10, 20) for i, d in enumerate([1, 2, 3, 4, 5, 6])])  # 6 digits


def matlab_header(path: Path) -> None:
    """Write a MATLAB 7.3 header into the file's 512-byte HDF5 user block, as MATLAB does."""
    text = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 ."
    header = text.ljust(116, b" ") + b"\x00" * 8 + b"\x00\x02IM"
    with path.open("r+b") as f:
        f.write(header)


def write_digit_struct(path: Path, entries: list[tuple[str, dict[str, list[float]]]]) -> Path:
    """A format 1 digitStruct.mat: digitStruct/name and digitStruct/bbox are (N, 1) object references; a bbox
    field holds the (1, 1) value itself for one digit, and (k, 1) references to (1, 1) values for k > 1."""
    counter = itertools.count()
    with h5py.File(path, "w", userblock_size=512) as f:
        refs = f.create_group("#refs#")
        group = f.create_group("digitStruct")
        names = group.create_dataset("name", (len(entries), 1), dtype=h5py.ref_dtype)
        bboxes = group.create_dataset("bbox", (len(entries), 1), dtype=h5py.ref_dtype)
        for i, (name, fields) in enumerate(entries):
            chars = np.array([ord(c) for c in name], dtype=np.uint16).reshape(-1, 1)
            names[i, 0] = refs.create_dataset(f"n{next(counter)}", data=chars).ref
            box = refs.create_group(f"b{next(counter)}")
            for field, values in fields.items():
                if len(values) == 1:
                    box.create_dataset(field, data=np.array([[float(values[0])]]))
                else:
                    ds = box.create_dataset(field, (len(values), 1), dtype=h5py.ref_dtype)
                    for j, value in enumerate(values):
                        ds[j, 0] = refs.create_dataset(f"v{next(counter)}", data=np.array([[float(value)]])).ref
            bboxes[i, 0] = box.ref
    matlab_header(path)
    return path


def fields_of(digits: list[tuple[float, ...]]) -> dict[str, list[float]]:
    return {field: [d[k] for d in digits] for k, field in enumerate(FIELDS)}


def paint_multi(path: Path) -> None:
    """100x50 blue image; the union box expanded by 30 % (x 14..66, y 7..33) is green left of x = 40, red right."""
    image = np.zeros((50, 100, 3), dtype=np.uint8)
    image[:] = BLUE
    image[7:33, 14:40] = GREEN
    image[7:33, 40:66] = RED
    Image.fromarray(image).save(path)


def make_split(folder: Path, entries: list[tuple[str, list[tuple[float, ...]]]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_digit_struct(folder / "digitStruct.mat", [(name, fields_of(digits)) for name, digits in entries])
    for name, _ in entries:
        if name == MULTI[0]:
            paint_multi(folder / name)
        else:
            Image.fromarray(np.full((50, 100, 3), YELLOW, dtype=np.uint8)).save(folder / name)
    return folder


@pytest.fixture
def split(tmp_path: Path) -> Path:
    return make_split(tmp_path / "train", [MULTI, SINGLE, LONG])


def test_read_digit_struct_both_layouts(split: Path) -> None:
    entries = read_digit_struct(split / "digitStruct.mat")
    assert [e.name for e in entries] == ["1.png", "2.png", "3.png"]
    assert entries[0].labels.tolist() == [1, 0, 5] and entries[0].labels.dtype == np.int64
    np.testing.assert_array_equal(entries[0].boxes, [[20, 10, 12, 20], [33, 12, 12, 18], [48, 10, 12, 20]])
    assert entries[0].union_box == (20.0, 10.0, 60.0, 30.0)
    assert entries[1].labels.tolist() == [7] and entries[1].boxes.shape == (1, 4)  # the scalar layout
    assert entries[2].labels.tolist() == [1, 2, 3, 4, 5, 6]
    assert len(read_digit_struct(split / "digitStruct.mat", limit=2)) == 2


def test_load_sequences_crops_and_targets(split: Path) -> None:
    images, targets, names = load_svhn_sequences(split, workers=2)
    assert names == ["1.png", "2.png"]  # the 6-digit number is dropped
    assert images.shape == (2, 3, 54, 54) and images.dtype == torch.uint8
    assert targets.tolist() == [[1, 0, 5, 10, -1, -1], [7, 10, -1, -1, -1, -1]]
    multi = images[0].int()
    # expanded box -> 64x64 -> centre 54x54: x = 40 falls on column 32 - 5 = 27 of the crop
    assert bool((multi[:, :, :25] == torch.tensor(GREEN).view(3, 1, 1)).all())
    assert bool((multi[:, :, 30:] == torch.tensor(RED).view(3, 1, 1)).all())
    # clipped to the image (not padded): every pixel is the image's yellow
    assert bool((images[1].int() == torch.tensor(YELLOW).view(3, 1, 1)).all())
    full = load_svhn_sequences(split, crop=None, max_digits=6)
    assert full.images.shape == (3, 3, 64, 64) and full.targets.shape == (3, 7)
    assert torch.equal(center_crop(full.images[:2], 54), images)
    assert full.targets[2].tolist() == [1, 2, 3, 4, 5, 6, 10]


def test_random_crop() -> None:
    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.int64).view(2, 3, 8, 8)
    crops = random_crop(images, 5, torch.Generator().manual_seed(0))
    assert crops.shape == (2, 3, 5, 5)
    for n in range(2):
        top, left = divmod(int(crops[n, 0, 0, 0] - images[n, 0, 0, 0]), 8)
        assert torch.equal(crops[n], images[n, :, top : top + 5, left : left + 5])
    assert torch.equal(center_crop(images, 4), images[..., 2:6, 2:6])
    with pytest.raises(ValueError, match="crop size"):
        random_crop(images, 9)


def test_missing_files(tmp_path: Path, split: Path) -> None:
    with pytest.raises(FileNotFoundError, match="digitStruct.mat"):
        read_digit_struct(tmp_path / "nowhere" / "digitStruct.mat")
    (split / "2.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"2\.png.*digitStruct\.mat"):
        load_svhn_sequences(split)


def test_not_hdf5(tmp_path: Path) -> None:
    path = tmp_path / "digitStruct.mat"
    path.write_bytes(b"MATLAB 5.0 MAT-file" + bytes(200))
    with pytest.raises(SvhnFormatError, match=r"digitStruct\.mat.*not an HDF5 file.*v7\.3"):
        read_digit_struct(path)


def test_missing_keys(tmp_path: Path) -> None:
    path = tmp_path / "digitStruct.mat"
    with h5py.File(path, "w") as f:
        f.create_group("something")
    with pytest.raises(SvhnFormatError, match=r"no group 'digitStruct'.*something"):
        read_digit_struct(path)
    with h5py.File(path, "w") as f:
        f.create_group("digitStruct").create_dataset("name", (1, 1), dtype=h5py.ref_dtype)
    with pytest.raises(SvhnFormatError, match=r"digitStruct/bbox must be a dataset of object references.*name"):
        read_digit_struct(path)
    fields = fields_of(MULTI[1])
    del fields["height"]
    write_digit_struct(path, [("1.png", fields)])
    with pytest.raises(SvhnFormatError, match=r"bbox\[0\] \(1\.png\) has no field 'height'.*found"):
        read_digit_struct(path)


def test_field_length_mismatch(tmp_path: Path) -> None:
    fields = fields_of(MULTI[1])
    fields["left"] = fields["left"][:1]
    path = write_digit_struct(tmp_path / "digitStruct.mat", [("1.png", fields)])
    with pytest.raises(SvhnFormatError, match=r"same number.*'label': 3.*'left': 1"):
        read_digit_struct(path)


@pytest.mark.parametrize("label", [0, 11, 2.5])
def test_label_out_of_range(tmp_path: Path, label: float) -> None:
    fields = fields_of(MULTI[1])
    fields["label"][1] = label
    path = write_digit_struct(tmp_path / "digitStruct.mat", [("1.png", fields)])
    with pytest.raises(SvhnFormatError, match=r"digitStruct\.mat.*label.*1\.\.10.*index 1"):
        read_digit_struct(path)


def test_name_bbox_count_mismatch(tmp_path: Path) -> None:
    path = write_digit_struct(tmp_path / "digitStruct.mat", [MULTI[:1] + (fields_of(MULTI[1]),)])
    with h5py.File(path, "r+") as f:
        names = f["digitStruct/name"][()]
        del f["digitStruct/name"]
        ds = f["digitStruct"].create_dataset("name", (2, 1), dtype=h5py.ref_dtype)
        ds[0, 0] = ds[1, 0] = names[0, 0]
    with pytest.raises(SvhnFormatError, match="name has 2 entries but digitStruct/bbox has 1"):
        read_digit_struct(path)


# ----------------------------------------------------------------------------------------------- format 2


def write_cropped(path: Path, n: int, seed: int = 0, **override: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    y = (np.arange(n) % 10 + 1).astype(np.uint8).reshape(n, 1)  # 1..10, 10 = digit 0
    variables = {"X": x, "y": y, **override}
    scipy.io.savemat(path, {k: v for k, v in variables.items() if v is not None})
    return x, y


def test_read_cropped(tmp_path: Path) -> None:
    x, y = write_cropped(tmp_path / "train_32x32.mat", 12)
    images, labels = read_cropped_mat(tmp_path / "train_32x32.mat")
    assert images.shape == (12, 3, 32, 32) and images.dtype == torch.uint8 and images.is_contiguous()
    assert labels.dtype == torch.int64 and labels.tolist() == [(i % 10 + 1) % 10 for i in range(12)]
    assert int(labels[9]) == 0  # the file's 10
    # X[row, col, channel, image] -> images[image, channel, row, col]
    assert int(images[5, 2, 3, 7]) == int(x[3, 7, 2, 5])
    np.testing.assert_array_equal(images.numpy(), x.transpose(3, 2, 0, 1))


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"y": None}, r"missing variable\(s\) \['y'\].*found \['X'\]"),
        ({"X": np.zeros((32, 32, 5), np.uint8)}, r"X must be \(32, 32, 3, N\).*found \(32, 32, 5\)"),
        ({"X": np.zeros((32, 32, 3, 5), np.float32)}, "X must be uint8, found float32"),
        ({"y": np.ones((4, 1), np.uint8)}, "X holds 5 images but y holds 4 labels"),
        ({"y": np.zeros((5, 1), np.uint8)}, r"1\.\.10.*found 0 at index 0"),
        ({"y": np.full((5, 1), 11, np.uint8)}, r"1\.\.10.*found 11"),
    ],
)
def test_cropped_errors(tmp_path: Path, override: dict, match: str) -> None:
    path = tmp_path / "test_32x32.mat"
    write_cropped(path, 5, **override)
    with pytest.raises(SvhnFormatError, match=match) as info:
        read_cropped_mat(path)
    assert "test_32x32.mat" in str(info.value)


def test_cropped_unreadable(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train_32x32.mat"):
        load_svhn_cropped(tmp_path, "train")
    bad = tmp_path / "train_32x32.mat"
    bad.write_bytes(b"not a mat file at all" * 10)
    with pytest.raises(SvhnFormatError, match=r"train_32x32\.mat: not a readable MATLAB v5"):
        read_cropped_mat(bad)
    hdf5 = tmp_path / "v73.mat"
    write_digit_struct(hdf5, [("1.png", fields_of(MULTI[1]))])  # a v7.3 file with a MATLAB header
    with pytest.raises(SvhnFormatError, match=r"v73\.mat: a MATLAB v7\.3"):
        read_cropped_mat(hdf5)


# ----------------------------------------------------------------------------------------------- datasets


def test_builders(tmp_path: Path) -> None:
    assert {"svhn_cropped", "svhn_sequences"} <= set(available_datasets())
    root = tmp_path / "data"
    (root / "svhn").mkdir(parents=True)
    write_cropped(root / "svhn" / "train_32x32.mat", 10, seed=1)
    write_cropped(root / "svhn" / "test_32x32.mat", 4, seed=2)
    write_cropped(root / "svhn" / "extra_32x32.mat", 3, seed=3)
    splits = build_dataset("svhn_cropped", DataConfig(val_size=3, seed=1), root)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (7, 3, 4)
    assert splits.num_classes == 10 and splits.image_shape == (3, 32, 32)
    assert len(build_dataset("svhn_cropped", DataConfig(val_size=3, svhn_extra=True), root).train) == 10
    assert len(build_dataset("svhn_cropped", DataConfig(val_size=3, num_train=2, num_test=1), root).val) == 1
    with pytest.raises(ValueError, match="RLATTENTION_DATA"):
        build_svhn_cropped(DataConfig(), None)

    make_split(root / "train", [MULTI, SINGLE, LONG, ("4.png", SINGLE[1]), ("5.png", MULTI[1][:2])])
    make_split(root / "test", [SINGLE, MULTI])
    seq = build_dataset("svhn_sequences", DataConfig(val_size=1, seed=0), root)
    assert (len(seq.train), len(seq.val), len(seq.test)) == (3, 1, 2)  # the 6-digit number is dropped
    assert seq.num_classes == 11 and seq.image_shape == (3, 54, 54) and seq.train.targets.shape == (3, 6)
    assert seq.test.targets[1].tolist() == [1, 0, 5, 10, -1, -1]
    small = build_dataset("svhn_sequences", DataConfig(val_size=1, num_train=1, num_test=1), root)
    assert (len(small.train), len(small.val), len(small.test)) == (1, 1, 1)
