"""Cluttered digits: shapes, determinism, the digit kept intact, clutter from other digits, speed."""

from __future__ import annotations

import time

import pytest
import torch

from rlattention.data.synthetic.cluttered import PRESETS, make_cluttered


def fake_digits(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, 1, 28, 28)`` uint8 sparse random 'ink' (about 30 % of pixels lit) and ``(n,)`` labels."""
    g = torch.Generator().manual_seed(seed)
    ink = torch.randint(1, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    lit = torch.rand(n, 1, 28, 28, generator=g) < 0.3
    return ink * lit, torch.randint(0, 10, (n,), generator=g)


def windows(canvas: torch.Tensor, side: int = 28) -> torch.Tensor:
    """All ``side x side`` windows of ``(N, 1, C, C)``: ``(N, (C - side + 1) ** 2, side, side)``."""
    w = canvas[:, 0].unfold(1, side, 1).unfold(2, side, 1)
    return w.reshape(len(canvas), -1, side, side)


def test_shape_dtype_and_labels() -> None:
    images, labels = fake_digits(10)
    out, out_labels = make_cluttered(images, labels.int(), canvas=60, num_clutter=4)
    assert out.shape == (10, 1, 60, 60) and out.dtype == torch.uint8
    assert out_labels.dtype == torch.int64 and torch.equal(out_labels, labels)


def test_presets() -> None:
    assert PRESETS == {
        "60x60": {"canvas": 60, "num_clutter": 4},
        "100x100": {"canvas": 100, "num_clutter": 10},
    }
    images, labels = fake_digits(3)
    for name, preset in PRESETS.items():
        out, _ = make_cluttered(images, labels, **preset)
        assert out.shape[-1] == int(name.split("x")[0])


def test_deterministic_and_seed_dependent() -> None:
    images, labels = fake_digits(50)
    first, _ = make_cluttered(images, labels, 60, 4, seed=7)
    second, _ = make_cluttered(images, labels, 60, 4, seed=7)
    other, _ = make_cluttered(images, labels, 60, 4, seed=8)
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_without_clutter_the_digit_is_translated_exactly() -> None:
    images, labels = fake_digits(30)
    out, _ = make_cluttered(images, labels, canvas=40, num_clutter=0, seed=1)
    assert torch.equal(out.flatten(1).sum(1, dtype=torch.int64), images.flatten(1).sum(1, dtype=torch.int64))
    exact = (windows(out) == images).flatten(2).all(-1)  # (N, P): window equal to the digit
    assert bool(exact.any(1).all())


def test_digit_kept_intact_under_clutter() -> None:
    images, labels = fake_digits(30)
    out, _ = make_cluttered(images, labels, canvas=40, num_clutter=6, clutter_size=8, seed=2)
    covers = (windows(out) >= images).flatten(2).all(-1)  # max-combination: every ink pixel survives
    assert bool(covers.any(1).all())
    assert bool((out.flatten(1).sum(1, dtype=torch.int64) > images.flatten(1).sum(1, dtype=torch.int64)).all())


def test_clutter_comes_from_other_digits() -> None:
    # Digit 0 is empty and digit 1 a solid square: the empty digit's canvas receives 8x8 pieces of the square,
    # the square's canvas receives only (empty) pieces of the empty digit.
    images = torch.zeros(2, 1, 28, 28, dtype=torch.uint8)
    images[1] = 255
    out, _ = make_cluttered(images, torch.tensor([0, 1]), canvas=60, num_clutter=3, clutter_size=8, seed=0)
    assert int((out[1] > 0).sum()) == 28 * 28
    assert 64 <= int((out[0] > 0).sum()) <= 3 * 64


def test_fragments_stay_inside_and_within_digit_values() -> None:
    images, labels = fake_digits(20)
    out, _ = make_cluttered(images, labels, canvas=28, num_clutter=5, seed=3)  # digit fills the whole canvas
    assert out.shape == (20, 1, 28, 28) and bool((out >= images).all())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"canvas": 27, "num_clutter": 4}, "canvas must be >= the digit size"),
        ({"canvas": 60, "num_clutter": -1}, "num_clutter"),
        ({"canvas": 60, "num_clutter": 2, "clutter_size": 29}, "clutter_size"),
        ({"canvas": 60, "num_clutter": 2, "clutter_size": 0}, "clutter_size"),
    ],
)
def test_invalid_arguments(kwargs: dict, match: str) -> None:
    images, labels = fake_digits(4)
    with pytest.raises(ValueError, match=match):
        make_cluttered(images, labels, **kwargs)


def test_invalid_inputs() -> None:
    images, labels = fake_digits(4)
    with pytest.raises(ValueError, match="uint8"):
        make_cluttered(images.float(), labels, 60, 4)
    with pytest.raises(ValueError, match=r"\(N, 1, H, W\)"):
        make_cluttered(images[:, 0], labels, 60, 4)
    with pytest.raises(ValueError, match="labels"):
        make_cluttered(images, labels[:3], 60, 4)


def test_single_and_empty_sets() -> None:
    images, labels = fake_digits(1)
    out, _ = make_cluttered(images, labels, 40, 3)
    assert out.shape == (1, 1, 40, 40)
    out, out_labels = make_cluttered(images[:0], labels[:0], 40, 3)
    assert out.shape == (0, 1, 40, 40) and out_labels.shape == (0,)


def test_vectorised_speed() -> None:
    """One call for 2,000 canvases is at least 5 times faster per canvas than one call per canvas (a ratio measured
    in the same run, each side the best of 3, so a loaded machine does not fail it; measured about 30x on one
    thread, 3.8x once as single timings beside two trainings and a test run)."""
    images, labels = fake_digits(2000)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        out, _ = make_cluttered(images, labels, **PRESETS["100x100"])
        times.append(time.perf_counter() - start)
    batched = min(times)
    assert out.shape == (2000, 1, 100, 100)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for i in range(200):
            make_cluttered(images[i : i + 1], labels[i : i + 1], **PRESETS["100x100"])
        times.append(time.perf_counter() - start)
    one_by_one = min(times) * 10  # extrapolated to the 2,000 canvases
    assert one_by_one / batched > 5.0, f"batched {batched:.2f} s vs one call per canvas {one_by_one:.2f} s"
