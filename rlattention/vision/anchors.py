"""Anchor regions and test-time views, as normalised boxes for :func:`rlattention.vision.crops.crop_boxes`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def anchor_shapes(areas: Sequence[float], ratios: Sequence[float]) -> list[tuple[float, float]]:
    """(width, height) in input pixels of every (area, ratio) pair, scale-major: ``w * h = area``,
    ``w / h = ratio`` (2.0 is the paper's 2:1)."""
    if not areas or not ratios or min(areas) <= 0 or min(ratios) <= 0:
        raise ValueError(f"anchor areas and ratios must be non-empty and positive, got {areas} and {ratios}")
    return [(math.sqrt(a * r), math.sqrt(a / r)) for a in areas for r in ratios]


def anchor_boxes(
    centres: Tensor, areas: Sequence[float], ratios: Sequence[float], image_size: tuple[int, int]
) -> Tensor:
    """k = |areas| x |ratios| boxes centred at each location.

    centres: ``(B, 2)`` (x, y) in [-1, 1]. image_size: ``(H, W)`` of the input image the areas refer to.
    Returns ``(B, k, 4)`` normalised (x0, y0, x1, y1); on a feature map of the same image the same normalised
    box covers the same part of the scene, so these boxes crop feature maps directly.
    """
    H, W = image_size
    wh = torch.tensor(anchor_shapes(areas, ratios), dtype=centres.dtype, device=centres.device)  # (k, 2) px
    half = wh / torch.tensor([W, H], dtype=centres.dtype, device=centres.device)  # half side, normalised
    c = centres[:, None, :]
    return torch.cat((c - half, c + half), dim=-1)


def grid_centres(steps: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """``steps`` fixed centres ``(steps, 2)`` (x, y) in [-1, 1] that spread over the image: the cell centres of a
    ``g x g`` grid, ``g = floor(sqrt(steps))``, row by row, then the inner corners of that grid from the image
    centre outwards (ties row by row), cycling through both lists if more are needed.

    Five steps give the four quadrant centres (+-0.5, +-0.5) and the image centre: with anchors of a quarter of
    the image, the first four tile it. Ten give the 3 x 3 cell centres and one inner corner.
    """
    if steps < 1:
        raise ValueError(f"a grid needs at least one step, got {steps}")
    g = math.isqrt(steps)
    cells = [((2 * j + 1) / g - 1, (2 * i + 1) / g - 1) for i in range(g) for j in range(g)]
    corners = [(2 * j / g - 1, 2 * i / g - 1) for i in range(1, g) for j in range(1, g)]
    corners.sort(key=lambda c: round(c[0] ** 2 + c[1] ** 2, 9))  # stable: ties keep row order
    order = cells + corners
    return torch.tensor([order[t % len(order)] for t in range(steps)], dtype=dtype)


def ten_view_boxes(size: int, crop: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The five ``crop x crop`` views of a ``size x size`` image (top-left, top-right, bottom-left,
    bottom-right, centre) as normalised boxes ``(5, 4)``; the other five views are their mirror images."""
    if not 0 < crop <= size:
        raise ValueError(f"view crop must be in (0, size={size}], got {crop}")
    s = 2.0 * crop / size
    boxes = [
        [-1.0, -1.0, -1.0 + s, -1.0 + s],
        [1.0 - s, -1.0, 1.0, -1.0 + s],
        [-1.0, 1.0 - s, -1.0 + s, 1.0],
        [1.0 - s, 1.0 - s, 1.0, 1.0],
        [-s / 2, -s / 2, s / 2, s / 2],
    ]
    return torch.tensor(boxes, dtype=dtype)
