"""benchmarks/unified_study.py: the issue's rows of each study as configs that load with their caps, the metric from
a report.json, and the stopping criterion the summaries check (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ISSUE_ROWS = {
    "unified_cluttered100": ["cnn", "ram", "topdown", "entropy", "entropy_context"],
    "unified_cluttered60": ["cnn", "ram", "topdown", "entropy", "entropy_context"],
    "unified_mnist": ["ram", "entropy", "entropy_context"],
    "unified_beta2": ["beta2_0", "beta2_001", "beta2_01"],
    "unified_sequences": ["entropy_context"],
}


@pytest.fixture(scope="module")
def study(benchmark_module):
    return benchmark_module("unified_study")


@pytest.mark.parametrize("name", sorted(ISSUE_ROWS))
def test_rows_are_the_issues_with_configs_that_load(study, name):
    from rlattention.engine.config import load_config

    spec = study.STUDIES[name]
    rows = {r.name: r for r in spec.rows}
    assert [r.name for r in spec.rows if r.issue_row] == ISSUE_ROWS[name]
    assert spec.seeds == ((0,) if name in ("unified_cluttered100", "unified_sequences") else (0, 1, 2))
    for row in spec.rows:
        for candidate in row.candidates:  # a row chosen on validation among variants that exist
            assert candidate in rows and not rows[candidate].issue_row
        if row.candidates:
            continue
        cfg = load_config(ROOT / row.config, row.overrides)
        assert cfg.method in ("unified", "cnn")
        epochs = [o for o in row.overrides if o.startswith("trainer.epochs=")]
        assert len(epochs) == 1 and cfg.trainer.epochs == int(epochs[0].split("=")[1])
        # the trainer stops by the summary's criterion, except where the lr decays over the whole cap
        decays = cfg.optim.schedule != "none"
        assert cfg.trainer.early_stop_patience == (0 if decays else study.WINDOW), row.name
        assert cfg.trainer.early_stop_min_delta == (0.0 if decays else study.MIN_GAIN), row.name
        # no row is judged while unified's epsilon still decays (the first 30% of the cap's steps)
        if not decays:
            assert cfg.trainer.early_stop_start_epoch >= 0.3 * cfg.trainer.epochs, row.name
            if cfg.method == "unified" and cfg.model.top_down:
                assert cfg.trainer.early_stop_start_epoch >= cfg.model.epsilon_decay * cfg.trainer.epochs
        if name == "unified_beta2":
            unrouted = row.name.endswith("unrouted")
            assert cfg.model.policy_grad_to_core is not unrouted
    if name == "unified_beta2":
        weights = {n: load_config(ROOT / rows[n].config, rows[n].overrides).model.reinforce_weight for n in rows}
        assert (weights["beta2_0"], weights["beta2_001"], weights["beta2_01"]) == (0.0, 0.01, 0.1)


def test_the_mnist_candidates_differ_from_the_cosine_run_in_one_switch_each(study):
    """``<row>_lr1e3_cosine_center`` and ``<row>_lr1e3_cosine_ema`` are the cosine candidate with one key changed."""
    from rlattention.engine.config import load_config, to_dict

    rows = {r.name: r for r in study.STUDIES["unified_mnist"].rows}

    def flat(name):
        cfg = to_dict(load_config(ROOT / rows[name].config, rows[name].overrides))
        return {f"{s}.{k}": v for s, sec in cfg.items() if isinstance(sec, dict) for k, v in sec.items()}

    for name in study.MNIST_CONFIGS:
        assert rows[name].candidates == tuple(f"{name}_{c}" for c in ("paper", *study.MNIST_VARIANTS))
        cosine = flat(f"{name}_lr1e3_cosine")
        assert (cosine["optim.lr"], cosine["optim.schedule"], cosine["trainer.ema_decay"]) == (1e-3, "cosine", 0.0)
        for variant, key, value in (("center", "model.init_location", "center"), ("ema", "trainer.ema_decay", 0.999)):
            other = flat(f"{name}_lr1e3_cosine_{variant}")
            assert {k for k in cosine if cosine[k] != other[k]} == {key} and other[key] == value


def test_metric_is_the_test_error_in_percent(study):
    report = {"test": {"accuracy": 87.5, "error": 12.5}, "best_val_accuracy": 90.0}
    assert study.metrics(report) == {"test_error": 12.5, "val_error": 10.0}
    with pytest.raises(ValueError, match="do not add to 100"):
        study.metrics({"test": {"accuracy": 0.875, "error": 0.125}, "best_val_accuracy": 0.9})  # fractions


def test_stopping_criterion_and_the_epoch_early_stopping_would_have_ended(study):
    flat = [50.0 + i for i in range(5)] + [54.05] * 12  # no gain of 0.2 after epoch 5
    rising = [50.0 + i for i in range(20)]
    assert study.stop_epoch(flat, window=10, min_gain=0.2) == 15
    assert study.stop_epoch(rising, window=10, min_gain=0.2) is None
    text = study.budget_check({"flat": flat, "rising": rising, "short": [1.0, 2.0]}, window=10, min_gain=0.2)
    lines = {line.split(":")[0]: line for line in text.splitlines() if line.startswith("- ")}
    assert "met: stopped improving" in lines["- flat"] and "ends it after epoch 15" in lines["- flat"]
    assert "NOT met" in lines["- rising"] and "would not have" in lines["- rising"]
    assert "too few to check" in lines["- short"]


def test_the_summary_judges_a_run_as_the_trainer_stopped_it(study):
    """stop_epoch replays the trainer's rule: a gain of exactly MIN_GAIN points of accuracy (12 of 6,000 validation
    images, which float rounding puts just under 0.2) counts as improving in both, and nothing is judged before the
    start epoch."""
    acc = [100 * 4000 / 6000] * 3 + [100 * 4012 / 6000] * 11
    assert acc[3] - acc[0] < 0.2  # the float gain lies under 0.2
    assert study.stop_epoch(acc) == 14  # the reference moved to epoch 4: ten epochs without a gain from there
    late = [100 * 4013 / 6000] * 11 + [100 * 4025 / 6000]  # 12 more images right in the last epoch
    assert late[-1] - late[0] < 0.2
    assert "NOT met: still improving" in study.budget_check({"run": late})
    falling = [60.0 - i for i in range(30)]
    assert study.stop_epoch(falling) == 11
    assert study.stop_epoch(falling, start=12) == 22  # epoch 12 is the first reference
    assert "ends it after epoch 22" in study.budget_check({"run": falling}, starts={"run": 12})


def test_a_run_without_early_stopping_is_not_said_to_be_stopped(study):
    """A cosine run trains to its horizon: its line says so and where the rule, replayed, would have ended it."""
    falling = [60.0 - i for i in range(30)]
    text = study.budget_check({"cos": falling, "stop": falling}, starts={"cos": 12, "stop": 12}, unstopped=["cos"])
    lines = {line.split(":")[0]: line for line in text.splitlines() if line.startswith("- ")}
    assert "trained to its cap without early stopping, which would have ended it after epoch 22" in lines["- cos"]
    assert "early stopping ends it after epoch 22" in lines["- stop"]
    rising = [50.0 + i for i in range(20)]
    assert "which would not have ended it" in study.budget_check({"cos": rising}, unstopped=["cos"])


def test_a_run_whose_folder_is_gone_is_named_not_dropped(study, tmp_path):
    """The budget check reads each run's validation curve from its folder; a run whose folder is gone (another
    machine's) keeps a line naming it instead of vanishing from the summary."""
    kept = tmp_path / "kept_s0"
    (kept / "logs").mkdir(parents=True)
    rows = "step,val/accuracy\n" + "".join(f"{i},{50 + i}\n" for i in range(1, 16))
    (kept / "logs" / "metrics.csv").write_text(rows)

    def command(run: str) -> str:
        return f"rlattention fit --config c.yaml trainer.out_dir={tmp_path} trainer.run_name={run} trainer.epochs=15"

    doc = {"rows": [{"name": "ram", "seeds": [0, 1], "commands": [command("kept_s0"), command("gone_s1")]}]}
    text = study.budget_md(doc)
    assert "- ram seed 0: 15 epochs" in text
    assert "ram seed 1" in text and str(tmp_path / "gone_s1") in text and "gone from this machine" in text
    assert "ram seed 0 (" not in text  # the run whose curve exists is not also listed as gone


