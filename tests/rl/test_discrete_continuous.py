"""The discrete-continuous policy of DCPG: log-probabilities of exactly the actions used, gradients through the
Gumbel-softmax relaxation into W_mu, the sampled bin driving the attention, bins spanning (0, 1), the expected
policy gradients on a two-armed bandit against the analytic ones, the in-batch R@1 + AP reward, and the
leave-one-out baseline of eq. 10."""

from __future__ import annotations

import math

import pytest
import torch

from rlattention.rl import leave_one_out_baseline
from rlattention.rl.discrete_continuous import (
    DiscreteContinuousPolicy,
    bin_mean,
    centred_bin_logits,
    dcpg_losses,
    gru_sequence,
    in_batch_retrieval_reward,
    mean_uniform_attention,
)
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
    loss_c.backward(retain_graph=True)  # continuous loss: through mu = mu(relaxed bin)
    assert policy.w_mu.weight.grad.abs().sum() > 0 and policy.w_std.weight.grad.abs().sum() > 0
    policy.zero_grad()
    loss_d.backward()
    assert policy.w_mu.weight.grad.abs().sum() > 0


def test_mu_grad_none_leaves_w_mu_to_the_discrete_term():
    policy = _policy(mu_grad="none")
    out = policy(torch.randn(4, 3, 6), generator=torch.Generator().manual_seed(0))
    loss_d, loss_c = dcpg_losses(out, torch.rand(4))
    loss_c.backward(retain_graph=True)
    assert policy.w_mu.weight.grad is None and policy.w_std.weight.grad.abs().sum() > 0
    loss_d.backward()
    assert policy.w_mu.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="mu_grad='none' needs estimator='straight_through'"):
        _policy(estimator="relaxed", mu_grad="none")


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
    disc = _policy(mode="discrete")(x)  # the sampled bin's centre is the attention
    assert (disc.log_prob_continuous == 0).all()
    assert torch.allclose(disc.head_attention, (disc.bins + 0.5) / 10)
    old = _policy(mode="discrete", bin_map="logistic", estimator="relaxed")(x)  # the first runs: Att = mu
    assert torch.allclose(old.head_attention, old.mu)
    cont = _policy(mode="continuous")(x)
    assert torch.isfinite(cont.log_prob_continuous).all()
    for key, value in (("estimator", "reinforce"), ("bin_map", "linear"), ("mu_grad", "exact"), ("mode", "both")):
        with pytest.raises(ValueError, match=f"{key} must be one of .*got '{value}'"):
            _policy(**{key: value})


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


@pytest.mark.parametrize("att_std", [0.03, 0.08])
def test_init_att_std_starts_the_discrete_stage_near_the_middle(att_std):
    """The initial policy's weights: near 0.5, spread about att_std (the Gumbel draw of a_g and then of a_s from
    it widen the prior somewhat), against the nearly uniform spread over (0, 1) (std 0.29) of PyTorch's init."""
    torch.manual_seed(0)
    x = torch.randn(64, 6, 16)
    centred = DiscreteContinuousPolicy(16, 32, num_bins=100, heads=2, init_att_std=att_std, init_std=1e-2)
    drawn = centred(x, generator=torch.Generator().manual_seed(0)).head_attention
    assert abs(drawn.mean().item() - 0.5) < 0.02
    assert att_std < drawn.std().item() < 2.5 * att_std
    evaluation = centred(x, deterministic=True).head_attention
    assert (evaluation - 0.5).abs().max() < 0.03
    uniform = DiscreteContinuousPolicy(16, 32, num_bins=100, heads=2, init_std=1e-2)
    assert uniform(x, generator=torch.Generator().manual_seed(0)).head_attention.std() > 0.25
    assert centred_bin_logits(100, att_std).argmax().item() in (49, 50)
    with pytest.raises(ValueError, match="init_att_std"):
        centred_bin_logits(100, 0.0)


# ---------------------------------------------------------------- the sampled bin drives the attention


def _shift_bins(policy: DiscreteContinuousPolicy, monkeypatch) -> None:
    """Intervene on a_s: the policy draws its bins as before (the same random numbers), then moves each by n / 2."""
    draw = policy.sample_bins
    monkeypatch.setattr(policy, "sample_bins", lambda a_g, generator=None: (draw(a_g, generator) + 5) % 10)


