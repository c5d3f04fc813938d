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
    "qmul_chairv2": "qmul_chairv2",
    "omniglot_sketch": "omniglot",
    "omniglot_reid": "omniglot",
    "digit_scenes": "mnist",
}
NOT_HERE = {
    "cifar10": "CIFAR-10",
    "svhn_sequences": "SVHN",
    "svhn_cropped": "SVHN",
    "voc2007": "Pascal VOC 2007",
    "market1501": "Market-1501",
    "dukemtmc": "DukeMTMC-reID",
}


def _phase1_config(artifact: str) -> Path:
    """The config whose run writes ``artifact`` (``runs/<run_name>/phase1.safetensors``)."""
    run_name = Path(artifact).parent.name
    for path in CONFIGS:
        if load_config(path).trainer.run_name == run_name:
            return path
    raise AssertionError(f"no config in configs/ has trainer.run_name={run_name!r} (needed for {artifact})")


@pytest.fixture(scope="module")
def scene_cache(tmp_path_factory) -> Path:
    """One cache for every digit_scenes config: the tiny dataset is generated once and reused."""
    return tmp_path_factory.mktemp("digit_scenes_cache")


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_smoke_fit(path, tmp_path, shared_data, scene_cache):
    _smoke_fit(path, tmp_path, shared_data, scene_cache)


#: phase-1 config -> its smoke run (this worker's): the phase-2 configs that need one fit it once, not once each
_PHASE1_RUNS: dict[Path, Path] = {}


def _phase1_run(path: Path, tmp_path: Path, shared_data: Path, scene_cache: Path | None) -> Path:
    run = _PHASE1_RUNS.get(path)
    if run is None or not (run / "phase1.safetensors").is_file():
        run = _PHASE1_RUNS[path] = _smoke_fit(path, tmp_path, shared_data, scene_cache)
    return run


def _smoke_fit(path: Path, tmp_path: Path, shared_data: Path, scene_cache: Path | None = None) -> Path:
    cfg = load_config(path)
    extra = []
    phase1 = getattr(cfg.model, "phase1", None)
    if phase1:  # a phase-2 method: the smoke run of the phase-1 config that writes its artifact, made first
        run = _phase1_run(_phase1_config(phase1), tmp_path / "phase1", shared_data, scene_cache)
        extra.append(f"model.phase1={run / 'phase1.safetensors'}")
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
    if cfg.data.name == "coco":  # 128 images, each through a pretrained backbone (and mirrored) for its features
        argv = [a for a in argv if not a.startswith(("data.num_train", "data.num_test"))]
        argv += ["data.num_train=24", "data.num_test=16", "data.val_size=8"]
    if cfg.data.name in ("qmul_chairv2", "omniglot_sketch"):
        # renders: the suite's cache ($RLATTENTION_CACHE, tests/conftest.py), keyed by content, built once a session
        argv += ["data.val_size=4", "data.image_size=32", "data.completion_steps=4"]
    if cfg.data.name == "omniglot_reid":
        argv += ["data.reid_val_ids=4"]
    if cfg.data.name == "digit_scenes":
        argv += [f"data.render_cache={scene_cache}", "model.embed_dim=32", "model.num_bins=10"]
    assert main(argv + extra) == 0
    report = json.loads((tmp_path / "smoke" / "report.json").read_text())
    assert report["steps"] == 2 and report["test"]["count"] > 0
    assert (tmp_path / "smoke" / "checkpoints" / "best.ckpt").is_file()
    return tmp_path / "smoke"
