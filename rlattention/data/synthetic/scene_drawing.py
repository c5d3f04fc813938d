"""Drawing the captioned digit scenes (:mod:`rlattention.data.synthetic.digit_scenes`): the layout of a split (digit
sizes, places without overlap, distractor fragments, all from the split's seeded generators) and its rendering
into RGB canvases, with the boxes and crop labels the region CNN trains on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rlattention.data.synthetic.scene_captions import COLOUR_JITTER, COLOUR_NAMES, PALETTE, SceneDigit, scene_captions
from rlattention.progress import progress_bar

__all__ = [
    "digit_sides",
]


#: Size of a digit relative to the canvas side.
_SIDE_FRACTION = {"small": 0.25, "large": 0.42}
_BACKGROUND = 10  # identity class of distractor crops
_NO_COLOUR = len(PALETTE)  # colour class of distractor crops without a digit
_MAX_TRIES, _MAX_RESTARTS, _DISTRACTOR_TRIES = 100, 10, 20


def digit_sides(canvas: int) -> dict[str, int]:
    """Side in pixels of a ``small`` and a ``large`` digit on a ``canvas`` px canvas (24 and 40 at 96)."""
    return {name: max(1, round(fraction * canvas)) for name, fraction in _SIDE_FRACTION.items()}


@dataclass
class _Layout:
    """Everything drawn for one split, before rendering."""

    scenes: list[list[SceneDigit]]
    captions: list[str]
    digit_scene: np.ndarray  # (T,) scene of each digit
    digit_top: np.ndarray  # (T,) glyph square position
    digit_left: np.ndarray
    digit_rgb: np.ndarray  # (T, 3) uint8
    patches: list[np.ndarray]  # T glyphs, uint8 (side, side)
    boxes: np.ndarray  # (N, R, 4) int64 pixels
    identity: np.ndarray  # (N, R) int64: digit class or _BACKGROUND
    colour: np.ndarray  # (N, R) int64: colour index or _NO_COLOUR


def _resize(glyphs: Tensor, side: int) -> np.ndarray:
    """``(M, 1, 28, 28)`` uint8 -> ``(M, side, side)`` uint8 numpy, bilinear (antialiased when shrinking)."""
    if len(glyphs) == 0:
        return np.zeros((0, side, side), dtype=np.uint8)
    y = F.interpolate(glyphs.float(), size=(side, side), mode="bilinear", align_corners=False, antialias=True)
    return y.round().clamp(0, 255).to(torch.uint8)[:, 0].numpy()


def _ink_boxes(patches: np.ndarray) -> np.ndarray:
    """``(M, s, s)`` -> ``(M, 4)`` tight boxes ``(x0, y0, x1, y1)`` of the non-zero pixels, exclusive ends."""
    rows, cols = patches.any(axis=2), patches.any(axis=1)
    if len(patches) and not rows.any(axis=1).all():
        raise ValueError("a source digit has no ink after resizing; MNIST digits should never be blank")
    s = patches.shape[1]
    y0, x0 = rows.argmax(axis=1), cols.argmax(axis=1)
    y1, x1 = s - rows[:, ::-1].argmax(axis=1), s - cols[:, ::-1].argmax(axis=1)
    return np.stack([x0, y0, x1, y1], axis=1).astype(np.int64)


def _place(sides: Sequence[int], canvas: int, cells: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """``(top, left)`` of non-overlapping squares of the given sides (rejection, then grid fallback)."""
    order = sorted(range(len(sides)), key=lambda v: -sides[v])
    side = np.asarray(sides, dtype=np.int64)
    for _ in range(_MAX_RESTARTS):
        placed: list[int] = []
        pos = np.zeros((len(sides), 2), dtype=np.int64)
        for v in order:
            s = int(side[v])
            cand = rng.integers(0, canvas - s + 1, size=(_MAX_TRIES, 2))  # (top, left) candidates
            if placed:
                t, lf, sz = pos[placed, 0], pos[placed, 1], side[placed]
                ct, cl = cand[:, :1], cand[:, 1:]
                apart = (ct + s <= t) | (t + sz <= ct) | (cl + s <= lf) | (lf + sz <= cl)  # (tries, placed)
                ok = apart.all(axis=1)
                if not ok.any():
                    break
                cand = cand[int(ok.argmax())]
            else:
                cand = cand[0]
            pos[v] = cand
            placed.append(v)
        if len(placed) == len(sides):
            return [(int(p[0]), int(p[1])) for p in pos]
    cell = canvas // cells  # grid fallback: a distinct cell per digit, uniform jitter inside it
    chosen = rng.permutation(cells * cells)[: len(sides)]
    jitter = rng.random((len(sides), 2))
    out = []
    for v, c in enumerate(chosen):
        slack = cell - sides[v] + 1
        out.append(
            (int(c // cells) * cell + int(jitter[v, 0] * slack), int(c % cells) * cell + int(jitter[v, 1] * slack))
        )
    return out


def _overlap(box: Sequence[int], boxes: np.ndarray) -> np.ndarray:
    """Intersection areas of ``box`` ``(x0, y0, x1, y1)`` with each of ``boxes`` ``(M, 4)``."""
    w = np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0])
    h = np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1])
    return np.maximum(w, 0) * np.maximum(h, 0)


def _distractor(digit_boxes: np.ndarray, canvas: int, rng: np.random.Generator) -> list[int]:
    """A distractor box ``[x0, y0, x1, y1]``: random anywhere, or a shifted / rescaled part of a digit's box;
    redrawn while its IoU with a digit box exceeds 0.5 (at most ``_DISTRACTOR_TRIES`` draws)."""
    areas = (digit_boxes[:, 2] - digit_boxes[:, 0]) * (digit_boxes[:, 3] - digit_boxes[:, 1])
    box = [0, 0, 1, 1]
    for _ in range(_DISTRACTOR_TRIES):
        u = rng.random(10)
        if u[0] < 0.5:  # part of a digit: rescaled by 0.6..1.3, centre moved by 0.3..0.8 of the box per axis
            x0, y0, x1, y1 = (float(c) for c in digit_boxes[int(u[1] * len(digit_boxes))])
            w, h = (x1 - x0) * (0.6 + 0.7 * u[2]), (y1 - y0) * (0.6 + 0.7 * u[3])
            shift = [(0.3 + 0.5 * u[4 + a]) * (1 if u[6 + a] < 0.5 else -1) for a in (0, 1)]
            if u[8] < 0.3:  # sometimes moved along one axis only
                shift[int(u[9] * 2)] = 0.0
            cx, cy = (x0 + x1) / 2 + shift[0] * (x1 - x0), (y0 + y1) / 2 + shift[1] * (y1 - y0)
        else:  # anywhere: sides 0.12..0.45 of the canvas
            w, h = (0.12 + 0.33 * u[2]) * canvas, (0.12 + 0.33 * u[3]) * canvas
            cx, cy = u[4] * canvas, u[5] * canvas
        wi, hi = min(max(round(w), 4), canvas), min(max(round(h), 4), canvas)
        x0 = min(max(round(cx - wi / 2), 0), canvas - wi)
        y0 = min(max(round(cy - hi / 2), 0), canvas - hi)
        box = [x0, y0, x0 + wi, y0 + hi]
        inter = _overlap(box, digit_boxes)
        if (inter / (wi * hi + areas - inter)).max() <= 0.5:
            break
    return box


def _distractor_colour(box: Sequence[int], digit_boxes: np.ndarray, colours: np.ndarray) -> int:
    """The colour of the digit box covering most of ``box`` if it covers >= 10 % of it, else ``_NO_COLOUR``."""
    cover = _overlap(box, digit_boxes)
    best = int(cover.argmax())
    return int(colours[best]) if cover[best] >= 0.1 * (box[2] - box[0]) * (box[3] - box[1]) else _NO_COLOUR


def _draw_digits(
    labels: Tensor, n: int, digits: tuple[int, int], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits of ``n`` scenes, drawn from ``rng`` in this order: their count per scene (``(n,)`` in
    ``digits``), their distinct classes ``cls`` (``(T,)`` in scene order), the source glyph of each (an index
    into ``labels``), large or small, palette colour and jittered ``rgb`` ``(T, 3)``."""
    labels_np = labels.numpy().astype(np.int64)
    low, high = digits
    count = rng.integers(low, high + 1, size=n)
    classes = np.argsort(rng.random((n, 10)), axis=1)[:, :high]
    active = np.arange(high)[None, :] < count[:, None]
    cls = classes[active]  # (T,) in scene order
    by_class = np.argsort(labels_np, kind="stable")
    per_class = np.bincount(labels_np, minlength=10)
    if (per_class == 0).any():
        raise ValueError(f"the source digits lack classes {np.flatnonzero(per_class == 0).tolist()}; need all ten")
    first = np.cumsum(per_class) - per_class
    source = by_class[
        first[cls] + np.minimum((rng.random(len(cls)) * per_class[cls]).astype(np.int64), per_class[cls] - 1)
    ]
    large = rng.random(len(cls)) < 0.5
    colour = rng.integers(len(PALETTE), size=len(cls))
    palette = np.array(list(PALETTE.values()), dtype=np.int64)
    rgb = np.clip(palette[colour] + rng.integers(-COLOUR_JITTER, COLOUR_JITTER + 1, size=(len(cls), 3)), 0, 255)
    return count, cls, source, large, colour, rgb


