"""Early stopping on the validation selection metric (``trainer.early_stop_patience``, ``early_stop_min_delta``):
the rule on hand-made sequences, then tiny real runs whose validation metric is scripted (the real evaluation runs,
its selection metric is replaced by the script's next value), stopped, resumed and reported."""

from __future__ import annotations

import json

import pytest
import torch
from lightning.fabric import Fabric
from tiny_runs import sigterm_at_step, tiny_ram

from rlattention.data.registry import build_dataset
from rlattention.engine import stopping, trainer
from rlattention.engine.checkpoint import load_checkpoint_file
from rlattention.engine.config import ConfigError, TrainerConfig, load_config
from rlattention.engine.evaluate import evaluate
from rlattention.engine.trainer import Progress, TrainingInterrupted, fit
from rlattention.methods.ram import RAM

TINY = tiny_ram(batch=32)  # 2 steps per epoch: a run of 10 epochs takes about a second
METRIC = RAM.selection_metric[0]  # accuracy, max


# ------------------------------------------------------------------------------------------ the rule alone
def _rule_cfg(patience: int, min_delta: float = 0.0, start: int = 0) -> TrainerConfig:
    return TrainerConfig(early_stop_patience=patience, early_stop_min_delta=min_delta, early_stop_start_epoch=start)


def _run_rule(
    values: list[float], mode: str, patience: int, min_delta: float = 0.0, total: int = 100, start: int = 0
) -> int | None:
    """The 1-based validation after which the rule stops (one epoch per validation), or None."""
    p, cfg = Progress(total_steps=total), _rule_cfg(patience, min_delta, start)
    for i, value in enumerate(values, start=1):
        p.epoch = p.step = i
        if stopping.update(p, value, mode, cfg):
            return i
    return None


@pytest.mark.parametrize(
    "values, mode, patience, min_delta, stop",
    [
        ([1, 2, 3, 3, 3], "max", 2, 0.0, 5),  # equal is no improvement
        ([1, 2, 3, 2, 4, 3, 3], "max", 2, 0.0, 7),  # 4 resets the count
        ([5, 4, 3, 3, 3], "min", 2, 0.0, 5),
        ([5, 4, 3, 4, 2, 3, 3], "min", 2, 0.0, 7),
        ([1, 2, 3], "max", 2, 0.0, None),  # still improving
        ([3, 2, 1], "max", 1, 0.0, 2),  # patience 1: the first validation without improvement
        ([1, 2, 3, 3, 3], "max", 0, 0.0, None),  # 0: off
        # min_delta 0.5: gains of 0.2 neither reset the count nor move the reference (1.0, at validation 1)
        ([1.0, 1.2, 1.3, 1.4], "max", 3, 0.5, 4),
        ([1.0, 1.2, 1.5, 1.6, 1.8, 1.9], "max", 3, 0.5, 6),  # 1.5 counts (>= 1.0 + 0.5): reference 1.5 at 3
        ([2.0, 1.8, 1.7, 1.6], "min", 3, 0.5, 4),
        ([2.0, 1.8, 1.5, 1.4, 1.2, 1.1], "min", 3, 0.5, 6),  # 1.5 counts (<= 2.0 - 0.5)
        ([1.1, 1.2, 1.2], "max", 2, 0.1, None),  # a gain of exactly min_delta counts, up to float rounding
        ([1.1, 1.0, 1.0], "min", 2, 0.1, None),
    ],
)
def test_the_rule_on_sequences(values, mode, patience, min_delta, stop):
    assert _run_rule(values, mode, patience, min_delta) == stop


def test_the_rule_state_a_smaller_gain_leaves_the_reference():
    p, cfg = Progress(total_steps=100), _rule_cfg(5, 0.5)
    for epoch, value in enumerate([10.0, 10.4, 10.49, 10.5], start=1):
        p.epoch = epoch
        stopping.update(p, value, "max", cfg)
    assert (p.stop_value, p.stop_epoch, p.stale_validations) == (10.5, 4, 0)  # 10.5 - 10.0 >= 0.5 counts
    stopping.update(p, 10.9, "max", cfg)
    assert (p.stop_value, p.stop_epoch, p.stale_validations) == (10.5, 4, 1)


