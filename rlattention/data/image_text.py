"""Image-text matching data in the engine's terms: the layout every image-text dataset returns (``precomp``,
:mod:`rlattention.data.readers.precomp`; ``image_captions``, :mod:`rlattention.data.readers.image_captions`;
``digit_scenes``, :mod:`rlattention.data.synthetic.digit_scenes`, written as a precomp folder and read back through
the same path).

Layout of every split (the contract with ``method: dcpg``): one item per caption.

* ``images``: ``(C, 1, R, F)`` float32, the region features of the caption's image. They are *gathered* on
  access (:class:`GatheredImages`) from the ``(N, 1, R, F)`` features of the split's N images, so the 5 captions
  of an image do not copy its features.
* ``targets``: int64 ``(C, 1 + L)``: column 0 is the image's index within the split (0..N-1; for training it
  is also the instance-loss class), columns 1.. the caption's token ids ``<start> ... <end>`` padded with 0.
* ``num_classes``: the number of training images (instance loss). ``meta``: ``vocab_size`` and ``vocab``
  (the ordinary words in id order) of the vocabulary built from the *training* captions only.

Splits: ``train`` -> train, ``dev`` -> val, ``test`` -> test (``data.test_split: testall`` for COCO 5K).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlattention.data.base import ArrayDataset


class GatheredImages:
    """A read-only ``(C, *item)`` view ``source[index[c]]`` of an ``(N, *item)`` tensor: indexing with an int64
    tensor, a slice or an int returns real tensors; nothing is copied until then."""

    def __init__(self, source: Tensor, index: Tensor) -> None:
        if index.ndim != 1 or index.dtype != torch.int64:
            raise ValueError(f"index must be int64 (C,), got {index.dtype} {tuple(index.shape)}")
        if len(index) and (int(index.min()) < 0 or int(index.max()) >= len(source)):
            raise ValueError(f"index must be in 0..{len(source) - 1}, got {int(index.min())}..{int(index.max())}")
        self.source, self.index = source, index

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.index), *self.source.shape[1:]))

    @property
    def ndim(self) -> int:
        return self.source.ndim

    @property
    def dtype(self) -> torch.dtype:
        return self.source.dtype

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, sel: Any) -> Tensor:
        return self.source[self.index[sel]]


def _split_items(features: np.ndarray, captions: list[str], caption_to_image: np.ndarray, vocab, max_len: int):
    from rlattention.data.text import encode_batch

    feats = torch.from_numpy(np.array(features, dtype=np.float32, copy=True))  # in RAM, writable
    if feats.ndim == 2:
        feats = feats[:, None]
    tokens, _ = encode_batch(captions, vocab, max_len=max_len or None)
    ids = torch.from_numpy(np.asarray(caption_to_image, dtype=np.int64))
    targets = torch.cat((ids[:, None], tokens), 1)
    return ArrayDataset(GatheredImages(feats[:, None], ids), targets)  # type: ignore[arg-type]
