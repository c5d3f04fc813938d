"""Speed of one DCPG training step (and of the per-epoch validation) against the step as first written.

    RLATTENTION_CACHE=/tmp/rlcache nice -n 10 python benchmarks/dcpg_step_speed.py --data-dir ../shared/data/mnist

The data and the model are built as ``rlattention fit --config configs/dcpg_digit_scenes.yaml`` builds them (the
cached digit scenes; batch 128, Adam); the reference is ``ReferenceDCPG`` of tests/methods/test_dcpg_speed.py
(the padded text GRU of the policy, ``nn.GRU`` on the packed captions, the dense convolutional decoder once per
branch, two instance cross-entropies, every item's image encoded at evaluation), with the same weights. Both
train on the same batches from the same seeds, alternating which goes first; the first ``--check`` steps print
the two losses (equal up to float rounding), then ``--steps`` steps are timed. Reports the medians and their
ratio (reference / fast), and the time of one validation pass (1,000 dev scenes x 5 captions) of each on the
same weights. Only the ratio is meaningful on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "methods"))

from lightning.fabric import Fabric  # noqa: E402
from test_dcpg_speed import ReferenceDCPG  # noqa: E402

from rlattention.data.registry import build_dataset  # noqa: E402
from rlattention.engine.config import load_config  # noqa: E402
from rlattention.engine.loader import BatchLoader  # noqa: E402
from rlattention.engine.method import DataInfo  # noqa: E402
from rlattention.engine.trainer import build_model, evaluate, make_optimizer  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--config", default=str(ROOT / "configs" / "dcpg_digit_scenes.yaml"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--check", type=int, default=3, help="steps whose losses are compared first")
    parser.add_argument("--steps", type=int, default=30, help="timed steps of each")
    parser.add_argument("--evals", type=int, default=2, help="timed validation passes of each (0: none)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. model.heads=1")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    splits = build_dataset(cfg.data.name, cfg.data, args.data_dir)
    torch.manual_seed(cfg.trainer.seed)
    fast = build_model(cfg, splits)
    ref = ReferenceDCPG(cfg.model, DataInfo(splits.image_shape, splits.num_classes, dict(splits.meta)))
    ref.load_state_dict(fast.state_dict())
    models = {"reference": ref, "fast": fast}
    optimisers = {name: make_optimizer(m.named_parameters(), cfg.optim) for name, m in models.items()}
    loader = BatchLoader(splits.train, cfg.trainer.batch_size, True, cfg.trainer.seed, 0, 1, True, "cpu")
    batches = iter(loader)

    def step(name: str, batch, seed: int) -> tuple[float, float]:
        torch.manual_seed(seed)
        t = time.perf_counter()
        out = models[name](*batch)
        optimisers[name].zero_grad(set_to_none=True)
        out.loss.backward()
        optimisers[name].step()
        return time.perf_counter() - t, out.loss.item()

    times: dict[str, list[float]] = {name: [] for name in models}
    for i in range(args.check + args.steps):
        batch = next(batches)
        order = list(models) if i % 2 else list(models)[::-1]
        losses = {}
        for name in order:
            seconds, losses[name] = step(name, batch, 1000 + i)
            if i >= args.check:
                times[name].append(seconds)
        if i < args.check:
            print(f"step {i}: loss reference {losses['reference']:.6f}, fast {losses['fast']:.6f}")
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(
        f"training step, median of {args.steps} (batch {cfg.trainer.batch_size}, {args.threads} thread(s)): "
        f"reference {1e3 * med['reference']:.0f} ms, fast {1e3 * med['fast']:.0f} ms, "
        f"ratio {med['reference'] / med['fast']:.2f}"
    )
    if args.evals > 0:
        ref.load_state_dict(fast.state_dict())
        fabric = Fabric(accelerator="cpu", devices=1)
        seconds: dict[str, list[float]] = {name: [] for name in models}
        metrics = {}
        for i in range(args.evals):
            for name in list(models) if i % 2 else list(models)[::-1]:
                t = time.perf_counter()
                metrics[name] = evaluate(fabric, models[name], splits.val, cfg.trainer.eval_batch_size)
                seconds[name].append(time.perf_counter() - t)
        med = {name: statistics.median(ts) for name, ts in seconds.items()}
        rsum = ", ".join(f"{name} {metrics[name]['rsum']:.2f}" for name in models)
        print(
            f"validation ({len(splits.val)} captions), median of {args.evals}: reference {med['reference']:.2f} s, "
            f"fast {med['fast']:.2f} s, ratio {med['reference'] / med['fast']:.2f}; rsum {rsum}"
        )


if __name__ == "__main__":
    main()
