"""The Python API (``rlattention.load_model`` / ``predict`` / ``save_pretrained`` / ``create_model``, docs/api.md).

Every ``python`` block of docs/api.md runs as written; a model saved with ``save_pretrained`` and read back with
``load_model`` gives bit-identical outputs (every method that takes images, darp without its phase-1 file); a run
folder loads its best checkpoint and gives the engine's own scores without reading data; every bad input is one
``ValueError`` line saying what was expected; and the attention returned is the attention used: replaying the
returned glimpses (ram, unified), regions (rarl) and maps (scal) through the networks gives the scores back.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
import yaml

import rlattention
from rlattention.api import WEIGHTS_FILE, create_model, load_model, predict, prepare_images, save_pretrained
from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.engine.checkpoint import CheckpointError, atomic_torch_save, load_checkpoint_file
from rlattention.engine.config import load_config, to_dict
from rlattention.engine.method import DataInfo

ROOT = Path(__file__).resolve().parents[1]
S, SIDE, PHOTOS = 2, 16, 6  # the tiny sketch-retrieval items of the darp cases: (S + 3, SIDE, SIDE)

TINY_RAM = {"num_glimpses": 3, "hidden_size": 16, "glimpse_dim": 16, "glimpse_hidden": 8, "loc_hidden": 8}
TINY_RARL = {
    "backbone_channels": [4, 8, 8],
    "anchor_areas": [64.0, 144.0],
    "anchor_ratios": [1.0, 2.0],
    "region_size": 2,
    "region_dim": 8,
    "hidden_size": 8,
    "num_iterations": 3,
}
#: method, model section, DataInfo of the round-trip cases (darp's phase1 path is filled in by the fixture)
CASES = {
    "ram": ("ram", TINY_RAM, ((1, 24, 24), 10)),
    "ram_center": ("ram", {**TINY_RAM, "init_location": "center", "core": "lstm"}, ((1, 24, 24), 10)),
    "unified": ("unified", {**TINY_RAM, "top_down": True, "region_dim": 8, "context": True}, ((1, 32, 32), 10)),
    "cnn": ("cnn", {"channels": [4, 8], "hidden": 8}, ((3, 16, 16), 4)),
    "rarl": ("rarl", TINY_RARL, ((1, 32, 32), 5)),
    "rarl_ten_view": ("rarl", {**TINY_RARL, "test_views": 10, "crop_margin": 8}, ((1, 32, 32), 5)),
    "rarl_global": ("rarl", {**TINY_RARL, "mode": "global"}, ((1, 32, 32), 5)),
    "scal": ("scal", {"width": 4, "critic_hidden": 8}, ((3, 32, 16), 5)),
    "darp_triplet": ("darp_triplet", {"channels": [4, 8], "embed_dim": 8, "shared_backbone": True}, None),
    "darp": ("darp", {"glimpses_per_step": 2, "hidden_size": 16, "glimpse_dim": 8, "num_heads": 2}, None),
    "darp_ensemble": (
        "darp",
        {"glimpses_per_step": 2, "hidden_size": 16, "glimpse_dim": 8, "num_heads": 2, "eval_ensemble": "embeddings"},
        None,
    ),
    "darp_policy": ("darp_policy", {"hidden_size": 8, "algorithm": "ppo"}, None),
}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def uint8_images(info: DataInfo, n: int = 3, seed: int = 0) -> np.ndarray:
    """``n`` random uint8 images of ``info``'s shape, channels-last ``(N, H, W, C)`` as files give them."""
    C, H, W = info.image_shape
    return np.random.default_rng(seed).integers(0, 256, (n, H, W, C), dtype=np.uint8)


def sketch_splits() -> DataSplits:
    g = torch.Generator().manual_seed(0)

    def items(ids: list[int]) -> ArrayDataset:
        images = (torch.rand(len(ids), S + 3, SIDE, SIDE, generator=g) * 255).to(torch.uint8)
        return ArrayDataset(images, torch.tensor(ids))

    return DataSplits(items([0, 1, 2, 3]), items([4]), items([5]), PHOTOS, name="tiny_sketches")


