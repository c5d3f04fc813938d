"""Every config file in configs/ trains for two steps through the CLI (tiny data), so a new config is tested
the day it is added. Configs whose data is not on this machine (CIFAR-10, SVHN) are skipped with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlattention.cli import main
from rlattention.engine.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
NEEDS_MNIST = {"mnist", "cluttered_mnist", "mnist_sequences"}
NOT_HERE = {"cifar10": "CIFAR-10", "svhn_sequences": "SVHN", "svhn_cropped": "SVHN"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_smoke_fit(path, tmp_path, shared_data):
    cfg = load_config(path)
    if cfg.data.name in NOT_HERE:
        pytest.skip(f"{NOT_HERE[cfg.data.name]} is not in the shared data of this machine ({shared_data})")
    data_dir = []
    if cfg.data.name in NEEDS_MNIST:
        mnist = shared_data / "mnist"
        if not mnist.exists():
            pytest.skip(f"real MNIST not found at {mnist}")
        data_dir = ["--data-dir", str(mnist)]
    argv = [
        "fit",
        "--config",
        str(path),
        *data_dir,
        f"trainer.out_dir={tmp_path}",
        "trainer.run_name=smoke",
        "trainer.epochs=1",
        "trainer.max_steps=2",
        "trainer.batch_size=16",
        "trainer.eval_batch_size=32",
        "trainer.progress=false",
        "trainer.num_threads=1",
        "data.num_train=64",
        "data.num_test=32",
        "eval.viz_images=1",
    ]
    if cfg.data.name in ("digits", "mnist_sequences"):
        argv.append("data.val_size=32")
    assert main(argv) == 0
    report = json.loads((tmp_path / "smoke" / "report.json").read_text())
    assert report["steps"] == 2 and report["test"]["count"] > 0
    assert (tmp_path / "smoke" / "checkpoints" / "best.ckpt").is_file()
