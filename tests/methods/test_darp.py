"""DARP and its baselines on a tiny synthetic sketch-retrieval task (the real readers are tested in
tests/data): phase 1 trains and writes its artifact, phase 2 reads it; gradients go where the paper says
(locator by the policy gradient only, glimpse/RNN/action networks by the supervised loss only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.engine.checkpoint import load_checkpoint_file
from rlattention.engine.config import from_dict
from rlattention.engine.method import DataInfo
from rlattention.engine.registry import get_method
from rlattention.engine.trainer import fit
from rlattention.methods.darp import DARP, DARPConfig, EmbeddingPolicy, PolicyConfig, load_phase1, training_gallery
from rlattention.metrics.sketch import true_ranks

S, SIDE, PHOTOS = 3, 32, 12


def synthetic_splits(seed: int = 0) -> DataSplits:
    """Each photo i has a distinct bar pattern; its sketches are noisy copies drawn progressively."""
    g = torch.Generator().manual_seed(seed)
    base = (torch.rand(PHOTOS, SIDE, SIDE, generator=g) > 0.85).float()

    def items(photo_ids: list[int]) -> ArrayDataset:
        n = len(photo_ids)
        ids = torch.tensor(photo_ids)
        full = base[ids] * (torch.rand(n, SIDE, SIDE, generator=g) > 0.2).float()
        keep = torch.linspace(0.3, 1.0, S)
        order = torch.rand(n, 1, SIDE, SIDE, generator=g)
        partial = full[:, None] * (order <= keep[None, :, None, None]).float()  # ink grows with the step
        photo = base[ids][:, None].expand(-1, 3, -1, -1) * torch.tensor([1.0, 0.5, 0.25])[None, :, None, None]
        images = (torch.cat((partial, photo), 1) * 255).to(torch.uint8)
        return ArrayDataset(images, ids)

    train = items([i % 8 for i in range(48)])
    val = items([8 + i % 2 for i in range(8)])
    test = items([10 + i % 2 for i in range(8)])
    return DataSplits(train, val, test, PHOTOS, name="synthetic_sketches")


def run(tmp_path: Path, method: str, model: dict, name: str, steps: int = 3) -> dict:
    cfg = from_dict(
        {
            "method": method,
            "data": {"name": "synthetic"},
            "model": model,
            "trainer": {
                "out_dir": str(tmp_path),
                "run_name": name,
                "max_steps": steps,
                "batch_size": 16,
                "eval_batch_size": 16,
                "progress": False,
                "num_threads": 1,
            },
            "eval": {"viz_images": 1},
        }
    )
    return fit(cfg, splits=synthetic_splits())


@pytest.fixture(scope="module")
def phase1(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("darp")
    report = run(tmp, "darp_triplet", {"channels": [8, 16], "augment_degrees": 5.0}, "p1", steps=4)
    assert report["artifacts"] == [str(tmp / "p1" / "phase1.safetensors")]
    assert set(report["test"]) >= {"acc@1", "acc@5", "acc@10", "auir", "percentile", "count", "gallery"}
    assert report["test"]["gallery"] == 2 and report["test"]["count"] == 8
    return tmp / "p1" / "phase1.safetensors"


def test_phase1_shared_backbone_exports_and_loads(tmp_path):
    report = run(tmp_path, "darp_triplet", {"channels": [8], "shared_backbone": True}, "shared", steps=1)
    p1 = load_phase1(report["artifacts"][0], DataInfo((S + 3, SIDE, SIDE), PHOTOS))
    assert p1.net.sketch_net is p1.net.photo_net


def test_bad_phase2_config_values_are_named(phase1):
    info = DataInfo((S + 3, SIDE, SIDE), PHOTOS)
    for key, value in (("target_sync", 0), ("mask_prob", 0.0), ("gamma", 1.5), ("num_heads", 0), ("epsilon", 2.0)):
        with pytest.raises(ValueError, match=f"model.{key}"):
            DARP.from_config(DARPConfig(**small_darp(phase1, **{key: value})), info)
    for key, value in (("std", 0.0), ("gamma", 2.0), ("ppo_memory", 0)):
        with pytest.raises(ValueError, match=f"model.{key}"):
            EmbeddingPolicy.from_config(PolicyConfig(phase1=str(phase1), **{key: value}), info)


def small_darp(phase1: Path, **kw) -> dict:
    return {"phase1": str(phase1), "glimpses_per_step": 2, "hidden_size": 32, "glimpse_dim": 16, **kw}


def test_phase1_artifact(phase1):
    info = DataInfo((S + 3, SIDE, SIDE), PHOTOS)
    p1 = load_phase1(phase1, info)
    assert p1.gallery.shape == (PHOTOS, 64) and bool(p1.present.all())
    assert torch.allclose(p1.gallery.norm(dim=1), torch.ones(PHOTOS), atol=1e-5)
    assert not any(p.requires_grad for p in p1.parameters())
    with pytest.raises(ValueError, match="13 photos|written for 12 photos"):
        load_phase1(phase1, DataInfo((S + 3, SIDE, SIDE), PHOTOS + 1))
    with pytest.raises(FileNotFoundError, match="train phase 1 first"):
        load_phase1(phase1.parent / "missing.safetensors", info)
    bad = phase1.parent / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="bad.safetensors"):
        load_phase1(bad, info)


@pytest.mark.parametrize(
    "model",
    [
        {},
        {"baseline": True, "core": "rnn", "h0": "zeros"},
        {"locator": "dqn", "grid": 4, "target_sync": 1},
        {"reward": "inverse_rank", "bootstrap_update": "acting"},
        {"context": True},
        {"locator": "raster", "eval_ensemble": "embeddings"},
    ],
    ids=["darp", "darp_baseline_rnn", "bootstrapped_dqn", "inverse_rank_acting", "context", "raster"],
)
def test_phase2_smoke_fit_and_eval(tmp_path, phase1, model):
    report = run(tmp_path, "darp", small_darp(phase1, **model), "p2")
    assert report["steps"] == 3 and 0.0 <= report["test"]["auir"] <= 100.0  # percent
    assert any(p.endswith("_step03.png") for p in report["figures"])
    ckpt = load_checkpoint_file(tmp_path / "p2" / "checkpoints" / "last.ckpt")  # weights only
    loaded = DARP.from_config(DARPConfig(**ckpt["config"]["model"]), DataInfo((S + 3, SIDE, SIDE), PHOTOS))
    loaded.load_state_dict(ckpt["model"])
    assert int(loaded.step_count) == 3
    assert (loaded.train_row >= 0).sum() == 8  # the training gallery survives the checkpoint


@pytest.mark.parametrize(
    ("method", "model"),
    [("darp", {"glimpses_per_step": 2, "hidden_size": 32, "glimpse_dim": 16}), ("darp_policy", {"hidden_size": 16})],
)
def test_phase2_checkpoint_needs_no_phase1_file(tmp_path, phase1, method, model):
    """A phase-2 checkpoint carries its phase-1 networks: it evaluates and resumes after the phase-1 file is
    gone, and a different phase-1 file at that path does not change it."""
    p1 = tmp_path / "phase1.safetensors"
    shutil.copy(phase1, p1)
    run(tmp_path, method, {**model, "phase1": str(p1)}, "p2")
    last = tmp_path / "p2" / "checkpoints" / "last.ckpt"
    ckpt = load_checkpoint_file(last)
    cls, info = get_method(method), DataInfo((S + 3, SIDE, SIDE), PHOTOS)
    cfg = cls.Config(**ckpt["config"]["model"])
    images = synthetic_splits().test.images[:4].float() / 255

    def predict() -> torch.Tensor:
        m = cls.from_checkpoint(cfg, info, ckpt["model"])
        m.load_state_dict(ckpt["model"])
        return m.eval().predict(images)

    before = predict()
    p1.unlink()
    with pytest.raises(FileNotFoundError):
        cls.from_config(cfg, info)  # the file is gone...
    assert torch.equal(predict(), before)  # ...and the checkpoint does not need it
    # a phase-1 file of another training at the same path: the checkpoint keeps its own networks
    other = run(tmp_path, "darp_triplet", {"channels": [8, 16], "augment_degrees": 5.0, "margin": 0.5}, "o", 2)
    shutil.copy(other["artifacts"][0], p1)
    assert torch.equal(predict(), before)
    p1.unlink()
    resumed = fit(
        from_dict({**ckpt["config"], "trainer": {**ckpt["config"]["trainer"], "max_steps": 5}}),
        resume=last,
        splits=synthetic_splits(),
    )
    assert resumed["steps"] == 5
    # a broken record is named
    bad = dict(ckpt["model"], **{"phase1._extra_state": {"format": "something else"}})
    with pytest.raises(ValueError, match="phase1._extra_state"):
        cls.from_checkpoint(cfg, info, bad)
    # checkpoints written before the record: phase 1 from the file, the weights still load
    old = {k: v for k, v in ckpt["model"].items() if not k.endswith("_extra_state")}  # (darp_policy: PPO memory too)
    shutil.copy(phase1, p1)
    m = cls.from_checkpoint(cfg, info, old)
    m.load_state_dict(old)
    assert torch.equal(m.eval().predict(images), before)


@pytest.mark.parametrize("algorithm", ["reinforce", "ppo"])
def test_policy_baselines_smoke_fit(tmp_path, phase1, algorithm):
    report = run(tmp_path, "darp_policy", {"phase1": str(phase1), "algorithm": algorithm, "hidden_size": 16}, "pb")
    assert report["steps"] == 3 and 0.0 <= report["test"]["auir"] <= 100.0  # percent


def test_ppo_memory_travels_in_the_checkpoint(tmp_path, phase1):
    run(tmp_path, "darp_policy", {"phase1": str(phase1), "algorithm": "ppo", "hidden_size": 16, "ppo_memory": 2}, "pm")
    ckpt = load_checkpoint_file(tmp_path / "pm" / "checkpoints" / "last.ckpt")
    info = DataInfo((S + 3, SIDE, SIDE), PHOTOS)
    model = EmbeddingPolicy.from_config(PolicyConfig(**ckpt["config"]["model"]), info)
    assert len(model.memory) == 0
    model.load_state_dict(ckpt["model"])
    assert len(model.memory) == 2  # the last ppo_memory batches of the 3 steps
    saved = ckpt["model"]["_extra_state"]["ppo_memory"]
    for got, want in zip(model.memory, saved, strict=True):
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert model.memory[-1]["G"].shape == (16, S)  # batch 16 of the last step, S completion steps
    with pytest.raises(ValueError, match="ppo_memory"):
        model.load_state_dict({**ckpt["model"], "_extra_state": {"ppo_memory": [{"feats": 1}]}})


def test_policy_baseline_starts_at_the_triplet_network(tmp_path, phase1):
    """The residual starts at zero: before training the policy predicts exactly the phase-1 embeddings."""
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    model = EmbeddingPolicy.from_config(PolicyConfig(phase1=str(phase1)), info).eval()
    images = splits.test.images[:4].float() / 255
    pred = model.predict(images)
    expected = model.phase1.net.predict(images)
    assert torch.allclose(pred, expected, atol=1e-6)


def test_gradients_follow_the_hybrid_loss(phase1):
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    torch.manual_seed(0)
    model = DARP.from_config(DARPConfig(**small_darp(phase1, reward="inverse_rank")), info)
    model.on_fit_start(splits)
    images, targets = splits.train.images[:8].float() / 255, splits.train.targets[:8]
    out = model(images, targets)
    assert torch.isfinite(out.loss)
    out.terms["rl"].backward(retain_graph=True)
    assert model.locator.fc.weight.grad.abs().sum() > 0
    for net in (model.glimpse, model.core, model.action_net):
        assert all(p.grad is None or p.grad.abs().sum() == 0 for p in net.parameters())
    model.zero_grad()
    out.terms["supervised"].backward()
    assert model.locator.fc.weight.grad is None or model.locator.fc.weight.grad.abs().sum() == 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.glimpse.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.core.parameters())
    assert all(p.grad is None for p in model.phase1.parameters())  # phase 1 stays frozen


def test_eta_and_step_counter_and_deterministic_predict(phase1):
    """The paper's setting: one continuous episode per sketch, eta of eq. 5 over training steps."""
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    model = DARP.from_config(DARPConfig(**small_darp(phase1, episode="continuous", eta_schedule="paper")), info)
    model.on_fit_start(splits)
    images, targets = splits.train.images[:4].float() / 255, splits.train.targets[:4]
    out = model(images, targets)
    assert out.stats["eta"].item() == pytest.approx(model.eta(0), abs=1e-6)
    model(images, targets)
    assert int(model.step_count) == 2
    model.eval()
    a, b = model.predict(images), model.predict(images)
    assert torch.equal(a, b) and a.shape == (4, S * 64 + 64)
    # the embedding reported for a completion step is a_t at its last glimpse
    ep = model.episode(images[:, :S], deterministic=True)
    assert torch.allclose(a[:, :64], ep["embedding"][:, 1], atol=1e-6)
    assert ep["locations"].shape == (4, S * 2, 2) and torch.equal(ep["locations"][:, 0], torch.zeros(4, 2))


