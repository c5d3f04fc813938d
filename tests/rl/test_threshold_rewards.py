"""The reward threshold schedule (lenient first, rising, the paper's eq. 5 kept as an option) and the dense rank
rewards, against slow obvious references on ranks from ``true_ranks`` (ties count against the query)."""

from __future__ import annotations

import math

import pytest
import torch

from rlattention.metrics.sketch import true_ranks
from rlattention.rl import (
    THRESHOLD_SHAPES,
    RankThresholdSchedule,
    SigmoidThreshold,
    delta_inverse_rank,
    rank_percentile,
    rank_threshold_reward,
)

GALLERY = 270


def test_default_schedule_is_lenient_first_and_rises_to_rank_one():
    eta = RankThresholdSchedule()
    # step 1: the true photo anywhere in the top half of a 270-photo gallery is rewarded
    assert rank_threshold_reward(torch.tensor([GALLERY // 2, GALLERY]), eta(1)).tolist() == [1.0, 0.0]
    assert eta(0) == pytest.approx(1 / 250) and eta(1) == pytest.approx((1 / 250) * 250 ** (1 / 16))
    assert eta(8) == pytest.approx(1 / math.sqrt(250))  # geometric: halfway in log-rank, rank <= 15.8
    assert rank_threshold_reward(torch.tensor([15, 16]), eta(8)).tolist() == [1.0, 0.0]
    # from `steps` on only rank 1 (exactly: eta is not rounded above 1)
    for step in (16, 17, 1000):
        assert eta(step) == 1.0
        assert rank_threshold_reward(torch.tensor([1, 2]), eta(step)).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("shape", THRESHOLD_SHAPES)
def test_schedule_is_monotone_and_accepts_tensors(shape):
    eta = RankThresholdSchedule(shape=shape)
    steps = torch.arange(0, 41)
    values = [eta(int(s)) for s in steps]
    assert all(b >= a for a, b in zip(values, values[1:], strict=False)) and values[-1] > values[0]
    as_tensor = eta(steps)  # a row of thresholds (e.g. one per completion step), no host sync
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.shape == (41,)
    assert torch.allclose(as_tensor.double(), torch.tensor(values, dtype=torch.float64), atol=1e-6)


def test_linear_and_sigmoid_shapes_at_chosen_points():
    lin = RankThresholdSchedule(start=0.1, end=0.9, steps=10, shape="linear")
    assert [lin(s) for s in (-5, 0, 5, 10, 20)] == pytest.approx([0.1, 0.1, 0.5, 0.9, 0.9])
    sig = RankThresholdSchedule(start=0.1, end=0.9, steps=10, shape="sigmoid", sharpness=10.0)
    assert [sig(s) for s in (0, 5, 10)] == pytest.approx([0.1, 0.5, 0.9])
    assert sig(2) + sig(8) == pytest.approx(1.0)  # symmetric about the midpoint
    assert sig(2) < lin(2) and sig(8) > lin(8)  # flat at both ends


def test_paper_shape_is_eq5_and_demands_rank_one_from_the_start():
    paper = RankThresholdSchedule(shape="paper", alpha=0.02, beta=-2.0)
    for t in (0, 10, 100, 1000):
        assert paper(t) == pytest.approx(SigmoidThreshold(0.02, -2.0)(t))
    # methods/darp/phase2.py's inline form (no host sync): sigmoid(alpha t - beta)
    step = torch.tensor(37)
    assert paper(step).item() == pytest.approx(torch.sigmoid(step.float() * 0.02 + 2.0).item())
    # eta_0 = 0.881 > 1/2: only rank 1 of the gallery is ever rewarded, while the default accepts rank <= 250
    assert rank_threshold_reward(torch.tensor([1, 2]), paper(0)).tolist() == [1.0, 0.0]
    assert rank_threshold_reward(torch.tensor([250]), RankThresholdSchedule()(0)).tolist() == [1.0]


def test_schedule_validates():
    with pytest.raises(ValueError, match="shape"):
        RankThresholdSchedule(shape="cosine")
    with pytest.raises(ValueError, match="start and end"):
        RankThresholdSchedule(start=0.0)
    with pytest.raises(ValueError, match="steps"):
        RankThresholdSchedule(steps=0)
    RankThresholdSchedule(start=0.0, shape="paper")  # start/end unused by eq. 5


def _ranks_with_ties(seed: int = 0, queries: int = 40, steps: int = 6) -> torch.Tensor:
    """Ranks ``(Q, S)`` of true photos in a 270-photo gallery with exact duplicates (ties), by ``true_ranks``."""
    g = torch.Generator().manual_seed(seed)
    distinct = torch.randint(-3, 4, (60, 4), generator=g).double()
    gallery = distinct[torch.randint(60, (GALLERY,), generator=g)]  # every row repeated ~4.5 times
    target = torch.randint(GALLERY, (queries,), generator=g)
    # queries walk from noise towards their photo, so ranks improve (and sometimes worsen) along the episode
    noise = 4.0 * torch.randn(queries, steps, 4, generator=g, dtype=torch.float64)
    shrink = torch.linspace(1.0, 0.0, steps, dtype=torch.float64)[None, :, None]
    ranks = true_ranks(gallery[target][:, None] + shrink * noise, gallery, target)
    duplicates = (gallery[None] == gallery[target][:, None]).all(-1).sum(-1)  # the true photo's copies
    assert torch.all(ranks[:, -1] == duplicates)  # at the photo itself: ties count against, rank = #copies
    return ranks


def test_delta_inverse_rank_matches_loop_and_telescopes():
    ranks = _ranks_with_ties()
    R = delta_inverse_rank(ranks)
    ref = torch.zeros(ranks.shape)
    for q in range(ranks.shape[0]):
        previous = 0.0  # rank_0 = inf by default: 1/rank_0 = 0
        for t in range(ranks.shape[1]):
            ref[q, t] = 1.0 / int(ranks[q, t]) - previous
            previous = 1.0 / int(ranks[q, t])
    assert torch.allclose(R, ref, atol=1e-6)
    assert torch.allclose(R.sum(-1), 1.0 / ranks[:, -1].float(), atol=1e-6)  # sum of rewards = final score
    assert (R < 0).any() and (R > 0).any() and R.abs().max() <= 1.0
    # rank_0 = G: the first reward is the gain over the worst rank
    R_g = delta_inverse_rank(ranks, rank0=GALLERY)
    assert torch.allclose(R_g[:, 0], 1.0 / ranks[:, 0].float() - 1.0 / GALLERY, atol=1e-6)
    assert torch.allclose(R_g[:, 1:], R[:, 1:])
    # a per-query rank_0 broadcasts over the leading dimensions
    per_query = torch.full((ranks.shape[0],), float(GALLERY))
    assert torch.allclose(delta_inverse_rank(ranks, per_query), R_g)


def test_rank_percentile_matches_loop_and_tie_convention():
    ranks = _ranks_with_ties(seed=1)
    R = rank_percentile(ranks, GALLERY)
    ref = torch.tensor([[(GALLERY - int(r)) / (GALLERY - 1) for r in row] for row in ranks])
    assert torch.allclose(R, ref, atol=1e-6)
    assert R.min() >= 0 and R.max() <= 1
    assert rank_percentile(torch.tensor([1, GALLERY]), GALLERY).tolist() == [1.0, 0.0]
    # a true photo tied with the whole gallery has rank G (ties count against): the worst reward
    same = torch.zeros(5, 3, dtype=torch.float64)
    tied = true_ranks(torch.ones(1, 3, dtype=torch.float64), same, torch.tensor([2]))
    assert tied.item() == 5 and rank_percentile(tied, 5).item() == 0.0
    assert rank_percentile(torch.tensor([1]), 1).item() == 1.0
    with pytest.raises(ValueError, match="ranks"):
        rank_percentile(torch.tensor([0, 3]), GALLERY)
    with pytest.raises(ValueError, match="ranks"):
        rank_percentile(torch.tensor([GALLERY + 1]), GALLERY)
