"""Several processes: collective timeouts that fail with one clear line, the setup group for long waits, the
DDP strategy, gathers in item order, the parameter check after training, and ending a job in order.

A collective of the training group waits at most ``trainer.collective_timeout_minutes``; the waits that may
legitimately last longer (rank 0 building the data first, models prepared at each rank's pace, rank 0 writing
figures and the report) use :class:`_SetupGroup`, whose timeout is ``trainer.setup_timeout_minutes``. A stalled or
dead rank is a :class:`CollectiveTimeout` (exit code 4) instead of a hang.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import sys
import time
import warnings
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy

from rlattention.engine.method import AttentionMethod


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


class _DDP(DDPStrategy):
    """Lightning's DDP whose processes meet (the rendezvous store's connections, ``init_process_group``) within
    ``rendezvous_timeout`` (``trainer.setup_timeout_minutes``), and whose training group's collectives then wait at
    most ``_timeout`` (``trainer.collective_timeout_minutes``). Lightning gives both the one timeout: a short
    collective timeout also cut off the start-up of processes still importing torch on a loaded machine, with
    torch's ``DistNetworkError`` instead of one clear line."""

    def __init__(self, *args: Any, rendezvous_timeout: datetime.timedelta, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rendezvous_timeout = rendezvous_timeout

    def _setup_distributed(self) -> None:
        import torch.distributed as dist

        try:  # torch's (private) setter of a group's timeout; without it, the one timeout as Lightning gives it
            from torch.distributed.distributed_c10d import _set_pg_timeout
        except ImportError:
            super()._setup_distributed()
            return
        collective = self._timeout
        self._timeout = max(self.rendezvous_timeout, collective)  # what Lightning hands init_process_group
        try:
            super()._setup_distributed()
        finally:
            self._timeout = collective
        if dist.is_available() and dist.is_initialized():
            _set_pg_timeout(collective)  # the default group's collectives, from here on


def _strategy(name: str, devices: Any, timeout_minutes: float = 10.0, setup_minutes: float | None = None):
    """``ddp`` (also ``auto`` with several devices outside interactive sessions, where Lightning picks ``ddp``
    too): Lightning's DDP with ``find_unused_parameters=True``. Some methods have trainable parameters that a step
    leaves without a gradient (e.g. the ``w_mean`` head of dcpg's policies, which only ``pg: continuous`` uses),
    which plain DDP rejects at the next step. ``ddp_find_unused_parameters_false``: plain DDP (a little faster
    where every step uses every parameter). The other names of Lightning's ``ddp`` family (``ddp_spawn``,
    ``ddp_fork``, ...) are built as Lightning builds them. Every DDP strategy gets ``timeout_minutes``
    (``trainer.collective_timeout_minutes``) as its process group's timeout: a collective that waits longer for a
    stalled rank raises instead of hanging. With ``setup_minutes`` (``trainer.setup_timeout_minutes``) the
    processes' start-up rendezvous waits that long instead (:class:`_DDP`). Other names go to Lightning as
    they are."""
    from lightning.fabric.strategies import STRATEGY_REGISTRY

    timeout = datetime.timedelta(minutes=timeout_minutes)
    cls, extra = DDPStrategy, {}
    if setup_minutes is not None:
        cls, extra = _DDP, {"rendezvous_timeout": datetime.timedelta(minutes=setup_minutes)}
    interactive = hasattr(sys, "ps1") or bool(sys.flags.interactive)
    if name == "ddp" or (name == "auto" and isinstance(devices, int) and devices > 1 and not interactive):
        return cls(find_unused_parameters=True, timeout=timeout, **extra)
    if name == "ddp_find_unused_parameters_false":
        return cls(find_unused_parameters=False, timeout=timeout, **extra)
    entry = STRATEGY_REGISTRY[name] if isinstance(name, str) and name in STRATEGY_REGISTRY else None
    if entry is not None and entry["strategy"] is DDPStrategy:
        return cls(**entry["init_params"], timeout=timeout, **extra)
    if entry is not None and issubclass(entry["strategy"], DDPStrategy):  # e.g. DeepSpeed: one timeout
        return entry["strategy"](**entry["init_params"], timeout=timeout)
    return name


def _fabric_timeout_minutes(fabric: Fabric, default: float) -> float:
    """The collective timeout of ``fabric``'s process group (Lightning's DDP strategies hold it), else ``default``."""
    timeout = getattr(fabric.strategy, "_timeout", None)
    return timeout.total_seconds() / 60 if isinstance(timeout, datetime.timedelta) else default


def _unwrap(model) -> AttentionMethod:
    return model.module if hasattr(model, "module") and isinstance(model.module, AttentionMethod) else model


def _gather_rows(fabric: Fabric, row: torch.Tensor) -> torch.Tensor:
    """``(world_size, *row.shape)`` on the CPU: every rank's ``row`` (e.g. its RNG state), rank r in row r.
    Collective: every rank calls it at the same point."""
    if fabric.world_size == 1:
        return row[None].clone()
    return fabric.all_gather(row.to(fabric.device)).cpu()


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
