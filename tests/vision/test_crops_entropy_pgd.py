"""Box crops against a slow reference, patch entropy, and the PGD attack."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rlattention.vision.adversarial import pgd_attack
from rlattention.vision.crops import (
    GATHER_MIN_CHANNELS,
    _bilinear_gather,
    _bilinear_grid_sample,
    crop_boxes,
    grid_boxes,
)
from rlattention.vision.entropy import binary_patch_entropy


def _crop_reference(images, box_px, size):
    """Per image: slice an integer pixel box (zero padded), area-resize by average pooling."""
    out = []
    for b in range(images.shape[0]):
        x0, y0, x1, y1 = box_px[b]
        pad = 64
        p = F.pad(images[b], (pad, pad, pad, pad))[:, y0 + pad : y1 + pad, x0 + pad : x1 + pad]
        out.append(F.adaptive_avg_pool2d(p[None], size)[0])
    return torch.stack(out)


def test_area_crop_matches_reference_on_aligned_boxes():
    torch.manual_seed(0)
    H, W = 24, 36
    x = torch.rand(6, 2, H, W, dtype=torch.float64)
    boxes_px, boxes = [], []
    for _ in range(6):
        x0, y0 = int(torch.randint(-6, W - 4, ())), int(torch.randint(-6, H - 4, ()))
        w, h = 4 * int(torch.randint(1, 4, ())), 3 * int(torch.randint(1, 4, ()))
        boxes_px.append((x0, y0, x0 + w, y0 + h))
        boxes.append([2 * x0 / W - 1, 2 * y0 / H - 1, 2 * (x0 + w) / W - 1, 2 * (y0 + h) / H - 1])
    out = crop_boxes(x, torch.tensor(boxes, dtype=torch.float64)[:, None], (3, 4))
    ref = torch.stack([_crop_reference(x[i : i + 1], [boxes_px[i]], (3, 4))[0] for i in range(6)])
    torch.testing.assert_close(out[:, 0], ref, atol=1e-9, rtol=0)


def test_bilinear_crop_of_whole_image_is_identity_and_many_boxes_in_one_call():
    x = torch.rand(2, 3, 8, 10)
    whole = torch.tensor([-1.0, -1.0, 1.0, 1.0]).expand(2, 5, 4)
    out = crop_boxes(x, whole, (8, 10), mode="bilinear")
    assert out.shape == (2, 5, 3, 8, 10)
    torch.testing.assert_close(out[:, 3], x, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="boxes"):
        crop_boxes(x, torch.zeros(2, 4), (2, 2))


def _random_boxes(B: int, n: int, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    """Boxes of many sizes, some reaching past the map on any side (zero padding)."""
    g = torch.Generator().manual_seed(seed)
    c = torch.rand(B, n, 2, generator=g, dtype=torch.float64) * 2.6 - 1.3
    half = torch.rand(B, n, 2, generator=g, dtype=torch.float64) * 1.2 + 0.05
    return torch.cat((c - half, c + half), -1).to(dtype)


def _grid_sample_crop(x, boxes, size):
    """The bilinear crop as one ``grid_sample`` of the cell centres (zero padding, align_corners=False)."""
    return _bilinear_grid_sample(x, boxes, *size)


def _bilinear_reference(x, boxes, size):
    """Pure Python: the bilinear sample at every cell centre of every box, zero outside the map."""
    B, C, H, W = x.shape
    h, w = size
    out = torch.zeros(B, boxes.shape[1], C, h, w, dtype=x.dtype)
    for b in range(B):
        for r, (x0, y0, x1, y1) in enumerate(boxes[b].tolist()):
            for i in range(h):
                py = ((y0 + (y1 - y0) * (i + 0.5) / h + 1) * H - 1) / 2
                for j in range(w):
                    px = ((x0 + (x1 - x0) * (j + 0.5) / w + 1) * W - 1) / 2
                    fx, fy = math.floor(px), math.floor(py)
                    for yy, wy in ((fy, 1 - (py - fy)), (fy + 1, py - fy)):
                        for xx, wx in ((fx, 1 - (px - fx)), (fx + 1, px - fx)):
                            if 0 <= yy < H and 0 <= xx < W:
                                out[b, r, :, i, j] += wy * wx * x[b, :, yy, xx]
    return out


@pytest.mark.parametrize("channels", [6, GATHER_MIN_CHANNELS])  # the grid_sample and the gather paths
@pytest.mark.parametrize("channels_last", [False, True])
def test_bilinear_crop_matches_python_reference_in_either_layout(channels, channels_last):
    x = torch.randn(3, channels, 7, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    boxes = _random_boxes(3, 5)
    ref = _bilinear_reference(x, boxes, (4, 3))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    out = crop_boxes(x, boxes, (4, 3), mode="bilinear")
    assert out.shape == (3, 5, channels, 4, 3)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    far = torch.tensor([[[2.5, 2.5, 3.0, 3.5]]], dtype=torch.float64).expand(3, 1, 4)  # wholly outside: zeros
    assert crop_boxes(x, far, (2, 2), mode="bilinear").abs().max() == 0


def test_bilinear_gather_gradients_reach_map_and_boxes():
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, requires_grad=True)
    boxes = _random_boxes(2, 3, seed=4).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, b: _bilinear_gather(x, b, 3, 2), (x, boxes))
    # and the same gradients as grid_sample's
    xr, br = x.detach().clone().requires_grad_(), boxes.detach().clone().requires_grad_()
    w = torch.randn(2, 3, 3, 3, 2, dtype=torch.float64)
    (_bilinear_gather(x, boxes, 3, 2) * w).sum().backward()
    (_grid_sample_crop(xr, br, (3, 2)) * w).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(boxes.grad, br.grad, atol=1e-9, rtol=1e-9)


def test_bilinear_gather_bf16_map_with_fp32_boxes():
    x = torch.randn(2, GATHER_MIN_CHANNELS, 6, 6, generator=torch.Generator().manual_seed(2))
    boxes = _random_boxes(2, 4, dtype=torch.float32, seed=2)
    out = crop_boxes(x.bfloat16(), boxes, (3, 3), mode="bilinear")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _grid_sample_crop(x, boxes, (3, 3)), atol=0.05, rtol=0.02)


def test_grid_boxes_tile_the_box():
    sub = grid_boxes(torch.tensor([[-1.0, -1.0, 1.0, 1.0]]), 2)
    assert sub.shape == (1, 4, 4)
    assert torch.equal(sub[0, 0], torch.tensor([-1.0, -1.0, 0.0, 0.0]))
    assert torch.equal(sub[0, 3], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    areas = ((sub[..., 2] - sub[..., 0]) * (sub[..., 3] - sub[..., 1])).sum()
    assert areas.item() == pytest.approx(4.0)


def test_binary_patch_entropy():
    black, white = torch.zeros(1, 1, 8, 8), torch.ones(1, 1, 8, 8)
    half = torch.cat([torch.zeros(1, 1, 8, 4), torch.ones(1, 1, 8, 4)], -1)
    quarter = torch.zeros(1, 1, 8, 8)
    quarter[..., :4, :4] = 1
    assert binary_patch_entropy(black).item() == 0.0
    assert binary_patch_entropy(white).item() == 0.0
    assert binary_patch_entropy(half).item() == pytest.approx(1.0)
    h = -(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75))
    assert binary_patch_entropy(quarter).item() == pytest.approx(h)


def test_pgd_stays_in_ball_and_raises_the_loss():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 3)
    x = torch.rand(32, 1, 4, 4)
    y = lin(x.flatten(1)).argmax(-1)  # the model is right on the clean images

    def logits(z):
        return lin(z.flatten(1))

    adv = pgd_attack(logits, x, y, epsilon=0.1, step_size=0.02, steps=10, generator=torch.Generator().manual_seed(1))
    assert (adv - x).abs().max() <= 0.1 + 1e-6 and adv.min() >= 0 and adv.max() <= 1
    assert F.cross_entropy(logits(adv), y) > F.cross_entropy(logits(x), y)
    assert torch.equal(pgd_attack(logits, x, y, 0.0, 0.01, 3, random_start=False), x)
