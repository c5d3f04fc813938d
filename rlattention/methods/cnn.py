"""A plain CNN classifier: the non-attentive baseline of the same data and engine (robustness comparisons
in the unified-attention paper, the global-pooling baseline of rarl)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.engine.method import AttentionMethod, DataInfo, StepOutput
from rlattention.engine.registry import register_method
from rlattention.vision.backbones import SmallCNN


@dataclass
class CNNConfig:
    channels: list[int] = field(default_factory=lambda: [32, 64, 128])
    hidden: int = 256
    dropout: float = 0.0


@register_method("cnn")
class CNN(AttentionMethod):
    Config = CNNConfig

    def __init__(self, cfg: CNNConfig, info: DataInfo) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = SmallCNN(info.image_shape[0], cfg.channels)
        self.head = nn.Sequential(
            nn.Linear(self.backbone.out_features, cfg.hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.hidden, info.num_classes),
        )

    @classmethod
    def from_config(cls, cfg: CNNConfig, info: DataInfo) -> CNN:
        return cls(cfg, info)

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
