"""Sketch retrieval metrics (DARP-SBIR, section IV.D): the true-photo rank of eq. 4 against a slow obvious
reference (float and integer-valued inputs, chunked and unchunked), exact ties, AUIR / acc@q / ranking
percentile on hand-computed cases, the gallery built from (sketch, photo) pairs, and the argument checks."""

from __future__ import annotations

import pytest
import torch

from rlattention.metrics.sketch import (
    acc_at,
    auir,
    gallery_from_pairs,
    rank_percentile,
    rank_percentile_curve,
    retrieval_score,
    sketch_retrieval_curves,
    sketch_retrieval_metrics,
    true_ranks,
)

# ------------------------------------------------------------------------------------------- slow references


def reference_ranks(queries: torch.Tensor, gallery: torch.Tensor, target: torch.Tensor) -> list[list[int]]:
    """Eq. 4 the obvious way, one (query, step, gallery item) at a time in Python floats: the number of gallery
    items whose squared distance to the query is <= that of the true item. Always returns ``[Q][S]`` (a 2-D
    ``queries`` is one step)."""
    q3 = queries.unsqueeze(1) if queries.ndim == 2 else queries
    qs, gs, ts = q3.tolist(), gallery.tolist(), target.tolist()
    out = []
    for steps, t in zip(qs, ts, strict=True):
        row = []
        for a in steps:
            dists = [sum((x - y) ** 2 for x, y in zip(e, a, strict=True)) for e in gs]
            row.append(sum(1 for d in dists if d <= dists[t]))
        out.append(row)
    return out


def reference_metrics(ranks: list[list[int]], n: int, ks: tuple[int, ...]) -> dict[str, float]:
    """The summary of :func:`sketch_retrieval_metrics` by hand: percentages, the mean rank as a rank."""
    q, s = len(ranks), len(ranks[0])
    out = {f"acc@{k}": 100 * sum(1 for r in ranks if r[-1] <= k) / q for k in ks}
    out["auir"] = 100 * sum(sum(1 / x for x in r) / s for r in ranks) / q
    out["mean_rank"] = sum(r[-1] for r in ranks) / q
    out["percentile"] = 100 * sum((n - x) / n for r in ranks for x in r) / (q * s)
    return out


