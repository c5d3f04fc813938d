"""DCPG on a tiny synthetic image-text task (the real readers and the digit-scene generator are tested in
tests/data): every ablation of Table 4 builds, trains through the engine and evaluates with the retrieval
metrics; evaluation is deterministic and BatchNorm-free; the policy losses reach only the policies."""

from __future__ import annotations

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
    "pg_baseline": {"pg_baseline": True, "estimator": "straight_through"},
}


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_every_ablation_fits_and_evaluates(tmp_path, name):
    cfg = from_dict(
        {
            "method": "dcpg",
            "data": {"name": "synthetic"},
            "model": small(**ABLATIONS[name]),
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
