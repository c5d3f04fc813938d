"""Rewards shared by several methods."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def classification_reward(logits_or_pred: Tensor, target: Tensor) -> Tensor:
    """R = 1[argmax == target] as float, shape ``(B,)``. Accepts logits ``(B, K)`` or predictions ``(B,)``."""
    pred = logits_or_pred.argmax(-1) if logits_or_pred.ndim == target.ndim + 1 else logits_or_pred
    return (pred == target).float()


def topn_label_reward(scores: Tensor, targets: Tensor) -> Tensor:
    """R = |g ∩ p| / n: the share of an image's n ground-truth labels g found among its top-n scores p.

    scores ``(B, C)``; targets ``(B, C)`` with 1 for a label (anything <= 0 is not a label). Images without
    labels get R = 0. Returns ``(B,)`` float; ties in the scores are broken by class index.
    """
    g = targets > 0
    n = g.sum(-1)  # (B,)
    order = scores.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(scores.shape[-1], device=scores.device).expand_as(order))
    hits = (g & (rank < n[:, None])).sum(-1)
    return torch.where(n > 0, hits.float() / n.clamp(min=1).float(), torch.zeros_like(hits, dtype=torch.float32))


def rank_threshold_reward(ranks: Tensor, eta: float | Tensor) -> Tensor:
    """R = 1[score >= eta] with score = 1 / rank (DARP eqs. 3-4); ranks ``(...)`` int >= 1 -> float ``(...)``.

    eta: a float or a tensor broadcastable to ``ranks`` (e.g. a ``RankThresholdSchedule`` of the completion steps).
    """
    return ((1.0 / ranks.to(torch.float32)) >= eta).float()


def delta_inverse_rank(ranks: Tensor, rank0: float | Tensor = math.inf) -> Tensor:
    """Dense rank reward R_t = 1/rank_t - 1/rank_{t-1} along the last (completion step) dimension.

    ranks: ``(..., T)`` int >= 1 (``true_ranks``: ties count against). rank0: the rank before the first step,
    a float or a tensor broadcastable to ``(...)``; the default inf makes 1/rank_0 = 0, so R_1 = 1/rank_1 and
    the rewards telescope: sum_t R_t = 1/rank_T, the final score (undiscounted returns G_t = 1/rank_T -
    1/rank_{t-1}). Pass the gallery size G (a blind guess's worst rank) to reward only the improvement over
    it. Returns float ``(..., T)`` in [-1, 1]: positive when the true item moved up, negative when it fell.
    """
    inv = 1.0 / ranks.to(torch.float32)
    inv0 = 1.0 / torch.as_tensor(rank0, dtype=inv.dtype, device=inv.device).expand(inv.shape[:-1])
    return torch.diff(inv, dim=-1, prepend=inv0.unsqueeze(-1))


def rank_percentile(ranks: Tensor, gallery_size: int) -> Tensor:
    """Dense rank reward R_t = 1 - (rank_t - 1) / (G - 1) for a gallery of G items: 1 at rank 1, 0 at rank G.

    ranks: ``(...)`` int in [1, G] (``true_ranks``: ties count against, so a true item tied with all others has
    rank G and gets 0). A one-item gallery gives 1. Returns float ``(...)`` in [0, 1], linear in the rank (unlike
    1/rank it still separates rank 50 from rank 100). Checked on CPU only (a host sync elsewhere).
    """
    if gallery_size < 1:
        raise ValueError(f"gallery_size must be >= 1, got {gallery_size}")
    if ranks.device.type == "cpu" and ranks.numel() and bool((ranks < 1).any() | (ranks > gallery_size).any()):
        raise ValueError(f"ranks must be in [1, {gallery_size}], got {ranks.min().item()}..{ranks.max().item()}")
    if gallery_size == 1:
        return torch.ones(ranks.shape, dtype=torch.float32, device=ranks.device)
    return 1.0 - (ranks.to(torch.float32) - 1.0) / (gallery_size - 1)
