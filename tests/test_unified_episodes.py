"""benchmarks/unified_episodes.py on a tiny RAM run of the drawn digits (no data folder), made and summarised as a
study makes it: the single pass it measures again is the one the study recorded, the K-episode figures are those of
``rlattention eval --mc-samples K`` on the whole splits, a record is kept once, a checkpoint that is gone is named
(exit 1) or trained again by its recorded command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from tiny_runs import config_of, eval_in_process, tiny_ram

TINY = tiny_ram(train=256, val=48, test=64, extra=["optim.lr=0.01", "trainer.epochs=2", "trainer.deterministic=true"])


@pytest.fixture(scope="module")
def episodes(benchmark_module):
    return benchmark_module("unified_episodes")


@pytest.fixture(scope="module")
def source(benchmark_module, tmp_path_factory) -> Path:
    """A source study folder: one issue row (``ram``, chosen among one candidate) of one seed, its run in ``work``."""
    study = benchmark_module("study")
    root = tmp_path_factory.mktemp("source")
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump({"method": "ram", **config_of(TINY)}))
    work, out = root / "runs", root / "unified_tiny"
    work.mkdir()
    record = study.run_one(study.Row("ram_lr", str(config)), 0, None, work, 1, [])
    (out / "runs.jsonl").parent.mkdir()
    (out / "runs.jsonl").write_text(json.dumps(record) + "\n")
    rows = [study.Row("ram", str(config), candidates=("ram_lr",), select_key="best_val_accuracy"),
            study.Row("ram_lr", str(config), issue_row=False)]  # fmt: skip

    def metrics(report: dict) -> dict[str, float]:
        return {"test_error": report["test"]["error"]}  # percent, as fit reports it

    study.summarise("unified_tiny", rows, [record], metrics, "d", "c", out, seeds=(0,))
    return out


def test_the_tested_checkpoint_is_measured_then_a_gone_one_named_and_retrained(
    episodes, source, tmp_path, capsys, monkeypatch
):
    """The run the source study tested: its single pass measured again is the recorded one, and the K-episode figures
    are those of the recorded ``rlattention eval`` commands on the whole splits. Then, its folder gone, a new table
    names it and exits 1, and ``--retrain-missing`` trains it again (it reproduces here) and measures it. The
    evaluations run in this process, and one recorded command once as the tool runs it (a process of its own)."""
    import shlex

    from study import run_dir_of

    src = json.loads((source / "runs.jsonl").read_text())
    out = tmp_path / "unified_tiny_episodes"
    argv = ["--source", str(source), "--out", str(out), "--mc-samples", "4", "--seed", "7"]
    run_eval = episodes.run_eval
    monkeypatch.setattr(episodes, "run_eval", eval_in_process)
    assert episodes.main(argv) == 0
    (rec,) = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert rec["row"] == "ram" and rec["source_row"] == "ram_lr"  # the issue row, from its chosen candidate's run
    assert rec["source_command"] == src["command"] and "retrained" not in rec
    report = rec["report"]
    assert report["test_error"] == pytest.approx(src["report"]["test"]["error"], abs=1e-4)  # the tested checkpoint
    assert report["val_count"] == 48 and report["test_count"] == 64  # the whole splits
    assert report["val_error"] == pytest.approx(100.0 - src["report"]["best_val_accuracy"])
    single, val_mc, test_mc = (shlex.split(c) for c in rec["command"].split(" && "))
    assert "--mc-samples" not in single and single[single.index("--split") + 1] == "test"
    for argv_mc, split in ((val_mc, "val"), (test_mc, "test")):
        assert argv_mc[argv_mc.index("--split") + 1] == split
        assert argv_mc[argv_mc.index("--mc-samples") + 1] == "4" and argv_mc[argv_mc.index("--seed") + 1] == "7"
    assert run_eval(test_mc, 1)["error"] == pytest.approx(report["test_error_mc"], abs=1e-4)  # the command reproduces
    doc = json.loads((out / "summary.json").read_text())
    (row,) = doc["rows"]
    assert set(row["metrics"]) == {"test_error", "test_error_mc4", "val_error", "val_error_mc4"}
    assert "equals the source study's recorded one" in (out / "summary.md").read_text()
    capsys.readouterr()
    assert episodes.main(argv) == 0  # recorded: not evaluated again
    assert "ram seed 0 ..." not in capsys.readouterr().out
    with pytest.raises(SystemExit, match="was measured with"):  # other settings do not join this table
        episodes.main([*argv[:-2], "--seed", "8"])

    shutil.rmtree(run_dir_of(src["command"]))
    again = tmp_path / "unified_tiny_episodes_again"
    argv = ["--source", str(source), "--out", str(again), "--mc-samples", "2"]
    assert episodes.main(argv) == 1
    assert "Not measured" in (again / "summary.md").read_text() and "ram seed 0" in capsys.readouterr().err
    assert episodes.main([*argv, "--retrain-missing"]) == 0
    (rec,) = [json.loads(line) for line in (again / "runs.jsonl").read_text().splitlines()]
    assert rec["retrained"]["test_accuracy_retrained"] == rec["retrained"]["test_accuracy_recorded"]
    assert rec["retrained"]["best_val_accuracy_retrained"] == rec["retrained"]["best_val_accuracy_recorded"]
    assert rec["report"]["test_error"] == pytest.approx(src["report"]["test"]["error"], abs=1e-4)
    assert "Trained again" in (again / "summary.md").read_text()


def test_a_single_pass_that_differs_from_the_record_is_named_with_its_cause(episodes):
    def rec(seed: int, now: float, retrained: bool) -> dict:
        report = {"test_error": now, "test_error_recorded": 1.0}
        return {"row": "ram", "seed": seed, "report": report, **({"retrained": {}} if retrained else {})}

    assert "equals" in episodes.agreement_md([rec(0, 1.00004, False)])  # within the 4 decimals kept
    text = episodes.agreement_md([rec(0, 1.2, True), rec(1, 1.0, False), rec(2, 0.9, False)])
    assert "ram seed 0 (1.20 against 1.00; retrained)" in text and "ram seed 1" not in text
    assert "ram seed 2 (0.90 against 1.00; not retrained: its best.ckpt may not be the one tested)" in text


def test_a_table_made_on_another_run_of_a_row_is_not_extended(episodes, source, tmp_path):
    """The source summary now names another run for a row and seed (another candidate chosen): the table made on the
    old one stops with both commands, instead of reporting the old run's figures under the row."""
    src = json.loads((source / "runs.jsonl").read_text())
    out = tmp_path / "unified_tiny_episodes"
    out.mkdir()
    old = {"row": "ram", "seed": 0, "source_command": src["command"] + " optim.lr=0.1", "settings": {"mc_samples": 4,
           "eval_seed": 7}, "report": {}}  # fmt: skip
    (out / "runs.jsonl").write_text(json.dumps(old) + "\n")
    with pytest.raises(SystemExit, match="now names the run of"):
        episodes.main(["--source", str(source), "--out", str(out), "--mc-samples", "4", "--seed", "7"])
