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
