"""Study ``dcpg_digit_scenes``: the Table 4 ablation of DCPG on captioned digit scenes, with the noise-matched
control, 3 seeds, every row at the same budget, selection on validation rsum.

    RLATTENTION_CACHE=/tmp/rlcache python benchmarks/dcpg_study.py --data-dir ../shared/data/mnist --seeds 0 1 2 \\
        --threads 1

Two at a time on 2 cores: first ``--rows baseline`` alone (its summary says whether the budget criterion below
held; if not, raise :data:`BUDGET` and run the baseline again into a fresh ``--work``/``--out``, since its
recorded runs would be skipped), then two such processes with disjoint ``--rows``,
e.g. ``--rows noise_matched full discrete continuous continuous_multihead`` and ``--rows reward_r1 reward_ap lambda10
lambda30 single_head pg_baseline``; both append to the same ``runs.jsonl``, and a last ``--summary-only`` writes the
summary of all. ``python benchmarks/dcpg_study.py check-budget RUN_DIR ...`` prints the validation curve of finished
or running baseline runs and the criterion.

Data: 2,500 training scenes (12,500 captions; ``data.num_train=2500``, the configs have 10,000), 1,000 dev and
1,000 test scenes of 2-4 MNIST digits (the 1K protocol), 6 regions of 69-d features; generated once into the cache
(``$RLATTENTION_CACHE``). Every row is its config, ``configs/dcpg_digit_scenes.yaml`` (``full``) plus one switch,
the file of its name (``configs/dcpg_digit_scenes_<row>.yaml``): ``baseline`` (triplet + instance + text decoding,
no policy, features scaled by lambda * 0.5 like the policy rows), ``noise_matched`` (the full network with its
policies frozen at their initial weights and no policy gradient: attention noise without learning), ``discrete``,
``continuous`` (1 head), ``continuous_multihead`` (2 heads), ``full`` (discrete-continuous, 2 heads, reward R@1 + AP,
lambda 20, straight-through estimator, logit bins, sigma starting at 0.15, the discrete stage starting near Att 0.5,
the self-critical advantage, the policies at 10x the learning rate), ``reward_r1``, ``reward_ap``, ``lambda10``,
``lambda30``, ``single_head``, ``pg_baseline`` (the leave-one-out baseline of eq. 10 instead of the self-critical
one).

``full`` is chosen on validation rsum (``best_val_rsum``, mean over the seeds every candidate ran) among the
variants ``full_uniform`` (the discrete stage starting nearly uniform over the bins: the first ``full`` runs, renamed),
``full_att05`` (a Gaussian prior over the bins around Att 0.5, sd 0.05: ``model.init_att_std``), ``full_att10``
(sd 0.1), ``full_att05_sc`` (+ ``model.self_critical``) and ``full_att05_sc_lr10`` (+ ``model.policy_lr_scale=10``);
the config ``dcpg_digit_scenes.yaml`` carries the settings of ``full_att05_sc_lr10``, the choice while only seed 0 had
run, so that every ablation row is it plus one switch. On all three seeds the choice is ``full_att05``, by 0.2
validation rsum (a tie: the two have the same test rsum); the ablation rows were kept on their parent, and
docs/dcpg.md gives Table 4's verdicts against both. ``noise_matched`` is ``noise_matched_att05``, the control of
every att05 candidate (the same initial policy;
``noise_matched_uniform``, the control of ``full_uniform``, ran as ``noise_matched`` first). The variants' rows pin
their settings with overrides; their seed-0 records were run before the config carried the chosen settings (the
commands recorded then reproduce them with the code of that commit, 19028a8-bd59650).

Budget (the same for every row, :data:`BUDGET`): 20 epochs of 98 steps (batch 128), Adam 4e-4 for 16 epochs, then
x 0.1 for 4 (``trainer.epochs=20 optim.step_epochs=16``), instead of the configs' 30 epochs of 390 steps.
Criterion: the baseline has stopped improving on validation, i.e. its validation rsum (of 600) at the last epoch
is less than 1 point above its value 2 epochs earlier (:data:`MIN_GAIN` over :data:`WINDOW` epochs, mean over its
seeds); the summary checks it (:func:`budget_check`).

Why 2,500 scenes: at 10,000 the study was about 30 single-thread hours (14 epochs x 390 steps x 0.55 s x 36
row-seeds), and the baseline had not been seen to flatten (validation rsum 290.3, 375.1, 406.0 after epochs 1-3).
A probe at 2,500 scenes with a constant learning rate (the baseline, seed 0, 1 thread beside other trainings,
72 s an epoch; validation only; command ``rlattention fit --config configs/dcpg_digit_scenes_baseline.yaml
--data-dir ../shared/data/mnist data.num_train=2500 trainer.epochs=30 optim.step_epochs=100``, stopped after 20
epochs) gave validation rsum 81.9, 190.6, 250.7, 306.8, 331.6, 351.5, 359.0, 367.6, 374.2, 376.5, 379.7, 384.6,
388.3, 388.4, 389.3, 392.3, 392.5, 394.6, 395.7, 394.7 after epochs 1-20: gains under 1 point an epoch on average
from epoch 16 on (+3.4 over epochs 16-20), +0.1 over the last two. The step after 16 epochs comes where the constant
rate has flattened, and the 4 epochs at the low rate are what the criterion checks. A row-seed is then about
20-25 min on one thread, the 36 row-seeds about 13 single-thread hours (two processes: 6-7 h).

Step time (issue 19): the training step computes the same losses as before (equal up to float rounding; the
exploration draws are the same random numbers) with less work: the caption decoder on the real positions only,
its first convolution shared by the image and text branches, the text GRUs on the packed captions, word_fc once
per vocabulary word, one instance product for both branches, and validation encoding each image once.
Measured interleaved in one process against the step as first written (``ReferenceDCPG`` of
tests/methods/test_dcpg_speed.py, same weights, batches and seeds), 1 thread under nice beside two other
trainings on the 2 cores, ``RLATTENTION_CACHE=/tmp/rlcache nice -n 10 python benchmarks/dcpg_step_speed.py
--data-dir ../shared/data/mnist [--config configs/dcpg_digit_scenes_baseline.yaml]``: ``full`` 2.11x faster per
step (median of 30: 1157 -> 548 ms), ``baseline`` 2.55x (904 -> 355 ms); validation 1.56x (4.85 -> 3.11 s). The
rest is arithmetic the model asks for (the decoder's second convolution over ~3,100 positions, the
10,000-way instance classifier, the GRUs, the GCN), so the epoch times above shrink by about these ratios.

Metrics (percent, 0-100; the test split, evaluated once on the checkpoint of the best validation rsum): ``rsum``
(sum of the six recalls, 0-600), ``i2t_r1``, ``i2t_r5``, ``i2t_r10`` (image query, caption gallery),
``t2i_r1``, ``t2i_r5``, ``t2i_r10``. The issue's target: ``full`` at least 5 rsum above ``baseline`` and above
``noise_matched``, means over the 3 seeds.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from study import Row, main, run_dir_of
from study import validation_curve as study_validation_curve

STUDY = "dcpg_digit_scenes"

#: The budget of every row (see the module docstring for the criterion and the measurement).
BUDGET = ["data.num_train=2500", "trainer.epochs=20", "optim.step_epochs=16"]
#: The criterion: the baseline's validation rsum gains less than MIN_GAIN over its last WINDOW epochs.
MIN_GAIN, WINDOW = 1.0, 2

#: (row, config suffix, what the row is). The row's config is configs/dcpg_digit_scenes{suffix}.yaml.
ROWS_SPEC: tuple[tuple[str, str, str], ...] = (
    ("baseline", "_baseline", "triplet + instance + text decoding, no policy (features x lambda * 0.5)"),
    ("discrete", "_discrete", "discrete PG only (the bin is the attention)"),
    ("continuous", "_continuous", "continuous PG only, 1 Gaussian head"),
    ("continuous_multihead", "_continuous_multihead", "continuous PG, 2 Gaussian heads"),
    ("reward_r1", "_reward_r1", "full, reward R@1 only"),
    ("reward_ap", "_reward_ap", "full, reward AP only"),
    ("lambda10", "_lambda10", "full, lambda 10"),
    ("lambda30", "_lambda30", "full, lambda 30"),
    ("single_head", "_single_head", "full with 1 head"),
    ("pg_baseline", "_pg_baseline", "full + leave-one-out PG baseline (beta 0.5, eq. 10)"),
)

#: The study's metric names -> the keys of ``report.json``'s ``test`` (already percent: R@K in 0-100, rsum 0-600).
METRIC_KEYS = {
    "rsum": "rsum",
    "i2t_r1": "i2t_r1",
    "i2t_r5": "i2t_r5",
    "i2t_r10": "i2t_r10",
    "t2i_r1": "t2i_r1",
    "t2i_r5": "t2i_r5",
    "t2i_r10": "t2i_r10",
}


#: Variants tried on the way (not rows of the issue): (row, config suffix, extra overrides, what it is).
VARIANTS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    (
        "full_uniform",
        "",
        ("model.init_att_std=null", "model.self_critical=false", "model.policy_lr_scale=1"),
        "full, the discrete stage starting nearly uniform over the bins (PyTorch's init; run as `full` before "
        "init_att_std existed, when this was the config's behaviour)",
    ),
    (
        "noise_matched_uniform",
        "_noise_matched",
        ("model.init_att_std=null",),
        "noise_matched of full_uniform (run as `noise_matched` before init_att_std existed)",
    ),
    (
        "full_att05",
        "",
        ("model.init_att_std=0.05", "model.self_critical=false", "model.policy_lr_scale=1"),
        "full, the discrete stage starting near Att 0.5 (a Gaussian prior over the bins, sd 0.05)",
    ),
    (
        "noise_matched_att05",
        "_noise_matched",
        ("model.init_att_std=0.05",),
        "noise_matched of full_att05 (its initial policy frozen, no policy gradient)",
    ),
    (
        "full_att10",
        "",
        ("model.init_att_std=0.1", "model.self_critical=false", "model.policy_lr_scale=1"),
        "full, the discrete stage starting near Att 0.5 with sd 0.1 (more exploration than full_att05)",
    ),
    (
        "full_att05_sc",
        "",
        ("model.init_att_std=0.05", "model.self_critical=true", "model.policy_lr_scale=1"),
        "full_att05 with the self-critical baseline (advantage: R(sampled) - R(mean actions) of the same query)",
    ),
    (
        "full_att05_sc_lr10",
        "",
        (
            "model.init_att_std=0.05",
            "model.self_critical=true",
            "optim.lr_scale.image_policy=10",
            "optim.lr_scale.text_policy=10",
        ),
        "full_att05_sc with the policies' learning rate x 10",
    ),
    (
        "continuous_lr1",
        "_continuous",
        ("model.policy_lr_scale=1",),
        "continuous at the policies' base learning rate (the chosen 10x was tuned for the bounded bins; the "
        "single Gaussian's mean is an unbounded linear head): does the row's collapse come from the 10x?",
    ),
    (
        "continuous_multihead_lr1",
        "_continuous_multihead",
        ("model.policy_lr_scale=1",),
        "continuous_multihead at the policies' base learning rate (as continuous_lr1)",
    ),
    (
        "baseline_lambda10",
        "_baseline",
        ("model.lam=10",),
        "baseline at lambda 10 (features x 5): lambda10's control, separating the feature scale from its attention",
    ),
)


#: The issue's rows chosen on validation among variants (the candidates ran under their own names).
FULL_CANDIDATES = ("full_uniform", "full_att05", "full_att10", "full_att05_sc", "full_att05_sc_lr10")


def rows() -> list[Row]:
    chosen = [
        Row(
            "full",
            "configs/dcpg_digit_scenes.yaml",
            list(BUDGET),
            "DCPG: discrete-continuous PG, 2 heads, reward R@1 + AP, lambda 20",
            candidates=FULL_CANDIDATES,
            select_key="best_val_rsum",
        ),
        Row(
            "noise_matched",
            "configs/dcpg_digit_scenes_noise_matched.yaml",
            list(BUDGET),
            "control: the full network, policies frozen at init, no policy gradient (of the att05 candidates)",
            candidates=("noise_matched_att05",),
            select_key="best_val_rsum",
        ),
    ]
    plain = [
        Row(name, f"configs/dcpg_digit_scenes{suffix}.yaml", list(BUDGET), note) for name, suffix, note in ROWS_SPEC
    ]
    issue = plain[:1] + chosen + plain[1:]  # baseline, full, noise_matched, the ablation rows
    variants = [
        Row(name, f"configs/dcpg_digit_scenes{suffix}.yaml", [*BUDGET, *extra], note, issue_row=False)
        for name, suffix, extra, note in VARIANTS
    ]
    return issue + variants


def metrics(report: dict) -> dict[str, float]:
    """The study's metrics from a dcpg ``report.json`` (test split; recalls in percent)."""
    test = report["test"]
    missing = [key for key in METRIC_KEYS.values() if key not in test]
    if missing:
        raise KeyError(f"report.json's test metrics lack {missing} (not a dcpg image-text run?): {sorted(test)}")
    return {name: float(test[key]) for name, key in METRIC_KEYS.items()}


