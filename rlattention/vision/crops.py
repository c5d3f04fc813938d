"""Batched crops of axis-aligned boxes, resized to a fixed size: one ``grid_sample`` for all boxes.

Boxes are ``(x0, y0, x1, y1)`` in the normalised coordinates of the glimpse sensor: [-1, 1] spans the image
from the left (top) edge of the first pixel to the right (bottom) edge of the last, x scaled by the width,
y by the height. Boxes may extend beyond the image (zero padding).

- ``mode="area"``: each output cell is the exact mean of the image over the cell (integral image, see
  :mod:`rlattention.vision.glimpse`); right for downsampling, e.g. the coarse levels of an image pyramid.
- ``mode="bilinear"``: each output cell is the bilinear sample at the cell centre (RoIAlign with one sample
  per bin); right for cropping feature maps. With many channels (``>= GATHER_MIN_CHANNELS``) it is computed as
  one weighted gather of channel vectors (``embedding_bag`` over the map viewed as a ``(B*H*W, C)`` table, four
  weighted rows per output cell), which reads each cell's channels contiguously; ``grid_sample`` strides over
  the channels and costs in proportion to them, but has no fixed cost, so it stays the choice for few
  channels. Both give the same values and gradients. Give the map in ``torch.channels_last`` memory format (as
  :class:`rlattention.methods.rarl.RARL` does once per image): the gather's table is then a view, and
  ``grid_sample`` is faster on it too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rlattention.vision.glimpse import integral_image

# The gather has a fixed cost of ~0.6-1.1 ms per call on 2 CPU threads (9 regions per image, batch 16-64);
# grid_sample's grows with the channels. Measured (2 threads, channels-last maps): 64 channels 0.70 vs 0.57 ms
# (8x8 maps) and 1.21 vs 1.16 ms (32x32); 128 channels 0.83 vs 1.03 ms and 1.19 vs 2.34 ms; 512 channels 2.0 vs
# 4.3 ms and 2.9 vs 8.9 ms (NCHW: 19.9 ms).
GATHER_MIN_CHANNELS = 128


def _lattice(boxes: Tensor, h: int, w: int, centres: bool) -> tuple[Tensor, Tensor]:
    """x ``(B, n, w')`` and y ``(B, n, h')`` sample coordinates: cell corners (w+1, h+1) or cell centres."""
    tx = torch.arange(w + (0 if centres else 1), dtype=boxes.dtype, device=boxes.device)
    ty = torch.arange(h + (0 if centres else 1), dtype=boxes.dtype, device=boxes.device)
    if centres:
        tx, ty = tx + 0.5, ty + 0.5
    x0, y0, x1, y1 = boxes.unbind(-1)
    xs = x0[..., None] + (x1 - x0)[..., None] * (tx / w)
    ys = y0[..., None] + (y1 - y0)[..., None] * (ty / h)
    return xs, ys


def _grid(xs: Tensor, ys: Tensor) -> Tensor:
    B, n, nx = xs.shape
    ny = ys.shape[-1]
    grid = torch.stack((xs[:, :, None, :].expand(B, n, ny, nx), ys[:, :, :, None].expand(B, n, ny, nx)), -1)
    return grid.reshape(B, n * ny, nx, 2)


def crop_boxes(
    images: Tensor, boxes: Tensor, size: tuple[int, int], mode: str = "area", integral: Tensor | None = None
) -> Tensor:
    """Crop ``n`` boxes per image and resize each to ``size = (h, w)``.

    images: ``(B, C, H, W)``. boxes: ``(B, n, 4)`` (x0, y0, x1, y1) normalised, x1 > x0, y1 > y0.
    integral: ``integral_image(images)`` if already computed (area mode), to share it across calls.
    Returns ``(B, n, C, h, w)`` in the dtype of ``images``. Differentiable w.r.t. images and boxes.
    """
    if boxes.ndim != 3 or boxes.shape[-1] != 4 or boxes.shape[0] != images.shape[0]:
        raise ValueError(f"boxes must be (B, n, 4) with B={images.shape[0]}, got {tuple(boxes.shape)}")
    B, C, H, W = images.shape
    n = boxes.shape[1]
    h, w = size
    if mode == "area":
        S = integral_image(images) if integral is None else integral
        xs, ys = _lattice(boxes.to(S.dtype), h, w, centres=False)
        out = F.grid_sample(S, _grid(xs, ys), mode="bilinear", padding_mode="border", align_corners=True)
        sums = out.reshape(B, C, n, h + 1, w + 1).diff(dim=-1).diff(dim=-2)
        cell_w = (boxes[..., 2] - boxes[..., 0]).to(S.dtype) * (W / (2.0 * w))  # (B, n) in pixels
        cell_h = (boxes[..., 3] - boxes[..., 1]).to(S.dtype) * (H / (2.0 * h))
        means = sums / (cell_w * cell_h)[:, None, :, None, None]
        return means.transpose(1, 2).to(images.dtype)
    if mode == "bilinear":
        if C >= GATHER_MIN_CHANNELS:
            return _bilinear_gather(images, boxes, h, w)
        return _bilinear_grid_sample(images, boxes, h, w)
    raise ValueError(f"crop mode must be 'area' or 'bilinear', got {mode!r}")


def _bilinear_grid_sample(images: Tensor, boxes: Tensor, h: int, w: int) -> Tensor:
    """The same samples as :func:`_bilinear_gather` by one ``grid_sample`` of every cell centre:
    ``(B, n, C, h, w)``."""
    B, C = images.shape[:2]
    xs, ys = _lattice(boxes.to(images.dtype), h, w, centres=True)
    out = F.grid_sample(images, _grid(xs, ys), mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.reshape(B, C, boxes.shape[1], h, w).transpose(1, 2)


def _axis_taps(pos: Tensor, size: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The two bilinear taps along one axis of ``size`` pixels for normalised sample positions ``pos``
    (``align_corners=False``): indices ``(..., 2)`` clamped into the map, weights ``(..., 2)`` zero for a tap
    outside it (zero padding, as ``grid_sample``)."""
    px = ((pos + 1.0) * size - 1.0) / 2.0  # pixel coordinates, centres at integers
    lo = px.detach().floor()
    frac = px - lo  # differentiable w.r.t. the box
    idx = torch.stack((lo, lo + 1), -1).long()
    wt = torch.stack((1.0 - frac, frac), -1) * ((idx >= 0) & (idx < size)).to(pos.dtype)
    return idx.clamp(0, size - 1), wt.to(dtype)


