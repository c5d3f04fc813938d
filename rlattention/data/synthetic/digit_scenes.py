"""Captioned digit scenes: a CPU-sized stand-in for image-text matching benchmarks (Flickr30k, COCO), written
to disk in the VSE++/SCAN/VSRN ``precomp`` layout (:mod:`rlattention.data.readers.precomp`), so that a matching model
trains through the same reader as real bottom-up region features.

Scenes. A black ``canvas x canvas`` RGB image holds 2 to 4 real MNIST digits of *distinct* classes (so a
digit's class names it uniquely in its scene). Each digit has

* a size: ``small`` or ``large``, the 28 px MNIST glyph resized to ``round(0.25 * canvas)`` or
  ``round(0.42 * canvas)`` px (24 and 40 px on the default 96 px canvas; :func:`digit_sides`);
* a colour: one of the six named colours of :data:`PALETTE` (drawn independently, so two digits may share
  one); the grey ink is tinted, ``pixel = ink / 255 * rgb`` with ``rgb`` the named colour plus a uniform
  per-channel jitter of at most :data:`COLOUR_JITTER`;
* a position: the resized glyph squares never overlap (uniform positions by rejection, larger glyphs first; a
  scene that cannot be packed after a few restarts falls back to a ``2 x 2`` grid with jitter inside the
  cells). A digit's *box* is the tight box of its non-zero pixels, ``(x0, y0, x1, y1)`` in pixels with
  exclusive ends; boxes of one scene are therefore disjoint.

Splits: ``train`` scenes use the 60,000 MNIST training digits; ``dev`` and ``test`` scenes use the MNIST test
digits, split into two disjoint halves by a seeded permutation (dev: the first 5,000, test: the rest), so no
evaluation scene shares a glyph with training or with the other evaluation split. Every split is drawn from
its own ``numpy`` generators seeded with ``split_seed(seed, split)`` (:func:`rlattention.data.splits.split_seed`).

Relations (:func:`relation`): ``a`` is ``"left of"`` ``b`` when ``a.x1 <= b.x0`` (``"right of"``: ``a.x0 >=
b.x1``; ``"above"``: ``a.y1 <= b.y0``; ``"below"``: ``a.y0 >= b.y1``), on the axis along which the two boxes
are separated by the larger gap (x on ties). Every relation stated in a caption therefore holds strictly for the
boxes.

Captions (:func:`scene_captions`): 5 distinct captions per image from a small grammar with paraphrases. A digit
is mentioned as ``[a|an|the] [size word] [colour] [digit|number] <class>``, the class as a number word
(``seven``) or a numeral (``7``), size and colour each present or omitted (a digit mentioned alone always has
its colour); size words are ``small / little / tiny`` and ``large / big``. The five are drawn from these
templates, two of them relational (with different ordered pairs where the scene allows), one listing every
digit, one mentioning a subset, one from any template, then shuffled::

    {A} {rel} {B}                       a small red seven left of a large blue 2
    there is {A} {rel} {B}              there is a blue two to the right of a small red seven
    the {A} is {rel} the {B}            the red number 7 is above the big green four
    {count} {digits|numbers}: {all}     two digits: a red 7 and a blue 2
    {a picture of|...} {all}            an image with a tiny cyan 3, a yellow eight and a big red zero
    {some} [on a black background]      a little magenta nine and a green 1   (1 of 2, 1-2 of 3, 2-3 of 4)
    {count} {digits|numbers} including {some}   three numbers including a big red 4 and a cyan two

with ``rel`` one of ``left of / to the left of / on the left of``, ``right of / ...``, ``above / over``,
``below / under / beneath``. Lower case ASCII; ``,`` and ``:`` are the only punctuation.

Regions. Each image has ``regions`` boxes (default 6): its digits' boxes plus distractors up to that number,
in a shuffled order. A distractor is, with equal chance, a random box anywhere (background, possibly cutting
digits) or a box shifted and rescaled from one digit's box so that it covers part of that digit; a distractor
overlapping a digit box with IoU > 0.5 is redrawn (up to 20 times). Region features (``D = 64 + 5``): a
:class:`RegionCNN` sees a square crop around each box (side ``1.15 * max(w, h) + 2`` px, same centre; pixels
outside the canvas are black), resized to ``32 x 32`` by exact area averaging
(:func:`rlattention.vision.crops.crop_boxes`); its 64 global-average-pooled channels are followed by the box
geometry ``(x0, y0, x1, y1, area)`` normalised by the canvas side.

The CNN is trained in a preparation step on crops of the first ``cnn_scenes`` *training* scenes (default 4,000):
every digit crop and a seeded 20 % of the distractor crops (so that digit classes dominate the training), 10 % of
them held out to report accuracies in the manifest. It learns each crop's digit class (10 classes, or
"background" for distractors) and colour (6 colours, or "none": a distractor takes the colour of the digit box
covering most of it when that is at least 10 % of its area), 5 epochs of Adam by default, seeded, on the CPU
(about 95 % digit-class accuracy on dev digit regions with the defaults). Its weights are saved as
``region_cnn.safetensors`` next to the data (:func:`load_region_cnn`; :func:`region_features` recomputes the
features of saved scenes).

Output folder (:func:`generate_digit_scenes`), for each split ``s`` of ``train``, ``dev``, ``test``:

* ``{s}_ims.npy`` float32 ``(N, R, D)`` and ``{s}_caps.txt`` (``5 N`` lines), the precomp pair;
* ``{s}_boxes.npy`` float32 ``(N, R, 4)``: the region boxes ``(x0, y0, x1, y1) / canvas`` in the order of the
  features;
* ``{s}_scenes.json``: ``{"canvas": H, "scenes": [{"digits": [{"label", "colour", "rgb", "size", "box",
  "region"}, ...]}, ...]}``, box in pixels, region the index of the digit's box among the image's regions
  (:func:`read_scene_descriptions`);
* ``{s}_scenes.npy`` uint8 ``(N, 3, H, W)``, the rendered scenes, only for the splits in ``image_splits``
  (default dev and test: 27.6 MB per 1,000 scenes at 96 px; :func:`find_scene_images` finds the scenes
  behind given region features, for figures);

plus ``region_cnn.safetensors`` and ``manifest.json`` (generator name and version, parameters, MNIST file
sizes, counts, feature dimension, CNN accuracies, file sizes, timings).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.data import limits
from rlattention.data.base import DataSplits
from rlattention.data.cache import resolve_cache_dir
from rlattention.data.readers.mnist import find_mnist_files, load_mnist
from rlattention.data.readers.precomp import CAPTIONS_PER_IMAGE, load_precomp_splits, write_precomp_split
from rlattention.data.registry import register_dataset
from rlattention.data.splits import split_seed
from rlattention.progress import progress_bar
from rlattention.vision.backbones import SmallCNN
from rlattention.vision.crops import crop_boxes

__all__ = [
    "COLOUR_NAMES",
    "CROP_SIZE",
    "GENERATOR_VERSION",
    "GEOMETRY_DIM",
    "MANIFEST_NAME",
    "NUMBER_WORDS",
    "PALETTE",
    "RELATION_WORDS",
    "SIZE_WORDS",
    "SPLITS",
    "WEIGHTS_NAME",
    "RegionCNN",
    "SceneDigit",
    "SceneImages",
    "build_digit_scenes",
    "digit_sides",
    "estimated_bytes",
    "find_scene_images",
    "generate_digit_scenes",
    "load_region_cnn",
    "read_scene_descriptions",
    "region_features",
    "relation",
    "scene_captions",
]

#: Bumped whenever the output for the same parameters changes; part of the manifest check.
GENERATOR_VERSION = 1
#: The splits written, in order, and the MNIST split each one draws its digits from.
SPLITS: tuple[str, ...] = ("train", "dev", "test")
MANIFEST_NAME = "manifest.json"
WEIGHTS_NAME = "region_cnn.safetensors"

#: Named digit colours (RGB of full ink).
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 100, 255),
    "yellow": (240, 220, 40),
    "cyan": (40, 210, 230),
    "magenta": (220, 50, 220),
}
COLOUR_NAMES: tuple[str, ...] = tuple(PALETTE)
#: Largest per-channel deviation of a digit's colour from its palette entry.
COLOUR_JITTER = 20
NUMBER_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SIZE_WORDS: dict[str, tuple[str, ...]] = {"small": ("small", "little", "tiny"), "large": ("large", "big")}
#: Relation of :func:`relation` -> its paraphrases in captions.
RELATION_WORDS: dict[str, tuple[str, ...]] = {
    "left of": ("left of", "to the left of", "on the left of"),
    "right of": ("right of", "to the right of", "on the right of"),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
}
_NOUNS = ("digit", "number")
_COUNT_WORDS = {2: "two", 3: "three", 4: "four"}
_PICTURE_PREFIXES = ("a picture of", "an image with", "a black background with", "a scene showing")
#: Size of a digit relative to the canvas side.
_SIDE_FRACTION = {"small": 0.25, "large": 0.42}
#: Side of the square crops the region CNN sees.
CROP_SIZE = 32
#: ``(x0, y0, x1, y1, area)`` appended to each region's CNN features.
GEOMETRY_DIM = 5
_CNN_CHANNELS = (16, 32, 64)
_BACKGROUND = 10  # identity class of distractor crops
_NO_COLOUR = len(PALETTE)  # colour class of distractor crops without a digit
_CROP_SCALE, _CROP_PAD = 1.15, 2.0
_MAX_TRIES, _MAX_RESTARTS, _DISTRACTOR_TRIES = 100, 10, 20
_CHUNK = 256  # scenes rendered / cropped at a time
_TEXT_BYTES_PER_SCENE = 550  # its 5 captions (~245 bytes) and its digits in {split}_scenes.json (~290 bytes)
_DISTRACTOR_FRACTION = 0.2  # of the distractor crops kept to train the region CNN (all digit crops are)
_DEV_DIGITS = 5000  # MNIST test digits (of a seeded permutation) reserved for dev scenes; test gets the rest


@dataclass(frozen=True)
class SceneDigit:
    """One digit of a scene: MNIST class, colour name and RGB, size name, box in pixels ``(x0, y0, x1, y1)``
    (exclusive ends) and the index of that box among the image's regions (``-1`` when not assigned)."""

    label: int
    colour: str
    size: str
    box: tuple[int, int, int, int]
    rgb: tuple[int, int, int] = (0, 0, 0)
    region: int = -1


