"""The studies of issue 22 for ``method: unified``, one script with the study as its first argument:

    nice -n 10 python benchmarks/unified_study.py unified_cluttered100 --data-dir ../shared/data/mnist --seeds 0 \\
        --threads 2 --rows ram
    nice -n 10 python benchmarks/unified_study.py unified_cluttered60 --data-dir ../shared/data/mnist \\
        --seeds 0 1 2 --threads 2 --rows ram
    nice -n 10 python benchmarks/unified_study.py unified_mnist --data-dir ../shared/data/mnist --seeds 0 1 2 \\
        --threads 2 --rows entropy_context
    nice -n 10 python benchmarks/unified_study.py unified_beta2 --data-dir ../shared/data/mnist --seeds 0 1 2 \\
        --threads 2 --rows beta2_001

Every option after the study is benchmarks/study.py's: ``--rows`` (any subset; a row at a time keeps each
process under the issue's two hours a row), ``--seeds``, ``--threads`` (2 on an otherwise idle machine, 1 beside
other trainings), ``--summary-only``, ``--out``/``--work``, and ``key=value`` overrides for every run (recorded;
write them before ``--rows``, which takes every word after it). Each run appends to
``benchmarks/results/<study>/runs.jsonl``; a recorded (row, seed) is not run again, so the same command continues a
study, and rows run in separate sessions (or two processes with disjoint ``--rows``) merge into one summary, with
its markdown table, the budget check and figures (``figures/``: test error per row, validation curves, seed 0's
glimpse and Q-value figures). ``python benchmarks/unified_study.py check-budget RUN_DIR ...`` prints the criterion
below for finished runs.

Studies (rows named as the issue names them; the rows' configs are ``configs/unified_<...>.yaml`` and
``configs/cnn_cluttered{100,60}.yaml``, the paper's settings: Adam 3e-4, batch 128, sigma 0.15, beta_1 = 1,
beta_2 = 0.01 with the policy gradient routed into the core (``policy_grad_to_core``, the unified default), lambda
0.5; the full training set, 54,000 images, 6,000 held out for validation, the 10,000 test images):

- ``unified_cluttered100``: 100 x 100 cluttered MNIST, 10 fragments of 8 x 8, 6 glimpses of 12 x 12 at 4 scales;
  rows ``cnn`` (the 5-layer CNN, lr 1e-3 as in cnn_cluttered60.yaml), ``ram``, ``topdown``, ``entropy``,
  ``entropy_context``; one seed. Targets: ``ram`` <= 30, ``entropy_context`` below ``ram`` and <= 20.3.
- ``unified_cluttered60``: the same rows on 60 x 60 with 4 fragments, 3 seeds.
- ``unified_mnist``: 28 x 28 MNIST, 6 glimpses of 8 x 8; rows ``ram``, ``entropy``, ``entropy_context``, 3 seeds.
  Target: ``entropy_context`` <= 1.0. Each row is chosen on validation (the best validation accuracy of seed 0,
  :data:`SELECT_SEEDS`) among the paper's constant lr 3e-4 (``<row>_paper``), lr 1e-3 with a cosine decay
  (``<row>_lr1e3_cosine``, the better of the two in the earlier 100-epoch runs of docs/unified.md) and the same with
  the first glimpse at the centre of the image (``<row>_lr1e3_cosine_center``; the paper draws L_0 at random, which
  on 28 x 28 often spends the first of 6 glimpses on the blank border) and, added after the first three's test
  figures were known, the cosine run validated and tested with a moving average of its weights
  (``<row>_lr1e3_cosine_ema``, ``trainer.ema_decay`` = :data:`EMA_DECAY`); ``--rows ram`` runs the four candidates
  on seed 0, then seeds 1 and 2 of the chosen one only (the losers' other seeds are not run). A tie on validation
  goes to the candidate listed first. Beside them, ``entropy_context_confidence`` (added after the leak below was
  found): the chosen ``entropy_context`` candidate with ``model.context_weights=confidence``.
- ``unified_beta2``: beta_2 in {0, 0.01, 0.1} (rows ``beta2_0``, ``beta2_001``, ``beta2_01``) on the full model of
  60 x 60 (``unified_cluttered60_entropy_context.yaml``: top-down, entropy, context), routed; beside them
  ``beta2_001_unrouted`` (beta_2 = 0.01 with ``policy_grad_to_core=false``, the default before issue 22). Note that
  ``beta2_0`` trains no location policy at all (its locations are those of the initial location network plus noise).
  ``beta2_001`` is unified_cluttered60's ``entropy_context`` row, config for config (``Row.same_as``): its records
  are copied from that study's ``runs.jsonl`` (run it first), not trained a second time.
- ``unified_sequences``: the sequences row of docs/unified.md re-run to convergence: ``unified_mnist_sequences.yaml``
  (54 x 54 MNIST sequences of 1-5 digits, 50,000 training canvases, 18 glimpses, a token every 3, entropy +
  context), row ``entropy_context``, seed 0, capped at 80 epochs (30 until session 18: the run recorded then is
  continued to 80, see :func:`study.extend_one`); its metric is the whole-sequence
  error; about 3-4 minutes an epoch on one thread. Beside it (added in session 17) ``entropy`` (no context
  constraint) and ``entropy_context_confidence``.

The context weights of eq. 11 (alpha_{t,y}, the true class's probability at each step) leak the label into C: in
the runs of issue 22 whose training logs are kept the context loss fell below 0.05 within 450 steps on 60 x 60,
classification still near chance (docs/unified.md); the ``*_confidence`` rows use
``model.context_weights=confidence`` (max_k alpha_{t,k}, no label).

The PGD table of the issue is benchmarks/unified_pgd.py, on the finished unified_cluttered60 checkpoints.

Metric: ``test_error``, percent, ``100 - accuracy`` of the run's ``report.json`` (its ``test`` section): the
checkpoint of the best validation accuracy, evaluated once on the test split with the mean locations in a single
pass (``eval.mc_samples = 0``; with top-down the pyramid is descended greedily and L_0 is the chosen region's
centre; without it L_0 is drawn uniformly from the evaluation seed). Also ``val_error``, 100 - the best validation
accuracy.

"Run until validation stops improving": every row with a constant learning rate (all but the MNIST
``*_lr1e3_cosine`` candidates, whose cosine decay needs its whole horizon) trains with the trainer's early stopping
(``trainer.early_stop_patience`` = :data:`WINDOW` validations, one an epoch, ``trainer.early_stop_min_delta`` =
:data:`MIN_GAIN` points of validation accuracy, monitored from :data:`START_FRACTION` of the cap, when the top-down
rows' epsilon has decayed; rlattention/engine/stopping.py), up to an epoch cap (:data:`CAPS`; the ``cnn`` caps are
too short for it to trigger), and the best validation checkpoint is tested. The summary checks, for every run,
whether validation had stopped improving (:func:`budget_check`: the best validation accuracy of the last
:data:`WINDOW` epochs is less than :data:`MIN_GAIN` points above the best before them, Keras'
EarlyStopping(min_delta=MIN_GAIN, patience=WINDOW)); it also names the epoch at which the trainer's rule ended the
run (:func:`stop_epoch` replays it on the curve). A run that
reached its cap without meeting the criterion says so in the summary: its row was still improving at the cap.

Cost of a row, measured (05:30-05:51, :data:`CAPS` set from it): two epochs on the first 27,008 training images
(= the 422 steps of one full epoch) and one validation pass on the 6,000 validation images, then the test; the
``cnn`` rows on 2,560 images (20 steps an epoch) and scaled to 422 steps. 1 torch thread, under ``nice -n 10``,
while two dcpg trainings (1 thread each, nice 0) and a dcpg evaluation loaded both cores (load average 3.5-4.7):
timings of a loaded machine, an upper bound for the same run alone. A row = cap x (epoch + validation), plus data
generation and the test (10-20 s, measured without figures; ``cnn`` 1.5-4 min):

    study / row                 step    epoch   validation  cap   one seed       fits ~2 h?
    cluttered100 cnn            3.47 s  1464 s  64 s          5   2.1 h          about, at 5 epochs (note 1)
    cluttered100 ram            52 ms   21.9 s  2.0 s       140   56 min         yes
    cluttered100 topdown        105 ms  44.3 s  2.9 s       140   1.8 h          yes
    cluttered100 entropy        88 ms   37.2 s  2.4 s       140   1.5 h          yes
    cluttered100 entropy_ctx    87 ms   36.7 s  2.3 s       140   1.5 h          yes
    cluttered60  cnn            1.17 s  494 s   23 s         14   2.0 h          about
    cluttered60  ram            44 ms   18.4 s  1.6 s       140   47 min         yes
    cluttered60  topdown        57 ms   24.0 s  1.4 s       140   59 min         yes
    cluttered60  entropy        66 ms   27.7 s  1.5 s       140   68 min         yes
    cluttered60  entropy_ctx    64 ms   26.8 s  1.4 s       140   66 min         yes (and each unified_beta2 row)
    mnist ram                   21 ms   8.7-9.0 s  0.3 s    200   31 min         yes (x 4 candidates)
    mnist entropy               21 ms   9.1 s   0.4 s       200   32 min         yes (x 4 candidates)
    mnist entropy_context       23 ms   9.8-10.1 s  0.3 s   200   35 min         yes (x 4 candidates)

Totals on one thread: unified_cluttered100 7.5 h (one seed); unified_cluttered60 5.8 h a seed, 17.4 h for three;
unified_mnist 9.9 h (12 candidate runs on seed 0, then the 3 chosen rows on seeds 1 and 2: 18 runs of
about 33 min); unified_beta2 4.4 h a seed, 13.2 h for three. Two
processes with disjoint ``--rows`` on the 2 cores halve the wall time.

Caps: the attention rows of both cluttered studies and of unified_beta2 train 140 epochs, the most that the slowest
of them (100 x 100 ``topdown``) fits in about two hours; one cap for all keeps the rows comparable. Every earlier
run of docs/unified.md was still improving at its end (cluttered: 12 epochs on 20,000 images; MNIST: best epochs
86-95 of 100), hence caps above the configs' 100 epochs where they fit; MNIST: 200.

The ``cnn`` rows were measured at 4.46 s and 1.44 s a step; the CNN now keeps its conv weights channels-last
(benchmarks/cnn_layout.py, results/cnn_layout.md: 1.38x and 1.36x, the same arithmetic), and the two lines above
are those measurements divided by that speed-up (the validation passes likewise), which bought the caps 5 and 14
instead of 3 and 10 in the same two hours.

Note 1: the 100 x 100 CNN costs about 25 min an epoch at one thread (convolutions on the whole canvas, 48/96/192
channels), so two hours buy 5 epochs, which will likely not meet the criterion (on 60 x 60 the same CNN had 88.7%
accuracy after 6 epochs, docs/unified.md): its summary line will say so; a CNN row run to convergence on 100 x 100
needs more than the issue's two hours (or two threads on an idle machine, not measured here).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from study import ROOT, Row, main, run_dir_of
from study import validation_curve as study_validation_curve

#: the epoch cap of every row (see the module docstring for the measurement behind it)
CAPS = {
    "unified_cluttered100": {"cnn": 5, "ram": 140, "topdown": 140, "entropy": 140, "entropy_context": 140},
    "unified_cluttered60": {"cnn": 14, "ram": 140, "topdown": 140, "entropy": 140, "entropy_context": 140},
    "unified_mnist": {"ram": 200, "entropy": 200, "entropy_context": 200},
    "unified_beta2": {"beta2": 140},
    # raised from 30 in session 18 (validation still rising by about 1.7 points an epoch at 30); the run recorded at
    # 30 is continued to 80 (extendable rows, benchmarks/study.py extend_one), not retrained
    "unified_sequences": {"entropy_context": 80},
}
#: the criterion: validation has stopped improving when the best validation accuracy of the last WINDOW epochs is
#: less than MIN_GAIN points (percent) above the best before them
MIN_GAIN, WINDOW = 0.2, 10
#: no run is judged before this fraction of its cap: unified's epsilon-greedy exploration of the pyramid decays over
#: the first 30% of the planned steps (``model.epsilon_decay``), and every row of a study gets the same start
START_FRACTION = 0.3

CLUTTERED_ROWS = ("ram", "topdown", "entropy", "entropy_context")
MNIST_CONFIGS = {
    "ram": "unified_mnist",
    "entropy": "unified_mnist_entropy",
    "entropy_context": "unified_mnist_entropy_context",
}
#: the unified_mnist candidates besides ``<row>_paper``, in the order they are listed (a tie goes to the first)
MNIST_VARIANTS = ("lr1e3_cosine", "lr1e3_cosine_center", "lr1e3_cosine_ema")
BETA2 = {"beta2_0": 0.0, "beta2_001": 0.01, "beta2_01": 0.1}
#: the seeds on which each unified_mnist row's candidates are compared (validation); only the chosen one runs the
#: other seeds
SELECT_SEEDS = (0,)
#: the decay of the unified_mnist ``*_lr1e3_cosine_ema`` candidates' weight average: about the last 1,000 steps (2.4
#: epochs of 421 steps)
EMA_DECAY = 0.999


@dataclass(frozen=True)
class Study:
    rows: tuple[Row, ...]
    seeds: tuple[int, ...]
    description: str
    targets: tuple[tuple[str, float], ...] = ()  # (row, the issue's target test error) drawn on the bar chart


def start_epoch(cap: int) -> int:
    """The first epoch early stopping monitors: :data:`START_FRACTION` of the cap, rounded up."""
    return math.ceil(START_FRACTION * cap)


def _epochs(study: str, row: str, early_stop: bool = True) -> list[str]:
    """The row's budget: its epoch cap and, unless its learning rate decays (a cosine schedule needs its whole
    horizon), the trainer's early stopping with the criterion of :func:`stop_epoch` (patience WINDOW validations,
    min_delta MIN_GAIN points, monitored from :func:`start_epoch`)."""
    cap = CAPS[study][row]
    stop = [
        f"trainer.early_stop_patience={WINDOW}",
        f"trainer.early_stop_min_delta={MIN_GAIN}",
        f"trainer.early_stop_start_epoch={start_epoch(cap)}",
    ]
    return [f"trainer.epochs={cap}", *(stop if early_stop else [])]


def cluttered_rows(side: int) -> tuple[Row, ...]:
    study = f"unified_cluttered{side}"
    cnn = Row("cnn", f"configs/cnn_cluttered{side}.yaml", _epochs(study, "cnn"), "5-layer CNN (3 conv + 2 FC), lr 1e-3")
    notes = {
        "ram": "RAM with the paper's settings (every switch off)",
        "topdown": "+ top-down: 2 pyramid levels of a 2 x 2 split, Q-learning",
        "entropy": "+ top-down + entropy constraint",
        "entropy_context": "+ top-down + entropy + context constraints",
    }
    attention = [
        Row(name, f"configs/unified_cluttered{side}_{name}.yaml", _epochs(study, name), notes[name])
        for name in CLUTTERED_ROWS
    ]
    variants = []
    if side == 100:  # added in session 19: the full model at 8 x 8 region views, the size at which a top-down step
        # costs under 1.5x a RAM step (unified_speed); a different model, whose accuracy this row measures
        small = [*_epochs(study, "entropy_context"), "model.region_size=16"]
        note = "+ top-down + entropy + context, 8 x 8 region views (model.region_size=16)"
        variants.append(Row("entropy_context_region16", f"configs/{study}_entropy_context.yaml", small, note, False))
    return (cnn, *attention, *variants)


def mnist_rows() -> tuple[Row, ...]:
    rows: list[Row] = []
    for name, config in MNIST_CONFIGS.items():
        path, epochs = f"configs/{config}.yaml", _epochs("unified_mnist", name)
        horizon = _epochs("unified_mnist", name, early_stop=False)
        paper, cosine, center, ema = f"{name}_paper", *(f"{name}_{v}" for v in MNIST_VARIANTS)
        rows.append(
            Row(
                name,
                path,
                note=f"{config}.yaml, lr, first location and weight averaging chosen on validation",
                candidates=(paper, *(f"{name}_{v}" for v in MNIST_VARIANTS)),
                select_key="best_val_accuracy",
                select_seeds=SELECT_SEEDS,
            )
        )
        rows.append(Row(paper, path, epochs, "the paper's constant lr 3e-4", issue_row=False))
        cos = [*horizon, "optim.lr=0.001", "optim.schedule=cosine"]
        rows.append(Row(cosine, path, cos, "lr 1e-3, cosine decay to 0", issue_row=False))
        # not the paper's (Algorithm 1 draws L_0 at random in the image): the first glimpse at the centre, where an
        # MNIST digit is, instead of anywhere in [-1, 1]^2, at test time too
        first = [*cos, "model.init_location=center"]
        rows.append(Row(center, path, first, "lr 1e-3 cosine, first glimpse at the centre", issue_row=False))
        # added in session 13, after the test figures of the first three were known (docs/unified.md says so): the
        # same training, validated and tested with a moving average of the weights over about the last 1,000 steps
        averaged = [*cos, f"trainer.ema_decay={EMA_DECAY}"]
        rows.append(Row(ema, path, averaged, f"lr 1e-3 cosine, weights averaged (EMA {EMA_DECAY})", issue_row=False))
    # added in session 17, after finding that eq. 11's weights alpha_{t,y} leak the label into C (docs/unified.md):
    # the chosen entropy_context candidate with label-free weights
    ema = [*_epochs("unified_mnist", "entropy_context", early_stop=False), "optim.lr=0.001", "optim.schedule=cosine"]
    confidence = [*ema, f"trainer.ema_decay={EMA_DECAY}", "model.context_weights=confidence"]
    note = (
        "entropy_context_lr1e3_cosine_ema, label-free context weights max_k alpha_{t,k} (eq. 11's alpha_{t,y} leak y)"
    )
    rows.append(
        Row("entropy_context_confidence", "configs/unified_mnist_entropy_context.yaml", confidence, note, False)
    )
    return tuple(rows)


def beta2_rows() -> tuple[Row, ...]:
    config, epochs = "configs/unified_cluttered60_entropy_context.yaml", _epochs("unified_beta2", "beta2")
    same = {"beta2_001": ("unified_cluttered60", "entropy_context")}  # the config's own beta_2: that row's runs
    rows = [
        Row(
            name,
            config,
            [*epochs, f"model.reinforce_weight={beta2}"],
            f"beta_2 = {beta2}, routed into the core",
            same_as=same.get(name, ()),
        )
        for name, beta2 in BETA2.items()
    ]
    unrouted = [*epochs, "model.reinforce_weight=0.01", "model.policy_grad_to_core=false"]
    rows.append(Row("beta2_001_unrouted", config, unrouted, "beta_2 = 0.01 not routed (before issue 22)", False))
    return tuple(rows)


def sequences_rows() -> tuple[Row, ...]:
    config, epochs = "configs/unified_mnist_sequences.yaml", _epochs("unified_sequences", "entropy_context")
    note = "the sequences row (table 3 stand-in): 54 x 54 MNIST sequences of 1-5 digits, entropy + context"
    # added in session 17 (the context weights of eq. 11 leak the label): without context, and with label-free
    # context weights
    variants = {
        "entropy": ("model.context=false", "entropy only (no context constraint)"),
        "entropy_context_confidence": (
            "model.context_weights=confidence",
            "entropy + context with label-free weights max_k alpha_{t,k}",
        ),
    }
    # extendable: a constant lr and sigma and no top-down schedule, so a run recorded at an earlier, smaller cap is
    # continued to this one and is the run of this cap (checked by extend_one)
    rows = [
        Row(name, config, [*epochs, o], text, issue_row=False, extendable=True) for name, (o, text) in variants.items()
    ]
    return (Row("entropy_context", config, epochs, note, extendable=True), *rows)


STUDIES = {
    "unified_cluttered100": Study(
        cluttered_rows(100),
        (0,),
        "Table 2 of the unified paper on 100 x 100 cluttered MNIST (10 fragments of 8 x 8), 6 glimpses of 12 x 12 "
        "at 4 scales, the paper's settings, full training set; test error (%) of the best validation checkpoint, "
        "mean locations, single pass",
        (("ram", 30.0), ("entropy_context", 20.3)),
    ),
    "unified_cluttered60": Study(
        cluttered_rows(60),
        (0, 1, 2),
        "The rows of table 2 on 60 x 60 cluttered MNIST (4 fragments of 8 x 8), 6 glimpses of 12 x 12 at 4 scales, "
        "the paper's settings, full training set; test error (%), mean locations, single pass",
    ),
    "unified_mnist": Study(
        mnist_rows(),
        (0, 1, 2),
        "Table 1 of the unified paper on 28 x 28 MNIST, 6 glimpses of 8 x 8; each row's lr (3e-4 constant or 1e-3 "
        "cosine), first location (random, as in the paper, or the centre) and weight averaging (none or an EMA) chosen "
        "on validation; test error (%), mean locations, single pass",
        (("entropy_context", 1.0),),
    ),
    "unified_beta2": Study(
        beta2_rows(),
        (0, 1, 2),
        "beta_2 (weight of the policy gradient, routed into the core) in {0, 0.01, 0.1}, the full unified model "
        "(top-down, entropy, context) on 60 x 60 cluttered MNIST; test error (%), mean locations, single pass",
    ),
    "unified_sequences": Study(
        sequences_rows(),
        (0,),
        "The sequences row of docs/unified.md (table 3 on 54 x 54 MNIST sequences of 1-5 digits, a stand-in for "
        "SVHN) run until validation stops improving: 18 glimpses, a token every 3; whole-sequence test error (%), "
        "mean locations, single pass",
    ),
}


def metrics(report: dict) -> dict[str, float]:
    """``test_error`` (percent) and ``val_error`` (100 - the best validation accuracy) from a ``report.json``."""
    test = report["test"]
    if abs(test["accuracy"] + test["error"] - 100.0) > 1e-6:
        raise ValueError(f"report.json's test accuracy and error do not add to 100: {test}")
    return {"test_error": 100.0 - float(test["accuracy"]), "val_error": 100.0 - float(report["best_val_accuracy"])}


# ------------------------------------------------------------------------------------------------- the budget
def validation_curve(run_dir: str | Path, key: str = "val/accuracy") -> list[float]:
    """:func:`study.validation_curve` of a unified run (validation accuracy by default)."""
    return study_validation_curve(run_dir, key)


def stop_epoch(curve: Sequence[float], window: int = WINDOW, min_gain: float = MIN_GAIN, start: int = 0) -> int | None:
    """The epoch (1-based) after which the trainer's early stopping (rlattention.engine.stopping, replayed on the
    curve: patience ``window``, ``min_delta = min_gain``, monitored from epoch ``start``) ends the run: ``window``
    epochs in a row without beating the last counted best by ``min_gain``; None if never."""
    from rlattention.engine import stopping
    from rlattention.engine.config import TrainerConfig
    from rlattention.engine.trainer import Progress

    cfg = TrainerConfig(early_stop_patience=window, early_stop_min_delta=min_gain, early_stop_start_epoch=start)
    progress = Progress(total_steps=len(curve) + 1)  # the planned end lies beyond the curve
    for epoch, value in enumerate(curve, 1):
        progress.epoch = progress.step = epoch
        if stopping.update(progress, value, "max", cfg):
            return epoch
    return None


def budget_check(
    curves: dict[str, Sequence[float]],
    window: int = WINDOW,
    min_gain: float = MIN_GAIN,
    starts: dict[str, int] | None = None,
    unstopped: Sequence[str] = (),
) -> str:
    """Markdown: for each run, whether the best validation accuracy of its last ``window`` epochs is less than
    ``min_gain`` points above its best before them (stopped improving; a gain of exactly ``min_gain`` up to float
    rounding counts as improving, as in the trainer), and the epoch at which early stopping (monitored from
    ``starts[name]``, default 0) ends it. The runs named in ``unstopped`` trained without early stopping (a
    learning-rate schedule to its horizon): for them the epoch is where the rule would have ended them."""
    from rlattention.engine.stopping import improved

    if not curves:
        return "Budget check: no run folder with a validation curve found."
    lines = [
        f"Budget check (validation accuracy, %; stopped improving: the best of the last {window} epochs is "
        f"less than {min_gain:g} above the best before them):",
        "",
    ]
    for name, curve in curves.items():
        if len(curve) <= window:
            lines.append(f"- {name}: {len(curve)} epochs, too few to check")
            continue
        gain = max(curve[-window:]) - max(curve[:-window])
        still = improved(max(curve[-window:]), max(curve[:-window]), "max", min_gain)
        verdict = "NOT met: still improving at the cap" if still else "met: stopped improving"
        stop = stop_epoch(curve, window, min_gain, (starts or {}).get(name, 0))
        if name in unstopped:  # trained to its cap: the rule is only replayed
            when = "trained to its cap without early stopping, " + (
                f"which would have ended it after epoch {stop}" if stop else "which would not have ended it"
            )
        else:
            when = f"early stopping ends it after epoch {stop}" if stop else "early stopping would not have"
        best = max(range(len(curve)), key=curve.__getitem__) + 1
        lines.append(
            f"- {name}: {len(curve)} epochs, best {max(curve):.2f} at epoch {best}, gain of the last "
            f"{window} {gain:+.2f} ({verdict}; {when})"
        )
    return "\n".join(lines)


def row_curves(row: dict) -> list[tuple[int, str, list[float]]]:
    """``(seed, command, validation accuracy by epoch)`` of each run of a summary row: the curves the summary keeps
    (``validation_curves``, from the records), else (a summary written before it kept them) the run folders'."""
    kept = row.get("validation_curves") or [None] * len(row["seeds"])
    return [
        (seed, command, list(curve) if curve is not None else validation_curve(run_dir_of(command)))
        for seed, command, curve in zip(row["seeds"], row["commands"], kept, strict=True)
    ]


