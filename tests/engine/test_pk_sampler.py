"""The P x K identity sampler of BatchLoader (re-id / metric learning)."""

import pytest
import torch

from rlattention.data.base import ArrayDataset
from rlattention.engine.loader import BatchLoader


def _data(counts):
    ids = torch.cat([torch.full((c,), i) for i, c in enumerate(counts)])
    targets = torch.stack([ids * 7 + 3, torch.zeros_like(ids), torch.zeros_like(ids)], 1)  # arbitrary id values
    images = torch.arange(len(ids), dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 2, 2).contiguous()
    return ArrayDataset(images, targets)


def test_every_batch_has_p_identities_of_k_distinct_items():
    ds = _data([5, 9, 4, 6, 12, 3, 8, 4])  # identity 5 has 3 < K images: drawn with replacement
    loader = BatchLoader(ds, 8, seed=1, sampler="pk", instances=4)
    assert len(loader) == len(ds) // 8
    seen = set()
    for _, targets in loader:
        ids = targets[:, 0].view(2, 4)
        assert (ids == ids[:, :1]).all() and ids[0, 0] != ids[1, 0]
    for b in loader._pk_indices():
        for group in b.view(2, 4):
            pid = int(ds.targets[group[0], 0])
            n = int((ds.targets[:, 0] == pid).sum())
            assert (ds.targets[group, 0] == pid).all()
            assert len(set(group.tolist())) == min(4, n)  # without replacement when possible
            seen.update(group.tolist())
    assert len(seen) > len(ds) // 2


def test_epochs_differ_and_replay_exactly():
    ds = _data([6] * 10)
    a = BatchLoader(ds, 12, seed=3, sampler="pk", instances=3)
    b = BatchLoader(ds, 12, seed=3, sampler="pk", instances=3)
    a.set_epoch(2)
    b.set_epoch(2, start_batch=1)
    full = [t for _, t in a]
    resumed = [t for _, t in b]
    assert len(resumed) == len(full) - 1 and all(torch.equal(x, y) for x, y in zip(full[1:], resumed, strict=True))
    a.set_epoch(3)
    assert not torch.equal(next(iter(a))[1], full[0])


def test_ranks_take_disjoint_batches_of_one_sequence():
    ds = _data([4] * 12)
    one = BatchLoader(ds, 8, seed=0, sampler="pk", instances=4)._pk_indices()
    r0 = BatchLoader(ds, 8, seed=0, world_size=2, rank=0, sampler="pk", instances=4)
    r1 = BatchLoader(ds, 8, seed=0, world_size=2, rank=1, sampler="pk", instances=4)
    assert len(r0) == len(r1) == len(one) // 2
    assert torch.equal(r0._pk_indices(), one[0::2][: len(r0)]) and torch.equal(r1._pk_indices(), one[1::2][: len(r1)])


def test_bad_pk_settings_are_clear():
    ds = _data([4] * 3)
    with pytest.raises(ValueError, match="multiple of trainer.pk_instances"):
        BatchLoader(ds, 6, sampler="pk", instances=4)
    with pytest.raises(ValueError, match="only 3 identities"):
        BatchLoader(ds, 16, sampler="pk", instances=4)
    with pytest.raises(ValueError, match="trainer.sampler"):
        BatchLoader(ds, 4, sampler="balanced")
