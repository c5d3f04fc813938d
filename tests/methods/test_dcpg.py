"""DCPG on a tiny synthetic image-text task (the real readers and the digit-scene generator are tested in
tests/data): every ablation of Table 4 builds, trains through the engine and evaluates with the retrieval
metrics; evaluation is deterministic and BatchNorm-free; the policy losses reach only the policies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.image_text import GatheredImages
from rlattention.engine.config import from_dict
from rlattention.engine.method import DataInfo
from rlattention.engine.trainer import fit
from rlattention.methods.dcpg import DCPG, DCPGConfig, hardest_negative_triplet

R, FEAT, VOCAB, L = 4, 12, 20, 7


def synthetic_split(n_images: int, seed: int) -> ArrayDataset:
    """Image i has region features around a code c_i; its captions mention words derived from c_i."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(4, VOCAB, (n_images, 3), generator=g)
    feats = torch.nn.functional.one_hot(codes, VOCAB).float().sum(1)[:, None, None, :FEAT].expand(-1, 1, R, -1)
    feats = feats + 0.1 * torch.randn(n_images, 1, R, FEAT, generator=g)
    ids = torch.arange(n_images).repeat_interleave(5)
    tokens = torch.zeros(len(ids), L, dtype=torch.long)
    tokens[:, 0] = 1
    tokens[:, 1:4] = codes[ids][:, torch.randperm(3, generator=g)]
    tokens[:, 4] = 2
    return ArrayDataset(GatheredImages(feats.contiguous(), ids), torch.cat((ids[:, None], tokens), 1))


def synthetic_splits() -> DataSplits:
    train = synthetic_split(24, 0)
    return DataSplits(train, synthetic_split(6, 1), synthetic_split(6, 2), 24, "synthetic", {"vocab_size": VOCAB})


def small(**kw) -> dict:
    return {"embed_dim": 16, "word_dim": 8, "num_bins": 10, "gcn_layers": 1, **kw}


ABLATIONS = {
    "triplet": {"pg": "none", "instance_weight": 0.0, "decoding_weight": 0.0},
    "instance": {"pg": "none", "decoding_weight": 0.0},
    "baseline": {"pg": "none"},
    "discrete_pg": {"pg": "discrete"},
    "continuous_pg": {"pg": "continuous", "heads": 1},
    "multihead_continuous": {"pg": "continuous", "heads": 2},
    "dcpg": {},
    "reward_r1": {"reward": "r1"},
    "reward_ap": {"reward": "ap", "lam": 10.0},
    "pg_baseline": {"pg_baseline": True, "mu_grad": "none"},
    "noise_matched": {"noise_matched": True},  # the control: initial policy, no policy-gradient term
    "printed_scheme": {"estimator": "relaxed", "bin_map": "logistic", "init_std": None},  # the first runs' scheme
}


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_every_ablation_fits_and_evaluates(tmp_path, monkeypatch, name):
    monkeypatch.setenv("RLATTENTION_CACHE", str(tmp_path / "cache"))  # the figures look for scenes there
    cfg = from_dict(
        {
            "method": "dcpg",
            "data": {"name": "synthetic"},
            "model": small(**ABLATIONS[name]),
            "eval": {"viz_images": 2},
            "trainer": {
                "out_dir": str(tmp_path),
                "run_name": name,
                "max_steps": 3,
                "batch_size": 16,
                "eval_batch_size": 8,
                "progress": False,
                "num_threads": 1,
            },
        }
    )
    report = fit(cfg, splits=synthetic_splits())
    test = report["test"]
    assert test["images"] == 6 and test["count"] == 30
    assert test["rsum"] == pytest.approx(sum(test[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10)))
    # the attention figures written at the end of fit; the baselines (no policy) have none
    no_policy = ABLATIONS[name].get("pg") == "none"
    assert [Path(p).name for p in report["figures"]] == (
        [] if no_policy else ["dcpg_attention_000.png", "dcpg_attention_001.png"]
    )


