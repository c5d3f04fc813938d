"""Bootstrapped heads (fresh masks, gradient only into masked heads; the per-head policy-gradient update is each
head's own policy gradient for ``acting`` and ``importance`` and biased for ``all``), the eta threshold schedule,
the rank reward and PPO's clipped surrogate."""

from __future__ import annotations

import math

import pytest
import torch

from rlattention.rl import (
    BOOTSTRAP_UPDATES,
    MultiHeadGaussianPolicy,
    SigmoidThreshold,
    bootstrap_masks,
    bootstrapped_q_loss,
    bootstrapped_reinforce_loss,
    discounted_returns,
    gaussian_log_prob,
    importance_weights,
    ppo_clip_loss,
    rank_threshold_reward,
    sample_heads,
)


def test_masks_are_fresh_per_experience_and_head():
    g = torch.Generator().manual_seed(0)
    m = bootstrap_masks((8, 20), num_heads=6, p=0.5, generator=g)
    assert m.shape == (8, 20, 6) and set(m.unique().tolist()) <= {0.0, 1.0}
    # masks differ across steps of one episode and across heads of one step
    assert (m[:, 1:] != m[:, :-1]).any(-1).float().mean() > 0.5
    assert (m[..., 1:] != m[..., :-1]).any().item()
    assert abs(m.mean().item() - 0.5) < 0.05
    assert bootstrap_masks((3, 4), 2, 1.0).eq(1).all()
    with pytest.raises(ValueError, match="probability"):
        bootstrap_masks((2,), 3, 0.0)


def test_only_masked_heads_receive_gradient():
    torch.manual_seed(0)
    K, F_, B, T = 4, 5, 3, 7
    policy = MultiHeadGaussianPolicy(F_, K, 2, std=(0.3, 0.2))
    h = torch.randn(B, T, F_)
    actions = torch.randn(B, T, 2).clamp(-1, 1)
    masks = torch.zeros(B, T, K)
    masks[..., 1] = 1.0  # only head 1 sees experience
    masks[0, 3, 2] = 1.0  # head 2 sees exactly one experience
    returns = torch.rand(B, T)
    loss = bootstrapped_reinforce_loss(policy.log_prob_all(actions, h), returns, masks, update="all")
    loss.backward()
    grad = policy.fc.weight.grad.view(K, 2, F_)
    assert grad[1].abs().sum() > 0 and grad[2].abs().sum() > 0
    assert grad[0].abs().sum() == 0 and grad[3].abs().sum() == 0
    # head 2's gradient is exactly that of its single masked experience
    policy.zero_grad()
    single = -(returns[0, 3] * policy.log_prob_all(actions[0, 3], h[0, 3])[2]) / B
    single.backward()
    assert torch.allclose(policy.fc.weight.grad.view(K, 2, F_)[2], grad[2], atol=1e-6)


def test_log_prob_all_matches_each_head_and_acting_head():
    torch.manual_seed(1)
    policy = MultiHeadGaussianPolicy(6, 3, 2, std=0.25)
    h = torch.randn(10, 6)
    head = sample_heads(10, 3, torch.Generator().manual_seed(0))
    out = policy(h, head, generator=torch.Generator().manual_seed(1))
    assert not out.action.requires_grad
    all_lp = policy.log_prob_all(out.action, h)
    means = policy.means(h)
    for k in range(3):
        assert torch.allclose(all_lp[:, k], gaussian_log_prob(out.action, means[:, k], 0.25), atol=1e-6)
    assert torch.allclose(out.log_prob, all_lp.gather(1, head[:, None]).squeeze(1), atol=1e-6)
    assert torch.allclose(out.mean, means[torch.arange(10), head])
    ens = policy(h, None, deterministic=True)
    assert torch.allclose(ens.action, means.mean(1))


def test_std_schedule_attribute_validates():
    policy = MultiHeadGaussianPolicy(4, 2)
    policy.std = 0.1
    assert policy.std == (0.1, 0.1)
    policy.std = (0.2, 0.05)
    assert policy.std == (0.2, 0.05)
    with pytest.raises(ValueError, match="positive"):
        policy.std = (0.1, -1.0)


def test_eta_schedule_matches_eq5():
    eta = SigmoidThreshold(alpha=0.02, beta=-2.0)
    for t in (0, 10, 100, 1000):
        assert eta(t) == pytest.approx(1.0 / (1.0 + math.exp(-0.02 * t - 2.0)))
    assert eta(0) == pytest.approx(0.8808, abs=1e-4)
    rising = SigmoidThreshold(0.02, 2.0)
    assert rising(0) == pytest.approx(0.1192, abs=1e-4) and rising(100) == pytest.approx(0.5)
    values = [rising(t) for t in range(0, 1000, 50)]
    assert values == sorted(values) and values[-1] < 1.0
    assert SigmoidThreshold(0.02, 1e6)(0) == 0.0  # no overflow