def budget_md(doc: dict) -> str:
    """:func:`budget_check` of every run of a summary (:func:`row_curves`). A run whose validation curve is neither
    in its record nor in its run folder is named, not dropped: an earlier summary in git has its line."""
    curves, starts, unstopped, gone = {}, {}, [], []
    for row in doc["rows"]:
        for seed, command, curve in row_curves(row):
            name = f"{row.get('selected_from', row['name'])} seed {seed}"
            if not curve:
                gone.append(f"{name} ({run_dir_of(command)})")
            else:
                curves[name] = curve
                opts = dict(p.split("=", 1) for p in shlex.split(command) if p.startswith("trainer.") and "=" in p)
                if int(opts.get("trainer.early_stop_patience", 0)) > 0:
                    starts[name] = int(opts.get("trainer.early_stop_start_epoch", 0))
                else:  # a schedule's horizon: replay the rule from the start the study gives its capped rows
                    unstopped.append(name)
                    starts[name] = start_epoch(int(opts.get("trainer.epochs", len(curve))))
    text = budget_check(curves, starts=starts, unstopped=unstopped)
    if gone:
        text += (
            "\n\nNot checked here and not drawn in the curves figure: these runs' records predate the kept validation "
            "curves and their run folders are gone from this machine (the summaries in git from when they ran, of this "
            "study or of the study they were copied from, have their lines): "
            f"{', '.join(dict.fromkeys(gone))}."
        )
    return text


