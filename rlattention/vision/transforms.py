"""Batched image transforms in plain torch (no torchvision): one call for the whole batch."""

from __future__ import annotations

import torch
from torch import Tensor


def random_crop_flip(images: Tensor, crop: int, flip: bool = True, generator: torch.Generator | None = None) -> Tensor:
    """A random ``crop x crop`` window (integer pixel offsets) of every image, mirrored with probability 1/2.

    images ``(B, C, H, W)`` -> ``(B, C, crop, crop)``. Exact pixel copies by one gather (advanced indexing);
    ``crop`` equal to the image side only flips.
    """
    B, C, H, W = images.shape
    if not 0 < crop <= min(H, W):
        raise ValueError(f"crop must be in (0, {min(H, W)}], got {crop}")
    if crop < min(H, W):
        dev = images.device
        x0 = torch.randint(0, W - crop + 1, (B,), generator=generator, device=dev)
        y0 = torch.randint(0, H - crop + 1, (B,), generator=generator, device=dev)
        offs = torch.arange(crop, device=dev)
        rows, cols = (y0[:, None] + offs)[:, :, None], (x0[:, None] + offs)[:, None, :]  # (B, crop, 1), (B, 1, crop)
        images = images[torch.arange(B, device=dev)[:, None, None], :, rows, cols].permute(0, 3, 1, 2)
    if flip:
        mirror = torch.rand(B, generator=generator, device=images.device) < 0.5
        images = torch.where(mirror[:, None, None, None], images.flip(-1), images)
    return images