def _bilinear_gather(images: Tensor, boxes: Tensor, h: int, w: int) -> Tensor:
    """Bilinear samples at the ``h x w`` cell centres of every box: ``(B, n, C, h, w)``, as
    ``grid_sample(..., align_corners=False, padding_mode="zeros")`` of those points, by one ``embedding_bag``."""
    B, C, H, W = images.shape
    n = boxes.shape[1]
    coord_dtype = torch.promote_types(boxes.dtype, torch.float32)  # positions in >= fp32 even for bf16 maps
    xs, ys = _lattice(boxes.to(coord_dtype), h, w, centres=True)  # (B, n, w), (B, n, h)
    ix, wx = _axis_taps(xs, W, coord_dtype)
    iy, wy = _axis_taps(ys, H, coord_dtype)
    base = (torch.arange(B, device=images.device) * (H * W)).view(B, 1, 1, 1, 1, 1)
    rows = base + iy[:, :, :, None, :, None] * W + ix[:, :, None, :, None, :]  # (B, n, h, w, 2, 2)
    weights = wy[:, :, :, None, :, None] * wx[:, :, None, :, None, :]
    table = images.permute(0, 2, 3, 1).reshape(B * H * W, C)  # a view for channels-last maps
    out = F.embedding_bag(
        rows.reshape(-1, 4), table, per_sample_weights=weights.reshape(-1, 4).to(images.dtype), mode="sum"
    )
    return out.view(B, n, h, w, C).permute(0, 1, 4, 2, 3)


def grid_boxes(boxes: Tensor, split: int) -> Tensor:
    """Divide each box ``(..., 4)`` into ``split x split`` sub-boxes, row-major: ``(..., split**2, 4)``."""
    x0, y0, x1, y1 = boxes.unbind(-1)
    t = torch.arange(split, dtype=boxes.dtype, device=boxes.device) / split
    dx, dy = (x1 - x0)[..., None], (y1 - y0)[..., None]
    left, top = x0[..., None] + dx * t, y0[..., None] + dy * t  # (..., split)
    sub_x0 = left[..., None, :].expand(*left.shape[:-1], split, split)
    sub_y0 = top[..., :, None].expand(*top.shape[:-1], split, split)
    sub = torch.stack((sub_x0, sub_y0, sub_x0 + dx[..., None] / split, sub_y0 + dy[..., None] / split), dim=-1)
    return sub.reshape(*boxes.shape[:-1], split * split, 4)
