"""The generic training and evaluation loop, on Lightning Fabric.

Fabric owns devices, the distributed strategy, precision, checkpoint I/O (through
:class:`~rlattention.engine.checkpoint.AtomicCheckpointIO`) and the loggers (CSV + TensorBoard); this module
owns only what is specific to us: the method registry, model selection on the validation split, resumable
progress and the final report.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import datetime
import json
import math
import os
import re
import shlex
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.fabric import Fabric
from lightning.fabric.loggers import CSVLogger, TensorBoardLogger
from torch import nn
from tqdm.auto import tqdm

from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.registry import build_dataset, resolve_data_dir
from rlattention.engine.checkpoint import (
    AtomicCheckpointIO,
    check_resumable,
    load_checkpoint_file,
    load_model_state,
)
from rlattention.engine.config import ExperimentConfig, OptimConfig, from_dict, to_dict
from rlattention.engine.loader import BatchLoader
from rlattention.engine.method import AttentionMethod, DataInfo
from rlattention.engine.registry import get_method
from rlattention.engine.rundir import (
    RunFolderError,
    check_not_busy,
    check_run_name,
    choose_run_dir,
    claim_run_dir,
    find_run_dir,
    refuse_links,
    resolve_resume,
    write_text_nofollow,
)
from rlattention.progress import progress_bar, progress_bars


class TrainingDiverged(RuntimeError):
    """A non-finite loss: the run stops, the last good checkpoint is kept."""


#: the signals that stop a run cleanly (:class:`TrainingInterrupted`): the first one received ends training at the
#: next step boundary, with a resumable ``checkpoints/last.ckpt``
STOP_SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT")


class TrainingInterrupted(BaseException):
    """SIGTERM, SIGHUP or SIGINT while :func:`fit` trained: training stopped at a step boundary and
    ``checkpoint`` (the run's ``checkpoints/last.ckpt``) holds the run at ``step``; ``rlattention fit --resume
    run_dir`` continues it exactly. A ``BaseException``, as ``KeyboardInterrupt`` is, so that an ``except
    Exception`` meant for failed runs does not swallow a request to stop. ``exit_code``: 128 + the signal's
    number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP)."""

    def __init__(self, signum: int, step: int, checkpoint: str | Path, run_dir: str | Path) -> None:
        self.signum = int(signum)
        self.signal_name = signal.Signals(self.signum).name
        self.step, self.checkpoint, self.run_dir = int(step), Path(checkpoint), Path(run_dir)
        super().__init__(
            f"interrupted by {self.signal_name} at step {self.step}; resumable checkpoint {self.checkpoint}; "
            f"continue with: rlattention fit --resume {shlex.quote(str(self.run_dir))}"
        )

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _StopSignals:
    """While the training loop runs: handlers for :data:`STOP_SIGNALS` that only record the first signal received
    (:attr:`signum`); the loop reads it at each step boundary. Installed from the main thread only (elsewhere
    ``signal.signal`` cannot be called: nothing is installed), never over a signal that is ignored (a run under
    ``nohup`` keeps ignoring SIGHUP) or whose handler was not set from Python (it could not be put back); the
    previous handlers are put back by :meth:`restore` (idempotent). A second signal is recorded nowhere: it cannot
    interrupt the checkpoint being saved (SIGKILL still ends the process at once; the atomic write then keeps the
    previous checkpoint)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _record(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for name in STOP_SIGNALS:
            sig = getattr(signal, name, None)  # no SIGHUP on Windows
            if sig is None:
                continue
            previous = signal.getsignal(sig)
            if previous is None or previous == signal.SIG_IGN:
                continue
            try:
                signal.signal(sig, self._record)
            except (ValueError, OSError):  # not the main interpreter, ...
                continue
            self._previous[sig] = previous

    def restore(self) -> None:
        while self._previous:
            sig, previous = self._previous.popitem()
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, previous)


def _agreed_signal(fabric: Fabric, stop: _StopSignals) -> int:
    """The signal the run stops for at this step boundary, 0 for none: the one this process received; with several
    processes the largest number any rank received, so that every rank stops at the same step (a collective:
    every rank calls it at every boundary; none with one process)."""
    mine = stop.signum or 0
    if fabric.world_size == 1:
        return mine
    agreed = fabric.all_reduce(torch.tensor([mine], dtype=torch.int64, device=fabric.device), reduce_op="max")
    return int(agreed.item())


def _interrupted(fabric: Fabric, signum: int, step: int, run_dir: Path) -> TrainingInterrupted:
    """The loggers flushed and closed (metrics.csv then holds every row up to ``step``, as a resume expects), and
    the exception to raise; ``checkpoints/last.ckpt`` already holds ``step``."""
    for logger in fabric.loggers:
        logger.finalize("interrupted")
    return TrainingInterrupted(signum, step, run_dir / "checkpoints" / "last.ckpt", run_dir)


