"""Table III of the DARP paper from trained runs: AUIR and acc@q on the test split of each run's selected
(best-validation) checkpoint, plus the ranking-percentile-vs-completion figure (the paper's figure 7).

    python benchmarks/darp_table.py --data-dir ../shared/data/qmul_chairv2 --out benchmarks/results/darp_chairv2 \
        triplet=runs/darp_triplet_chairv2 vanilla_rl=runs/darp_vanilla_rl_chairv2 ppo=runs/darp_ppo_chairv2 \
        bdqn=runs/darp_bdqn_chairv2 darp=runs/darp_chairv2 darp_baseline=runs/darp_chairv2_baseline

Writes ``<out>.json``, ``<out>.md`` and ``<out>_percentile.png``. Evaluation is deterministic (mean actions).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rlattention.engine.loader import BatchLoader
from rlattention.engine.trainer import load_for_eval
from rlattention.vision.plot import plot_completion_curves


@torch.no_grad()
def evaluate_run(run: Path, data_dir: str | None, split: str, batch_size: int) -> tuple[dict, dict]:
    ckpt = run / "checkpoints" / "best.ckpt"
    cfg, model, splits = load_for_eval(ckpt, data_dir)
    model.eval()
    ds = getattr(splits, split)
    scores = [model.predict(x) for x, _ in BatchLoader(ds, batch_size, shuffle=False, drop_last=False)]
    scores = torch.cat(scores)
    report = json.loads((run / "report.json").read_text()) if (run / "report.json").is_file() else {}
    info = {"method": cfg.method, "train_seconds": report.get("train_seconds"), "epochs": report.get("epochs")}
    return {**model.metrics(scores, ds.targets), **info}, model.curves(scores, ds.targets)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    ap.add_argument("--data-dir")
    ap.add_argument("--split", default="test", choices=["test", "val"])
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--out", required=True, help="output path without extension")
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    rows, curves = {}, {}
    for item in args.runs:
        name, _, run = item.partition("=")
        metrics, curve = evaluate_run(Path(run), args.data_dir, args.split, args.batch_size)
        rows[name], curves[name] = metrics, curve["percentile"]
        print(f"{name}: AUIR {metrics['auir']:.2f}  acc@5 {metrics['acc@5']:.2f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = {"split": args.split, "runs": rows, "percentile_curves": {k: v.tolist() for k, v in curves.items()}}
    out.with_suffix(".json").write_text(json.dumps(table, indent=2))
    lines = [
        "| run | AUIR | acc@1 | acc@5 | acc@10 | mean rank | sketches | gallery | train s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in rows.items():
        lines.append(
            f"| {name} | {m['auir']:.2f} | {m['acc@1']:.2f} | {m['acc@5']:.2f} | "
            f"{m['acc@10']:.2f} | {m['mean_rank']:.1f} | {int(m['count'])} | {int(m['gallery'])} | "
            f"{m['train_seconds']} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot_completion_curves(curves, out.with_name(out.name + "_percentile.png"), title=args.title)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
