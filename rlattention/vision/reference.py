"""Slow, obvious reference implementations that the fast kernels are tested and benchmarked against."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def glimpse_reference(images: Tensor, locations: Tensor, size: int, num_scales: int, scale_factor: int = 2) -> Tensor:
    """The way public RAM code extracts glimpses: per sample and scale, pad, slice, average-pool to g x g.

    Centre in pixels: ``floor((l + 1) / 2 * W)``; patch of side ``n = g f^s`` spans
    ``[c - n // 2, c - n // 2 + n)``. Returns ``(B, k, C, g, g)``.
    """
    B, C, H, W = images.shape
    out = torch.zeros(B, num_scales, C, size, size, dtype=images.dtype)
    for b in range(B):
        cx = math.floor(0.5 * (float(locations[b, 0]) + 1.0) * W)
        cy = math.floor(0.5 * (float(locations[b, 1]) + 1.0) * H)
        for s in range(num_scales):
            block = scale_factor**s
            n = size * block
            pad = n + max(H, W)  # generous: locations may lie outside [-1, 1]
            padded = F.pad(images[b], (pad, pad, pad, pad))
            x0, y0 = cx - n // 2 + pad, cy - n // 2 + pad
            patch = padded[:, y0 : y0 + n, x0 : x0 + n]
            out[b, s] = F.avg_pool2d(patch[None], block)[0] if block > 1 else patch
    return out
