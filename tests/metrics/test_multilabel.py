"""Multi-label metrics: AP / mAP (plain and VOC07 11-point) and the top-3 CP/CR/CF1/OP/OR/OF1 of eq. 11,
checked on hand-computed cases, against slow obvious references, and against torchmetrics where it computes
the same quantity."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torchmetrics.classification import (
    MultilabelAveragePrecision,
    MultilabelF1Score,
    MultilabelPrecision,
    MultilabelRecall,
)

from rlattention.metrics.multilabel import (
    average_precision,
    mean_average_precision,
    multilabel_metrics,
    precision_recall_f1,
    predicted_labels,
)

# ------------------------------------------------------------------------------------------- slow references


def reference_ap(scores: list[float], targets: list[int], eleven_point: bool = False) -> float:
    """One class, the obvious way: drop ignored entries, sort, walk the ranking one image at a time (the VOC
    devkit's VOCevalcls.m walk). Only valid without ties."""
    pairs = sorted(((s, t) for s, t in zip(scores, targets, strict=True) if t != -1), key=lambda p: -p[0])
    num_pos = sum(t == 1 for _, t in pairs)
    if num_pos == 0:
        return math.nan
    tp = fp = 0
    precisions, recalls = [], []
    for _, t in pairs:
        tp += t == 1
        fp += t == 0
        precisions.append(tp / (tp + fp))
        recalls.append(tp / num_pos)
    if not eleven_point:
        total, prev_recall = 0.0, 0.0
        for p, r in zip(precisions, recalls, strict=True):
            total += (r - prev_recall) * p
            prev_recall = r
        return total
    total = 0.0
    for level in range(11):
        reached = [p for p, r in zip(precisions, recalls, strict=True) if r >= level / 10]
        total += max(reached) if reached else 0.0
    return total / 11


def reference_counts(pred: list[list[bool]], targets: list[list[int]]) -> tuple[list[int], list[int], list[int]]:
    """Per class: (N^c, N^p, N^g), counted image by image, ignored (-1) entries skipped."""
    k = len(targets[0])
    n_c, n_p, n_g = [0] * k, [0] * k, [0] * k
    for row_pred, row_t in zip(pred, targets, strict=True):
        for i in range(k):
            if row_t[i] == -1:
                continue
            n_p[i] += row_pred[i]
            n_g[i] += row_t[i] == 1
            n_c[i] += row_pred[i] and row_t[i] == 1
    return n_c, n_p, n_g


def random_case(n: int, k: int, seed: int, ties: bool = False, ignored: bool = True) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(n, k, generator=g)
    if ties:
        scores = (scores * 5).round() / 5  # few distinct values -> many ties
    targets = (torch.rand(n, k, generator=g) < 0.3).long()
    if ignored:
        targets[torch.rand(n, k, generator=g) < 0.1] = -1
    return scores, targets


# ------------------------------------------------------------------------------------------- AP, hand-computed


def test_ap_hand_computed():
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5]).view(-1, 1)
    targets = torch.tensor([1, 0, 1, 0, 1]).view(-1, 1)
    # precision at each positive: 1/1, 2/3, 3/5
    assert average_precision(scores, targets).item() == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)


def test_ap_ties_form_one_threshold_and_do_not_depend_on_order():
    # groups: {0.9}: 0 tp, 1 fp; {0.5, 0.5}: 1 tp, 2 fp -> P = 1/3; {0.1}: 2 tp, 2 fp -> P = 1/2
    scores = torch.tensor([[0.9], [0.5], [0.5], [0.1]])
    expected = (1 / 3 + 1 / 2) / 2
    for targets in ([0, 1, 0, 1], [0, 0, 1, 1]):  # the tied positive first or second
        t = torch.tensor(targets).view(-1, 1)
        assert average_precision(scores, t).item() == pytest.approx(expected)


def test_ap_all_tied_is_the_positive_rate():
    scores = torch.full((5, 1), 0.3)
    targets = torch.tensor([[1], [0], [0], [1], [0]])
    assert average_precision(scores, targets).item() == pytest.approx(2 / 5)
    assert average_precision(scores, targets, eleven_point=True).item() == pytest.approx(2 / 5)


def test_class_without_positive_is_nan_and_left_out_of_map():
    scores = torch.tensor([[0.9, 0.2, 0.4], [0.1, 0.8, 0.3], [0.5, 0.3, 0.9]])
    targets = torch.tensor([[1, 0, 0], [0, 1, -1], [0, 0, 0]])  # class 2: no positive (one ignored)
    ap = average_precision(scores, targets)
    assert ap[:2].tolist() == pytest.approx([1.0, 1.0])
    assert math.isnan(ap[2].item())
    assert mean_average_precision(scores, targets) == pytest.approx(1.0)
    assert math.isnan(mean_average_precision(scores[:, 2:], targets[:, 2:]))