def random_case(
    q: int, s: int | None, g: int, d: int, dtype: torch.dtype, seed: int, integer: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random queries ``(Q, S, D)`` (or ``(Q, D)`` for ``s=None``), gallery ``(G, D)`` and targets. Queries are
    noisy copies of their true item, so ranks spread over the whole range. ``integer=True``: small integer
    values, for which every distance is exact in float32 and float64 and ties are frequent."""
    gen = torch.Generator().manual_seed(seed)
    shape = (q, d) if s is None else (q, s, d)
    if integer:
        gallery = torch.randint(-2, 3, (g, d), generator=gen).to(dtype)
        target = torch.randint(0, g, (q,), generator=gen)
        noise = torch.randint(-1, 2, shape, generator=gen).to(dtype)
    else:
        gallery = torch.randn(g, d, generator=gen, dtype=dtype)
        target = torch.randint(0, g, (q,), generator=gen)
        noise = torch.randn(shape, generator=gen, dtype=dtype) * 1.5
    base = gallery[target] if s is None else gallery[target].unsqueeze(1)
    return base + noise, gallery, target


# ------------------------------------------------------------------------------------------------- true_ranks

SHAPES = [(1, 1, 1, 1), (7, 4, 13, 5), (12, 3, 40, 16), (5, None, 30, 8), (3, 17, 1, 4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("max_elements", [2**26, 1, 50])
def test_true_ranks_matches_reference(shape, dtype, integer, max_elements):
    q, s, g, d = shape
    queries, gallery, target = random_case(q, s, g, d, dtype, seed=q * 1000 + g, integer=integer)
    got = true_ranks(queries, gallery, target, max_elements=max_elements)
    assert got.dtype == torch.int64
    assert got.shape == ((q,) if s is None else (q, s))
    expected = reference_ranks(queries, gallery, target)
    assert (got.reshape(q, -1).tolist()) == expected


def test_true_ranks_chunked_equals_unchunked():
    queries, gallery, target = random_case(50, 6, 70, 12, torch.float32, seed=3)
    full = true_ranks(queries, gallery, target)
    for max_elements in (1, 6 * 70 - 1, 6 * 70, 6 * 70 * 7 + 3):
        assert torch.equal(true_ranks(queries, gallery, target, max_elements=max_elements), full)


def test_ranks_are_between_one_and_gallery_size():
    for seed, integer in [(0, False), (1, True), (2, True)]:
        queries, gallery, target = random_case(30, 5, 25, 3, torch.float32, seed=seed, integer=integer)
        r = true_ranks(queries, gallery, target, max_elements=100)
        assert int(r.min()) >= 1 and int(r.max()) <= 25
    # D = 0: every item is at distance 0, all tie with the true one -> rank G.
    r = true_ranks(torch.zeros(4, 2, 0), torch.zeros(9, 0), torch.tensor([0, 3, 8, 8]))
    assert r.tolist() == [[9, 9]] * 4


def test_query_on_its_true_item_has_rank_one():
    gallery = torch.randn(20, 8, generator=torch.Generator().manual_seed(5))
    target = torch.tensor([3, 0, 19, 7])
    assert true_ranks(gallery[target], gallery, target).tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("g", [5, 67, 300])
def test_duplicate_of_true_row_gives_rank_two(dtype, g):
    """A copy of the true photo anywhere in the gallery ties exactly and counts against the query."""
    gen = torch.Generator().manual_seed(g)
    d = 37  # not a multiple of any SIMD width
    gallery = torch.randn(g, d, generator=gen, dtype=dtype) * 3
    target = torch.arange(min(g, 24)) % (g - 1)
    queries = gallery[target].unsqueeze(1) + 0.01 * torch.randn(len(target), 3, d, generator=gen, dtype=dtype)
    assert (true_ranks(queries, gallery, target) == 1).all()
    for dup_at in (0, g // 2, g - 1):
        for t in range(0, len(target), 5):
            dup = gallery.clone()
            true_row = int(target[t])
            if true_row == dup_at:
                continue
            dup[dup_at] = gallery[true_row]
            r = true_ranks(queries, dup, target)
            assert r[t].tolist() == [2, 2, 2], (dup_at, t)
    # Many duplicates of the same row: the rank counts all of them.
    dup = gallery.clone()
    dup[1:4] = gallery[0]
    r = true_ranks(gallery[:1] + 0.001, dup, torch.tensor([0]))
    assert r.tolist() == [4]


def test_equidistant_item_counts_against_the_query():
    # Query at the origin; true item (1, 0); (0, 1) and (-1, 0) lie at exactly the same distance, (0, 0.5) closer,
    # (2, 2) further: rank = 1 (itself) + 2 (ties) + 1 (closer) = 4.
    gallery = torch.tensor([[2.0, 2.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.5], [-1.0, 0.0]])
    for dtype in (torch.float32, torch.float64):
        r = true_ranks(torch.zeros(1, 2, dtype=dtype), gallery.to(dtype), torch.tensor([1]))
        assert r.tolist() == [4]
    # Off the origin: a = (1, 2, 3); the true item and its mirror images through the query along each axis.
    a = torch.tensor([[1.0, 2.0, 3.0]])
    gallery = torch.tensor([[2.0, 4.0, 6.0], [0.0, 4.0, 6.0], [2.0, 0.0, 6.0], [2.0, 4.0, 0.0], [1.0, 2.0, 9.0]])
    assert true_ranks(a, gallery, torch.tensor([0])).tolist() == [4]  # (1, 2, 9) is further (36 > 14)
    # Strictly closer items only (no tie): the true item is the furthest -> rank G.
    assert true_ranks(a, gallery, torch.tensor([4])).tolist() == [5]


def test_near_ties_below_float32_product_resolution_are_settled_exactly():
    # Far from the origin the float32 product ||e||^2 - 2 a.e (values ~4e6, spacing 0.25) cannot tell the
    # squared distances 1 and (1 +- 2^-13)^2 apart; the near-tie is recomputed from the coordinate differences.
    a = torch.tensor([[1000.0, 1000.0]])
    step = 2.0**-13  # representable next to 1001 in float32 (spacing 2^-14)
    for sign, expected in [(1.0, 1), (-1.0, 2), (0.0, 2)]:
        gallery = torch.tensor([[1001.0, 1000.0], [1000.0, 1001.0 + sign * step], [0.0, 0.0]])
        assert gallery[1, 1].item() == 1001.0 + sign * step
        assert true_ranks(a, gallery, torch.tensor([0])).tolist() == [expected], sign
        assert reference_ranks(a, gallery, torch.tensor([0])) == [[expected]]


def test_reduced_precision_float32_products_still_match_reference():
    queries, gallery, target = random_case(20, 4, 30, 16, torch.float32, seed=8)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # TF32 / bfloat16 products where the hardware has them
        got = true_ranks(queries, gallery, target)
    finally:
        torch.set_float32_matmul_precision(previous)
    assert got.tolist() == reference_ranks(queries, gallery, target)


def test_half_precision_inputs_are_raised_to_float32():
    queries, gallery, target = random_case(6, 2, 10, 4, torch.float16, seed=0, integer=True)
    got = true_ranks(queries, gallery, target)
    assert got.reshape(6, -1).tolist() == reference_ranks(queries, gallery, target)


def test_target_may_be_any_integer_dtype_and_result_has_no_grad():
    queries, gallery, target = random_case(5, 3, 8, 4, torch.float32, seed=1)
    queries.requires_grad_(True)
    a = true_ranks(queries, gallery, target)
    b = true_ranks(queries, gallery, target.to(torch.int32))
    assert torch.equal(a, b) and not a.requires_grad


# ----------------------------------------------------------------------------------- metrics from the ranks


def test_retrieval_score_is_inverse_rank():
    r = torch.tensor([[1, 2], [4, 10]])
    s = retrieval_score(r)
    assert s.dtype == torch.float64
    assert s.tolist() == [[1.0, 0.5], [0.25, 0.1]]


def test_auir_hand_examples():
    assert auir(torch.tensor([[4, 2, 1, 1]])) == pytest.approx((1 / 4 + 1 / 2 + 1 + 1) / 4)
    two = torch.tensor([[4, 2, 1, 1], [1, 1, 1, 1]])
    assert auir(two) == pytest.approx(((1 / 4 + 1 / 2 + 1 + 1) / 4 + 1.0) / 2)
    assert auir(torch.ones(3, 7, dtype=torch.int64)) == 1.0  # perfect retrieval at every step
    # Rank 1 from step k on, a huge rank before: (S - k + 1) / S.
    s, k, huge = 8, 3, 10**12
    r = torch.tensor([[huge] * (k - 1) + [1] * (s - k + 1)])
    assert auir(r) == pytest.approx((s - k + 1) / s, abs=1e-9)


def test_auir_matches_reference_on_random_ranks():
    r = torch.randint(1, 50, (13, 9), generator=torch.Generator().manual_seed(0))
    expected = sum(sum(1 / x for x in row) / 9 for row in r.tolist()) / 13
    assert auir(r) == pytest.approx(expected, rel=1e-12)


def test_acc_at():
    r = torch.tensor([[9, 1], [1, 3], [2, 6], [1, 11]])  # last step: 1, 3, 6, 11
    assert acc_at(r, 1) == 0.25
    assert acc_at(r, 5) == 0.5
    assert acc_at(r, 10) == 0.75
    assert acc_at(r, 11) == 1.0
    assert acc_at(r[:, 0], 1) == 0.5  # (Q,): used as they are


def test_rank_percentile_hand_example():
    r = torch.tensor([[1, 5], [10, 3]])
    p = rank_percentile(r, 10)
    assert p.dtype == torch.float64
    assert p.flatten().tolist() == pytest.approx([0.9, 0.5, 0.0, 0.7])
    assert rank_percentile_curve(r, 10).tolist() == pytest.approx([0.45, 0.6])


@pytest.mark.parametrize("integer", [False, True])
def test_sketch_retrieval_metrics_match_reference(integer):
    queries, gallery, target = random_case(40, 6, 30, 8, torch.float64, seed=11, integer=integer)
    got = sketch_retrieval_metrics(queries, gallery, target, max_elements=500)
    ranks = reference_ranks(queries, gallery, target)
    expected = reference_metrics(ranks, 30, (1, 5, 10))
    steps = {"acc@1_steps", "acc@5_steps", "acc@10_steps", "mean_rank_steps"}
    assert set(got) == {"acc@1", "acc@5", "acc@10", "auir", "mean_rank", "percentile"} | steps
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key
    flat = [x for row in ranks for x in row]  # every query at every completion step
    for k in (1, 5, 10):
        assert got[f"acc@{k}_steps"] == pytest.approx(100 * sum(x <= k for x in flat) / len(flat), rel=1e-12)
    assert got["mean_rank_steps"] == pytest.approx(sum(flat) / len(flat), rel=1e-12)
    other = sketch_retrieval_metrics(queries, gallery, target, ks=(3,))
    assert set(other) == {"acc@3", "auir", "mean_rank", "percentile", "acc@3_steps", "mean_rank_steps"}


def test_sketch_retrieval_curves_match_reference():
    queries, gallery, target = random_case(25, 5, 20, 6, torch.float32, seed=4, integer=True)
    curves = sketch_retrieval_curves(queries, gallery, target)
    ranks = reference_ranks(queries, gallery, target)
    assert set(curves) == {"percentile", "inverse_rank", "acc@1"}
    for s in range(5):
        column = [row[s] for row in ranks]
        assert float(curves["percentile"][s]) == pytest.approx(sum((20 - x) / 20 for x in column) / 25)
        assert float(curves["inverse_rank"][s]) == pytest.approx(sum(1 / x for x in column) / 25)
        assert float(curves["acc@1"][s]) == pytest.approx(sum(x == 1 for x in column) / 25)
    assert all(c.shape == (5,) for c in curves.values())
    # The mean of the inverse-rank curve (a fraction) is the AUIR (in percent).
    metrics = sketch_retrieval_metrics(queries, gallery, target)
    assert 100 * float(curves["inverse_rank"].mean()) == pytest.approx(metrics["auir"])


def test_complete_sketches_only():
    queries, gallery, target = random_case(10, None, 15, 4, torch.float64, seed=2)
    got = sketch_retrieval_metrics(queries, gallery, target)
    ranks = reference_ranks(queries, gallery, target)
    assert got["acc@1"] == pytest.approx(reference_metrics(ranks, 15, (1,))["acc@1"])
    assert got["auir"] == pytest.approx(reference_metrics(ranks, 15, (1,))["auir"])


# --------------------------------------------------------------------------------------- gallery_from_pairs


def test_gallery_from_pairs_dedups_and_remaps():
    photos = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))  # photo ids 3, 5, 7
    ids = torch.tensor([7, 3, 7, 5, 3])
    photo_emb = photos[torch.tensor([2, 0, 2, 1, 0])]
    gallery, rows = gallery_from_pairs(photo_emb, ids)
    assert rows.dtype == torch.int64
    assert rows.tolist() == [2, 0, 2, 1, 0]
    assert torch.equal(gallery, photos)
    assert torch.equal(gallery[rows], photo_emb)
    # The first occurrence is used (within tolerance, later ones may differ slightly).
    noisy = photo_emb.clone()
    noisy[2] += 1e-6
    gallery, _ = gallery_from_pairs(noisy, ids)
    assert torch.equal(gallery[2], photo_emb[0])
    # End to end: a sketch equal to its photo is at rank 1.
    assert true_ranks(photo_emb, gallery, rows).tolist() == [1] * 5


def test_gallery_from_pairs_rejects_different_embeddings_of_one_photo():
    photo_emb = torch.zeros(4, 3)
    ids = torch.tensor([1, 42, 1, 42])
    photo_emb[3] = 1.0
    with pytest.raises(ValueError, match="photo id 42"):
        gallery_from_pairs(photo_emb, ids)
    gallery, rows = gallery_from_pairs(photo_emb, ids, atol=None)  # check skipped: first occurrence wins
    assert torch.equal(gallery, torch.zeros(2, 3)) and rows.tolist() == [0, 1, 0, 1]


# -------------------------------------------------------------------------------------------------- errors


def test_true_ranks_argument_errors():
    queries, gallery, target = random_case(4, 3, 6, 5, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"queries must have shape \(Q, D\) or \(Q, S, D\)"):
        true_ranks(queries[0, 0], gallery, target)
    with pytest.raises(ValueError, match=r"gallery must have shape \(G, D\)"):
        true_ranks(queries, gallery.unsqueeze(0), target)
    with pytest.raises(ValueError, match="same embedding size D"):
        true_ranks(queries, gallery[:, :4], target)
    with pytest.raises(ValueError, match=r"target must have shape \(4,\)"):
        true_ranks(queries, gallery, target[:3])
    with pytest.raises(ValueError, match="target must be an integer tensor"):
        true_ranks(queries, gallery, target.float())
    with pytest.raises(ValueError, match=r"target must hold gallery rows in \[0, 6\).*\[6\]"):
        true_ranks(queries, gallery, torch.tensor([0, 6, 1, 2]))
    with pytest.raises(ValueError, match="target must hold gallery rows"):
        true_ranks(queries, gallery, torch.tensor([0, -1, 1, 2]))
    with pytest.raises(ValueError, match="queries must be a floating-point tensor"):
        true_ranks(queries.long(), gallery, target)
    bad = queries.clone()
    bad[1, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="queries contains NaN"):
        true_ranks(bad, gallery, target)
    with pytest.raises(ValueError, match="max_elements"):
        true_ranks(queries, gallery, target, max_elements=0)
    with pytest.raises(TypeError, match="gallery must be a torch.Tensor"):
        true_ranks(queries, gallery.tolist(), target)


def test_metric_argument_errors():
    r = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="ranks must all be >= 1"):
        auir(torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match=r"ranks must have shape \(Q, S\)"):
        auir(r[0])
    with pytest.raises(ValueError, match="q must be an integer >= 1"):
        acc_at(r, 0)
    with pytest.raises(ValueError, match="gallery_size = 3"):
        rank_percentile(r, 3)
    with pytest.raises(ValueError, match="gallery_size must be an integer >= 1"):
        rank_percentile(r, 0)
    with pytest.raises(ValueError, match="ks must be integers >= 1"):
        sketch_retrieval_metrics(torch.zeros(2, 3, 4), torch.zeros(5, 4), torch.tensor([0, 1]), ks=(1, 0))
    with pytest.raises(ValueError, match=r"query_emb must have shape"):
        sketch_retrieval_metrics(torch.zeros(2, 3, 4, 1), torch.zeros(5, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"ranks must have at least one completion step"):
        acc_at(torch.ones(3, 0, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match=r"query_emb must have at least one completion step"):
        sketch_retrieval_metrics(torch.zeros(2, 0, 4), torch.zeros(5, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"photo_emb must have shape \(Q, D\)"):
        gallery_from_pairs(torch.zeros(2, 3, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"target must have shape \(2,\)"):
        gallery_from_pairs(torch.zeros(2, 4), torch.tensor([0, 1, 2]))
