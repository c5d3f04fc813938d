"""The two costly parts of a top-down image pyramid (:mod:`rlattention.methods.unified`), computed exactly and
cheaply on CPU.

- **Region views.** A pyramid level views each sub-region of the current region at a fixed resolution, every
  output cell the exact mean of the image over the cell (:func:`rlattention.vision.crops.crop_boxes`, area mode).
  When the level's cells are whole pixels on the pixel grid (a quad tree of a 100 x 100 image viewed at 25 x 25:
  cells of 2 x 2 pixels, then 1 x 1), those means are block means of the image and a view is one tile of them:
  :func:`tile_views` gathers the tiles, without the float64 integral image and the bilinear sampling of its
  ``(r + 1)^2`` corners per view.
- **Region encoder.** ``AdaptiveAvgPool_s(ReLU(conv_3x3(x)))`` of many small regions with few channels, where
  ``nn.Conv2d`` and ``nn.AdaptiveAvgPool2d`` are slow on CPU: :func:`conv_relu_pool`, chunk by chunk of regions,
  lays out the 9 shifted copies of the zero-padded regions, computes the convolution as one matrix product with
  them and pools the rows and then the columns of the maps with a fixed averaging matrix
  (:func:`adaptive_pool_matrix`): ``P h P^T``, under a third of the arithmetic of one product with
  ``kron(P, P)``.

Both equal the slow references up to float rounding, in values and in gradients; tests/methods/test_unified.py
keeps the references.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


# --------------------------------------------------------------------------------------------- region views
def pyramid_cells(size: int, boxes_per_side: int, view: int) -> int:
    """Pixels per view cell along an axis of ``size`` pixels cut into ``boxes_per_side`` boxes, each viewed at
    ``view`` cells; 0 when a cell is not a whole number of pixels (then the boxes need :func:`crop_boxes`)."""
    cell, rest = divmod(size, boxes_per_side * view)
    return cell if rest == 0 else 0


def block_means(images: Tensor, cy: int, cx: int) -> Tensor:
    """Means of the ``cy x cx`` pixel blocks: ``(B, C, H, W)`` -> ``(B, C, H / cy, W / cx)`` (sides divisible), as
    ``avg_pool2d(images, (cy, cx))``, by adding strided slices (rows, then columns): several times faster on CPU."""
    B, C, H, W = images.shape
    rows = images.reshape(B, C, H // cy, cy, W)
    acc = rows[:, :, :, 0]
    for i in range(1, cy):
        acc = acc + rows[:, :, :, i]
    cols = acc.reshape(B, C, H // cy, W // cx, cx)
    out = cols[..., 0]
    for j in range(1, cx):
        out = out + cols[..., j]
    return out if cy * cx == 1 else out * (1.0 / (cy * cx))


def tile_views(images: Tensor, boxes: Tensor, view: int, cells: tuple[int, int]) -> Tensor:
    """Views of boxes that sit on the pixel grid, ``(B, n, C, view, view)``.

    images: ``(B, C, H, W)``. boxes: ``(B, n, 4)`` (x0, y0, x1, y1) normalised as in
    :mod:`rlattention.vision.crops`, each ``view * cells[1]`` pixels wide, ``view * cells[0]`` high and at a
    multiple of that from the top-left corner of the image (checked by the caller, e.g. with
    :func:`pyramid_cells`). Every output cell is the mean of its ``cells[0] x cells[1]`` pixels, as
    ``crop_boxes(images, boxes, (view, view))``. Differentiable w.r.t. the images (not the boxes).
    """
    B, C, H, W = images.shape
    cy, cx = cells
    pooled = block_means(images, cy, cx)  # (B, C, ny * view, nx * view)
    ny, nx = H // (cy * view), W // (cx * view)
    tiles = pooled.reshape(B, C, ny, view, nx, view).permute(0, 2, 4, 1, 3, 5)  # (B, ny, nx, C, view, view)
    # the tile of each box, from its top-left corner; rounding absorbs the float error of the box coordinates
    tx = torch.round((boxes[..., 0] + 1.0) * (nx / 2.0)).long().clamp_(0, nx - 1)  # (B, n)
    ty = torch.round((boxes[..., 1] + 1.0) * (ny / 2.0)).long().clamp_(0, ny - 1)
    return tiles[torch.arange(B, device=images.device)[:, None], ty, tx]


# ------------------------------------------------------------------------------------------ region encoder
CHUNK = 32  # regions per chunk: their 16 x 25 x 25 maps (1.3 MB) and taps (0.7 MB) stay near the core


def adaptive_pool_matrix(size: int, out: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """``(out, size)``: row i averages the bin ``[floor(i size / out), ceil((i + 1) size / out))``, the bins of
    :class:`torch.nn.AdaptiveAvgPool1d`, so that ``x @ P.T`` is that pooling of the last dimension."""
    P = torch.zeros(out, size, dtype=dtype)
    for i in range(out):
        lo, hi = (i * size) // out, -(-(i + 1) * size // out)
        P[i, lo:hi] = 1.0 / (hi - lo)
    return P


def _padded_chunks(regions: Tensor, chunk: int) -> Tensor:
    """``(N, C, r, r)`` -> ``(m, C, r + 2, n, r + 2)``: chunks of ``n = min(chunk, N)`` regions, zero-padded by one
    pixel (the last chunk completed with zero regions), the rows of the regions outermost."""
    N, C, r, _ = regions.shape
    n = min(chunk, N)
    m = -(-N // n)
    xp = F.pad(regions, (1, 1, 1, 1, 0, 0, 0, m * n - N))  # (m n, C, r+2, r+2)
    return xp.reshape(m, n, C, r + 2, r + 2).permute(0, 2, 3, 1, 4).contiguous()


def _taps(x: Tensor) -> Tensor:
    """The 9 taps of a 3 x 3 convolution of one chunk ``(C, r + 2, n, r + 2)``: ``(C * 9, r * n * r)``, row
    ``c * 9 + 3 dy + dx`` (the order of ``conv.weight.reshape(out, C * 9)``), column ``(y, region, x)``."""
    C, r2, n, _ = x.shape
    r = r2 - 2
    sc, sy, sn, sx = x.stride()
    shifted = x.as_strided((C, 3, 3, r, n, r), (sc, sy, sx, sy, sn, sx), x.storage_offset())
    return shifted.reshape(C * 9, r * n * r)


def _pool(h: Tensor, P: Tensor) -> Tensor:
    """Adaptive average pooling of maps ``(k, r, n, r)`` ([y, region, x]) -> ``(n, k, s, s)``: rows (one product
    ``P @ h``), then columns (transposed to be rows again: the products stay wide)."""
    k, r, n, _ = h.shape
    s = P.shape[0]
    rows = torch.matmul(P, h.reshape(k, r, n * r))  # (k, s_y, n r)
    cols = rows.reshape(k, s, n, r).permute(0, 3, 1, 2).reshape(k, r, s * n)  # (k, x, s_y n)
    return torch.matmul(P, cols).reshape(k, s, s, n).permute(3, 0, 2, 1)  # (n, k, s_y, s_x)


def _unpool(grad: Tensor, P: Tensor) -> Tensor:
    """The transpose of :func:`_pool`: ``(n, k, s, s)`` -> ``(k, r n r)``, the gradient of every map value."""
    n, k, s, _ = grad.shape
    r = P.shape[1]
    cols = grad.permute(1, 2, 0, 3).reshape(k * s * n, s).mm(P)  # (k s_y n, r): spread over x
    return torch.matmul(P.t(), cols.view(k, s, n * r)).view(k, -1)  # spread over y


def _forward(xq: Tensor, W: Tensor, b: Tensor, P: Tensor, keep: bool) -> tuple[Tensor, list[Tensor]]:
    """``(m n, k, s, s)`` pooled maps and, if ``keep``, the ``(k, r n r)`` maps ReLU(conv) of every chunk."""
    k = W.shape[0]
    r = xq.shape[2] - 2
    out, maps = [], []
    for x in xq:  # chunk by chunk: its taps and maps stay in cache
        h = torch.addmm(b[:, None], W, _taps(x)).clamp_(min=0)  # (k, r n r) = ReLU(conv)
        out.append(_pool(h.view(k, r, -1, r), P))
        if keep:
            maps.append(h)
    return torch.cat(out), maps


class _ConvReluPool(torch.autograd.Function):
    """:func:`conv_relu_pool` with a hand-written backward pass through the same chunks: the taps again (cheap, from
    the padded regions), the transposed pooling, ReLU' (from the maps the forward pass keeps: 20 MB per pyramid
    level of 512 regions of 25 x 25 with 16 channels, less than computing them again costs), the weight and bias
    gradients (one product with the taps, one sum) and, when the regions need it, theirs (each tap's gradient added
    back at its shift)."""

    @staticmethod
    def forward(ctx, xq: Tensor, W: Tensor, b: Tensor, P: Tensor) -> Tensor:
        out, maps = _forward(xq, W, b, P, keep=True)
        ctx.save_for_backward(xq, W, b, P, *maps)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        xq, W, b, P, *maps = ctx.saved_tensors
        m, C, r2, n, _ = xq.shape
        r = r2 - 2
        gW_t, gb = W.new_zeros(W.shape[1], W.shape[0]), torch.zeros_like(b)
        gxq = torch.zeros_like(xq) if ctx.needs_input_grad[0] else None
        for i, (x, h) in enumerate(zip(xq, maps, strict=True)):
            cols = _taps(x)
            g = _unpool(grad[i * n : (i + 1) * n], P)  # d out / d ReLU(conv), (k, r n r)
            g = torch.ops.aten.threshold_backward(g, h, 0)  # ReLU': zero where ReLU(conv) = 0
            gW_t.addmm_(cols, g.t())  # (C * 9, k): this orientation of the product is twice as fast on CPU
            gb += g.sum(1)
            if gxq is not None:
                gcols = W.t().mm(g).view(C, 3, 3, r, n, r)
                for dy in range(3):
                    for dx in range(3):
                        gxq[i, :, dy : dy + r, :, dx : dx + r] += gcols[:, dy, dx]
        return gxq, gW_t.t(), gb, None


def conv_relu_pool(regions: Tensor, weight: Tensor, bias: Tensor, P: Tensor, chunk: int = CHUNK) -> Tensor:
    """``AdaptiveAvgPool(ReLU(conv_3x3(regions)))``, zero padding 1, flattened channel-major: ``(N, C, r, r)`` ->
    ``(N, k * s * s)``, as ``nn.Conv2d``, ``nn.AdaptiveAvgPool2d(s)``, ``flatten(1)``.

    weight ``(k, C, 3, 3)``, bias ``(k,)``: the convolution's. P ``(s, r)``: :func:`adaptive_pool_matrix`, applied
    to the rows and then to the columns of every map (``P h P^T``: the same values as one product with
    ``kron(P, P)``, at under a third of its arithmetic). Chunks of ``chunk`` regions. Differentiable w.r.t. the regions,
    the weight and the bias.
    """
    N = regions.shape[0]
    xq = _padded_chunks(regions, chunk)
    W = weight.reshape(weight.shape[0], -1)  # (k, C * 9)
    P = P.to(regions.dtype)
    if torch.is_grad_enabled() and (W.requires_grad or bias.requires_grad or xq.requires_grad):
        out = _ConvReluPool.apply(xq, W, bias, P)
    else:
        out = _forward(xq, W, bias, P, keep=False)[0]
    return out[:N].flatten(1)
