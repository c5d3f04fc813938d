"""Returns from per-step rewards."""

from __future__ import annotations

import torch
from torch import Tensor


def discounted_returns(rewards: Tensor, gamma: float = 1.0) -> Tensor:
    """G_t = sum_{t' >= t} gamma^(t'-t) r_t'.

    rewards: ``(B, T)``. Returns ``(B, T)``. One broadcast product with the upper-triangular discount matrix
    summed over t', no Python loop over time. Not a matmul: under autocast a matmul runs in bf16/fp16 and would
    round the returns (to 2^-8 relative), which the policy gradient then multiplies by log pi.
    """
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be (B, T), got shape {tuple(rewards.shape)}")
    T = rewards.shape[1]
    t = torch.arange(T, device=rewards.device)
    lag = (t[None, :] - t[:, None]).to(rewards.dtype)  # lag[t, t'] = t' - t
    discount = torch.where(lag >= 0, torch.as_tensor(gamma, dtype=rewards.dtype).pow(lag.clamp(min=0)), 0.0)
    return (rewards[:, None, :] * discount).sum(-1)


def terminal_returns(reward: Tensor, num_steps: int, gamma: float = 1.0) -> Tensor:
    """Returns when the only reward ``reward`` ``(B,)`` arrives after the last of ``num_steps`` steps.

    G_t = gamma^(T-1-t) R, shape ``(B, T)``.
    """
    powers = torch.arange(num_steps - 1, -1, -1, device=reward.device, dtype=reward.dtype)
    return reward[:, None] * torch.as_tensor(gamma, dtype=reward.dtype).pow(powers)[None, :]