# ------------------------------------------------------------------------------------------------ the figures
FIGURES = ("test_error.png", "validation_curves.png")


def _seed0_figures(row: dict) -> dict[str, Path]:
    """``{kind: path}`` of the first glimpse and Q-value figures that ``rlattention fit`` drew for a row's seed 0."""
    if 0 not in row["seeds"]:
        return {}
    folder = run_dir_of(row["commands"][row["seeds"].index(0)]) / "figures"
    found = {kind: folder / f"{kind}_000.png" for kind in ("glimpses", "qvalues")}
    return {kind: path for kind, path in found.items() if path.is_file()}


def figures_md(doc: dict, out: Path | None = None) -> str:
    """The markdown below the table: the budget check and the figures that :func:`draw_figures` writes. A row's seed-0
    figures are linked while its run folder has them or while ``out/figures`` holds the copies an earlier summary
    made (the run folder gone)."""
    lines = [budget_md(doc), "", *(f"![{name}](figures/{name})" for name in FIGURES), ""]
    for r in doc["rows"]:
        kinds = _seed0_figures(r) if r["issue_row"] else {}
        if r["issue_row"] and not kinds and out is not None and 0 in r["seeds"]:
            copies = {kind: out / "figures" / f"{r['name']}_s0_{kind}.png" for kind in ("glimpses", "qvalues")}
            kinds = {kind: path for kind, path in copies.items() if path.is_file()}
        if kinds:
            links = ", ".join(f"[{kind}](figures/{r['name']}_s0_{kind}.png)" for kind in kinds)
            lines.append(f"- {r['name']}, seed 0, the first test image: {links}")
    return "\n".join(lines)


