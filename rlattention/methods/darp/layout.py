"""What the three DARP methods share: the layout of a sketch-retrieval item and of a prediction, and the
retrieval metrics (``rlattention.metrics.sketch``) over a split's gallery of photos."""

from __future__ import annotations

import torch
from torch import Tensor

from rlattention.engine.method import AttentionMethod, DataInfo
from rlattention.metrics.sketch import gallery_from_pairs, sketch_retrieval_curves, sketch_retrieval_metrics

_SELECTABLE = ("auir", "acc@1", "acc@5", "acc@10", "percentile")


def split_layout(images: Tensor) -> tuple[Tensor, Tensor]:
    """``(B, S + 3, H, W)`` -> partial renders ``(B, S, H, W)`` and photos ``(B, 3, H, W)``."""
    if images.ndim != 4 or images.shape[1] < 4:
        raise ValueError(
            f"sketch-retrieval items must be (B, S + 3, H, W) with S >= 1 partial renders and an RGB photo, "
            f"got shape {tuple(images.shape)}"
        )
    return images[:, :-3], images[:, -3:]


def completion_steps(info: DataInfo) -> int:
    channels = info.image_shape[0]
    if channels < 4:
        raise ValueError(
            f"the sketch-retrieval methods need items of S + 3 channels (S partial renders + an RGB photo), got "
            f"{channels} channels: use a sketch-retrieval dataset (qmul_chairv2, omniglot_sketch)"
        )
    return channels - 3


class SketchRetrievalMethod(AttentionMethod):
    """Shared by the three methods: the prediction layout and the retrieval metrics."""

    task = "sketch_retrieval"  # items (S + 3, H, W), targets (N,) photo ids

    def _set_selection(self, select_on: str) -> None:
        if select_on not in _SELECTABLE:
            raise ValueError(f"model.select_on must be one of {', '.join(_SELECTABLE)}, got {select_on!r}")
        self.selection_metric = (select_on, "max")

    @staticmethod
    def pack(query_emb: Tensor, photo_emb: Tensor) -> Tensor:
        """``(B, S, D)`` sketch embeddings and ``(B, D)`` photo embeddings -> ``(B, S * D + D)``."""
        return torch.cat((query_emb.flatten(1), photo_emb), dim=1)

    def unpack(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        D = self.embed_dim
        B, n = scores.shape
        if n % D or n // D < 2:
            raise ValueError(f"predictions must be (B, S * {D} + {D}), got {tuple(scores.shape)}")
        return scores[:, :-D].reshape(B, -1, D), scores[:, -D:]

    def metrics(self, scores: Tensor, targets: Tensor) -> dict[str, float]:
        query, photo = self.unpack(scores)
        gallery, rows = gallery_from_pairs(photo, targets)
        out = sketch_retrieval_metrics(query, gallery, rows)
        return {**out, "count": float(len(targets)), "gallery": float(len(gallery))}

    def curves(self, scores: Tensor, targets: Tensor) -> dict[str, Tensor]:
        query, photo = self.unpack(scores)
        gallery, rows = gallery_from_pairs(photo, targets)
        return sketch_retrieval_curves(query, gallery, rows)
