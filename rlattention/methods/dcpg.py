"""Discrete-continuous action space policy-gradient attention for image-text matching (DCPG): Yan, Yu and Xie,
"Discrete-continuous Action Space Policy Gradient-based Attention for Image-Text Matching", CVPR 2021.

Data layout (``rlattention.data.image_text``): one item per caption. ``images`` ``(C, 1, R, F)``: the region
features of the caption's image (gathered, not copied, from the ``(N, 1, R, F)`` image features); ``targets``
``(C, 1 + L)`` int64: column 0 is the image's index in its split, columns 1.. the caption's token ids
(``<start> ... <end>``, padded with 0). ``DataInfo.meta["vocab_size"]`` sizes the word embedding.

Model (section 3): region features -> linear -> GCN reasoning over the fully connected region graph with
affinities R(F_i, F_j) = phi(F_i)^T psi(F_j) (eq. 1, VSRN) -> I^1..I^T; words -> 300-d embedding -> linear to the
joint width. For each modality a :class:`~rlattention.rl.discrete_continuous.DiscreteContinuousPolicy`
produces the attention Att (eqs. 2-5); fusion I_A = I * (lambda Att), I_E = GRU(I_A)^T + mean_t I_A (eqs. 11-12),
L2-normalised. By default the sampled bin a_s drives the forward pass (``estimator: straight_through``) and the
bins span Att in (0, 1) (``bin_map: logit``); see the policy's module for the paper's printed forms. Losses
(eq. 13): VSE++ hinge triplet with the hardest in-batch negatives (eq. 14), instance loss (cross-entropy over
training image ids, classifier shared by both modalities), text decoding (a causal convolutional caption decoder
shared by the image and text branches), and the discrete and continuous policy gradients of both modalities
(eqs. 7-8) with the in-batch R@1 + AP reward (eq. 9) and optionally the leave-one-out baseline beta * mean of the
other rewards (eq. 10).

Scale of the fused features, the same in every row of the ablation: the features enter the fusion multiplied by
lambda * Att (eqs. 11-12), so the triplet loss of a policy row sees features of scale lambda * E[Att]. The rows
without a policy (``pg: none``) use the constant Att = ``fixed_attention``, by default the mean attention of a
uniform policy over the bins (0.5 with ``bin_map: logit``, what the initial policy draws on average), so that
their features have the same scale lambda / 2 instead of 1.

Speed (the same numbers, less work; tests/methods/test_dcpg_speed.py checks each against the slow version): the
text decoder runs on the real caption positions only, once for both branches (:meth:`CaptionDecoder.loss_sum`);
the text GRUs run on the packed captions (:func:`~rlattention.rl.discrete_continuous.gru_sequence`); the word
features are word_fc of the vocabulary, looked up; evaluation encodes each image of a batch once.

Controls: ``noise_matched: true`` keeps the policies at their initial weights (frozen) and drops the
policy-gradient terms: the attention is drawn in training from the initial policy's distribution (and is its
mode at evaluation), which separates "attention noise as a regulariser" from "learned attention".

Evaluation: mean actions (no sampling), BatchNorm-free networks in eval mode; a prediction is
``[I_E, T_E]`` per caption and :meth:`DCPG.metrics` ranks all captions against all images of the split.

Figures (:meth:`DCPG.visualize`): per item, the deterministic region and word attention (the mean over heads,
i.e. the weights applied in eq. 11, and each head), on the rendered digit scene when it is found, with how well
the caption matches its image among the other items' images. The words come from ``DataInfo.meta["vocab"]``,
kept as a plain attribute and not in the checkpoint: loading a checkpoint rebuilds the data (``load_for_eval``)
and with it the vocabulary; without one, words are shown as ``#id``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.engine.method import AttentionMethod, DataInfo, StepOutput
from rlattention.engine.registry import register_method
from rlattention.methods.dcpg_encoders import CaptionDecoder, GCNReasoning
from rlattention.methods.dcpg_plot import _feature_boxes, _plot_attention, caption_and_region_names
from rlattention.metrics.retrieval import retrieval_metrics
from rlattention.metrics.sketch import gallery_from_pairs
from rlattention.rl import leave_one_out_baseline
from rlattention.rl.discrete_continuous import (
    BIN_MAPS,
    ESTIMATORS,
    MU_GRADS,
    DiscreteContinuousPolicy,
    dcpg_losses,
    gru_sequence,
    in_batch_retrieval_reward,
    mean_uniform_attention,
)


@dataclass
class DCPGConfig:
    """The ``model:`` section of ``method: dcpg``. Paper sizes: embed_dim 2048, GRU 2048; ours default to CPU
    sizes. ``pg`` selects the attention: none (the baseline of Table 4) | discrete | continuous (one Gaussian)
    | discrete_continuous (DCPG). Bad values raise a ``ValueError`` naming the key."""

    embed_dim: int = 256  # joint embedding width (paper 2048)
    word_dim: int = 300
    gcn_layers: int = 2  # VSRN uses 4
    pg: str = "discrete_continuous"
    heads: int = 2
    num_bins: int = 100  # n
    tau: float = 1.0  # Gumbel-softmax temperature
    init_std: float | None = 0.15  # sigma of the continuous stage starts at this, so that training's attention is
    # close to evaluation's (z = mu); None: PyTorch's default init (sigma near softplus(0) = 0.69)
    init_att_std: float | None = 0.05  # the discrete stage starts as a discretised Gaussian over the bins around
    # Att 0.5 with this standard deviation (attention units), so that the first weights drawn are near the no-policy
    # rows' constant 0.5; None: nearly uniform over the bins (PyTorch's init: weights spread over (0, 1), which cost
    # 34 rsum in the issue-19 study)
    pg_to_features: bool = False  # let the policy gradient reach the region/word encoders (false: policies read
    # detached features, so the REINFORCE noise trains only the policies)
    estimator: str = "straight_through"  # straight_through: the sampled bin a_s drives the forward pass (the
    # paper's a_s); relaxed: the expected Gumbel-softmax bin does, and a_s only enters log a_g(a_s)
    bin_map: str = "logit"  # logit: mu = logit((a_s + 1/2) / n), Att spans (0, 1); logistic: eq. 3 as printed,
    # mu = logistic(a_s / n), Att within [0.62, 0.68]
    mu_grad: str = "relaxed"  # relaxed: the continuous term reaches W_mu through the relaxed bin (straight-through
    # Gumbel, the paper); none: W_mu learns from the discrete term only (unbiased; needs straight_through)
    noise_matched: bool = False  # control: policies frozen at init, no policy-gradient terms
    fixed_attention: float | None = None  # pg: none: the constant Att of the fusion; None: the mean attention of
    # a uniform policy over the bins (0.5 with bin_map logit), the policy rows' scale
    lam: float = 20.0  # lambda of eqs. 11-12
    reward: str = "r1+ap"  # r1 | ap | r1+ap (eq. 9)
    pg_baseline: bool = False  # eq. 10
    baseline_beta: float = 0.5
    self_critical: bool = False  # the advantage is R(sampled attention) - R(mean actions) of the same query: the
    # reward of the query's deterministic embedding against the same batch, a baseline that does not depend on
    # the query's own actions (unbiased), per query rather than per batch (eq. 10's)
    margin: float = 0.2
    instance_weight: float = 1.0  # 0 removes the instance loss
    decoding_weight: float = 1.0  # 0 removes the text-decoding loss
    pg_weight: float = 1.0
    policy_lr_scale: float = 1.0  # the policies' learning rate is optim.lr times this (their only gradient is the
    # policy gradient, whose scale Adam ignores: this is what sets how fast they move)
    decoder_layers: int = 2
    glove: str | None = None  # optional glove.*.txt to initialise the word embedding
    select_on: str = "rsum"


#: The version of the attention scheme saved with the weights (buffer ``attention_scheme``): 2 = the bins of
#: ``bin_map`` and the ``fixed_attention`` scale of the no-policy rows; checkpoints without it are scheme 1.
ATTENTION_SCHEME = 2


def _check_config(cfg: DCPGConfig) -> None:
    """A ``ValueError`` naming the key, the value and what was expected, for every bad ``model.*`` value."""
    for name, value, allowed in (
        ("pg", cfg.pg, ("none", "discrete", "continuous", "discrete_continuous")),
        ("reward", cfg.reward, ("r1", "ap", "r1+ap")),
        ("estimator", cfg.estimator, ESTIMATORS),
        ("bin_map", cfg.bin_map, BIN_MAPS),
        ("mu_grad", cfg.mu_grad, MU_GRADS),
    ):
        if value not in allowed:
            raise ValueError(f"model.{name} must be one of {', '.join(allowed)}, got {value!r}")
    for name, value, ok, what in (
        ("num_bins", cfg.num_bins, cfg.num_bins >= 2, ">= 2"),
        ("tau", cfg.tau, cfg.tau > 0, "> 0"),
        (
            "init_std",
            cfg.init_std,
            cfg.init_std is None or cfg.init_std > 1e-3,
            "> 0.001 (the policy's min_std) or null",
        ),
        ("init_att_std", cfg.init_att_std, cfg.init_att_std is None or cfg.init_att_std > 0, "> 0 or null"),
        ("policy_lr_scale", cfg.policy_lr_scale, cfg.policy_lr_scale > 0, "> 0"),
        (
            "fixed_attention",
            cfg.fixed_attention,
            cfg.fixed_attention is None or 0 < cfg.fixed_attention <= 1,
            "in (0, 1] or null",
        ),
    ):
        if not ok:
            raise ValueError(f"model.{name} must be {what}, got {value!r}")
    if cfg.estimator == "relaxed" and cfg.mu_grad == "none":
        raise ValueError(
            "model.mu_grad='none' needs model.estimator='straight_through' (got 'relaxed'): the relaxed forward pass "
            "ignores the sampled bin, so W_mu would learn only from zero-mean noise"
        )
    if cfg.self_critical and cfg.pg_baseline:
        raise ValueError("model.self_critical and model.pg_baseline are two baselines: set one of them, not both")
    if cfg.noise_matched and cfg.pg == "none":
        raise ValueError("model.noise_matched=true needs a policy (model.pg other than 'none'), got model.pg='none'")


def hardest_negative_triplet(sims: Tensor, same: Tensor, margin: float) -> Tensor:
    """VSE++ (eq. 14): for each positive pair (i, i), the hardest caption and the hardest image in the batch
    that do not belong to the same image. sims ``(B, B)`` image x caption; same ``(B, B)`` bool."""
    pos = sims.diagonal()
    neg = sims.masked_fill(same, float("-inf"))
    cost_c = F.relu(margin - pos + neg.max(dim=1).values)  # hardest caption for each image
    cost_i = F.relu(margin - pos + neg.max(dim=0).values)  # hardest image for each caption
    cost_c = torch.where(torch.isfinite(cost_c), cost_c, torch.zeros_like(cost_c))
    cost_i = torch.where(torch.isfinite(cost_i), cost_i, torch.zeros_like(cost_i))
    return (cost_c + cost_i).mean()


@register_method("dcpg")
class DCPG(AttentionMethod):
    Config = DCPGConfig
    task = "image_text"
    selection_metric = ("rsum", "max")
    # torch 2.13's inductor generates vectorised C++ for this model's backward that corrupts the heap on the CPU
    # (the process aborts: "malloc_consolidate(): invalid chunk size"); scalar C++ code is correct
    # (tests/engine/test_compile_methods.py with RLATTENTION_COMPILE_BACKEND=inductor)
    cpu_compile_options = {"cpp.simdlen": 1}

    def __init__(self, cfg: DCPGConfig, info: DataInfo) -> None:
        super().__init__()
        _check_config(cfg)
        if cfg.lam <= 0 or cfg.margin < 0 or cfg.embed_dim < 1 or cfg.heads < 1:
            raise ValueError(
                f"need model.lam > 0, model.margin >= 0, model.embed_dim >= 1, model.heads >= 1; got "
                f"{cfg.lam}, {cfg.margin}, {cfg.embed_dim}, {cfg.heads}"
            )
        vocab_size = int(info.meta.get("vocab_size", 0))
        if vocab_size < 5 or len(info.image_shape) != 3:
            raise ValueError(
                "dcpg needs an image-text dataset (items (1, R, F) region features, DataInfo.meta['vocab_size']); "
                f"got image shape {info.image_shape} and meta {sorted(info.meta)}"
            )
        self.cfg = cfg
        E = cfg.embed_dim
        self.region_fc = nn.Linear(info.image_shape[-1], E)
        self.gcn = GCNReasoning(E, cfg.gcn_layers)
        self.word_embedding = nn.Embedding(vocab_size, cfg.word_dim, padding_idx=0)
        self.word_fc = nn.Linear(cfg.word_dim, E)
        mode = "discrete_continuous" if cfg.pg == "none" else cfg.pg
        policy = dict(
            num_bins=cfg.num_bins,
            heads=cfg.heads,
            tau=cfg.tau,
            estimator=cfg.estimator,
            mode=mode,
            init_std=cfg.init_std,
            bin_map=cfg.bin_map,
            mu_grad=cfg.mu_grad,
            init_att_std=cfg.init_att_std,
        )
        self.image_policy = DiscreteContinuousPolicy(E, E, **policy) if cfg.pg != "none" else None
        self.text_policy = DiscreteContinuousPolicy(E, E, **policy) if cfg.pg != "none" else None
        if cfg.noise_matched:  # the control: the initial policies, never trained
            for policy_module in (self.image_policy, self.text_policy):
                policy_module.requires_grad_(False)
        # pg: none: the constant attention of the fusion (the policy rows' mean scale, see the module doc)
        self.fixed_attention = (
            cfg.fixed_attention
            if cfg.fixed_attention is not None
            else mean_uniform_attention(cfg.num_bins, cfg.bin_map)
        )
        self.register_buffer("attention_scheme", torch.tensor(ATTENTION_SCHEME))
        self.image_gru = nn.GRU(E, E, batch_first=True)  # GRU_gr^I
        self.text_gru = nn.GRU(E, E, batch_first=True)  # GRU_gr^T
        self.instance = nn.Linear(E, info.num_classes) if cfg.instance_weight > 0 else None
        self.decoder = (
            CaptionDecoder(vocab_size, E, min(E, 256), cfg.decoder_layers) if cfg.decoding_weight > 0 else None
        )
        if cfg.glove:
            self._load_glove(cfg.glove, info)
        # the ordinary words (ids 4..) for figures; a plain attribute, not in the state dict (see the module doc)
        self.vocab_words: list[str] = [str(w) for w in info.meta.get("vocab") or []]

    def lr_scales(self) -> dict[str, float]:
        """``model.policy_lr_scale`` for both policies (none without policies or at 1)."""
        if self.image_policy is None or self.cfg.policy_lr_scale == 1.0:
            return {}
        return {"image_policy": self.cfg.policy_lr_scale, "text_policy": self.cfg.policy_lr_scale}

    @classmethod
    def from_config(cls, cfg: DCPGConfig, info: DataInfo) -> DCPG:
        return cls(cfg, info)

    @classmethod
    def from_checkpoint(cls, cfg: DCPGConfig, info: DataInfo, state: dict) -> DCPG:
        """A checkpoint without ``attention_scheme`` was trained before ``bin_map`` and ``fixed_attention``
        existed: with mu = logistic(a_s / n) and unscaled features in the ``pg: none`` rows. Its model is rebuilt
        so (``state`` gets the marker, so that its weights load)."""
        if "attention_scheme" not in state:
            cfg = dataclasses.replace(cfg, bin_map="logistic", fixed_attention=1.0 / cfg.lam)
            state["attention_scheme"] = torch.tensor(1)
        return cls(dataclasses.replace(cfg, glove=None), info)  # the checkpoint holds every weight

    @classmethod
    def data_info_from_state(cls, info: DataInfo, state: dict) -> DataInfo:
        """``meta["vocab_size"]`` from the word embedding of the weights ``state`` when the checkpoint's data_info
        lacks it (checkpoints written before data_info kept the data's meta; their figures show ``#id`` for the
        words, which newer checkpoints carry in ``meta["vocab"]``)."""
        weight = state.get("word_embedding.weight")
        if "vocab_size" in info.meta or not isinstance(weight, torch.Tensor) or weight.ndim != 2:
            return info
        return dataclasses.replace(info, meta={**info.meta, "vocab_size": int(weight.shape[0])})

    def _load_glove(self, path: str, info: DataInfo) -> None:
        from rlattention.data.text import Vocabulary, load_glove

        words = info.meta.get("vocab")
        if not words:
            raise ValueError("model.glove needs the vocabulary (ordinary words) in DataInfo.meta['vocab']")
        vectors, _ = load_glove(path, Vocabulary(words), dim=self.cfg.word_dim)
        with torch.no_grad():
            self.word_embedding.weight.copy_(torch.as_tensor(vectors))

    # ---------------------------------------------------------------- encoders
    def _fuse(self, x: Tensor, mask: Tensor | None, policy, gru: nn.GRU, deterministic: bool):
        """Attention (eqs. 2-5) and fusion (eqs. 11-12): x ``(B, T, E)`` -> embedding ``(B, E)``, policy output."""
        out = None
        if policy is not None:
            out = policy(x if self.cfg.pg_to_features else x.detach(), mask, deterministic=deterministic)
            x = x * (self.cfg.lam * out.attention.unsqueeze(-1))  # I_A = I * (lambda Att)
        else:  # no policy: the constant attention, so the features have the scale of the policy rows'
            x = x * (self.cfg.lam * self.fixed_attention)
        if mask is None:
            h, _ = gru(x)
            last, mean = h[:, -1], x.mean(1)
        else:
            lengths = mask.sum(1).clamp(min=1)
            _, last = gru_sequence(gru, x, lengths)  # the packed sequences
            mean = (x * mask.unsqueeze(-1)).sum(1) / lengths.unsqueeze(-1).to(x.dtype)
        return F.normalize(last + mean, dim=-1), out  # I_E = h_g^T + mean_t I_A

    def region_features(self, regions: Tensor) -> Tensor:
        """I^1..I^T ``(B, R, E)``: region_fc then the GCN, of ``(B, 1, R, F)`` or ``(B, R, F)`` regions."""
        return self.gcn(self.region_fc(regions.flatten(1, -2) if regions.ndim == 4 else regions))

    def encode_images(self, regions: Tensor, deterministic: bool):
        return self._fuse(self.region_features(regions), None, self.image_policy, self.image_gru, deterministic)

    def word_features(self, tokens: Tensor) -> Tensor:
        """word_fc(word_embedding(tokens)) ``(B, L, E)``; with fewer words in the vocabulary than tokens, as
        a lookup in word_fc applied to the whole vocabulary (the same values, computed once per word)."""
        if self.word_embedding.num_embeddings <= tokens.numel():
            table = self.word_fc(self.word_embedding.weight)
            return F.embedding(tokens, table, padding_idx=self.word_embedding.padding_idx)
        return self.word_fc(self.word_embedding(tokens))

    def encode_texts(self, tokens: Tensor, deterministic: bool):
        mask = tokens != 0
        w = self.word_features(tokens)
        return self._fuse(w, mask, self.text_policy, self.text_gru, deterministic)

    # ---------------------------------------------------------------- training
    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:
        cfg = self.cfg
        ids, tokens = targets[:, 0], targets[:, 1:]
        v, mask = self.region_features(images), tokens != 0
        w = self.word_features(tokens)
        img, img_pg = self._fuse(v, None, self.image_policy, self.image_gru, deterministic=False)
        txt, txt_pg = self._fuse(w, mask, self.text_policy, self.text_gru, deterministic=False)
        sims = img @ txt.T  # (B, B) cosine similarities, image x caption
        same = ids[:, None] == ids[None, :]
        terms = {"triplet": hardest_negative_triplet(sims, same, cfg.margin)}
        if self.instance is not None:
            # the mean cross-entropy of the images plus that of the captions, as one product with the classifier
            logits = self.instance(torch.cat((img, txt)))
            terms["instance"] = cfg.instance_weight * F.cross_entropy(logits, ids.repeat(2), reduction="sum") / len(ids)
        if self.decoder is not None:
            terms["decoding"] = cfg.decoding_weight * self.decoder.loss_sum((img, txt), tokens)
        stats = {}
        if img_pg is not None:
            r_img = in_batch_retrieval_reward(sims, same, cfg.reward)  # image queries, captions as gallery
            r_txt = in_batch_retrieval_reward(sims.T, same.T, cfg.reward)  # caption queries
            greedy = {}
            if cfg.self_critical and not cfg.noise_matched:
                greedy = self._greedy_rewards(v, w, mask, img, txt, same)
            pg_rows = () if cfg.noise_matched else (("image", img_pg, r_img), ("text", txt_pg, r_txt))
            for name, out, r in pg_rows:  # the noise-matched control has no policy-gradient term (reward logged)
                b = leave_one_out_baseline(r, cfg.baseline_beta) if cfg.pg_baseline else greedy.get(name)  # eq. 10 | SC
                l_d, l_c = dcpg_losses(out, r, b)
                if cfg.pg in ("discrete", "discrete_continuous"):
                    terms[f"pg_d_{name}"] = cfg.pg_weight * l_d
                if cfg.pg in ("continuous", "discrete_continuous"):
                    terms[f"pg_c_{name}"] = cfg.pg_weight * l_c
            stats = {"reward": 0.5 * (r_img.mean() + r_txt.mean()), "reward_image": r_img.mean()}
            if greedy:  # how much the sampled attention beats the mean actions, on average
                stats["advantage"] = 0.5 * ((r_img - greedy["image"]).mean() + (r_txt - greedy["text"]).mean())
        loss = sum(terms.values())
        stats["batch_r1"] = (sims.argmax(1) == torch.arange(len(ids), device=ids.device)).float().mean()
        return StepOutput(loss, terms=terms, stats=stats)

    @torch.no_grad()
    def _greedy_rewards(self, v: Tensor, w: Tensor, mask: Tensor, img: Tensor, txt: Tensor, same: Tensor) -> dict:
        """The self-critical baselines: the reward of each image query's and each caption query's embedding
        under mean actions, ranked against the batch's sampled embeddings of the other modality (the same gallery
        as its sampled reward), so that a query's baseline does not depend on its own actions."""
        img_g, _ = self._fuse(v, None, self.image_policy, self.image_gru, deterministic=True)
        txt_g, _ = self._fuse(w, mask, self.text_policy, self.text_gru, deterministic=True)
        return {
            "image": in_batch_retrieval_reward(img_g @ txt.T, same, self.cfg.reward),
            "text": in_batch_retrieval_reward(txt_g @ img.T, same.T, self.cfg.reward),
        }

    # ---------------------------------------------------------------- evaluation
    def predict_batch(
        self, images: Tensor, targets: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None
    ) -> Tensor:
        """``[I_E, T_E]`` ``(B, 2E)`` per caption item, with mean actions. The items of one image (the same id in
        ``targets[:, 0]`` and equal region features: the 5 captions of an image in an evaluation batch) share
        one encoding of the image (deterministic, so the same as encoding each)."""
        with torch.no_grad():
            ids = targets[:, 0]
            _, inverse = torch.unique(ids, return_inverse=True)
            first = torch.full((int(inverse.max()) + 1 if len(ids) else 0,), len(ids), device=ids.device)
            first = first.scatter_reduce(0, inverse, torch.arange(len(ids), device=ids.device), "amin")
            if len(first) < len(ids) and torch.equal(images[first][inverse], images):
                img, _ = self.encode_images(images[first], deterministic=True)
                img = img[inverse]
            else:
                img, _ = self.encode_images(images, deterministic=True)
            txt, _ = self.encode_texts(targets[:, 1:], deterministic=True)
        return torch.cat((img, txt), 1)

    def predict(self, images: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError("dcpg predicts from (images, captions): use predict_batch")

    def metrics(self, scores: Tensor, targets: Tensor) -> dict[str, float]:
        E = self.cfg.embed_dim
        img, txt = scores[:, :E], scores[:, E:]
        gallery, caption_to_image = gallery_from_pairs(img, targets[:, 0].long(), atol=1e-3, rtol=1e-3)
        m = retrieval_metrics(gallery @ txt.T, caption_to_image)
        return {**m, "count": float(len(txt)), "images": float(len(gallery))}

    @torch.no_grad()
    def attention(self, images: Tensor, targets: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """Deterministic region and word attention ``(B, R)``, ``(B, L)`` (None without a policy)."""
        tokens = targets[:, 1:]
        if self.image_policy is None:
            return None, None
        v = self.region_features(images)
        w = self.word_features(tokens)
        return (
            self.image_policy(v, None, deterministic=True).attention,
            self.text_policy(w, tokens != 0, deterministic=True).attention,
        )

    # ---------------------------------------------------------------- figures
    #: Where :meth:`visualize` looks for the rendered digit scenes of its items: generated digit-scenes folders or
    #: cache folders holding them (:func:`rlattention.data.synthetic.digit_scenes.find_scene_images`); empty: the
    #: default cache (``$RLATTENTION_CACHE`` or ``~/.cache/rlattention``). Set it for a run with a custom
    #: ``data.render_cache``.
    scene_roots: tuple[str | Path, ...] = ()
    #: At most this many figures per :meth:`visualize` call.
    max_figures: int = 16

    @torch.no_grad()
    def _attention_heads(self, regions: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Deterministic attention of every head: regions ``(B, R, H)``, words ``(B, L, H)`` (0 on padding)."""
        v = self.gcn(self.region_fc(regions))
        w = self.word_features(tokens)
        return (
            self.image_policy(v, None, deterministic=True).head_attention,
            self.text_policy(w, tokens != 0, deterministic=True).head_attention,
        )

    def _words(self, tokens: Sequence[int]) -> list[str]:
        """Token ids -> words (``<start>`` etc. for the special ids); ``#id`` without a matching vocabulary."""
        from rlattention.data.text import SPECIAL_TOKENS

        words = self.vocab_words
        known = len(SPECIAL_TOKENS) + len(words) == self.word_embedding.num_embeddings
        out = []
        for t in tokens:
            if t < len(SPECIAL_TOKENS):
                out.append(SPECIAL_TOKENS[t])
            else:
                out.append(words[t - len(SPECIAL_TOKENS)] if known else f"#{t}")
        return out

    def visualize(
        self, images: Tensor, targets: Tensor, out_dir: Path, generator: torch.Generator | None = None
    ) -> list[Path]:
        """One figure per item (the first :attr:`max_figures`), ``out_dir/dcpg_attention_{item:03d}.png``.

        A figure shows the deterministic (mean-action) attention of the item's regions and caption words: the
        mean over heads (the weights applied to the features, eq. 11) and, with several heads, each head. The
        regions are drawn as boxes shaded by their weight on the rendered scene when the item's scene is found
        (digit scenes: :func:`~rlattention.data.synthetic.digit_scenes.find_scene_images` in :attr:`scene_roots`, which
        checks that the saved features of the scene equal the item's), else on a black square when the features
        carry a box geometry (see :func:`_feature_boxes`), else only as bars. The title gives the caption's
        cosine similarity to its image and the rank of its image among the distinct images of ``images`` (the
        in-batch match the reward scores). ``generator`` is unused: the attention is deterministic.

        Raises :class:`NoAttentionPolicyError` for ``model.pg: none`` (no attention to draw).
        """
        if self.image_policy is None or self.text_policy is None:
            raise NoAttentionPolicyError(
                "dcpg with model.pg=none (a Table 4 baseline) has no attention policy, so there are no attention "
                "weights to draw: the region and word features enter the fusion unweighted"
            )
        from rlattention.data.synthetic.digit_scenes import find_scene_images

        n = min(len(images), self.max_figures)
        regions = images[:n].flatten(1, -2) if images.ndim == 4 else images[:n]  # (n, R, F)
        ids, tokens = targets[:n, 0], targets[:n, 1:]
        with torch.no_grad():
            region_heads, word_heads = (a.float().cpu().numpy() for a in self._attention_heads(regions, tokens))
            img, _ = self.encode_images(regions, deterministic=True)
            txt, _ = self.encode_texts(tokens, deterministic=True)
        ids_list = ids.tolist()
        gallery = list(dict.fromkeys(ids_list))  # the distinct images, in order of first appearance
        sims = (txt @ img[[ids_list.index(g) for g in gallery]].T).float().cpu().numpy()  # (n, M)
        regions_cpu = regions.detach().float().cpu()
        scenes = find_scene_images(regions_cpu, ids.cpu(), list(self.scene_roots) or None)
        boxes = scenes.boxes if scenes is not None else _feature_boxes(regions_cpu.numpy())
        cfg = self.cfg
        H = region_heads.shape[-1]
        heading = f"DCPG attention (pg={cfg.pg}, {H} head{'s' if H > 1 else ''}, lambda={cfg.lam:g}, mean actions)"
        paths = []
        for i in range(n):
            keep = [t for t in tokens[i].tolist() if t != 0]
            words = self._words(keep)
            L = len(words)
            column = gallery.index(ids_list[i])
            rank = 1 + int((sims[i] > sims[i, column]).sum())
            match = f"cos(I_E, T_E) = {sims[i, column]:.3f}; its image ranks {rank} of {len(gallery)} in this batch"
            if rank > 1:
                top = int(sims[i].argmax())
                match += f" (top: image {gallery[top]}, cos {sims[i, top]:.3f})"
            caption, names = caption_and_region_names(
                words, regions.shape[1], scenes.digits[i] if scenes is not None else (), "\n"
            )
            if scenes is not None:
                where = f"scene: {scenes.folder.name}/{scenes.split} image {ids_list[i]}"
            elif boxes is not None:
                where = "no rendered scene found: boxes from the features' geometry on a black square"
            else:
                where = "no rendered scene or box geometry: regions by index"
            paths.append(
                _plot_attention(
                    Path(out_dir) / f"dcpg_attention_{i:03d}.png",
                    f'{heading}\nimage {ids_list[i]}, caption "{caption}"\n{match}',
                    scenes.images[i] if scenes is not None else None,
                    boxes[i] if boxes is not None else None,
                    names,
                    region_heads[i],
                    words,
                    word_heads[i, :L],
                    where,
                )
            )
        return paths


class NoAttentionPolicyError(NotImplementedError, ValueError):
    """:meth:`DCPG.visualize` of a model without attention policies (``model.pg: none``, the Table 4 baselines).
    A ``NotImplementedError``, so ``fit`` writes no figures and goes on, and a ``ValueError``, so
    ``rlattention viz`` reports it as an error message."""
