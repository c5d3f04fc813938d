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
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import Tensor

from rlattention.engine.checkpoint import fsync_folder
from rlattention.engine.config import EvalConfig, ExperimentConfig, build_config, from_dict, read_config_file, to_dict
from rlattention.engine.method import AttentionMethod, DataInfo
from rlattention.engine.registry import get_method
from rlattention.engine.rundir import find_run_dir

SAVED_FORMAT = "rlattention.saved_model/1"
CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "model.safetensors"
#: the top-level section of a saved folder's config.yaml that is not an experiment setting (see save_pretrained)
SAVED_SECTION = "saved_model"
_TENSOR_REF = "__rlattention_tensor__"  # marks a tensor inside an encoded ``_extra_state`` value
_EXTRA_PREFIX = "__extra_state__/"  # names of those tensors in model.safetensors


@dataclass(frozen=True)
class Prediction:
    """What :func:`predict` returns for N images (tensors on the model's device).

    scores: the model's :meth:`~rlattention.engine.method.AttentionMethod.predict` output with mean actions:
        class probabilities ``(N, K)`` (ram, cnn, unified; ``(N, J, K)`` for unified's sequences), label
        probabilities ``(N, K)`` (rarl), embeddings ``(N, D)`` (scal), or sketch embeddings after each completion
        step followed by the photo embedding ``(N, S * D + D)`` (darp, darp_triplet, darp_policy).
    labels: ``scores.argmax(-1)`` for classifiers; ``(N, K)`` bool for rarl (a label is predicted when it is among
        the top 3 with probability >= 0.1, the rule of the multi-label metrics); None for the retrieval models,
        whose scores are embeddings to compare.
    attention: what the model attended to in the pass that gave ``scores`` (keys per method, see docs/api.md):
        coordinates are (x, y) in [-1, 1], (-1, -1) the top-left corner of the image, boxes (x0, y0, x1, y1).
    """

    scores: Tensor
    labels: Tensor | None
    attention: dict[str, Tensor]


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
    from rlattention.engine.checkpoint import CheckpointError, load_checkpoint_file

    ckpt = load_checkpoint_file(path, map_location="cpu")
    cfg = from_dict(ckpt["config"], source=f"{path} (config)")
    if "data_info" not in ckpt:
        raise CheckpointError(f"{path}: the checkpoint records no data_info (image_shape, num_classes) to build from")
    try:
        info = DataInfo.from_record(ckpt["data_info"], f"{path}: data_info")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    info = get_method(cfg.method).data_info_from_state(info, ckpt["model"])
    return _build(cfg, info, ckpt["model"], _checkpoint_progress(ckpt, cfg), path)


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


# -------------------------------------------------------------------------------------------------- saving