def test_per_partial_episodes_start_afresh_from_each_partial(phase1):
    """The default: each partial is its own episode (first glimpse at the centre, h0 from that partial's phase-1
    embedding), and the embedding of completion step s depends on partial s only."""
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    model = DARP.from_config(DARPConfig(**small_darp(phase1)), info)
    assert model.cfg.episode == "per_partial"
    model.eval()
    images = splits.train.images[:4].float() / 255
    a = model.predict(images)
    for s in range(S):
        ep = model.episode(images[:, s : s + 1], deterministic=True)
        assert torch.allclose(a[:, s * 64 : (s + 1) * 64], ep["embedding"][:, -1], atol=1e-6)
        assert torch.equal(ep["locations"][:, 0], torch.zeros(4, 2))
    changed = images.clone()
    changed[:, 0] = 1.0 - changed[:, 0]  # another first partial changes step 1 only
    b = model.predict(changed)
    assert not torch.allclose(a[:, :64], b[:, :64]) and torch.allclose(a[:, 64:], b[:, 64:], atol=1e-6)
    # the threshold rises over the completion steps: partial s of every episode gets eta(s - 1)
    model.train()
    model.on_fit_start(splits)
    out = model(images, splits.train.targets[:4])
    want = torch.stack([torch.as_tensor(model.eta_completion(float(s))) for s in range(S)]).mean()
    assert out.stats["eta"].item() == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize("reward", ["threshold", "inverse_rank", "delta_inverse_rank", "percentile"])
