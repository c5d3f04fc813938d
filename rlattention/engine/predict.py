"""Predicting on ordinary images with a trained model: the images checked and converted as the engine converts its
own data (:func:`prepare_images`), mean actions, and the attention used (:func:`predict`, :class:`Prediction`).
Below the methods, so that :meth:`AttentionMethod.predict_images
<rlattention.engine.method.AttentionMethod.predict_images>` needs nothing above the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from rlattention.engine.config import EvalConfig, ExperimentConfig
from rlattention.engine.datainfo import DataInfo
from rlattention.engine.pretrained import _check_model

if TYPE_CHECKING:
    from rlattention.engine.method import AttentionMethod


@dataclass(frozen=True)
class Prediction:
    """What :func:`predict` returns for N images (tensors on the model's device).

    scores: the model's :meth:`~rlattention.engine.method.AttentionMethod.predict` output with mean actions:
        class probabilities ``(N, K)`` (ram, cnn, unified; ``(N, J, K)`` for unified's sequences), label
        probabilities ``(N, K)`` (rarl), embeddings ``(N, D)`` (scal), or sketch embeddings after each completion
        step followed by the photo embedding ``(N, S * D + D)`` (darp, darp_triplet, darp_policy).
    labels: ``scores.argmax(-1)`` for classifiers; ``(N, K)`` bool for rarl (a label is predicted when it is among
        the top 3 with probability >= 0.1, the rule of the multi-label metrics); None for the retrieval models,
        whose scores are embeddings to compare.
    attention: what the model attended to in the pass that gave ``scores`` (keys per method, see docs/api.md):
        coordinates are (x, y) in [-1, 1], (-1, -1) the top-left corner of the image, boxes (x0, y0, x1, y1).
    """

    scores: Tensor
    labels: Tensor | None
    attention: dict[str, Tensor]


def _device(model: AttentionMethod) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def prepare_images(model: AttentionMethod, images: Any) -> Tensor:
    """``images`` as the float ``(N, C, H, W)`` batch in [0, 1] that ``model`` takes (on its device), checked
    against the image shape ``(C, H, W)`` it was trained on (``model.data_info``).

    Accepted: uint8 arrays or tensors (numpy, torch, or anything ``np.asarray`` reads, e.g. a PIL image),
    channels-last as images are stored: ``(H, W)``, ``(H, W, C)``, ``(N, H, W)`` (one channel) or
    ``(N, H, W, C)``, and the engine's own ``(N, C, H, W)`` uint8 batches; divided by 255. Floating-point tensors
    or arrays in [0, 1], channels-first: ``(C, H, W)`` or ``(N, C, H, W)``. A 3-D uint8 array is ``(H, W, C)``
    when its last side is C (or 1, 3, 4), else ``(N, H, W)``.

    One-line :class:`ValueError` for another dtype, floats outside [0, 1] or NaN, another rank, another channel
    count, another height and width (nothing is resized: resize the images to the training size first), or no
    images.
    """
    _check_model(model)
    info = getattr(model, "data_info", None)
    if not isinstance(info, DataInfo):
        raise ValueError(
            "the model carries no data_info (the image shape it was trained on): load it with rlattention.load_model "
            "or build it with rlattention.create_model"
        )
    C, H, W = info.image_shape
    if not isinstance(images, Tensor | np.ndarray):
        try:
            images = np.asarray(images)
        except Exception as e:
            raise ValueError(f"images: cannot read a {type(images).__name__} as an array ({e})") from None
    if isinstance(images, np.ndarray):
        if images.dtype != np.uint8 and not np.issubdtype(images.dtype, np.floating):
            raise ValueError(f"images: dtype {images.dtype}; expected uint8 (0-255) or floating point in [0, 1]")
        images = torch.from_numpy(np.ascontiguousarray(images))
    x = images.detach()
    if x.dtype == torch.uint8:
        x, layout = _uint8_layout(x, C)
        x = x.float().div(255.0)  # as the engine converts its uint8 data
    elif x.is_floating_point():
        if x.ndim not in (3, 4):
            raise ValueError(
                f"images: a float array of shape {tuple(x.shape)}; expected (C, H, W) or (N, C, H, W) "
                "(float images are channels-first; uint8 ones may be (H, W[, C]))"
            )
        layout = "(C, H, W)" if x.ndim == 3 else "(N, C, H, W)"
        x = (x[None] if x.ndim == 3 else x).float()
        if bool(torch.isnan(x).any()):
            raise ValueError(f"images: {int(torch.isnan(x).sum())} NaN value(s); expected floats in [0, 1]")
        lo, hi = float(x.min()) if x.numel() else 0.0, float(x.max()) if x.numel() else 0.0
        if lo < 0.0 or hi > 1.0:
            raise ValueError(
                f"images: float values in [{lo:g}, {hi:g}]; expected [0, 1] (divide 0-255 images by 255, or pass "
                "them as uint8)"
            )
    else:
        raise ValueError(f"images: dtype {x.dtype}; expected uint8 (0-255) or floating point in [0, 1]")
    if x.shape[0] == 0:
        raise ValueError(f"images: an empty batch of shape {tuple(images.shape)}")
    if x.shape[1] != C:
        raise ValueError(
            f"images: {x.shape[1]} channel(s) (shape {tuple(images.shape)} read as {layout}); the {model.name} model "
            f"takes {C} channel(s) ({C} x {H} x {W} images)"
        )
    if tuple(x.shape[-2:]) != (H, W):
        raise ValueError(
            f"images: {x.shape[-2]} x {x.shape[-1]} pixels (H x W); the {model.name} model takes {H} x {W}, the size "
            "it was trained on: resize them first (nothing is resized silently)"
        )
    return x.to(_device(model)).contiguous()


def _uint8_layout(x: Tensor, C: int) -> tuple[Tensor, str]:
    """A uint8 ``(H, W)``, ``(H, W, C)``, ``(N, H, W)``, ``(N, H, W, C)`` or ``(N, C, H, W)`` array -> ``(N, C, H, W)``
    and the layout it was read as."""
    small = (1, 3, 4)  # channel counts of ordinary images
    s = tuple(x.shape)
    if x.ndim == 2:
        return x[None, None], "(H, W)"
    if x.ndim == 3:
        if s[-1] == C or s[-1] in small:
            return x.permute(2, 0, 1)[None], "(H, W, C)"
        return x[:, None], "(N, H, W)"
    if x.ndim == 4:
        if s[-1] == C or (s[1] != C and s[1] not in small):
            return x.permute(0, 3, 1, 2), "(N, H, W, C)"
        return x, "(N, C, H, W)"
    raise ValueError(
        f"images: a uint8 array of shape {s}; expected (H, W), (H, W, C), (N, H, W) or (N, H, W, C) "
        "(float images: (C, H, W) or (N, C, H, W))"
    )


def predict(model: AttentionMethod, images: Any, seed: int | None = None) -> Prediction:
    """Predict ``images`` (see :func:`prepare_images` for what is accepted) with mean actions, in eval mode (the
    model's mode is restored afterwards): the scores the engine evaluates and the attention of the same pass.

    seed: of the generator the model draws from (e.g. RAM's random first glimpse); default the config's
        ``eval.seed``, so that repeated calls, and a reloaded model, give identical outputs.

    Also ``model.predict_images(images)``. (``model.predict(x)`` stays the engine's call on ready float batches.)
    dcpg is not covered: its items are region features matched with captions, not images.
    """
    _check_model(model)
    if model.task == "image_text":
        raise ValueError(
            f"predict takes images; the {model.name} model matches region features with captions: call "
            "model.predict_batch(features, targets) for embeddings and model.attention(features, targets) for the "
            "region and word attention"
        )
    x = prepare_images(model, images)
    cfg = getattr(model, "config", None)
    if seed is None:
        seed = cfg.eval.seed if isinstance(cfg, ExperimentConfig) else EvalConfig().seed
    generator = torch.Generator(device=x.device).manual_seed(int(seed))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            scores, attention = model.predict_with_attention(x, generator)
    finally:
        model.train(was_training)
    return Prediction(scores, _labels(model, scores), dict(attention))


def _labels(model: AttentionMethod, scores: Tensor) -> Tensor | None:
    if model.task == "classification":
        return scores.argmax(-1)
    if model.task == "multilabel":
        from rlattention.metrics.multilabel import predicted_labels

        return predicted_labels(scores).to(scores.device)
    return None
