"""ResNets in plain torch (He et al. 2016): ResNet-50 for real images and narrow variants for CPU runs.

Parameter names follow the usual ResNet layout (``conv1``, ``bn1``, ``layer1.0.conv1``, ...,
``layer1.0.downsample.0`` / ``.1``; bottleneck blocks stride in their 3 x 3 conv, "ResNet v1.5"), so ImageNet
weights saved elsewhere as safetensors or a weights-only torch file load with :meth:`ResNet.load_weights`
(the ``fc`` head is ignored). The network is exposed as five stages, the stem and ``layer1..4``
(:meth:`ResNet.stages`, channels in :attr:`ResNet.stage_channels`), so methods can insert modules between
them (e.g. the attention modules of self-critical attention after the stem and after every stage).
"""

from __future__ import annotations

import os

from torch import Tensor, nn

from rlattention.vision.backbones import BackboneInfo, load_matching_weights, register_backbone


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(c_in, width, stride)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(c_in, c_out, stride)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Sequential | None:
    if stride == 1 and c_in == c_out:
        return None
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))


BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet(nn.Module):
    """``(B, C, H, W) -> (B, stage_channels[-1], H', W')`` feature maps (no pooling, no classifier).

    block / layers / width: block type, blocks per stage and the first stage's width (ResNet-50: bottleneck,
    ``(3, 4, 6, 3)``, 64). stem: ``"imagenet"`` (7 x 7 stride-2 conv + 3 x 3 stride-2 max-pool, /4) or
    ``"small"`` (3 x 3 stride-1 conv, no pooling: for 32-64 px inputs). last_stride: stride of ``layer4`` (1 is
    the usual re-identification choice: a 256 x 128 person gives a 16 x 8 map instead of 8 x 4).
    """

    def __init__(
        self,
        block: str = "bottleneck",
        layers: tuple[int, ...] | list[int] = (3, 4, 6, 3),
        width: int = 64,
        in_channels: int = 3,
        stem: str = "imagenet",
        last_stride: int = 2,
    ) -> None:
        super().__init__()
        if block not in BLOCKS:
            raise ValueError(f"block must be one of {sorted(BLOCKS)}, got {block!r}")
        if stem not in ("imagenet", "small"):
            raise ValueError(f"stem must be 'imagenet' or 'small', got {stem!r}")
        if len(layers) != 4 or min(layers) < 1:
            raise ValueError(f"layers must be 4 positive block counts, got {list(layers)}")
        if last_stride not in (1, 2):
            raise ValueError(f"last_stride must be 1 or 2, got {last_stride}")
        cls = BLOCKS[block]
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(in_channels, width, 7, 2, 3, bias=False)
            self.maxpool: nn.Module = nn.MaxPool2d(3, 2, 1)
        else:
            self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        c_in, channels = width, [width]
        for i, (n, stride) in enumerate(zip(layers, (1, 2, 2, last_stride), strict=True)):
            w = width * 2**i
            blocks = [cls(c_in, w, stride)] + [cls(w * cls.expansion, w) for _ in range(n - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            c_in = w * cls.expansion
            channels.append(c_in)
        self.stage_channels: list[int] = channels
        self.out_features = c_in
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        for m in self.modules():  # zero-init the last BN of each residual branch: blocks start as identities
            if isinstance(m, Bottleneck):
                nn.init.zeros_(m.bn3.weight)
            elif isinstance(m, BasicBlock):
                nn.init.zeros_(m.bn2.weight)

    def stem(self, x: Tensor) -> Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))

    def stages(self) -> list:
        """The five stages as callables: the stem, then ``layer1`` .. ``layer4``."""
        return [self.stem, self.layer1, self.layer2, self.layer3, self.layer4]

    def forward(self, x: Tensor) -> Tensor:
        for stage in self.stages():
            x = stage(x)
        return x

    def _units(self) -> list[nn.Module]:
        return [
            nn.Sequential(self.conv1, self.bn1, self.relu, self.maxpool),
            *self.layer1,
            *self.layer2,
            *self.layer3,
            *self.layer4,
        ]

    @property
    def num_units(self) -> int:
        """The stem and every residual block (``model.freeze=N`` trains the last N)."""
        return 1 + sum(len(getattr(self, f"layer{i}")) for i in range(1, 5))

    def level_units(self, level: int) -> int:
        return 1 + sum(len(getattr(self, f"layer{i}")) for i in range(1, min(level, 4) + 1))

    def unit_modules(self, i: int) -> list[nn.Module]:
        return [self._units()[i]]

    def forward_units(self, x: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        for unit in self._units()[start:stop]:
            x = unit(x)
        return x

    def forward_levels(self, x: Tensor, out_indices: tuple[int, ...]) -> list[Tensor]:
        """Outputs of the stages ``out_indices`` (0: stem, 1..4: ``layer1`` .. ``layer4``)."""
        outs = []
        for stage in self.stages()[: max(out_indices) + 1]:
            x = stage(x)
            outs.append(x)
        return [outs[i] for i in out_indices]

    def load_weights(self, path: str | os.PathLike) -> None:
        """Load ImageNet-style weights (safetensors or weights-only torch file; ``fc.*`` and other extra keys
        are ignored). A missing or mis-shaped tensor is an error naming the file and the key."""
        load_matching_weights(self, path, "ResNet")


def resnet50(in_channels: int = 3, last_stride: int = 1) -> ResNet:
    return ResNet("bottleneck", (3, 4, 6, 3), 64, in_channels, "imagenet", last_stride)


def narrow_resnet(in_channels: int = 3, width: int = 16, last_stride: int = 1, stem: str = "small") -> ResNet:
    """A ResNet-10-shaped network (one basic block per stage) for CPU runs on small images."""
    return ResNet("basic", (1, 1, 1, 1), width, in_channels, stem, last_stride)


@register_backbone(
    BackboneInfo(
        "resnet50",
        (3, 224, 224),
        (0.485, 0.456, 0.406),
        (0.229, 0.224, 0.225),
        feature_channels=(64, 256, 512, 1024, 2048),
        feature_strides=(4, 4, 8, 16, 32),
        top1=76.1,
        notes="v1.5; no weights packaged: pretrained=PATH (torchvision-layout keys; fc.* ignored)",
        defaults={"last_stride": 2},
    )
)
def _resnet50(in_chans: int = 3, last_stride: int = 2, num_classes: int = 0) -> ResNet:
    return resnet50(in_chans, last_stride)