def test_every_reward_trains(phase1, reward):
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    model = DARP.from_config(DARPConfig(**small_darp(phase1, reward=reward)), info)
    model.on_fit_start(splits)
    out = model(splits.train.images[:4].float() / 255, splits.train.targets[:4])
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.locator.fc.weight.grad is not None


def test_random_locator_moves_and_is_seeded_at_evaluation(phase1):
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    model = DARP.from_config(DARPConfig(**small_darp(phase1, locator="random")), info)
    assert not hasattr(model, "locator")
    model.eval()
    images = splits.train.images[:4].float() / 255
    ep = model.episode(images[:, :1], deterministic=True)
    locs = ep["locations"]
    assert locs.abs().max() <= 1 and locs.std() > 0.3  # spread over the sketch
    assert torch.equal(model.predict(images), model.predict(images))  # the same locations every evaluation
    model.train()
    model.on_fit_start(splits)
    out = model(images, splits.train.targets[:4])
    assert out.terms["rl"].item() == 0.0


def test_training_item_outside_gallery_is_an_error(phase1):
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    model = DARP.from_config(DARPConfig(**small_darp(phase1)), info)
    model.on_fit_start(splits)
    with pytest.raises(ValueError, match="training gallery"):
        model(splits.test.images[:2].float() / 255, splits.test.targets[:2])
    with pytest.raises(ValueError, match="model.locator"):
        DARP.from_config(DARPConfig(**small_darp(phase1, locator="ppo")), info)
    assert json.loads(json.dumps({"ok": 1}))


