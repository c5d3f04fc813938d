"""The words of the captioned digit scenes (:mod:`rlattention.data.synthetic.digit_scenes`): a scene's digits
(:class:`SceneDigit`: class, colour, size, box), the spatial relation of two digits (:func:`relation`) and the
caption grammar (:func:`scene_captions`: five captions per scene from a seeded generator, each naming the digits
unambiguously).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlattention.data.readers.precomp import CAPTIONS_PER_IMAGE

__all__ = [
    "COLOUR_JITTER",
    "COLOUR_NAMES",
    "NUMBER_WORDS",
    "PALETTE",
    "RELATION_WORDS",
    "SIZE_WORDS",
    "SceneDigit",
    "relation",
    "scene_captions",
]


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
