"""Stochastic policies over continuous actions."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def gaussian_log_prob(action: Tensor, mean: Tensor, std: Tensor | float) -> Tensor:
    """log N(action | mean, diag(std^2)), summed over the last (action) dimension.

    action, mean: ``(..., D)``; std: scalar or broadcastable to ``(..., D)``. Returns ``(...)``.
    """
    std_t = torch.as_tensor(std, dtype=mean.dtype, device=mean.device)
    z = (action - mean) / std_t
    return (-0.5 * z.pow(2) - torch.log(std_t) - _LOG_SQRT_2PI).expand_as(mean).sum(-1)


class PolicyOutput(NamedTuple):
    action: Tensor  # (B, D) the action that is used downstream; never carries gradient
    log_prob: Tensor  # (B,) log pi(action | h), differentiable w.r.t. the policy parameters
    mean: Tensor  # (B, D) the mean action (the deterministic action at evaluation)


class GaussianPolicy(nn.Module):
    """pi(a | h) = N(mu(h), sigma^2 I) with mu(h) = tanh(W h + b) in [-1, 1]^D and a fixed sigma.

    ``std`` is a plain attribute so a schedule may anneal it during training. The sample is detached:
    its log-probability is the only path for the policy gradient (the score-function estimator), and it is
    the log-probability of exactly the action returned.
    """

    def __init__(self, in_features: int, action_dim: int = 2, std: float = 0.17, bounded: bool = True) -> None:
        super().__init__()
        if std <= 0:
            raise ValueError(f"policy std must be > 0, got {std}")
        self.fc = nn.Linear(in_features, action_dim)
        self.std = float(std)
        self.bounded = bounded

    def mean(self, h: Tensor) -> Tensor:
        # fp32 under any autocast: actions and log-probabilities must not be rounded to bf16 (a sampled location
        # would move by up to 2^-8 of its range and log pi sums D terms)
        mu = self.fc(h).float()
        return torch.tanh(mu) if self.bounded else mu

    def forward(self, h: Tensor, deterministic: bool = False, generator: torch.Generator | None = None) -> PolicyOutput:
        """h: ``(B, F)`` -> action ``(B, D)``, log_prob ``(B,)``, mean ``(B, D)``.

        deterministic: return the mean as the action (its log-prob is still reported, for diagnostics).
        generator: draw the noise from this generator (seeded Monte-Carlo evaluation).
        """
        mu = self.mean(h)
        if deterministic:
            action = mu.detach()
        else:
            eps = torch.randn(mu.shape, generator=generator, device=mu.device, dtype=mu.dtype)
            action = (mu + self.std * eps).detach()
        return PolicyOutput(action, gaussian_log_prob(action, mu, self.std), mu)


def gaussian_entropy(std: Tensor, action_dim: int | None = None) -> Tensor:
    """H(N(mu, diag(std^2))) = sum_d (log std_d + 1/2 log(2 pi e)); it does not depend on the mean.

    std: ``(D,)`` (or a scalar with ``action_dim``). Returns a scalar, differentiable w.r.t. ``std``.
    """
    std = torch.as_tensor(std)
    if std.ndim == 0:
        if action_dim is None:
            raise ValueError("a scalar std needs action_dim")
        std = std.expand(action_dim)
    return (torch.log(std) + 0.5 + _LOG_SQRT_2PI).sum()


class LearnedStdGaussianPolicy(nn.Module):
    """pi(a | h) = N(mu(h), diag(sigma^2)), mu(h) = tanh(W h + b) as in :class:`GaussianPolicy`, with a learned,
    state-independent sigma = exp(log_sigma) per action dimension, clamped to ``[std_min, std_max]`` (no gradient
    reaches log_sigma while it is clamped).

    Unlike :class:`GaussianPolicy`, the score-function gradient also reaches sigma (d log pi / d log sigma_d =
    z_d^2 - 1), and an entropy bonus (:meth:`entropy`) can push it up: the entropy grows with log sigma. The
    sample is detached, as in :class:`GaussianPolicy`.
    """

    def __init__(
        self,
        in_features: int,
        action_dim: int = 2,
        std: float = 0.17,
        bounded: bool = True,
        std_min: float = 0.01,
        std_max: float = 1.0,
    ) -> None:
        super().__init__()
        if not 0 < std_min <= std <= std_max:
            raise ValueError(f"need 0 < std_min <= std <= std_max, got {std_min}, {std}, {std_max}")
        self.fc = nn.Linear(in_features, action_dim)
        self.bounded = bounded
        self.log_std = nn.Parameter(torch.full((action_dim,), math.log(std)))
        self.log_std_min, self.log_std_max = math.log(std_min), math.log(std_max)

    @property
    def std(self) -> Tensor:
        """sigma ``(D,)``, differentiable w.r.t. ``log_std`` inside the bounds."""
        return self.log_std.float().clamp(self.log_std_min, self.log_std_max).exp()

    def mean(self, h: Tensor) -> Tensor:
        mu = self.fc(h).float()  # fp32 under autocast, as GaussianPolicy
        return torch.tanh(mu) if self.bounded else mu

    def entropy(self) -> Tensor:
        """The policy's entropy (a scalar, the same for every state)."""
        return gaussian_entropy(self.std)

    def forward(self, h: Tensor, deterministic: bool = False, generator: torch.Generator | None = None) -> PolicyOutput:
        """h: ``(B, F)`` -> action ``(B, D)``, log_prob ``(B,)`` (of that action; differentiable w.r.t. W, b and
        log_sigma), mean ``(B, D)``. deterministic: the mean is the action."""
        mu = self.mean(h)
        std = self.std
        if deterministic:
            action = mu.detach()
        else:
            eps = torch.randn(mu.shape, generator=generator, device=mu.device, dtype=mu.dtype)
            action = (mu + std.detach() * eps).detach()
        return PolicyOutput(action, gaussian_log_prob(action, mu, std), mu)