def test_eval_head_selects_one_head_or_the_ensemble(phase1):
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    x = splits.test.images[:3, :S].float() / 255
    torch.manual_seed(0)
    ens = DARP.from_config(DARPConfig(**small_darp(phase1)), info).eval()
    one = DARP.from_config(DARPConfig(**small_darp(phase1, eval_head=2)), info).eval()
    one.load_state_dict(ens.state_dict())
    ep_ens, ep_one = ens.episode(x, deterministic=True), one.episode(x, deterministic=True)
    means = ens.locator.means(ep_ens["hidden"][:, 0])  # (B, K, 2) after the first glimpse
    assert torch.allclose(ep_ens["locations"][:, 1], means.mean(1), atol=1e-6)
    assert torch.allclose(ep_one["locations"][:, 1], means[:, 2], atol=1e-6)
    with pytest.raises(ValueError, match="model.eval_head"):
        DARP.from_config(DARPConfig(**small_darp(phase1, eval_head=6)), info)


def test_embedding_ensemble_averages_each_heads_own_episode(phase1):
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    images = splits.test.images[:3].float() / 255
    x = images[:, :S]
    torch.manual_seed(0)
    model = DARP.from_config(
        DARPConfig(**small_darp(phase1, eval_ensemble="embeddings", locator_init="spread")), info
    ).eval()
    G, K = model.cfg.glimpses_per_step, model.cfg.num_heads
    episodes = [model.episodes(x, deterministic=True, head=k) for k in range(K)]
    # spread heads start apart: their first actions differ
    first = torch.stack([ep["locations"][:, 1] for ep in episodes], 1)  # (episodes, K, 2)
    assert torch.cdist(first, first).amax() > 0.3
    expected = torch.stack([ep["per_item"](ep["embedding"])[:, G - 1 :: G] for ep in episodes]).mean(0)
    query, _ = model.unpack(model.predict(images))
    assert torch.allclose(query, expected, atol=1e-6)
    # not the same as one episode at the mean location
    model.cfg.eval_ensemble = "locations"
    query_loc, _ = model.unpack(model.predict(images))
    assert not torch.allclose(query_loc, expected, atol=1e-4)
    with pytest.raises(ValueError, match="head must be"):
        model.episode(x, deterministic=True, head=K)
    with pytest.raises(ValueError, match="model.eval_ensemble"):
        DARP.from_config(DARPConfig(**small_darp(phase1, eval_ensemble="votes")), info)
    with pytest.raises(ValueError, match="bootstrap locator only"):
        DARP.from_config(DARPConfig(**small_darp(phase1, locator="dqn", locator_init="spread")), info)
    with pytest.raises(ValueError, match="model.locator_radius"):
        DARP.from_config(DARPConfig(**small_darp(phase1, locator_init="spread", locator_radius=1.0)), info)


