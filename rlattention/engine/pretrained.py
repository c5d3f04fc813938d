"""Saving a model as a folder of its own, ``config.yaml`` + ``model.safetensors`` (:func:`save_pretrained`), and
decoding such a folder's weights; :func:`rlattention.load_model` reads it back. Below the methods, so that
:meth:`AttentionMethod.save_pretrained <rlattention.engine.method.AttentionMethod.save_pretrained>` needs nothing
above the engine."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from torch import Tensor

from rlattention.engine.checkpoint import fsync_folder
from rlattention.engine.config import ExperimentConfig, to_dict
from rlattention.engine.datainfo import DataInfo

if TYPE_CHECKING:
    from rlattention.engine.method import AttentionMethod

SAVED_FORMAT = "rlattention.saved_model/1"
CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "model.safetensors"
#: the top-level section of a saved folder's config.yaml that is not an experiment setting (see save_pretrained)
SAVED_SECTION = "saved_model"
_TENSOR_REF = "__rlattention_tensor__"  # marks a tensor inside an encoded ``_extra_state`` value
_EXTRA_PREFIX = "__extra_state__/"  # names of those tensors in model.safetensors


def _check_model(model: Any) -> None:
    """An rlattention model: a module with the interface of :class:`~rlattention.engine.method.AttentionMethod`
    (checked by its methods, so that this module need not import the class that calls it)."""
    if not (isinstance(model, torch.nn.Module) and callable(getattr(model, "predict_with_attention", None))):
        raise TypeError(f"expected an rlattention model (an AttentionMethod), got {type(model).__name__}")


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
