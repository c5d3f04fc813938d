"""Self-critical attention (scal) on tiny synthetic re-id data: rewards, gradient routing, losses, and a fit
through the engine with the P x K sampler (the Market/Omniglot readers are tested in tests/data/test_reid_datasets.py,
the metrics in tests/metrics/test_reid_metrics.py)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.fabric import Fabric

from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.engine.checkpoint import load_checkpoint_file
from rlattention.engine.config import from_dict
from rlattention.engine.method import DataInfo
from rlattention.engine.trainer import evaluate, fit
from rlattention.methods.scal import SCAL, SCALConfig, attention_rewards, batch_hard_triplet

ROOT = Path(__file__).resolve().parents[2]
OMNIGLOT = ROOT.parent / "shared" / "data" / "omniglot"
SIDE = 16


def model(**kw) -> SCAL:
    torch.manual_seed(0)
    cfg = SCALConfig(**{"width": 8, "critic_hidden": 16, "pad": 0, **kw})
    return SCAL(cfg, DataInfo((1, SIDE, SIDE), 6))


def batch(n_ids: int = 3, k: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    labels = torch.arange(n_ids).repeat_interleave(k)
    proto = torch.rand(n_ids, 1, SIDE, SIDE, generator=g)
    x = (proto[labels] + 0.2 * torch.rand(len(labels), 1, SIDE, SIDE, generator=g)).clamp(0, 1)
    targets = torch.stack([labels, labels % 2, torch.zeros_like(labels)], 1)
    return x, targets


# -- rewards ---------------------------------------------------------------------------------------------------
def test_rewards_on_hand_made_predictions():
    labels = torch.tensor([0, 1, 2, 0])
    att = torch.tensor([[3.0, 0, 0], [0, 0, 2.0], [0, 0, 1.0], [0, 0, 0]])
    plain = torch.tensor([[1.0, 0, 0], [0, 0, 1.0], [0, 0, 1.0], [0, 0, 0]])
    r = attention_rewards(att, plain, labels)
    assert r["reward_classification"].tolist() == [1, 0, 1, 0]  # predicted 0, 2 (wrong), 2, a 3-way tie (not right)
    assert r["reward_amelioration"].tolist() == [1, 0, 0, 0]  # p_y up / down / equal / equal (strict >)
    assert r["reward"].tolist() == [2, 0, 1, 0]
    assert attention_rewards(att, plain, labels, "classification")["reward"].tolist() == [1, 0, 1, 0]
    assert attention_rewards(att, plain, labels, "amelioration")["reward"].tolist() == [1, 0, 0, 0]
    with pytest.raises(ValueError, match="model.reward"):
        attention_rewards(att, plain, labels, "rank")


def test_amelioration_reward_compares_with_attention_switched_off():
    m = model()
    x, t = batch()
    m.train()
    out = m(x, t)
    with torch.no_grad():  # the same weights, the same batch statistics: attended vs plain pass
        _, fb, _ = m.embed(x)
        _, fb_plain, _ = m.embed(x, attend=False)
        expected = attention_rewards(m.classifier(fb), m.classifier(fb_plain), t[:, 0])
    for key in ("reward", "reward_classification", "reward_amelioration"):
        assert torch.allclose(out.stats[key], expected[key].mean())
    # attention "off" is the plain backbone: the stages without any module in between
    with torch.no_grad():
        y = x
        for stage in m.backbone.stages():
            y = stage(y)
        assert torch.allclose(m.bnneck(y.mean((2, 3))), fb_plain, atol=1e-6)


def test_the_plain_pass_leaves_batchnorm_statistics_alone():
    m = model()
    ref = copy.deepcopy(m)
    x, t = batch()
    m(x, t)
    with torch.no_grad():
        ref.embed(x)  # only the attended pass may move the running statistics
    for (name, a), b in zip(m.named_buffers(), ref.buffers(), strict=True):
        assert torch.equal(a, b), name


# -- gradient routing ------------------------------------------------------------------------------------------
def _grads(m: SCAL) -> dict[str, bool]:
    return {n: p.grad is not None and bool(p.grad.abs().sum() > 0) for n, p in m.named_parameters()}


PARTS = ("backbone", "agents", "critic", "classifier", "bnneck")


def _groups(g: dict[str, bool]) -> dict[str, bool]:
    return {part: any(v for n, v in g.items() if n.startswith(part)) for part in PARTS}


def _only(*parts: str) -> dict[str, bool]:
    return {part: part in parts for part in PARTS}


def test_critic_loss_reaches_the_agent_only():
    m = model()
    x, t = batch()
    out = m(x, t)
    out.terms["critic"].backward()
    assert _groups(_grads(m)) == _only("agents")
    # every module of the stack gets the critic's signal
    assert all(_grads(m)[f"agents.{i}.channel.2.weight"] for i in range(5))


def test_mse_loss_reaches_the_critic_only():
    m = model()
    x, t = batch()
    out = m(x, t)
    out.terms["critic_mse"].backward()
    assert _groups(_grads(m)) == _only("critic")


def test_reid_losses_train_backbone_agents_and_heads_but_not_the_critic():
    m = model()
    x, t = batch()
    out = m(x, t)
    (out.terms["triplet"] + out.terms["cross_entropy"]).backward()
    g = _groups(_grads(m))
    assert g["backbone"] and g["agents"] and g["classifier"] and not g["critic"]
    assert m.bnneck.bias.grad is None  # BNNeck: no shift


def test_the_full_loss_is_the_sum_of_its_terms():
    m = model()
    out = m(*batch())
    assert torch.allclose(out.loss, sum(out.terms.values()))
    assert set(out.terms) == {"triplet", "cross_entropy", "critic", "critic_mse"}


@pytest.mark.parametrize("mode,terms", [("weak", {"triplet", "cross_entropy"}), ("none", {"triplet", "cross_entropy"})])
def test_ablations_have_no_critic(mode, terms):
    m = model(attention=mode)
    out = m(*batch())
    assert set(out.terms) == terms and m.critic is None
    assert (len(m.agents) == 0) == (mode == "none")


# -- losses ----------------------------------------------------------------------------------------------------
def test_label_smoothing_is_the_papers_formula():
    m = model(label_smoothing=0.2, triplet_weight=0.0)
    x, t = batch()
    out = m(x, t)
    with torch.no_grad():
        _, fb, _ = m.embed(x)
        logp = m.classifier(fb).log_softmax(1)
    K = logp.shape[1]
    y = F.one_hot(t[:, 0], K).float()
    expected = -(logp * ((1 - 0.2) * y + 0.2 / K)).sum(1).mean()
    assert torch.allclose(out.terms["cross_entropy"], expected, atol=1e-5)


def _batch_hard_reference(emb, labels, margin):
    losses, hits = [], []
    for i in range(len(labels)):
        pos = [torch.dist(emb[i], emb[j]) for j in range(len(labels)) if j != i and labels[j] == labels[i]]
        neg = [torch.dist(emb[i], emb[j]) for j in range(len(labels)) if labels[j] != labels[i]]
        if not pos or not neg:
            continue
        losses.append(torch.relu(max(pos) - min(neg) + margin))
        hits.append(float(min(neg) > max(pos)))
    return torch.stack(losses).mean(), sum(hits) / len(hits)


@pytest.mark.parametrize("seed", range(5))
def test_batch_hard_triplet_matches_a_slow_reference(seed):
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(14, 5, generator=g)
    labels = torch.randint(0, 4, (14,), generator=g)
    labels[0] = 9  # an anchor without a positive is left out
    loss, acc = batch_hard_triplet(emb, labels, 0.5)
    ref_loss, ref_acc = _batch_hard_reference(emb, labels, 0.5)
    assert torch.allclose(loss, ref_loss, atol=1e-5) and acc.item() == pytest.approx(ref_acc)


def test_bad_config_values_are_named():
    for kw, key in [
        ({"attention": "soft"}, "model.attention"),
        ({"attention_types": ["temporal"]}, "model.attention_types"),
        ({"positions": [0, 7]}, "model.positions"),
        ({"backbone": "vgg"}, "model.backbone"),
        ({"eval_feature": "logits"}, "model.eval_feature"),
    ]:
        with pytest.raises(ValueError, match=key):
            model(**kw)


# -- engine ----------------------------------------------------------------------------------------------------
def synthetic_reid(seed: int = 0) -> DataSplits:
    """Identities = random blob patterns; cameras = two brightness/shift variants."""
    g = torch.Generator().manual_seed(seed)
    protos = (torch.rand(30, 1, SIDE, SIDE, generator=g) > 0.7).float()

    def items(ids: list[int], roles: list[int], relabel: dict | None = None) -> ArrayDataset:
        ids_t = torch.tensor(ids)
        cams = torch.arange(len(ids)) % 2
        x = protos[ids_t] * (0.6 + 0.4 * cams.float())[:, None, None, None]
        x = (x + 0.15 * torch.rand(x.shape, generator=g)).clamp(0, 1)
        pids = torch.tensor([relabel[i] for i in ids]) if relabel else ids_t + 1
        return ArrayDataset((x * 255).to(torch.uint8), torch.stack([pids, cams, torch.tensor(roles)], 1))

    train_ids = [i for i in range(12) for _ in range(6)]
    train = items(train_ids, [0] * len(train_ids), {i: i for i in range(12)})

    def eval_split(first: int) -> ArrayDataset:
        ids = list(range(first, first + 6))
        q = items([i for i in ids for _ in range(2)], [1] * 12)  # one query per camera
        gal = items([i for i in ids for _ in range(4)], [2] * 24)
        return ArrayDataset(torch.cat([q.images, gal.images]), torch.cat([q.targets, gal.targets]))

    return DataSplits(train, eval_split(12), eval_split(20), 12, name="synthetic_reid", meta={"reid": True})


def run(tmp_path: Path, model_cfg: dict, name: str, steps: int = 4) -> dict:
    cfg = from_dict(
        {
            "method": "scal",
            "data": {"name": "synthetic"},
            "model": {"width": 8, "critic_hidden": 16, **model_cfg},
            "trainer": {
                "out_dir": str(tmp_path),
                "run_name": name,
                "max_steps": steps,
                "batch_size": 12,
                "pk_instances": 3,
                "sampler": "pk",
                "eval_batch_size": 16,
                "progress": False,
                "num_threads": 1,
            },
            "eval": {"viz_images": 2},
        }
    )
    return fit(cfg, splits=synthetic_reid())


@pytest.mark.parametrize("mode", ["critic", "weak", "none"])
def test_fit_evaluate_reload_and_figures(tmp_path, mode):
    report = run(tmp_path, {"attention": mode}, mode)
    test = report["test"]
    assert {"rank1", "rank5", "rank10", "mAP"} <= set(test) and 0 <= test["mAP"] <= 100
    assert test["count"] == 12 and test["gallery"] == 24
    assert len(report["figures"]) == 2 and all(Path(p).stat().st_size > 0 for p in report["figures"])
    # the best checkpoint (weights only, no pickled code) rebuilds a model that scores the same
    ckpt = load_checkpoint_file(tmp_path / mode / "checkpoints" / "best.ckpt")
    splits = synthetic_reid()
    cfg = from_dict(ckpt["config"])
    again = SCAL.from_config(cfg.model, DataInfo(splits.image_shape, splits.num_classes))
    again.load_state_dict(ckpt["model"])
    fabric = Fabric(accelerator="cpu", devices=1)
    metrics = evaluate(fabric, fabric.setup_module(again), splits.test, 16)
    assert metrics["mAP"] == pytest.approx(test["mAP"]) and metrics["rank1"] == pytest.approx(test["rank1"])


@pytest.mark.skipif(not OMNIGLOT.is_dir(), reason=f"Omniglot zips not found at {OMNIGLOT}")
def test_smoke_fit_through_the_cli(tmp_path):
    cmd = [
        sys.executable, "-m", "rlattention.cli", "fit", "--config", str(ROOT / "configs" / "scal_omniglot.yaml"),
        "--data-dir", str(OMNIGLOT.parent), f"trainer.out_dir={tmp_path}", "trainer.run_name=smoke",
        "trainer.max_steps=2", "trainer.progress=false", "trainer.num_threads=1", "data.num_train=12",
        "trainer.batch_size=16", "data.num_test=6", "data.reid_val_ids=4", "eval.viz_images=1",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "smoke" / "report.json").read_text())
    assert report["test"]["count"] > 0 and "mAP" in report["test"]
