"""Proximal policy optimisation's clipped surrogate (Schulman et al., 2017)."""

from __future__ import annotations

import torch
from torch import Tensor


def ppo_clip_loss(log_pi: Tensor, log_pi_old: Tensor, advantage: Tensor, clip: float = 0.2) -> Tensor:
    """L = -E[min(rho A, clip(rho, 1 - eps, 1 + eps) A)], rho = pi(a|s) / pi_old(a|s).

    log_pi: log-probabilities of the stored actions under the current policy (differentiable);
    log_pi_old: under the policy that collected them; advantage: detached. All of one shape.
    """
    if clip <= 0:
        raise ValueError(f"PPO clip must be > 0, got {clip}")
    ratio = torch.exp(log_pi - log_pi_old.detach())
    adv = advantage.detach()
    return -torch.minimum(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv).mean()
