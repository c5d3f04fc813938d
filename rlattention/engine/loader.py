"""Batches from an in-memory dataset, shuffled per epoch, sharded across processes.

The whole dataset lives in one uint8 tensor, so a batch is one index operation: no per-sample collate.
The permutation of epoch ``e`` depends only on ``(seed, e)``: resuming at batch ``k`` of an epoch replays
exactly the batches an uninterrupted run would have seen.

``sampler="pk"`` (metric learning, person re-identification): every batch holds ``P = batch_size // K``
distinct identities with ``K`` images each (drawn without replacement when the identity has at least ``K``
images, with replacement otherwise). The identity of an item is ``targets[:, 0]`` (or ``targets`` when 1-D).
An epoch has ``len(dataset) // batch_size`` such batches; the batches of epoch ``e`` depend only on
``(seed, e)``, so resuming replays them too, and with several processes rank ``r`` takes batches
``r, r + world_size, ...`` of the same sequence.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from rlattention.data.base import ArrayDataset


def unit_float(images: Tensor) -> Tensor:
    """Images as the engine feeds them to a model: uint8 (0-255) divided by 255, other dtypes as float32 (a new
    tensor for uint8, the same values otherwise). Every evaluation outside the loader converts through this."""
    return images.float().div_(255.0) if images.dtype == torch.uint8 else images.float()


class BatchLoader:
    def __init__(
        self,
        dataset: ArrayDataset,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
        device: torch.device | str = "cpu",
        sampler: str = "random",
        instances: int = 4,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(dataset) < world_size:
            raise ValueError(f"dataset of {len(dataset)} items cannot be sharded over {world_size} processes")
        if sampler not in ("random", "pk"):
            raise ValueError(f"trainer.sampler must be 'random' or 'pk', got {sampler!r}")
        self.dataset, self.batch_size, self.shuffle, self.seed = dataset, batch_size, shuffle, seed
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.device = torch.device(device)
        self.epoch = 0
        self.start_batch = 0
        self.per_rank = len(dataset) // world_size if shuffle or drop_last else -(-len(dataset) // world_size)
        self.sampler = sampler
        if sampler == "pk":
            self._init_pk(instances)

    def _init_pk(self, instances: int) -> None:
        if instances < 1 or self.batch_size % instances:
            raise ValueError(
                f"trainer.batch_size={self.batch_size} must be a multiple of trainer.pk_instances={instances} (>= 1)"
            )
        t = self.dataset.targets
        ids = t[:, 0] if t.ndim == 2 else t
        if ids.ndim != 1 or ids.dtype.is_floating_point:
            raise ValueError(
                f"the pk sampler needs integer identities in targets[:, 0], got {tuple(t.shape)} {t.dtype}"
            )
        uniq, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        self.pk_p, self.pk_k = self.batch_size // instances, instances
        if self.pk_p > len(uniq):
            raise ValueError(
                f"trainer.batch_size={self.batch_size} asks for {self.pk_p} identities of {instances} images per "
                f"batch, but the training split has only {len(uniq)} identities"
            )
        order = torch.argsort(inverse, stable=True)  # items grouped by identity
        self.pk_counts = counts
        self.pk_table = torch.full((len(uniq), int(counts.max())), -1, dtype=torch.long)  # identity -> its items
        col = torch.arange(len(ids)) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        self.pk_table[inverse[order], col] = order
        self.pk_batches = len(ids) // self.batch_size  # batches per epoch, all ranks together

    def _pk_indices(self) -> Tensor:
        """``(batches of this rank, P * K)`` item indices of the current epoch."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        n_ids, width = self.pk_table.shape
        mine = range(self.rank, self.pk_batches - self.pk_batches % self.world_size, self.world_size)
        out = torch.empty(self.pk_batches, self.pk_p * self.pk_k, dtype=torch.long)
        col = torch.arange(self.pk_k)
        for b in range(self.pk_batches):  # every rank draws every batch, so the streams stay aligned
            who = torch.randperm(n_ids, generator=g)[: self.pk_p]
            n = self.pk_counts[who]
            keys = torch.rand(self.pk_p, width, generator=g)
            keys[torch.arange(width) >= n[:, None]] = 2.0  # padding sorts last
            pick = torch.argsort(keys, dim=1)[:, : self.pk_k]
            pick = torch.where(col < n[:, None], pick, pick.gather(1, col.remainder(n[:, None])))
            out[b] = self.pk_table[who[:, None], pick].reshape(-1)
        return out[list(mine)]

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, start_batch

    def __len__(self) -> int:
        if self.sampler == "pk":
            return self.pk_batches // self.world_size
        n = self.per_rank
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _indices(self) -> Tensor:
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        return order[self.rank :: self.world_size][: self.per_rank]

    def to_device(self, images: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        images = images.to(self.device, non_blocking=True)
        return unit_float(images), targets.to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        if self.sampler == "pk":
            batches = self._pk_indices()
            for b in range(self.start_batch, len(batches)):
                yield self.to_device(self.dataset.images[batches[b]], self.dataset.targets[batches[b]])
            return
        idx = self._indices()
        for b in range(self.start_batch, len(self)):
            sel = idx[b * self.batch_size : (b + 1) * self.batch_size]
            yield self.to_device(self.dataset.images[sel], self.dataset.targets[sel])
