"""Where the DARP agent looks next when it has no Gaussian heads to sample: the grid of the bootstrapped-DQN
locator's actions, its epsilon-greedy choice and Q-learning targets, and the fixed raster of the ``raster``
ablation."""

from __future__ import annotations

import torch
from torch import Tensor


def cell_centres(rows: int, cols: int) -> Tensor:
    """``(rows * cols, 2)`` locations (x, y in [-1, 1]): the centres of a rows x cols partition, row-major (the
    DQN locator's actions and the raster's glimpses)."""
    ys = (torch.arange(rows, dtype=torch.float32) + 0.5) / rows * 2.0 - 1.0
    xs = (torch.arange(cols, dtype=torch.float32) + 0.5) / cols * 2.0 - 1.0
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((gx.flatten(), gy.flatten()), -1)


def raster_locations(n: int) -> Tensor:
    """``(n, 2)``: the first n :func:`cell_centres` of a rows x cols raster with rows = floor(sqrt(n)) and
    cols = ceil(n / rows) (12 -> 3 x 4)."""
    rows = max(1, int(n**0.5))
    return cell_centres(rows, -(-n // rows))[:n]


def epsilon_greedy_cells(q: Tensor, head: Tensor | None, epsilon: float, generator=None) -> Tensor:
    """The bootstrapped-DQN locator's choice among the A cells from Q-values ``(B, K, A)`` of its K heads.

    ``head`` ``(B,)``: the head acting in each episode, greedy in its own Q_k with probability 1 - epsilon and a
    uniform cell otherwise (no draw at all when epsilon is 0); None: the ensemble, argmax of the heads' mean Q
    (evaluation). Returns cell indices ``(B,)``."""
    if head is None:
        return q.mean(1).argmax(-1)
    q_k = q.gather(1, head.view(-1, 1, 1).expand(-1, 1, q.shape[-1])).squeeze(1)
    cell = q_k.argmax(-1)
    if epsilon > 0:
        explore = torch.rand(len(q), generator=generator, device=q.device) < epsilon
        uniform = torch.randint(q.shape[-1], cell.shape, generator=generator, device=q.device)
        cell = torch.where(explore, uniform, cell)
    return cell


def q_learning_targets(rewards: Tensor, q_next: Tensor, gamma: float) -> Tensor:
    """y_t = R_{t+1} + gamma max_a Q_target(h_{t+1}, a), the episode ending after its last action.

    rewards ``(N, T-1)``: R_{t+1} of each action; q_next ``(N, T-1, K)``: max_a Q_target of the next state per head.
    Returns ``(N, T-1, K)``."""
    last = torch.zeros_like(rewards)
    last[:, -1] = 1.0
    return rewards[..., None] + gamma * (1.0 - last[..., None]) * q_next
