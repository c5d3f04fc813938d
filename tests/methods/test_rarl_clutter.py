"""rarl on the cluttered task (issue 20): the anchor cap, the grid control and its coverage, region locations that
change the forward pass, equal test episodes for every policy, and the exploration options (sigma schedule, learned
sigma with an entropy bonus, several episodes with a leave-one-out baseline), each checked against its claim."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rlattention.engine.config import load_config
from rlattention.engine.method import DataInfo
from rlattention.methods.rarl import RARL, RARLConfig
from rlattention.rl import LearnedStdGaussianPolicy, gaussian_entropy, leave_one_out_baseline, reinforce_loss
from rlattention.vision.anchors import anchor_boxes, grid_centres

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ROWS = ("", "_random", "_grid", "_global", "_single", "_nolstm", "_t1", "_t10")
ANCHORS = dict(anchor_areas=[576.0, 1600.0, 4096.0], anchor_ratios=[2.0, 1.0, 0.5])
SMALL = dict(backbone_channels=[4, 8, 8], region_dim=16, hidden_size=16, **ANCHORS)


def _model(**kw) -> RARL:
    torch.manual_seed(0)
    return RARL(RARLConfig(**{**SMALL, **kw}), DataInfo((1, 128, 128), 10))


def _batch(n: int = 4):
    torch.manual_seed(1)
    x = torch.rand(n, 1, 128, 128) * (torch.rand(n, 1, 128, 128) > 0.9)
    y = torch.zeros(n, 10)
    y[:, 2] = 1
    y[: n // 2, 5] = 1
    return x, y


def _pixel_coverage(boxes: torch.Tensor, size: int) -> torch.Tensor:
    """``(size, size)`` bool: the pixels whose centre lies in at least one normalised box ``(n, 4)``."""
    centres = (torch.arange(size) + 0.5) * 2 / size - 1
    x, y = centres.view(1, 1, -1), centres.view(1, -1, 1)
    b = boxes.view(-1, 4, 1, 1)
    inside = (x >= b[:, 0]) & (x <= b[:, 2]) & (y >= b[:, 1]) & (y <= b[:, 3])
    return inside.any(0)


# ---------------------------------------------------------------------------------------------------- anchors
def test_anchors_respect_the_cap():
    cfg = load_config(CONFIGS / "rarl_clutter.yaml")
    H = W = cfg.data.canvas_size
    assert cfg.model.max_anchor_fraction == 0.25
    boxes = anchor_boxes(torch.zeros(1, 2), cfg.model.anchor_areas, cfg.model.anchor_ratios, (H, W))[0]
    areas = (boxes[:, 2] - boxes[:, 0]) * W / 2 * (boxes[:, 3] - boxes[:, 1]) * H / 2
    assert float(areas.max()) <= 0.25 * H * W + 1e-3
    # every row of the study builds under the cap
    for row in ROWS:
        RARL(load_config(CONFIGS / f"rarl_clutter{row}.yaml").model, DataInfo((1, H, W), 10))
    with pytest.raises(ValueError, match="max_anchor_fraction"):
        _model(anchor_areas=[4097.0], max_anchor_fraction=0.25)
    with pytest.raises(ValueError, match="max_anchor_fraction"):
        _model(max_anchor_fraction=1.5)
    _model(anchor_areas=[128.0**2])  # no cap by default (the 64 x 64 canvases of rarl_digits use a whole-canvas anchor)


# ------------------------------------------------------------------------------------------------------ grid
@pytest.mark.parametrize("T", [5, 10])
def test_grid_covers_the_image(T):
    centres = grid_centres(T)
    boxes = anchor_boxes(centres, ANCHORS["anchor_areas"], ANCHORS["anchor_ratios"], (128, 128))  # (T, k, 4)
    assert _pixel_coverage(boxes, 128).all()
    largest = anchor_boxes(centres, [4096.0], [1.0], (128, 128))
    if T == 5:  # the four quadrant squares tile the canvas on their own
        assert _pixel_coverage(largest[:4], 128).all()
    assert len({tuple(c) for c in centres.tolist()}) == T  # no centre visited twice


def test_grid_policy_is_the_same_fixed_grid_for_every_image():
    m = _model(policy="grid").eval()
    x, _ = _batch()
    fmap = m.backbone.feature_map(x)
    for deterministic in (True, False):
        locs = m.episode(fmap, (128, 128), deterministic, torch.Generator().manual_seed(0))[3]
        torch.testing.assert_close(locs, grid_centres(5).expand(4, 5, 2))
    assert not hasattr(m, "locator") and not any("locator" in n for n, _ in m.named_parameters())
    p1, p2 = m.predict(x, mc_samples=5), m.predict(x)
    torch.testing.assert_close(p1, p2)  # a fixed grid: every test episode is the same


# ---------------------------------------------------------------------------------- locations drive the features
def test_region_location_changes_the_forward_pass():
    m = _model(policy="grid").eval()
    x = torch.zeros(1, 1, 128, 128)
    x[0, 0, 10:30, 12:28] = 1.0  # ink in the top-left quadrant only
    fmap = m.backbone.feature_map(x)
    boxes = {
        name: anchor_boxes(torch.tensor([c]), ANCHORS["anchor_areas"], ANCHORS["anchor_ratios"], (128, 128))
        for name, c in (("on", [-0.7, -0.7]), ("away", [0.6, 0.6]), ("away2", [0.5, 0.7]))
    }
    h = {name: m._regions(fmap, b, None)[0] for name, b in boxes.items()}
    assert not torch.allclose(h["on"], h["away"])  # different centres -> different region features
    # the grid centres drive the whole episode: moving them changes the scores
    a_grid = m.episode(fmap, (128, 128), True)[0]
    m.grid = grid_centres(5).flip(0).contiguous()
    a_moved = m.episode(fmap, (128, 128), True)[0]
    assert not torch.allclose(a_grid, a_moved)


def test_learned_policy_locations_are_what_the_regions_see(monkeypatch):
    m = _model(learn_std=True, std=0.3).eval()
    x, _ = _batch(2)
    fmap = m.backbone.feature_map(x)
    seen = []
    import rlattention.methods.rarl as rarl_module

    real = rarl_module.anchor_boxes
    monkeypatch.setattr(rarl_module, "anchor_boxes", lambda c, *a: seen.append(c.clone()) or real(c, *a))
    locs = m.episode(fmap, (128, 128), False, torch.Generator().manual_seed(3))[3]
    torch.testing.assert_close(torch.stack(seen, 1), locs)  # the sampled l_t is the centre of R_t


# ------------------------------------------------------------------------------------ equal cost at test time
def test_rows_share_backbone_anchors_steps_and_episodes():
    cfgs = {row: load_config(CONFIGS / f"rarl_clutter{row}.yaml") for row in ROWS}
    base = cfgs[""]
    assert base.eval.mc_samples >= 2
    for row, cfg in cfgs.items():
        assert cfg.data == base.data and cfg.optim == base.optim
        assert cfg.eval.mc_samples == base.eval.mc_samples
        assert cfg.trainer.epochs == base.trainer.epochs and cfg.trainer.batch_size == base.trainer.batch_size
        m, b = cfg.model, base.model
        assert m.backbone_channels == b.backbone_channels and m.train_episodes == b.train_episodes
        if row in ("_random", "_grid", "_global"):  # the controls differ in the policy (or attention) only
            assert (m.anchor_areas, m.anchor_ratios, m.num_iterations) == (b.anchor_areas, b.anchor_ratios, 5)
    assert cfgs["_random"].model.policy == "random" and cfgs["_grid"].model.policy == "grid"
    assert cfgs["_global"].model.mode == "global"


@pytest.mark.parametrize("policy", ["learned", "random", "grid"])
def test_every_policy_runs_the_same_number_of_test_episodes_on_one_backbone_pass(monkeypatch, policy):
    m = _model(policy=policy).eval()
    x, _ = _batch(2)
    calls = {"backbone": 0, "episode": 0}
    real_fmap, real_episode = m.backbone.feature_map, m.episode

    def count(name, fn):
        def wrapped(*a, **k):
            calls[name] += 1
            return fn(*a, **k)

        return wrapped

    monkeypatch.setattr(m.backbone, "feature_map", count("backbone", real_fmap))
    monkeypatch.setattr(m, "episode", count("episode", real_episode))
    m.predict(x, mc_samples=5, generator=torch.Generator().manual_seed(0))
    assert calls == {"backbone": 1, "episode": 5}


def test_monte_carlo_episodes_differ_for_sampling_policies():
    x, _ = _batch(2)
    for policy in ("learned", "random"):
        m = _model(policy=policy, std=0.3).eval()
        fmap = m.backbone.feature_map(x)
        g = torch.Generator().manual_seed(0)
        l1, l2 = (m.episode(fmap, (128, 128), False, g)[3] for _ in range(2))
        assert not torch.allclose(l1, l2)


# -------------------------------------------------------------------------------------------------- exploration
def test_sigma_schedule_anneals_linearly():
    m = _model(std=0.3, std_final=0.05)
    for progress, expected in ((0.0, 0.3), (0.5, 0.175), (1.0, 0.05)):
        m.set_progress(progress)
        assert m.locator.std == pytest.approx(expected)
    x, y = _batch()
    m.set_progress(1.0)
    locs = m._scores(x, deterministic=False, generator=torch.Generator().manual_seed(0))[3]
    mean_locs = m._scores(x, deterministic=True)[3]
    assert (locs[:, 0] - mean_locs[:, 0]).abs().max() < 5 * 0.05  # the first step samples with the current sigma


def test_entropy_bonus_gradient_increases_sigma():
    policy = LearnedStdGaussianPolicy(4, 2, std=0.2)
    (-0.1 * policy.entropy()).backward()  # L_H = -beta H
    assert (policy.log_std.grad < 0).all()  # descent raises log sigma
    torch.testing.assert_close(policy.log_std.grad, torch.full((2,), -0.1))  # dH/dlog sigma_d = 1
    # entropy of a diagonal Gaussian against torch's
    ref = torch.distributions.Normal(torch.zeros(2), policy.std.detach()).entropy().sum()
    torch.testing.assert_close(gaussian_entropy(policy.std.detach()), ref)
    # in rarl: with only the bonus acting on the policy, an Adam step raises sigma
    m = _model(learn_std=True, std=0.2, entropy_weight=0.5, reinforce_weight=0.0)
    opt = torch.optim.Adam(m.locator.parameters(), lr=0.05)
    x, y = _batch()
    before = m.locator.std.detach().clone()
    out = m(x, y)
    assert "entropy" in out.terms
    opt.zero_grad()
    out.loss.backward()
    opt.step()
    assert (m.locator.std > before).all()


def test_learned_sigma_policy_gradient_matches_the_analytic_gradient():
    """Toy bandit, r(a) = -||a - c||^2, a ~ N(mu, diag(sigma^2)): J = -||mu - c||^2 - sum_d sigma_d^2, so
    dJ/dlog sigma_d = -2 sigma_d^2 and dJ/dmu = -2 (mu - c). The score-function estimate through the learned-sigma
    policy must agree with both."""
    torch.manual_seed(0)
    c = torch.tensor([0.3, -0.2])
    policy = LearnedStdGaussianPolicy(1, 2, std=0.4, bounded=False)
    with torch.no_grad():
        policy.fc.weight.zero_()
        policy.fc.bias.copy_(torch.tensor([-0.1, 0.2]))
    n = 400_000
    out = policy(torch.ones(n, 1))
    reward = -(out.action - c).pow(2).sum(-1)
    reinforce_loss(out.log_prob, reward).backward()
    sigma = policy.std.detach()
    torch.testing.assert_close(-policy.log_std.grad, -2 * sigma**2, atol=0.01, rtol=0.05)
    torch.testing.assert_close(-policy.fc.bias.grad, -2 * (policy.fc.bias.detach() - c), atol=0.01, rtol=0.05)


def _bandit_group_estimates(groups: int, K: int, loo: bool, seed: int, offset: float = 0.0) -> torch.Tensor:
    """Per-group estimates ``(groups, D)`` of dJ/dmu from K samples of one state each, with or without the
    leave-one-out baseline (the mean reward of the group's other K - 1 samples); rewards shifted by ``offset``."""
    g = torch.Generator().manual_seed(seed)
    c, mu, sigma = torch.tensor([0.3, -0.2]), torch.tensor([-0.4, 0.5]), 0.5
    a = mu + sigma * torch.randn(groups, K, 2, generator=g)
    r = -(a - c).pow(2).sum(-1) + offset
    b = leave_one_out_baseline(r, dim=1) if loo else torch.zeros_like(r)
    score = (a - mu) / sigma**2  # d log pi / d mu
    return ((r - b)[..., None] * score).mean(1)


@pytest.mark.parametrize("offset, ratio", [(0.0, 0.6), (5.0, 0.3)])
def test_leave_one_out_baseline_lowers_the_variance_without_moving_the_mean(offset, ratio):
    plain = _bandit_group_estimates(100_000, 4, loo=False, seed=0, offset=offset)
    loo = _bandit_group_estimates(100_000, 4, loo=True, seed=1, offset=offset)
    analytic = -2 * (torch.tensor([-0.4, 0.5]) - torch.tensor([0.3, -0.2]))
    for est in (plain, loo):  # both unbiased
        se = est.std(0) / math.sqrt(len(est))
        assert ((est.mean(0) - analytic).abs() < 4 * se).all()
    assert (loo.var(0) < ratio * plain.var(0)).all()
    # and a constant added to every reward changes nothing with the baseline (only the plain estimate's variance)
    torch.testing.assert_close(loo, _bandit_group_estimates(100_000, 4, loo=True, seed=1, offset=offset + 7.0))


def test_rarl_loo_episodes_share_one_backbone_pass_and_centre_the_advantages(monkeypatch):
    m = _model(train_episodes=3, baseline="loo")
    assert not hasattr(m, "baseline")  # no learned baseline to train
    x, y = _batch()
    calls = []
    real = m.backbone.feature_map
    monkeypatch.setattr(m.backbone, "feature_map", lambda t: calls.append(t.shape[0]) or real(t))
    captured = {}
    import rlattention.methods.rarl as rarl_module

    real_loss = rarl_module.reinforce_loss

    def spy(log_pi, G, b, **kw):
        captured.update(log_pi=log_pi, G=G, b=b)
        return real_loss(log_pi, G, b, **kw)

    monkeypatch.setattr(rarl_module, "reinforce_loss", spy)
    out = m(x, y)
    out.loss.backward()
    assert calls == [4]  # one backbone pass for the 4 x 3 episodes
    assert captured["log_pi"].shape == (12, 5)
    advantage = (captured["G"] - captured["b"])[:, 0].view(4, 3)
    torch.testing.assert_close(advantage.sum(1), torch.zeros(4))  # leave-one-out: centred within each image
    assert m.locator.fc.weight.grad is not None


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(baseline="loo"), "train_episodes"),
        (dict(train_episodes=0), "train_episodes"),
        (dict(entropy_weight=0.1), "learn_std"),
        (dict(learn_std=True, std_final=0.05), "std_final"),
        (dict(learn_std=True, std=0.9, std_max=0.5), "std_max"),
        (dict(baseline="critic"), "baseline"),
        (dict(policy="spiral"), "policy"),
    ],
)
def test_bad_exploration_options_name_their_key(kw, match):
    with pytest.raises(ValueError, match=match):
        _model(**kw)