def test_darp_heads_benchmark_measures_head_placement(phase1):
    """benchmarks/darp_heads.py: heads started apart are apart; heads forced onto one point are not."""
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "darp_heads.py"
    spec = importlib.util.spec_from_file_location("darp_heads", script)
    heads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(heads)
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    torch.manual_seed(0)
    model = DARP.from_config(DARPConfig(**small_darp(phase1, locator_init="spread", locator_radius=0.5)), info)
    apart = heads.placement(model, splits.test.images[:4])
    assert apart["sketches"] == 4 and len(apart["head_means"]) == 6
    assert apart["mean_pairwise_distance"] > 0.4 and 0.4 < apart["distance_from_centre"] < 0.6
    with torch.no_grad():
        model.locator.fc.weight.zero_()
        model.locator.fc.bias.fill_(0.2)  # every head at (tanh 0.2, tanh 0.2), whatever the state
    together = heads.placement(model, splits.test.images[:4])
    assert together["mean_pairwise_distance"] == 0.0 and together["episode_spread"] == 0.0
    assert together["distance_from_centre"] == pytest.approx(2**0.5 * torch.tanh(torch.tensor(0.2)).item(), abs=1e-3)


def test_raster_locator_visits_a_fixed_raster_without_a_policy(phase1):
    from rlattention.methods.darp import raster_locations

    r = raster_locations(12)  # 3 rows x 4 columns, row-major
    assert r.shape == (12, 2)
    assert torch.allclose(r[:4, 0], torch.tensor([-0.75, -0.25, 0.25, 0.75]))
    assert torch.allclose(r[::4, 1], torch.tensor([-2 / 3, 0.0, 2 / 3]))
    assert raster_locations(1).tolist() == [[0.0, 0.0]] and raster_locations(5).shape == (5, 2)
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    model = DARP.from_config(DARPConfig(**small_darp(phase1, locator="raster", glimpses_per_step=3)), info)
    model.on_fit_start(splits)
    images, targets = splits.train.images[:4].float() / 255, splits.train.targets[:4]
    ep = model.episode(images[:, :S])
    assert torch.equal(ep["locations"], raster_locations(3).repeat(S, 1).expand(4, -1, -1))  # every partial
    out = model(images, targets)
    assert float(out.terms["rl"]) == 0.0 and not hasattr(model, "locator")


def _triplet(**model) -> torch.nn.Module:
    cls = get_method("darp_triplet")
    cfg = from_dict({"method": "darp_triplet", "model": {"channels": [8], "augment_degrees": 0.0,
                                                           "augment_flip": 0.0, **model}})  # fmt: skip
    return cls.from_config(cfg.model, DataInfo((S + 3, SIDE, SIDE), PHOTOS))


@pytest.mark.parametrize("model", [{"loss": "infonce"}, {"negatives": "all"}, {"negatives": "random"}])
def test_phase1_losses_prefer_the_true_photo(model):
    """Each loss is lower when every sketch embeds next to its own photo than when the photos are permuted, and a
    duplicate of the true photo in the batch is never a negative."""
    torch.manual_seed(0)
    net = _triplet(**model)
    items = synthetic_splits().train
    x = items.images[:8].float() / 255
    y = torch.arange(8)
    emb = torch.nn.functional.normalize(torch.randn(8, net.embed_dim), dim=-1)
    net.sketch_net.forward = lambda _: emb  # the sketch and photo embeddings are set by hand
    net.photo_net.forward = lambda _: emb
    aligned = net(x, y).loss
    net.photo_net.forward = lambda _: emb.roll(1, 0)
    shuffled = net(x, y).loss
    assert aligned < shuffled
    # sketches 0 and 1 of the same photo: photo 1 is not a negative of sketch 0
    net.photo_net.forward = lambda _: emb
    dup = y.clone()
    dup[1] = dup[0]
    emb2 = emb.clone()
    emb2[1] = emb2[0]
    net.sketch_net.forward = lambda _: emb2
    net.photo_net.forward = lambda _: emb2
    if model.get("loss") == "infonce":
        assert net(x, dup).loss < net(x, y).loss  # identical true photos are not penalised as confusions


def test_phase1_loss_values_are_named():
    with pytest.raises(ValueError, match="model.loss"):
        _triplet(loss="contrastive")
    with pytest.raises(ValueError, match="model.negatives"):
        _triplet(negatives="semi")
    with pytest.raises(ValueError, match="feature_levels"):
        _triplet(backbone="efficientnet_lite0", feature_levels=[3, 4], feature_grid=[3])


