"""The cross-validated recipe selection of benchmarks/sbir_recipes.py: folds partition the training photos, a
held-out fold's photos never reach the heads trained for it, a recipe that can retrieve scores above one that
cannot, and the chosen recipe's overrides are valid ``rlattention fit`` settings that mean what the recipe says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlattention.engine.config import load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recipes(benchmark_module):
    return benchmark_module("sbir_recipes")


def features(photos: int = 20, per: int = 3, dim: int = 16, noise: float = 0.3, seed: int = 0) -> dict:
    """Sketch features = their photo's features + noise (mirrors: the same), one key ``l4g1``."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(photos, dim, generator=g)
    y = torch.arange(photos).repeat_interleave(per)
    s = base[y] + noise * torch.randn(len(y), dim, generator=g)
    return {"y": y, "s": {"l4g1": s}, "sf": {"l4g1": s}, "p": {"l4g1": base[y]}, "pf": {"l4g1": base[y]}}


def test_folds_partition_the_photos_and_are_seeded(recipes):
    y = torch.arange(23).repeat_interleave(2)
    folds = recipes.photo_folds(y, 5, seed=0)
    ids = torch.cat(folds)
    assert sorted(ids.tolist()) == list(range(23)) and {len(f) for f in folds} == {4, 5}
    assert all(torch.equal(a, b) for a, b in zip(folds, recipes.photo_folds(y, 5, seed=0), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(folds, recipes.photo_folds(y, 5, seed=1), strict=True))
    with pytest.raises(ValueError, match="--folds"):
        recipes.photo_folds(y, 1, seed=0)


def test_held_out_photos_never_train_and_a_real_signal_beats_none(recipes, monkeypatch):
    data = features()
    folds = recipes.photo_folds(data["y"], 4, seed=0)
    seen = []
    real = recipes.train_heads

    def spy(d, *args, **kw):
        seen.append((set(d["train"]["y"].tolist()), set(d["val"]["y"].tolist())))
        return real(d, *args, **kw)

    monkeypatch.setattr(recipes, "train_heads", spy)
    good = recipes.cross_validate(data, ["l4g1"], {"epochs": 10, "lr": 3e-3, "bs": 8}, folds, seed=0)
    assert len(seen) == 4
    for (train, held), fold in zip(seen, folds, strict=True):
        assert held == set(fold.tolist()) and not train & held
    noise = features()
    noise["s"] = {"l4g1": torch.randn_like(noise["s"]["l4g1"])}  # sketches unrelated to their photos
    noise["sf"] = noise["s"]
    bad = recipes.cross_validate(noise, ["l4g1"], {"epochs": 10, "lr": 3e-3, "bs": 8}, folds, seed=0)
    assert good["cv_acc@1"] > 80 and good["cv_acc@1"] > bad["cv_acc@1"] + 30
    assert good["epochs"] == [5, 10] and good["best_epoch"] in (5, 10) and len(good["fold_acc@5"]) == 4


def test_library_overrides_are_valid_and_mean_the_recipe(recipes):
    keys, opts = recipes.CV_RECIPES["L3 3x3 + L4 2x2, linear 128-d, InfoNCE tau 0.2, lr 1e-3"]
    cfg = load_config(ROOT / "configs" / "darp_triplet_chairv2_lite0.yaml", recipes.library_overrides(keys, opts, 15))
    m = cfg.model
    assert list(m.feature_levels) == [3, 4] and list(m.feature_grid) == [3, 2]
    assert (m.embed_dim, m.loss, m.temperature, m.head) == (128, "infonce", 0.2, "linear")
    assert cfg.optim.lr == pytest.approx(1e-3) and cfg.optim.weight_decay == 0 and cfg.trainer.epochs == 15
    pooled = recipes.library_overrides(["l4g1"], {}, 40)
    cfg = load_config(ROOT / "configs" / "darp_triplet_chairv2_lite0.yaml", pooled)
    assert list(cfg.model.feature_levels) == [] and cfg.model.loss == "triplet" and cfg.model.embed_dim == 64
    for name, (keys, opts) in recipes.CV_RECIPES.items():  # every recipe maps onto the library
        assert "drop" not in opts, name
        load_config(
            ROOT / "configs" / "darp_triplet_chairv2_lite0.yaml",
            recipes.library_overrides(keys, {k: v for k, v in opts.items() if k != "epochs"}, 10),
        )
