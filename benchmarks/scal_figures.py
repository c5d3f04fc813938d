"""Attention maps of scal runs over the same test queries, every panel on one colour scale with one colourbar.

    python benchmarks/scal_figures.py --data-dir ../shared/data \\
        --run weak=runs/studies/scal_omniglot/weak_s0 --run self_critical=runs/studies/scal_omniglot/sc_explored_s0 \\
        --out benchmarks/results/scal_omniglot/attention_maps.png

Each ``--run NAME=PATH`` is a run folder (its ``checkpoints/best.ckpt``; ``--ckpt last`` for ``last.ckpt``) or a
checkpoint file, loaded as ``rlattention viz`` loads it. The first ``--num`` queries of the test split are drawn
once per run: the image, then each attention module's map (spatial x channel attention averaged over channels,
resized to the image) over it. The colour scale is the same for every panel: ``--vmin/--vmax`` if given, else the
smallest to the largest value over every map drawn, written on the colourbar. Runs without attention (the
``backbone`` row) are refused with their name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlattention.engine.loader import unit_float  # noqa: E402
from rlattention.engine.trainer import load_for_eval  # noqa: E402
from rlattention.vision.plot import plot_attention_overlays  # noqa: E402


def parse_runs(specs: list[str]) -> dict[str, Path]:
    """``["name=path", ...]`` -> ``{name: path}``; a bare path is named by its folder."""
    runs: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec).name, spec
        if not name or not path:
            raise SystemExit(f"--run {spec!r}: expected NAME=PATH")
        if name in runs:
            raise SystemExit(f"--run {spec!r}: the name {name!r} is given twice")
        runs[name] = Path(path)
    return runs


def checkpoint_of(path: Path, which: str) -> Path:
    """The checkpoint file of a run folder (``checkpoints/<which>.ckpt``) or the file itself."""
    ckpt = path / "checkpoints" / f"{which}.ckpt" if path.is_dir() else path
    if not ckpt.is_file():
        raise SystemExit(f"{path}: no checkpoint at {ckpt}")
    return ckpt


def query_maps(checkpoint: Path, data_dir: str | None, num: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``(images, maps, module names)`` of the first ``num`` test queries of a scal checkpoint."""
    cfg, model, splits = load_for_eval(checkpoint, data_dir)
    if cfg.method != "scal":
        raise SystemExit(f"{checkpoint}: a {cfg.method} checkpoint, not scal")
    if not model.positions:
        raise SystemExit(f"{checkpoint}: model.attention is none (the backbone row): no attention maps to draw")
    model.eval()
    test = splits.test
    idx = torch.nonzero(test.targets[:, 2] == 1).squeeze(1)[:num]
    images = test.images[idx]
    return images, model.attention_maps(unit_float(images)).cpu(), [f"att{i}" for i in model.positions]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, help="NAME=PATH of a run folder or checkpoint")
    ap.add_argument("--data-dir", default=None, help="the data root (default: the run's data.data_dir)")
    ap.add_argument("--ckpt", default="best", choices=["best", "last"])
    ap.add_argument("--num", type=int, default=4, help="test queries to draw (default 4)")
    ap.add_argument("--vmin", type=float, default=None)
    ap.add_argument("--vmax", type=float, default=None)
    ap.add_argument("--out", required=True, help="the PNG to write (an existing file is not overwritten)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists: remove it or choose another --out")
    if (args.vmin is None) != (args.vmax is None):
        raise SystemExit("give both --vmin and --vmax, or neither")
    if args.num < 1:
        raise SystemExit(f"--num must be at least 1, got {args.num}")
    images, maps, names = None, {}, []
    for name, path in parse_runs(args.run).items():
        imgs, m, mods = query_maps(checkpoint_of(path, args.ckpt), args.data_dir, args.num)
        if images is not None and not torch.equal(images, imgs):
            raise SystemExit(f"--run {name}: its test queries differ from the first run's (another data split?)")
        images, maps[name] = imgs, m
        names = mods if len(mods) > len(names) else names
    vrange = None if args.vmin is None else (args.vmin, args.vmax)
    path = plot_attention_overlays(images, maps, out, names, vrange, title="scal attention on test queries")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
