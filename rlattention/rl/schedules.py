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
