"""The policy baselines of DARP's Table III (method ``darp_policy``): "triplet + vanilla RL" and "triplet + PPO",
after Bhunia et al., "Sketch Less for More" (CVPR 2020). A policy network maps the frozen phase-1 features of each
partial sketch to a Gaussian over the sketch embedding, trained by REINFORCE (``algorithm: reinforce``) or by PPO's
clipped surrogate over a replay memory with a Monte-Carlo value network (``algorithm: ppo``)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.engine.method import DataInfo, StepOutput
from rlattention.engine.registry import register_method
from rlattention.methods.darp.frozen import Phase1, Phase2Method, extra_state_optional, training_gallery
from rlattention.methods.darp.layout import completion_steps, split_layout
from rlattention.metrics.sketch import true_ranks
from rlattention.rl import (
    LinearSchedule,
    SigmoidThreshold,
    discounted_returns,
    gaussian_log_prob,
    leave_one_out_baseline,
    ppo_clip_loss,
)


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
class EmbeddingPolicy(Phase2Method):
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

    _load_from_state_dict = extra_state_optional(nn.Module._load_from_state_dict)

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
