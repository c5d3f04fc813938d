"""The generic training loop, on Lightning Fabric.

Fabric owns devices, the distributed strategy, precision, checkpoint I/O (through
:class:`~rlattention.engine.checkpoint.AtomicCheckpointIO`) and the loggers (:mod:`rlattention.engine.loggers`);
this module owns only what is specific to us: :func:`fit` chooses and locks the run folder, then
:class:`Trainer` runs a few named steps (setup, one epoch, validation and selection, checkpointing, the final test
and report). Its neighbours: :mod:`~rlattention.engine.evaluate` (metrics of a model on a split),
:mod:`~rlattention.engine.loading` (a checkpoint rebuilt for evaluation, ``evaluate_checkpoint``),
:mod:`~rlattention.engine.optim`, :mod:`~rlattention.engine.signals` (stop signals) and
:mod:`~rlattention.engine.distributed` (timeouts, setup waits, several processes).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.fabric import Fabric
from tqdm.auto import tqdm

from rlattention.data.base import DataSplits
from rlattention.data.registry import build_dataset, resolve_data_dir
from rlattention.engine import stopping
from rlattention.engine.averaging import EMA_KEY, evaluation_weights, make_average, resume_average
from rlattention.engine.checkpoint import AtomicCheckpointIO, check_resumable, load_checkpoint_file, load_model_state
from rlattention.engine.config import ExperimentConfig, to_dict
from rlattention.engine.distributed import (  # noqa: F401  (re-exported: the names importers used before)
    CollectiveTimeout,
    _collective_failure,
    _collectives_fail_clearly,
    _gather_rows,
    _rank_zero_first,
    _setup_group,
    _strategy,
    _unwrap,
    check_params_in_sync,
    leave_after_collective_failure,
    leave_process_group,
)
from rlattention.engine.evaluate import evaluate, evaluate_under_attack  # noqa: F401  (evaluate_under_attack: re-export)
from rlattention.engine.loader import BatchLoader
from rlattention.engine.loading import evaluate_checkpoint, load_for_eval  # noqa: F401  (re-exported)
from rlattention.engine.loggers import final_metrics, log_figures, log_hparams, make_loggers, truncate_metrics_csv
from rlattention.engine.method import AttentionMethod, DataInfo
from rlattention.engine.optim import make_optimizer, make_scheduler
from rlattention.engine.registry import get_method
from rlattention.engine.rundir import (
    RunFolderError,
    check_not_busy,
    check_run_name,
    choose_run_dir,
    claim_run_dir,
    refuse_links,
    resolve_resume,
    write_text_nofollow,
)
from rlattention.engine.runprogress import Progress  # noqa: F401  (re-exported)
from rlattention.engine.signals import STOP_SIGNALS, TrainingInterrupted, _agreed_signal, _interrupted, _StopSignals  # noqa: F401  (STOP_SIGNALS, TrainingInterrupted: re-exported)
from rlattention.metrics import METRIC_UNITS
from rlattention.progress import progress_bars


class TrainingDiverged(RuntimeError):
    """A non-finite loss: the run stops, the last good checkpoint is kept."""


def _check_writable(run_dir: Path) -> None:
    probe = run_dir / ".write-test"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * 65536)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OSError(f"run folder {run_dir} is not writable ({e.strerror or e}); set trainer.out_dir") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)  # also after a partial write (full disk)


def build_model(cfg: ExperimentConfig, splits: Any, state: dict | None = None) -> AttentionMethod:
    """The method of ``cfg`` built for ``splits`` as :func:`fit` builds it (``on_fit_start`` called); the caller
    seeds the random streams first. ``state``: the weights of a checkpoint about to be loaded into it (see
    :meth:`AttentionMethod.from_checkpoint`)."""
    info = DataInfo(splits.image_shape, splits.num_classes, dict(splits.meta))
    method = get_method(cfg.method)
    model = method.from_config(cfg.model, info) if state is None else method.from_checkpoint(cfg.model, info, state)
    model.on_fit_start(splits)
    return model


def _make_fabric(cfg: ExperimentConfig, run_dir: Path | None, resume: bool = False) -> Fabric:
    tc = cfg.trainer
    return Fabric(
        accelerator=tc.accelerator,
        devices=tc.devices,
        strategy=_strategy(tc.strategy, tc.devices, tc.collective_timeout_minutes, tc.setup_timeout_minutes),
        precision=tc.precision,
        plugins=[AtomicCheckpointIO()],
        loggers=make_loggers(run_dir, resume, tc.wandb, to_dict(cfg)),
    )


def fit(
    cfg: ExperimentConfig,
    data_dir: str | None = None,
    resume: str | Path | None = None,
    splits: DataSplits | None = None,
) -> dict[str, Any]:
    """Train ``cfg``; returns the final report (best epoch, validation and test metrics, paths).

    A new run gets a folder of its own (``out_dir/run_name``, else ``run_name-v2``, ``-v3``...: a used folder is
    never written into; ``trainer.overwrite`` renames it aside first); ``resume``: a run folder or a checkpoint
    inside one, continued in that folder. The run folder is locked (``.lock``) while the run trains.

    SIGTERM, SIGHUP or SIGINT (Ctrl-C) during training stops the run at the next step boundary (every process of a
    multi-process run at the same step): ``checkpoints/last.ckpt`` is saved as the periodic save writes it, the
    loggers are flushed, the lock released, the previous signal handlers restored, and :class:`TrainingInterrupted`
    (naming the signal, the step and the checkpoint) is raised; ``resume`` then continues exactly as an
    uninterrupted run would. Further signals while it saves are ignored (the checkpoint is never cut short). A
    signal that is ignored (``nohup``) stays ignored; outside the main thread no handler is installed.

    Several processes: a collective (gradient all-reduce, barrier, broadcast) that waits more than
    ``trainer.collective_timeout_minutes`` (default 10) for a stalled or dead rank, or loses its connection to a rank
    whose process ended, raises :class:`CollectiveTimeout`, one line naming this rank, the world size, the timeout
    and its key (the CLI prints it and exits with 4). The waits that may legitimately take longer use a gloo group
    of their own whose timeout is ``trainer.setup_timeout_minutes`` (default 240): the other ranks while rank 0
    builds the data and caches first, every rank preparing its model (``on_fit_start``) before the first training
    collective, the others while rank 0 writes figures, artifacts and report.json."""
    tc = cfg.trainer
    if tc.num_threads > 0:
        torch.set_num_threads(tc.num_threads)
    if tc.deterministic:
        torch.use_deterministic_algorithms(True)
    resume_dir, resume_path = resolve_resume(resume) if resume else (None, None)
    if splits is None:  # record the data folder this run reads: a resume then needs no --data-dir
        used = resolve_data_dir(data_dir or cfg.data.data_dir)
        if used is not None:
            cfg = copy.deepcopy(cfg)
            tc = cfg.trainer
            cfg.data.data_dir = data_dir = str(used.absolute())
    name = ""
    if resume_dir is not None:
        run_dir = resume_dir
        refuse_links(run_dir)
        check_not_busy(run_dir)  # at once, before anything touches the folder
    else:
        if tc.run_name:
            check_run_name(tc.run_name)
        name = tc.run_name or f"{cfg.method}_{cfg.data.name}_{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir = choose_run_dir(tc.out_dir, name, tc.overwrite)
        if tc.overwrite:
            check_not_busy(run_dir)
    fabric = _make_fabric(cfg, run_dir, resume=resume_path is not None)
    fabric.launch()
    with _collectives_fail_clearly(fabric, tc.collective_timeout_minutes):
        _setup_group(fabric, tc.setup_timeout_minutes)  # several processes: the long waits' group, made at once
        return _fit_launched(cfg, fabric, run_dir, name, resume_path, splits, data_dir)


def _claim(cfg: ExperimentConfig, fabric: Fabric, run_dir: Path, name: str, fresh: bool):
    """Rank 0's part of taking the run folder: created, checked writable, locked (the lock is returned) and, for a
    new run, given its ``config.yaml`` (a resume rewrites it once its checkpoint is loaded: a failed resume changes
    nothing)."""
    lock = claim_run_dir(run_dir, fresh=fresh, overwrite=fresh and cfg.trainer.overwrite, make=_check_writable)
    try:
        if fresh and run_dir.name != name:
            fabric.print(
                f"run folder {run_dir.with_name(name)} is already used: this run writes to {run_dir} "
                "(trainer.overwrite=true / --overwrite starts in the old name, keeping the old run aside)"
            )
        if fresh:
            write_text_nofollow(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    except Exception:
        lock.release()
        raise
    return lock


def _fit_launched(
    cfg: ExperimentConfig,
    fabric: Fabric,
    run_dir: Path,
    name: str,
    resume_path: Path | None,
    splits: DataSplits | None,
    data_dir: str | None,
) -> dict[str, Any]:
    """The rest of :func:`fit` once ``fabric`` is launched: the run folder chosen, created and locked by rank 0
    (the others wait for its word), then :meth:`Trainer.fit`."""
    run_dir = Path(fabric.broadcast(str(run_dir)))  # rank 0's folder (a default name holds rank 0's time)
    lock, failure = None, None
    if fabric.global_rank == 0:
        try:
            lock = _claim(cfg, fabric, run_dir, name, fresh=resume_path is None)
        except Exception as e:
            failure = e
    if fabric.world_size > 1:
        message = fabric.broadcast(None if failure is None else str(failure) or type(failure).__name__)
        if failure is None and message is not None:
            raise RunFolderError(message)
    if failure is not None:
        raise failure
    fabric.barrier()
    stop = _StopSignals()
    try:
        return Trainer(cfg, fabric, run_dir, stop).fit(resume_path, splits, data_dir)
    finally:
        stop.restore()  # the handlers the process had before (also after an error)
        if lock is not None:
            lock.release()


def _diverged(out, step: int) -> None:
    bad = [k for k, v in out.terms.items() if not torch.isfinite(v).all()]
    raise TrainingDiverged(
        f"non-finite loss at step {step} (terms: {', '.join(bad) or 'loss'}); "
        "the last good checkpoint is kept in checkpoints/last.ckpt"
    )


class _Window:
    """The training terms summed since the last logged row (``log_every`` steps), and when that row was logged."""

    def __init__(self, since: float) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0
        self.since = since

    def add(self, out) -> None:
        for k, v in {"loss": out.loss, **out.terms, **out.stats}.items():
            self.sums[k] = self.sums[k] + v.detach() if k in self.sums else v.detach().clone()
        self.count += 1


class Trainer:
    """One run of :func:`fit` once its folder is chosen, locked and holds ``config.yaml``, as named steps that each
    read alone, in the manner of Lightning's loops: :meth:`setup` (data, model, optimiser, batches, resume), then
    per epoch :meth:`train_epoch`, :meth:`validate` (model selection on the validation split: ``best.ckpt``) and
    :meth:`save` (``last.ckpt``), and at the end :meth:`test` (the selected model on ``eval.split``) and
    :meth:`report` (report.json, figures, artifacts). ``stop``: the stop-signal handlers the epochs run under (the
    caller restores them)."""

    def __init__(self, cfg: ExperimentConfig, fabric: Fabric, run_dir: Path, stop: _StopSignals) -> None:
        self.cfg, self.tc, self.fabric, self.run_dir, self.stop = cfg, cfg.trainer, fabric, run_dir, stop
        self.ckpt_dir = run_dir / "checkpoints"
        self.setup_group = _setup_group(fabric, cfg.trainer.setup_timeout_minutes)  # None with one process
        self.progress = Progress()
        self.last_loss: torch.Tensor | None = None  # of the last training step: never save non-finite weights
        self.epoch_seconds: list[float] = []  # training time of each epoch of this process (validation excluded)
        self.done = False

    # ------------------------------------------------------------------------------------------------- the run
    def fit(self, resume_path: Path | None, splits: DataSplits | None, data_dir: str | None) -> dict[str, Any]:
        """Set up, train epoch by epoch (validating, selecting, saving), then test the selected model and report."""
        self.setup(resume_path, splits, data_dir)
        self.done = self.progress.step >= self.total_steps or stopping.stopped_early(self.progress, self.tc)
        self.t_start = time.perf_counter() - self.progress.wall_time
        self.stop.install()  # SIGTERM, SIGHUP, SIGINT: recorded, acted on at the next step boundary
        while not self.done and self.progress.epoch < self.max_epochs:
            epoch_finished = self.train_epoch()
            p = self.progress
            periodic = epoch_finished and (p.epoch % self.tc.val_every == 0 or p.epoch == self.max_epochs)
            if periodic or self.done:  # also when max_steps ends training inside an epoch
                self.validate()
            self.save("last")
            signum = _agreed_signal(self.fabric, self.stop)
            if signum:  # received during the run's last step or a validation: `last` was just saved
                raise _interrupted(self.fabric, signum, p.step, self.run_dir)
        self.stop.restore()  # the final evaluation and report: signals act as they did before the loop
        # DDP averages the gradients, so every rank must end with the same weights; check before they are replaced
        in_sync = check_params_in_sync(self.fabric, self.model)
        test_split, test_metrics = self.test()
        return self.report(test_split, test_metrics, in_sync)

    # ------------------------------------------------------------------------------------------------ setup
    def setup(self, resume_path: Path | None, splits: DataSplits | None, data_dir: str | None) -> None:
        """Data, model (from the resumed checkpoint's weights when resuming), optimiser, batches and schedule, set
        up by Fabric; then the resumed state, or fresh per-rank random streams."""
        fabric, tc = self.fabric, self.tc
        fabric.seed_everything(tc.seed, verbose=False)  # same initial weights on every rank
        self.splits = self._build_data(splits, data_dir)
        t_build = time.perf_counter()
        model = self._build_model(resume_path)
        self.prepare_seconds = time.perf_counter() - t_build  # includes on_fit_start (e.g. caching frozen features)
        if tc.compile:  # compiles forward (the training step) in place: parameter names and checkpoints unchanged
            options = get_method(self.cfg.method).cpu_compile_options if fabric.device.type == "cpu" else {}
            model.compile(options=dict(options) or None)
        # frozen parameters: not stepped; the method's own lr multipliers under optim.lr_scale
        optimizer = make_optimizer(model.named_parameters(), self.cfg.optim, model.lr_scales())
        self.loader = self._make_loader()
        self.steps_per_epoch = len(self.loader)
        # with trainer.max_steps > 0 the run lasts exactly that many steps (trainer.epochs is then ignored)
        self.total_steps = tc.max_steps if tc.max_steps > 0 else tc.epochs * self.steps_per_epoch
        self.max_epochs = -(-self.total_steps // self.steps_per_epoch)
        self.scheduler = make_scheduler(optimizer, self.cfg.optim, self.total_steps, self.steps_per_epoch)
        if self.setup_group is not None:  # every rank prepared (data, caches, model) at its own pace: meet before
            self.setup_group.barrier()  # the first training collective (DDP's broadcast of the weights) starts
        self.model, self.optimizer = fabric.setup(model, optimizer)
        self.raw = _unwrap(self.model)
        self.average = make_average(fabric, self.raw, tc.ema_decay)  # trainer.ema_decay > 0: what is evaluated
        if resume_path is not None:
            self._resume(resume_path)
        else:
            fabric.seed_everything(tc.seed + fabric.global_rank, verbose=False)  # rank-specific exploration noise
        self.progress.total_steps = self.total_steps
        self.metric_name, self.mode = self.raw.selection_metric

    def _build_data(self, splits: DataSplits | None, data_dir: str | None) -> DataSplits:
        if splits is not None:
            return splits
        # rank 0 writes any render cache; the others then read it. Cache builds (renders, scenes, frozen features)
        # show bars on rank 0 on a terminal unless trainer.progress=false
        with _rank_zero_first(self.setup_group), progress_bars(self.tc.progress):
            return build_dataset(self.cfg.data.name, self.cfg.data, data_dir or self.cfg.data.data_dir)

    def _build_model(self, resume_path: Path | None) -> AttentionMethod:
        """The model; resuming: rebuilt from the checkpoint's weights where a method reads an artifact (darp), and
        every weight of the checkpoint loaded into it (or a one-line error naming the keys)."""
        resume_ckpt = load_checkpoint_file(resume_path) if resume_path is not None else None
        if resume_ckpt is not None:
            check_resumable(resume_ckpt, resume_path)
        with progress_bars(self.tc.progress):  # on_fit_start: e.g. the frozen-feature caches
            model = build_model(self.cfg, self.splits, resume_ckpt["model"] if resume_ckpt is not None else None)
        if resume_ckpt is not None:
            load_model_state(model, resume_ckpt["model"], resume_path)
        return model

    def _make_loader(self) -> BatchLoader:
        tc, fabric, train = self.tc, self.fabric, self.splits.train
        rank, world = fabric.global_rank, fabric.world_size
        loader = BatchLoader(
            train, tc.batch_size, True, tc.seed, rank, world, True, fabric.device, tc.sampler, tc.pk_instances
        )
        if len(loader) == 0:
            raise ValueError(
                f"trainer.batch_size={tc.batch_size} x {fabric.world_size} process(es) is larger than the training "
                f"split ({len(train)} images): no full batch to train on"
            )
        return loader

    def _state(self) -> dict[str, Any]:
        """What a checkpoint holds of the run besides its config, random streams and data shape (``ema``: the
        averaged weights, with ``trainer.ema_decay`` > 0)."""
        state = dict(model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, progress=self.progress)
        if self.average is not None:
            state[EMA_KEY] = self.average
        return state

    def _resume(self, resume_path: Path) -> None:
        """Model, optimiser, scheduler, progress and every rank's random streams from ``resume_path``; the run's
        ``config.yaml`` (resume overrides included) and ``metrics.csv`` (rows a killed run logged after this
        checkpoint are about to be logged again) brought to that point."""
        fabric, p, cfg = self.fabric, self.progress, self.cfg
        state = self._state()
        state.pop(EMA_KEY, None)  # loaded below from what is left: a checkpoint of a run without it has none
        rest = fabric.load(resume_path, state, strict=True)  # restores model, optimizer and scheduler in place
        resume_average(fabric, self.average, rest.get(EMA_KEY), resume_path)
        loaded = state["progress"]  # Fabric may hand back a copy (or a plain dict) rather than load in place
        p.load_state_dict(loaded if isinstance(loaded, dict) else loaded.state_dict())
        if fabric.global_rank == 0:
            write_text_nofollow(self.run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
            final = f"{cfg.eval.split}/" if cfg.eval.split != "val" else ""  # val rows at `step` precede it
            truncate_metrics_csv(self.run_dir / "logs" / "metrics.csv", p.step, final)
        ranks = rest.get("torch_rng_ranks")
        if ranks is not None and ranks.shape[0] == fabric.world_size:  # every rank continues its streams exactly
            torch.set_rng_state(ranks[fabric.global_rank].cpu().clone())
            cuda_ranks = rest.get("cuda_rng_ranks")
            if cuda_ranks is not None and fabric.device.type == "cuda":
                torch.cuda.set_rng_state(cuda_ranks[fabric.global_rank].cpu().clone(), fabric.device)
        elif fabric.global_rank == 0 and "torch_rng" in rest:  # another world size: rank 0 continues exactly
            torch.set_rng_state(rest["torch_rng"])
            if "cuda_rng" in rest and fabric.device.type == "cuda":
                torch.cuda.set_rng_state(rest["cuda_rng"], fabric.device)
        elif fabric.global_rank > 0:  # other ranks: fresh streams, distinct per rank and per resume point
            fabric.seed_everything(self.tc.seed + fabric.global_rank + 7919 * p.step, verbose=False)

    # ------------------------------------------------------------------------------------------------ training
    def train_epoch(self) -> bool:
        """The batches left of the current epoch (all of them, unless resumed mid-epoch or ended by ``max_steps``);
        returns whether the epoch finished. A stop signal ends it at a step boundary (:meth:`_stop_at_step`)."""
        p, tc, fabric = self.progress, self.tc, self.fabric
        t_epoch = time.perf_counter()
        self.loader.set_epoch(p.epoch, p.epoch_step)
        self.model.train()
        bar = tqdm(
            total=self.steps_per_epoch,
            initial=p.epoch_step,
            desc=f"epoch {p.epoch + 1}/{self.max_epochs}",
            disable=not tc.progress or fabric.global_rank != 0,
            dynamic_ncols=True,
            mininterval=0.5,
        )
        window = _Window(time.perf_counter())
        for images, targets in self.loader:
            out = self.training_step(images, targets)
            window.add(out)
            bar.update(1)
            if p.step % tc.log_every == 0:
                window = _Window(self._log_window(window, out, bar))
            if self._periodic_save_due():
                p.wall_time = time.perf_counter() - self.t_start
                self.save("last")
            if p.step >= self.total_steps:
                self.done = True
                break
            self._stop_at_step(bar)
        bar.close()
        self.epoch_seconds.append(round(time.perf_counter() - t_epoch, 3))
        finished = p.epoch_step >= self.steps_per_epoch
        if finished:
            p.epoch += 1
            p.epoch_step = 0
        p.wall_time = time.perf_counter() - self.t_start
        return finished

    def training_step(self, images: torch.Tensor, targets: torch.Tensor):
        """One optimiser step on a batch; returns the method's output (loss, terms, stats)."""
        self.raw.set_progress(self.progress.fraction)
        out = self.model(images, targets)
        if self.fabric.device.type == "cpu" and not torch.isfinite(out.loss):
            _diverged(out, self.progress.step)
        self.last_loss = out.loss.detach()
        self.optimizer.zero_grad(set_to_none=True)
        self.fabric.backward(out.loss)
        if self.cfg.optim.grad_clip > 0:
            self.fabric.clip_gradients(self.model, self.optimizer, max_norm=self.cfg.optim.grad_clip)
        self.optimizer.step()
        if self.average is not None:
            self.average.update()
        self.scheduler.step()
        self.progress.step += 1
        self.progress.epoch_step += 1
        return out

    def _log_window(self, window: _Window, out, bar) -> float:
        """The ``train/`` row of the last ``log_every`` steps: mean terms, images per second, learning rate; returns
        when the row was measured (the start of the next window)."""
        logged = {f"train/{k}": float(v) / window.count for k, v in window.sums.items()}
        if not math.isfinite(logged["train/loss"]):
            _diverged(out, self.progress.step)
        now = time.perf_counter()
        per_s = window.count * self.tc.batch_size * self.fabric.world_size / max(1e-9, now - window.since)
        logged["train/images_per_s"] = per_s
        logged["train/lr"] = self.scheduler.get_last_lr()[0]
        self.fabric.log_dict(logged, step=self.progress.step)
        bar.set_postfix(
            loss=f"{logged['train/loss']:.3f}",
            reward=f"{logged.get('train/reward', float('nan')):.3f}",
            img_s=f"{logged['train/images_per_s']:.0f}",
            refresh=False,
        )
        return now

    def _periodic_save_due(self) -> bool:
        every = self.tc.checkpoint_every
        return every > 0 and self.progress.step % every == 0

    def _stop_at_step(self, bar) -> None:
        """At a step boundary: on a stop signal (any rank's), ``last`` at this step (unless just saved), then out."""
        signum = _agreed_signal(self.fabric, self.stop)
        if not signum:
            return
        bar.close()
        if not self._periodic_save_due():
            self.progress.wall_time = time.perf_counter() - self.t_start
            self.save("last")
        raise _interrupted(self.fabric, signum, self.progress.step, self.run_dir)

    # ------------------------------------------------------------------------------------- selection, saving
    def validate(self) -> dict[str, float]:
        """The validation metrics, logged; a better selection metric saves ``best``; an early stop ends training."""
        p, fabric, tc = self.progress, self.fabric, self.tc
        with self.average.swapped_in() if self.average is not None else contextlib.nullcontext():
            metrics = evaluate(
                fabric, self.model, self.splits.val, tc.eval_batch_size, 0, self.cfg.eval.seed, tc.progress
            )
        fabric.log_dict({f"val/{k}": v for k, v in metrics.items()}, step=p.step)
        value = metrics[self.metric_name]
        better = (lambda a, b: a > b) if self.mode == "max" else (lambda a, b: a < b)
        stop = stopping.update(p, value, self.mode, tc)  # the same on every rank: every rank has the same metrics
        if p.best_value is None or better(value, p.best_value):  # (counted first: best.ckpt holds this count)
            p.best_value, p.best_epoch, p.best_step = value, p.epoch, p.step
            self.save("best")
        self.done = self.done or stop
        if fabric.global_rank == 0:
            fabric.print(
                f"epoch {p.epoch}: val {self.metric_name} {value:.2f} (best {p.best_value:.2f} "
                f"at epoch {p.best_epoch}), {p.wall_time:.0f}s"
            )
            if stop:
                fabric.print(stopping.describe(p, tc, self.metric_name))
        return metrics

    def save(self, name: str) -> None:
        """``checkpoints/<name>.ckpt``: model, optimiser, scheduler, progress, config, every rank's random streams
        (rank r's in row r, so a resume continues them all) and the data's shape. Never non-finite weights."""
        fabric = self.fabric
        if self.last_loss is not None and not torch.isfinite(self.last_loss):
            raise TrainingDiverged(
                f"non-finite loss before step {self.progress.step}; not saving {name}.ckpt, the previous one is kept"
            )
        rng = {"torch_rng": torch.get_rng_state(), "torch_rng_ranks": _gather_rows(fabric, torch.get_rng_state())}
        if fabric.device.type == "cuda":
            cuda_rng = torch.cuda.get_rng_state(fabric.device)
            rng.update(cuda_rng=cuda_rng, cuda_rng_ranks=_gather_rows(fabric, cuda_rng))
        # the data's facts travel with the weights (an image-text vocabulary's words, a folder's class names)
        info = DataInfo(self.splits.image_shape, self.splits.num_classes, dict(self.splits.meta))
        data_info = info.record(strict=False)
        fabric.save(
            self.ckpt_dir / f"{name}.ckpt",
            {**self._state(), "config": to_dict(self.cfg), **rng, "data_info": data_info},
        )

    # ------------------------------------------------------------------------------------------- test, report
    def test(self):
        """The model selected on validation (``best.ckpt``, with the schedules of that point), evaluated once on
        ``eval.split``; returns that split and its metrics (logged)."""
        best_path = self.ckpt_dir / "best.ckpt"
        if best_path.is_file():  # all of its weights (averaged, with trainer.ema_decay), or an error
            load_model_state(self.raw, evaluation_weights(load_checkpoint_file(best_path)), best_path)
            self.raw.set_progress(min(1.0, self.progress.best_step / max(1, self.total_steps)))
        elif self.average is not None:  # never validated: the last weights, averaged
            averaged = self.average.state_dict()["weights"]  # under every name of a shared parameter
            load_model_state(self.raw, {**self.raw.state_dict(), **averaged}, "the weight average")
        ec, tc = self.cfg.eval, self.tc
        split = self.splits.test if ec.split == "test" else self.splits.val
        metrics = evaluate(self.fabric, self.model, split, tc.eval_batch_size, ec.mc_samples, ec.seed, tc.progress)
        self.fabric.log_dict({f"{ec.split}/{k}": v for k, v in metrics.items()}, step=self.progress.step)
        return split, metrics

    def report(self, test_split, test_metrics: dict[str, float], in_sync: bool) -> dict[str, Any]:
        """The final report; rank 0 adds the figures and artifacts and writes ``report.json``. The loggers close."""
        p, cfg, fabric = self.progress, self.cfg, self.fabric
        report = {
            "run_dir": str(self.run_dir),
            "method": cfg.method,
            "dataset": cfg.data.name,
            "units": METRIC_UNITS,
            "epochs": p.epoch,
            "steps": p.step,
            "train_seconds": round(p.wall_time, 1),
            "prepare_seconds": round(self.prepare_seconds, 2),
            "epoch_seconds": self.epoch_seconds,
            "world_size": fabric.world_size,
            "params_in_sync": in_sync,
            "best_epoch": p.best_epoch,
            f"best_val_{self.metric_name}": p.best_value,
            **stopping.summary(p, self.tc),  # early_stopped, early_stop_epoch
            cfg.eval.split: test_metrics,
        }
        if fabric.global_rank == 0:
            refuse_links(self.run_dir)  # figures/ and report.json: never written through a link planted meanwhile
            figures = self._figures(test_split)
            report["figures"] = [str(path) for path in figures]
            self.raw.eval()
            report["artifacts"] = [str(path) for path in self.raw.export(self.splits, self.run_dir)]
            refuse_links(self.run_dir)
            write_text_nofollow(self.run_dir / "report.json", json.dumps(report, indent=2))
            log_figures(fabric.loggers, figures, p.step)  # TensorBoard (and W&B) get the figures, the config
            log_hparams(fabric.loggers, to_dict(cfg), final_metrics(report, cfg.eval.split, self.metric_name), p.step)
        if self.setup_group is not None:  # the others wait for rank 0's figures and artifacts (an export: minutes)
            self.setup_group.barrier()
        for logger in fabric.loggers:
            logger.finalize("success")
        return report

    def _figures(self, split) -> list[Path]:
        """The attention figures of the first ``eval.viz_images`` images of ``split`` (none for a method that draws
        none)."""
        ec = self.cfg.eval
        if ec.viz_images <= 0:
            return []
        gen = torch.Generator(device=self.fabric.device).manual_seed(ec.seed)
        self.raw.eval()
        folder = self.run_dir / "figures"
        try:
            return list(self.raw.visualize_split(split, folder, ec.viz_images, self.tc.eval_batch_size, generator=gen))
        except NotImplementedError:
            return []
