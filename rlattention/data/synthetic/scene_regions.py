"""Region features of the captioned digit scenes (:mod:`rlattention.data.synthetic.digit_scenes`): a small CNN
(:class:`RegionCNN`) trained once per scenes folder on square crops around the digit boxes and the distractors,
whose pooled features, followed by each box's geometry ``(x0, y0, x1, y1, area)``, are the scene's region
features (:func:`region_features`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.data.synthetic.scene_captions import PALETTE
from rlattention.data.synthetic.scene_drawing import _BACKGROUND
from rlattention.progress import progress_bar
from rlattention.vision.backbones import SmallCNN
from rlattention.vision.crops import crop_boxes

__all__ = [
    "CROP_SIZE",
    "GEOMETRY_DIM",
    "WEIGHTS_NAME",
    "RegionCNN",
    "load_region_cnn",
    "region_features",
]


#: Side of the square crops the region CNN sees.
CROP_SIZE = 32
#: ``(x0, y0, x1, y1, area)`` appended to each region's CNN features.
GEOMETRY_DIM = 5
_CNN_CHANNELS = (16, 32, 64)
_CROP_SCALE, _CROP_PAD = 1.15, 2.0
_CHUNK = 256  # scenes rendered / cropped at a time
#: The region CNN's weights in a scenes folder.
WEIGHTS_NAME = "region_cnn.safetensors"


class RegionCNN(nn.Module):
    """:class:`SmallCNN` over ``3 x 32 x 32`` region crops with two training heads: digit class (10 +
    background) and colour (6 + none). ``forward`` returns the pooled features ``(B, channels[-1])``."""

    def __init__(self, channels: Sequence[int] = _CNN_CHANNELS) -> None:
        super().__init__()
        self.backbone = SmallCNN(3, tuple(int(c) for c in channels))
        self.identity_head = nn.Linear(self.backbone.out_features, 11)
        self.colour_head = nn.Linear(self.backbone.out_features, len(PALETTE) + 1)
        self.out_features = self.backbone.out_features
        self.to(memory_format=torch.channels_last)  # about twice as fast for these small convolutions on a CPU

    def forward(self, crops: Tensor) -> Tensor:
        return self.backbone(crops.contiguous(memory_format=torch.channels_last))


def _crop_views(boxes: np.ndarray, canvas: int) -> Tensor:
    """Pixel boxes ``(..., 4)`` -> the square crop views in the ``[-1, 1]`` coordinates of ``crop_boxes``."""
    b = torch.from_numpy(boxes).double()
    cx, cy = (b[..., 0] + b[..., 2]) / 2, (b[..., 1] + b[..., 3]) / 2
    half = (torch.maximum(b[..., 2] - b[..., 0], b[..., 3] - b[..., 1]) * _CROP_SCALE + _CROP_PAD) / 2
    view = torch.stack([cx - half, cy - half, cx + half, cy + half], dim=-1)
    return (view * (2.0 / canvas) - 1.0).float()


def _crops(scenes: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """uint8 scenes ``(B, 3, H, W)`` and pixel boxes ``(B, R, 4)`` -> uint8 crops ``(B, R, 3, 32, 32)``."""
    images = torch.from_numpy(scenes).float() / 255.0
    crops = crop_boxes(images, _crop_views(boxes, scenes.shape[-1]), (CROP_SIZE, CROP_SIZE), mode="area")
    return (crops * 255.0).round().clamp(0, 255).to(torch.uint8).numpy()


def _geometry(boxes: np.ndarray, canvas: int) -> np.ndarray:
    """Pixel boxes ``(..., 4)`` -> ``(..., 5)`` float32 ``(x0, y0, x1, y1, area)`` normalised by the canvas."""
    b = boxes.astype(np.float64) / canvas
    area = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    return np.concatenate([b, area[..., None]], axis=-1).astype(np.float32)


@torch.no_grad()
def _cnn_features(model: RegionCNN, crops: np.ndarray, batch: int = 256) -> np.ndarray:
    """uint8 crops ``(..., 3, 32, 32)`` -> float32 features ``(..., C)`` (model in eval mode)."""
    flat = torch.from_numpy(crops.reshape(-1, 3, CROP_SIZE, CROP_SIZE))
    outs = [model(flat[i : i + batch].float() / 255.0) for i in range(0, len(flat), batch)]
    out = torch.cat(outs) if outs else torch.zeros(0, model.out_features)
    return out.numpy().astype(np.float32).reshape(*crops.shape[:-3], model.out_features)


def region_features(model: RegionCNN, scenes: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Region features of rendered scenes: float32 ``(N, R, C + 5)``.

    scenes: uint8 ``(N, 3, H, W)`` (``H == W``, e.g. ``{split}_scenes.npy``). boxes: ``(N, R, 4)`` region boxes,
    normalised ``(x0, y0, x1, y1) / H`` as in ``{split}_boxes.npy``. The model is put in eval mode.
    """
    if scenes.ndim != 4 or scenes.shape[1] != 3 or scenes.shape[2] != scenes.shape[3] or scenes.dtype != np.uint8:
        raise ValueError(f"scenes must be uint8 (N, 3, H, H), got {scenes.dtype} {scenes.shape}")
    if boxes.ndim != 3 or boxes.shape[0] != len(scenes) or boxes.shape[2] != 4:
        raise ValueError(f"boxes must be (N={len(scenes)}, R, 4), got shape {boxes.shape}")
    canvas = scenes.shape[-1]
    pixels = np.round(np.asarray(boxes, dtype=np.float64) * canvas).astype(np.int64)
    model.eval()
    parts = []
    for i in range(0, len(scenes), _CHUNK):
        crops = _crops(scenes[i : i + _CHUNK], pixels[i : i + _CHUNK])
        parts.append(np.concatenate([_cnn_features(model, crops), _geometry(pixels[i : i + _CHUNK], canvas)], -1))
    if not parts:
        return np.zeros((0, boxes.shape[1], model.out_features + GEOMETRY_DIM), dtype=np.float32)
    return np.concatenate(parts)


