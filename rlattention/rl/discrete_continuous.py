"""The discrete-continuous action-space policy of DCPG (Yan, Yu and Xie, "Discrete-continuous Action Space Policy
Gradient-based Attention for Image-Text Matching", CVPR 2021), eqs. 2-5.

For every element t of a sequence (image regions or words) a GRU reads the features, h^t = GRU(x^t, h^{t-1}),
and each of ``heads`` heads acts in two stages:

1. discrete: logits a^t = W_mu h^t over n bins; a_g = Gumbel-softmax(a^t) (relaxed, temperature tau); a bin
   a_s ~ Categorical(a_g) with log-probability log a_g(a_s) (eq. 2);
2. continuous: mu^t = the mean of bin a_s (``bin_map``); sigma^t = softplus(W_std h^t) + min_std > 0; a sample
   z ~ N(mu^t, sigma^t); Att^t = sigmoid(z) (eq. 4); the log-probability is that of exactly this z under
   N(mu^t, sigma^t) (eq. 5).

``bin_map`` (how a bin becomes mu):

* ``logit`` (default): mu = logit((a_s + 1/2) / n), so that sigmoid(mu) = (a_s + 1/2) / n is the centre of
  bin a_s of n equal bins of (0, 1): the attention can take any weight in (0, 1);
* ``logistic``: eq. 3 as printed, mu = logistic(a_s / n) in [0.5, 0.73], so Att = sigmoid(z) at z = mu lies in
  [0.62, 0.68] (the largest ratio between two weights is 1.08: the attention cannot attend).

``estimator`` (what the forward pass uses, and how mu stays differentiable):

* ``straight_through`` (default; the paper's a_s): the forward pass uses the *sampled* bin a_s, so the reward
  depends on a_s and the discrete term log a_g(a_s) * R is a score-function gradient of the expected reward
  (unbiased: the Gumbel noise does not depend on the parameters, and a_s ~ Categorical(a_g) given it). With
  ``mu_grad="relaxed"`` the continuous term also reaches W_mu through mu, by the straight-through Gumbel
  gradient (forward a_s, backward the gradient of the relaxed bin sum_k a_g[k] k: the paper's "Gumbel-softmax
  makes mu trainable"; a biased extra: for a fixed a_s, mu does not depend on W_mu); ``mu_grad="none"`` leaves
  W_mu to the discrete term, so that both terms together are an unbiased gradient of the expected reward.
* ``relaxed``: the forward pass uses the relaxed bin sum_k a_g[k] k and never a_s; the continuous term is then
  an unbiased gradient of the relaxed model's expected reward, and the discrete term is zero-mean noise (the
  reward does not depend on a_s). Kept to reproduce the first runs.

Modes (ablations of Table 4): ``discrete_continuous`` (DCPG); ``discrete`` (the bin itself is the attention:
z = mu, no continuous stage); ``continuous`` (one Gaussian per head whose mean comes from a linear head,
mu = W_mean h with ``bin_map="logit"``, logistic(W_mean h) with ``"logistic"``; no discrete stage).

At evaluation (``deterministic``) there is no sampling: the bin is the mode of softmax(a^t) (its expectation
with ``estimator="relaxed"``) and z = mu.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.rl.policies import gaussian_log_prob

ESTIMATORS: tuple[str, ...] = ("straight_through", "relaxed")
BIN_MAPS: tuple[str, ...] = ("logit", "logistic")
MU_GRADS: tuple[str, ...] = ("relaxed", "none")
MODES: tuple[str, ...] = ("discrete_continuous", "discrete", "continuous")


def bin_mean(bins: Tensor, num_bins: int, bin_map: str = "logit") -> Tensor:
    """mu of (possibly relaxed) bin values in [0, n - 1] (eq. 3; see ``bin_map`` in the module docstring)."""
    if bin_map == "logit":
        return torch.logit((bins + 0.5) / num_bins)  # sigmoid(mu) = (a_s + 1/2) / n
    if bin_map == "logistic":
        return torch.sigmoid(bins / num_bins)  # mu = logistic(a_s / n), eq. 3 as printed
    raise ValueError(f"bin_map must be one of {', '.join(BIN_MAPS)}, got {bin_map!r}")


def bin_attention(bins: Tensor, num_bins: int, bin_map: str = "logit") -> Tensor:
    """The attention of bins at z = mu, as the ``discrete`` mode applies it: (a_s + 1/2) / n for ``logit``;
    logistic(a_s / n) itself for ``logistic`` (the discrete ablation of the first runs used mu as the weight)."""
    mu = bin_mean(bins, num_bins, bin_map)
    return torch.sigmoid(mu) if bin_map == "logit" else mu


def mean_uniform_attention(num_bins: int, bin_map: str = "logit", mode: str = "discrete_continuous") -> float:
    """E[Att] at z = mu for a uniform distribution over the n bins: 0.5 with ``logit``; with ``logistic`` about
    0.650 (``discrete_continuous``: sigmoid(logistic(k / n))) or 0.62 (``discrete``: logistic(k / n)). The
    scale that the no-policy rows of the ablation give their features (``DCPGConfig.fixed_attention``)."""
    k = torch.arange(num_bins, dtype=torch.float64)
    if mode == "discrete":
        return float(bin_attention(k, num_bins, bin_map).mean())
    return float(torch.sigmoid(bin_mean(k, num_bins, bin_map)).mean())


class _PackedGRU(torch.autograd.Function):
    """One GRU layer over packed sequences from the zero state, with the backward pass written out (see
    :func:`gru_sequence`). ``x``: ``(S, F)`` the data of a ``PackedSequence`` (time-major, rows sorted by
    decreasing length), ``batch_sizes``: its rows per step. Returns the packed outputs ``(S, H)``.

    Forward, per step t on its n_t rows: gh = W_hh h + b_hh; r, z = sigmoid(gi_rz + gh_rz);
    n = tanh(gi_n + r gh_n); h' = n + z (h - n), where gi = W_ih x + b_ih of all steps is one matrix product
    and h is the output of the step before (the sequence of a row keeps its position while it runs). Backward:
    the recurrence run back with one matrix product per step, the factors that do not depend on it computed
    for all steps at once; the gradients of x, of the weights and of the biases are one product (or sum) each."""

    @staticmethod
    def forward(ctx, x, weight_ih, weight_hh, bias_ih, bias_hh, batch_sizes):  # noqa: ANN001, ANN205
        S, H = len(x), weight_hh.shape[1]
        gi = torch.addmm(bias_ih, x, weight_ih.t())  # (S, 3H)
        gh, rz = x.new_empty(S, 3 * H), x.new_empty(S, 2 * H)
        n, outputs = x.new_empty(S, H), x.new_empty(S, H)
        w_hh_t = weight_hh.t()
        start, h = 0, x.new_zeros(batch_sizes[0], H)
        for size in batch_sizes:
            rows = slice(start, start + size)
            h = h[:size]
            torch.addmm(bias_hh, h, w_hh_t, out=gh[rows])
            torch.add(gi[rows, : 2 * H], gh[rows, : 2 * H], out=rz[rows]).sigmoid_()
            torch.addcmul(gi[rows, 2 * H :], rz[rows, :H], gh[rows, 2 * H :], out=n[rows]).tanh_()
            h = torch.addcmul(n[rows], rz[rows, H:], h - n[rows], out=outputs[rows])
            start += size
        ctx.save_for_backward(x, weight_ih, weight_hh, outputs, gh, rz, n)
        ctx.batch_sizes = batch_sizes
        return outputs

    @staticmethod
    def backward(ctx, d_outputs):  # noqa: ANN001, ANN205
        x, weight_ih, weight_hh, outputs, gh, rz, n = ctx.saved_tensors
        sizes = ctx.batch_sizes
        S, H = len(x), weight_hh.shape[1]
        r, z = rz[:, :H], rz[:, H:]
        h_prev = torch.cat([outputs.new_zeros(sizes[0], H)] + [outputs[a : a + m] for a, m in _previous_rows(sizes)])
        # d h' -> d n (through tanh), d z (pre-sigmoid) and d r (pre-sigmoid, via d n), for all steps at once
        to_n = (1 - z) * (1 - n * n)
        to_z = (h_prev - n) * z * (1 - z)
        to_r = gh[:, 2 * H :] * r * (1 - r)
        d_gh = x.new_empty(S, 3 * H)  # d(W_hh h + b_hh); its r, z parts are also those of d(W_ih x + b_ih)
        d_n = x.new_empty(S, H)  # the n part of d(W_ih x + b_ih)
        dh = x.new_zeros(sizes[0], H)
        end = S
        for size in reversed(sizes):
            rows = slice(end - size, end)
            d_new = dh[:size] + d_outputs[rows]
            torch.mul(d_new, to_n[rows], out=d_n[rows])
            torch.mul(d_n[rows], to_r[rows], out=d_gh[rows, :H])
            torch.mul(d_new, to_z[rows], out=d_gh[rows, H : 2 * H])
            torch.mul(d_n[rows], r[rows], out=d_gh[rows, 2 * H :])
            torch.addmm(d_new * z[rows], d_gh[rows], weight_hh, out=dh[:size])
            end -= size
        need = ctx.needs_input_grad
        d_x = d_w_ih = d_w_hh = d_b_ih = d_b_hh = None
        if need[0]:
            d_x = torch.addmm(d_n @ weight_ih[2 * H :], d_gh[:, : 2 * H], weight_ih[: 2 * H])
        if need[1]:
            d_w_ih = torch.cat((d_gh[:, : 2 * H].t() @ x, d_n.t() @ x))
        if need[2]:
            d_w_hh = d_gh.t() @ h_prev
        if need[3]:
            d_b_ih = torch.cat((d_gh[:, : 2 * H].sum(0), d_n.sum(0)))
        if need[4]:
            d_b_hh = d_gh.sum(0)
        return d_x, d_w_ih, d_w_hh, d_b_ih, d_b_hh, None


def _previous_rows(batch_sizes: list[int]) -> list[tuple[int, int]]:
    """For every step t >= 1 of packed data: (first row of step t - 1, n_t), the rows holding h^{t-1} of the
    n_t sequences of step t."""
    starts = [0]
    for size in batch_sizes[:-1]:
        starts.append(starts[-1] + size)
    return [(starts[t - 1], batch_sizes[t]) for t in range(1, len(batch_sizes))]


def gru_sequence(gru: nn.GRU, x: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``gru`` (one layer, unidirectional, ``batch_first``) over ``x`` ``(B, T, F)`` from the zero state:
    outputs ``(B, T, H)`` and the last state ``(B, H)``.

    ``lengths`` ``(B,)`` int in 1..T: row b is the sequence of its first ``lengths[b]`` elements, as with
    ``pack_padded_sequence``: its later outputs are 0 and its last state is the one after element
    ``lengths[b] - 1``. Without ``lengths`` this is ``gru(x)``. With them, on the CPU without autocast, the
    packed recurrence runs in :class:`_PackedGRU` (each step on the rows still running, the backward written
    out: about 1.3x faster than autograd through ``nn.GRU`` on the packed sequence, 1.6x than ``nn.GRU`` over
    the padded batch, for 128 captions of 5-23 words), equal to ``nn.GRU`` up to float rounding
    (tests/rl/test_discrete_continuous.py checks values and gradients); elsewhere and under ``torch.compile``
    ``nn.GRU`` runs the packed sequence (cuDNN on a GPU)."""
    if gru.num_layers != 1 or gru.bidirectional or not gru.batch_first or not gru.bias:
        raise ValueError("gru_sequence supports one-layer, unidirectional, batch_first GRUs with biases")
    if lengths is None:
        out, h_n = gru(x)
        return out, h_n[-1]
    T = x.shape[1]
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    if x.device.type != "cpu" or torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling():
        out, h_n = gru(packed)
        h_n = h_n[-1]
    else:
        params = (gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0)
        sizes = packed.batch_sizes.tolist()
        data = _PackedGRU.apply(packed.data, *params, sizes)
        out = packed._replace(data=data)
        # the last state of each sequence: its row at its last step (sorted order), then in the input order
        starts = torch.tensor([0, *sizes[:-1]]).cumsum(0)
        lengths_sorted = (packed.batch_sizes[None, :] > torch.arange(sizes[0])[:, None]).sum(1)
        last_rows = starts[lengths_sorted - 1] + torch.arange(sizes[0])
        h_n = data.index_select(0, last_rows.to(data.device)).index_select(0, packed.unsorted_indices)
    out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
    return out, h_n


