"""Containers shared by every dataset reader and generator."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


def check_digit_images(images: Tensor, labels: Tensor, what: str = "images") -> None:
    """The input every digit generator takes: uint8 ``(N, 1, H, W)`` glyphs and ``(N,)`` labels."""
    if images.ndim != 4 or images.shape[1] != 1:
        raise ValueError(f"{what} must be (N, 1, H, W), got shape {tuple(images.shape)}")
    if images.dtype != torch.uint8:
        raise ValueError(f"{what} must be uint8 (0..255), got {images.dtype}")
    if labels.shape != (len(images),):
        raise ValueError(f"labels must be ({len(images)},) to match the {what}, got shape {tuple(labels.shape)}")


@dataclass
class ArrayDataset:
    """An in-memory dataset: images and their targets, indexed together.

    images: ``(N, C, H, W)`` uint8 (0..255) or float tensor.
    targets: ``(N,)`` int64 class ids, or ``(N, ...)`` for structured targets.
    """

    images: torch.Tensor
    targets: torch.Tensor

    def __post_init__(self) -> None:
        if self.images.ndim != 4:
            raise ValueError(f"images must be (N, C, H, W), got shape {tuple(self.images.shape)}")
        if len(self.images) != len(self.targets):
            raise ValueError(
                f"images and targets differ in length: {len(self.images)} images, {len(self.targets)} targets"
            )

    def __len__(self) -> int:
        return len(self.images)

    def subset(self, index: torch.Tensor) -> ArrayDataset:
        return ArrayDataset(self.images[index], self.targets[index])


@dataclass
class DataSplits:
    """Train / validation / test splits of one task, plus what a model needs to know about it."""

    train: ArrayDataset
    val: ArrayDataset
    test: ArrayDataset
    num_classes: int
    name: str = ""
    meta: dict = field(default_factory=dict)  # passed to the model as DataInfo.meta (e.g. a vocabulary size)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train.images.shape[1:])  # type: ignore[return-value]
