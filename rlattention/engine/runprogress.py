"""A run's progress: what every checkpoint records of where training is (epoch, step, the selected best, the early
stopping count of :mod:`rlattention.engine.stopping`, the planned horizon, the time spent), saved and restored by
Fabric as a stateful object."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Progress:
    epoch: int = 0  # epochs completed
    epoch_step: int = 0  # batches done in the current epoch (mid-epoch checkpoints)
    step: int = 0  # optimiser steps done
    best_value: float | None = None
    best_epoch: int = -1
    best_step: int = 0
    stop_value: float | None = None  # early stopping (engine/stopping.py): the last value that counted as improving,
    stop_epoch: int = -1  # its epoch,
    stale_validations: int = 0  # and the validations since then that did not count
    total_steps: int = 0  # optimiser steps the run is planned for (the schedules' horizon)
    wall_time: float = 0.0  # seconds of training so far, across resumes

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / max(1, self.total_steps))

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, d: dict) -> None:
        self.__dict__.update(d)
