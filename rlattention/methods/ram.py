"""Recurrent attention model (RAM): Mnih, Heess, Graves, Kavukcuoglu, "Recurrent Models of Visual
Attention", NIPS 2014; notation of the unified-attention paper (section 3.2 and appendix).

At step t the glimpse sensor reads k patches around L_{t-1}; the glimpse network fuses them with the
location into G_t; the core RNN updates H_t; the location network, a Gaussian policy, proposes L_t; after
T glimpses the classifier predicts the label from H_T. The reward is R = 1[y_hat = y] at the end of the
episode. Training minimises the hybrid loss

    L = -log p(y | H_T)                                   (classification, supervised)
        - (1/B) sum_b sum_t (R - b_t) log pi(L_t | H_t)   (REINFORCE, RAM eq. 2 with a baseline)
        + (1/B) sum_b sum_t (R - b_t)^2                   (baseline regression)

Only the T - 1 locations L_1..L_{T-1} that the sensor actually uses are actions; L_0 is drawn uniformly
(or is the centre) and is not part of the policy. ``policy_grad_to_core`` says whether the policy gradient
flows into the core network and the glimpse network (true in the paper, where the whole model is trained
end to end by the hybrid loss); when false, the location network reads a detached H_t.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.engine.method import AttentionMethod, DataInfo, StepOutput
from rlattention.engine.registry import register_method
from rlattention.rl import (
    GaussianPolicy,
    LearnedBaseline,
    LinearSchedule,
    classification_reward,
    policy_gradient_losses,
    terminal_returns,
)
from rlattention.vision import GlimpseSensor
from rlattention.vision.recurrent import CoreNetwork, GlimpseNetwork
from rlattention.vision.transforms import random_shift


@dataclass
class RAMConfig:
    """The ``model:`` section for ``method: ram``. Defaults: 6 glimpses of 8x8, one scale (MNIST)."""

    glimpse_size: int = 8  # g: side of each patch
    num_scales: int = 1  # k: patches per glimpse
    scale_factor: float = 2.0  # side ratio of successive patches
    glimpse_mode: str = "area"  # area | nearest (see vision.glimpse)
    num_glimpses: int = 6  # T
    glimpse_hidden: int = 128  # h_g = ReLU(Linear(patches))
    loc_hidden: int = 128  # h_l = ReLU(Linear(l))
    glimpse_dim: int = 256  # G = ReLU(Linear(h_g) + Linear(h_l))
    core: str = "rnn"  # rnn: H_t = ReLU(Linear(H_{t-1}) + Linear(G_t)) | lstm
    hidden_size: int = 256  # H
    std: float = 0.17  # sigma of the location policy, in units of half the image side
    std_final: float | None = None  # anneal sigma linearly to this over training (None: fixed)
    init_location: str = "random"  # L_0: random (uniform in [-1, 1]^2) | center
    policy_grad_to_core: bool = False  # does the REINFORCE gradient reach the core and glimpse networks? (paper: yes)
    reinforce_weight: float = 1.0  # weight of the REINFORCE term in the hybrid loss
    baseline_weight: float = 1.0  # weight of the baseline regression
    gamma: float = 1.0  # discount of the terminal reward (1: every action gets R)
    # training only (not in the papers): translate each image by up to this many pixels (zero padding)
    augment_shift: int = 0


class Episode(NamedTuple):
    logits: Tensor  # (B, K) from H_T
    log_pi: Tensor  # (B, T-1) log-probabilities of the locations actually used
    baseline: Tensor  # (B, T-1) b_t for those actions
    locations: Tensor  # (B, T, 2) L_0 .. L_{T-1}
    patches: Tensor  # (B, T, k, C, g, g) what the sensor returned at each glimpse
    hidden: Tensor  # (B, T, H) H_1 .. H_T


@register_method("ram")
class RAM(AttentionMethod):
    Config = RAMConfig

    def __init__(self, cfg: RAMConfig, info: DataInfo) -> None:
        super().__init__()
        if cfg.num_glimpses < 1:
            raise ValueError(f"model.num_glimpses must be >= 1, got {cfg.num_glimpses}")
        if cfg.std_final is not None and cfg.std_final <= 0:
            raise ValueError(f"model.std_final must be > 0 (or null for a fixed sigma), got {cfg.std_final}")
        if cfg.init_location not in ("random", "center"):
            raise ValueError(f"model.init_location must be 'random' or 'center', got {cfg.init_location!r}")
        if cfg.augment_shift < 0:
            raise ValueError(f"model.augment_shift must be >= 0 pixels, got {cfg.augment_shift}")
        self.cfg = cfg
        channels = info.image_shape[0]
        self.sensor = GlimpseSensor(cfg.glimpse_size, cfg.num_scales, cfg.scale_factor, cfg.glimpse_mode)
        self.glimpse = GlimpseNetwork(
            channels * self.sensor.out_features, cfg.glimpse_hidden, cfg.loc_hidden, cfg.glimpse_dim
        )
        self.core = CoreNetwork(cfg.core, cfg.glimpse_dim, cfg.hidden_size)
        self.locator = GaussianPolicy(cfg.hidden_size, 2, cfg.std)
        self.baseline = LearnedBaseline(cfg.hidden_size, init_value=0.5)
        self.classifier = nn.Linear(cfg.hidden_size, info.num_classes)
        self.std_schedule = LinearSchedule(cfg.std, cfg.std_final)

    @classmethod
    def from_config(cls, cfg: RAMConfig, info: DataInfo) -> RAM:
        return cls(cfg, info)

    def set_progress(self, progress: float) -> None:
        self.locator.std = self.std_schedule(progress)

    def augment(self, images: Tensor) -> Tensor:
        """The training images, each translated by up to ``augment_shift`` pixels (zero padding)."""
        return random_shift(images, self.cfg.augment_shift) if self.cfg.augment_shift > 0 else images

    def initial_location(self, batch: int, like: Tensor, generator: torch.Generator | None) -> Tensor:
        if self.cfg.init_location == "center":
            return like.new_zeros(batch, 2)
        return torch.rand(batch, 2, generator=generator, device=like.device, dtype=like.dtype) * 2.0 - 1.0

    def episode(
        self,
        images: Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        initial_location: Tensor | None = None,
        differentiable_locations: bool = False,
        prepared: Tensor | None = None,
    ) -> Episode:
        """Run T glimpses. images ``(B, C, H, W)`` in [0, 1].

        initial_location: ``(B, 2)`` L_0 (default: :meth:`initial_location`).
        differentiable_locations: with ``deterministic``, let gradients flow through the mean locations
            (x -> H_t -> mu_t = L_t -> next patch), e.g. for gradient-based attacks. Never used in training.
        prepared: ``self.sensor.prepare(images)`` if the caller already computed it.
        """
        B, T = images.shape[0], self.cfg.num_glimpses
        if prepared is None:
            prepared = self.sensor.prepare(images)  # once per episode: depends only on the image
        loc = self.initial_location(B, images, generator) if initial_location is None else initial_location
        state = self.core.initial_state(B, images)
        log_pis, baselines, locs, patches_seen, hidden = [], [], [loc], [], []
        h = None
        for t in range(T):
            patches = self.sensor.extract(prepared, loc, images.dtype)  # x_t: (B, k, C, g, g)
            patches_seen.append(patches)
            g_t = self.glimpse(patches, loc)  # G_t
            h, state = self.core(g_t, state)  # H_t
            hidden.append(h)
            if t < T - 1:  # L_t is used by the next glimpse, so it is an action
                act = self.locator(h if self.cfg.policy_grad_to_core else h.detach(), deterministic, generator)
                log_pis.append(act.log_prob)  # log pi(L_t | H_t) of exactly the L_t used below
                baselines.append(self.baseline(h))  # b_t, detached input
                loc = act.mean if (differentiable_locations and deterministic) else act.action
                locs.append(loc)
        logits = self.classifier(h)
        empty = images.new_zeros(B, 0)
        return Episode(
            logits,
            torch.stack(log_pis, 1) if log_pis else empty,
            torch.stack(baselines, 1) if baselines else empty,
            torch.stack(locs, 1),
            torch.stack(patches_seen, 1),
            torch.stack(hidden, 1),
        )

    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:
        images = self.augment(images)
        ep = self.episode(images)
        cfg = self.cfg
        nll = F.cross_entropy(ep.logits, targets)  # -log p(y | H_T)
        R = classification_reward(ep.logits.detach(), targets)  # R = 1[y_hat = y], (B,)
        G = terminal_returns(R, ep.log_pi.shape[1], cfg.gamma)  # (B, T-1), reward only at the end
        l_rl, l_b = policy_gradient_losses(ep.log_pi, G, ep.baseline)  # advantage G - b_t, b_t detached
        loss = nll + cfg.reinforce_weight * l_rl + cfg.baseline_weight * l_b
        return StepOutput(
            loss,
            terms={"nll": nll, "reinforce": l_rl, "baseline": l_b},
            stats={"reward": R.mean(), "sigma": torch.tensor(self.locator.std)},
        )

    @torch.no_grad()
    def predict(self, images: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None) -> Tensor:
        """Class probabilities ``(B, K)``: mean locations, or the average over ``mc_samples`` sampled episodes."""
        if mc_samples <= 0:
            return self.predict_with_attention(images, generator)[0]
        probs = 0.0
        for _ in range(mc_samples):
            probs = probs + self.episode(images, deterministic=False, generator=generator).logits.softmax(-1)
        return probs / mc_samples

    @torch.no_grad()
    def predict_with_attention(
        self, images: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Class probabilities ``(B, K)`` with mean locations (:meth:`predict`) and ``{"locations": (B, T, 2)}``:
        L_0 .. L_{T-1}, the centre of every glimpse the sensor read, (x, y) in [-1, 1] with (-1, -1) the top-left
        corner of the image and (1, 1) the bottom-right (:mod:`rlattention.vision.glimpse`). L_0 is drawn from
        ``generator`` (``init_location: random``) or is the centre."""
        ep = self.episode(images, deterministic=True, generator=generator)
        return ep.logits.softmax(-1), {"locations": ep.locations}

    def attack_logits(self, images: Tensor, seed: int = 0) -> Tensor:
        """Deterministic logits with gradients through the mean locations (L_0 drawn from ``seed``)."""
        gen = torch.Generator(device=images.device).manual_seed(seed)
        return self.episode(images, deterministic=True, generator=gen, differentiable_locations=True).logits

    @torch.no_grad()
    def visualize(self, images: Tensor, targets: Tensor, out_dir: Path, generator: torch.Generator | None = None):
        from rlattention.vision.plot import plot_glimpses

        ep = self.episode(images, deterministic=True, generator=generator)
        pred = ep.logits.argmax(-1)
        sides = [self.cfg.glimpse_size * self.cfg.scale_factor**s for s in range(self.cfg.num_scales)]
        paths = []
        for i in range(len(images)):
            path = Path(out_dir) / f"glimpses_{i:03d}.png"
            title = f"label {int(targets[i])}, predicted {int(pred[i])}"
            plot_glimpses(images[i], ep.locations[i], ep.patches[i], sides, path, title=title)
            paths.append(path)
        return paths