def test_heads_spread_is_logged_and_measures_the_heads_distance(phase1):
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    images, targets = splits.train.images[:4].float() / 255, splits.train.targets[:4]
    spreads = {}
    for init in ("centre", "spread"):
        torch.manual_seed(0)
        model = DARP.from_config(DARPConfig(**small_darp(phase1, locator_init=init, locator_radius=0.6)), info)
        model.on_fit_start(splits)
        spreads[init] = float(model(images, targets).stats["heads_spread"])
    # K = 6 heads on a circle of radius 0.6: mean pairwise distance 0.6 * 2 * mean |sin(pi k / 6)| ~ 0.86
    assert spreads["spread"] > 0.6 and spreads["centre"] < 0.3


def test_frozen_phase1_cache_does_not_depend_on_the_split(tmp_path, monkeypatch):
    """The seeds of a study carve other validation photos out of train: they must share one feature file."""
    from rlattention.data.base import DataSplits

    monkeypatch.setenv("RLATTENTION_CACHE", str(tmp_path))
    a = synthetic_splits()
    b = DataSplits(a.val, a.train, a.test, a.num_classes, name=a.name)  # other photos in training
    paths = []
    for splits in (a, b):
        torch.manual_seed(0)  # the same (here random, in a study pretrained) frozen weights
        net = _triplet(backbone="efficientnet_lite0", freeze="all", soft_attention=False, augment_flip=0.5)
        net.on_fit_start(splits)
        paths.append((net.sketch_net.backbone.cache.path, net.photo_net.backbone.cache.path))
    assert paths[0] == paths[1] and paths[0][0].is_file()


def test_darp_figures_draw_every_heads_glimpses_and_the_training_curves(tmp_path, phase1):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "darp_figures", Path(__file__).resolve().parents[2] / "benchmarks" / "darp_figures.py"
    )
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    model_cfg = {**small_darp(phase1), "num_heads": 2}
    report = run(tmp_path, "darp", model_cfg, "fig", steps=2)
    run_dir = Path(report["run_dir"])
    curves = figures.training_curves(run_dir)
    assert "val/auir" in curves
    info = DataInfo((S + 3, SIDE, SIDE), PHOTOS)
    model = DARP.from_config(DARPConfig(**model_cfg), info)
    images = synthetic_splits().test.images[:2].float() / 255
    paths = figures.plot_head_glimpses(model, images, tmp_path / "figs")
    assert [p.name for p in paths] == ["glimpses_head0.png", "glimpses_head1.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert figures.plot_training(run_dir, tmp_path / "figs" / "training.png").stat().st_size > 1000


def test_residual_embedding_starts_at_phase1_and_the_glimpses_then_correct_it(phase1):
    """``embedding=residual``: untrained, phase 2 predicts exactly the phase-1 embedding of each partial (the
    ``triplet`` row); after one supervised step the correction is non-zero and depends on where the glimpses
    land, so the locator's actions change the embedding."""
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    torch.manual_seed(0)
    model = DARP.from_config(DARPConfig(**small_darp(phase1, embedding="residual")), info)
    model.eval()
    images = splits.test.images[:4].float() / 255
    assert torch.allclose(model.predict(images), model.phase1.net.predict(images), atol=1e-6)
    model.train()
    model.on_fit_start(splits)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out = model(splits.train.images[:8].float() / 255, splits.train.targets[:8])
    out.terms["supervised"].backward()
    opt.step()
    model.eval()
    assert not torch.allclose(model.predict(images), model.phase1.net.predict(images), atol=1e-4)
    sketch = images[:, :1]
    at_centre = model.episode(sketch, deterministic=True)["embedding"][:, 0]  # glimpse 1: at the centre
    model.cfg.locator = "raster"  # the same network, its first glimpse elsewhere (a raster's first cell)
    model.register_buffer("raster", torch.tensor([[-0.6, -0.6]] * model.cfg.glimpses_per_step), persistent=False)
    elsewhere = model.episode(sketch, deterministic=True)["embedding"][:, 0]
    assert not torch.allclose(at_centre, elsewhere, atol=1e-5)
    with pytest.raises(ValueError, match="model.embedding"):
        DARP.from_config(DARPConfig(**small_darp(phase1, embedding="sum")), info)


def test_blank_glimpses_see_nothing_but_the_phase1_embedding(phase1):
    """``glimpse_content=blank`` (the no-attention control): two sketches with the same phase-1 embedding get the
    same phase-2 embedding whatever their pixels, while reading the glimpses (the default) tells them apart."""
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    sketch = splits.test.images[:2, :1].float() / 255
    other = sketch.flip(-1)  # different pixels under the glimpses
    torch.manual_seed(0)
    image = DARP.from_config(DARPConfig(**small_darp(phase1, h0="zeros")), info).eval()
    torch.manual_seed(0)
    blank = DARP.from_config(DARPConfig(**small_darp(phase1, h0="zeros", glimpse_content="blank")), info).eval()
    blank.load_state_dict(image.state_dict())  # the same weights: only what the glimpses read differs
    a, b = (image.episode(x, deterministic=True)["embedding"] for x in (sketch, other))
    assert not torch.allclose(a, b, atol=1e-5)
    a, b = (blank.episode(x, deterministic=True)["embedding"] for x in (sketch, other))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="model.glimpse_content"):
        DARP.from_config(DARPConfig(**small_darp(phase1, glimpse_content="noise")), info)


