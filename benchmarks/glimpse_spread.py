"""Where a trained glimpse model looks: the distance of each glimpse from the image centre, and how much it varies
from image to image.

    nice -n 10 python benchmarks/glimpse_spread.py RUN [RUN ...] --data-dir ../shared/data/mnist

RUN is a run folder (its ``checkpoints/best.ckpt``, the checkpoint chosen on validation; ``--checkpoint last`` for the
last one) of a model that reports glimpse ``locations`` (ram, unified). The first ``--limit`` images of the
validation split are predicted as the engine evaluates them: mean locations, the config's evaluation seed
(:func:`rlattention.engine.predict.predict`). The test split is not read. For each glimpse t the table gives:

- ``|L_t|``: the mean distance of L_t from the image centre, in the units of the locations ((x, y) in [-1, 1]: 0 is the
  centre, 1 the middle of an edge, 1.41 a corner);
- ``spread``: the root of the summed variance of x and y over the images (0: every image is looked at in the same
  place).

It also gives the accuracy of the pass on those images. A policy that has collapsed shows a spread near 0, or
glimpses far from where the objects are. ``--out FILE`` writes the figures as json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlattention import load_model  # noqa: E402
from rlattention.data.registry import build_dataset  # noqa: E402
from rlattention.engine.predict import predict  # noqa: E402


def spread(run: str | Path, data_dir: str | None, limit: int, checkpoint: str = "best") -> dict:
    """``{"run", "checkpoint", "images", "accuracy", "distance", "spread"}`` of one run (see the module docstring);
    ``distance`` and ``spread`` hold one value per glimpse."""
    path = Path(run) / "checkpoints" / f"{checkpoint}.ckpt"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {checkpoint} checkpoint (expected a run folder of rlattention fit)")
    model = load_model(path)
    cfg = model.config
    splits = build_dataset(cfg.data.name, cfg.data, data_dir or cfg.data.data_dir)
    if splits.val is None or len(splits.val) == 0:
        raise ValueError(f"{run}: its data has no validation split (data.val_size = 0) to look at")
    images, targets = splits.val.images[:limit], splits.val.targets[:limit]
    out = predict(model, images)
    if "locations" not in out.attention:
        raise ValueError(f"{run}: method {cfg.method!r} reports no glimpse locations ({sorted(out.attention)})")
    locations = out.attention["locations"].float()  # (N, T, 2)
    accuracy = 100.0 * (out.labels == targets.to(out.labels.device)).float().mean().item()
    return {
        "run": str(run),
        "checkpoint": checkpoint,
        "images": len(images),
        "accuracy": round(accuracy, 2),
        "distance": [round(v, 3) for v in locations.norm(dim=-1).mean(0).tolist()],
        "spread": [round(v, 3) for v in locations.var(0, unbiased=False).sum(-1).sqrt().tolist()],
    }


def table(results: Sequence[dict]) -> str:
    glimpses = max(len(r["distance"]) for r in results)
    head = "| run | images | accuracy | " + " | ".join(f"L_{t}: abs, spread" for t in range(glimpses)) + " |"
    lines = [head, "|" + "---|" * (3 + glimpses)]
    for r in results:
        cells = [f"{d:.2f}, {s:.2f}" for d, s in zip(r["distance"], r["spread"], strict=True)]
        lines.append(f"| {Path(r['run']).name} | {r['images']} | {r['accuracy']:.2f}% | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders")
    ap.add_argument("--data-dir", help="the data folder the runs trained on (default: the one in their config)")
    ap.add_argument("--limit", type=int, default=1000, help="the first N validation images")
    ap.add_argument("--checkpoint", choices=("best", "last"), default="best")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="also write the figures to this json file (refused if it exists)")
    args = ap.parse_args(argv)
    if args.limit <= 0:
        ap.error(f"--limit must be > 0, got {args.limit}")
    if args.out and Path(args.out).exists():
        ap.error(f"--out {args.out} exists; name a new file")
    torch.set_num_threads(args.threads)
    results = [spread(run, args.data_dir, args.limit, args.checkpoint) for run in args.runs]
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