def test_sampled_bin_drives_the_attention(monkeypatch):
    policy = _policy(min_std=1e-5, init_std=1e-4)  # straight_through, bins spanning (0, 1); sigma ~ 0
    x = torch.randn(3, 5, 6)
    out = policy(x, generator=torch.Generator().manual_seed(4))
    assert torch.allclose(out.head_attention, (out.bins + 0.5) / 10, atol=1e-4)  # Att = centre of bin a_s
    _shift_bins(policy, monkeypatch)
    moved = policy(x, generator=torch.Generator().manual_seed(4))
    assert torch.equal(moved.bins, (out.bins + 5) % 10)
    assert torch.allclose(moved.head_attention, (moved.bins + 0.5) / 10, atol=1e-4)
    assert (moved.head_attention - out.head_attention).abs().min() > 0.49  # every weight moved by half the range


def test_relaxed_estimator_ignores_the_sampled_bin(monkeypatch):
    """The first runs' option: the forward pass uses the expected bin, so a_s changes nothing but log a_g(a_s)."""
    policy = _policy(estimator="relaxed")
    x = torch.randn(3, 5, 6)
    out = policy(x, generator=torch.Generator().manual_seed(4))
    _shift_bins(policy, monkeypatch)
    moved = policy(x, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(moved.bins, out.bins) and not torch.equal(moved.log_prob_discrete, out.log_prob_discrete)
    assert torch.equal(moved.head_attention, out.head_attention)


def _forced_bin(bin_map: str, b: int) -> torch.Tensor:
    """Deterministic attention of a policy whose logits put all mass on bin ``b`` of 10."""
    policy = _policy(bin_map=bin_map)
    with torch.no_grad():
        policy.w_mu.weight.zero_()
        policy.w_mu.bias.fill_(0.0)
        policy.w_mu.bias.view(2, 10)[:, b] = 30.0
    return policy(torch.randn(2, 4, 6), deterministic=True).head_attention


def test_bins_span_the_unit_interval():
    low, high = _forced_bin("logit", 0), _forced_bin("logit", 9)
    assert torch.allclose(low, torch.full_like(low, 0.05)) and torch.allclose(high, torch.full_like(high, 0.95))
    assert (high / low).min() > 18  # the weights of two regions can differ 19-fold
    # eq. 3 as printed: mu = logistic(a_s / n) in [0.5, 0.71], Att = sigmoid(mu) within [0.62, 0.68]
    low, high = _forced_bin("logistic", 0), _forced_bin("logistic", 9)
    assert low.min() >= 0.62 and high.max() <= 0.68 and (high / low).max() < 1.08
    assert mean_uniform_attention(100, "logit") == pytest.approx(0.5)
    assert mean_uniform_attention(100, "logistic") == pytest.approx(0.65, abs=0.01)


@pytest.mark.parametrize("init_std, small", [(0.15, True), (None, False)])
def test_small_init_std_keeps_training_attention_near_evaluation(init_std, small):
    """With the discrete stage settled on a bin, training's Att = sigmoid(mu + sigma eps) differs from evaluation's
    sigmoid(mu) by about sigma / 4 * 0.75: ~0.02 at the default sigma 0.15, ~0.1 at PyTorch's default sigma ~0.7."""
    torch.manual_seed(0)
    policy = DiscreteContinuousPolicy(6, 8, num_bins=10, heads=2, init_std=init_std)
    with torch.no_grad():
        policy.w_mu.bias.view(2, 10)[:, 7] = 30.0  # the discrete stage picks bin 7 (Att 0.75 at z = mu)
    x = torch.randn(64, 5, 6)
    train = policy(x, generator=torch.Generator().manual_seed(1)).head_attention
    evaluation = policy(x, deterministic=True).head_attention
    assert torch.allclose(evaluation, torch.full_like(evaluation, 0.75))
    gap = (train - evaluation).abs().mean().item()
    assert gap < 0.03 if small else gap > 0.07


# ---------------------------------------------------------------- a two-armed bandit: expected gradients


def _bandit_reward(att: torch.Tensor) -> torch.Tensor:
    """Smooth, in (0, 2), best near Att = 0.78: bin 1 of 2 (Att 0.75) beats bin 0 (0.25), and sigma matters."""
    return 1.0 + att - 3.0 * (att - 0.7).square()


def _bandit_policy(**kw) -> DiscreteContinuousPolicy:
    """num_bins 2, one head; a constant input, so every sample is a draw of the same state's action."""
    torch.manual_seed(0)
    policy = DiscreteContinuousPolicy(1, 2, num_bins=2, heads=1, init_std=1.0, **kw)
    with torch.no_grad():
        policy.w_mu.bias.copy_(torch.tensor([0.3, -0.2]))  # the worse bin 0 is the likelier at first
        policy.w_mean.bias.fill_(0.4)
    return policy


def _analytic_gradients(policy: DiscreteContinuousPolicy) -> dict[str, torch.Tensor]:
    """d E[R] / d(logits, sigma pre-activation, mean) by quadrature in float64 (the logits and the
    pre-activations equal the biases of W_mu, W_std, W_mean up to a constant, so these are the biases' gradients).

    The bin's law: P(a_s = 1) = E_g[a_g(1)] = E_L[sigmoid((a_1 - a_0 + L) / tau)], L = g_1 - g_0 ~ Logistic(0, 1);
    given the bin, z ~ N(mu, sigma)."""
    f64 = torch.float64
    with torch.no_grad():
        h = policy.gru(torch.zeros(1, 1, 1))[0][0, 0]
    logits = policy.w_mu(h).detach().to(f64).requires_grad_()
    pre_std = policy.w_std(h).detach().to(f64)[0].requires_grad_()
    mean = policy.w_mean(h).detach().to(f64)[0].requires_grad_()
    ell = torch.linspace(-30, 30, 6001, dtype=f64)
    p1 = (torch.sigmoid((logits[1] - logits[0] + ell) / policy.tau) * torch.sigmoid(ell) * torch.sigmoid(-ell)).sum()
    p1 = p1 * (ell[1] - ell[0])
    sigma = torch.nn.functional.softplus(pre_std) + policy.min_std
    eps = torch.linspace(-10, 10, 8001, dtype=f64)
    normal = torch.exp(-0.5 * eps.square()) / math.sqrt(2 * math.pi) * (eps[1] - eps[0])

    def over_z(mu: torch.Tensor) -> torch.Tensor:  # E_z[R(sigmoid(z))], z ~ N(mu, sigma), for each mu
        return (_bandit_reward(torch.sigmoid(mu[..., None] + sigma * eps)) * normal).sum(-1)

    mu = bin_mean(torch.arange(2, dtype=f64), 2, policy.bin_map)
    if policy.mode == "continuous":
        expected = over_z(mean)
    elif policy.mode == "discrete":
        expected = (torch.stack((1 - p1, p1)) * _bandit_reward(torch.sigmoid(mu))).sum()
    else:
        expected = (torch.stack((1 - p1, p1)) * over_z(mu)).sum()
    grads = torch.autograd.grad(expected, (logits, pre_std, mean), allow_unused=True)
    return {k: torch.zeros(()) if g is None else g.float() for k, g in zip(("mu", "std", "mean"), grads, strict=True)}


def _mc_gradients(
    policy: DiscreteContinuousPolicy,
    baseline: bool | str = False,
    offset: float = 0.0,
    chunks: int = 20,
    size: int = 5000,
):
    """Each chunk: -d(loss) / d(biases) of ``size`` samples, per term, with the reward plus ``offset`` (which does
    not change the expected gradient). Returns {(term, bias): (chunks, ...)}."""
    g = torch.Generator().manual_seed(1)
    biases = {"mu": policy.w_mu.bias, "std": policy.w_std.bias, "mean": policy.w_mean.bias}
    rows: dict[tuple[str, str], list[torch.Tensor]] = {}
    for _ in range(chunks):
        out = policy(torch.zeros(size, 1, 1), generator=g)
        reward = _bandit_reward(out.head_attention[:, 0, 0]) + offset
        if baseline == "greedy":  # self-critical: the reward of the mean actions (does not depend on the sample)
            mode = policy(torch.zeros(size, 1, 1), deterministic=True).head_attention[:, 0, 0]
            b = _bandit_reward(mode) + offset
        else:
            b = leave_one_out_baseline(reward) if baseline else None
        losses = dict(zip(("d", "c"), dcpg_losses(out, reward, b), strict=True))
        for term, loss in losses.items():
            if not loss.requires_grad:  # mode discrete: no continuous term
                continue
            grads = torch.autograd.grad(loss, list(biases.values()), retain_graph=True, allow_unused=True)
            for name, grad in zip(biases, grads, strict=True):
                rows.setdefault((term, name), []).append(torch.zeros(()) if grad is None else -grad.squeeze())
    return {k: torch.stack(v) for k, v in rows.items()}


def _agree(samples: torch.Tensor, analytic: torch.Tensor) -> None:
    """The chunk mean matches ``analytic`` within 5 standard errors (of a 20-chunk estimate), and ``analytic`` is
    clearly non-zero (8 standard errors)."""
    mean, se = samples.mean(0), samples.std(0) / math.sqrt(len(samples))
    assert ((mean - analytic).abs() <= 5 * se + 1e-4).all(), (mean, analytic, se)
    assert (analytic.abs() > 8 * se).all(), (analytic, se)


@pytest.mark.parametrize("mu_grad", ["none", "relaxed"])
def test_bandit_expected_policy_gradients_equal_the_analytic_ones(mu_grad):
    """straight_through: the discrete term's expected gradient is d E[R] / d logits, the continuous term's is
    d E[R] / d sigma. With mu_grad none nothing else reaches W_mu (the sum is unbiased); with the paper's
    relaxed mu, the continuous term adds the straight-through Gumbel gradient to W_mu (a biased extra)."""
    policy = _bandit_policy(mu_grad=mu_grad)
    analytic = _analytic_gradients(policy)
    mc = _mc_gradients(policy)
    assert analytic["mu"][1] > 0  # bin 1 is the better arm
    _agree(mc["d", "mu"], analytic["mu"])
    _agree(mc["c", "std"], analytic["std"])
    assert (mc["d", "std"] == 0).all()  # sigma is not a parameter of the discrete law
    extra = mc["c", "mu"].mean(0)
    assert (extra == 0).all() if mu_grad == "none" else extra.abs().min() > 0.05


def test_bandit_discrete_and_continuous_ablations_equal_the_analytic_ones():
    discrete = _bandit_policy(mode="discrete")
    _agree(_mc_gradients(discrete)["d", "mu"], _analytic_gradients(discrete)["mu"])
    continuous = _bandit_policy(mode="continuous")
    analytic, mc = _analytic_gradients(continuous), _mc_gradients(continuous)
    _agree(mc["c", "mean"], analytic["mean"])
    _agree(mc["c", "std"], analytic["std"])


def test_bandit_relaxed_discrete_term_is_zero_mean_noise():
    """estimator relaxed: the reward does not depend on a_s, so E[R grad log a_g(a_s)] = 0 although the
    discrete law has a non-zero gradient (the straight-through policy's, same weights, is ~0.15)."""
    samples = _mc_gradients(_bandit_policy(estimator="relaxed"))["d", "mu"]
    mean, se = samples.mean(0), samples.std(0) / math.sqrt(len(samples))
    assert (mean.abs() <= 4 * se).all() and (se < 0.01).all()
    assert _analytic_gradients(_bandit_policy())["mu"].abs().min() > 0.1


@pytest.mark.parametrize("baseline", [True, "greedy"])
def test_bandit_baselines_lower_variance_without_moving_the_mean(baseline):
    """Rewards in (2, 4): without a baseline the offset only adds variance; the leave-one-out baseline (eq. 10,
    beta 1) and the self-critical one (the reward of the mean actions) remove most of it, and every estimate stays
    on the analytic gradient."""
    policy = _bandit_policy(mu_grad="none")
    analytic = _analytic_gradients(policy)
    plain, based = _mc_gradients(policy, offset=2.0), _mc_gradients(policy, baseline=baseline, offset=2.0)
    for key in (("d", "mu"), ("c", "std")):
        a, b = plain[key], based[key]
        assert (b.std(0) < 0.5 * a.std(0)).all(), (key, b.std(0), a.std(0))
        _agree(b, analytic[key[1]])
        assert ((a.mean(0) - analytic[key[1]]).abs() <= 5 * a.std(0) / math.sqrt(len(a))).all()


def test_bandit_gradient_steps_move_probability_to_the_better_bin():
    policy = _bandit_policy(mu_grad="none")
    opt = torch.optim.SGD(policy.parameters(), lr=1.5)
    g = torch.Generator().manual_seed(2)

    def p_better() -> float:
        return policy(torch.zeros(1, 1, 1), deterministic=True).log_prob_discrete.exp().item()

    assert policy(torch.zeros(1, 1, 1), deterministic=True).bins.item() == 0  # the worse bin is the mode at first
    before = 1 - p_better()
    for _ in range(10):
        out = policy(torch.zeros(1000, 1, 1), generator=g)
        reward = _bandit_reward(out.head_attention[:, 0, 0])
        loss_d, loss_c = dcpg_losses(out, reward, leave_one_out_baseline(reward))
        opt.zero_grad()
        (loss_d + loss_c).backward()
        opt.step()
    final = policy(torch.zeros(1, 1, 1), deterministic=True)
    assert final.bins.item() == 1 and p_better() > 0.8 > 0.5 > before


# ---------------------------------------------------------------- the packed GRU (gru_sequence)


def _reference_packed_gru(gru: torch.nn.GRU, x: torch.Tensor, lengths: torch.Tensor):
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, h_n = gru(packed)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out, h_n[-1]


@pytest.mark.parametrize(
    "lengths", [[8, 3, 5, 1, 8, 2], [4, 3, 5, 1, 4, 2], [8] * 6, [1] * 6], ids=["mixed", "shorter", "full", "ones"]
)
def test_gru_sequence_equals_nn_gru_on_packed_sequences(lengths):
    torch.manual_seed(0)
    gru = torch.nn.GRU(5, 7, batch_first=True).double()
    x = torch.randn(6, 8, 5, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor(lengths)
    weights = (torch.randn(6, 8, 7, dtype=torch.float64), torch.randn(6, 7, dtype=torch.float64))
    results = []
    for run in (_reference_packed_gru, gru_sequence):
        out, h_n = run(gru, x, lengths)
        loss = (out * weights[0]).sum() + (h_n * weights[1]).sum()
        results.append((out, h_n, torch.autograd.grad(loss, [x, *gru.parameters()])))
    (out_a, h_a, grads_a), (out_b, h_b, grads_b) = results
    assert torch.allclose(out_a, out_b, atol=1e-12) and torch.allclose(h_a, h_b, atol=1e-12)
    assert (out_b[torch.arange(8)[None] >= lengths[:, None]] == 0).all()  # after a row's end: 0, as packed
    for a, b in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(a, b, atol=1e-12)
    out, h_n = gru_sequence(gru, x)  # without lengths: gru(x) itself
    assert torch.equal(out, gru(x)[0]) and torch.equal(h_n, gru(x)[1][-1])


def test_masked_policy_equals_the_gru_run_over_the_padding_too():
    """The policy's GRU stops at each row's last real element; the real elements get what the GRU over every
    position (padding included, as first written) gives them: the same attention, log-probabilities and bins,
    from the same random numbers."""
    policy = _policy()
    x = torch.randn(4, 7, 6)
    mask = torch.arange(7)[None] < torch.tensor([7, 3, 5, 1])[:, None]
    padded = _policy()
    padded.gru_states = lambda x, mask: padded.gru(x)[0]
    for deterministic in (False, True):
        a = policy(x, mask, deterministic=deterministic, generator=torch.Generator().manual_seed(5))
        b = padded(x, mask, deterministic=deterministic, generator=torch.Generator().manual_seed(5))
        for name in ("attention", "head_attention", "log_prob_discrete", "log_prob_continuous"):
            assert torch.allclose(getattr(a, name), getattr(b, name), atol=1e-6), name
        assert torch.equal(a.bins[mask], b.bins[mask])
        assert torch.allclose(a.mu[mask], b.mu[mask], atol=1e-5) and torch.allclose(a.z[mask], b.z[mask], atol=1e-5)
