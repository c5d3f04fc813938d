"""SIGTERM, SIGHUP and SIGINT stop ``rlattention fit`` cleanly: at the next step boundary ``last.ckpt`` is saved,
the process exits with 128 + the signal's number and one line on stderr naming the signal, the step, the checkpoint
and the resume command, the run folder is unlocked, nothing else is touched, and ``--resume`` ends exactly where an
uninterrupted run ends (bit-identical weights, same report and metrics). Built on the helpers of
``test_crash_safety.py`` (same tiny run, same uninterrupted reference)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import test_crash_safety
import torch
from lightning.fabric import Fabric
from test_crash_safety import (
    DDP,
    DDP_STEPS,
    STEPS,
    TIMEOUT,
    _argv,
    _assert_same_result,
    _cli,
    _env,
    _finish,
    _metric_rows,
    _wait,
)
from test_run_folders import TINY as SHORT
from test_run_folders import snapshot

from rlattention.cli import main
from rlattention.engine import trainer
from rlattention.engine.checkpoint import check_resumable, load_checkpoint_file
from rlattention.engine.rundir import lock_run_dir

STOPS = ("SIGTERM", "SIGHUP", "SIGINT")


@pytest.fixture(autouse=True)
def _default_stop_signals():
    """The stop signals at their defaults while a test runs, in this process and so in the processes it starts: a
    suite launched in the background (``nohup``, ``cmd &`` in a script) inherits SIGHUP or SIGINT ignored, and an
    ignored signal is deliberately left ignored by ``fit`` (``test_an_ignored_signal_stays_ignored``)."""
    defaults = {
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGHUP: signal.SIG_DFL,
        signal.SIGINT: signal.default_int_handler,
    }
    previous = {sig: signal.signal(sig, handler) for sig, handler in defaults.items()}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


# the fixtures of test_crash_safety.py: the uninterrupted run (computed once for this module too), torch's globals
reference = test_crash_safety.reference
_restore_torch_globals = test_crash_safety._restore_torch_globals

# A child `rlattention fit` that sends itself SIG (real signal, real handler) inside optimiser step AT ("step") or
# during the validation of epoch AT ("validation"), and the same signal again while the interrupted run writes
# last.ckpt. At the first signal it records the sha256 of every file under OUT (the runs folder); it writes that
# record to STATE when it ends.
_SIGNAL_SELF = """
import hashlib, json, os, signal, sys
import lightning.fabric
import rlattention.engine.checkpoint as ckpt_io
import rlattention.engine.trainer as trainer
from rlattention.cli import main

SIG, WHEN, AT, OUT, STATE = signal.Signals[sys.argv[1]], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
state = {"steps": 0, "evals": 0, "files": None, "again": 0}

def files():
    out = {}
    for folder, _, names in os.walk(OUT):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, OUT)] = hashlib.sha256(f.read()).hexdigest()
    return out

def send():
    state["files"] = files()
    os.kill(os.getpid(), SIG)

real_backward = lightning.fabric.Fabric.backward
def backward(self, *args, **kwargs):  # once per optimiser step
    state["steps"] += 1
    if WHEN == "step" and state["steps"] == AT:
        send()
    return real_backward(self, *args, **kwargs)

real_evaluate = trainer.evaluate
def evaluate(*args, **kwargs):  # the validations of the epochs, then the final evaluation
    state["evals"] += 1
    if WHEN == "validation" and state["evals"] == AT:
        send()
    return real_evaluate(*args, **kwargs)

real_save = ckpt_io.torch.save
def save(obj, f, *args, **kwargs):  # the same signal again as a checkpoint is written after the first one
    if state["files"] is not None and os.path.basename(getattr(f, "name", "")).startswith(".last.ckpt.tmp-"):
        state["again"] += 1
        os.kill(os.getpid(), SIG)
    return real_save(obj, f, *args, **kwargs)

lightning.fabric.Fabric.backward = backward
trainer.evaluate = evaluate
ckpt_io.torch.save = save
try:
    code = main(sys.argv[6:])
finally:
    with open(STATE, "w") as f:
        json.dump(state, f)
