"""Baselines for variance reduction."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class LearnedBaseline(nn.Module):
    """b_t = w^T h_t + c, a learned estimate of the expected return from state h_t.

    The input is detached: the baseline is trained only by :func:`baseline_loss` and never shapes the
    representation it reads. h: ``(..., F)`` -> ``(...)``.
    """

    def __init__(self, in_features: int, init_value: float = 0.0) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, 1)
        nn.init.zeros_(self.fc.weight)
        nn.init.constant_(self.fc.bias, init_value)

    def forward(self, h: Tensor) -> Tensor:
        return self.fc(h.detach()).squeeze(-1)


def baseline_loss(baseline: Tensor, returns: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean squared error between the baseline and the (detached) returns, over valid steps."""
    target = returns.detach()
    if mask is None:
        return F.mse_loss(baseline, target)
    mask = mask.to(baseline.dtype)
    return ((baseline - target).pow(2) * mask).sum() / mask.sum().clamp(min=1.0)


def leave_one_out_baseline(rewards: Tensor, beta: float = 1.0, dim: int = 0) -> Tensor:
    """b_k = beta * mean_{j != k} r_j along ``dim``: each sample's own reward is excluded.

    rewards: any shape with at least 2 entries along ``dim``. Returns the same shape, detached.
    """
    n = rewards.shape[dim]
    if n < 2:
        raise ValueError(f"leave-one-out needs at least 2 samples along dim {dim}, got {n}")
    r = rewards.detach()
    return beta * (r.sum(dim=dim, keepdim=True) - r) / (n - 1)


__all__ = ["LearnedBaseline", "baseline_loss", "leave_one_out_baseline"]
