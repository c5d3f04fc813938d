"""Experiment configs: typed dataclass defaults, YAML files, ``key=value`` command-line overrides.

The schema is ``ExperimentConfig`` with the ``model:`` section of the chosen method. OmegaConf checks every key and
type against it; an unknown key or a value of the wrong type is a :class:`ConfigError` that names the key and lists
the valid keys (or the expected type).

Values are literal: OmegaConf's ``${...}`` interpolations (references to other keys, ``${oc.env:...}`` environment
look-ups, resolvers) are not resolved in config files, overrides or checkpoint configs; a string holding ``${`` is
kept verbatim (see :func:`build_config` for the explicit opt-in). Every numeric setting is range-checked against
:data:`RANGES` and :data:`MODEL_RANGES`: a value out of range is a :class:`ConfigError` naming the key, the value and
the allowed range.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from rlattention.data import limits
from rlattention.data.config import DataConfig
from rlattention.engine.ranges import MODEL_RANGES, RANGES, Range
from rlattention.engine.registry import get_method


class ConfigError(ValueError):
    """A config file or override that does not fit the schema."""


@dataclass
class OptimConfig:
    name: str = "adam"  # adam | sgd
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9  # sgd only
    grad_clip: float = 0.0  # max global grad norm; 0 disables
    schedule: str = "none"  # none | cosine | step
    step_epochs: int = 30  # step schedule: decay every this many epochs
    step_gamma: float = 0.1
    warmup_steps: int = 0
    # learning-rate multipliers by parameter-name prefix (the longest matching prefix wins), e.g. {locator: 10}:
    # the locator's parameters at 10 x lr. Every prefix must name some parameter of the model.
    lr_scale: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainerConfig:
    epochs: int = 10
    max_steps: int = 0  # > 0: train exactly this many optimiser steps (epochs is then ignored)
    batch_size: int = 128
    eval_batch_size: int = 1000
    accelerator: str = "cpu"  # cpu | cuda | gpu | auto
    devices: Any = 1  # int or "auto"
    strategy: str = "auto"  # auto | ddp | ...
    precision: str = "32-true"  # 32-true | bf16-mixed | 16-mixed
    num_threads: int = 0  # torch intra-op threads on CPU (0: leave torch's default)
    seed: int = 0
    out_dir: str = "runs"
    run_name: str = ""  # default: <method>_<dataset>_<timestamp>
    overwrite: bool = False  # a used out_dir/run_name is renamed aside (never deleted); default: run_name-v2, -v3...
    log_every: int = 50  # steps between logged scalars
    val_every: int = 1  # epochs between validations
    # early stopping on the validation selection metric (rlattention/engine/stopping.py): with patience N > 0,
    # training ends after N validations in a row (counted in validations, i.e. every val_every epochs, not in
    # epochs) without an improvement of at least early_stop_min_delta (>= 0, in the metric's own units, e.g. 0.1 =
    # 0.1 percentage point; 0: any strict improvement) over the last value that improved by that much; best.ckpt is
    # then tested as usual. 0: off. The schedule keeps its horizon (trainer.epochs / max_steps): with a decaying
    # learning rate (cosine, step) an early stop cuts the schedule short, before the lr has decayed
    early_stop_patience: int = 0
    early_stop_min_delta: float = 0.0
    # validations before this many epochs are done are not monitored (a model's own schedules, e.g. unified's
    # epsilon decay over the first 30% of the steps, should be over before a plateau means anything)
    early_stop_start_epoch: int = 0
    checkpoint_every: int = 0  # also save `last` every this many steps (0: at epoch ends only)
    # > 0: an exponential moving average of the trained weights with this decay (e.g. 0.999: about the last 1,000
    # steps) is what validation selects and the test, figures and exports evaluate (rlattention/engine/averaging.py);
    # checkpoints keep the trained weights too. 0: off
    ema_decay: float = 0.0
    progress: bool = True
    wandb: str = ""  # a W&B project: also log there (offline unless $WANDB_MODE; pip install "rlattention[wandb]")
    deterministic: bool = False  # torch.use_deterministic_algorithms
    sampler: str = "random"  # random: shuffled batches | pk: P identities x K images per batch (re-id, metric learning)
    pk_instances: int = 4  # K of the pk sampler; batch_size must be a multiple of it
    compile: bool = False  # torch.compile the training step (Module.compile; on CPU inductor needs a C++ compiler)
    # several processes (ddp): a collective (gradient all-reduce, barrier, broadcast) that waits longer than this
    # for a stalled or dead rank fails the run with one line naming this rank (exit code 4) instead of hanging
    # (> 0, at most a week; Lightning's own default is 30 minutes)
    collective_timeout_minutes: float = 10.0
    # several processes: the waits that legitimately outlast a collective, on a gloo group of their own: the others
    # while rank 0 builds the data and its caches first (a first render or frozen-feature cache can take 30+
    # minutes), every rank preparing its model before the first training collective, the others while rank 0
    # writes figures, artifacts and report.json at the end (> 0, at most a week)
    setup_timeout_minutes: float = 240.0


@dataclass
class EvalConfig:
    split: str = "test"  # test | val
    mc_samples: int = 0  # 0: mean actions; M > 0: average over M sampled episodes
    seed: int = 1234  # seed of evaluation randomness (initial locations, MC samples)
    viz_images: int = 6  # attention figures written at the end of fit (0: none)


@dataclass
class ExperimentConfig:
    method: str = "ram"
    data: DataConfig = field(default_factory=DataConfig)
    model: Any = None  # the method's Config dataclass
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def _schema(method: str) -> DictConfig:
    cls = get_method(method)
    base = OmegaConf.structured(ExperimentConfig)
    base.model = OmegaConf.structured(cls.Config)
    OmegaConf.set_struct(base, True)
    _free_mappings(base)
    return base


def _free_mappings(node: DictConfig) -> None:
    """Dict-typed fields (such as ``optim.lr_scale``) take new keys; their values are still type-checked."""
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            if OmegaConf.get_type(child) is dict:
                OmegaConf.set_struct(child, False)
            else:
                _free_mappings(child)


def _valid_keys(schema: DictConfig, dotted: str) -> tuple[str, list[str]]:
    """The section that holds ``dotted`` and its valid keys."""
    parts = dotted.split(".")
    node: Any = schema
    section = []
    for p in parts[:-1]:
        if isinstance(node, DictConfig) and p in node and isinstance(node[p], DictConfig):
            node = node[p]
            section.append(p)
        else:
            break
    return ".".join(section), list(node.keys()) if isinstance(node, DictConfig) else []


def _explain(exc: OmegaConfBaseException, schema: DictConfig, source: str, literal: bool = True) -> ConfigError:
    key = getattr(exc, "full_key", None) or ""
    if isinstance(exc, ConfigKeyError | ConfigAttributeError):
        section, keys = _valid_keys(schema, key)
        leaf = key.split(".")[-1]
        hint = difflib.get_close_matches(leaf, keys, n=1)
        where = f"section '{section}'" if section else "the top level"
        msg = f"{source}: unknown key '{key}' in {where}. Valid keys: {', '.join(keys)}"
        if hint:
            msg += f". Did you mean '{hint[0]}'?"
        return ConfigError(msg)
    value = getattr(exc, "value", None)
    if isinstance(exc, ValidationError) and literal and isinstance(value, str) and "${" in value:
        line = str(exc).strip().splitlines()[0]
        line = line[line.find("Value '") :] if "Value '" in line else line  # drop "While dereferencing ..."
        return ConfigError(
            f"{source}: bad value for '{key}': {line}: interpolation is off ('${{...}}' is kept as a literal string)"
        )
    if isinstance(exc, ValidationError):
        section, keys = _valid_keys(schema, key)
        msg = str(exc).splitlines()[0]
        return ConfigError(
            f"{source}: bad value for '{key}': {msg}. Valid keys of '{section or 'top'}': {', '.join(keys)}"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__  # drop OmegaConf's key dump
    return ConfigError(f"{source}: {first}")


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    size = path.stat().st_size
    if size > limits.MAX_YAML_BYTES:
        raise ConfigError(
            f"{path}: config file of {size:,} bytes exceeds the limit of {limits.MAX_YAML_BYTES:,} bytes "
            "(MAX_YAML_BYTES, rlattention.data.limits)"
        )
    try:
        data = limits.safe_load_limited(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); expected a YAML config") from None
    except limits.YamlLimitError as e:
        raise ConfigError(f"{path}: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to parse") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections at the top, got {type(data).__name__}")
    return data


def parse_overrides(overrides: list[str]) -> dict:
    out: dict = {}
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. model.num_glimpses=8)")
        key, value = item.split("=", 1)
        try:
            parsed = limits.safe_load_limited(value) if value != "" else ""
        except (yaml.YAMLError, RecursionError):  # also aliases and deep nesting: kept as the plain string
            parsed = value
        out[key.strip()] = parsed
    return out


_INTERPOLATION = re.compile(r"(\\*)\$\{")


def _literal(value: Any) -> Any:
    """``value`` with every string escaped for OmegaConf, so that it comes out of ``OmegaConf.to_object`` verbatim:
    ``${`` becomes ``\\${`` and the backslashes right before it are doubled (OmegaConf's escape grammar), nothing
    else changes. Mappings and lists are walked; keys are left alone (OmegaConf never resolves keys)."""
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: m.group(1) * 2 + "\\${", value)
    if isinstance(value, dict):
        return {k: _literal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_literal(v) for v in value]
    return value


def build_config(
    raw: dict, overrides: dict | None = None, source: str = "config", *, interpolation: bool = False
) -> ExperimentConfig:
    """Merge ``raw`` (a dict as read from YAML) and dotted ``overrides`` onto the schema.

    Every value is literal: a string holding ``${...}`` is kept as it is, never resolved by OmegaConf (no
    environment look-ups, no references between keys, no self-referencing loops); in a numeric field it is a
    :class:`ConfigError` saying interpolation is off. ``interpolation=True`` (for trusted configs, from code
    only: no config file, override or environment variable can turn it on) restores OmegaConf's resolution."""
    overrides = dict(overrides or {})
    method = overrides.pop("method", None) or raw.get("method", "ram")
    try:
        schema = _schema(str(method))
    except KeyError as e:
        raise ConfigError(f"{source}: {e.args[0]}") from None
    raw = {k: v for k, v in raw.items() if k != "method"}
    escaped = overrides
    if not interpolation:
        try:
            raw, escaped = _literal(raw), _literal(overrides)
        except RecursionError:
            raise ConfigError(f"{source}: nested too deeply") from None
    cfg = schema.copy()
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.create(raw))
    except OmegaConfBaseException as e:
        raise _explain(e, schema, source, not interpolation) from None
    for key, value in overrides.items():
        try:
            OmegaConf.update(cfg, key, escaped[key], merge=True, force_add=False)
        except OmegaConfBaseException as e:
            raise _explain(e, schema, f"override {key}={value!r}", not interpolation) from None
    try:
        model = cfg.model
    except OmegaConfBaseException as e:  # interpolation=True only: e.g. a self-reference
        raise _explain(e, schema, source, not interpolation) from None
    if not isinstance(model, DictConfig):  # ``model`` is typed Any in ExperimentConfig: check it here
        raise ConfigError(
            f"{source}: 'model' must be a mapping of {method} settings (keys: {', '.join(schema.model.keys())}), "
            f"got {model!r}"
        )
    cfg.method = str(method)
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise _explain(e, schema, source, not interpolation) from None
    _check_sides(obj, source)
    check_ranges(obj, source)
    return obj  # type: ignore[return-value]


#: (section, key) of the image / canvas / glimpse side settings capped at ``limits.MAX_IMAGE_SIDE`` px.
SIDE_KEYS: tuple[tuple[str, str], ...] = (
    ("data", "canvas_size"),
    ("data", "image_size"),
    ("data", "clutter_size"),
    ("data", "reid_size"),
    ("model", "glimpse_size"),
    ("model", "region_size"),
)


def _check_sides(cfg: Any, source: str) -> None:
    """A :class:`ConfigError` naming the key, its value and the maximum for a side above ``MAX_IMAGE_SIDE``."""
    for section, key in SIDE_KEYS:
        value = getattr(getattr(cfg, section, None), key, None)
        try:
            limits.check_side(f"{section}.{key}", value)
        except limits.InputLimitError as e:
            raise ConfigError(f"{source}: {e}") from None


def _check_value(key: str, value: Any, allowed: Range, source: str) -> None:
    single = not isinstance(value, list | tuple | dict)
    values = [value] if single else list(value.values()) if isinstance(value, dict) else list(value)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if v not in allowed:
            what = "it" if single else f"every {'value' if isinstance(value, dict) else 'element'}"
            got = "" if single else f", got {v!r}"
            raise ConfigError(f"{source}: {key}={value!r} is out of range: {what} must be {allowed}{got}")


def check_ranges(cfg: ExperimentConfig, source: str = "config") -> None:
    """A :class:`ConfigError` naming the key, the value and the allowed range for the first numeric setting of
    ``cfg`` out of :data:`RANGES` / :data:`MODEL_RANGES` (lists and mappings: the first bad element)."""
    for dotted, allowed in RANGES.items():
        section, key = dotted.split(".")
        _check_value(dotted, getattr(getattr(cfg, section), key), allowed, source)
    for key, allowed in MODEL_RANGES.get(cfg.method, {}).items():
        _check_value(f"model.{key}", getattr(cfg.model, key, None), allowed, source)


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_config_file(path: Path, _seen: tuple[Path, ...] = ()) -> dict:
    """Read a YAML config; ``base: other.yaml`` (relative to this file) is read first and overlaid."""
    path = Path(path)
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: 'base' files form a cycle: {' -> '.join(str(p) for p in (*_seen, path))}")
    raw = _read_yaml(path)
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"{path}: 'base' must be the path of another config file, got {base!r}")
    return _deep_merge(read_config_file(path.parent / base, (*_seen, path.resolve())), raw)


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, *, interpolation: bool = False
) -> ExperimentConfig:
    """A config file (or the defaults) with ``key=value`` overrides; values are literal unless ``interpolation``
    (see :func:`build_config`)."""
    raw = read_config_file(Path(path)) if path else {}
    return build_config(
        raw, parse_overrides(overrides or []), source=str(path) if path else "defaults", interpolation=interpolation
    )


def to_dict(cfg: ExperimentConfig) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(d: dict, source: str = "checkpoint") -> ExperimentConfig:
    return build_config(d, source=source)
