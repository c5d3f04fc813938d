"""Multi-digit sequences: shapes, determinism, target encoding, left-to-right order, rendering against a slow
reference, the ``mnist_sequences`` builder, and the sequence metrics."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlattention.data.config import DataConfig
from rlattention.data.readers.mnist import load_mnist
from rlattention.data.registry import available_datasets, build_dataset
from rlattention.data.synthetic.sequences import (
    END_TOKEN,
    PAD_TOKEN,
    build_mnist_sequences,
    encode_sequences,
    make_sequences,
)
from rlattention.metrics import sequence as seq_metrics
from rlattention.metrics.sequence import decode_sequence, sequence_error


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """These batches are small: one intra-op thread avoids paying thread synchronisation per operation, which
    dominates (10x) on a busy machine. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def templates() -> tuple[torch.Tensor, torch.Tensor]:
    """Ten distinct 'digits': ``(10, 1, 28, 28)`` uint8 random ink in the central 20x20 (as MNIST), labels 0..9."""
    g = torch.Generator().manual_seed(123)
    ink = torch.randint(64, 256, (10, 1, 20, 20), generator=g, dtype=torch.uint8)
    ink *= torch.rand(10, 1, 20, 20, generator=g) < 0.5
    digits = torch.zeros(10, 1, 28, 28, dtype=torch.uint8)
    digits[:, :, 4:24, 4:24] = ink
    return digits, torch.arange(10)


@pytest.fixture(scope="module")
def sample() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    digits, labels = templates()
    return tuple(make_sequences(digits, labels, 300, seed=0))  # type: ignore[return-value]


def lengths_of(targets: torch.Tensor) -> torch.Tensor:
    return ((targets >= 0) & (targets <= 9)).sum(1)


