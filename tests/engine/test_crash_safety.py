"""Crash safety of ``rlattention fit``: a SIGKILL mid-training then ``--resume`` ends where an uninterrupted run
ends; a process dying while it writes a checkpoint keeps the previous one; an unwritable run folder or a full disk
is a clear error before any training."""

from __future__ import annotations

import csv
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from tiny_runs import RESUMABLE

from rlattention.cli import main
from rlattention.engine import trainer
from rlattention.engine.checkpoint import CheckpointError, load_checkpoint_file
from rlattention.methods.ram import RAM

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "ram_digits.yaml"
# tiny_runs.RESUMABLE: 16 steps an epoch, 64 in all, `last` every 3 steps (mid-epoch checkpoints are resumed from)
TINY = [*RESUMABLE, "trainer.log_every=4"]
STEPS = 64
LOG_EVERY = 4
TIMEOUT = 120  # seconds for one child run (a loaded machine); the runs take a few seconds


def _argv(out_dir: Path, name: str) -> list[str]:
    return ["fit", "--config", str(CONFIG), *TINY, f"trainer.out_dir={out_dir}", f"trainer.run_name={name}"]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture(autouse=True)
def _restore_torch_globals():
    """In-process fits set torch's thread count and deterministic mode: give them back to the other tests."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted run: its report and last weights."""
    out = tmp_path_factory.mktemp("reference")
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        assert main(_argv(out, "straight")) == 0
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
    run = out / "straight"
    return {
        "report": json.loads((run / "report.json").read_text()),
        "weights": load_checkpoint_file(run / "checkpoints" / "last.ckpt")["model"],
        "metrics": _metric_rows(run),
    }


def _assert_same_result(run: Path, reference: dict, resumed_at: int | None = None) -> None:
    report = json.loads((run / "report.json").read_text())
    ref = reference["report"]
    assert report["steps"] == ref["steps"] == STEPS and report["epochs"] == ref["epochs"]
    # CPU, one thread, deterministic algorithms: bit-identical, so exact equality (no tolerance)
    assert report["test"] == ref["test"]
    assert report["best_epoch"] == ref["best_epoch"]
    assert report["best_val_accuracy"] == ref["best_val_accuracy"]
    weights = load_checkpoint_file(run / "checkpoints" / "last.ckpt")["model"]
    assert weights.keys() == reference["weights"].keys()
    for k, v in weights.items():
        assert torch.equal(v, reference["weights"][k]), k
    # metrics.csv: the same rows as the uninterrupted run's (none lost, none repeated), equal but for timing; the
    # first training row after the resume averages only the steps since the resume point (the window's running
    # sums are not checkpointed), so its values differ
    rows, ref_rows = _metric_rows(run), reference["metrics"]
    assert [r["step"] for r in rows] == [r["step"] for r in ref_rows]
    straddles = resumed_at is not None
    for r, q in zip(rows, ref_rows, strict=True):
        if straddles and "train/loss" in r and int(r["step"]) > resumed_at:
            straddles = False  # this row's window began before the resume point
            if int(r["step"]) - LOG_EVERY < resumed_at:
                continue
        assert {k: v for k, v in r.items() if k not in TIMING} == {k: v for k, v in q.items() if k not in TIMING}


TIMING = {"train/images_per_s", "train/wall_time", "train/elapsed_s"}