def test_rank_threshold_reward():
    ranks = torch.tensor([1, 2, 3, 8, 9])
    assert rank_threshold_reward(ranks, 0.88).tolist() == [1, 0, 0, 0, 0]
    assert rank_threshold_reward(ranks, 0.125).tolist() == [1, 1, 1, 1, 0]  # 1/8 >= 0.125


def test_ppo_clip_loss_clips_the_ratio():
    log_old = torch.zeros(4)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    log_new = torch.log(torch.tensor([1.5, 1.1, 0.5, 0.9])).requires_grad_()
    loss = ppo_clip_loss(log_new, log_old, adv, clip=0.2)
    loss.backward()
    # ratios 1.5 (A>0) and 0.5 (A<0) are outside the trust region: no gradient; the others have gradient
    assert log_new.grad[0] == 0 and log_new.grad[2] == 0
    assert log_new.grad[1] != 0 and log_new.grad[3] != 0
    expected = -(torch.tensor([1.2, 1.1, -0.8, -0.9])).mean()
    assert loss.item() == pytest.approx(expected.item())


def test_bootstrapped_q_loss_masks_heads():
    q = torch.randn(5, 3, 4, requires_grad=True)
    action = torch.tensor([0, 1, 2, 3, 0])
    target = torch.randn(5, 3)
    masks = torch.zeros(5, 3)
    masks[:, 0] = 1
    bootstrapped_q_loss(q, action, target, masks).backward()
    assert q.grad[:, 1:].abs().sum() == 0 and q.grad[:, 0].abs().sum() > 0


def test_spread_starts_each_head_on_its_own_point_of_the_circle():
    torch.manual_seed(0)
    policy = MultiHeadGaussianPolicy(16, 6, 2, 0.2).spread_(radius=0.5)
    mu = policy.means(torch.zeros(1, 16))[0]  # (K, 2): the biases alone
    angle = torch.arange(6) * (2 * math.pi / 6)
    assert torch.allclose(mu, 0.5 * torch.stack((angle.cos(), angle.sin()), -1), atol=1e-6)
    assert torch.allclose(mu.norm(dim=-1), torch.full((6,), 0.5), atol=1e-6)
    assert torch.cdist(mu, mu).add(torch.eye(6)).min() > 0.4  # distinct points
    # the state moves each mean only a little at first
    h = torch.randn(64, 16)
    assert (policy.means(h) - mu).abs().max() < 0.2
    with pytest.raises(ValueError, match="radius"):
        MultiHeadGaussianPolicy(16, 6, 2, 0.2).spread_(radius=1.0)
    with pytest.raises(ValueError, match="action_dim"):
        MultiHeadGaussianPolicy(16, 6, 3, 0.2).spread_()


# ------------------------------------------------------------------ the per-head update: its claim on a bandit
# A stateless T-step bandit with two equally good optima: v_t ~ N(mu_k, SIGMA^2) (1-d), R(v) = sum_c N-shaped bumps
# exp(-(v - c)^2 / (2 W^2)) at c = +-C, G_t = sum_{t' >= t} R(v_t'). Head k's objective J_k(mu_k) = E_{pi_k}[sum_t
# R(v_t)] = T j(mu_k) with j(m) = sum_c W / s exp(-(m - c)^2 / (2 s^2)), s^2 = W^2 + SIGMA^2 (a Gaussian convolution).
C, W, SIGMA, T_BANDIT = 0.6, 0.15, 0.2, 2


def _bumps(v: torch.Tensor) -> torch.Tensor:
    return sum(torch.exp(-((v - c) ** 2) / (2 * W**2)) for c in (C, -C))


def _analytic_gradient(mu: float) -> float:
    """d/dmu_k E_{v ~ pi_k}[sum_t R(v_t)]."""
    s2 = W**2 + SIGMA**2
    return T_BANDIT * sum(-(mu - c) / s2 * W / math.sqrt(s2) * math.exp(-((mu - c) ** 2) / (2 * s2)) for c in (C, -C))


def _per_episode_updates(update: str, mus: list[float], n: int, seed: int, p: float = 0.5, clip: float = 1.0):
    """Each episode's ascent direction for each head's mean: ``(n, K)`` float64 (minus n times the gradient of the
    batch loss w.r.t. a per-episode copy of the means, so autograd hands back every episode's contribution)."""
    g = torch.Generator().manual_seed(seed)
    K = len(mus)
    mu = torch.tensor(mus, dtype=torch.float64).expand(n, K).clone().requires_grad_()
    head = sample_heads(n, K, g)
    v = mu.detach().gather(1, head[:, None]) + SIGMA * torch.randn(n, T_BANDIT, generator=g, dtype=torch.float64)
    log_pi = gaussian_log_prob(v[..., None, None], mu[:, None, :, None].expand(n, T_BANDIT, K, 1), SIGMA)
    returns = discounted_returns(_bumps(v), 1.0)  # (n, T)
    masks = bootstrap_masks((n, T_BANDIT), K, p, generator=g).double()
    loss = bootstrapped_reinforce_loss(log_pi, returns, masks, acting_head=head, update=update, clip=clip)
    (grad,) = torch.autograd.grad(loss, mu)
    return -grad * n, head


