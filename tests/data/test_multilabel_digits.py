"""Multi-label digit canvases: shapes, 2-4 distinct labels per canvas, labels equal to the digits drawn (checked
with flat 'digits' whose grey value encodes their class), no overlap in the default layout, determinism,
clutter, argument errors, and the registered dataset on real MNIST."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlattention.data.registry import build_dataset
from rlattention.data.synthetic import multilabel_digits  # noqa: F401  (registers "multilabel_digits")
from rlattention.data.synthetic.multilabel_digits import (
    CLUTTER_TASK,
    NUM_CLASSES,
    build_multilabel_digits,
    make_multilabel_digits,
)


def value_of(c: int) -> int:
    return 20 * c + 25  # distinct non-zero grey value per class: 25, 45, ..., 205


def flat_digits(per_class: int = 3, side: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Solid squares whose grey value encodes the class: a resized one keeps exactly that value everywhere."""
    labels = torch.arange(NUM_CLASSES).repeat_interleave(per_class)
    images = torch.tensor([value_of(int(c)) for c in labels], dtype=torch.uint8).view(-1, 1, 1, 1)
    return images.expand(-1, 1, side, side).contiguous(), labels


def test_shapes_and_label_counts():
    images, labels = flat_digits()
    canvases, targets = make_multilabel_digits(images, labels, 300, canvas=128, seed=0)
    assert canvases.shape == (300, 1, 128, 128) and canvases.dtype == torch.uint8
    assert targets.shape == (300, NUM_CLASSES) and targets.dtype == torch.float32
    assert set(targets.unique().tolist()) == {0.0, 1.0}
    counts = targets.sum(1)
    assert set(counts.long().tolist()) == {2, 3, 4}  # every count occurs, nothing outside 2..4
    assert (targets.sum(0) > 0).all()  # every class is drawn somewhere


def test_labels_are_exactly_the_digits_drawn_and_do_not_overlap():
    images, labels = flat_digits()
    canvases, targets = make_multilabel_digits(images, labels, 200, canvas=128, scale_range=(1.0, 2.0), seed=3)
    for canvas, target in zip(canvases[:, 0], targets, strict=True):
        expected = {value_of(c) for c in target.nonzero().view(-1).tolist()}
        values = set(canvas.unique().tolist()) - {0}
        assert values == expected
        for v in values:  # one whole square per digit, of a side within the scale range: no overlap, no clipping
            ys, xs = (canvas == v).nonzero(as_tuple=True)
            height, width = int(ys.max() - ys.min()) + 1, int(xs.max() - xs.min()) + 1
            assert height == width and 28 <= height <= 56
            assert len(ys) == height * width


def test_min_max_digits_and_source_classes():
    images, labels = flat_digits()
    keep = labels < 5  # only classes 0..4 available
    _, targets = make_multilabel_digits(images[keep], labels[keep], 100, canvas=96, min_digits=3, max_digits=3)
    assert (targets.sum(1) == 3).all()
    assert targets[:, 5:].sum() == 0


