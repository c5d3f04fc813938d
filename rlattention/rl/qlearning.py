"""Q-learning parts: exploration, targets from a frozen network, the TD loss."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def epsilon_greedy(q: Tensor, epsilon: float, generator: torch.Generator | None = None) -> Tensor:
    """argmax_a Q with probability 1 - epsilon, a uniform action otherwise. q ``(B, A)`` -> ``(B,)`` int64."""
    B, A = q.shape
    greedy = q.argmax(-1)
    if epsilon <= 0:
        return greedy
    explore = torch.rand(B, generator=generator, device=q.device) < epsilon
    uniform = torch.randint(A, (B,), generator=generator, device=q.device)
    return torch.where(explore, uniform, greedy)


def softmax_exploration(q: Tensor, temperature: float, generator: torch.Generator | None = None) -> Tensor:
    """Sample a ~ softmax(Q / temperature). q ``(B, A)`` -> ``(B,)`` int64."""
    probs = F.softmax(q.detach() / max(temperature, 1e-8), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def q_targets(reward: Tensor, next_q_target: Tensor | None, gamma: float, terminal: bool) -> Tensor:
    """y = r + gamma max_a' Q_target(s', a') (eq. 8); y = r at a terminal step. Always detached."""
    if terminal or next_q_target is None:
        return reward.detach()
    return (reward + gamma * next_q_target.max(-1).values).detach()


def q_loss(q: Tensor, action: Tensor, target: Tensor) -> Tensor:
    """(Q(s, a) - y)^2 averaged over the batch (eq. 9). q ``(B, A)``, action ``(B,)``, target ``(B,)``."""
    q_sa = q.gather(-1, action[:, None]).squeeze(-1)
    return F.mse_loss(q_sa, target.detach())


class TargetNetwork(nn.Module):
    """A frozen copy of ``online`` that changes only when :meth:`sync` is called.

    Its parameters have ``requires_grad=False`` (no optimiser or DDP touches them) and are saved in the
    checkpoint, so a resumed run has the same target as an uninterrupted one.
    """

    def __init__(self, online: nn.Module) -> None:
        super().__init__()
        self.net = copy.deepcopy(online)
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.net.eval()

    def train(self, mode: bool = True) -> TargetNetwork:  # stays in eval mode
        super().train(False)
        return self

    @torch.no_grad()
    def sync(self, online: nn.Module) -> None:
        self.net.load_state_dict(online.state_dict())

    @torch.no_grad()
    def forward(self, *args, **kwargs):
        return self.net(*args, **kwargs)
