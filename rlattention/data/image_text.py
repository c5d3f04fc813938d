"""Image-text matching datasets in the engine's terms: ``precomp`` (real VSE++/SCAN/VSRN region features and
captions, :mod:`rlattention.data.precomp`) and ``digit_scenes`` (the generated captioned digit scenes of
:mod:`rlattention.data.digit_scenes`, written as a precomp folder and read back through the same path).

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

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.registry import register_dataset


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


def load_precomp_splits(folder: Path, cfg: Any, name: str) -> DataSplits:
    from rlattention.data.precomp import read_precomp_split
    from rlattention.data.text import Vocabulary

    test_split = str(getattr(cfg, "test_split", "test") or "test")
    parts = {split: read_precomp_split(folder, split) for split in ("train", "dev", test_split)}
    vocab = Vocabulary.build(parts["train"].captions)  # training captions only
    max_len = int(getattr(cfg, "max_caption_len", 0) or 0)
    limits = {"train": int(getattr(cfg, "num_train", 0) or 0), "dev": int(getattr(cfg, "num_test", 0) or 0)}
    limits[test_split] = limits["dev"]
    out = {}
    for split, part in parts.items():
        feats, caps, c2i = part.features, list(part.captions), np.asarray(part.caption_to_image)
        if limits[split] > 0:  # the first images only (smoke runs), with all their captions
            keep = c2i < limits[split]
            feats, caps, c2i = feats[: limits[split]], [c for c, k in zip(caps, keep, strict=True) if k], c2i[keep]
        out[split] = _split_items(np.asarray(feats), caps, c2i, vocab, max_len)
    num_train = int(out["train"].targets[:, 0].max()) + 1
    meta = {"vocab_size": len(vocab), "vocab": vocab.words[4:]}
    return DataSplits(out["train"], out["dev"], out[test_split], num_train, name=name, meta=meta)


@register_dataset("precomp")
def build_precomp(cfg: Any, data_dir: Path | None) -> DataSplits:
    if data_dir is None:
        raise ValueError(
            "precomp needs a folder with {train,dev,test}_ims.npy and _caps.txt: pass --data-dir or set "
            "RLATTENTION_DATA (e.g. a VSE++/SCAN data/f30k_precomp folder)"
        )
    return load_precomp_splits(Path(data_dir), cfg, "precomp")


@register_dataset("digit_scenes")
def build_digit_scenes(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Generate (once, cached) captioned digit scenes from real MNIST digits in ``data_dir`` and read them
    through the precomp path."""
    from rlattention.data.digit_scenes import generate_digit_scenes
    from rlattention.data.strokes import resolve_cache_dir

    if data_dir is None:
        raise ValueError("digit_scenes needs the MNIST idx files: pass --data-dir or set RLATTENTION_DATA")
    cache = resolve_cache_dir(getattr(cfg, "render_cache", None))
    if cache is None:
        raise ValueError("digit_scenes writes a precomp folder: data.render_cache must not disable the cache")
    n_train = int(getattr(cfg, "num_train", 0) or 0) or 10000
    n_test = int(getattr(cfg, "num_test", 0) or 0) or 1000
    seed = int(getattr(cfg, "seed", 0))
    folder = Path(cache) / f"digit_scenes_s{seed}_{n_train}_{n_test}"
    generate_digit_scenes(
        folder, data_dir, num_train=n_train, num_dev=n_test, num_test=n_test, seed=seed, progress=True
    )  # announced first (what, where, about how many bytes); over $RLATTENTION_CACHE_LIMIT: refused
    sub = type("Cfg", (), {"test_split": "test", "max_caption_len": getattr(cfg, "max_caption_len", 0)})()
    return load_precomp_splits(folder, sub, "digit_scenes")
