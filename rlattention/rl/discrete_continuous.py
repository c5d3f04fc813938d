"""The discrete-continuous action-space policy of DCPG (Ji et al., "Discrete-continuous Action Space Policy
Gradient-based Attention for Image-Text Matching", CVPR 2021), eqs. 2-5.

For every element t of a sequence (image regions or words) a GRU reads the features, h^t = GRU(x^t, h^{t-1}),
and each of ``heads`` heads acts in two stages:

1. discrete: logits a^t = W_mu h^t over n bins; a_g = Gumbel-softmax(a^t) (relaxed, temperature tau); a bin
   a_s ~ Categorical(a_g) with log-probability log a_g(a_s) (eq. 2);
2. continuous: mu^t = logistic(a_s / n), made differentiable through the relaxation (``estimator``:
   ``relaxed``: the relaxed bin sum_k a_g[k] k replaces a_s in the forward pass too; ``straight_through``: the
   forward pass uses the sampled a_s, the backward pass the gradient of the relaxed bin); sigma^t =
   softplus(W_std h^t) + min_std > 0; a sample z ~ N(mu^t, sigma^t); Att^t = sigmoid(z) (eq. 4); the
   log-probability is that of exactly this z under N(mu^t, sigma^t) (eq. 5).

At evaluation (``deterministic``) there is no sampling: the bin is the mode of softmax(a^t) and z = mu^t.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.rl.policies import gaussian_log_prob


class DCPGOutput(NamedTuple):
    attention: Tensor  # (B, T) Att^t in (0, 1), the mean over heads (what is applied to the features)
    head_attention: Tensor  # (B, T, H)
    log_prob_discrete: Tensor  # (B, T, H) log a_g(a_s) of the bin actually sampled
    log_prob_continuous: Tensor  # (B, T, H) log N(z | mu, sigma) of the z actually used
    bins: Tensor  # (B, T, H) int64 the sampled bins a_s
    mu: Tensor  # (B, T, H)
    sigma: Tensor  # (B, T, H)
    z: Tensor  # (B, T, H) the continuous samples (detached)


class DiscreteContinuousPolicy(nn.Module):
    def __init__(
        self,
        in_features: int,
        hidden: int,
        num_bins: int = 100,
        heads: int = 2,
        tau: float = 1.0,
        estimator: str = "relaxed",
        min_std: float = 1e-3,
        mode: str = "discrete_continuous",
        init_std: float | None = None,
    ) -> None:
        super().__init__()
        if estimator not in ("relaxed", "straight_through"):
            raise ValueError(f"estimator must be 'relaxed' or 'straight_through', got {estimator!r}")
        if mode not in ("discrete_continuous", "discrete", "continuous"):
            raise ValueError(f"mode must be 'discrete_continuous', 'discrete' or 'continuous', got {mode!r}")
        if num_bins < 2 or heads < 1 or tau <= 0:
            raise ValueError(f"need num_bins >= 2, heads >= 1, tau > 0; got {num_bins}, {heads}, {tau}")
        self.num_bins, self.heads, self.tau, self.estimator, self.min_std = num_bins, heads, tau, estimator, min_std
        self.mode = mode
        self.gru = nn.GRU(in_features, hidden, batch_first=True)
        self.w_mu = nn.Linear(hidden, heads * num_bins)  # W_mu: discrete logits per head
        self.w_std = nn.Linear(hidden, heads)  # W_std
        self.w_mean = nn.Linear(hidden, heads)  # the mean of the single-Gaussian ablation (mode="continuous")
        if init_std is not None:  # start sigma near init_std: bias = softplus^-1(init_std - min_std)
            if init_std <= min_std:
                raise ValueError(f"init_std must be > min_std ({min_std}), got {init_std}")
            nn.init.zeros_(self.w_std.weight)
            nn.init.constant_(self.w_std.bias, math.log(math.expm1(init_std - min_std)))
        self.register_buffer("bin_values", torch.arange(num_bins, dtype=torch.float32), persistent=False)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> DCPGOutput:
        """x: ``(B, T, F)``; mask: ``(B, T)`` bool, True for real elements (padding gets attention 0 and no
        log-probability)."""
        B, T, _ = x.shape
        H, n = self.heads, self.num_bins
        h, _ = self.gru(x)  # h^t = GRU(x^t, h^{t-1})
        logits = self.w_mu(h).view(B, T, H, n)  # a^t
        values = self.bin_values.to(logits.dtype)
        if deterministic:
            probs = logits.softmax(-1)
            bins = probs.argmax(-1)
            relaxed_bin = (probs * values).sum(-1) if self.estimator == "relaxed" else bins.to(logits.dtype)
            log_pd = probs.gather(-1, bins.unsqueeze(-1)).squeeze(-1).clamp_min(1e-20).log()
        else:
            u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
            gumbel = -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))
            a_g = ((logits + gumbel) / self.tau).softmax(-1)  # Gumbel-softmax
            bins = torch.multinomial(a_g.detach().reshape(-1, n).float(), 1, generator=generator).view(B, T, H)
            log_pd = a_g.gather(-1, bins.unsqueeze(-1)).squeeze(-1).clamp_min(1e-20).log()  # log a_g(a_s)
            soft = (a_g * values).sum(-1)  # relaxed bin, differentiable in W_mu
            if self.estimator == "relaxed":
                relaxed_bin = soft
            else:  # straight-through: forward a_s, backward d(soft)
                relaxed_bin = bins.to(soft.dtype) + soft - soft.detach()
        mu = torch.sigmoid(relaxed_bin / n)  # mu^t = logistic(a_s / n)
        if self.mode == "continuous":  # single-Gaussian ablation: mu from a linear head, no discrete stage
            mu = torch.sigmoid(self.w_mean(h))
        sigma = F.softplus(self.w_std(h)) + self.min_std
        if self.mode == "discrete":  # discrete-PG ablation: the discrete action itself is the attention
            att = mu.detach()
            z_used = torch.logit(att.clamp(1e-6, 1 - 1e-6))
            log_pc = torch.zeros_like(mu)
        else:
            if deterministic:
                z_used = mu
            else:
                eps = torch.randn(mu.shape, generator=generator, device=mu.device, dtype=mu.dtype)
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


__all__ = ["DCPGOutput", "DiscreteContinuousPolicy", "dcpg_losses", "in_batch_retrieval_reward"]
