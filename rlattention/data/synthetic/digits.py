"""``digits``: the embedded default dataset, generated on the fly with no download.

The ten digit glyphs are rendered once with Pillow's embedded scalable font
(``ImageFont.load_default(size=...)``, Pillow >= 10.1 with FreeType) at two stroke widths, white on black and
cropped to their ink box. Every sample
then gets its own random affine transform (rotation, scale to a 14-22 px tall digit, shear, and a translation
anywhere on the canvas with the digit fully inside), applied to the whole batch by one ``affine_grid`` +
``grid_sample`` call per fixed-size chunk, plus light Gaussian noise. Everything is drawn from one seeded
``torch.Generator``: the same arguments give bit-identical tensors.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.limits import check_side
from rlattention.data.registry import register_dataset

__all__ = ["build_digits", "make_digits", "render_glyphs"]

FONT_SIZE = 32  # px; ink about 23 px tall, so the transform mostly shrinks (little aliasing)
STROKE_WIDTHS = (0, 1)  # extra outline in font pixels (regular and bold): the stroke-width variation
HEIGHT_RANGE = (14.0, 22.0)  # target ink height in canvas pixels (before rotation and shear)
MAX_ROTATION_DEG = 15.0
MAX_SHEAR = 0.2
MAX_NOISE_STD = 8.0  # per-image Gaussian noise std drawn in 0..MAX_NOISE_STD (0..255 scale)
MARGIN = 1.5  # canvas pixels kept between the ink box and the border (covers the bilinear blur)
MIN_CANVAS = 16
_CHUNK = 4096  # images per grid_sample call: bounds memory to tens of MB


def render_glyphs(
    font_size: int = FONT_SIZE, strokes: tuple[int, ...] = STROKE_WIDTHS
) -> tuple[Tensor, Tensor, Tensor]:
    """Render the digits 0-9 at each stroke width, white on black, each centred in one square template.

    Returns ``templates`` float32 ``(10, S, G, G)`` in 0..1 (S = len(strokes), G the common side),
    ``ink_size`` float64 ``(10, S, 2)``: (width, height) of each ink box in template pixels, and
    ``ink_centre`` float64 ``(10, S, 2)``: (x, y) of each ink box centre in ``grid_sample`` coordinates
    (-1..1, ``align_corners=False``).
    """
    try:
        font = ImageFont.load_default(size=font_size)
    except (ImportError, OSError) as err:  # pragma: no cover - only without FreeType
        raise RuntimeError("the digits dataset needs Pillow >= 10.1 built with FreeType") from err
    if not isinstance(font, ImageFont.FreeTypeFont):  # pragma: no cover - only without FreeType
        raise RuntimeError("the digits dataset needs Pillow >= 10.1 built with FreeType (scalable default font)")
    crops: list[list[np.ndarray]] = []
    for digit in range(10):
        row = []
        for stroke in strokes:
            side = 3 * font_size + 4 * stroke
            image = Image.new("L", (side, side), 0)
            ImageDraw.Draw(image).text(
                (font_size, font_size // 2),
                str(digit),
                fill=255,
                font=font,
                stroke_width=stroke,
                stroke_fill=255,
            )
            box = image.getbbox()
            if box is None:  # pragma: no cover - a broken font
                raise RuntimeError(f"the default font rendered no ink for digit {digit}")
            row.append(np.asarray(image.crop(box), dtype=np.float32) / 255.0)
        crops.append(row)
    side = max(max(c.shape) for row in crops for c in row) + 4  # zero border around every glyph
    templates = torch.zeros(10, len(strokes), side, side)
    ink_size = torch.zeros(10, len(strokes), 2, dtype=torch.float64)
    ink_centre = torch.zeros(10, len(strokes), 2, dtype=torch.float64)
    for d, row in enumerate(crops):
        for s, crop in enumerate(row):
            h, w = crop.shape
            top, left = (side - h) // 2, (side - w) // 2
            templates[d, s, top : top + h, left : left + w] = torch.from_numpy(crop)
            ink_size[d, s] = torch.tensor([w, h], dtype=torch.float64)
            ink_centre[d, s] = torch.tensor([left + w / 2, top + h / 2], dtype=torch.float64) / (side / 2) - 1
    return templates, ink_size, ink_centre


def _linear_maps(angle: Tensor, shear: Tensor, scale: Tensor) -> Tensor:
    """``A = scale * R(angle) @ [[1, shear], [0, 1]]``: template px -> canvas px, ``(N, 2, 2)`` float64.

    angle: ``(N,)`` radians; shear, scale: ``(N,)``. Coordinates are (x right, y down).
    """
    cos, sin = torch.cos(angle), torch.sin(angle)
    a = torch.stack([torch.stack([cos, cos * shear - sin], -1), torch.stack([sin, sin * shear + cos], -1)], -2)
    return a * scale.view(-1, 1, 1)


def _half_extent(a: Tensor, size: Tensor) -> Tensor:
    """Half width and height ``(N, 2)`` of the bounding box of a (w, h) ``size`` box mapped by ``a``."""
    return (a.abs() * (size / 2).unsqueeze(1)).sum(-1)


def _inverse_2x2(a: Tensor) -> Tensor:
    """Exact inverse of a batch of 2x2 matrices ``(N, 2, 2)``."""
    det = a[:, 0, 0] * a[:, 1, 1] - a[:, 0, 1] * a[:, 1, 0]
    adj = torch.stack([torch.stack([a[:, 1, 1], -a[:, 0, 1]], -1), torch.stack([-a[:, 1, 0], a[:, 0, 0]], -1)], -2)
    return adj / det.view(-1, 1, 1)


def _sample_thetas(
    n: int, canvas: int, glyph_side: int, ink_size: Tensor, ink_centre: Tensor, generator: torch.Generator
) -> Tensor:
    """``affine_grid`` matrices ``(n, 2, 3)`` float32 mapping canvas coordinates to template coordinates.

    ink_size / ink_centre: ``(n, 2)`` of each sample's glyph (see :func:`render_glyphs`).
    """
    rand = torch.rand(n, 5, generator=generator, dtype=torch.float64)
    angle = (2 * rand[:, 0] - 1) * math.radians(MAX_ROTATION_DEG)
    shear = (2 * rand[:, 1] - 1) * MAX_SHEAR
    height = HEIGHT_RANGE[0] + rand[:, 2] * (HEIGHT_RANGE[1] - HEIGHT_RANGE[0])
    a = _linear_maps(angle, shear, height / ink_size[:, 1])
    # Shrink the digits that would not fit (small canvases only), then place the ink box fully inside.
    fit = ((canvas / 2 - MARGIN) / _half_extent(a, ink_size).amax(-1)).clamp(max=1.0)
    a = a * fit.view(-1, 1, 1)
    half = _half_extent(a, ink_size) + MARGIN
    centre_px = half + rand[:, 3:5] * (canvas - 2 * half)
    centre = centre_px / (canvas / 2) - 1  # canvas grid coordinates, -1..1
    m = _inverse_2x2(a) * (canvas / glyph_side)
    b = ink_centre - (m @ centre.unsqueeze(-1)).squeeze(-1)
    return torch.cat([m, b.unsqueeze(-1)], -1).float()


def make_digits(n: int, canvas: int = 40, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Generate ``n`` images of single rendered digits at random poses.

    n: number of images, ``>= 0``; the ten classes are balanced exactly (counts differ by at most 1).
    canvas: side of the square image in pixels, ``>= 16``; digits are 14-22 px tall (shrunk only if the canvas
        is too small for them) and lie fully inside, at least 1.5 px from the border.
    seed: seed of a private ``torch.Generator``; the same ``(n, canvas, seed)`` give bit-identical tensors.

    Returns ``images`` uint8 ``(n, 1, canvas, canvas)`` (white digit on black, 0..255, with light noise) and
    ``labels`` int64 ``(n,)`` in 0..9. About 0.1 s per 10k images at 40x40.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if canvas < MIN_CANVAS:
        raise ValueError(f"canvas must be >= {MIN_CANVAS} px to hold a legible digit, got {canvas}")
    templates, ink_size, ink_centre = render_glyphs()
    generator = torch.Generator().manual_seed(int(seed))
    labels = torch.randperm(n, generator=generator) % 10
    stroke = torch.randint(len(STROKE_WIDTHS), (n,), generator=generator)
    thetas = _sample_thetas(
        n, canvas, templates.shape[-1], ink_size[labels, stroke], ink_centre[labels, stroke], generator
    )
    noise_std = torch.rand(n, generator=generator) * MAX_NOISE_STD
    images = torch.empty(n, 1, canvas, canvas, dtype=torch.uint8)
    for start in range(0, n, _CHUNK):
        sl = slice(start, start + _CHUNK)
        glyphs = templates[labels[sl], stroke[sl]].unsqueeze(1)
        grid = F.affine_grid(thetas[sl], [len(glyphs), 1, canvas, canvas], align_corners=False)
        ink = F.grid_sample(glyphs, grid, mode="bilinear", padding_mode="zeros", align_corners=False) * 255
        noise = torch.randn(ink.shape, generator=generator) * noise_std[sl].view(-1, 1, 1, 1)
        images[sl] = (ink + noise).round_().clamp_(0, 255).to(torch.uint8)
    return images, labels


def _option(cfg: Any, name: str, default: int) -> int:
    value = getattr(cfg, name, None)
    return default if value is None else int(value)


@register_dataset("digits")
def build_digits(cfg: Any, data_dir: Path | None) -> DataSplits:
    """The embedded ``digits`` task, 10 classes; ``data_dir`` is ignored.

    train: ``cfg.num_train or 20000`` images with ``cfg.seed``; val: ``cfg.val_size`` images when
    ``0 < val_size < 6000``, else 2000 (the 6000 default is MNIST's and too many here), with ``seed + 1``;
    test: ``cfg.num_test or 5000`` images with ``seed + 2``. Canvas ``cfg.canvas_size or 40``.
    """
    seed = _option(cfg, "seed", 0)
    canvas = _option(cfg, "canvas_size", 0) or 40
    check_side("data.canvas_size", canvas)
    val_size = _option(cfg, "val_size", 6000)
    num_val = val_size if 0 < val_size < 6000 else 2000
    train = ArrayDataset(*make_digits(_option(cfg, "num_train", 0) or 20000, canvas, seed=seed))
    val = ArrayDataset(*make_digits(num_val, canvas, seed=seed + 1))
    test = ArrayDataset(*make_digits(_option(cfg, "num_test", 0) or 5000, canvas, seed=seed + 2))
    return DataSplits(train, val, test, num_classes=10, name="digits")
