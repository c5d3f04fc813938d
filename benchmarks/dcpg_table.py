"""The ablation table in the shape of Table 4 of the DCPG paper, from finished ``dcpg`` run folders.

    python benchmarks/dcpg_table.py runs/dcpg_digit_scenes_triplet runs/dcpg_digit_scenes_instance ... > table.md

Each run folder must hold the ``report.json`` and ``config.yaml`` that ``rlattention fit`` writes. One row per run,
in the order given: the switches that differ from the full scheme (read from the run's config: the losses, the
policy or its absence, the noise-matched control, and the estimator, bin map and initial sigma when they are not
the current ones, so that runs of the first scheme are told apart), test R@1/5/10 in both directions, rsum, the
validation rsum of the selected epoch, epochs and training time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

COLUMNS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum")


#: The attention scheme of runs written before these keys existed (their config.yaml lacks them): the relaxed
#: expected bin in the forward pass, mu = logistic(a_s / n) as eq. 3 is printed, PyTorch's initial sigma, and
#: unscaled features in the rows without a policy (``fixed_attention = 1 / lambda``).
OLD_SCHEME = {"estimator": "relaxed", "bin_map": "logistic", "init_std": None, "mu_grad": "relaxed"}
#: The scheme of the current configs (configs/dcpg_digit_scenes.yaml); only what differs from it is named.
SCHEME = {"estimator": "straight_through", "bin_map": "logit", "init_std": 0.15, "mu_grad": "relaxed"}


def _scheme(model: dict) -> list[str]:
    """The estimator switches of a policy row that differ from :data:`SCHEME` (missing keys: :data:`OLD_SCHEME`)."""
    got = {k: model.get(k, OLD_SCHEME[k]) for k in SCHEME}
    parts = []
    if got["estimator"] != SCHEME["estimator"]:
        parts.append(f"{got['estimator'].replace('_', '-')} estimator")
    if got["bin_map"] != SCHEME["bin_map"]:
        parts.append(f"{got['bin_map']} bins" + (" (eq. 3 as printed)" if got["bin_map"] == "logistic" else ""))
    if got["mu_grad"] != SCHEME["mu_grad"]:
        parts.append(f"mu_grad {got['mu_grad']}")
    if got["init_std"] != SCHEME["init_std"]:
        parts.append("σ init: PyTorch default" if got["init_std"] is None else f"σ init {got['init_std']:g}")
    if model.get("pg_to_features", False):
        parts.append("PG reaches the encoders")
    return parts


def _fixed_scale(model: dict) -> float:
    """lambda * Att of a row without a policy: the features' scale in the fusion (eqs. 11-12)."""
    lam = float(model.get("lam", 20.0))
    if "fixed_attention" not in model:  # written before the no-policy rows were scaled like the policy rows
        return 1.0
    fixed = model["fixed_attention"]
    if fixed is None:  # the mean attention of a uniform policy over the bins, as DCPG computes it
        from rlattention.rl.discrete_continuous import mean_uniform_attention

        fixed = mean_uniform_attention(int(model.get("num_bins", 100)), model.get("bin_map", OLD_SCHEME["bin_map"]))
    return lam * float(fixed)


def describe(model: dict) -> str:
    """The scheme of a run in the paper's vocabulary, from its model config (``config.yaml``'s ``model:``).

    A key missing from the config is taken as it was before the key existed (:data:`OLD_SCHEME`), so that a run
    of the first scheme is not labelled as the current one. The noise-matched control (``noise_matched: true``:
    policies frozen at their initial weights, no policy-gradient term) is labelled as such, not as its ``pg``.
    """
    pg = model.get("pg", "discrete_continuous")
    losses = ["triplet"]
    if model.get("instance_weight", 1.0) > 0:
        losses.append("instance")
    if model.get("decoding_weight", 1.0) > 0:
        losses.append("text decoding")
    parts = [" + ".join(losses)]
    heads = int(model.get("heads", 2))
    head_text = f"{heads} head{'s' if heads > 1 else ''}"
    if pg == "none":
        parts.append(f"no policy (features × {_fixed_scale(model):g})")
    elif model.get("noise_matched", False):
        parts.append(
            f"noise-matched control: attention from the frozen initial {pg.replace('_', '-')} policy "
            f"({head_text}), no policy gradient"
        )
        parts.append(f"λ = {model.get('lam', 20.0):g}")
        parts.extend(_scheme(model))
    else:
        parts.append(f"PG {pg.replace('_', '-')}")
        parts.append(head_text)
        parts.append(f"reward {model.get('reward', 'r1+ap')}")
        parts.append(f"λ = {model.get('lam', 20.0):g}")
        if model.get("pg_baseline", False):
            parts.append(f"PG baseline β = {model.get('baseline_beta', 0.5):g}")
        parts.extend(_scheme(model))
    return ", ".join(parts)


def row(run: Path) -> str:
    report_path, config_path = run / "report.json", run / "config.yaml"
    for p in (report_path, config_path):
        if not p.is_file():
            raise SystemExit(f"{run}: no {p.name} (is it a finished rlattention run folder?)")
    report = json.loads(report_path.read_text())
    cfg = yaml.safe_load(config_path.read_text())
    test = report.get("test")
    if not test or "rsum" not in test:
        raise SystemExit(f"{report_path}: no test rsum (not an image-text run?)")
    cells = [f"{test[k]:.1f}" for k in COLUMNS]
    return (
        f"| `{run.name}` | {describe(cfg['model'])} | "
        + " | ".join(cells)
        + f" | {report['best_val_rsum']:.1f} | {report['epochs']} | {report['train_seconds']:.0f} s |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    print("| run | scheme | i2t R@1 | R@5 | R@10 | t2i R@1 | R@5 | R@10 | rsum | val rsum | epochs | training |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        print(row(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