def _phase2(phase1: Path, method: str, cache: bool, **kw) -> torch.nn.Module:
    info = DataInfo((S + 3, SIDE, SIDE), PHOTOS)
    if method == "darp":
        return DARP.from_config(DARPConfig(**small_darp(phase1, phase1_cache=cache, **kw)), info)
    return EmbeddingPolicy.from_config(PolicyConfig(phase1=str(phase1), phase1_cache=cache, **kw), info)


def _count_sketch_renders(model: torch.nn.Module) -> list[int]:
    """A running count of the renders the phase-1 sketch CNN processes (a hook on its first convolution)."""
    conv = next(m for m in model.phase1.net.sketch_net.modules() if isinstance(m, torch.nn.Conv2d))
    seen = [0]
    conv.register_forward_hook(lambda _m, args, _out: seen.__setitem__(0, seen[0] + len(args[0])))
    return seen


MEMO_CASES = [
    ("darp", {"augment_degrees": 0.0}),
    ("darp", {"augment_degrees": 0.0, "embedding": "residual", "context": True}),
    ("darp", {"augment_degrees": 0.0, "episode": "continuous"}),
    ("darp_policy", {"hidden_size": 16}),
    ("darp_policy", {"hidden_size": 16, "algorithm": "ppo", "recurrent": True}),
]


@pytest.mark.parametrize(("method", "model"), MEMO_CASES, ids=["darp", "residual_context", "continuous", "rl", "ppo"])
def test_phase1_memo_changes_no_loss_or_prediction(phase1, method, model):
    """The same weights and seed give the same training losses and predictions with the memo of the phase-1
    outputs (read, not recomputed) as with model.phase1_cache=false."""
    splits = synthetic_splits()
    torch.manual_seed(0)
    memo, direct = _phase2(phase1, method, True, **model), _phase2(phase1, method, False, **model)
    direct.load_state_dict(memo.state_dict())
    for m in (memo, direct):
        m.on_fit_start(splits)
    assert not direct.phase1.memos and len(memo.phase1.memos) == 1
    images, targets = splits.train.images[:8].float() / 255, splits.train.targets[:8]
    test = splits.test.images[:4].float() / 255
    outs = []
    for m in (memo, direct):
        torch.manual_seed(1)
        step = [m(images, targets) for _ in range(2)]  # (PPO: the second step replays the first's memory)
        outs.append((step, m.eval().predict(test)))
    (steps_m, pred_m), (steps_d, pred_d) = outs
    for a, b in zip(steps_m, steps_d, strict=True):
        assert torch.allclose(a.loss, b.loss, atol=1e-6)
        assert all(torch.allclose(a.terms[k], b.terms[k], atol=1e-6) for k in b.terms)
    assert torch.allclose(pred_m, pred_d, atol=1e-6)
    (table,) = memo.phase1.memos.values()
    assert table.misses == 0 and table.hits > 0  # every phase-1 output of the memo's model was read