sys.exit(code)
"""

# files an interrupted run may write after the signal; everything else that existed then must be unchanged
WRITTEN_ON_STOP = ("checkpoints/last.ckpt", "logs/metrics.csv", "tb/")


def _neighbour(out: Path) -> Path:
    """Another run folder beside the one under test, which a signal must leave alone."""
    other = out / "neighbour"
    (other / "checkpoints").mkdir(parents=True)
    (other / "config.yaml").write_text("method: ram\n")
    (other / "checkpoints" / "last.ckpt").write_bytes(os.urandom(256))
    return other


def _one_line(err: bytes) -> str:
    lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


def _expected_line(name: str, step: int, run: Path) -> str:
    return (
        f"rlattention fit: interrupted by {name} at step {step}; resumable checkpoint {run}/checkpoints/last.ckpt; "
        f"continue with: rlattention fit --resume {run}"
    )


def _assert_stopped_cleanly(run: Path, step: int) -> dict:
    """``last.ckpt`` holds ``step`` and can be resumed; no report, no temporary file, the lock is free."""
    ckpt = load_checkpoint_file(run / "checkpoints" / "last.ckpt")
    check_resumable(ckpt, run)
    assert ckpt["progress"]["step"] == step
    assert not (run / "report.json").exists()
    assert not list(run.glob("checkpoints/.*.tmp-*"))
    lock_run_dir(run, record_pid=False).release()  # nobody holds the run folder any more (its file is kept as is)
    return ckpt


@pytest.mark.parametrize(
    ("name", "when", "at", "stop_step"),
    [
        ("SIGTERM", "step", 10, 10),  # mid-epoch, between two periodic saves: last.ckpt is written for the stop
        ("SIGHUP", "step", 9, 9),  # the step of a periodic save: that save is the stop's checkpoint
        ("SIGINT", "step", 16, 16),  # the last step of epoch 1: stopped before its validation
        ("SIGTERM", "validation", 2, 32),  # during epoch 2's validation: stopped after its end-of-epoch save
    ],
)
def test_signal_saves_a_resumable_checkpoint_and_resume_equals_uninterrupted_run(
    tmp_path, reference, name, when, at, stop_step
):
    out = tmp_path / "runs"
    neighbour = _neighbour(out)
    before = snapshot(neighbour)
    run = out / "stopped"
    state_file = tmp_path / "child_state.json"
    script = textwrap.dedent(_SIGNAL_SELF)
    proc = subprocess.run(
        [sys.executable, "-c", script, name, when, str(at), str(out), str(state_file), *_argv(out, "stopped")],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=TIMEOUT,
    )
    signum = signal.Signals[name].value
    assert proc.returncode == 128 + signum, proc.stderr.decode(errors="replace")[-4000:]
    assert _one_line(proc.stderr) == _expected_line(name, stop_step, run)
    state = json.loads(state_file.read_text())
    assert state["files"] is not None
    if stop_step % 3:  # not a periodic save's step: the stop wrote last.ckpt while the signal came again
        assert state["again"] >= 1

    ckpt = _assert_stopped_cleanly(run, stop_step)
    assert (ckpt["progress"]["epoch"], ckpt["progress"]["epoch_step"]) in ((stop_step // 16, stop_step % 16), (0, 16))
    # every file that existed when the signal came is unchanged (config.yaml, best.ckpt, the lock, the other run),
    # but for those the stop writes (and best.ckpt when the signal came during a validation that found a new best)
    written = WRITTEN_ON_STOP + (("checkpoints/best.ckpt",) if when == "validation" else ())
    after = snapshot(out)
    for rel, digest in state["files"].items():
        if not rel.startswith("stopped/") or not rel[len("stopped/") :].startswith(written):
            assert after.get(rel) == digest, rel
    assert snapshot(neighbour) == before
    rows = [r["step"] for r in _metric_rows(run)]
    assert rows and max(int(s) for s in rows) <= stop_step  # metrics.csv: nothing logged past the checkpoint

    assert main(["fit", "--resume", str(run)]) == 0
    _assert_same_result(run, reference, resumed_at=stop_step)


def test_signal_from_outside_mid_training_then_resume_equals_uninterrupted_run(tmp_path, reference):
    """SIGINT (what Ctrl-C sends) from another process at a moment the test does not choose."""
    out = tmp_path / "runs"
    neighbour = _neighbour(out)
    run = out / "outside"
    last = run / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlattention.cli", *_argv(out, "outside")],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait(proc, last.exists)  # the first periodic save (step 3): training is under way
        before = snapshot(out)
        proc.send_signal(signal.SIGINT)
    finally:
        _, err = proc.communicate(timeout=TIMEOUT)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal came (a very fast machine)")
    assert proc.returncode == 130, err.decode(errors="replace")[-4000:]
    step = load_checkpoint_file(last)["progress"]["step"]
    assert 3 <= step < STEPS
    assert _one_line(err) == _expected_line("SIGINT", step, run)
    _assert_stopped_cleanly(run, step)
    after = snapshot(out)
    assert after["outside/config.yaml"] == before["outside/config.yaml"]
    assert {k: v for k, v in after.items() if k.startswith("neighbour/")} == {
        k: v for k, v in before.items() if k.startswith("neighbour/")
    }
    assert sorted(snapshot(neighbour)) == ["checkpoints/last.ckpt", "config.yaml"]

    assert main(["fit", "--resume", str(run)]) == 0
    _assert_same_result(run, reference, resumed_at=step)


def _signal_at_step(monkeypatch, sig: int, at: int) -> None:
    """This process sends itself ``sig`` inside optimiser step ``at``."""
    real, calls = Fabric.backward, [0]

    def backward(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), sig)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Fabric, "backward", backward)


def _handlers() -> dict[str, object]:
    return {name: signal.getsignal(getattr(signal, name)) for name in STOPS}


def test_in_process_stop_restores_the_handlers_and_releases_the_lock(tmp_path, monkeypatch, capsys):
    """``main`` called from Python: the same one line and exit code; afterwards the process has its own handlers
    back and the run folder is free, so the resume can start in the same process."""
    before = _handlers()
    _signal_at_step(monkeypatch, signal.SIGTERM, 2)
    argv = ["fit", *SHORT, "trainer.max_steps=4", f"trainer.out_dir={tmp_path}", "trainer.run_name=r"]
    assert main(argv) == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [_expected_line("SIGTERM", 2, tmp_path / "r")]
    assert _handlers() == before
    _assert_stopped_cleanly(tmp_path / "r", 2)
    monkeypatch.undo()
    assert main(["fit", "--resume", str(tmp_path / "r")]) == 0
    assert json.loads((tmp_path / "r" / "report.json").read_text())["steps"] == 4
    assert _handlers() == before


def test_fit_raises_training_interrupted(tmp_path, monkeypatch):
    from rlattention.engine.config import load_config

    _signal_at_step(monkeypatch, signal.SIGHUP, 1)
    cfg = load_config(None, [*SHORT, f"trainer.out_dir={tmp_path}", "trainer.run_name=r"])
    with pytest.raises(trainer.TrainingInterrupted) as info:
        trainer.fit(cfg)
    e = info.value
    assert not isinstance(e, Exception)  # an `except Exception` for failed runs does not swallow a stop
    assert (e.signal_name, e.step, e.exit_code) == ("SIGHUP", 1, 129)
    assert e.checkpoint == tmp_path / "r" / "checkpoints" / "last.ckpt" and e.run_dir == tmp_path / "r"


def test_an_ignored_signal_stays_ignored(tmp_path, monkeypatch):
    """Under ``nohup`` SIGHUP is ignored: the run neither installs a handler for it nor stops."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        _signal_at_step(monkeypatch, signal.SIGHUP, 1)
        assert main(["fit", *SHORT, f"trainer.out_dir={tmp_path}", "trainer.run_name=r"]) == 0
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert json.loads((tmp_path / "r" / "report.json").read_text())["steps"] == 2


