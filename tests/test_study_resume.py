"""benchmarks/study.py across sessions: a run that a killed study left is continued from its checkpoint and ends
where an uninterrupted run ends; a folder that cannot be continued (another config, a report without a record, no
checkpoint) is renamed aside with its log, never written into; a folder that another process still trains in
stops the study and is left alone."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from tiny_runs import RESUMABLE

from rlattention.engine.checkpoint import load_checkpoint_file
from rlattention.engine.rundir import RunFolderBusy, lock_run_dir

ROOT = Path(__file__).resolve().parents[1]
# 512 / 32 = 16 steps an epoch, 4 epochs; `last` every 3 steps, so a kill lands after a checkpoint, mid-run
TINY = RESUMABLE
TIMEOUT = 180


@pytest.fixture(scope="module")
def study(benchmark_module):
    return benchmark_module("study")


@pytest.fixture(scope="module")
def row(study):
    return study.Row("tiny", "configs/ram_digits.yaml", TINY, "a tiny RAM")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    """A ``--data-dir`` as a study passes it, relative to the repository (the digits are drawn, it stays empty);
    the run records it as an absolute path, which must not stop a resume."""
    return os.path.relpath(tmp_path_factory.mktemp("data"), ROOT)


@pytest.fixture(scope="module")
def reference(study, row, data_dir, tmp_path_factory) -> dict:
    """An uninterrupted run's record."""
    return study.run_one(row, 0, data_dir, tmp_path_factory.mktemp("straight"), 1, [])


def _killed_run(study, row, work: Path, data_dir: str) -> int:
    """Start the row's fresh run as a study would, SIGKILL it once `last` has been replaced once (mid-run), and
    return the step of its last checkpoint."""
    last = work / "tiny_s0" / "checkpoints" / "last.ckpt"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(study.fit_argv(row, 0, data_dir, work, 1, []), cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + TIMEOUT
    first = None
    while proc.poll() is None and time.monotonic() < deadline:
        if last.exists():
            first = first or os.stat(last).st_ino
            if os.stat(last).st_ino != first:  # replaced once: at least two checkpoints written
                break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=TIMEOUT)
    # the kill lands right after the second checkpoint (step 6 of 64), so the run cannot have finished first
    assert proc.returncode == -signal.SIGKILL, f"the run ended ({proc.returncode}) before it was killed"
    assert not (work / "tiny_s0" / "report.json").exists()
    return load_checkpoint_file(last)["progress"]["step"]


def test_a_killed_run_is_continued_and_ends_as_the_uninterrupted_run(study, row, data_dir, reference, tmp_path):
    killed_at = _killed_run(study, row, tmp_path, data_dir)
    assert 0 < killed_at < 64
    (tmp_path / "tiny_s0.log").write_text("# the first attempt's log\n")  # what the killed study had written
    rec = study.run_one(row, 0, data_dir, tmp_path, 1, [])
    assert rec["resumed"]["step"] == killed_at
    assert "--resume" in rec["resumed"]["command"] and "--resume" not in rec["command"]
    assert rec["command"] == shlex.join(study.fit_argv(row, 0, data_dir, tmp_path, 1, []))  # the fresh run's command
    # continued exactly: the same selected model, the same test figures (CPU, one thread, deterministic)
    assert rec["report"]["test"] == reference["report"]["test"]
    assert rec["report"]["best_epoch"] == reference["report"]["best_epoch"]
    assert rec["report"]["steps"] == reference["report"]["steps"] == 64
    # the record keeps the whole validation curve (one value an epoch), the continued run's as the straight one's
    assert len(reference["validation_curves"]["val/accuracy"]) == 4
    assert rec["validation_curves"] == reference["validation_curves"]
    log = (tmp_path / "tiny_s0.log").read_text()
    assert log.startswith("# the first attempt's log\n") and "--resume" in log  # appended, not replaced
    assert not list(tmp_path.glob("*.incomplete-*"))


