"""Multi-label recognition metrics: per-class AP, mAP, and the top-k precision / recall / F1 of eq. 11 of
the RARL paper (Chen et al., "Recurrent attentional reinforcement learning for multi-label image
recognition", AAAI 2018), following Gong et al. 2013 and Wang et al. 2016 (CNN-RNN).

Inputs everywhere:

* ``scores``: ``(N, K)`` real scores, one row per image, one column per class. The AP only depends on the
  ranking, so logits work; the top-k precision/recall compare scores with a probability threshold, so pass
  probabilities there (e.g. ``sigmoid(logits)``).
* ``targets``: ``(N, K)`` with values ``1`` (the class is present), ``0`` (absent) and ``-1`` (ignored for
  this image and class: in VOC, the class is present only as objects marked *difficult*). An ignored entry
  counts nowhere: it is neither a positive nor a negative of the AP, neither a prediction nor a ground truth
  of the precision/recall. Any other value is an error.

All results are fractions in ``[0, 1]``; multiply by 100 for the percentages of the papers' tables.
Computation runs on the inputs' device in float64 (ratios) / int64 (counts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "IGNORE",
    "average_precision",
    "mean_average_precision",
    "multilabel_metrics",
    "precision_recall_f1",
]

#: Target value of an (image, class) pair that the metrics ignore (VOC 'difficult'-only labels).
IGNORE = -1

ArrayLike = Tensor | np.ndarray | Sequence[Sequence[float]]


def _as_tensor(x: ArrayLike) -> Tensor:
    return x.detach() if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))


def _check(scores: ArrayLike, targets: ArrayLike) -> tuple[Tensor, Tensor]:
    """Validated ``(scores float64 (N, K), targets int64 (N, K))`` on the scores' device."""
    s, t = _as_tensor(scores), _as_tensor(targets)
    if s.ndim != 2 or t.shape != s.shape:
        raise ValueError(
            f"expected scores and targets of the same shape (N, K), got {tuple(s.shape)} and {tuple(t.shape)}"
        )
    s = s.to(torch.float64)
    if not bool(torch.isfinite(s).all()):
        raise ValueError("scores contain NaN or infinite values")
    t = t.to(device=s.device)
    if t.is_floating_point() and not bool((t == t.round()).all()):
        raise ValueError("targets must be 1 (present), 0 (absent) or -1 (ignored); found non-integer values")
    t = t.to(torch.int64)
    bad = (t != 1) & (t != 0) & (t != IGNORE)
    if bool(bad.any()):
        found = sorted(set(t[bad].unique().tolist()))
        raise ValueError(f"targets must be 1 (present), 0 (absent) or -1 (ignored); found {found}")
    return s, t