@pytest.fixture(scope="module")
def phase1_file(tmp_path_factory) -> Path:
    """A darp_triplet phase-1 artifact of the tiny sketch items (untrained networks: the API does not care)."""
    folder = tmp_path_factory.mktemp("phase1")
    torch.manual_seed(0)
    triplet = create_model({"method": "darp_triplet", "model": {"channels": [4, 8], "embed_dim": 8}}, sketch_info())
    return triplet.eval().export(sketch_splits(), folder)[0]


def sketch_info() -> DataInfo:
    return DataInfo((S + 3, SIDE, SIDE), PHOTOS)


def build(case: str, phase1: Path | None = None):
    method, section, info = CASES[case]
    section = dict(section)
    if method in ("darp", "darp_policy"):
        section["phase1"] = str(phase1)
    torch.manual_seed(0)
    info = sketch_info() if info is None else DataInfo(*info)
    return create_model({"method": method, "model": section}, info)


def assert_same(a: rlattention.Prediction, b: rlattention.Prediction) -> None:
    assert torch.equal(a.scores, b.scores)
    assert (a.labels is None) == (b.labels is None) and (a.labels is None or torch.equal(a.labels, b.labels))
    assert a.attention.keys() == b.attention.keys()
    for k in a.attention:
        assert torch.equal(a.attention[k], b.attention[k]), k


# ------------------------------------------------------------------------------------------------------ docs


def test_docs_api_code_blocks_run(tmp_path, monkeypatch):
    """Every ```python block of docs/api.md, in order, in one namespace, in an empty folder."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs_api"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/api.md (python block {i + 1})", "exec"), namespace)
    assert (tmp_path / "ram_tiny_model" / WEIGHTS_FILE).is_file()
    assert "docs/api.md" in (ROOT / "README.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("case", sorted(CASES))
def test_save_pretrained_load_model_round_trip_is_bit_identical(case, tmp_path, phase1_file):
    phase1 = None
    if CASES[case][0] in ("darp", "darp_policy"):  # a copy that is deleted before loading
        phase1 = tmp_path / "p1" / "phase1.safetensors"
        phase1.parent.mkdir()
        shutil.copy(phase1_file, phase1)
    model = build(case, phase1)
    images = uint8_images(model.data_info)
    before = predict(model, images)
    assert model.training  # predict evaluates in eval mode and puts the mode back

    folder = model.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "model.safetensors"]
    if phase1 is not None:
        phase1.unlink()  # the phase-1 networks travel in the weights
    loaded = load_model(folder)
    assert not loaded.training and type(loaded) is type(model)
    assert loaded.config == model.config and loaded.data_info == model.data_info
    after = predict(loaded, images)
    assert_same(before, after)
    reference = model.state_dict()
    for k, v in loaded.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, reference[k]), k
    # the safetensors file itself also loads (as what load_model accepts)
    assert_same(after, predict(load_model(folder / WEIGHTS_FILE), images))


@pytest.mark.parametrize("case", sorted(CASES))
def test_front_door_scores_are_the_engines(case, tmp_path, phase1_file):
    """``predict`` gives what the engine's ``model.predict`` gives on the engine's float batch (uint8 / 255, the
    same seeded generator), and ``predict_with_attention`` the same scores as ``predict``."""
    model = build(case, phase1_file).eval()
    images = uint8_images(model.data_info)
    # the engine's data: contiguous uint8 (N, C, H, W), converted by x.float().div_(255)
    engine_batch = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().float().div_(255.0)
    assert torch.equal(prepare_images(model, images), engine_batch)
    seed = model.config.eval.seed
    engine = model.predict(engine_batch, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(predict(model, images).scores, engine)
    scores, _ = model.predict_with_attention(engine_batch, torch.Generator().manual_seed(seed))
    assert torch.equal(scores, engine)


def test_shared_tensors_are_stored_once(tmp_path):
    from safetensors import safe_open

    model = build("darp_triplet")
    assert model.sketch_net is model.photo_net
    model.save_pretrained(tmp_path / "saved")
    with safe_open(str(tmp_path / "saved" / WEIGHTS_FILE), framework="pt") as f:
        keys = set(f.keys())
    assert any(k.startswith("photo_net.") for k in keys)
    assert not any(k.startswith("sketch_net.") for k in keys)
    loaded = load_model(tmp_path / "saved")
    assert torch.equal(loaded.sketch_net.fc.weight, model.photo_net.fc.weight)


def test_dcpg_loads_from_checkpoint_without_meta_and_predict_says_what_to_call(tmp_path):
    """A checkpoint records no DataInfo.meta: dcpg's vocabulary size comes from its word embedding."""
    section = {"embed_dim": 8, "word_dim": 8, "gcn_layers": 1, "heads": 1, "num_bins": 10, "decoder_layers": 1}
    torch.manual_seed(0)
    model = create_model(
        {"method": "dcpg", "model": section}, {"image_shape": (1, 4, 6), "num_classes": 5, "meta": {"vocab_size": 12}}
    ).eval()
    features = torch.rand(3, 1, 4, 6)
    targets = torch.tensor([[0, 1, 5, 6, 2], [1, 1, 7, 2, 0], [2, 1, 9, 10, 2]])
    ckpt = {
        "model": model.state_dict(),
        "config": to_dict(model.config),
        "data_info": {"image_shape": [1, 4, 6], "num_classes": 5},
        "progress": {"step": 1, "total_steps": 2},
    }
    atomic_torch_save(ckpt, tmp_path / "dcpg.ckpt")
    loaded = load_model(tmp_path / "dcpg.ckpt")
    assert loaded.data_info.meta == {"vocab_size": 12}
    assert torch.equal(loaded.predict_batch(features, targets), model.predict_batch(features, targets))
    again = load_model(loaded.save_pretrained(tmp_path / "saved"))
    assert torch.equal(again.predict_batch(features, targets), model.predict_batch(features, targets))
    with pytest.raises(ValueError, match=r"region features with captions: call model\.predict_batch"):
        predict(loaded, features)


