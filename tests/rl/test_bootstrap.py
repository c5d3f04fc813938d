"""Bootstrapped heads (fresh masks, gradient only into masked heads), the eta threshold schedule, the rank
reward and PPO's clipped surrogate."""

from __future__ import annotations

import math

import pytest
import torch

from rlattention.rl import (
    MultiHeadGaussianPolicy,
    SigmoidThreshold,
    bootstrap_masks,
    bootstrapped_q_loss,
    bootstrapped_reinforce_loss,
    gaussian_log_prob,
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
    loss = bootstrapped_reinforce_loss(policy.log_prob_all(actions, h), returns, masks)
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
