"""Figures of what a sensor saw (matplotlib, no display needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from rlattention.vision.glimpse import locations_to_pixels


def _as_image(x: Tensor):
    x = x.detach().float().cpu()
    return x[0].numpy() if x.shape[0] == 1 else x.permute(1, 2, 0).clamp(0, 1).numpy()


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def _box_to_pixels(box: Tensor, H: int, W: int) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) normalised -> (left, top, width, height) in pixels."""
    x0, y0, x1, y1 = (float(v) for v in box)
    return (x0 + 1) * W / 2, (y0 + 1) * H / 2, (x1 - x0) * W / 2, (y1 - y0) * H / 2


def plot_glimpses(
    image: Tensor,
    locations: Tensor,
    patches: Tensor,
    sides: Sequence[float],
    path: Path,
    title: str = "",
    region: Tensor | None = None,
) -> Path:
    """Draw the glimpse path on the image and the multi-scale patches of every step.

    image ``(C, H, W)`` in [0, 1]; locations ``(T, 2)`` in [-1, 1]; patches ``(T, k, C, g, g)``;
    sides: the side in pixels of each scale's square; region: an optional box ``(4,)`` (normalised x0, y0,
    x1, y1), e.g. the top-down region the first glimpse was drawn from, drawn dashed. Writes a PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    T, k = patches.shape[:2]
    H, W = image.shape[-2:]
    fig = plt.figure(figsize=(3.2 + 1.3 * T, max(3.2, 1.3 * k + 0.6)))
    grid = fig.add_gridspec(k, T + 3)
    ax = fig.add_subplot(grid[:, :3])
    ax.imshow(_as_image(image), cmap="gray", vmin=0, vmax=1, extent=(0, W, H, 0))
    px = locations_to_pixels(locations.detach().float().cpu(), H, W).numpy()
    colours = plt.cm.viridis(torch.linspace(0, 1, T).numpy())
    ax.plot(px[:, 0], px[:, 1], "-", color="white", lw=1, alpha=0.7)
    if region is not None:
        left, top, w, h = _box_to_pixels(region.detach().cpu(), H, W)
        ax.add_patch(Rectangle((left, top), w, h, fill=False, edgecolor="red", lw=1.5, ls="--"))
    for t in range(T):
        for s, side in enumerate(sides):
            ax.add_patch(
                Rectangle(
                    (px[t, 0] - side / 2, px[t, 1] - side / 2),
                    side,
                    side,
                    fill=False,
                    edgecolor=colours[t],
                    lw=1.5 if s == 0 else 0.8,
                    alpha=1.0 if s == 0 else 0.6,
                )
            )
        ax.text(px[t, 0], px[t, 1], str(t + 1), color=colours[t], fontsize=8, ha="center", va="center")
    ax.set_xlim(-W * 0.1, W * 1.1)
    ax.set_ylim(H * 1.1, -H * 0.1)
    ax.set_title(title, fontsize=9)
    ax.axis("off")
    for t in range(T):
        for s in range(k):
            a = fig.add_subplot(grid[s, 3 + t])
            a.imshow(_as_image(patches[t, s]), cmap="gray", vmin=0, vmax=1)
            a.set_xticks([])
            a.set_yticks([])
            if s == 0:
                a.set_title(f"t={t + 1}", fontsize=8, color=colours[t])
            if t == 0:
                a.set_ylabel(f"x{sides[s] / sides[0]:g}", fontsize=8)
    return _save(fig, path)


def plot_region_q(
    image: Tensor, boxes: Sequence[Tensor], q: Sequence[Tensor], actions: Sequence[Tensor], path: Path
) -> Path:
    """One panel per pyramid level: the level's sub-regions on the image, each labelled with its Q-value, the
    chosen one highlighted. boxes ``[(A, 4)]``, q ``[(A,)]``, actions ``[()]`` per level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    H, W = image.shape[-2:]
    L = len(boxes)
    fig, axes = plt.subplots(1, L, figsize=(3.2 * L, 3.4), squeeze=False)
    for level, ax in enumerate(axes[0]):
        ax.imshow(_as_image(image), cmap="gray", vmin=0, vmax=1, extent=(0, W, H, 0))
        qv = q[level].detach().float().cpu()
        for a in range(len(qv)):
            left, top, w, h = _box_to_pixels(boxes[level][a].detach().cpu(), H, W)
            chosen = a == int(actions[level])
            ax.add_patch(
                Rectangle((left, top), w, h, fill=False, edgecolor="red" if chosen else "cyan", lw=2 if chosen else 1)
            )
            ax.text(left + w / 2, top + h / 2, f"{qv[a]:.2f}", color="yellow", ha="center", va="center", fontsize=8)
        ax.set_title(f"level {level}: Q per region", fontsize=9)
        ax.set_xlim(0, W)
        ax.set_ylim(H, 0)
        ax.axis("off")
    return _save(fig, path)