def test_nan_never_counts_and_the_last_validation_is_no_early_stop():
    assert _run_rule([float("nan"), float("nan")], "max", 2) == 2
    assert _run_rule([float("nan"), 1.0, 1.0], "min", 2) is None
    assert _run_rule([3, 2, 1], "max", 2, total=3) is None  # patience used up at the planned end: not early
    assert 1.2 - 1.1 < 0.1 and stopping.improved(1.2, 1.1, "max", 0.1)  # rounding does not hide a gain of 0.1
    assert not stopping.improved(1.19, 1.1, "max", 0.1) and not stopping.improved(1.1, 1.1, "max", 0.0)
    with pytest.raises(ValueError, match="'max' or 'min'"):
        stopping.improved(1.0, 0.0, "up")


def test_nothing_is_monitored_before_the_start_epoch_or_with_patience_0():
    falling = [5, 4, 3, 2, 1, 1, 1, 1]
    assert _run_rule(falling, "max", 2) == 3
    # epochs 1-4 not monitored: epoch 5's 1 is the first reference, epochs 6 and 7 do not beat it
    assert _run_rule(falling, "max", 2, start=5) == 7
    assert _run_rule([1, 2, 3, 3, 3, 3], "max", 2, start=6) is None  # epoch 6 alone: the first reference
    p, cfg = Progress(total_steps=100), _rule_cfg(0)
    for epoch, value in enumerate([3, 2, 1], start=1):
        p.epoch = epoch
        assert not stopping.update(p, value, "max", cfg)
    assert (p.stop_value, p.stale_validations) == (None, 0)  # off: a later resume with a patience starts afresh


# -------------------------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def splits():
    cfg = load_config(None, TINY)
    return build_dataset(cfg.data.name, cfg.data, None)


class Scripted:
    """The trainer's ``evaluate``, with the selection metric of the i-th validation replaced by ``values[i]`` (the
    final test runs unchanged). One object across an interrupted run and its resume continues the script."""

    def __init__(self, splits, values: list[float]) -> None:
        self.splits, self.values, self.calls = splits, list(values), 0

    def __call__(self, fabric, model, dataset, *args, **kwargs) -> dict[str, float]:
        metrics = evaluate(fabric, model, dataset, *args, **kwargs)
        if dataset is self.splits.val:
            metrics[METRIC] = float(self.values[self.calls])
            self.calls += 1
        return metrics


PLATEAU = [10, 20, 30, 25, 30, 29, 28, 27, 26, 25]  # best 30 at epoch 3 (a later 30 is no improvement)


def _fit(tmp_path, splits, monkeypatch, values, *overrides, name="r"):
    scripted = Scripted(splits, values)
    monkeypatch.setattr(trainer, "evaluate", scripted)
    cfg = load_config(None, [*TINY, f"trainer.out_dir={tmp_path}", f"trainer.run_name={name}", *overrides])
    return fit(cfg, splits=splits), scripted


def _pick(report: dict) -> dict:
    return {k: report[k] for k in ("epochs", "early_stopped", "early_stop_epoch", "best_epoch")}


def _ckpt_epochs(run) -> tuple[int, int]:
    """The epochs of ``best.ckpt`` and ``last.ckpt`` of ``run``."""
    return tuple(load_checkpoint_file(run / "checkpoints" / f"{n}.ckpt")["progress"]["epoch"] for n in ("best", "last"))