def average_precision(scores: ArrayLike, targets: ArrayLike, eleven_point: bool = False) -> Tensor:
    """Per-class average precision, ``(K,)`` float64; ``nan`` for a class without any positive.

    scores: ``(N, K)`` real scores (only the ranking within each class matters).
    targets: ``(N, K)`` in ``{1, 0, -1}``; ``-1`` entries are left out of that class's ranking.
    eleven_point: ``False`` (default): the non-interpolated AP, the area under the stepwise
        precision-recall curve, ``AP = sum_j (R_j - R_{j-1}) P_j`` over the distinct score thresholds ``j``
        (as scikit-learn and torchmetrics compute it). ``True``: the VOC2007 11-point interpolated AP,
        ``AP = 1/11 sum_{t in 0, 0.1, ..., 1} max_{R_j >= t} P_j`` (0 where no point reaches recall ``t``);
        the thresholds are exactly ``k / 10`` so that, e.g., a recall of 3/10 reaches ``t = 0.3``.

    Ties: images with equal scores in a class form one threshold, i.e. one point of the curve (they are
    all predicted positive together), so the result does not depend on the order of tied images. The VOC
    devkit instead walks its sort order one image at a time; without ties both agree.

    Vectorised: one sort of all columns at once, cumulative counts, and a batched ``searchsorted`` for the
    tie groups and the 11 recall levels; no loop over classes.
    """
    s, t = _check(scores, targets)
    n, k = s.shape
    if n == 0:
        return torch.full((k,), float("nan"), dtype=torch.float64, device=s.device)
    # Class-major (K, N) so that each row is one ranking; stable sort -> deterministic tie order.
    s_sorted, order = torch.sort(s.T.contiguous(), dim=1, descending=True, stable=True)
    t_sorted = torch.gather(t.T, 1, order)
    pos = (t_sorted == 1).to(torch.float64)
    neg = (t_sorted == 0).to(torch.float64)
    tp = pos.cumsum(1)
    fp = neg.cumsum(1)
    num_pos = tp[:, -1]  # (K,)
    # Last index of each rank's tie group: the ascending sequence -s_sorted, searched from the right.
    ascending = -s_sorted
    group_end = torch.searchsorted(ascending, ascending, right=True) - 1
    tp_end = torch.gather(tp, 1, group_end)
    fp_end = torch.gather(fp, 1, group_end)
    precision = tp_end / (tp_end + fp_end).clamp(min=1.0)  # precision at the threshold of each rank's group
    safe_pos = num_pos.clamp(min=1.0).unsqueeze(1)
    if not eleven_point:
        # Each positive adds 1/P recall at the precision of its tie group's threshold.
        ap = (pos * precision).sum(1) / safe_pos.squeeze(1)
    else:
        recall = tp_end / safe_pos  # non-decreasing along the ranking
        # Interpolated precision at rank i: the best precision at rank i or later (reverse cumulative max).
        best_after = precision.flip(1).cummax(1).values.flip(1)
        levels = torch.arange(11, dtype=torch.float64, device=s.device) / 10
        first = torch.searchsorted(recall.contiguous(), levels.expand(k, 11).contiguous(), right=False)
        reached = first < n
        interp = torch.gather(best_after, 1, first.clamp(max=n - 1)) * reached
        ap = interp.mean(1)
    return torch.where(num_pos > 0, ap, torch.full_like(ap, float("nan")))


