"""The Python front door: load a trained model, predict on ordinary images, read the attention, save and reload.

    import rlattention

    model = rlattention.load_model("runs/ram_digits")  # a run folder, a .ckpt file, or a save_pretrained folder
    pred = rlattention.predict(model, images)          # uint8 (H, W[, C]) arrays or float tensors in [0, 1]
    pred.scores, pred.labels, pred.attention["locations"]
    model.save_pretrained("ram_digits_model")          # config.yaml + model.safetensors, read by load_model

Every model is built from its config and the :class:`~rlattention.engine.method.DataInfo` it was trained with
(image shape, class count, dataset facts), never from the data itself: a checkpoint records the image shape and
the class count, a :func:`save_pretrained` folder the whole ``DataInfo``. The images are checked against that
shape, and converted as the engine converts its own uint8 data (``x / 255``). Predictions use mean actions (no
sampling), in eval mode, with random numbers (e.g. RAM's random first glimpse) drawn from a generator seeded with
the config's ``eval.seed``, so that the same images always give the same outputs. See ``docs/api.md``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from rlattention.engine.config import ExperimentConfig, build_config, from_dict, read_config_file
from rlattention.engine.method import AttentionMethod, DataInfo
from rlattention.engine.predict import Prediction, predict, prepare_images
from rlattention.engine.pretrained import (
    CONFIG_FILE,
    SAVED_FORMAT,
    SAVED_SECTION,
    WEIGHTS_FILE,
    _decode_state,
    save_pretrained,
)
from rlattention.engine.registry import get_method
from rlattention.engine.rundir import find_run_dir

# ------------------------------------------------------------------------------------------------ building


def create_model(config: ExperimentConfig | dict | str | os.PathLike, info: DataInfo | dict) -> AttentionMethod:
    """A new, untrained model of ``config`` for data described by ``info``, built as the engine builds it (the
    method's ``from_config`` with the config's ``model`` section), with ``.config`` and ``.data_info`` attached so
    that :func:`predict` can check its inputs and :func:`save_pretrained` can write it.

    config: an :class:`~rlattention.engine.config.ExperimentConfig`, a dict as a YAML config holds it (e.g.
        ``{"method": "ram", "model": {"num_glimpses": 4}}``; unset keys take their defaults), or a YAML file.
    info: a :class:`DataInfo` or ``{"image_shape": (C, H, W), "num_classes": K, "meta": {...}}``.
    """
    if isinstance(config, ExperimentConfig):
        cfg = config
    elif isinstance(config, dict):
        cfg = build_config(config, source="create_model(config)")
    else:
        cfg = build_config(read_config_file(Path(config)), source=str(config))
    info = info if isinstance(info, DataInfo) else DataInfo.from_record(info, "create_model(info)")
    model = get_method(cfg.method).from_config(cfg.model, info)
    return _attach(model, cfg, info, 0.0)


def _attach(model: AttentionMethod, cfg: ExperimentConfig, info: DataInfo, progress: float) -> AttentionMethod:
    model.config = cfg
    model.data_info = info
    model.training_progress = progress  # the fraction of training its schedules (sigma, epsilon) are at
    return model


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> AttentionMethod:
    """The model saved at ``path``, in eval mode, on ``map_location``, with ``.config`` (its
    :class:`~rlattention.engine.config.ExperimentConfig`) and ``.data_info`` attached. No data is read.

    path: a run folder written by ``rlattention fit`` (or a folder inside it): its ``checkpoints/best.ckpt``, the
        model selected on validation that ``fit`` tested, or ``checkpoints/last.ckpt`` when the run has no best
        one; any ``.ckpt`` checkpoint file; or a folder written by :func:`save_pretrained` (``config.yaml`` +
        ``model.safetensors``, or that ``model.safetensors`` itself).

    A checkpoint records the image shape and the class count of its data but not ``DataInfo.meta``: a method
    that needs meta recovers it from the weights (:meth:`AttentionMethod.data_info_from_state`). A darp model
    carries its phase-1 networks in its weights, so the phase-1 artifact need not exist any more (checkpoints
    written before that was recorded still read ``model.phase1``, and name it when it is missing). Errors are one
    line naming the path and what was expected: :class:`FileNotFoundError` for a missing path,
    :class:`~rlattention.engine.checkpoint.CheckpointError` for anything else.
    """
    from rlattention.engine.checkpoint import CheckpointError

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"{p}: not found; expected a run folder, a .ckpt checkpoint or a folder written by save_pretrained"
        )
    if p.is_file() and p.name == WEIGHTS_FILE:
        p = p.parent
    elif p.is_file() and p.suffix == ".safetensors":  # e.g. a darp phase-1 artifact
        raise CheckpointError(
            f"{p}: a .safetensors file other than a saved folder's {WEIGHTS_FILE}; expected a run folder, a .ckpt "
            "checkpoint or a folder written by save_pretrained"
        )
    if p.is_dir():
        if (p / WEIGHTS_FILE).exists():
            model = _load_saved(p)
        else:
            run = find_run_dir(p)
            if run is None:
                raise CheckpointError(
                    f"{p}: neither a run folder (config.yaml and checkpoints/) nor a saved model folder "
                    f"({CONFIG_FILE} and {WEIGHTS_FILE})"
                )
            ckpt = next((c for c in (run / "checkpoints" / n for n in ("best.ckpt", "last.ckpt")) if c.is_file()), None)
            if ckpt is None:
                raise CheckpointError(f"{run}: run folder without checkpoints/best.ckpt or checkpoints/last.ckpt")
            model = _load_checkpoint(ckpt)
    else:
        model = _load_checkpoint(p)
    return model.to(map_location).eval()


def _load_checkpoint(path: Path) -> AttentionMethod:
    from rlattention.engine.averaging import evaluation_weights
    from rlattention.engine.checkpoint import CheckpointError, load_checkpoint_file

    ckpt = load_checkpoint_file(path, map_location="cpu")
    cfg = from_dict(ckpt["config"], source=f"{path} (config)")
    if "data_info" not in ckpt:
        raise CheckpointError(f"{path}: the checkpoint records no data_info (image_shape, num_classes) to build from")
    try:
        info = DataInfo.from_record(ckpt["data_info"], f"{path}: data_info")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    weights = evaluation_weights(ckpt)  # averaged where the run averaged them (trainer.ema_decay)
    info = get_method(cfg.method).data_info_from_state(info, weights)
    return _build(cfg, info, weights, _checkpoint_progress(ckpt, cfg), path)


def _checkpoint_progress(ckpt: dict, cfg: ExperimentConfig) -> float:
    """The fraction of training done when ``ckpt`` was written (its schedules' horizon, else ``max_steps``; a
    checkpoint with neither recorded, from before the horizon was, is taken as trained to the end)."""
    progress = ckpt.get("progress") if isinstance(ckpt.get("progress"), dict) else {}
    step, total = int(progress.get("step", 0)), int(progress.get("total_steps", 0))
    total = total if total > 0 else cfg.trainer.max_steps
    return 1.0 if total <= 0 else min(1.0, step / total)


def _load_saved(folder: Path) -> AttentionMethod:
    from rlattention.engine.checkpoint import CheckpointError

    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: has {WEIGHTS_FILE} but no {CONFIG_FILE}; expected both (save_pretrained)")
    try:
        raw = read_config_file(config_path)
        saved = raw.pop(SAVED_SECTION, None)
        if not isinstance(saved, dict) or saved.get("format") != SAVED_FORMAT:
            raise ValueError(
                f"{config_path}: no '{SAVED_SECTION}' section of format {SAVED_FORMAT!r}: not written by "
                "save_pretrained"
            )
        info = DataInfo.from_record(saved.get("data_info"), f"{config_path}: {SAVED_SECTION}.data_info")
        progress = saved.get("training_progress", 1.0)
        if not isinstance(progress, int | float) or isinstance(progress, bool) or not 0.0 <= progress <= 1.0:
            raise ValueError(f"{config_path}: {SAVED_SECTION}.training_progress must be in [0, 1], got {progress!r}")
        cfg = from_dict(raw, source=str(config_path))
    except ValueError as e:  # ConfigError is one
        raise CheckpointError(str(e)) from None
    data = weights_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if saved.get("weights_sha256") not in (None, digest):
        raise CheckpointError(
            f"{weights_path}: sha256 {digest[:12]}... is not the {str(saved['weights_sha256'])[:12]}... that "
            f"{CONFIG_FILE} records: the folder holds parts of two different saves"
        )
    state = _decode_state(data, weights_path)
    return _build(cfg, info, state, float(progress), weights_path)


def _build(cfg: ExperimentConfig, info: DataInfo, state: dict, progress: float, source: Path) -> AttentionMethod:
    """The method of ``cfg`` rebuilt for the weights ``state`` (all loaded, or a one-line error naming the keys)."""
    from rlattention.engine.checkpoint import CheckpointError, load_model_state

    try:
        model = get_method(cfg.method).from_checkpoint(cfg.model, info, state)
    except (ValueError, OSError, KeyError) as e:  # e.g. an old darp checkpoint whose phase-1 file is gone
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{source}: cannot rebuild its {cfg.method} model: {first}") from None
    load_model_state(model, state, source)
    model.set_progress(progress)
    return _attach(model, cfg, info, progress)


__all__ = [
    "CONFIG_FILE",
    "Prediction",
    "SAVED_FORMAT",
    "WEIGHTS_FILE",
    "create_model",
    "load_model",
    "predict",
    "prepare_images",
    "save_pretrained",
]