def plot_regions(image: Tensor, locations: Tensor, boxes: Tensor, path: Path, title: str = "") -> Path:
    """The attended locations ``(T, 2)`` and their anchor regions ``(T, k, 4)`` (normalised) on the image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    H, W = image.shape[-2:]
    T = locations.shape[0]
    fig, ax = plt.subplots(figsize=(4.2, 4.4))
    ax.imshow(_as_image(image), cmap="gray", vmin=0, vmax=1, extent=(0, W, H, 0))
    colours = plt.cm.viridis(torch.linspace(0, 1, T).numpy())
    px = locations_to_pixels(locations.detach().float().cpu(), H, W).numpy()
    for t in range(T):
        for box in boxes[t]:
            left, top, w, h = _box_to_pixels(box.detach().cpu(), H, W)
            ax.add_patch(Rectangle((left, top), w, h, fill=False, edgecolor=colours[t], lw=0.8, alpha=0.8))
        ax.text(px[t, 0], px[t, 1], str(t + 1), color=colours[t], fontsize=9, ha="center", va="center")
    ax.set_xlim(0, W)
    ax.set_ylim(H, 0)
    ax.set_title(title, fontsize=8)
    ax.axis("off")
    return _save(fig, path)


def step_colours(T: int):
    """T distinct colours, one per step (tab10 up to 10 steps, then a sampled rainbow)."""
    import matplotlib.pyplot as plt

    if T <= 10:
        return [plt.cm.tab10(t) for t in range(T)]
    return [plt.cm.gist_rainbow(t / max(1, T - 1)) for t in range(T)]


def plot_region_steps(
    images: Tensor,
    locations: Tensor,
    boxes: Tensor,
    titles: Sequence[str],
    path: Path,
    title_colours: Sequence[str] | None = None,
    suptitle: str = "",
    columns: int = 0,
) -> Path:
    """Several images, each with the regions attended at every step: thin boxes in one colour per step and the
    step's number at its centre, a legend of the step colours, one title per panel (e.g. true and predicted labels).

    images ``(N, C, H, W)`` in [0, 1]; locations ``(N, T, 2)`` in [-1, 1]; boxes ``(N, T, k, 4)`` normalised
    (x0, y0, x1, y1); titles: N strings; title_colours: N matplotlib colours (default black); columns: panels per
    row (0: ceil(sqrt(N)), at most 4). Writes a PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    N, T = locations.shape[:2]
    H, W = images.shape[-2:]
    cols = max(1, min(columns or min(4, math.ceil(math.sqrt(N))), N))
    rows = -(-N // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 3.3 * rows + 0.5), squeeze=False)
    colours = step_colours(T)
    for ax in axes.flat:
        ax.axis("off")
    for i in range(N):
        ax = axes.flat[i]
        ax.imshow(_as_image(images[i]), cmap="gray", vmin=0, vmax=1, extent=(0, W, H, 0))
        px = locations_to_pixels(locations[i].detach().float().cpu(), H, W).numpy()
        for t in range(T):
            for box in boxes[i, t]:
                left, top, w, h = _box_to_pixels(box.detach().cpu(), H, W)
                ax.add_patch(Rectangle((left, top), w, h, fill=False, edgecolor=colours[t], lw=0.6, alpha=0.9))
        for t in range(T):  # numbers last, on top of every box; a step at (nearly) an earlier step's centre is
            # labelled below it, so that a policy that revisits one place shows every step's number
            repeats = sum(1 for u in range(t) if abs(px[u] - px[t]).max() < 0.05 * max(H, W))
            ax.text(
                px[t, 0], px[t, 1] + repeats * 0.07 * H, str(t + 1), color="white", fontsize=7, ha="center",
                va="center", fontweight="bold",
                bbox=dict(boxstyle="round,pad=0.15", facecolor=colours[t], edgecolor="none", alpha=0.85),
            )  # fmt: skip
        ax.set_xlim(0, W)
        ax.set_ylim(H, 0)
        colour = title_colours[i] if title_colours else "black"
        ax.set_title(titles[i], fontsize=8, color=colour)
    handles = [Patch(facecolor="none", edgecolor=colours[t], label=f"step {t + 1}") for t in range(T)]
    fig.legend(handles=handles, loc="lower center", ncol=min(T, 10), fontsize=7, frameon=False)
    if suptitle:
        fig.suptitle(suptitle, fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return _save(fig, path)


def plot_completion_curves(curves: dict[str, Tensor], path: Path, ylabel: str = "ranking percentile", title: str = ""):
    """One line per method of a per-completion-step metric ``(S,)`` against the completion degree s/S
    (e.g. the DARP paper's figure 7, ranking percentile vs completion). Writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    for name, values in curves.items():
        v = values.detach().float().cpu()
        x = torch.arange(1, len(v) + 1, dtype=torch.float32) / len(v)
        ax.plot(x.numpy(), v.numpy(), marker="o", ms=3, label=name)
    ax.set_xlabel("completion degree of the sketch")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    return _save(fig, path)


#: The colour map of attention overlays: perceptually uniform, so equal steps of attention look equally different.
ATTENTION_CMAP = "viridis"


def attention_range(maps: Sequence[Tensor], vrange: tuple[float, float] | None = None) -> tuple[float, float]:
    """The one colour scale of a figure of attention maps: ``vrange`` if given (checked), else the smallest and
    largest value over all the maps (a degenerate range widened by 1e-6)."""
    if vrange is not None:
        lo, hi = (float(v) for v in vrange)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"vrange must be two finite numbers lo < hi, got {vrange!r}")
        return lo, hi
    values = [m.detach().float() for m in maps if m.numel()]
    if not values:
        return 0.0, 1.0
    lo = min(float(v.min()) for v in values)
    hi = max(float(v.max()) for v in values)
    return lo, max(hi, lo + 1e-6)


def plot_reid_ranking(
    query: Tensor,
    maps: Tensor,
    ranked: Tensor,
    correct: Sequence[bool],
    path: Path,
    title: str = "",
    module_names: Sequence[str] = (),
    vrange: tuple[float, float] | None = (0.0, 1.0),
) -> Path:
    """A re-identification query: the query image, its attention maps over it (one panel per module, all on one
    colour scale, ``vrange``, by default the attention's own range 0 to 1; ``None``: the maps' common min to max)
    with one colourbar, and the ranked gallery strip (green frame: same identity, red: another).

    query ``(C, H, W)`` (uint8 or float in [0, 1]); maps ``(M, H, W)`` in [0, 1]; ranked ``(K, C, H, W)``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def img(x: Tensor):
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        return _as_image(x)

    M, K = len(maps), len(ranked)
    lo, hi = attention_range(list(maps), vrange)
    cols = max(1 + M, K)
    fig, axes = plt.subplots(2, cols, figsize=(1.3 * cols, 3.2), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    cmap = "gray" if query.shape[0] == 1 else None
    axes[0, 0].imshow(img(query), cmap=cmap)
    axes[0, 0].set_title("query", fontsize=8)
    shown = None
    for m in range(M):  # every map on the same colour scale, so that panels compare
        a = maps[m].float().cpu()
        axes[0, 1 + m].imshow(img(query), cmap=cmap)
        shown = axes[0, 1 + m].imshow(a.numpy(), cmap=ATTENTION_CMAP, alpha=0.6, vmin=lo, vmax=hi)
        name = module_names[m] if m < len(module_names) else f"module {m}"
        axes[0, 1 + m].set_title(f"{name}\n{float(a.min()):.2f}-{float(a.max()):.2f}", fontsize=7)
    if shown is not None:
        bar = fig.colorbar(shown, ax=list(axes[0, 1 : 1 + M]), fraction=0.025, pad=0.02)
        bar.set_label("attention (channel mean)", fontsize=7)
        bar.ax.tick_params(labelsize=6)
    for k in range(K):
        ax = axes[1, k]
        ax.imshow(img(ranked[k]), cmap=cmap)
        ax.axis("on")
        ax.set_xticks([])
        ax.set_yticks([])
        for side in ax.spines.values():
            side.set_edgecolor("tab:green" if correct[k] else "tab:red")
            side.set_linewidth(3)
        ax.set_title(f"{k + 1}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def attention_overlay_figure(
    images: Tensor,
    maps: dict[str, Tensor],
    module_names: Sequence[str] = (),
    vrange: tuple[float, float] | None = None,
    title: str = "",
):
    """Attention maps of one or more models over the same images, every panel on one colour scale with one
    colourbar. ``images`` ``(N, C, H, W)`` (uint8 or float in [0, 1]); ``maps`` ``{model name: (N, M, H, W)}``
    (each model may have its own number of modules M); ``vrange`` the scale (``None``: the min to max over every
    map drawn). One row per image and model, the image first. Returns the matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if images.ndim != 4:
        raise ValueError(f"images must be (N, C, H, W), got {tuple(images.shape)}")
    if not maps:
        raise ValueError("attention_overlay_figure needs at least one model's maps")
    N = len(images)
    for name, m in maps.items():
        if m.ndim != 4 or len(m) != N or tuple(m.shape[-2:]) != tuple(images.shape[-2:]):
            raise ValueError(
                f"maps[{name!r}] must be (N={N}, M, H, W) with the images' H x W {tuple(images.shape[-2:])}, "
                f"got {tuple(m.shape)}"
            )
    lo, hi = attention_range([m for m in maps.values()], vrange)
    M = max(m.shape[1] for m in maps.values())
    rows = N * len(maps)
    fig, axes = plt.subplots(rows, 1 + M, figsize=(1.25 * (1 + M) + 0.8, 1.3 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    cmap = "gray" if images.shape[1] == 1 else None
    shown = None
    for n in range(N):
        x = images[n].float() / 255.0 if images.dtype == torch.uint8 else images[n].float()
        for j, (name, m) in enumerate(maps.items()):
            r = n * len(maps) + j
            axes[r, 0].imshow(_as_image(x), cmap=cmap)
            axes[r, 0].set_title(f"{name}, image {n}", fontsize=7)
            for k in range(m.shape[1]):
                a = m[n, k].detach().float().cpu()
                axes[r, 1 + k].imshow(_as_image(x), cmap=cmap)
                shown = axes[r, 1 + k].imshow(a.numpy(), cmap=ATTENTION_CMAP, alpha=0.6, vmin=lo, vmax=hi)
                label = module_names[k] if k < len(module_names) else f"module {k}"
                axes[r, 1 + k].set_title(f"{label} {float(a.min()):.2f}-{float(a.max()):.2f}", fontsize=6)
    bar = fig.colorbar(shown, ax=axes.ravel().tolist(), fraction=0.02, pad=0.01)
    bar.set_label(f"attention (channel mean), one scale {lo:.2f} to {hi:.2f}", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def plot_attention_overlays(
    images: Tensor,
    maps: dict[str, Tensor],
    path: Path,
    module_names: Sequence[str] = (),
    vrange: tuple[float, float] | None = None,
    title: str = "",
) -> Path:
    """:func:`attention_overlay_figure` saved to ``path``."""
    return _save(attention_overlay_figure(images, maps, module_names, vrange, title), path)