class CollectiveTimeout(RuntimeError):
    """A multi-process run failed because a rank stalled or died: a collective waited longer than its timeout
    (``key``: ``trainer.collective_timeout_minutes``, or ``trainer.setup_timeout_minutes`` for the setup waits of
    :class:`_SetupGroup`) for the other ranks, or lost its connection to a rank whose process ended. The message is
    one line naming this process's rank and the world size, the timeout, the key that sets it and, when known, the
    ranks that did not arrive. The other ranks are not coming: end the process without meeting them again (the
    CLI prints the line and exits with ``exit_code``, 4, skipping the barriers of :func:`leave_process_group`)."""

    exit_code = 4

    def __init__(
        self,
        rank: int,
        world_size: int,
        minutes: float,
        key: str,
        what: str = "a collective",
        absent: Iterable[int] | None = None,
        lost: bool = False,
    ) -> None:
        self.rank, self.world_size, self.minutes, self.key = int(rank), int(world_size), float(minutes), key
        self.absent, self.lost = sorted(absent or []), lost
        if lost:
            head = f"{what} lost its connection to another rank"
        else:
            head = f"{what} waited more than {self.minutes:g} min for the other ranks ({key})"
        how = "ended or died" if lost else "stalled or died"
        if len(self.absent) == 1:
            tail = f"rank {self.absent[0]} did not arrive: it {how} (see its own output)"
        elif self.absent:
            tail = f"ranks {', '.join(map(str, self.absent))} did not arrive: they {how} (see their own output)"
        else:
            tail = f"a rank {how} (see its own output)"
        super().__init__(f"rank {self.rank} of {self.world_size}: {head}; {tail}")


# torch's words for a collective that waited too long (gloo: "Timed out waiting 600000ms for recv operation to
# complete" from the operation that timed out, "Application timeout caused pair closure" from the others of the
# process; NCCL's watchdog: "... ran for 600010 milliseconds before timing out"; monitored barriers: "failed to
# pass monitoredBarrier in ... ms") or that lost its peer (gloo: "Connection closed by peer [addr]:port. This is
# typically caused by a remote worker crashing"), and the marks of an error of torch.distributed at all
_TIMED_OUT = re.compile(r"tim(e|ed|ing) ?out|monitoredBarrier", re.IGNORECASE)
_LOST_PEER = re.compile(r"connection (closed|reset) by peer|broken pipe", re.IGNORECASE)
_DISTRIBUTED = re.compile(
    r"gloo|nccl|c10d|processgroup|monitoredbarrier|watchdog|(send|recv) operation|pair closure|remote worker",
    re.IGNORECASE,
)


def _collective_failure(
    error: BaseException, minutes: float, key: str, what: str = "a collective", absent: list[int] | None = None
) -> CollectiveTimeout | None:
    """``error`` as a :class:`CollectiveTimeout` when it is torch.distributed's timeout (or lost peer) of a collective
    in a process group of several ranks; None for any other error (raised as it is)."""
    if isinstance(error, CollectiveTimeout):
        return error
    import torch.distributed as dist

    if not isinstance(error, RuntimeError) or not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() <= 1:
        return None
    text = str(error)
    if not (isinstance(error, getattr(dist, "DistError", ())) or _DISTRIBUTED.search(text)):
        return None
    if _TIMED_OUT.search(text):
        lost = False
    elif _LOST_PEER.search(text):
        lost = True
    else:
        return None
    return CollectiveTimeout(dist.get_rank(), dist.get_world_size(), minutes, key, what, absent, lost)


@contextlib.contextmanager
def _collectives_fail_clearly(fabric: Fabric, minutes: float):
    """Inside: torch's error for a collective of the training group (``fabric``'s, ``minutes`` its timeout) that
    timed out or lost a rank is raised as a :class:`CollectiveTimeout` (the loggers flushed and closed first, as
    the process is about to end without meeting the other ranks again); other errors pass unchanged."""
    try:
        yield
    except RuntimeError as e:
        failure = _collective_failure(e, minutes, "trainer.collective_timeout_minutes")
        if failure is None:
            raise
        for logger in fabric.loggers:
            with contextlib.suppress(Exception):
                logger.finalize("failed")
        if failure is e:
            raise
        raise failure from e


class _SetupGroup:
    """A gloo process group of every rank whose timeout is ``trainer.setup_timeout_minutes``, for the waits that
    legitimately outlast a collective timeout: the other ranks while rank 0 builds the data and caches first
    (:func:`_rank_zero_first`), ranks that prepare their models (caches of frozen features...) at their own pace
    before the first training collective, the others while rank 0 writes figures, artifacts and the report. Gloo
    also when the training group is NCCL. Each rank records its arrival at a barrier on the rendezvous store, so
    that a rank that times out can name the ranks that did not arrive (``monitored_barrier`` names them on rank 0
    only, logs extra lines on stderr, and says "failed to pass" also of a rank whose process ended)."""

    def __init__(self, minutes: float) -> None:
        import torch.distributed as dist

        self.minutes = float(minutes)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(minutes=self.minutes))
        self._store = dist.distributed_c10d._get_default_store()
        self._prefix = f"rlattention/setup/{self.group.group_name}"  # the same on every rank, new for each group
        self._calls = 0

    def barrier(self) -> None:
        """Wait for every rank at most ``minutes``; a rank that does not arrive in time, or whose process ended, is a
        :class:`CollectiveTimeout` naming ``trainer.setup_timeout_minutes`` and the ranks that did not arrive."""
        import torch.distributed as dist

        self._calls += 1  # every rank makes the same calls: the same keys
        key = f"{self._prefix}/{self._calls}/"
        with contextlib.suppress(Exception):  # the record only names the absent ranks in a message
            self._store.set(key + str(self.rank), "1")
        try:  # a barrier: the sum of one CPU number (no device involved, also when the training group is NCCL)
            dist.all_reduce(torch.zeros(1), group=self.group)
        except RuntimeError as e:
            absent = None
            with contextlib.suppress(Exception):  # rank 0, the store's host, may be the one that died
                absent = [q for q in range(self.world_size) if not self._store.check([key + str(q)])]
            failure = _collective_failure(e, self.minutes, "trainer.setup_timeout_minutes", "a setup barrier", absent)
            if failure is None:
                raise
            raise failure from e


