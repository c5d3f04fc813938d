"""Stroke sketches: the restricted unpickler (refuses code), the QMUL coordinate pickle (real file and malformed
ones), Omniglot stroke files (format, and alignment with their PNGs), partial renders (against a slow exact
reference; monotone; pen-ups respected) and the checked render cache (hits, keys, corrupt files rebuilt)."""

from __future__ import annotations

import io
import pickle
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rlattention.data import safe_pickle
from rlattention.data.cache import CACHE_ENV, resolve_cache_dir
from rlattention.data.readers import cifar
from rlattention.data.readers.strokes import (
    OMNIGLOT_FRAME,
    SketchFormatError,
    cache_file,
    cached_render_stack,
    check_sketch,
    parse_omniglot_strokes,
    parse_qmul_key,
    partial_counts,
    read_omniglot_strokes,
    read_qmul_coordinates,
    render_partials,
    render_partials_batch,
    sketch_frame,
)
from rlattention.data.safe_pickle import PickleReadError, UnsafePickleError, load_restricted_pickle

# ------------------------------------------------------------------------------------------ restricted pickles


def os_system_pickle(marker: Path) -> bytes:
    """PROTO 2, GLOBAL 'os system', the command, TUPLE1, REDUCE, STOP: runs ``touch marker`` under plain pickle."""
    command = f"touch {marker}".encode()
    return b"\x80\x02cos\nsystem\n" + pickle.SHORT_BINSTRING + bytes([len(command)]) + command + b"\x85R."


