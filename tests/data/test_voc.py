"""Pascal VOC 2007 reader: a tiny VOCdevkit tree written in the official schema (objects with pose, truncated,
difficult, bndbox, person parts), its {1, 0, -1} targets (difficult-only classes ignored), the registered
dataset's splits, and a clear error for each malformed or missing file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from rlattention.data.photos import ImageDecodeError
from rlattention.data.readers import voc  # noqa: F401  (registers "voc2007")
from rlattention.data.readers.voc import (
    VOC_CLASSES,
    VocFormatError,
    build_voc2007,
    find_voc2007_dir,
    load_voc2007,
    parse_annotation,
    read_image_set,
)
from rlattention.data.registry import build_dataset
from rlattention.metrics.multilabel import average_precision

PART = """
		<part>
			<name>head</name>
			<bndbox><xmin>10</xmin><ymin>10</ymin><xmax>20</xmax><ymax>20</ymax></bndbox>
		</part>"""


def object_xml(name: str, difficult: int | None = 0, parts: bool = False) -> str:
    difficult_tag = "" if difficult is None else f"\n\t\t<difficult>{difficult}</difficult>"
    return f"""
	<object>
		<name>{name}</name>
		<pose>Left</pose>
		<truncated>0</truncated>{difficult_tag}
		<bndbox>
			<xmin>5</xmin>
			<ymin>6</ymin>
			<xmax>30</xmax>
			<ymax>25</ymax>
		</bndbox>{PART if parts else ""}
	</object>"""


def annotation_xml(image_id: str, objects: str) -> str:
    return f"""<annotation>
	<folder>VOC2007</folder>
	<filename>{image_id}.jpg</filename>
	<source>
		<database>The VOC2007 Database</database>
		<annotation>PASCAL VOC2007</annotation>
		<image>flickr</image>
		<flickrid>341012865</flickrid>
	</source>
	<owner>
		<flickrid>Fried Camels</flickrid>
		<name>Jinky the Fruit Bat</name>
	</owner>
	<size>
		<width>40</width>
		<height>30</height>
		<depth>3</depth>
	</size>
	<segmented>0</segmented>{objects}
