"""Rewards shared by several methods."""

from __future__ import annotations

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


def rank_threshold_reward(ranks: Tensor, eta: float) -> Tensor:
    """R = 1[score >= eta] with score = 1 / rank (DARP eqs. 3-4); ranks ``(...)`` int >= 1 -> float ``(...)``."""
    return ((1.0 / ranks.to(torch.float32)) >= eta).float()
