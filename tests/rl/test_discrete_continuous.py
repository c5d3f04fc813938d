"""The discrete-continuous policy of DCPG: log-probabilities of exactly the actions used, gradients through the
Gumbel-softmax relaxation into W_mu, the in-batch R@1 + AP reward, and the leave-one-out baseline of eq. 10."""

from __future__ import annotations

import pytest
import torch

from rlattention.rl import leave_one_out_baseline
from rlattention.rl.discrete_continuous import DiscreteContinuousPolicy, dcpg_losses, in_batch_retrieval_reward
from rlattention.rl.policies import gaussian_log_prob


def _policy(**kw) -> DiscreteContinuousPolicy:
    torch.manual_seed(0)
    return DiscreteContinuousPolicy(6, 8, num_bins=10, heads=2, **kw)


def test_log_probs_are_of_the_actions_used():
    policy = _policy()
    x = torch.randn(3, 5, 6)
    out = policy(x, generator=torch.Generator().manual_seed(1))
    # continuous: log N(z | mu, sigma) of the z that produced the attention (fails if z were re-sampled)
    assert torch.allclose(out.head_attention, torch.sigmoid(out.z))
    expected = gaussian_log_prob(out.z.unsqueeze(-1), out.mu.unsqueeze(-1), out.sigma.unsqueeze(-1))
    assert torch.allclose(out.log_prob_continuous, expected, atol=1e-6)
    # a second draw differs, so a log-prob of another sample would not match
    other = policy(x, generator=torch.Generator().manual_seed(2))
    assert not torch.allclose(other.z, out.z)
    assert out.bins.shape == (3, 5, 2) and out.log_prob_discrete.le(0).all()
    assert torch.allclose(out.attention, out.head_attention.mean(-1))


def test_discrete_log_prob_is_of_the_sampled_bin():
    policy = _policy()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 6)
    out = policy(x, generator=g)
    # recompute a_g with the same noise: replay the generator
    g2 = torch.Generator().manual_seed(3)
    h, _ = policy.gru(x)
    logits = policy.w_mu(h).view(2, 4, 2, 10)
    u = torch.rand(logits.shape, generator=g2)
    a_g = ((logits - torch.log(-torch.log(u.clamp(1e-10, 1 - 1e-7)))) / policy.tau).softmax(-1)
    assert torch.allclose(out.log_prob_discrete, a_g.gather(-1, out.bins.unsqueeze(-1)).squeeze(-1).log(), atol=1e-5)


@pytest.mark.parametrize("estimator", ["relaxed", "straight_through"])
def test_gumbel_softmax_gradient_reaches_w_mu(estimator):
    policy = _policy(estimator=estimator)
    out = policy(torch.randn(4, 3, 6), generator=torch.Generator().manual_seed(0))
    loss_d, loss_c = dcpg_losses(out, torch.rand(4))
    loss_c.backward(retain_graph=True)  # continuous loss: through mu = logistic(relaxed bin / n)
    assert policy.w_mu.weight.grad.abs().sum() > 0 and policy.w_std.weight.grad.abs().sum() > 0
    policy.zero_grad()
    loss_d.backward()
    assert policy.w_mu.weight.grad.abs().sum() > 0


def test_deterministic_evaluation_and_padding():
    policy = _policy()
    x = torch.randn(2, 4, 6)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    a = policy(x, mask, deterministic=True)
    b = policy(x, mask, deterministic=True)
    assert torch.equal(a.attention, b.attention)
    assert torch.allclose(a.head_attention[mask], torch.sigmoid(a.mu)[mask])
    assert (a.attention[~mask] == 0).all() and (a.log_prob_continuous[~mask] == 0).all()


def test_ablation_modes():
    x = torch.randn(2, 3, 6)
    disc = _policy(mode="discrete")(x)
    assert (disc.log_prob_continuous == 0).all() and torch.allclose(disc.head_attention, disc.mu)
    cont = _policy(mode="continuous")(x)
    assert torch.isfinite(cont.log_prob_continuous).all()
    with pytest.raises(ValueError, match="estimator"):
        _policy(estimator="reinforce")


def test_in_batch_reward_r1_and_ap_by_hand():
    sims = torch.tensor([[0.9, 0.8, 0.1], [0.2, 0.5, 0.5], [0.3, 0.2, 0.1]])
    rel = torch.tensor([[1, 0, 1], [0, 1, 0], [0, 0, 0]], dtype=torch.bool)
    # q0: ranked [rel, irr, rel] -> R@1 1, AP (1/1 + 2/3) / 2; q1: tie 0.5/0.5, ties against -> [irr, rel, irr]
    r = in_batch_retrieval_reward(sims, rel, "r1+ap")
    assert r[0].item() == pytest.approx(1 + (1 + 2 / 3) / 2)
    assert r[1].item() == pytest.approx(0 + 0.5)
    assert r[2].item() == 0.0
    assert in_batch_retrieval_reward(sims, rel, "r1").tolist() == [1.0, 0.0, 0.0]


def test_leave_one_out_baseline_excludes_own_reward():
    rewards = torch.tensor([1.0, 0.0, 2.0, 3.0])
    b = leave_one_out_baseline(rewards, beta=0.5)
    assert b.tolist() == pytest.approx([0.5 * 5 / 3, 0.5 * 6 / 3, 0.5 * 4 / 3, 0.5 * 3 / 3])


def test_init_std_sets_the_starting_sigma():
    policy = _policy(init_std=0.1)
    out = policy(torch.randn(2, 3, 6))
    assert torch.allclose(out.sigma, torch.full_like(out.sigma, 0.1), atol=1e-5)
    with pytest.raises(ValueError, match="init_std"):
        _policy(init_std=0.0)
