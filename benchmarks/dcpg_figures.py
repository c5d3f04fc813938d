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

Attention over regions and words on one scale (``--viz``/``--checkpoint``, ``--kind pairs`` or ``both``): one figure
per checkpoint, ``dcpg_attention_pairs.png``, with one row per pair (the first caption of each of the first
``--num-images`` images): the scene with its region boxes coloured by their weight, the region weights and the word
weights as cells, each cell printed with its value. Every weight is the deterministic attention applied to the
features (mean actions, mean over heads, eq. 11), a number in (0, 1), drawn on one fixed colour scale from 0 to 1
(the same in every panel and every row, so that figures of different runs compare) with one colourbar.

    python benchmarks/dcpg_figures.py /tmp/t4/runs/dcpg_digit_scenes /tmp/t4/runs/dcpg_digit_scenes_baseline \\
        --out benchmarks/results/dcpg_reward.png
    python benchmarks/dcpg_figures.py dcpg=/tmp/t4/runs/dcpg_digit_scenes \\
        discrete=/tmp/t4/runs/dcpg_digit_scenes_discrete \\
        --key train/reward --key train/reward_image --smooth 10 --out /tmp/dcpg_reward.png
    python benchmarks/dcpg_figures.py /tmp/t4/runs/dcpg_digit_scenes --out /tmp/dcpg_reward.png \\
        --viz --data-dir ../shared/data/mnist --num-images 4 --viz-out /tmp/dcpg_attention
    python benchmarks/dcpg_figures.py --checkpoint runs/dcpg_digit_scenes/checkpoints/best.ckpt \\
        --data-dir ../shared/data/mnist
    python benchmarks/dcpg_figures.py --checkpoint runs/dcpg_digit_scenes/checkpoints/best.ckpt \\
        --data-dir ../shared/data/mnist --kind pairs --num-images 4 --viz-out docs/figures

