"""On-the-fly (partial) sketch-based image retrieval metrics of the DARP-SBIR paper (section IV.D): the rank of
the true photo (eq. 4), ``acc@q`` on the complete sketch, the area under the inverse rank (AUIR) and the ranking
percentile versus the completion degree of the sketch.

Inputs everywhere:

* ``queries``: sketch embeddings ``a``, either ``(Q, D)`` (one sketch per query) or ``(Q, S, D)`` (the ``S``
  completion steps of each query sketch, from the first partial sketch to the complete one, in order).
* ``gallery``: photo embeddings ``e``, ``(G, D)``, one row per candidate photo.
* ``target``: ``(Q,)`` integer, the gallery row of each query's true photo (see :func:`gallery_from_pairs` to
  build the gallery and these rows from ``(sketch, photo)`` pairs).
* ``ranks``: the output of :func:`true_ranks`, ``(Q,)`` or ``(Q, S)`` integer ranks ``>= 1``.

Distances are squared Euclidean distances. Ties count against the query: the rank of the true photo is the
number of gallery photos at a distance ``<=`` its own, itself included (eq. 4), so a duplicate of the true photo
in the gallery makes the rank 2. All ratios are float64 fractions in ``[0, 1]``; multiply by 100 for the
percentages of the papers' tables. Everything runs on the inputs' device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "acc_at",
    "auir",
    "gallery_from_pairs",
    "rank_percentile",
    "rank_percentile_curve",
    "retrieval_score",
    "sketch_retrieval_curves",
    "sketch_retrieval_metrics",
    "true_ranks",
]

#: Default cap on the number of entries of one block of the distance matrix (``2**26`` float32 = 256 MiB).
MAX_ELEMENTS = 2**26


def _check_embeddings(x: Tensor, name: str, shapes: str, ndims: tuple[int, ...]) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {shapes}, got {type(x).__name__}")
    if x.ndim not in ndims:
        raise ValueError(f"{name} must have shape {shapes}, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or infinite values")


def _check_index(target: Tensor, name: str, length: int, device: torch.device) -> Tensor:
    """``target`` as an int64 ``(length,)`` tensor on ``device``."""
    if not isinstance(target, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape ({length},), got {type(target).__name__}")
    if target.ndim != 1 or target.shape[0] != length:
        raise ValueError(f"{name} must have shape ({length},) (one entry per query), got {tuple(target.shape)}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got dtype {target.dtype}")
    return target.to(device=device, dtype=torch.int64)


def _check_ranks(ranks: Tensor, ndims: tuple[int, ...] | None = (1, 2), shapes: str = "(Q,) or (Q, S)") -> Tensor:
    """``ranks`` checked: a real tensor with ``ndim`` in ``ndims`` (any if ``None``) and all entries ``>= 1``."""
    if not isinstance(ranks, Tensor):
        raise TypeError(f"ranks must be a torch.Tensor of shape {shapes}, got {type(ranks).__name__}")
    if ndims is not None and ranks.ndim not in ndims:
        raise ValueError(f"ranks must have shape {shapes}, got {tuple(ranks.shape)}")
    if ranks.dtype == torch.bool or ranks.is_complex():
        raise ValueError(f"ranks must be a real tensor of ranks >= 1, got dtype {ranks.dtype}")
    if ranks.numel() and not bool((ranks >= 1).all()):
        raise ValueError(f"ranks must all be >= 1 (the true item counts itself), found minimum {ranks.min().item()}")
    return ranks


def _matmul_unit_roundoff(dtype: torch.dtype, device: torch.device) -> float:
    """Unit roundoff of a matrix product in ``dtype`` on ``device``; float32 products that may run in reduced
    precision (TF32 on CUDA, ``torch.set_float32_matmul_precision`` below ``"highest"``) get bfloat16's."""
    if dtype == torch.float64:
        return 2.0**-53
    reduced = torch.get_float32_matmul_precision() != "highest" or (
        device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    )
    return 2.0**-8 if reduced else 2.0**-24