def test_ignored_entries_are_removed_from_the_ranking():
    scores = torch.tensor([[0.9], [0.8], [0.7], [0.6]])
    targets = torch.tensor([[-1], [1], [0], [1]])
    # without the ignored top image: [1, 0, 1] -> (1 + 2/3) / 2
    assert average_precision(scores, targets).item() == pytest.approx((1 + 2 / 3) / 2)
    # an ignored *negative-looking* score changes nothing either
    targets2 = torch.tensor([[1], [-1], [0], [1]])
    assert average_precision(scores, targets2).item() == pytest.approx((1 + 2 / 3) / 2)


def test_eleven_point_hand_computed():
    # ranking [1, 0, 1, 0, 0, 1], 3 positives: points (R, P) = (1/3, 1), (1/3, 1/2), (2/3, 2/3), (2/3, 1/2),
    # (2/3, 2/5), (1, 1/2). Levels 0..0.3 -> 1; 0.4..0.6 -> 2/3; 0.7..1.0 -> 1/2.
    scores = torch.linspace(1, 0.1, 6).view(-1, 1)
    targets = torch.tensor([1, 0, 1, 0, 0, 1]).view(-1, 1)
    assert average_precision(scores, targets, eleven_point=True).item() == pytest.approx(8 / 11)
    assert average_precision(scores, targets).item() == pytest.approx((1 + 2 / 3 + 1 / 2) / 3)


def test_eleven_point_levels_are_exact_tenths():
    # 3 positives, 1 negative, 7 positives: recall is exactly 3/10 at precision 1. With levels built by
    # repeated addition (0.1 + 0.1 + 0.1 = 0.30000000000000004) that point would be missed.
    targets = torch.tensor([1, 1, 1, 0] + [1] * 7).view(-1, 1)
    scores = torch.linspace(1, 0, 11).view(-1, 1)
    assert average_precision(scores, targets, eleven_point=True).item() == pytest.approx((4 + 7 * 10 / 11) / 11)


def test_ap_matches_slow_reference_without_ties():
    scores, targets = random_case(60, 7, seed=1)
    for eleven in (False, True):
        ours = average_precision(scores, targets, eleven_point=eleven)
        for c in range(7):
            ref = reference_ap(scores[:, c].tolist(), targets[:, c].tolist(), eleven_point=eleven)
            assert ours[c].item() == pytest.approx(ref, abs=1e-12)