def test_shapes_and_dtypes(sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    images, targets, boxes = sample
    assert images.shape == (300, 1, 54, 54) and images.dtype == torch.uint8
    assert targets.shape == (300, 6) and targets.dtype == torch.int64
    assert boxes.shape == (300, 5, 4) and boxes.dtype == torch.float32
    digits, labels = templates()
    other = make_sequences(digits, labels, 7, canvas=80, max_len=3, seed=1)
    assert other.images.shape == (7, 1, 80, 80) and other.targets.shape == (7, 4) and other.boxes.shape == (7, 3, 4)
    empty = make_sequences(digits[:0], labels[:0], 0)
    assert empty.images.shape == (0, 1, 54, 54) and empty.targets.shape == (0, 6)


def test_deterministic_and_seed_dependent(sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    digits, labels = templates()
    again = make_sequences(digits, labels, 300, seed=0)
    assert torch.equal(again.images, sample[0]) and torch.equal(again.targets, sample[1])
    assert torch.equal(again.boxes.nan_to_num(-7), sample[2].nan_to_num(-7))
    other = make_sequences(digits, labels, 300, seed=1)
    assert not torch.equal(other.targets, sample[1]) and not torch.equal(other.images, sample[0])


def test_all_lengths_occur_and_targets_are_well_formed(sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    _, targets, boxes = sample
    lengths = lengths_of(targets)
    assert set(lengths.tolist()) == {1, 2, 3, 4, 5}
    pos = torch.arange(6).expand(300, -1)
    length = lengths.view(-1, 1)
    assert bool(((targets >= 0) & (targets <= 9) == (pos < length)).all())
    assert bool((targets[pos == length] == END_TOKEN).all())
    assert bool((targets[pos > length] == PAD_TOKEN).all())
    active = torch.arange(5).view(1, -1) < length
    assert bool(boxes[active].isfinite().all()) and bool(boxes[~active].isnan().all())
    assert make_sequences(*templates(), 50, min_len=3, max_len=3, seed=2).targets[:, 3].eq(END_TOKEN).all()


def test_boxes_inside_canvas_left_to_right_and_scaled(sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    _, targets, boxes = sample
    lengths = lengths_of(targets)
    active = torch.arange(5).view(1, -1) < lengths.view(-1, 1)
    b = boxes[active]
    assert float(b[:, :2].min()) >= -1e-4 and float(b[:, 2:].max()) <= 54 + 1e-4
    side_x, side_y = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    assert torch.allclose(side_x, side_y, atol=1e-4)  # square, isotropic scaling
    assert float(side_x.max()) <= 28 * 1.1 + 1e-4  # never enlarged beyond the native size (max_zoom = 1)
    centres = (boxes[..., 0] + boxes[..., 2]) / 2
    steps = centres[:, 1:] - centres[:, :-1]
    assert bool((steps[active[:, 1:]] > 0).all())
    single = boxes[lengths == 1, 0]  # one digit fits at native size: its side is 28 * scale, scale in 0.8..1.1
    single_side = single[:, 2] - single[:, 0]
    assert (
        len(single) > 0 and float(single_side.min()) >= 28 * 0.8 - 1e-4 and float(single_side.max()) <= 28 * 1.1 + 1e-4
    )


def column_centroid(images: torch.Tensor) -> torch.Tensor:
    """``(N, 1, H, W)`` -> ``(N,)`` ink-weighted mean column (nan without ink)."""
    mass = images[:, 0].double().sum(1)  # (N, W)
    cols = torch.arange(images.shape[-1], dtype=torch.float64)
    return (mass * cols).sum(1) / mass.sum(1)


def check_left_to_right(digits: torch.Tensor, labels: torch.Tensor, n: int, seed: int) -> int:
    """Render the same layouts with only the digits of one class inked; the column centroid of class c must sit
    where c sits in the target. Returns how many sequences were checked."""
    full = make_sequences(digits, labels, n, seed=seed)
    per_class = []
    for c in range(10):
        only_c = digits * (labels == c).view(-1, 1, 1, 1).to(torch.uint8)
        per_class.append(make_sequences(only_c, labels, n, seed=seed))
        assert torch.equal(per_class[-1].targets, full.targets)  # layout does not depend on pixel values
    stacked = torch.stack([p.images for p in per_class])  # (10, N, 1, H, W)
    assert torch.equal(stacked.amax(0), full.images)  # digits combine with max
    centroids = torch.stack([column_centroid(p.images) for p in per_class], dim=1)  # (N, 10)
    checked = 0
    for i, sequence in enumerate(decode_sequence(full.targets)):
        if len(set(sequence)) < len(sequence) or len(sequence) < 2:
            continue  # a repeated class has one centroid for several digits
        order = sorted(sequence, key=lambda c: float(centroids[i, c]))
        assert order == sequence, f"sequence {i}: target {sequence}, digits appear left to right as {order}"
        checked += 1
    return checked


def test_digits_left_to_right_match_targets() -> None:
    digits, labels = templates()
    assert check_left_to_right(digits, labels, 300, seed=5) > 100


def test_real_mnist_left_to_right(require_data: Callable[[str], Path]) -> None:
    digits, labels = load_mnist(require_data("mnist"), "test")
    assert check_left_to_right(digits[:2000], labels[:2000], 300, seed=6) > 100


def reference_render(
    digits: torch.Tensor, sources: list[int], boxes: torch.Tensor, canvas: int, ss: int
) -> torch.Tensor:
    """Slow, obvious version: per digit, grid_sample a supersampled full canvas, box-filter it, take the max."""
    out = torch.zeros(canvas, canvas)
    q = canvas * ss
    points = (torch.arange(q, dtype=torch.float64) + 0.5) / ss
    for src, (x0, y0, x1, y1) in zip(sources, boxes.double().tolist(), strict=True):
        gx = 2 * (points - x0) / (x1 - x0) - 1
        gy = 2 * (points - y0) / (y1 - y0) - 1
        grid = torch.stack([gx.view(1, q).expand(q, q), gy.view(q, 1).expand(q, q)], dim=-1).float()
        drawn = F.grid_sample(digits[src : src + 1].float(), grid[None], mode="bilinear", align_corners=False)
        out = torch.maximum(out, F.avg_pool2d(drawn, ss)[0, 0])
    return out.round().clamp(0, 255).to(torch.uint8)


def test_rendering_matches_slow_reference() -> None:
    digits, labels = templates()
    batch = make_sequences(digits, labels, 12, seed=9, supersample=3)
    for i in range(12):
        sequence = decode_sequence(batch.targets[i])[0]
        # each template is its own class, so the target names the source image
        expected = reference_render(digits, sequence, batch.boxes[i, : len(sequence)], 54, 3)
        diff = (expected.int() - batch.images[i, 0].int()).abs()
        assert int(diff.max()) <= 1, f"image {i}: max difference {int(diff.max())}"  # float rounding only


def test_invalid_arguments() -> None:
    digits, labels = templates()
    with pytest.raises(ValueError, match="min_len"):
        make_sequences(digits, labels, 4, min_len=0)
    with pytest.raises(ValueError, match="min_len"):
        make_sequences(digits, labels, 4, min_len=4, max_len=3)
    with pytest.raises(ValueError, match="gap"):
        make_sequences(digits, labels, 4, gap=(-30.0, 0.0))
    with pytest.raises(ValueError, match="uint8"):
        make_sequences(digits.float(), labels, 4)
    with pytest.raises(ValueError, match="0..9"):
        make_sequences(digits, labels + 1, 4)
    with pytest.raises(ValueError, match="empty"):
        make_sequences(digits[:0], labels[:0], 4)
    with pytest.raises(ValueError, match="scale"):
        make_sequences(digits, labels, 4, scale=(1.1, 0.8))


def test_encode_sequences() -> None:
    expected = torch.tensor([[3, 1, 4, 10, -1, -1], [0, 10, -1, -1, -1, -1], [9, 9, 9, 9, 9, 10]])
    assert torch.equal(encode_sequences([[3, 1, 4], [0], [9, 9, 9, 9, 9]], max_len=5), expected)
    with pytest.raises(ValueError, match="expected 1..5"):
        encode_sequences([[1, 2, 3, 4, 5, 6]], max_len=5)
    with pytest.raises(ValueError, match="expected 1..5"):
        encode_sequences([[]], max_len=5)
    with pytest.raises(ValueError, match="0..9"):
        encode_sequences([[10]], max_len=5)


def test_decode_sequence() -> None:
    tokens = torch.tensor([[3, 1, 10, -1], [7, 10, 4, 4], [2, 5, 8, 1], [10, 3, 3, 3], [6, -1, 10, 2]])
    assert decode_sequence(tokens) == [[3, 1], [7], [2, 5, 8, 1], [], [6]]
    assert decode_sequence([4, 2, 10]) == [[4, 2]]
    assert decode_sequence(np.array([[1, 0, 10]])) == [[1, 0]]
    assert decode_sequence(torch.tensor([[1, 2, 3]]), end_token=2) == [[1]]
    with pytest.raises(ValueError, match="integer"):
        decode_sequence(torch.zeros(2, 3))


def test_sequence_error() -> None:
    target = torch.tensor([[3, 1, 10, -1], [7, 10, -1, -1], [2, 5, 8, 10]])
    assert sequence_error(target, target) == 0.0
    pred = torch.tensor(
        [
            [3, 1, 10, 5],  # right: the position under padding is ignored
            [7, 2, 10, 10],  # wrong: no end token where the target ends
            [2, 5, 8, 9],  # wrong: the end token is missed
        ]
    )
    assert sequence_error(pred, target) == pytest.approx(2 / 3)
    assert sequence_error(torch.tensor([[3, 2, 10, -1]]), target[:1]) == 1.0  # one wrong digit
    # a prediction that stops early is padded and wrong; extra predicted steps past the target are ignored
    assert sequence_error(torch.tensor([[2, 5, 8]]), target[2:]) == 1.0
    assert sequence_error(torch.tensor([[7, 10, 0, 0, 0, 0, 0]]), target[1:2]) == 0.0
    assert math.isnan(sequence_error(torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long)))
    with pytest.raises(ValueError, match="rows"):
        sequence_error(pred[:2], target)


def test_token_constants_agree() -> None:
    assert seq_metrics.END_TOKEN == END_TOKEN and seq_metrics.PAD_TOKEN == PAD_TOKEN


@pytest.fixture(scope="module")
def mnist_dir(require_data: Callable[[str], Path]) -> Path:
    return require_data("mnist")


def test_mnist_sequences_builder(mnist_dir: Path) -> None:
    assert "mnist_sequences" in available_datasets()
    cfg = DataConfig(name="mnist_sequences", num_train=120, num_test=40, val_size=60, seed=3)
    splits = build_dataset("mnist_sequences", cfg, mnist_dir)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (120, 40, 40)  # val capped at num_test
    assert splits.num_classes == 11 and splits.image_shape == (1, 54, 54) and splits.name == "mnist_sequences"
    assert splits.train.targets.shape == (120, 6)
    assert not torch.equal(splits.val.images, splits.test.images[: len(splits.val)])
    small = build_dataset(
        "mnist_sequences", DataConfig(num_train=10, num_test=5, val_size=5, canvas_size=64, max_digits=3), mnist_dir
    )
    assert small.image_shape == (1, 64, 64) and small.train.targets.shape == (10, 4)
    assert set(lengths_of(small.train.targets).tolist()) <= {1, 2, 3}
    with pytest.raises(ValueError, match="RLATTENTION_DATA"):
        build_mnist_sequences(cfg, None)
