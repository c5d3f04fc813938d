"""Batches from an in-memory dataset, shuffled per epoch, sharded across processes.

The whole dataset lives in one uint8 tensor, so a batch is one index operation: no per-sample collate.
The permutation of epoch ``e`` depends only on ``(seed, e)``: resuming at batch ``k`` of an epoch replays
exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from rlattention.data.base import ArrayDataset


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
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(dataset) < world_size:
            raise ValueError(f"dataset of {len(dataset)} items cannot be sharded over {world_size} processes")
        self.dataset, self.batch_size, self.shuffle, self.seed = dataset, batch_size, shuffle, seed
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.device = torch.device(device)
        self.epoch = 0
        self.start_batch = 0
        self.per_rank = len(dataset) // world_size if shuffle or drop_last else -(-len(dataset) // world_size)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, start_batch

    def __len__(self) -> int:
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
        images = images.float().div_(255.0) if images.dtype == torch.uint8 else images.float()
        return images, targets.to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        idx = self._indices()
        for b in range(self.start_batch, len(self)):
            sel = idx[b * self.batch_size : (b + 1) * self.batch_size]
            yield self.to_device(self.dataset.images[sel], self.dataset.targets[sel])