def _paired_sq_dist(a: Tensor, e: Tensor, a_rows: Tensor, e_rows: Tensor, max_elements: int) -> Tensor:
    """``||a[a_rows[p]] - e[e_rows[p]]||^2`` for each pair ``p``, ``(P,)`` float64, the squares of the coordinate
    differences added in coordinate order: elementwise operations only, so the value is a fixed function of the
    pair's coordinates (identical pairs give identical values, wherever they sit). At most about
    ``max_elements`` coordinates are gathered at once."""
    out = torch.zeros(a_rows.shape[0], dtype=torch.float64, device=a.device)
    step = max(1, max_elements // max(1, a.shape[1]))
    for start in range(0, a_rows.shape[0], step):
        stop = start + step
        diff = a[a_rows[start:stop]].to(torch.float64) - e[e_rows[start:stop]].to(torch.float64)
        sq = diff * diff
        acc = out[start:stop]
        for k in range(sq.shape[1]):
            acc += sq[:, k]
    return out


def true_ranks(queries: Tensor, gallery: Tensor, target: Tensor, max_elements: int = MAX_ELEMENTS) -> Tensor:
    """Rank of the true gallery item of each query (and completion step), eq. 4 of the DARP-SBIR paper.

    queries: ``(Q, D)`` or ``(Q, S, D)`` sketch embeddings ``a``.
    gallery: ``(G, D)`` photo embeddings ``e``, on the same device.
    target: ``(Q,)`` integer gallery row of each query's true photo, ``0 <= target < G``.
    max_elements: largest number of (query step, gallery item) entries held at once; the queries are processed
        in blocks of ``max(1, max_elements // (S * G))`` queries.

    Returns ``(Q,)`` or ``(Q, S)`` int64 ranks ``rank = #{j : ||e_j - a||^2 <= ||e_true - a||^2}``, in ``[1, G]``:
    ties count against the query and the true item counts itself.

    One matrix pass per block: ``c_j = ||e_j||^2 - 2 a . e_j`` for all items by one matrix product in the inputs'
    floating dtype (float16/bfloat16 are raised to float32); this is ``||e_j - a||^2`` less ``||a||^2``, a
    constant of the row that changes no comparison within it. The true item's ``c`` is gathered from that same
    matrix, and a rounding-error bound ``tol`` of the product splits the row into items surely closer
    (``c_j < c_true - tol``), surely further (``c_j > c_true + tol``) and near-ties. A matrix product does not
    give bit-identical results for identical columns (BLAS edge tiles round differently), so the near-ties,
    which include the true item itself and every duplicate of it, are settled by recomputing ``||e_j - a||^2``
    and ``||e_true - a||^2`` directly in float64 (squared coordinate differences added in order): identical
    gallery rows then always tie, and other exact ties (e.g. items placed symmetrically about the query with
    exactly representable coordinates) are counted too. Near-ties are rare, so this costs little beyond the
    product; the result agrees with exact arithmetic on the inputs up to float64 rounding of the near-ties.
    """
    t = _check_rank_inputs(queries, gallery, target, max_elements)
    q, (g, d) = queries.shape[0], gallery.shape
    dtype = torch.promote_types(queries.dtype, gallery.dtype)
    if dtype not in (torch.float32, torch.float64):
        dtype = torch.float32
    steps = queries.shape[1] if queries.ndim == 3 else 1
    n = q * steps
    ranks = torch.empty(n, dtype=torch.int64, device=queries.device)
    if n == 0:
        return ranks.reshape(q, steps) if queries.ndim == 3 else ranks
    a = queries.detach().to(dtype).reshape(n, d)  # query-major: rows i*S .. i*S + S-1 are query i
    e = gallery.detach().to(dtype)
    e_sq = (e * e).sum(1)  # (G,)
    rows_t = t.repeat_interleave(steps)  # (n,) true gallery row of each query step
    # |error of c_j| <= (D + 2) u (||e_j||^2 + 2 ||a|| ||e_j||); tol bounds the error of c_j - c_true, twice over.
    u = _matmul_unit_roundoff(dtype, queries.device)
    e_sq_max = e_sq.max()
    slack = 4.0 * (d + 2)
    tol = slack * u * (e_sq_max + 2.0 * a.norm(dim=1) * e_sq_max.sqrt()) + slack * torch.finfo(dtype).tiny  # (n,)

    block = max(1, max_elements // (steps * g)) * steps  # whole queries per block
    for start in range(0, n, block):
        stop = min(start + block, n)
        c = torch.addmm(e_sq.unsqueeze(0), a[start:stop], e.T, beta=1.0, alpha=-2.0)  # (rows, G)
        c_true = c.gather(1, rows_t[start:stop].unsqueeze(1))  # (rows, 1), from the same matrix
        lo = c_true - tol[start:stop, None]
        hi = c_true + tol[start:stop, None]
        below = (c < lo).sum(1, dtype=torch.int32)  # surely closer than the true item (int32: faster sums)
        in_band = (c <= hi).sum(1, dtype=torch.int32) - below  # near-ties, the true item included (>= 1)
        rank = below.to(torch.int64) + 1
        tied = (in_band > 1).nonzero().squeeze(1)  # rows with a near-tie besides the true item
        sub = max(1, max_elements // (8 * g))  # rows refined at once: bounds the (row, item) pair indices
        for first in range(0, tied.numel(), sub):
            rows = tied[first : first + sub]  # rows within the block
            band = (c[rows] >= lo[rows]) & (c[rows] <= hi[rows])
            pair_row, pair_item = band.nonzero(as_tuple=True)
            rows_a = start + rows  # rows of a
            d_true = _paired_sq_dist(a, e, rows_a, rows_t[rows_a], max_elements)  # (rows,)
            d_pair = _paired_sq_dist(a, e, rows_a[pair_row], pair_item, max_elements)
            counted = torch.zeros(rows.numel(), dtype=torch.int64, device=c.device)
            counted.index_add_(0, pair_row, (d_pair <= d_true[pair_row]).to(torch.int64))
            rank[rows] = below[rows].to(torch.int64) + counted
        ranks[start:stop] = rank
    return ranks.reshape(q, steps) if queries.ndim == 3 else ranks


def _check_rank_inputs(queries: Tensor, gallery: Tensor, target: Tensor, max_elements: int) -> Tensor:
    """:func:`true_ranks`' arguments checked, with a one-line error for each mistake; returns ``target`` as
    an index tensor ``(Q,)`` on the queries' device."""
    _check_embeddings(queries, "queries", "(Q, D) or (Q, S, D)", (2, 3))
    _check_embeddings(gallery, "gallery", "(G, D)", (2,))
    if gallery.device != queries.device:
        raise ValueError(f"queries and gallery must be on the same device, got {queries.device} and {gallery.device}")
    if gallery.shape[1] != queries.shape[-1]:
        raise ValueError(
            f"queries and gallery must have the same embedding size D, got queries {tuple(queries.shape)} "
            f"and gallery {tuple(gallery.shape)}"
        )
    q = queries.shape[0]
    t = _check_index(target, "target", q, queries.device)
    g = gallery.shape[0]
    if q and (g == 0 or not bool(((t >= 0) & (t < g)).all())):
        bad = t[(t < 0) | (t >= g)]
        raise ValueError(f"target must hold gallery rows in [0, {g}) (G = {g}), found {bad[:5].tolist()}")
    if max_elements < 1:
        raise ValueError(f"max_elements must be >= 1, got {max_elements}")
    return t


def retrieval_score(ranks: Tensor) -> Tensor:
    """The retrieval score ``1 / rank`` of eq. 4, float64, same shape as ``ranks`` (any shape, ranks ``>= 1``)."""
    r = _check_ranks(ranks, ndims=None, shapes="(...)")
    return 1.0 / r.to(torch.float64)


def acc_at(ranks: Tensor, q: int) -> float:
    """``acc@q``: the fraction of queries whose true photo is in the top ``q`` on the complete sketch.

    ranks: ``(Q,)`` ranks of the complete sketches, or ``(Q, S)``, of which the last step (the complete sketch)
        is used. q: ``>= 1``. Returns ``#{i : rank_i <= q} / Q`` (``nan`` for ``Q = 0``).
    """
    r = _check_ranks(ranks)
    if isinstance(q, bool) or not isinstance(q, int) or q < 1:
        raise ValueError(f"q must be an integer >= 1, got {q!r}")
    if r.ndim == 2 and r.shape[1] == 0:
        raise ValueError(f"ranks must have at least one completion step (S >= 1), got {tuple(r.shape)}")
    last = r[:, -1] if r.ndim == 2 else r
    if last.numel() == 0:
        return float("nan")
    return float((last <= q).to(torch.float64).mean())


def auir(ranks: Tensor) -> float:
    """Area under the inverse rank (AUIR), the partial-sketch metric of the DARP-SBIR paper.

    ranks: ``(Q, S)``, the rank of the true photo after each of the ``S`` completion steps of each query.

    For query ``i`` the area under ``1 / rank`` versus the completion degree ``x_s = s / S``, ``s = 1..S``, by the
    right-Riemann (step) rule: ``AUIR_i = sum_s (x_s - x_{s-1}) / rank_{i,s} = (1/S) sum_s 1 / rank_{i,s}`` with
    ``x_0 = 0``, i.e. the mean inverse rank over the steps. The result is the mean of ``AUIR_i`` over the queries.
    The paper does not fix the quadrature; with the step rule, perfect retrieval at every step gives 1.0 and a
    query retrieved at rank 1 from step ``k`` on (and at a very large rank before) gets ``(S - k + 1) / S``.
    Returns a float in ``(0, 1]`` (``nan`` for ``Q = 0`` or ``S = 0``).
    """
    r = _check_ranks(ranks, ndims=(2,), shapes="(Q, S)")
    if r.numel() == 0:
        return float("nan")
    return float((1.0 / r.to(torch.float64)).mean(1).mean(0))


def _check_gallery_size(ranks: Tensor, gallery_size: int) -> None:
    if isinstance(gallery_size, bool) or not isinstance(gallery_size, int) or gallery_size < 1:
        raise ValueError(f"gallery_size must be an integer >= 1, got {gallery_size!r}")
    if ranks.numel() and not bool((ranks <= gallery_size).all()):
        raise ValueError(f"ranks must be <= gallery_size = {gallery_size}, found maximum {ranks.max().item()}")


def rank_percentile(ranks: Tensor, gallery_size: int) -> Tensor:
    """Ranking percentile ``(N - rank) / N`` of each query (and step), float64, same shape as ``ranks``.

    ranks: ``(Q,)`` or ``(Q, S)`` ranks in ``[1, N]``; gallery_size: ``N``, the number of gallery photos.

    This is the paper's ``(N - sum_j 1(||e_j - a||^2 <= ||e_i - a||^2)) / N``: the fraction of the gallery ranked
    strictly behind the true photo, ``(N - 1) / N`` at rank 1 and 0 at rank ``N`` (0.9: in the top 10%).
    """
    r = _check_ranks(ranks)
    _check_gallery_size(r, gallery_size)
    return (gallery_size - r.to(torch.float64)) / gallery_size


def rank_percentile_curve(ranks: Tensor, gallery_size: int) -> Tensor:
    """The ranking percentile versus the completion degree: :func:`rank_percentile` of ``ranks (Q, S)`` averaged
    over the queries, ``(S,)`` float64 (the curve of the paper's Fig. 7; ``nan`` for ``Q = 0``)."""
    r = _check_ranks(ranks, ndims=(2,), shapes="(Q, S)")
    return rank_percentile(r, gallery_size).mean(0)


def _check_ks(ks: Sequence[int]) -> list[int]:
    out = list(ks)
    for k in out:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"ks must be integers >= 1, got {tuple(ks)!r}")
    return out


def _steps_ranks(query_emb: Tensor, gallery_emb: Tensor, target: Tensor, max_elements: int) -> Tensor:
    """``(Q, S)`` ranks; a ``(Q, D)`` query is a single (complete) step."""
    _check_embeddings(query_emb, "query_emb", "(Q, S, D) or (Q, D)", (2, 3))
    _check_embeddings(gallery_emb, "gallery_emb", "(G, D)", (2,))
    if query_emb.ndim == 3 and query_emb.shape[1] == 0:
        raise ValueError(f"query_emb must have at least one completion step (S >= 1), got {tuple(query_emb.shape)}")
    r = true_ranks(query_emb, gallery_emb, target, max_elements=max_elements)
    return r.unsqueeze(1) if r.ndim == 1 else r


def sketch_retrieval_metrics(
    query_emb: Tensor,
    gallery_emb: Tensor,
    target: Tensor,
    ks: Sequence[int] = (1, 5, 10),
    max_elements: int = MAX_ELEMENTS,
) -> dict[str, float]:
    """All on-the-fly sketch retrieval metrics of the DARP-SBIR paper at once.

    query_emb: ``(Q, S, D)`` sketch embeddings after each completion step (``(Q, D)``: complete sketches only).
    gallery_emb: ``(G, D)`` photo embeddings. target: ``(Q,)`` gallery row of each query's true photo.
    ks: the ``q`` of the reported ``acc@q``. max_elements: see :func:`true_ranks`.

    Returns exactly the keys ``acc@q`` for each ``q`` in ``ks`` (:func:`acc_at`, on the complete sketch = last
    step), ``auir`` (:func:`auir`), ``mean_rank`` (mean rank on the complete sketch, in ``[1, G]``),
    ``percentile`` (:func:`rank_percentile` averaged over queries and steps) and the partial-sketch protocol's
    ``acc@q_steps`` and ``mean_rank_steps`` (the same averaged over the S completion steps too). All but the mean
    ranks are in percent (0-100, as the paper prints them; :func:`acc_at`, :func:`auir` and
    :func:`rank_percentile` return fractions); the mean ranks are ranks in ``[1, G]``.
    """
    ks = _check_ks(ks)
    r = _steps_ranks(query_emb, gallery_emb, target, max_elements)
    out = {f"acc@{k}": 100.0 * acc_at(r, k) for k in ks}
    out["auir"] = 100.0 * auir(r)
    out["mean_rank"] = float(r[:, -1].to(torch.float64).mean()) if r.numel() else float("nan")
    for k in ks:
        out[f"acc@{k}_steps"] = 100.0 * float((r <= k).to(torch.float64).mean()) if r.numel() else float("nan")
    out["mean_rank_steps"] = float(r.to(torch.float64).mean()) if r.numel() else float("nan")
    out["percentile"] = 100.0 * float(rank_percentile(r, gallery_emb.shape[0]).mean()) if r.numel() else float("nan")
    return out


def sketch_retrieval_curves(
    query_emb: Tensor,
    gallery_emb: Tensor,
    target: Tensor,
    max_elements: int = MAX_ELEMENTS,
) -> dict[str, Tensor]:
    """Per-completion-step curves for figures, each ``(S,)`` float64 on the inputs' device, averaged over the
    queries: ``percentile`` (:func:`rank_percentile_curve`, the paper's Fig. 7), ``inverse_rank`` (mean
    ``1 / rank``; its mean over the steps is the AUIR) and ``acc@1`` (fraction of queries at rank 1).
    Arguments as in :func:`sketch_retrieval_metrics`."""
    r = _steps_ranks(query_emb, gallery_emb, target, max_elements)
    return {
        "percentile": rank_percentile_curve(r, gallery_emb.shape[0]),
        "inverse_rank": retrieval_score(r).mean(0),
        "acc@1": (r == 1).to(torch.float64).mean(0),
    }


def gallery_from_pairs(
    photo_emb: Tensor,
    target: Tensor,
    atol: float | None = 1e-4,
    rtol: float = 1e-4,
) -> tuple[Tensor, Tensor]:
    """Build the gallery from ``(sketch, photo)`` pairs where each query comes with its true photo's embedding.

    photo_emb: ``(Q, D)`` embedding of the true photo of each query; several queries may share a photo.
    target: ``(Q,)`` integer photo id of each query (any integers, e.g. dataset indices).
    atol, rtol: all embeddings of one photo are expected to be equal (the photo network is deterministic in
        evaluation mode); each is checked against the first one with ``|x - x_first| <= atol + rtol |x_first|``,
        and a ``ValueError`` names the first photo id that fails. ``atol=None`` skips the check.

    Returns ``(gallery (G, D), target_row (Q,) int64)``: one gallery row per distinct photo id, in increasing id
    order (row ``k`` is the ``k``-th smallest id, i.e. ``torch.unique(target)[k]``), holding the embedding of the
    id's first occurrence, and each query's id remapped to its gallery row.
    """
    _check_embeddings(photo_emb, "photo_emb", "(Q, D)", (2,))
    q = photo_emb.shape[0]
    ids = _check_index(target, "target", q, photo_emb.device)
    unique_ids, rows = torch.unique(ids, sorted=True, return_inverse=True)
    order = torch.arange(q, device=photo_emb.device)
    first = torch.full((len(unique_ids),), q, dtype=torch.int64, device=photo_emb.device)
    first = first.scatter_reduce(0, rows, order, reduce="amin")  # first occurrence of each id
    gallery = photo_emb[first]
    if atol is not None and q:
        ref = gallery[rows]
        diff = (photo_emb - ref).abs()
        bad = (diff > atol + rtol * ref.abs()).any(1)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"photo id {int(ids[i])} has different embeddings at query {i} and at its first occurrence "
                f"{int(first[rows[i]])} (max abs difference {float(diff[i].max()):.3g} > atol={atol}, rtol={rtol}); "
                "the photo network should be deterministic (eval mode)"
            )
    return gallery, rows