def _glyph_patches(
    glyphs: Tensor, source: np.ndarray, large: np.ndarray, sides: dict[str, int]
) -> tuple[list[np.ndarray], np.ndarray]:
    """Each digit's glyph resized to its size, and the ink box of each patch ``(T, 4)``."""
    patches: list[np.ndarray] = [np.zeros((0, 0), dtype=np.uint8)] * len(source)
    ink = np.zeros((len(source), 4), dtype=np.int64)
    for name, flag in (("small", False), ("large", True)):
        group = np.flatnonzero(large == flag)
        resized = _resize(glyphs[torch.from_numpy(source[group])], sides[name])
        ink[group] = _ink_boxes(resized)
        for g, patch in zip(group.tolist(), resized, strict=True):
            patches[g] = patch
    return patches, ink


def _draw_split(
    glyphs: Tensor,
    labels: Tensor,
    n: int,
    canvas: int,
    digits: tuple[int, int],
    regions: int,
    seed: int,
    progress: bool = False,
    desc: str = "layout",
) -> _Layout:
    """Draw the digits, layout, regions and captions of ``n`` scenes (no rendering)."""
    rng = np.random.default_rng([seed, 0])  # digits and attributes
    place_rng = np.random.default_rng([seed, 1])  # positions and distractors
    caption_rng = np.random.default_rng([seed, 2])
    high = digits[1]
    count, cls, source, large, colour, rgb = _draw_digits(labels, n, digits, rng)
    digit_scene = np.repeat(np.arange(n), count)
    sides = digit_sides(canvas)
    patches, ink = _glyph_patches(glyphs, source, large, sides)

    cells = math.ceil(math.sqrt(high))
    top = np.zeros(len(cls), dtype=np.int64)
    left = np.zeros(len(cls), dtype=np.int64)
    boxes = np.zeros((n, regions, 4), dtype=np.int64)
    identity = np.full((n, regions), _BACKGROUND, dtype=np.int64)
    colour_target = np.full((n, regions), _NO_COLOUR, dtype=np.int64)
    scenes: list[list[SceneDigit]] = []
    captions: list[str] = []
    starts = np.cumsum(count) - count
    for s in progress_bar(range(n), desc=desc, unit="scene", enabled=progress):
        idx = np.arange(starts[s], starts[s] + count[s])
        size_names = ["large" if large[v] else "small" for v in idx]
        positions = _place([sides[name] for name in size_names], canvas, cells, place_rng)
        top[idx] = [p[0] for p in positions]
        left[idx] = [p[1] for p in positions]
        digit_boxes = ink[idx] + np.stack([left[idx], top[idx], left[idx], top[idx]], axis=1)
        all_boxes = [list(b) for b in digit_boxes.tolist()]
        while len(all_boxes) < regions:
            all_boxes.append(_distractor(digit_boxes, canvas, place_rng))
        order = place_rng.permutation(regions)  # region r holds box order[r]
        where = np.argsort(order)  # box b sits at region where[b]
        boxes[s] = np.asarray(all_boxes, dtype=np.int64)[order]
        for b in range(len(idx), regions):
            colour_target[s, where[b]] = _distractor_colour(all_boxes[b], digit_boxes, colour[idx])
        identity[s, where[: len(idx)]] = cls[idx]
        colour_target[s, where[: len(idx)]] = colour[idx]
        scene = [
            SceneDigit(
                label=int(cls[v]),
                colour=COLOUR_NAMES[int(colour[v])],
                size=size_names[k],
                box=tuple(int(c) for c in digit_boxes[k]),  # type: ignore[arg-type]
                rgb=tuple(int(c) for c in rgb[v]),  # type: ignore[arg-type]
                region=int(where[k]),
            )
            for k, v in enumerate(idx)
        ]
        scenes.append(scene)
        captions.extend(scene_captions(scene, caption_rng))
    return _Layout(
        scenes, captions, digit_scene, top, left, rgb.astype(np.uint8), patches, boxes, identity, colour_target
    )


def _render(layout: _Layout, start: int, stop: int, canvas: int) -> np.ndarray:
    """Scenes ``start .. stop - 1`` as uint8 ``(B, 3, canvas, canvas)``."""
    out = np.zeros((stop - start, canvas, canvas, 3), dtype=np.uint8)
    lo, hi = np.searchsorted(layout.digit_scene, [start, stop])
    for v in range(lo, hi):
        patch = layout.patches[v]
        s = patch.shape[0]
        tinted = ((patch[:, :, None].astype(np.uint16) * layout.digit_rgb[v] + 127) // 255).astype(np.uint8)
        t, lf = layout.digit_top[v], layout.digit_left[v]
        view = out[layout.digit_scene[v] - start, t : t + s, lf : lf + s]
        np.maximum(view, tinted, out=view)
    return out.transpose(0, 3, 1, 2)