def digit_sides(canvas: int) -> dict[str, int]:
    """Side in pixels of a ``small`` and a ``large`` digit on a ``canvas`` px canvas (24 and 40 at 96)."""
    return {name: max(1, round(fraction * canvas)) for name, fraction in _SIDE_FRACTION.items()}


# ------------------------------------------------------------------------------------------------ relations


def relation(a: Sequence[int], b: Sequence[int]) -> str:
    """Where box ``a`` lies relative to box ``b``: ``"left of"``, ``"right of"``, ``"above"`` or ``"below"``.

    Boxes are ``(x0, y0, x1, y1)`` with exclusive ends (y grows downwards). The answer is the side along the
    axis where the boxes are separated by the larger gap (x on ties), so it holds strictly: ``"left of"``
    means ``a.x1 <= b.x0``. Raises ``ValueError`` for overlapping boxes (no side holds).
    """
    ax0, ay0, ax1, ay1 = a
    bx0, by0, bx1, by1 = b
    gap_x = max(bx0 - ax1, ax0 - bx1)
    gap_y = max(by0 - ay1, ay0 - by1)
    if gap_x >= 0 and gap_x >= gap_y:
        return "left of" if ax1 <= bx0 else "right of"
    if gap_y >= 0:
        return "above" if ay1 <= by0 else "below"
    raise ValueError(f"boxes {tuple(a)} and {tuple(b)} overlap: no relation left/right/above/below holds")