</annotation>
"""


#: id -> (objects xml, colour of the solid test image)
TREE = {
    # dog; person both difficult and not (-> present); the person has a <part> whose <name> is not a class
    "000001": (object_xml("dog") + object_xml("person", 1) + object_xml("person", 0, parts=True), (200, 30, 30)),
    # cat only difficult (-> ignored); chair present
    "000002": (object_xml("cat", 1) + object_xml("chair"), (30, 200, 30)),
    # no <difficult> tag (-> not difficult), whitespace around the name
    "000003": (object_xml("\n\t\t\taeroplane ", None), (30, 30, 200)),
    "000004": (object_xml("tvmonitor") + object_xml("bottle", 1), (120, 120, 120)),
    "000005": (object_xml("bottle"), (250, 250, 250)),
}
TRAINVAL = ["000001", "000002", "000003"]
TEST = ["000004", "000005"]


def write_tree(root: Path) -> Path:
    """``root/VOCdevkit/VOC2007`` with the TREE above; returns the VOC2007 folder."""
    voc_dir = root / "VOCdevkit" / "VOC2007"
    for sub in ("Annotations", "ImageSets/Main", "JPEGImages"):
        (voc_dir / sub).mkdir(parents=True)
    for image_id, (objects, colour) in TREE.items():
        (voc_dir / "Annotations" / f"{image_id}.xml").write_text(annotation_xml(image_id, objects))
        Image.new("RGB", (40, 30), colour).save(voc_dir / "JPEGImages" / f"{image_id}.jpg", quality=95)
    (voc_dir / "ImageSets" / "Main" / "trainval.txt").write_text("\n".join(TRAINVAL) + "\n")
    (voc_dir / "ImageSets" / "Main" / "test.txt").write_text("\n".join(TEST) + "\n\n")
    return voc_dir


def expected_target(image_id: str) -> torch.Tensor:
    t = torch.zeros(len(VOC_CLASSES))
    index = VOC_CLASSES.index
    if image_id == "000001":
        t[index("dog")] = t[index("person")] = 1
    elif image_id == "000002":
        t[index("cat")], t[index("chair")] = -1, 1
    elif image_id == "000003":
        t[index("aeroplane")] = 1
    elif image_id == "000004":
        t[index("tvmonitor")], t[index("bottle")] = 1, -1
    else:
        t[index("bottle")] = 1
    return t


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    return write_tree(tmp_path)


def test_load_targets_and_images(tree: Path):
    images, targets, ids = load_voc2007(tree.parents[1], "trainval", image_size=16)
    assert ids == TRAINVAL
    assert images.shape == (3, 3, 16, 16) and images.dtype == torch.uint8
    assert targets.dtype == torch.float32
    torch.testing.assert_close(targets, torch.stack([expected_target(i) for i in TRAINVAL]))
    # solid colours survive JPEG + resize up to a few levels
    for img, (_, colour) in zip(images, (TREE[i] for i in TRAINVAL), strict=True):
        assert (img.float().mean((1, 2)) - torch.tensor(colour, dtype=torch.float32)).abs().max() < 4
    # the difficult-only cat of image 2 is ignored by the metrics: AP of 'cat' has no positive -> nan
    ap = average_precision(torch.rand(3, 20), targets)
    assert torch.isnan(ap[VOC_CLASSES.index("cat")])


def test_find_dir_accepts_the_usual_roots(tree: Path):
    for root in (tree, tree.parent, tree.parents[1]):
        assert find_voc2007_dir(root) == tree
    assert read_image_set(tree, "test") == TEST


def test_registered_dataset_splits(tree: Path):
    cfg = SimpleNamespace(image_size=8, val_size=1, seed=0, num_train=0, num_test=0)
    splits = build_dataset("voc2007", cfg, tree.parents[1])
    assert splits.num_classes == 20 and splits.name == "voc2007"
    assert splits.image_shape == (3, 8, 8)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (2, 1, 2)
    trainval_rows = {tuple(expected_target(i).tolist()) for i in TRAINVAL}
    seen = [tuple(r.tolist()) for r in torch.cat([splits.train.targets, splits.val.targets])]
    assert sorted(seen) == sorted(trainval_rows)  # train + val is trainval, each image once
    torch.testing.assert_close(splits.test.targets, torch.stack([expected_target(i) for i in TEST]))

    # val_size 0: train on all of trainval, with an overlapping monitoring split
    all_train = build_voc2007(SimpleNamespace(image_size=8, val_size=0, seed=0), tree)
    assert len(all_train.train) == 3 and len(all_train.val) == 1
    assert any(torch.equal(all_train.val.targets[0], row) for row in all_train.train.targets)
    # num_train / num_test keep the first images only
    small = build_voc2007(SimpleNamespace(image_size=8, val_size=1, num_train=1, num_test=1), tree)
    assert (len(small.train), len(small.val), len(small.test)) == (1, 1, 1)


def test_errors_missing_folders_and_files(tree: Path, tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"Annotations/, ImageSets/Main/ and JPEGImages/"):
        find_voc2007_dir(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="voc2007 needs"):
        build_voc2007(SimpleNamespace(), None)
    (tree / "ImageSets" / "Main" / "test.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"test\.txt.*VOCtest_06-Nov-2007\.tar"):
        build_voc2007(SimpleNamespace(image_size=8, val_size=1), tree)
    (tree / "ImageSets" / "Main" / "trainval.txt").write_text("000001\n000009\n")
    with pytest.raises(FileNotFoundError, match=r"000009\.xml"):
        load_voc2007(tree, "trainval")
    (tree / "ImageSets" / "Main" / "trainval.txt").write_text("000001 1\n")
    with pytest.raises(VocFormatError, match=r"trainval\.txt:1: expected one image id"):
        read_image_set(tree, "trainval")
    (tree / "ImageSets" / "Main" / "trainval.txt").write_text("000001\n000002\n")
    (tree / "JPEGImages" / "000002.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"000002\.jpg"):
        load_voc2007(tree, "trainval")


def test_error_val_size_too_large(tree: Path):
    with pytest.raises(ValueError, match=r"val_size=6000 must be in 0\.\.2"):
        build_voc2007(SimpleNamespace(image_size=8, val_size=6000), tree)


def test_error_image_that_does_not_decode(tree: Path):
    (tree / "JPEGImages" / "000003.jpg").write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    with pytest.raises(ImageDecodeError, match=r"000003\.jpg: cannot decode"):
        load_voc2007(tree, "trainval", image_size=8)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (annotation_xml("000001", ""), r"no <object> element"),
        (annotation_xml("000001", "<object><pose>Left</pose><difficult>0</difficult></object>"), r"has no <name>"),
        (annotation_xml("000001", object_xml("unicorn")), r"unknown class name 'unicorn'; expected one of: aeroplane"),
        (annotation_xml("000001", object_xml("dog", 2)), r"<difficult> '2', expected 0 or 1"),
        ("<annotation><object><name>dog</name>", r"malformed XML"),
        ("<annotations></annotations>", r"expected the root element <annotation>"),
        (
            '<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]>\n'
            "<annotation><object><name>&lol2;</name></object></annotation>",
            r"DOCTYPE/ENTITY declaration",
        ),
    ],
)
def test_annotation_errors_name_the_file(tmp_path: Path, body: str, message: str):
    path = tmp_path / "000001.xml"
    path.write_text(body)
    with pytest.raises(VocFormatError, match=message) as info:
        parse_annotation(path)
    assert str(path) in str(info.value)