_SETUP_GROUPS: weakref.WeakKeyDictionary[Fabric, _SetupGroup] = weakref.WeakKeyDictionary()


def _setup_group(fabric: Fabric | None, minutes: float) -> _SetupGroup | None:
    """The :class:`_SetupGroup` of ``fabric``'s run, made at the first call (every rank makes it at the same point:
    right after ``fabric.launch()``) and kept for the run; None with one process (nothing to wait for)."""
    import torch.distributed as dist

    if fabric is None or fabric.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size() <= 1:
        return None
    group = _SETUP_GROUPS.get(fabric)
    if group is None:
        group = _SETUP_GROUPS[fabric] = _SetupGroup(minutes)
    return group


@contextlib.contextmanager
def _rank_zero_first(setup: _SetupGroup | None):
    """As ``fabric.rank_zero_first()``: rank 0 runs the block first (it writes any cache), then the other ranks (they
    read it), waiting on the setup group (``trainer.setup_timeout_minutes``), not the collective timeout. One
    process: the block alone. An error in rank 0's block skips its barrier: the others learn it when its process
    ends (a :class:`CollectiveTimeout` saying that a rank ended) rather than repeat the failed work."""
    if setup is not None and setup.rank > 0:
        setup.barrier()
    yield
    if setup is not None and setup.rank == 0:
        setup.barrier()


@dataclass
class Progress:
    epoch: int = 0  # epochs completed
    epoch_step: int = 0  # batches done in the current epoch (mid-epoch checkpoints)
    step: int = 0  # optimiser steps done
    best_value: float | None = None
    best_epoch: int = -1
    best_step: int = 0
    total_steps: int = 0  # optimiser steps the run is planned for (the schedules' horizon)
    wall_time: float = 0.0  # seconds of training so far, across resumes

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / max(1, self.total_steps))

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, d: dict) -> None:
        self.__dict__.update(d)


def param_groups(named: Iterable[tuple[str, nn.Parameter]], cfg: OptimConfig) -> list[dict]:
    """Parameter groups of ``optim.lr_scale``: each parameter at ``lr`` times the multiplier of the longest
    prefix of its name (``locator`` matches ``locator.fc.weight``, not ``locators.x``), 1 without one."""
    named = list(named)
    scales = dict(cfg.lr_scale or {})
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


def make_optimizer(params, cfg: OptimConfig) -> torch.optim.Optimizer:
    """The optimiser of ``optim``; ``params``: parameters, or ``(name, parameter)`` pairs (needed by
    ``optim.lr_scale``)."""
    params = list(params)
    named = bool(params) and isinstance(params[0], tuple)
    if cfg.lr_scale and not named:
        raise ValueError("optim.lr_scale needs named parameters (pass model.named_parameters())")
    if named:
        params = param_groups(params, cfg)
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


def _unwrap(model) -> AttentionMethod:
    return model.module if hasattr(model, "module") and isinstance(model.module, AttentionMethod) else model


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
        try:
            probe.unlink(missing_ok=True)  # also after a partial write (full disk)
        except OSError:
            pass


def _csv_logger(run_dir: Path, resume: bool) -> CSVLogger:
    """Lightning's CSV logger, writing every row as it is logged (its default keeps up to 100 in memory, which a
    killed run loses); on resume it appends to the run's metrics.csv instead of replacing it."""
    logger = CSVLogger(run_dir, name="logs", version="", flush_logs_every_n_steps=1)
    csv_path = run_dir / "logs" / "metrics.csv"
    if resume and csv_path.is_file():
        aside = run_dir / ".metrics.csv.previous"
        os.replace(csv_path, aside)
        writer = logger.experiment  # created now, while there is no metrics.csv for it to delete
        os.replace(aside, csv_path)
        with open(csv_path, newline="") as f:
            header = next(csv.reader(f), [])
        writer.metrics_keys = sorted(header)  # append under the existing columns
    return logger


def _gather_rows(fabric: Fabric, row: torch.Tensor) -> torch.Tensor:
    """``(world_size, *row.shape)`` on the CPU: every rank's ``row`` (e.g. its RNG state), rank r in row r.
    Collective: every rank calls it at the same point."""
    if fabric.world_size == 1:
        return row[None].clone()
    return fabric.all_gather(row.to(fabric.device)).cpu()


def build_model(cfg: ExperimentConfig, splits: Any, state: dict | None = None) -> AttentionMethod:
    """The method of ``cfg`` built for ``splits`` as :func:`fit` builds it (``on_fit_start`` called); the caller
    seeds the random streams first. ``state``: the weights of a checkpoint about to be loaded into it (see
    :meth:`AttentionMethod.from_checkpoint`)."""
    info = DataInfo(splits.image_shape, splits.num_classes, dict(splits.meta))
    method = get_method(cfg.method)
    model = method.from_config(cfg.model, info) if state is None else method.from_checkpoint(cfg.model, info, state)
    model.on_fit_start(splits)
    return model