def test_a_plateau_stops_at_the_expected_epoch_and_tests_the_best(tmp_path, splits, monkeypatch, capsys):
    report, scripted = _fit(
        tmp_path, splits, monkeypatch, PLATEAU, "trainer.epochs=10", "trainer.early_stop_patience=3"
    )
    # epochs 4, 5, 6 do not beat 30 (epoch 3): training ends after epoch 6
    assert _pick(report) == {"epochs": 6, "early_stopped": True, "early_stop_epoch": 6, "best_epoch": 3}
    assert (report["steps"], scripted.calls) == (12, 6)  # 2 steps per epoch; validations 7-10 never ran
    assert report[f"best_val_{METRIC}"] == 30.0
    on_disk = json.loads((tmp_path / "r" / "report.json").read_text())
    assert (on_disk["early_stopped"], on_disk["early_stop_epoch"], on_disk["epochs"]) == (True, 6, 6)
    assert on_disk["test"] == report["test"] and METRIC in on_disk["test"]  # the final test ran
    assert _ckpt_epochs(tmp_path / "r") == (3, 6)  # best.ckpt of the best value; last.ckpt where it stopped
    best = load_checkpoint_file(tmp_path / "r" / "checkpoints" / "best.ckpt")["progress"]
    assert (best["stop_value"], best["stop_epoch"], best["stale_validations"]) == (30.0, 3, 0)  # its own count
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("early stop")]
    assert lines == [
        "early stop after epoch 6: val accuracy has not improved for 3 validations (trainer.early_stop_patience=3); "
        "best 30.00 at epoch 3 (best.ckpt, tested)"
    ]


def test_min_delta_small_gains_do_not_count_but_best_ckpt_follows_them(tmp_path, splits, monkeypatch, capsys):
    values = [10, 20, 20.1, 20.2, 20.3, 30, 40]
    overrides = ("trainer.epochs=7", "trainer.early_stop_patience=3", "trainer.early_stop_min_delta=0.5")
    report, _ = _fit(tmp_path, splits, monkeypatch, values, *overrides)
    # 20.1, 20.2, 20.3 each beat the best (best.ckpt moves) but not 20 + 0.5: the count reaches 3 at epoch 5
    assert _pick(report) == {"epochs": 5, "early_stopped": True, "early_stop_epoch": 5, "best_epoch": 5}
    assert _ckpt_epochs(tmp_path / "r") == (5, 5)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("early stop"))
    assert line == (
        "early stop after epoch 5: val accuracy has not improved by at least 0.5 on 20.00 (epoch 2) for 3 "
        "validations (trainer.early_stop_patience=3, trainer.early_stop_min_delta=0.5); best 20.30 at epoch 5 "
        "(best.ckpt, tested)"
    )


def test_the_count_is_in_validations_with_val_every(tmp_path, splits, monkeypatch):
    # validations after epochs 2, 4, 6, 8, 10: the 3rd and 4th do not improve -> stop after epoch 8
    overrides = ("trainer.epochs=10", "trainer.val_every=2", "trainer.early_stop_patience=2")
    report, scripted = _fit(tmp_path, splits, monkeypatch, [10, 20, 15, 15, 50], *overrides)
    assert (report["epochs"], scripted.calls, report["early_stop_epoch"], report["best_epoch"]) == (8, 4, 8, 4)


def test_patience_0_trains_every_epoch(tmp_path, splits, monkeypatch, capsys):
    report, scripted = _fit(tmp_path, splits, monkeypatch, PLATEAU, "trainer.epochs=10")
    assert _pick(report) == {"epochs": 10, "early_stopped": False, "early_stop_epoch": None, "best_epoch": 3}
    assert scripted.calls == 10
    assert json.loads((tmp_path / "r" / "report.json").read_text())["early_stopped"] is False
    # patience used up exactly at the last epoch: the run ends there anyway, not early
    report, _ = _fit(
        tmp_path, splits, monkeypatch, PLATEAU, "trainer.epochs=6", "trainer.early_stop_patience=3", name="p"
    )
    assert (report["epochs"], report["early_stopped"]) == (6, False)
    assert "early stop" not in capsys.readouterr().out


