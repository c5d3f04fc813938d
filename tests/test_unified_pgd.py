"""benchmarks/unified_pgd.py: a finished study's checkpoints attacked with PGD and tabulated, on a tiny CNN run of the
embedded digits (no data folder): the attack lowers the accuracy it reports, the record continues instead of
repeating, and the summary follows the results schema."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = [  # a small CNN on the embedded digits: about 60% test accuracy in 15 s, something for PGD to take away
    "method=cnn",
    "data.name=digits",
    "data.num_train=1024",
    "data.val_size=64",
    "data.num_test=64",
    "data.canvas_size=28",
    "model.channels=[16,32]",
    "model.hidden=64",
    "optim.lr=0.003",
    "trainer.batch_size=64",
    "trainer.epochs=6",
    "trainer.progress=false",
    "trainer.num_threads=1",
    "eval.viz_images=0",
]


@pytest.fixture(scope="module")
def pgd(benchmark_module):
    return benchmark_module("unified_pgd")


def test_metrics_are_percent_and_the_share_kept(pgd):
    report = {"accuracy": {"clean": 80.0, "0.01": 40.0, "0.1": 0.0}, "epsilons": [0.01, 0.1]}
    assert pgd.metrics(report) == {
        "accuracy_clean": 80.0,
        "accuracy_eps0.01": 40.0,
        "accuracy_eps0.1": 0.0,
        "kept_eps0.01": 50.0,
        "kept_eps0.1": 0.0,
    }
    argv = pgd.eval_argv(Path("run/best.ckpt"), "data", 1000, 0.02)
    assert argv[argv.index("--epsilon") + 1] == "0.02" and argv[argv.index("--step-size") + 1] == "0.005"
    assert "--attack" not in pgd.eval_argv(Path("run/best.ckpt"), None, 1000, None)


def test_a_finished_run_is_attacked_recorded_once_and_summarised(pgd, benchmark_module, tmp_path, capsys, monkeypatch):
    # the evaluations run in this process: run_eval's own subprocess runs in tests/test_unified_episodes.py
    from tiny_runs import eval_in_process

    from rlattention.engine.config import load_config
    from rlattention.engine.trainer import fit

    overrides = [*TINY, f"trainer.out_dir={tmp_path}", "trainer.run_name=cnn_s0"]
    fit(load_config(None, overrides))
    monkeypatch.setattr(pgd, "run_eval", eval_in_process)
    source = tmp_path / "source"
    source.mkdir()
    command = shlex.join(["rlattention", "fit", *overrides])
    record = {"row": "cnn", "seed": 0, "config": "configs/cnn_cluttered60.yaml", "command": command}
    (source / "runs.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "project" / "benchmarks" / "results" / "unified_pgd"
    argv = ["--source", str(source), "--out", str(out), "--epsilons", "0.3", "--limit", "64"]
    # --seeds / --rows: only those runs now (two processes can share a table); an unknown row is refused
    assert pgd.main([*argv, "--seeds", "1"]) == 0 and not (out / "runs.jsonl").exists()
    with pytest.raises(SystemExit):
        pgd.main([*argv, "--rows", "nope"])
    assert "not rows of" in capsys.readouterr().err
    assert pgd.main([*argv, "--rows", "cnn", "--seeds", "0"]) == 0
    doc = json.loads((out / "summary.json").read_text())
    (row,) = doc["rows"]
    assert row["name"] == "cnn" and row["seeds"] == [0]
    clean, attacked = row["metrics"]["accuracy_clean"][0], row["metrics"]["accuracy_eps0.3"][0]
    assert clean > 30.0  # the tiny model has learned something to attack (10 classes: chance is 10%)
    assert attacked < clean  # a budget of 0.3 of the pixel range takes accuracy away
    assert (out / "figures" / "pgd_accuracy.png").stat().st_size > 0
    capsys.readouterr()
    assert pgd.main(argv) == 0  # recorded: not attacked again
    assert "cnn seed 0 ..." not in capsys.readouterr().out
    assert len((out / "runs.jsonl").read_text().splitlines()) == 1
    assert "1 torch thread(s) per run" in doc["machine"]
    cpu = json.loads((out / "runs.jsonl").read_text())["cpu"]  # the CPU the attack ran on, named in the summary
    assert cpu == benchmark_module("study").cpu_model() and f"the runs' CPUs: {cpu} (1 run)" in doc["machine"]
    # a source run whose folder is gone (the machine that trained it is not this one): the others are still
    # tabulated, the gone one is named in the summary and the exit status says the table is not the whole study
    gone = {**record, "row": "ram", "command": command.replace("cnn_s0", "ram_s0")}
    (source / "runs.jsonl").write_text(json.dumps(record) + "\n" + json.dumps(gone) + "\n")
    assert pgd.main(argv) == 1
    partial = (out / "summary.md").read_text()
    assert "Not attacked" in partial and "ram seed 0" in partial and str(tmp_path / "ram_s0") in partial
    assert [r["name"] for r in json.loads((out / "summary.json").read_text())["rows"]] == ["cnn"]
    assert len((out / "runs.jsonl").read_text().splitlines()) == 1
    (source / "runs.jsonl").write_text(json.dumps(record) + "\n")
    assert pgd.main(argv) == 0
    other = ["--source", str(source), "--out", str(out), "--epsilons", "0.1", "--limit", "64"]
    with pytest.raises(SystemExit, match="cnn seed 0 was attacked with .*'epsilons': \\[0.3\\]"):
        pgd.main(other)  # other budgets would not share the table: refused, the records untouched
    assert len((out / "runs.jsonl").read_text().splitlines()) == 1
    # another source's table lives in a folder of its own, and its study is named after that folder
    other_out = out.parent / "unified_pgd_tiny"
    other_out.mkdir()
    (other_out / "runs.jsonl").write_text((out / "runs.jsonl").read_text())
    argv = ["--source", str(source), "--out", str(other_out), "--epsilons", "0.3", "--limit", "64", "--summary-only"]
    assert pgd.main(argv) == 0
    other_doc = json.loads((other_out / "summary.json").read_text())
    assert other_doc["study"] == "unified_pgd_tiny" and other_doc["rows"][0]["metrics"] == row["metrics"]
    assert f"--out {other_out}" in other_doc["command"]
    checker = ROOT.parent / "shared" / "tools" / "check_results.py"
    if checker.is_file():  # the schema of ../shared/RESULTS.md, as the project's own check reads it
        proc = subprocess.run([sys.executable, str(checker), str(tmp_path / "project")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rows_in_the_source_studys_order(pgd):
    # unified_cluttered100's rows finished ram, topdown, entropy_context, entropy, then cnn: the table lists them
    # as the study defines them; rows of an unknown source keep their recorded order
    finished = ["ram", "topdown", "entropy_context", "entropy", "cnn", "ram"]
    assert pgd.row_order("unified_cluttered100", finished) == ["cnn", "ram", "topdown", "entropy", "entropy_context"]
    assert pgd.row_order("unified_cluttered100", ["entropy", "ram"]) == ["ram", "entropy"]
    assert pgd.row_order("source", ["b", "a", "b", "c"]) == ["b", "a", "c"]


def test_a_gone_checkpoint_is_named_or_trained_again_by_its_recorded_command(
    pgd, benchmark_module, tmp_path, capsys, monkeypatch
):
    # the source study's record made as the study makes it (study.run_one), its run folder then deleted, as when
    # the machine that trained it is gone: without --retrain-missing the table says so and exits 1; with it the run
    # is trained again by its recorded command and seed, and (training being deterministic here) it reproduces
    import yaml

    study = benchmark_module("study")
    config = tmp_path / "tiny.yaml"
    from tiny_runs import config_of, eval_in_process

    monkeypatch.setattr(pgd, "run_eval", eval_in_process)  # the fits run as the tool runs them: subprocesses

    nested = config_of(TINY)  # a shorter run: what is asserted is that it reproduces, not what it learns
    data, trainer = {**nested["data"], "num_train": 256}, {**nested["trainer"], "epochs": 2}
    config.write_text(yaml.safe_dump({**nested, "data": data, "trainer": trainer}))
    work = tmp_path / "runs"
    work.mkdir()
    record = study.run_one(study.Row("cnn", str(config)), 0, None, work, 1, [])
    source = tmp_path / "source"
    source.mkdir()
    (source / "runs.jsonl").write_text(json.dumps(record) + "\n")
    shutil.rmtree(work)  # the whole work folder, as on a new machine: the retraining makes it again
    out = tmp_path / "unified_pgd"
    argv = ["--source", str(source), "--out", str(out), "--epsilons", "0.3", "--limit", "64"]
    assert pgd.main(argv) == 1
    assert "Not attacked" in (out / "summary.md").read_text() and not (out / "runs.jsonl").exists()
    assert "cnn seed 0" in capsys.readouterr().err
    assert pgd.main([*argv, "--retrain-missing"]) == 0
    assert (work / "cnn_s0" / "checkpoints" / "best.ckpt").is_file()
    (attack,) = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    again = attack["retrained"]
    assert again["command"] == record["command"]
    assert again["test_accuracy_retrained"] == again["test_accuracy_recorded"] == record["report"]["test"]["accuracy"]
    summary = (out / "summary.md").read_text()
    assert "Trained again for this table" in summary and "cnn seed 0 (the same)" in summary
    assert "Not attacked" not in summary
    assert json.loads((out / "summary.json").read_text())["command"].endswith("--retrain-missing")
    # a record whose command cannot be rebuilt (another data folder) is refused, not trained into its folder
    shutil.rmtree(work / "cnn_s0")
    (out / "runs.jsonl").unlink()
    with pytest.raises(SystemExit, match="cannot retrain"):
        pgd.main([*argv, "--retrain-missing", "--data-dir", str(tmp_path)])
    assert not (work / "cnn_s0").exists()


def test_the_retrained_line_names_a_changed_accuracy_with_two_decimals(pgd):
    """A retrained checkpoint that did not reproduce reads '88.76% against 89.40%', not a float's repr."""

    def again(was, now):
        return {"test_accuracy_recorded": was, "test_accuracy_retrained": now}

    records = [
        {"row": "ram", "seed": 1, "retrained": again(89.4, 88.75999999999999)},
        {"row": "ram", "seed": 0, "retrained": again(89.9, 89.9)},
        {"row": "cnn", "seed": 0},
    ]
    line = pgd.retrained_md(records)
    assert "ram seed 1 (88.76% against 89.40%)" in line and "ram seed 0 (the same)" in line
    assert "cnn" not in line and "99999" not in line
    assert pgd.retrained_md(records[2:]) == ""
