"""Bad input, every reader: truncated, empty, wrongly typed and malicious files, and wrong CLI arguments.

Every case must fail with an exception of a clear type whose message names the offending file (or key) and
what was expected, and nothing may be written outside the data folder and the designated cache (the current
directory, ``HOME`` and ``RLATTENTION_CACHE`` point into the test's temp folder, which is snapshotted before
and after). Hypothesis fuzzes the config loader, the MNIST idx parser and the precomp caption reader.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from rlattention.data import photos, text
from rlattention.data.readers import cifar, coco, mnist, precomp, reid, sketch_retrieval, strokes, svhn, voc
from rlattention.data.safe_pickle import UnsafePickleError
from rlattention.engine.config import ConfigError, load_config

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# ----------------------------------------------------------------------------------------------- sandbox


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


class Sandbox(NamedTuple):
    root: Path
    data: Path  # the data folder: the only place bad files are written to
    cache: Path  # RLATTENTION_CACHE
    marker: Path  # what a malicious payload would create


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd, HOME and RLATTENTION_CACHE inside ``tmp_path``; afterwards nothing may have appeared or changed
    outside ``data/`` and ``cache/`` (checked against a snapshot, on top of the test's own assertions)."""
    box = Sandbox(tmp_path, tmp_path / "data", tmp_path / "cache", tmp_path / "pwned")
    for name in ("data", "cache", "home", "cwd"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLATTENTION_CACHE", str(box.cache))
    monkeypatch.setenv("MPLCONFIGDIR", str(box.cache / "matplotlib"))  # matplotlib's font cache, on import
    monkeypatch.chdir(tmp_path / "cwd")
    yield box
    outside = {k: v for k, v in _tree(tmp_path).items() if not k.startswith(("data", "cache"))}
    assert outside == {}, f"files written outside the data folder: {sorted(outside)}"
    assert not box.marker.exists()


class _Payload:
    """Unpickling this calls ``os.system``: the readers must refuse it without calling anything."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_pickle(box: Sandbox, protocol: int) -> bytes:
    return pickle.dumps({"data": _Payload(box.marker)}, protocol=protocol)


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _png(side: int = 4) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (side, side), 255).save(buf, format="PNG")
    return buf.getvalue()


def _idx(dims: tuple[int, ...], payload: bytes) -> bytes:
    return bytes([0, 0, 0x08, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims) + payload


# ----------------------------------------------------------------------------------------------- the table


class Case(NamedTuple):
    build: Callable[[Sandbox], tuple[Callable[[], Any], str]]  # writes the bad file(s): (call, name in message)
    error: type[BaseException]
    fragment: str  # part of the message saying what was wrong / expected (lower case)


def _file(name: str, data: bytes, call: Callable[[Path], Any], shown: str | None = None):
    def build(box: Sandbox):
        path = box.data / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return (lambda: call(path)), shown or path.name

    return build


def _mnist_folder(images: bytes, labels: bytes, broken: str):
    def build(box: Sandbox):
        (box.data / "train-images-idx3-ubyte").write_bytes(images)
        (box.data / "train-labels-idx1-ubyte").write_bytes(labels)
        return (lambda: mnist.load_mnist(box.data, "train")), broken

    return build


def _cifar_tar(box: Sandbox):
    """A cifar-10-python.tar.gz whose member climbs out of the data folder: the reader never extracts it."""
    path = box.data / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in ("../evil.txt", "cifar-10-batches-py/test_batch"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    return (lambda: cifar.load_cifar10(box.data, "train")), path.name


def _omniglot(images_members: dict[str, bytes], strokes_members: dict[str, bytes], broken: str):
    def build(box: Sandbox):
        _zip(box.data / "images_background_small1.zip", images_members)
        _zip(box.data / "strokes_background_small1.zip", strokes_members)
        return (lambda: sketch_retrieval.load_omniglot_sketch_index(box.data, [1])), broken

    return build


_GOOD_PNGS = {f"images_background/Greek/character01/0101_{i:02d}.png": _png() for i in (1, 2)}
_GOOD_STROKES = {"strokes_background/Greek/character01/0101_02.txt": b"START\n1,2,0\n3,4,10\nBREAK\n"}


def _omniglot_reid(members: dict[str, bytes], broken: str):
    def build(box: Sandbox):
        for name in reid.OMNIGLOT_REID_ZIPS:
            _zip(box.data / name, members)
        return (lambda: reid.build_omniglot_reid(SimpleNamespace(reid_size=[8, 8], reid_val_ids=0), box.data)), broken

    return build


def _market(train_bytes: bytes, name: str = "0001_c1s1_000001_00.jpg"):
    def build(box: Sandbox):
        folder = box.data / "market1501"
        for sub in reid.REID_SUBDIRS:
            (folder / sub).mkdir(parents=True)
        (folder / "bounding_box_train" / name).write_bytes(train_bytes)
        (folder / "query" / "0002_c1s1_000001_00.jpg").write_bytes(train_bytes)
        (folder / "bounding_box_test" / "0002_c2s1_000001_00.jpg").write_bytes(train_bytes)
        cfg = SimpleNamespace(reid_val_ids=0, reid_size=[8, 4])
        return (lambda: reid.build_market1501(cfg, box.data)), name

    return build


def _precomp(features: bytes | np.ndarray, captions: bytes, broken: str, per_image: int = 1):
    def build(box: Sandbox):
        ims = box.data / "test_ims.npy"
        if isinstance(features, np.ndarray):
            np.save(ims, features, allow_pickle=features.dtype == object)
        else:
            ims.write_bytes(features)
        (box.data / "test_caps.txt").write_bytes(captions)
        return (lambda: precomp.read_precomp_split(box.data, "test", per_image)), broken

    return build


def _voc_image_set(data: bytes):
    def build(box: Sandbox):
        main = box.data / "VOC2007" / "ImageSets" / "Main"
        main.mkdir(parents=True)
        (box.data / "VOC2007" / "Annotations").mkdir()
        (main / "test.txt").write_bytes(data)
        return (lambda: voc.load_voc2007(box.data, "test")), "test.txt"

    return build


def _mat_v5(**variables: Any) -> bytes:
    import scipy.io

    buf = io.BytesIO()
    scipy.io.savemat(buf, variables)
    return buf.getvalue()


_COCO_OK = {"images": [{"id": 1, "file_name": "a.jpg"}], "categories": [{"id": 1, "name": "cat"}]}
_CIFAR_DATA = np.zeros((2, 3072), np.uint8)
_VOC_XML = b"<annotation><object><name>cat</name></object></annotation>"
_BILLION_LAUGHS = b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">]><annotation>&lol;</annotation>'

CASES: dict[str, Case] = {
    # MNIST idx
    "mnist/empty": Case(_file("t.idx", b"", mnist.read_idx), mnist.IdxFormatError, "too short"),
    "mnist/truncated": Case(
        _file("t.idx", _idx((3, 28, 28), b"\0" * 100), mnist.read_idx), mnist.IdxFormatError, "truncated"
    ),
    "mnist/html": Case(_file("t.idx", b"<!DOCTYPE html><html>", mnist.read_idx), mnist.IdxFormatError, "html"),
    "mnist/bad-gzip": Case(_file("t.idx.gz", b"\x1f\x8b\x08garbage", mnist.read_idx), mnist.IdxFormatError, "gzip"),
    "mnist/labels-out-of-range": Case(
        _mnist_folder(_idx((1, 28, 28), b"\0" * 784), _idx((1,), b"\x0b"), "train-labels-idx1-ubyte"),
        mnist.IdxFormatError,
        "labels must be in 0..9",
    ),
    "mnist/images-as-labels": Case(
        _mnist_folder(_idx((2,), b"\0\0"), _idx((2,), b"\0\0"), "train-images-idx3-ubyte"),
        mnist.IdxFormatError,
        "wrong magic",
    ),
    # SVHN
    "svhn/empty-mat": Case(_file("train_32x32.mat", b"", svhn.read_cropped_mat), svhn.SvhnFormatError, "matlab v5"),
    "svhn/truncated-mat": Case(
        _file(
            "train_32x32.mat",
            _mat_v5(X=np.zeros((32, 32, 3, 4), np.uint8), y=np.ones((4, 1)))[:300],
            svhn.read_cropped_mat,
        ),
        svhn.SvhnFormatError,
        "matlab v5",
    ),
    "svhn/missing-y": Case(
        _file("train_32x32.mat", _mat_v5(X=np.zeros((32, 32, 3, 1), np.uint8)), svhn.read_cropped_mat),
        svhn.SvhnFormatError,
        "missing variable",
    ),
    "svhn/json-as-mat": Case(
        _file("train_32x32.mat", b'{"X": 1}', svhn.read_cropped_mat), svhn.SvhnFormatError, "expected x and y"
    ),
    "svhn/digitstruct-text": Case(
        _file("digitStruct.mat", b"hello", svhn.read_digit_struct), svhn.SvhnFormatError, "hdf5"
    ),
    # CIFAR
    "cifar/empty": Case(
        _file("data_batch_1", b"", cifar.read_cifar_batch), cifar.CifarFormatError, "truncated or corrupt"
    ),
    "cifar/truncated": Case(
        _file(
            "data_batch_1",
            pickle.dumps({"data": _CIFAR_DATA, "labels": [0, 1]}, protocol=4)[:200],
            cifar.read_cifar_batch,
        ),
        cifar.CifarFormatError,
        "truncated or corrupt",
    ),
    "cifar/list": Case(
        _file("data_batch_1", pickle.dumps([1, 2]), cifar.read_cifar_batch),
        cifar.CifarFormatError,
        "expected a pickled dict",
    ),
    "cifar/missing-labels": Case(
        _file(
            "data_batch_1", pickle.dumps({"data": _CIFAR_DATA}, protocol=4), lambda p: cifar.read_cifar_batch(p, None)
        ),
        cifar.CifarFormatError,
        "missing key",
    ),
    "cifar/float-labels": Case(
        _file(
            "data_batch_1",
            pickle.dumps({"data": _CIFAR_DATA, "labels": [0.5, 1]}, protocol=4),
            lambda p: cifar.read_cifar_batch(p, None),
        ),
        cifar.CifarFormatError,
        "list of ints",
    ),
    "cifar/tar-only": Case(_cifar_tar, FileNotFoundError, "extract it first"),
    # Pascal VOC
    "voc/empty-xml": Case(_file("a.xml", b"", voc.parse_annotation), voc.VocFormatError, "malformed xml"),
    "voc/truncated-xml": Case(_file("a.xml", _VOC_XML[:30], voc.parse_annotation), voc.VocFormatError, "malformed xml"),
    "voc/entities": Case(_file("a.xml", _BILLION_LAUGHS, voc.parse_annotation), voc.VocFormatError, "refused"),
    "voc/binary-image-set": Case(_voc_image_set(b"\xff\xfe\x00garbage\n"), voc.VocFormatError, "utf-8"),
    "voc/empty-image-set": Case(_voc_image_set(b""), voc.VocFormatError, "no image ids"),
    # COCO
    "coco/empty": Case(_file("instances.json", b"", coco.read_coco_instances), coco.CocoFormatError, "not valid json"),
    "coco/truncated": Case(
        _file("instances.json", json.dumps(_COCO_OK).encode()[:40], coco.read_coco_instances),
        coco.CocoFormatError,
        "not valid json",
    ),
    "coco/missing-annotations": Case(
        _file("instances.json", json.dumps(_COCO_OK).encode(), coco.read_coco_instances),
        coco.CocoFormatError,
        "'annotations'",
    ),
    "coco/list-image-id": Case(
        _file(
            "instances.json",
            json.dumps({**_COCO_OK, "annotations": [{"image_id": [1], "category_id": 1}]}).encode(),
            coco.read_coco_instances,
        ),
        coco.CocoFormatError,
        "image_id [1]",
    ),
    "coco/dict-category-id": Case(
        _file(
            "instances.json",
            json.dumps({**_COCO_OK, "annotations": [{"image_id": 1, "category_id": {"a": 1}}]}).encode(),
            coco.read_coco_instances,
        ),
        coco.CocoFormatError,
        "category_id",
    ),
    "coco/deeply-nested": Case(
        _file("instances.json", b"[" * 200_000, coco.read_coco_instances), coco.CocoFormatError, "json"
    ),
    # images that do not decode
    "photo/not-an-image": Case(
        _file("x.jpg", b"GIF89a garbage", lambda p: photos.read_resized_image(p, 8)),
        photos.ImageDecodeError,
        "cannot decode",
    ),
    "photo/truncated-png": Case(
        _file("x.png", _png(64)[:60], lambda p: photos.load_resized_images([p], 8)),
        photos.ImageDecodeError,
        "cannot decode",
    ),
    # precomp (features + captions)
    "precomp/empty-captions": Case(
        _file("test_caps.txt", b"", precomp.read_captions), precomp.PrecompFormatError, "no captions"
    ),
    "precomp/latin1-captions": Case(
        _file("test_caps.txt", b"caf\xe9\n", precomp.read_captions), precomp.PrecompFormatError, "not utf-8"
    ),
    "precomp/truncated-npy": Case(
        _precomp(b"\x93NUMPY\x01\x00v\x00{'descr'", b"a\n", "test_ims.npy"),
        precomp.PrecompFormatError,
        "not a readable .npy",
    ),
    "precomp/pickled-npy": Case(
        _precomp(np.array([_Payload(Path("/nonexistent/x"))], dtype=object), b"a\n", "test_ims.npy"),
        precomp.PrecompFormatError,
        "not a readable .npy",
    ),
    "precomp/wrong-count": Case(
        _precomp(np.zeros((2, 1, 3), np.float32), b"a\nb\nc\n", "test_caps.txt"),
        precomp.PrecompFormatError,
        "wrong caption count",
    ),
    # GloVe / vocabulary (the caption side of the text readers)
    "text/vocab-empty": Case(_file("vocab.json", b"", text.Vocabulary.load), text.VocabularyError, "not valid json"),
    "text/vocab-wrong-type": Case(
        _file("vocab.json", b"[1, 2]", text.Vocabulary.load), text.VocabularyError, "expected a json object"
    ),
    "text/glove-ragged": Case(
        _file("glove.txt", b"a 1 2\nb 1\n", lambda p: text.load_glove(p, text.Vocabulary.build(["a b"]))),
        text.GloveFormatError,
        "line 2",
    ),
    # QMUL ChairV2 coordinate pickle
    "qmul/empty": Case(
        _file("ChairV2_Coordinate", b"", strokes.read_qmul_coordinates),
        strokes.SketchFormatError,
        "truncated or corrupt",
    ),
    "qmul/truncated": Case(
        _file("ChairV2_Coordinate", pickle.dumps({"/train/a_1": np.zeros((4, 3))})[:50], strokes.read_qmul_coordinates),
        strokes.SketchFormatError,
        "truncated or corrupt",
    ),
    "qmul/list": Case(
        _file("ChairV2_Coordinate", pickle.dumps([1]), strokes.read_qmul_coordinates),
        strokes.SketchFormatError,
        "expected a pickled dict",
    ),
    "qmul/bad-key": Case(
        _file("ChairV2_Coordinate", pickle.dumps({"chair": np.zeros((2, 3))}), strokes.read_qmul_coordinates),
        strokes.SketchFormatError,
        "does not look like",
    ),
    "qmul/string-array": Case(
        _file(
            "ChairV2_Coordinate",
            pickle.dumps({"/train/a_1": np.array([["a", "b", "c"]])}),
            strokes.read_qmul_coordinates,
        ),
        strokes.SketchFormatError,
        "numeric (n, 3)",
    ),
    # Omniglot zips (sketch retrieval and re-id)
    "omniglot/not-a-zip": Case(
        _omniglot(_GOOD_PNGS, _GOOD_STROKES, "images_background_small1.zip"),
        strokes.SketchFormatError,
        "not a readable zip",
    ),
    "omniglot/zip-slip": Case(
        _omniglot({**_GOOD_PNGS, "../evil.txt": b"evil"}, _GOOD_STROKES, "images_background_small1.zip"),
        strokes.SketchFormatError,
        "'..' path",
    ),
    "omniglot/zip-slip-png": Case(
        _omniglot(
            _GOOD_PNGS, {**_GOOD_STROKES, "strokes_background/../../x/y.txt": b""}, "strokes_background_small1.zip"
        ),
        strokes.SketchFormatError,
        "'..' path",
    ),
    "omniglot/missing-strokes": Case(
        _omniglot(_GOOD_PNGS, {"s/Greek/c/x.txt": b""}, "strokes_background_small1.zip"),
        strokes.SketchFormatError,
        "no stroke file",
    ),
    "omniglot/bad-strokes": Case(
        _file("0101_02.txt", b"\x00\xff binary", strokes.read_omniglot_strokes), strokes.SketchFormatError, "ascii"
    ),
    "omniglot/truncated-strokes": Case(
        _file("0101_02.txt", b"START\n1,2,0\n3,", strokes.read_omniglot_strokes), strokes.SketchFormatError, "line 3"
    ),
    "omniglot_reid/zip-slip": Case(
        _omniglot_reid({"../evil.png": _png(), **_GOOD_PNGS}, "images_background_small1.zip"),
        reid.ReidFormatError,
        "'..' path",
    ),
    "omniglot_reid/bad-png": Case(
        _omniglot_reid({f"i/Greek/c/0101_{i:02d}.png": b"not a png" for i in range(1, 5)}, "0101_01.png"),
        photos.ImageDecodeError,
        "cannot decode",
    ),
    # Market-1501-style folders
    "market/bad-image": Case(_market(b"\xff\xd8\xff truncated jpeg"), photos.ImageDecodeError, "cannot decode"),
    "market/bad-name": Case(_market(b"", "holiday.jpg"), reid.ReidFormatError, "not a market-1501"),
}


def _omniglot_not_a_zip(case: Case) -> Case:  # the images "zip" is a text file
    def build(box: Sandbox):
        call, name = case.build(box)
        (box.data / name).write_text("not a zip")
        return call, name

    return case._replace(build=build)


CASES["omniglot/not-a-zip"] = _omniglot_not_a_zip(CASES["omniglot/not-a-zip"])


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_file_is_a_clear_error(case: Case, sandbox: Sandbox):
    call, name = case.build(sandbox)
    with pytest.raises(case.error) as info:
        call()
    message = str(info.value)
    assert name in message, message
    assert case.fragment in message.lower(), message
    assert "\n" not in message.strip(), message
    assert not (sandbox.root / "evil.txt").exists() and not (sandbox.root / "evil.png").exists()


# ----------------------------------------------------------------------------------------------- malicious pickles


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize(
    ("filename", "read", "error"),
    [
        ("data_batch_1", cifar.read_cifar_batch, cifar.UnsafePickleError),
        ("batches.meta", cifar.read_cifar_meta, cifar.UnsafePickleError),
        ("ChairV2_Coordinate", strokes.read_qmul_coordinates, UnsafePickleError),
    ],
)
def test_code_running_pickle_is_refused(sandbox: Sandbox, protocol, filename, read, error):
    path = sandbox.data / filename
    path.write_bytes(_evil_pickle(sandbox, protocol))
    with pytest.raises(error) as info:
        read(path)
    assert filename in str(info.value) and "system" in str(info.value)
    assert not sandbox.marker.exists()


def test_code_running_pickle_is_refused_by_the_cifar_dataset(sandbox: Sandbox):
    folder = sandbox.data / cifar.CIFAR10_DIR
    folder.mkdir()
    for name in (*cifar.TRAIN_BATCHES, cifar.TEST_BATCH):
        (folder / name).write_bytes(_evil_pickle(sandbox, 2))
    with pytest.raises(cifar.UnsafePickleError, match="data_batch_1"):
        cifar.build_cifar10(SimpleNamespace(), sandbox.data)
    assert not sandbox.marker.exists()


# ----------------------------------------------------------------------------------------------- hypothesis


_KEYS = st.sampled_from(
    [
        "method",
        "model",
        "data",
        "trainer",
        "optim",
        "eval",
        "trainer.epochs",
        "trainer.devices",
        "model.num_glimpses",
        "data.name",
        "optim.lr",
        "eval.split",
        "bogus",
        "model.bogus",
        "trainer.epochs.x",
        "",
    ]
)
_VALUES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["1", "-1", "1.5", "null", "true", "[1, 2]", "{a: 1}", "ram", "nope", ".inf", "[", "!!python/name:os.system"]
    ),
)
_YAML_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=8))
_YAML_TREES = st.recursive(
    _YAML_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(_KEYS, st.text(max_size=6)), inner, max_size=3)
    ),
    max_leaves=8,
)


@FUZZ
@given(st.lists(st.one_of(st.builds("{}={}".format, _KEYS, _VALUES), st.text(max_size=15)), max_size=3))
def test_fuzz_config_overrides(overrides):
    try:
        load_config(None, overrides)
    except ConfigError as err:
        assert str(err).strip() and "\n" not in str(err).strip()


@FUZZ
@given(
    st.one_of(st.dictionaries(st.one_of(_KEYS, st.text(max_size=6)), _YAML_TREES, max_size=4), st.binary(max_size=60))
)
def test_fuzz_config_files(content):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "exp.yaml"
        path.write_bytes(content if isinstance(content, bytes) else yaml.safe_dump(content).encode())
        try:
            load_config(path)
        except ConfigError as err:
            assert str(err).strip()


@FUZZ
@given(st.binary(max_size=80), st.booleans())
def test_fuzz_idx_random_bytes(data, compress):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "random.idx"
        path.write_bytes(gzip.compress(data) if compress else data)
        try:
            mnist.read_idx(path)
        except mnist.IdxFormatError as err:
            assert "random.idx" in str(err)


@FUZZ
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=3),
    st.sampled_from([(0x08, 1), (0x09, 1), (0x0B, 2), (0x0C, 4), (0x0D, 4), (0x0E, 8)]),
    st.integers(-6, 6),
    st.booleans(),
)
def test_fuzz_idx_valid_header_bad_payload(dims, dtype, delta, compress):
    code, itemsize = dtype
    need = int(np.prod(dims)) * itemsize
    header = bytes([0, 0, code, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)
    data = header + os.urandom(max(0, need + delta))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "payload.idx"
        path.write_bytes(gzip.compress(data) if compress else data)
        if need + delta == need or (delta < 0 and need == 0):
            assert mnist.read_idx(path).shape == tuple(dims)
        else:
            with pytest.raises(mnist.IdxFormatError, match="payload.idx.*(truncated|trailing)"):
                mnist.read_idx(path)


@FUZZ
@given(st.binary(max_size=80))
def test_fuzz_captions_random_bytes(data):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x_caps.txt"
        path.write_bytes(data)
        try:
            captions = precomp.read_captions(path)
        except precomp.PrecompFormatError as err:
            assert "x_caps.txt" in str(err)
        else:
            assert captions and all(c.strip() for c in captions)


_LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\ufeff"), min_size=1, max_size=12)


@FUZZ
@given(st.lists(_LINE.filter(str.strip), min_size=1, max_size=8), st.integers(1, 3), st.integers(1, 3))
def test_fuzz_captions_text_and_counts(lines, images, per_image):
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "test_caps.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        np.save(Path(folder) / "test_ims.npy", np.zeros((images, 1, 2), np.float32))
        assert precomp.read_captions(Path(folder) / "test_caps.txt") == lines
        if len(lines) == images * per_image:
            assert precomp.read_precomp_split(folder, "test", per_image).captions == lines
        else:
            with pytest.raises(
                precomp.PrecompFormatError, match="test_caps.txt.*wrong caption count|wrong caption count"
            ):
                precomp.read_precomp_split(folder, "test", per_image)


# ----------------------------------------------------------------------------------------------- CLI


def _cli_cases(box: Sandbox) -> dict[str, tuple[list[str], str]]:
    text_ckpt = box.data / "notes.ckpt"
    text_ckpt.write_text("this is not a checkpoint\n")
    bad_yaml = box.data / "bad.yaml"
    bad_yaml.write_text("trainer: [unclosed\n")
    out = f"trainer.out_dir={box.data / 'runs'}"
    return {
        "fit/missing-config": (["fit", "--config", str(box.data / "none.yaml"), out], "config file not found"),
        "fit/bad-yaml": (["fit", "--config", str(bad_yaml), out], "not valid yaml"),
        "fit/wrong-type": (["fit", "trainer.epochs=abc", out], "trainer.epochs"),
        "fit/model-scalar": (["fit", "model=3", out], "'model' must be a mapping"),
        "fit/unknown-method": (["fit", "method=nope", out], "unknown method"),
        "fit/unknown-dataset": (["fit", "data.name=nope", out], "nope"),
        "fit/resume-missing": (["fit", "--resume", str(box.data / "norun")], "not found"),
        "fit/resume-text": (["fit", "--resume", str(text_ckpt)], "notes.ckpt"),
        "eval/missing": (["eval", str(box.data / "none.ckpt")], "checkpoint not found"),
        "eval/text": (["eval", str(text_ckpt)], "notes.ckpt"),
        "viz/missing": (["viz", str(box.data / "none.ckpt"), "--out", str(box.data / "fig")], "checkpoint not found"),
        "viz/text": (["viz", str(text_ckpt), "--out", str(box.data / "fig")], "notes.ckpt"),
        "data/unknown-dataset": (["data", "info", "nope"], "nope"),
        "data/unknown-key": (["data", "info", "digits", "data.bogus=1"], "unknown key 'data.bogus'"),
        "data/no-name": (["data", "info"], "give a dataset name"),
        "bench/unknown": (["bench", "nope", "--out", str(box.data / "bench")], "unknown benchmark"),
        "bench/threads": (["bench", "--threads", "0", "--out", str(box.data / "bench")], "threads"),
    }


_CLI_IDS = [  # the keys of _cli_cases
    "fit/missing-config", "fit/bad-yaml", "fit/wrong-type", "fit/model-scalar", "fit/unknown-method",
    "fit/unknown-dataset", "fit/resume-missing", "fit/resume-text", "eval/missing", "eval/text", "viz/missing",
    "viz/text", "data/unknown-dataset", "data/unknown-key", "data/no-name", "bench/unknown", "bench/threads",
]  # fmt: skip


@pytest.mark.parametrize("which", _CLI_IDS)
def test_cli_wrong_arguments(which, sandbox: Sandbox, capsys):
    from rlattention.cli import main

    argv, fragment = _cli_cases(sandbox)[which]
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse errors and the handlers' own refusals
        code = stop.code
        err = str(stop.code) if isinstance(stop.code, str) else capsys.readouterr().err
    else:
        err = capsys.readouterr().err
    assert code not in (0, None), err
    lines = [line for line in err.strip().splitlines() if not line.startswith("usage:")]
    assert len(lines) == 1, err
    assert fragment.lower() in lines[0].lower(), err