# ------------------------------------------------------------------------------------------------- captions


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _mention(digit: SceneDigit, rng: np.random.Generator, article: str = "a", rich: bool = False) -> str:
    """``[a|an|the] [size] [colour] [digit|number] <class>``; ``article="a"`` picks ``a`` or ``an``.

    Detail: size and colour (45 %), colour only (35 %), size only (10 %), neither (10 %); with ``rich`` (a digit
    mentioned alone) always the colour, and the size 45 / 80 of the time. A noun ``digit`` or ``number`` before
    the class 25 % of the time; the class as a number word 60 %, else as a numeral.
    """
    u_detail, u_noun, u_word, u_size, u_which = rng.random(5)
    if rich:
        u_detail *= 0.8
    words = []
    if u_detail < 0.45 or 0.8 <= u_detail < 0.9:
        options = SIZE_WORDS[digit.size]
        words.append(options[int(u_size * len(options))])
    if u_detail < 0.8:
        words.append(digit.colour)
    if u_noun < 0.25:
        words.append(_NOUNS[int(u_which * len(_NOUNS))])
    words.append(NUMBER_WORDS[digit.label] if u_word < 0.6 else str(digit.label))
    if article == "a" and words[0] in ("eight", "8"):
        article = "an"
    return " ".join([article, *words])


def _listing(mentions: list[str]) -> str:
    return mentions[0] if len(mentions) == 1 else f"{', '.join(mentions[:-1])} and {mentions[-1]}"


def _caption(kind: str, digits: Sequence[SceneDigit], pair: tuple[int, int], rng: np.random.Generator) -> str:
    """One caption of template ``kind`` (see the module docstring); ``pair`` is used by relational templates."""
    k = len(digits)
    i, j = pair
    rel = _pick(rng, RELATION_WORDS[relation(digits[i].box, digits[j].box)])
    if kind == "relation":
        return f"{_mention(digits[i], rng)} {rel} {_mention(digits[j], rng)}"
    if kind == "there_is":
        return f"there is {_mention(digits[i], rng)} {rel} {_mention(digits[j], rng)}"
    if kind == "the":
        return f"{_mention(digits[i], rng, 'the')} is {rel} {_mention(digits[j], rng, 'the')}"
    order = [int(v) for v in rng.permutation(k)]
    noun = f"{_COUNT_WORDS[k]} {_pick(rng, _NOUNS)}s"
    if kind == "count_list":
        return f"{noun}: {_listing([_mention(digits[v], rng) for v in order])}"
    if kind == "picture":
        return f"{_pick(rng, _PICTURE_PREFIXES)} {_listing([_mention(digits[v], rng) for v in order])}"
    if kind == "subset":  # 1 of 2, 1-2 of 3, 2-3 of 4 digits
        some = order[: int(rng.integers(max(1, k - 2), k))]
        suffix = " on a black background" if rng.random() < 0.3 else ""
        return _listing([_mention(digits[v], rng, rich=len(some) == 1) for v in some]) + suffix
    if kind == "including":  # 1 of 2, 2 of 3 or 4 digits
        some = order[: min(2, k - 1)]
        return f"{noun} including {_listing([_mention(digits[v], rng, rich=True) for v in some])}"
    raise ValueError(f"unknown caption template {kind!r}")


_RELATIONAL = ("relation", "there_is", "the")
_ALL_DIGITS = ("count_list", "picture")
_SOME_DIGITS = ("subset", "including")


def scene_captions(
    digits: Sequence[SceneDigit], rng: np.random.Generator, count: int = CAPTIONS_PER_IMAGE
) -> list[str]:
    """``count`` distinct captions of one scene (see the module docstring for the grammar).

    digits: the scene's digits, at least 2, of distinct classes, with disjoint boxes. The slots are two
    relational captions (different ordered pairs when the scene has them), one listing all digits, one
    mentioning a subset, then any template; ``count`` other than 5 keeps the first ``count`` slots (cycling
    for more). The captions are returned in a random order. Deterministic given ``rng``'s state.
    """
    if len(digits) < 2:
        raise ValueError(f"a scene needs at least 2 digits for relational captions, got {len(digits)}")
    labels = [d.label for d in digits]
    if len(set(labels)) != len(labels):
        raise ValueError(f"the digits of a scene must have distinct classes, got {labels}")
    pairs = [tuple(int(v) for v in p) for p in itertools.permutations(range(len(digits)), 2)]
    pair_order = [pairs[int(v)] for v in rng.permutation(len(pairs))]
    families = [_RELATIONAL, _RELATIONAL, _ALL_DIGITS, _SOME_DIGITS, _RELATIONAL + _ALL_DIGITS + _SOME_DIGITS]
    captions: list[str] = []
    for slot in range(count):
        family = families[slot % len(families)]
        for attempt in range(20):
            kind = _pick(rng, family)
            text = _caption(kind, digits, pair_order[(slot + attempt) % len(pair_order)], rng)
            if text not in captions:
                break
        else:  # pragma: no cover - 20 identical draws in a row are practically impossible
            raise RuntimeError(f"could not draw {count} distinct captions for the scene {digits}")
        captions.append(text)
    return [captions[int(v)] for v in rng.permutation(len(captions))]