def test_fit_outside_the_main_thread_installs_no_handler(tmp_path, monkeypatch):
    """``signal.signal`` only works in the main thread: elsewhere fit trains as before, without handlers."""
    from rlattention.engine.config import load_config

    before = _handlers()
    seen, result = [], {}
    real = trainer._StopSignals.install

    def install(self):
        real(self)
        seen.append(dict(self._previous))

    monkeypatch.setattr(trainer._StopSignals, "install", install)
    cfg = load_config(None, [*SHORT, f"trainer.out_dir={tmp_path}", "trainer.run_name=t"])

    def target():
        try:
            result["report"] = trainer.fit(cfg)
        except BaseException as e:  # reported below
            result["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(TIMEOUT)
    assert "error" not in result, result.get("error")
    assert result["report"]["steps"] == 2
    assert seen == [{}]  # called, installed nothing
    assert _handlers() == before


def test_sigterm_to_rank_0_of_a_2_process_run_stops_both_at_one_step(tmp_path):
    """SIGTERM reaches rank 0 only (as a scheduler killing the job's main process): both ranks agree to stop at the
    same step boundary, rank 0 writes last.ckpt with both ranks' random streams, the job exits 143 with one line,
    and a 2-process resume ends exactly where the uninterrupted 2-process run ends."""
    _finish(_cli([*_argv(tmp_path, "straight"), *DDP], tmp_path))
    straight = tmp_path / "straight"
    ref_report = json.loads((straight / "report.json").read_text())
    ref_weights = load_checkpoint_file(straight / "checkpoints" / "last.ckpt")["model"]

    run = tmp_path / "stopped"
    last = run / "checkpoints" / "last.ckpt"
    proc = _cli([*_argv(tmp_path, "stopped"), *DDP], tmp_path)
    try:
        _wait(proc, last.exists)
        proc.send_signal(signal.SIGTERM)  # rank 0 only: rank 1 is its child, in the same session
    finally:
        _, err = proc.communicate(timeout=TIMEOUT)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal came (a very fast machine)")
    assert proc.returncode == 143, err.decode(errors="replace")[-4000:]
    ckpt = load_checkpoint_file(last)
    step = ckpt["progress"]["step"]
    assert 3 <= step < DDP_STEPS and ckpt["torch_rng_ranks"].shape[0] == 2
    # Lightning's start-up banner goes to stderr too; after it, one line from rank 0 only, and no traceback
    text = err.decode(errors="replace")
    assert "Traceback" not in text
    ours = [line for line in text.splitlines() if line.startswith("rlattention")]
    assert ours == [_expected_line("SIGTERM", step, run)] and text.rstrip().endswith(ours[0]), text
    _assert_stopped_cleanly(run, step)

    _finish(_cli(["fit", "--resume", str(run)], tmp_path))
    report = json.loads((run / "report.json").read_text())
    assert report["world_size"] == 2 and report["params_in_sync"] is True
    assert report["steps"] == ref_report["steps"] == DDP_STEPS
    assert report["test"] == ref_report["test"] and report["best_epoch"] == ref_report["best_epoch"]
    weights = load_checkpoint_file(last)["model"]
    for k, v in weights.items():
        assert torch.equal(v, ref_weights[k]), k


# A child `rlattention fit` that sends itself SIG while the dataset is being built, before any training loop runs.
_SIGNAL_WHILE_BUILDING = """
import os, signal, sys
import rlattention.engine.trainer as trainer
from rlattention.cli import main

SIG = signal.Signals[sys.argv[1]]
real_build = trainer.build_dataset
def build(*args, **kwargs):
    os.kill(os.getpid(), SIG)
    return real_build(*args, **kwargs)
trainer.build_dataset = build
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("name", STOPS)
def test_a_signal_before_training_ends_the_command_with_one_line(tmp_path, name):
    """SIGTERM, SIGHUP or SIGINT while the data are built (no training loop yet): one line saying so, no traceback,
    exit 128 + the signal's number; the run folder holds only what it held then and is unlocked; a run beside it
    is untouched."""
    out = tmp_path / "runs"
    other = _neighbour(out)
    before = snapshot(other)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _SIGNAL_WHILE_BUILDING,
            name,
            "fit",
            *SHORT,
            f"trainer.out_dir={out}",
            "trainer.run_name=run",
        ],  # fmt: skip
        cwd=tmp_path,
        env=test_crash_safety._env(),
        capture_output=True,
        timeout=TIMEOUT,
    )
    signum = int(signal.Signals[name])
    assert proc.returncode == 128 + signum, proc.stderr.decode()
    line = _one_line(proc.stderr)
    assert line.startswith(f"rlattention fit: interrupted by {name} outside the training loop"), line
    run = out / "run"
    assert sorted(p.name for p in run.iterdir()) == [".lock", "config.yaml"]  # nothing trained, nothing saved
    lock_run_dir(run, record_pid=False).release()
    assert snapshot(other) == before
