"""Multi-label digit canvases: a CPU-sized stand-in for multi-label photo benchmarks (VOC, COCO); the
``multilabel_digits`` dataset.

Each canvas holds 2 to 4 real digits of *distinct* classes, each scaled by its own random factor and placed
at a random position; the label of the canvas is the set of digit classes drawn, as a multi-hot vector over
the 10 classes. Optional clutter (small fragments cut from random digits) adds distractors.

Layout (grid with jitter): the canvas is divided into a ``g x g`` grid of cells, ``g = ceil(sqrt(max
digits))`` (2 x 2 for up to 4 digits); each digit of a canvas gets its own randomly chosen cell and a
uniformly random position inside it. A digit that fits in its cell (side <= canvas / g, e.g. up to 64 px on
the default 128 canvas, while 28 px digits scaled by at most 2 are 56 px) never overlaps another digit; a
larger one is centred on its cell and clamped into the canvas, so overlaps stay bounded by the excess.
Digit pixels combine with ``max``.

Everything is batched over canvases: one resize (``torch.nn.functional.interpolate``) per distinct digit
size and a gather/``scatter_reduce`` paste into the flattened canvases; Python loops only run over the few
digit sizes, the clutter fragments and fixed-size chunks that bound the index memory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from rlattention.data.base import ArrayDataset, DataSplits, check_digit_images
from rlattention.data.mnist import load_mnist, split_seed
from rlattention.data.registry import register_dataset
from rlattention.data.splits import train_val_split

__all__ = ["NUM_CLASSES", "build_multilabel_digits", "make_multilabel_digits"]

#: Digit classes 0..9; targets are ``(n, NUM_CLASSES)`` multi-hot.
NUM_CLASSES = 10

_CHUNK = 4096  # digits per paste chunk: bounds the int64 index tensors (4096 * 56 * 56 * 8 B ~ 100 MB)
_MISSING_DIR_MSG = (
    "multilabel_digits needs the four MNIST idx files: pass --data-dir or set RLATTENTION_DATA "
    "(e.g. ../shared/data/mnist)"
)


def _paste_max(flat: Tensor, patches: Tensor, canvas_index: Tensor, top: Tensor, left: Tensor, side: int) -> None:
    """In place: the pixels of ``patches[m]`` are max-combined into canvas ``canvas_index[m]`` at
    ``(top[m], left[m])``.

    flat: ``(n * side * side,)`` uint8, the canvases flattened. patches: ``(M, h, w)`` uint8, all inside the
    canvas. canvas_index, top, left: ``(M,)`` int64. Several patches may land on the same canvas and overlap
    (``scatter_reduce`` with ``amax`` combines them).
    """
    h, w = patches.shape[1:]
    rows = torch.arange(h, device=flat.device).view(1, h, 1) * side
    cols = torch.arange(w, device=flat.device).view(1, 1, w)
    for start in range(0, len(patches), _CHUNK):
        sl = slice(start, start + _CHUNK)
        origin = (canvas_index[sl] * side + top[sl]) * side + left[sl]
        index = (origin.view(-1, 1, 1) + rows + cols).reshape(-1)
        flat.scatter_reduce_(0, index, patches[sl].reshape(-1), reduce="amax")


def _resize(digits: Tensor, size: int) -> Tensor:
    """``(M, H, W)`` uint8 -> ``(M, size, size)`` uint8, bilinear (antialiased when shrinking)."""
    if digits.shape[1:] == (size, size):
        return digits
    x = digits.unsqueeze(1).float()
    y = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return y.round().clamp(0, 255).to(torch.uint8).squeeze(1)


def _validate(
    images: Tensor,
    labels: Tensor,
    n: int,
    canvas: int,
    min_digits: int,
    max_digits: int,
    scale_range: tuple[float, float],
    num_clutter: int,
    clutter_size: int,
) -> Tensor:
    """Check the arguments; returns the sorted distinct classes present in ``labels``."""
    check_digit_images(images, labels)
    if images.shape[2] != images.shape[3]:
        raise ValueError(f"images must be (N, 1, S, S) square digits, got shape {tuple(images.shape)}")
    if len(images) == 0:
        raise ValueError("no source digits: images is empty")
    if labels.is_floating_point() or int(labels.min()) < 0 or int(labels.max()) >= NUM_CLASSES:
        raise ValueError(f"labels must be integer digit classes in 0..{NUM_CLASSES - 1}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits} and {max_digits}")
    classes = labels.unique(sorted=True)
    if len(classes) < max_digits:
        raise ValueError(
            f"the source digits hold {len(classes)} distinct classes {classes.tolist()}, fewer than "
            f"max_digits={max_digits}: canvases need distinct classes"
        )
    low, high = (float(v) for v in scale_range)
    if not 0 < low <= high:
        raise ValueError(f"scale_range must be (low, high) with 0 < low <= high, got {scale_range}")
    side = images.shape[2]
    largest = round(side * high)
    if largest > canvas:
        raise ValueError(f"canvas {canvas} is smaller than the largest scaled digit ({side} x {high} = {largest} px)")
    if num_clutter < 0:
        raise ValueError(f"num_clutter must be >= 0, got {num_clutter}")
    if num_clutter > 0 and not 1 <= clutter_size <= side:
        raise ValueError(f"clutter_size must be in 1..{side} (the digit size), got {clutter_size}")
    return classes


def make_multilabel_digits(
    images: Tensor,
    labels: Tensor,
    n: int,
    canvas: int = 128,
    min_digits: int = 2,
    max_digits: int = 4,
    scale_range: tuple[float, float] = (1.0, 2.0),
    num_clutter: int = 0,
    clutter_size: int = 8,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Draw ``n`` multi-label digit canvases.

    images: ``(N, 1, S, S)`` uint8 source digits (``28 x 28`` for MNIST); labels: ``(N,)`` classes in 0..9.
    n: number of canvases. canvas: canvas side in pixels.
    min_digits / max_digits: each canvas holds a uniform number of digits in ``min_digits..max_digits``, all
        of distinct classes (drawn uniformly among the classes present in ``labels``), each digit a uniformly
        drawn source image of its class.
    scale_range: each digit is resized to ``round(S * u)`` px, ``u`` uniform in ``scale_range``.
    num_clutter / clutter_size: fragments of ``clutter_size`` px cut at uniform positions from uniformly drawn
        source digits and pasted at uniform positions, per canvas.
    seed: seed of a private ``torch.Generator`` (drawn on the CPU): the same inputs and seed give
        bit-identical outputs.

    Positions follow the grid-with-jitter layout of the module docstring. Returns ``(canvases, targets)``:
    uint8 ``(n, 1, canvas, canvas)`` and float32 multi-hot ``(n, 10)`` (1 for each class drawn), on the
    images' device.
    """
    classes = _validate(images, labels, n, canvas, min_digits, max_digits, scale_range, num_clutter, clutter_size)
    device = images.device
    side = images.shape[2]
    digits = images[:, 0]
    labels = labels.to(device="cpu", dtype=torch.int64)
    g = torch.Generator().manual_seed(int(seed))
    slots = max_digits

    # How many digits, which classes (distinct: the first slots of a random permutation), which source images.
    count = torch.randint(min_digits, max_digits + 1, (n,), generator=g)
    active = torch.arange(slots).view(1, -1) < count.view(-1, 1)  # (n, slots)
    perm = torch.rand(n, len(classes), generator=g).argsort(dim=1)[:, :slots]
    cls = classes[perm]  # (n, slots)
    by_class = torch.argsort(labels, stable=True)
    per_class = torch.bincount(labels, minlength=NUM_CLASSES)
    first_of_class = per_class.cumsum(0) - per_class
    pick = (torch.rand(n, slots, generator=g) * per_class[cls]).long().clamp(max=per_class[cls] - 1)
    source = by_class[first_of_class[cls] + pick]  # (n, slots) indices into images

    # Sizes and positions: a distinct grid cell per slot, a uniform place inside it (centred if too big).
    low, high = (float(v) for v in scale_range)
    size = (side * (low + (high - low) * torch.rand(n, slots, generator=g))).round().long()
    grid = math.ceil(math.sqrt(slots))
    cell = canvas / grid
    cell_id = torch.rand(n, grid * grid, generator=g).argsort(dim=1)[:, :slots]
    slack = cell - size.double()

    def place(cell_coord: Tensor) -> Tensor:
        jitter = torch.rand(n, slots, generator=g, dtype=torch.float64)
        offset = torch.where(slack >= 0, jitter * slack, slack / 2)
        return torch.minimum((cell_coord * cell + offset).floor().long().clamp(min=0), canvas - size)

    top, left = place(cell_id // grid), place(cell_id % grid)

    flat = torch.zeros(n * canvas * canvas, dtype=torch.uint8, device=device)
    canvas_of = torch.arange(n).view(-1, 1).expand(n, slots)
    sel = active.reshape(-1)
    canvas_of, source, size = canvas_of.reshape(-1)[sel], source.reshape(-1)[sel], size.reshape(-1)[sel]
    top, left = top.reshape(-1)[sel], left.reshape(-1)[sel]
    by_size = torch.argsort(size, stable=True)
    sizes, counts = torch.unique_consecutive(size[by_size], return_counts=True)
    for s, group in zip(sizes.tolist(), by_size.split(counts.tolist()), strict=True):
        patches = _resize(digits[source[group].to(device)], int(s))
        _paste_max(flat, patches, *(t[group].to(device) for t in (canvas_of, top, left)), canvas)

    if n > 0:
        for _ in range(num_clutter):
            src = torch.randint(len(digits), (n,), generator=g)
            y0, x0 = (torch.randint(side - clutter_size + 1, (n,), generator=g) for _ in range(2))
            rows = (y0.view(-1, 1) + torch.arange(clutter_size)).view(n, clutter_size, 1)
            cols = (x0.view(-1, 1) + torch.arange(clutter_size)).view(n, 1, clutter_size)
            fragments = digits[src.view(-1, 1, 1).to(device), rows.to(device), cols.to(device)]
            y1, x1 = (torch.randint(canvas - clutter_size + 1, (n,), generator=g) for _ in range(2))
            _paste_max(flat, fragments, torch.arange(n, device=device), y1.to(device), x1.to(device), canvas)

    targets = torch.zeros(n, NUM_CLASSES, dtype=torch.float32)
    targets.scatter_(1, cls, active.float())  # classes are distinct per canvas: no slot overwrites another
    return flat.view(n, 1, canvas, canvas), targets.to(device)


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


@register_dataset("multilabel_digits")
def build_multilabel_digits(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Multi-label digit canvases from real MNIST digits, 10 classes, float32 multi-hot targets.

    Source digits: train and val canvases are drawn from the MNIST training split divided by
    ``train_val_split(60000, cfg.val_size, cfg.seed)`` (so validation canvases hold digits never seen in
    training; with ``val_size == 0`` they are drawn from the training digits, on different canvases); test
    canvases from the MNIST test split. Sizes: ``cfg.num_train`` train canvases (0 -> 20000) and
    ``cfg.num_test`` val and test canvases each (0 -> 5000). ``cfg.canvas_size`` (0 -> 128),
    ``cfg.digits_per_canvas`` (default ``(2, 4)``), ``cfg.scale_range`` (default ``(1.0, 2.0)``),
    ``cfg.num_clutter`` (default 0 here, but a ``DataConfig`` sets 4) and ``cfg.clutter_size`` (8) are
    passed to :func:`make_multilabel_digits`; each split's seed comes from ``cfg.seed`` and the split name.
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG)
    seed = int(_option(cfg, "seed", 0))
    min_digits, max_digits = (int(v) for v in _option(cfg, "digits_per_canvas", (2, 4)))
    options = dict(
        canvas=int(_option(cfg, "canvas_size", 0)) or 128,
        min_digits=min_digits,
        max_digits=max_digits,
        scale_range=tuple(float(v) for v in _option(cfg, "scale_range", (1.0, 2.0))),
        num_clutter=int(_option(cfg, "num_clutter", 0)),
        clutter_size=int(_option(cfg, "clutter_size", 8)),
    )
    num_train = int(_option(cfg, "num_train", 0)) or 20000
    num_test = int(_option(cfg, "num_test", 0)) or 5000
    images, labels = load_mnist(data_dir, "train")
    train_idx, val_idx = train_val_split(len(images), int(_option(cfg, "val_size", 6000)), seed)
    if len(val_idx) == 0:
        val_idx = train_idx
    test_images, test_labels = load_mnist(data_dir, "test")
    sources = {
        "train": (images[train_idx], labels[train_idx], num_train),
        "val": (images[val_idx], labels[val_idx], num_test),
        "test": (test_images, test_labels, num_test),
    }
    parts = {
        split: ArrayDataset(*make_multilabel_digits(imgs, labs, count, seed=split_seed(seed, split), **options))
        for split, (imgs, labs, count) in sources.items()
    }
    return DataSplits(parts["train"], parts["val"], parts["test"], num_classes=NUM_CLASSES, name="multilabel_digits")