def _expected_update(update: str, mus: list[float], n: int = 200_000, seed: int = 0, clip: float = 1.0):
    """Monte-Carlo mean of each head's update and its standard error, normalised so that an unbiased update
    estimates grad J_k: ``acting`` by P(omega_k = 1) P(head k acts) = p / K, ``importance`` and ``all`` by p
    (every episode feeds every head)."""
    p = 0.5
    est, head = _per_episode_updates(update, mus, n, seed, p, clip)
    norm = p / len(mus) if update == "acting" else p
    return est.mean(0) / norm, est.std(0) / math.sqrt(n) / norm, est, head


def test_acting_update_is_each_heads_own_policy_gradient():
    mus = [-0.45, 0.1, 0.5]  # on both sides of both optima: the heads' gradients differ in sign and size
    mean, se, est, head = _expected_update("acting", mus)
    analytic = torch.tensor([_analytic_gradient(m) for m in mus], dtype=torch.float64)
    assert torch.all((mean - analytic).abs() < 4 * se), (mean, analytic, se)
    assert torch.all(analytic.abs() > 20 * se)  # informative: far from zero in standard errors
    # head k learns nothing from the episodes it did not act in
    assert torch.all(est[head[:, None] != torch.arange(3)] == 0)


def test_importance_update_with_large_clip_is_each_heads_own_policy_gradient():
    mus = [0.3, 0.4, 0.5]  # close enough (in units of sigma) for the 2-step ratios to have a finite variance
    mean, se, _, _ = _expected_update("importance", mus, clip=1e6)
    analytic = torch.tensor([_analytic_gradient(m) for m in mus], dtype=torch.float64)
    assert torch.all((mean - analytic).abs() < 4 * se), (mean, analytic, se)
    assert torch.all(analytic.abs() > 20 * se)
    # a clip of 1 trades that for bounded weights: it under-weights the episodes a head likes more than the actor
    clipped, clipped_se, _, _ = _expected_update("importance", mus, clip=1.0)
    assert (analytic[-1] - clipped[-1]) > 10 * clipped_se[-1]


def test_all_update_is_biased_and_points_the_wrong_way():
    """Head 0 sits left of the optimum at +C, so its policy gradient is positive; under ``all`` it also learns
    from head 1's actions near -C (high reward, far left of head 0): its expected update points left, away from
    its own optimum. The ``acting`` update on the same episodes points right. This is why ``all`` is not the
    default."""
    mus = [0.45, -0.6]
    analytic = _analytic_gradient(mus[0])
    assert analytic > 0
    biased, se, _, _ = _expected_update("all", mus)
    assert biased[0] < -10 * se[0], (biased, se)  # significantly negative: the wrong way
    acting, acting_se, _, _ = _expected_update("acting", mus)
    assert abs(acting[0] - analytic) < 4 * acting_se[0] and acting[0] > 10 * acting_se[0]