def test_predictions_are_deterministic_and_losses_route_gradients():
    splits = synthetic_splits()
    torch.manual_seed(0)
    model = DCPG(DCPGConfig(**small()), DataInfo(splits.image_shape, splits.num_classes, splits.meta))
    images, targets = splits.train.images[torch.arange(16)], splits.train.targets[:16]
    out = model(images, targets)
    assert torch.isfinite(out.loss) and {"pg_d_image", "pg_c_image", "pg_d_text", "pg_c_text"} <= set(out.terms)
    pg = sum(v for k, v in out.terms.items() if k.startswith("pg_"))
    pg.backward(retain_graph=True)
    assert model.image_policy.w_mu.weight.grad.abs().sum() > 0 and model.text_policy.w_std.weight.grad.abs().sum() > 0
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.image_gru.parameters())
    for encoder in (model.region_fc, model.gcn, model.word_fc, model.word_embedding):  # pg_to_features=False
        assert all(p.grad is None or p.grad.abs().sum() == 0 for p in encoder.parameters())
    model.eval()
    a = model.predict_batch(images, targets)
    b = model.predict_batch(images, targets)
    assert torch.equal(a, b)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def test_hardest_negative_triplet_masks_captions_of_the_same_image():
    sims = torch.tensor([[0.9, 0.95, 0.1], [0.2, 0.8, 0.3], [0.1, 0.2, 0.7]])
    ids = torch.tensor([0, 0, 1])  # captions 0 and 1 belong to image 0
    same = ids[:, None] == ids[None, :]
    loss = hardest_negative_triplet(sims, same, margin=0.2)
    # row 0: hardest negative is column 2 (0.1), not column 1 (same image)
    expected_c = torch.tensor([max(0.0, 0.2 - 0.9 + 0.1), max(0.0, 0.2 - 0.8 + 0.3), max(0.0, 0.2 - 0.7 + 0.2)])
    expected_i = torch.tensor([max(0.0, 0.2 - 0.9 + 0.1), max(0.0, 0.2 - 0.8 + 0.2), max(0.0, 0.2 - 0.7 + 0.3)])
    assert loss.item() == pytest.approx((expected_c + expected_i).mean().item())


def test_needs_an_image_text_dataset():
    with pytest.raises(ValueError, match="vocab_size"):
        DCPG(DCPGConfig(), DataInfo((1, 28, 28), 10))
    with pytest.raises(ValueError, match="model.pg"):
        DCPG(DCPGConfig(pg="ppo"), DataInfo((1, 4, 12), 10, {"vocab_size": 20}))


# ---------------------------------------------------------------- figures (DCPG.visualize)

WORDS = [f"w{i}" for i in range(VOCAB - 4)]  # the ordinary words of ids 4.. (DataInfo.meta["vocab"])


def tiny_model(**kw) -> DCPG:
    splits = synthetic_splits()
    torch.manual_seed(0)
    meta = {**splits.meta, "vocab": WORDS}
    return DCPG(DCPGConfig(**small(**kw)), DataInfo(splits.image_shape, splits.num_classes, meta)).eval()


def record_plots(monkeypatch) -> list[dict]:
    """Wrap the figure writer so a test sees what each figure was given."""
    import rlattention.methods.dcpg as dcpg

    calls: list[dict] = []
    original = dcpg._plot_attention

    def spy(path, title, scene, boxes, region_names, region_heads, words, word_heads, note):
        calls.append(dict(scene=scene, boxes=boxes, names=region_names, region_heads=region_heads, words=words))
        return original(path, title, scene, boxes, region_names, region_heads, words, word_heads, note)

    monkeypatch.setattr(dcpg, "_plot_attention", spy)
    return calls


def assert_pngs(paths, count):
    assert len(paths) == count
    for p in paths:
        assert p.is_file() and p.stat().st_size > 1000 and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("heads", [2, 1])
def test_visualize_writes_one_figure_per_item_with_words_and_heads(tmp_path, monkeypatch, heads):
    model = tiny_model(heads=heads)
    model.scene_roots = (tmp_path / "no_scenes",)  # never the user's cache
    calls = record_plots(monkeypatch)
    test = synthetic_splits().test
    paths = model.visualize(test.images[torch.arange(3)], test.targets[:3], tmp_path / "figs")
    assert_pngs(paths, 3)
    assert [p.name for p in paths] == [f"dcpg_attention_{i:03d}.png" for i in range(3)]
    tokens = test.targets[0, 1:]
    expected = ["<start>", *(WORDS[t - 4] for t in tokens[1:4].tolist()), "<end>"]
    assert calls[0]["words"] == expected  # the caption's words from the vocabulary, padding dropped
    assert calls[0]["region_heads"].shape == (R, heads)
    assert calls[0]["scene"] is None and calls[0]["boxes"] is None  # synthetic features carry no box geometry
    weights, _ = model.attention(test.images[torch.arange(3)], test.targets[:3])
    assert torch.allclose(torch.as_tensor(calls[0]["region_heads"]).mean(-1), weights[0], atol=1e-6)


