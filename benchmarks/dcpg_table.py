"""The ablation table in the shape of Table 4 of the DCPG paper, from finished ``dcpg`` run folders.

    python benchmarks/dcpg_table.py runs/dcpg_digit_scenes_triplet runs/dcpg_digit_scenes_instance ... > table.md

Each run folder must hold the ``report.json`` and ``config.yaml`` that ``rlattention fit`` writes. One row per run,
in the order given: the switches that differ from the full scheme (read from the run's config), test R@1/5/10 in
both directions, rsum, the validation rsum of the selected epoch, epochs and training time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

COLUMNS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum")


def describe(model: dict) -> str:
    """The scheme of a run in the paper's vocabulary, from its model config."""
    pg = model.get("pg", "discrete_continuous")
    losses = ["triplet"]
    if model.get("instance_weight", 1.0) > 0:
        losses.append("instance")
    if model.get("decoding_weight", 1.0) > 0:
        losses.append("text decoding")
    parts = [" + ".join(losses)]
    if pg != "none":
        parts.append(f"PG {pg.replace('_', '-')}")
        parts.append(f"{model.get('heads', 2)} head{'s' if model.get('heads', 2) > 1 else ''}")
        parts.append(f"reward {model.get('reward', 'r1+ap')}")
        parts.append(f"λ = {model.get('lam', 20.0):g}")
        if model.get("pg_baseline", False):
            parts.append(f"PG baseline β = {model.get('baseline_beta', 0.5):g}")
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