def test_checkpoints_carry_the_datas_meta(tmp_path):
    """The data's facts (a folder's class names, a vocabulary's words) travel with the weights: a checkpoint's
    data_info keeps DataSplits.meta, so a model loaded from it has them; a value that is not plain data is left
    out with a warning naming it, and the run still trains and saves."""
    from rlattention.engine.trainer import fit

    gen = torch.Generator().manual_seed(0)

    def items(n: int) -> ArrayDataset:
        images = torch.randint(0, 256, (n, 1, 24, 24), generator=gen, dtype=torch.uint8)
        return ArrayDataset(images, torch.arange(n) % 3)

    meta = {"classes": ["cat", "dog", "eel"], "vocab": ["a", "b"], "counts": {"train": 12}, "table": np.zeros(2)}
    splits = DataSplits(items(12), items(6), items(6), 3, name="tiny", meta=meta)
    cfg = load_config(
        None,
        [
            "method=ram",
            *(f"model.{k}={v}" for k, v in TINY_RAM.items()),
            "trainer.batch_size=6",
            "trainer.max_steps=2",
            "trainer.progress=false",
            "trainer.num_threads=1",
            "eval.viz_images=0",
            f"trainer.out_dir={tmp_path}",
            "trainer.run_name=meta",
        ],
    )
    threads = torch.get_num_threads()
    try:
        with pytest.warns(UserWarning, match=r"data_info\.meta\.table: a ndarray cannot be saved"):
            run = Path(fit(cfg, splits=splits)["run_dir"])
    finally:
        torch.set_num_threads(threads)
    saved = load_checkpoint_file(run / "checkpoints" / "last.ckpt")["data_info"]
    assert saved["meta"] == {"classes": ["cat", "dog", "eel"], "vocab": ["a", "b"], "counts": {"train": 12}}
    loaded = load_model(run)
    assert loaded.data_info.meta["classes"] == ["cat", "dog", "eel"] and "table" not in loaded.data_info.meta
    again = load_model(loaded.save_pretrained(tmp_path / "saved"))
    assert again.data_info == loaded.data_info
    with pytest.raises(ValueError, match=r"data_info\.meta\.table: a ndarray cannot be saved"):
        DataInfo((1, 24, 24), 3, meta).record()


# -------------------------------------------------------------------------------------------- run folders


