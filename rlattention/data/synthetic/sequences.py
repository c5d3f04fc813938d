"""Multi-digit MNIST sequences: a synthetic stand-in for SVHN house numbers (Goodfellow et al., 2014;
Ba et al., 2015), and the ``mnist_sequences`` dataset.

Each canvas shows 1..``max_len`` real MNIST digits side by side, left to right, with per-digit jitter:

1. Layout in native MNIST pixels: digit ``k`` is a square of side ``28 * s_k`` with ``s_k ~ U(scale)``
   (default 0.8..1.1); consecutive squares are ``g_k ~ U(gap)`` pixels apart (default -6..0: the squares
   may overlap, the ~4 px empty margin of an MNIST digit keeps the ink apart); each square's centre is
   shifted vertically by ``v_k ~ U(-jitter_y, jitter_y)``.
2. Like the SVHN crops (the union box of the digits, expanded and resized), the union box of the squares
   is scaled isotropically to fill ``fill`` of the canvas (default 0.9, close to the ~0.91 of the SVHN
   protocol: box * 1.3 -> 64 px, centre 54 px kept), but never enlarged beyond ``max_zoom`` (default 1:
   short sequences keep native-size digits instead of being blown up).
3. The scaled box is placed uniformly at random inside the canvas.

Rendering is batched: every (image, digit) pair of a chunk of images is drawn at once with two batched
matrix products (scaling along an axis is separable), as bilinear sampling averaged over
``supersample x supersample`` points per pixel (anti-aliasing), and the digits of an image combine with
``max``. The only Python loop runs over fixed-size chunks of images, which bound the memory.

Targets (:func:`encode_sequences`): int64 ``(N, max_len + 1)``; positions ``0..len-1`` hold the digits
(0..9), position ``len`` the end token :data:`END_TOKEN` (10), the rest :data:`PAD_TOKEN` (-1).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlattention.data.base import ArrayDataset, DataSplits, check_digit_images
from rlattention.data.limits import check_side
from rlattention.data.readers.mnist import load_mnist
from rlattention.data.registry import register_dataset
from rlattention.data.sequence_targets import END_TOKEN, PAD_TOKEN, encode_sequences
from rlattention.data.splits import split_seed, train_val_split

__all__ = [
    "END_TOKEN",
    "PAD_TOKEN",
    "SequenceBatch",
    "build_mnist_sequences",
    "encode_sequences",
    "make_sequences",
]


_DIGIT_SIDE = 28
_CHUNK = 1024  # images rendered at once: <= 5 * 1024 single-digit float canvases (~60 MB at 54x54)
_DEFAULT_NUM_TRAIN = 50_000
_DEFAULT_NUM_TEST = 10_000
_DEFAULT_CANVAS = 54
_MISSING_DIR_MSG = (
    "mnist_sequences needs the four MNIST idx files: pass --data-dir or set RLATTENTION_DATA "
    "(e.g. ../shared/data/mnist)"
)


class SequenceBatch(NamedTuple):
    """What :func:`make_sequences` returns.

    images: uint8 ``(N, 1, canvas, canvas)``, 0..255, white ink on black.
    targets: int64 ``(N, max_len + 1)``: digits, end token, padding (see :func:`encode_sequences`).
    boxes: float32 ``(N, max_len, 4)``: each digit's square ``(x0, y0, x1, y1)`` in canvas pixels
        (the whole 28x28 MNIST frame, not only the ink); ``nan`` for slots past the sequence's end.
    """

    images: Tensor
    targets: Tensor
    boxes: Tensor


def _targets(digit_labels: Tensor, lengths: Tensor) -> Tensor:
    """digit_labels ``(N, max_len)`` int64, lengths ``(N,)`` in 1..max_len -> ``(N, max_len + 1)`` targets."""
    n, max_len = digit_labels.shape
    pos = torch.arange(max_len + 1).expand(n, -1)
    padded = torch.cat([digit_labels, torch.zeros(n, 1, dtype=torch.int64)], dim=1)
    length = lengths.view(-1, 1)
    return torch.where(pos < length, padded, torch.where(pos == length, END_TOKEN, PAD_TOKEN))


def _validate(
    digits: Tensor,
    labels: Tensor,
    canvas: int,
    max_len: int,
    min_len: int,
    scale: tuple[float, float],
    gap: tuple[float, float],
    jitter_y: float,
    fill: float,
    max_zoom: float,
    supersample: int,
) -> None:
    check_digit_images(digits, labels, "digits")
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) > 9):
        raise ValueError(f"labels must be digits 0..9, found {int(labels.min())}..{int(labels.max())}")
    if canvas < 8:
        raise ValueError(f"canvas must be >= 8 pixels, got {canvas}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    if not 0 < scale[0] <= scale[1]:
        raise ValueError(f"scale must be a range 0 < low <= high, got {scale}")
    if not gap[0] <= gap[1] or gap[0] <= -_DIGIT_SIDE * scale[0]:
        raise ValueError(
            f"gap must be a range low <= high with low > -{_DIGIT_SIDE} * scale[0] = {-_DIGIT_SIDE * scale[0]:g} "
            f"(digit centres must move right), got {gap}"
        )
    if jitter_y < 0 or not 0 < fill <= 1 or max_zoom <= 0 or supersample < 1:
        raise ValueError(
            f"need jitter_y >= 0, 0 < fill <= 1, max_zoom > 0, supersample >= 1; got jitter_y={jitter_y}, "
            f"fill={fill}, max_zoom={max_zoom}, supersample={supersample}"
        )


def _layout(
    n: int,
    num_digits: int,
    max_len: int,
    min_len: int,
    canvas: int,
    scale: tuple[float, float],
    gap: tuple[float, float],
    jitter_y: float,
    fill: float,
    max_zoom: float,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor]:
    """Draw every random choice of ``n`` canvases at once (CPU, float64 for exact reproducibility).

    Returns ``lengths`` int64 ``(n,)`` in min_len..max_len, ``sources`` int64 ``(n, max_len)`` indices into the
    digits, and ``boxes`` float64 ``(n, max_len, 4)`` ``(x0, y0, x1, y1)`` canvas squares (all slots, even the
    unused ones past ``lengths``, which lie outside the union box and are never rendered).
    """

    def uniform(low: float, high: float, *shape: int) -> Tensor:
        return low + (high - low) * torch.rand(*shape, generator=generator, dtype=torch.float64)

    lengths = torch.randint(min_len, max_len + 1, (n,), generator=generator)
    sources = torch.randint(max(num_digits, 1), (n, max_len), generator=generator)
    side = _DIGIT_SIDE * uniform(*scale, n, max_len)
    gaps = uniform(*gap, n, max_len)
    centre_y = uniform(-jitter_y, jitter_y, n, max_len)
    place = uniform(0.0, 1.0, n, 2)

    # Native layout: square k spans [left_k, left_k + side_k] x [centre_y_k -+ side_k / 2].
    step = side + gaps
    left = torch.cumsum(step, dim=1) - step
    x0, x1 = left, left + side
    y0, y1 = centre_y - side / 2, centre_y + side / 2
    active = torch.arange(max_len).view(1, -1) < lengths.view(-1, 1)
    inf = torch.tensor(math.inf, dtype=torch.float64)
    ux0 = torch.where(active, x0, inf).amin(1)
    uy0 = torch.where(active, y0, inf).amin(1)
    ux1 = torch.where(active, x1, -inf).amax(1)
    uy1 = torch.where(active, y1, -inf).amax(1)
    width, height = ux1 - ux0, uy1 - uy0
    zoom = torch.clamp(fill * canvas / torch.maximum(width, height), max=max_zoom)
    # The scaled union box, at a uniform position inside the canvas.
    bx = place[:, 0] * (canvas - width * zoom)
    by = place[:, 1] * (canvas - height * zoom)
    z = zoom.view(-1, 1)
    boxes = torch.stack(
        [
            bx.view(-1, 1) + (x0 - ux0.view(-1, 1)) * z,
            by.view(-1, 1) + (y0 - uy0.view(-1, 1)) * z,
            bx.view(-1, 1) + (x1 - ux0.view(-1, 1)) * z,
            by.view(-1, 1) + (y1 - uy0.view(-1, 1)) * z,
        ],
        dim=-1,
    )
    return lengths, sources, boxes


def _axis_weights(start: Tensor, side: Tensor, size: int, source: int, supersample: int) -> Tensor:
    """Resampling weights along one axis: output pixel ``u`` of a ``size`` wide canvas from ``source`` pixels.

    start, side: float64 ``(B,)``: where the digit's outer edge starts on the canvas and how wide it is.
    Returns float32 ``(B, size, source)``: the average over ``supersample`` evenly spaced points of canvas pixel
    ``u`` of the linear-interpolation weights of the digit's pixels, zero outside the digit. Canvas point ``x``
    reads the digit at ``(x - start) / side * source`` (pixel ``j`` centred at ``j + 0.5``), i.e. exactly
    ``grid_sample(..., mode="bilinear", padding_mode="zeros", align_corners=False)`` followed by an
    ``avg_pool2d(supersample)`` box filter against aliasing.
    """
    b = len(start)
    points = torch.arange(size * supersample, dtype=torch.float64).add_(0.5).div_(supersample)  # (size * ss,)
    where = (points.view(1, -1) - start.view(-1, 1)) / side.view(-1, 1) * source - 0.5  # (B, size * ss)
    low = where.floor()
    frac = (where - low).float()
    index = torch.stack([low, low + 1], dim=-1).long()  # the two neighbouring source pixels of each point
    weight = torch.stack([1 - frac, frac], dim=-1).div_(supersample)
    inside = (index >= 0) & (index < source)  # zero padding: pixels off the digit contribute nothing
    weight = torch.where(inside, weight, 0.0).view(b, size, 2 * supersample)
    index = index.clamp_(0, source - 1).view(b, size, 2 * supersample)
    return torch.zeros(b, size, source).scatter_add_(2, index, weight)


def _render(digits: Tensor, boxes: Tensor, canvas: int, supersample: int) -> Tensor:
    """Each of B digits drawn alone into its square of a black canvas.

    digits: float ``(B, 1, h, w)`` 0..255. boxes: float64 ``(B, 4)`` ``(x0, y0, x1, y1)`` in canvas pixels.
    Returns float ``(B, canvas, canvas)`` 0..255. Axis-aligned scaling is separable, so the resampling is two
    batched matrix products ``Wy @ digit @ Wx^T`` (see :func:`_axis_weights`).
    """
    h, w = digits.shape[2:]
    wy = _axis_weights(boxes[:, 1], boxes[:, 3] - boxes[:, 1], canvas, h, supersample).to(digits.device)
    wx = _axis_weights(boxes[:, 0], boxes[:, 2] - boxes[:, 0], canvas, w, supersample).to(digits.device)
    return torch.bmm(torch.bmm(wy, digits[:, 0]), wx.transpose(1, 2))


def make_sequences(
    digits: Tensor,
    labels: Tensor,
    n: int,
    *,
    canvas: int = _DEFAULT_CANVAS,
    max_len: int = 5,
    min_len: int = 1,
    scale: tuple[float, float] = (0.8, 1.1),
    gap: tuple[float, float] = (-6.0, 0.0),
    jitter_y: float = 4.0,
    fill: float = 0.9,
    max_zoom: float = 1.0,
    supersample: int = 4,
    seed: int = 0,
) -> SequenceBatch:
    """Generate ``n`` multi-digit canvases from real digits (see the module docstring for the layout).

    digits: ``(M, 1, 28, 28)`` uint8 digit images, 0..255 (e.g. from :func:`load_mnist`); ``M >= 1`` if ``n > 0``.
    labels: ``(M,)`` integer digit classes 0..9.
    n: number of canvases to generate.
    canvas: canvas side in pixels (54 as for SVHN).
    max_len / min_len: the number of digits per canvas is uniform in ``min_len..max_len``.
    scale: range of the per-digit scale, relative to 28 native pixels.
    gap: range of the horizontal gap between consecutive digit squares, in native pixels (negative: overlap).
    jitter_y: range of the vertical offset of each digit's centre, ``+-jitter_y`` native pixels.
    fill: the longer side of the scaled union box is ``fill * canvas`` ...
    max_zoom: ... unless that would scale the digits by more than ``max_zoom``.
    supersample: bilinear samples per pixel per axis (anti-aliasing of shrunk digits).
    seed: seed of a private ``torch.Generator``; all choices are drawn up front on the CPU, so the result is
        bit-identical for the same inputs and seed, whatever the digits' device.

    Returns a :class:`SequenceBatch` ``(images, targets, boxes)`` on the digits' device (targets and boxes on
    the CPU): uint8 ``(n, 1, canvas, canvas)``, int64 ``(n, max_len + 1)``, float32 ``(n, max_len, 4)``.
    """
    scale = (float(scale[0]), float(scale[1]))
    gap = (float(gap[0]), float(gap[1]))
    _validate(digits, labels, canvas, max_len, min_len, scale, gap, jitter_y, fill, max_zoom, supersample)
    if n > 0 and len(digits) == 0:
        raise ValueError(f"cannot draw {n} sequences from an empty set of digits")
    generator = torch.Generator().manual_seed(int(seed))
    lengths, sources, boxes = _layout(
        n, len(digits), max_len, min_len, canvas, scale, gap, jitter_y, fill, max_zoom, generator
    )
    labels_cpu = labels.detach().to("cpu", torch.int64)
    digit_labels = labels_cpu[sources] if len(digits) else torch.zeros(n, max_len, dtype=torch.int64)
    targets = _targets(digit_labels, lengths)
    active = torch.arange(max_len).view(1, -1) < lengths.view(-1, 1)

    device = digits.device
    images = torch.empty(n, 1, canvas, canvas, dtype=torch.uint8, device=device)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        image, slot = active[start:stop].nonzero(as_tuple=True)  # every (image, digit slot) pair drawn in this chunk
        drawn = _render(
            digits[sources[start + image, slot].to(device)].float(), boxes[start + image, slot], canvas, supersample
        )
        work = torch.zeros(stop - start, canvas * canvas, device=device)
        index = image.to(device).view(-1, 1).expand(-1, canvas * canvas)
        work.scatter_reduce_(0, index, drawn.view(-1, canvas * canvas), "amax")  # max: neighbours never erase ink
        images[start:stop, 0] = work.view(-1, canvas, canvas).round_().clamp_(0, 255).to(torch.uint8)
    boxes = torch.where(active.unsqueeze(-1), boxes, torch.tensor(math.nan, dtype=torch.float64)).float()
    return SequenceBatch(images, targets, boxes)


# ----------------------------------------------------------------------------------------------- dataset


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


@register_dataset("mnist_sequences")
def build_mnist_sequences(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Multi-digit MNIST sequences, 1x``canvas``x``canvas`` uint8 images, 11 classes (digits + end token).

    Source digits: the MNIST training digits minus ``cfg.val_size`` held out by
    ``train_val_split(60000, val_size, seed)`` feed the training canvases; the held-out digits feed the
    validation canvases; the t10k digits feed the test canvases, so no digit image is shared across splits.
    Sizes: ``cfg.num_train`` training canvases (default 50000), ``cfg.val_size`` validation canvases (capped
    at ``cfg.num_test`` when that is > 0), ``cfg.num_test`` test canvases (default 10000).
    Canvas ``cfg.canvas_size`` (default 54), up to ``cfg.max_digits`` digits (default 5); the generator seed
    of each split comes from ``cfg.seed`` and the split name. Targets: int64 ``(N, max_digits + 1)``, see
    :func:`encode_sequences`.
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG)
    canvas = int(_option(cfg, "canvas_size", 0)) or _DEFAULT_CANVAS
    check_side("data.canvas_size", canvas)
    max_len = int(_option(cfg, "max_digits", 5))
    seed = int(_option(cfg, "seed", 0))
    val_size = int(_option(cfg, "val_size", 6000))
    num_train = int(_option(cfg, "num_train", 0)) or _DEFAULT_NUM_TRAIN
    num_test_cfg = int(_option(cfg, "num_test", 0))
    num_test = num_test_cfg or _DEFAULT_NUM_TEST
    num_val = min(val_size, num_test_cfg) if num_test_cfg > 0 else val_size

    train_digits, train_labels = load_mnist(data_dir, "train")
    train_idx, val_idx = train_val_split(len(train_digits), val_size, seed)
    test_digits, test_labels = load_mnist(data_dir, "test")
    sources = {
        "train": (train_digits[train_idx], train_labels[train_idx], num_train),
        "val": (train_digits[val_idx], train_labels[val_idx], num_val),
        "test": (test_digits, test_labels, num_test),
    }
    parts = []
    for split, (digits, labels, count) in sources.items():
        batch = make_sequences(digits, labels, count, canvas=canvas, max_len=max_len, seed=split_seed(seed, split))
        parts.append(ArrayDataset(batch.images, batch.targets))
    return DataSplits(*parts, num_classes=END_TOKEN + 1, name="mnist_sequences")
