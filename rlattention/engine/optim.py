"""The optimiser (with per-prefix learning-rate multipliers, ``optim.lr_scale``) and the learning-rate schedule of
``optim``."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from rlattention.engine.config import OptimConfig


def param_groups(
    named: Iterable[tuple[str, nn.Parameter]], cfg: OptimConfig, method_scales: dict[str, float] | None = None
) -> list[dict]:
    """Parameter groups of ``optim.lr_scale``: each parameter at ``lr`` times the multiplier of the longest
    prefix of its name (``locator`` matches ``locator.fc.weight``, not ``locators.x``), 1 without one.
    ``method_scales``: the method's own multipliers (:meth:`AttentionMethod.lr_scales`), under ``optim.lr_scale``."""
    named = list(named)
    scales = {**(method_scales or {}), **dict(cfg.lr_scale or {})}
    for prefix, scale in scales.items():
        if not scale > 0:
            raise ValueError(f"optim.lr_scale.{prefix} must be > 0, got {scale}")
        if not any(n == prefix or n.startswith(prefix + ".") for n, _ in named):
            tops = sorted({n.split(".")[0] for n, _ in named})
            raise ValueError(f"optim.lr_scale.{prefix}: no parameter of the model is named so; top-level: {tops}")
    groups: dict[float, list[nn.Parameter]] = {}
    for name, p in named:
        match = [k for k in scales if name == k or name.startswith(k + ".")]
        groups.setdefault(scales[max(match, key=len)] if match else 1.0, []).append(p)
    order = sorted(groups, key=lambda scale: (scale != 1.0, scale))  # the plain lr first: train/lr logs group 0
    return [{"params": groups[scale], "lr": cfg.lr * scale} for scale in order]


def make_optimizer(params, cfg: OptimConfig, method_scales: dict[str, float] | None = None) -> torch.optim.Optimizer:
    """The optimiser of ``optim``; ``params``: parameters, or ``(name, parameter)`` pairs (needed by
    ``optim.lr_scale`` and ``method_scales``, the method's own multipliers)."""
    params = list(params)
    named = bool(params) and isinstance(params[0], tuple)
    if (cfg.lr_scale or method_scales) and not named:
        raise ValueError("optim.lr_scale needs named parameters (pass model.named_parameters())")
    if named:
        params = param_groups(params, cfg, method_scales)
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    raise ValueError(f"optim.name must be 'adam' or 'sgd', got {cfg.name!r}")


def make_scheduler(opt: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int, steps_per_epoch: int):
    def factor(step: int) -> float:
        warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0
        if cfg.schedule == "none":
            return warm
        if cfg.schedule == "cosine":
            return warm * 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(1, total_steps)))
        if cfg.schedule == "step":
            return warm * cfg.step_gamma ** (step // max(1, cfg.step_epochs * steps_per_epoch))
        raise ValueError(f"optim.schedule must be 'none', 'cosine' or 'step', got {cfg.schedule!r}")

    factor(0)  # validate the name now, not at the first step
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)
