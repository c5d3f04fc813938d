"""Early stopping on the validation selection metric: ``trainer.early_stop_patience`` and
``trainer.early_stop_min_delta``.

The rule, counted in validations (one every ``trainer.val_every`` epochs, plus the last one), not in epochs: a
validation *counts as an improvement* when its value beats the reference value (the last one that counted) in the
metric's direction (``"max"``: higher is better, ``"min"``: lower) by at least ``min_delta`` (strictly better when
``min_delta`` is 0); the first validation always counts (unless its value is NaN). A smaller gain neither resets the
count nor moves the reference, so a run that creeps up by less than ``min_delta`` per validation still stops.
Training stops after ``patience`` consecutive validations that did not count, unless that validation was the run's
last anyway (then it is no early stop). Validations before ``trainer.early_stop_start_epoch`` epochs are done are
not monitored at all (for a model whose own schedules, e.g. unified's epsilon-greedy decay, run over the first part
of training: a plateau there says nothing about convergence). Which model is tested is decided apart from this:
``best.ckpt`` follows any strict improvement.

The state (the reference value, its epoch, the validations since) lives in the trainer's ``Progress``: it is saved in
every checkpoint and a resumed run continues the count exactly. These functions read and update it in place; they
take no collective, as every rank computes the same validation metrics (:func:`rlattention.engine.evaluate.evaluate`
gathers the scores of the whole split on every rank) and so takes the same decision.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type hints only: the trainer imports this module
    from rlattention.engine.config import TrainerConfig
    from rlattention.engine.runprogress import Progress


def improved(value: float, reference: float | None, mode: str, min_delta: float = 0.0) -> bool:
    """Whether ``value`` beats ``reference`` in direction ``mode`` (``"max"`` | ``"min"``) by at least ``min_delta``
    (>= 0, in the metric's units; with 0: strictly better). ``reference`` None (nothing counted yet): any value that
    is not NaN. A gain equal to ``min_delta`` up to float rounding (e.g. 1.2 - 1.1 for 0.1) counts."""
    if mode not in ("max", "min"):
        raise ValueError(f"selection metric mode must be 'max' or 'min', got {mode!r}")
    if math.isnan(value):
        return False
    if reference is None:
        return True
    gain = value - reference if mode == "max" else reference - value
    rounding = 1e-12 * max(1.0, abs(value), abs(reference))  # the error of the subtraction, with a wide margin
    return gain > 0 and gain + rounding >= min_delta


def update(progress: Progress, value: float, mode: str, cfg: TrainerConfig) -> bool:
    """Count one validation whose selection metric is ``value`` (``progress.epoch``: the epochs done when it ran);
    returns whether training ends after it (:func:`stopped_early`). Nothing is counted with early stopping off
    (patience 0: a run resumed later with a patience starts its count then) or before
    ``trainer.early_stop_start_epoch`` epochs are done (not monitored at all, like Keras' ``start_from_epoch``)."""
    if cfg.early_stop_patience <= 0 or progress.epoch < cfg.early_stop_start_epoch:
        return False
    if improved(value, progress.stop_value, mode, cfg.early_stop_min_delta):
        progress.stop_value, progress.stop_epoch, progress.stale_validations = value, progress.epoch, 0
    else:
        progress.stale_validations += 1
    return stopped_early(progress, cfg)


def stopped_early(progress: Progress, cfg: TrainerConfig) -> bool:
    """Whether the patience is used up (``trainer.early_stop_patience`` > 0 validations in a row without an
    improvement that counted) before the planned end of training (``progress.step < progress.total_steps``). Read at
    the start of a resumed run too: a run that stopped early is not trained further (unless resumed with a larger
    or no patience)."""
    patience = cfg.early_stop_patience
    return 0 < patience <= progress.stale_validations and progress.step < progress.total_steps


def describe(progress: Progress, cfg: TrainerConfig, metric: str) -> str:
    """The one line saying that training stopped early and why (epoch, patience, reference and best values)."""
    n, delta = cfg.early_stop_patience, cfg.early_stop_min_delta
    why = f"has not improved for {n} validation{'s' if n != 1 else ''} (trainer.early_stop_patience={n})"
    if delta > 0:
        on = "" if progress.stop_value is None else f" on {progress.stop_value:.2f} (epoch {progress.stop_epoch})"
        why = f"has not improved by at least {delta:g}{on} for {n} validation{'s' if n != 1 else ''} "
        why += f"(trainer.early_stop_patience={n}, trainer.early_stop_min_delta={delta:g})"
    return (
        f"early stop after epoch {progress.epoch}: val {metric} {why}; best {progress.best_value:.2f} at epoch "
        f"{progress.best_epoch} (best.ckpt, tested)"
    )


def summary(progress: Progress, cfg: TrainerConfig) -> dict[str, Any]:
    """What ``report.json`` records: ``early_stopped`` and ``early_stop_epoch`` (the last epoch trained, or None)."""
    stopped = stopped_early(progress, cfg)
    return {"early_stopped": stopped, "early_stop_epoch": progress.epoch if stopped else None}