def test_deterministic_from_the_seed():
    images, labels = flat_digits()
    a = make_multilabel_digits(images, labels, 50, num_clutter=2, seed=7)
    b = make_multilabel_digits(images, labels, 50, num_clutter=2, seed=7)
    c = make_multilabel_digits(images, labels, 50, num_clutter=2, seed=8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_clutter_only_adds_ink():
    images, labels = flat_digits()
    clean, t0 = make_multilabel_digits(images, labels, 40, num_clutter=0, seed=1)
    cluttered, t1 = make_multilabel_digits(images, labels, 40, num_clutter=5, clutter_size=6, seed=1)
    assert torch.equal(t0, t1)  # same digits and labels (clutter is drawn after them)
    assert (cluttered >= clean).all()
    assert (cluttered > clean).sum() > 40 * 6 * 6  # most fragments land on empty background


def test_argument_errors():
    images, labels = flat_digits()
    with pytest.raises(ValueError, match="distinct classes"):
        make_multilabel_digits(images[labels < 3], labels[labels < 3], 5, max_digits=4)
    with pytest.raises(ValueError, match="smaller than the largest scaled digit"):
        make_multilabel_digits(images, labels, 5, canvas=50, scale_range=(1.0, 2.0))
    with pytest.raises(ValueError, match="min_digits"):
        make_multilabel_digits(images, labels, 5, min_digits=3, max_digits=2)
    with pytest.raises(ValueError, match="uint8"):
        make_multilabel_digits(images.float(), labels, 5)
    with pytest.raises(ValueError, match="0..9"):
        make_multilabel_digits(images, labels + 1, 5)
    assert make_multilabel_digits(images, labels, 0)[0].shape == (0, 1, 128, 128)


def test_registered_dataset_on_real_mnist(require_data):
    mnist = require_data("mnist")
    cfg = SimpleNamespace(
        num_train=48, num_test=16, val_size=500, seed=0, canvas_size=96, scale_range=(1.0, 1.5), num_clutter=2
    )
    splits = build_dataset("multilabel_digits", cfg, mnist)
    assert splits.num_classes == 10 and splits.name == "multilabel_digits"
    assert splits.image_shape == (1, 96, 96)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (48, 16, 16)
    for part in (splits.train, splits.val, splits.test):
        assert part.targets.shape == (len(part), 10)
        counts = part.targets.sum(1)
        assert ((counts >= 2) & (counts <= 4)).all()
    again = build_multilabel_digits(cfg, mnist)
    assert torch.equal(again.test.images, splits.test.images)
    assert not torch.equal(splits.val.images, splits.test.images)
    with pytest.raises(ValueError, match="MNIST"):
        build_multilabel_digits(cfg, None)


# ------------------------------------------------------------------ the cluttered task of the rarl study (issue 20)
CELL = CLUTTER_TASK["canvas"] // CLUTTER_TASK["grid_cells"]  # 32 px


def test_objects_are_where_the_labels_say():
    images, labels = flat_digits()
    task = dict(CLUTTER_TASK, num_clutter=0)
    canvases, targets, objects = make_multilabel_digits(images, labels, 120, seed=4, return_objects=True, **task)
    assert objects.shape == (120, 4, 5) and objects.dtype == torch.int64
    for canvas, target, objs in zip(canvases[:, 0], targets, objects, strict=True):
        present = objs[objs[:, 0] >= 0]
        assert sorted(present[:, 0].tolist()) == target.nonzero().view(-1).tolist()
        assert (objs[objs[:, 0] < 0, 1:] == 0).all()  # empty slots: class -1, zero box
        inside = torch.zeros_like(canvas, dtype=torch.bool)
        for c, x0, y0, x1, y1 in present.tolist():
            assert 14 <= x1 - x0 == y1 - y0 <= 28 and 0 <= x0 and 0 <= y0 and x1 <= 128 and y1 <= 128
            assert x0 // CELL == (x1 - 1) // CELL and y0 // CELL == (y1 - 1) // CELL  # inside one cell
            assert (canvas[y0:y1, x0:x1] == value_of(c)).all()  # the box holds exactly that class's digit
            inside[y0:y1, x0:x1] = True
        assert (canvas[~inside] == 0).all()  # nothing outside the boxes without clutter


def test_clutter_task_on_real_digits_ink_is_in_the_boxes(require_data):
    from rlattention.data.readers.mnist import load_mnist

    images, labels = load_mnist(require_data("mnist"), "test")
    images, labels = images[:2000], labels[:2000]
    n = 100
    cluttered, targets, objects = make_multilabel_digits(images, labels, n, seed=5, return_objects=True, **CLUTTER_TASK)
    clean, targets0, objects0 = make_multilabel_digits(
        images, labels, n, seed=5, return_objects=True, **dict(CLUTTER_TASK, num_clutter=0)
    )
    assert torch.equal(targets, targets0) and torch.equal(objects, objects0)  # clutter is drawn after the digits
    clutter_area = CLUTTER_TASK["num_clutter"] * CLUTTER_TASK["clutter_size"] ** 2
    box_ink, empty_ink = [], []
    for i in range(n):
        occupied = set()
        for c, x0, y0, x1, y1 in objects[i].tolist():
            if c < 0:
                continue
            crop = cluttered[i, 0, y0:y1, x0:x1]
            assert crop.float().sum() >= 5 * 255, (i, c)  # a crop at each object's box holds a digit's ink
            box_ink.append(crop.float().mean() / 255)
            occupied.add((y0 // CELL, x0 // CELL))
        outside = torch.ones(128, 128, dtype=torch.bool)
        for _, x0, y0, x1, y1 in objects[i].tolist():
            outside[y0:y1, x0:x1] = False
        assert (clean[i, 0][outside] == 0).all()  # without clutter: no ink away from the objects
        assert int((cluttered[i, 0][outside] > 0).sum()) <= clutter_area  # with it: at most the fragments' area
        for r in range(4):
            for q in range(4):
                if (r, q) not in occupied:  # a cell away from all objects: clutter-level ink only
                    cell = cluttered[i, 0, r * CELL : (r + 1) * CELL, q * CELL : (q + 1) * CELL]
                    empty_ink.append(cell.float().mean() / 255)
    assert torch.stack(box_ink).mean() > 4 * torch.stack(empty_ink).mean()


def test_clutter_task_spreads_objects_and_counts():
    images, labels = flat_digits()
    _, targets, objects = make_multilabel_digits(images, labels, 400, seed=6, return_objects=True, **CLUTTER_TASK)
    assert set(targets.sum(1).long().tolist()) == {1, 2, 3, 4}
    present = objects[objects[..., 0] >= 0]
    cells = {(y0 // CELL, x0 // CELL) for _, x0, y0, _, _ in present.tolist()}
    assert len(cells) == 16  # every one of the 16 places is used
    sides = (present[:, 3] - present[:, 1]).unique()
    assert sides.min() == 14 and sides.max() == 28


def test_clutter_task_is_deterministic_by_seed_and_old_defaults_unchanged():
    images, labels = flat_digits()
    a = make_multilabel_digits(images, labels, 40, seed=9, return_objects=True, **CLUTTER_TASK)
    b = make_multilabel_digits(images, labels, 40, seed=9, return_objects=True, **CLUTTER_TASK)
    c = make_multilabel_digits(images, labels, 40, seed=10, return_objects=True, **CLUTTER_TASK)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[2], c[2])
    # the new options at their defaults draw exactly what the generator drew before them
    old = make_multilabel_digits(images, labels, 40, num_clutter=3, seed=2)
    new = make_multilabel_digits(images, labels, 40, num_clutter=3, seed=2, grid_cells=0, clutter_scale=1.0)
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])


def test_clutter_fragments_are_cut_from_shrunk_digits():
    labels = torch.arange(NUM_CLASSES).repeat_interleave(2)
    images = torch.zeros(len(labels), 1, 28, 28, dtype=torch.uint8)
    images[:, :, 10:18, 10:18] = 255  # an 8 px block: at clutter_scale 0.5 it shrinks to 4 px

    def most_full_ink_outside_the_digits(clutter_scale: float) -> int:
        task = dict(CLUTTER_TASK, min_digits=1, max_digits=1, num_clutter=1, clutter_size=14)
        task.update(scale_range=(0.5, 0.5), clutter_scale=clutter_scale)
        canvases, _, objects = make_multilabel_digits(images, labels, 30, seed=1, return_objects=True, **task)
        outside = canvases.clone()
        for i, (_, x0, y0, x1, y1) in enumerate(objects[:, 0].tolist()):
            outside[i, 0, y0:y1, x0:x1] = 0
        return int((outside == 255).flatten(1).sum(1).max())

    assert most_full_ink_outside_the_digits(0.5) <= 16  # a 14 px fragment of a 14 px digit: its 4 x 4 block
    assert most_full_ink_outside_the_digits(1.0) > 16  # of a 28 px digit: part of an 8 x 8 block


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("layout_grid", 1, "data.layout_grid"),
        ("layout_grid", -1, "data.layout_grid"),
        ("clutter_size", 30, "data.clutter_size"),
        ("clutter_scale", 0.0, "data.clutter_scale"),
        ("digits_per_canvas", [3, 2], "data.digits_per_canvas"),
        ("digits_per_canvas", [1, 11], "data.digits_per_canvas"),
        ("scale_range", [0.5, 5.0], "data.scale_range"),
        ("scale_range", [1.0], "data.scale_range"),
        ("num_clutter", -1, "data.num_clutter"),
        ("canvas_size", -5, "data.canvas_size"),
        ("num_train", -1, "data.num_train"),
    ],
)
def test_bad_task_options_name_their_key(tmp_path, key, value, match):
    cfg = SimpleNamespace(
        canvas_size=128, digits_per_canvas=[1, 4], scale_range=[0.5, 1.0], layout_grid=4, num_clutter=16,
        clutter_size=8, clutter_scale=0.75, num_train=8, num_test=8, val_size=100, seed=0,
    )  # fmt: skip
    setattr(cfg, key, value)
    with pytest.raises(ValueError, match=match):
        build_multilabel_digits(cfg, tmp_path)  # checked before any file is read


