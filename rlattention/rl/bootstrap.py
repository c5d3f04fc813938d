"""Bootstrapped exploration (Osband et al., "Deep exploration via bootstrapped DQN", NIPS 2016) for policy
gradients and Q-learning: K heads share a trunk; one head acts for a whole episode; every experience carries a
mask omega in {0, 1}^K drawn fresh for it, and head k learns only from the experiences with omega_k = 1.
For a policy gradient, head k must moreover learn only from actions of its own (``update="acting"``) or from
importance-weighted actions of the other heads (``update="importance"``): see ``bootstrapped_reinforce_loss``.

Used by DARP's locator (a K-head Gaussian policy, the paper's "bootstrapped policy gradient") and by the
bootstrapped-DQN locator baseline (K Q-heads over a discretised action set).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from rlattention.rl.policies import PolicyOutput, gaussian_log_prob


def bootstrap_masks(
    shape: Sequence[int], num_heads: int, p: float, generator: torch.Generator | None = None, device=None
) -> Tensor:
    """omega ~ Bernoulli(p)^K, one independent draw per experience: float ``(*shape, num_heads)`` in {0, 1}.

    p = 1 gives every head every experience (no bootstrapping); p = 0.5 is the "double-or-nothing" bootstrap.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"bootstrap mask probability must be in (0, 1], got {p}")
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    u = torch.rand(*shape, num_heads, generator=generator, device=device)
    return (u < p).float()


def sample_heads(batch: int, num_heads: int, generator: torch.Generator | None = None, device=None) -> Tensor:
    """The head that acts for each episode: uniform over ``0..num_heads-1``, int64 ``(batch,)``."""
    return torch.randint(num_heads, (batch,), generator=generator, device=device)