def _train_heads(update: str, starts: list[float], steps: int = 150, batch: int = 256, seed: int = 0):
    """K 1-d heads on the two-optimum bandit (one step per episode, plain SGD -- torch.optim's first step costs a
    2 s import --, no baseline as in the paper); returns the final means ``(K,)``."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    K = len(starts)
    policy = MultiHeadGaussianPolicy(1, K, action_dim=1, std=SIGMA)
    with torch.no_grad():
        policy.fc.weight.zero_()
        policy.fc.bias.copy_(torch.atanh(torch.tensor(starts)))
    h = torch.ones(batch, 1)
    for _ in range(steps):
        head = sample_heads(batch, K, g)
        out = policy(h, head, generator=g)
        log_pi = policy.log_prob_all(out.action, h)[:, None]  # (B, 1, K)
        masks = bootstrap_masks((batch, 1), K, 0.5, generator=g)
        R = _bumps(out.action)  # (B, 1)
        loss = bootstrapped_reinforce_loss(log_pi, R, masks, acting_head=head, update=update)
        policy.zero_grad()
        loss.backward()
        with torch.no_grad():
            for param in policy.parameters():  # h = 1: weight and bias both move the mean, 0.05 in all
                param -= 0.025 * param.grad
    with torch.no_grad():
        return policy.means(torch.ones(1, 1))[0, :, 0]


@pytest.mark.parametrize("starts", [[-0.3, 0.3], [-0.2, 0.1, 0.3]], ids=["K2", "K3"])
def test_acting_heads_stay_apart_all_heads_collapse(starts):
    start_distance = torch.pdist(torch.tensor(starts)[:, None]).mean()
    acting = _train_heads("acting", starts)
    # each head climbs to its nearest optimum, both optima stay covered and the heads move apart
    assert (acting - C).abs().min() < 0.1 and (acting + C).abs().min() < 0.1, acting
    assert torch.pdist(acting[:, None]).mean() > start_distance
    collapsed = _train_heads("all", starts)
    # every head is pulled to every head's rewarded actions: they end on one point
    assert torch.pdist(collapsed[:, None]).mean() < 0.25 * start_distance, collapsed


@pytest.mark.parametrize("update", BOOTSTRAP_UPDATES)
def test_head_with_zero_mask_gets_no_gradient_from_that_experience(update):
    """Per experience and head, the gradient w.r.t. log pi_k(v_bt) is -(1/B) w_btk (G - b): zero where omega = 0,
    and w matches a slow reference (for ``importance``: the clipped product of per-step ratios over the episode)."""
    g = torch.Generator().manual_seed(5)
    B, T, K, clip = 6, 4, 3, 1.5
    log_pi = (0.3 * torch.randn(B, T, K, generator=g, dtype=torch.float64)).requires_grad_()
    returns, baseline = torch.rand(B, T, generator=g, dtype=torch.float64), torch.full((B, T), 0.2).double()
    masks = bootstrap_masks((B, T), K, 0.5, generator=g).double()
    head = sample_heads(B, K, g)
    bootstrapped_reinforce_loss(log_pi, returns, masks, baseline, acting_head=head, update=update, clip=clip).backward()
    assert torch.all(log_pi.grad[masks == 0] == 0)
    ref, lp = torch.zeros(B, T, K, dtype=torch.float64), log_pi.detach()
    for b in range(B):
        a = int(head[b])
        for k in range(K):
            if update == "all":
                w = 1.0
            elif update == "acting":
                w = float(k == a)
            else:
                w = min(clip, math.prod(math.exp(lp[b, t, k] - lp[b, t, a]) for t in range(T)))
            for t in range(T):
                ref[b, t, k] = -masks[b, t, k] * w * (returns[b, t] - 0.2) / B
    assert torch.allclose(log_pi.grad, ref, atol=1e-12)
    if update != "all":  # the acting head's own experiences always count fully
        own = masks.gather(-1, head[:, None, None].expand(B, T, 1)).bool().squeeze(-1)
        assert torch.all(log_pi.grad.gather(-1, head[:, None, None].expand(B, T, 1)).squeeze(-1)[own] != 0)


def test_importance_weights_are_the_clipped_episode_ratio():
    log_pi = torch.tensor([[[0.0, 1.0, -50.0], [0.0, 0.5, -50.0]]])  # (1, 2, 3); head 0 acted
    w = importance_weights(log_pi, torch.tensor([0]), clip=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, math.exp(-100.0)]]))  # e^1.5 clipped to 2
    long = torch.zeros(1, 500, 2)
    long[..., 1] = 1.0  # a product over 500 steps: e^500 overflows float32, the log-space clip does not
    assert importance_weights(long, torch.tensor([0]), clip=3.0).tolist() == [[1.0, 3.0]]
    with pytest.raises(ValueError, match="clip"):
        importance_weights(log_pi, torch.tensor([0]), clip=0.5)


def test_update_argument_defaults_and_validation():
    g = torch.Generator().manual_seed(0)
    log_pi = torch.randn(4, 3, 2, generator=g)
    returns, masks, head = torch.rand(4, 3, generator=g), torch.ones(4, 3, 2), torch.tensor([0, 1, 1, 0])
    # with the acting head the default is the unbiased "acting" update
    assert torch.equal(
        bootstrapped_reinforce_loss(log_pi, returns, masks, acting_head=head),
        bootstrapped_reinforce_loss(log_pi, returns, masks, acting_head=head, update="acting"),
    )
    # without it (older callers) the old biased update, with a warning
    with pytest.warns(FutureWarning, match="acting_head"):
        legacy = bootstrapped_reinforce_loss(log_pi, returns, masks)
    assert torch.equal(legacy, bootstrapped_reinforce_loss(log_pi, returns, masks, update="all"))
    with pytest.raises(ValueError, match="acting_head"):
        bootstrapped_reinforce_loss(log_pi, returns, masks, update="importance")
    with pytest.raises(ValueError, match="one of"):
        bootstrapped_reinforce_loss(log_pi, returns, masks, acting_head=head, update="every")
    with pytest.raises(ValueError, match=r"\(B,\)"):
        bootstrapped_reinforce_loss(log_pi, returns, masks, acting_head=head[:2])