def test_rarl_clutter_config_is_the_documented_task():
    from rlattention.engine.config import load_config

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    data = load_config(root / "configs" / "rarl_clutter.yaml").data
    from_config = dict(
        canvas=data.canvas_size,
        min_digits=data.digits_per_canvas[0],
        max_digits=data.digits_per_canvas[1],
        scale_range=tuple(data.scale_range),
        grid_cells=data.layout_grid,
        num_clutter=data.num_clutter,
        clutter_size=data.clutter_size,
        clutter_scale=data.clutter_scale,
    )
    assert data.name == "multilabel_digits" and from_config == CLUTTER_TASK


def test_registered_clutter_task_is_deterministic(require_data):
    mnist = require_data("mnist")
    cfg = SimpleNamespace(
        canvas_size=128, digits_per_canvas=[1, 4], scale_range=[0.5, 1.0], layout_grid=4, num_clutter=16,
        clutter_size=8, clutter_scale=0.75, num_train=24, num_test=8, val_size=500, seed=3,
    )  # fmt: skip
    a, b = build_multilabel_digits(cfg, mnist), build_multilabel_digits(cfg, mnist)
    assert a.image_shape == (1, 128, 128)
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(a, split).images, getattr(b, split).images)
        assert torch.equal(getattr(a, split).targets, getattr(b, split).targets)
    cfg.seed = 4
    assert not torch.equal(build_multilabel_digits(cfg, mnist).train.images, a.train.images)
