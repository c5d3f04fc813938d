"""benchmarks/study.py: a run recorded at a smaller epoch cap than its row's is continued to the row's cap
(``extend_one``) and ends as the run of the larger cap trained from the start; its earlier outputs are kept beside,
its earlier record stays in runs.jsonl but no longer counts; what cannot be continued exactly (a cap-dependent
schedule, another config, another early-stopping state) is refused with the reason and nothing is touched."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from tiny_runs import RESUMABLE

from rlattention.engine.rundir import RunFolderBusy, lock_run_dir

BASE = [o for o in RESUMABLE if not o.startswith("trainer.epochs=")] + [
    "optim.schedule=none",  # ram_digits.yaml decays lr and sigma over the cap; an extension needs neither
    "model.std_final=null",
    "trainer.early_stop_patience=5",
]


def _row(study, cap: int, start: int, *extra: str, extendable: bool = True):
    overrides = [*BASE, f"trainer.epochs={cap}", f"trainer.early_stop_start_epoch={start}", *extra]
    return study.Row("tiny", "configs/ram_digits.yaml", overrides, "a tiny RAM", extendable=extendable)


@pytest.fixture(scope="module")
def study(benchmark_module):
    return benchmark_module("study")


@pytest.fixture(scope="module")
def longer(study, tmp_path_factory) -> dict:
    """The record of the 4-epoch run trained from the start (early stopping monitored from epoch 2)."""
    return study.run_one(_row(study, 4, 2), 0, None, tmp_path_factory.mktemp("longer"), 1, [])


def _short(study, work: Path) -> dict:
    """A 2-epoch run (monitored from epoch 1) recorded as a study records it."""
    rec = study.run_one(_row(study, 2, 1), 0, None, work, 1, [])
    with (work / "runs.jsonl").open("a") as f:
        f.write(json.dumps(rec) + "\n")
    return rec


def _metrics(report: dict) -> dict[str, float]:
    return {"test_error": 100.0 - report["test"]["accuracy"]}


def test_a_run_recorded_at_a_smaller_cap_is_extended_to_the_run_of_the_larger_cap(study, longer, tmp_path):
    short = _short(study, tmp_path)
    curve = short["validation_curves"]["val/accuracy"]
    # monitored from epoch 1 or from epoch 2, the early-stopping state after epoch 2 is the same only when epoch 2
    # improved on epoch 1; this deterministic run does (else the extension must be refused, tested below)
    assert curve[1] > curve[0], curve
    run = tmp_path / "tiny_s0"
    earlier_report = (run / "report.json").read_text()
    earlier_best = (run / "checkpoints" / "best.ckpt").read_bytes()
    argv = ["--out", str(tmp_path), "--work", str(tmp_path), "--seeds", "0", "--threads", "1"]
    assert study.main("tiny", [_row(study, 4, 2)], _metrics, "extension", argv=argv, default_seeds=(0,)) == 0
    records = study._records(tmp_path / "runs.jsonl")
    assert len(records) == 2 and records[0] == short  # the earlier record is kept as it was
    rec = records[1]
    # the extended run is the larger cap's run: the same selected model, test figures and curve (CPU, deterministic)
    assert rec["report"]["test"] == longer["report"]["test"]
    assert rec["report"]["best_epoch"] == longer["report"]["best_epoch"]
    assert rec["report"]["steps"] == longer["report"]["steps"] == 64
    assert rec["validation_curves"] == longer["validation_curves"]
    assert rec["validation_curves"]["val/accuracy"][:2] == curve
    # its command is the fresh run's (which reproduces it); what was continued, and how, is named
    assert rec["command"] == shlex.join(study.fit_argv(_row(study, 4, 2), 0, None, tmp_path, 1, []))
    ext = rec["extended"]
    assert ext["from_epochs"] == 2 and ext["from_command"] == short["command"] and ext["step"] == 32
    assert "--resume" in ext["command"] and "trainer.epochs=4" in ext["command"]
    assert ext["earlier_test"] == short["report"]["test"]
    # the earlier run's outputs are kept beside, unchanged
    log = (tmp_path / "tiny_s0.log").read_text().split("# rlattention fit --resume")
    assert len(log) == 2 and "--resume" not in log[0]  # trained once, then continued once
    assert [line.split(":")[0] for line in log[1].splitlines() if line.startswith("epoch ")] == ["epoch 3", "epoch 4"]
    assert (run / "report.cap2.json").read_text() == earlier_report
    assert (run / "checkpoints" / "best.cap2.ckpt").read_bytes() == earlier_best
    assert json.loads((run / "report.json").read_text())["steps"] == 64
    # the earlier record's checkpoint is the kept one (what a benchmark of that record must read), the new one's
    # the folder's
    assert study.checkpoint_of(short) == run / "checkpoints" / "best.cap2.ckpt"
    assert study.checkpoint_of(rec) == run / "checkpoints" / "best.ckpt"
    # only the extended record counts now, and the study is done: running it again trains nothing
    assert study.current_records(records) == [rec]
    summary = json.loads((tmp_path / "summary.json").read_text())
    (row,) = summary["rows"]
    assert row["seeds"] == [0] and "PARTIAL" not in summary["description"]
    assert row["metrics"]["test_error"] == [pytest.approx(100.0 - longer["report"]["test"]["accuracy"], abs=0.01)]
    assert study.main("tiny", [_row(study, 4, 2)], _metrics, "extension", argv=argv, default_seeds=(0,)) == 0
    assert len(study._records(tmp_path / "runs.jsonl")) == 2


def test_what_cannot_be_extended_exactly_is_refused_untouched(study, tmp_path):
    short = _short(study, tmp_path)
    run = tmp_path / "tiny_s0"
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    refusals = {
        "cosine": (_row(study, 4, 2, "optim.schedule=cosine"), "depends on the cap", "optim.schedule"),
        "lr": (_row(study, 4, 2, "optim.lr=0.02"), "more than the cap", "optim.lr"),
        # monitored from epoch 3, a fresh run has counted nothing at epoch 2; the short run has
        "start": (_row(study, 4, 3), "early stopping would be in another state", "epoch 3"),
    }
    for name, (row, why, detail) in refusals.items():
        assert study.needs_extension(row, short, None, tmp_path, [])
        plan, said = study.extension_plan(row, short, None, tmp_path, [])
        assert plan is None and why in said and detail in said, (name, said)
        with pytest.raises(RuntimeError, match="cannot be extended"):
            study.extend_one(row, short, None, tmp_path, 1, [])
    copied = study.Row("tiny", "configs/ram_digits.yaml", _row(study, 4, 2).overrides, extendable=True,
                       same_as=("other", "tiny"))  # fmt: skip
    plan, said = study.extension_plan(copied, short, None, tmp_path, [])
    assert plan is None and "copies another study's runs" in said
    lock = lock_run_dir(run)  # another process trains in the folder: the study stops, nothing is touched
    try:
        with pytest.raises(RunFolderBusy):
            study.extend_one(_row(study, 4, 2), short, None, tmp_path, 1, [])
    finally:
        lock.release()
    # not an extendable row, or not a larger cap: nothing to extend
    assert not study.needs_extension(_row(study, 4, 2, extendable=False), short, None, tmp_path, [])
    assert not study.needs_extension(_row(study, 2, 1), short, None, tmp_path, [])
    # another run's report in the folder
    report = json.loads((run / "report.json").read_text())
    (run / "report.json").write_text(json.dumps({**report, "steps": 1}))
    plan, said = study.extension_plan(_row(study, 4, 2), short, None, tmp_path, [])
    assert plan is None and "not the recorded run's report" in said
    (run / "report.json").write_text(json.dumps(report))
    # the study says why and runs nothing; the folder is as it was
    argv = ["--out", str(tmp_path), "--work", str(tmp_path), "--seeds", "0", "--threads", "1"]
    assert study.main("tiny", [refusals["lr"][0]], _metrics, "refused", argv=argv, default_seeds=(0,)) == 0
    assert study._records(tmp_path / "runs.jsonl") == [short]
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before
    # the summary shows the short run and says it is short of its row's cap
    description = json.loads((tmp_path / "summary.json").read_text())["description"]
    assert "PARTIAL" in description and "tiny seed 0 (2 of its cap of 4 epochs)" in description, description


def test_the_replay_of_early_stopping_names_where_it_would_have_ended(study):
    # patience 3 used up at epoch 5, the curve's last: the state, and the stop
    assert study._replay([5, 6, 6, 6, 6], 1, "max", 3, 0.0) == ((6, 2, 3), 5)
    assert study._replay([5, 6, 6, 6, 7], 1, "max", 3, 0.0) == ((7, 5, 0), None)
    # with min_delta 1, monitored from epoch 1 or 2 the state after epoch 5 is the same, but from epoch 2 the rule
    # would have ended the run after epoch 4: the same state is not enough for an extension to be exact
    curve = [10, 10.5, 11.2, 11.4, 13]
    assert study._replay(curve, 1, "max", 2, 1.0) == ((13, 5, 0), None)
    assert study._replay(curve, 2, "max", 2, 1.0) == ((13, 5, 0), 4)
    # "min" metrics, and nothing counted before the start epoch
    assert study._replay([3.0, 2.0, 2.5], 2, "min", 5, 0.0) == ((2.0, 2, 1), None)
    assert study._replay([3.0, 2.0], 3, "max", 5, 0.0) == ((None, -1, 0), None)