def _train_region_cnn(
    crops: np.ndarray,
    identity: np.ndarray,
    colour: np.ndarray,
    epochs: int,
    seed: int,
    progress: bool,
    batch_size: int = 128,
    lr: float = 3e-3,
) -> tuple[RegionCNN, dict[str, Any]]:
    """Train a :class:`RegionCNN` on uint8 crops ``(M, 3, 32, 32)`` with targets ``(M,)``, 10 % held out.

    Adam with a one-cycle learning-rate schedule (peak ``lr``), the sum of the two cross-entropies. Returns
    the model (eval mode) and the held-out accuracies: digit class on digit crops and on distractor crops
    ("background"), colour on digit crops.
    """
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(len(crops), generator=g)
    n_held = len(crops) // 10
    held, train = perm[:n_held], perm[n_held:]
    x = torch.from_numpy(crops)
    y_id, y_col = torch.from_numpy(identity), torch.from_numpy(colour)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = RegionCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps = max(1, epochs * math.ceil(len(train) / batch_size))
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.2)
    model.train()
    bar = progress_bar(total=steps, desc="region cnn", unit="step", enabled=progress)
    for _ in range(epochs):
        order = train[torch.randperm(len(train), generator=g)]
        for i in range(0, len(order), batch_size):
            b = order[i : i + batch_size]
            bar.update(1)
            if len(b) < 2:
                continue  # BatchNorm needs two samples
            feats = model(x[b].float() / 255.0)
            loss = F.cross_entropy(model.identity_head(feats), y_id[b])
            loss = loss + F.cross_entropy(model.colour_head(feats), y_col[b])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
    bar.close()
    model.eval()
    metrics: dict[str, Any] = {"train_crops": len(train), "heldout_crops": n_held}
    if n_held:
        with torch.no_grad():
            feats = torch.from_numpy(_cnn_features(model, crops[held.numpy()]))
            id_ok = model.identity_head(feats).argmax(1) == y_id[held]
            col_ok = model.colour_head(feats).argmax(1) == y_col[held]
        digit = y_id[held] != _BACKGROUND
        for name, ok, mask in (
            ("identity_accuracy_digits", id_ok, digit),
            ("identity_accuracy_distractors", id_ok, ~digit),
            ("colour_accuracy_digits", col_ok, digit),
        ):
            metrics[name] = round(float(ok[mask].float().mean()), 4) if mask.any() else None
    return model, metrics


def _save_region_cnn(model: RegionCNN, path: Path) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    channels = ",".join(str(int(m.out_channels)) for m in model.backbone.body if isinstance(m, nn.Conv2d))
    save_file(state, str(path), metadata={"format": "rlattention.digit_scenes.region_cnn", "channels": channels})


def load_region_cnn(path: str | os.PathLike) -> RegionCNN:
    """The :class:`RegionCNN` saved by :func:`generate_digit_scenes` (a dataset folder or the
    ``region_cnn.safetensors`` file itself), in eval mode."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_NAME
    if not path.is_file():
        raise FileNotFoundError(f"region CNN weights not found: {path}")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != "rlattention.digit_scenes.region_cnn" or not meta.get("channels"):
        raise ValueError(f"{path}: not a digit-scenes region CNN (metadata {meta}); expected format and channels")
    model = RegionCNN([int(c) for c in meta["channels"].split(",")])
    model.load_state_dict(load_file(str(path)))
    return model.eval()
