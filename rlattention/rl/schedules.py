"""Schedules of a scalar over training progress (e.g. the policy's sigma, the rank reward's threshold eta)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


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
        z = -self.alpha * step + self.beta
        return 1.0 / (1.0 + math.exp(z)) if z < 700 else 0.0


THRESHOLD_SHAPES = ("geometric", "linear", "sigmoid", "paper")


@dataclass(frozen=True)
class RankThresholdSchedule:
    """A threshold eta(step) on the score 1/rank of DARP eq. 3 (R = 1[1/rank >= eta]) that starts lenient and
    rises from ``start`` (step 0) to ``end`` (step ``steps`` and after).

    ``step`` counts whatever should tighten the reward: the completion step of the partial sketch within an
    episode (an early partial is rewarded for a coarse retrieval, the full sketch only for rank 1) or the training
    step (as eq. 5). It may be a float or a tensor (e.g. ``torch.arange(1, S + 1)`` for a row of per-completion-
    step thresholds, or a step-count buffer, with no host sync); the result has the same type.

    With p = clamp(step / steps, 0, 1), ``shape``:

    - ``geometric`` (default): eta = start (end / start)^p, so the largest rewarded rank 1/eta shrinks by the
      same factor every step (a rank scale is multiplicative: 200 -> 100 is like 4 -> 2);
    - ``linear``: eta = start + (end - start) p (spends most of the range on ranks 1-2: eta = 0.5 is rank <= 2);
    - ``sigmoid``: eta = start + (end - start) s(p), s the logistic of ``sharpness`` (p - 1/2) rescaled to s(0) = 0,
      s(1) = 1 (flat at both ends);
    - ``paper``: DARP eq. 5, eta = 1 / (1 + exp(-alpha step + beta)); start/end/steps are ignored. With the paper's
      alpha = 0.02, beta = -2 it starts at 0.881 (only rank 1 is ever rewarded) -- kept for reproduction.

    The defaults (eta 1/250 -> 1 over 16 steps, geometric) reward rank <= 250 at step 0, rank <= 177 at step 1
    (the top 65% of a 270-item gallery), rank <= 15 at step 8 and only rank 1 from step 16 on.
    """

    start: float = 1.0 / 250.0
    end: float = 1.0
    steps: float = 16.0
    shape: str = "geometric"
    sharpness: float = 10.0
    alpha: float = 0.02
    beta: float = -2.0

    def __post_init__(self) -> None:
        if self.shape not in THRESHOLD_SHAPES:
            raise ValueError(f"threshold shape must be one of {THRESHOLD_SHAPES}, got {self.shape!r}")
        if self.shape != "paper":
            if not 0.0 < self.start <= 1.0 or not 0.0 < self.end <= 1.0:
                raise ValueError(f"eta start and end must be in (0, 1] (a score 1/rank), got {self.start}, {self.end}")
            if self.steps <= 0:
                raise ValueError(f"threshold steps must be > 0, got {self.steps}")
            if self.shape == "sigmoid" and self.sharpness <= 0:
                raise ValueError(f"sigmoid sharpness must be > 0, got {self.sharpness}")

    def __call__(self, step: float | Tensor) -> float | Tensor:
        if isinstance(step, Tensor):
            return self._eta(step if step.is_floating_point() else step.to(torch.get_default_dtype()))
        return float(self._eta(torch.tensor(float(step), dtype=torch.float64)))

    def _eta(self, step: Tensor) -> Tensor:
        if self.shape == "paper":  # DARP eq. 5
            return torch.sigmoid(self.alpha * step - self.beta)
        p = (step / self.steps).clamp(0.0, 1.0)
        if self.shape == "geometric":
            eta = self.start * (self.end / self.start) ** p
        else:
            if self.shape == "sigmoid":
                lo = 1.0 / (1.0 + math.exp(self.sharpness / 2))  # the logistic at p = 0; 1 - lo at p = 1
                p = (torch.sigmoid(self.sharpness * (p - 0.5)) - lo) / (1.0 - 2.0 * lo)
            eta = self.start + (self.end - self.start) * p
        # exactly start/end at the ends: a rounded-up end = 1 + 1e-7 would never reward rank 1
        return eta.clamp(min(self.start, self.end), max(self.start, self.end))
