"""BatchNorm state around a pass that must leave no trace: a diagnostic or exploratory forward pass in training mode."""

from __future__ import annotations

from typing import Any

from torch import nn


class FrozenBatchNormStats:
    """Inside the block BatchNorm layers in training mode use batch statistics but do not update their
    running statistics (momentum 0), so an extra diagnostic pass leaves the model's state unchanged."""

    def __init__(self, module: nn.Module) -> None:
        self.layers = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def __enter__(self) -> None:
        self.saved = [
            (m.momentum, m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None)
            for m in self.layers
        ]
        for m in self.layers:
            m.momentum = 0.0

    def __exit__(self, *exc: Any) -> None:
        for m, (momentum, tracked) in zip(self.layers, self.saved, strict=True):
            m.momentum = momentum
            if tracked is not None:
                m.num_batches_tracked.copy_(tracked)
