"""Fixed-seed train / validation splits of one set of ``n`` examples, and the per-split seed of a generator."""

from __future__ import annotations

import zlib

import torch
from torch import Tensor


def train_val_split(n: int, val_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """Split ``range(n)`` into disjoint training and validation indices by a seeded permutation.

    n: number of examples, ``n >= 1``.
    val_size: how many go to validation, ``0 <= val_size < n`` (training is never empty).
    seed: seed of the permutation (a private ``torch.Generator``; the global RNG is untouched).

    Returns ``(train_idx, val_idx)``: int64 tensors of shapes ``(n - val_size,)`` and ``(val_size,)``,
    each sorted ascending; together they cover ``0..n-1`` exactly once. The same arguments always
    give the same split.
    """
    if n < 1:
        raise ValueError(f"cannot split {n} examples: n must be >= 1")
    if not 0 <= val_size < n:
        raise ValueError(f"val_size must be in 0..{n - 1} for n={n} (training must keep >= 1), got {val_size}")
    generator = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(n, generator=generator)
    val_idx = perm[:val_size].sort().values
    train_idx = perm[val_size:].sort().values
    return train_idx, val_idx


def split_seed(seed: int, split: str) -> int:
    """A generator seed for one split, derived deterministically (and differently per split) from ``seed``."""
    return (int(seed) * 1_000_003 + zlib.crc32(split.encode())) % (2**63)
