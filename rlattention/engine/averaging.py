"""An exponential moving average of the trained weights (``trainer.ema_decay``), the weights a run evaluates.

With ``trainer.ema_decay = d > 0`` every optimiser step moves the average ``a`` of each trained (``requires_grad``)
floating-point parameter ``w`` toward it: ``a <- a + (1 - d_n) (w - a)`` with ``d_n = min(d, (1 + n) / (10 + n))``
after ``n`` earlier updates. The warm-up ``d_n`` keeps the first steps from being dominated by the initial weights (the
average then starts as a short window and widens to ``1 / (1 - d)`` steps). Buffers and frozen parameters are not
averaged: the evaluated model takes them from the trained one. BatchNorm's running statistics are therefore those of
the trained weights, not recomputed for the average (as SWA's ``update_bn`` would): the trainer says so when the
model has such layers.

Validation (and so the choice of ``best.ckpt``), the final test, figures, exports and every evaluation of a checkpoint
(:func:`evaluation_weights`) use the averaged weights. A checkpoint keeps the trained weights in ``model`` (a resume
continues them) and the average in ``ema``.

The update is one fused ``torch._foreach_lerp_`` over the parameter list; :func:`reference_update` is its plain,
slow statement, which the tests compare it with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

#: the checkpoint entry that holds the average (absent when ``trainer.ema_decay`` is 0)
EMA_KEY = "ema"


def warmup_decay(decay: float, updates: int) -> float:
    """The decay of update number ``updates + 1``: ``min(decay, (1 + updates) / (10 + updates))``."""
    return min(decay, (1.0 + updates) / (10.0 + updates))


def reference_update(average: dict[str, torch.Tensor], params: dict[str, torch.Tensor], decay: float) -> None:
    """The slow statement of one update: ``a = decay * a + (1 - decay) * w`` for each name, in float64."""
    for name, a in average.items():
        w = params[name].detach().to(torch.float64)
        a.copy_((decay * a.to(torch.float64) + (1.0 - decay) * w).to(a.dtype))


class WeightAverage:
    """The moving average of ``module``'s trained floating-point parameters (see the module docstring).

    ``state_dict``/``load_state_dict`` make it a checkpointed object like the optimiser: ``{"decay", "updates",
    "weights"}``, ``weights`` keyed by the parameters' names in ``module.state_dict()``: a parameter the module
    holds under several names (a shared backbone) appears under each of them, so that a checkpoint's evaluation
    weights (:func:`evaluation_weights`) replace every copy. Half-precision parameters (``trainer.precision``
    ``bf16-true`` or ``16-true``) are averaged in float32: a step of ``1 - d`` = 0.001 would round away in bf16."""

    def __init__(self, module: torch.nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"trainer.ema_decay must be in (0, 1) to average weights, got {decay}")
        self.module, self.decay, self.updates = module, float(decay), 0
        aliases: dict[int, list[str]] = {}  # id(parameter) -> its names, the first as named_parameters() gives it
        live: dict[int, torch.nn.Parameter] = {}
        for n, p in module.named_parameters(remove_duplicate=False):
            if p.requires_grad and p.is_floating_point():
                aliases.setdefault(id(p), []).append(n)
                live[id(p)] = p
        if not aliases:
            raise ValueError("trainer.ema_decay > 0, but the model has no trained floating-point parameter to average")
        self.names = [names[0] for names in aliases.values()]
        self.aliases = {names[0]: names for names in aliases.values()}
        self._live = [live[k] for k in aliases]
        self.weights = {n: _averaged_copy(p) for n, p in zip(self.names, self._live, strict=True)}

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average toward the module's current weights."""
        d = warmup_decay(self.decay, self.updates)
        averages = list(self.weights.values())
        ends = [p.detach().to(a.dtype) for p, a in zip(self._live, averages, strict=True)]
        torch._foreach_lerp_(averages, ends, 1.0 - d)
        self.updates += 1

    @contextlib.contextmanager
    @torch.no_grad()
    def swapped_in(self) -> Iterator[None]:
        """The module holds the averaged weights inside the block and its trained ones again after it (also on an
        error)."""
        trained = [p.detach().clone() for p in self._live]
        try:
            for p, a in zip(self._live, self.weights.values(), strict=True):
                p.copy_(a)
            yield
        finally:
            for p, w in zip(self._live, trained, strict=True):
                p.copy_(w)

    def state_dict(self) -> dict[str, Any]:
        weights = {alias: a.clone() for n, a in self.weights.items() for alias in self.aliases[n]}
        return {"decay": self.decay, "updates": self.updates, "weights": weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The average of a checkpoint, all of it or (a :class:`ValueError` naming what does not fit) none."""
        weights = state.get("weights") if isinstance(state, dict) else None
        expected = {alias for names in self.aliases.values() for alias in names}
        if not isinstance(weights, dict) or not set(self.names) <= set(weights) or not set(weights) <= expected:
            got = sorted(weights) if isinstance(weights, dict) else type(weights).__name__
            raise ValueError(
                f"the checkpoint's '{EMA_KEY}' entry does not average this model's trained parameters "
                f"(expected {len(self.names)} names such as {self.names[:3]}, got {str(got)[:200]})"
            )
        for n, a in self.weights.items():  # every shape checked before anything is copied
            w = weights[n]
            if not isinstance(w, torch.Tensor) or w.shape != a.shape:
                shape = list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
                raise ValueError(
                    f"the checkpoint's '{EMA_KEY}' weight {n!r} is {shape}, the model's is {list(a.shape)}"
                )
        for n, a in self.weights.items():
            a.copy_(weights[n])
        self.updates = int(state.get("updates", 0))


_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)


def make_average(fabric: Any, module: torch.nn.Module, decay: float) -> WeightAverage | None:
    """The trainer's average of ``module`` (None with ``decay`` 0); rank 0 says when BatchNorm layers will run with
    the trained weights' statistics."""
    if decay <= 0:
        return None
    if fabric.global_rank == 0 and any(isinstance(m, _NORMS) for m in module.modules()):
        fabric.print(
            "trainer.ema_decay: the averaged weights are evaluated with the BatchNorm running statistics of the "
            "trained ones (not recomputed for the average)"
        )
    return WeightAverage(module, decay)


def resume_average(fabric: Any, average: WeightAverage | None, saved: Any, source: Any) -> None:
    """A resumed run's average from its checkpoint's entry ``saved`` (a :class:`CheckpointError` naming ``source``
    when it does not fit); rank 0 says when the run starts an average (the checkpoint has none) or drops one
    (``trainer.ema_decay`` is now 0)."""
    from rlattention.engine.checkpoint import CheckpointError

    if average is not None and isinstance(saved, dict):
        try:
            average.load_state_dict(saved)
        except ValueError as e:
            raise CheckpointError(f"{source}: {e}") from None
    elif average is not None and fabric.global_rank == 0:
        fabric.print(f"{source} holds no weight average: trainer.ema_decay starts it from its weights")
    elif isinstance(saved, dict) and fabric.global_rank == 0:
        fabric.print(
            f"{source} holds a weight average, but trainer.ema_decay is 0: the run continues without it "
            "(validation and the test evaluate the trained weights; best.ckpt keeps its average until replaced)"
        )


def _averaged_copy(p: torch.Tensor) -> torch.Tensor:
    """The starting average of ``p``: a copy, in float32 when ``p`` is half precision."""
    w = p.detach().clone()
    return w.float() if w.dtype in (torch.float16, torch.bfloat16) else w


def evaluation_weights(ckpt: dict) -> dict:
    """The weights a checkpoint is evaluated with: its ``model`` entry, with the averaged parameters of its ``ema``
    entry (when the run averaged weights) in place of the trained ones."""
    state = ckpt["model"]
    ema = ckpt.get(EMA_KEY)
    if not isinstance(ema, dict) or not isinstance(state, dict):
        return state
    return {**state, **ema.get("weights", {})}