class Reduces:
    """An object whose pickle calls ``os.system`` (as ``posix.system`` on Linux) when loaded."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        import os

        return (os.system, (self.command,))


def test_restricted_pickle_refuses_os_system(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pkl"
    path.write_bytes(os_system_pickle(marker))
    with pytest.raises(UnsafePickleError, match=r"evil\.pkl: refused global os\.system: a test pickle"):
        load_restricted_pickle(path, "test pickle")
    assert not marker.exists()
    with pytest.raises(UnsafePickleError, match=r"ChairV2_Coordinate: refused global os\.system"):
        read_qmul_coordinates(_write(tmp_path / "ChairV2_Coordinate", os_system_pickle(marker)))
    path.write_bytes(pickle.dumps({"/train/a_1": Reduces(f"touch {marker}")}, protocol=4))
    with pytest.raises(UnsafePickleError, match=r"evil\.pkl: refused global (posix|os|nt)\.system"):
        read_qmul_coordinates(path)
    assert not marker.exists()
    path.write_bytes(pickle.dumps({"f": eval}, protocol=3))
    with pytest.raises(UnsafePickleError, match=r"refused global builtins\.eval"):
        load_restricted_pickle(path, "test pickle")


def test_restricted_pickle_reads_numpy_arrays_of_every_protocol(tmp_path: Path) -> None:
    data = {"/train/a_1": np.arange(6.0).reshape(2, 3), "n": [1, "x", b"y", None, True, 2.5]}
    for protocol in (3, 4, 5):  # 5: numpy pickles through _frombuffer
        path = tmp_path / f"p{protocol}"
        path.write_bytes(pickle.dumps(data, protocol=protocol))
        loaded = load_restricted_pickle(path, "test pickle")
        np.testing.assert_array_equal(loaded["/train/a_1"], data["/train/a_1"])
        assert loaded["n"] == data["n"]


def test_restricted_pickle_damaged_and_missing(tmp_path: Path) -> None:
    path = tmp_path / "cut.pkl"
    blob = pickle.dumps({"/train/a_1": np.zeros((5, 3))}, protocol=3)
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(PickleReadError, match=r"cut\.pkl: not a readable pickle.*truncated or corrupt: get a copy"):
        load_restricted_pickle(path, "test pickle", hint="get a copy")
    with pytest.raises(FileNotFoundError, match=r"test pickle not found: .*absent\.pkl"):
        load_restricted_pickle(tmp_path / "absent.pkl", "test pickle")


def test_cifar_keeps_its_error_types() -> None:
    assert issubclass(cifar.UnsafePickleError, safe_pickle.UnsafePickleError)
    assert issubclass(cifar.UnsafePickleError, cifar.CifarFormatError)


# ------------------------------------------------------------------------------------------------ QMUL pickle


def _write(path: Path, blob: bytes) -> Path:
    path.write_bytes(blob)
    return path


@pytest.fixture(scope="module")
def chairv2(require_data) -> Path:
    return require_data("qmul_chairv2")


def test_real_chairv2_coordinates(chairv2: Path) -> None:
    sketches = read_qmul_coordinates(chairv2 / "ChairV2_Coordinate")
    assert len(sketches) == 1275
    parsed = [parse_qmul_key(key) for key in sketches]
    assert sum(split == "train" for split, _ in parsed) == 952
    assert sum(split == "test" for split, _ in parsed) == 323
    train_ids = {photo for split, photo in parsed if split == "train"}
    test_ids = {photo for split, photo in parsed if split == "test"}
    assert (len(train_ids), len(test_ids)) == (300, 100) and not train_ids & test_ids
    assert all((chairv2 / "photo" / f"{photo}.png").is_file() for photo in train_ids | test_ids)
    assert parse_qmul_key("/test/CHABRA003GRY-UK_v1_PearlGrey_2") == ("test", "CHABRA003GRY-UK_v1_PearlGrey")
    assert parse_qmul_key("/test/sdich070-laque-rouge_A1YX741QQSMKPS") == ("test", "sdich070-laque-rouge")
    for sketch in sketches.values():
        assert sketch.dtype == np.float32 and sketch.shape[1] == 3 and 40 <= len(sketch) <= 519
        assert sketch[-1, 2] == 1.0  # every sketch ends a stroke
    points = np.concatenate(list(sketches.values()))
    assert points[:, :2].min() == 33.0 and points[:, :2].max() == 223.0  # drawn in the 256 x 256 photo frame


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ([np.zeros((3, 3))], r"expected a pickled dict of sketches, found list"),
        ({}, r"the dict holds no sketches"),
        ({"/val/chair_1": np.zeros((3, 3))}, r"key '/val/chair_1' does not look like '/train/<photo_id>_<n>'"),
        ({"train/chair_1": np.zeros((3, 3))}, r"key 'train/chair_1' does not look like"),
        ({"/train/chair": np.zeros((3, 3))}, r"key '/train/chair' does not look like"),
        ({"/train/chair_1": np.zeros((4, 2))}, r"key '/train/chair_1': a sketch must be a numeric \(N, 3\).*\(4, 2\)"),
        ({"/train/chair_1": np.zeros((3, 3, 1))}, r"key '/train/chair_1': a sketch must be .*\(3, 3, 1\)"),
        ({"/train/chair_1": np.zeros((0, 3))}, r"key '/train/chair_1': a sketch must have at least one point"),
        ({"/train/chair_1": np.array([[1.0, np.nan, 0.0]])}, r"key '/train/chair_1': coordinates must be finite"),
        ({"/test/chair_2": np.array([[1.0, 2.0, 2.0]])}, r"key '/test/chair_2': the third column \(pen_up\) must"),
        ({"/train/chair_1": [[1.0, 2.0, 1.0]]}, r"key '/train/chair_1': expected a numpy array, found list"),
    ],
)
def test_malformed_qmul_pickles(tmp_path: Path, content: object, match: str) -> None:
    path = _write(tmp_path / "ChairV2_Coordinate", pickle.dumps(content, protocol=3))
    with pytest.raises(SketchFormatError, match=match) as info:
        read_qmul_coordinates(path)
    assert str(path) in str(info.value)


def test_truncated_qmul_pickle(tmp_path: Path) -> None:
    blob = pickle.dumps({"/train/chair_1": np.zeros((30, 3))}, protocol=3)
    path = _write(tmp_path / "ChairV2_Coordinate", blob[:-20])
    with pytest.raises(SketchFormatError, match=r"ChairV2_Coordinate: not a readable pickle"):
        read_qmul_coordinates(path)
    with pytest.raises(FileNotFoundError, match="QMUL coordinate pickle not found"):
        read_qmul_coordinates(tmp_path / "missing")


# ----------------------------------------------------------------------------------------------- Omniglot text

STROKE_TEXT = "START\n1,-2,0\n3,-4,10\nBREAK\n5,-6,20\nBREAK\n"


def test_parse_omniglot_strokes(tmp_path: Path) -> None:
    expected = np.array([[1.5, 2.5, 0.0], [3.5, 4.5, 1.0], [5.5, 6.5, 1.0]], dtype=np.float32)
    np.testing.assert_array_equal(parse_omniglot_strokes(STROKE_TEXT), expected)
    path = tmp_path / "0001_01.txt"
    path.write_text(STROKE_TEXT.replace("\n", "\r\n"))
    np.testing.assert_array_equal(read_omniglot_strokes(path), expected)
    np.testing.assert_array_equal(read_omniglot_strokes(str(path)), expected)
    np.testing.assert_array_equal(read_omniglot_strokes(STROKE_TEXT.encode()), expected)
    np.testing.assert_array_equal(read_omniglot_strokes(STROKE_TEXT), expected)
    with pytest.raises(FileNotFoundError, match=r"Omniglot stroke file not found: .*absent\.txt"):
        read_omniglot_strokes(tmp_path / "absent.txt")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"starts with a line 'START', found an empty file"),
        ("1,-2,0\nBREAK\n", r"starts with a line 'START', found '1,-2,0'"),
        ("START\n1,-2\nBREAK\n", r"line 2: expected 'x,y,t_ms' \(three numbers\).*found '1,-2'"),
        ("START\n1,-2,0\nabc,1,2\nBREAK\n", r"line 3: expected 'x,y,t_ms'"),
        ("START\n1,-2,0\nBREAK\nBREAK\n", r"line 4: 'BREAK' ends a stroke without points"),
        ("START\n1,nan,0\nBREAK\n", r"line 2: coordinates must be finite"),
        ("START\n1,-2,0\nBREAK\n3,-4,5\n", r"last stroke is not closed by a 'BREAK'"),
        ("START\n", r"no points between 'START' and the end"),
        (b"START\n\xff,1,2\nBREAK\n", r"not an ASCII stroke file"),
    ],
)
def test_malformed_omniglot_strokes(text: str | bytes, match: str) -> None:
    with pytest.raises(SketchFormatError, match=f"^char01/0001_02.txt: .*{match}"):
        parse_omniglot_strokes(text, "char01/0001_02.txt")


def test_omniglot_strokes_align_with_their_png(require_data) -> None:
    """The parsed strokes, drawn 5 px wide in the PNG frame, cover the PNG's ink (y negated, pixel centres)."""
    folder = require_data("omniglot")
    with (
        zipfile.ZipFile(folder / "strokes_background_small1.zip") as strokes,
        zipfile.ZipFile(folder / "images_background_small1.zip") as images,
    ):
        names = sorted(n for n in strokes.namelist() if n.endswith(".txt") and not n.startswith("__MACOSX"))
        assert len(names) == 2720
        ious, flipped = [], []
        for name in names[::90]:  # 31 drawings of all 5 alphabets
            sketch = parse_omniglot_strokes(strokes.read(name), name)
            png = name.replace("strokes_background", "images_background").replace(".txt", ".png")
            ink = ~np.array(Image.open(io.BytesIO(images.read(png))).convert("1"))
            rendered = render_partials(sketch, steps=1, size=105, line_width=5.0, frame=OMNIGLOT_FRAME)[0] > 0
            ious.append((rendered & ink).sum() / (rendered | ink).sum())
            upside_down = sketch.copy()
            upside_down[:, 1] = 105.0 - upside_down[:, 1]
            other = render_partials(upside_down, steps=1, size=105, line_width=5.0, frame=OMNIGLOT_FRAME)[0] > 0
            flipped.append((other & ink).sum() / (other | ink).sum())
    assert np.median(ious) > 0.88 and np.min(ious) > 0.6, ious
    assert np.median(flipped) < 0.3  # without negating y the strokes miss the ink


