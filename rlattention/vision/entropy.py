"""Information content of image patches."""

from __future__ import annotations

import torch
from torch import Tensor


def binary_entropy(p: Tensor) -> Tensor:
    """H(p) = -p log2 p - (1 - p) log2 (1 - p) in bits, with 0 log 0 = 0."""
    q = 1.0 - p
    return -(torch.xlogy(p, p) + torch.xlogy(q, q)) / torch.log(torch.tensor(2.0, dtype=p.dtype))


def binary_patch_entropy(patches: Tensor, threshold: float = 0.5, dims: int = 3) -> Tensor:
    """Binarise each patch at ``threshold`` and return the entropy of its 2-bin histogram, in bits.

    patches: ``(..., C, h, w)`` (the last ``dims`` dimensions form one patch). Returns ``(...)`` in [0, 1]:
    0 for an all-dark or all-bright patch, 1 when half the pixels are above the threshold. Not
    differentiable (a count), so it is only ever a weight.
    """
    ones = (patches > threshold).to(torch.float32).flatten(-dims).mean(-1)
    return binary_entropy(ones)
