"""Cluttered translated digits (Mnih et al., 2014): each digit at a random place on a larger canvas, plus
small fragments cut from other digits as distractors; the ``cluttered_mnist`` dataset (real MNIST digits).

Everything is batched over the N images (gather / scatter on flattened canvases); the only Python loops
run over the few clutter fragments and over fixed-size chunks of images that bound the index memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlattention.data.base import ArrayDataset, DataSplits, check_digit_images
from rlattention.data.limits import check_side
from rlattention.data.readers.mnist import mnist_splits
from rlattention.data.registry import register_dataset
from rlattention.data.splits import split_seed

__all__ = ["PRESETS", "build_cluttered_mnist", "make_cluttered"]

#: The two settings of the RAM paper: 60x60 with 4 fragments and 100x100 with 10 fragments (8x8 each).
PRESETS: dict[str, dict[str, int]] = {
    "60x60": dict(canvas=60, num_clutter=4),
    "100x100": dict(canvas=100, num_clutter=10),
}

_NUM_CLASSES = 10
_CHUNK = 8192  # images per scatter chunk: bounds the int64 index tensors to ~50 MB for 28x28 patches


def _window_index(top: Tensor, left: Tensor, height: int, width: int, stride: int) -> Tensor:
    """Flat indices of a ``height x width`` window of a row-major image with ``stride`` columns.

    top, left: ``(N,)`` int64 window corners. Returns ``(N, height * width)`` int64.
    """
    rows = torch.arange(height, device=top.device).view(1, height, 1)
    cols = torch.arange(width, device=top.device).view(1, 1, width)
    start = (top * stride + left).view(-1, 1, 1)
    return (start + rows * stride + cols).view(len(top), height * width)


def _paste_max(flat: Tensor, patches: Tensor, top: Tensor, left: Tensor, side: int) -> None:
    """In place: ``flat[n] = max(window, patches[n])`` with the window at (top, left) of a flattened image.

    flat: ``(N, side * side)`` uint8. patches: ``(N, h, w)`` uint8. top, left: ``(N,)`` int64, windows inside.
    """
    h, w = patches.shape[1:]
    for start in range(0, len(flat), _CHUNK):
        sl = slice(start, start + _CHUNK)
        index = _window_index(top[sl], left[sl], h, w, side)
        current = flat[sl].gather(1, index)
        flat[sl].scatter_(1, index, torch.maximum(current, patches[sl].reshape(len(index), h * w)))


def _crop(images: Tensor, source: Tensor, top: Tensor, left: Tensor, size: int) -> Tensor:
    """``images[source[n], top[n]:top[n]+size, left[n]:left[n]+size]`` for every n: ``(N, size, size)``.

    images: ``(M, H, W)``; source, top, left: ``(N,)`` int64.
    """
    rows = (top.view(-1, 1) + torch.arange(size, device=top.device)).view(-1, size, 1)
    cols = (left.view(-1, 1) + torch.arange(size, device=left.device)).view(-1, 1, size)
    return images[source.view(-1, 1, 1), rows, cols]


def _validate(images: Tensor, labels: Tensor, canvas: int, num_clutter: int, clutter_size: int) -> None:
    check_digit_images(images, labels)
    height, width = images.shape[2:]
    if canvas < max(height, width):
        raise ValueError(f"canvas must be >= the digit size {height}x{width} (28 for MNIST), got {canvas}")
    if num_clutter < 0:
        raise ValueError(f"num_clutter must be >= 0, got {num_clutter}")
    if num_clutter > 0 and not 1 <= clutter_size <= min(height, width):
        raise ValueError(f"clutter_size must be in 1..{min(height, width)} (the digit size), got {clutter_size}")


def make_cluttered(
    images: Tensor,
    labels: Tensor,
    canvas: int,
    num_clutter: int,
    clutter_size: int = 8,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Place every digit on a cluttered ``canvas x canvas`` background.

    images: ``(N, 1, H, W)`` uint8 digits (``28 x 28`` for MNIST), 0..255.
    labels: ``(N,)`` integer class ids, returned as int64.
    canvas: canvas side in pixels, ``>= max(H, W)`` (see :data:`PRESETS`: 60 or 100 in the RAM paper).
    num_clutter: distractor fragments per canvas, ``>= 0``.
    clutter_size: side of each square fragment, ``1..min(H, W)``.
    seed: seed of a private ``torch.Generator``; the same inputs and seed give bit-identical outputs.

    Each digit lands at a uniform integer offset fully inside the canvas. Each fragment is cropped at a
    uniform position from a uniformly drawn *other* digit of the set (the digit itself only when N == 1)
    and pasted at a uniform position; pixels combine with ``max``, so clutter never erases the digit's ink.

    Returns ``(cluttered, labels)``: uint8 ``(N, 1, canvas, canvas)`` and int64 ``(N,)``, on the images'
    device.
    """
    _validate(images, labels, canvas, num_clutter, clutter_size)
    n, _, height, width = images.shape
    device = images.device
    digits = images[:, 0]
    generator = torch.Generator().manual_seed(int(seed))

    def randint(high: int) -> Tensor:  # (N,) int64 uniform in 0..high-1, drawn on the CPU for determinism
        return torch.randint(high, (n,), generator=generator).to(device)

    flat = torch.zeros(n, canvas * canvas, dtype=torch.uint8, device=device)
    _paste_max(flat, digits, randint(canvas - height + 1), randint(canvas - width + 1), canvas)
    if n > 0:
        for _ in range(num_clutter):
            other = (torch.arange(n, device=device) + 1 + randint(n - 1)) % n if n > 1 else randint(1)
            fragment = _crop(
                digits,
                other,
                randint(height - clutter_size + 1),
                randint(width - clutter_size + 1),
                clutter_size,
            )
            top, left = randint(canvas - clutter_size + 1), randint(canvas - clutter_size + 1)
            _paste_max(flat, fragment, top, left, canvas)
    return flat.view(n, 1, canvas, canvas), labels.to(torch.int64).clone()


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


@register_dataset("cluttered_mnist")
def build_cluttered_mnist(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Cluttered translated MNIST, 10 classes: each real split (as in ``mnist``) placed on a
    ``cfg.canvas_size`` (default 60) canvas with ``cfg.num_clutter`` fragments of ``cfg.clutter_size`` px
    cut from the same split's digits. Seeds come from ``cfg.seed`` and the split name (:func:`split_seed`),
    so train, val and test get different layouts.
    """
    canvas = int(_option(cfg, "canvas_size", 0)) or 60
    num_clutter = int(_option(cfg, "num_clutter", 4))
    clutter_size = int(_option(cfg, "clutter_size", 8))
    check_side("data.canvas_size", canvas)
    check_side("data.clutter_size", clutter_size)
    seed = int(_option(cfg, "seed", 0))
    parts: list[ArrayDataset] = []
    for split, part in zip(("train", "val", "test"), mnist_splits(cfg, data_dir), strict=True):
        images, labels = make_cluttered(
            part.images, part.targets, canvas, num_clutter, clutter_size, seed=split_seed(seed, split)
        )
        parts.append(ArrayDataset(images, labels))
    return DataSplits(*parts, num_classes=_NUM_CLASSES, name="cluttered_mnist")
