"""benchmarks/dcpg_study.py: the issue's rows, each a config that loads with the study's budget, and the metrics
taken from a dcpg report.json into the summary (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ISSUE_ROWS = [
    "baseline",
    "noise_matched",
    "discrete",
    "continuous",
    "continuous_multihead",
    "full",
    "reward_r1",
    "reward_ap",
    "lambda10",
    "lambda30",
    "single_head",
    "pg_baseline",
]
ISSUE_METRICS = ["rsum", "i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10"]


@pytest.fixture(scope="module")
def study(benchmark_module):
    return benchmark_module("dcpg_study")


def test_rows_are_the_issues_with_their_configs_and_one_budget(study):
    from rlattention.engine.config import load_config

    every = study.rows()
    rows = [r for r in every if r.issue_row]
    assert sorted(r.name for r in rows) == sorted(ISSUE_ROWS)
    assert {r.name: r.config for r in rows}["full"] == "configs/dcpg_digit_scenes.yaml"
    assert {r.name: r.config for r in rows}["noise_matched"] == "configs/dcpg_digit_scenes_noise_matched.yaml"
    variants = {r.name: r for r in every if not r.issue_row}
    models = {}
    for r in every:
        assert r.overrides[: len(study.BUDGET)] == study.BUDGET  # the same budget in every row
        assert r.issue_row or r.overrides != study.BUDGET  # a variant is its config plus something
        cfg = load_config(ROOT / r.config, r.overrides)  # the config exists and the overrides fit its schema
        assert cfg.method == "dcpg" and cfg.data.name == "digit_scenes"
        budget = dict(o.split("=") for o in study.BUDGET)
        assert cfg.trainer.epochs == int(budget["trainer.epochs"])
        assert cfg.data.num_train == int(budget["data.num_train"])
        assert cfg.optim.step_epochs == int(budget["optim.step_epochs"]) < cfg.trainer.epochs
        models[r.name] = cfg.model
        for name in r.candidates:  # a row chosen on validation among variants that exist
            assert name in variants and r.select_key == "best_val_rsum"
    full = models["full"]
    assert models["baseline"].pg == "none" and models["noise_matched"].noise_matched and not full.noise_matched
    assert (full.pg, full.heads, full.reward, full.lam) == ("discrete_continuous", 2, "r1+ap", 20.0)
    assert (models["lambda10"].lam, models["lambda30"].lam, models["single_head"].heads) == (10.0, 30.0, 1)
    assert (models["reward_r1"].reward, models["reward_ap"].reward) == ("r1", "ap")
    assert models["pg_baseline"].pg_baseline and models["continuous_multihead"].heads == 2
    # the config carries the candidate chosen on validation (full_att05_sc_lr10), so that every ablation row is it
    # plus one switch; the control has its initial policy
    assert vars(models["full_att05_sc_lr10"]) == vars(full)
    assert vars(models["noise_matched_att05"]) == vars(models["noise_matched"])
    assert models["full_uniform"].init_att_std is None and not models["full_att05"].self_critical


def test_metrics_are_the_report_percentages_and_reach_the_summary(study, tmp_path):
    import study as runner

    test = {"i2t_r1": 60.6, "i2t_r5": 88.0, "i2t_r10": 94.3, "t2i_r1": 30.72, "t2i_r5": 56.2, "t2i_r10": 67.1}
    report = {"test": {**test, "rsum": 396.92, "i2t_medr": 1.0, "count": 5000.0}, "train_seconds": 10.0}
    got = study.metrics(report)
    assert list(got) == ISSUE_METRICS
    assert got["rsum"] == 396.92 and got["t2i_r1"] == 30.72  # already percent: not scaled again
    with pytest.raises(KeyError, match="rsum"):
        study.metrics({"test": test})
    records = [
        {"row": "full", "seed": s, "overrides": study.BUDGET, "command": "rlattention fit trainer.num_threads=1",
         "report": report}
        for s in (1, 0)
    ]  # fmt: skip
    doc = runner.summarise(study.STUDY, study.rows(), records, study.metrics, "d", "c", tmp_path, primary="rsum")
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == doc and [r["name"] for r in doc["rows"]] == ["full"]
    assert doc["rows"][0]["seeds"] == [0, 1] and doc["rows"][0]["metrics"]["rsum"] == [396.92, 396.92]
    assert "PARTIAL" in doc["description"] and "baseline (0 of 3 seeds)" in doc["description"]


def test_budget_check_reads_the_baseline_curves_of_the_summary(study, tmp_path):
    run = tmp_path / "work" / "baseline_s0"
    (run / "logs").mkdir(parents=True)
    lines = ["step,train/loss,val/rsum", "50,3.0,", "390,,290.0", "780,,400.0", "1170,,400.5", "1560,,400.8"]
    (run / "logs" / "metrics.csv").write_text("\n".join(lines) + "\n")
    assert study.validation_curve(run) == [290.0, 400.0, 400.5, 400.8]
    command = f"rlattention fit trainer.seed=0 trainer.out_dir={tmp_path / 'work'} trainer.run_name=baseline_s0"
    doc = {"rows": [{"name": "baseline", "seeds": [0], "commands": [command]}]}
    md = study.baseline_budget_md(doc)
    assert "seed 0: 290.0, 400.0, 400.5, 400.8" in md and "0.80 (< 1: met" in md  # 400.8 - 400.0 over 2 epochs
    import shutil

    shutil.rmtree(run)  # the folder gone: the curve the summary keeps (from the record) gives the same check
    kept = {"rows": [{**doc["rows"][0], "validation_curves": [[290.0, 400.0, 400.5, 400.8]]}]}
    assert study.baseline_budget_md(kept) == md
    assert "NOT met" in study.budget_check({"a": [290.0, 300.0, 310.0]})
    assert "Too few epochs" in study.budget_check({"a": [290.0, 300.0]})


def test_table4_orderings_say_holds_reversed_or_no_difference(study):
    doc = {
        "rows": [
            {"name": "full", "metrics": {"rsum": [400.0, 402.0, 404.0]}},  # sd 2
            {"name": "baseline", "metrics": {"rsum": [391.0, 392.0, 393.0]}},  # 10 below: holds
            {"name": "discrete", "metrics": {"rsum": [401.0, 403.0, 405.0]}},  # +1 over full, within sd 2
            {"name": "single_head", "metrics": {"rsum": [420.0, 421.0, 422.0]}},  # 19 above full: reversed
            {"name": "continuous", "metrics": {"rsum": [399.0]}},  # one seed
        ]
    }
    lines = {line.split(" (")[0]: line for line in study.ordering_md(doc).splitlines() if line.startswith("- ")}
    assert "holds: gap +10.00" in lines["- full > baseline"]
    assert "no difference: gap -1.00, larger seed sd 2.00" in lines["- full > discrete"]
    assert "reversed: gap -19.00" in lines["- full > single_head"]
    assert "no spread yet" in lines["- continuous > baseline"]
    assert lines["- full > lambda10"].endswith("not run yet")
    assert len(lines) == len(study.TABLE4_ORDERINGS)