def _metric_rows(run: Path) -> list[dict]:
    with open(run / "logs" / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def _wait(proc: subprocess.Popen, until) -> None:
    """Poll ``until()`` while the child runs (returns early when it exits or after TIMEOUT)."""
    deadline = time.monotonic() + TIMEOUT
    while not until():
        if proc.poll() is not None or time.monotonic() > deadline:
            return
        time.sleep(0.005)


@pytest.mark.parametrize("kill_when", ["last_replaced", "best_written"])
def test_sigkill_mid_training_then_resume_equals_uninterrupted_run(tmp_path, reference, kill_when):
    """Killed (1) mid-epoch, just after `last` was replaced once, or (2) just after the first best.ckpt appeared,
    which is most often before the end-of-epoch `last` is written: the resume then replays the end of the epoch,
    its validation and best.ckpt. Wherever the kill lands, the result must be the uninterrupted one."""
    run = tmp_path / "killed"
    last, best = run / "checkpoints" / "last.ckpt", run / "checkpoints" / "best.ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlattention.cli", *_argv(tmp_path, "killed")],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        if kill_when == "best_written":
            _wait(proc, best.exists)
        else:
            _wait(proc, last.exists)
            first = os.stat(last).st_ino if last.exists() else None
            # until it has been replaced once (os.replace: a new inode)
            _wait(proc, lambda: last.exists() and os.stat(last).st_ino != first)
        proc.send_signal(signal.SIGKILL)
    finally:
        _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode in (-signal.SIGKILL, 0), err.decode(errors="replace")
    killed_at = load_checkpoint_file(last)["progress"]["step"]
    assert killed_at >= 6  # at least two checkpoints were written before the kill
    if proc.returncode == -signal.SIGKILL:  # the usual case; on a very slow machine the run may have finished first
        assert not (run / "report.json").exists()
    assert not list(run.glob("checkpoints/.*.tmp-*")) or all(
        p.name.endswith(f"-{proc.pid}") for p in run.glob("checkpoints/.*.tmp-*")
    )

    assert main(["fit", "--resume", str(run)]) == 0
    _assert_same_result(run, reference, resumed_at=killed_at)


_DIE_MID_WRITE = """
import io, os, signal, sys
import torch
import rlattention.engine.checkpoint as ckpt_io
from rlattention.cli import main

real_save, calls = torch.save, {"last": 0}

def save(obj, f, *args, **kwargs):
    name = os.path.basename(getattr(f, "name", ""))
    if name.startswith(".last.ckpt.tmp-"):
        calls["last"] += 1
        if calls["last"] == DIE_AT:  # half of the real bytes reach the disk, then the process dies
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)

ckpt_io.torch.save = save
sys.exit(main(sys.argv[1:]))
"""


