"""COCO instances reader: the real 128-image train2017 subset (counts, 80-class mapping, known labels, the
seeded train/val/test split), the train2017 + val2017 layout on tiny files, and clear errors for malformed json
and bad images."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from rlattention.data.photos import ImageDecodeError
from rlattention.data.readers import coco  # noqa: F401  (registers "coco")
from rlattention.data.readers.coco import (
    CocoFormatError,
    build_coco,
    find_coco_dir,
    instances_path,
    load_coco,
    read_coco_instances,
)
from rlattention.data.registry import build_dataset

SUBSET = "coco_train2017_subset128"

# ------------------------------------------------------------------------------------------- the real subset


@pytest.fixture(scope="module")
def subset_dir(require_data) -> Path:
    return require_data(SUBSET)


@pytest.fixture(scope="module")
def instances(subset_dir: Path):
    return read_coco_instances(instances_path(subset_dir, "train2017"))


def test_subset_counts_and_category_mapping(instances):
    assert len(instances.image_ids) == 128 and instances.image_ids == sorted(instances.image_ids)
    assert instances.targets.shape == (128, 80) and instances.targets.dtype == torch.float32
    assert len(instances.category_ids) == 80 and instances.category_ids == sorted(instances.category_ids)
    assert (instances.category_ids[0], instances.category_names[0]) == (1, "person")
    assert (instances.category_ids[79], instances.category_names[79]) == (90, "toothbrush")
    assert instances.category_names[2] == "car"  # COCO id 3
    assert set(instances.targets.unique().tolist()) == {0.0, 1.0}
    assert int(instances.targets.sum()) == 362  # distinct (image, category) pairs among the 939 annotations
    assert int((instances.targets.sum(0) > 0).sum()) == 71  # categories that occur in the subset


def test_subset_known_images(instances):
    names = instances.category_names
    row = instances.image_ids.index(9)
    assert instances.file_names[row] == "000000000009.jpg"
    assert {names[k] for k in instances.targets[row].nonzero().view(-1).tolist()} == {"bowl", "broccoli", "orange"}
    row = instances.image_ids.index(25)
    assert {names[k] for k in instances.targets[row].nonzero().view(-1).tolist()} == {"giraffe"}
    for unannotated in (250, 508):  # kept, with no label
        assert instances.targets[instances.image_ids.index(unannotated)].sum() == 0


def test_subset_load_images(subset_dir: Path):
    images, targets, inst = load_coco(subset_dir.parent, "train2017", image_size=24, limit=3)
    assert images.shape == (3, 3, 24, 24) and images.dtype == torch.uint8
    assert inst.image_ids[:3] == [9, 25, 30]
    torch.testing.assert_close(targets, inst.targets[:3])
    assert images.float().std() > 10  # real photos, not blank


def test_subset_registered_dataset_split(subset_dir: Path, instances):
    cfg = SimpleNamespace(image_size=16, val_size=10, seed=0)
    splits = build_dataset("coco", cfg, subset_dir.parent)  # the shared folder: the subset is found inside
    assert splits.num_classes == 80 and splits.name == "coco"
    assert (len(splits.train), len(splits.val), len(splits.test)) == (86, 10, 32)  # test = 25 % of 128
    assert splits.image_shape == (3, 16, 16)
    total = sum(int(part.targets.sum()) for part in (splits.train, splits.val, splits.test))
    assert total == int(instances.targets.sum())  # a partition of the 128 images
    again = build_coco(cfg, subset_dir)
    assert torch.equal(again.test.images, splits.test.images) and torch.equal(again.val.targets, splits.val.targets)
    other = build_coco(SimpleNamespace(image_size=16, val_size=10, seed=1, num_train=5, num_test=3), subset_dir)
    assert (len(other.train), len(other.val), len(other.test)) == (5, 3, 3)


# ----------------------------------------------------------------------------------------------- tiny files


def tiny_instances(file_names: list[str], first_id: int = 1) -> dict:
    images = [
        {"id": first_id + i, "file_name": name, "width": 20, "height": 10, "license": 1}
        for i, name in enumerate(file_names)
    ]
    categories = [
        {"supercategory": "person", "id": 1, "name": "person"},
        {"supercategory": "animal", "id": 18, "name": "dog"},
        {"supercategory": "vehicle", "id": 3, "name": "car"},
    ]
    annotations = [
        {"id": 100, "image_id": first_id, "category_id": 18, "bbox": [1, 1, 5, 5], "area": 25.0, "iscrowd": 0},
        {"id": 101, "image_id": first_id, "category_id": 18, "bbox": [2, 2, 5, 5], "area": 25.0, "iscrowd": 0},
        {"id": 102, "image_id": first_id, "category_id": 1, "bbox": [0, 0, 9, 9], "area": 81.0, "iscrowd": 1},
    ]
    return {"info": {}, "licenses": [], "images": images, "annotations": annotations, "categories": categories}


def write_coco(root: Path, split: str, data: dict, with_images: bool = True) -> Path:
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    path = instances_path(root, split)
    path.write_text(json.dumps(data))
    if with_images:
        (root / split).mkdir(exist_ok=True)
        for im in data["images"]:
            Image.new("RGB", (20, 10), (90, 60, 30)).save(root / split / im["file_name"])
    return path


def test_train_and_val2017_layout(tmp_path: Path):
    write_coco(tmp_path, "train2017", tiny_instances([f"t{i}.jpg" for i in range(6)]))
    write_coco(tmp_path, "val2017", tiny_instances(["v0.jpg", "v1.jpg"], first_id=50))
    splits = build_coco(SimpleNamespace(image_size=8, val_size=2, seed=0), tmp_path)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (4, 2, 2)  # test = val2017
    # classes sorted by category id: person (1) -> 0, car (3) -> 1, dog (18) -> 2; crowd labels count
    torch.testing.assert_close(splits.test.targets, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    assert find_coco_dir(tmp_path) == tmp_path


def test_val2017_with_other_categories_is_refused(tmp_path: Path):
    write_coco(tmp_path, "train2017", tiny_instances(["t0.jpg", "t1.jpg"]))
    other = tiny_instances(["v0.jpg"])
    other["categories"] = other["categories"][:2]
    other["annotations"] = other["annotations"][:2]
    write_coco(tmp_path, "val2017", other)
    with pytest.raises(CocoFormatError, match="categories differ"):
        build_coco(SimpleNamespace(image_size=8, val_size=1), tmp_path)


def _drop(data: dict, key: str, index: int, field: str) -> dict:
    del data[key][index][field]
    return data


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("images") and d, r"missing top-level key 'images'"),
        (lambda d: d.pop("annotations") and d, r"missing top-level key 'annotations'"),
        (lambda d: _drop(d, "images", 1, "file_name"), r"images\[1\] has no key 'file_name'"),
        (lambda d: _drop(d, "annotations", 2, "category_id"), r"annotations\[2\] has no key 'category_id'"),
        (lambda d: _drop(d, "categories", 0, "name"), r"categories\[0\] has no key 'name'"),
        (lambda d: d["annotations"][0].update(category_id=99) or d, r"category_id 99, not in 'categories'"),
        (lambda d: d["annotations"][1].update(image_id=77) or d, r"image_id 77, not in 'images'"),
        (lambda d: d["images"][1].update(id=1) or d, r"images ids appear more than once: \[1\]"),
        (lambda d: d.update(images={"id": 1}) or d, r"'images' must be a list"),
    ],
)
def test_malformed_json_names_key_and_file(tmp_path: Path, edit, message: str):
    path = write_coco(tmp_path, "train2017", edit(tiny_instances(["a.jpg", "b.jpg"])), with_images=False)
    with pytest.raises(CocoFormatError, match=message) as info:
        read_coco_instances(path)
    assert str(path) in str(info.value)


def test_invalid_json_missing_files_and_bad_images(tmp_path: Path):
    (tmp_path / "annotations").mkdir()
    instances_path(tmp_path, "train2017").write_text('{"images": [')
    with pytest.raises(CocoFormatError, match=r"instances_train2017\.json: not valid json"):
        read_coco_instances(instances_path(tmp_path, "train2017"))
    with pytest.raises(FileNotFoundError, match=r"annotations/instances_train2017\.json"):
        find_coco_dir(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="coco needs"):
        build_coco(SimpleNamespace(), None)

    write_coco(tmp_path, "train2017", tiny_instances(["a.jpg", "b.jpg", "c.jpg"]))
    (tmp_path / "train2017" / "b.jpg").write_bytes(b"GIF89a truncated nonsense")
    with pytest.raises(ImageDecodeError, match=r"b\.jpg: cannot decode"):
        load_coco(tmp_path, image_size=8)
    (tmp_path / "train2017" / "b.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"b\.jpg"):
        load_coco(tmp_path, image_size=8)