def test_ap_matches_torchmetrics_with_ties_and_ignored_entries():
    for seed, ties in ((2, False), (3, True)):
        scores, targets = random_case(80, 6, seed=seed, ties=ties)
        targets[:, 5] = torch.where(targets[:, 5] == 1, torch.zeros_like(targets[:, 5]), targets[:, 5])
        ours = average_precision(scores, targets)
        metric = MultilabelAveragePrecision(num_labels=6, average=None, ignore_index=-1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torchmetrics warns about the class without positives
            theirs = metric(scores, targets).double()
        # torchmetrics returns 0 (not nan) for a class without positives; we return nan and leave it out of mAP
        assert math.isnan(ours[5].item())
        torch.testing.assert_close(ours[:5], theirs[:5], atol=1e-6, rtol=0)
        assert mean_average_precision(scores, targets) == pytest.approx(theirs[:5].mean().item(), abs=1e-6)


def test_ap_is_vectorised_over_classes_consistently():
    scores, targets = random_case(50, 5, seed=4, ties=True)
    full = average_precision(scores, targets, eleven_point=True)
    for c in range(5):
        single = average_precision(scores[:, c : c + 1], targets[:, c : c + 1], eleven_point=True)
        assert single.item() == pytest.approx(full[c].item())


# ---------------------------------------------------------------------------------- top-3 precision / recall


HAND_SCORES = torch.tensor(
    [
        [0.90, 0.80, 0.05, 0.70],  # top 3: classes 0, 1, 3
        [0.20, 0.30, 0.40, 0.50],  # top 3: classes 3, 2, 1
        [0.05, 0.01, 0.02, 0.50],  # top 3: 3, 0, 2; only class 3 is >= 0.1
    ]
)
HAND_TARGETS = torch.tensor([[1, 0, 0, 1], [0, 1, 1, 0], [1, 0, 0, 0]])


def test_predicted_labels_top3_and_threshold():
    pred = predicted_labels(HAND_SCORES)
    expected = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(pred, expected)
    # ties: the lower class index wins; the threshold is inclusive
    tied = predicted_labels(torch.full((1, 5), 0.1))
    assert tied.tolist() == [[True, True, True, False, False]]
    assert predicted_labels(HAND_SCORES, top_k=None, threshold=0.5).sum().item() == 5
    assert predicted_labels(HAND_SCORES, top_k=1, threshold=None).sum(1).tolist() == [1, 1, 1]


def test_precision_recall_f1_hand_computed():
    # per class (N^c, N^p, N^g): (1, 1, 2), (1, 2, 1), (1, 1, 1), (1, 3, 1)
    out = precision_recall_f1(HAND_SCORES, HAND_TARGETS)
    assert out["OP"] == pytest.approx(4 / 7)
    assert out["OR"] == pytest.approx(4 / 5)
    assert out["OF1"] == pytest.approx(2 / 3)
    assert out["CP"] == pytest.approx((1 + 1 / 2 + 1 + 1 / 3) / 4)
    assert out["CR"] == pytest.approx((1 / 2 + 1 + 1 + 1) / 4)
    assert out["CF1"] == pytest.approx(119 / 152)  # 2 CP CR / (CP + CR), eq. 11
    mean_of_f1 = (2 / 3 + 2 / 3 + 1 + 1 / 2) / 4
    assert abs(out["CF1"] - mean_of_f1) > 0.05  # not the mean of per-class F1


def test_precision_recall_ignored_and_never_predicted_classes():
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.0], [0.9, 0.8, 0.7, 0.0]])
    targets = torch.tensor([[1, -1, 0, 1], [1, 1, -1, 0]])
    out = precision_recall_f1(scores, targets)
    # class 0: Nc=2, Np=2, Ng=2; class 1: Nc=1, Np=1 (image 0 ignored), Ng=1; class 2: Nc=0, Np=1, Ng=0;
    # class 3: never predicted, Nc=0, Np=0 (-> precision 0), Ng=1
    assert out["OP"] == pytest.approx(3 / 4)
    assert out["OR"] == pytest.approx(3 / 4)
    assert out["CP"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    assert out["CR"] == pytest.approx((1 + 1 + 0 + 0) / 4)


def test_precision_recall_match_slow_reference_and_torchmetrics():
    for seed in (5, 6):
        scores, targets = random_case(70, 9, seed=seed, ties=seed == 6)
        out = precision_recall_f1(scores, targets, top_k=3, threshold=0.3)
        pred = predicted_labels(scores, top_k=3, threshold=0.3)
        n_c, n_p, n_g = reference_counts(pred.tolist(), targets.tolist())
        k = len(n_c)
        cp = sum(c / p if p else 0.0 for c, p in zip(n_c, n_p, strict=True)) / k
        cr = sum(c / g if g else 0.0 for c, g in zip(n_c, n_g, strict=True)) / k
        assert out["CP"] == pytest.approx(cp)
        assert out["CR"] == pytest.approx(cr)
        assert out["OP"] == pytest.approx(sum(n_c) / sum(n_p))
        assert out["OR"] == pytest.approx(sum(n_c) / sum(n_g))
        assert out["CF1"] == pytest.approx(2 * cp * cr / (cp + cr))

        # torchmetrics has no multilabel top-k, so it gets our 0/1 top-3 decisions with threshold 0.5. Then its
        # macro precision/recall are CP/CR (zero_division=0 as here), micro ones are OP/OR, micro F1 is OF1.
        # Its macro F1 is the mean of per-class F1; eq. 11 (and so CF1 here) is the harmonic mean of CP and CR.
        kw = dict(num_labels=k, threshold=0.5, ignore_index=-1)
        hard = pred.float()
        assert MultilabelPrecision(average="macro", **kw)(hard, targets).item() == pytest.approx(out["CP"], abs=1e-6)
        assert MultilabelRecall(average="macro", **kw)(hard, targets).item() == pytest.approx(out["CR"], abs=1e-6)
        assert MultilabelPrecision(average="micro", **kw)(hard, targets).item() == pytest.approx(out["OP"], abs=1e-6)
        assert MultilabelRecall(average="micro", **kw)(hard, targets).item() == pytest.approx(out["OR"], abs=1e-6)
        assert MultilabelF1Score(average="micro", **kw)(hard, targets).item() == pytest.approx(out["OF1"], abs=1e-6)
        macro_f1 = MultilabelF1Score(average="macro", **kw)(hard, targets).item()
        assert macro_f1 <= out["CF1"] + 1e-9  # mean of harmonic means <= harmonic mean of means


def test_multilabel_metrics_keys_and_values():
    out = multilabel_metrics(HAND_SCORES, HAND_TARGETS)
    assert set(out) == {"mAP", "CP", "CR", "CF1", "OP", "OR", "OF1", "count"}
    assert out["count"] == 3.0
    # percentages (the functions behind them return fractions)
    assert out["mAP"] == pytest.approx(100 * mean_average_precision(HAND_SCORES, HAND_TARGETS))
    assert out["OF1"] == pytest.approx(100 * 2 / 3)
    perfect = multilabel_metrics(HAND_TARGETS.float().clamp(min=0), HAND_TARGETS)
    assert perfect["mAP"] == pytest.approx(100.0)
    assert perfect["OP"] == pytest.approx(100.0) and perfect["OR"] == pytest.approx(100.0)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="same shape"):
        average_precision(torch.zeros(3, 2), torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"found \[2\]"):
        average_precision(torch.zeros(2, 2), torch.tensor([[0, 2], [1, 0]]))
    with pytest.raises(ValueError, match="NaN"):
        precision_recall_f1(torch.tensor([[float("nan"), 0.0]]), torch.tensor([[1, 0]]))
    assert torch.isnan(average_precision(torch.zeros(0, 4), torch.zeros(0, 4))).all()
