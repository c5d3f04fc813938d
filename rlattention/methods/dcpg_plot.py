"""DCPG's attention figures (:meth:`rlattention.methods.dcpg.DCPG.visualize`): per item, the region boxes shaded
by their attention (the mean over heads and each head), and bars of the region and word attention."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _feature_boxes(regions: np.ndarray, tol: float = 1e-3) -> np.ndarray | None:
    """Region boxes ``(B, R, 4)`` ``(x0, y0, x1, y1)`` in [0, 1] from the features, or ``None``.

    Layout relied on (digit scenes, :mod:`rlattention.data.synthetic.digit_scenes`): each region's features end with its
    box geometry ``(x0, y0, x1, y1, area)`` divided by the canvas side. The layout is accepted only when every
    region of every item satisfies ``0 <= x0 < x1 <= 1``, ``0 <= y0 < y1 <= 1`` and ``area = (x1 - x0)(y1 - y0)``
    within ``tol`` (bottom-up features of real datasets carry no geometry and fail this)."""
    if regions.ndim != 3 or regions.shape[-1] < 6:
        return None
    x0, y0, x1, y1, area = np.moveaxis(regions[..., -5:].astype(np.float64), -1, 0)
    ok = (x0 >= -tol) & (y0 >= -tol) & (x1 <= 1 + tol) & (y1 <= 1 + tol) & (x0 < x1) & (y0 < y1)
    ok &= np.abs(area - (x1 - x0) * (y1 - y0)) <= tol
    return np.clip(regions[..., -5:-1], 0.0, 1.0).astype(np.float32) if bool(ok.all()) else None


def caption_and_region_names(words: Sequence[str], num_regions: int, digits=(), sep: str = " ") -> tuple[str, list]:
    """The caption without its ``<start>``/``<end>`` markers, and a name per region: its index, followed (after
    ``sep``) by the colour and label of the scene digit drawn in it (``digits``: a scene's digits, each with
    ``region``, ``colour`` and ``label``)."""
    caption = " ".join(w for w in words if not (w.startswith("<") and w.endswith(">")))
    names = [str(k) for k in range(num_regions)]
    for d in digits:
        if 0 <= d.region < num_regions:
            names[d.region] = f"{d.region}{sep}{d.colour} {d.label}"
    return caption, names


def _scale(weights: np.ndarray):
    """A colour normalisation spanning ``weights`` (at least 1e-3 wide: with ``bin_map: logistic`` the
    deterministic attention sigmoid(mu) lies within [0.62, 0.68], so a fixed 0..1 scale would show no
    difference)."""
    from matplotlib.colors import Normalize

    lo, hi = (float(weights.min()), float(weights.max())) if weights.size else (0.0, 1.0)
    pad = max(0.0, 1e-3 - (hi - lo)) / 2
    return Normalize(lo - pad, hi + pad)


def _draw_regions(ax, scene: np.ndarray | None, boxes: np.ndarray, weights: np.ndarray, cmap, norm) -> None:
    """Boxes (normalised) shaded by their weight, the most attended on top and drawn thicker, labelled with their
    index, on the uint8 ``(3, H, W)`` scene or a black square."""
    from matplotlib.patches import Rectangle

    if scene is not None:
        side_y, side_x = scene.shape[-2:]
        ax.imshow(np.transpose(scene, (1, 2, 0)), extent=(0, side_x, side_y, 0))
    else:
        side_y = side_x = 100
        ax.add_patch(Rectangle((0, 0), side_x, side_y, facecolor="black"))
    for k in np.argsort(weights, kind="stable"):
        level = float(np.clip(norm(weights[k]), 0.0, 1.0))
        colour = cmap(level)
        x0, y0, x1, y1 = (float(v) for v in boxes[k] * np.array([side_x, side_y, side_x, side_y]))
        ax.add_patch(
            Rectangle(
                (x0, y0),
                x1 - x0,
                y1 - y0,
                facecolor=(*colour[:3], 0.1 + 0.35 * level),
                edgecolor=colour,
                lw=0.6 + 2.4 * level,
            )
        )
        ax.text(
            x0 + 0.5,
            y0 + 0.5,
            str(k),
            color="black" if level > 0.6 else "white",
            fontsize=6,
            ha="left",
            va="top",
            bbox={"facecolor": colour, "alpha": 0.85, "pad": 0.8, "linewidth": 0},
        )
    ax.set_xlim(0, side_x)
    ax.set_ylim(side_y, 0)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])


def _attention_bars(ax, labels: list[str], heads: np.ndarray, cmap, norm, ylabel: str) -> None:
    """Bars: the mean over heads, coloured by its value; markers: each head (when there are several). The y
    axis spans the weights' range (``norm``), so the bars show differences, not the absolute level."""
    mean = heads.mean(-1)
    x = np.arange(len(mean))
    H = heads.shape[-1]
    span = norm.vmax - norm.vmin
    bottom = norm.vmin - 0.15 * span
    colours = cmap(np.clip(norm(mean), 0.0, 1.0))
    label = "mean over heads" if H > 1 else None
    ax.bar(x, mean - bottom, bottom=bottom, color=colours, edgecolor="black", linewidth=0.5, label=label)
    for xi, m in zip(x, mean, strict=True):
        ax.text(xi, m + 0.03 * span, f"{m:.3f}", ha="center", va="bottom", fontsize=6)
    if H > 1:
        for h, marker in zip(range(H), itertools.cycle("os^vD<>"), strict=False):
            ax.scatter(x, heads[:, h], marker=marker, s=16, zorder=3, color=f"C{h % 10}", label=f"head {h + 1}")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    long = max((len(s) for s in labels), default=0) > 3 and len(labels) > 8
    ax.set_xticks(x, labels, fontsize=7, rotation=45 if long else 0, ha="right" if long else "center")
    ax.set_xlim(-0.6, len(mean) - 0.4)
    ax.set_ylim(bottom, norm.vmax + 0.25 * span)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="y", alpha=0.3)


