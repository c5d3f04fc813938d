"""The multi-resolution glimpse sensor of the recurrent attention model (Mnih et al. 2014).

A glimpse at location ``l`` in [-1, 1]^2 ((-1, -1) is the top-left corner of the image, (1, 1) the
bottom-right, (0, 0) the centre; x first) is ``k`` square patches centred at ``l``: the first ``g`` x ``g``
pixels, each next one ``f`` times the side of the previous, every patch area-resized to ``g`` x ``g``.
Outside the image is zero. Non-square images are handled: x is scaled by the width, y by the height.

How it is computed. The only per-episode work (:meth:`GlimpseSensor.prepare`) is the integral image
``S(y, x) = sum of the image over [0, y) x [0, x)``, in float64. For a piecewise-constant image, ``S``
evaluated by bilinear interpolation is the *exact* integral up to a continuous point, and clamping the
point to the image (``padding_mode="border"``) is exactly zero padding. So every output pixel, the mean of
the image over its ``f^s`` x ``f^s`` square, is a 2-D finite difference of ``S`` at the square's corners.
A glimpse samples ``S`` at the ``(g + 1)^2`` corner lattice of each scale: one
:func:`torch.nn.functional.grid_sample` call for the whole batch and all scales. Gradients reach the image.

With a single scale every output pixel is one pixel-sized square, whose exact area average is the
bilinear interpolation at its centre: then no integral image is needed and the glimpse is a plain bilinear
``grid_sample`` of the image (zero padding), which is the same value and much cheaper.

Modes: ``"area"`` averages over the square centred at the exact continuous location; ``"nearest"`` snaps the
centre to the pixel grid the way public RAM code does (``floor((l + 1) / 2 * W)``, patch
``[c - n // 2, c - n // 2 + n)``) and then equals the pad-slice-average-pool reference
(:func:`rlattention.vision.reference.glimpse_reference`) up to float32 rounding. Both agree with the
reference exactly on integer-aligned crops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def locations_to_pixels(locations: Tensor, height: int, width: int) -> Tensor:
    """Map ``(..., 2)`` locations (x, y) in [-1, 1] to continuous pixel-edge coordinates (x in [0, W])."""
    size = torch.tensor([width, height], dtype=locations.dtype, device=locations.device)
    return 0.5 * (locations + 1.0) * size


def integral_image(images: Tensor) -> Tensor:
    """``(B, C, H, W)`` -> float64 ``(B, C, H + 1, W + 1)`` with ``S[y, x] = images[:y, :x].sum()``."""
    return F.pad(images.to(torch.float64), (1, 0, 1, 0)).cumsum_(-1).cumsum_(-2)


class GlimpseSensor(nn.Module):
    """Batched retina-like glimpse sensor.

    Args:
        size: ``g``, the side of every output patch in pixels.
        num_scales: ``k``, patches per glimpse.
        scale_factor: ``f``, ratio between the sides of successive patches (any value > 0; integer
            factors keep the squares on the pixel grid).
        mode: ``"area"`` (continuous locations) or ``"nearest"`` (centre snapped to the pixel grid).
    """

    def __init__(self, size: int = 8, num_scales: int = 1, scale_factor: float = 2, mode: str = "area") -> None:
        super().__init__()
        if size < 1 or num_scales < 1:
            raise ValueError(f"glimpse size and num_scales must be >= 1, got {size} and {num_scales}")
        if scale_factor <= 0:
            raise ValueError(f"scale_factor must be > 0, got {scale_factor}")
        if mode not in ("area", "nearest"):
            raise ValueError(f"glimpse mode must be 'area' or 'nearest', got {mode!r}")
        self.size, self.num_scales, self.scale_factor, self.mode = size, num_scales, scale_factor, mode
        step = torch.tensor([scale_factor**s for s in range(num_scales)], dtype=torch.float64)
        self.register_buffer("_step", step, persistent=False)  # (k,) side of one output pixel, in pixels
        self.register_buffer("_corner", torch.arange(size + 1, dtype=torch.float64), persistent=False)
        self._direct = num_scales == 1  # one pixel-sized block per output pixel: sample the image directly
        self._cache_key: tuple | None = None
        self._cached_offsets = torch.empty(0)
        self._cached_inv_area = torch.empty(0)

    @property
    def out_features(self) -> int:
        """Values in one glimpse per image channel: ``k * g * g``."""
        return self.num_scales * self.size * self.size

    def prepare(self, images: Tensor) -> Tensor:
        """Per-episode work: the integral image, float64 ``(B, C, H + 1, W + 1)`` (the image itself when there
        is a single scale)."""
        return images if self._direct else integral_image(images)

    def _offsets(self, H: int, W: int, device: torch.device) -> Tensor:
        """Corner lattice of every scale relative to the centre, in grid units: ``(k * (g + 1), g + 1, 2)``.

        Cached per image size and device: ``grid = centre + offsets`` is then one add per glimpse.
        """
        key = (H, W, device)
        if self._cache_key != key and self._direct:  # pixel-centre lattice of the g x g patch
            centre = self._corner[:-1].to(device) + 0.5 - (self.size // 2 if self.mode == "nearest" else self.size / 2)
            g = self.size
            ox = (centre * (2.0 / W))[None, :].expand(g, g)
            oy = (centre * (2.0 / H))[:, None].expand(g, g)
            self._cached_offsets = torch.stack((ox, oy), dim=-1)  # (g, g, 2)
            self._cache_key = key
        elif self._cache_key != key:
            step = self._step.to(device)
            extent = self.size * step  # (k,) patch side in pixels
            half = torch.floor(extent / 2) if self.mode == "nearest" else extent / 2
            corner = self._corner.to(device)[None, :] * step[:, None] - half[:, None]  # (k, g+1) pixels
            k, g1 = self.num_scales, self.size + 1
            ox = (corner * (2.0 / W))[:, None, :].expand(k, g1, g1)
            oy = (corner * (2.0 / H))[:, :, None].expand(k, g1, g1)
            self._cached_offsets = torch.stack((ox, oy), dim=-1).reshape(k * g1, g1, 2)
            self._cached_inv_area = (1.0 / (step * step))[:, None, None]
            self._cache_key = key
        return self._cached_offsets

    def extract(self, prepared: Tensor, locations: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """One glimpse per image.

        prepared: output of :meth:`prepare`. locations: ``(B, 2)`` (x, y), nominally in [-1, 1]; values
        outside see zero padding. Returns ``(B, k, C, g, g)`` in ``dtype``.
        """
        if self._direct:
            return self._extract_direct(prepared, locations, dtype)
        B, C, H1, W1 = prepared.shape
        H, W = H1 - 1, W1 - 1
        offsets = self._offsets(H, W, prepared.device)
        centre = locations.to(prepared.dtype)  # grid units: align_corners=True maps [-1, 1] onto [0, W]
        if self.mode == "nearest":
            size = torch.tensor([W, H], dtype=prepared.dtype, device=prepared.device)
            centre = torch.floor(0.5 * (centre + 1.0) * size) * (2.0 / size) - 1.0
        grid = centre[:, None, None, :] + offsets
        S = F.grid_sample(prepared, grid, mode="bilinear", padding_mode="border", align_corners=True)
        k, g1 = self.num_scales, self.size + 1
        S = S.reshape(B, C, k, g1, g1)
        means = S.diff(dim=-1).diff(dim=-2) * self._cached_inv_area  # (B, C, k, g, g) area means
        return means.transpose(1, 2).to(dtype)

    def _extract_direct(self, images: Tensor, locations: Tensor, dtype: torch.dtype) -> Tensor:
        B, C, H, W = images.shape
        offsets = self._offsets(H, W, images.device).to(images.dtype)
        centre = locations.to(images.dtype)  # align_corners=False: [-1, 1] spans the pixel edges
        if self.mode == "nearest":
            size = torch.tensor([W, H], dtype=images.dtype, device=images.device)
            centre = torch.floor(0.5 * (centre + 1.0) * size) * (2.0 / size) - 1.0
        grid = centre[:, None, None, :] + offsets
        mode = "nearest" if self.mode == "nearest" else "bilinear"  # nearest: exact pixels at the centres
        out = F.grid_sample(images, grid, mode=mode, padding_mode="zeros", align_corners=False)
        return out[:, None].to(dtype)

    def forward(self, images: Tensor, locations: Tensor) -> Tensor:
        """``(B, C, H, W)``, ``(B, 2)`` -> ``(B, k, C, g, g)``. Inside an episode, prepare once and extract."""
        return self.extract(self.prepare(images), locations, images.dtype)