class DCPGOutput(NamedTuple):
    attention: Tensor  # (B, T) Att^t in (0, 1), the mean over heads (what is applied to the features)
    head_attention: Tensor  # (B, T, H)
    log_prob_discrete: Tensor  # (B, T, H) log a_g(a_s) of the bin actually sampled
    log_prob_continuous: Tensor  # (B, T, H) log N(z | mu, sigma) of the z actually used
    bins: Tensor  # (B, T, H) int64 the sampled bins a_s
    mu: Tensor  # (B, T, H)
    sigma: Tensor  # (B, T, H)
    z: Tensor  # (B, T, H) the continuous samples (detached)


def centred_bin_logits(num_bins: int, att_std: float, bin_map: str = "logit") -> Tensor:
    """Logits ``(n,)`` of a discretised Gaussian over the bins: the bin whose attention (at z = mu) is a gets
    -(a - c)^2 / (2 att_std^2), c the attention of the middle of the range (0.5 with ``logit``). The discrete
    stage's starting prior with ``init_att_std``: the initial policy draws weights near the middle, not spread
    over the whole range."""
    if att_std <= 0:
        raise ValueError(f"init_att_std must be > 0, got {att_std}")
    att = bin_attention(torch.arange(num_bins, dtype=torch.float64), num_bins, bin_map)
    centre = float(bin_attention(torch.tensor((num_bins - 1) / 2, dtype=torch.float64), num_bins, bin_map))
    return (-0.5 * ((att - centre) / att_std) ** 2).float()