@pytest.fixture(scope="module")
def ram_run(tmp_path_factory) -> Path:
    from rlattention.engine.trainer import fit

    out = tmp_path_factory.mktemp("runs")
    threads = torch.get_num_threads()
    cfg = load_config(
        None,
        [
            "method=ram",
            "data.name=digits",
            "data.canvas_size=24",
            "data.num_train=32",
            "data.val_size=16",
            "data.num_test=16",
            *(f"model.{k}={v}" for k, v in TINY_RAM.items()),
            "trainer.batch_size=16",
            "trainer.max_steps=2",
            "trainer.progress=false",
            "trainer.num_threads=1",
            "eval.viz_images=0",
            f"trainer.out_dir={out}",
            "trainer.run_name=ram",
        ],
    )
    try:
        return Path(fit(cfg)["run_dir"])
    finally:
        torch.set_num_threads(threads)


def test_run_folder_loads_best_then_last_with_the_engines_scores(ram_run, tmp_path):
    from rlattention.engine.trainer import load_for_eval

    run = tmp_path / "run"
    shutil.copytree(ram_run, run)
    best, last = run / "checkpoints" / "best.ckpt", run / "checkpoints" / "last.ckpt"
    ckpt = load_checkpoint_file(best)
    ckpt["model"] = {k: v + 0.01 if v.is_floating_point() else v for k, v in ckpt["model"].items()}
    atomic_torch_save(ckpt, best)  # best now differs from last

    _, engine_model, splits = load_for_eval(best)  # the engine's evaluation path: rebuilds the data
    images = splits.test.images[:4]  # uint8 (4, 1, 24, 24), the datasets' layout
    engine = engine_model.eval().predict(images.float() / 255, generator=torch.Generator().manual_seed(1234))

    from_run = predict(load_model(run), images)
    assert torch.equal(from_run.scores, engine)  # the run folder means best.ckpt; no data was needed
    assert torch.equal(predict(load_model(best), images).scores, engine)
    assert torch.equal(predict(load_model(run / "checkpoints"), images).scores, engine)
    assert not torch.equal(predict(load_model(last), images).scores, engine)
    best.unlink()
    assert torch.equal(predict(load_model(run), images).scores, predict(load_model(last), images).scores)

    model = load_model(last)
    assert model.training_progress == 1.0 and model.config.method == "ram"
    same = predict(load_model(model.save_pretrained(tmp_path / "saved")), images)
    assert_same(predict(model, images), same)


# ----------------------------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def ram_model():
    return build("ram")  # images (1, 24, 24)


GOOD = np.zeros((24, 24), np.uint8)


