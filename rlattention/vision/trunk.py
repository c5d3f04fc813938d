"""A registered backbone as a method's feature extractor: preprocessing, a frozen part and a trainable part.

What the methods' ``model.backbone`` / ``model.pretrained`` / ``model.freeze`` keys build::

    trunk = Trunk("efficientnet_lite0", pretrained=True, freeze="all", in_chans=1)
    fmap = trunk.feature_map(images)          # (B, C_in, H, W) in [0, 1] -> (B, trunk.out_features, h, w)

* Preprocessing: a 1-channel input is replicated to the backbone's 3 channels; pixels are normalised with the
  backbone's mean and std (Lite: ``(x - 127) / 128`` on 0..255). The input size is the caller's: every backbone
  here is fully convolutional (the published weights were trained at ``backbone_info(name).input_size``).
* ``level``: the feature level whose map is returned (default the last; ``backbone_info(name).feature_channels``).
* ``freeze``: ``"all"`` (nothing trains), ``"none"`` (everything trains) or an int N: the last N units (Lite: the
  stem, each block and the head are units) train, the others are frozen. Frozen units are always in eval mode
  (BatchNorm uses its running statistics) and get no gradient.
* ``pooled``: return the global average of the map ``(B, C)`` instead of the map; with ``freeze="all"`` the
  pooled vector is what the feature cache stores (small enough for every partial sketch of a dataset).
* ``grid``: ``{level: g}``: the maps of several levels, each average-pooled to a ``g x g`` grid, flattened and
  concatenated (a vector that keeps coarse layout; several levels need ``freeze="all"``).
* The frozen part's outputs can be cached (:meth:`Trunk.build_cache`, :mod:`rlattention.vision.feature_cache`):
  every later call reads them, by content, instead of running the frozen units.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlattention.vision.backbones import backbone_info, create_backbone
from rlattention.vision.feature_cache import FeatureCache


@torch.no_grad()
def fold_batchnorm(net: nn.Module) -> nn.Module:
    """An inference copy of ``net`` with every BatchNorm that follows a convolution folded into that convolution
    (``w' = w * gamma / sqrt(var + eps)``, ``b' = beta + (b - mean) * gamma / sqrt(var + eps)``) and replaced by
    an identity, in channels-last memory order: the same function in eval mode, 1.5-3x faster on the CPU.
    Networks without ``conv_bn_pairs()`` are copied as they are."""
    net = copy.deepcopy(net).eval()
    for parent, conv_name, bn_name in getattr(net, "conv_bn_pairs", list)():
        conv, bn = getattr(parent, conv_name), getattr(parent, bn_name)
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
        conv.weight = nn.Parameter(conv.weight * scale.view(-1, 1, 1, 1), requires_grad=False)
        conv.bias = nn.Parameter(bn.bias + (bias - bn.running_mean) * scale, requires_grad=False)
        setattr(parent, bn_name, nn.Identity())
    for p in net.parameters():
        p.requires_grad_(False)
    return net.to(memory_format=torch.channels_last)


def feature_cache_dir(setting: str) -> Path | None | bool:
    """A method's ``model.feature_cache`` value -> where the frozen features live: a folder; ``None`` (in memory,
    this run only, for ``memory``); ``False`` (no cache, for ``none``/``off``/``false``). ``auto``:
    ``$RLATTENTION_CACHE`` (``none`` there disables disk caching) or ``~/.cache/rlattention``."""
    text = str(setting).strip()
    low = text.lower()
    if low in ("none", "off", "false", "0", "no"):
        return False
    if low == "memory":
        return None
    if low in ("auto", ""):
        env = os.environ.get("RLATTENTION_CACHE")
        if env is not None:
            return None if env.strip().lower() in ("", "none", "off", "false", "0") else Path(env).expanduser()
        return Path("~/.cache/rlattention").expanduser()
    return Path(text).expanduser()


def parse_freeze(freeze: str | int, num_units: int) -> int:
    """``model.freeze`` -> the number of trainable units at the end of the network."""
    if isinstance(freeze, bool):
        raise ValueError(f"model.freeze must be 'all', 'none' or a number of last units to train, got {freeze!r}")
    if isinstance(freeze, str):
        if freeze == "all":
            return 0
        if freeze == "none":
            return num_units
        if not freeze.strip().isdigit():
            raise ValueError(f"model.freeze must be 'all', 'none' or a number of last units to train, got {freeze!r}")
        freeze = int(freeze)
    if not 0 <= int(freeze) <= num_units:
        raise ValueError(f"model.freeze={freeze}: the backbone has {num_units} units (stem, blocks, head)")
    return int(freeze)


class Trunk(nn.Module):
    def __init__(
        self,
        name: str,
        pretrained: bool | str = False,
        freeze: str | int = "none",
        in_chans: int = 3,
        level: int = -1,
        pooled: bool = False,
        cache_dtype: torch.dtype = torch.float16,
        grid: dict[int, int] | None = None,
        **kwargs,
    ) -> None:
        super().__init__()
        info = backbone_info(name)
        if in_chans not in (1, 3):
            raise ValueError(f"{name} takes 1-channel (replicated) or 3-channel images, got {in_chans} channels")
        n_levels = len(info.feature_channels)

        def check(lv: int) -> int:
            if not -n_levels <= lv < n_levels:
                raise ValueError(f"feature levels of {name} must be in 0..{n_levels - 1} (or -1: the last), got {lv}")
            return lv % n_levels

        level = check(level)
        self.grid = {check(int(k)): int(v) for k, v in (grid or {}).items()}
        if any(g < 1 for g in self.grid.values()):
            raise ValueError(f"grid sizes must be >= 1, got {grid}")
        if self.grid:
            level, pooled = max(self.grid), True
        self.name, self.info, self.in_chans, self.level, self.pooled = name, info, in_chans, level, pooled
        self.net = create_backbone(name, pretrained=pretrained, **{"num_classes": 0, **kwargs})
        if not hasattr(self.net, "forward_units"):
            raise ValueError(f"backbone {name} cannot be split into units (no forward_units)")
        self.num_units = self.net.level_units(level)
        self.trainable_units = parse_freeze(freeze, self.num_units)
        self.frozen_units = self.num_units - self.trainable_units
        for i in range(self.frozen_units):
            for m in self.net.unit_modules(i):
                for p in m.parameters():
                    p.requires_grad_(False)
        self.register_buffer("mean", torch.tensor(info.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(info.std).view(1, 3, 1, 1), persistent=False)
        if self.grid and self.trainable_units and len(self.grid) > 1:
            raise ValueError("pooling several feature levels needs model.freeze=all (their features are cached)")
        self.out_features = (
            sum(info.feature_channels[lv] * g * g for lv, g in sorted(self.grid.items()))
            if self.grid
            else info.feature_channels[level]
        )
        self.cache: FeatureCache | None = None
        self.cache_dtype = cache_dtype
        self._fused: tuple | None = None  # (weights version, BatchNorm-folded copy) for the frozen units
        self.train(True)  # puts the frozen units in eval mode

    def extra_repr(self) -> str:
        return (
            f"{self.name}, level={self.level}, units frozen/trainable={self.frozen_units}/"
            f"{self.trainable_units}, pooled={self.pooled}"
        )

    def train(self, mode: bool = True) -> Trunk:
        super().train(mode)
        for i in range(self.frozen_units):  # frozen units: running BatchNorm statistics, always
            for m in self.net.unit_modules(i):
                m.train(False)
        return self

    def preprocess(self, x: Tensor) -> Tensor:
        if x.shape[1] != self.in_chans:
            raise ValueError(f"{self.name} trunk expects {self.in_chans}-channel images, got {tuple(x.shape)}")
        if self.in_chans == 1:
            x = x.expand(-1, 3, -1, -1)
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def _frozen(self, x: Tensor) -> Tensor:
        """The frozen units on raw [0, 1] images (and the pooling, when nothing after them trains), run by a
        BatchNorm-folded channels-last copy made on first use (and again after the weights are reloaded)."""
        frozen = [m for i in range(self.frozen_units) for m in self.net.unit_modules(i)]
        digest = tuple(t._version for m in frozen for t in (*m.parameters(), *m.buffers()))
        if self._fused is None or self._fused[0] != digest or self._fused[1] is None:
            self._fused = (digest, fold_batchnorm(self.net))
        net = self._fused[1]
        if next(net.parameters()).device != x.device:
            net.to(x.device)
        with torch.no_grad():
            x = self.preprocess(x).contiguous(memory_format=torch.channels_last)
            if self.grid and self.trainable_units == 0:
                return self._grid_pool(net, x)
            h = net.forward_units(x, 0, self.frozen_units).contiguous()
            if self.pooled and self.trainable_units == 0:
                h = h.mean(dim=(-2, -1))
        return h

    def _grid_pool(self, net: nn.Module, x: Tensor) -> Tensor:
        """Every level of ``grid`` average-pooled to its ``g x g`` grid, flattened and concatenated (levels in
        order): ``(B, sum_l C_l g_l^2)``. A grid keeps where things are, which global pooling loses."""
        outs, start = [], 0
        for lv in sorted(self.grid):
            stop = self.net.level_units(lv)
            x = net.forward_units(x, start, stop)
            outs.append(F.adaptive_avg_pool2d(x, self.grid[lv]).flatten(1))
            start = stop
        return torch.cat(outs, dim=1)

    def feature_map(self, x: Tensor) -> Tensor:
        """``(B, in_chans, H, W)`` in [0, 1] -> ``(B, out_features, h, w)``, or ``(B, out_features)`` if pooled."""
        if self.frozen_units == 0:
            if self.grid:
                return self._grid_pool(self.net, self.preprocess(x))
            h = self.net.forward_units(self.preprocess(x), 0, self.num_units)
        else:
            h = self.cache(x) if self.cache is not None else self._frozen(x)
            if self.trainable_units:
                h = self.net.forward_units(h, self.frozen_units, self.num_units)
        if self.grid and h.ndim == 4:  # one level, its last units trained
            return F.adaptive_avg_pool2d(h, self.grid[self.level]).flatten(1)
        if self.pooled and h.ndim == 4:
            h = h.mean(dim=(-2, -1))
        return h

    forward = feature_map

    def build_cache(
        self,
        images: Tensor,
        cache_dir: str | os.PathLike | None,
        batch_size: int = 64,
        progress: bool = True,
        what: str = "features",
    ) -> FeatureCache | None:
        """Compute (or read from ``cache_dir``) the frozen part's outputs for every item of ``images`` (uint8
        ``(N, in_chans, H, W)``); later calls on those images read them. No-op when nothing is frozen."""
        if self.frozen_units == 0:
            return None
        if self.cache is None:
            describe = (
                f"{self.name}|in={self.in_chans}|units={self.frozen_units}|pooled="
                f"{self.pooled and self.trainable_units == 0}|mean={self.info.mean}|std={self.info.std}"
                f"|grid={sorted(self.grid.items())}"
            )
            frozen = nn.ModuleList(m for i in range(self.frozen_units) for m in self.net.unit_modules(i))
            self.cache = FeatureCache(self._frozen, frozen, describe, self.cache_dtype)
        return self.cache.build(images, cache_dir, batch_size, progress, what=what)


def cache_trunk_inputs(
    trunk: nn.Module, inputs: list[Tensor], setting: str, flips: bool = False, what: str = "features"
) -> None:
    """A method's ``on_fit_start`` helper: when ``trunk`` is a :class:`Trunk` with frozen units and
    ``setting`` (its ``model.feature_cache``) allows it, cache its frozen outputs for every image of ``inputs``
    (uint8 ``(N, C, H, W)`` tensors, e.g. the train / val / test images), and of their mirror images when
    training flips them. Float inputs are left uncached (nothing exact to key them by)."""
    if not isinstance(trunk, Trunk) or trunk.frozen_units == 0:
        return
    cache_dir = feature_cache_dir(setting)
    if cache_dir is False or not inputs or any(t.dtype != torch.uint8 for t in inputs):
        return
    images = torch.cat(inputs)
    if flips:
        images = torch.cat((images, images.flip(-1)))
    trunk.build_cache(images, cache_dir, what=what)


class StagedTrunk(Trunk):
    """A :class:`Trunk` exposed as five stages (the feature levels), for methods that insert modules between
    stages (self-critical attention): :meth:`stages` returns callables, the first of which preprocesses the
    raw [0, 1] images; ``stage_channels`` are the levels' channels. Frozen units are not cached here (what follows
    the first stage depends on trainable modules)."""

    def __init__(self, name: str, pretrained: bool | str = False, freeze: str | int = "none", in_chans: int = 3):
        super().__init__(name, pretrained, freeze, in_chans, level=-1)
        self.stage_channels = list(self.info.feature_channels)
        bounds = [0] + [self.net.level_units(i) for i in range(len(self.stage_channels))]
        self._bounds = list(zip(bounds[:-1], bounds[1:], strict=True))

    def _stage(self, i: int):
        start, stop = self._bounds[i]

        def run(x: Tensor) -> Tensor:
            if i == 0:
                x = self.preprocess(x)
            return self.net.forward_units(x, start, stop)

        return run

    def stages(self) -> list:
        return [self._stage(i) for i in range(len(self._bounds))]
