"""What a DCPG checkpoint's attention selects on captioned digit scenes: the mean deterministic weight (mean actions,
mean over heads: the weights of eq. 11) of the digit regions against the distractor regions, and of the caption
words by kind (digit words, colours, sizes, relation words, the rest), over a whole split.

    RLATTENTION_CACHE=/tmp/rlcache python benchmarks/dcpg_attention_stats.py \\
        runs/studies/dcpg_digit_scenes/full_s0/checkpoints/best.ckpt ... --data-dir ../shared/data/mnist

``--probe FOLDER`` (a generated digit-scenes folder, e.g. ``/tmp/rlcache/digit_scenes_s0_2500_1000``) also fits a
linear probe (logistic regression, L-BFGS, standardised features) from a region's features to "digit or
distractor" on the train split and prints its test accuracy: how much of the selection the encoder's first linear
layer can already do without any attention.

One markdown row per checkpoint. A region is a digit region when the split's scene descriptions
(``{split}_scenes.json`` of the generated folder, found by :func:`find_scene_images`, which checks the features)
assign a digit to it; the others are distractors. ``digit - distractor`` is the mean weight of the digit regions
minus that of the distractors, per image, averaged; ``sd`` columns: the spread of the weights within a kind over
the split. An attention that selects shows a gap far above the spread of an untrained policy (the
``noise_matched`` rows: the initial policy's mode).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from rlattention.data.synthetic.scene_captions import (  # noqa: E402
    COLOUR_NAMES,
    NUMBER_WORDS,
    RELATION_WORDS,
    SIZE_WORDS,
)

#: Word kinds, in table order; a word in none of them is "other" (articles, nouns, "and", "of", ...).
WORD_KINDS: dict[str, frozenset[str]] = {
    "digit": frozenset(NUMBER_WORDS) | frozenset(str(d) for d in range(10)),
    "colour": frozenset(COLOUR_NAMES),
    "size": frozenset(w for words in SIZE_WORDS.values() for w in words),
    "relation": frozenset(w for phrases in RELATION_WORDS.values() for p in phrases for w in p.split())
    - {"of", "the", "to", "on"},
}


def word_kind(word: str) -> str:
    for kind, words in WORD_KINDS.items():
        if word in words:
            return kind
    return "other"


def attention_stats(model, images: torch.Tensor, targets: torch.Tensor, batch: int = 500) -> dict[str, float]:
    """Mean and sd of the deterministic attention of the digit and distractor regions and of each word kind, over
    the items ``images`` ``(N, 1, R, F)``, ``targets`` ``(N, 1 + L)``; raises when the scenes are not found."""
    from rlattention.data.synthetic.digit_scenes import find_scene_images

    region_w: dict[str, list[float]] = {"digit": [], "distractor": []}
    gaps: list[float] = []
    word_w: dict[str, list[float]] = {k: [] for k in (*WORD_KINDS, "other")}
    seen: set[int] = set()
    for start in range(0, len(targets), batch):
        im, tg = images[start : start + batch], targets[start : start + batch]
        region_att, word_att = model.attention(im, tg)
        regions = im.flatten(1, -2).float()
        scenes = find_scene_images(regions, tg[:, 0], list(model.scene_roots) or None)
        if scenes is None:
            raise FileNotFoundError(
                "the rendered digit scenes of these items were not found (set RLATTENTION_CACHE to the cache the "
                f"run generated its data in; searched {list(model.scene_roots) or 'the default cache'})"
            )
        for i in range(len(tg)):
            tokens = tg[i, 1:]
            keep = tokens != 0
            for word, w in zip(model._words(tokens[keep].tolist()), word_att[i][keep].tolist(), strict=True):
                if not word.startswith("<"):
                    word_w[word_kind(word)].append(w)
            image = int(tg[i, 0])
            if image in seen:  # the image's regions once, not once per caption
                continue
            seen.add(image)
            digit = np.zeros(regions.shape[1], dtype=bool)
            digit[[d.region for d in scenes.digits[i] if d.region >= 0]] = True
            att = region_att[i].numpy()
            region_w["digit"] += att[digit].tolist()
            region_w["distractor"] += att[~digit].tolist()
            if digit.any() and (~digit).any():
                gaps.append(float(att[digit].mean() - att[~digit].mean()))
    out = {"images": float(len(seen)), "digit - distractor": float(np.mean(gaps))}
    for kind, values in {**region_w, **{f"word {k}": v for k, v in word_w.items()}}.items():
        out[f"{kind}"] = float(np.mean(values)) if values else float("nan")
        out[f"{kind} sd"] = float(np.std(values)) if values else float("nan")
    return out


def distractor_probe(folder: str | Path) -> tuple[float, float]:
    """(test accuracy, fraction of digit regions in test) of a logistic regression from one region's features to
    digit (True) / distractor, fitted on the train split of a generated digit-scenes folder."""
    from rlattention.data.synthetic.digit_scenes import read_scene_descriptions

    def split(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        features = np.load(Path(folder) / f"{name}_ims.npy", allow_pickle=False)
        digit = np.zeros(features.shape[:2], dtype=np.float32)
        for i, scene in enumerate(read_scene_descriptions(folder, name)):
            digit[i, [d.region for d in scene if d.region >= 0]] = 1.0
        return torch.tensor(features.reshape(-1, features.shape[-1])), torch.tensor(digit.reshape(-1))

    (x, y), (x_test, y_test) = split("train"), split("test")
    mean, std = x.mean(0), x.std(0) + 1e-6
    probe = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.LBFGS(probe.parameters(), max_iter=200)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(probe((x - mean) / std).squeeze(1), y)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        correct = (probe((x_test - mean) / std).squeeze(1) > 0).float() == y_test
    return float(correct.float().mean()), float(y_test.mean())


COLUMNS = ("digit", "distractor", "digit - distractor", "word digit", "word colour", "word size", "word relation",
           "word other")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from dcpg_figures import load_dcpg

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="*", metavar="[LABEL=]CKPT")
    ap.add_argument("--probe", metavar="FOLDER", help="also the linear digit/distractor probe of this scenes folder")
    ap.add_argument("--data-dir", help="the dataset folder, as for rlattention viz (digit_scenes: the MNIST folder)")
    ap.add_argument("--split", default="test", choices=["test", "val"])
    args = ap.parse_args(argv)
    if args.probe:
        torch.manual_seed(0)
        accuracy, share = distractor_probe(args.probe)
        print(f"Linear probe, region features -> digit/distractor: test accuracy {100 * accuracy:.2f}% "
              f"(digit regions: {100 * share:.1f}% of the test regions)\n")  # fmt: skip
    if not args.checkpoints:
        return 0
    head = "| checkpoint | " + " | ".join(f"{c} (sd)" if c != "digit - distractor" else c for c in COLUMNS) + " |"
    print(head)
    print("|" + "---|" * (len(COLUMNS) + 1))
    for spec in args.checkpoints:
        label, _, path = spec.rpartition("=") if "=" in spec else (spec, "", spec)
        model, splits = load_dcpg(path, args.data_dir)
        ds = getattr(splits, args.split)
        stats = attention_stats(model, ds.images, ds.targets)
        cells = [
            f"{stats[c]:+.3f}" if c == "digit - distractor" else f"{stats[c]:.3f} ({stats[c + ' sd']:.3f})"
            for c in COLUMNS
        ]
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
