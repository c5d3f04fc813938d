"""benchmarks/study.py: a row chosen on validation among variant rows (``Row.candidates``) takes the figures of the
candidate with the best mean validation figure, never of the best test figure; it runs nothing itself, and asking
for it runs its candidates (no training here: ``run_one`` is replaced)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study(benchmark_module):
    return benchmark_module("study")


def record(row: str, seed: int, val: float, test: float) -> dict:
    return {
        "row": row,
        "seed": seed,
        "config": "configs/x.yaml",
        "overrides": [f"row={row}"],
        "command": f"fit {row} {seed}",
        "report": {"best_val": val, "test": {"acc": test}, "train_seconds": 1.0},
    }


def rows(study):
    return [
        study.Row("pick", "configs/x.yaml", [], "chosen", candidates=("a", "b"), select_key="best_val"),
        study.Row("a", "configs/x.yaml", [], "variant a", False),
        study.Row("b", "configs/x.yaml", [], "variant b", False),
    ]


def test_the_candidate_with_the_better_validation_mean_is_chosen_not_the_better_test(study, tmp_path):
    # a: better validation (0.6 vs 0.5 mean), worse test; b: the reverse
    recs = [record("a", s, 0.6, 10.0 + s) for s in (0, 1)] + [record("b", s, 0.5, 90.0 + s) for s in (0, 1)]
    doc = study.summarise("s", rows(study), recs, lambda r: r["test"], "d", "cmd", tmp_path, seeds=(0, 1))
    pick = next(r for r in doc["rows"] if r["name"] == "pick")
    assert pick["selected_from"] == "a"
    assert pick["metrics"]["acc"] == [10.0, 11.0]
    assert pick["overrides"] == ["row=a"] and pick["commands"] == ["fit a 0", "fit a 1"]
    assert "best_val" in pick["selection"] and "0.6" in pick["selection"] and "0.5" in pick["selection"]
    assert "PARTIAL" not in doc["description"]
    assert "= a, chosen on validation" in (tmp_path / "summary.md").read_text()
    # flip the validation figures: the choice follows them
    recs = [record("a", s, 0.4, 10.0) for s in (0, 1)] + [record("b", s, 0.5, 90.0) for s in (0, 1)]
    doc = study.summarise("s", rows(study), recs, lambda r: r["test"], "d", "cmd", tmp_path, seeds=(0, 1))
    assert next(r for r in doc["rows"] if r["name"] == "pick")["selected_from"] == "b"


def test_a_chosen_row_is_partial_when_its_choice_lacks_seeds_and_absent_without_records(study, tmp_path):
    recs = [record("a", 0, 0.6, 10.0)]
    doc = study.summarise("s", rows(study), recs, lambda r: r["test"], "d", "cmd", tmp_path, seeds=(0, 1))
    assert "pick (1 of 2 seeds)" in doc["description"]
    doc = study.summarise("s", rows(study), [], lambda r: r["test"], "d", "cmd", tmp_path, seeds=(0, 1))
    assert doc["rows"] == []


def test_a_choice_with_a_candidate_not_yet_run_says_so(study, tmp_path):
    """Only ``a`` ran: ``pick`` takes its figures, but its selection says no choice was made (``b`` not yet run)
    and the study is PARTIAL until ``b`` has every seed."""
    recs = [record("a", s, 0.6, 10.0) for s in (0, 1)]
    doc = study.summarise("s", rows(study), recs, lambda r: r["test"], "d", "cmd", tmp_path, seeds=(0, 1))
    pick = next(r for r in doc["rows"] if r["name"] == "pick")
    assert pick["selected_from"] == "a" and "not yet run: b" in pick["selection"]
    assert "chosen on validation" not in pick["selection"]
    assert "pick's candidate b (0 of 2 seeds)" in doc["description"]


def test_asking_for_a_chosen_row_runs_its_candidates_and_never_the_row(study, tmp_path, monkeypatch):
    ran = []

    def fake_run(row, seed, data_dir, work, threads, extra):
        ran.append((row.name, seed))
        return record(row.name, seed, 0.5, 1.0)

    monkeypatch.setattr(study, "run_one", fake_run)
    monkeypatch.setattr(study, "ROOT", tmp_path)
    argv = ["--rows", "pick", "--seeds", "0", "--out", "out", "--work", "work"]
    assert study.main("s", rows(study), lambda r: r["test"], "d", argv, default_seeds=(0,)) == 0
    assert sorted(ran) == [("a", 0), ("b", 0)]
    logged = [json.loads(line)["row"] for line in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert sorted(logged) == ["a", "b"]


def test_candidates_are_compared_on_the_seeds_they_share(study, tmp_path):
    """``a`` was taken to a third seed where its validation figure is low: the choice compares seeds 0 and 1,
    which both ran, not a's three against b's two."""
    recs = [record("a", 0, 0.6, 1.0), record("a", 1, 0.6, 1.0), record("a", 2, 0.1, 1.0)]
    recs += [record("b", s, 0.5, 2.0) for s in (0, 1)]
    pick, how = study.select_candidate(rows(study)[0], recs)
    assert pick == "a" and "over seeds 0, 1" in how and "a 0.6" in how and "b 0.5" in how
    # the mean over every recorded seed would have chosen b (a: 0.43)
    doc = study.summarise("s", rows(study), recs, lambda r: r["test"], "d", "cmd", tmp_path, seeds=(0, 1))
    assert next(r for r in doc["rows"] if r["name"] == "pick")["metrics"]["acc"] == [1.0, 1.0, 1.0]


def seed_rows(study):
    """``pick`` compares its candidates on seed 0 only; the other seeds run for the chosen candidate alone."""
    return [
        study.Row("pick", "configs/x.yaml", [], "chosen", candidates=("a", "b"), select_key="best_val",
                  select_seeds=(0,)),
        study.Row("a", "configs/x.yaml", [], "variant a", False),
        study.Row("b", "configs/x.yaml", [], "variant b", False),
    ]  # fmt: skip


def run_seeds(study, tmp_path, monkeypatch, vals: dict[str, float], seeds: list[int]) -> list[tuple[str, int]]:
    ran = []

    def fake_run(row, seed, data_dir, work, threads, extra):
        ran.append((row.name, seed))
        return record(row.name, seed, vals[row.name], 1.0)

    monkeypatch.setattr(study, "run_one", fake_run)
    monkeypatch.setattr(study, "ROOT", tmp_path)
    argv = ["--rows", "pick", "--seeds", *map(str, seeds), "--out", "out", "--work", "work"]
    assert study.main("s", seed_rows(study), lambda r: r["test"], "d", argv, default_seeds=(0, 1, 2)) == 0
    return ran


@pytest.mark.parametrize("better", ["a", "b"])
def test_only_the_candidate_chosen_on_the_compared_seeds_runs_the_others(study, tmp_path, monkeypatch, better):
    """Both candidates run seed 0; the one with the better validation figure there runs seeds 1 and 2, the other
    never does, whichever comes first in the rows; the summary is complete without the loser's other seeds."""
    vals = {"a": 0.6, "b": 0.5} if better == "a" else {"a": 0.5, "b": 0.6}
    ran = run_seeds(study, tmp_path, monkeypatch, vals, [0, 1, 2])
    assert sorted(ran) == sorted([("a", 0), ("b", 0), (better, 1), (better, 2)])
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    pick = next(r for r in doc["rows"] if r["name"] == "pick")
    assert pick["selected_from"] == better and pick["seeds"] == [0, 1, 2]
    assert "over seeds 0 of" in pick["selection"] and "PARTIAL" not in doc["description"]


