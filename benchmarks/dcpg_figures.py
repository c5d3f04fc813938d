"""Figures of DCPG runs: the in-batch reward over training, and the attention figures of their checkpoints.

Reward curve. ``fit`` logs, every ``trainer.log_every`` steps, the mean over those steps of the loss, of every loss
term and of every ``StepOutput.stats`` entry as ``train/<name>``; for ``method: dcpg`` with a policy the stats are
``reward`` (the in-batch reward of eq. 9, mean of the image-query and caption-query rewards; r1+ap lies in [0, 2]),
``reward_image`` (image queries only) and ``batch_r1``; validation logs ``val/<metric>`` (``val/rsum`` ...) once per
epoch. They are read from ``<run>/logs/metrics.csv`` (Lightning's CSV logger: a ``step`` column and one column per
key, blank where a row lacks it; Lightning may hold it back until training ends) or, while the run is still training
(no ``metrics.csv`` yet), from the TensorBoard events in ``<run>/tb``. A resumed run may log a step twice: the last
value counts. The figure has one panel of the training keys (``--key``, default ``train/reward``; faint: as logged,
solid: a centred moving average over ``--smooth`` points) and, when a run logged it, one panel of ``--val-key``
(default ``val/rsum``). Runs without a key (the ``model.pg: none`` baselines have no reward) are left out of that
panel with a note.

Attention figures (``--viz``): each run's ``checkpoints/best.ckpt`` (``--ckpt last``: ``last.ckpt``) and every
``--checkpoint FILE`` is loaded like ``rlattention viz`` does, and :meth:`DCPG.visualize` draws the first
caption of each of the first ``--num-images`` images of ``--split``, into ``--viz-out`` (default
``<run>/figures``; ``dcpg_attention_<item>.png``). The rendered digit scenes are looked up in the run's
``data.render_cache``. A baseline checkpoint (``model.pg: none``) has no attention: it is reported and skipped.

    python benchmarks/dcpg_figures.py /tmp/t4/runs/dcpg_digit_scenes /tmp/t4/runs/dcpg_digit_scenes_baseline \\
        --out benchmarks/results/dcpg_reward.png
    python benchmarks/dcpg_figures.py dcpg=/tmp/t4/runs/dcpg_digit_scenes \\
        discrete=/tmp/t4/runs/dcpg_digit_scenes_discrete \\
        --key train/reward --key train/reward_image --smooth 10 --out /tmp/dcpg_reward.png
    python benchmarks/dcpg_figures.py /tmp/t4/runs/dcpg_digit_scenes --out /tmp/dcpg_reward.png \\
        --viz --data-dir ../shared/data/mnist --num-images 4 --viz-out /tmp/dcpg_attention
    python benchmarks/dcpg_figures.py --checkpoint runs/dcpg_digit_scenes/checkpoints/best.ckpt \\
        --data-dir ../shared/data/mnist

A run is a folder or ``LABEL=FOLDER`` (the label names it in the legend; default: the folder's name). Without
``--out`` the curve goes to ``<first run>/figures/dcpg_reward.png``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np


def read_metric(run: str | Path, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of ``key`` logged by the run in folder ``run``, in step order (one value per step, the
    last one logged). From ``logs/metrics.csv``, else the TensorBoard events in ``tb/``; empty arrays when the run
    never logged ``key``. Raises ``FileNotFoundError`` when the run has neither."""
    run = Path(run)
    csv_path = run / "logs" / "metrics.csv"
    by_step: dict[int, float] = {}
    if csv_path.is_file():
        with open(csv_path, newline="") as f:
            for row in csv.DictReader(f):
                text = (row.get(key) or "").strip()
                step = (row.get("step") or "").strip()
                if text and step:
                    by_step[int(float(step))] = float(text)
    elif (run / "tb").is_dir() and any((run / "tb").glob("events.out.tfevents.*")):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
        events.Reload()
        if key in events.Tags().get("scalars", []):
            for event in events.Scalars(key):
                by_step[int(event.step)] = float(event.value)
    else:
        raise FileNotFoundError(
            f"{run}: no logs/metrics.csv and no TensorBoard events in tb/ (not a run folder, or nothing logged yet)"
        )
    steps = np.array(sorted(by_step), dtype=np.int64)
    return steps, np.array([by_step[s] for s in steps.tolist()], dtype=np.float64)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Centred mean over ``window`` points (fewer at both ends, where the window is cut), same length as
    ``values``; ``window <= 1``: the values themselves."""
    n = len(values)
    if window <= 1 or n == 0:
        return values.astype(np.float64)
    sums = np.cumsum(np.concatenate(([0.0], values.astype(np.float64))))
    starts = np.clip(np.arange(n) - window // 2, 0, n)
    ends = np.clip(np.arange(n) - window // 2 + window, 0, n)
    return (sums[ends] - sums[starts]) / (ends - starts)


def parse_runs(specs: Sequence[str]) -> dict[str, Path]:
    """``FOLDER`` or ``LABEL=FOLDER`` -> ``{label: folder}`` (labels made unique)."""
    runs: dict[str, Path] = {}
    for spec in specs:
        label, sep, folder = spec.partition("=")
        if not sep or not label or "/" in label:  # a plain folder (which may itself contain "=")
            label, folder = Path(spec).name or spec, spec
        base, n = label, 2
        while label in runs:
            label, n = f"{base} ({n})", n + 1
        runs[label] = Path(folder)
    return runs


def plot_reward_curves(
    runs: Mapping[str, str | Path] | Sequence[str | Path],
    out: str | Path,
    keys: Sequence[str] = ("train/reward",),
    smooth: int = 5,
    val_key: str | None = "val/rsum",
) -> Path:
    """Plot ``keys`` of every run against the training step (and ``val_key`` in a second panel when logged) into
    the PNG ``out``. runs: ``{label: folder}`` or folders. Returns ``out``. Raises ``ValueError`` when no run
    logged any of ``keys``, ``FileNotFoundError`` for a folder without logs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not isinstance(runs, Mapping):
        runs = {Path(r).name: Path(r) for r in runs}
    curves = {(label, key): read_metric(folder, key) for label, folder in runs.items() for key in keys}
    if not any(len(s) for s, _ in curves.values()):
        raise ValueError(
            f"none of the runs ({', '.join(map(str, runs.values()))}) logged {', '.join(keys)} (baselines with "
            "model.pg=none have no reward; dcpg logs train/reward every trainer.log_every steps)"
        )
    vals = {label: read_metric(folder, val_key) for label, folder in runs.items()} if val_key else {}
    vals = {label: c for label, c in vals.items() if len(c[0])}
    fig, axes = plt.subplots(2 if vals else 1, 1, figsize=(7.5, 6.4 if vals else 4.0), squeeze=False)
    ax = axes[0, 0]
    styles = ["-", "--", ":", "-."]
    missing = []
    for r, label in enumerate(runs):
        colour = f"C{r % 10}"
        for k, key in enumerate(keys):
            steps, values = curves[label, key]
            if not len(steps):
                missing.append(f"{label}: no {key}")
                continue
            ax.plot(steps, values, color=colour, alpha=0.25, lw=0.8)
            name = label if len(keys) == 1 else f"{label}: {key}"
            ax.plot(steps, moving_average(values, smooth), color=colour, ls=styles[k % len(styles)], lw=1.6, label=name)
    ax.set_xlabel("training step")
    ax.set_ylabel(keys[0] if len(keys) == 1 else "logged value")
    title = "in-batch reward (eq. 9) during training"
    if smooth > 1:
        title += f"; solid: centred moving average of {smooth} logged points"
    if missing:
        title += "\nnot logged: " + "; ".join(missing)
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if vals:
        ax = axes[1, 0]
        for r, label in enumerate(runs):
            if label in vals:
                steps, values = vals[label]
                ax.plot(steps, values, marker="o", ms=3, color=f"C{r % 10}", label=label)
        ax.set_xlabel("training step")
        ax.set_ylabel(val_key)
        ax.set_title(f"validation ({val_key}, once per epoch)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def first_caption_items(image_ids: Sequence[int], num_images: int) -> list[int]:
    """The index of the first caption of each of the first ``num_images`` distinct images."""
    seen: dict[int, int] = {}
    for index, image in enumerate(image_ids):
        if len(seen) >= num_images:
            break
        seen.setdefault(int(image), index)
    return list(seen.values())


def write_attention_figures(
    checkpoint: str | Path,
    out_dir: str | Path,
    data_dir: str | None = None,
    split: str = "test",
    num_images: int = 4,
) -> list[Path]:
    """The :meth:`DCPG.visualize` figures of a checkpoint (as ``rlattention viz`` loads it) for the first caption
    of each of the first ``num_images`` images of ``split``; returns the paths. Raises
    ``rlattention.methods.dcpg.NoAttentionPolicyError`` for a ``model.pg: none`` checkpoint."""
    from rlattention.data.strokes import resolve_cache_dir
    from rlattention.engine.trainer import load_for_eval

    cfg, model, splits = load_for_eval(checkpoint, data_dir)
    if cfg.method != "dcpg":
        raise ValueError(f"{checkpoint}: a {cfg.method} checkpoint, not dcpg (use `rlattention viz` for it)")
    model.eval()
    cache = resolve_cache_dir(getattr(cfg.data, "render_cache", None))
    if cache is not None:
        model.scene_roots = (cache,)  # where the run's digit scenes were generated
    ds = getattr(splits, split)
    items = first_caption_items(ds.targets[:, 0].tolist(), num_images)
    import torch

    index = torch.tensor(items, dtype=torch.int64)
    return model.visualize(ds.images[index], ds.targets[index], Path(out_dir))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", metavar="[LABEL=]RUN_DIR", help="run folders (<out_dir>/<run_name>)")
    ap.add_argument("--out", help="reward-curve PNG (default: <first run>/figures/dcpg_reward.png)")
    ap.add_argument("--key", action="append", help="logged training key(s) to plot (default: train/reward)")
    ap.add_argument("--val-key", default="val/rsum", help="validation key of the second panel ('' for none)")
    ap.add_argument("--smooth", type=int, default=5, help="moving-average window in logged points (1: none)")
    ap.add_argument("--viz", action="store_true", help="also write the attention figures of each run's checkpoint")
    ap.add_argument("--ckpt", default="best", choices=["best", "last"], help="--viz: which checkpoint of a run")
    ap.add_argument("--checkpoint", action="append", default=[], help="attention figures of this checkpoint file")
    ap.add_argument("--data-dir", help="dataset folder (digit_scenes: the MNIST folder), as for rlattention viz")
    ap.add_argument("--split", default="test", choices=["test", "val", "train"])
    ap.add_argument("--num-images", type=int, default=4, help="figures: first caption of this many images")
    ap.add_argument("--viz-out", help="attention-figure folder (default: <run>/figures)")
    args = ap.parse_args(argv)
    if not args.runs and not args.checkpoint:
        ap.error("give run folders (reward curve) and/or --checkpoint files (attention figures)")
    runs = parse_runs(args.runs)
    if runs:
        out = Path(args.out) if args.out else next(iter(runs.values())) / "figures" / "dcpg_reward.png"
        print(plot_reward_curves(runs, out, args.key or ["train/reward"], args.smooth, args.val_key or None))
    checkpoints = [Path(c) for c in args.checkpoint]
    if args.viz:
        checkpoints += [folder / "checkpoints" / f"{args.ckpt}.ckpt" for folder in runs.values()]
    if not checkpoints:
        return 0
    from rlattention.engine.checkpoint import CheckpointError
    from rlattention.methods.dcpg import NoAttentionPolicyError

    status = 0
    for ckpt in checkpoints:
        out_dir = Path(args.viz_out) if args.viz_out else ckpt.parent.parent / "figures"
        if len(checkpoints) > 1 and args.viz_out:
            out_dir = out_dir / ckpt.parent.parent.name
        try:
            for path in write_attention_figures(ckpt, out_dir, args.data_dir, args.split, args.num_images):
                print(path)
        except NoAttentionPolicyError as e:
            print(f"{ckpt}: skipped: {e}", file=sys.stderr)
        except (CheckpointError, FileNotFoundError, ValueError) as e:
            print(f"{ckpt}: error: {e}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
