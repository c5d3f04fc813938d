"""The interface between a method (``rlattention.methods.*``) and the generic engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from rlattention.engine.datainfo import DataInfo, plain_data  # noqa: F401  (their home before datainfo.py)
from rlattention.engine.loader import unit_float
from rlattention.metrics.classification import classification_metrics


@dataclass
class StepOutput:
    """What a training forward pass returns.

    loss: the scalar that is back-propagated. terms: its weighted parts (logged, checked for NaN).
    stats: other scalars worth logging (reward, accuracy, sigma...). All are tensors; the engine decides
    when to turn them into floats, so the hot path never synchronises.
    """

    loss: Tensor
    terms: dict[str, Tensor] = field(default_factory=dict)
    stats: dict[str, Tensor] = field(default_factory=dict)


class AttentionMethod(nn.Module):
    """Base class of every method. Subclasses set ``Config`` and implement the four methods below.

    ``forward(images, targets)`` is the training step (so DDP and precision wrappers see it);
    ``predict`` is evaluation: deterministic (mean actions) unless ``mc_samples > 0``.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = object
    #: the validation metric used for model selection and whether larger is better
    selection_metric: ClassVar[tuple[str, str]] = ("accuracy", "max")
    #: what targets look like: "classification" (N,) class ids | "multilabel" (N, K) in {1, 0, -1} |
    #: "sketch_retrieval" (N,) photo ids of (S + 3)-channel sketch/photo items | "image_text" (C, 1 + L) image
    #: id + caption tokens of (1, R, F) region-feature items | "reid" (N, 3) [identity, camera, role] with role
    #: 0 train, 1 query, 2 gallery
    task: ClassVar[str] = "classification"
    #: inductor options used when ``trainer.compile`` runs on the CPU: work-arounds for inductor bugs a method's
    #: graph triggers (see :class:`rlattention.methods.dcpg.DCPG`)
    cpu_compile_options: ClassVar[dict[str, Any]] = {}
    #: why the method draws no figures (``rlattention viz`` prints it in one line), None when it draws some
    no_figures: ClassVar[str | None] = None

    @classmethod
    def from_config(cls, cfg: Any, info: DataInfo) -> AttentionMethod:
        raise NotImplementedError(f"{cls.__name__} must implement from_config")

    @classmethod
    def from_checkpoint(cls, cfg: Any, info: DataInfo, state: dict[str, Any]) -> AttentionMethod:
        """The model that a checkpoint's weights ``state`` (its ``model`` entry) are about to be loaded into.
        The default is :meth:`from_config`; a method whose construction reads an external artifact (darp's
        phase-1 file) rebuilds it from ``state`` instead, so a checkpoint stays usable when that file has
        moved or been overwritten."""
        return cls.from_config(cfg, info)

    @classmethod
    def data_info_from_state(cls, info: DataInfo, state: dict[str, Any]) -> DataInfo:
        """The :class:`DataInfo` to rebuild a checkpoint's model with when the checkpoint records only the image
        shape and the class count (``info``, with an empty ``meta``) and no data is at hand
        (:func:`rlattention.load_model`). The default is ``info``; a method whose construction reads
        ``DataInfo.meta`` fills what it needs from the weights ``state`` (e.g. dcpg's vocabulary size)."""
        return info

    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} must implement forward (the training step)")

    def predict(self, images: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement predict")  # pragma: no cover

    def predict_with_attention(
        self, images: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``(scores, attention)``: what :meth:`predict` returns with mean actions (``mc_samples=0``) and the
        attention that produced those scores, from the same forward pass (read by :func:`rlattention.predict`).
        The default has no attention (``{}``); a method with attention overrides it and documents its keys."""
        return self.predict(images, generator=generator), {}

    def predict_images(self, images: Any, seed: int | None = None) -> Any:
        """:func:`rlattention.predict` of this model: uint8 ``(H, W[, C])`` arrays or float tensors in [0, 1] ->
        a :class:`~rlattention.engine.predict.Prediction` (scores, labels, attention). Not named ``predict``: the
        engine calls :meth:`predict` with model-ready float batches."""
        from rlattention.engine.predict import predict

        return predict(self, images, seed=seed)

    def save_pretrained(self, folder: str | Path, overwrite: bool = False) -> Path:
        """:func:`rlattention.save_pretrained` of this model: ``folder/config.yaml`` and ``folder/model.safetensors``,
        which :func:`rlattention.load_model` reads back."""
        from rlattention.engine.pretrained import save_pretrained

        return save_pretrained(self, folder, overwrite=overwrite)

    def predict_batch(
        self, images: Tensor, targets: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None
    ) -> Tensor:
        """What evaluation calls: :meth:`predict` unless a method's inputs live partly in the targets (e.g.
        image-text matching, where the captions are the targets of the image items)."""
        return self.predict(images, mc_samples=mc_samples, generator=generator)

    def attack_logits(self, images: Tensor, seed: int = 0) -> Tensor:
        """Differentiable deterministic logits ``(B, K)`` for gradient-based attacks (mean actions)."""
        raise NotImplementedError(f"{type(self).__name__} does not support gradient attacks")

    def lr_scales(self) -> dict[str, float]:
        """Learning-rate multipliers the method's own config asks for: parameter-name prefix -> factor, applied
        as ``optim.lr_scale`` is (which overrides them prefix by prefix). None by default."""
        return {}

    def set_progress(self, progress: float) -> None:
        """Called before every training step with the fraction of training done, in [0, 1]."""

    def on_fit_start(self, splits: Any) -> None:
        """Called once by ``fit`` after the model is built, before training, with the run's ``DataSplits``
        (e.g. to note which gallery items belong to the training split). Not called when a checkpoint is only
        evaluated, so whatever it computes must live in buffers that the checkpoint carries."""

    def export(self, splits: Any, run_dir: Path) -> list[Path]:
        """Called by ``fit`` on rank 0 after training, with the selected (best) weights loaded: write the
        method's artifacts (e.g. embeddings another method reads) into ``run_dir``; return their paths."""
        return []

    def metrics(self, scores: Tensor, targets: Tensor) -> dict[str, float]:
        """Evaluation metrics from all predictions of a split (default: classification)."""
        return classification_metrics(scores, targets)

    def visualize(self, images: Tensor, targets: Tensor, out_dir: Path, generator: torch.Generator | None = None):
        """Write figures for ``images`` into ``out_dir``; return the paths written. A model that cannot draw
        (e.g. no attention weights in its configuration) raises ``NotImplementedError`` saying why: ``fit`` then
        writes no figures, ``rlattention viz`` prints that reason in one line."""
        raise NotImplementedError(
            self.visualization_unavailable() or f"{type(self).__name__} has no visualisation"
        )  # pragma: no cover

    @classmethod
    def visualization_unavailable(cls) -> str | None:
        """Why this method draws no figures at all, or None when it draws some: :attr:`no_figures`, else a reason
        when it overrides neither :meth:`visualize` nor :meth:`visualize_split`. ``rlattention viz`` checks it
        before building the data."""
        if cls.no_figures:
            return cls.no_figures
        if cls.visualize is AttentionMethod.visualize and cls.visualize_split is AttentionMethod.visualize_split:
            return f"{cls.__name__} implements neither visualize nor visualize_split"
        return None

    def visualize_split(
        self,
        dataset: Any,
        out_dir: Path,
        num_images: int,
        batch_size: int = 256,
        generator: torch.Generator | None = None,
    ) -> list[Path]:
        """Figures for an evaluation split (what ``fit`` and ``rlattention viz`` call): by default
        :meth:`visualize` on its first ``num_images`` items. Methods whose figures need the whole split (a
        ranked gallery) override this."""
        n = min(num_images, len(dataset))
        device = next(self.parameters()).device
        images, targets = dataset.images[:n].to(device), dataset.targets[:n].to(device)
        return self.visualize(unit_float(images), targets, out_dir, generator=generator)