# -------------------------------------------------------------------------------------------------- rendering


def reference_distance(sketch: np.ndarray, count: int, size: int, frame: tuple[float, ...]) -> np.ndarray:
    """Slow, obvious: distance (output pixels) from every pixel centre to the first ``count`` points drawn as
    dots joined within strokes."""
    x0, y0, x1, y1 = frame
    pts = (sketch[:count, :2].astype(np.float64) - [x0, y0]) * [size / (x1 - x0), size / (y1 - y0)]
    centres = np.stack(np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="xy"), -1)
    best = np.full((size, size), np.inf)
    for i in range(count):
        a = pts[i]
        b = pts[i + 1] if i + 1 < count and sketch[i, 2] == 0 else a
        ab = b - a
        t = np.clip(((centres - a) @ ab) / max(ab @ ab, 1e-12), 0.0, 1.0)
        best = np.minimum(best, np.linalg.norm(centres - (a + t[..., None] * ab), axis=-1))
    return best


def random_sketch(rng: np.random.Generator, n: int, extent: float) -> np.ndarray:
    sketch = np.zeros((n, 3), dtype=np.float32)
    sketch[:, :2] = np.cumsum(rng.normal(0.0, extent / 8, (n, 2)), axis=0) + extent / 2
    sketch[rng.random(n) < 0.2, 2] = 1.0
    sketch[-1, 2] = 1.0
    return sketch


