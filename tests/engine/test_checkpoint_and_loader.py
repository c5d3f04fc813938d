"""Atomic, weights-only checkpoints; the in-memory loader's sharding and resumption."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from rlattention.data.base import ArrayDataset
from rlattention.engine.checkpoint import CheckpointError, atomic_torch_save, load_checkpoint_file
from rlattention.engine.loader import BatchLoader


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("boom while pickling")


def test_failed_write_keeps_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"model": {"w": torch.ones(2)}, "config": {}}, path)
    with pytest.raises(RuntimeError, match="boom"):
        atomic_torch_save({"model": {"w": torch.zeros(2)}, "config": {}, "bad": Unpicklable()}, path)
    assert torch.equal(load_checkpoint_file(path)["model"]["w"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left behind


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_load_refuses_code_execution(tmp_path):
    """A checkpoint that would run code when unpickled: one line naming the file and the object, and never torch's
    advice to retry with ``weights_only=False`` (which would run it)."""
    path = tmp_path / "evil.ckpt"
    torch.save({"model": {}, "config": {}, "x": Evil()}, path)
    raw = tmp_path / "raw.ckpt"
    raw.write_bytes(pickle.dumps(Evil()))
    for bad in (path, raw):
        with pytest.raises(CheckpointError) as err:
            load_checkpoint_file(bad)
        message = str(err.value)
        assert str(bad) in message and "\n" not in message and "\x1b" not in message
        assert "weights_only=False" not in message and "add_safe_globals" not in message
        assert "could run code" in message
    assert "system" in str(pytest.raises(CheckpointError, load_checkpoint_file, path).value)  # the refused object


def test_truncated_and_missing(tmp_path):
    path = tmp_path / "t.ckpt"
    atomic_torch_save({"model": {"w": torch.randn(100)}, "config": {}}, path)
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match="t.ckpt"):
        load_checkpoint_file(path)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint_file(tmp_path / "nope.ckpt")


def _ds(n=103):
    return ArrayDataset(torch.arange(n, dtype=torch.uint8).reshape(n, 1, 1, 1).repeat(1, 1, 2, 2), torch.arange(n))


def test_shards_are_disjoint_and_epochs_differ():
    ds = _ds()
    seen = []
    for rank in range(2):
        ld = BatchLoader(ds, 10, seed=3, rank=rank, world_size=2)
        ld.set_epoch(0)
        seen.append(torch.cat([t for _, t in ld]))
    assert len(set(seen[0].tolist()) & set(seen[1].tolist())) == 0
    assert len(seen[0]) == len(seen[1]) == 50
    ld = BatchLoader(ds, 10, seed=3)
    ld.set_epoch(1)
    assert not torch.equal(torch.cat([t for _, t in ld]), seen[0])


def test_resume_mid_epoch_replays_the_same_batches():
    ds = _ds()
    ld = BatchLoader(ds, 8, seed=5)
    ld.set_epoch(2)
    full = [t for _, t in ld]
    ld.set_epoch(2, start_batch=4)
    rest = [t for _, t in ld]
    assert all(torch.equal(a, b) for a, b in zip(full[4:], rest, strict=True))


def test_images_are_scaled_to_unit_range():
    ld = BatchLoader(_ds(), 4, shuffle=False)
    images, _ = next(iter(ld))
    assert images.dtype == torch.float32 and images.max() <= 1.0
