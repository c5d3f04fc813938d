"""Convolutional backbones in plain torch (no torchvision)."""

from __future__ import annotations

from torch import Tensor, nn


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
        from pathlib import Path

        import torch

        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"VGG16 weights not found: {p}")
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(p))
        else:
            state = torch.load(p, map_location="cpu", weights_only=True)
            state = state.get("state_dict", state) if isinstance(state, dict) else state
        wanted = self.state_dict()
        picked = {k: v for k, v in state.items() if k in wanted}
        missing = sorted(set(wanted) - set(picked))
        if missing:
            raise ValueError(f"{p}: missing VGG16 layers {missing[:4]}{'...' if len(missing) > 4 else ''}")
        for k, v in picked.items():
            if v.shape != wanted[k].shape:
                raise ValueError(f"{p}: {k} has shape {tuple(v.shape)}, expected {tuple(wanted[k].shape)}")
        self.load_state_dict(picked)

    def feature_map(self, x: Tensor) -> Tensor:
        return self.features(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x).mean(dim=(-2, -1))
