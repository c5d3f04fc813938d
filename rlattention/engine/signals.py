"""Stopping a run cleanly on SIGTERM, SIGHUP or SIGINT.

While :func:`~rlattention.engine.trainer.fit` trains, :class:`_StopSignals` records the first stop signal; the
training loop asks :func:`_agreed_signal` at each step boundary (with several processes every rank then stops at
the same step), saves ``checkpoints/last.ckpt`` and raises :class:`TrainingInterrupted` (:func:`_interrupted`).
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import threading
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric

#: the signals that stop a run cleanly (:class:`TrainingInterrupted`): the first one received ends training at the
#: the signals that stop a run cleanly (:class:`TrainingInterrupted`): the first one received ends training at the
#: next step boundary, with a resumable ``checkpoints/last.ckpt``
STOP_SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT")


class TrainingInterrupted(BaseException):
    """SIGTERM, SIGHUP or SIGINT while :func:`fit` trained: training stopped at a step boundary and
    ``checkpoint`` (the run's ``checkpoints/last.ckpt``) holds the run at ``step``; ``rlattention fit --resume
    run_dir`` continues it exactly. A ``BaseException``, as ``KeyboardInterrupt`` is, so that an ``except
    Exception`` meant for failed runs does not swallow a request to stop. ``exit_code``: 128 + the signal's
    number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP)."""

    def __init__(self, signum: int, step: int, checkpoint: str | Path, run_dir: str | Path) -> None:
        self.signum = int(signum)
        self.signal_name = signal.Signals(self.signum).name
        self.step, self.checkpoint, self.run_dir = int(step), Path(checkpoint), Path(run_dir)
        super().__init__(
            f"interrupted by {self.signal_name} at step {self.step}; resumable checkpoint {self.checkpoint}; "
            f"continue with: rlattention fit --resume {shlex.quote(str(self.run_dir))}"
        )

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _StopSignals:
    """While the training loop runs: handlers for :data:`STOP_SIGNALS` that only record the first signal received
    (:attr:`signum`); the loop reads it at each step boundary. Installed from the main thread only (elsewhere
    ``signal.signal`` cannot be called: nothing is installed), never over a signal that is ignored (a run under
    ``nohup`` keeps ignoring SIGHUP) or whose handler was not set from Python (it could not be put back); the
    previous handlers are put back by :meth:`restore` (idempotent). A second signal is recorded nowhere: it cannot
    interrupt the checkpoint being saved (SIGKILL still ends the process at once; the atomic write then keeps the
    previous checkpoint)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _record(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for name in STOP_SIGNALS:
            sig = getattr(signal, name, None)  # no SIGHUP on Windows
            if sig is None:
                continue
            previous = signal.getsignal(sig)
            if previous is None or previous == signal.SIG_IGN:
                continue
            try:
                signal.signal(sig, self._record)
            except (ValueError, OSError):  # not the main interpreter, ...
                continue
            self._previous[sig] = previous

    def restore(self) -> None:
        while self._previous:
            sig, previous = self._previous.popitem()
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, previous)


def _agreed_signal(fabric: Fabric, stop: _StopSignals) -> int:
    """The signal the run stops for at this step boundary, 0 for none: the one this process received; with several
    processes the largest number any rank received, so that every rank stops at the same step (a collective:
    every rank calls it at every boundary; none with one process)."""
    mine = stop.signum or 0
    if fabric.world_size == 1:
        return mine
    agreed = fabric.all_reduce(torch.tensor([mine], dtype=torch.int64, device=fabric.device), reduce_op="max")
    return int(agreed.item())


def _interrupted(fabric: Fabric, signum: int, step: int, run_dir: Path) -> TrainingInterrupted:
    """The loggers flushed and closed (metrics.csv then holds every row up to ``step``, as a resume expects), and
    the exception to raise; ``checkpoints/last.ckpt`` already holds ``step``."""
    for logger in fabric.loggers:
        logger.finalize("interrupted")
    return TrainingInterrupted(signum, step, run_dir / "checkpoints" / "last.ckpt", run_dir)
