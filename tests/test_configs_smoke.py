"""Every config file in configs/ trains for two steps through the CLI (tiny data), so a new config is tested
the day it is added. Configs whose data is not on this machine (CIFAR-10, SVHN) are skipped with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlattention.cli import main
from rlattention.engine.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
DATA_FOLDER = {  # dataset -> its folder in the shared data
    "mnist": "mnist",
    "cluttered_mnist": "mnist",
    "mnist_sequences": "mnist",
    "multilabel_digits": "mnist",
    "coco": "coco_train2017_subset128",
}
NOT_HERE = {"cifar10": "CIFAR-10", "svhn_sequences": "SVHN", "svhn_cropped": "SVHN", "voc2007": "Pascal VOC 2007"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_smoke_fit(path, tmp_path, shared_data):
    cfg = load_config(path)
    if cfg.data.name in NOT_HERE:
        pytest.skip(f"{NOT_HERE[cfg.data.name]} is not in the shared data of this machine ({shared_data})")
    data_dir = []
    if cfg.data.name in DATA_FOLDER:
        folder = shared_data / DATA_FOLDER[cfg.data.name]
        if not folder.exists():
            pytest.skip(f"{cfg.data.name} data not found at {folder}")
        data_dir = ["--data-dir", str(folder)]
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
    if cfg.data.name in ("digits", "mnist_sequences", "multilabel_digits"):
        argv.append("data.val_size=32")
    if cfg.data.name == "coco":
        argv = [a for a in argv if not a.startswith(("data.num_train", "data.num_test"))] + ["data.val_size=8"]
    assert main(argv) == 0
    report = json.loads((tmp_path / "smoke" / "report.json").read_text())
    assert report["steps"] == 2 and report["test"]["count"] > 0
    assert (tmp_path / "smoke" / "checkpoints" / "best.ckpt").is_file()