_LEAVE_CALLS = 0


def leave_process_group(exit_code: int | None = None, timeout: float = 300.0) -> None:
    """End a multi-process job in order; with ``exit_code``, end this process too, skipping interpreter teardown.
    No-op unless a process group of several ranks is initialised.

    Tearing a gloo process group down races its worker threads: a worker still dropping the last collective's
    tensors needs the GIL, while the thread destroying the group holds it and waits for that worker. Inside a
    run the two deadlock (seen: a rank hung freeing the DDP reducer at the end of ``fit``); at interpreter exit
    Python ends such a worker instead, the likely cause of the ranks that aborted after their work was done
    ("terminate called without an active exception", SIGABRT), failing runs that succeeded. So a finished job
    never tears the group down: the ranks meet, every rank but 0 reports on the rendezvous store, rank 0 (the
    store's host under Lightning's launchers) waits for those reports, and with ``exit_code`` each rank flushes
    its output and leaves with ``os._exit`` (files, checkpoints and loggers are closed before this is called).
    Without ``exit_code`` the caller keeps running with the group in place (rank 0's wait also gives its workers
    time to finish)."""
    global _LEAVE_CALLS
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return
    _LEAVE_CALLS += 1
    key = f"rlattention/left/{_LEAVE_CALLS}"  # every rank makes the same calls: the same keys
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if rank != 0:
        store.add(key, 1)
    else:
        deadline = time.monotonic() + timeout
        while store.add(key, 0) < world - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    if exit_code is not None:
        _exit_now(exit_code)


def leave_after_collective_failure(exit_code: int) -> None:
    """After a :class:`CollectiveTimeout`: end this process at once with ``exit_code`` (output flushed), without the
    barriers of :func:`leave_process_group` (the other ranks are not coming: they would only wait again) and without
    tearing the process group down (it can hang on the failed collective). No-op unless a process group of several
    ranks is initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        _exit_now(exit_code)


def _exit_now(exit_code: int) -> None:
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(exit_code)


def truncate_metrics_csv(path: Path, step: int, final_prefix: str = "") -> int:
    """Drop the rows of ``path`` that a run killed after its checkpoint at ``step`` logged after that checkpoint,
    and that the resumed run logs again: every row of a later step, and the final evaluation's rows (keys starting
    with ``final_prefix``, e.g. ``test/``) at ``step`` itself. Atomic. Returns how many rows were dropped; a
    missing file drops none."""
    if not path.is_file():
        return 0
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames or [], list(reader)

    def logged_after(row: dict) -> bool:
        try:
            at = int(float(row.get("step") or -1))
        except ValueError:  # not a number: keep it, it is not ours to judge
            return False
        final = bool(final_prefix) and any(k.startswith(final_prefix) and v not in ("", None) for k, v in row.items())
        return at > step or (at == step and final)

    kept = [r for r in rows if not logged_after(r)]
    if len(kept) == len(rows):
        return 0
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(kept)
    os.replace(tmp, path)
    return len(rows) - len(kept)


def _strategy(name: str, devices: Any, timeout_minutes: float = 10.0):
    """``ddp`` (also ``auto`` with several devices outside interactive sessions, where Lightning picks ``ddp``
    too): Lightning's DDP with ``find_unused_parameters=True``. Some methods have trainable parameters that a step
    leaves without a gradient (e.g. the ``w_mean`` head of dcpg's policies, which only ``pg: continuous`` uses),
    which plain DDP rejects at the next step. ``ddp_find_unused_parameters_false``: plain DDP (a little faster
    where every step uses every parameter). The other names of Lightning's ``ddp`` family (``ddp_spawn``,
    ``ddp_fork``, ...) are built as Lightning builds them. Every DDP strategy gets ``timeout_minutes``
    (``trainer.collective_timeout_minutes``) as its process group's timeout: a collective that waits longer for a
    stalled rank raises instead of hanging. Other names go to Lightning as they are."""
    from lightning.fabric.strategies import STRATEGY_REGISTRY, DDPStrategy

    timeout = datetime.timedelta(minutes=timeout_minutes)
    interactive = hasattr(sys, "ps1") or bool(sys.flags.interactive)
    if name == "ddp" or (name == "auto" and isinstance(devices, int) and devices > 1 and not interactive):
        return DDPStrategy(find_unused_parameters=True, timeout=timeout)
    if name == "ddp_find_unused_parameters_false":
        return DDPStrategy(find_unused_parameters=False, timeout=timeout)
    entry = STRATEGY_REGISTRY[name] if isinstance(name, str) and name in STRATEGY_REGISTRY else None
    if entry is not None and issubclass(entry["strategy"], DDPStrategy):
        return entry["strategy"](**entry["init_params"], timeout=timeout)
    return name


def _make_fabric(cfg: ExperimentConfig, run_dir: Path | None, resume: bool = False) -> Fabric:
    tc = cfg.trainer
    loggers = []
    if run_dir is not None:
        loggers = [_csv_logger(run_dir, resume), TensorBoardLogger(run_dir, name="tb", version="")]
    return Fabric(
        accelerator=tc.accelerator,
        devices=tc.devices,
        strategy=_strategy(tc.strategy, tc.devices, tc.collective_timeout_minutes),
        precision=tc.precision,
        plugins=[AtomicCheckpointIO()],
        loggers=loggers,
    )


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


def _any_rank(fabric: Fabric, flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one (a collective: every rank must call it)."""
    flags = fabric.all_gather(torch.tensor([float(flag)], device=fabric.device))
    return bool(flags.sum() > 0)


