"""DCPG model-level claims of the estimator fix: the sampled bin a_s drives the forward pass (changing it changes
the attention, the similarities and the loss; with the relaxed option it changes nothing but log a_g(a_s)); every
row of the ablation fuses features of the same scale; the noise-matched control has no policy-gradient term and
keeps drawing its attention from the initial policy; bad config values name their key; checkpoints written before
the change keep their scheme. (The estimator's expected gradients are tested on a bandit in
tests/rl/test_discrete_continuous.py.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlattention.engine.config import load_config
from rlattention.engine.method import DataInfo
from rlattention.methods.dcpg import DCPG, DCPGConfig
from rlattention.rl.discrete_continuous import mean_uniform_attention

ROOT = Path(__file__).resolve().parents[2]


def _dcpg_helpers():
    """tests/methods/test_dcpg.py by path (the tests folder is not a package): its tiny synthetic task."""
    key = "_dcpg_estimator_helpers"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("test_dcpg.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


helpers = _dcpg_helpers()
SPLITS = helpers.synthetic_splits()
INFO = DataInfo(SPLITS.image_shape, SPLITS.num_classes, SPLITS.meta)
IMAGES, TARGETS = SPLITS.train.images[torch.arange(16)], SPLITS.train.targets[:16]


def make(**kw) -> DCPG:
    torch.manual_seed(0)
    return DCPG(DCPGConfig(**helpers.small(**kw)), INFO)


def record_attention(model: DCPG) -> list:
    """The policy outputs of every forward (image, then text), via forward hooks."""
    seen: list = []
    for policy in (model.image_policy, model.text_policy):
        policy.register_forward_hook(lambda module, args, output: seen.append(output))
    return seen


# ---------------------------------------------------------------- the sampled bin drives the forward pass


@pytest.mark.parametrize("estimator", ["straight_through", "relaxed"])
def test_changing_the_sampled_bin_changes_attention_similarity_and_loss(monkeypatch, estimator):
    model = make(estimator=estimator)
    seen = record_attention(model)
    torch.manual_seed(5)
    before = model(IMAGES, TARGETS)
    for policy in (model.image_policy, model.text_policy):  # intervene on a_s only: same random numbers
        draw = policy.sample_bins
        monkeypatch.setattr(
            policy, "sample_bins", lambda a_g, generator=None, draw=draw: (draw(a_g, generator) + 5) % 10
        )
    torch.manual_seed(5)
    after = model(IMAGES, TARGETS)
    (img_a, txt_a), (img_b, txt_b) = seen[:2], seen[2:]
    words = TARGETS[:, 1:] != 0
    assert torch.equal(img_b.bins, (img_a.bins + 5) % 10)
    assert not torch.equal(after.terms["pg_d_image"], before.terms["pg_d_image"])  # log a_g of the other bins
    if estimator == "straight_through":
        assert (img_b.head_attention - img_a.head_attention).abs().mean() > 0.3
        assert (txt_b.head_attention - txt_a.head_attention)[words].abs().mean() > 0.3
        for term in ("triplet", "instance", "decoding"):  # every loss of the embeddings sees a_s
            assert abs(after.terms[term].item() - before.terms[term].item()) > 1e-4
    else:  # the defect the straight-through default fixes: a_s reaches neither the attention nor the loss
        assert torch.equal(img_b.head_attention, img_a.head_attention)
        assert torch.equal(txt_b.head_attention, txt_a.head_attention)
        for term in ("triplet", "instance", "decoding"):
            assert torch.equal(after.terms[term], before.terms[term])


# ---------------------------------------------------------------- the self-critical baseline


def _spy_greedy(model: DCPG, monkeypatch) -> list[dict]:
    seen: list[dict] = []
    original = model._greedy_rewards

    def spy(*args):
        seen.append(original(*args))
        return seen[-1]

    monkeypatch.setattr(model, "_greedy_rewards", spy)
    return seen


def test_self_critical_baseline_is_the_reward_of_the_mean_actions(monkeypatch):
    """A policy whose draws are its mean actions (one bin certain, sigma ~ 0): every advantage is 0, so the
    policy-gradient terms vanish; a wide policy's advantages are not all 0."""
    model = make(self_critical=True, init_std=2e-3)
    with torch.no_grad():
        for policy in (model.image_policy, model.text_policy):
            policy.w_mu.weight.zero_()
            policy.w_mu.bias.fill_(0.0)
            policy.w_mu.bias.view(2, 10)[:, 7] = 60.0
    greedy = _spy_greedy(model, monkeypatch)
    out = model(IMAGES, TARGETS)
    assert len(greedy) == 1 and out.stats["advantage"].abs().item() < 1e-6
    for term in ("pg_d_image", "pg_c_image", "pg_d_text", "pg_c_text"):
        assert out.terms[term].abs().item() < 1e-4, term
    wide = make(self_critical=True, init_std=0.5)
    assert make(self_critical=False)(IMAGES, TARGETS).stats.get("advantage") is None
    torch.manual_seed(1)
    terms = wide(IMAGES, TARGETS).terms
    assert max(terms[t].abs().item() for t in ("pg_d_image", "pg_d_text")) > 1e-3


