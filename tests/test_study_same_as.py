"""benchmarks/study.py: a row declared the same as another study's row (``Row.same_as``) takes that study's
records, config for config, and is never trained a second time; a definition that drifted apart is an error naming
the keys (no training here: ``run_one`` is replaced)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

DATA = "../shared/data/mnist"  # spelled as the studies spell it; nothing is read from it here


@pytest.fixture(scope="module")
def study(benchmark_module):
    return benchmark_module("study")


@pytest.fixture(scope="module")
def unified(benchmark_module):
    return benchmark_module("unified_study")


def source_record(study, row, seed: int, work: Path, data_dir: str = DATA) -> dict:
    """The record run_one writes for ``row`` and ``seed`` (its report made up)."""
    argv = study.fit_argv(row, seed, data_dir, work, 1, [])
    return {
        "row": row.name,
        "seed": seed,
        "config": row.config,
        "overrides": [o.format(seed=seed, work=work) for o in row.overrides],
        "command": shlex.join(argv),
        "report": {
            "test": {"accuracy": 90.0 + seed, "error": 10.0 - seed},
            "best_val_accuracy": 91.0,
            "train_seconds": 1.0,
        },
    }


def write_source(tmp_path: Path, records: list[dict]) -> None:
    out = tmp_path / "out" / "unified_cluttered60"
    out.mkdir(parents=True)
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def no_training(*args, **kwargs):
    raise AssertionError("a row declared the same as another study's row must not train")


def run_beta2(study, unified, tmp_path, rows, seeds, data_dir=DATA):
    argv = ["--rows", "beta2_001", "--seeds", *map(str, seeds), "--data-dir", data_dir]
    argv += ["--out", str(tmp_path / "out" / "unified_beta2"), "--work", str(tmp_path / "work")]
    return study.main("unified_beta2", rows, unified.metrics, "d", argv)


def test_beta2_001_takes_the_cluttered60_entropy_context_runs(study, unified, tmp_path, monkeypatch, capsys):
    """The real definitions: beta2_001 is unified_cluttered60's entropy_context config key by key, so seed 0's
    record is copied (saying where from) and seed 1, not yet run there, waits for it."""
    source = next(r for r in unified.STUDIES["unified_cluttered60"].rows if r.name == "entropy_context")
    write_source(tmp_path, [source_record(study, source, 0, tmp_path / "c60")])
    monkeypatch.setattr(study, "run_one", no_training)
    rows = unified.STUDIES["unified_beta2"].rows
    assert next(r for r in rows if r.name == "beta2_001").same_as == ("unified_cluttered60", "entropy_context")
    assert run_beta2(study, unified, tmp_path, rows, [0, 1]) == 0
    assert "beta2_001 seed 1 not run: it is unified_cluttered60's entropy_context, not yet run for seed 1" in (
        capsys.readouterr().out
    )
    (rec,) = [json.loads(line) for line in (tmp_path / "out" / "unified_beta2" / "runs.jsonl").read_text().splitlines()]
    assert rec["row"] == "beta2_001" and rec["seed"] == 0
    assert rec["reused_from"]["study"] == "unified_cluttered60" and rec["reused_from"]["row"] == "entropy_context"
    assert "entropy_context_s0" in rec["command"]  # the command that made the run, which reproduces it
    assert rec["cpu"] is None  # the source named no CPU: the copy does not name this machine's, which did not run it
    doc = json.loads((tmp_path / "out" / "unified_beta2" / "summary.json").read_text())
    row = next(r for r in doc["rows"] if r["name"] == "beta2_001")
    assert row["metrics"]["test_error"] == [10.0] and row["same_as"] == "unified_cluttered60/entropy_context"
    assert "beta2_001 (1 of 3 seeds)" in doc["description"]
    # asked again, the copied record is not copied twice
    assert run_beta2(study, unified, tmp_path, rows, [0]) == 0
    assert len((tmp_path / "out" / "unified_beta2" / "runs.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("change", "key"),
    [("model.reinforce_weight=0.1", "model.reinforce_weight"), ("trainer.epochs=100", "trainer.epochs")],
)
def test_a_row_that_drifted_from_its_source_is_refused(study, unified, tmp_path, monkeypatch, change, key):
    source = next(r for r in unified.STUDIES["unified_cluttered60"].rows if r.name == "entropy_context")
    write_source(tmp_path, [source_record(study, source, 0, tmp_path / "c60")])
    monkeypatch.setattr(study, "run_one", no_training)
    beta2 = next(r for r in unified.STUDIES["unified_beta2"].rows if r.name == "beta2_001")
    drifted = study.Row(beta2.name, beta2.config, [*beta2.overrides, change], same_as=beta2.same_as)
    with pytest.raises(
        ValueError, match=rf"beta2_001 is declared the same as unified_cluttered60's entropy_context.*{key}"
    ):
        run_beta2(study, unified, tmp_path, [drifted], [0])
    log = tmp_path / "out" / "unified_beta2" / "runs.jsonl"
    assert not log.exists() or not log.read_text()  # nothing recorded


def test_another_data_folder_is_another_run(study, unified, tmp_path, monkeypatch):
    """The source ran on another data folder: not the same run, refused with the key named; the same folder spelled
    another way is the same run."""
    source = next(r for r in unified.STUDIES["unified_cluttered60"].rows if r.name == "entropy_context")
    write_source(tmp_path, [source_record(study, source, 0, tmp_path / "c60", data_dir=str(tmp_path / "elsewhere"))])
    monkeypatch.setattr(study, "run_one", no_training)
    rows = unified.STUDIES["unified_beta2"].rows
    with pytest.raises(ValueError, match="data.data_dir"):
        run_beta2(study, unified, tmp_path, rows, [0])
    (tmp_path / "out" / "unified_cluttered60" / "runs.jsonl").write_text(
        json.dumps(source_record(study, source, 0, tmp_path / "c60")) + "\n"
    )  # now on DATA, spelled relative to the repository; asked for with an absolute spelling of the same folder
    respelled = str(study.ROOT / ".." / "shared" / "data" / "." / "mnist")
    assert run_beta2(study, unified, tmp_path, rows, [0], data_dir=respelled) == 0
    (rec,) = [json.loads(line) for line in (tmp_path / "out" / "unified_beta2" / "runs.jsonl").read_text().splitlines()]
    assert rec["row"] == "beta2_001" and rec["reused_from"]["row"] == "entropy_context"