def _run_folder(root: Path, name: str, curve: list[float], report: dict) -> None:
    """A finished run's folder: its metrics log (a training row, then one validation row an epoch) and report."""
    import json

    (root / name / "logs").mkdir(parents=True)
    lines = ["step,train/loss,val/accuracy,val/error,val/count", "5,2.0,,,"]
    lines += [f"{10 * i},,{v},{100 - v},600" for i, v in enumerate(curve, 1)]
    (root / name / "logs" / "metrics.csv").write_text("\n".join(lines) + "\n")
    (root / name / "report.json").write_text(json.dumps({**report, "train_seconds": 99.0}))  # times may differ


def _report(test_error: float) -> dict:
    return {"test": {"accuracy": 100.0 - test_error, "error": test_error}, "best_val_accuracy": 55.0,
            "train_seconds": 3.0}  # fmt: skip


def test_a_summary_keeps_the_curves_so_its_budget_check_outlives_the_run_folders(study, tmp_path, benchmark_module):
    """Records made before records held curves gain them (in curves.jsonl, appended to; runs.jsonl is never
    rewritten) while their folders hold those runs; the summary keeps them per seed, so its budget check and curves
    figure are the same once the folders are gone."""
    import json
    import shutil

    runner = benchmark_module("study")
    work, out = tmp_path / "work", tmp_path / "out"
    curve = [50.0 + i for i in range(5)] + [54.05] * 12  # stops improving: early stopping ends it after epoch 15
    _run_folder(work, "ram_s0", curve, _report(10.0))

    def record(seed: int) -> dict:
        command = (
            f"rlattention fit --config c.yaml trainer.seed={seed} trainer.out_dir={work} trainer.run_name=ram_s{seed} "
            "trainer.epochs=17 trainer.early_stop_patience=10 trainer.early_stop_start_epoch=0"
        )
        return {"row": "ram", "seed": seed, "overrides": [], "command": command, "report": _report(10.0)}

    out.mkdir()
    log = out / "runs.jsonl"
    earlier = [record(0), record(1)]  # seed 1's folder is already gone
    text = "".join(json.dumps(r) + "\n" for r in earlier)
    log.write_text(text)
    assert runner.keep_validation_curves(log) == 1
    assert log.read_text() == text  # the records are never rewritten
    (kept,) = [json.loads(line) for line in (out / "curves.jsonl").read_text().splitlines()]
    assert kept["validation_curves"] == {"val/accuracy": curve, "val/error": [100 - v for v in curve]}  # no counts
    assert runner.keep_validation_curves(log) == 0  # nothing more to add: nothing appended twice
    records = runner.with_kept_curves(runner._records(log), log)
    assert records[0]["validation_curves"] == kept["validation_curves"] and "validation_curves" not in records[1]

    rows = [runner.Row("ram", "c.yaml")]
    args = ("unified_x", rows, records, study.metrics, "d", "c", out)
    doc = runner.summarise(*args, curve_key="val/accuracy")
    assert doc["validation_curve_key"] == "val/accuracy" and doc["rows"][0]["validation_curves"] == [curve, []]
    before = study.budget_md(doc)
    assert "- ram seed 0: 17 epochs" in before and "ends it after epoch 15" in before and "ram seed 1 (" in before
    shutil.rmtree(work / "ram_s0")
    records = runner.with_kept_curves(runner._records(log), log)
    doc = runner.summarise(*args[:2], records, *args[3:], curve_key="val/accuracy")
    assert study.budget_md(doc) == before
    study.draw_figures(doc, out, targets=())
    assert (out / "figures" / "validation_curves.png").stat().st_size > 0
    assert "ram_s0_glimpses" not in study.figures_md(doc, out)  # no figure anywhere: no link
    (out / "figures" / "ram_s0_glimpses.png").write_bytes(b"png")  # the copy an earlier summary made
    assert "[glimpses](figures/ram_s0_glimpses.png)" in study.figures_md(doc, out)  # still linked


