"""Cost of one training step of the unified model's table-2 rows at 100 x 100 (issue 22: a top-down step at most
1.5x a RAM step at the same glimpse count).

    nice -n 10 python benchmarks/unified_speed.py --data-dir ../shared/data/mnist

Builds the rows ``ram``, ``topdown``, ``entropy``, ``entropy_context`` from configs/unified_cluttered100_*.yaml
as ``rlattention fit`` builds them (batch 128, Adam, one torch thread), and two more, the top-down row with
``model.region_size`` 32, 24 and 16 (smaller region views: a different model), and times whole training steps (forward,
backward, optimiser step) round-robin over the rows, the first ``--warmup`` rounds discarded, on the same batches
of 100 x 100 cluttered MNIST (``--data-dir``; without it, synthetic clutter of the same size). Writes
``benchmarks/results/unified_speed/summary.json`` (metric ``step_ms``, one value: the median; ``ratio_to_ram``;
the thread's CPU time ``step_cpu_ms`` and ``cpu_ratio_to_ram``, the median over the rounds of the ratio to the ram
step of the same round) and ``summary.md``. The machine is shared: only the ratios, measured interleaved in one
process, mean anything; the CPU-time ratio is the steadier of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from study import cpu_model  # noqa: E402

from rlattention.engine.config import load_config  # noqa: E402
from rlattention.engine.method import DataInfo  # noqa: E402
from rlattention.engine.registry import get_method  # noqa: E402
from rlattention.engine.trainer import make_optimizer  # noqa: E402

ROWS = {  # name: (config, overrides); the four rows, then the top-down row at smaller region views
    "ram": ("configs/unified_cluttered100_ram.yaml", []),
    "topdown": ("configs/unified_cluttered100_topdown.yaml", []),
    "entropy": ("configs/unified_cluttered100_entropy.yaml", []),
    "entropy_context": ("configs/unified_cluttered100_entropy_context.yaml", []),
    # model.region_size changes the model (each pyramid level sees its regions at region_size / 2 pixels instead
    # of 25 x 25): what it costs and saves, not an exact speed-up
    "topdown_region32": ("configs/unified_cluttered100_topdown.yaml", ["model.region_size=32"]),
    "topdown_region24": ("configs/unified_cluttered100_topdown.yaml", ["model.region_size=24"]),
    "topdown_region16": ("configs/unified_cluttered100_topdown.yaml", ["model.region_size=16"]),
    # added in session 19: the full model at 8 x 8 region views, whose accuracy unified_cluttered100 measures
    "entropy_context_region16": ("configs/unified_cluttered100_entropy_context.yaml", ["model.region_size=16"]),
}
OUT = ROOT / "benchmarks" / "results" / "unified_speed"


def synthetic_batches(n: int, batch: int, side: int, seed: int = 0):
    """Dark canvases with 11 random 12 x 12 patches (a digit-sized blob and 10 clutter pieces)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.zeros(batch, 1, side, side)
        for b in range(batch):
            for _ in range(11):
                i, j = torch.randint(0, side - 12, (2,), generator=g).tolist()
                x[b, 0, i : i + 12, j : j + 12] = torch.rand(12, 12, generator=g)
        yield x, torch.randint(0, 10, (batch,), generator=g)


