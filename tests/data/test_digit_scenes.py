"""Captioned digit scenes: relations from boxes, captions checked word by word against their scene (a parser of
the grammar written here, independent of the generator), the precomp files and their shapes, boxes that cover
the digits, geometry features, determinism, the saved region CNN, manifest re-use, atomic regeneration of a
damaged folder, and argument errors. Real MNIST, tiny sizes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from rlattention.data.readers.precomp import read_precomp_split
from rlattention.data.synthetic import digit_scenes
from rlattention.data.synthetic.digit_scenes import (
    MANIFEST_NAME,
    SPLITS,
    generate_digit_scenes,
    read_scene_descriptions,
)
from rlattention.data.synthetic.scene_captions import (
    COLOUR_NAMES,
    NUMBER_WORDS,
    RELATION_WORDS,
    SIZE_WORDS,
    SceneDigit,
    relation,
    scene_captions,
)
from rlattention.data.synthetic.scene_regions import GEOMETRY_DIM, load_region_cnn, region_features

SMALL = dict(num_train=48, num_dev=10, num_test=10, regions=6, canvas=96, cnn_epochs=1, cnn_scenes=48)

# ------------------------------------------------------------------------------------- a parser of the grammar

_COUNTS = {"two": 2, "three": 3, "four": 4}
_SIZE_OF = {word: size for size, words in SIZE_WORDS.items() for word in words}
_RELATION_OF = {phrase: rel for rel, phrases in RELATION_WORDS.items() for phrase in phrases}
_LABEL = "|".join([*NUMBER_WORDS, *(str(d) for d in range(10))])
_MENTION = re.compile(
    rf"\b(a|an|the) (?:({'|'.join(_SIZE_OF)}) )?(?:({'|'.join(COLOUR_NAMES)}) )?(?:(digit|number) )?({_LABEL})\b"
)
_COUNT = re.compile(r"\b(two|three|four) (digits|numbers)\b")
_BETWEEN = re.compile(rf"^(?:is )?({'|'.join(sorted(_RELATION_OF, key=len, reverse=True))})$")


def _label(token: str) -> int:
    return int(token) if token.isdigit() else NUMBER_WORDS.index(token)


def _holds(rel: str, a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether box ``a`` is strictly ``rel`` box ``b`` (exclusive ends, y downwards)."""
    return {
        "left of": a[2] <= b[0],
        "right of": a[0] >= b[2],
        "above": a[3] <= b[1],
        "below": a[1] >= b[3],
    }[rel]


def check_caption(caption: str, scene: list[SceneDigit]) -> list[str]:
    """Assert that ``caption`` is consistent with ``scene``; returns the relations it states."""
    assert caption == caption.strip().lower() and caption.isascii() and "  " not in caption, caption
    by_label = {d.label: d for d in scene}
    text = caption
    for match in _COUNT.finditer(caption):  # "three digits": the count of the scene
        assert _COUNTS[match.group(1)] == len(scene), (caption, scene)
    text = _COUNT.sub("<count>", text)
    mentions = list(_MENTION.finditer(text))
    assert mentions, f"no digit mentioned in {caption!r}"
    for m in mentions:
        article, size_word, colour, _, label = m.groups()
        digit = by_label.get(_label(label))
        assert digit is not None, f"{caption!r} mentions {label!r}, not in the scene {scene}"
        if size_word is not None:
            assert _SIZE_OF[size_word] == digit.size, (caption, m.group(0), digit)
        if colour is not None:
            assert colour == digit.colour, (caption, m.group(0), digit)
        first = m.group(0).split()[1]
        if article != "the":
            assert article == ("an" if first in ("eight", "8") else "a"), (caption, m.group(0))
    # Every digit, colour and size word belongs to a mention (none is stated loosely elsewhere).
    rest = _MENTION.sub("<digit>", text).split()
    loose = set(rest) & {*NUMBER_WORDS, *map(str, range(10)), *COLOUR_NAMES, *_SIZE_OF}
    assert not loose, f"{caption!r}: words {loose} outside a digit mention"
    # A relation phrase between two consecutive mentions holds for their boxes.
    stated = []
    for m1, m2 in zip(mentions[:-1], mentions[1:], strict=True):
        between = text[m1.end() : m2.start()].strip()
        rel = _BETWEEN.match(between)
        if rel is None:
            assert not set(between.split()) & {w for p in _RELATION_OF for w in p.split()} - {"the", "of"}, (
                f"{caption!r}: unparsed relation {between!r}"
            )
            continue
        a, b = by_label[_label(m1.group(5))], by_label[_label(m2.group(5))]
        name = _RELATION_OF[rel.group(1)]
        assert _holds(name, a.box, b.box), f"{caption!r}: {a} is not {name} {b}"
        stated.append(name)
    return stated