def _gather_in_order(fabric: Fabric, local: list[torch.Tensor], ranges: list[tuple[int, int]], n: int) -> torch.Tensor:
    """Every rank's scores of its ranges (``ranges[rank::world_size]``) -> the scores of all ``n`` items in item
    order, on every rank. Shards are zero-padded to one length for ``all_gather``; the padding is dropped."""
    W, r = fabric.world_size, fabric.global_rank
    counts = [sum(b - a for a, b in ranges[q::W]) for q in range(W)]
    # rank 0 always has a batch; a rank without one learns the shape of a score from it
    tail = fabric.broadcast(tuple(local[0].shape[1:]) if r == 0 else None, src=0)
    padded = torch.zeros((max(counts), *tail), dtype=torch.float32)
    if local:
        mine = torch.cat(local)
        padded[: len(mine)] = mine
    gathered = fabric.all_gather(padded.to(fabric.device)).cpu()  # (W, max(counts), ...)
    full = torch.empty((n, *tail), dtype=torch.float32)
    for q in range(W):
        if counts[q]:
            index = torch.cat([torch.arange(a, b) for a, b in ranges[q::W]])
            full[index] = gathered[q, : counts[q]]
    return full


def _sync_buffers(fabric: Fabric, model: torch.nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics...), as DDP does before each training forward:
    the last training step updated them from each rank's own batch. Rank 0's are what the checkpoint holds."""
    if fabric.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        for b in model.buffers():
            torch.distributed.broadcast(b.data, src=0)


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


def params_fingerprint(model: torch.nn.Module) -> tuple[list[str], torch.Tensor]:
    """Names of the parameters and ``(P, 2)`` float64 [sum, sum of squares] of each: a cheap fingerprint."""
    names, rows = [], []
    for name, p in _unwrap(model).named_parameters():
        d = p.detach().double()
        names.append(name)
        rows.append(torch.stack((d.sum(), d.square().sum())))
    return names, torch.stack(rows) if rows else torch.zeros(0, 2, dtype=torch.float64)


def check_params_in_sync(fabric: Fabric, model: torch.nn.Module) -> bool:
    """Whether every rank holds the same parameters (fingerprints gathered from all ranks; a collective).
    Warns, naming the first parameter that differs, when they do not."""
    if fabric.world_size == 1:
        return True
    names, local = params_fingerprint(model)
    every = fabric.all_gather(local.to(fabric.device)).cpu()  # (W, P, 2)
    same = (every == every[:1]) | (every.isnan() & every[:1].isnan())
    differ = (~same).flatten(2).any(-1).any(0)  # (P,)
    if not bool(differ.any()):
        return True
    if fabric.global_rank == 0:
        k = int(differ.nonzero()[0])
        ranks = [q for q in range(fabric.world_size) if not bool(same[q, k].all())]
        warnings.warn(
            f"parameters differ across the {fabric.world_size} processes after training: first {names[k]!r} "
            f"(sum, sum of squares on rank 0 {every[0, k].tolist()}, differing on rank(s) {ranks}); "
            f"{int(differ.sum())} of {len(names)} parameters differ. The checkpoint holds rank 0's weights.",
            stacklevel=2,
        )
    return False


def _resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given; a folder: ``checkpoints/last.ckpt`` of the run folder it is (or is inside)."""
    p = Path(path)
    if not p.is_dir():
        return p
    run = find_run_dir(p)
    return (p if run is None or run == p.absolute() else run) / "checkpoints" / "last.ckpt"


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


