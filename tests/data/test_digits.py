"""The embedded ``digits`` dataset: shapes, determinism, balance, placement, speed, the builder."""

from __future__ import annotations

import time

import pytest
import torch

from rlattention.data.config import DataConfig
from rlattention.data.registry import build_dataset
from rlattention.data.synthetic.digits import build_digits, make_digits, render_glyphs

INK = 64  # well above the light noise (std <= 8), well below the strokes


@pytest.fixture(scope="module")
def sample() -> tuple[torch.Tensor, torch.Tensor]:
    return make_digits(1000, canvas=40, seed=0)


def test_shape_and_dtype(sample: tuple[torch.Tensor, torch.Tensor]) -> None:
    images, labels = sample
    assert images.shape == (1000, 1, 40, 40) and images.dtype == torch.uint8
    assert labels.shape == (1000,) and labels.dtype == torch.int64
    assert int(labels.min()) == 0 and int(labels.max()) == 9
    assert make_digits(7, canvas=64, seed=3)[0].shape == (7, 1, 64, 64)
    assert make_digits(0)[0].shape == (0, 1, 40, 40)


def test_deterministic_bit_identical(sample: tuple[torch.Tensor, torch.Tensor]) -> None:
    images, labels = make_digits(1000, canvas=40, seed=0)
    assert torch.equal(images, sample[0]) and torch.equal(labels, sample[1])


def test_seeds_differ(sample: tuple[torch.Tensor, torch.Tensor]) -> None:
    images, labels = make_digits(1000, canvas=40, seed=1)
    assert not torch.equal(labels, sample[1])
    assert (images != sample[0]).float().mean() > 0.5


def test_classes_balanced(sample: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert torch.bincount(sample[1], minlength=10).tolist() == [100] * 10
    counts = torch.bincount(make_digits(1003, seed=4)[1], minlength=10)
    assert int(counts.max() - counts.min()) <= 1


def test_ink_inside_canvas_and_digit_size(sample: tuple[torch.Tensor, torch.Tensor]) -> None:
    ink = sample[0][:, 0] > INK
    border = torch.cat([ink[:, 0], ink[:, -1], ink[:, :, 0], ink[:, :, -1]], dim=1)
    assert not bool(border.any()), "a digit touches the canvas border"
    assert bool(ink.flatten(1).any(1).all()), "an image without a digit"
    height = ink.any(2).sum(1).float()  # rows with ink
    assert 10 <= float(height.min()) and float(height.max()) <= 27
    assert 16 <= float(height.mean()) <= 21


def test_positions_spread_over_canvas(sample: tuple[torch.Tensor, torch.Tensor]) -> None:
    ink = (sample[0][:, 0] > INK).float()
    cols = torch.arange(40, dtype=torch.float32)
    centre_x = (ink.sum(1) * cols).sum(1) / ink.sum((1, 2))
    assert float(centre_x.min()) < 13 and float(centre_x.max()) > 27  # translated anywhere, not only centred


def test_background_is_lightly_noisy(sample: tuple[torch.Tensor, torch.Tensor]) -> None:
    background = sample[0][:, 0, 0].float()  # the top row never holds ink
    assert 0 < float(background.mean()) < 8


def test_glyph_bank() -> None:
    templates, ink_size, ink_centre = render_glyphs()
    assert templates.shape[:2] == ink_size.shape[:2] == ink_centre.shape[:2] == (10, 2)
    assert bool((templates.amax((2, 3)) > 0.99).all())  # every glyph has full-intensity ink
    assert bool((ink_size[..., 1] >= 20).all()) and bool((ink_centre.abs() < 0.2).all())
    assert bool((templates[:, 1].sum((1, 2)) > templates[:, 0].sum((1, 2))).all())  # bold has more ink


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="canvas"):
        make_digits(4, canvas=12)
    with pytest.raises(ValueError, match="n must be"):
        make_digits(-1)


def test_speed() -> None:
    """5,000 digits in one call cost at least 10 times less per digit than one call per digit (a ratio in the same
    run, so a loaded machine does not fail it; measured about 60x on one thread)."""
    start = time.perf_counter()
    make_digits(5000, canvas=40, seed=0)
    batched = time.perf_counter() - start
    start = time.perf_counter()
    for seed in range(100):
        make_digits(1, canvas=40, seed=seed)
    one_by_one = (time.perf_counter() - start) * 50  # extrapolated to the 5,000 digits
    assert one_by_one / batched > 10.0, f"5000 digits: batched {batched:.2f} s vs one by one {one_by_one:.2f} s"


def test_builder_sizes_and_seeds() -> None:
    splits = build_digits(DataConfig(num_train=200, num_test=100, val_size=50, seed=3), None)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (200, 50, 100)
    assert splits.num_classes == 10 and splits.image_shape == (1, 40, 40) and splits.name == "digits"
    assert torch.equal(splits.train.images, make_digits(200, 40, seed=3)[0])
    assert torch.equal(splits.val.images, make_digits(50, 40, seed=4)[0])
    assert torch.equal(splits.test.images, make_digits(100, 40, seed=5)[0])
    default_val = build_dataset("digits", DataConfig(num_train=10, num_test=10, canvas_size=32))
    assert len(default_val.val) == 2000 and default_val.image_shape == (1, 32, 32)