# ------------------------------------------------------------------------------------- pure functions


def test_relation_follows_the_boxes():
    assert relation((0, 0, 10, 10), (20, 0, 30, 10)) == "left of"
    assert relation((20, 0, 30, 10), (0, 0, 10, 10)) == "right of"
    assert relation((0, 0, 10, 10), (0, 12, 10, 20)) == "above"
    assert relation((0, 12, 10, 20), (0, 0, 10, 10)) == "below"
    assert relation((0, 0, 10, 10), (10, 10, 20, 20)) == "left of"  # touching corner: tie -> x axis
    assert relation((0, 0, 10, 10), (12, 30, 20, 40)) == "above"  # separated on both axes: the larger gap
    with pytest.raises(ValueError, match="overlap"):
        relation((0, 0, 10, 10), (5, 5, 15, 15))


HAND_SCENE = [
    SceneDigit(label=7, colour="red", size="small", box=(5, 30, 20, 50)),
    SceneDigit(label=2, colour="blue", size="large", box=(50, 20, 80, 60)),
]


def test_captions_of_a_hand_made_scene():
    seen_relations = set()
    for seed in range(40):
        captions = scene_captions(HAND_SCENE, np.random.default_rng(seed))
        assert len(captions) == 5 and len(set(captions)) == 5
        for caption in captions:
            seen_relations.update(check_caption(caption, HAND_SCENE))
            words = set(caption.split())
            assert words & {"seven", "7", "two", "2"}
            assert not words & ({"green", "yellow", "cyan", "magenta"} | set(NUMBER_WORDS[3:7]) | {"eight", "nine"})
    assert seen_relations == {"left of", "right of"}  # 7 left of 2, and 2 right of 7, never above / below
    again = scene_captions(HAND_SCENE, np.random.default_rng(3))
    assert again == scene_captions(HAND_SCENE, np.random.default_rng(3))
    assert again != scene_captions(HAND_SCENE, np.random.default_rng(4))
    examples = [c for s in range(40) for c in scene_captions(HAND_SCENE, np.random.default_rng(s))]
    assert any(re.search(r"\b7\b", c) for c in examples) and any("seven" in c for c in examples)
    assert any(c.startswith("two digits: ") or c.startswith("two numbers: ") for c in examples)
    assert any(c.startswith("there is ") for c in examples) and any(" is " in c for c in examples)


def test_caption_argument_errors():
    with pytest.raises(ValueError, match="at least 2 digits"):
        scene_captions(HAND_SCENE[:1], np.random.default_rng(0))
    with pytest.raises(ValueError, match="distinct classes"):
        scene_captions([HAND_SCENE[0], HAND_SCENE[0]], np.random.default_rng(0))


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="regions must be >= the most digits"):
        generate_digit_scenes(tmp_path / "d", tmp_path, regions=3)
    with pytest.raises(ValueError, match="2 <= low <= high <= 4"):
        generate_digit_scenes(tmp_path / "d", tmp_path, digits=(1, 3))
    with pytest.raises(ValueError, match="canvas must be >= 32"):
        generate_digit_scenes(tmp_path / "d", tmp_path, canvas=20)
    with pytest.raises(ValueError, match="num_train must be >= 1"):
        generate_digit_scenes(tmp_path / "d", tmp_path, num_train=0)
    with pytest.raises(ValueError, match="image_splits"):
        generate_digit_scenes(tmp_path / "d", tmp_path, image_splits="test")
    with pytest.raises(FileNotFoundError, match="MNIST"):
        generate_digit_scenes(tmp_path / "d", tmp_path)  # no MNIST files there
    assert not (tmp_path / "d").exists()


# ------------------------------------------------------------------------------------- generated folders


@pytest.fixture(scope="module")
def mnist(require_data) -> Path:
    return require_data("mnist")


