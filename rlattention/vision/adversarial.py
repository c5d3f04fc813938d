"""Projected gradient descent (Madry et al. 2018) in the L-infinity ball: the attack of the unified-attention
paper's robustness experiment (eq. 15)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def pgd_attack(
    logits_fn: Callable[[Tensor], Tensor],
    images: Tensor,
    targets: Tensor,
    epsilon: float,
    step_size: float,
    steps: int,
    random_start: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """x^{t+1} = Proj_{||x - x_0||_inf <= eps, [0, 1]} (x^t + step_size * sign(grad_x CE(logits_fn(x^t), y))).

    logits_fn: differentiable ``(B, C, H, W) -> (B, K)`` (for attention models: mean actions, gradients
    through the locations). images in [0, 1]. Returns the adversarial images, detached.
    """
    if epsilon < 0 or step_size <= 0 or steps < 0:
        raise ValueError(f"need epsilon >= 0, step_size > 0, steps >= 0; got {epsilon}, {step_size}, {steps}")
    x0 = images.detach()
    x = x0.clone()
    if random_start and epsilon > 0:
        noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype) * 2 - 1
        x = (x0 + epsilon * noise).clamp(0, 1)
    for _ in range(steps):
        x.requires_grad_(True)
        loss = F.cross_entropy(logits_fn(x), targets)
        (grad,) = torch.autograd.grad(loss, x)
        with torch.no_grad():
            x = x + step_size * grad.sign()
            x = torch.min(torch.max(x, x0 - epsilon), x0 + epsilon).clamp(0, 1)
    return x.detach()