def curve_lines(doc: dict) -> list[tuple[str, str, list[float]]]:
    """``(label, line style, validation accuracy by epoch)`` of every run of a summary that has a curve
    (:func:`row_curves`): the issue rows' solid, then the variant rows' dashed and labelled so, to be read beside the
    issue's rows, not as one of them. A run is drawn once: a variant run that an issue row was selected from (the
    same command) is drawn as the issue row's."""
    lines, drawn = [], set()
    for r in sorted(doc["rows"], key=lambda r: not r["issue_row"]):  # a stable sort: the issue rows first
        for seed, command, curve in row_curves(r):
            if curve and command not in drawn:
                drawn.add(command)
                name = f"{r.get('selected_from', r['name'])} s{seed}"
                lines.append((name, "-", curve) if r["issue_row"] else (f"{name} (variant)", "--", curve))
    return lines


def draw_figures(doc: dict, out: Path, targets: Sequence[tuple[str, float]]) -> list[Path]:
    """``out/figures/``: the test error of every issue row (mean, one dot per seed, the issue's targets dashed), the
    validation accuracy of every run by epoch (a variant row's dashed), and seed 0's first glimpse (and Q-value)
    figures of each issue row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = out / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    rows = [r for r in doc["rows"] if r["issue_row"]]
    fig, ax = plt.subplots(figsize=(1.2 * len(rows) + 2, 3.5))
    for i, r in enumerate(rows):
        errors = r["metrics"]["test_error"]
        ax.bar(i, statistics.mean(errors), color="0.8")
        ax.plot([i] * len(errors), errors, "k.", ms=6)
    for name, target in targets:
        if name in [r["name"] for r in rows]:
            i = [r["name"] for r in rows].index(name)
            ax.plot([i - 0.45, i + 0.45], [target, target], "r--", lw=1.5)
    ax.set_xticks(range(len(rows)), [r["name"] for r in rows], rotation=20)
    ax.set(ylabel="test error (%)", title=f"{doc['study']} (dots: seeds; red: the issue's target)")
    fig.tight_layout()
    fig.savefig(folder / FIGURES[0], dpi=110)
    plt.close(fig)
    lines = curve_lines(doc)
    fig, ax = plt.subplots(figsize=(6 + 2.5 * (len(lines) > 8), 4))
    for label, linestyle, curve in lines:
        ax.plot(range(1, len(curve) + 1), curve, label=label, linestyle=linestyle)
    ax.set(xlabel="epoch", ylabel="validation accuracy (%)", title=doc["study"])
    if len(lines) > 8:  # beside the axes, where it hides no curve
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif lines:  # inside the axes (no run with a kept curve: an empty figure, no legend)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / FIGURES[1], dpi=110)
    plt.close(fig)
    written = [folder / name for name in FIGURES]
    for r in rows:
        for kind, src in _seed0_figures(r).items():
            written.append(Path(shutil.copyfile(src, folder / f"{r['name']}_s0_{kind}.png")))
    return written


def run(argv: Sequence[str]) -> int:
    if argv[:1] == ["check-budget"]:
        if len(argv) < 2:
            sys.exit("usage: python benchmarks/unified_study.py check-budget RUN_DIR ...")
        starts = {}
        for run_dir in argv[1:]:
            config = Path(run_dir) / "config.yaml"
            trainer = (yaml.safe_load(config.read_text()) or {}).get("trainer", {}) if config.is_file() else {}
            starts[run_dir] = int(trainer.get("early_stop_start_epoch", 0))
        print(budget_check({run_dir: validation_curve(run_dir) for run_dir in argv[1:]}, starts=starts))
        return 0
    if not argv or argv[0] not in STUDIES:
        sys.exit(f"usage: python benchmarks/unified_study.py {{{','.join(STUDIES)}}} [study options]")
    name, study = argv[0], STUDIES[argv[0]]
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--out", default=f"benchmarks/results/{name}")
    out = ROOT / ap.parse_known_args(argv[1:])[0].out
    code = main(
        name,
        study.rows,
        metrics,
        study.description,
        argv[1:],
        default_seeds=study.seeds,
        extra_md=lambda doc: figures_md(doc, out),
        script=f"nice -n 10 python benchmarks/unified_study.py {name}",
        primary="test_error",
        curve_key="val/accuracy",
    )
    if code == 0 and (out / "summary.json").is_file():
        doc = json.loads((out / "summary.json").read_text())
        if doc["rows"]:
            draw_figures(doc, out, study.targets)
    return code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
