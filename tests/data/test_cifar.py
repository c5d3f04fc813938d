"""CIFAR-10 python pickles: small batches written in the real (Python 2, protocol 2) format, read back through
the restricted unpickler; malicious, truncated and malformed files are refused with the file named."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlattention.data.config import DataConfig
from rlattention.data.readers import cifar
from rlattention.data.readers.cifar import (
    CIFAR10_CLASSES,
    CIFAR10_DIR,
    CifarFormatError,
    UnsafePickleError,
    build_cifar10,
    find_cifar10_dir,
    load_cifar10,
    read_cifar_batch,
    read_cifar_meta,
    read_cifar_pickle,
)
from rlattention.data.registry import available_datasets, build_dataset


class Py2Pickler(pickle._Pickler):  # the pure-Python pickler, so that one opcode writer can be replaced
    """Writes ``bytes`` as Python 2 ``str`` (SHORT_BINSTRING / BINSTRING), as cPickle did for the real files;
    a Python 3 protocol 2 pickle would instead call ``_codecs.encode``."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def py2_pickle(obj: Any, numpy1: bool = True) -> bytes:
    """Protocol 2 bytes of ``obj``; ``numpy1`` names ``numpy.core.multiarray`` as numpy 1.x (the real files) did."""
    import io

    buffer = io.BytesIO()
    Py2Pickler(buffer, protocol=2).dump(obj)
    data = buffer.getvalue()
    if numpy1:
        data = data.replace(b"cnumpy._core.multiarray\n_reconstruct\n", b"cnumpy.core.multiarray\n_reconstruct\n")
    return data


def batch_dict(images: np.ndarray, labels: list[int], name: bytes = b"training batch 1 of 5") -> dict[bytes, Any]:
    return {
        b"batch_label": name,
        b"labels": labels,
        b"data": images.reshape(len(images), 3072),
        b"filenames": [f"img_{i}.png".encode() for i in range(len(images))],
    }


def fake_images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)