@pytest.mark.parametrize("kw", [dict(), dict(baseline="none"), dict(learn_std=True, entropy_weight=0.01)])
def test_exploration_variants_train_and_predict(kw):
    m = _model(train_episodes=2, **kw)
    x, y = _batch()
    out = m(x, y)
    out.loss.backward()
    assert torch.isfinite(out.loss) and "reinforce" in out.terms
    assert ("baseline" in out.terms) == (kw.get("baseline", "learned") == "learned")
    m.eval()
    p = m.predict(x, mc_samples=2, generator=torch.Generator().manual_seed(0))
    assert p.shape == (4, 10) and torch.isfinite(p).all()


# ------------------------------------------------------------------------------------------------------- figure
def test_figure_has_numbered_steps_and_labels(tmp_path, monkeypatch):
    import rlattention.vision.plot as plot

    m = _model().eval()
    x, y = _batch(3)
    seen = {}
    real = plot.plot_region_steps

    def spy(images, locations, boxes, titles, path, *a, **k):
        seen.update(locations=locations, boxes=boxes, titles=titles)
        return real(images, locations, boxes, titles, path, *a, **k)

    monkeypatch.setattr(plot, "plot_region_steps", spy)
    paths = m.visualize(x, y, tmp_path)
    assert paths[0].name == "regions_steps.png" and paths[0].stat().st_size > 5000
    assert len(paths) == 1 + 3
    assert seen["boxes"].shape == (3, 5, 9, 4) and seen["locations"].shape == (3, 5, 2)
    assert all(t.startswith("true 2 5 | predicted") or t.startswith("true 2 | predicted") for t in seen["titles"])
    assert len({tuple(c) for c in plot.step_colours(5)}) == 5  # one colour per step