@pytest.mark.parametrize("method", ["darp", "darp_policy"])
def test_phase1_memo_computes_each_partial_once_and_rotations_always(phase1, method):
    """on_fit_start runs the phase-1 sketch CNN once per distinct partial of the splits; then unaugmented training
    and evaluation run it on nothing, and a rotated (not 8-bit exact) partial is computed, not read or stored."""
    from rlattention.data.base import DataSplits

    base = synthetic_splits()
    repeated = ArrayDataset(base.train.images[:8].clone(), base.train.targets[:8].clone())  # partials seen in train
    splits = DataSplits(base.train, repeated, base.test, base.num_classes, name=base.name)
    model = _phase2(phase1, method, True, **({"augment_degrees": 0.0} if method == "darp" else {"hidden_size": 16}))
    count = _count_sketch_renders(model)
    model.on_fit_start(splits)
    every = torch.cat([s.images[:, :S].flatten(0, 1).flatten(1) for s in (splits.train, splits.val, splits.test)])
    distinct = len(torch.unique(every, dim=0))
    (table,) = model.phase1.memos.values()
    assert count[0] == len(table) == distinct == len(every) - 8 * S  # the repeated partials: computed once
    count[0] = 0
    model(splits.train.images[:8].float() / 255, splits.train.targets[:8]).loss.backward()
    model.eval().predict(splits.val.images[:4].float() / 255)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # mixed precision: the keys stay exact, the memo serves
        model.phase1.partials(splits.test.images[:4, :S].float() / 255, model.phase1_output)
    assert count[0] == 0
    from rlattention.vision.transforms import random_rotate_flip

    sketches = splits.train.images[:4, :S].float() / 255
    rotated, _ = random_rotate_flip(sketches, 10.0, generator=torch.Generator().manual_seed(0))
    got = model.phase1.partials(rotated, model.phase1_output)
    assert count[0] == 4 * S and len(table) == distinct and table.misses == 4 * S
    assert torch.allclose(got, getattr(model.phase1.net, model.phase1_output)(rotated), atol=1e-6)
    near = sketches.clone()  # off the 8-bit grid by 0.3 of a level, at a pixel that fingerprints does not sample
    near.view(4, S, -1)[:, :, 1] += 0.3 / 255
    count[0] = 0
    got = model.phase1.partials(near, model.phase1_output)
    assert count[0] == 4 * S and len(table) == distinct
    assert torch.allclose(got, getattr(model.phase1.net, model.phase1_output)(near), atol=1e-6)
    if method == "darp":  # the training step's own rotation (model.augment_degrees) is computed the same way
        model.cfg.augment_degrees = 10.0
        count[0] = 0
        model.train()(splits.train.images[:4].float() / 255, splits.train.targets[:4])
        assert count[0] == 4 * S and len(table) == distinct
        rotating = _phase2(phase1, method, True)  # built with augment_degrees > 0: its training partials are left out
        rotating.on_fit_start(splits)
        evaluated = torch.cat([s.images[:, :S].flatten(0, 1).flatten(1) for s in (splits.val, splits.test)])
        assert len(rotating.phase1.memos["embed_sketches"]) == len(torch.unique(evaluated, dim=0)) < distinct


def test_phase1_memo_is_not_saved_and_is_dropped_with_other_phase1_weights(phase1):
    """The memo is in no state_dict (a model without it loads the state strictly, and vice versa); loading other
    phase-1 weights drops it, loading the same keeps it; a dtype change is followed."""
    splits = synthetic_splits()
    torch.manual_seed(0)
    memo, direct = _phase2(phase1, "darp", True), _phase2(phase1, "darp", False)
    memo.on_fit_start(splits)
    state = memo.state_dict()
    assert state.keys() == direct.state_dict().keys()
    assert not any("memo" in k for k in state)
    direct.load_state_dict(state)  # strict both ways: a checkpoint from before the memo loads
    memo.load_state_dict(direct.state_dict())
    assert len(memo.phase1.memos) == 1  # the same phase-1 weights: kept
    images = splits.test.images[:4].float() / 255
    assert torch.allclose(memo.eval().predict(images), direct.eval().predict(images), atol=1e-6)
    other = {k: v + 0.01 if k.startswith("phase1.net.sketch_net.") and v.is_floating_point() else v
             for k, v in state.items()}  # fmt: skip
    memo.load_state_dict(other)
    direct.load_state_dict(other)
    assert not memo.phase1.memos  # stale: dropped, the new weights compute
    assert torch.allclose(memo.predict(images), direct.predict(images), atol=1e-6)
    memo.on_fit_start(splits)
    memo.double()
    direct.double()
    assert torch.allclose(memo.predict(images.double()), direct.predict(images.double()), atol=1e-5)


def test_infonce_supervision_ranks_the_true_photo_higher(phase1):
    """``supervised=infonce``: descending its gradient raises the true photo's place among the training photos
    (mean 1/rank at the last glimpse of every partial)."""
    splits = synthetic_splits()
    info = DataInfo(splits.image_shape, splits.num_classes)
    torch.manual_seed(0)
    model = DARP.from_config(
        DARPConfig(**small_darp(phase1, supervised="infonce", augment_degrees=0.0, locator="raster")), info
    )
    model.on_fit_start(splits)
    images, targets = splits.train.images[:16].float() / 255, splits.train.targets[:16]

    def inverse_rank() -> float:
        with torch.no_grad():
            a = model.episodes(images[:, :S], deterministic=True)["embedding"][:, -1:]
            rows = model.train_row[targets].repeat_interleave(a.shape[0] // len(targets))
            return float((1.0 / true_ranks(a, training_gallery(model), rows).float()).mean())

    before = inverse_rank()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(30):
        out = model(images, targets)
        opt.zero_grad()
        out.terms["supervised"].backward()
        opt.step()
    assert inverse_rank() > before + 0.1
    with pytest.raises(ValueError, match="model.supervised"):
        DARP.from_config(DARPConfig(**small_darp(phase1, supervised="l1")), info)
    with pytest.raises(ValueError, match="supervised_temperature"):
        DARP.from_config(DARPConfig(**small_darp(phase1, supervised_temperature=0.0)), info)