def test_visualize_without_a_vocabulary_shows_token_ids(tmp_path, monkeypatch):
    splits = synthetic_splits()  # meta has vocab_size only
    model = DCPG(DCPGConfig(**small()), DataInfo(splits.image_shape, splits.num_classes, splits.meta)).eval()
    model.scene_roots = (tmp_path,)
    calls = record_plots(monkeypatch)
    assert_pngs(model.visualize(splits.test.images[torch.arange(1)], splits.test.targets[:1], tmp_path), 1)
    assert calls[0]["words"][0] == "<start>" and calls[0]["words"][1] == f"#{int(splits.test.targets[0, 2])}"


def scene_features(n: int) -> tuple[torch.Tensor, np.ndarray]:
    """Region features ending with the digit-scenes geometry (x0, y0, x1, y1, area) / canvas; and the boxes."""
    g = torch.Generator().manual_seed(3)
    corner = 0.5 * torch.rand(n, R, 2, generator=g)
    size = 0.1 + 0.4 * torch.rand(n, R, 2, generator=g)
    boxes = torch.cat((corner, corner + size), -1)
    area = (size[..., 0] * size[..., 1])[..., None]
    feats = torch.cat((torch.randn(n, R, FEAT - 5, generator=g), boxes, area), -1)
    return feats, boxes.numpy()


def write_fake_scenes(folder, feats: torch.Tensor, boxes: np.ndarray) -> None:
    """A generated digit-scenes folder as find_scene_images reads it (test split only)."""
    import json

    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{}")
    n = len(feats)
    np.save(folder / "test_ims.npy", feats.numpy())
    np.save(folder / "test_boxes.npy", boxes.astype(np.float32))
    np.save(folder / "test_scenes.npy", np.full((n, 3, 40, 40), 60, dtype=np.uint8))
    (folder / "test_caps.txt").write_text("a red seven\n" * (5 * n))
    digit = {"label": 7, "colour": "red", "rgb": [230, 40, 40], "size": "small", "box": [1, 1, 5, 9], "region": 2}
    scenes = {"canvas": 40, "scenes": [{"digits": [digit]} for _ in range(n)]}
    (folder / "test_scenes.json").write_text(json.dumps(scenes))


def test_visualize_draws_the_digit_scene_or_the_feature_boxes(tmp_path, monkeypatch):
    model = tiny_model()
    feats, boxes = scene_features(4)
    ids = torch.tensor([2, 3])
    images = feats[ids][:, None]  # (B, 1, R, F) items of images 2 and 3
    targets = torch.cat((ids[:, None], synthetic_splits().test.targets[:2, 1:]), 1)
    write_fake_scenes(tmp_path / "cache" / "digit_scenes_s0_4_4", feats, boxes)
    calls = record_plots(monkeypatch)

    model.scene_roots = (tmp_path / "cache",)  # a cache folder holding generated folders
    assert_pngs(model.visualize(images, targets, tmp_path / "scene"), 2)
    assert calls[0]["scene"].shape == (3, 40, 40)
    np.testing.assert_allclose(calls[1]["boxes"], boxes[3])
    assert calls[0]["names"][2] == "2\nred 7" and calls[0]["names"][0] == "0"

    calls.clear()
    model.scene_roots = (tmp_path / "elsewhere",)  # no scenes: the geometry of the features
    assert_pngs(model.visualize(images[:1], targets[:1], tmp_path / "geometry"), 1)
    assert calls[0]["scene"] is None
    np.testing.assert_allclose(calls[0]["boxes"], boxes[2], atol=1e-6)

    calls.clear()
    model.scene_roots = (tmp_path / "cache",)  # other features: the saved scene must not be used
    assert_pngs(model.visualize(images[:1] + 0.5, targets[:1], tmp_path / "other"), 1)
    assert calls[0]["scene"] is None and calls[0]["boxes"] is None  # shifted geometry fails the check too


def test_visualize_without_a_policy_raises_a_clear_error(tmp_path):
    from rlattention.methods.dcpg import NoAttentionPolicyError

    model = tiny_model(pg="none")
    test = synthetic_splits().test
    with pytest.raises(NoAttentionPolicyError, match="pg=none") as err:
        model.visualize(test.images[torch.arange(2)], test.targets[:2], tmp_path)
    assert isinstance(err.value, NotImplementedError) and isinstance(err.value, ValueError)  # fit skips; CLI reports
    assert not any(tmp_path.iterdir())
