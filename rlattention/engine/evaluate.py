"""Evaluation of a model on a split: deterministic (mean actions, seeded), sharded over processes with the numbers
of one process, and under a PGD attack. Loading a checkpoint for evaluation: :mod:`rlattention.engine.loading`."""

from __future__ import annotations

import torch
from lightning.fabric import Fabric

from rlattention.data.base import ArrayDataset
from rlattention.engine.distributed import _any_rank, _gather_in_order, _sync_buffers, _unwrap
from rlattention.engine.loader import BatchLoader
from rlattention.engine.method import AttentionMethod
from rlattention.progress import progress_bar


def _eval_ranges(n: int, batch_size: int) -> list[tuple[int, int]]:
    """The evaluation batches of a split of ``n`` items: contiguous ``[start, stop)`` ranges in item order."""
    return [(s, min(n, s + batch_size)) for s in range(0, n, batch_size)]


def _predict_ranges(
    fabric: Fabric,
    model: AttentionMethod,
    dataset: ArrayDataset,
    ranges: list[tuple[int, int]],
    mc_samples: int,
    generator: torch.Generator,
    bar=None,
) -> list[torch.Tensor]:
    """``model.predict_batch`` on each ``[start, stop)`` range of ``dataset``, in order (float32, on the CPU)."""
    loader = BatchLoader(dataset, 1, shuffle=False, drop_last=False, device=fabric.device)  # for to_device only
    scores = []
    for a, b in ranges:
        sel = torch.arange(a, b)
        images, targets = loader.to_device(dataset.images[sel], dataset.targets[sel])
        with fabric.autocast():
            out = model.predict_batch(images, targets, mc_samples=mc_samples, generator=generator)
        scores.append(out.float().cpu())
        if bar is not None:
            bar.update(1)
    return scores


def _sharded_scores(
    fabric: Fabric, model: AttentionMethod, dataset: ArrayDataset, batch_size: int, seed: int, progress: bool
) -> torch.Tensor | None:
    """Mean-action scores of the whole split, each rank predicting batches ``rank, rank + W, ...`` (the same
    batches as one process), gathered in item order. None when the model drew from the evaluation generator:
    its draws depend on every earlier batch of the one seeded stream, which a rank cannot reproduce, so the
    caller then evaluates the whole split on every rank (numbers identical to one process either way)."""
    ranges = _eval_ranges(len(dataset), batch_size)
    mine = ranges[fabric.global_rank :: fabric.world_size]
    gen = torch.Generator(device=fabric.device).manual_seed(seed)
    fresh = gen.get_state()
    bar = progress_bar(total=len(mine), desc="eval", unit="batch", enabled=progress and fabric.global_rank == 0)
    try:
        local = _predict_ranges(fabric, model, dataset, mine[:1], 0, gen, bar)  # one batch, then ask every rank
        if _any_rank(fabric, not torch.equal(gen.get_state(), fresh)):
            return None
        local += _predict_ranges(fabric, model, dataset, mine[1:], 0, gen, bar)
        if _any_rank(fabric, not torch.equal(gen.get_state(), fresh)):
            return None
    finally:
        bar.close()
    return _gather_in_order(fabric, local, ranges, len(dataset))


@torch.no_grad()
def evaluate(
    fabric: Fabric,
    model: AttentionMethod,
    dataset: ArrayDataset,
    batch_size: int,
    mc_samples: int = 0,
    seed: int = 1234,
    progress: bool = False,
) -> dict[str, float]:
    """Metrics of ``model`` on ``dataset``: eval mode, seeded, mean actions unless ``mc_samples > 0``.

    With several processes each rank predicts its share of the batches and the scores are gathered, so every
    rank computes the metrics of the whole split and gets the numbers of one process (every rank first takes
    rank 0's buffers, e.g. BatchNorm statistics, which the checkpoint holds). Evaluations that draw random
    numbers (``mc_samples > 0``, a random initial glimpse) use one seeded stream across the batches; to keep
    those numbers identical to one process, every rank then evaluates the whole split. ``progress``: a bar over
    the batches, on rank 0, on a terminal (:func:`rlattention.progress.progress_bar`)."""
    model = _unwrap(model)
    _sync_buffers(fabric, model)
    was_training = model.training
    model.eval()
    try:
        scores = None
        if fabric.world_size > 1 and mc_samples <= 0:
            scores = _sharded_scores(fabric, model, dataset, batch_size, seed, progress)
        if scores is None:
            gen = torch.Generator(device=fabric.device).manual_seed(seed)
            ranges = _eval_ranges(len(dataset), batch_size)
            show = progress and fabric.global_rank == 0
            with progress_bar(total=len(ranges), desc="eval", unit="batch", enabled=show) as bar:
                scores = torch.cat(_predict_ranges(fabric, model, dataset, ranges, mc_samples, gen, bar))
    finally:
        model.train(was_training)
    return model.metrics(scores, dataset.targets.cpu())


def evaluate_under_attack(
    fabric: Fabric,
    model: AttentionMethod,
    dataset: ArrayDataset,
    batch_size: int,
    epsilon: float,
    step_size: float,
    steps: int,
    seed: int = 1234,
    progress: bool = False,
) -> dict[str, float]:
    """Metrics on PGD (L-inf) adversarial images: the attack follows the model's deterministic, differentiable
    forward (:meth:`AttentionMethod.attack_logits`); the prediction is then the usual deterministic one.

    With several processes rank ``r`` attacks batches ``r, r + W, ...``; the model's randomness is seeded per
    batch (``seed + i``) and the random starts of the batches it skips are drawn and discarded, so every batch
    sees the random start of one process and the gathered metrics equal those of one process."""
    from rlattention.vision.adversarial import pgd_attack

    model = _unwrap(model)
    _sync_buffers(fabric, model)
    model.eval()
    W, r = fabric.world_size, fabric.global_rank
    loader = BatchLoader(dataset, 1, shuffle=False, drop_last=False, device=fabric.device)  # for to_device only
    ranges = _eval_ranges(len(dataset), batch_size)
    gen = torch.Generator(device=fabric.device).manual_seed(seed)
    scores = []
    bars = progress_bar(ranges, desc="pgd", unit="batch", enabled=progress and fabric.global_rank == 0)
    for i, (a, b) in enumerate(bars):
        sel = torch.arange(a, b)
        if i % W != r:
            if epsilon > 0:  # pgd_attack's random start: one uniform draw of the batch's shape
                shape = (b - a, *dataset.images.shape[1:])
                torch.rand(shape, generator=gen, device=fabric.device, dtype=torch.float32)
            continue
        images, targets = loader.to_device(dataset.images[sel], dataset.targets[sel])
        adv = pgd_attack(
            lambda z, i=i: model.attack_logits(z, seed=seed + i),
            images,
            targets,
            epsilon,
            step_size,
            steps,
            generator=gen,
        )
        with torch.no_grad():
            batch_gen = torch.Generator(device=fabric.device).manual_seed(seed + i)
            scores.append(model.predict(adv, generator=batch_gen).float().cpu())
    full = _gather_in_order(fabric, scores, ranges, len(dataset)) if W > 1 else torch.cat(scores)
    return model.metrics(full, dataset.targets.cpu())