@pytest.mark.parametrize("line_width", [1.0, 2.0, 3.5])
def test_render_matches_exact_reference(line_width: float) -> None:
    rng = np.random.default_rng(int(line_width * 10))
    frame = (0.0, 0.0, 20.0, 20.0)
    for _ in range(4):
        sketch = random_sketch(rng, 23, 20.0)
        steps, size, radius = 5, 24, line_width / 2
        renders = render_partials(sketch, steps=steps, size=size, line_width=line_width, frame=frame)
        for s, count in enumerate(partial_counts(len(sketch), steps)):
            distance = reference_distance(sketch, int(count), size, frame)
            ink = renders[s] == 255
            assert ink[distance <= radius - 0.05 * radius].all()  # sampling loses at most 3 % of the radius
            assert not ink[distance > radius + 1e-6].any()


def test_partial_counts_and_frame() -> None:
    assert partial_counts(10, 4).tolist() == [3, 5, 8, 10]
    assert partial_counts(2, 5).tolist() == [1, 1, 2, 2, 2]
    assert partial_counts(40, 17)[-1] == 40 and partial_counts(1, 17).tolist() == [1] * 17
    sketch = np.array([[0, 0, 0], [10, 4, 1]], dtype=np.float32)
    assert sketch_frame(sketch) == pytest.approx((-0.5, -3.5, 10.5, 7.5))
    assert sketch_frame(np.array([[3, 3, 1]])) == pytest.approx((2.45, 2.45, 3.55, 3.55))
    with pytest.raises(ValueError, match=r"need num_points >= 1"):
        partial_counts(0, 17)