def test_the_curves_figure_draws_a_variant_row_dashed_beside_the_issue_rows(study):
    """A variant row's curve is drawn (it is what a variant is read against) but dashed and labelled as a variant;
    a run without a curve draws nothing, and a run an issue row was selected from is drawn once, as the issue row's."""
    rows = [
        {"name": "ram", "issue_row": True, "seeds": [0, 1], "commands": ["c0", "c1"],
         "validation_curves": [[10.0, 20.0], [11.0, 21.0]]},
        {"name": "ram_small", "issue_row": False, "seeds": [0], "commands": ["c2"], "validation_curves": [[12.0]]},
    ]  # fmt: skip
    lines = study.curve_lines({"rows": rows})
    assert lines == [("ram s0", "-", [10.0, 20.0]), ("ram s1", "-", [11.0, 21.0]),
                     ("ram_small s0 (variant)", "--", [12.0])]  # fmt: skip
    rows[1]["validation_curves"] = [[]]
    assert [label for label, _, _ in study.curve_lines({"rows": rows})] == ["ram s0", "ram s1"]
    # an issue row selected from a variant's runs: those runs are drawn once, as the issue row's, listed first
    chosen = {"name": "ram", "selected_from": "ram_lr", "issue_row": True, "seeds": [0], "commands": ["c5"],
              "validation_curves": [[30.0]]}  # fmt: skip
    candidate = {"name": "ram_lr", "issue_row": False, "seeds": [0, 1], "commands": ["c5", "c6"],
                 "validation_curves": [[30.0], [31.0]]}  # fmt: skip
    assert study.curve_lines({"rows": [candidate, chosen]}) == [("ram_lr s0", "-", [30.0]),
                                                               ("ram_lr s1 (variant)", "--", [31.0])]  # fmt: skip


def test_a_folder_holding_another_run_lends_no_curves(tmp_path, benchmark_module):
    """A run trained again into a recorded run's folder that did not reproduce it (or another run under the same
    name) is not the recorded run: its curves are not kept for that record, nor read for it."""
    import json

    runner = benchmark_module("study")
    _run_folder(tmp_path, "ram_s0", [50.0, 51.0], _report(12.5))
    command = f"rlattention fit trainer.out_dir={tmp_path} trainer.run_name=ram_s0"
    log = tmp_path / "out" / "runs.jsonl"
    log.parent.mkdir()
    rec = {"row": "ram", "seed": 0, "command": command, "report": _report(10.0)}
    log.write_text(json.dumps(rec) + "\n")
    assert runner.keep_validation_curves(log) == 0 and not (log.parent / "curves.jsonl").exists()
    assert runner.recorded_curve(rec, "val/accuracy") == []
    same = {**rec, "report": _report(12.5)}
    assert runner.recorded_curve(same, "val/accuracy") == [50.0, 51.0]  # the same run, another time: read
    log.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"runs.jsonl:1: not a JSON record"):  # names the file and the line
        runner.keep_validation_curves(log)
