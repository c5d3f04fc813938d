"""Where the K locator heads of trained DARP runs look: for each run's selected (best-validation) checkpoint,
each head's deterministic episode on the first ``--limit`` test sketches, then

- the heads' mean locations and their mean pairwise distance (0: every head looks at the same place),
- the mean distance of a head's mean location from the centre,
- the spread of one episode's locations (the norm of their standard deviation over the glimpses).

Locations are in [-1, 1] image units.

    python benchmarks/darp_heads.py --data-dir ../shared/data/qmul_chairv2 runs/darp_chairv2 runs/darp_spread
"""

from __future__ import annotations

import argparse
import json

import torch

from rlattention.engine.trainer import load_for_eval
from rlattention.methods.darp import split_layout


@torch.no_grad()
def placement(model, images: torch.Tensor) -> dict:
    """The measures above for a DARP model (bootstrap locator) on sketch-retrieval items ``images``."""
    model.eval()
    sketches, _ = split_layout(images.float() / 255 if images.dtype == torch.uint8 else images.float())
    heads = range(model.cfg.num_heads)
    locs = torch.stack([model.episode(sketches, True, head=k)["locations"][:, 1:] for k in heads])  # (K, B, T, 2)
    means = locs.mean((1, 2))  # (K, 2)
    K = len(means)
    pairwise = torch.cdist(means, means).sum() / max(1, K * (K - 1))
    return {
        "head_means": [[round(v, 3) for v in m.tolist()] for m in means],
        "mean_pairwise_distance": round(float(pairwise), 3),
        "distance_from_centre": round(float(means.norm(dim=-1).mean()), 3),
        "episode_spread": round(float(locs.std(2).norm(dim=-1).mean()), 3),
        "sketches": len(images),
    }


def head_placement(run: str, data_dir: str | None, limit: int) -> dict:
    cfg, model, splits = load_for_eval(f"{run}/checkpoints/best.ckpt", data_dir)
    if cfg.method != "darp" or cfg.model.locator != "bootstrap":
        raise ValueError(f"{run}: a darp run with the bootstrap locator is needed, got method {cfg.method}")
    return {"run": run, **placement(model, splits.test.images[:limit])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--data-dir")
    ap.add_argument("--limit", type=int, default=64, help="test sketches to use (default 64)")
    args = ap.parse_args(argv)
    for run in args.runs:
        print(json.dumps(head_placement(run, args.data_dir, args.limit)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
