"""Multi-label digit canvases: shapes, 2-4 distinct labels per canvas, labels equal to the digits drawn (checked
with flat 'digits' whose grey value encodes their class), no overlap in the default layout, determinism,
clutter, argument errors, and the registered dataset on real MNIST."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlattention.data import multilabel_digits  # noqa: F401  (registers "multilabel_digits")
from rlattention.data.multilabel_digits import NUM_CLASSES, build_multilabel_digits, make_multilabel_digits
from rlattention.data.registry import build_dataset


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
