"""What ``eval`` and ``viz`` leave behind (issue 24, "a user's first day"): ``eval`` keeps its results in
``eval.json`` (``eval-2.json``... never over an earlier one, never through a link), ``viz`` writes a new folder
and never touches the training ``figures/``, and a method that draws no figures says so in one line."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest
import torch
import yaml

import rlattention
from rlattention.cli import main
from rlattention.engine.method import AttentionMethod
from rlattention.engine.registry import available_methods, get_method

TINY = [
    "data.name=digits",
    "data.num_train=128",
    "data.val_size=64",
    "data.num_test=64",
    "data.canvas_size=32",
    "model.num_glimpses=2",
    "model.hidden_size=32",
    "model.glimpse_dim=32",
    "trainer.batch_size=64",
    "trainer.eval_batch_size=64",
    "trainer.epochs=1",
    "trainer.progress=false",
    "trainer.num_threads=1",
    "eval.viz_images=2",
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for f in fragments:
        assert f in err[0], (f, err[0])
    return err[0]


@pytest.fixture(scope="module")
def ram_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    assert main(["fit", *TINY, f"trainer.out_dir={out}", "trainer.run_name=ram"]) == 0
    return out / "ram"


@pytest.fixture
def run(ram_run: Path, tmp_path: Path) -> Path:
    """A copy of the tiny RAM run, so that each test starts from a run folder without eval or viz outputs."""
    import shutil

    copy = tmp_path / "ram"
    shutil.copytree(ram_run, copy, ignore=shutil.ignore_patterns(".lock"))
    return copy


def test_eval_writes_eval_json_and_never_overwrites_it(run: Path, capsys) -> None:
    ckpt = run / "checkpoints" / "best.ckpt"
    capsys.readouterr()
    assert main(["eval", str(ckpt), "--json", "--mc-samples", "2", "--seed", "7"]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)  # stdout: the metrics' JSON line alone
    assert captured.err.strip() == f"results: {run / 'eval.json'}"
    saved = json.loads((run / "eval.json").read_text())
    assert saved["metrics"] == printed  # the names and values the console shows
    assert saved["checkpoint"] == str(ckpt.absolute()) and saved["checkpoint_sha256"] == sha256(ckpt)
    assert (saved["split"], saved["seed"], saved["mc_samples"], saved["attack"]) == ("test", 7, 2, None)
    # the data folder the evaluation resolved: none for these built-in digits, unless the run or the environment
    # names one ($RLATTENTION_DATA, as CI sets it; fit records it in the run's config)
    from rlattention.data.registry import resolve_data_dir

    recorded = yaml.safe_load((run / "config.yaml").read_text())["data"].get("data_dir")
    folder = resolve_data_dir(recorded)
    expected = None if folder is None else str(folder.absolute())
    assert (saved["method"], saved["dataset"], saved["data_dir"], saved["images"]) == ("ram", "digits", expected, 64)
    assert saved["command"] == shlex.join(
        ["rlattention", "eval", str(ckpt), "--json", "--mc-samples", "2", "--seed", "7"]
    )
    assert saved["versions"]["rlattention"] == rlattention.__version__
    assert saved["versions"]["torch"] == torch.__version__
    assert saved["summary"].startswith("test: accuracy") and saved["time"]
    first = sha256(run / "eval.json")

    # a second evaluation (under attack, on another split) goes to eval-2.json; eval.json is unchanged
    argv = ["eval", str(run), "--split", "val", "--attack", "pgd", "--epsilon", "0.1", "--steps", "1", "--limit", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == f"results: {run / 'eval-2.json'}" and out[0].startswith("val: accuracy")
    assert sha256(run / "eval.json") == first
    second = json.loads((run / "eval-2.json").read_text())
    assert second["attack"] == {"name": "pgd", "epsilon": 0.1, "step_size": 0.01, "steps": 1}
    assert second["split"] == "val" and second["images"] == 8 and second["metrics"]["count"] == 8
    assert second["checkpoint"] == str((run / "checkpoints" / "last.ckpt").absolute())

    # --no-save writes nothing; --out FILE writes that new file only, and never over an existing one
    before = snapshot(run)
    assert main(["eval", str(ckpt), "--no-save"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("test: accuracy") and "results:" not in line and snapshot(run) == before
    out_file = run.parent / "elsewhere" / "mine.json"
    assert main(["eval", str(ckpt), "--out", str(out_file)]) == 0
    assert json.loads(out_file.read_text())["summary"] == line and snapshot(run) == before
    kept = sha256(out_file)
    capsys.readouterr()
    assert main(["eval", str(ckpt), "--out", str(out_file)]) == 2
    one_line(capsys, str(out_file), "exists", "never overwritten")
    assert sha256(out_file) == kept


def test_eval_outside_a_run_folder_writes_next_to_the_checkpoint(run: Path, tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    ckpt = loose / "model.ckpt"
    ckpt.write_bytes((run / "checkpoints" / "best.ckpt").read_bytes())
    assert main(["eval", str(ckpt)]) == 0
    assert json.loads((loose / "eval.json").read_text())["checkpoint_sha256"] == sha256(ckpt)


def test_eval_refuses_a_linked_result_with_one_line(run: Path, tmp_path: Path, capsys) -> None:
    target = tmp_path / "victim.json"
    target.write_text("keep me")
    (run / "eval.json").symlink_to(target)
    before = snapshot(run)
    capsys.readouterr()
    assert main(["eval", str(run / "checkpoints" / "best.ckpt"), "--json"]) == 2
    one_line(capsys, str(run / "eval.json"), "symbolic link", "never written through a link")
    assert target.read_text() == "keep me" and snapshot(run) == before
    assert not (run / "eval-2.json").exists()
    linked_run = tmp_path / "linked"
    linked_run.symlink_to(run, target_is_directory=True)  # the run folder itself a link
    (run / "eval.json").unlink()
    assert main(["eval", str(linked_run / "checkpoints" / "best.ckpt")]) == 2
    one_line(capsys, str(linked_run), "symbolic link")
    assert not (run / "eval.json").exists()


def test_viz_writes_a_new_folder_and_leaves_figures_alone(run: Path, capsys) -> None:
    figures = snapshot(run / "figures")
    assert len(figures) == 2
    assert main(["viz", str(run / "checkpoints" / "best.ckpt"), "--num-images", "2"]) == 0
    assert sorted(p.name for p in (run / "viz").iterdir()) == ["glimpses_000.png", "glimpses_001.png"]
    first = snapshot(run / "viz")
    assert main(["viz", str(run), "--num-images", "1"]) == 0  # a run folder: its last.ckpt
    assert [p.name for p in (run / "viz-2").iterdir()] == ["glimpses_000.png"]
    assert snapshot(run / "figures") == figures and snapshot(run / "viz") == first
    printed = capsys.readouterr().out.split()
    assert printed[-1] == str(run / "viz-2" / "glimpses_000.png")

    # --out: a new or empty folder; a used one needs --overwrite
    capsys.readouterr()
    assert main(["viz", str(run), "--out", str(run / "viz")]) == 2
    one_line(capsys, str(run / "viz"), "not an empty folder")
    assert snapshot(run / "viz") == first
    assert main(["viz", str(run), "--out", str(run / "viz"), "--num-images", "1", "--overwrite"]) == 0
    empty = run.parent / "empty"
    empty.mkdir()
    assert main(["viz", str(run), "--out", str(empty), "--num-images", "1"]) == 0
    assert [p.name for p in empty.iterdir()] == ["glimpses_000.png"]


def test_viz_never_writes_through_a_link(run: Path, tmp_path: Path, capsys) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "viz").symlink_to(elsewhere, target_is_directory=True)
    (run / "viz-2").mkdir()
    (run / "viz-2" / "glimpses_000.png").symlink_to(tmp_path / "victim.png")
    capsys.readouterr()
    assert main(["viz", str(run), "--num-images", "1"]) == 2
    one_line(capsys, str(run / "viz"), "symbolic link")
    assert not list(elsewhere.iterdir())
    assert main(["viz", str(run), "--num-images", "1", "--out", str(run / "viz-2"), "--overwrite"]) == 2
    one_line(capsys, str(run / "viz-2"), "symbolic links", "glimpses_000.png")
    assert not (tmp_path / "victim.png").exists()


@pytest.mark.parametrize("method", available_methods())
def test_every_method_draws_figures_or_says_why(method: str) -> None:
    """Each registered method either implements ``visualize`` / ``visualize_split`` or names, in one sentence,
    why it draws nothing (printed by ``rlattention viz``)."""
    cls = get_method(method)
    reason = cls.visualization_unavailable()
    overrides = (
        cls.visualize is not AttentionMethod.visualize or cls.visualize_split is not AttentionMethod.visualize_split
    )
    if reason is None:
        assert overrides, method
    else:
        assert reason.strip() and "\n" not in reason
        assert method in {"cnn", "darp_triplet", "darp_policy"} or not overrides, method


def test_viz_of_a_method_without_figures_is_one_line(tmp_path: Path, capsys) -> None:
    tiny = [a for a in TINY if not a.startswith(("model.", "eval."))]
    assert main(["fit", "method=cnn", *tiny, f"trainer.out_dir={tmp_path}", "trainer.run_name=cnn"]) == 0
    before = snapshot(tmp_path / "cnn")
    capsys.readouterr()
    assert main(["viz", str(tmp_path / "cnn")]) == 2
    line = one_line(capsys, "rlattention viz: cnn draws no figures", "without attention")
    assert "Traceback" not in line and "NotImplementedError" not in line
    assert snapshot(tmp_path / "cnn") == before and not (tmp_path / "cnn" / "viz").exists()


def test_a_two_process_eval_writes_one_file_from_rank_0(run: Path) -> None:
    """Fabric's launcher re-runs the command line for rank 1: only rank 0 prints and writes eval.json."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK")}
    env.pop("WORLD_SIZE", None)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(repo), env.get("PYTHONPATH", "")]))
    args = ["eval", str(run / "checkpoints" / "best.ckpt"), "--json", "--devices", "2", "--batch-size", "16"]
    proc = subprocess.run(
        [sys.executable, "-m", "rlattention.cli", *args], cwd=run.parent, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in run.glob("eval*.json")) == ["eval.json"]
    saved = json.loads((run / "eval.json").read_text())
    assert saved["metrics"] == json.loads(proc.stdout) and saved["devices"] == 2
    assert proc.stderr.count("results: ") == 1


def test_a_model_that_cannot_draw_is_one_line_and_leaves_no_folder(run: Path, capsys, monkeypatch) -> None:
    """As dcpg with model.pg=none (no attention policy): visualize raises NotImplementedError saying why."""
    from rlattention.methods.ram import RAM

    def cannot(self, *args, **kwargs):
        raise NotImplementedError("this configuration has no attention weights to draw")

    monkeypatch.setattr(RAM, "visualize", cannot)
    before = snapshot(run)
    capsys.readouterr()
    assert main(["viz", str(run)]) == 2
    one_line(capsys, "rlattention viz: ram draws no figures for", "no attention weights to draw")
    assert snapshot(run) == before and not (run / "viz").exists()
