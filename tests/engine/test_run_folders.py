"""Run folders are never lost or escaped: a used name gets ``-v2``, ``--overwrite`` keeps the old run aside, a
locked folder is refused at once, nothing is written through a symbolic link, ``trainer.run_name`` stays inside
``trainer.out_dir``, a checkpoint that does not fit the model is never resumed, and ``--resume`` takes a run
folder or any checkpoint inside it (without ``--data-dir``). Every test also checks that what existed before is
byte for byte unchanged."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import tiny_ram

from rlattention.cli import main
from rlattention.engine.checkpoint import load_checkpoint_file
from rlattention.engine.rundir import check_run_name, resolve_resume

TINY = tiny_ram(eval_batch=64, extra=["trainer.max_steps=2", "trainer.log_every=1"])


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _fit(out: Path, name: str, *extra: str) -> int:
    return main(["fit", *TINY, f"trainer.out_dir={out}", f"trainer.run_name={name}", *extra])


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (links recorded as their target, never followed)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_file():
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _one_line_error(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for f in fragments:
        assert f in err[0], (f, err[0])
    return err[0]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """One finished 2-step run; tests copy it."""
    out = tmp_path_factory.mktemp("base")
    threads = torch.get_num_threads()
    try:
        assert _fit(out, "run") == 0
    finally:
        torch.set_num_threads(threads)
    return out / "run"


def _copy(base_run: Path, where: Path, name: str = "run") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    run = where / name
    shutil.copytree(base_run, run, symlinks=True)
    return run


def test_second_fit_with_the_same_name_gets_a_new_folder(tmp_path, base_run, capsys):
    first = _copy(base_run, tmp_path)
    before = snapshot(first)
    capsys.readouterr()
    assert _fit(tmp_path, "run") == 0
    out = capsys.readouterr().out
    assert f"run folder: {tmp_path / 'run-v2'}" in out
    assert "already used" in out and str(tmp_path / "run-v2") in out
    assert json.loads((tmp_path / "run-v2" / "report.json").read_text())["run_dir"] == str(tmp_path / "run-v2")
    assert (tmp_path / "run-v2" / "checkpoints" / "last.ckpt").is_file()
    assert snapshot(first) == before
    # an empty folder of that name is free: it is used as it is
    (tmp_path / "empty").mkdir()
    assert (tmp_path / "run-v3").exists() is False
    assert _fit(tmp_path, "empty") == 0
    assert (tmp_path / "empty" / "report.json").is_file() and not (tmp_path / "empty-v2").exists()
    assert snapshot(first) == before


def test_overwrite_keeps_the_old_run_aside(tmp_path, base_run, capsys):
    first = _copy(base_run, tmp_path)
    before = snapshot(first)
    assert _fit(tmp_path, "run", "--overwrite") == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(aside) == 1 and snapshot(aside[0]) == before
    assert "kept as" in capsys.readouterr().out
    assert (tmp_path / "run" / "report.json").is_file() and not (tmp_path / "run-v2").exists()
    assert load_checkpoint_file(tmp_path / "run")["config"]["trainer"]["run_name"] == "run"


_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_locked_run_folder_is_refused_at_once(tmp_path, base_run, capsys):
    run = _copy(base_run, tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLDER), str(run / ".lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(run)
        assert main(["fit", "--resume", str(run), "trainer.max_steps=4"]) == 2
        _one_line_error(capsys, "in use by another process", str(run), f"pid {holder.pid}")
        assert snapshot(run) == before
        assert _fit(tmp_path, "run", "--overwrite") == 2  # a run in use is never moved aside either
        _one_line_error(capsys, "in use by another process", str(run), f"pid {holder.pid}")
        assert snapshot(run) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    # the lock is free again: the run continues
    assert main(["fit", "--resume", str(run), "trainer.max_steps=3"]) == 0
    assert load_checkpoint_file(run)["progress"]["step"] == 3


def test_our_own_lock_is_exclusive_and_names_our_pid(tmp_path):
    from rlattention.engine.rundir import RunFolderBusy, lock_run_dir

    with lock_run_dir(tmp_path) as lock:
        assert lock.held and (tmp_path / ".lock").read_text().strip() == str(os.getpid())
        fd = os.open(tmp_path / ".lock", os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        with pytest.raises(RunFolderBusy, match=f"pid {os.getpid()}"):
            lock_run_dir(tmp_path)
    fd = os.open(tmp_path / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    finally:
        os.close(fd)


def test_symbolic_links_are_never_written_through(tmp_path, base_run, capsys):
    run = _copy(base_run, tmp_path / "runs")
    outside = tmp_path / "outside"
    shutil.move(run / "checkpoints", outside)
    (run / "checkpoints").symlink_to(outside, target_is_directory=True)
    before_run, before_outside = snapshot(run), snapshot(outside)
    assert main(["fit", "--resume", str(run), "trainer.max_steps=4"]) == 2
    _one_line_error(capsys, str(run / "checkpoints"), "symbolic link")
    assert snapshot(run) == before_run and snapshot(outside) == before_outside
    # the run folder itself a link (to an empty folder elsewhere): a new run does not start in it
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "runs" / "linked").symlink_to(target, target_is_directory=True)
    for extra in ((), ("--overwrite",)):
        assert _fit(tmp_path / "runs", "linked", *extra) == 2
        _one_line_error(capsys, str(tmp_path / "runs" / "linked"), "symbolic link")
        assert list(target.iterdir()) == []
    # a checkpoint is never written into a linked folder
    from rlattention.engine.checkpoint import CheckpointError, atomic_torch_save

    with pytest.raises(CheckpointError, match="symbolic link"):
        atomic_torch_save({"x": 1}, run / "checkpoints" / "new.ckpt")
    assert snapshot(outside) == before_outside


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".hidden", "a\\b", "/abs"])
def test_run_names_are_single_folder_names(tmp_path, name, capsys):
    out = tmp_path / "out"
    out.mkdir()
    assert _fit(out, name) == 2
    _one_line_error(capsys, "trainer.run_name", repr(name))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and list(out.iterdir()) == []
    assert check_run_name("fine_name-1.v2") == "fine_name-1.v2"
    with pytest.raises(ValueError, match="trainer.run_name"):
        check_run_name("   ")


def _edit_checkpoint(path: Path, edit) -> None:
    ckpt = torch.load(path, weights_only=True)
    edit(ckpt["model"])
    torch.save(ckpt, path)


@pytest.mark.parametrize(
    "how, fragments",
    [
        ("missing", ["1 missing", "glimpse_net.fc_g.weight"]),
        ("extra", ["1 unexpected", "surprise.weight"]),
        ("shape", ["1 of another shape", "glimpse_net.fc_g.weight", "[3, 3]"]),
        ("empty", ["missing", "in all"]),
    ],
)
def test_a_checkpoint_that_does_not_fit_is_never_resumed(tmp_path, base_run, capsys, how, fragments):
    run = _copy(base_run, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    keys = list(load_checkpoint_file(last)["model"])
    key = "glimpse_net.fc_g.weight" if "glimpse_net.fc_g.weight" in keys else keys[0]
    fragments = [f.replace("glimpse_net.fc_g.weight", key) for f in fragments]
    edits = {
        "missing": lambda m: m.pop(key),
        "extra": lambda m: m.__setitem__("surprise.weight", torch.zeros(2)),
        "shape": lambda m: m.__setitem__(key, torch.zeros(3, 3)),
        "empty": lambda m: m.clear(),
    }
    _edit_checkpoint(last, edits[how])
    before = snapshot(run)
    assert main(["fit", "--resume", str(run), "trainer.max_steps=4"]) == 2
    _one_line_error(capsys, str(last), "do not fit", *fragments)
    assert {k: v for k, v in snapshot(run).items() if k != ".lock"} == {k: v for k, v in before.items() if k != ".lock"}
    assert load_checkpoint_file(last)["progress"]["step"] == 2
    # evaluating it: the same one-line error
    assert main(["eval", str(last)]) == 2
    _one_line_error(capsys, "do not fit", *fragments)


def test_resume_takes_the_run_folder_or_any_checkpoint_inside_it(tmp_path, base_run, capsys):
    run = _copy(base_run, tmp_path)
    deep = run / "checkpoints" / "kept" / "step2.ckpt"
    deep.parent.mkdir()
    shutil.copy(run / "checkpoints" / "last.ckpt", deep)
    assert resolve_resume(run) == (run, run / "checkpoints" / "last.ckpt")
    assert resolve_resume(run / "checkpoints") == (run, run / "checkpoints" / "last.ckpt")
    assert resolve_resume(deep) == (run, deep)

    kept = snapshot(deep.parent)
    capsys.readouterr()
    assert main(["fit", "--resume", str(run / "checkpoints" / "last.ckpt"), "trainer.max_steps=3"]) == 0
    assert f"run folder: {run}\n" in capsys.readouterr().out
    assert load_checkpoint_file(run)["progress"]["step"] == 3
    assert main(["fit", "--resume", str(run), "trainer.max_steps=4"]) == 0
    assert f"run folder: {run}\n" in capsys.readouterr().out
    assert load_checkpoint_file(run)["progress"]["step"] == 4
    assert main(["fit", "--resume", str(deep), "trainer.max_steps=3"]) == 0  # back from step 2, in the same run
    assert f"run folder: {run}\n" in capsys.readouterr().out
    assert load_checkpoint_file(run)["progress"]["step"] == 3
    assert json.loads((run / "report.json").read_text())["run_dir"] == str(run)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and snapshot(deep.parent) == kept

    # a run folder without checkpoints, a folder that is no run, --overwrite with --resume: one-line errors
    empty = tmp_path / "nockpt"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "config.yaml").write_text("method: ram\n")
    assert main(["fit", "--resume", str(empty)]) == 2
    _one_line_error(capsys, str(empty), "no checkpoint")
    assert main(["fit", "--resume", str(tmp_path)]) == 2
    _one_line_error(capsys, str(tmp_path), "not a run folder")
    with pytest.raises(SystemExit, match="--overwrite"):
        main(["fit", "--resume", str(run), "--overwrite"])


def _idx(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def test_resume_needs_no_data_dir(tmp_path, monkeypatch, capsys):
    """A dataset read from files (MNIST, 100 random images): the run records its data folder; --resume finds it
    again without --data-dir, an explicit --data-dir still wins."""
    monkeypatch.delenv("RLATTENTION_DATA", raising=False)
    data = tmp_path / "mnist"
    data.mkdir()
    rng = np.random.default_rng(0)
    for images, labels, n in (
        ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", 100),
        ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", 32),
    ):
        (data / images).write_bytes(_idx(rng.integers(0, 256, (n, 28, 28))))
        (data / labels).write_bytes(_idx(rng.integers(0, 10, n)))
    argv = [a for a in TINY if not a.startswith(("data.name", "data.num_", "data.canvas"))]
    mnist = ["data.name=mnist", "data.val_size=20"]
    out = tmp_path / "runs"
    assert main(["fit", *argv, *mnist, f"trainer.out_dir={out}", "trainer.run_name=m", "--data-dir", str(data)]) == 0
    run = out / "m"
    assert load_checkpoint_file(run)["config"]["data"]["data_dir"] == str(data)
    assert f"data_dir: {data}" in (run / "config.yaml").read_text()
    before = snapshot(data)
    assert main(["fit", "--resume", str(run), "trainer.max_steps=3"]) == 0
    assert load_checkpoint_file(run)["progress"]["step"] == 3
    # --data-dir wins over the recorded folder (a copy elsewhere) and is recorded in turn
    moved = tmp_path / "moved"
    shutil.copytree(data, moved)
    assert main(["fit", "--resume", str(run), "trainer.max_steps=4", "--data-dir", str(moved)]) == 0
    ckpt = load_checkpoint_file(run)
    assert ckpt["progress"]["step"] == 4 and ckpt["config"]["data"]["data_dir"] == str(moved)
    assert snapshot(data) == before


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_of_a_diverged_run_are_never_evaluated_or_resumed(tmp_path, base_run, capsys, value):
    """A checkpoint holding a NaN or infinite weight: ``eval`` and ``--resume`` give one line naming the file and
    the tensor, instead of metrics computed from NaN outputs; nothing in the run folder changes."""
    run = _copy(base_run, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    key = next(k for k, v in load_checkpoint_file(last)["model"].items() if v.is_floating_point() and v.numel() > 1)
    _edit_checkpoint(last, lambda m: m[key].view(-1).__setitem__(1, value))
    before = {k: v for k, v in snapshot(run).items() if k != ".lock"}
    assert main(["eval", str(last)]) == 2
    _one_line_error(capsys, str(last), "NaN or infinite", key, "diverged")
    assert main(["fit", "--resume", str(run), "trainer.max_steps=4"]) == 2
    _one_line_error(capsys, str(last), "NaN or infinite", key)
    assert {k: v for k, v in snapshot(run).items() if k != ".lock"} == before