class MultiHeadGaussianPolicy(nn.Module):
    """K Gaussian location policies pi_k(v | h) = N(tanh(W_k h + b_k), diag(sigma_x^2, sigma_y^2)).

    ``std`` is a plain attribute (a float or a ``(sigma_x, sigma_y)`` pair) so a schedule can shrink it during
    training. Samples are detached: the only path of the policy gradient is the log-probability.
    """

    def __init__(self, in_features: int, num_heads: int, action_dim: int = 2, std: float | Sequence[float] = 0.2):
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        self.num_heads, self.action_dim = num_heads, action_dim
        self.fc = nn.Linear(in_features, num_heads * action_dim)
        self.std = std

    @property
    def std(self) -> tuple[float, ...]:
        return self._std

    @std.setter
    def std(self, value: float | Sequence[float]) -> None:
        values = (float(value),) * self.action_dim if isinstance(value, (int, float)) else tuple(map(float, value))
        if len(values) != self.action_dim or min(values) <= 0:
            raise ValueError(f"policy std must be {self.action_dim} positive values (or one), got {value}")
        self._std = values

    @torch.no_grad()
    def spread_(self, radius: float = 0.5, weight_scale: float = 0.1) -> MultiHeadGaussianPolicy:
        """Start head k at its own point of a circle of ``radius`` around the centre (angle 2 pi k / K; a 2-d
        action only), with the input weights scaled by ``weight_scale`` so the state moves each mean only a
        little at first. With the default initialisation every head starts near the centre (tanh of a small
        output), so when the rewards are sparse all K heads look at the same place and the bootstrap has no
        diversity to exploit."""
        if self.action_dim != 2:
            raise ValueError(f"spread_ places 2-d locations, this policy has action_dim {self.action_dim}")
        if not 0.0 <= radius < 1.0:
            raise ValueError(f"spread radius must be in [0, 1) (tanh range), got {radius}")
        angle = torch.arange(self.num_heads, dtype=torch.float64) * (2 * math.pi / self.num_heads)
        points = radius * torch.stack((angle.cos(), angle.sin()), -1)  # (K, 2), x then y
        self.fc.bias.copy_(torch.atanh(points).flatten().to(self.fc.bias.dtype))
        self.fc.weight.mul_(weight_scale)
        return self

    def std_tensor(self, like: Tensor) -> Tensor:
        return torch.tensor(self._std, dtype=like.dtype, device=like.device)

    def means(self, h: Tensor) -> Tensor:
        """h ``(..., F)`` -> the K heads' mean actions ``(..., K, D)``."""
        return torch.tanh(self.fc(h)).unflatten(-1, (self.num_heads, self.action_dim))

    def forward(
        self,
        h: Tensor,
        head: Tensor | None,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> PolicyOutput:
        """Act with head ``head[b]`` of each episode (``(B,)`` int64), or with the mean of the K heads' means
        (``head=None``, an ensemble used at evaluation). Returns the action, its log-probability under the
        acting head (for the ensemble: under the averaged mean) and the mean action."""
        mu_all = self.means(h)  # (B, K, D)
        if head is None:
            mu = mu_all.mean(-2)
        else:
            mu = mu_all.gather(-2, head.view(-1, 1, 1).expand(-1, 1, self.action_dim)).squeeze(-2)
        std = self.std_tensor(mu)
        if deterministic:
            action = mu.detach()
        else:
            eps = torch.randn(mu.shape, generator=generator, device=mu.device, dtype=mu.dtype)
            action = (mu + std * eps).detach()
        return PolicyOutput(action, gaussian_log_prob(action, mu, std), mu)

    def log_prob_all(self, action: Tensor, h: Tensor) -> Tensor:
        """log pi_k(action | h) for every head: action ``(..., D)``, h ``(..., F)`` -> ``(..., K)``."""
        mu_all = self.means(h)
        return gaussian_log_prob(action.detach().unsqueeze(-2), mu_all, self.std_tensor(mu_all))


BOOTSTRAP_UPDATES = ("acting", "importance", "all")


def importance_weights(log_pi_heads: Tensor, acting_head: Tensor, clip: float = 1.0) -> Tensor:
    """Per-episode truncated importance ratios min(clip, prod_t pi_k(v_t | h_t) / pi_a(v_t | h_t)), detached.

    log_pi_heads: ``(B, T, K)`` log-probabilities of episode b's actions under every head, all T steps of the
    episode; acting_head: ``(B,)`` int64, the head a_b that sampled them. Returns ``(B, K)`` in ``[0, clip]``; the
    acting head's own ratio is exactly 1. Computed in log space (no overflow for long episodes).
    """
    if not (clip >= 1.0 and math.isfinite(clip)):
        raise ValueError(f"importance clip must be finite and >= 1 (the acting head's own ratio is 1), got {clip}")
    lp = log_pi_heads.detach()
    lp_act = lp.gather(-1, acting_head.view(-1, 1, 1).expand(-1, lp.shape[1], 1))  # (B, T, 1)
    log_rho = (lp - lp_act).sum(1)  # (B, K): log prod_t pi_k / pi_a over the whole episode
    return log_rho.clamp(max=math.log(clip)).exp()


def bootstrapped_reinforce_loss(
    log_pi_heads: Tensor,
    returns: Tensor,
    masks: Tensor,
    baseline: Tensor | None = None,
    acting_head: Tensor | None = None,
    update: str | None = None,
    clip: float = 1.0,
) -> Tensor:
    """L = -(1/B) sum_b sum_t sum_k w_btk (G_bt - b_bt) log pi_k(v_bt | h_bt)  (DARP eq. 8, one term per head).

    log_pi_heads: ``(B, T, K)`` log-probabilities of the actions actually taken (by the acting head), under every
    head, for all T steps of each episode; returns, baseline: ``(B, T)``; masks: ``(B, T, K)`` bootstrap masks
    omega (Osband et al. 2016: head k learns only from experiences with omega_k = 1); acting_head: ``(B,)`` int64,
    the head that sampled episode b (``sample_heads``). Advantage, masks and weights are detached.

    ``update`` chooses the weight w_btk:

    - ``"acting"`` (the default when ``acting_head`` is given): w = omega_btk 1[k = a_b]. Head k learns only from
      the episodes it acted in, so its term is the on-policy REINFORCE estimate of grad_k E_{pi_k}[G]; in
      expectation over the uniform head choice and the masks the update is (p / K) grad_k J_k.
    - ``"importance"``: w = omega_btk min(clip, rho_bk), rho_bk = prod_{t=1..T} pi_k(v_bt|h_bt) / pi_a(v_bt|h_bt)
      (``importance_weights``). The ratio is per episode, not per step: G_bt depends on the later actions
      v_{t+1..T} (and h_t on the earlier ones), so only the whole-trajectory ratio turns an expectation under
      pi_a into one under pi_k for every (t, G_t); a per-step ratio would leave the rest of the trajectory
      distributed as under the acting head (the behaviour head's Q in place of head k's). With clip -> inf the
      update is unbiased, (p) grad_k J_k in expectation (every episode feeds every head), but the variance of
      rho grows exponentially with T and with the heads' distance; a finite clip (truncated IS, as IMPALA's
      rho-bar / Retrace's c-bar) bounds each off-policy term by clip times an on-policy one at the price of a
      bias that under-weights experiences far more likely under head k than under the actor. clip = 1 (the
      default) never lets another head's episode count more than an own one. Over long episodes with distinct
      heads rho is ~0 or clipped, so this is close to ``"acting"`` plus a few clipped terms.
    - ``"all"``: w = omega_btk, every head learns from every head's actions with no correction. This is the old
      behaviour, kept as an option only: it is BIASED for k != a_b (the actions come from pi_a, not pi_k), can
      point the wrong way, and pulls all heads onto the rewarded actions of any head (they collapse).

    ``update=None`` resolves to ``"acting"`` when ``acting_head`` is given and, for backwards compatibility, to
    ``"all"`` (with a ``FutureWarning``) when it is not; ``"acting"``/``"importance"`` require ``acting_head``.
    """
    if update is None:
        if acting_head is None:
            warnings.warn(
                "bootstrapped_reinforce_loss without acting_head uses the biased 'all' update; pass "
                "acting_head=<(B,) head that sampled each episode> for the unbiased 'acting' update",
                FutureWarning,
                stacklevel=2,
            )
        update = "acting" if acting_head is not None else "all"
    if update not in BOOTSTRAP_UPDATES:
        raise ValueError(f"bootstrap update must be one of {BOOTSTRAP_UPDATES}, got {update!r}")
    if log_pi_heads.shape != masks.shape:
        raise ValueError(f"log_pi_heads {tuple(log_pi_heads.shape)} and masks {tuple(masks.shape)} must match")
    if update != "all":
        if acting_head is None:
            raise ValueError(f"update={update!r} needs acting_head, the (B,) head that sampled each episode")
        if acting_head.shape != log_pi_heads.shape[:1]:
            raise ValueError(f"acting_head {tuple(acting_head.shape)} must be (B,) = ({log_pi_heads.shape[0]},)")
    if log_pi_heads.numel() == 0:
        return log_pi_heads.new_zeros(())
    advantage = returns.detach()
    if baseline is not None:
        advantage = advantage - baseline.detach()
    weights = masks.detach().to(log_pi_heads.dtype)
    if update == "acting":  # on-policy per head: w = omega_k 1[k = a]
        weights = weights * F.one_hot(acting_head, log_pi_heads.shape[-1]).to(weights.dtype)[:, None]
    elif update == "importance":  # off-policy per head: w = omega_k min(clip, prod_t pi_k / pi_a)
        weights = weights * importance_weights(log_pi_heads, acting_head, clip)[:, None]
    weighted = weights * advantage.unsqueeze(-1)
    return -(weighted * log_pi_heads).sum(dim=(1, 2)).mean()


def bootstrapped_q_loss(q_heads: Tensor, action: Tensor, target: Tensor, masks: Tensor) -> Tensor:
    """Masked TD loss of K Q-heads: sum_k omega_k (Q_k(s, a) - y_k)^2, averaged over the experiences.

    q_heads: ``(N, K, A)``; action: ``(N,)`` int64; target: ``(N, K)`` (each head's own bootstrap target,
    detached); masks: ``(N, K)``.
    """
    q_sa = q_heads.gather(-1, action.view(-1, 1, 1).expand(-1, q_heads.shape[1], 1)).squeeze(-1)  # (N, K)
    return (masks.detach() * (q_sa - target.detach()).pow(2)).sum(-1).mean()