def _interrupted_run(tmp_path, splits, monkeypatch) -> tuple:
    """The plateau run (patience 3) stopped by SIGTERM in the middle of epoch 5 (at step 9), after 4 validations:
    its config and scripted evaluation, to resume with."""
    scripted = Scripted(splits, PLATEAU)
    monkeypatch.setattr(trainer, "evaluate", scripted)
    overrides = [
        f"trainer.out_dir={tmp_path}",
        "trainer.run_name=r",
        "trainer.epochs=10",
        "trainer.early_stop_patience=3",
    ]
    cfg = load_config(None, [*TINY, *overrides])
    real_backward = Fabric.backward
    sigterm_at_step(monkeypatch, 9)
    with pytest.raises(TrainingInterrupted):
        fit(cfg, splits=splits)
    monkeypatch.setattr(Fabric, "backward", real_backward)
    return cfg, scripted


def test_a_resumed_run_continues_the_count(tmp_path, splits, monkeypatch):
    overrides = ("trainer.epochs=10", "trainer.early_stop_patience=3")
    reference, _ = _fit(tmp_path / "ref", splits, monkeypatch, PLATEAU, *overrides)
    assert reference["early_stop_epoch"] == 6
    cfg, scripted = _interrupted_run(tmp_path, splits, monkeypatch)
    progress = load_checkpoint_file(tmp_path / "r" / "checkpoints" / "last.ckpt")["progress"]
    assert (progress["step"], progress["epoch"], progress["epoch_step"]) == (9, 4, 1)
    # 4 validations done: the reference 30 of epoch 3, then the 4th (25) did not count
    assert (progress["stop_value"], progress["stop_epoch"], progress["stale_validations"]) == (30.0, 3, 1)
    report = fit(cfg, splits=splits, resume=tmp_path / "r")
    assert scripted.calls == 6  # validations 5 and 6 after the resume, none repeated
    for key in ("epochs", "steps", "early_stopped", "early_stop_epoch", "best_epoch", f"best_val_{METRIC}"):
        assert report[key] == reference[key], key
    assert report["test"] == reference["test"]  # the same best.ckpt tested
    # resuming the finished run again trains nothing: it stopped early and stays stopped (test and report again)
    again = fit(cfg, splits=splits, resume=tmp_path / "r")
    assert (again["epochs"], again["steps"], again["early_stopped"], scripted.calls) == (6, 12, True, 6)


def test_a_checkpoint_from_before_early_stopping_resumes_with_a_fresh_count(tmp_path, splits, monkeypatch):
    cfg, _ = _interrupted_run(tmp_path, splits, monkeypatch)
    last = tmp_path / "r" / "checkpoints" / "last.ckpt"
    ckpt = load_checkpoint_file(last)
    for key in ("stop_value", "stop_epoch", "stale_validations"):  # as written before these keys existed
        del ckpt["progress"][key]
    torch.save(ckpt, last)
    report = fit(cfg, splits=splits, resume=tmp_path / "r")
    # the count starts again at the resume: 30 (epoch 5) counts, 29, 28, 27 do not -> stop after epoch 8
    assert (report["epochs"], report["early_stop_epoch"], report["best_epoch"]) == (8, 8, 3)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("trainer.early_stop_patience=-1", "trainer.early_stop_patience=-1 is out of range: it must be >= 0"),
        ("trainer.early_stop_min_delta=-0.1", "trainer.early_stop_min_delta=-0.1 is out of range: it must be >= 0"),
        ("trainer.early_stop_min_delta=.nan", "trainer.early_stop_min_delta=nan is out of range: it must be >= 0"),
        ("trainer.early_stop_patience=1.5", "trainer.early_stop_patience"),
        ("trainer.early_stop_patience=often", "trainer.early_stop_patience"),
    ],
)
def test_a_bad_value_is_a_clear_error(tmp_path, override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(None, [*TINY, f"trainer.out_dir={tmp_path}", override])
    assert fragment in str(e.value) and "\n" not in str(e.value).strip()
    assert not any(tmp_path.iterdir())  # refused before any run folder is made