@pytest.fixture(scope="module")
def generated(mnist, tmp_path_factory) -> Path:
    return generate_digit_scenes(
        tmp_path_factory.mktemp("scenes") / "digits", mnist, seed=0, image_splits=SPLITS, **SMALL
    )


def test_precomp_files_and_manifest(generated):
    manifest = json.loads((generated / MANIFEST_NAME).read_text())
    dim = manifest["feature_dim"]
    assert dim == manifest["cnn_feature_dim"] + GEOMETRY_DIM == 64 + 5
    assert manifest["generator"] == "digit_scenes" and manifest["params"]["seed"] == 0
    for split, n in zip(SPLITS, (SMALL["num_train"], SMALL["num_dev"], SMALL["num_test"]), strict=True):
        data = read_precomp_split(generated, split)
        assert data.features.shape == (n, 6, dim) and data.features.dtype == np.float32
        assert np.isfinite(data.features).all()
        assert len(data.captions) == 5 * n and data.caption_to_image.tolist() == [j // 5 for j in range(5 * n)]
        boxes = np.load(generated / f"{split}_boxes.npy")
        assert boxes.shape == (n, 6, 4) and boxes.dtype == np.float32
        assert (boxes >= 0).all() and (boxes <= 1).all() and (boxes[..., 2:] > boxes[..., :2]).all()
        scenes = read_scene_descriptions(generated, split)
        assert len(scenes) == n and all(2 <= len(s) <= 4 for s in scenes)
        images = np.load(generated / f"{split}_scenes.npy")
        assert images.shape == (n, 3, 96, 96) and images.dtype == np.uint8
        assert manifest["counts"][split] == {"images": n, "captions": 5 * n, "digits": sum(map(len, scenes))}
    for name, size in manifest["files"].items():
        assert (generated / name).stat().st_size == size


def test_every_caption_is_consistent_with_its_scene(generated):
    relations = set()
    for split in SPLITS:
        captions = read_precomp_split(generated, split).captions
        for i, scene in enumerate(read_scene_descriptions(generated, split)):
            assert len({d.label for d in scene}) == len(scene)
            mine = captions[5 * i : 5 * i + 5]
            assert len(set(mine)) == 5
            stated = [check_caption(caption, scene) for caption in mine]
            assert sum(bool(r) for r in stated) >= 2  # two relational captions per image
            relations.update(r for rs in stated for r in rs)
    assert relations == {"left of", "right of", "above", "below"}


def test_digit_boxes_cover_the_digits_and_geometry(generated):
    for split in SPLITS:
        images = np.load(generated / f"{split}_scenes.npy")
        boxes = np.load(generated / f"{split}_boxes.npy")
        features = read_precomp_split(generated, split).features
        geometry = features[..., -GEOMETRY_DIM:]
        np.testing.assert_allclose(geometry[..., :4], boxes, atol=1e-6)
        area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
        np.testing.assert_allclose(geometry[..., 4], area, atol=1e-6)
        for image, box_set, scene in zip(images, boxes, read_scene_descriptions(generated, split), strict=True):
            inside = np.zeros(image.shape[1:], dtype=bool)
            regions = [d.region for d in scene]
            assert len(set(regions)) == len(scene) and all(0 <= r < 6 for r in regions)
            for d in scene:
                x0, y0, x1, y1 = d.box
                np.testing.assert_allclose(box_set[d.region] * 96, d.box, atol=1e-4)
                ink = image[:, y0:y1, x0:x1].max(axis=0) > 0
                # tight: ink touches all four sides of the box
                assert ink[0].any() and ink[-1].any() and ink[:, 0].any() and ink[:, -1].any()
                assert not inside[y0:y1, x0:x1].any(), "digit boxes overlap"
                inside[y0:y1, x0:x1] = True
                # the digit's ink has its colour: the brightest pixel points along its RGB
                patch = image[:, y0:y1, x0:x1].reshape(3, -1).astype(float)
                brightest = patch[:, patch.sum(0).argmax()]
                cosine = brightest @ np.array(d.rgb) / (np.linalg.norm(brightest) * np.linalg.norm(d.rgb))
                assert cosine > 0.99, (d, brightest)
                assert (d.size == "large") == (y1 - y0 > 24 or x1 - x0 > 24)
            assert not image.max(axis=0)[~inside].any(), "ink outside the digit boxes"


def test_deterministic_and_seed_dependent(generated, mnist, tmp_path):
    again = generate_digit_scenes(tmp_path / "again", mnist, seed=0, image_splits=SPLITS, **SMALL)
    for split in SPLITS:
        a, b = read_precomp_split(generated, split), read_precomp_split(again, split)
        assert a.captions == b.captions
        np.testing.assert_allclose(a.features, b.features, rtol=0, atol=1e-5)
        for suffix in ("_boxes.npy", "_scenes.npy"):
            assert np.array_equal(np.load(generated / f"{split}{suffix}"), np.load(again / f"{split}{suffix}"))
        assert (generated / f"{split}_scenes.json").read_bytes() == (again / f"{split}_scenes.json").read_bytes()
    other = generate_digit_scenes(tmp_path / "other", mnist, seed=1, **SMALL)
    for split in SPLITS:
        assert read_precomp_split(other, split).captions != read_precomp_split(generated, split).captions
    assert not np.array_equal(np.load(other / "test_boxes.npy"), np.load(generated / "test_boxes.npy"))


def test_saved_region_cnn_reproduces_the_features(generated):
    model = load_region_cnn(generated)
    scenes, boxes = np.load(generated / "test_scenes.npy"), np.load(generated / "test_boxes.npy")
    features = region_features(model, scenes, boxes)
    np.testing.assert_allclose(features, read_precomp_split(generated, "test").features, rtol=0, atol=1e-5)


def test_manifest_reuse_skips_work_and_failures_leave_the_folder(generated, mnist, monkeypatch):
    before = {p.name: p.stat().st_mtime_ns for p in generated.iterdir()}

    def boom(*args, **kwargs):
        raise RuntimeError("generation started")

    monkeypatch.setattr(digit_scenes, "_write_all", boom)
    assert generate_digit_scenes(generated, mnist, seed=0, image_splits=SPLITS, **SMALL) == generated
    changed = {**SMALL, "num_test": 11}
    with pytest.raises(RuntimeError, match="generation started"):  # other parameters: regenerates ...
        generate_digit_scenes(generated, mnist, seed=0, image_splits=SPLITS, **changed)
    with pytest.raises(RuntimeError, match="generation started"):
        generate_digit_scenes(generated, mnist, seed=0, image_splits=SPLITS, force=True, **SMALL)
    # ... and an interrupted run leaves the previous dataset untouched and no temporary folder behind
    assert {p.name: p.stat().st_mtime_ns for p in generated.iterdir()} == before
    assert sorted(p.name for p in generated.parent.iterdir()) == [generated.name]


@pytest.mark.parametrize("damage", ["truncate", "delete", "manifest", "params"])
def test_damaged_folder_is_regenerated(generated, mnist, tmp_path, damage):
    folder = tmp_path / "copy"
    shutil.copytree(generated, folder)
    if damage == "truncate":
        path = folder / "test_ims.npy"
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "delete":
        (folder / "dev_caps.txt").unlink()
    elif damage == "manifest":
        (folder / MANIFEST_NAME).write_text("{not json")
    else:  # a manifest claiming other parameters
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
        manifest["params"]["seed"] = 5
        (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    generate_digit_scenes(folder, mnist, seed=0, image_splits=SPLITS, **SMALL)
    for split in SPLITS:
        a, b = read_precomp_split(generated, split), read_precomp_split(folder, split)
        assert a.captions == b.captions
        np.testing.assert_allclose(a.features, b.features, rtol=0, atol=1e-5)
    assert json.loads((folder / MANIFEST_NAME).read_text())["params"]["seed"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]  # no temporary folders left


def test_refuses_to_replace_a_foreign_folder(mnist, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="notes.txt"):
        generate_digit_scenes(folder, mnist, **SMALL)
    assert (folder / "notes.txt").read_text() == "keep me"


def test_swap_in_restores_the_old_folder_when_the_rename_fails(tmp_path, monkeypatch):
    old, new = tmp_path / "data", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    (old / "manifest.json").write_text("old")
    (new / "manifest.json").write_text("new")
    real_replace = digit_scenes.os.replace

    def failing_replace(src, dst):
        if Path(src) == new:
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(digit_scenes.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        digit_scenes._swap_in(new, old)
    assert (old / "manifest.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "new"]  # nothing hidden left behind
    monkeypatch.undo()
    digit_scenes._swap_in(new, old)
    assert (old / "manifest.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
