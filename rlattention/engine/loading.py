"""A checkpoint made ready to evaluate: its file found (:func:`_resolve_checkpoint`), read once, its config parsed
once, its data and model rebuilt, then scored by :mod:`rlattention.engine.evaluate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric

from rlattention.data.registry import build_dataset, resolve_data_dir
from rlattention.engine.averaging import evaluation_weights
from rlattention.engine.checkpoint import load_checkpoint_file, load_model_state
from rlattention.engine.config import ExperimentConfig, from_dict
from rlattention.engine.distributed import (
    _collectives_fail_clearly,
    _fabric_timeout_minutes,
    _rank_zero_first,
    _setup_group,
    _strategy,
)
from rlattention.engine.evaluate import evaluate, evaluate_under_attack
from rlattention.engine.method import DataInfo
from rlattention.engine.registry import get_method
from rlattention.engine.rundir import find_run_dir


def _resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given; a folder: ``checkpoints/last.ckpt`` of the run folder it is (or is inside)."""
    p = Path(path)
    if not p.is_dir():
        return p
    run = find_run_dir(p)
    return (p if run is None or run == p.absolute() else run) / "checkpoints" / "last.ckpt"


def load_for_eval(
    path: str | Path, data_dir: str | None = None, overrides: dict | None = None, fabric: Fabric | None = None
):
    """Load a checkpoint (weights only) and rebuild its model and data. Returns (cfg, model, splits).
    fabric: a launched multi-process Fabric, so that rank 0 builds the data (and its caches) first."""
    return _build_for_eval(load_checkpoint_file(_resolve_checkpoint(path)), path, data_dir, fabric)


def _build_for_eval(
    ckpt: dict,
    path: str | Path,
    data_dir: str | None,
    fabric: Fabric | None,
    cfg: ExperimentConfig | None = None,
):
    """``(cfg, model, splits)`` of the checkpoint ``ckpt`` read from ``path`` (named in errors): its config (``cfg``
    when the caller parsed it already), its data (rank 0 first) and its model holding all of its weights, with the
    schedules (sigma, epsilon) at the point of training the checkpoint was written."""
    if cfg is None:
        cfg = from_dict(ckpt["config"], source=f"{path} (config)")
    setup = _setup_group(fabric, cfg.trainer.setup_timeout_minutes)  # None with one process
    with _rank_zero_first(setup):  # rank 0 writes any cache; the others then read it
        splits = build_dataset(cfg.data.name, cfg.data, data_dir or cfg.data.data_dir)
    weights = evaluation_weights(ckpt)  # averaged where the run averaged them (trainer.ema_decay)
    model = get_method(cfg.method).from_checkpoint(
        cfg.model, DataInfo(splits.image_shape, splits.num_classes, dict(splits.meta)), weights
    )
    load_model_state(model, weights, path)  # all of the weights, or a one-line error naming the keys
    model.set_progress(_checkpoint_progress(ckpt, cfg, len(splits.train)))  # schedules (sigma, epsilon) as trained
    if setup is not None:  # the others built the data after rank 0: meet before the next (timed) collective
        setup.barrier()
    return cfg, model, splits


def _eval_fabric(cfg: ExperimentConfig, accelerator: str, devices: int, strategy: str) -> Fabric:
    """The launched Fabric of an evaluation: ``devices`` processes (``strategy`` "auto": ddp when several), the
    checkpoint's ``trainer.precision`` and timeouts (``collective_timeout_minutes`` for the DDP group, the setup
    group of ``setup_timeout_minutes`` made right after the launch)."""
    tc = cfg.trainer
    if devices > 1 and strategy == "auto":
        strategy = "ddp"
    fabric = Fabric(
        accelerator=accelerator,
        devices=devices,
        strategy=_strategy(strategy, devices, tc.collective_timeout_minutes, tc.setup_timeout_minutes),
        precision=tc.precision,
    )
    fabric.launch()
    with _collectives_fail_clearly(fabric, tc.collective_timeout_minutes):
        _setup_group(fabric, tc.setup_timeout_minutes)
    return fabric