A run is a folder or ``LABEL=FOLDER`` (the label names it in the legend; default: the folder's name). Without
``--out`` the curve goes to ``<first run>/figures/dcpg_reward.png``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


def load_dcpg(checkpoint: str | Path, data_dir: str | None = None):
    """``(model, splits)`` of a dcpg checkpoint, as ``rlattention viz`` loads it, in eval mode, with the run's
    rendered scenes looked up in its ``data.render_cache``."""
    from rlattention.data.cache import resolve_cache_dir
    from rlattention.engine.trainer import load_for_eval

    cfg, model, splits = load_for_eval(checkpoint, data_dir)
    if cfg.method != "dcpg":
        raise ValueError(f"{checkpoint}: a {cfg.method} checkpoint, not dcpg (use `rlattention viz` for it)")
    model.eval()
    cache = resolve_cache_dir(getattr(cfg.data, "render_cache", None))
    if cache is not None:
        model.scene_roots = (cache,)  # where the run's digit scenes were generated
    return model, splits


def _first_pairs(splits, split: str, num_images: int):
    """``(images, targets)`` of the first caption of each of the first ``num_images`` images of ``split``."""
    import torch

    ds = getattr(splits, split)
    items = first_caption_items(ds.targets[:, 0].tolist(), num_images)
    index = torch.tensor(items, dtype=torch.int64)
    return ds.images[index], ds.targets[index]


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
    model, splits = load_dcpg(checkpoint, data_dir)
    images, targets = _first_pairs(splits, split, num_images)
    return model.visualize(images, targets, Path(out_dir))


@dataclass
class PairAttention:
    """The attention of one image-caption pair, as :func:`attention_pairs_figure` draws it."""

    label: str  # e.g. "image 3"
    caption: str  # e.g. "a red seven left of a small blue two" (the tokens without <start>, <end>)
    region_names: list[str]  # (R,) e.g. "2: red 7" for a digit box, "4" for a distractor
    region_attention: np.ndarray  # (R,) in (0, 1), the weights applied to the region features
    words: list[str]  # (L,) the caption's tokens, <start> and <end> included, padding dropped
    word_attention: np.ndarray  # (L,) in (0, 1)
    scene: np.ndarray | None = None  # uint8 (3, H, W), the rendered scene when found
    boxes: np.ndarray | None = None  # (R, 4) (x0, y0, x1, y1) in [0, 1], in region order, when known


def attention_pairs(model, images, targets) -> list[PairAttention]:
    """The deterministic attention (mean actions; the mean over heads, i.e. the weights of eq. 11) of a dcpg
    ``model`` on pairs: images ``(B, 1, R, F)`` region features, targets ``(B, 1 + L)`` (image index, tokens).
    The scenes are looked up in ``model.scene_roots`` (digit scenes); without them the boxes come from the
    features' geometry when they carry one. Raises ``NoAttentionPolicyError`` for ``model.pg: none``."""
    import torch

    from rlattention.data.synthetic.digit_scenes import find_scene_images
    from rlattention.methods.dcpg import NoAttentionPolicyError, _feature_boxes, caption_and_region_names

    if model.image_policy is None:
        raise NoAttentionPolicyError("dcpg with model.pg=none has no attention policy: no attention to draw")
    with torch.no_grad():
        region_att, word_att = model.attention(images, targets)
    regions = (images.flatten(1, -2) if images.ndim == 4 else images).detach().float().cpu()
    ids = targets[:, 0].cpu()
    scenes = find_scene_images(regions, ids, list(model.scene_roots) or None)
    boxes = scenes.boxes if scenes is not None else _feature_boxes(regions.numpy())
    pairs = []
    for i in range(len(targets)):
        tokens = targets[i, 1:]
        keep = tokens != 0
        words = model._words(tokens[keep].tolist())
        digits = scenes.digits[i] if scenes is not None else ()
        caption, names = caption_and_region_names(words, regions.shape[1], digits, ": ")
        pairs.append(
            PairAttention(
                label=f"image {int(ids[i])}",
                caption=caption,
                region_names=names,
                region_attention=region_att[i].float().cpu().numpy(),
                words=words,
                word_attention=word_att[i][keep].float().cpu().numpy(),
                scene=np.asarray(scenes.images[i]) if scenes is not None else None,
                boxes=np.asarray(boxes[i]) if boxes is not None else None,
            )
        )
    return pairs


#: The colour scale of every attention panel: the weights are in (0, 1).
ATTENTION_RANGE = (0.0, 1.0)


def _cells(ax, values: np.ndarray, labels: Sequence[str], width: int, cmap, norm, title: str) -> None:
    """One row of cells coloured by ``values`` on ``norm`` (``width`` cells; the ones past the values are
    blank), each printed with its value and labelled below."""
    row = np.full((1, width), np.nan)
    row[0, : len(values)] = values
    ax.imshow(np.ma.masked_invalid(row), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    for x, v in enumerate(values):
        ax.text(x, 0, f"{v:.2f}", ha="center", va="center", fontsize=7, color="black" if norm(v) > 0.6 else "white")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
    ax.set_xlim(-0.5, width - 0.5)
    ax.set_yticks([])
    ax.set_title(title, fontsize=8, loc="left")


def attention_pairs_figure(pairs: Sequence[PairAttention], title: str = ""):
    """A matplotlib figure of ``pairs``, one row each: [scene with boxes] | region cells | word cells, all on
    one colour scale fixed to (0, 1) (``ATTENTION_RANGE``, viridis), with one colourbar. Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    if not pairs:
        raise ValueError("no pairs to draw")
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    norm = Normalize(*ATTENTION_RANGE)
    R = max(len(p.region_attention) for p in pairs)
    L = max(len(p.word_attention) for p in pairs)
    with_scene = any(p.boxes is not None for p in pairs)
    ratios = ([2.2] if with_scene else []) + [max(R, 2) * 0.55, max(L, 2) * 0.55]
    row_height = 2.3 if with_scene else 1.3
    fig = plt.figure(figsize=(sum(ratios) + 1.6, row_height * len(pairs) + 0.8), layout="constrained")
    grid = fig.add_gridspec(len(pairs), len(ratios), width_ratios=ratios)
    axes = []
    for r, pair in enumerate(pairs):
        c = 0
        if with_scene:
            ax = fig.add_subplot(grid[r, 0])
            axes.append(ax)
            if pair.scene is not None:
                h, w = pair.scene.shape[-2:]
                ax.imshow(np.transpose(pair.scene, (1, 2, 0)), extent=(0, w, h, 0))
            else:
                h = w = 100
                ax.add_patch(Rectangle((0, 0), w, h, facecolor="black"))
            if pair.boxes is not None:
                for k in np.argsort(pair.region_attention, kind="stable"):  # the most attended on top
                    x0, y0, x1, y1 = (float(v) for v in pair.boxes[k] * np.array([w, h, w, h]))
                    colour = cmap(norm(pair.region_attention[k]))
                    ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=colour, lw=2.0))
                    ax.text(x0 + 1, y0 + 1, str(k), color="white", fontsize=6, ha="left", va="top")
            ax.set_xlim(0, w)
            ax.set_ylim(h, 0)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(pair.label, fontsize=8, loc="left")
            c = 1
        region_title = "regions" if with_scene else f"{pair.label}: regions"
        ax = fig.add_subplot(grid[r, c])
        axes.append(ax)
        _cells(ax, pair.region_attention, pair.region_names, R, cmap, norm, region_title)
        ax = fig.add_subplot(grid[r, c + 1])
        axes.append(ax)
        _cells(ax, pair.word_attention, pair.words, L, cmap, norm, f'words of "{pair.caption}"')
    bar = fig.colorbar(ScalarMappable(norm, cmap), ax=axes, shrink=0.8, pad=0.01)
    bar.set_label("attention Att (mean over heads), fixed scale 0 to 1", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def plot_attention_pairs(pairs: Sequence[PairAttention], out: str | Path, title: str = "") -> Path:
    """:func:`attention_pairs_figure` saved as the PNG ``out``; returns ``out``."""
    import matplotlib.pyplot as plt

    fig = attention_pairs_figure(pairs, title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write_attention_pairs(
    checkpoint: str | Path,
    out: str | Path,
    data_dir: str | None = None,
    split: str = "test",
    num_images: int = 4,
) -> Path:
    """The one-scale pairs figure (:func:`attention_pairs_figure`) of a checkpoint, for the first caption of each
    of the first ``num_images`` images of ``split``, into the PNG ``out``."""
    model, splits = load_dcpg(checkpoint, data_dir)
    images, targets = _first_pairs(splits, split, num_images)
    return plot_attention_pairs(attention_pairs(model, images, targets), out, _pairs_title(model, checkpoint, split))


def _pairs_title(model, checkpoint: str | Path, split: str) -> str:
    cfg = model.cfg
    return (
        f"DCPG attention on {split} pairs ({Path(checkpoint).parent.parent.name}: pg={cfg.pg}, {cfg.heads} "
        f"head{'s' if cfg.heads > 1 else ''}, lambda={cfg.lam:g}{', noise-matched' if cfg.noise_matched else ''}; "
        "mean actions)"
    )


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
    ap.add_argument(
        "--kind",
        default="both",
        choices=["pairs", "items", "both"],
        help="attention figures: pairs (one figure, fixed 0-1 scale), items (one per pair, DCPG.visualize), both",
    )
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
            model, splits = load_dcpg(ckpt, args.data_dir)  # loaded once for both kinds
            images, targets = _first_pairs(splits, args.split, args.num_images)
            if args.kind in ("pairs", "both"):
                pairs = attention_pairs(model, images, targets)
                out = out_dir / "dcpg_attention_pairs.png"
                print(plot_attention_pairs(pairs, out, _pairs_title(model, ckpt, args.split)))
            if args.kind in ("items", "both"):
                for path in model.visualize(images, targets, out_dir):
                    print(path)
        except NoAttentionPolicyError as e:
            print(f"{ckpt}: skipped: {e}", file=sys.stderr)
        except (CheckpointError, FileNotFoundError, ValueError) as e:
            print(f"{ckpt}: error: {e}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
