"""What a run logs besides metrics.csv: TensorBoard gets the run's figures and its config as hyperparameters with
the final metrics (read back from the event files), and ``trainer.wandb: PROJECT`` adds Weights & Biases, offline
unless ``WANDB_MODE`` says otherwise, with a one-line error when the package is missing (tested with a fake
``wandb`` module: the package is not a test dependency)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch
from tiny_runs import tiny_ram

from rlattention.cli import main
from rlattention.engine.config import ConfigError
from rlattention.engine.loggers import WANDB_MISSING, WandbLogger, check_wandb_project

TINY = tiny_ram(eval_batch=64, viz=2, extra=["trainer.max_steps=2", "trainer.log_every=1"])


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _fit(out: Path, name: str, *extra: str) -> int:
    return main(["fit", *TINY, f"trainer.out_dir={out}", f"trainer.run_name={name}", *extra])


def _events(run: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_gets_the_figures_and_the_config_as_hyperparameters(tmp_path):
    assert _fit(tmp_path, "run") == 0
    run = tmp_path / "run"
    report = json.loads((run / "report.json").read_text())
    assert len(report["figures"]) == 2
    acc = _events(run)
    tags = acc.Tags()
    # every figure of report.json, as an image of the run's last step
    expected = {f"figures/{Path(p).stem}" for p in report["figures"]}
    assert expected <= set(tags["images"])
    image = acc.Images(sorted(expected)[0])[-1]
    assert image.step == report["steps"] and image.width > 0 and image.height > 0
    # the hparams plugin: the resolved config (nested keys joined by "/") with the final metrics
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent("hparams")
    assert content, "no hyperparameters in the TensorBoard run"
    session = experiment = None
    for data in content.values():
        parsed = plugin_data_pb2.HParamsPluginData.FromString(data)
        if parsed.HasField("session_start_info"):
            session = parsed.session_start_info
        if parsed.HasField("experiment"):
            experiment = parsed.experiment
    assert session is not None and experiment is not None
    assert session.hparams["method"].string_value == "ram"
    assert session.hparams["trainer/max_steps"].number_value == 2
    assert session.hparams["data/name"].string_value == "digits"
    metrics = {m.name.tag for m in experiment.metric_infos}
    assert {f"test/{k}" for k in report["test"]} <= metrics
    assert "best_val/accuracy" in metrics
    assert acc.Scalars("best_val/accuracy")[-1].value == pytest.approx(report["best_val_accuracy"])


class FakeRun:
    def __init__(self, calls: list, kwargs: dict) -> None:
        self.calls, self.id = calls, "fake-id-1"
        self.config = types.SimpleNamespace(update=lambda params, **kw: calls.append(("config", params, kw)))
        self.summary = types.SimpleNamespace(update=lambda metrics: calls.append(("summary", metrics)))

    def log(self, data: dict, step: int | None = None) -> None:
        self.calls.append(("log", data, step))

    def finish(self, exit_code: int = 0) -> None:
        self.calls.append(("finish", exit_code))


def _fake_wandb(calls: list) -> types.ModuleType:
    module = types.ModuleType("wandb")

    def init(**kwargs):
        calls.append(("init", kwargs))
        return FakeRun(calls, kwargs)

    class Image:
        def __init__(self, path: str) -> None:
            self.path = path

    module.init, module.Image = init, Image
    return module


def test_wandb_logs_scalars_config_summary_and_figures_offline(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(calls))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert _fit(tmp_path, "run", "trainer.wandb=my-project") == 0
    run = tmp_path / "run"
    report = json.loads((run / "report.json").read_text())
    inits = [c[1] for c in calls if c[0] == "init"]
    assert len(inits) == 1
    init = inits[0]
    assert init["mode"] == "offline"  # nothing leaves the machine unasked
    assert init["project"] == "my-project" and init["name"] == "run" and init["dir"] == str(run)
    assert init["config"]["method"] == "ram" and init["config"]["trainer"]["wandb"] == "my-project"
    assert (run / "wandb-id").read_text() == "fake-id-1"  # a resume continues this W&B run
    logged = [c for c in calls if c[0] == "log"]
    keys = set().union(*(c[1] for c in logged))
    assert {"train/loss", "val/accuracy", "test/accuracy"} <= keys
    images = [(k, v.path) for c in logged for k, v in c[1].items() if k.startswith("figures/")]
    assert sorted(p for _, p in images) == sorted(report["figures"])
    summaries = [c[1] for c in calls if c[0] == "summary"]
    assert summaries and summaries[-1]["test/accuracy"] == pytest.approx(report["test"]["accuracy"])
    assert calls[-1] == ("finish", 0)


def test_wandb_mode_comes_from_the_environment(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(calls))
    monkeypatch.setenv("WANDB_MODE", "online")
    (tmp_path / "wandb-id").write_text("earlier-run\n")
    logger = WandbLogger(tmp_path, "p", {"a": 1})
    logger.log_metrics({"x": 1.0}, step=3)
    logger.finalize("interrupted")
    init = calls[0][1]
    assert init["mode"] == "online" and init["id"] == "earlier-run" and init["resume"] == "allow"
    assert calls[1] == ("log", {"x": 1.0}, 3) and calls[-1] == ("finish", 1)


def test_missing_wandb_is_a_one_line_error_before_the_run_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails as when it is not installed
    assert _fit(tmp_path, "run", "trainer.wandb=my-project") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'pip install "rlattention[wandb]"' in err and WANDB_MISSING in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["a/b", "x:y", " p", "q" * 129])
def test_wandb_project_names_are_checked(name):
    with pytest.raises(ConfigError, match="trainer.wandb"):
        check_wandb_project(name)
    assert check_wandb_project("rlattention-ram") == "rlattention-ram"
