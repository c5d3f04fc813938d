"""How well scal's critic predicts the reward of explored attention over training (issue 21), from the training logs
of the ``scal_omniglot`` study's runs.

    python benchmarks/scal_critic_r2.py --rows sc_critic sc_critic_cw03 sc_explored \\
        --out benchmarks/results/scal_omniglot/critic_r2

Reads ``logs/metrics.csv`` of every run folder ``<work>/<row>_s<seed>`` (``--work``, default the study's
``runs/studies/scal_omniglot``) and reports ``train/critic_heldout_r2``: the R^2 of the critic's predictions on each
step's fresh explored passes, made before it learns from them (1 = exact, 0 = no better than their mean, < 0 =
worse), averaged over windows of ``--window`` logged steps, mean over the seeds and per seed. Writes ``<out>.json``
and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY = "train/critic_heldout_r2"


def r2_curve(run_dir: Path) -> list[tuple[int, float]]:
    """``(step, R^2)`` of every logged training step of a run folder; empty without a log."""
    path = run_dir / "logs" / "metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [(int(float(r["step"])), float(r[KEY])) for r in csv.DictReader(f) if (r.get(KEY) or "").strip()]


def windows(curve: list[tuple[int, float]], width: int, last_step: int) -> list[float | None]:
    """Mean R^2 over the steps ``[k width, (k + 1) width)`` for k up to ``last_step // width``; None when empty."""
    out = []
    for k in range(last_step // width + 1):
        vals = [v for s, v in curve if k * width <= s < (k + 1) * width]
        out.append(statistics.mean(vals) if vals else None)
    return out


def report(work: Path, rows: list[str], width: int) -> dict:
    runs = {row: sorted(work.glob(f"{row}_s[0-9]*")) for row in rows}
    curves = {row: {p.name: r2_curve(p) for p in paths if p.is_dir()} for row, paths in runs.items()}
    last = max((s for per in curves.values() for c in per.values() for s, _ in c), default=0)
    out: dict = {"metric": KEY, "window_steps": width, "work": str(work), "rows": {}}
    for row, per in curves.items():
        seeds = {name: windows(c, width, last) for name, c in per.items() if c}
        if not seeds:
            continue
        mean = []
        for k in range(last // width + 1):
            vals = [w[k] for w in seeds.values() if w[k] is not None]
            mean.append(statistics.mean(vals) if vals else None)
        overall = {name: statistics.mean(v for _, v in per[name]) for name in seeds}
        out["rows"][row] = {"mean": mean, "runs": seeds, "overall": overall}
    return out


def markdown(doc: dict, command: str) -> str:
    width = doc["window_steps"]
    n = max((len(r["mean"]) for r in doc["rows"].values()), default=0)
    head = [f"{k * width}-{(k + 1) * width - 1}" for k in range(n)]
    lines = [
        "# scal_omniglot: the critic's held-out R^2 over training",
        "",
        f"Command: `{command}`",
        "",
        "R^2 of the critic's reward predictions on each step's fresh explored passes, before it learns from them (1: "
        "exact; 0: no better than the passes' mean reward; < 0: worse), mean over windows of "
        f"{width} training steps; the row's mean over its seeds, then each seed.",
        "",
        "| row / run | " + " | ".join(head) + " | whole run |",
        "|---|" + "---|" * (n + 1),
    ]

    def cells(values: list) -> str:
        return " | ".join("" if v is None else f"{v:+.2f}" for v in values)

    for row, r in doc["rows"].items():
        whole = statistics.mean(r["overall"].values())
        lines.append(f"| **{row}** (mean of {len(r['runs'])}) | {cells(r['mean'])} | {whole:+.2f} |")
        for name, w in r["runs"].items():
            lines.append(f"| {name} | {cells(w)} | {r['overall'][name]:+.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", required=True, help="study rows whose runs have a critic")
    ap.add_argument("--work", default="runs/studies/scal_omniglot")
    ap.add_argument("--window", type=int, default=200)
    ap.add_argument("--out", default="benchmarks/results/scal_omniglot/critic_r2")
    args = ap.parse_args(argv)
    work = Path(args.work) if Path(args.work).is_absolute() else ROOT / args.work
    doc = report(work, args.rows, args.window)
    if not doc["rows"]:
        sys.exit(f"no run of {args.rows} with {KEY} in its logs under {work}")
    out = Path(args.out) if Path(args.out).is_absolute() else ROOT / args.out
    command = "python benchmarks/scal_critic_r2.py --rows " + " ".join(args.rows) + f" --window {args.window}"
    doc["work"] = args.work
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(doc, command))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