# ----------------------------------------------------------------------------------------------- the layout


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
    labels_np = labels.numpy().astype(np.int64)
    low, high = digits
    count = rng.integers(low, high + 1, size=n)
    classes = np.argsort(rng.random((n, 10)), axis=1)[:, :high]
    active = np.arange(high)[None, :] < count[:, None]
    digit_scene = np.repeat(np.arange(n), count)
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

    sides = digit_sides(canvas)
    patches: list[np.ndarray] = [np.zeros((0, 0), dtype=np.uint8)] * len(cls)
    ink = np.zeros((len(cls), 4), dtype=np.int64)
    for name, flag in (("small", False), ("large", True)):
        group = np.flatnonzero(large == flag)
        resized = _resize(glyphs[torch.from_numpy(source[group])], sides[name])
        ink[group] = _ink_boxes(resized)
        for g, patch in zip(group.tolist(), resized, strict=True):
            patches[g] = patch

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


# ----------------------------------------------------------------------------------------- region features


class RegionCNN(nn.Module):
    """:class:`SmallCNN` over ``3 x 32 x 32`` region crops with two training heads: digit class (10 +
    background) and colour (6 + none). ``forward`` returns the pooled features ``(B, channels[-1])``."""

    def __init__(self, channels: Sequence[int] = _CNN_CHANNELS) -> None:
        super().__init__()
        self.backbone = SmallCNN(3, tuple(int(c) for c in channels))
        self.identity_head = nn.Linear(self.backbone.out_features, 11)
        self.colour_head = nn.Linear(self.backbone.out_features, len(PALETTE) + 1)
        self.out_features = self.backbone.out_features
        self.to(memory_format=torch.channels_last)  # about twice as fast for these small convolutions on a CPU

    def forward(self, crops: Tensor) -> Tensor:
        return self.backbone(crops.contiguous(memory_format=torch.channels_last))


def _crop_views(boxes: np.ndarray, canvas: int) -> Tensor:
    """Pixel boxes ``(..., 4)`` -> the square crop views in the ``[-1, 1]`` coordinates of ``crop_boxes``."""
    b = torch.from_numpy(boxes).double()
    cx, cy = (b[..., 0] + b[..., 2]) / 2, (b[..., 1] + b[..., 3]) / 2
    half = (torch.maximum(b[..., 2] - b[..., 0], b[..., 3] - b[..., 1]) * _CROP_SCALE + _CROP_PAD) / 2
    view = torch.stack([cx - half, cy - half, cx + half, cy + half], dim=-1)
    return (view * (2.0 / canvas) - 1.0).float()


