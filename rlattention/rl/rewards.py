"""Rewards shared by several methods."""

from __future__ import annotations

from torch import Tensor


def classification_reward(logits_or_pred: Tensor, target: Tensor) -> Tensor:
    """R = 1[argmax == target] as float, shape ``(B,)``. Accepts logits ``(B, K)`` or predictions ``(B,)``."""
    pred = logits_or_pred.argmax(-1) if logits_or_pred.ndim == target.ndim + 1 else logits_or_pred
    return (pred == target).float()