class DiscreteContinuousPolicy(nn.Module):
    """See the module docstring. ``init_std``: sigma starts at this value (W_std zero, its bias
    softplus^-1(init_std - min_std)), so that training and evaluation see similar attention; ``None``:
    PyTorch's default initialisation (sigma near softplus(0) = 0.69). ``init_att_std``: the discrete stage starts
    as a discretised Gaussian over the bins around the middle attention with this standard deviation in attention
    units (:func:`centred_bin_logits` as W_mu's bias, its weight scaled by 0.1); ``None``: PyTorch's default
    initialisation (nearly uniform over the bins, so the first weights drawn spread over the whole range)."""

    def __init__(
        self,
        in_features: int,
        hidden: int,
        num_bins: int = 100,
        heads: int = 2,
        tau: float = 1.0,
        estimator: str = "straight_through",
        min_std: float = 1e-3,
        mode: str = "discrete_continuous",
        init_std: float | None = 0.15,
        bin_map: str = "logit",
        mu_grad: str = "relaxed",
        init_att_std: float | None = None,
    ) -> None:
        super().__init__()
        for name, value, allowed in (
            ("estimator", estimator, ESTIMATORS),
            ("mode", mode, MODES),
            ("bin_map", bin_map, BIN_MAPS),
            ("mu_grad", mu_grad, MU_GRADS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        if num_bins < 2 or heads < 1 or tau <= 0:
            raise ValueError(f"need num_bins >= 2, heads >= 1, tau > 0; got {num_bins}, {heads}, {tau}")
        if estimator == "relaxed" and mu_grad == "none":
            raise ValueError(
                "mu_grad='none' needs estimator='straight_through': with 'relaxed' the forward pass ignores a_s, so "
                "W_mu would learn only from the discrete term, which is then zero-mean noise"
            )
        if init_std is not None and init_std <= min_std:
            raise ValueError(f"init_std must be > min_std ({min_std}), got {init_std}")
        self.num_bins, self.heads, self.tau, self.estimator, self.min_std = num_bins, heads, tau, estimator, min_std
        self.mode, self.bin_map, self.mu_grad = mode, bin_map, mu_grad
        self.gru = nn.GRU(in_features, hidden, batch_first=True)
        self.w_mu = nn.Linear(hidden, heads * num_bins)  # W_mu: discrete logits per head
        self.w_std = nn.Linear(hidden, heads)  # W_std
        self.w_mean = nn.Linear(hidden, heads)  # the mean of the single-Gaussian ablation (mode="continuous")
        if init_std is not None:  # start sigma at init_std: bias = softplus^-1(init_std - min_std)
            nn.init.zeros_(self.w_std.weight)
            nn.init.constant_(self.w_std.bias, math.log(math.expm1(init_std - min_std)))
        if init_att_std is not None:  # the discrete stage starts near the middle attention
            with torch.no_grad():
                self.w_mu.weight.mul_(0.1)
                self.w_mu.bias.copy_(centred_bin_logits(num_bins, init_att_std, bin_map).repeat(heads))
        self.register_buffer("bin_values", torch.arange(num_bins, dtype=torch.float32), persistent=False)

    def sample_bins(self, a_g: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """a_s ~ Categorical(a_g) (eq. 2): a_g ``(B, T, H, n)`` -> int64 ``(B, T, H)``. A method of its own so
        that a test can intervene on a_s."""
        n = a_g.shape[-1]
        return torch.multinomial(a_g.detach().reshape(-1, n).float(), 1, generator=generator).view(a_g.shape[:-1])

    @torch.compiler.disable  # run eagerly under torch.compile (nn.GRU breaks the graph there anyway)
    def gru_states(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """h^t ``(B, T, hidden)``; with a mask, each row up to its last real element (0 after it)."""
        if mask is None:
            return self.gru(x)[0]
        positions = torch.arange(1, x.shape[1] + 1, device=x.device)
        return gru_sequence(self.gru, x, (mask * positions).amax(1).clamp(min=1))[0]

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> DCPGOutput:
        """x: ``(B, T, F)``; mask: ``(B, T)`` bool, True for real elements (padding gets attention 0 and no
        log-probability). With a mask the GRU runs each row up to its last real element only (the packed
        sequence; the GRU is causal, so the real elements get the states of the full run, and the padding after
        them gets h = 0): the outputs of the padding (``bins``, ``mu``, ``sigma``, ``z``) are placeholders,
        drawn with the same random numbers as before so that the random stream does not depend on them."""
        B, T, _ = x.shape
        H, n = self.heads, self.num_bins
        h = self.gru_states(x, mask)  # h^t = GRU(x^t, h^{t-1})
        logits = self.w_mu(h).view(B, T, H, n)  # a^t
        values = self.bin_values.to(logits.dtype)
        if deterministic:
            probs = logits.softmax(-1)
            bins = probs.argmax(-1)
            bin_value = (probs * values).sum(-1) if self.estimator == "relaxed" else bins.to(logits.dtype)
            log_pd = probs.gather(-1, bins.unsqueeze(-1)).squeeze(-1).clamp_min(1e-20).log()
        else:
            u = torch.rand_like(logits, generator=generator)  # (like torch.rand: traceable with symbolic T)
            gumbel = -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))
            a_g = ((logits + gumbel) / self.tau).softmax(-1)  # Gumbel-softmax
            bins = self.sample_bins(a_g, generator)  # a_s ~ Multinomial(a_g)
            log_pd = a_g.gather(-1, bins.unsqueeze(-1)).squeeze(-1).clamp_min(1e-20).log()  # log a_g(a_s)
            soft = (a_g * values).sum(-1)  # relaxed bin, differentiable in W_mu
            if self.estimator == "relaxed":
                bin_value = soft
            elif self.mu_grad == "relaxed":  # straight-through: forward a_s exactly, backward d(soft)
                bin_value = bins.to(soft.dtype) + (soft - soft.detach())
            else:  # forward a_s, no gradient through mu
                bin_value = bins.to(soft.dtype)
        mu = bin_mean(bin_value, n, self.bin_map)  # eq. 3
        if self.mode == "continuous":  # single-Gaussian ablation: mu from a linear head, no discrete stage
            mu = self.w_mean(h) if self.bin_map == "logit" else torch.sigmoid(self.w_mean(h))
        sigma = F.softplus(self.w_std(h)) + self.min_std
        if self.mode == "discrete":  # discrete-PG ablation: the discrete action itself is the attention
            att = bin_attention(bin_value, n, self.bin_map).detach()
            z_used = torch.logit(att.clamp(1e-6, 1 - 1e-6))
            log_pc = torch.zeros_like(mu)
        else:
            if deterministic:
                z_used = mu
            else:
                eps = torch.randn_like(mu, generator=generator)
                z_used = (mu + sigma * eps).detach()  # the sample actually used
            log_pc = gaussian_log_prob(z_used.unsqueeze(-1), mu.unsqueeze(-1), sigma.unsqueeze(-1))  # eq. 5
            att = torch.sigmoid(z_used)  # Att^t = sigmoid(z)
        if mask is not None:
            m = mask.to(att.dtype).unsqueeze(-1)
            att, log_pd, log_pc = att * m, log_pd * m, log_pc * m
        return DCPGOutput(att.mean(-1), att, log_pd, log_pc, bins, mu, sigma, z_used.detach())


def dcpg_losses(out: DCPGOutput, reward: Tensor, baseline: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Discrete and continuous policy-gradient losses (eqs. 7-8): -(1/B) sum_b (sum_t,h log p) (R_b - b_b).

    reward, baseline: ``(B,)``; the advantage is detached. Returns ``(loss_discrete, loss_continuous)``.
    """
    adv = reward.detach() - (baseline.detach() if baseline is not None else 0.0)
    lp_d = out.log_prob_discrete.sum(dim=(1, 2))
    lp_c = out.log_prob_continuous.sum(dim=(1, 2))
    return -(lp_d * adv).mean(), -(lp_c * adv).mean()


def in_batch_retrieval_reward(sims: Tensor, relevant: Tensor, kind: str = "r1+ap") -> Tensor:
    """Per-query reward with the batch as gallery (eq. 9): R@1, AP or R@1 + AP.

    sims: ``(Q, G)`` similarities of each query to each gallery item; relevant: ``(Q, G)`` bool (e.g. same
    image id). Ties are broken against the query (a relevant item ranks below an irrelevant one with the same
    similarity). Queries without a relevant item get 0. Returns ``(Q,)`` float, detached.
    """
    if kind not in ("r1", "ap", "r1+ap"):
        raise ValueError(f"reward must be 'r1', 'ap' or 'r1+ap', got {kind!r}")
    sims = sims.detach().float()
    rel = relevant.to(torch.bool)
    # ranked order with ties against the query: stable sorts, first irrelevant before relevant, then by -sim
    order = torch.argsort(rel.float(), dim=1, stable=True)
    order = order.gather(1, torch.argsort(-sims.gather(1, order), dim=1, stable=True))
    rel_sorted = rel.gather(1, order).float()  # (Q, G) in ranked order
    hits = rel_sorted.cumsum(1)
    n_rel = rel_sorted.sum(1)
    positions = torch.arange(1, sims.shape[1] + 1, device=sims.device, dtype=torch.float32)
    ap = (rel_sorted * hits / positions).sum(1) / n_rel.clamp(min=1)
    r1 = rel_sorted[:, 0]
    out = {"r1": r1, "ap": ap, "r1+ap": r1 + ap}[kind]
    return torch.where(n_rel > 0, out, torch.zeros_like(out))


__all__ = [
    "BIN_MAPS",
    "ESTIMATORS",
    "MODES",
    "MU_GRADS",
    "DCPGOutput",
    "DiscreteContinuousPolicy",
    "bin_attention",
    "bin_mean",
    "centred_bin_logits",
    "dcpg_losses",
    "gru_sequence",
    "in_batch_retrieval_reward",
    "mean_uniform_attention",
]