DESCRIPTION = (
    "Table 4 ablation of DCPG on captioned digit scenes (2,500 training scenes / 12,500 captions, 1K dev, 1K test), "
    "with the noise-matched control; test split, checkpoint of the best validation rsum; every row 20 epochs, the "
    f"lr x 0.1 after 16; budget criterion: the baseline's validation rsum gains < {MIN_GAIN:g} over its last "
    f"{WINDOW} epochs (checked below the table)"
)


def validation_curve(run_dir: str | Path, key: str = "val/rsum") -> list[float]:
    """:func:`study.validation_curve` of a dcpg run (validation rsum by default)."""
    return study_validation_curve(run_dir, key)


def budget_check(curves: dict[str, Sequence[float]], window: int = WINDOW, min_gain: float = MIN_GAIN) -> str:
    """Markdown: each curve (validation rsum per epoch) and whether the mean gain over the last ``window`` epochs,
    last value minus the value ``window`` epochs before, is below ``min_gain``."""
    if not curves:
        return "Budget check: no baseline run found."
    lines = ["Budget check (baseline, validation rsum per epoch):", ""]
    gains = []
    for name, curve in curves.items():
        lines.append(f"- {name}: " + ", ".join(f"{v:.1f}" for v in curve))
        if len(curve) > window:
            gains.append(curve[-1] - curve[-1 - window])
    if not gains:
        return "\n".join([*lines, "", f"Too few epochs to check the gain over the last {window}."])
    gain = statistics.mean(gains)
    verdict = "met: the baseline has stopped improving" if gain < min_gain else "NOT met: the baseline still improves"
    lines += [
        "",
        f"Gain over the last {window} epochs, mean of {len(gains)} run(s): {gain:.2f} (< {min_gain:g}: {verdict}).",
    ]
    return "\n".join(lines)


