"""benchmarks/dcpg_attention_stats.py: word kinds, and the digit / distractor statistics of known attention weights
(a stub model and stub scenes: no training, no generated data)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "dcpg_attention_stats.py"


@pytest.fixture(scope="module")
def stats(benchmark_module):
    return benchmark_module("dcpg_attention_stats")


def test_word_kinds(stats):
    kinds = [stats.word_kind(w) for w in ("seven", "7", "red", "tiny", "left", "above", "of", "a", "digit")]
    assert kinds == ["digit", "digit", "colour", "size", "relation", "relation", "other", "other", "other"]


class _StubModel:
    """Region weights 0.9 on region 0 and 0.1 elsewhere; word weights 0.8 for token 5 ('seven'), 0.2 else."""

    scene_roots = ()

    def attention(self, images, targets):
        region = torch.full((len(images), images.shape[-2]), 0.1)
        region[:, 0] = 0.9
        tokens = targets[:, 1:]
        return region, torch.where(tokens == 5, 0.8, 0.2)

    def _words(self, tokens):
        return [{1: "<start>", 2: "<end>", 5: "seven", 6: "the"}[t] for t in tokens]


def test_digit_and_distractor_means_count_each_image_once(stats, monkeypatch):
    import rlattention.data.synthetic.digit_scenes as scenes

    # 3 items: images 0, 0 (a second caption), 1; 4 regions each; image 0's digits in regions 0 and 1, image 1's in 0
    digits = {0: [SimpleNamespace(region=0), SimpleNamespace(region=1)], 1: [SimpleNamespace(region=0)]}
    monkeypatch.setattr(
        scenes,
        "find_scene_images",
        lambda features, ids, roots=None: SimpleNamespace(digits=[digits[int(i)] for i in ids]),
    )
    images = torch.zeros(3, 1, 4, 6)
    targets = torch.tensor([[0, 1, 5, 6, 2], [0, 1, 6, 2, 0], [1, 1, 5, 2, 0]])
    out = stats.attention_stats(_StubModel(), images, targets, batch=1)  # image 0 in two batches
    assert out["images"] == 2
    # digit weights: image 0 (0.9, 0.1), image 1 (0.9); distractors: image 0 (0.1, 0.1), image 1 (0.1 x 3)
    assert out["digit"] == pytest.approx((0.9 + 0.1 + 0.9) / 3)
    assert out["distractor"] == pytest.approx(0.1)
    assert out["digit - distractor"] == pytest.approx(((0.5 - 0.1) + (0.9 - 0.1)) / 2)
    assert out["word digit"] == pytest.approx(0.8) and out["word other"] == pytest.approx(0.2)  # <start>/<end> out