def _crops(scenes: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """uint8 scenes ``(B, 3, H, W)`` and pixel boxes ``(B, R, 4)`` -> uint8 crops ``(B, R, 3, 32, 32)``."""
    images = torch.from_numpy(scenes).float() / 255.0
    crops = crop_boxes(images, _crop_views(boxes, scenes.shape[-1]), (CROP_SIZE, CROP_SIZE), mode="area")
    return (crops * 255.0).round().clamp(0, 255).to(torch.uint8).numpy()


def _geometry(boxes: np.ndarray, canvas: int) -> np.ndarray:
    """Pixel boxes ``(..., 4)`` -> ``(..., 5)`` float32 ``(x0, y0, x1, y1, area)`` normalised by the canvas."""
    b = boxes.astype(np.float64) / canvas
    area = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    return np.concatenate([b, area[..., None]], axis=-1).astype(np.float32)


@torch.no_grad()
def _cnn_features(model: RegionCNN, crops: np.ndarray, batch: int = 256) -> np.ndarray:
    """uint8 crops ``(..., 3, 32, 32)`` -> float32 features ``(..., C)`` (model in eval mode)."""
    flat = torch.from_numpy(crops.reshape(-1, 3, CROP_SIZE, CROP_SIZE))
    outs = [model(flat[i : i + batch].float() / 255.0) for i in range(0, len(flat), batch)]
    out = torch.cat(outs) if outs else torch.zeros(0, model.out_features)
    return out.numpy().astype(np.float32).reshape(*crops.shape[:-3], model.out_features)


def region_features(model: RegionCNN, scenes: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Region features of rendered scenes: float32 ``(N, R, C + 5)``.

    scenes: uint8 ``(N, 3, H, W)`` (``H == W``, e.g. ``{split}_scenes.npy``). boxes: ``(N, R, 4)`` region boxes,
    normalised ``(x0, y0, x1, y1) / H`` as in ``{split}_boxes.npy``. The model is put in eval mode.
    """
    if scenes.ndim != 4 or scenes.shape[1] != 3 or scenes.shape[2] != scenes.shape[3] or scenes.dtype != np.uint8:
        raise ValueError(f"scenes must be uint8 (N, 3, H, H), got {scenes.dtype} {scenes.shape}")
    if boxes.ndim != 3 or boxes.shape[0] != len(scenes) or boxes.shape[2] != 4:
        raise ValueError(f"boxes must be (N={len(scenes)}, R, 4), got shape {boxes.shape}")
    canvas = scenes.shape[-1]
    pixels = np.round(np.asarray(boxes, dtype=np.float64) * canvas).astype(np.int64)
    model.eval()
    parts = []
    for i in range(0, len(scenes), _CHUNK):
        crops = _crops(scenes[i : i + _CHUNK], pixels[i : i + _CHUNK])
        parts.append(np.concatenate([_cnn_features(model, crops), _geometry(pixels[i : i + _CHUNK], canvas)], -1))
    if not parts:
        return np.zeros((0, boxes.shape[1], model.out_features + GEOMETRY_DIM), dtype=np.float32)
    return np.concatenate(parts)


def _train_region_cnn(
    crops: np.ndarray,
    identity: np.ndarray,
    colour: np.ndarray,
    epochs: int,
    seed: int,
    progress: bool,
    batch_size: int = 128,
    lr: float = 3e-3,
) -> tuple[RegionCNN, dict[str, Any]]:
    """Train a :class:`RegionCNN` on uint8 crops ``(M, 3, 32, 32)`` with targets ``(M,)``, 10 % held out.

    Adam with a one-cycle learning-rate schedule (peak ``lr``), the sum of the two cross-entropies. Returns
    the model (eval mode) and the held-out accuracies: digit class on digit crops and on distractor crops
    ("background"), colour on digit crops.
    """
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(len(crops), generator=g)
    n_held = len(crops) // 10
    held, train = perm[:n_held], perm[n_held:]
    x = torch.from_numpy(crops)
    y_id, y_col = torch.from_numpy(identity), torch.from_numpy(colour)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = RegionCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps = max(1, epochs * math.ceil(len(train) / batch_size))
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.2)
    model.train()
    bar = progress_bar(total=steps, desc="region cnn", unit="step", enabled=progress)
    for _ in range(epochs):
        order = train[torch.randperm(len(train), generator=g)]
        for i in range(0, len(order), batch_size):
            b = order[i : i + batch_size]
            bar.update(1)
            if len(b) < 2:
                continue  # BatchNorm needs two samples
            feats = model(x[b].float() / 255.0)
            loss = F.cross_entropy(model.identity_head(feats), y_id[b])
            loss = loss + F.cross_entropy(model.colour_head(feats), y_col[b])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
    bar.close()
    model.eval()
    metrics: dict[str, Any] = {"train_crops": len(train), "heldout_crops": n_held}
    if n_held:
        with torch.no_grad():
            feats = torch.from_numpy(_cnn_features(model, crops[held.numpy()]))
            id_ok = model.identity_head(feats).argmax(1) == y_id[held]
            col_ok = model.colour_head(feats).argmax(1) == y_col[held]
        digit = y_id[held] != _BACKGROUND
        for name, ok, mask in (
            ("identity_accuracy_digits", id_ok, digit),
            ("identity_accuracy_distractors", id_ok, ~digit),
            ("colour_accuracy_digits", col_ok, digit),
        ):
            metrics[name] = round(float(ok[mask].float().mean()), 4) if mask.any() else None
    return model, metrics


def _save_region_cnn(model: RegionCNN, path: Path) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    channels = ",".join(str(int(m.out_channels)) for m in model.backbone.body if isinstance(m, nn.Conv2d))
    save_file(state, str(path), metadata={"format": "rlattention.digit_scenes.region_cnn", "channels": channels})


def load_region_cnn(path: str | os.PathLike) -> RegionCNN:
    """The :class:`RegionCNN` saved by :func:`generate_digit_scenes` (a dataset folder or the
    ``region_cnn.safetensors`` file itself), in eval mode."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_NAME
    if not path.is_file():
        raise FileNotFoundError(f"region CNN weights not found: {path}")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != "rlattention.digit_scenes.region_cnn" or not meta.get("channels"):
        raise ValueError(f"{path}: not a digit-scenes region CNN (metadata {meta}); expected format and channels")
    model = RegionCNN([int(c) for c in meta["channels"].split(",")])
    model.load_state_dict(load_file(str(path)))
    return model.eval()


# ------------------------------------------------------------------------------------------- dataset folder


def read_scene_descriptions(folder: str | os.PathLike, split: str) -> list[list[SceneDigit]]:
    """The digits of every scene of ``{split}_scenes.json`` in a generated folder, in image order."""
    path = Path(folder) / f"{split}_scenes.json"
    if not path.is_file():
        raise FileNotFoundError(f"scene descriptions not found: {path}")
    limits.check_file_size(path, limits.MAX_JSON_BYTES, "scene descriptions json")
    data = json.loads(path.read_text(encoding="utf-8"))
    return [
        [
            SceneDigit(
                label=int(d["label"]),
                colour=str(d["colour"]),
                size=str(d["size"]),
                box=tuple(int(c) for c in d["box"]),  # type: ignore[arg-type]
                rgb=tuple(int(c) for c in d["rgb"]),  # type: ignore[arg-type]
                region=int(d["region"]),
            )
            for d in scene["digits"]
        ]
        for scene in data["scenes"]
    ]


def _split_files(split: str, with_images: bool) -> list[str]:
    names = [f"{split}_ims.npy", f"{split}_caps.txt", f"{split}_boxes.npy", f"{split}_scenes.json"]
    return [*names, f"{split}_scenes.npy"] if with_images else names


def _known_names() -> set[str]:
    return {MANIFEST_NAME, WEIGHTS_NAME, *(name for s in SPLITS for name in _split_files(s, True))}


def _mnist_fingerprint(mnist_root: str | os.PathLike) -> dict[str, int]:
    """``{file name: size}`` of the four MNIST files used (names only, so moving the folder changes nothing)."""
    paths = [p for split in ("train", "test") for p in find_mnist_files(mnist_root, split)]  # type: ignore[arg-type]
    return {p.name: p.stat().st_size for p in paths}


def _manifest_matches(out_dir: Path, params: dict[str, Any], mnist: dict[str, int]) -> bool:
    """Whether ``out_dir`` holds a complete generation with exactly these parameters (files at their sizes)."""
    try:
        manifest = json.loads((out_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("generator") != "digit_scenes":
        return False
    if manifest.get("version") != GENERATOR_VERSION or manifest.get("params") != params:
        return False
    if manifest.get("mnist") != mnist or not isinstance(manifest.get("files"), dict):
        return False
    expected = {WEIGHTS_NAME, *(n for s in SPLITS for n in _split_files(s, s in params["image_splits"]))}
    if set(manifest["files"]) != expected:
        return False
    for name, size in manifest["files"].items():
        path = out_dir / name
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def _check_replaceable(out_dir: Path) -> None:
    """Refuse to replace a folder holding anything this generator does not write."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a folder; expected a digit-scenes dataset folder")
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in _known_names())
    if foreign:
        raise FileExistsError(
            f"{out_dir} holds files that generate_digit_scenes does not write ({', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}); it would replace the whole folder: choose an empty or new folder"
        )


def _params(
    num_train: int,
    num_dev: int,
    num_test: int,
    regions: int,
    seed: int,
    canvas: int,
    digits: Sequence[int],
    cnn_epochs: int,
    cnn_scenes: int,
    image_splits: Sequence[str],
) -> dict[str, Any]:
    """The validated generation parameters, as recorded in (and compared with) the manifest."""
    for name, value in (("num_train", num_train), ("num_dev", num_dev), ("num_test", num_test)):
        if int(value) < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if int(num_train) < 1:
        raise ValueError(f"num_train must be >= 1 (the region CNN is trained on training scenes), got {num_train}")
    if len(digits) != 2:
        raise ValueError(f"digits must be (low, high) digits per scene, got {digits!r}")
    low, high = int(digits[0]), int(digits[1])
    if not 2 <= low <= high <= 4:
        raise ValueError(f"digits must be (low, high) with 2 <= low <= high <= 4 digits per scene, got {digits}")
    if int(regions) < high:
        raise ValueError(f"regions must be >= the most digits per scene ({high}), got {regions}")
    sides = digit_sides(int(canvas))
    if int(canvas) < 32:
        raise ValueError(f"canvas must be >= 32 px (small digits are a quarter of it), got {canvas}")
    if sides["large"] > int(canvas) // math.ceil(math.sqrt(high)):
        raise ValueError(f"canvas {canvas} cannot hold {high} large digits of {sides['large']} px")
    if int(cnn_epochs) < 1 or int(cnn_scenes) < 1:
        raise ValueError(f"cnn_epochs and cnn_scenes must be >= 1, got {cnn_epochs} and {cnn_scenes}")
    bad = [s for s in image_splits if s not in SPLITS]
    if bad or isinstance(image_splits, str):
        raise ValueError(f"image_splits must be a sequence of split names among {SPLITS}, got {image_splits!r}")
    return {
        "seed": int(seed),
        "num_train": int(num_train),
        "num_dev": int(num_dev),
        "num_test": int(num_test),
        "regions": int(regions),
        "canvas": int(canvas),
        "digits": [low, high],
        "digit_sides": sides,
        "palette": {k: list(v) for k, v in PALETTE.items()},
        "colour_jitter": COLOUR_JITTER,
        "captions_per_image": CAPTIONS_PER_IMAGE,
        "crop_size": CROP_SIZE,
        "cnn": {
            "channels": list(_CNN_CHANNELS),
            "epochs": int(cnn_epochs),
            "scenes": int(cnn_scenes),
            "distractor_fraction": _DISTRACTOR_FRACTION,
        },
        "image_splits": [s for s in SPLITS if s in image_splits],
    }


def _sources(mnist_root: str | os.PathLike, seed: int) -> dict[str, tuple[Tensor, Tensor]]:
    """MNIST digits of each split: train from the MNIST training set, dev / test from disjoint halves of t10k."""
    train = load_mnist(mnist_root, "train")
    test_images, test_labels = load_mnist(mnist_root, "test")
    perm = torch.from_numpy(
        np.random.default_rng([split_seed(seed, "mnist-test-halves"), 0]).permutation(len(test_images))
    )
    dev_idx, test_idx = perm[:_DEV_DIGITS], perm[_DEV_DIGITS:]
    return {
        "train": train,
        "dev": (test_images[dev_idx], test_labels[dev_idx]),
        "test": (test_images[test_idx], test_labels[test_idx]),
    }


def _write_all(tmp: Path, mnist_root: str | os.PathLike, params: dict[str, Any], progress: bool) -> dict[str, Any]:
    """Generate every file into ``tmp``; returns the manifest entries besides params and files."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    sources = _sources(mnist_root, params["seed"])
    canvas, regions = params["canvas"], params["regions"]
    digits = (int(params["digits"][0]), int(params["digits"][1]))
    sizes = {"train": params["num_train"], "dev": params["num_dev"], "test": params["num_test"]}
    layouts = {}
    for split in SPLITS:
        glyphs, labels = sources[split]
        seed = split_seed(params["seed"], split)
        layouts[split] = _draw_split(
            glyphs,
            labels,
            sizes[split],
            canvas,
            digits,
            regions,
            seed,
            progress,
            f"{split} layout",
        )
    timings["layout_and_captions"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    train = layouts["train"]
    m = min(params["cnn"]["scenes"], sizes["train"])
    keep_rng = np.random.default_rng([split_seed(params["seed"], "region-cnn"), 0])
    keep = (train.identity[:m] != _BACKGROUND) | (keep_rng.random((m, regions)) < params["cnn"]["distractor_fraction"])
    crops = []
    for i in range(0, m, _CHUNK):
        stop = min(i + _CHUNK, m)
        crops.append(_crops(_render(train, i, stop, canvas), train.boxes[i:stop])[keep[i:stop]])
    model, metrics = _train_region_cnn(
        np.concatenate(crops),
        train.identity[:m][keep],
        train.colour[:m][keep],
        params["cnn"]["epochs"],
        split_seed(params["seed"], "region-cnn"),
        progress,
    )
    _save_region_cnn(model, tmp / WEIGHTS_NAME)
    timings["region_cnn"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    counts = {}
    for split in SPLITS:
        layout, n = layouts[split], sizes[split]
        keep_images = split in params["image_splits"]
        feats = np.zeros((n, regions, model.out_features + GEOMETRY_DIM), dtype=np.float32)
        images = np.zeros((n, 3, canvas, canvas), dtype=np.uint8) if keep_images else None
        for i in progress_bar(range(0, n, _CHUNK), desc=f"{split} features", unit="chunk", enabled=progress):
            stop = min(i + _CHUNK, n)
            scenes = _render(layout, i, stop, canvas)
            feats[i:stop, :, : model.out_features] = _cnn_features(model, _crops(scenes, layout.boxes[i:stop]))
            feats[i:stop, :, model.out_features :] = _geometry(layout.boxes[i:stop], canvas)
            if images is not None:
                images[i:stop] = scenes
        write_precomp_split(tmp, split, feats, layout.captions)
        np.save(tmp / f"{split}_boxes.npy", (layout.boxes / canvas).astype(np.float32), allow_pickle=False)
        if images is not None:
            np.save(tmp / f"{split}_scenes.npy", images, allow_pickle=False)
        scenes_json = {"canvas": canvas, "scenes": [{"digits": [asdict(d) for d in scene]} for scene in layout.scenes]}
        (tmp / f"{split}_scenes.json").write_text(json.dumps(scenes_json, separators=(",", ":")), encoding="utf-8")
        counts[split] = {"images": n, "captions": len(layout.captions), "digits": len(layout.patches)}
    timings["render_and_features"] = time.perf_counter() - t0
    return {
        "feature_dim": model.out_features + GEOMETRY_DIM,
        "cnn_feature_dim": model.out_features,
        "geometry": ["x0", "y0", "x1", "y1", "area"],
        "counts": counts,
        "cnn_metrics": metrics,
        "seconds": {k: round(v, 3) for k, v in timings.items()},
    }


def generate_digit_scenes(
    out_dir: str | os.PathLike,
    mnist_root: str | os.PathLike,
    num_train: int = 10000,
    num_dev: int = 1000,
    num_test: int = 1000,
    regions: int = 6,
    seed: int = 0,
    canvas: int = 96,
    progress: bool = False,
    *,
    digits: tuple[int, int] = (2, 4),
    cnn_epochs: int = 5,
    cnn_scenes: int = 4000,
    image_splits: Sequence[str] = ("dev", "test"),
    force: bool = False,
) -> Path:
    """Write a captioned digit-scenes dataset in the precomp layout into ``out_dir`` (see the module docstring).

    mnist_root: the MNIST folder (as for :func:`rlattention.data.readers.mnist.load_mnist`).
    num_train / num_dev / num_test: scenes per split (the test protocol is 1,000 images, as for Flickr30k).
    regions: regions per image (digit boxes + distractors), at least ``digits[1]``.
    seed: the seed of everything (layouts, captions, the region CNN's initialisation and batches).
    canvas: side of the square RGB canvas in pixels. digits: ``(fewest, most)`` digits per scene, within 2..4.
    cnn_epochs / cnn_scenes: training of the region CNN, on the crops of the first ``cnn_scenes`` train scenes.
    image_splits: splits whose rendered scenes are saved as ``{split}_scenes.npy`` (for figures).
    progress: show progress bars (:func:`rlattention.progress.progress_bar`: rank 0, on a terminal). force:
    regenerate even when the folder is up to date.

    When ``out_dir`` already holds a generation whose manifest records the same parameters, generator version
    and MNIST file sizes, and every listed file has its recorded size, nothing is done. Otherwise everything is
    generated into a temporary folder beside ``out_dir`` which then replaces it, so an interrupted run never
    leaves a half-written dataset. Before that, one line on stderr says how many scenes go where and about how
    many bytes (:func:`estimated_bytes`); over ``$RLATTENTION_CACHE_LIMIT`` (default 2 GB) nothing is generated
    or written (:class:`~rlattention.cache_limit.CacheTooLarge`). A folder holding files this generator does not
    write is never replaced (``FileExistsError``). Returns ``out_dir`` as a ``Path``.

    Reproducibility: layouts and captions are bit-identical for a seed everywhere; the region CNN's training
    is seeded, and bit-identical features need the same torch build and thread count (the saved weights let
    :func:`region_features` recompute them from saved scenes).
    """
    out_dir = Path(out_dir).expanduser()
    params = _params(num_train, num_dev, num_test, regions, seed, canvas, digits, cnn_epochs, cnn_scenes, image_splits)
    params = json.loads(json.dumps(params))  # the form it has after a round trip through the manifest
    mnist = _mnist_fingerprint(mnist_root)
    if not force and _manifest_matches(out_dir, params, mnist):
        return out_dir
    _check_replaceable(out_dir)
    from rlattention.cache_limit import announce_cache_build

    n = params["num_train"] + params["num_dev"] + params["num_test"]
    announce_cache_build(
        f"generating {n:,} digit scenes ({params['num_train']:,} train, {params['num_dev']:,} dev, "
        f"{params['num_test']:,} test)",
        out_dir,
        estimated_bytes(params),
        "generate fewer scenes (data.num_train, data.num_test)",
    )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        start = time.perf_counter()
        info = _write_all(tmp, mnist_root, params, progress)
        info["seconds"]["total"] = round(time.perf_counter() - start, 3)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        manifest = {"generator": "digit_scenes", "version": GENERATOR_VERSION, "params": params, "mnist": mnist}
        manifest.update(info)
        manifest["files"] = files
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        umask = os.umask(0)
        os.umask(umask)
        for path in tmp.iterdir():  # temporary files and folders are private (0600 / 0700): the usual modes
            path.chmod(0o666 & ~umask)
        tmp.chmod(0o777 & ~umask)
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def estimated_bytes(params: dict[str, Any]) -> int:
    """About the bytes :func:`generate_digit_scenes` writes for ``params`` (see :func:`_params`), from the shapes:
    region features float32 ``(N, R, 64 + 5)``, boxes float32 ``(N, R, 4)``, the scenes of ``image_splits``
    uint8 ``(N, 3, H, W)``, plus about :data:`_TEXT_BYTES_PER_SCENE` of captions and scene descriptions per scene
    (measured on the defaults) and the region CNN's weights (about 0.1 MB)."""
    counts = {"train": params["num_train"], "dev": params["num_dev"], "test": params["num_test"]}
    per_scene = params["regions"] * 4 * (_CNN_CHANNELS[-1] + GEOMETRY_DIM + 4) + _TEXT_BYTES_PER_SCENE
    scenes = sum(counts[s] for s in params["image_splits"]) * 3 * params["canvas"] ** 2
    return sum(counts.values()) * per_scene + scenes + 100_000


def _swap_in(new: Path, out_dir: Path) -> None:
    """Rename the folder ``new`` to ``out_dir``; a previous ``out_dir`` is moved aside first and deleted after
    (or moved back if the rename fails)."""
    if not out_dir.exists():
        os.replace(new, out_dir)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    old = aside / out_dir.name
    os.replace(out_dir, old)
    try:
        os.replace(new, out_dir)
    except BaseException:
        if not out_dir.exists():
            os.replace(old, out_dir)
            aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class SceneImages:
    """The rendered scenes of some items, found by :func:`find_scene_images` (for figures only)."""

    folder: Path  # the generated dataset folder
    split: str
    images: np.ndarray  # uint8 (B, 3, H, W), the rendered canvases
    boxes: np.ndarray  # float32 (B, R, 4), the region boxes (x0, y0, x1, y1) / canvas, in feature order
    digits: list[list[SceneDigit]]  # the digits of each scene (``region``: the index of the digit's box)


def _scene_folders(roots: Sequence[str | os.PathLike]) -> list[Path]:
    """Generated dataset folders: each root that is one (holds a manifest), else its ``digit_scenes_*`` folders."""
    found = []
    for root in (Path(r).expanduser() for r in roots):
        if (root / MANIFEST_NAME).is_file():
            found.append(root)
        elif root.is_dir():
            found.extend(p for p in sorted(root.glob("digit_scenes_*")) if (p / MANIFEST_NAME).is_file())
    return found


def find_scene_images(
    features: np.ndarray | Tensor,
    image_ids: np.ndarray | Tensor,
    roots: Sequence[str | os.PathLike] | None = None,
    atol: float = 1e-5,
) -> SceneImages | None:
    """The rendered scenes behind region features, for figures; ``None`` when none is found.

    features: ``(B, R, D)`` region features of ``B`` items; image_ids: ``(B,)`` the index of each item's image
    in its split (column 0 of the image-text targets). Searched: every generated folder in ``roots`` (a root is
    either such a folder or a cache folder holding ``digit_scenes_*`` folders; default: the default cache,
    :func:`rlattention.data.cache.default_cache_dir`) and every split of it whose scenes were saved
    (``image_splits``, dev and test by default). A split matches when its saved features of those images equal
    ``features`` (within ``atol``), so a figure never shows the wrong scene. Nothing is generated or written;
    the feature files are memory-mapped, only the rows of ``image_ids`` are read.
    """
    if roots is None:
        from rlattention.data.cache import default_cache_dir

        default = default_cache_dir()
        roots = [default] if default is not None else []
    feats = np.asarray(features.detach().cpu() if isinstance(features, Tensor) else features, dtype=np.float32)
    ids = np.asarray(image_ids.detach().cpu() if isinstance(image_ids, Tensor) else image_ids, dtype=np.int64)
    if feats.ndim != 3 or ids.shape != feats.shape[:1] or len(ids) == 0 or ids.min() < 0:
        return None
    for folder in _scene_folders(roots):
        for split in SPLITS:
            if not all((folder / name).is_file() for name in _split_files(split, with_images=True)):
                continue
            try:
                saved = np.load(folder / f"{split}_ims.npy", mmap_mode="r", allow_pickle=False)
                if saved.shape[1:] != feats.shape[1:] or ids.max() >= len(saved):
                    continue
                if not np.allclose(saved[ids], feats, rtol=0.0, atol=atol):
                    continue
                images = np.load(folder / f"{split}_scenes.npy", mmap_mode="r", allow_pickle=False)
                boxes = np.load(folder / f"{split}_boxes.npy", mmap_mode="r", allow_pickle=False)
                scenes = read_scene_descriptions(folder, split)
            except (OSError, ValueError):
                continue
            return SceneImages(
                folder, split, np.array(images[ids]), np.array(boxes[ids], dtype=np.float32), [scenes[i] for i in ids]
            )
    return None


@register_dataset("digit_scenes")
def build_digit_scenes(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Generate (once, cached) captioned digit scenes from real MNIST digits in ``data_dir`` and read them
    through the precomp path."""
    if data_dir is None:
        raise ValueError("digit_scenes needs the MNIST idx files: pass --data-dir or set RLATTENTION_DATA")
    cache = resolve_cache_dir(getattr(cfg, "render_cache", None))
    if cache is None:
        raise ValueError("digit_scenes writes a precomp folder: data.render_cache must not disable the cache")
    n_train = int(getattr(cfg, "num_train", 0) or 0) or 10000
    n_test = int(getattr(cfg, "num_test", 0) or 0) or 1000
    seed = int(getattr(cfg, "seed", 0))
    folder = Path(cache) / f"digit_scenes_s{seed}_{n_train}_{n_test}"
    generate_digit_scenes(
        folder, data_dir, num_train=n_train, num_dev=n_test, num_test=n_test, seed=seed, progress=True
    )  # announced first (what, where, about how many bytes); over $RLATTENTION_CACHE_LIMIT: refused
    sub = type("Cfg", (), {"test_split": "test", "max_caption_len": getattr(cfg, "max_caption_len", 0)})()
    return load_precomp_splits(folder, sub, "digit_scenes")