def mean_average_precision(scores: ArrayLike, targets: ArrayLike, eleven_point: bool = False) -> float:
    """mAP: the mean of :func:`average_precision` over the classes with at least one positive
    (``nan`` if no class has one)."""
    ap = average_precision(scores, targets, eleven_point=eleven_point)
    valid = ~torch.isnan(ap)
    return float(ap[valid].mean()) if bool(valid.any()) else float("nan")


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` with ``0 / 0 := 0`` (float64)."""
    num, den = num.to(torch.float64), den.to(torch.float64)
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.zeros_like(num))


def _f1(p: Tensor, r: Tensor) -> Tensor:
    return _ratio(2 * p * r, p + r)


def predicted_labels(scores: ArrayLike, top_k: int | None = 3, threshold: float | None = 0.1) -> Tensor:
    """The labels assigned to each image: ``(N, K)`` bool.

    A label is assigned when it is among the ``top_k`` highest scores of its image (ties broken towards the
    lower class index) *and* its score is ``>= threshold``, so an image may get fewer than ``top_k``
    labels. ``top_k=None`` drops the top-k rule, ``threshold=None`` the threshold.
    """
    s = _as_tensor(scores).to(torch.float64)
    if s.ndim != 2:
        raise ValueError(f"expected scores (N, K), got shape {tuple(s.shape)}")
    chosen = torch.ones_like(s, dtype=torch.bool)
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        # A stable descending sort keeps equal scores in class order, so the lower class index wins a tie.
        order = torch.sort(s, dim=1, descending=True, stable=True).indices[:, : min(top_k, s.shape[1])]
        in_top = torch.zeros_like(chosen)
        chosen = in_top.scatter_(1, order, True)
    if threshold is not None:
        chosen = chosen & (s >= threshold)
    return chosen


def precision_recall_f1(
    scores: ArrayLike,
    targets: ArrayLike,
    top_k: int | None = 3,
    threshold: float | None = 0.1,
) -> dict[str, float]:
    """Overall and per-class precision, recall and F1 of the top-k labels (eq. 11 of the RARL paper).

    scores: ``(N, K)`` probabilities (the threshold is a probability).
    targets: ``(N, K)`` in ``{1, 0, -1}``.
    top_k, threshold: each image gets the labels of :func:`predicted_labels` (by default its top 3 labels
        whose probability is ``>= 0.1``, as in the paper's COCO protocol: "we select the top 3 labels for
        each image ... filter out the labels with probabilities lower than a pre-defined threshold (0.1)").

    With, per class ``i``, ``N_i^c`` correctly predicted images, ``N_i^p`` predicted images and ``N_i^g``
    ground-truth images (ignored ``-1`` entries are left out of all three; the top-k choice itself is made
    over all ``K`` scores, and an ignored label chosen there is simply not counted):

    * ``OP = sum N^c / sum N^p``, ``OR = sum N^c / sum N^g``, ``OF1 = 2 OP OR / (OP + OR)``;
    * ``CP = 1/C sum_i N_i^c / N_i^p``, ``CR = 1/C sum_i N_i^c / N_i^g``, ``CF1 = 2 CP CR / (CP + CR)``.

    ``CF1`` is the harmonic mean of ``CP`` and ``CR``, not the mean of the per-class F1 scores. A ratio
    ``0 / 0`` counts as 0 (so a class that is never predicted has precision 0, and, on a subset where a class
    has no ground truth, its recall is 0), and the class means run over all ``C = K`` classes, as in eq. 11.

    Returns ``{"CP", "CR", "CF1", "OP", "OR", "OF1"}`` as floats in ``[0, 1]``.
    """
    s, t = _check(scores, targets)
    pred = predicted_labels(s, top_k=top_k, threshold=threshold)
    counted = t != IGNORE
    gt = t == 1
    n_c = (pred & gt).sum(0)  # (K,) correctly predicted images per class
    n_p = (pred & counted).sum(0)  # predicted images per class
    n_g = gt.sum(0)  # ground-truth images per class
    op, orec = _ratio(n_c.sum(), n_p.sum()), _ratio(n_c.sum(), n_g.sum())
    k = s.shape[1]
    cp = _ratio(n_c, n_p).sum() / k if k else torch.zeros((), dtype=torch.float64)
    cr = _ratio(n_c, n_g).sum() / k if k else torch.zeros((), dtype=torch.float64)
    return {
        "CP": float(cp),
        "CR": float(cr),
        "CF1": float(_f1(cp, cr)),
        "OP": float(op),
        "OR": float(orec),
        "OF1": float(_f1(op, orec)),
    }


def multilabel_metrics(
    scores: ArrayLike,
    targets: ArrayLike,
    top_k: int | None = 3,
    threshold: float | None = 0.1,
    eleven_point: bool = False,
) -> dict[str, float]:
    """All multi-label metrics of the RARL paper at once.

    scores: ``(N, K)`` probabilities; targets: ``(N, K)`` in ``{1, 0, -1}`` (see the module docstring).
    Returns ``{"mAP", "CP", "CR", "CF1", "OP", "OR", "OF1", "count"}``: :func:`mean_average_precision`
    (``eleven_point`` selects the VOC2007 11-point AP), :func:`precision_recall_f1` with ``top_k`` and
    ``threshold``, and the number of images. The metrics are in percent (0-100, as the paper prints them; the
    functions they come from return fractions).
    """
    s, t = _check(scores, targets)
    out = {"mAP": mean_average_precision(s, t, eleven_point=eleven_point)}
    out.update(precision_recall_f1(s, t, top_k=top_k, threshold=threshold))
    out = {k: 100.0 * v for k, v in out.items()}
    out["count"] = float(len(s))
    return out
