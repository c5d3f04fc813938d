"""Checkpoint I/O: written atomically, read without executing pickled code.

:class:`AtomicCheckpointIO` is a Lightning ``CheckpointIO`` plugin, so ``fabric.save``/``fabric.load`` use it:
the checkpoint is written to a temporary file in the same folder, flushed to disk, and renamed over the
target (``os.replace`` is atomic on POSIX), so a crash mid-write never replaces a good checkpoint; the temporary
file a killed process left behind (``.<name>.tmp-<pid>``, never read as a checkpoint) is removed by the next
successful write of that checkpoint. Loading
uses ``torch.load(weights_only=True)``: only tensors and plain Python containers are accepted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, truncated, or holds something other than weights and plain data."""


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    path = Path(path)
    for check in (True, False):  # before and after creating the folder
        if os.path.islink(path.parent):  # e.g. a run's checkpoints/ replaced by a link: never written through
            raise CheckpointError(f"{path.parent} is a symbolic link; a checkpoint is never written through a link")
        if check:
            path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.raw.name = str(tmp)  # as open(tmp) names it
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_folder(path.parent)  # make the rename itself durable
    _remove_stale_temp_files(path)
    return path


def fsync_folder(folder: str | os.PathLike) -> None:
    """Flush ``folder``'s entries to disk, so that a file renamed into it survives a power loss (best effort: a
    file system that cannot fsync a folder is left as it is)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _remove_stale_temp_files(path: Path) -> None:
    """Remove ``.<name>.tmp-<pid>`` files of ``path`` left by processes that died mid-write (SIGKILL, power loss).
    Only files whose writer is no longer running on this machine go; a live pid (or one we may not signal) keeps
    its file, so a concurrent writer is never disturbed."""
    prefix = f".{path.name}.tmp-"
    for tmp in path.parent.glob(f"{prefix}*"):
        suffix = tmp.name[len(prefix) :]
        if not suffix.isdigit() or int(suffix) == os.getpid():
            continue
        try:
            os.kill(int(suffix), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except (OSError, OverflowError):  # e.g. PermissionError: a live process of another user
            continue
        try:
            tmp.unlink()
        except OSError:
            pass


def load_checkpoint_file(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated zip, foreign pickle, wrong format...: never retried without weights_only
        from rlattention.vision.backbones import load_error_reason

        raise CheckpointError(
            f"{path}: not a loadable rlattention checkpoint (read with weights_only=True): {load_error_reason(e)}"
        ) from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise CheckpointError(f"{path}: expected a dict with 'model' and 'config' entries")
    return ckpt


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint plugin: atomic writes, weights-only reads."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options: Any | None = None) -> None:
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict:
        return load_checkpoint_file(path, map_location="cpu" if map_location is None else map_location)


RESUMABLE = ("model", "optimizer", "scheduler", "progress")  # what a resumed run restores from a checkpoint


def _names(keys: list[str], count: int = 3) -> str:
    shown = ", ".join(keys[:count])
    return f"{shown}, ... ({len(keys)} in all)" if len(keys) > count else shown


def load_model_state(model: torch.nn.Module, state: dict, source: Any) -> None:
    """Load the weights ``state`` into ``model``, all of them or none: a one-line :class:`CheckpointError` naming
    the missing, unexpected and shape-mismatched keys (the first few of each, with counts) when they do not fit,
    or the tensors holding NaN or infinite values (checked first: the model is then left as it was).
    The model's own load hooks apply (e.g. an optional ``_extra_state`` is not reported missing)."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{source}: the checkpoint's 'model' entry is not a state dict")
    bad = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
           and not bool(torch.isfinite(v).all())]  # fmt: skip
    if bad:  # weights a diverged run left: every output of the model would be NaN
        raise CheckpointError(
            f"{source}: {len(bad)} weight tensor(s) hold NaN or infinite values ({_names(bad)}); "
            "these weights come from a run that diverged and can be neither evaluated nor continued"
        )
    expected = model.state_dict()
    shapes = [
        f"{k} (checkpoint {list(v.shape)}, model {list(expected[k].shape)})"
        for k, v in state.items()
        if k in expected
        and isinstance(v, torch.Tensor)
        and isinstance(expected[k], torch.Tensor)
        and v.shape != expected[k].shape
    ]
    if shapes:  # a load would raise on the first one: report the key sets without loading
        missing = [k for k in expected if k not in state and not k.endswith("_extra_state")]
        unexpected = [k for k in state if k not in expected]
    else:
        try:
            result = model.load_state_dict(state, strict=False)
        except (RuntimeError, ValueError, TypeError, KeyError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"{source}: the checkpoint's weights do not fit the model: {first}") from None
        missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing ({_names(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected ({_names(unexpected)})")
        if shapes:
            parts.append(f"{len(shapes)} of another shape ({_names(shapes, 2)})")
        raise CheckpointError(
            f"{source}: the checkpoint's weights do not fit the model of its config: {'; '.join(parts)}"
        )


def check_resumable(ckpt: dict, source: Any) -> None:
    """A :class:`CheckpointError` naming the entries a resume needs that ``ckpt`` lacks (a weights-only file)."""
    lacking = [k for k in RESUMABLE if k not in ckpt]
    if lacking:
        raise CheckpointError(
            f"{source}: cannot resume from it: no {', '.join(repr(k) for k in lacking)} entr"
            f"{'y' if len(lacking) == 1 else 'ies'} (it can be evaluated, not continued)"
        )
