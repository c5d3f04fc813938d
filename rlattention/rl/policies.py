"""Stochastic policies over continuous actions, and a categorical policy over the cells of a feature map."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
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


def grid_cell_centres(grid: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The centres ``(grid * grid, 2)`` (x, y) in [-1, 1] of the cells of a ``grid x grid`` partition of the image,
    row by row (cell ``n = i * grid + j`` is row i, column j: the order of a flattened ``(grid, grid)`` map)."""
    if grid < 1:
        raise ValueError(f"a grid needs at least one cell per side, got {grid}")
    c = (2 * torch.arange(grid, dtype=torch.float64) + 1) / grid - 1
    y, x = torch.meshgrid(c, c, indexing="ij")
    return torch.stack((x, y), -1).reshape(-1, 2).to(dtype)


class MapCategoricalPolicy(nn.Module):
    """pi(j | F, h) = softmax_j(v^T tanh(W_f f_j + W_h h + b)) over the ``grid x grid`` cells of a feature map F.

    f_j is F average-pooled to ``grid x grid`` (cell j, row-major), h the recurrent state. The action is the centre
    of the chosen cell (x, y) in [-1, 1] (:func:`grid_cell_centres`), so, unlike the linear Gaussian policies, the
    location is scored from what each place of the image contains and may point at any cell for any state.

    Use: :meth:`encode_cells` once per feature map (W_f f_j + b does not depend on the state), then per step
    :meth:`logits` (cells in ``visited`` get -inf: never drawn again) and :meth:`act`, or both at once with
    :meth:`forward`. The drawn cell index is not returned (:class:`PolicyOutput`, as the Gaussian policies);
    :meth:`cell_index` recovers it from the action. The action is detached: log pi(j) is the only path for the
    policy gradient (the score-function estimator), and it is the log-probability of exactly the cell returned.
    ``mean`` is the centre of the most probable cell, the deterministic action.
    """

    def __init__(self, feature_dim: int, state_dim: int, grid: int = 8, hidden: int = 64) -> None:
        super().__init__()
        if grid < 1:
            raise ValueError(f"policy grid must be >= 1, got {grid}")
        if hidden < 1:
            raise ValueError(f"policy hidden size must be >= 1, got {hidden}")
        self.grid = grid
        self.cell_fc = nn.Linear(feature_dim, hidden)  # W_f, b
        self.state_fc = nn.Linear(state_dim, hidden, bias=False)  # W_h
        self.score = nn.Linear(hidden, 1, bias=False)  # v
        self.register_buffer("centres", grid_cell_centres(grid), persistent=False)  # (N, 2)

    @property
    def num_cells(self) -> int:
        return self.grid * self.grid

    def cell_features(self, fmap: Tensor) -> Tensor:
        """f_j: ``(B, C, h, w)`` -> ``(B, N, C)``, the map average-pooled to ``grid x grid``, row-major."""
        return F.adaptive_avg_pool2d(fmap, self.grid).flatten(2).transpose(1, 2)

    def encode_cells(self, fmap: Tensor) -> Tensor:
        """W_f f_j + b ``(B, N, hidden)`` of a feature map ``(B, C, h, w)``; the same for every step."""
        return self.cell_fc(self.cell_features(fmap))

    def logits(self, cells: Tensor, h: Tensor, visited: Tensor | None = None) -> Tensor:
        """cells ``(B, N, hidden)`` (:meth:`encode_cells`), h ``(B, F)``, visited ``(B, N)`` bool or None ->
        logits ``(B, N)`` in fp32 (as the Gaussian policies under autocast), -inf at the visited cells."""
        u = self.score(torch.tanh(cells + self.state_fc(h)[:, None, :])).squeeze(-1).float()
        return u if visited is None else u.masked_fill(visited, float("-inf"))

    def act(
        self, logits: Tensor, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> PolicyOutput:
        """logits ``(B, N)`` -> the centre of a cell drawn from softmax(logits) (the most probable one if
        ``deterministic``; its log-prob is still reported) ``(B, 2)``, its log_prob ``(B,)``, the mode's centre."""
        log_p = torch.log_softmax(logits, -1)
        mode = logits.detach().argmax(-1)
        if deterministic:
            j = mode
        else:
            j = torch.multinomial(log_p.detach().exp(), 1, generator=generator).squeeze(-1)
        centres = self.centres.to(logits.dtype)
        return PolicyOutput(centres[j], log_p.gather(-1, j[:, None]).squeeze(-1), centres[mode])

    def forward(
        self,
        cells: Tensor,
        h: Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        visited: Tensor | None = None,
    ) -> PolicyOutput:
        """:meth:`act` on :meth:`logits`: cells ``(B, N, hidden)``, h ``(B, F)`` -> action ``(B, 2)``, log_prob
        ``(B,)`` (differentiable w.r.t. W_f, W_h, b, v and the inputs), mean ``(B, 2)``."""
        return self.act(self.logits(cells, h, visited), deterministic, generator)

    @staticmethod
    def entropy(logits: Tensor) -> Tensor:
        """H(pi) = -sum_j p_j log p_j ``(B,)`` of logits ``(B, N)``; -inf (masked) cells contribute 0, and no NaN
        reaches the gradient through them. Differentiable w.r.t. the logits."""
        log_p = torch.log_softmax(logits, -1)
        log_p = log_p.masked_fill(torch.isneginf(logits), 0.0)
        return -(log_p.exp() * log_p).sum(-1)

    def cell_index(self, action: Tensor) -> Tensor:
        """The cell ``(B,)`` (long, row-major) whose centre is ``action`` ``(B, 2)``."""
        ij = torch.round((action.detach().double() + 1) * self.grid / 2 - 0.5).long().clamp(0, self.grid - 1)
        return ij[:, 1] * self.grid + ij[:, 0]
