"""Partial-sketch retrieval datasets: the layout contract (renders then photo, global photo indices), splits by
photo / character (validation gallery disjoint from training), the real QMUL-Chair-V2 and Omniglot files, tiny
hand-made folders, the render cache, and clear errors for missing photos, folders and stroke files."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rlattention.data.config import DataConfig
from rlattention.data.photos import read_resized_image
from rlattention.data.readers.sketch_retrieval import (
    QMUL_FRAME,
    build_omniglot_sketch,
    build_qmul_chairv2,
    find_omniglot_dir,
    find_qmul_chairv2_dir,
    gallery_photos,
    load_omniglot_sketch_index,
    load_qmul_chairv2_index,
)
from rlattention.data.readers.strokes import (
    OMNIGLOT_FRAME,
    SketchFormatError,
    parse_omniglot_strokes,
    read_qmul_coordinates,
    render_partials,
)
from rlattention.data.registry import available_datasets, build_dataset


def check_layout(splits, steps: int, size: int) -> None:
    for part in (splits.train, splits.val, splits.test):
        assert part.images.dtype == torch.uint8 and part.images.shape[1:] == (steps + 3, size, size)
        assert part.targets.dtype == torch.int64 and part.targets.shape == (len(part.images),)
        if len(part):
            assert 0 <= int(part.targets.min()) and int(part.targets.max()) < splits.num_classes
            renders = part.images[:, :steps].numpy()
            ink = renders > 0
            assert (renders[ink] == 255).all()  # ink 255 on 0
            assert (ink[:, 1:] >= ink[:, :-1]).all()  # partial renders grow


def photo_sets(splits) -> list[set[int]]:
    return [set(part.targets.tolist()) for part in (splits.train, splits.val, splits.test)]


# ------------------------------------------------------------------------------------------- real ChairV2


@pytest.fixture(scope="module")
def chairv2_dir(require_data) -> Path:
    return require_data("qmul_chairv2")


@pytest.fixture(scope="module")
def chairv2_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("render_cache")


@pytest.fixture(scope="module")
def chairv2(chairv2_dir: Path, chairv2_cache: Path):
    cfg = DataConfig(name="qmul_chairv2", image_size=32, val_size=30, seed=3, render_cache=str(chairv2_cache))
    return build_dataset("qmul_chairv2", cfg, chairv2_dir.parent)  # the shared folder: found inside


def test_chairv2_layout_and_splits(chairv2, chairv2_dir: Path) -> None:
    assert "qmul_chairv2" in available_datasets() and "omniglot_sketch" in available_datasets()
    assert chairv2.name == "qmul_chairv2" and chairv2.num_classes == 400
    check_layout(chairv2, 17, 32)
    assert (len(chairv2.train) + len(chairv2.val), len(chairv2.test)) == (952, 323)
    train, val, test = photo_sets(chairv2)
    assert (len(train), len(val), len(test)) == (270, 30, 100)  # split by photo
    assert not train & val and not test & (train | val)
    index = load_qmul_chairv2_index(chairv2_dir)
    assert index.photo_ids == sorted(index.photo_ids) and len(index.photo_ids) == 400
    test_ids = {index.photo_ids[int(t)] for t, s in zip(index.targets, index.splits, strict=True) if s == "test"}
    assert {index.photo_ids[t] for t in test} == test_ids


def test_chairv2_channels_are_renders_then_photo(chairv2, chairv2_dir: Path) -> None:
    index = load_qmul_chairv2_index(chairv2_dir)
    sketches = read_qmul_coordinates(chairv2_dir / "ChairV2_Coordinate")
    test_keys = [k for k in index.keys if k.startswith("/test/")]  # test rows: test sketches in key order
    for row in (0, 100, 322):
        key = test_keys[row]
        target = int(chairv2.test.targets[row])
        assert key.startswith(f"/test/{index.photo_ids[target]}_")
        expected = render_partials(sketches[key], steps=17, size=32, line_width=2.0, frame=QMUL_FRAME)
        np.testing.assert_array_equal(chairv2.test.images[row, :17].numpy(), expected)
        photo = read_resized_image(chairv2_dir / "photo" / f"{index.photo_ids[target]}.png", 32).transpose(2, 0, 1)
        np.testing.assert_array_equal(chairv2.test.images[row, 17:].numpy(), photo)
    indices, photos = gallery_photos(chairv2.test, 17)
    assert indices.tolist() == sorted(set(chairv2.test.targets.tolist())) and photos.shape == (100, 3, 32, 32)


def test_chairv2_cache_and_head(chairv2, chairv2_dir: Path, chairv2_cache: Path) -> None:
    assert len(list(chairv2_cache.glob("renders-*.safetensors"))) == 2  # the renders and the resized photos
    cfg = DataConfig(image_size=32, val_size=30, seed=3, render_cache=str(chairv2_cache), num_train=5, num_test=3)
    small = build_qmul_chairv2(cfg, chairv2_dir)  # from the cache
    assert (len(small.train), len(small.val), len(small.test)) == (5, 3, 3)
    assert torch.equal(small.test.images, chairv2.test.images[:3])
    assert torch.equal(small.train.images, chairv2.train.images[:5])
    assert torch.equal(small.val.targets, chairv2.val.targets[:3])


# ------------------------------------------------------------------------------------------- tiny ChairV2


TINY_SKETCHES = {
    "/train/chair_a_1": [[40, 40, 0], [200, 60, 1], [60, 200, 1]],
    "/train/chair_a_2": [[100, 40, 0], [100, 200, 1]],
    "/train/chair_b_1": [[40, 200, 0], [200, 200, 1]],
    "/train/chair_c_1": [[128, 128, 1]],
    "/train/chair_d_x7": [[40, 40, 0], [200, 200, 0], [40, 200, 1]],
    "/test/stool_x_1": [[60, 60, 0], [180, 60, 0], [180, 180, 1]],
    "/test/stool_x_2": [[60, 180, 0], [180, 180, 1]],
}
TINY_COLOURS = {"chair_a": (200, 0, 0), "chair_b": (0, 200, 0), "chair_c": (0, 0, 200), "chair_d": (9, 9, 9)}


def write_chairv2(root: Path) -> Path:
    folder = root / "qmul_chairv2"
    (folder / "photo").mkdir(parents=True)
    data = {key: np.array(points, dtype=np.float64) for key, points in TINY_SKETCHES.items()}
    (folder / "ChairV2_Coordinate").write_bytes(pickle.dumps(data, protocol=3))
    for name, colour in {**TINY_COLOURS, "stool_x": (50, 100, 150)}.items():
        Image.new("RGB", (20, 20), colour).save(folder / "photo" / f"{name}.png")
    return folder


def test_tiny_chairv2(tmp_path: Path) -> None:
    folder = write_chairv2(tmp_path)
    cfg = DataConfig(image_size=8, completion_steps=3, val_size=1, seed=0, render_cache="none")
    splits = build_qmul_chairv2(cfg, tmp_path)
    check_layout(splits, 3, 8)
    assert splits.num_classes == 5  # chair_a, chair_b, chair_c, chair_d, stool_x
    assert find_qmul_chairv2_dir(tmp_path) == folder and find_qmul_chairv2_dir(folder) == folder
    train, val, test = photo_sets(splits)
    assert len(val) == 1 and train | val == {0, 1, 2, 3} and not train & val and test == {4}
    assert len(splits.train) + len(splits.val) == 5 and len(splits.test) == 2
    np.testing.assert_array_equal(splits.test.images[0, 3:].numpy(), np.full((3, 8, 8), 1) * [[[50]], [[100]], [[150]]])
    expected = render_partials(np.array(TINY_SKETCHES["/test/stool_x_1"]), steps=3, size=8, frame=QMUL_FRAME)
    np.testing.assert_array_equal(splits.test.images[0, :3].numpy(), expected)
    rows = {int(t): i for i, t in enumerate(splits.train.targets.tolist())}
    if 3 in rows:  # chair_d (one sketch, key suffix "x7") is dark
        assert int(splits.train.images[rows[3], 3:].max()) == 9
    whole = build_qmul_chairv2(DataConfig(image_size=8, completion_steps=3, val_size=0, render_cache="none"), folder)
    assert len(whole.train) == 5 and set(whole.val.targets.tolist()) <= set(whole.train.targets.tolist())


def test_tiny_chairv2_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="RLATTENTION_DATA"):
        build_qmul_chairv2(DataConfig(), None)
    with pytest.raises(FileNotFoundError, match=r"QMUL-Chair-V2 not found: expected ChairV2_Coordinate"):
        build_qmul_chairv2(DataConfig(render_cache="none"), tmp_path)
    folder = write_chairv2(tmp_path)
    with pytest.raises(ValueError, match=r"val_size=4 must be in 0\.\.3: .*training photos"):
        build_qmul_chairv2(DataConfig(image_size=8, val_size=4, render_cache="none"), tmp_path)
    (folder / "photo" / "chair_b.png").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"photo not found: .*chair_b\.png \(the true photo of sketch '/train/chair_b_1'"
    ):
        load_qmul_chairv2_index(tmp_path)
    for photo in (folder / "photo").iterdir():
        photo.unlink()
    (folder / "photo").rmdir()
    with pytest.raises(FileNotFoundError, match=r"photo folder not found: .*qmul_chairv2/photo"):
        load_qmul_chairv2_index(folder)


# ------------------------------------------------------------------------------------------- real Omniglot


@pytest.fixture(scope="module")
def omniglot_dir(require_data) -> Path:
    return require_data("omniglot")


@pytest.fixture(scope="module")
def omniglot(omniglot_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    cache = tmp_path_factory.mktemp("omniglot_cache")
    cfg = DataConfig(image_size=32, completion_steps=5, val_size=10, seed=0, render_cache=str(cache))
    return build_dataset("omniglot_sketch", cfg, omniglot_dir.parent)


def test_omniglot_sketch_layout_and_splits(omniglot, omniglot_dir: Path) -> None:
    assert omniglot.name == "omniglot_sketch" and omniglot.num_classes == 136
    check_layout(omniglot, 5, 32)
    train, val, test = photo_sets(omniglot)
    assert (len(train), len(val), len(test)) == (92, 10, 34)  # characters: 25 % test, 10 validation
    assert not train & val and not test & (train | val)
    assert (len(omniglot.train), len(omniglot.val), len(omniglot.test)) == (92 * 19, 10 * 19, 34 * 19)
    index = load_omniglot_sketch_index(omniglot_dir)
    assert index.photo_ids == sorted(index.photo_ids) and all(p.endswith("_01") for p in index.photo_ids)
    assert index.photo_ids[0] == "small1/Balinese/character01/0108_01"
    assert len(index.keys) == 136 * 19 and not set(index.keys) & set(index.photo_ids)  # the gallery drawer is no query
    both = load_omniglot_sketch_index(omniglot_dir, [2, 1])
    assert len(both.photo_ids) == 242 and len(both.keys) == 242 * 19 and both.subsets == [1, 2]
    chars = [p.split("/")[1:3] for p in both.photo_ids]  # small2's Greek and Latin are small1's: read once
    assert len({tuple(c) for c in chars}) == 242
    assert not [p for p in both.photo_ids if p.startswith(("small2/Greek", "small2/Latin"))]


def test_omniglot_sketch_channels(omniglot, omniglot_dir: Path) -> None:
    index = load_omniglot_sketch_index(omniglot_dir)
    test_rows = np.flatnonzero(np.isin(index.targets, omniglot.test.targets.numpy()))
    row = 25
    query = index.keys[test_rows[row]]  # test rows: the test characters' queries in index order
    target = int(omniglot.test.targets[row])
    assert query.rsplit("/", 1)[0] == index.photo_ids[target].rsplit("/", 1)[0]  # same character
    assert query != index.photo_ids[target]  # another drawer
    with zipfile.ZipFile(omniglot_dir / "strokes_background_small1.zip") as strokes:
        _, member = index.query_members[test_rows[row]]
        sketch = parse_omniglot_strokes(strokes.read(member))
    expected = render_partials(sketch, steps=5, size=32, line_width=2.0, frame=OMNIGLOT_FRAME)
    np.testing.assert_array_equal(omniglot.test.images[row, :5].numpy(), expected)
    with zipfile.ZipFile(omniglot_dir / "images_background_small1.zip") as images:
        png = Image.open(io.BytesIO(images.read(index.photo_members[target][1])))
        photo = np.array(png.convert("RGB").resize((32, 32), Image.Resampling.BILINEAR)).transpose(2, 0, 1)
    np.testing.assert_array_equal(omniglot.test.images[row, 5:].numpy(), photo)
    assert (photo[0] == photo[1]).all() and (photo[1] == photo[2]).all() and photo.mean() > 128  # grey, white paper


# ------------------------------------------------------------------------------------------- tiny Omniglot


def write_omniglot(root: Path, skip_strokes: tuple[str, ...] = ()) -> Path:
    """images/strokes_background_small1.zip with 3 characters x 3 drawers (and macOS metadata)."""
    folder = root / "omniglot"
    folder.mkdir()
    characters = [("Alpha", "character01", 1), ("Alpha", "character02", 2), ("Beta", "character01", 3)]
    with (
        zipfile.ZipFile(folder / "images_background_small1.zip", "w") as images,
        zipfile.ZipFile(folder / "strokes_background_small1.zip", "w") as strokes,
    ):
        strokes.writestr("__MACOSX/strokes_background_small1/._x.txt", b"junk")
        strokes.writestr("strokes_background_small1/.DS_Store", b"junk")
        for alphabet, character, number in characters:
            for drawer in (1, 2, 3):
                name = f"{alphabet}/{character}/{number:04d}_{drawer:02d}"
                canvas = Image.new("1", (105, 105), 1)
                canvas.paste(0, (10 * number, 10 * drawer, 10 * number + 20, 10 * drawer + 20))
                buffer = io.BytesIO()
                canvas.save(buffer, format="PNG")
                images.writestr(f"images_background_small1/{name}.png", buffer.getvalue())
                if name not in skip_strokes:
                    text = f"START\n{10 * number},-{10 * drawer},0\n{10 * number + 20},-{10 * drawer},30\nBREAK\n"
                    strokes.writestr(f"strokes_background_small1/{name}.txt", text)
    return folder


def test_tiny_omniglot_sketch(tmp_path: Path) -> None:
    folder = write_omniglot(tmp_path)
    assert find_omniglot_dir(tmp_path) == folder
    cfg = DataConfig(image_size=16, completion_steps=2, val_size=1, test_fraction=0.25, render_cache="none")
    splits = build_omniglot_sketch(cfg, tmp_path)
    check_layout(splits, 2, 16)
    assert splits.num_classes == 3 and [len(s) for s in photo_sets(splits)] == [1, 1, 1]
    assert (len(splits.train), len(splits.val), len(splits.test)) == (2, 2, 2)  # drawers 2 and 3 are queries
    index = load_omniglot_sketch_index(folder)
    assert index.photo_ids == [
        "small1/Alpha/character01/0001_01",
        "small1/Alpha/character02/0002_01",
        "small1/Beta/character01/0003_01",
    ]
    assert index.keys[:2] == ["small1/Alpha/character01/0001_02", "small1/Alpha/character01/0001_03"]
    assert index.targets.tolist() == [0, 0, 1, 1, 2, 2]


def test_tiny_omniglot_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="RLATTENTION_DATA"):
        build_omniglot_sketch(DataConfig(), None)
    with pytest.raises(FileNotFoundError, match=r"Omniglot zips not found: need images_background_small1\.zip"):
        load_omniglot_sketch_index(tmp_path)
    folder = write_omniglot(tmp_path, skip_strokes=("Alpha/character02/0002_03",))
    with pytest.raises(ValueError, match=r"omniglot_subsets must be a non-empty list of \[1, 2\].*got \[3\]"):
        build_omniglot_sketch(DataConfig(omniglot_subsets=[3], render_cache="none"), folder)
    with pytest.raises(FileNotFoundError, match=r"strokes_background_small2\.zip"):
        load_omniglot_sketch_index(folder, [1, 2])
    with pytest.raises(
        SketchFormatError, match=r"strokes_background_small1\.zip: no stroke file Alpha/character02/0002_03\.txt"
    ):
        load_omniglot_sketch_index(folder)
