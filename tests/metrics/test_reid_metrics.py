"""Re-identification metrics (Market-1501 protocol): the vectorised ``reid_metrics`` against the per-query
reference on many random cases (junk, distractors, same-camera images, ties, skipped queries, several dtypes,
chunkings and thread counts), both against hand-computed CMC/AP values and a pure-Python sort, the argument
checks and ``pairwise_distances`` (the ``reid`` speed benchmark: tests/benchmarks/test_speed_benchmarks.py)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from rlattention.metrics.reid import pairwise_distances, reid_metrics, reid_metrics_reference

KEYS = ["rank1", "rank5", "rank10", "mAP", "num_queries", "num_skipped"]


@contextlib.contextmanager
def torch_threads(n: int):
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def random_case(g: torch.Generator, q: int, gal: int, ids: int, cams: int, ties: bool):
    """Random labels with junk (-1) and distractors (0) among the gallery identities, and distances that are
    small integers (many ties) or uniform floats."""
    qp = torch.randint(-1, ids + 1, (q,), generator=g)
    gp = torch.randint(-1, ids + 1, (gal,), generator=g)
    qc = torch.randint(0, cams, (q,), generator=g)
    gc = torch.randint(0, cams, (gal,), generator=g)
    d = torch.randint(0, 4, (q, gal), generator=g).float() if ties else torch.rand(q, gal, generator=g)
    return d, qp, gp, qc, gc


def assert_same(fast: dict, ref: dict) -> None:
    assert list(fast) == list(ref)
    for k in ref:
        if k == "mAP":
            assert fast[k] == pytest.approx(ref[k], rel=0, abs=1e-10), k
        else:
            assert fast[k] == ref[k], k
    assert isinstance(fast["num_queries"], int) and isinstance(fast["num_skipped"], int)


def python_metrics(d, qp, gp, qc, gc, ks):
    """A third implementation in plain Python: ``sorted`` by (distance, is_match), then CMC and AP."""
    firsts, aps, skipped = [], [], 0
    d, qp, gp, qc, gc = d.double().tolist(), qp.tolist(), gp.tolist(), qc.tolist(), gc.tolist()
    for i, row in enumerate(d):
        kept = [j for j in range(len(gp)) if gp[j] != -1 and not (gp[j] == qp[i] and gc[j] == qc[i])]
        ranking = sorted(kept, key=lambda j, i=i, row=row: (row[j], gp[j] == qp[i]))
        positions = [pos for pos, j in enumerate(ranking) if gp[j] == qp[i]]
        if not positions:
            skipped += 1
            continue
        firsts.append(positions[0])
        aps.append(sum((n + 1) / (pos + 1) for n, pos in enumerate(positions)) / len(positions))
    out = {f"rank{k}": 100.0 * sum(f < k for f in firsts) / len(firsts) for k in ks}
    out.update(mAP=100.0 * sum(aps) / len(aps), num_queries=len(firsts), num_skipped=skipped)
    return out


# --------------------------------------------------------------------------------------- hand-made cases

# Gallery of 10 images: (identity, camera).
HAND_GALLERY = [(1, 0), (2, 1), (1, 1), (-1, 1), (0, 2), (1, 2), (3, 1), (4, 1), (5, 0), (6, 0)]
# Query A (identity 1, camera 0): image 0 is the same identity in the same camera (removed) and image 3 is junk
# (removed); the kept ranking is 1 (0.2, no), 2 (0.3, match), 4 (0.4, distractor), 5 (0.5, match), then 6-9:
# matches at 0-based ranks 1 and 3, AP = (1/2 + 2/4) / 2 = 0.5.
# Query B (identity 3, camera 0): its match, image 6, ties with image 7 at 1.0 and the tie counts against it:
# 8 (0.5), 7 (1.0), 6 (1.0, match): rank 2, AP = 1/3.
# Query C (identity 6, camera 0): its only image, 9, is in camera 0: no match left, skipped.
HAND_DIST = [
    [0.1, 0.2, 0.3, 0.05, 0.4, 0.5, 0.9, 0.9, 0.9, 0.9],
    [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 1.0, 1.0, 0.5, 3.0],
    [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.0],
]
HAND_QUERIES = [(1, 0), (3, 0), (6, 0)]


def hand_case(gallery=HAND_GALLERY, queries=HAND_QUERIES, dist=HAND_DIST):
    return (
        torch.tensor(dist),
        torch.tensor([p for p, _ in queries]),
        torch.tensor([p for p, _ in gallery]),
        torch.tensor([c for _, c in queries]),
        torch.tensor([c for _, c in gallery]),
    )


@pytest.mark.parametrize("fn", [reid_metrics, reid_metrics_reference, python_metrics])
def test_hand_computed_values(fn):
    args = hand_case()
    out = fn(*args, (1, 2, 3)) if fn is python_metrics else fn(*args, ranks=(1, 2, 3))
    assert out["rank1"] == 0.0  # A's first match is at rank 1, B's at rank 2
    assert out["rank2"] == 50.0
    assert out["rank3"] == 100.0
    assert out["mAP"] == pytest.approx(100 * (0.5 + 1 / 3) / 2, abs=1e-12)
    assert out["num_queries"] == 2 and out["num_skipped"] == 1


def test_same_camera_filter_changes_the_answer():
    # Query A alone: with image 0 in camera 0 (the query's camera) it is removed; moved to camera 3 it becomes
    # A's first match at rank 0, and the other matches move to ranks 2 and 4.
    same = hand_case(queries=HAND_QUERIES[:1], dist=HAND_DIST[:1])
    moved_gallery = [(1, 3)] + HAND_GALLERY[1:]
    other = hand_case(gallery=moved_gallery, queries=HAND_QUERIES[:1], dist=HAND_DIST[:1])
    for fn in (reid_metrics, reid_metrics_reference):
        a, b = fn(*same), fn(*other)
        assert (a["rank1"], a["mAP"]) == (0.0, pytest.approx(50.0, abs=1e-12))
        assert (b["rank1"], b["mAP"]) == (100.0, pytest.approx(100 * (1 + 2 / 3 + 3 / 5) / 3, abs=1e-12))


def test_junk_is_removed_and_distractors_count():
    # Image 3 (distance 0.05 to A) as an ordinary identity instead of junk: A's matches move to ranks 2 and 4.
    gallery = list(HAND_GALLERY)
    gallery[3] = (2, 1)
    args = hand_case(gallery=gallery, queries=HAND_QUERIES[:1], dist=HAND_DIST[:1])
    assert reid_metrics(*args)["mAP"] == pytest.approx(100 * (1 / 3 + 2 / 5) / 2, abs=1e-12)
    # The distractor (image 4, identity 0) between A's matches: without it, the second match is at rank 2.
    gallery = list(HAND_GALLERY)
    gallery[4] = (-1, 2)
    args = hand_case(gallery=gallery, queries=HAND_QUERIES[:1], dist=HAND_DIST[:1])
    assert reid_metrics(*args)["mAP"] == pytest.approx(100 * (1 / 2 + 2 / 3) / 2, abs=1e-12)


def test_all_equal_distances_put_the_matches_last():
    # 3 non-matches and 2 matches, all at distance 0: ranks 3 and 4 (ties against the query).
    d = torch.zeros(1, 5)
    qp, qc = torch.tensor([7]), torch.tensor([0])
    gp, gc = torch.tensor([7, 1, 2, 7, 0]), torch.tensor([1, 1, 1, 2, 1])
    for fn in (reid_metrics, reid_metrics_reference):
        out = fn(d, qp, gp, qc, gc, ranks=(1, 3, 4, 5))
        assert [out["rank1"], out["rank3"], out["rank4"], out["rank5"]] == [0.0, 0.0, 100.0, 100.0]
        assert out["mAP"] == pytest.approx(100 * (1 / 4 + 2 / 5) / 2, abs=1e-12)


# --------------------------------------------------------------------------------------- against the reference


def test_random_cases_match_the_reference():
    g = torch.Generator().manual_seed(0)
    checked = skipped_seen = 0
    for trial in range(150):
        q, gal = int(torch.randint(1, 25, (1,), generator=g)), int(torch.randint(1, 50, (1,), generator=g))
        ids, cams = int(torch.randint(1, 8, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        args = random_case(g, q, gal, ids, cams, ties=trial % 2 == 0)
        try:
            ref = reid_metrics_reference(*args, ranks=(1, 2, 3, 5))
        except ValueError as e:
            assert "no query has a valid match" in str(e)
            with pytest.raises(ValueError, match="no query has a valid match"):
                reid_metrics(*args)
            continue
        for chunk in (1, 37, None):
            assert_same(reid_metrics(*args, ranks=(1, 2, 3, 5), chunk_elements=chunk), ref)
        if trial % 10 == 0:
            assert_same(python_metrics(*args, (1, 2, 3, 5)), ref)
        checked += 1
        skipped_seen += ref["num_skipped"] > 0
    assert checked > 80 and skipped_seen > 20


@pytest.mark.parametrize("ties", [False, True])
def test_larger_case_chunks_and_threads_do_not_matter(ties):
    g = torch.Generator().manual_seed(1)
    args = random_case(g, 300, 700, ids=40, cams=6, ties=ties)
    ref = reid_metrics_reference(*args)
    assert ref["num_queries"] > 200
    results = []
    for threads in (1, 2):
        with torch_threads(threads):
            for chunk in (1, 700 * 5 + 3, 2**18, 10**9):
                results.append(reid_metrics(*args, chunk_elements=chunk))
    for r in results:
        assert_same(r, ref)
        assert r == results[0]  # bit-identical whatever the blocks and threads


def test_many_matches_per_query_and_distractor_queries():
    # Few identities (dozens of matches per query) and queries of identity 0, which match the distractors of
    # other cameras (no identity but -1 is special); queries of identity -1 are always skipped.
    g = torch.Generator().manual_seed(2)
    d, qp, gp, qc, gc = random_case(g, 60, 400, ids=2, cams=3, ties=True)
    qp[:5] = 0
    qp[5:8] = -1
    ref = reid_metrics_reference(d, qp, gp, qc, gc)
    assert ref["num_skipped"] >= 3
    assert_same(reid_metrics(d, qp, gp, qc, gc, chunk_elements=1000), ref)


def test_gallery_order_does_not_matter():
    # Ties count against the query whatever the gallery order, so permuting the gallery changes nothing.
    g = torch.Generator().manual_seed(3)
    d, qp, gp, qc, gc = random_case(g, 80, 200, ids=10, cams=4, ties=True)
    perm = torch.randperm(200, generator=g)
    a = reid_metrics(d, qp, gp, qc, gc)
    b = reid_metrics(d[:, perm], qp, gp[perm], qc, gc[perm])
    assert a["num_queries"] == b["num_queries"] and a["rank1"] == b["rank1"] and a["rank5"] == b["rank5"]
    assert a["mAP"] == pytest.approx(b["mAP"], abs=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_dtypes_and_infinities(dtype):
    g = torch.Generator().manual_seed(4)
    d, qp, gp, qc, gc = random_case(g, 50, 120, ids=8, cams=3, ties=False)
    d = d.to(dtype)
    d[0, :10] = float("inf")
    d[1, :10] = float("-inf")
    d[2] = float("inf")  # a whole row of ties
    assert_same(reid_metrics(d, qp, gp, qc, gc), reid_metrics_reference(d, qp, gp, qc, gc))


def test_non_contiguous_and_int32_inputs():
    g = torch.Generator().manual_seed(5)
    d, qp, gp, qc, gc = random_case(g, 40, 90, ids=6, cams=3, ties=True)
    ref = reid_metrics(d, qp, gp, qc, gc)
    out = reid_metrics(d.T.contiguous().T, qp.int(), gp.int(), qc.to(torch.int16), gc.to(torch.uint8))
    assert out == ref
    assert reid_metrics(d.requires_grad_(), qp, gp, qc, gc) == ref


# --------------------------------------------------------------------------------------- argument checks


def test_errors_name_the_argument_and_shape():
    d, qp, gp, qc, gc = hand_case()
    with pytest.raises(TypeError, match=r"dist must be a torch.Tensor of shape \(Q, G\)"):
        reid_metrics(d.tolist(), qp, gp, qc, gc)
    with pytest.raises(ValueError, match=r"dist must have shape \(Q, G\).*got \(30,\)"):
        reid_metrics(d.flatten(), qp, gp, qc, gc)
    with pytest.raises(ValueError, match=r"dist must be a floating-point tensor.*torch.int64"):
        reid_metrics(d.long(), qp, gp, qc, gc)
    with pytest.raises(ValueError, match=r"gallery is empty.*G >= 1, got \(3, 0\)"):
        reid_metrics(d[:, :0], qp, gp[:0], qc, gc[:0])
    with pytest.raises(ValueError, match="at least one query"):
        reid_metrics(d[:0], qp[:0], gp, qc[:0], gc)
    with pytest.raises(ValueError, match=r"query_pids must have shape \(Q,\) = \(3,\).*got \(2,\)"):
        reid_metrics(d, qp[:2], gp, qc, gc)
    with pytest.raises(ValueError, match=r"gallery_cams must have shape \(G,\) = \(10,\).*got \(10, 1\)"):
        reid_metrics(d, qp, gp, qc, gc[:, None])
    with pytest.raises(ValueError, match=r"gallery_pids must be an integer \(int64\) tensor.*torch.float32"):
        reid_metrics(d, qp, gp.float(), qc, gc)
    with pytest.raises(ValueError, match="query_cams must be an integer"):
        reid_metrics(d, qp, gp, qc.bool(), gc)
    with pytest.raises(TypeError, match="query_cams must be a torch.Tensor"):
        reid_metrics(d, qp, gp, [0, 0, 0], gc)
    bad = d.clone()
    bad[1, 4] = float("nan")
    for fn in (reid_metrics, reid_metrics_reference):
        with pytest.raises(ValueError, match="dist contains NaN"):
            fn(bad, qp, gp, qc, gc)
    with pytest.raises(ValueError, match="ranks must be"):
        reid_metrics(d, qp, gp, qc, gc, ranks=(0, 5))
    with pytest.raises(ValueError, match="ranks must be"):
        reid_metrics(d, qp, gp, qc, gc, ranks=())
    with pytest.raises(ValueError, match="chunk_elements must be"):
        reid_metrics(d, qp, gp, qc, gc, chunk_elements=0)
    with pytest.raises(ValueError, match="no query has a valid match.*all 1 queries"):
        reid_metrics(d[2:], qp[2:], gp, qc[2:], gc)


def test_inf_minus_inf_is_not_mistaken_for_nan():
    d, qp, gp, qc, gc = hand_case()
    d[0, 6], d[0, 7] = float("inf"), float("-inf")  # the sum is NaN, no entry is
    assert_same(reid_metrics(d, qp, gp, qc, gc), reid_metrics_reference(d, qp, gp, qc, gc))


# --------------------------------------------------------------------------------------- distances


def test_pairwise_distances():
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(7, 16, generator=g, dtype=torch.float64), torch.randn(11, 16, generator=g, dtype=torch.float64)
    expected = torch.cdist(a, b)
    sq = pairwise_distances(a, b)
    assert sq.shape == (7, 11) and sq.dtype == torch.float64
    torch.testing.assert_close(sq, expected**2)
    torch.testing.assert_close(pairwise_distances(a, b, squared=False), expected)
    assert float(pairwise_distances(a, a).diagonal().min()) >= 0  # clamped at 0 against rounding
    cos = pairwise_distances(a, b, "cosine")
    torch.testing.assert_close(cos, 1 - torch.nn.functional.cosine_similarity(a[:, None], b[None], dim=-1))
    assert pairwise_distances(a.float(), b).dtype == torch.float64  # promoted
    with pytest.raises(ValueError, match="metric must be 'euclidean' or 'cosine'"):
        pairwise_distances(a, b, "manhattan")
    with pytest.raises(ValueError, match=r"same D.*\(7, 16\).*\(11, 15\)"):
        pairwise_distances(a, b[:, :15])
    with pytest.raises(ValueError, match=r"gallery_feats must have shape \(G, D\)"):
        pairwise_distances(a, b[0])
    with pytest.raises(ValueError, match="query_feats must be a floating-point"):
        pairwise_distances(a.long(), b)


def test_metrics_from_features_end_to_end():
    # Each identity's images are near their centre: every query finds its matches first (rank-1 = mAP = 100).
    g = torch.Generator().manual_seed(7)
    centres = 10 * torch.randn(5, 8, generator=g)
    qp, gp = torch.arange(5), torch.arange(5).repeat(3)
    qc, gc = torch.zeros(5, dtype=torch.long), torch.arange(15) // 5
    q = centres[qp] + 0.01 * torch.randn(5, 8, generator=g)
    gal = centres[gp] + 0.01 * torch.randn(15, 8, generator=g)
    out = reid_metrics(pairwise_distances(q, gal), qp, gp, qc, gc)
    assert out == {"rank1": 100.0, "rank5": 100.0, "rank10": 100.0, "mAP": 100.0, "num_queries": 5, "num_skipped": 0}
    assert math.isclose(reid_metrics(pairwise_distances(q, gal, "cosine"), qp, gp, qc, gc)["mAP"], 100.0)