def test_self_critical_baseline_of_a_query_ignores_its_own_actions(monkeypatch):
    """Moving the image policy's sampled bins changes the image queries' rewards, not their baselines (which
    rank the mean-action embeddings against the same sampled captions): the baseline is unbiased."""
    model = make(self_critical=True)
    greedy = _spy_greedy(model, monkeypatch)
    seen = record_attention(model)
    torch.manual_seed(5)
    model(IMAGES, TARGETS)
    draw = model.image_policy.sample_bins
    monkeypatch.setattr(model.image_policy, "sample_bins", lambda a_g, generator=None: (draw(a_g, generator) + 5) % 10)
    torch.manual_seed(5)
    model(IMAGES, TARGETS)
    # per forward: sampled image, sampled text, then the mean actions of each (the baselines)
    assert len(seen) == 8 and torch.equal(seen[5].bins, seen[1].bins)  # the captions' draws are the same
    assert not torch.equal(seen[4].bins, seen[0].bins)
    assert torch.equal(greedy[0]["image"], greedy[1]["image"])


def test_self_critical_and_eq_10_baseline_exclude_each_other():
    with pytest.raises(ValueError, match="self_critical and model.pg_baseline"):
        make(self_critical=True, pg_baseline=True)


# ---------------------------------------------------------------- the same feature scale in every row


def test_the_no_policy_rows_scale_features_as_the_policy_rows_do():
    baseline, full = make(pg="none"), make()
    assert baseline.fixed_attention == 0.5 == mean_uniform_attention(10, "logit")
    # the baseline's fusion is the policy rows' fusion with the constant Att = 0.5: I_A = I * (lambda / 2)
    x = torch.randn(3, 4, 16)
    constant = SimpleNamespace(attention=torch.full((3, 4), 0.5))
    fused, _ = baseline._fuse(x, None, None, baseline.image_gru, deterministic=False)
    stub, _ = baseline._fuse(x, None, lambda *a, **k: constant, baseline.image_gru, deterministic=False)
    assert torch.allclose(fused, stub)
    # and the initial policy's training attention averages 0.5: the same scale lambda * E[Att] in both rows
    seen = record_attention(full)
    torch.manual_seed(1)
    full(IMAGES, TARGETS)
    words = TARGETS[:, 1:] != 0
    assert abs(seen[0].head_attention.mean().item() - 0.5) < 0.06
    assert abs(seen[1].head_attention[words].mean().item() - 0.5) < 0.06
    unscaled = make(pg="none", fixed_attention=1 / 20)  # the first runs' baseline: features times 1
    assert unscaled.fixed_attention * unscaled.cfg.lam == pytest.approx(1.0)


def _row_scale(model: DCPGConfig) -> float:
    """lambda * E[Att] of a config's fusion at the start of training."""
    if model.pg == "none":
        att = (
            model.fixed_attention
            if model.fixed_attention is not None
            else mean_uniform_attention(model.num_bins, model.bin_map)
        )
    else:
        att = mean_uniform_attention(model.num_bins, model.bin_map, model.pg)
        if model.pg == "continuous":  # mean from a linear head near 0 at init: Att = sigmoid(~0)
            att = 0.5
    return model.lam * att


def test_every_ablation_config_has_the_same_feature_scale_but_the_lambda_rows():
    configs = sorted((ROOT / "configs").glob("dcpg_digit_scenes*.yaml"))
    assert len(configs) >= 14
    for path in configs:
        model = load_config(path).model
        expected = {"lambda10": 5.0, "lambda30": 15.0}.get(path.stem.rsplit("_", 1)[-1], 10.0)
        assert _row_scale(model) == pytest.approx(expected), path.name


# ---------------------------------------------------------------- the noise-matched control


def _steps(model: DCPG, n: int = 3) -> None:
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    torch.manual_seed(2)
    for _ in range(n):
        opt.zero_grad()
        model(IMAGES, TARGETS).loss.backward()
        opt.step()


def test_noise_matched_control_has_no_policy_gradient_term():
    control = make(noise_matched=True)
    out = control(IMAGES, TARGETS)
    assert not [k for k in out.terms if k.startswith("pg_")] and {"triplet", "instance", "decoding"} <= set(out.terms)
    assert "reward" in out.stats  # logged, for the reward curve beside the policy rows'
    out.loss.backward()
    for policy in (control.image_policy, control.text_policy):
        assert all(not p.requires_grad and p.grad is None for p in policy.parameters())
    assert control.image_gru.weight_ih_l0.grad.abs().sum() > 0  # the rest of the network trains