def _fit_launched(
    cfg: ExperimentConfig,
    fabric: Fabric,
    run_dir: Path,
    name: str,
    resume_path: Path | None,
    splits: DataSplits | None,
    data_dir: str | None,
) -> dict[str, Any]:
    """The rest of :func:`fit` once ``fabric`` is launched: the run folder chosen, created and locked by rank 0,
    then :func:`_train`."""
    tc = cfg.trainer
    run_dir = Path(fabric.broadcast(str(run_dir)))  # rank 0's folder (a default name holds rank 0's time)
    lock, failure = None, None
    if fabric.global_rank == 0:  # rank 0 creates, locks and guards the folder; the others wait for its word
        try:
            fresh = resume_path is None
            lock = claim_run_dir(run_dir, fresh=fresh, overwrite=fresh and tc.overwrite, make=_check_writable)
            if fresh and run_dir.name != name:
                fabric.print(
                    f"run folder {run_dir.with_name(name)} is already used: this run writes to {run_dir} "
                    "(trainer.overwrite=true / --overwrite starts in the old name, keeping the old run aside)"
                )
            if fresh:  # a resume rewrites it once its checkpoint is loaded: a failed resume changes nothing
                write_text_nofollow(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
        except Exception as e:
            if lock is not None:
                lock.release()
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
        return _train(cfg, fabric, run_dir, resume_path, splits, data_dir, stop)
    finally:
        stop.restore()  # the handlers the process had before (also after an error)
        if lock is not None:
            lock.release()


def _train(
    cfg: ExperimentConfig,
    fabric: Fabric,
    run_dir: Path,
    resume_path: Path | None,
    splits: DataSplits | None,
    data_dir: str | None,
    stop: _StopSignals,
) -> dict[str, Any]:
    """The body of :func:`fit` once the run folder is chosen, locked and holds ``config.yaml``; ``stop``: the
    signal handlers installed for the training loop (the caller restores them)."""
    tc = cfg.trainer
    setup = _setup_group(fabric, tc.setup_timeout_minutes)  # None with one process
    fabric.seed_everything(tc.seed, verbose=False)  # same initial weights on every rank
    if splits is None:
        # rank 0 writes any render cache; the others then read it. Cache builds (renders, scenes, frozen features)
        # show bars on rank 0 on a terminal unless trainer.progress=false
        with _rank_zero_first(setup), progress_bars(tc.progress):
            splits = build_dataset(cfg.data.name, cfg.data, data_dir or cfg.data.data_dir)
    method_cls = get_method(cfg.method)
    # resuming: the model is rebuilt from the checkpoint's weights where a method reads an artifact (darp)
    t_build = time.perf_counter()
    resume_ckpt = load_checkpoint_file(resume_path) if resume_path is not None else None
    if resume_ckpt is not None:
        check_resumable(resume_ckpt, resume_path)
    with progress_bars(tc.progress):  # on_fit_start: e.g. the frozen-feature caches
        model = build_model(cfg, splits, resume_ckpt["model"] if resume_ckpt is not None else None)
    if resume_ckpt is not None:  # every weight of the checkpoint fits, or a one-line error naming the keys
        load_model_state(model, resume_ckpt["model"], resume_path)
    del resume_ckpt
    prepare_seconds = time.perf_counter() - t_build  # includes on_fit_start (e.g. caching frozen features)
    if tc.compile:  # compiles forward (the training step) in place: parameter names and checkpoints are unchanged
        options = method_cls.cpu_compile_options if fabric.device.type == "cpu" else {}
        model.compile(options=dict(options) or None)
    optimizer = make_optimizer(model.named_parameters(), cfg.optim)  # frozen parameters get no gradient: not stepped
    loader = BatchLoader(
        splits.train,
        tc.batch_size,
        True,
        tc.seed,
        fabric.global_rank,
        fabric.world_size,
        True,
        fabric.device,
        sampler=tc.sampler,
        instances=tc.pk_instances,
    )
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise ValueError(
            f"trainer.batch_size={tc.batch_size} x {fabric.world_size} process(es) is larger than the training split "
            f"({len(splits.train)} images): no full batch to train on"
        )
    # with trainer.max_steps > 0 the run lasts exactly that many steps (trainer.epochs is then ignored)
    total_steps = tc.max_steps if tc.max_steps > 0 else tc.epochs * steps_per_epoch
    max_epochs = -(-total_steps // steps_per_epoch)
    scheduler = make_scheduler(optimizer, cfg.optim, total_steps, steps_per_epoch)
    if setup is not None:  # every rank prepared (data, caches, model) at its own pace: meet before the first
        setup.barrier()  # training collective (DDP's broadcast of the weights in setup) starts its timeout
    model, optimizer = fabric.setup(model, optimizer)
    raw = _unwrap(model)
    progress = Progress()
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "progress": progress}
    if resume_path is not None:
        rest = fabric.load(resume_path, state, strict=True)  # restores model, optimizer and scheduler in place
        loaded = state["progress"]  # Fabric may hand back a copy (or a plain dict) rather than load in place
        progress.load_state_dict(loaded if isinstance(loaded, dict) else loaded.state_dict())
        state["progress"] = progress
        if fabric.global_rank == 0:  # the config of the run from now on (resume overrides included)
            write_text_nofollow(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
        if fabric.global_rank == 0:  # rows a killed run logged after this checkpoint are about to be logged again
            final = f"{cfg.eval.split}/" if cfg.eval.split != "val" else ""  # val rows at `step` precede it
            truncate_metrics_csv(run_dir / "logs" / "metrics.csv", progress.step, final)
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
            fabric.seed_everything(tc.seed + fabric.global_rank + 7919 * progress.step, verbose=False)
    else:
        fabric.seed_everything(tc.seed + fabric.global_rank, verbose=False)  # rank-specific exploration noise
    progress.total_steps = total_steps

    metric_name, mode = raw.selection_metric
    better = (lambda a, b: a > b) if mode == "max" else (lambda a, b: a < b)
    ckpt_dir = run_dir / "checkpoints"

    last_loss: torch.Tensor | None = None

    def save(name: str) -> None:
        if last_loss is not None and not torch.isfinite(last_loss):  # never write non-finite weights
            raise TrainingDiverged(
                f"non-finite loss before step {progress.step}; not saving {name}.ckpt, the previous one is kept"
            )
        rng = {"torch_rng": torch.get_rng_state(), "torch_rng_ranks": _gather_rows(fabric, torch.get_rng_state())}
        if fabric.device.type == "cuda":
            cuda_rng = torch.cuda.get_rng_state(fabric.device)
            rng.update(cuda_rng=cuda_rng, cuda_rng_ranks=_gather_rows(fabric, cuda_rng))
        fabric.save(
            ckpt_dir / f"{name}.ckpt",
            {
                "model": model,
                "optimizer": optimizer,
                "scheduler": scheduler,
                "progress": progress,
                "config": to_dict(cfg),
                **rng,  # every rank's random streams (rank r's in row r), so a resume continues them all
                "data_info": {"image_shape": list(splits.image_shape), "num_classes": splits.num_classes},
            },
        )

    is_cpu = fabric.device.type == "cpu"
    done = progress.step >= total_steps
    t_start = time.perf_counter() - progress.wall_time
    val_metrics: dict[str, float] = {}
    epoch_seconds: list[float] = []  # training time of each epoch of this process (validation excluded)
    stop.install()  # SIGTERM, SIGHUP, SIGINT: recorded, acted on at the next step boundary (fit restores them)
    while not done and progress.epoch < max_epochs:
        epoch = progress.epoch
        t_epoch = time.perf_counter()
        loader.set_epoch(epoch, progress.epoch_step)
        model.train()
        sums: dict[str, torch.Tensor] = {}
        count = 0
        bar = tqdm(
            total=steps_per_epoch,
            initial=progress.epoch_step,
            desc=f"epoch {epoch + 1}/{max_epochs}",
            disable=not tc.progress or fabric.global_rank != 0,
            dynamic_ncols=True,
            mininterval=0.5,
        )
        t_log = time.perf_counter()
        for images, targets in loader:
            raw.set_progress(progress.fraction)
            out = model(images, targets)
            if is_cpu and not torch.isfinite(out.loss):
                _diverged(out, progress.step)
            last_loss = out.loss.detach()
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(out.loss)
            if cfg.optim.grad_clip > 0:
                fabric.clip_gradients(model, optimizer, max_norm=cfg.optim.grad_clip)
            optimizer.step()
            scheduler.step()
            progress.step += 1
            progress.epoch_step += 1
            for k, v in {"loss": out.loss, **out.terms, **out.stats}.items():
                sums[k] = sums[k] + v.detach() if k in sums else v.detach().clone()
            count += 1
            bar.update(1)
            if progress.step % tc.log_every == 0:
                logged = {f"train/{k}": float(v) / count for k, v in sums.items()}
                if not math.isfinite(logged["train/loss"]):
                    _diverged(out, progress.step)
                now = time.perf_counter()
                logged["train/images_per_s"] = count * tc.batch_size * fabric.world_size / max(1e-9, now - t_log)
                logged["train/lr"] = scheduler.get_last_lr()[0]
                fabric.log_dict(logged, step=progress.step)
                bar.set_postfix(
                    loss=f"{logged['train/loss']:.3f}",
                    reward=f"{logged.get('train/reward', float('nan')):.3f}",
                    img_s=f"{logged['train/images_per_s']:.0f}",
                    refresh=False,
                )
                sums, count, t_log = {}, 0, now
            if tc.checkpoint_every > 0 and progress.step % tc.checkpoint_every == 0:
                progress.wall_time = time.perf_counter() - t_start
                save("last")
            if progress.step >= total_steps:
                done = True
                break
            signum = _agreed_signal(fabric, stop)
            if signum:  # a stop signal: `last` at this step (unless just saved), then out
                bar.close()
                if not (tc.checkpoint_every > 0 and progress.step % tc.checkpoint_every == 0):
                    progress.wall_time = time.perf_counter() - t_start
                    save("last")
                raise _interrupted(fabric, signum, progress.step, run_dir)
        bar.close()
        epoch_seconds.append(round(time.perf_counter() - t_epoch, 3))
        epoch_finished = progress.epoch_step >= steps_per_epoch
        if epoch_finished:
            progress.epoch += 1
            progress.epoch_step = 0
        progress.wall_time = time.perf_counter() - t_start
        periodic = epoch_finished and (progress.epoch % tc.val_every == 0 or progress.epoch == max_epochs)
        if periodic or done:  # also when max_steps ends training inside an epoch
            val_metrics = evaluate(fabric, model, splits.val, tc.eval_batch_size, 0, cfg.eval.seed, tc.progress)
            fabric.log_dict({f"val/{k}": v for k, v in val_metrics.items()}, step=progress.step)
            value = val_metrics[metric_name]
            if progress.best_value is None or better(value, progress.best_value):
                progress.best_value, progress.best_epoch, progress.best_step = value, progress.epoch, progress.step
                save("best")
            if fabric.global_rank == 0:
                fabric.print(
                    f"epoch {progress.epoch}: val {metric_name} {value:.4f} (best {progress.best_value:.4f} "
                    f"at epoch {progress.best_epoch}), {progress.wall_time:.0f}s"
                )
        save("last")
        signum = _agreed_signal(fabric, stop)
        if signum:  # received during the run's last step or a validation: `last` was just saved
            raise _interrupted(fabric, signum, progress.step, run_dir)
    stop.restore()  # the final evaluation and report: signals act as they did before the loop

    # DDP averages the gradients, so every rank must end with the same weights; check before they are replaced.
    in_sync = check_params_in_sync(fabric, model)

    # Final report: the model selected on validation, evaluated once on the requested split.
    best_path = ckpt_dir / "best.ckpt"
    if best_path.is_file():
        load_model_state(raw, load_checkpoint_file(best_path)["model"], best_path)  # all of it, or an error
        raw.set_progress(min(1.0, progress.best_step / max(1, total_steps)))  # the schedules of that checkpoint
    test_split = splits.test if cfg.eval.split == "test" else splits.val
    test_metrics = evaluate(
        fabric, model, test_split, tc.eval_batch_size, cfg.eval.mc_samples, cfg.eval.seed, tc.progress
    )
    fabric.log_dict({f"{cfg.eval.split}/{k}": v for k, v in test_metrics.items()}, step=progress.step)
    report = {
        "run_dir": str(run_dir),
        "method": cfg.method,
        "dataset": cfg.data.name,
        "epochs": progress.epoch,
        "steps": progress.step,
        "train_seconds": round(progress.wall_time, 1),
        "prepare_seconds": round(prepare_seconds, 2),
        "epoch_seconds": epoch_seconds,
        "world_size": fabric.world_size,
        "params_in_sync": in_sync,
        "best_epoch": progress.best_epoch,
        f"best_val_{metric_name}": progress.best_value,
        cfg.eval.split: test_metrics,
    }
    figures: list[str] = []
    if fabric.global_rank == 0:
        refuse_links(run_dir)  # figures/ and report.json: never written through a link planted meanwhile
        if cfg.eval.viz_images > 0:
            gen = torch.Generator(device=fabric.device).manual_seed(cfg.eval.seed)
            raw.eval()
            try:
                figures = [
                    str(p)
                    for p in raw.visualize_split(
                        test_split, run_dir / "figures", cfg.eval.viz_images, tc.eval_batch_size, generator=gen
                    )
                ]
            except NotImplementedError:
                figures = []
        report["figures"] = figures
        raw.eval()
        report["artifacts"] = [str(p) for p in raw.export(splits, run_dir)]
        refuse_links(run_dir)
        write_text_nofollow(run_dir / "report.json", json.dumps(report, indent=2))
    if setup is not None:  # the others wait for rank 0's figures and artifacts (an export can take minutes)
        setup.barrier()
    for logger in fabric.loggers:
        logger.finalize("success")
    return report


def _diverged(out, step: int) -> None:
    bad = [k for k, v in out.terms.items() if not torch.isfinite(v).all()]
    raise TrainingDiverged(
        f"non-finite loss at step {step} (terms: {', '.join(bad) or 'loss'}); "
        "the last good checkpoint is kept in checkpoints/last.ckpt"
    )


def load_for_eval(
    path: str | Path, data_dir: str | None = None, overrides: dict | None = None, fabric: Fabric | None = None
):
    """Load a checkpoint (weights only) and rebuild its model and data. Returns (cfg, model, splits).
    fabric: a launched multi-process Fabric, so that rank 0 builds the data (and its caches) first."""
    return _build_for_eval(load_checkpoint_file(_resolve_checkpoint(path)), path, data_dir, fabric)


def _build_for_eval(ckpt: dict, path: str | Path, data_dir: str | None, fabric: Fabric | None):
    cfg_dict = ckpt["config"]
    cfg = from_dict(cfg_dict, source=f"{path} (config)")
    setup = _setup_group(fabric, cfg.trainer.setup_timeout_minutes)  # None with one process
    with _rank_zero_first(setup):  # rank 0 writes any cache; the others then read it
        splits = build_dataset(cfg.data.name, cfg.data, data_dir or cfg.data.data_dir)
    model = get_method(cfg.method).from_checkpoint(
        cfg.model, DataInfo(splits.image_shape, splits.num_classes, dict(splits.meta)), ckpt["model"]
    )
    load_model_state(model, ckpt["model"], path)  # all of the weights, or a one-line error naming the keys
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
        strategy=_strategy(strategy, devices, tc.collective_timeout_minutes),
        precision=tc.precision,
    )
    fabric.launch()
    with _collectives_fail_clearly(fabric, tc.collective_timeout_minutes):
        _setup_group(fabric, tc.setup_timeout_minutes)
    return fabric


def _fabric_timeout_minutes(fabric: Fabric, default: float) -> float:
    """The collective timeout of ``fabric``'s process group (Lightning's DDP strategies hold it), else ``default``."""
    timeout = getattr(fabric.strategy, "_timeout", None)
    return timeout.total_seconds() / 60 if isinstance(timeout, datetime.timedelta) else default


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
    ``trainer.setup_timeout_minutes``, see :func:`fit`); a stalled or dead rank is a :class:`CollectiveTimeout`."""
    if split not in ("test", "val", "train"):
        raise ValueError(f"split must be test, val or train, got {split!r}")
    ckpt = load_checkpoint_file(_resolve_checkpoint(path))
    cfg = from_dict(ckpt["config"], source=f"{path} (config)")
    if fabric is None:
        fabric = _eval_fabric(cfg, accelerator, devices, strategy)
    with _collectives_fail_clearly(fabric, _fabric_timeout_minutes(fabric, cfg.trainer.collective_timeout_minutes)):
        cfg, model, splits = _build_for_eval(ckpt, path, data_dir, fabric)
        dataset = getattr(splits, split)
        if limit > 0:
            dataset = dataset.subset(torch.arange(min(limit, len(dataset))))
        if record is not None:
            record.update(eval_record(path, cfg, data_dir, len(dataset)))
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