def data_batches(cfg, data_dir: str, n: int, batch: int):
    from rlattention.data.registry import build_dataset
    from rlattention.engine.loader import BatchLoader

    splits = build_dataset(cfg.data.name, cfg.data, data_dir)
    loader = iter(BatchLoader(splits.train, batch, True, cfg.trainer.seed, 0, 1, True, "cpu"))
    for _ in range(n):
        yield next(loader)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None, help="MNIST folder (default: synthetic clutter)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3, help="rounds discarded")
    parser.add_argument("--steps", type=int, default=30, help="timed rounds (one step of every row each)")
    parser.add_argument(
        "--name", default="summary",
        help="the files' stem in benchmarks/results/unified_speed/ (default: summary; another machine's run: its name)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not args.name or Path(args.name).name != args.name or args.name.startswith("."):
        parser.error(f"--name {args.name!r}: expected a plain file stem such as 'zen3', without a folder")

    torch.set_num_threads(args.threads)
    cfgs = {name: load_config(str(ROOT / path), overrides) for name, (path, overrides) in ROWS.items()}
    side = cfgs["ram"].data.canvas_size
    n = args.warmup + args.steps
    if args.data_dir:
        batches = list(data_batches(cfgs["ram"], args.data_dir, n, args.batch))
    else:
        batches = list(synthetic_batches(n, args.batch, side))
    models, optims = {}, {}
    for name, cfg in cfgs.items():
        torch.manual_seed(cfg.trainer.seed)
        model = get_method(cfg.method).from_config(cfg.model, DataInfo((1, side, side), 10, {}))
        model.train()
        model.set_progress(0.1)
        models[name], optims[name] = model, make_optimizer(model.named_parameters(), cfg.optim)

    times: dict[str, list[float]] = {name: [] for name in ROWS}
    cpu: dict[str, list[float]] = {name: [] for name in ROWS}
    for i, (x, y) in enumerate(batches):
        order = list(ROWS) if i % 2 == 0 else list(ROWS)[::-1]  # alternate who goes first
        for name in order:
            t, c = time.perf_counter(), time.thread_time()
            out = models[name](x, y)
            optims[name].zero_grad(set_to_none=True)
            out.loss.backward()
            optims[name].step()
            if i >= args.warmup:
                times[name].append(1e3 * (time.perf_counter() - t))
                cpu[name].append(1e3 * (time.thread_time() - c))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    med_cpu = {name: statistics.median(ts) for name, ts in cpu.items()}
    # paired: each round's CPU time over the ram step of the same round, then the median over the rounds
    paired = {name: [a / b for a, b in zip(ts, cpu["ram"], strict=True)] for name, ts in cpu.items()}
    quartiles = {name: [round(q, 2) for q in statistics.quantiles(r, n=4)] for name, r in paired.items()}
    command = "nice -n 10 python benchmarks/unified_speed.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    load = os.getloadavg()
    machine = (
        f"{args.threads} torch thread(s) ({os.cpu_count()} cores, {cpu_model()}), "
        f"torch {torch.__version__}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end"
    )
    rows = []
    for name, (path, overrides) in ROWS.items():
        rows.append({
            "name": name, "config": path, "overrides": overrides, "seeds": [cfgs[name].trainer.seed],
            "metrics": {
                "step_ms": [round(med[name], 1)], "ratio_to_ram": [round(med[name] / med["ram"], 2)],
                "step_cpu_ms": [round(med_cpu[name], 1)],
                "cpu_ratio_to_ram": [round(statistics.median(paired[name]), 2)],
            },
            "step_ms_all": [round(t, 1) for t in times[name]],
            "step_cpu_ms_all": [round(t, 1) for t in cpu[name]],
            "cpu_ratio_to_ram_quartiles": quartiles[name],
        })  # fmt: skip
    summary = {
        "study": "unified_speed",
        "description": (
            f"one training step (forward, backward, Adam) at batch {args.batch}, {side} x {side}, "
            f"{cfgs['ram'].model.num_glimpses} glimpses, median of {args.steps} steps per row timed round-robin "
            f"after {args.warmup} warm-up rounds, in one process; "
            + ("cluttered MNIST batches" if args.data_dir else "synthetic clutter batches")
            + "; step_ms is wall-clock time (ratio_to_ram: of the medians), step_cpu_ms the CPU time of the (one) "
            "computing thread, which time spent waiting for a core under load does not inflate (cpu_ratio_to_ram: "
            "the median over the rounds of each step's CPU time over the ram step of the same round)"
        ),
        "command": command.strip(),
        "selection": "not applicable (timing of training steps)",
        "machine": machine,
        "load_average": list(load),
        "rows": rows,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [
        "# unified_speed: one training step, 100 x 100, batch 128, one thread",
        "",
        f"`{summary['command']}`; {machine}.",
        "",
        "| row | config | overrides | step (ms, median) | x ram | CPU time (ms, median) | x ram (paired) | 25-75% |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, over, q = r["metrics"], " ".join(r["overrides"]) or "-", r["cpu_ratio_to_ram_quartiles"]
        lines.append(
            f"| {r['name']} | {r['config']} | {over} | {m['step_ms'][0]} | {m['ratio_to_ram'][0]} "
            f"| {m['step_cpu_ms'][0]} | {m['cpu_ratio_to_ram'][0]} | {q[0]} - {q[2]} |"
        )
    (OUT / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