def save_pretrained(model: AttentionMethod, folder: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write ``model`` to ``folder``: ``model.safetensors`` (every tensor of its state dict, contiguous, on the CPU)
    and ``config.yaml`` (its whole experiment config, plus a ``saved_model`` section: the format, the
    ``DataInfo`` the model is built with, its training progress and the sha256 of ``model.safetensors``).
    :func:`load_model` reads the folder back into a model whose :func:`predict` outputs are bit-identical. Returns
    ``folder``.

    The model must carry ``.config`` and ``.data_info`` (models from :func:`load_model` and :func:`create_model`
    do). Tensors that share memory (one module reachable under two names) are stored once and their other names
    recorded; non-tensor state (``_extra_state``, e.g. darp's phase-1 record) is stored as JSON in the file's
    metadata, any tensors inside it as tensors of their own.

    Safety: a folder that exists and is not empty is refused unless ``overwrite`` (which replaces the two files
    and leaves any other file alone); a run folder (holding ``checkpoints/``) is always refused, as is a folder or
    file that is a symbolic link. Each file is written to a temporary file in the folder, flushed and renamed
    over its name (atomic), ``config.yaml`` last; a save cut short between the two renames leaves a digest that
    does not match, which :func:`load_model` reports.
    """
    import safetensors.torch

    _check_model(model)
    cfg, info = getattr(model, "config", None), getattr(model, "data_info", None)
    if not isinstance(cfg, ExperimentConfig) or not isinstance(info, DataInfo):
        raise ValueError(
            "save_pretrained needs the model's experiment config and DataInfo (.config and .data_info): load it with "
            "rlattention.load_model or build it with rlattention.create_model"
        )
    folder = Path(folder)
    if folder.is_symlink():
        raise OSError(f"{folder} is a symbolic link; save_pretrained never writes through a link")
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder}: exists and is not a folder")
    if (folder / "checkpoints").exists():
        raise FileExistsError(f"{folder}: a run folder (checkpoints/); save_pretrained writes a folder of its own")
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{folder}: not empty; pass overwrite=True to replace its {CONFIG_FILE} and {WEIGHTS_FILE}"
        )
    tensors, metadata = _encode_state(model.state_dict())
    metadata.update(format=SAVED_FORMAT, method=cfg.method)
    data = safetensors.torch.save(tensors, metadata=metadata)
    record = {
        **to_dict(cfg),
        SAVED_SECTION: {
            "format": SAVED_FORMAT,
            "data_info": info.record(),
            "training_progress": float(getattr(model, "training_progress", 1.0)),
            "weights_sha256": hashlib.sha256(data).hexdigest(),
        },
    }
    text = yaml.safe_dump(record, sort_keys=False)
    folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink():  # replaced by a link after the check above
        raise OSError(f"{folder} is a symbolic link; save_pretrained never writes through a link")
    _write_atomic(folder / WEIGHTS_FILE, data)
    _write_atomic(folder / CONFIG_FILE, text.encode("utf-8"))
    return folder


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` to a temporary file beside ``path`` (never following a link), flushed, then renamed over it."""
    if path.is_symlink():
        raise OSError(f"{path} is a symbolic link; save_pretrained never writes through a link")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():  # left by an earlier process of this pid
        tmp.unlink()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
    fsync_folder(path.parent)  # make the rename durable


def _encode_state(state: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """A state dict -> (tensors for safetensors, metadata): copies of the tensors, contiguous and on the CPU,
    those that are views of one another under several names stored once (``aliases``), and the non-tensor
    entries (``_extra_state``) as JSON (``extra_state``) with their tensors stored as ``__extra_state__/<n>``."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    extra: dict[str, Any] = {}
    seen: dict[tuple, str] = {}

    def keep(v: Tensor) -> Tensor:
        return v.detach().to("cpu", copy=True).contiguous()

    def encode(v: Any, key: str) -> Any:
        if isinstance(v, Tensor):
            name = f"{_EXTRA_PREFIX}{len([k for k in tensors if k.startswith(_EXTRA_PREFIX)])}"
            tensors[name] = keep(v)
            return {_TENSOR_REF: name}
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {k: encode(x, key) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [encode(x, key) for x in v]
        if v is None or isinstance(v, bool | int | float | str):
            return v
        raise ValueError(f"{key}: a {type(v).__name__} in the model's state cannot be saved (tensors and plain data)")

    for k, v in state.items():
        if not isinstance(v, Tensor):
            extra[k] = encode(v, k)
            continue
        ident = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.stride(), v.dtype, v.device)
        if v.numel() > 0 and ident in seen:
            aliases[k] = seen[ident]
            continue
        seen[ident] = k
        tensors[k] = keep(v)
    return tensors, {"aliases": json.dumps(aliases), "extra_state": json.dumps(extra)}


def _decode_state(data: bytes, source: Path) -> dict[str, Any]:
    """The state dict that :func:`_encode_state` wrote into the safetensors bytes ``data``."""
    import safetensors.torch

    from rlattention.engine.checkpoint import CheckpointError

    try:
        tensors = safetensors.torch.load(data)
        (n,) = struct.unpack("<Q", data[:8])  # the safetensors header: its length, then JSON with __metadata__
        meta = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
        aliases, extra = json.loads(meta.get("aliases", "{}")), json.loads(meta.get("extra_state", "{}"))
    except Exception as e:  # truncated, foreign or damaged file
        raise CheckpointError(f"{source}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    if meta.get("format") != SAVED_FORMAT:
        raise CheckpointError(f"{source}: format {meta.get('format')!r}, expected {SAVED_FORMAT!r} (save_pretrained)")

    def decode(v: Any) -> Any:
        if isinstance(v, dict):
            if set(v) == {_TENSOR_REF}:
                return tensors[v[_TENSOR_REF]]
            return {k: decode(x) for k, x in v.items()}
        if isinstance(v, list):
            return [decode(x) for x in v]
        return v

    state: dict[str, Any] = {k: v for k, v in tensors.items() if not k.startswith(_EXTRA_PREFIX)}
    try:
        state.update({alias: state[name] for alias, name in aliases.items()})
        state.update({k: decode(v) for k, v in extra.items()})
    except KeyError as e:
        raise CheckpointError(f"{source}: its metadata names a tensor the file does not hold: {e}") from None
    return state


# ----------------------------------------------------------------------------------------------- predicting


def _check_model(model: Any) -> None:
    if not isinstance(model, AttentionMethod):
        raise TypeError(f"expected an rlattention model (an AttentionMethod), got {type(model).__name__}")


def _device(model: AttentionMethod) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def prepare_images(model: AttentionMethod, images: Any) -> Tensor:
    """``images`` as the float ``(N, C, H, W)`` batch in [0, 1] that ``model`` takes (on its device), checked
    against the image shape ``(C, H, W)`` it was trained on (``model.data_info``).

    Accepted: uint8 arrays or tensors (numpy, torch, or anything ``np.asarray`` reads, e.g. a PIL image),
    channels-last as images are stored: ``(H, W)``, ``(H, W, C)``, ``(N, H, W)`` (one channel) or
    ``(N, H, W, C)``, and the engine's own ``(N, C, H, W)`` uint8 batches; divided by 255. Floating-point tensors
    or arrays in [0, 1], channels-first: ``(C, H, W)`` or ``(N, C, H, W)``. A 3-D uint8 array is ``(H, W, C)``
    when its last side is C (or 1, 3, 4), else ``(N, H, W)``.

    One-line :class:`ValueError` for another dtype, floats outside [0, 1] or NaN, another rank, another channel
    count, another height and width (nothing is resized: resize the images to the training size first), or no
    images.
    """
    _check_model(model)
    info = getattr(model, "data_info", None)
    if not isinstance(info, DataInfo):
        raise ValueError(
            "the model carries no data_info (the image shape it was trained on): load it with rlattention.load_model "
            "or build it with rlattention.create_model"
        )
    C, H, W = info.image_shape
    if not isinstance(images, Tensor | np.ndarray):
        try:
            images = np.asarray(images)
        except Exception as e:
            raise ValueError(f"images: cannot read a {type(images).__name__} as an array ({e})") from None
    if isinstance(images, np.ndarray):
        if images.dtype != np.uint8 and not np.issubdtype(images.dtype, np.floating):
            raise ValueError(f"images: dtype {images.dtype}; expected uint8 (0-255) or floating point in [0, 1]")
        images = torch.from_numpy(np.ascontiguousarray(images))
    x = images.detach()
    if x.dtype == torch.uint8:
        x, layout = _uint8_layout(x, C)
        x = x.float().div(255.0)  # as the engine converts its uint8 data
    elif x.is_floating_point():
        if x.ndim not in (3, 4):
            raise ValueError(
                f"images: a float array of shape {tuple(x.shape)}; expected (C, H, W) or (N, C, H, W) "
                "(float images are channels-first; uint8 ones may be (H, W[, C]))"
            )
        layout = "(C, H, W)" if x.ndim == 3 else "(N, C, H, W)"
        x = (x[None] if x.ndim == 3 else x).float()
        if bool(torch.isnan(x).any()):
            raise ValueError(f"images: {int(torch.isnan(x).sum())} NaN value(s); expected floats in [0, 1]")
        lo, hi = float(x.min()) if x.numel() else 0.0, float(x.max()) if x.numel() else 0.0
        if lo < 0.0 or hi > 1.0:
            raise ValueError(
                f"images: float values in [{lo:g}, {hi:g}]; expected [0, 1] (divide 0-255 images by 255, or pass "
                "them as uint8)"
            )
    else:
        raise ValueError(f"images: dtype {x.dtype}; expected uint8 (0-255) or floating point in [0, 1]")
    if x.shape[0] == 0:
        raise ValueError(f"images: an empty batch of shape {tuple(images.shape)}")
    if x.shape[1] != C:
        raise ValueError(
            f"images: {x.shape[1]} channel(s) (shape {tuple(images.shape)} read as {layout}); the {model.name} model "
            f"takes {C} channel(s) ({C} x {H} x {W} images)"
        )
    if tuple(x.shape[-2:]) != (H, W):
        raise ValueError(
            f"images: {x.shape[-2]} x {x.shape[-1]} pixels (H x W); the {model.name} model takes {H} x {W}, the size "
            "it was trained on: resize them first (nothing is resized silently)"
        )
    return x.to(_device(model)).contiguous()


def _uint8_layout(x: Tensor, C: int) -> tuple[Tensor, str]:
    """A uint8 ``(H, W)``, ``(H, W, C)``, ``(N, H, W)``, ``(N, H, W, C)`` or ``(N, C, H, W)`` array -> ``(N, C, H, W)``
    and the layout it was read as."""
    small = (1, 3, 4)  # channel counts of ordinary images
    s = tuple(x.shape)
    if x.ndim == 2:
        return x[None, None], "(H, W)"
    if x.ndim == 3:
        if s[-1] == C or s[-1] in small:
            return x.permute(2, 0, 1)[None], "(H, W, C)"
        return x[:, None], "(N, H, W)"
    if x.ndim == 4:
        if s[-1] == C or (s[1] != C and s[1] not in small):
            return x.permute(0, 3, 1, 2), "(N, H, W, C)"
        return x, "(N, C, H, W)"
    raise ValueError(
        f"images: a uint8 array of shape {s}; expected (H, W), (H, W, C), (N, H, W) or (N, H, W, C) "
        "(float images: (C, H, W) or (N, C, H, W))"
    )


def predict(model: AttentionMethod, images: Any, seed: int | None = None) -> Prediction:
    """Predict ``images`` (see :func:`prepare_images` for what is accepted) with mean actions, in eval mode (the
    model's mode is restored afterwards): the scores the engine evaluates and the attention of the same pass.

    seed: of the generator the model draws from (e.g. RAM's random first glimpse); default the config's
        ``eval.seed``, so that repeated calls, and a reloaded model, give identical outputs.

    Also ``model.predict_images(images)``. (``model.predict(x)`` stays the engine's call on ready float batches.)
    dcpg is not covered: its items are region features matched with captions, not images.
    """
    _check_model(model)
    if model.task == "image_text":
        raise ValueError(
            f"predict takes images; the {model.name} model matches region features with captions: call "
            "model.predict_batch(features, targets) for embeddings and model.attention(features, targets) for the "
            "region and word attention"
        )
    x = prepare_images(model, images)
    cfg = getattr(model, "config", None)
    if seed is None:
        seed = cfg.eval.seed if isinstance(cfg, ExperimentConfig) else EvalConfig().seed
    generator = torch.Generator(device=x.device).manual_seed(int(seed))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            scores, attention = model.predict_with_attention(x, generator)
    finally:
        model.train(was_training)
    return Prediction(scores, _labels(model, scores), dict(attention))


def _labels(model: AttentionMethod, scores: Tensor) -> Tensor | None:
    if model.task == "classification":
        return scores.argmax(-1)
    if model.task == "multilabel":
        from rlattention.metrics.multilabel import predicted_labels

        return predicted_labels(scores).to(scores.device)
    return None


__all__ = [
    "Prediction",
    "create_model",
    "load_model",
    "predict",
    "prepare_images",
    "save_pretrained",
    "SAVED_FORMAT",
]
