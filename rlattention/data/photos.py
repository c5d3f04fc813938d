"""Parts shared by the photo dataset readers (VOC, COCO): decoding image files into one in-memory uint8
tensor resized to a fixed square, and the held-out validation split of a labelled training set.

Images are decoded with Pillow in a thread pool (decoding releases the
GIL), converted to RGB and resized to ``size x size`` with Pillow's antialiased bilinear filter (the aspect
ratio is not kept, as in the RARL paper's "resized to N x N"). JPEGs are decoded in Pillow's draft mode,
i.e. already scaled down by 1/2, 1/4 or 1/8 in the DCT when that still leaves at least ``size`` pixels per
side, which makes loading large photos several times faster.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from rlattention.data.splits import train_val_split

__all__ = ["ImageDecodeError", "holdout_split", "load_resized_images", "read_resized_image"]


class ImageDecodeError(ValueError):
    """An image file that cannot be decoded; the message names the file."""


def read_resized_image(path: str | os.PathLike, size: int) -> np.ndarray:
    """One image file as ``(size, size, 3)`` uint8 RGB.

    Raises ``FileNotFoundError`` naming the file if it is missing and :class:`ImageDecodeError` naming it if
    Pillow cannot decode it (not an image, truncated, or a decompression bomb).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as img:
            img.draft("RGB", (size, size))  # JPEG: decode at 1/2, 1/4 or 1/8 scale when still >= size
            rgb = img.convert("RGB")
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ImageDecodeError(f"{path}: cannot decode the image ({type(err).__name__}: {err})") from err
    return np.array(rgb, dtype=np.uint8)  # a writable copy


def load_resized_images(paths: Sequence[str | os.PathLike], size: int, workers: int | None = None) -> Tensor:
    """Decode ``paths`` (in order) into a ``(N, 3, size, size)`` uint8 tensor.

    workers: decoding threads (default ``min(8, os.cpu_count())``). The whole result is held in memory:
    ``N * 3 * size * size`` bytes (about 1.5 GB for 10,000 images at 224).
    """
    if size < 1:
        raise ValueError(f"image size must be >= 1, got {size}")
    out = torch.empty(len(paths), 3, size, size, dtype=torch.uint8)
    if not paths:
        return out
    workers = workers or min(8, os.cpu_count() or 1)

    def decode(item: tuple[int, str | os.PathLike]) -> None:
        i, path = item
        out[i] = torch.from_numpy(read_resized_image(path, size)).permute(2, 0, 1)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(decode, enumerate(paths)):  # re-raises the first error, in order
            pass
    return out


def holdout_split(n: int, val_size: int, seed: int, source: str) -> tuple[Tensor, Tensor]:
    """``(train_idx, val_idx)`` of ``n`` labelled images (``source`` names them in errors).

    ``val_size > 0``: ``val_size`` images, drawn with :func:`train_val_split` (seeded), are held out of
    training: a proper validation split for model selection. ``val_size == 0``: training keeps all ``n``
    images (as the papers do, e.g. VOC07 trains on all of ``trainval``) and the validation split is a seeded
    10 % of them (at least one image), *overlapping* training: it only monitors training and must not be
    used for model selection.
    """
    if n < 1:
        raise ValueError(f"{source}: no images to split")
    if val_size < 0 or val_size >= n:
        raise ValueError(
            f"val_size={val_size} must be in 0..{n - 1}: {source} has {n} images (set data.val_size, e.g. "
            f"{max(1, n // 10)}, or 0 to train on all of them with an overlapping 10% monitoring split)"
        )
    if val_size > 0:
        return train_val_split(n, val_size, seed)
    _, val_idx = train_val_split(n, max(1, round(n / 10)) if n > 1 else 0, seed)
    if n == 1:
        val_idx = torch.zeros(1, dtype=torch.int64)
    return torch.arange(n), val_idx
