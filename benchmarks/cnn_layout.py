"""One training step of the CNN classifier (the control row of the unified cluttered studies) with its conv weights
in channels-last order (as ``method: cnn`` builds it) against the plain layout, timed interleaved in one process::

    nice -n 10 python benchmarks/cnn_layout.py --steps 5

Batch 128, the configs' 48/96/192 channels, Adam, 1 torch thread, at 100 x 100 and 60 x 60; CPU time of the
process per step, median over the rounds; writes ``benchmarks/results/cnn_layout.md``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from pathlib import Path

import torch

from rlattention.engine.method import DataInfo
from rlattention.methods.cnn import CNN, CNNConfig

OUT = Path(__file__).resolve().parent / "results" / "cnn_layout.md"


def step_fn(model: CNN, side: int, batch: int):
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    g = torch.Generator().manual_seed(0)
    images, targets = torch.rand(batch, 1, side, side, generator=g), torch.randint(0, 10, (batch,), generator=g)

    def step() -> float:
        t = time.process_time()
        opt.zero_grad()
        model(images, targets).loss.backward()
        opt.step()
        return time.process_time() - t

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("::")[0])
    ap.add_argument("--steps", type=int, default=5, help="timed rounds (each: one step of each layout)")
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = [
        "# cnn_layout: one CNN training step, conv weights channels-last vs plain",
        "",
        f"`nice -n 10 python benchmarks/cnn_layout.py --steps {args.steps}`; batch {args.batch}, channels 48/96/192, "
        f"1 torch thread, torch {torch.__version__}, {os.cpu_count()} cores; CPU time per step, median of "
        f"{args.steps} interleaved rounds (after one warm-up step each); load average at the end: "
        "LOAD.",
        "",
        "| image | plain (s) | channels-last (s) | speed-up |",
        "|---|---|---|---|",
    ]
    for side in (100, 60):
        torch.manual_seed(0)
        fast = CNN(CNNConfig(channels=[48, 96, 192], hidden=384), DataInfo(image_shape=(1, side, side), num_classes=10))
        plain = copy.deepcopy(fast)
        plain.backbone.to(memory_format=torch.contiguous_format)
        steps = {"plain": step_fn(plain, side, args.batch), "channels_last": step_fn(fast, side, args.batch)}
        for f in steps.values():
            f()
        times: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(args.steps):
            for k, f in steps.items():
                times[k].append(f())
        med = {k: statistics.median(v) for k, v in times.items()}
        lines.append(
            f"| {side} x {side} | {med['plain']:.2f} | {med['channels_last']:.2f} | "
            f"{med['plain'] / med['channels_last']:.2f}x |"
        )
        print(lines[-1], flush=True)
    lines[2] = lines[2].replace("LOAD", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    OUT.write_text("\n".join(lines) + "\n")
    print(OUT.read_text())


if __name__ == "__main__":
    main()
