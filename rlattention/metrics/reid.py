"""Person re-identification metrics with the Market-1501 protocol: CMC rank-k accuracy and mAP from a query x
gallery distance matrix (for the ``scal`` method; the same protocol serves DukeMTMC-reID and CUHK03).

Inputs everywhere:

* ``dist``: ``(Q, G)`` real distances, one row per query image, one column per gallery image; smaller means
  more similar (any dissimilarity works: only the order within a row matters). :func:`pairwise_distances`
  builds one from embeddings.
* ``query_pids (Q,)``, ``gallery_pids (G,)``: integer person identities; ``query_cams (Q,)``,
  ``gallery_cams (G,)``: integer camera ids. int64 is expected; other integer dtypes are accepted.

The protocol, for each query ``q`` with identity ``p`` seen by camera ``c``:

* gallery images of identity ``p`` taken by camera ``c`` are removed (finding the same person in the same
  camera is too easy; Market-1501 evaluates cross-camera matching only);
* gallery images with identity ``-1`` (Market's "junk": bad detections, body fragments) are removed for every
  query; a query whose identity is ``-1`` therefore has no match and is skipped;
* every other gallery image stays. Those of identity ``p`` (from other cameras) are the query's *matches*; the
  rest, including the distractors of identity ``0`` (Market's false detections), are non-matches. No identity
  other than ``-1`` is special: a query of identity ``0`` would match the distractors of other cameras (the
  real query sets have none);
* the remaining gallery images are ranked by increasing distance. A query with no match left is skipped (not
  counted in any metric) and reported in ``num_skipped``.

Ties: a non-match at exactly the same distance as a match is ranked *before* it (ties count against the
query; pessimistic, so a model cannot gain from constant distances). Equivalently, the ranking sorts by
``(distance, is_match)`` with non-matches first among equal distances. Matches tied with each other take
consecutive positions; their order does not change any metric.

With ``r_1 < r_2 < ... < r_M`` the 0-based positions of the query's ``M`` matches in that ranking:

* CMC: the query is a hit at ``k`` if ``r_1 < k``; ``rank{k}`` is the percentage of hits over the evaluated
  queries;
* AP: the non-interpolated average precision of open-reid / torchreid, the mean over the matches of the
  precision at each match, ``AP = (1 / M) * sum_i i / (r_i + 1)``; ``mAP`` is the mean AP over the evaluated
  queries, in percent. (The official Market-1501 MATLAB code interpolates precision between consecutive
  matches instead and gives slightly different numbers.)

:func:`reid_metrics` computes these without a loop over queries or a sort of the rows (see its docstring);
:func:`reid_metrics_reference` is the obvious per-query loop, kept for tests and benchmarks. Both give the
same ranks, so the same metrics up to float rounding of the final means.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

__all__ = ["CHUNK_ELEMENTS", "pairwise_distances", "reid_metrics", "reid_metrics_reference"]

#: Entries of ``dist`` (rows x gallery size) processed per step by :func:`reid_metrics`: a block of rows small
#: enough to stay in the CPU caches while it is compared with each of its rows' match distances.
CHUNK_ELEMENTS = 2**18

JUNK_PID = -1

_HAS_BITWISE_COUNT = hasattr(np, "bitwise_count")  # numpy >= 2.0


# ------------------------------------------------------------------------------------------------- checks


def _check_labels(x: Tensor, name: str, shape: str, length: int) -> np.ndarray:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {shape}, got {type(x).__name__}")
    if x.ndim != 1 or x.shape[0] != length:
        raise ValueError(f"{name} must have shape {shape} = ({length},) (one entry per image), got {tuple(x.shape)}")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer (int64) tensor of shape {shape}, got dtype {x.dtype}")
    return x.detach().to(device="cpu", dtype=torch.int64).numpy()


def _check_ranks(ranks: Sequence[int]) -> tuple[int, ...]:
    try:
        ks = tuple(ranks)
    except TypeError:
        raise ValueError(f"ranks must be a sequence of integers >= 1, got {ranks!r}") from None
    if not ks or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in ks):
        raise ValueError(f"ranks must be a non-empty sequence of integers >= 1, got {ranks!r}")
    return tuple(int(k) for k in ks)


def _check_inputs(
    dist: Tensor,
    query_pids: Tensor,
    gallery_pids: Tensor,
    query_cams: Tensor,
    gallery_cams: Tensor,
    ranks: Sequence[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]]:
    """The validated inputs as CPU numpy arrays: ``dist`` float32/float64 (half precisions widened to float32,
    which keeps every order and tie), the labels int64, and the ranks as a tuple of ints."""
    if not isinstance(dist, Tensor):
        raise TypeError(f"dist must be a torch.Tensor of shape (Q, G) (queries x gallery), got {type(dist).__name__}")
    if dist.ndim != 2:
        raise ValueError(f"dist must have shape (Q, G) (rows: queries, columns: gallery), got {tuple(dist.shape)}")
    if not dist.is_floating_point():
        raise ValueError(f"dist must be a floating-point tensor of shape (Q, G), got dtype {dist.dtype}")
    q, g = dist.shape
    if q == 0:
        raise ValueError(f"dist must have at least one query row, got shape {tuple(dist.shape)}")
    if g == 0:
        raise ValueError(f"the gallery is empty: dist must have shape (Q, G) with G >= 1, got {tuple(dist.shape)}")
    qp = _check_labels(query_pids, "query_pids", "(Q,)", q)
    gp = _check_labels(gallery_pids, "gallery_pids", "(G,)", g)
    qc = _check_labels(query_cams, "query_cams", "(Q,)", q)
    gc = _check_labels(gallery_cams, "gallery_cams", "(G,)", g)
    ks = _check_ranks(ranks)
    d = dist.detach()
    if d.dtype not in (torch.float32, torch.float64):
        d = d.float()
    d = d.cpu().contiguous().numpy()
    # One float sum is NaN when an entry is NaN (or by overflow/inf - inf, hence the exact check then).
    with np.errstate(invalid="ignore", over="ignore"):
        maybe_nan = bool(np.isnan(d.sum()))
    if maybe_nan and bool(np.isnan(d).any()):
        raise ValueError("dist contains NaN values: the ranking is undefined")
    return d, qp, gp, qc, gc, ks


def _metrics(first_rank: np.ndarray, ap: np.ndarray, ks: tuple[int, ...], skipped: int) -> dict[str, float]:
    """The returned dictionary from the 0-based rank of the first match and the AP of each evaluated query."""
    n = first_rank.shape[0]
    if n == 0:
        raise ValueError(
            "no query has a valid match in the gallery (after removing junk and same-camera images of the same "
            f"identity): all {skipped} queries would be skipped"
        )
    out: dict[str, float] = {f"rank{k}": 100.0 * float(np.count_nonzero(first_rank < k)) / n for k in ks}
    out["mAP"] = 100.0 * float(np.mean(ap, dtype=np.float64))
    out["num_queries"] = n
    out["num_skipped"] = skipped
    return out


# ------------------------------------------------------------------------------------------------- metrics


def _same_pid_pairs(qp: np.ndarray, gp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All (query, gallery) pairs with the same identity, grouped by query in query order: ``(starts (Q,),
    counts (Q,), cols (P,))``, query ``i``'s gallery columns being ``cols[starts[i] : starts[i] + counts[i]]``
    (in increasing order). Cost: sorting the gallery identities, then linear in the number of pairs."""
    order = np.argsort(gp, kind="stable")
    sorted_pids = gp[order]
    lo = np.searchsorted(sorted_pids, qp, side="left")
    counts = np.searchsorted(sorted_pids, qp, side="right") - lo
    starts = np.cumsum(counts) - counts
    # Within query i's range, pair t takes the sorted gallery entry lo[i] + (t - starts[i]).
    pos = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(lo - starts, counts)
    return starts, counts, order[pos]


