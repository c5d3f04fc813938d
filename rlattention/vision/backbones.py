"""Convolutional backbones in plain torch (no torchvision)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor, nn


def load_matching_weights(module: nn.Module, path: str | os.PathLike, what: str) -> None:
    """Load every tensor of ``module.state_dict()`` from ``path`` (``.safetensors``, or a torch file read with
    ``weights_only=True``: no pickled code runs). Extra keys in the file (a classifier head...) are ignored; a
    missing or mis-shaped tensor is an error naming the file and the key. ``what`` names the network in errors."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} weights not found: {p}")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(p))
    else:
        try:
            state = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # not a torch file, or one that needs pickled code
            raise ValueError(f"{p}: not a weights-only torch file ({type(e).__name__}: {e})") from e
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        if not isinstance(state, dict):
            raise ValueError(f"{p}: expected a dict of tensors, got {type(state).__name__}")
    wanted = module.state_dict()
    picked = {k: v for k, v in state.items() if k in wanted}
    missing = sorted(k for k in set(wanted) - set(picked) if not k.endswith("num_batches_tracked"))  # optional
    if missing:
        raise ValueError(f"{p}: missing {what} tensors {missing[:4]}{'...' if len(missing) > 4 else ''}")
    for k, v in picked.items():
        if not isinstance(v, Tensor) or v.shape != wanted[k].shape:
            shape = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
            raise ValueError(f"{p}: {k} has shape {shape}, expected {tuple(wanted[k].shape)}")
    module.load_state_dict(picked, strict=False)  # everything but num_batches_tracked was checked above


class SmallCNN(nn.Module):
    """``len(channels)`` blocks of conv3x3 - BatchNorm - ReLU - maxpool2, then global average pooling.

    ``(B, C, H, W)`` -> ``(B, channels[-1])``; ``feature_map`` gives the map before pooling.
    """

    def __init__(self, in_channels: int, channels: list[int] | tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()
        layers, c_in = [], in_channels
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
            layers.append(nn.MaxPool2d(2))
            c_in = c
        self.body = nn.Sequential(*layers)
        self.out_features = c_in

    def feature_map(self, x: Tensor) -> Tensor:
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x).mean(dim=(-2, -1))


#: VGG16 convolution widths up to conv5_3 ("M" = 2x2 max pooling); conv5_3 has stride 16.
VGG16_LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512)


class VGG16Features(nn.Module):
    """The VGG16 convolutional trunk up to conv5_3 + ReLU (Simonyan & Zisserman 2015), in plain torch.

    Parameter names are ``features.<i>.weight`` / ``.bias`` with the layer indices of the usual VGG16
    ``features`` stack, so a VGG16 state dict saved elsewhere (safetensors or a weights-only torch file)
    loads with :meth:`load_weights`. ``(B, 3, H, W) -> (B, 512, H/16, W/16)``.
    """

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = in_channels
        for v in VGG16_LAYERS:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c_in, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                c_in = int(v)
        self.features = nn.Sequential(*layers)
        self.out_features = 512

    def load_weights(self, path: str) -> None:
        """Load ``features.*`` tensors from a ``.safetensors`` file or a weights-only torch file; other keys
        (e.g. a classifier) are ignored; a missing or mis-shaped layer is an error naming the key."""
        load_matching_weights(self, path, "VGG16")

    def feature_map(self, x: Tensor) -> Tensor:
        return self.features(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x).mean(dim=(-2, -1))