def test_partials_are_monotone_and_end_complete(require_data) -> None:
    sketches = read_qmul_coordinates(require_data("qmul_chairv2") / "ChairV2_Coordinate")
    chosen = [sketches[key] for key in sorted(sketches)[::64]]
    stack = render_partials_batch(chosen, steps=17, size=64, line_width=2.0, frame=(0, 0, 256, 256))
    assert stack.shape == (len(chosen), 17, 64, 64) and stack.dtype == np.uint8
    assert set(np.unique(stack).tolist()) == {0, 255}
    ink = stack > 0
    assert (ink[:, 1:] >= ink[:, :-1]).all()  # step s + 1 contains step s
    assert (ink[:, 1:].sum((2, 3)) >= ink[:, :-1].sum((2, 3))).all()
    assert (ink[:, 0].sum((1, 2)) < ink[:, -1].sum((1, 2))).all()
    for sketch, renders in zip(chosen, stack, strict=True):
        complete = render_partials(sketch, steps=1, size=64, line_width=2.0, frame=(0, 0, 256, 256))[0]
        np.testing.assert_array_equal(renders[-1], complete)
    own = render_partials(chosen[0], steps=3, size=32)  # default frame: the sketch's own bounding box
    assert own[-1].any() and own.shape == (3, 32, 32)


def test_pen_up_breaks_the_line_and_dots() -> None:
    two_strokes = np.array([[2, 10, 0], [6, 10, 1], [14, 10, 0], [18, 10, 1]], dtype=np.float32)
    frame = (0, 0, 20, 20)
    broken = render_partials(two_strokes, steps=1, size=20, line_width=2.0, frame=frame)[0]
    assert broken[10, 4] == 255 and broken[10, 16] == 255  # on both strokes
    assert broken[10, 10] == 0 and broken[9, 10] == 0  # between them: no connecting line
    joined = two_strokes.copy()
    joined[1, 2] = 0.0
    assert render_partials(joined, steps=1, size=20, line_width=2.0, frame=frame)[0][10, 10] == 255
    dot = render_partials(np.array([[10.5, 10.5, 1]]), steps=2, size=20, line_width=3.0, frame=frame)
    assert (dot[0] == dot[1]).all() and dot[0][10, 10] == 255 and 5 <= (dot[0] > 0).sum() <= 13
    # one point per step: a dot, the first stroke, then the first point of the second one as a dot
    partial = render_partials(two_strokes, steps=4, size=20, line_width=2.0, frame=frame)
    assert partial[0][10, 2] == 255 and partial[0][10, 4] == 0
    assert partial[1][10, 4] == 255 and not partial[1][:, 12:].any()
    assert partial[2][10, 14] == 255 and partial[2][10, 16] == 0 and partial[3][10, 16] == 255
    thick = render_partials(two_strokes, steps=1, size=20, line_width=4.0, frame=frame)[0]
    assert (thick > 0).sum() > (broken > 0).sum()


def test_far_points_are_clipped_not_sampled() -> None:
    """A point far outside the frame (a glitch in a file) neither blows up memory nor breaks the line to it."""
    far = np.array([[10, 10, 0], [1e12, 5e11, 0], [12, 14, 1]], dtype=np.float32)
    renders = render_partials(far, steps=3, size=32, line_width=2.0, frame=(0, 0, 32, 32))
    assert (renders[0] > 0).sum() <= 4  # the first point only
    assert renders[1][20, 31] == 255  # the line towards (1e12, 5e11) leaves the raster at (31.5, 20.75)
    assert renders[2][14, 12] == 255


def test_render_argument_errors() -> None:
    sketch = np.array([[0, 0, 0], [1, 1, 1]], dtype=np.float32)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        render_partials(sketch, steps=0)
    with pytest.raises(ValueError, match="line_width must be >= 1"):
        render_partials(sketch, line_width=0.5)
    with pytest.raises(ValueError, match=r"frame \(x0, y0, x1, y1\) needs x1 > x0"):
        render_partials(sketch, frame=(0, 0, 0, 5))
    with pytest.raises(SketchFormatError, match=r"sketch: a sketch must be a numeric \(N, 3\)"):
        render_partials(np.zeros((3, 2)))
    with pytest.raises(SketchFormatError, match="sketch 1: coordinates must be finite"):
        render_partials_batch([sketch, np.array([[np.inf, 0, 1]])], frame=(0, 0, 2, 2))
    assert check_sketch([[1, 2, 1]]).dtype == np.float32


