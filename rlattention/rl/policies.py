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