def _ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated index ranges ``[starts[i], starts[i] + counts[i])`` and the number ``i`` of each."""
    total = int(counts.sum())
    offsets = np.cumsum(counts) - counts
    which = np.repeat(np.arange(counts.shape[0]), counts)
    return np.arange(total, dtype=np.int64) - offsets[which] + starts[which], which


def _count_at_most(block: np.ndarray, thresholds: np.ndarray, mask: np.ndarray, out: np.ndarray) -> None:
    """``out[i, j] = #{g : block[i, g] <= thresholds[i, j]}`` (NaN entries never count). ``mask``: a bool
    buffer ``(R, W)`` with ``W >= G`` a multiple of 8 whose columns ``G:`` are False."""
    r, g = block.shape
    m = mask[:r]
    words = m.view(np.uint64)  # 8 booleans (bytes 0 or 1) per word: the popcount of a word counts its Trues
    for j in range(thresholds.shape[1]):
        np.less_equal(block, thresholds[:, j : j + 1], out=m[:, :g])
        if _HAS_BITWISE_COUNT:
            out[:, j] = np.bitwise_count(words).sum(axis=1, dtype=np.int64)
        else:  # pragma: no cover - numpy < 2.0
            out[:, j] = m.sum(axis=1)


def reid_metrics(
    dist: Tensor,
    query_pids: Tensor,
    gallery_pids: Tensor,
    query_cams: Tensor,
    gallery_cams: Tensor,
    ranks: Sequence[int] = (1, 5, 10),
    *,
    chunk_elements: int | None = None,
) -> dict[str, float]:
    """CMC and mAP of the Market-1501 protocol (see the module docstring for the protocol and tie rule).

    dist: ``(Q, G)`` float distances, smaller = more similar, no NaN (``+-inf`` allowed), any device (the work
        is done on the CPU; float16/bfloat16 are widened to float32, which keeps every order and tie).
    query_pids, query_cams: ``(Q,)``; gallery_pids, gallery_cams: ``(G,)``: integer identities and cameras,
        identity ``-1`` = junk (removed), ``0`` = distractor (an ordinary non-match).
    ranks: the CMC cut-offs ``k >= 1`` to report.
    chunk_elements: about how many entries of ``dist`` are processed per step (default
        :data:`CHUNK_ELEMENTS`); the result does not depend on it.

    Returns ``{"rank{k}": CMC at k for each k in ranks, "mAP": ..., "num_queries": ..., "num_skipped": ...}``:
    the CMC values and mAP as floats in percent ``[0, 100]`` over the ``num_queries`` evaluated queries; the
    counts as ints, ``num_queries + num_skipped = Q``. Raises ``ValueError`` for malformed inputs, NaN
    distances, an empty gallery, or when every query is skipped.

    Algorithm (no sort of the rows, no loop over queries): only the positions of the matches are needed, and
    the position of the ``j``-th match (0-based, matches sorted by distance) is ``j`` plus the number of valid
    non-matches at a distance ``<=`` its own. The same-identity pairs are found by sorting the gallery
    identities once; each query's few match distances are sorted. Queries are then ordered by their number of
    matches and taken in blocks of rows: a block is copied, its removed and matching entries are set to NaN
    (which never compares ``<=``), and it is compared with each of its rows' sorted match distances in turn,
    the number of True entries per row being counted by popcount. The cost is about ``Q * G * M_mean``
    comparisons (``M_mean`` the mean number of matches per query, about 13 in the ``reid`` benchmark's
    Market-sized data), at about 0.15 ns each: 0.1-0.2 s for Market-1501. (A binary search of every entry among
    its row's match distances, ``torch.searchsorted``, costs about 28 ns per entry, 1.5 s at that size.) The
    blocks are processed in ``torch.get_num_threads()`` Python threads running numpy (which releases the GIL),
    taking blocks from a shared queue: no barrier between blocks, which keeps the speed when other processes
    share the cores (torch's parallel operations meet at a barrier in every call).
    """
    d, qp, gp, qc, gc, ks = _check_inputs(dist, query_pids, gallery_pids, query_cams, gallery_cams, ranks)
    if chunk_elements is None:
        chunk_elements = CHUNK_ELEMENTS
    if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int) or chunk_elements < 1:
        raise ValueError(f"chunk_elements must be an integer >= 1 or None, got {chunk_elements!r}")
    q, g = d.shape

    # Same-identity pairs: the matches (other cameras, identity not junk) and the removed same-camera entries.
    pair_starts, pair_counts, pair_cols = _same_pid_pairs(qp, gp)
    pair_rows = np.repeat(np.arange(q), pair_counts)
    is_match = (gc[pair_cols] != qc[pair_rows]) & (qp[pair_rows] != JUNK_PID)
    num_matches = np.bincount(pair_rows[is_match], minlength=q)

    # The matches' distances, sorted within each query (pairs are grouped by query, in query order).
    match_rows, match_cols = pair_rows[is_match], pair_cols[is_match]
    match_dist = d[match_rows, match_cols]
    match_dist = match_dist[np.lexsort((match_dist, match_rows))]
    match_starts = np.cumsum(num_matches) - num_matches

    evaluated = np.flatnonzero(num_matches)
    skipped = q - evaluated.shape[0]
    first_rank = np.zeros(q, dtype=np.int64)
    ap = np.zeros(q, dtype=np.float64)
    if evaluated.shape[0] == 0:
        return _metrics(first_rank[evaluated], ap[evaluated], ks, skipped)

    pairs = (pair_starts, pair_counts, pair_cols)
    _match_positions(d, gp, evaluated, num_matches, match_dist, match_starts, pairs, chunk_elements, first_rank, ap)
    return _metrics(first_rank[evaluated], ap[evaluated], ks, skipped)


def _match_positions(
    d: np.ndarray,
    gp: np.ndarray,
    evaluated: np.ndarray,
    num_matches: np.ndarray,
    match_dist: np.ndarray,
    match_starts: np.ndarray,
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray],
    chunk_elements: int,
    first_rank: np.ndarray,
    ap: np.ndarray,
) -> None:
    """The block scan of :func:`reid_metrics`: fills ``first_rank`` (0-based rank of the first match) and ``ap``
    (average precision) of the ``evaluated`` queries, from the distances ``d`` ``(Q, G)``, the gallery identities
    ``gp``, each query's sorted match distances (``match_dist`` from ``match_starts``, ``num_matches`` of them)
    and its same-identity ``pairs`` ``(starts, counts, columns)``, in blocks of about ``chunk_elements``."""
    g = d.shape[1]
    pair_starts, pair_counts, pair_cols = pairs
    junk_cols = np.flatnonzero(gp == JUNK_PID)
    by_count = evaluated[np.argsort(num_matches[evaluated], kind="stable")]  # similar counts share a block
    rows_per_block = max(1, min(chunk_elements // g, by_count.shape[0]))
    blocks = [by_count[i : i + rows_per_block] for i in range(0, by_count.shape[0], rows_per_block)]
    width = (g + 7) // 8 * 8

    def work(next_block: itertools.count) -> None:
        buf = np.empty((rows_per_block, g), dtype=d.dtype)
        mask = np.zeros((rows_per_block, width), dtype=bool)
        while (b := next(next_block)) < len(blocks):
            rows = blocks[b]
            r = rows.shape[0]
            block = buf[:r]
            np.take(d, rows, axis=0, out=block, mode="clip")
            block[:, junk_cols] = np.nan
            idx, local = _ranges(pair_starts[rows], pair_counts[rows])
            block[local, pair_cols[idx]] = np.nan  # the matches and the same-camera images of the identity
            m = num_matches[rows]
            width_m = int(m.max())
            j = np.arange(width_m)
            valid = j < m[:, None]
            thresholds = np.where(valid, match_dist[np.minimum(match_starts[rows, None] + j, match_dist.size - 1)], 0)
            counts = np.empty((r, width_m), dtype=np.int64)
            _count_at_most(block, thresholds.astype(d.dtype, copy=False), mask, counts)
            position = j + counts  # 0-based rank of the j-th match among the kept gallery images
            first_rank[rows] = position[:, 0]
            precision = np.where(valid, (j + 1) / (position + 1), 0.0)
            ap[rows] = precision.sum(axis=1) / m

    workers = max(1, min(torch.get_num_threads(), len(blocks)))
    shared = itertools.count()  # next() on it is atomic under the GIL: a shared queue of block numbers
    if workers == 1:
        work(shared)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for f in [pool.submit(work, shared) for _ in range(workers)]:
                f.result()


def reid_metrics_reference(
    dist: Tensor,
    query_pids: Tensor,
    gallery_pids: Tensor,
    query_cams: Tensor,
    gallery_cams: Tensor,
    ranks: Sequence[int] = (1, 5, 10),
) -> dict[str, float]:
    """:func:`reid_metrics` the obvious way, one query at a time (slow; for tests and benchmarks): remove the
    junk and same-camera same-identity images, sort the rest by ``(distance, is_match)`` with a stable sort
    (``np.lexsort``: non-matches first among equal distances), and read CMC and AP off the cumulative hits."""
    d, qp, gp, qc, gc, ks = _check_inputs(dist, query_pids, gallery_pids, query_cams, gallery_cams, ranks)
    first_ranks, aps = [], []
    skipped = 0
    for i in range(d.shape[0]):
        keep = (gp != JUNK_PID) & ~((gp == qp[i]) & (gc == qc[i]))
        row, hits = d[i, keep], gp[keep] == qp[i]
        if not hits.any():
            skipped += 1
            continue
        hits = hits[np.lexsort((hits, row))]  # sorted by distance, then non-matches (False) first
        positions = np.flatnonzero(hits)  # 0-based ranks of the matches
        cumulative = np.cumsum(hits)
        first_ranks.append(positions[0])
        aps.append(np.mean(cumulative[positions] / (positions + 1)))
    return _metrics(np.asarray(first_ranks, dtype=np.int64), np.asarray(aps, dtype=np.float64), ks, skipped)


# ------------------------------------------------------------------------------------------------- distances


def pairwise_distances(
    query_feats: Tensor, gallery_feats: Tensor, metric: str = "euclidean", *, squared: bool = True
) -> Tensor:
    """The ``(Q, G)`` distance matrix between ``query_feats (Q, D)`` and ``gallery_feats (G, D)`` (same device,
    floating point; computed in their promoted dtype, on their device).

    metric:
      * ``"euclidean"``: ``|q|^2 + |g|^2 - 2 q.g``, clamped at 0 against rounding, i.e. the *squared* Euclidean
        distance (as torchreid and open-reid use); ``squared=False`` takes its square root. The ranking is the
        same either way (the square root is monotone; it can only merge values that differ by rounding).
      * ``"cosine"``: ``1 - cos(q, g)`` in ``[0, 2]`` (rows L2-normalised first; a zero row has distance 1 to
        everything). ``squared`` is ignored.
    """
    for x, name, shape in ((query_feats, "query_feats", "(Q, D)"), (gallery_feats, "gallery_feats", "(G, D)")):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape {shape}, got {type(x).__name__}")
        if x.ndim != 2:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor of shape {shape}, got dtype {x.dtype}")
    if gallery_feats.shape[1] != query_feats.shape[1]:
        raise ValueError(
            f"query_feats (Q, D) and gallery_feats (G, D) must have the same D, got {tuple(query_feats.shape)} "
            f"and {tuple(gallery_feats.shape)}"
        )
    if gallery_feats.device != query_feats.device:
        raise ValueError(
            f"query_feats and gallery_feats must be on the same device, got {query_feats.device} "
            f"and {gallery_feats.device}"
        )
    dtype = torch.promote_types(query_feats.dtype, gallery_feats.dtype)
    a, b = query_feats.to(dtype), gallery_feats.to(dtype)
    if metric == "euclidean":
        out = torch.addmm(
            a.pow(2).sum(1, keepdim=True) + b.pow(2).sum(1)[None, :], a, b.T, beta=1.0, alpha=-2.0
        ).clamp_(min=0)
        return out if squared else out.sqrt_()
    if metric == "cosine":
        a = torch.nn.functional.normalize(a, dim=1)
        b = torch.nn.functional.normalize(b, dim=1)
        return 1.0 - a @ b.T
    raise ValueError(f"metric must be 'euclidean' or 'cosine', got {metric!r}")
