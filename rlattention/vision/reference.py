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


def glimpse_public_reference(
    images: Tensor, locations: Tensor, size: int, num_scales: int, scale_factor: float = 2, tuned: bool = False
) -> Tensor:
    """Glimpses computed the way public RAM re-implementations do it, batch-wise; the speed baseline.

    Per scale ``s`` (side ``n = g f^s``): zero-pad the whole batch by ``n // 2``, take the centre
    ``c = floor((l + 1) / 2 * [W, H])`` as integers, slice ``padded[i, :, cy : cy + n, cx : cx + n]`` in a
    Python loop over the batch, ``torch.stack`` the slices and average-pool them to ``g x g``; the scales are
    stacked to ``(B, k, C, g, g)``. Nothing is reused between calls: every glimpse pads the batch again, and,
    as in public code, the slice bounds are 0-d tensor elements of the centre tensor (``start[i, 1]``), not
    Python ints (``tuned=True`` converts them once per call: a faster reference than public code).

    Only valid for ``locations`` in [-1, 1] (the padding is just large enough for centres inside the image;
    a centre outside gives a short or empty slice and ``torch.stack`` fails), so callers clamp, as public
    code does. There it equals :func:`glimpse_reference`. For odd ``n`` the right/bottom pad is
    ``n - n // 2`` (one more than public code) so that ``l = 1`` also works; for even ``n`` it is the same.
    ``size * scale_factor**s`` must be a multiple of ``size`` (integer factors).
    """
    if not float(scale_factor).is_integer() or scale_factor < 1:
        raise ValueError(f"glimpse_public_reference needs an integer scale_factor >= 1, got {scale_factor}")
    B, C, H, W = images.shape
    wh = torch.tensor([W, H], dtype=torch.float64, device=locations.device)
    start = torch.floor(0.5 * (locations.to(torch.float64) + 1.0) * wh).long()  # (B, 2) x, y
    scales = []
    for s in range(num_scales):
        n = size * int(scale_factor) ** s
        lo, hi = n // 2, n - n // 2
        padded = F.pad(images, (lo, hi, lo, hi))
        if tuned:
            cs = start.tolist()
            patches = torch.stack([padded[i, :, cy : cy + n, cx : cx + n] for i, (cx, cy) in enumerate(cs)])
        else:
            end = start + n
            patches = torch.stack([padded[i, :, start[i, 1] : end[i, 1], start[i, 0] : end[i, 0]] for i in range(B)])
        scales.append(F.avg_pool2d(patches, n // size) if n > size else patches)
    return torch.stack(scales, 1)


def crop_boxes_loop_reference(fmap: Tensor, boxes: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinear crops one region at a time (a Python loop over images and regions, one ``grid_sample`` per
    region): the per-region reference of :func:`rlattention.vision.crops.crop_boxes` (``mode="bilinear"``).

    fmap ``(B, C, H, W)``, boxes ``(B, k, 4)`` normalised -> ``(B, k, C, h, w)``.
    """
    B, k = boxes.shape[:2]
    h, w = size
    out = []
    for b in range(B):
        regions = []
        for r in range(k):
            x0, y0, x1, y1 = boxes[b, r].tolist()
            xs = torch.tensor([x0 + (x1 - x0) * (j + 0.5) / w for j in range(w)], dtype=fmap.dtype)
            ys = torch.tensor([y0 + (y1 - y0) * (i + 0.5) / h for i in range(h)], dtype=fmap.dtype)
            grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1)[None]  # (1, h, w, 2)
            regions.append(F.grid_sample(fmap[b : b + 1], grid, mode="bilinear", align_corners=False)[0])
        out.append(torch.stack(regions))
    return torch.stack(out)
