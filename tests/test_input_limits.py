"""Size and decompression bombs (issue 23): every compressed, archived, json or YAML input and every size setting
is checked against the documented caps of :mod:`rlattention.data.limits` before memory is allocated for it. Each
test asserts the one-line error (file or key, what was found, the limit) and that no file that existed before
(input folder, render cache) was changed. The caps are made small by monkeypatching, so the bombs stay small."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import sys
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path
from types import ModuleType

import pytest

from rlattention.data import limits
from rlattention.data.config import DataConfig
from rlattention.data.limits import InputLimitError, gunzip_limited
from rlattention.data.readers.coco import CocoFormatError, read_coco_instances
from rlattention.data.readers.mnist import MNIST_FILES, IdxFormatError, load_mnist, read_idx
from rlattention.data.readers.sketch_retrieval import build_omniglot_sketch, load_omniglot_sketch_index
from rlattention.data.readers.strokes import SketchFormatError
from rlattention.data.registry import build_dataset
from rlattention.engine.config import ConfigError, load_config

_TESTS = Path(__file__).resolve().parent


def _data_dir(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    return tmp_path / "data"


def _fixtures(name: str) -> ModuleType:
    """A test module of ``tests/data`` (not a package), imported by path for its small fixture builders."""
    module_name = f"_input_limits_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, _TESTS / "data" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[module_name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[module_name]


def snapshot(*folders: Path) -> dict[str, str]:
    """``{path: sha256}`` of every file under ``folders``."""
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in folders
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A render cache folder holding one existing entry (which must survive untouched)."""
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "renders-existing.safetensors").write_bytes(b"an existing cache entry")
    return folder


def _zeros_gzip(path: Path, size: int) -> Path:
    """A gzip file of ``size`` zero bytes, compressed 1 MiB at a time (never ``size`` bytes in memory)."""
    compressor, chunk = zlib.compressobj(9, zlib.DEFLATED, 31), bytes(1 << 20)
    with path.open("wb") as f:
        for start in range(0, size, len(chunk)):
            f.write(compressor.compress(chunk[: size - start]))
        f.write(compressor.flush())
    return path


# ----------------------------------------------------------------------------------------------------- gzip