def baseline_budget_md(doc: dict) -> str:
    """:func:`budget_check` of the ``baseline`` runs of a summary: the curves the summary keeps (from the records),
    else (a summary written before it kept them) the run folders'."""
    curves = {}
    for row in doc["rows"]:
        if row["name"] == "baseline":
            kept = row.get("validation_curves") or [None] * len(row["seeds"])
            for seed, command, curve in zip(row["seeds"], row["commands"], kept, strict=True):
                curve = list(curve) if curve is not None else validation_curve(run_dir_of(command))
                if curve:
                    curves[f"seed {seed}"] = curve
    return budget_check(curves)


#: Table 4's orderings (Flickr30k, rsum of the six recalls in the paper): (higher row, lower row, paper's rsums).
#: The paper's "Our scheme" has one head and "+multi-head" two; our ``full`` has two, ``single_head`` one.
TABLE4_ORDERINGS: tuple[tuple[str, str, str], ...] = (
    ("full", "baseline", "515.3 > 470.9"),
    ("discrete", "baseline", "501.7 > 470.9"),
    ("continuous", "baseline", "478.7 > 470.9"),
    ("full", "discrete", "515.3 > 501.7"),
    ("full", "continuous_multihead", "515.3 > 487.0"),
    ("continuous_multihead", "continuous", "487.0 > 478.7"),
    ("discrete", "continuous", "501.7 > 478.7"),
    ("full", "reward_ap", "512.1 > 510.8 (R@1 + AP > AP)"),
    ("reward_ap", "reward_r1", "510.8 > 500.1"),
    ("full", "lambda10", "512.1 > 503.6"),
    ("full", "lambda30", "512.1 > 501.2"),
    ("pg_baseline", "full", "512.5 > 512.1 (slightly)"),
    ("full", "single_head", "515.3 > 512.1"),
)


