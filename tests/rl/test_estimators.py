"""The policy-gradient estimator is right: it matches the analytic gradient on a toy bandit, a baseline keeps it
unbiased and lowers its variance, and no gradient leaks into the baseline or through the sampled action."""

from __future__ import annotations

import math

import pytest
import torch

from rlattention.rl import (
    GaussianPolicy,
    LearnedBaseline,
    baseline_loss,
    discounted_returns,
    gaussian_log_prob,
    leave_one_out_baseline,
    reinforce_loss,
    terminal_returns,
)

TARGET = torch.tensor([0.3, -0.2])
SIGMA = 0.5


def _bandit(n: int, seed: int, baseline: float | None):
    """One-step bandit: a ~ N(mu, sigma^2 I), r(a) = -||a - c||^2, J(mu) = -||mu - c||^2 - D sigma^2.

    Returns the per-sample estimates of dJ/dmu ``(n, D)`` obtained by back-propagating ``reinforce_loss``
    (a tensor of per-sample means expanded from mu lets autograd hand us each sample's contribution).
    """
    torch.manual_seed(seed)
    policy = GaussianPolicy(1, action_dim=2, std=SIGMA, bounded=False)
    with torch.no_grad():
        policy.fc.weight.zero_()
        policy.fc.bias.copy_(torch.tensor([-0.4, 0.5]))
    h = torch.ones(n, 1)
    out = policy(h)
    reward = -(out.action - TARGET).pow(2).sum(-1)
    b = None if baseline is None else torch.full((n,), baseline)
    loss = reinforce_loss(out.log_prob, reward, b)
    (grad_mean,) = torch.autograd.grad(loss, out.mean)  # (n, D): -(1/n) * per-sample estimate
    return -grad_mean * n, policy.fc.bias.detach()


def test_score_function_matches_analytic_gradient():
    est, mu = _bandit(200_000, seed=0, baseline=None)
    analytic = -2.0 * (mu - TARGET)
    mean, se = est.mean(0), est.std(0) / math.sqrt(len(est))
    assert torch.all((mean - analytic).abs() < 4 * se), (mean, analytic, se)
    # and the estimate is informative: the analytic gradient is many standard errors away from zero
    assert torch.all(analytic.abs() > 10 * se)


def test_parameter_gradient_equals_mean_of_estimates():
    torch.manual_seed(1)
    policy = GaussianPolicy(3, std=SIGMA, bounded=True)
    h = torch.randn(64, 3)
    out = policy(h)
    reward = torch.randn(64)
    reinforce_loss(out.log_prob, reward).backward()
    # closed form of d/dW of -(1/B) sum r log pi for mu = tanh(W h + b)
    mu = out.mean.detach()
    dlogpi_dmu = (out.action - mu) / SIGMA**2
    dmu_dpre = 1 - mu.pow(2)
    g_pre = -(reward[:, None] * dlogpi_dmu * dmu_dpre) / 64
    assert torch.allclose(policy.fc.weight.grad, g_pre.T @ h, atol=1e-6)
    assert torch.allclose(policy.fc.bias.grad, g_pre.sum(0), atol=1e-6)


def test_baseline_keeps_mean_and_lowers_variance():
    plain, mu = _bandit(200_000, seed=2, baseline=None)
    expected_reward = -(mu - TARGET).pow(2).sum() - 2 * SIGMA**2
    with_b, _ = _bandit(200_000, seed=2, baseline=float(expected_reward))
    se = torch.sqrt(plain.var(0) / len(plain) + with_b.var(0) / len(with_b))
    assert torch.all((plain.mean(0) - with_b.mean(0)).abs() < 4 * se)
    assert torch.all(with_b.var(0) < 0.5 * plain.var(0)), (with_b.var(0), plain.var(0))


def test_policy_term_sends_no_gradient_to_baseline():
    torch.manual_seed(3)
    h = torch.randn(16, 8, requires_grad=True)
    policy, base = GaussianPolicy(8), LearnedBaseline(8)
    out = policy(h)
    b = base(h)
    reinforce_loss(out.log_prob, torch.ones(16), b).backward()
    assert base.fc.weight.grad is None and base.fc.bias.grad is None
    # the baseline's own loss trains it and does not reach the state it reads
    h.grad = None
    baseline_loss(base(h), torch.ones(16)).backward()
    assert base.fc.bias.grad is not None and base.fc.bias.grad.abs().sum() > 0
    assert h.grad is None


def test_sampled_action_carries_no_gradient_and_log_prob_is_of_that_action():
    torch.manual_seed(4)
    policy = GaussianPolicy(5, std=0.2)
    out = policy(torch.randn(10, 5))
    assert not out.action.requires_grad
    ref = torch.distributions.Normal(out.mean, 0.2).log_prob(out.action).sum(-1)
    assert torch.allclose(out.log_prob, ref, atol=1e-6)
    det = policy(torch.randn(10, 5), deterministic=True)
    assert torch.equal(det.action, det.mean.detach())


def test_seeded_generator_reproduces_samples():
    policy = GaussianPolicy(4)
    h = torch.randn(6, 4)
    a = policy(h, generator=torch.Generator().manual_seed(7)).action
    b = policy(h, generator=torch.Generator().manual_seed(7)).action
    assert torch.equal(a, b)


def test_gaussian_log_prob_matches_torch():
    a, m = torch.randn(7, 3), torch.randn(7, 3)
    ref = torch.distributions.Normal(m, 0.3).log_prob(a).sum(-1)
    assert torch.allclose(gaussian_log_prob(a, m, 0.3), ref, atol=1e-6)


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_discounted_returns_match_loop(gamma):
    r = torch.randn(4, 7)
    ref = torch.zeros_like(r)
    running = torch.zeros(4)
    for t in reversed(range(7)):
        running = r[:, t] + gamma * running
        ref[:, t] = running
    assert torch.allclose(discounted_returns(r, gamma), ref, atol=1e-6)


def test_terminal_returns():
    R = torch.tensor([1.0, 0.0, 2.0])
    G = terminal_returns(R, 3, gamma=0.5)
    assert torch.allclose(G, torch.tensor([[0.25, 0.5, 1.0], [0, 0, 0], [0.5, 1.0, 2.0]]))
    rewards = torch.zeros(3, 3)
    rewards[:, -1] = R
    assert torch.allclose(G, discounted_returns(rewards, 0.5))


def test_leave_one_out_excludes_own_reward():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    b = leave_one_out_baseline(r, beta=0.5)
    assert torch.allclose(b, 0.5 * torch.tensor([1 / 3, 2 / 3, 2 / 3, 1 / 3]))
    with pytest.raises(ValueError):
        leave_one_out_baseline(torch.ones(1))


def test_reinforce_mask_drops_padded_steps():
    log_pi = torch.randn(2, 3, requires_grad=True)
    G = torch.ones(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    reinforce_loss(log_pi, G, mask=mask).backward()
    assert torch.equal(log_pi.grad == 0, mask == 0)