@pytest.mark.parametrize(
    "images, fragments",
    [
        (GOOD.astype(np.int64), ["dtype int64", "expected uint8 (0-255) or floating point in [0, 1]"]),
        (torch.zeros(1, 24, 24, dtype=torch.bool), ["dtype torch.bool", "expected uint8"]),
        (torch.full((1, 24, 24), 1.5), ["float values in [1.5, 1.5]", "expected [0, 1]"]),
        (torch.full((2, 1, 24, 24), -0.25), ["float values in [-0.25, -0.25]", "expected [0, 1]"]),
        (torch.full((1, 24, 24), float("nan")), ["576 NaN value(s)", "expected floats in [0, 1]"]),
        (torch.full((1, 24, 24), float("inf")), ["float values in [inf, inf]", "expected [0, 1]"]),
        (torch.zeros(24, 24), ["float array of shape (24, 24)", "expected (C, H, W) or (N, C, H, W)"]),
        (torch.zeros(1, 1, 1, 24, 24), ["float array of shape (1, 1, 1, 24, 24)", "(N, C, H, W)"]),
        (np.zeros((1, 1, 1, 24, 24), np.uint8), ["uint8 array of shape (1, 1, 1, 24, 24)", "(H, W), (H, W, C)"]),
        (np.zeros(24, np.uint8), ["uint8 array of shape (24,)", "expected (H, W)"]),
        (np.zeros((24, 24, 3), np.uint8), ["3 channel(s)", "read as (H, W, C)", "takes 1 channel(s)"]),
        (torch.zeros(2, 3, 24, 24), ["3 channel(s)", "read as (N, C, H, W)", "takes 1 channel(s)"]),
        (np.zeros((20, 24), np.uint8), ["20 x 24 pixels", "takes 24 x 24", "nothing is resized silently"]),
        (torch.zeros(1, 32, 32), ["32 x 32 pixels", "takes 24 x 24"]),
        (np.zeros((0, 24, 24), np.uint8), ["an empty batch of shape (0, 24, 24)"]),
        (["a", "b"], ["dtype <U1", "expected uint8"]),
    ],
    ids=[
        "int64",
        "bool",
        "above_1",
        "below_0",
        "nan",
        "inf",
        "float_2d",
        "float_5d",
        "uint8_5d",
        "uint8_1d",
        "rgb_for_grey",
        "float_3_channels",
        "height",
        "float_size",
        "empty",
        "strings",
    ],
)
def test_bad_images_are_one_clear_value_error(ram_model, images, fragments):
    with pytest.raises(ValueError) as err:
        predict(ram_model, images)
    message = str(err.value)
    assert "\n" not in message and message.startswith("images: ")
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_every_accepted_layout_gives_the_same_prediction(ram_model):
    rng = np.random.default_rng(3)
    hw = rng.integers(0, 256, (24, 24), dtype=np.uint8)
    reference = predict(ram_model, hw).scores
    same = [
        hw[:, :, None],  # (H, W, C)
        hw[None],  # (N, H, W)
        hw[None, :, :, None],  # (N, H, W, C)
        torch.from_numpy(hw)[None, None],  # (N, C, H, W): the datasets' layout
        torch.from_numpy(hw).float().div(255)[None],  # float (C, H, W)
        torch.from_numpy(hw).double().div(255)[None, None],  # float64 (N, C, H, W)
    ]
    for images in same:
        assert torch.equal(predict(ram_model, images).scores, reference)
    with pytest.raises(TypeError, match="expected an rlattention model"):
        predict(torch.nn.Linear(2, 2), hw)


def test_load_errors_name_the_path_and_what_was_expected(tmp_path, ram_model):
    with pytest.raises(FileNotFoundError, match=r"missing: not found; expected a run folder, a \.ckpt"):
        load_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty: neither a run folder .* nor a saved model folder"):
        load_model(tmp_path / "empty")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("method: ram\n")
    with pytest.raises(CheckpointError, match=r"run: run folder without checkpoints/best\.ckpt or checkpoints/last"):
        load_model(run)
    (tmp_path / "phase1.safetensors").write_bytes(safetensors.torch.save({"gallery": torch.zeros(2, 2)}))
    with pytest.raises(CheckpointError, match=r"phase1\.safetensors: a \.safetensors file other than a saved folder"):
        load_model(tmp_path / "phase1.safetensors")
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"junk\.ckpt: not a loadable rlattention checkpoint"):
        load_model(tmp_path / "junk.ckpt")

    saved = ram_model.save_pretrained(tmp_path / "saved")
    config = (saved / "config.yaml").read_text()
    (saved / "config.yaml").unlink()
    with pytest.raises(CheckpointError, match=r"saved: has model\.safetensors but no config\.yaml"):
        load_model(saved)
    record = yaml.safe_load(config)
    (saved / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in record.items() if k != "saved_model"}))
    with pytest.raises(CheckpointError, match=r"config\.yaml: no 'saved_model' section"):
        load_model(saved)
    record["saved_model"]["data_info"]["image_shape"] = [1, 24]
    (saved / "config.yaml").write_text(yaml.safe_dump(record))
    with pytest.raises(CheckpointError, match=r"saved_model\.data_info: image_shape must be three positive integers"):
        load_model(saved)
    (saved / "config.yaml").write_text(config)
    other = build("ram_center").save_pretrained(tmp_path / "other")
    shutil.copy(other / WEIGHTS_FILE, saved / WEIGHTS_FILE)  # a save cut short between its two renames
    with pytest.raises(CheckpointError, match=r"model\.safetensors: sha256 .* the folder holds parts of two"):
        load_model(saved)
    record["saved_model"]["data_info"]["image_shape"] = [1, 24, 24]
    record["saved_model"].pop("weights_sha256")
    (saved / "config.yaml").write_text(yaml.safe_dump(record))
    (saved / WEIGHTS_FILE).write_bytes(b"\x40" + b"\x00" * 20)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        load_model(saved)
    (saved / WEIGHTS_FILE).write_bytes(safetensors.torch.save({"x": torch.zeros(1)}))  # a safetensors file, not ours
    with pytest.raises(CheckpointError, match=r"model\.safetensors: format None, expected 'rlattention\.saved_model"):
        load_model(saved)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_save_pretrained_never_overwrites_or_follows_links(tmp_path, ram_model):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(FileExistsError, match=r"busy: not empty; pass overwrite=True"):
        save_pretrained(ram_model, busy)
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(target, tmp_path / "link")
    with pytest.raises(OSError, match=r"link is a symbolic link; save_pretrained never writes through a link"):
        save_pretrained(ram_model, tmp_path / "link")
    assert not any(target.iterdir())
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileExistsError, match=r"run: a run folder \(checkpoints/\)"):
        save_pretrained(ram_model, tmp_path / "run", overwrite=True)
    (tmp_path / "run" / "checkpoints").rmdir()
    (tmp_path / "run").rmdir()
    assert snapshot(tmp_path) == before

    ram_model.save_pretrained(tmp_path / "saved")
    os.replace(tmp_path / "saved" / "config.yaml", tmp_path / "elsewhere.yaml")
    os.symlink(tmp_path / "elsewhere.yaml", tmp_path / "saved" / "config.yaml")
    with pytest.raises(OSError, match=r"config\.yaml is a symbolic link"):
        save_pretrained(ram_model, tmp_path / "saved", overwrite=True)
    os.unlink(tmp_path / "saved" / "config.yaml")

    other = build("ram_center")
    save_pretrained(other, busy, overwrite=True)  # replaces the two files, leaves the others
    assert (busy / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in busy.iterdir()) == ["config.yaml", "model.safetensors", "notes.txt"]
    images = uint8_images(other.data_info)
    assert_same(predict(load_model(busy), images), predict(other, images))
    with pytest.raises(ValueError, match=r"needs the model's experiment config and DataInfo"):
        save_pretrained(type(other)(other.cfg, other.data_info), tmp_path / "bare")