def test_other_seeds_wait_for_the_comparison(study, tmp_path, monkeypatch, capsys):
    """Asked for seeds 1 and 2 before seed 0 has run, no candidate runs anything (no choice yet) and the study
    says what it waits for; the summary is PARTIAL."""
    assert run_seeds(study, tmp_path, monkeypatch, {"a": 0.6, "b": 0.5}, [1, 2]) == []
    out = capsys.readouterr().out
    assert "a seed 1 not run: it waits for the comparison of pick's candidates (a seed 0, b seed 0 not yet run)" in out
    # seed 0 of both, then seeds 1 and 2 again: only the chosen one runs them
    assert sorted(run_seeds(study, tmp_path, monkeypatch, {"a": 0.6, "b": 0.5}, [0])) == [("a", 0), ("b", 0)]
    assert run_seeds(study, tmp_path, monkeypatch, {"a": 0.6, "b": 0.5}, [1, 2]) == [("a", 1), ("a", 2)]
    assert "b seed 1 not run: pick chose a on validation of seed(s) 0" in capsys.readouterr().out


def test_the_choice_ignores_seeds_outside_the_comparison(study, tmp_path):
    """Both ran seed 1 too (e.g. before select_seeds was set), where b is far better: the choice still reads seed 0
    only (the mean over seeds 0 and 1 would have chosen b)."""
    recs = [record("a", 0, 0.6, 1.0), record("b", 0, 0.5, 2.0), record("a", 1, 0.1, 1.0), record("b", 1, 0.99, 2.0)]
    pick, how = study.select_candidate(seed_rows(study)[0], recs)
    assert pick == "a" and "over seeds 0 of" in how
    doc = study.summarise("s", seed_rows(study), recs, lambda r: r["test"], "d", "cmd", tmp_path, seeds=(0, 1))
    assert next(r for r in doc["rows"] if r["name"] == "pick")["selected_from"] == "a"
    assert "PARTIAL" not in doc["description"]  # b needs no seed beyond the compared one
