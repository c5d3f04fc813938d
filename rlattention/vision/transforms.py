"""Batched image transforms in plain torch (no torchvision): one call for the whole batch."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def random_crop_flip(
    images: Tensor, crop: int | tuple[int, int], flip: bool = True, generator: torch.Generator | None = None
) -> Tensor:
    """A random ``crop`` window (``h x w``, or ``crop x crop`` for an int; integer pixel offsets) of every image,
    mirrored with probability 1/2.

    images ``(B, C, H, W)`` -> ``(B, C, h, w)``. Exact pixel copies by one gather (advanced indexing); a crop
    equal to the image size only flips.
    """
    B, C, H, W = images.shape
    ch, cw = (crop, crop) if isinstance(crop, int) else (int(crop[0]), int(crop[1]))
    if not (0 < ch <= H and 0 < cw <= W):
        raise ValueError(f"crop must fit the {H} x {W} images, got {ch} x {cw}")
    if (ch, cw) != (H, W):
        dev = images.device
        x0 = torch.randint(0, W - cw + 1, (B,), generator=generator, device=dev)
        y0 = torch.randint(0, H - ch + 1, (B,), generator=generator, device=dev)
        rows = (y0[:, None] + torch.arange(ch, device=dev))[:, :, None]  # (B, ch, 1)
        cols = (x0[:, None] + torch.arange(cw, device=dev))[:, None, :]  # (B, 1, cw)
        images = images[torch.arange(B, device=dev)[:, None, None], :, rows, cols].permute(0, 3, 1, 2)
    if flip:
        mirror = torch.rand(B, generator=generator, device=images.device) < 0.5
        images = torch.where(mirror[:, None, None, None], images.flip(-1), images)
    return images


def random_shift(images: Tensor, pad: int, flip: bool = False, generator: torch.Generator | None = None) -> Tensor:
    """Zero-pad by ``pad`` pixels on every side and crop back to the original size at a random offset (the
    usual re-identification "pad and crop"), optionally mirrored with probability 1/2. ``pad = 0``: only flips."""
    if pad < 0:
        raise ValueError(f"pad must be >= 0, got {pad}")
    H, W = images.shape[-2:]
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad)) if pad else images
    return random_crop_flip(padded, (H, W), flip, generator)


def random_erasing(
    images: Tensor,
    p: float = 0.5,
    area: tuple[float, float] = (0.02, 0.4),
    aspect: tuple[float, float] = (0.3, 3.3),
    value: float = 0.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Random erasing (Zhong et al. 2020): with probability ``p`` an image gets one rectangle of ``area`` (a
    fraction of the image, uniform) and aspect ratio ``aspect`` (log-uniform) set to ``value``; rectangles
    are clipped to the image. One mask for the batch, no per-image loop. images ``(B, C, H, W)`` float."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"erasing probability must be in [0, 1], got {p}")
    B, _, H, W = images.shape
    dev = images.device

    def u(lo: float, hi: float) -> Tensor:
        return lo + (hi - lo) * torch.rand(B, generator=generator, device=dev)

    frac = u(*area)
    ratio = torch.exp(u(math.log(aspect[0]), math.log(aspect[1])))
    h = (torch.sqrt(frac * H * W * ratio)).round().clamp(1, H)
    w = (torch.sqrt(frac * H * W / ratio)).round().clamp(1, W)
    y0 = (u(0.0, 1.0) * (H - h + 1)).floor()
    x0 = (u(0.0, 1.0) * (W - w + 1)).floor()
    on = torch.rand(B, generator=generator, device=dev) < p
    ys = torch.arange(H, device=dev)[None, :]
    xs = torch.arange(W, device=dev)[None, :]
    in_y = (ys >= y0[:, None]) & (ys < (y0 + h)[:, None])  # (B, H)
    in_x = (xs >= x0[:, None]) & (xs < (x0 + w)[:, None])  # (B, W)
    mask = (in_y[:, :, None] & in_x[:, None, :] & on[:, None, None])[:, None]  # (B, 1, H, W)
    return images.masked_fill(mask, value)


def random_rotate_flip(
    images: Tensor, max_degrees: float = 0.0, flip_p: float = 0.0, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Rotate every image by its own angle drawn uniformly in ``[-max_degrees, max_degrees]`` about the centre
    and mirror it horizontally with probability ``flip_p``; all channels of an image move together (e.g. the
    partial renders of one sketch). One ``affine_grid`` + ``grid_sample`` (bilinear, zero fill) for the batch.

    images ``(B, C, H, W)`` float -> ``(warped (B, C, H, W), flipped (B,) bool)``; with no rotation the flip is
    an exact pixel mirror.
    """
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


def image_to_tensor(image, size: int, crop_fraction: float = 0.875) -> Tensor:
    """A PIL image of any mode and size -> float ``(3, size, size)`` in [0, 1], as ImageNet classifiers are
    evaluated: the shorter side resized (bicubic) to ``size / crop_fraction``, then the centre ``size x size``.

    Modes: RGB as is; grey (``L``, ``I``, ``I;16``, ``F``, ``1``) replicated to three channels (16-bit and
    float images scaled by their own maximum); palette (``P``) converted through its palette; images with
    transparency (``RGBA``, ``LA``, ``PA``, ``P`` with a transparent colour) composited on white; ``CMYK`` and
    ``YCbCr`` converted to RGB. ``crop_fraction=1`` resizes the whole image to ``size x size`` (aspect not
    kept)."""
    import numpy as np
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise TypeError(f"expected a PIL image, got {type(image).__name__}")
    if not 0.0 < crop_fraction <= 1.0:
        raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    img = image
    if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        a = np.asarray(img, dtype=np.float64)
        top = a.max() if a.size and a.max() > 0 else 1.0
        img = Image.fromarray((np.clip(a / top, 0, 1) * 255).round().astype(np.uint8), "L")
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, rgba)
    img = img.convert("RGB")
    w, h = img.size
    if crop_fraction == 1.0:
        img = img.resize((size, size), Image.BICUBIC)
    else:
        scale = size / crop_fraction / min(w, h)
        img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BICUBIC)
        w, h = img.size
        left, top_ = (w - size) // 2, (h - size) // 2
        img = img.crop((left, top_, left + size, top_ + size))
    return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).float().div_(255.0)