def test_gzip_bomb_is_refused_while_inflating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mnist = _fixtures("test_mnist")
    rng = __import__("numpy").random.default_rng(0)
    for split, n in (("train", 20), ("test", 10)):  # a valid tiny MNIST folder (as test_mnist's tiny_mnist)
        images_name, labels_name = MNIST_FILES[split]
        mnist.write(tmp_path / images_name, mnist.idx_bytes(rng.integers(0, 256, (n, 28, 28), dtype="uint8")), True)
        mnist.write(tmp_path / labels_name, mnist.idx_bytes(rng.integers(0, 10, n, dtype="uint8")), True)
    images_gz = tmp_path / f"{MNIST_FILES['test'][0]}.gz"
    # the IDX header of 10x28x28 images followed by 16 MiB of zeros: a ~16 KB file that inflates 1000x
    header = bytes([0, 0, 8, 3]) + (10).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
    bomb = _zeros_gzip(tmp_path / "zeros.gz", 16 << 20)
    images_gz.write_bytes(gzip.compress(header, mtime=0) + bomb.read_bytes())  # two gzip members
    bomb.unlink()
    before = snapshot(tmp_path)
    assert images_gz.stat().st_size < 64 << 10

    monkeypatch.setattr(limits, "MAX_DECOMPRESSED_BYTES", 2 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(IdxFormatError) as err:
            load_mnist(tmp_path, "test")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert isinstance(err.value, InputLimitError) and "\n" not in message
    assert str(images_gz) in message and "inflates beyond 2,097,152 bytes" in message
    assert "MAX_DECOMPRESSED_BYTES" in message
    assert peak < 8 << 20  # streamed: the cap plus a chunk or two, never the 16 MiB
    assert snapshot(tmp_path) == before

    # with the default size cap, the compression ratio stops it (once past RATIO_CHECK_BYTES)
    monkeypatch.setattr(limits, "MAX_DECOMPRESSED_BYTES", 1 << 30)
    monkeypatch.setattr(limits, "RATIO_CHECK_BYTES", 1 << 20)
    with pytest.raises(IdxFormatError, match=r"inflates more than 200x .*MAX_COMPRESSION_RATIO"):
        read_idx(images_gz)
    assert snapshot(tmp_path) == before


def test_gunzip_limited_matches_gzip_for_valid_and_corrupt_data() -> None:
    payload = bytes(range(256)) * 1000
    two_members = gzip.compress(payload[:1000]) + gzip.compress(payload[1000:])
    assert gunzip_limited("x.gz", two_members) == gzip.decompress(two_members) == payload
    assert gunzip_limited("x.gz", two_members + b"\x00" * 7) == payload  # zero padding, as gzip.decompress
    with pytest.raises(EOFError):
        gunzip_limited("x.gz", two_members[:-20])
    with pytest.raises(zlib.error):
        gunzip_limited("x.gz", two_members[:-4] + b"\xff\xff\xff\xff")  # wrong ISIZE trailer: not trusted


# ------------------------------------------------------------------------------------------------------ zip


def _omniglot_with_big_stroke_file(tmp_path: Path, size: int) -> Path:
    """The tiny Omniglot folder of test_sketch_retrieval, with one query's stroke file ``size`` bytes long."""
    name = "Alpha/character01/0001_02"
    folder = _fixtures("test_sketch_retrieval").write_omniglot(_data_dir(tmp_path), skip_strokes=(name,))
    line = b"10,-10,0\n"
    with zipfile.ZipFile(folder / "strokes_background_small1.zip", "a", zipfile.ZIP_DEFLATED) as strokes:
        with strokes.open(f"strokes_background_small1/{name}.txt", "w") as member:
            member.write(b"START\n" + line * (size // len(line)) + b"BREAK\n")
    return folder


@pytest.mark.parametrize(
    ("cap", "message"),
    [
        ("MAX_DECOMPRESSED_BYTES", r"zip member declares 1,\d{3},\d{3} bytes, over the limit of 65,536 bytes"),
        ("RATIO_CHECK_BYTES", r"zip member inflates \d+x .* over the limit of 200x \(MAX_COMPRESSION_RATIO"),
    ],
)
def test_zip_member_over_the_caps_is_refused_before_reading(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, cap: str, message: str
) -> None:
    folder = _omniglot_with_big_stroke_file(tmp_path, 1 << 20)
    before = snapshot(tmp_path)
    monkeypatch.setattr(limits, cap, 64 << 10)
    read_sizes: list[int] = []
    real_read = zipfile.ZipExtFile.read
    monkeypatch.setattr(zipfile.ZipExtFile, "read", lambda self, n=-1: read_sizes.append(n) or real_read(self, n))
    cfg = DataConfig(image_size=16, completion_steps=2, val_size=1, render_cache=str(cache_dir))
    with pytest.raises(SketchFormatError, match=message) as err:
        build_omniglot_sketch(cfg, tmp_path / "data")
    assert isinstance(err.value, InputLimitError) and "\n" not in str(err.value)
    assert f"{folder / 'strokes_background_small1.zip'}:strokes_background_small1/Alpha/character01/0001_02.txt" in (
        str(err.value)
    )
    assert all(0 <= n < 1 << 16 for n in read_sizes)  # only the small members were read
    assert snapshot(tmp_path) == before  # neither the data nor the render cache changed


def test_zip_with_too_many_members(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _fixtures("test_sketch_retrieval").write_omniglot(_data_dir(tmp_path))
    before = snapshot(tmp_path)
    monkeypatch.setattr(limits, "MAX_ARCHIVE_MEMBERS", 10)  # the images zip has 9 members, the strokes zip 11
    with pytest.raises(SketchFormatError) as err:
        load_omniglot_sketch_index(tmp_path / "data")
    assert isinstance(err.value, InputLimitError)
    assert str(err.value) == (
        f"{folder / 'strokes_background_small1.zip'}: 11 zip members exceed the limit of 10 (rlattention.data.limits)"
    )
    monkeypatch.setattr(limits, "MAX_ARCHIVE_MEMBERS", 200_000)
    monkeypatch.setattr(limits, "MAX_ARCHIVE_TOTAL_BYTES", 100)  # declared sizes, summed before any read
    with pytest.raises(
        SketchFormatError, match=r"zip members declare [\d,]+ bytes in all, over the limit of 100 bytes"
    ):
        build_omniglot_sketch(DataConfig(image_size=16, val_size=1, render_cache=str(cache_dir)), tmp_path / "data")
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------------------------------- json


def test_json_with_too_many_categories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    coco = _fixtures("test_coco")
    data = coco.tiny_instances([f"t{i}.jpg" for i in range(6)])
    data["categories"] += [{"id": 1000 + k, "name": f"c{k}"} for k in range(47)]  # 50 in all
    path = coco.write_coco(tmp_path, "train2017", data, with_images=False)
    before = snapshot(tmp_path)
    monkeypatch.setattr(limits, "MAX_CATEGORIES", 20)
    with pytest.raises(CocoFormatError) as err:
        read_coco_instances(path)
    assert isinstance(err.value, InputLimitError)
    assert str(err.value) == f"{path}: 50 categories exceed the limit of 20 (rlattention.data.limits)"

    monkeypatch.setattr(limits, "MAX_CATEGORIES", 10_000)
    monkeypatch.setattr(limits, "MAX_TARGET_ELEMENTS", 200)  # 6 images x 50 categories = 300 target entries
    with pytest.raises(CocoFormatError, match=r"300 target entries \(6 images x 50 categories\) exceed .* 200"):
        read_coco_instances(path)

    monkeypatch.setattr(limits, "MAX_JSON_BYTES", 1000)  # checked on the file size, before parsing
    with pytest.raises(CocoFormatError, match=r"instances json of [\d,]+ bytes exceeds the limit of 1,000 bytes"):
        read_coco_instances(path)
    assert snapshot(tmp_path) == before
    assert json.loads(path.read_text()) == data


# ----------------------------------------------------------------------------------------------------- yaml


def _billion_laughs() -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join(["model:", *("  " + line for line in lines)]) + "\n"


def test_yaml_alias_bomb_fails_fast(tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(_billion_laughs())
    before = snapshot(tmp_path)
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert time.perf_counter() - start < 2.0
    assert str(err.value) == (
        f"{path}: line 2: YAML anchor '&a0' refused (anchors and aliases are not allowed in config files: "
        "write the values out)"
    )
    only_alias = tmp_path / "alias.yaml"
    only_alias.write_text("model:\n  num_glimpses: *n\n")
    with pytest.raises(ConfigError, match=r"alias\.yaml: line 2: YAML alias '\*n' refused"):
        load_config(only_alias)
    only_alias.unlink()
    assert snapshot(tmp_path) == before


def test_yaml_nested_too_deep_or_too_large(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("model:\n  x: " + "[" * 5000 + "]" * 5000 + "\n")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(deep)
    assert (
        str(err.value) == f"{deep}: line 2: nested more than 32 levels deep (MAX_YAML_DEPTH, rlattention.data.limits)"
    )
    monkeypatch.setattr(limits, "MAX_YAML_BYTES", 1000)
    with pytest.raises(ConfigError, match=r"deep\.yaml: config file of 10,013 bytes exceeds the limit of 1,000 bytes"):
        load_config(deep)
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------------------------- size keys


def test_canvas_and_glimpse_sizes_over_the_maximum(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("method: ram\ndata:\n  name: digits\n  canvas_size: 100000\n")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: data.canvas_size=100000: a side of 100000 px exceeds the maximum of 4096 px "
        "(MAX_IMAGE_SIDE, rlattention.data.limits)"
    )
    with pytest.raises(ConfigError, match=r"model\.glimpse_size=5000: a side of 5000 px exceeds the maximum of 4096"):
        load_config(None, ["method=ram", "model.glimpse_size=5000"])
    with pytest.raises(ConfigError, match=r"data\.reid_size=\[8192, 128\]: a side of 8192 px"):
        load_config(None, ["data.reid_size=[8192,128]"])
    assert load_config(None, ["data.canvas_size=4096"]).data.canvas_size == 4096  # the maximum itself is fine
    # the builders check too, before generating anything (they can be called without a config file)
    start = time.perf_counter()
    with pytest.raises(InputLimitError, match=r"data\.canvas_size=100000: a side of 100000 px"):
        build_dataset("digits", DataConfig(name="digits", canvas_size=100_000), None)
    assert time.perf_counter() - start < 2.0
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "name", ["../secret.jpg", "sub/../../secret.jpg", "/etc/passwd", "..\\secret.jpg", "", "C:secret.jpg"]
)
def test_coco_file_name_that_leaves_its_folder_is_refused(tmp_path: Path, name: str) -> None:
    """A COCO ``file_name`` with ``..``, an absolute path or nothing: one line naming the json, the entry and the
    name; the image beside the dataset folder is never opened and no file changes."""
    coco_tests = _fixtures("test_coco")
    root = _data_dir(tmp_path) / "coco"
    data = coco_tests.tiny_instances(["t0.jpg", "t1.jpg"])
    coco_tests.write_coco(root, "train2017", data)
    (tmp_path / "data" / "secret.jpg").write_bytes(b"not yours")
    data["images"][1]["file_name"] = name
    path = root / "annotations" / "instances_train2017.json"
    path.write_text(json.dumps(data))
    before = snapshot(tmp_path)
    with pytest.raises(CocoFormatError) as err:
        read_coco_instances(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "images[1].file_name" in message
    assert repr(name) in message and "inside its folder" in message
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("image_id", ["../../../secret", "/tmp/secret", "a/../../b"])
def test_voc_image_id_that_leaves_its_folder_is_refused(tmp_path: Path, image_id: str) -> None:
    """A VOC image set listing an id with ``..`` or an absolute path: one line naming the file, the line and the id;
    nothing is read outside ``VOC2007/`` and no file changes."""
    from rlattention.data.readers.voc import VocFormatError, read_image_set

    voc_dir = _fixtures("test_voc").write_tree(_data_dir(tmp_path))
    listing = voc_dir / "ImageSets" / "Main" / "trainval.txt"
    listing.write_text(f"000001\n{image_id}\n")
    before = snapshot(tmp_path)
    with pytest.raises(VocFormatError) as err:
        read_image_set(voc_dir, "trainval")
    message = str(err.value)
    assert "\n" not in message and f"{listing}:2" in message and repr(image_id) in message
    assert snapshot(tmp_path) == before