def write_cifar(folder: Path, per_batch: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A cifar-10-batches-py folder with five training batches and a test batch of ``per_batch`` images."""
    folder.mkdir(parents=True, exist_ok=True)
    train_x, train_y = [], []
    for i in range(1, 6):
        x, y = fake_images(per_batch, i), [(i + j) % 10 for j in range(per_batch)]
        (folder / f"data_batch_{i}").write_bytes(py2_pickle(batch_dict(x, y), numpy1=i % 2 == 1))
        train_x.append(x)
        train_y += y
    test_x, test_y = fake_images(per_batch, 0), [j % 10 for j in range(per_batch)]
    (folder / "test_batch").write_bytes(py2_pickle(batch_dict(test_x, test_y, b"testing batch 1 of 1")))
    meta = {b"label_names": [n.encode() for n in CIFAR10_CLASSES], b"num_cases_per_batch": 10000, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(py2_pickle(meta))
    return np.concatenate(train_x), np.array(train_y), test_x, np.array(test_y)


def test_py2_format_is_faithful(tmp_path: Path) -> None:
    data = py2_pickle(batch_dict(fake_images(2, 0), [1, 2]))
    assert b"_codecs" not in data and b"cnumpy.core.multiarray\n_reconstruct\n" in data
    raw = pickle.loads(data, encoding="bytes")  # the usual (unsafe) way gives bytes keys, as for the real files
    assert sorted(raw) == [b"batch_label", b"data", b"filenames", b"labels"]


def test_read_batch_layout(tmp_path: Path) -> None:
    x = fake_images(4, 7)
    path = tmp_path / "data_batch_1"
    path.write_bytes(py2_pickle(batch_dict(x, [3, 1, 4, 1])))
    images, labels = read_cifar_batch(path, expect_count=4)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64 and labels.tolist() == [3, 1, 4, 1]
    np.testing.assert_array_equal(images.numpy(), x)
    row = x.reshape(4, 3072)  # 1024 red, 1024 green, 1024 blue, each row-major
    assert int(images[2, 1, 0, 5]) == int(row[2, 1024 + 5]) and int(images[2, 2, 31, 31]) == int(row[2, 3071])
    raw = read_cifar_pickle(path)
    assert raw["batch_label"] == b"training batch 1 of 5" and raw["filenames"][0] == b"img_0.png"


def test_load_folder_meta_and_numpy2_pickles(tmp_path: Path) -> None:
    train_x, train_y, test_x, test_y = write_cifar(tmp_path / CIFAR10_DIR)
    assert find_cifar10_dir(tmp_path) == tmp_path / CIFAR10_DIR
    images, labels = load_cifar10(tmp_path, "train", batch_size=4)  # batches 2 and 4 name numpy._core
    assert images.shape == (20, 3, 32, 32)
    np.testing.assert_array_equal(images.numpy(), train_x)
    np.testing.assert_array_equal(labels.numpy(), train_y)
    images, labels = load_cifar10(tmp_path / CIFAR10_DIR, "test", batch_size=None)
    np.testing.assert_array_equal(images.numpy(), test_x)
    assert read_cifar_meta(tmp_path / CIFAR10_DIR / "batches.meta") == list(CIFAR10_CLASSES)
    with pytest.raises(
        CifarFormatError, match=r"data_batch_1: data must hold 10000 images \(10000, 3072\), found \(4, 3072\)"
    ):
        load_cifar10(tmp_path, "train")  # the real files hold 10000 images per batch


def test_malicious_pickle_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    command = f"touch {marker}".encode()
    # PROTO 2, GLOBAL 'os system', the command string, TUPLE1, REDUCE, STOP: os.system("touch ...") when loaded
    payload = b"\x80\x02cos\nsystem\n" + pickle.SHORT_BINSTRING + bytes([len(command)]) + command + b"\x85R."
    path = tmp_path / "data_batch_1"
    path.write_bytes(payload)
    with pytest.raises(UnsafePickleError, match=r"data_batch_1: refused global os\.system") as info:
        read_cifar_batch(path)
    assert isinstance(info.value, CifarFormatError) and not marker.exists()
    # a pickle written by Python 3 with bytes needs _codecs.encode, which the real files never reference
    path.write_bytes(pickle.dumps({b"data": b"x"}, protocol=2))
    with pytest.raises(UnsafePickleError, match="refused global _codecs.encode"):
        read_cifar_pickle(path)
    path.write_bytes(pickle.dumps({"f": eval}, protocol=2))
    with pytest.raises(UnsafePickleError, match=r"refused global (__builtin__|builtins)\.eval"):
        read_cifar_pickle(path)


def test_truncated_and_not_a_dict(tmp_path: Path) -> None:
    data = py2_pickle(batch_dict(fake_images(4, 0), [0, 1, 2, 3]))
    path = tmp_path / "test_batch"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CifarFormatError, match=r"test_batch: not a readable pickle.*truncated or corrupt"):
        read_cifar_batch(path)
    path.write_bytes(b"")
    with pytest.raises(CifarFormatError, match="test_batch: not a readable pickle"):
        read_cifar_batch(path)
    path.write_bytes(py2_pickle([1, 2, 3]))
    with pytest.raises(CifarFormatError, match="test_batch: expected a pickled dict, found list"):
        read_cifar_batch(path)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({b"data": np.zeros((4, 3071), np.uint8)}, r"data must be uint8 \(4, 3072\), found uint8 \(4, 3071\)"),
        (
            {b"data": np.zeros((4, 3, 32, 32), np.uint8)},
            r"data must be uint8 \(4, 3072\), found uint8 \(4, 3, 32, 32\)",
        ),
        ({b"data": np.zeros((4, 3072), np.float32)}, r"data must be uint8 .* found float32"),
        ({b"data": np.zeros((5, 3072), np.uint8)}, r"must hold 4 images \(4, 3072\), found \(5, 3072\)"),
        ({b"labels": [0, 1, 2]}, "4 images but 3 labels"),
        ({b"labels": [0, 1, 10, 3]}, r"labels must be in 0\.\.9, found 10 at index 2"),
        ({b"labels": None}, r"missing key\(s\) \['labels'\]"),
    ],
)
def test_malformed_batches(tmp_path: Path, change: dict, match: str) -> None:
    content = batch_dict(fake_images(4, 0), [0, 1, 2, 3])
    for key, value in change.items():
        if value is None:
            del content[key]
        else:
            content[key] = value
    path = tmp_path / "data_batch_3"
    path.write_bytes(py2_pickle(content))
    with pytest.raises(CifarFormatError, match=match) as info:
        read_cifar_batch(path, expect_count=4)
    assert "data_batch_3" in str(info.value)


def test_missing_files_and_bad_meta(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"data_batch_1.*test_batch.*searched"):
        find_cifar10_dir(tmp_path)
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="extract it first"):
        load_cifar10(tmp_path, "test")
    with pytest.raises(FileNotFoundError, match="batches.meta"):
        read_cifar_meta(tmp_path / "batches.meta")
    (tmp_path / "batches.meta").write_bytes(py2_pickle({b"label_names": [b"cat"]}))
    with pytest.raises(CifarFormatError, match="label_names must be a list of 10 names, found list of 1"):
        read_cifar_meta(tmp_path / "batches.meta")


def test_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "cifar10" in available_datasets()
    write_cifar(tmp_path / "cifar10" / CIFAR10_DIR)
    monkeypatch.setattr(cifar, "_BATCH_SIZE", 4)  # the builder insists on full batches; these hold 4
    splits = build_dataset("cifar10", DataConfig(val_size=6, seed=2), tmp_path)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (14, 6, 4)
    assert splits.num_classes == 10 and splits.image_shape == (3, 32, 32) and splits.name == "cifar10"
    again = build_dataset("cifar10", DataConfig(val_size=6, seed=2), tmp_path)
    assert torch.equal(again.val.images, splits.val.images)
    small = build_dataset("cifar10", DataConfig(val_size=6, num_train=5, num_test=2), tmp_path)
    assert (len(small.train), len(small.val), len(small.test)) == (5, 2, 2)
    with pytest.raises(ValueError, match="RLATTENTION_DATA"):
        build_cifar10(DataConfig(), None)