def _plot_attention(
    path: Path,
    title: str,
    scene: np.ndarray | None,
    boxes: np.ndarray | None,
    region_names: list[str],
    region_heads: np.ndarray,
    words: list[str],
    word_heads: np.ndarray,
    note: str,
) -> Path:
    """One item's figure: [region boxes: mean, head 1, ...] / region bars / word bars. Writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    from matplotlib.cm import ScalarMappable

    cmap = plt.get_cmap("viridis")
    region_norm, word_norm = _scale(region_heads), _scale(word_heads)
    H = region_heads.shape[-1]
    panels = [("mean over heads (applied)" if H > 1 else "region attention", region_heads.mean(-1))]
    if H > 1:
        panels += [(f"head {h + 1}", region_heads[:, h]) for h in range(H)]
    if boxes is None:
        panels = []
    ratios = ([3.0] if panels else []) + [1.7, 1.7]
    cols = max(1, len(panels))
    width = max(3.0 * cols + 1.0, 0.5 * len(words) + 2.0, 0.75 * len(region_names) + 2.0, 6.5)
    fig = plt.figure(figsize=(width, sum(ratios) + 1.3), layout="constrained")
    grid = fig.add_gridspec(len(ratios), cols, height_ratios=ratios)
    if panels:
        axes = [fig.add_subplot(grid[0, c]) for c in range(cols)]
        for ax, (name, weights) in zip(axes, panels, strict=True):
            norm = _scale(weights)  # each panel its own scale: which regions this head prefers
            _draw_regions(ax, scene, boxes, weights, cmap, norm)  # type: ignore[arg-type]
            ax.set_title(name, fontsize=8)
            bar = fig.colorbar(
                ScalarMappable(norm, cmap), cax=ax.inset_axes([0.1, -0.08, 0.8, 0.04]), orientation="horizontal"
            )
            bar.ax.tick_params(labelsize=6)
            bar.ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(3))
    _attention_bars(fig.add_subplot(grid[-2, :]), region_names, region_heads, cmap, region_norm, "region attention")
    _attention_bars(fig.add_subplot(grid[-1, :]), words, word_heads, cmap, word_norm, "word attention")
    scales = "each box panel has its own colour scale; bar axes span the weights of all heads"
    fig.suptitle(f"{title}\n{note}; {scales}", fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
