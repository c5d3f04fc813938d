"""Engine edge cases: a diverging loss, batches larger than the data, max_steps."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_runs import tiny_ram

from rlattention.engine.checkpoint import load_checkpoint_file
from rlattention.engine.config import load_config
from rlattention.engine.trainer import TrainingDiverged, fit
from rlattention.methods.ram import RAM

TINY = tiny_ram(train=256, val=64, test=64, hidden=32, batch=32, extra=["trainer.log_every=1"])


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    real = RAM.forward
    calls = {"n": 0}

    def forward(self, images, targets):
        out = real(self, images, targets)
        calls["n"] += 1
        if calls["n"] > 5:  # the 6th step diverges
            out.terms["nll"] = out.terms["nll"] * float("nan")
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(RAM, "forward", forward)
    cfg = load_config(
        None, [*TINY, f"trainer.out_dir={tmp_path}", "trainer.run_name=nan", "trainer.checkpoint_every=2"]
    )
    with pytest.raises(TrainingDiverged, match=r"step 5 .*nll"):
        fit(cfg)
    ckpt = load_checkpoint_file(tmp_path / "nan" / "checkpoints" / "last.ckpt")
    assert ckpt["progress"]["step"] == 4
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_batch_larger_than_data_is_a_clear_error(tmp_path):
    cfg = load_config(None, [*TINY, f"trainer.out_dir={tmp_path}", "trainer.batch_size=1024"])
    with pytest.raises(ValueError, match="larger than the training split"):
        fit(cfg)


def test_max_steps_overrides_epochs(tmp_path):
    cfg = load_config(
        None, [*TINY, f"trainer.out_dir={tmp_path}", "trainer.run_name=ms", "trainer.epochs=1", "trainer.max_steps=20"]
    )  # 8 steps per epoch: 20 steps span 3 epochs
    report = fit(cfg)
    assert report["steps"] == 20
    assert json.loads((tmp_path / "ms" / "report.json").read_text())["steps"] == 20


def test_non_finite_loss_is_a_one_line_cli_error(tmp_path, monkeypatch, capsys):
    from rlattention.cli import main

    real = RAM.forward

    def forward(self, images, targets):
        out = real(self, images, targets)
        out.terms["nll"] = out.terms["nll"] * float("inf")
        out.loss = out.loss * float("inf")
        return out

    monkeypatch.setattr(RAM, "forward", forward)
    assert main(["fit", *TINY, f"trainer.out_dir={tmp_path}", "trainer.run_name=inf"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stopped: non-finite loss at step 0" in err[0] and "nll" in err[0]