# ----------------------------------------------------------------------------- the attention is the one used


def test_ram_locations_are_the_glimpses_that_gave_the_scores(ram_model):
    """Reading glimpses at the returned locations through the glimpse, core and classifier networks gives the
    scores back; reading them elsewhere does not."""
    model = ram_model.eval()
    images = uint8_images(model.data_info, n=4)
    pred = predict(model, images)
    locations = pred.attention["locations"]
    assert locations.shape == (4, model.cfg.num_glimpses, 2) and bool((locations.abs() <= 1).all())
    assert not torch.equal(locations[:, 1], locations[:, 2])  # the policy moved the glimpse
    x = prepare_images(model, images)

    def replay(locs: torch.Tensor) -> torch.Tensor:
        prepared, state = model.sensor.prepare(x), model.core.initial_state(len(x), x)
        with torch.no_grad():
            for t in range(locs.shape[1]):
                patches = model.sensor.extract(prepared, locs[:, t], x.dtype)
                h, state = model.core(model.glimpse(patches, locs[:, t]), state)
            return model.classifier(h).softmax(-1)

    assert torch.equal(replay(locations), pred.scores)
    assert not torch.allclose(replay(locations.flip(-1) * 0.5), pred.scores)


def test_unified_region_is_where_the_first_glimpse_went(tmp_path):
    model = build("unified").eval()
    images = uint8_images(model.data_info, n=4)
    pred = predict(model, images)
    att = pred.attention
    levels, cells = model.cfg.pyramid_levels, model.cfg.pyramid_split**2
    assert att["region_boxes"].shape == (4, levels, cells, 4) and att["region_choices"].shape == (4, levels)
    last = att["region_boxes"][torch.arange(4), -1, att["region_choices"][:, -1]]
    assert torch.equal(att["region"], last)  # the finest region is the last level's choice
    assert torch.equal(att["locations"][:, 0], 0.5 * (att["region"][:, :2] + att["region"][:, 2:]))  # L_0: its centre
    side = 2.0 / model.cfg.pyramid_split**levels
    assert torch.allclose(att["region"][:, 2:] - att["region"][:, :2], torch.full((4, 2), side))