def ordering_md(doc: dict, key: str = "rsum") -> str:
    """Markdown: each ordering of :data:`TABLE4_ORDERINGS` on the study's test ``key`` (mean over seeds): holds,
    reversed, or no difference (the gap within the larger of the two rows' seed standard deviations); rows with
    fewer than 2 seeds get the gap only."""
    rows = {r["name"]: r["metrics"][key] for r in doc["rows"] if key in r.get("metrics", {})}
    lines = ["Table 4's orderings (paper: Flickr30k rsum) on this study's test rsum:", ""]
    for high, low, paper in TABLE4_ORDERINGS:
        if high not in rows or low not in rows:
            lines.append(f"- {high} > {low} ({paper}): not run yet")
            continue
        a, b = rows[high], rows[low]
        gap = statistics.mean(a) - statistics.mean(b)
        if min(len(a), len(b)) < 2:
            verdict = f"gap {gap:+.2f} (seeds {len(a)} and {len(b)}: no spread yet)"
        else:
            spread = max(statistics.stdev(a), statistics.stdev(b))
            what = "no difference" if abs(gap) <= spread else "holds" if gap > 0 else "reversed"
            verdict = f"{what}: gap {gap:+.2f}, larger seed sd {spread:.2f}"
        lines.append(f"- {high} > {low} ({paper}): {verdict}")
    return "\n".join(lines)


def extra_md(doc: dict) -> str:
    return baseline_budget_md(doc) + "\n\n" + ordering_md(doc)


if __name__ == "__main__":
    if sys.argv[1:2] == ["check-budget"]:
        runs = sys.argv[2:] or sys.exit("usage: python benchmarks/dcpg_study.py check-budget RUN_DIR ...")
        print(budget_check({run: validation_curve(run) for run in runs}))
        sys.exit(0)
    sys.exit(
        main(
            STUDY,
            rows(),
            metrics,
            DESCRIPTION,
            sys.argv[1:],
            extra_md=extra_md,
            script="python benchmarks/dcpg_study.py",
            primary="rsum",
            curve_key="val/rsum",
        )
    )
