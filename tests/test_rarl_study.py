"""benchmarks/rarl_study.py: the issue's rows and metrics, each row a config that loads with the study's budget, the
controls at the learned row's cost, and the metrics taken from a rarl report.json into the summary (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ISSUE_ROWS = ["learned", "random", "grid", "global", "single", "nolstm", "t1", "t10"]


@pytest.fixture(scope="module")
def study(benchmark_module):
    return benchmark_module("rarl_study")


def test_rows_are_the_issues_with_their_configs_and_one_budget(study):
    from rlattention.engine.config import load_config

    rows = study.rows()
    assert [r.name for r in rows if r.issue_row] == ISSUE_ROWS
    assert study.STUDY == "rarl_multilabel" and list(study.METRIC_KEYS) == ["map", "cf1", "of1"]
    cfgs = {}
    for r in rows:
        assert r.overrides[: len(study.BUDGET)] == study.BUDGET  # the same budget in every row
        cfg = load_config(ROOT / r.config, r.overrides)  # the config exists and the overrides fit its schema
        assert cfg.method == "rarl" and cfg.data.name == "multilabel_digits" and cfg.data.canvas_size == 128
        cfgs[r.name] = cfg
    learned = cfgs["learned"]
    assert {r.name: r.config for r in rows}["learned"] == "configs/rarl_clutter.yaml"
    assert learned.model.policy == "learned" and learned.model.mode == "attention"
    assert (cfgs["random"].model.policy, cfgs["grid"].model.policy, cfgs["global"].model.mode) == (
        "random", "grid", "global",
    )  # fmt: skip
    for name in ("random", "grid"):  # equal cost: only the policy differs
        m = cfgs[name].model
        assert (m.anchor_areas, m.anchor_ratios, m.num_iterations, m.train_episodes, m.backbone_channels) == (
            learned.model.anchor_areas, learned.model.anchor_ratios, learned.model.num_iterations,
            learned.model.train_episodes, learned.model.backbone_channels,
        )  # fmt: skip
    assert all(c.eval.mc_samples == learned.eval.mc_samples >= 2 for c in cfgs.values())
    assert (cfgs["t1"].model.num_iterations, cfgs["t10"].model.num_iterations) == (1, 10)
    assert len(cfgs["single"].model.anchor_areas) * len(cfgs["single"].model.anchor_ratios) == 1
    assert cfgs["nolstm"].model.recurrent is False
    # every row on the same frozen, pretrained backbone level; the learned rows with the map locator unless a variant
    # says otherwise
    assert {(c.model.backbone, c.model.pretrained, c.model.freeze, c.model.backbone_level) for c in cfgs.values()} == {
        ("efficientnet_lite0", True, "all", 2)
    }
    assert learned.model.locator == "map" and learned.model.locator_inhibit
    assert cfgs["learned_gaussian"].model.locator == "gaussian" and cfgs["learned_gaussian"].model.learn_std
    paper = cfgs["learned_gaussian_paper"].model
    assert (paper.locator, paper.std, paper.learn_std, paper.baseline, paper.train_episodes) == (
        "gaussian", 0.11, False, "learned", 1,
    )  # fmt: skip


def test_metrics_are_percentages_and_reach_the_summary(study, tmp_path):
    import study as runner

    report = {"test": {"mAP": 81.23, "CF1": 70.0, "OF1": 75.0, "CP": 10.0, "count": 2000.0}, "units": "percent",
              "train_seconds": 10.0}  # fmt: skip
    assert study.metrics(report) == pytest.approx({"map": 81.23, "cf1": 70.0, "of1": 75.0})
    with pytest.raises(KeyError, match="mAP"):
        study.metrics({"test": {"CF1": 0.1, "OF1": 0.1}})
    # a report written before reports said their units held fractions: read in percent, the record untouched
    legacy = {"test": {"mAP": 0.8123, "CF1": 0.7, "OF1": 0.75, "count": 2000.0}, "best_val_mAP": 0.8, "epochs": 12}
    fractions = ("mAP", "CP", "CR", "CF1", "OP", "OR", "OF1")
    read = runner.in_percent(legacy, fractions)
    assert study.metrics(read) == pytest.approx({"map": 81.23, "cf1": 70.0, "of1": 75.0})
    assert read["best_val_mAP"] == pytest.approx(80.0) and read["test"]["count"] == 2000.0 and read["epochs"] == 12
    assert legacy["test"]["mAP"] == 0.8123 and legacy["best_val_mAP"] == 0.8 and "units" not in legacy
    assert runner.in_percent(report, fractions) is report  # already percent: as it is
    records = [
        {"row": row, "seed": s, "overrides": study.BUDGET, "command": "rlattention fit trainer.num_threads=1",
         "report": {**report, "test": {**report["test"], "mAP": value}}}
        for s in (1, 0) for row, value in (("learned", 90.0), ("random", 88.5))
    ]  # fmt: skip
    doc = runner.summarise(study.STUDY, study.rows(), records, study.metrics, "d", "c", tmp_path, primary="map")
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == doc and [r["name"] for r in doc["rows"]] == ["learned", "random"]
    assert doc["rows"][0]["metrics"]["map"] == [90.0, 90.0]
    assert "PARTIAL" in doc["description"] and "grid (0 of 3 seeds)" in doc["description"]
    md = study.target_md(doc)
    assert "learned - random: +1.50 mAP (met)" in md and "grid: not recorded yet" in md
