"""The batch-wise public-style glimpse extractor (the speed baseline) against the per-sample reference."""

from __future__ import annotations

import pytest
import torch

from rlattention.vision.reference import glimpse_public_reference, glimpse_reference

CASES = [(28, 28, 8, 1), (100, 100, 12, 4), (37, 53, 6, 3), (60, 45, 7, 2), (28, 28, 1, 1), (20, 20, 5, 1)]


@pytest.mark.parametrize("H,W,g,k", CASES)
def test_public_reference_equals_reference_inside_the_image(H, W, g, k):
    torch.manual_seed(0)
    x = torch.rand(10, 2, H, W)
    loc = torch.rand(10, 2) * 2 - 1
    loc[:4] = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, 1.0], [1.0, -1.0]])  # the corners are valid too
    out = glimpse_public_reference(x, loc, g, k, 2)
    assert out.shape == (10, k, 2, g, g)
    torch.testing.assert_close(out, glimpse_reference(x, loc, g, k, 2), rtol=0, atol=1e-6)


def test_public_reference_scale_factor_three_and_float_factor():
    torch.manual_seed(1)
    x = torch.rand(5, 1, 40, 40)
    loc = torch.rand(5, 2) * 2 - 1
    torch.testing.assert_close(glimpse_public_reference(x, loc, 4, 3, 3.0), glimpse_reference(x, loc, 4, 3, 3))


def test_public_reference_rejects_non_integer_factor():
    with pytest.raises(ValueError, match="integer scale_factor"):
        glimpse_public_reference(torch.rand(1, 1, 8, 8), torch.zeros(1, 2), 2, 2, 1.5)
