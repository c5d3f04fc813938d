"""Phase 2 of DARP (method ``darp``): the glimpse agent. A glimpse network on the current partial sketch -> RNN ->
the action network a_t (a sketch embedding, supervised by ||a_t - e_i||^2, eq. 7) and a locator that picks the
next glimpse: K bootstrapped Gaussian heads trained by the bootstrapped policy gradient (eq. 8) with the dynamic
ranking reward (eqs. 3-6), or the bootstrapped-DQN baseline over a grid of locations (:mod:`.locators`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.engine.method import DataInfo, StepOutput
from rlattention.engine.registry import register_method
from rlattention.methods.darp.frozen import Phase1, Phase2Method, training_gallery
from rlattention.methods.darp.layout import completion_steps, split_layout
from rlattention.methods.darp.locators import cell_centres, epsilon_greedy_cells, q_learning_targets, raster_locations
from rlattention.metrics.sketch import true_ranks
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
    rank_percentile,
    rank_threshold_reward,
    sample_heads,
)
from rlattention.rl.qlearning import TargetNetwork
from rlattention.vision import GlimpseSensor
from rlattention.vision.recurrent import CoreNetwork, GlimpseNetwork
from rlattention.vision.transforms import random_rotate_flip

DARP_REWARDS = ("threshold", "inverse_rank", "delta_inverse_rank", "percentile")


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
class DARP(Phase2Method):
    Config = DARPConfig
    phase1_output = "embed_sketches"  # what phase 2 reads of each partial (memoised with model.phase1_cache)

    def __init__(self, cfg: DARPConfig, info: DataInfo, phase1: Phase1) -> None:
        super().__init__()
        _check_config(cfg)
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
        epsilon = 0.0 if deterministic else self.epsilon
        cell = epsilon_greedy_cells(self._q(h), head, epsilon, generator)  # (B,) indices of self.cells
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
        rows = self.train_row[targets]
        if rows.device.type == "cpu" and bool((rows < 0).any()):  # (not checked on accelerators: a host sync)
            raise ValueError("a training item's photo is not in the training gallery (on_fit_start not called?)")
        gallery = training_gallery(self)
        supervised = self.supervised_loss(a, self.phase1.gallery[targets], rows, gallery)  # eq. 7
        ranks = true_ranks(a.detach(), gallery, rows)  # (N, T), ties count against
        eta = self.threshold(ep["partial"], a.dtype)  # eq. 5, or rising over the completion steps
        R = self.reward(ranks, eta, len(gallery))  # eqs. 3-4
        G = discounted_returns(R[:, 1:], cfg.gamma)  # eq. 6: return of action v_t, R_{t+1} + gamma R_{t+2} + ...
        h_act = H[:, :-1].detach()
        b = self.value(h_act) if self.value is not None else None
        rl = self.locator_loss(ep, H, R, G, b)  # eq. 8 (or the DQN baseline's Q-learning loss)
        if rl is None:
            rl = supervised.new_zeros(())  # no policy to train
        loss = cfg.supervised_weight * supervised + cfg.reinforce_weight * rl
        terms = {"supervised": supervised, "rl": rl}
        if b is not None:
            terms["baseline"] = baseline_loss(b, G)
            loss = loss + terms["baseline"]
        if self.training:
            self.step_count += 1
            if cfg.locator == "dqn" and int(self.step_count) % cfg.target_sync == 0:
                self.q_target.sync(self.q_heads)
        return StepOutput(loss, terms=terms, stats=self._stats(ep, ranks, R, eta, h_act))

    def supervised_loss(self, a: Tensor, e: Tensor, rows: Tensor, gallery: Tensor) -> Tensor:
        """Embeddings a_t ``(N, T, D)`` against the true photo's e_i ``(N, D)`` (its row ``(N,)`` of the training
        ``gallery``): ||a_t - e_i||^2 (eq. 7), or ``infonce``, the true photo against every training photo."""
        if self.cfg.supervised == "mse":
            return (a - e[:, None]).pow(2).sum(-1).mean()  # ||a_t - e_i||^2
        logits = F.normalize(a, dim=-1) @ gallery.T / self.cfg.supervised_temperature  # (N, T, G)
        return F.cross_entropy(logits.flatten(0, 1), rows.repeat_interleave(a.shape[1]))

    def threshold(self, partial: Tensor, dtype: torch.dtype) -> Tensor:
        """eta of the rank reward: eq. 5 over training steps (``eta_schedule: paper``), or rising over the
        completion step ``partial`` of each glimpse (``(N, 1)`` or ``(T,)``)."""
        if self.cfg.eta_schedule == "paper":
            return torch.sigmoid(self.step_count.float() * self.cfg.eta_alpha - self.cfg.eta_beta)  # no host sync
        return self.eta_completion(partial.float()).to(dtype)

    def locator_loss(self, ep: dict, H: Tensor, R: Tensor, G: Tensor, b: Tensor | None) -> Tensor | None:
        """The locator's loss on the episodes ``ep`` (hidden states H ``(N, T, F)``, rewards R ``(N, T)``, returns
        G ``(N, T-1)`` of the actions, baseline b or None): the bootstrapped policy gradient (eq. 8) of the
        Gaussian heads, or the bootstrapped Q-learning loss of the DQN heads; None for the fixed locators."""
        cfg = self.cfg
        h_act = H[:, :-1].detach()
        B, T1 = G.shape
        masks = bootstrap_masks((B, T1), cfg.num_heads, cfg.mask_prob, device=H.device)  # fresh per experience
        if cfg.locator in ("raster", "random"):
            return None  # no policy to train (the masks are drawn all the same: the random stream as before)
        if cfg.locator == "bootstrap":
            log_pi = self.locator.log_prob_all(ep["actions"], h_act)  # (N, T-1, K)
            # eq. 8, per head on its masked share of its own (or weighted) episodes
            return (
                bootstrapped_reinforce_loss(
                    log_pi, G, masks, b, acting_head=ep["head"], update=cfg.bootstrap_update, clip=cfg.importance_clip
                )
                / T1
            )
        if cfg.bootstrap_update == "acting":  # head k learns from its own episodes only
            masks = masks * F.one_hot(ep["head"], cfg.num_heads).to(masks.dtype)[:, None]
        q = self._q(h_act)  # (N, T-1, K, A)
        with torch.no_grad():
            q_next = self._q(H[:, 1:].detach(), target=True).max(-1).values  # (N, T-1, K); h_T ends the episode
            y = q_learning_targets(R[:, 1:], q_next, cfg.gamma)
        return bootstrapped_q_loss(q.flatten(0, 1), ep["cells"].flatten(), y.flatten(0, 1), masks.flatten(0, 1))

    def _stats(self, ep: dict, ranks: Tensor, R: Tensor, eta: Tensor, h_act: Tensor) -> dict[str, Tensor]:
        cfg = self.cfg
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
        return stats

    def reward(self, ranks: Tensor, eta: Tensor, gallery_size: int) -> Tensor:
        """R_t of every glimpse from the true photo's rank ``(N, T)`` (``model.reward``)."""
        if self.cfg.reward == "threshold":
            return rank_threshold_reward(ranks, eta)  # eq. 3
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


def _pairs(cfg: DARPConfig) -> list[tuple[float, float]]:
    std = list(cfg.std)
    end = list(cfg.std_final) if cfg.std_final is not None else std
    if len(std) != 2 or len(end) != 2:
        raise ValueError(f"model.std and model.std_final must be [sigma_x, sigma_y], got {cfg.std}, {cfg.std_final}")
    return list(zip(std, end, strict=True))


def _check_config(cfg: DARPConfig) -> None:
    """One-line errors for a ``model:`` section of ``method: darp`` that cannot be built."""
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
    if cfg.locator != "bootstrap" and cfg.locator_init != "centre":
        raise ValueError(f"model.locator_init={cfg.locator_init!r} applies to the bootstrap locator only")
