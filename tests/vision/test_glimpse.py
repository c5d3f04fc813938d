"""The batched glimpse sensor against the slow pad-slice-pool reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlattention.vision import GlimpseSensor
from rlattention.vision import glimpse as glimpse_module
from rlattention.vision.reference import glimpse_reference

CASES = [(28, 28, 8, 1), (100, 100, 12, 4), (37, 53, 6, 3), (60, 45, 7, 2), (28, 28, 1, 1)]


@pytest.mark.parametrize("H,W,g,k", CASES)
def test_nearest_mode_equals_reference(H, W, g, k):
    torch.manual_seed(0)
    x = torch.rand(12, 2, H, W)
    loc = torch.rand(12, 2) * 2.6 - 1.3  # partly outside the image: zero padding
    out = GlimpseSensor(g, k, 2, mode="nearest")(x, loc)
    ref = glimpse_reference(x, loc, g, k, 2)
    assert out.shape == (12, k, 2, g, g)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)  # float32 rounding of the sums only


@pytest.mark.parametrize("H,W,g,k", [c for c in CASES if c[2] % 2 == 0])
def test_area_mode_equals_reference_on_pixel_aligned_centres(H, W, g, k):
    torch.manual_seed(1)
    x = torch.rand(12, 1, H, W)
    cx = torch.randint(-4, W + 4, (12,)).double()
    cy = torch.randint(-4, H + 4, (12,)).double()
    loc = torch.stack([2 * cx / W - 1, 2 * cy / H - 1], 1)
    out = GlimpseSensor(g, k, 2, mode="area")(x.double(), loc)
    ref = glimpse_reference(x.double(), loc + 1e-9, g, k, 2)  # nudge: the reference floors
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-9)


def test_area_mode_is_exact_area_average_at_half_pixels():
    """Between pixels the area sampler averages the covered fractions: a 1x1 patch centred on the corner of 4
    pixels is their mean."""
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    loc = torch.tensor([[0.0, 0.0]])  # the centre of a 4x4 image is the corner shared by pixels 5, 6, 9, 10
    out = GlimpseSensor(1, 1)(x.double(), loc)
    assert out.item() == pytest.approx((5 + 6 + 9 + 10) / 4)
    two = GlimpseSensor(1, 2, 2)(x.double(), loc)  # second scale: 2x2 block mean, same value here
    assert two[0, 1].item() == pytest.approx((5 + 6 + 9 + 10) / 4)


def test_area_mode_is_continuous_in_location():
    torch.manual_seed(2)
    x = torch.rand(4, 1, 40, 40)
    s = GlimpseSensor(8, 3)
    loc = torch.rand(4, 2) * 2 - 1
    a, b = s(x, loc), s(x, loc + 1e-4)
    assert (a - b).abs().max() < 1e-2


def test_far_outside_is_zero_and_gradient_reaches_image():
    x = torch.rand(3, 1, 28, 28, requires_grad=True)
    s = GlimpseSensor(8, 2)
    far = s(x, torch.full((3, 2), 5.0))
    assert far.abs().max() == 0
    s(x, torch.zeros(3, 2)).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_one_grid_sample_call_per_glimpse(monkeypatch):
    calls = []
    real = F.grid_sample

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(glimpse_module.F, "grid_sample", counting)
    s = GlimpseSensor(12, 4)
    prepared = s.prepare(torch.rand(32, 1, 100, 100))
    for _ in range(6):
        s.extract(prepared, torch.rand(32, 2) * 2 - 1)
    assert len(calls) == 6  # whole batch and all four scales in each call


def test_output_follows_input_dtype_and_device():
    x = torch.rand(2, 3, 20, 30, dtype=torch.float64)
    out = GlimpseSensor(4, 2)(x, torch.zeros(2, 2))
    assert out.dtype == torch.float64 and out.device == x.device and out.shape == (2, 2, 3, 4, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_matches_cpu():
    x = torch.rand(4, 1, 50, 50)
    loc = torch.rand(4, 2) * 2 - 1
    s = GlimpseSensor(8, 3)
    torch.testing.assert_close(s.cuda()(x.cuda(), loc.cuda()).cpu(), s.cpu()(x, loc), atol=1e-5, rtol=0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        GlimpseSensor(8, 1, mode="bicubic")
    with pytest.raises(ValueError, match="scale_factor"):
        GlimpseSensor(8, 2, scale_factor=0)
