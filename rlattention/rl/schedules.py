"""Schedules of a scalar over training progress (e.g. the policy's sigma)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearSchedule:
    """Linear from ``start`` to ``end`` over ``progress`` in [0, 1]; constant when ``end`` is None."""

    start: float
    end: float | None = None

    def __call__(self, progress: float) -> float:
        if self.end is None:
            return self.start
        p = min(max(progress, 0.0), 1.0)
        return self.start + (self.end - self.start) * p


@dataclass(frozen=True)
class SigmoidThreshold:
    """eta_t = 1 / (1 + exp(-alpha t + beta)) over training steps t (DARP eq. 5).

    With the paper's alpha = 0.02, beta = -2 the threshold starts at 1/(1 + e^-2) = 0.881 and rises to 1; a
    positive beta (e.g. +2) starts it low (0.119) so that early, weak retrievals are rewarded too.
    """

    alpha: float = 0.02
    beta: float = -2.0

    def __call__(self, step: float) -> float:
        import math

        z = -self.alpha * step + self.beta
        return 1.0 / (1.0 + math.exp(z)) if z < 700 else 0.0
