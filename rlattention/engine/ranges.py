"""The allowed range of every numeric config setting (:data:`RANGES` for the shared sections, :data:`MODEL_RANGES`
per method; :data:`MODEL_CHECKED_BY_METHOD`: the fields a method checks itself), read by
:func:`rlattention.engine.config.check_ranges`. Tests check that no numeric field lacks one."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """The allowed values of a numeric setting: ``lo``/``hi`` bounds (``None``: unbounded; ``*_open``: the bound
    itself excluded) and ``extra`` values allowed besides. A list setting is checked element by element; ``null``
    (where the schema allows it), booleans and strings (e.g. ``devices: auto``) are not checked here. NaN and the
    infinities are always out of range."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    extra: tuple[int, ...] = ()

    def __contains__(self, v: float) -> bool:
        if v in self.extra:
            return True
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        return self.hi is None or not (v > self.hi or (self.hi_open and v == self.hi))

    def __str__(self) -> str:
        def num(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else str(x)

        if self.lo is not None and self.hi is not None:
            text = f"in {'(' if self.lo_open else '['}{num(self.lo)}, {num(self.hi)}{')' if self.hi_open else ']'}"
        elif self.lo is not None:
            text = f"{'>' if self.lo_open else '>='} {num(self.lo)}"
        elif self.hi is not None:
            text = f"{'<' if self.hi_open else '<='} {num(self.hi)}"
        else:
            text = "finite"
        return text + "".join(f" or {x}" for x in self.extra)


AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
POSITIVE = Range(0, lo_open=True)
UNIT = Range(0, 1)  # probabilities, fractions, discounts
SEED = Range(0, 2**32 - 1)  # numpy's and Lightning's seed_everything's bounds
REAL = Range()  # any finite number

#: ``section.key`` -> allowed range, for every numeric field of the shared sections (a test checks that none is
#: missing). Settings a dataset or the trainer checks further against other settings (``data.cv_fold`` < the
#: folds, ``data.clutter_size`` <= the digit size, ``trainer.pk_instances`` dividing the batch) keep those checks.
RANGES: dict[str, Range] = {
    "trainer.epochs": AT_LEAST_1,
    "trainer.max_steps": AT_LEAST_0,
    "trainer.batch_size": AT_LEAST_1,
    "trainer.eval_batch_size": AT_LEAST_1,
    "trainer.devices": Range(1, extra=(-1,)),  # an int (-1: all); "auto" and device lists go to Lightning
    "trainer.num_threads": AT_LEAST_0,
    "trainer.seed": SEED,
    "trainer.log_every": AT_LEAST_1,
    "trainer.val_every": AT_LEAST_1,
    "trainer.early_stop_patience": AT_LEAST_0,  # 0: off
    "trainer.early_stop_min_delta": AT_LEAST_0,
    "trainer.early_stop_start_epoch": AT_LEAST_0,
    "trainer.checkpoint_every": AT_LEAST_0,
    "trainer.ema_decay": Range(0, 1, hi_open=True),  # 0: off
    "trainer.pk_instances": AT_LEAST_1,
    "trainer.collective_timeout_minutes": Range(0, 7 * 24 * 60, lo_open=True),  # at most a week
    "trainer.setup_timeout_minutes": Range(0, 7 * 24 * 60, lo_open=True),  # at most a week
    "optim.lr": AT_LEAST_0,
    "optim.weight_decay": AT_LEAST_0,
    "optim.momentum": UNIT,
    "optim.grad_clip": AT_LEAST_0,
    "optim.step_epochs": AT_LEAST_1,
    "optim.step_gamma": Range(0, 1, lo_open=True),
    "optim.warmup_steps": AT_LEAST_0,
    "optim.lr_scale": AT_LEAST_0,  # every multiplier
    "data.val_size": AT_LEAST_0,
    "data.seed": SEED,
    "data.num_train": AT_LEAST_0,
    "data.num_test": AT_LEAST_0,
    "data.canvas_size": AT_LEAST_0,  # 0: the dataset's default
    "data.num_clutter": AT_LEAST_0,
    "data.clutter_size": AT_LEAST_1,
    "data.max_digits": AT_LEAST_1,
    "data.image_size": AT_LEAST_1,
    "data.test_fraction": Range(0, 1, lo_open=True, hi_open=True),  # as the datasets that use it require
    "data.digits_per_canvas": AT_LEAST_1,
    "data.scale_range": POSITIVE,
    "data.layout_grid": AT_LEAST_0,
    "data.clutter_scale": POSITIVE,
    "data.completion_steps": AT_LEAST_1,
    "data.line_width": AT_LEAST_1,  # output pixels, as the renderer requires
    "data.omniglot_subsets": Range(1, 2),
    "data.max_caption_len": AT_LEAST_0,
    "data.reid_size": AT_LEAST_1,
    "data.reid_val_ids": AT_LEAST_0,
    "data.reid_cameras": Range(2),  # omniglot_reid also needs it to divide 20
    "data.cv_folds": AT_LEAST_0,
    "data.cv_fold": AT_LEAST_0,
    "eval.mc_samples": AT_LEAST_0,
    "eval.seed": SEED,
    "eval.viz_images": AT_LEAST_0,
}

#: the glimpse network, core and location policy that RAM, unified and darp share
_GLIMPSE_RANGES: dict[str, Range] = {
    "glimpse_size": AT_LEAST_1,
    "num_scales": AT_LEAST_1,
    "scale_factor": POSITIVE,
    "glimpse_hidden": AT_LEAST_1,
    "loc_hidden": AT_LEAST_1,
    "glimpse_dim": AT_LEAST_1,
    "hidden_size": AT_LEAST_1,
    "std": POSITIVE,
}

_RAM_RANGES: dict[str, Range] = {
    **_GLIMPSE_RANGES,
    "reinforce_weight": AT_LEAST_0,
    "baseline_weight": AT_LEAST_0,
    "gamma": UNIT,
}

#: method -> ``model.`` key -> allowed range. Together with :data:`MODEL_CHECKED_BY_METHOD` it lists every numeric
#: field of every method's Config (a test checks that); settings whose range depends on other settings (e.g.
#: ``model.crop_margin`` < the image side) are checked by the method.
MODEL_RANGES: dict[str, dict[str, Range]] = {
    "cnn": {"channels": AT_LEAST_1, "hidden": AT_LEAST_1, "dropout": UNIT},
    "ram": _RAM_RANGES,
    "unified": {
        **_RAM_RANGES,
        "conv_channels": AT_LEAST_1,
        "entropy_threshold": UNIT,
        "entropy_lambda": AT_LEAST_0,
        "context_weight": AT_LEAST_0,
        "context_hidden": AT_LEAST_1,
        "pyramid_levels": AT_LEAST_1,
        "pyramid_split": AT_LEAST_1,
        "region_size": AT_LEAST_0,  # 0: half the image side
        "region_dim": AT_LEAST_1,
        "epsilon_start": UNIT,
        "epsilon_end": UNIT,
        "epsilon_decay": UNIT,
        "temperature": POSITIVE,
        "q_gamma": UNIT,
        "target_sync_every": AT_LEAST_1,
        "q_weight": AT_LEAST_0,
        "glimpses_per_token": AT_LEAST_0,
    },
    "darp_triplet": {
        "channels": AT_LEAST_1,
        "head_hidden": AT_LEAST_1,
        "feature_levels": AT_LEAST_0,
        "feature_grid": AT_LEAST_1,
        "embed_dim": AT_LEAST_1,
        "margin": AT_LEAST_0,
        "augment_degrees": Range(0, 180),
        "augment_flip": UNIT,
    },
    "darp": {
        **_GLIMPSE_RANGES,
        "std_final": POSITIVE,
        "eta_start": UNIT,
        "eta_end": UNIT,
        "eta_alpha": REAL,  # eq. 5's logistic: any real slope and offset
        "eta_beta": REAL,
        "supervised_weight": AT_LEAST_0,
        "reinforce_weight": AT_LEAST_0,
        "augment_degrees": Range(0, 180),
    },
    "darp_policy": {"hidden_size": AT_LEAST_1, "eta_alpha": REAL, "eta_beta": REAL, "value_weight": AT_LEAST_0},
    "dcpg": {
        "word_dim": AT_LEAST_1,
        "gcn_layers": AT_LEAST_0,
        "baseline_beta": UNIT,
        "instance_weight": AT_LEAST_0,
        "decoding_weight": AT_LEAST_0,
        "pg_weight": AT_LEAST_0,
        "decoder_layers": AT_LEAST_1,
        "policy_lr_scale": POSITIVE,
    },
    "rarl": {
        "backbone_channels": AT_LEAST_1,
        "backbone_level": AT_LEAST_0,
        "anchor_areas": POSITIVE,
        "anchor_ratios": POSITIVE,
        "region_size": AT_LEAST_1,
        "region_dim": AT_LEAST_1,
        "hidden_size": AT_LEAST_1,
        "num_iterations": AT_LEAST_1,
        "std": POSITIVE,
        "std_final": POSITIVE,
        "std_min": POSITIVE,
        "std_max": POSITIVE,
        "reinforce_weight": AT_LEAST_0,
        "baseline_weight": AT_LEAST_0,
    },
    "scal": {
        "width": AT_LEAST_1,
        "last_stride": AT_LEAST_1,
        "reduction": AT_LEAST_1,
        "spatial_hidden": AT_LEAST_1,
        "critic_hidden": AT_LEAST_1,
        "pg_weight": AT_LEAST_0,
        "critic_weight": AT_LEAST_0,
        "mse_weight": AT_LEAST_0,
        "margin": AT_LEAST_0,
        "triplet_weight": AT_LEAST_0,
        "label_smoothing": UNIT,
        "ce_weight": AT_LEAST_0,
        "pad": AT_LEAST_0,
        "erase_p": UNIT,
    },
}

#: method -> numeric ``model.`` keys the method's own ``__init__`` range-checks (not repeated here).
MODEL_CHECKED_BY_METHOD: dict[str, tuple[str, ...]] = {
    "cnn": (),
    "ram": ("num_glimpses", "std_final", "augment_shift"),
    "unified": ("num_glimpses", "std_final", "augment_shift"),
    "darp_triplet": ("temperature",),  # > 0 when model.loss=infonce uses it
    "darp": (
        "glimpses_per_step",
        "num_heads",
        "mask_prob",
        "importance_clip",
        "gamma",
        "supervised_temperature",
        "grid",
        "epsilon",
        "epsilon_final",
        "target_sync",
        "eval_head",
        "locator_radius",
    ),
    "darp_policy": ("std", "std_final", "gamma", "ppo_clip", "ppo_memory"),
    "dcpg": ("embed_dim", "heads", "num_bins", "tau", "init_std", "init_att_std", "fixed_attention", "lam", "margin"),
    "rarl": (
        "max_anchor_fraction",
        "entropy_weight",
        "train_episodes",
        "locator_grid",  # >= 1 when model.locator=map uses it
        "locator_hidden",
        "crop_margin",
        "test_views",
    ),
    "scal": ("positions", "explore", "explore_std", "explore_grid"),
}