def _checkpoint_progress(ckpt: dict, cfg: ExperimentConfig, num_train: int) -> float:
    """Fraction of training done when ``ckpt`` was written (single-process step count)."""
    progress = ckpt.get("progress", {})
    step = int(progress.get("step", 0))
    total = int(progress.get("total_steps", 0))
    if total <= 0:  # checkpoints written before total_steps was recorded: single-process estimate
        tc = cfg.trainer
        total = tc.max_steps if tc.max_steps > 0 else tc.epochs * max(1, num_train // tc.batch_size)
    return min(1.0, step / max(1, total))


def evaluate_checkpoint(
    path: str | Path,
    data_dir: str | None = None,
    split: str = "test",
    mc_samples: int = 0,
    seed: int = 1234,
    batch_size: int = 1000,
    accelerator: str = "cpu",
    attack: dict | None = None,
    limit: int = 0,
    devices: int = 1,
    strategy: str = "auto",
    fabric: Fabric | None = None,
    record: dict | None = None,
) -> dict[str, float]:
    """Evaluate a checkpoint; ``attack={"epsilon", "step_size", "steps"}`` evaluates under PGD instead.
    limit: evaluate only the first ``limit`` images (0: all). ``record``: a dict this fills with what the
    evaluation used (:func:`eval_record`: the checkpoint file, the dataset, its folder, the images evaluated), as
    ``rlattention eval`` writes it into ``eval.json``.

    devices > 1 evaluates with that many processes (``strategy`` "auto" then means "ddp"): each scores its share
    of the batches, the scores are gathered and every process returns the metrics of the whole split, equal to
    those of one process. Fabric's launcher starts the other processes by re-running this program's command
    line (as ``rlattention eval --devices N`` does), unless they were started by torchrun or SLURM. ``fabric``:
    an already launched Fabric to use instead (``accelerator``, ``devices`` and ``strategy`` are then ignored).
    The processes use the timeouts of the checkpoint's config (``trainer.collective_timeout_minutes``,
    ``trainer.setup_timeout_minutes``, see :func:`~rlattention.engine.trainer.fit`); a stalled or dead rank is a
    :class:`~rlattention.engine.distributed.CollectiveTimeout`."""
    if split not in ("test", "val", "train"):
        raise ValueError(f"split must be test, val or train, got {split!r}")
    file = _resolve_checkpoint(path)  # the path is resolved, read and its config parsed once each
    ckpt = load_checkpoint_file(file)
    cfg = from_dict(ckpt["config"], source=f"{path} (config)")
    if fabric is None:
        fabric = _eval_fabric(cfg, accelerator, devices, strategy)
    with _collectives_fail_clearly(fabric, _fabric_timeout_minutes(fabric, cfg.trainer.collective_timeout_minutes)):
        cfg, model, splits = _build_for_eval(ckpt, path, data_dir, fabric, cfg)
        dataset = getattr(splits, split)
        if limit > 0:
            dataset = dataset.subset(torch.arange(min(limit, len(dataset))))
        if record is not None:
            record.update(eval_record(file, cfg, data_dir, len(dataset)))
        model = fabric.setup_module(model)
        if attack:
            return evaluate_under_attack(fabric, model, dataset, batch_size, seed=seed, progress=True, **attack)
        return evaluate(fabric, model, dataset, batch_size, mc_samples, seed, progress=True)


def eval_record(path: str | Path, cfg: ExperimentConfig, data_dir: str | None, images: int) -> dict[str, Any]:
    """What an evaluation of checkpoint ``path`` used: the checkpoint file (absolute), the method, the dataset of
    ``cfg`` (the checkpoint's config, with any data settings replaced), the data folder read (``data_dir``, else
    the config's ``data.data_dir``, else ``$RLATTENTION_DATA``; ``None`` for built-in data) and the number of
    images evaluated."""
    used = resolve_data_dir(data_dir or cfg.data.data_dir)
    return {
        "checkpoint": str(_resolve_checkpoint(path).absolute()),
        "method": cfg.method,
        "dataset": cfg.data.name,
        "data_dir": None if used is None else str(used.absolute()),
        "images": int(images),
    }