@pytest.mark.parametrize("init_att_std, low, high", [(None, 0.15, 0.35), (0.05, 0.03, 0.12)])
def test_noise_matched_attention_stays_random_as_the_initial_policys(init_att_std, low, high):
    kw = {"init_att_std": init_att_std}
    control, initial, learner = make(noise_matched=True, **kw), make(noise_matched=True, **kw), make(**kw)
    _steps(control)
    _steps(learner)
    for name in ("image_policy", "text_policy"):  # the control's policies are still the initial ones
        for (key, p), q in zip(
            getattr(control, name).state_dict().items(), getattr(initial, name).state_dict().values(), strict=True
        ):
            assert torch.equal(p, q), key
    moved = [
        not torch.equal(p, q)
        for p, q in zip(learner.image_policy.parameters(), initial.image_policy.parameters(), strict=True)
    ]
    assert any(moved)  # the policy-gradient row's policy has left the initial law; the control's has not
    assert not torch.equal(control.region_fc.weight, initial.region_fc.weight)  # the control did train
    # in training its attention is a fresh draw from the initial policy's law: with the same noise, the initial
    # policy's attention; with other noise, other weights spread over (0, 1) as the bins' centres are
    v = control.gcn(control.region_fc(IMAGES.flatten(1, -2))).detach()
    draws = [control.image_policy(v, generator=torch.Generator().manual_seed(s)).head_attention for s in range(8)]
    same = initial.image_policy(v, generator=torch.Generator().manual_seed(0)).head_attention
    assert torch.equal(draws[0], same)
    spread = torch.stack(draws).std(0).mean().item()
    # uniform bins over (0, 1) have std 0.29, the centred prior about its sd (widened by the Gumbel draws); a
    # settled policy would be near sigma / 4
    assert low < spread < high, spread
    control.eval()
    a, b = control.predict_batch(IMAGES, TARGETS), control.predict_batch(IMAGES, TARGETS)
    assert torch.equal(a, b)  # evaluation: the initial policy's mode, deterministic


def test_noise_matched_config_is_the_full_scheme_plus_the_switch():
    full = load_config(ROOT / "configs" / "dcpg_digit_scenes.yaml")
    control = load_config(ROOT / "configs" / "dcpg_digit_scenes_noise_matched.yaml")
    assert control.model.noise_matched and not full.model.noise_matched
    assert {**vars(control.model), "noise_matched": False} == vars(full.model)
    assert control.trainer.run_name != full.trainer.run_name


# ---------------------------------------------------------------- configuration and old checkpoints


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"estimator": "reinforce"}, r"model\.estimator must be one of straight_through, relaxed, got 'reinforce'"),
        ({"bin_map": "linear"}, r"model\.bin_map must be one of logit, logistic, got 'linear'"),
        ({"mu_grad": "exact"}, r"model\.mu_grad must be one of relaxed, none, got 'exact'"),
        ({"init_std": 0.0}, r"model\.init_std must be > 0\.001 .* got 0\.0"),
        ({"fixed_attention": 1.5}, r"model\.fixed_attention must be in \(0, 1\] or null, got 1\.5"),
        ({"tau": 0.0}, r"model\.tau must be > 0, got 0\.0"),
        ({"num_bins": 1}, r"model\.num_bins must be >= 2, got 1"),
        ({"estimator": "relaxed", "mu_grad": "none"}, r"model\.mu_grad='none' needs model\.estimator"),
        ({"pg": "none", "noise_matched": True}, r"model\.noise_matched=true needs a policy"),
    ],
)
def test_bad_config_values_name_their_key(kw, match):
    with pytest.raises(ValueError, match=match):
        make(**kw)


@pytest.mark.parametrize("pg", ["discrete_continuous", "none"])
def test_checkpoints_from_before_the_change_keep_their_scheme(pg):
    state = make(pg=pg).state_dict()
    assert int(state["attention_scheme"]) == 2
    current = DCPG.from_checkpoint(make(pg=pg).cfg, INFO, dict(state))
    assert current.cfg.bin_map == "logit" and current.fixed_attention == 0.5
    del state["attention_scheme"]  # written before bin_map and fixed_attention existed
    old = DCPG.from_checkpoint(make(pg=pg).cfg, INFO, state)
    old.load_state_dict(state)  # the weights load
    assert old.cfg.bin_map == "logistic" and old.fixed_attention * old.cfg.lam == pytest.approx(1.0)
    if pg != "none":
        regions, words = old.eval().attention(IMAGES, TARGETS)
        assert regions.min() >= 0.62 and regions.max() <= 0.68  # the old scheme's range
