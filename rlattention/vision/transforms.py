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


def random_rotate_flip(
    images: Tensor, max_degrees: float = 0.0, flip_p: float = 0.0, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Rotate every image by its own angle drawn uniformly in ``[-max_degrees, max_degrees]`` about the centre
    and mirror it horizontally with probability ``flip_p``; all channels of an image move together (e.g. the
    partial renders of one sketch). One ``affine_grid`` + ``grid_sample`` (bilinear, zero fill) for the batch.

    images ``(B, C, H, W)`` float -> ``(warped (B, C, H, W), flipped (B,) bool)``; with no rotation the flip is
    an exact pixel mirror.
    """
    import math

    import torch.nn.functional as F

    if not 0.0 <= flip_p <= 1.0:
        raise ValueError(f"flip probability must be in [0, 1], got {flip_p}")
    B = images.shape[0]
    dev = images.device
    flipped = torch.rand(B, generator=generator, device=dev) < flip_p
    if max_degrees <= 0:
        return torch.where(flipped[:, None, None, None], images.flip(-1), images), flipped
    angle = (torch.rand(B, generator=generator, device=dev) * 2.0 - 1.0) * math.radians(max_degrees)
    cos, sin = torch.cos(angle), torch.sin(angle)
    sx = torch.where(flipped, -1.0, 1.0)
    zero = torch.zeros_like(cos)
    # output pixel (x, y) samples the input at R(angle) (sx x, y): mirror first, then rotate
    theta = torch.stack((torch.stack((cos * sx, -sin, zero), -1), torch.stack((sin * sx, cos, zero), -1)), 1)
    grid = F.affine_grid(theta.to(images.dtype), list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False), flipped