def test_rarl_boxes_are_the_regions_whose_scores_were_pooled():
    """Cropping the returned boxes from the feature map and running the LSTM and classifier over them, with the
    category-wise max, gives the scores back; other boxes do not."""
    model = build("rarl").eval()
    images = uint8_images(model.data_info, n=4)
    pred = predict(model, images)
    boxes, T, k = pred.attention["boxes"], model.cfg.num_iterations, model.num_regions
    assert boxes.shape == (4, T, k, 4) and pred.labels.dtype == torch.bool
    centres = 0.5 * (boxes[..., :2] + boxes[..., 2:])
    assert torch.allclose(centres, pred.attention["locations"][:, :, None].expand_as(centres), atol=1e-6)
    x = prepare_images(model, images)

    def replay(b: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            fmap = model.backbone.feature_map(x).contiguous(memory_format=torch.channels_last)
            _, state = model._regions(fmap, fmap.new_tensor([-1.0, -1.0, 1.0, 1.0]).expand(len(x), 1, 4), None)
            scores = []
            for t in range(T):
                h_r, state = model._regions(fmap, b[:, t], state)
                scores.append(model.classifier(h_r).float())
            return model._probs(torch.cat(scores, 1).max(1).values)

    assert torch.allclose(replay(boxes), pred.scores, atol=1e-6)
    assert not torch.allclose(replay(boxes.flip(1).roll(1, 0)), pred.scores, atol=1e-6)


def test_rarl_ten_view_regions_lie_inside_their_views():
    model = build("rarl_ten_view").eval()
    pred = predict(model, uint8_images(model.data_info, n=2))
    att = pred.attention
    assert att["locations"].shape == (2, 10, model.cfg.num_iterations, 2) and att["views"].shape == (10, 4)
    views = att["views"][None, :, None]  # (1, 10, 1, 4)
    inside = (att["locations"] >= views[..., :2] - 1e-6) & (att["locations"] <= views[..., 2:] + 1e-6)
    assert bool(inside.all())
    first, mirrored = att["views"][:5], att["views"][5:]  # views 5-9: the mirror image's, mapped back
    assert torch.equal(mirrored[:, [1, 3]], first[:, [1, 3]]) and torch.equal(mirrored[:, [0, 2]], -first[:, [2, 0]])


def test_scal_maps_are_the_attention_multiplied_into_the_features():
    """One spatial module after the stride-1 stem: its map is at image resolution, so multiplying the stem's
    features by the returned map and running the rest of the network gives the embeddings back."""
    torch.manual_seed(0)
    section = {"width": 4, "critic_hidden": 8, "positions": [0], "attention_types": ["spatial"], "stem": "small"}
    model = create_model({"method": "scal", "model": section}, {"image_shape": (3, 16, 8), "num_classes": 3}).eval()
    images = uint8_images(model.data_info, n=4)
    pred = predict(model, images)
    maps = pred.attention["maps"]
    assert maps.shape == (4, 1, 16, 8) and bool(((maps > 0) & (maps < 1)).all()) and pred.labels is None
    x = prepare_images(model, images)

    def replay(m: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            stages = model.backbone.stages()
            h = stages[0](x) * m
            for stage in stages[1:]:
                h = stage(h)
            return model.bnneck(h.mean((2, 3)))

    assert torch.allclose(replay(maps), pred.scores, atol=1e-5)
    assert not torch.allclose(replay(torch.ones_like(maps)), pred.scores, atol=1e-3)


def test_darp_glimpses_per_partial_start_at_the_centre(phase1_file):
    model = build("darp", phase1_file).eval()
    pred = predict(model, torch.from_numpy(uint8_images(model.data_info)).permute(0, 3, 1, 2))  # (N, S + 3, H, W)
    locations = pred.attention["locations"]
    assert locations.shape == (3, S, model.cfg.glimpses_per_step, 2)
    assert torch.equal(locations[:, :, 0], torch.zeros(3, S, 2))  # a per-partial episode starts at the centre
    assert bool((locations[:, :, 1:] != 0).any())
    ensemble = build("darp_ensemble", phase1_file)
    assert predict(ensemble, uint8_images(ensemble.data_info)).attention["locations"].shape == (3, 2, S, 2, 2)
