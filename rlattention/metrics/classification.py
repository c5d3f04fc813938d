"""Single-label classification metrics."""

from __future__ import annotations

from torch import Tensor


def classification_metrics(scores: Tensor, targets: Tensor) -> dict[str, float]:
    """scores ``(N, K)`` (logits or probabilities), targets ``(N,)`` -> ``accuracy`` and ``error`` in percent
    (0-100, as the papers print them; ``accuracy + error = 100``) and ``count``."""
    if scores.ndim != 2 or targets.ndim != 1 or len(scores) != len(targets):
        raise ValueError(
            f"expected scores (N, K) and targets (N,), got {tuple(scores.shape)} and {tuple(targets.shape)}"
        )
    n = len(targets)
    correct = (scores.argmax(1) == targets).sum().item() if n else 0
    acc = correct / n if n else float("nan")
    return {"accuracy": 100.0 * acc, "error": 100.0 * (1.0 - acc), "count": float(n)}
