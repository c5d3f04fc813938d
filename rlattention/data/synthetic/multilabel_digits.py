"""Multi-label digit canvases: a CPU-sized stand-in for multi-label photo benchmarks (VOC, COCO); the
``multilabel_digits`` dataset.

Each canvas holds 2 to 4 real digits of *distinct* classes, each scaled by its own random factor and placed
at a random position; the label of the canvas is the set of digit classes drawn, as a multi-hot vector over
the 10 classes. Optional clutter (small fragments cut from random digits) adds distractors.

Layout (grid with jitter): the canvas is divided into a ``g x g`` grid of cells, ``g = ceil(sqrt(max
digits))`` (2 x 2 for up to 4 digits) unless ``grid_cells`` asks for a finer grid; each digit of a canvas gets
its own randomly chosen cell and a uniformly random position inside it. A digit that fits in its cell (side <=
canvas / g, e.g. up to 64 px on the default 128 canvas, while 28 px digits scaled by at most 2 are 56 px) never
overlaps another digit; a larger one is centred on its cell and clamped into the canvas, so overlaps stay bounded
by the excess.
Digit pixels combine with ``max``.

The cluttered task of the rarl study (``configs/rarl_clutter.yaml``, :data:`CLUTTER_TASK`) is this generator with
small digits on a large canvas, where where-to-look matters: 128 x 128, 1 to 4 digits of 14-28 px on a 4 x 4 grid
of 32 px cells (so digits never overlap and may sit in any of 16 places), and 16 fragments of 8 px cut from digits
shrunk to 21 px (the digits' mean size, so fragments have the digits' stroke width) as clutter.

Everything is batched over canvases: one resize (``torch.nn.functional.interpolate``) per distinct digit
size and a gather/``scatter_reduce`` paste into the flattened canvases; Python loops only run over the few
digit sizes, the clutter fragments and fixed-size chunks that bound the index memory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from rlattention.data.base import ArrayDataset, DataSplits, check_digit_images
from rlattention.data.limits import check_side
from rlattention.data.readers.mnist import load_mnist
from rlattention.data.registry import register_dataset
from rlattention.data.splits import split_seed, train_val_split

__all__ = ["CLUTTER_TASK", "NUM_CLASSES", "build_multilabel_digits", "make_multilabel_digits"]

#: Digit classes 0..9; targets are ``(n, NUM_CLASSES)`` multi-hot.
NUM_CLASSES = 10

#: The cluttered multi-label task (``configs/rarl_clutter.yaml`` writes the same values as ``data.*`` keys):
#: arguments of :func:`make_multilabel_digits`, with the config key of each in the comment.
CLUTTER_TASK: dict = dict(
    canvas=128,  # data.canvas_size
    min_digits=1,  # data.digits_per_canvas[0]
    max_digits=4,  # data.digits_per_canvas[1]
    scale_range=(0.5, 1.0),  # data.scale_range: 14-28 px MNIST digits
    grid_cells=4,  # data.layout_grid: 4 x 4 cells of 32 px, one digit per cell
    num_clutter=16,  # data.num_clutter
    clutter_size=8,  # data.clutter_size
    clutter_scale=0.75,  # data.clutter_scale: fragments cut from digits shrunk to 21 px
)

_CHUNK = 4096  # digits per paste chunk: bounds the int64 index tensors (4096 * 56 * 56 * 8 B ~ 100 MB)
_MISSING_DIR_MSG = (
    "multilabel_digits needs the four MNIST idx files: pass --data-dir or set RLATTENTION_DATA "
    "(e.g. ../shared/data/mnist)"
)


def _paste_max(flat: Tensor, patches: Tensor, canvas_index: Tensor, top: Tensor, left: Tensor, side: int) -> None:
    """In place: the pixels of ``patches[m]`` are max-combined into canvas ``canvas_index[m]`` at
    ``(top[m], left[m])``.

    flat: ``(n * side * side,)`` uint8, the canvases flattened. patches: ``(M, h, w)`` uint8, all inside the
    canvas. canvas_index, top, left: ``(M,)`` int64. Several patches may land on the same canvas and overlap
    (``scatter_reduce`` with ``amax`` combines them).
    """
    h, w = patches.shape[1:]
    rows = torch.arange(h, device=flat.device).view(1, h, 1) * side
    cols = torch.arange(w, device=flat.device).view(1, 1, w)
    for start in range(0, len(patches), _CHUNK):
        sl = slice(start, start + _CHUNK)
        origin = (canvas_index[sl] * side + top[sl]) * side + left[sl]
        index = (origin.view(-1, 1, 1) + rows + cols).reshape(-1)
        flat.scatter_reduce_(0, index, patches[sl].reshape(-1), reduce="amax")


def _resize(digits: Tensor, size: int) -> Tensor:
    """``(M, H, W)`` uint8 -> ``(M, size, size)`` uint8, bilinear (antialiased when shrinking)."""
    if digits.shape[1:] == (size, size):
        return digits
    x = digits.unsqueeze(1).float()
    y = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return y.round().clamp(0, 255).to(torch.uint8).squeeze(1)


def _validate(
    images: Tensor,
    labels: Tensor,
    n: int,
    canvas: int,
    min_digits: int,
    max_digits: int,
    scale_range: tuple[float, float],
    num_clutter: int,
    clutter_size: int,
    grid_cells: int = 0,
    clutter_scale: float = 1.0,
) -> Tensor:
    """Check the arguments; returns the sorted distinct classes present in ``labels``."""
    check_digit_images(images, labels)
    if images.shape[2] != images.shape[3]:
        raise ValueError(f"images must be (N, 1, S, S) square digits, got shape {tuple(images.shape)}")
    if len(images) == 0:
        raise ValueError("no source digits: images is empty")
    if labels.is_floating_point() or int(labels.min()) < 0 or int(labels.max()) >= NUM_CLASSES:
        raise ValueError(f"labels must be integer digit classes in 0..{NUM_CLASSES - 1}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits} and {max_digits}")
    classes = labels.unique(sorted=True)
    if len(classes) < max_digits:
        raise ValueError(
            f"the source digits hold {len(classes)} distinct classes {classes.tolist()}, fewer than "
            f"max_digits={max_digits}: canvases need distinct classes"
        )
    low, high = (float(v) for v in scale_range)
    if not 0 < low <= high:
        raise ValueError(f"scale_range must be (low, high) with 0 < low <= high, got {scale_range}")
    side = images.shape[2]
    largest = round(side * high)
    if largest > canvas:
        raise ValueError(f"canvas {canvas} is smaller than the largest scaled digit ({side} x {high} = {largest} px)")
    if num_clutter < 0:
        raise ValueError(f"num_clutter must be >= 0, got {num_clutter}")
    if grid_cells < 0 or (grid_cells > 0 and grid_cells * grid_cells < max_digits):
        raise ValueError(
            f"grid_cells must be 0 (automatic) or a g with g * g >= max_digits={max_digits}, got {grid_cells}"
        )
    if grid_cells > canvas:
        raise ValueError(f"grid_cells must be <= the canvas side {canvas}, got {grid_cells}")
    if not clutter_scale > 0:
        raise ValueError(f"clutter_scale must be > 0, got {clutter_scale}")
    source = round(side * clutter_scale)  # side of the digits the fragments are cut from
    if num_clutter > 0 and not 1 <= clutter_size <= min(source, canvas):
        raise ValueError(
            f"clutter_size must be in 1..{min(source, canvas)} (the digit size {side} x clutter_scale "
            f"{clutter_scale:g}, at most the canvas), got {clutter_size}"
        )
    return classes


class _Layout(NamedTuple):
    """The digits of ``n`` canvases: per slot ``(n, max_digits)`` whether it holds a digit, its class, its source
    image, its side in px and its top-left corner; ``objects`` ``(n, max_digits, 5)`` as returned."""

    active: Tensor
    cls: Tensor
    source: Tensor
    size: Tensor
    top: Tensor
    left: Tensor
    objects: Tensor


def _draw_layout(
    labels: Tensor,
    classes: Tensor,
    n: int,
    side: int,
    canvas: int,
    min_digits: int,
    max_digits: int,
    scale_range: tuple[float, float],
    grid_cells: int,
    g: torch.Generator,
) -> _Layout:
    """How many digits, which classes and source images, their sizes and places, drawn from ``g``."""
    slots = max_digits
    # How many digits, which classes (distinct: the first slots of a random permutation), which source images.
    count = torch.randint(min_digits, max_digits + 1, (n,), generator=g)
    active = torch.arange(slots).view(1, -1) < count.view(-1, 1)  # (n, slots)
    perm = torch.rand(n, len(classes), generator=g).argsort(dim=1)[:, :slots]
    cls = classes[perm]  # (n, slots)
    by_class = torch.argsort(labels, stable=True)
    per_class = torch.bincount(labels, minlength=NUM_CLASSES)
    first_of_class = per_class.cumsum(0) - per_class
    pick = (torch.rand(n, slots, generator=g) * per_class[cls]).long().clamp(max=per_class[cls] - 1)
    source = by_class[first_of_class[cls] + pick]  # (n, slots) indices into images

    # Sizes and positions: a distinct grid cell per slot, a uniform place inside it (centred if too big).
    low, high = (float(v) for v in scale_range)
    size = (side * (low + (high - low) * torch.rand(n, slots, generator=g))).round().long()
    grid = int(grid_cells) or math.ceil(math.sqrt(slots))
    cell = canvas / grid
    cell_id = torch.rand(n, grid * grid, generator=g).argsort(dim=1)[:, :slots]
    slack = cell - size.double()

    def place(cell_coord: Tensor) -> Tensor:
        jitter = torch.rand(n, slots, generator=g, dtype=torch.float64)
        offset = torch.where(slack >= 0, jitter * slack, slack / 2)
        return torch.minimum((cell_coord * cell + offset).floor().long().clamp(min=0), canvas - size)

    top, left = place(cell_id // grid), place(cell_id % grid)
    box = torch.stack([left, top, left + size, top + size], dim=-1) * active[..., None]  # (n, slots, 4) px
    objects = torch.cat([torch.where(active, cls, -1)[..., None], box], dim=-1)  # (class, x0, y0, x1, y1)
    return _Layout(active, cls, source, size, top, left, objects)


def _paste_digits(flat: Tensor, digits: Tensor, layout: _Layout, canvas: int) -> None:
    """Paste every drawn digit, resized to its side, into the flattened canvases (one resize per distinct side)."""
    device = flat.device
    n, slots = layout.active.shape
    canvas_of = torch.arange(n).view(-1, 1).expand(n, slots)
    sel = layout.active.reshape(-1)
    canvas_of, source, size = canvas_of.reshape(-1)[sel], layout.source.reshape(-1)[sel], layout.size.reshape(-1)[sel]
    top, left = layout.top.reshape(-1)[sel], layout.left.reshape(-1)[sel]
    by_size = torch.argsort(size, stable=True)
    sizes, counts = torch.unique_consecutive(size[by_size], return_counts=True)
    for s, group in zip(sizes.tolist(), by_size.split(counts.tolist()), strict=True):
        patches = _resize(digits[source[group].to(device)], int(s))
        _paste_max(flat, patches, *(t[group].to(device) for t in (canvas_of, top, left)), canvas)


def _paste_clutter(
    flat: Tensor,
    digits: Tensor,
    n: int,
    canvas: int,
    num_clutter: int,
    clutter_size: int,
    clutter_scale: float,
    g: torch.Generator,
) -> None:
    """Paste ``num_clutter`` fragments per canvas, cut from source digits drawn from ``g``."""
    device = flat.device
    side = digits.shape[1]
    source_side = round(side * clutter_scale)
    pieces = _resize(digits, source_side) if source_side != side else digits  # what fragments are cut from
    for _ in range(num_clutter):
        src = torch.randint(len(digits), (n,), generator=g)
        y0, x0 = (torch.randint(source_side - clutter_size + 1, (n,), generator=g) for _ in range(2))
        rows = (y0.view(-1, 1) + torch.arange(clutter_size)).view(n, clutter_size, 1)
        cols = (x0.view(-1, 1) + torch.arange(clutter_size)).view(n, 1, clutter_size)
        fragments = pieces[src.view(-1, 1, 1).to(device), rows.to(device), cols.to(device)]
        y1, x1 = (torch.randint(canvas - clutter_size + 1, (n,), generator=g) for _ in range(2))
        _paste_max(flat, fragments, torch.arange(n, device=device), y1.to(device), x1.to(device), canvas)


def make_multilabel_digits(
    images: Tensor,
    labels: Tensor,
    n: int,
    canvas: int = 128,
    min_digits: int = 2,
    max_digits: int = 4,
    scale_range: tuple[float, float] = (1.0, 2.0),
    num_clutter: int = 0,
    clutter_size: int = 8,
    seed: int = 0,
    grid_cells: int = 0,
    clutter_scale: float = 1.0,
    return_objects: bool = False,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """Draw ``n`` multi-label digit canvases.

    images: ``(N, 1, S, S)`` uint8 source digits (``28 x 28`` for MNIST); labels: ``(N,)`` classes in 0..9.
    n: number of canvases. canvas: canvas side in pixels.
    min_digits / max_digits: each canvas holds a uniform number of digits in ``min_digits..max_digits``, all
        of distinct classes (drawn uniformly among the classes present in ``labels``), each digit a uniformly
        drawn source image of its class.
    scale_range: each digit is resized to ``round(S * u)`` px, ``u`` uniform in ``scale_range``.
    num_clutter / clutter_size: fragments of ``clutter_size`` px cut at uniform positions from uniformly drawn
        source digits and pasted at uniform positions, per canvas.
    seed: seed of a private ``torch.Generator`` (drawn on the CPU): the same inputs and seed give
        bit-identical outputs.
    grid_cells: side g of the layout grid (g * g >= max_digits); 0: ``ceil(sqrt(max_digits))``.
    clutter_scale: the fragments are cut from the source digits resized to ``round(S * clutter_scale)`` px
        (1.0: the source digits as they are), so that fragments can have the stroke width of small digits.
    return_objects: also return the objects drawn (see below).

    Positions follow the grid-with-jitter layout of the module docstring. Returns ``(canvases, targets)``:
    uint8 ``(n, 1, canvas, canvas)`` and float32 multi-hot ``(n, 10)`` (1 for each class drawn), on the
    images' device; with ``return_objects`` also ``objects`` int64 ``(n, max_digits, 5)``: per slot
    ``(class, x0, y0, x1, y1)``, the pixel box of the pasted digit (``x1``, ``y1`` exclusive), class -1 and a
    zero box for an empty slot (a canvas with fewer than ``max_digits`` digits).
    """
    classes = _validate(
        images, labels, n, canvas, min_digits, max_digits, scale_range, num_clutter, clutter_size, grid_cells,
        clutter_scale,
    )  # fmt: skip
    device = images.device
    side = images.shape[2]
    digits = images[:, 0]
    labels = labels.to(device="cpu", dtype=torch.int64)
    g = torch.Generator().manual_seed(int(seed))
    layout = _draw_layout(labels, classes, n, side, canvas, min_digits, max_digits, scale_range, grid_cells, g)
    active, cls, objects = layout.active, layout.cls, layout.objects
    flat = torch.zeros(n * canvas * canvas, dtype=torch.uint8, device=device)
    _paste_digits(flat, digits, layout, canvas)
    if n > 0 and num_clutter > 0:
        _paste_clutter(flat, digits, n, canvas, num_clutter, clutter_size, clutter_scale, g)

    targets = torch.zeros(n, NUM_CLASSES, dtype=torch.float32)
    targets.scatter_(1, cls, active.float())  # classes are distinct per canvas: no slot overwrites another
    if return_objects:
        return flat.view(n, 1, canvas, canvas), targets.to(device), objects.to(device)
    return flat.view(n, 1, canvas, canvas), targets.to(device)


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value


_MNIST_SIDE = 28


def _config_options(cfg: Any) -> dict[str, Any]:
    """The ``data.*`` keys of ``cfg`` as arguments of :func:`make_multilabel_digits`, each checked with an error
    that names its key (the generator's own checks name its arguments)."""

    def pair(key: str, default: tuple, kind: type) -> tuple:
        value = _option(cfg, key, default)
        try:
            low, high = (kind(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"data.{key} must be a pair [low, high], got {value!r}") from None
        return low, high

    canvas = int(_option(cfg, "canvas_size", 0)) or 128
    min_digits, max_digits = pair("digits_per_canvas", (2, 4), int)
    scale_range = pair("scale_range", (1.0, 2.0), float)
    grid = int(_option(cfg, "layout_grid", 0))
    num_clutter = int(_option(cfg, "num_clutter", 0))
    clutter_size = int(_option(cfg, "clutter_size", 8))
    clutter_scale = float(_option(cfg, "clutter_scale", 1.0))
    if canvas < 1:
        raise ValueError(f"data.canvas_size must be >= 1 (0: 128), got {canvas}")
    check_side("data.canvas_size", canvas)
    check_side("data.clutter_size", clutter_size)
    if not 1 <= min_digits <= max_digits <= NUM_CLASSES:
        raise ValueError(
            f"data.digits_per_canvas must be [low, high] with 1 <= low <= high <= {NUM_CLASSES} (distinct classes), "
            f"got {[min_digits, max_digits]}"
        )
    if not 0 < scale_range[0] <= scale_range[1]:
        raise ValueError(f"data.scale_range must be [low, high] with 0 < low <= high, got {list(scale_range)}")
    if round(_MNIST_SIDE * scale_range[1]) > canvas:
        raise ValueError(
            f"data.scale_range {list(scale_range)}: the largest digit ({_MNIST_SIDE} x {scale_range[1]:g} px) is "
            f"larger than data.canvas_size={canvas}"
        )
    if grid < 0 or (grid > 0 and grid * grid < max_digits) or grid > canvas:
        raise ValueError(
            f"data.layout_grid must be 0 (automatic: ceil(sqrt(max digits))) or g with g * g >= the largest number of "
            f"digits ({max_digits}) and g <= data.canvas_size, got {grid}"
        )
    if num_clutter < 0:
        raise ValueError(f"data.num_clutter must be >= 0, got {num_clutter}")
    if not clutter_scale > 0:
        raise ValueError(f"data.clutter_scale must be > 0, got {clutter_scale}")
    source = min(round(_MNIST_SIDE * clutter_scale), canvas)
    if num_clutter > 0 and not 1 <= clutter_size <= source:
        raise ValueError(
            f"data.clutter_size must be in 1..{source} (the digits the fragments are cut from: {_MNIST_SIDE} x "
            f"data.clutter_scale={clutter_scale:g}), got {clutter_size}"
        )
    for key in ("num_train", "num_test", "val_size"):
        if int(_option(cfg, key, 0)) < 0:
            raise ValueError(f"data.{key} must be >= 0, got {_option(cfg, key, 0)}")
    return dict(
        canvas=canvas,
        min_digits=min_digits,
        max_digits=max_digits,
        scale_range=scale_range,
        num_clutter=num_clutter,
        clutter_size=clutter_size,
        grid_cells=grid,
        clutter_scale=clutter_scale,
    )


@register_dataset("multilabel_digits")
def build_multilabel_digits(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Multi-label digit canvases from real MNIST digits, 10 classes, float32 multi-hot targets.

    Source digits: train and val canvases are drawn from the MNIST training split divided by
    ``train_val_split(60000, cfg.val_size, cfg.seed)`` (so validation canvases hold digits never seen in
    training; with ``val_size == 0`` they are drawn from the training digits, on different canvases); test
    canvases from the MNIST test split. Sizes: ``cfg.num_train`` train canvases (0 -> 20000) and
    ``cfg.num_test`` val and test canvases each (0 -> 5000). Passed to :func:`make_multilabel_digits`, each checked
    with an error naming its key: ``cfg.canvas_size`` (0 -> 128), ``cfg.digits_per_canvas`` (default
    ``(2, 4)``), ``cfg.scale_range`` (default ``(1.0, 2.0)``), ``cfg.layout_grid`` (0: automatic),
    ``cfg.num_clutter`` (default 0 here, but a ``DataConfig`` sets 4), ``cfg.clutter_size`` (8) and
    ``cfg.clutter_scale`` (1.0); each split's seed comes from ``cfg.seed`` and the split name. The cluttered task
    of the rarl study is :data:`CLUTTER_TASK`.
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG)
    seed = int(_option(cfg, "seed", 0))
    options = _config_options(cfg)
    num_train = int(_option(cfg, "num_train", 0)) or 20000
    num_test = int(_option(cfg, "num_test", 0)) or 5000
    images, labels = load_mnist(data_dir, "train")
    train_idx, val_idx = train_val_split(len(images), int(_option(cfg, "val_size", 6000)), seed)
    if len(val_idx) == 0:
        val_idx = train_idx
    test_images, test_labels = load_mnist(data_dir, "test")
    sources = {
        "train": (images[train_idx], labels[train_idx], num_train),
        "val": (images[val_idx], labels[val_idx], num_test),
        "test": (test_images, test_labels, num_test),
    }
    parts = {
        split: ArrayDataset(*make_multilabel_digits(imgs, labs, count, seed=split_seed(seed, split), **options))
        for split, (imgs, labs, count) in sources.items()
    }
    return DataSplits(parts["train"], parts["val"], parts["test"], num_classes=NUM_CLASSES, name="multilabel_digits")