def test_a_run_left_under_another_config_is_kept_aside_with_its_log(study, row, data_dir, tmp_path):
    killed_at = _killed_run(study, row, tmp_path, data_dir)
    run = tmp_path / "tiny_s0"
    fixed = study.fit_argv(row, 0, None, tmp_path, 1, [])[4:-2]
    for same in (data_dir, str(ROOT / data_dir), str(ROOT / data_dir) + "/"):  # one folder, spelled three ways
        progress, why = study.resume_state(run, row.config, fixed, same)
        assert progress is not None and progress["step"] == killed_at and why == ""
    progress, why = study.resume_state(run, row.config, fixed, str(tmp_path))
    assert progress is None and "data.data_dir" in why
    changed = [o if o != "optim.lr=0.01" else "optim.lr=0.02" for o in fixed]
    progress, why = study.resume_state(run, row.config, changed, data_dir)
    assert progress is None and "optim.lr" in why and "0.01" in why and "0.02" in why
    # the row as a study now defines it (another learning rate): the old folder goes aside, a fresh run starts
    (tmp_path / "tiny_s0.log").write_text("old log\n")
    weights = load_checkpoint_file(run / "checkpoints" / "last.ckpt")["model"]
    new_row = study.Row("tiny", row.config, [o if o != "optim.lr=0.01" else "optim.lr=0.02" for o in TINY])
    rec = study.run_one(new_row, 0, data_dir, tmp_path, 1, [])
    assert "resumed" not in rec and rec["report"]["steps"] == 64
    (aside,) = tmp_path.glob("tiny_s0.incomplete-*[0-9]")
    assert (tmp_path / f"{aside.name}.log").read_text() == "old log\n"
    kept = load_checkpoint_file(aside / "checkpoints" / "last.ckpt")
    assert kept["progress"]["step"] == killed_at
    assert all((kept["model"][k] == v).all() for k, v in weights.items())  # untouched


def test_a_checkpoint_written_before_a_config_key_existed_is_continued(study, row, data_dir, tmp_path):
    """A key the schema gained since (here trainer.ema_decay, whose default changes nothing) reads as its default;
    set to another value by the row, it differs."""
    killed_at = _killed_run(study, row, tmp_path, data_dir)
    last = tmp_path / "tiny_s0" / "checkpoints" / "last.ckpt"
    ckpt = load_checkpoint_file(last)
    del ckpt["config"]["trainer"]["ema_decay"]
    torch.save(ckpt, last)
    fixed = study.fit_argv(row, 0, None, tmp_path, 1, [])[4:-2]
    progress, why = study.resume_state(tmp_path / "tiny_s0", row.config, fixed, data_dir)
    assert progress is not None and progress["step"] == killed_at and why == ""
    progress, why = study.resume_state(tmp_path / "tiny_s0", row.config, [*fixed, "trainer.ema_decay=0.5"], data_dir)
    assert progress is None and "trainer.ema_decay: 0.0 in the checkpoint, 0.5 now" in why
    ckpt["config"]["trainer"]["no_such_key"] = 1
    torch.save(ckpt, last)
    progress, why = study.resume_state(tmp_path / "tiny_s0", row.config, fixed, data_dir)
    assert progress is None and "no longer fits the schema" in why and "no_such_key" in why


def test_what_cannot_be_continued_says_why(study, row, tmp_path):
    run = tmp_path / "tiny_s0"
    (run / "checkpoints").mkdir(parents=True)
    fixed = study.fit_argv(row, 0, None, tmp_path, 1, [])[4:-2]
    progress, why = study.resume_state(run, row.config, fixed)
    assert progress is None and "no checkpoints/last.ckpt" in why
    (run / "checkpoints" / "last.ckpt").write_bytes(b"not a checkpoint")
    progress, why = study.resume_state(run, row.config, fixed)
    assert progress is None and "last.ckpt" in why and "not a loadable" in why
    (run / "report.json").write_text(json.dumps({}))
    progress, why = study.resume_state(run, row.config, fixed)
    assert progress is None and "report.json" in why


def test_a_folder_another_process_trains_in_stops_the_study_untouched(study, row, tmp_path):
    run = tmp_path / "tiny_s0"
    run.mkdir()
    (run / "marker").write_text("mine")
    lock = lock_run_dir(run)
    try:
        with pytest.raises(RunFolderBusy):
            study.run_one(row, 0, None, tmp_path, 1, [])
    finally:
        lock.release()
    assert (run / "marker").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_s0"]
