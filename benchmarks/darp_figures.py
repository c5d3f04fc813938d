"""Figures of a trained DARP run that a reader can read:

1. ``glimpses_head<k>.png``: for a few test sketches, each locator head's glimpses on the partial sketch at three
   completion steps: one square per glimpse, coloured by its order in the episode and numbered.
2. ``training.png``: the reward rate (``train/reward``) and the heads' spread (``train/heads_spread``: mean pairwise
   distance of the heads' mean locations, in [-1, 1] image units) over training, from ``logs/metrics.csv``.

    python benchmarks/darp_figures.py RUN_DIR --data-dir ../shared/data/omniglot --out benchmarks/results/darp_omniglot
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch


def training_curves(run: Path) -> dict[str, tuple[list[int], list[float]]]:
    """``{name: (steps, values)}`` of the logged training scalars of a run."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    with (run / "logs" / "metrics.csv").open() as f:
        for row in csv.DictReader(f):
            for key in ("train/reward", "train/heads_spread", "val/auir"):
                if row.get(key):
                    steps, values = out.setdefault(key, ([], []))
                    steps.append(int(row["step"]))
                    values.append(float(row[key]))
    return out


def plot_training(run: Path, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = training_curves(run)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, key, label in ((axes[0], "train/reward", "reward rate"), (axes[1], "train/heads_spread", "heads' spread")):
        if key in curves:
            ax.plot(*curves[key], lw=1.5)
        else:
            ax.text(0.5, 0.5, "not logged by this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_title("mean distance between the heads' mean locations", fontsize=9)
    axes[0].set_title("mean reward per glimpse", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@torch.no_grad()
def plot_head_glimpses(model, images: torch.Tensor, out_dir: Path, steps: list[int] | None = None) -> list[Path]:
    """One figure per head (or one for a policy-free locator): rows are sketches, columns completion steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm
    from matplotlib.patches import Rectangle

    from rlattention.methods.darp import split_layout

    model.eval()
    sketches, _ = split_layout(images)
    B, S, H, W = sketches.shape
    G = model.cfg.glimpses_per_step
    steps = steps or sorted({max(1, S // 4), max(1, S // 2), S})
    heads = list(range(model.cfg.num_heads)) if model.cfg.locator in ("bootstrap", "dqn") else [None]
    side = model.cfg.glimpse_size
    paths = []
    for k in heads:
        ep = model.episodes(sketches, deterministic=True, head=k)
        locs = ep["per_item"](ep["locations"])  # (B, S * G, 2) in [-1, 1]
        fig, axes = plt.subplots(B, len(steps), figsize=(2.4 * len(steps), 2.4 * B), squeeze=False)
        colours = cm.viridis(torch.linspace(0, 1, G).numpy())
        for i in range(B):
            for j, s in enumerate(steps):
                ax = axes[i][j]
                ax.imshow(sketches[i, s - 1].cpu(), cmap="gray_r", vmin=0, vmax=1)
                for g in range(G):
                    x, y = locs[i, (s - 1) * G + g].tolist()
                    cx, cy = (x + 1) / 2 * W, (y + 1) / 2 * H
                    ax.add_patch(Rectangle((cx - side / 2, cy - side / 2), side, side, fill=False, lw=1.2,
                                           edgecolor=colours[g]))  # fmt: skip
                    ax.text(cx, cy, str(g + 1), color=colours[g], fontsize=7, ha="center", va="center")
                ax.set_xticks([])
                ax.set_yticks([])
                if i == 0:
                    ax.set_title(f"partial {s}/{S}", fontsize=9)
        name = "glimpses.png" if k is None else f"glimpses_head{k}.png"
        fig.suptitle(("policy-free locator" if k is None else f"head {k}") + ": glimpses 1..G, dark to light",
                     fontsize=10)  # fmt: skip
        fig.tight_layout()
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--data-dir")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--num-sketches", type=int, default=4)
    args = ap.parse_args(argv)
    from rlattention.engine.trainer import load_for_eval

    cfg, model, splits = load_for_eval(args.run / "checkpoints" / "best.ckpt", args.data_dir)
    images = splits.test.images[: args.num_sketches].float() / 255.0
    name = args.run.name
    for p in plot_head_glimpses(model, images, args.out / f"{name}_figures"):
        print(p)
    print(plot_training(args.run, args.out / f"{name}_figures" / "training.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