# ------------------------------------------------------------------------------------------------------ cache


class Builder:
    def __init__(self, value: int = 7) -> None:
        self.calls = 0
        self.value = value

    def __call__(self) -> np.ndarray:
        self.calls += 1
        return np.full((3, 4, 5), self.value, dtype=np.uint8) + np.arange(5, dtype=np.uint8)


KEY = {"source": {"path": "/x/ChairV2_Coordinate", "size": 10, "mtime_ns": 1}, "steps": 3, "line_width": 2.0}


def test_cache_hit_and_keys(tmp_path: Path) -> None:
    build = Builder()
    first = cached_render_stack(KEY, build, tmp_path)
    path = cache_file(KEY, tmp_path)
    assert path.is_file() and build.calls == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = cached_render_stack(KEY, build, tmp_path)
    assert build.calls == 1 and again.dtype == np.uint8
    np.testing.assert_array_equal(again, first)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left behind
    assert cache_file({**KEY, "line_width": 3.0}, tmp_path) != path
    assert cache_file({**KEY, "steps": 17}, tmp_path) != path
    assert cache_file({**KEY, "source": {**KEY["source"], "mtime_ns": 2}}, tmp_path) != path
    assert cache_file(dict(reversed(list(KEY.items()))), tmp_path) == path  # key order does not matter
    other = Builder(9)
    np.testing.assert_array_equal(cached_render_stack({**KEY, "line_width": 3.0}, other, tmp_path), other())
    cached_render_stack(KEY, Builder(), None)  # no cache: nothing written
    assert len(list(tmp_path.iterdir())) == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda blob: blob[: len(blob) // 2],  # truncated
        lambda blob: blob[:-1] + bytes([blob[-1] ^ 0xFF]),  # a flipped byte in the data
        lambda blob: blob[:20] + b"#" + blob[21:],  # a flipped byte in the header
        lambda blob: b"",
        lambda blob: b"not a safetensors file at all",
    ],
)
def test_corrupt_cache_is_detected_and_rebuilt(tmp_path: Path, damage) -> None:
    expected = cached_render_stack(KEY, Builder(), tmp_path)
    path = cache_file(KEY, tmp_path)
    path.write_bytes(damage(path.read_bytes()))
    build = Builder()
    with pytest.warns(UserWarning, match=f"render cache file {path} is invalid.*rebuilding"):
        rebuilt = cached_render_stack(KEY, build, tmp_path)
    assert build.calls == 1
    np.testing.assert_array_equal(rebuilt, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(cached_render_stack(KEY, build, tmp_path), expected)  # repaired
    assert build.calls == 1


def test_cache_of_another_key_and_unwritable_folder(tmp_path: Path) -> None:
    cached_render_stack(KEY, Builder(1), tmp_path)
    other_key = {**KEY, "steps": 4}
    cache_file(other_key, tmp_path).write_bytes(cache_file(KEY, tmp_path).read_bytes())
    with pytest.warns(UserWarning, match="stored key differs"):
        np.testing.assert_array_equal(cached_render_stack(other_key, Builder(2), tmp_path), Builder(2)())
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.warns(UserWarning, match="cannot write the render cache file"):
        np.testing.assert_array_equal(cached_render_stack(KEY, Builder(3), blocker / "cache"), Builder(3)())


def test_resolve_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert resolve_cache_dir(None) == Path("~/.cache/rlattention").expanduser()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert resolve_cache_dir(None) == tmp_path / "env"
    assert resolve_cache_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"  # the config value wins
    for off in ("", "none", "None", "off", "false"):
        assert resolve_cache_dir(off) is None
    monkeypatch.setenv(CACHE_ENV, "none")
    assert resolve_cache_dir(None) is None