def test_dying_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, reference):
    # last.ckpt is written at steps 3, 6, 9, ...: the process dies while writing the one of step 9
    script = textwrap.dedent(_DIE_MID_WRITE).replace("DIE_AT", "3")
    proc = subprocess.run(
        [sys.executable, "-c", script, *_argv(tmp_path, "torn")],
        env=_env(),
        capture_output=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode(errors="replace")
    ckpts = tmp_path / "torn" / "checkpoints"
    torn = list(ckpts.glob(".last.ckpt.tmp-*"))
    assert len(torn) == 1 and torn[0].stat().st_size > 0  # the half-written temporary file is still there
    with pytest.raises(CheckpointError):
        load_checkpoint_file(torn[0])  # ... and it is not a checkpoint
    # the previous last.ckpt is intact; the temporary file is never taken for a checkpoint
    assert sorted(p.name for p in ckpts.glob("*.ckpt")) == ["last.ckpt"]
    assert load_checkpoint_file(ckpts / "last.ckpt")["progress"]["step"] == 6
    assert load_checkpoint_file(tmp_path / "torn")["progress"]["step"] == 6  # a run folder resolves to last.ckpt

    assert main(["fit", "--resume", str(tmp_path / "torn")]) == 0
    _assert_same_result(tmp_path / "torn", reference, resumed_at=6)
    assert not list(ckpts.glob(".*.tmp-*")), "the dead process's temporary file was not cleaned up"


def _no_training(monkeypatch):
    def forward(self, *args, **kwargs):
        raise AssertionError("training started although the run folder is unusable")

    monkeypatch.setattr(RAM, "forward", forward)


def test_run_folder_that_cannot_be_a_folder_is_a_clear_error_at_start(tmp_path, monkeypatch, capsys):
    _no_training(monkeypatch)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert main(_argv(blocker / "runs", "x")) == 2
    err = capsys.readouterr().err
    assert "not writable" in err and str(blocker / "runs" / "x") in err
    assert "Traceback" not in err


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores folder permissions")
def test_read_only_run_folder_is_a_clear_error_at_start(tmp_path, monkeypatch, capsys):
    _no_training(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert main(_argv(ro, "x")) == 2
    finally:
        ro.chmod(0o755)
    err = capsys.readouterr().err
    assert "not writable" in err and str(ro / "x") in err
    assert not (ro / "x" / "checkpoints").exists()


def test_full_disk_is_a_clear_error_at_start(tmp_path, monkeypatch, capsys):
    """A full disk, simulated: every write of the start-up probe fails with ENOSPC."""
    _no_training(monkeypatch)
    real_open = open

    class FullDisk:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    def fake_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return FullDisk(f) if "w" in mode or "a" in mode else f

    monkeypatch.setattr(trainer, "open", fake_open, raising=False)  # only the trainer module's writes
    assert main(_argv(tmp_path, "full")) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "full") in err and os.strerror(errno.ENOSPC) in err and "not writable" in err
    assert not (tmp_path / "full" / "checkpoints").exists()


DDP = ["trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu"]
DDP_STEPS = 32  # 512 / (2 ranks x 32) = 8 steps per epoch, 4 epochs


def _ddp_env() -> dict[str, str]:
    env = {k: v for k, v in _env().items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK")}
    env.pop("WORLD_SIZE", None)  # Lightning's launcher picks a free port and starts rank 1
    return env


def _cli(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlattention.cli", *args],
        cwd=cwd,
        env=_ddp_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: both ranks can be killed at once, as a node failure does
        **kwargs,
    )


def _finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err.decode(errors="replace")[-4000:]


def test_sigkill_of_a_2_process_run_then_resume_equals_uninterrupted_run(tmp_path):
    """Both ranks of a DDP run die by SIGKILL mid-training; ``--resume`` with two processes again continues from
    the last checkpoint, every rank with its own random streams (saved per rank), and ends exactly where the
    uninterrupted 2-process run ends."""
    _finish(_cli([*_argv(tmp_path, "straight"), *DDP], tmp_path))
    straight = tmp_path / "straight"
    reference = {
        "report": json.loads((straight / "report.json").read_text()),
        "weights": load_checkpoint_file(straight / "checkpoints" / "last.ckpt")["model"],
        "metrics": _metric_rows(straight),
    }
    assert reference["report"]["world_size"] == 2 and reference["report"]["params_in_sync"] is True

    run = tmp_path / "killed"
    last = run / "checkpoints" / "last.ckpt"
    proc = _cli([*_argv(tmp_path, "killed"), *DDP], tmp_path)
    try:
        _wait(proc, last.exists)
        first = os.stat(last).st_ino if last.exists() else None
        _wait(proc, lambda: last.exists() and os.stat(last).st_ino != first)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=TIMEOUT)
    killed_at = load_checkpoint_file(last)["progress"]["step"]
    if proc.returncode != -signal.SIGKILL or killed_at >= DDP_STEPS:
        pytest.skip("the run finished before it could be killed (a very fast machine)")
    assert not (run / "report.json").exists()
    assert load_checkpoint_file(last)["torch_rng_ranks"].shape[0] == 2

    _finish(_cli(["fit", "--resume", str(run)], tmp_path))
    report = json.loads((run / "report.json").read_text())
    assert report["world_size"] == 2 and report["params_in_sync"] is True
    assert report["steps"] == reference["report"]["steps"] == DDP_STEPS
    assert report["test"] == reference["report"]["test"]
    assert report["best_epoch"] == reference["report"]["best_epoch"]
    weights = load_checkpoint_file(last)["model"]
    for k, v in weights.items():
        assert torch.equal(v, reference["weights"][k]), k
    rows = _metric_rows(run)
    assert [r["step"] for r in rows] == [r["step"] for r in reference["metrics"]]
