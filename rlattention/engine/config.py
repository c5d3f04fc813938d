"""Experiment configs: typed dataclass defaults, YAML files, ``key=value`` command-line overrides.

The schema is ``ExperimentConfig`` with the ``model:`` section of the chosen method. OmegaConf checks every
key and type against it; an unknown key or a value of the wrong type is a :class:`ConfigError` that names
the key and lists the valid keys (or the expected type).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from rlattention.data import limits
from rlattention.data.config import DataConfig
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
    log_every: int = 50  # steps between logged scalars
    val_every: int = 1  # epochs between validations
    checkpoint_every: int = 0  # also save `last` every this many steps (0: at epoch ends only)
    progress: bool = True
    deterministic: bool = False  # torch.use_deterministic_algorithms
    sampler: str = "random"  # random: shuffled batches | pk: P identities x K images per batch (re-id, metric learning)
    pk_instances: int = 4  # K of the pk sampler; batch_size must be a multiple of it
    compile: bool = False  # torch.compile the training step (Module.compile; on CPU inductor needs a C++ compiler)


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


def _explain(exc: OmegaConfBaseException, schema: DictConfig, source: str) -> ConfigError:
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
    if isinstance(exc, ValidationError):
        section, keys = _valid_keys(schema, key)
        msg = str(exc).splitlines()[0]
        return ConfigError(
            f"{source}: bad value for '{key}': {msg}. Valid keys of '{section or 'top'}': {', '.join(keys)}"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__  # drop OmegaConf's key dump
    return ConfigError(f"{source}: {first}")


class YamlLimitError(yaml.YAMLError):
    """YAML refused by :class:`_LimitedLoader`: an alias or anchor, or nesting deeper than
    :data:`rlattention.data.limits.MAX_YAML_DEPTH`."""


class _LimitedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses anchors and aliases (``&a`` / ``*a``: their expansion can be exponential,
    the "billion laughs") at the first one met, and mappings / lists nested deeper than ``MAX_YAML_DEPTH``;
    both before anything is built from them."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark else 0
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            kind = "alias" if isinstance(event, yaml.AliasEvent) else "anchor"
            raise YamlLimitError(
                f"line {line}: YAML {kind} '{'*' if kind == 'alias' else '&'}{event.anchor}' refused "
                "(anchors and aliases are not allowed in config files: write the values out)"
            )
        self._depth += 1
        try:
            if self._depth > limits.MAX_YAML_DEPTH:
                raise YamlLimitError(
                    f"line {line}: nested more than {limits.MAX_YAML_DEPTH} levels deep "
                    "(MAX_YAML_DEPTH, rlattention.data.limits)"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _safe_load(text: str) -> Any:
    """``yaml.safe_load`` with :class:`_LimitedLoader` (no aliases, bounded depth)."""
    loader = _LimitedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


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
        data = _safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); expected a YAML config") from None
    except YamlLimitError as e:
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
            parsed = _safe_load(value) if value != "" else ""
        except (yaml.YAMLError, RecursionError):  # also aliases and deep nesting: kept as the plain string
            parsed = value
        out[key.strip()] = parsed
    return out


def build_config(raw: dict, overrides: dict | None = None, source: str = "config") -> ExperimentConfig:
    """Merge ``raw`` (a dict as read from YAML) and dotted ``overrides`` onto the schema."""
    overrides = dict(overrides or {})
    method = overrides.pop("method", None) or raw.get("method", "ram")
    try:
        schema = _schema(str(method))
    except KeyError as e:
        raise ConfigError(f"{source}: {e.args[0]}") from None
    cfg = schema.copy()
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.create({k: v for k, v in raw.items() if k != "method"}))
    except OmegaConfBaseException as e:
        raise _explain(e, schema, source) from None
    for key, value in overrides.items():
        try:
            OmegaConf.update(cfg, key, value, merge=True, force_add=False)
        except OmegaConfBaseException as e:
            raise _explain(e, schema, f"override {key}={value!r}") from None
    if not isinstance(cfg.model, DictConfig):  # ``model`` is typed Any in ExperimentConfig: check it here
        raise ConfigError(
            f"{source}: 'model' must be a mapping of {method} settings (keys: {', '.join(schema.model.keys())}), "
            f"got {cfg.model!r}"
        )
    cfg.method = str(method)
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise _explain(e, schema, source) from None
    _check_sides(obj, source)
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


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    raw = read_config_file(Path(path)) if path else {}
    return build_config(raw, parse_overrides(overrides or []), source=str(path) if path else "defaults")


def to_dict(cfg: ExperimentConfig) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(d: dict, source: str = "checkpoint") -> ExperimentConfig:
    return build_config(d, source=source)
