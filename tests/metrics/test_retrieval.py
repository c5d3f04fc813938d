"""Image-text retrieval metrics: the one-pass ranks against a slow per-query sort (with and without ties, several
dtypes and chunkings), against the public-code argsort and torchmetrics' RetrievalHitRate, the tie rule on hand
examples, medr/meanr/rsum, explicit caption -> image mappings, the embeddings path (one product or blocks), the
COCO 1K / 5K protocols and the argument checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlattention.metrics import retrieval
from rlattention.metrics.retrieval import (
    caption_to_image_from_counts,
    coco_1k_folds,
    coco_5k,
    metrics_from_ranks,
    retrieval_metrics,
    retrieval_metrics_from_embeddings,
    retrieval_ranks,
    retrieval_ranks_from_embeddings,
)

KEYS = [
    "i2t_r1",
    "i2t_r5",
    "i2t_r10",
    "i2t_medr",
    "i2t_meanr",
    "t2i_r1",
    "t2i_r5",
    "t2i_r10",
    "t2i_medr",
    "t2i_meanr",
    "rsum",
]

# ------------------------------------------------------------------------------------------- slow references


def reference_ranks(sims: torch.Tensor, m: list[int]) -> tuple[list[int], list[int]]:
    """One query at a time in Python: sort the gallery by decreasing similarity, non-matching items first among
    equal similarities (ties against the query), and take the position of the first matching item."""
    s = sims.double().tolist()
    n, c = len(s), len(m)
    i2t = []
    for i in range(n):
        order = sorted(range(c), key=lambda j, i=i: (-s[i][j], m[j] == i))
        i2t.append(next(pos for pos, j in enumerate(order) if m[j] == i))
    t2i = []
    for j in range(c):
        order = sorted(range(n), key=lambda i, j=j: (-s[i][j], i == m[j]))
        t2i.append(order.index(m[j]))
    return i2t, t2i


def public_style_ranks(sims: np.ndarray, m: np.ndarray) -> tuple[list[int], list[int]]:
    """The VSE++/SCAN evaluation loop: argsort each row / column, best position of a matching item. Ties are
    broken arbitrarily, so only for tie-free similarities."""
    n, c = sims.shape
    i2t = []
    for i in range(n):
        inds = np.argsort(sims[i])[::-1]
        i2t.append(min(int(np.where(inds == j)[0][0]) for j in np.nonzero(m == i)[0]))
    t2i = []
    for j in range(c):
        inds = np.argsort(sims[:, j])[::-1]
        t2i.append(int(np.where(inds == m[j])[0][0]))
    return i2t, t2i


def reference_metrics(i2t: list[int], t2i: list[int]) -> dict[str, float]:
    out = {}
    for d, r in (("i2t", i2t), ("t2i", t2i)):
        for k in (1, 5, 10):
            out[f"{d}_r{k}"] = 100.0 * sum(1 for x in r if x < k) / len(r)
        out[f"{d}_medr"] = float(np.median(np.asarray(r) + 1))
        out[f"{d}_meanr"] = sum(x + 1 for x in r) / len(r)
    return out


def random_sims(n: int, k: int, seed: int, integer: bool, dtype=torch.float32) -> torch.Tensor:
    """``(N, k N)`` similarities; captions of image ``i`` (columns ``k i .. k i + k - 1``) get a bonus, so the
    ranks spread from 0 upwards. ``integer=True``: values in {-2..4}, so ties are everywhere."""
    gen = torch.Generator().manual_seed(seed)
    own = torch.eye(n).repeat_interleave(k, 1)
    if integer:
        sims = torch.randint(-2, 3, (n, k * n), generator=gen) + torch.randint(0, 3, (n, k * n), generator=gen) * own
    else:
        sims = torch.randn(n, k * n, generator=gen) + 1.5 * own
    return sims.to(dtype)


# ------------------------------------------------------------------------------------------------- ranks

SHAPES = [(1, 1), (1, 5), (2, 5), (3, 1), (7, 5), (13, 3), (30, 5)]


@pytest.fixture(params=["numpy", "torch"])
def cpu_backend(request, monkeypatch):
    """Both ways of counting float32/float64 blocks on the CPU (numpy threads, torch operations as on a GPU)."""
    monkeypatch.setattr(retrieval, "NUMPY_ON_CPU", request.param == "numpy")
    return request.param


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("chunk_elements", [None, 1, 37])
def test_ranks_match_slow_reference(shape, integer, chunk_elements, cpu_backend):
    n, k = shape
    sims = random_sims(n, k, seed=100 * n + k, integer=integer)
    i2t, t2i = retrieval_ranks(sims, chunk_elements=chunk_elements)
    assert i2t.dtype == t2i.dtype == torch.int64
    assert i2t.shape == (n,) and t2i.shape == (k * n,)
    m = (torch.arange(k * n) // k).tolist()
    assert (i2t.tolist(), t2i.tolist()) == reference_ranks(sims, m)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("integer", [False, True])
def test_other_dtypes_match_reference(dtype, integer):
    sims = random_sims(11, 5, seed=7, integer=integer, dtype=dtype)  # float16: rounding makes ties too
    m = (torch.arange(55) // 5).tolist()
    i2t, t2i = retrieval_ranks(sims, chunk_elements=50)
    assert (i2t.tolist(), t2i.tolist()) == reference_ranks(sims, m)


@pytest.mark.parametrize("n", [1, 4, 25])
def test_tie_free_ranks_match_public_argsort_loop(n):
    sims = random_sims(n, 5, seed=n, integer=False, dtype=torch.float64)
    m = np.arange(5 * n) // 5
    i2t, t2i = retrieval_ranks(sims)
    assert (i2t.tolist(), t2i.tolist()) == public_style_ranks(sims.numpy(), m)


def test_hand_example_with_ties():
    # 3 images, 2 captions each (m = 0 0 1 1 2 2).
    sims = torch.tensor(
        [
            [0.9, 0.9, 0.9, 0.1, 0.2, 0.0],
            [0.5, 0.2, 0.4, 0.6, 0.6, 0.6],
            [0.9, 0.1, 0.4, 0.6, 0.3, 0.1],
        ]
    )
    i2t, t2i = retrieval_ranks(sims)
    # image 0: own best 0.9 (twice: own ties do not count), caption 2 of image 1 ties at 0.9 -> 1;
    # image 1: own best 0.6, captions 4 and 5 tie -> 2; image 2: own best 0.3, captions 0, 2, 3 above -> 3.
    assert i2t.tolist() == [1, 2, 3]
    # caption 0: image 2 ties with the true image 0 -> 1; caption 1: alone at the top -> 0; caption 2 (0.4):
    # image 0 above, image 2 ties -> 2; captions 3, 4, 5: one other image ties or is above -> 1.
    assert t2i.tolist() == [1, 0, 2, 1, 1, 1]
    m = metrics_from_ranks(i2t, t2i)
    assert (m["i2t_r1"], m["i2t_r5"], m["i2t_medr"], m["i2t_meanr"]) == (0.0, 100.0, 3.0, 3.0)
    assert m["t2i_r1"] == pytest.approx(100 / 6) and m["t2i_r5"] == 100.0
    assert m["t2i_medr"] == 2.0 and m["t2i_meanr"] == 2.0  # 1-based ranks 2 1 3 2 2 2
    assert m["rsum"] == pytest.approx(400 + 100 / 6)


def test_ties_count_against_the_query_in_both_directions():
    # All similarities equal: every other item ties with the true one and is ranked before it.
    sims = torch.zeros(4, 12)
    i2t, t2i = retrieval_ranks(sims)
    assert i2t.tolist() == [9] * 4  # the 12 - 3 captions of the other images; the own 3 never count
    assert t2i.tolist() == [3] * 12  # the 3 other images
    # One exact tie with a foreign item costs exactly one place, in both directions.
    sims = torch.tensor([[2.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 2.0]])
    assert [r.tolist() for r in retrieval_ranks(sims)] == [[0, 0], [0, 0, 0, 0]]
    sims[1, 0] = 2.0  # image 1 now ties with caption 0's true image, and caption 0 with image 1's own best
    assert [r.tolist() for r in retrieval_ranks(sims)] == [[0, 1], [1, 0, 0, 0]]


def test_own_caption_ties_and_infinities(cpu_backend):
    sims = torch.tensor([[1.0, 1.0, 1.0, -1.0], [float("-inf"), 0.0, float("inf"), float("inf")]])
    i2t, t2i = retrieval_ranks(sims, torch.tensor([0, 0, 0, 1]))
    assert i2t.tolist() == [0, 1]  # image 0: its 3 captions tie for first; image 1: caption 2 ties with its 3 (+inf)
    assert t2i.tolist() == [0, 0, 1, 0]  # caption 2: image 1 (+inf) above the true image 0


def test_nan_is_an_error(cpu_backend):
    sims = random_sims(6, 5, seed=0, integer=False)
    sims[4, 17] = float("nan")
    with pytest.raises(ValueError, match="sims contains NaN"):
        retrieval_ranks(sims, chunk_elements=60)
    sims = torch.tensor([[float("inf"), float("-inf")]])  # +inf and -inf sum to NaN but are valid
    assert [r.tolist() for r in retrieval_ranks(sims)] == [[0], [0, 0]]


def test_explicit_mapping_with_unequal_counts(cpu_backend):
    gen = torch.Generator().manual_seed(3)
    counts = [1, 3, 5, 2, 4, 1]
    m = caption_to_image_from_counts(counts)
    assert m.tolist() == [0, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 4, 4, 4, 4, 5]
    perm = torch.randperm(len(m), generator=gen)
    for mapping in (m, m[perm]):  # stored image by image, or shuffled
        for integer in (False, True):
            n, c = len(counts), len(mapping)
            sims = torch.randint(-2, 3, (n, c), generator=gen).float() if integer else torch.randn(n, c, generator=gen)
            i2t, t2i = retrieval_ranks(sims, mapping, chunk_elements=11)
            assert (i2t.tolist(), t2i.tolist()) == reference_ranks(sims, mapping.tolist())
            got = retrieval_metrics(sims, mapping)
            assert got == pytest.approx({**reference_metrics(i2t.tolist(), t2i.tolist()), "rsum": got["rsum"]})
    assert caption_to_image_from_counts(torch.tensor([2, 1])).tolist() == [0, 0, 1]


def test_default_mapping_is_k_captions_per_image():
    for n, k in [(6, 5), (6, 2), (5, 1)]:
        sims = random_sims(n, k, seed=n + k, integer=True)
        explicit = torch.arange(n * k) // k
        a = retrieval_ranks(sims)
        b = retrieval_ranks(sims, explicit.to(torch.int32))
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------------------- metrics


def test_metrics_match_reference_and_rsum_is_the_sum_of_the_six():
    for n, integer in [(9, False), (20, True), (40, False)]:
        sims = random_sims(n, 5, seed=n, integer=integer)
        got = retrieval_metrics(sims)
        assert list(got) == KEYS
        assert all(isinstance(v, float) for v in got.values())
        i2t, t2i = reference_ranks(sims, (torch.arange(5 * n) // 5).tolist())
        expected = reference_metrics(i2t, t2i)
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, abs=1e-12), key
        six = got["i2t_r1"] + got["i2t_r5"] + got["i2t_r10"] + got["t2i_r1"] + got["t2i_r5"] + got["t2i_r10"]
        assert got["rsum"] == six


def test_median_and_mean_rank_are_one_based_with_numpy_median():
    m = metrics_from_ranks(torch.tensor([0, 1, 2, 5]), torch.tensor([3, 0, 0]))
    assert m["i2t_medr"] == 2.5 and m["i2t_meanr"] == 3.0  # 1-based 1 2 3 6: mean of the middle two
    assert m["t2i_medr"] == 1.0 and m["t2i_meanr"] == 2.0  # 1-based 4 1 1
    assert m["i2t_r1"] == 25.0 and m["i2t_r5"] == 75.0 and m["i2t_r10"] == 100.0
    assert m["t2i_r1"] == pytest.approx(200 / 3) and m["t2i_r5"] == 100.0
    # The VSE++ code prints floor(median(0-based ranks)) + 1 = floor of ours.
    assert np.floor(np.median([0, 1, 2, 5])) + 1 == np.floor(m["i2t_medr"])
    ranks = torch.randint(0, 50, (101,), generator=torch.Generator().manual_seed(0))
    for r in (ranks, ranks[:100]):
        assert metrics_from_ranks(r, r)["t2i_medr"] == float(np.median(r.numpy() + 1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recalls_agree_with_torchmetrics_hit_rate(seed):
    from torchmetrics.retrieval import RetrievalHitRate

    n, k = 12 + seed, 5
    sims = random_sims(n, k, seed=seed, integer=False)  # tie-free: torchmetrics breaks ties arbitrarily
    c = n * k
    m = torch.arange(c) // k
    relevant = m[None, :] == torch.arange(n)[:, None]  # (N, C)
    got = retrieval_metrics(sims)
    for top_k in (1, 5, 10):
        hr = RetrievalHitRate(top_k=top_k)
        i2t = hr(sims.reshape(-1), relevant.reshape(-1), indexes=torch.arange(n).repeat_interleave(c))
        hr = RetrievalHitRate(top_k=top_k)
        t2i = hr(sims.T.reshape(-1), relevant.T.reshape(-1), indexes=torch.arange(c).repeat_interleave(n))
        assert got[f"i2t_r{top_k}"] == pytest.approx(100 * float(i2t), abs=1e-4)
        assert got[f"t2i_r{top_k}"] == pytest.approx(100 * float(t2i), abs=1e-4)


# ------------------------------------------------------------------------------------------------- embeddings


def random_embeddings(n: int, c: int, d: int, seed: int, integer: bool, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    if integer:  # small integers: every product is exact, whatever the blocking
        img = torch.randint(-2, 3, (n, d), generator=gen).to(dtype)
        cap = torch.randint(-2, 3, (c, d), generator=gen).to(dtype)
    else:
        img = torch.randn(n, d, generator=gen, dtype=dtype)
        cap = torch.randn(c, d, generator=gen, dtype=dtype)
    return img, cap


@pytest.mark.parametrize("integer", [False, True])
def test_embeddings_path_equals_sims_path(integer):
    img, cap = random_embeddings(8, 40, 6, seed=1, integer=integer)
    a = retrieval_ranks_from_embeddings(img, cap)
    b = retrieval_ranks(img @ cap.T)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert retrieval_metrics_from_embeddings(img, cap) == retrieval_metrics(img @ cap.T)


@pytest.mark.parametrize("max_elements", [1, 30, 200])
@pytest.mark.parametrize("integer,dtype", [(True, torch.float32), (False, torch.float64)])
def test_embeddings_in_blocks_match_reference(max_elements, integer, dtype, cpu_backend):
    img, cap = random_embeddings(9, 27, 5, seed=max_elements, integer=integer, dtype=dtype)
    counts = [3, 1, 4, 2, 5, 3, 3, 4, 2]
    m = caption_to_image_from_counts(counts)[torch.randperm(27, generator=torch.Generator().manual_seed(0))]
    expected = reference_ranks(img @ cap.T, m.tolist())
    got = retrieval_ranks_from_embeddings(img, cap, m, max_elements=max_elements, chunk_elements=4)
    assert tuple(r.tolist() for r in got) == expected
    full = retrieval_ranks_from_embeddings(img, cap, m)
    assert tuple(r.tolist() for r in full) == expected


# ------------------------------------------------------------------------------------------------- protocols


def test_coco_1k_folds_is_the_mean_of_the_folds():
    n, k, folds = 20, 5, 4
    img, cap = random_embeddings(n, n * k, 4, seed=5, integer=False)
    cap = cap + 2.0 * img.repeat_interleave(k, 0)  # better than chance
    sims = img @ cap.T
    size = n // folds
    per_fold = [
        retrieval_metrics(sims[f * size : (f + 1) * size, f * size * k : (f + 1) * size * k]) for f in range(folds)
    ]
    expected = {key: sum(r[key] for r in per_fold) / folds for key in KEYS}
    got = coco_1k_folds(sims, folds=folds)
    assert list(got) == KEYS
    assert got == pytest.approx(expected, abs=1e-9)
    six = got["i2t_r1"] + got["i2t_r5"] + got["i2t_r10"] + got["t2i_r1"] + got["t2i_r5"] + got["t2i_r10"]
    assert got["rsum"] == six
    # From embeddings: the diagonal blocks only, products of the fold's rows.
    from_emb = coco_1k_folds(img=img, cap=cap, folds=folds)
    assert from_emb == pytest.approx(expected, abs=1e-9)
    # An explicit, shuffled mapping: fold f holds the captions of images f*size .. (f+1)*size - 1.
    perm = torch.randperm(n * k, generator=torch.Generator().manual_seed(1))
    shuffled = coco_1k_folds(sims[:, perm], caption_to_image=(torch.arange(n * k) // k)[perm], folds=folds)
    assert shuffled == pytest.approx(expected, abs=1e-9)
    # One fold is the whole set (= coco_5k).
    assert coco_1k_folds(sims, folds=1) == retrieval_metrics(sims) == coco_5k(sims)
    assert coco_5k(img=img, cap=cap) == retrieval_metrics_from_embeddings(img, cap)


# ------------------------------------------------------------------------------------------------- checks


def test_argument_errors_name_the_argument():
    sims = torch.zeros(3, 15)
    with pytest.raises(ValueError, match=r"sims must have shape \(N, C\)"):
        retrieval_ranks(torch.zeros(15))
    with pytest.raises(ValueError, match=r"sims must have shape \(N, C\)"):
        retrieval_metrics(torch.zeros(2, 3, 15))
    with pytest.raises(TypeError, match="sims must be a torch.Tensor"):
        retrieval_ranks(np.zeros((3, 15)))
    with pytest.raises(ValueError, match="sims must be a floating-point"):
        retrieval_ranks(torch.zeros(3, 15, dtype=torch.int64))
    with pytest.raises(ValueError, match="at least one image row"):
        retrieval_ranks(torch.zeros(0, 5))
    with pytest.raises(ValueError, match=r"C = 16 captions .* pass caption_to_image of shape \(16,\)"):
        retrieval_ranks(torch.zeros(3, 16))
    with pytest.raises(ValueError, match=r"caption_to_image must have shape \(C,\) = \(15,\)"):
        retrieval_ranks(sims, torch.zeros(14, dtype=torch.int64))
    with pytest.raises(ValueError, match="caption_to_image must be an integer"):
        retrieval_ranks(sims, torch.zeros(15))
    with pytest.raises(ValueError, match=r"caption_to_image must hold image indices in \[0, 3\)"):
        retrieval_ranks(sims, torch.full((15,), 3))
    with pytest.raises(ValueError, match=r"images \[2\] .* have none"):
        retrieval_ranks(sims, torch.arange(15) % 2)
    with pytest.raises(ValueError, match="chunk_elements"):
        retrieval_ranks(sims, chunk_elements=0)
    with pytest.raises(ValueError, match=r"cap must have shape \(C, D\) with the same D"):
        retrieval_ranks_from_embeddings(torch.zeros(3, 4), torch.zeros(15, 5))
    with pytest.raises(ValueError, match=r"img must have shape \(N, D\)"):
        retrieval_metrics_from_embeddings(torch.zeros(3), torch.zeros(15, 5))
    with pytest.raises(ValueError, match="cap contains NaN or infinite"):
        retrieval_ranks_from_embeddings(torch.zeros(3, 4), torch.full((15, 4), float("inf")))
    with pytest.raises(ValueError, match="max_elements"):
        retrieval_ranks_from_embeddings(torch.zeros(3, 4), torch.zeros(15, 4), max_elements=0)
    with pytest.raises(ValueError, match=r"i2t_rank must have shape \(N,\)"):
        metrics_from_ranks(torch.zeros(2, 2, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="t2i_rank must hold 0-based ranks"):
        metrics_from_ranks(torch.zeros(2, dtype=torch.int64), torch.tensor([0, -1]))
    with pytest.raises(ValueError, match="t2i_rank must be an integer"):
        metrics_from_ranks(torch.zeros(2, dtype=torch.int64), torch.zeros(2))
    with pytest.raises(ValueError, match="multiple of folds = 2"):
        coco_1k_folds(sims, folds=2)
    with pytest.raises(ValueError, match="not both"):
        coco_1k_folds(sims, img=torch.zeros(3, 4), cap=torch.zeros(15, 4))
    with pytest.raises(ValueError, match="both img"):
        coco_5k(img=torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"counts must all be >= 1"):
        caption_to_image_from_counts([2, 0, 1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    sims = random_sims(30, 5, seed=0, integer=True)
    m = torch.arange(150) // 5
    cpu = retrieval_ranks(sims, m)
    gpu = retrieval_ranks(sims.cuda(), m.cuda())
    assert all(g.device.type == "cuda" and torch.equal(g.cpu(), c) for g, c in zip(gpu, cpu, strict=True))
    img, cap = random_embeddings(30, 150, 8, seed=0, integer=True)
    for max_elements in (1, 2**28):
        gpu = retrieval_ranks_from_embeddings(img.cuda(), cap.cuda(), max_elements=max_elements)
        assert all(torch.equal(g.cpu(), c) for g, c in zip(gpu, retrieval_ranks(img @ cap.T), strict=True))
    assert retrieval_metrics(sims.cuda().half()) == retrieval_metrics(sims.half())


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_cpu_threads_give_the_same_ranks(threads):
    sims = random_sims(23, 5, seed=threads, integer=True)
    expected = reference_ranks(sims, (torch.arange(115) // 5).tolist())
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for chunk_elements in (1, 115, 500, None):
            got = retrieval_ranks(sims, chunk_elements=chunk_elements)
            assert tuple(r.tolist() for r in got) == expected
    finally:
        torch.set_num_threads(previous)
