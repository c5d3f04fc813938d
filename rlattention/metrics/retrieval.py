"""Image-text retrieval metrics (image -> text "i2t" and text -> image "t2i"), as printed in the tables of the
VSE++ / SCAN / VSRN / DCPG papers: R@1, R@5, R@10 in percent, the median and mean rank, and rsum, on
Flickr30K, COCO 1K (mean over 5 folds of 1,000 images) and COCO 5K (the whole test set).

Inputs everywhere:

* ``sims``: ``(N, C)`` real similarities, one row per image, one column per caption (cosine similarities when
  the embeddings are L2-normalised, but any real score works: only the order within a row or column matters).
* ``caption_to_image``: ``(C,)`` integer, the image (row of ``sims``) that caption ``j`` describes. ``None``
  means the VSE++/SCAN ``precomp`` layout: ``C = k N`` captions, ``k`` per image in image order, so caption
  ``j`` belongs to image ``j // k`` (``k = 5`` for Flickr30K and COCO). Any mapping is accepted, with unequal
  numbers of captions per image (:func:`caption_to_image_from_counts` builds one from the counts), as long as
  every image has at least one caption.
* ``img`` ``(N, D)`` and ``cap`` ``(C, D)``: embeddings, ``sims = img @ cap.T``.

Ranks are 0-based (0 = retrieved first), int64. The rank of a query is the number of NON-matching items whose
similarity is ``>=`` the similarity of the best matching item: ties count against the query, in both
directions. Equivalently, it is the position of the first matching item when the items are sorted by
decreasing similarity and, among equal similarities, the non-matching items come first.

* i2t, image ``i``: matching items are its captions; with ``M_i`` the largest similarity among them,
  ``rank_i = #{j : caption j is not of image i, sims[i, j] >= M_i}``. Its own captions never count against it,
  even when they tie with each other (that is the VSE code's "best rank over the 5 captions", made
  deterministic for ties).
* t2i, caption ``j`` of image ``m_j``: ``rank_j = #{i != m_j : sims[i, j] >= sims[m_j, j]}``.

NaN similarities are an error; ``+-inf`` are ordered as usual. Every comparison is made on the values of
``sims`` as given (no tolerance), in its own dtype, on its device.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "MAX_ELEMENTS",
    "caption_to_image_from_counts",
    "coco_1k_folds",
    "coco_5k",
    "metrics_from_ranks",
    "retrieval_metrics",
    "retrieval_metrics_from_embeddings",
    "retrieval_ranks",
    "retrieval_ranks_from_embeddings",
]

#: Largest similarity matrix (``N * C`` entries) that :func:`retrieval_ranks_from_embeddings` holds at once
#: (``2**28`` float32 = 1 GiB; COCO 5K is ``1.25e8``). Beyond it, each direction gets its own product in blocks.
MAX_ELEMENTS = 2**28

#: Entries of ``sims`` compared per step on the CPU: a block of rows small enough to stay in the CPU caches (its
#: boolean mask is reused), so that both directions cost about one read of ``sims``.
CPU_CHUNK_ELEMENTS = 2**18

#: The same on other devices (GPU): fewer, larger steps.
DEVICE_CHUNK_ELEMENTS = 2**26

#: Count float32/float64 CPU blocks with numpy in Python threads (see :func:`_ge_counts`); ``False``: with torch
#: operations, as on other devices (the tests run both).
NUMPY_ON_CPU = True

#: Entries of one block of the similarity matrix computed by a single matrix product when ``N * C`` exceeds
#: ``max_elements`` (large enough for an efficient product).
PRODUCT_BLOCK_ELEMENTS = 2**24

RECALL_KS = (1, 5, 10)
METRIC_KEYS = tuple(f"{d}_{name}" for d in ("i2t", "t2i") for name in ("r1", "r5", "r10", "medr", "meanr")) + ("rsum",)


# ------------------------------------------------------------------------------------------------- checks


def _check_sims(sims: Tensor) -> None:
    if not isinstance(sims, Tensor):
        raise TypeError(f"sims must be a torch.Tensor of shape (N, C) (images x captions), got {type(sims).__name__}")
    if sims.ndim != 2:
        raise ValueError(f"sims must have shape (N, C) (rows: images, columns: captions), got {tuple(sims.shape)}")
    if not sims.is_floating_point():
        raise ValueError(f"sims must be a floating-point tensor, got dtype {sims.dtype}")
    if sims.shape[0] == 0 or sims.shape[1] == 0:
        raise ValueError(f"sims must have at least one image row and one caption column, got {tuple(sims.shape)}")


def _check_embeddings(x: Tensor, name: str, shape: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {shape}, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} must have at least one row, got {tuple(x.shape)}")
    # A sum is a fast reduction and is finite when every entry is (barring overflow, then checked entrywise).
    if not bool(torch.isfinite(x.sum())) and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or infinite values")


def _check_pair(img: Tensor, cap: Tensor) -> None:
    _check_embeddings(img, "img", "(N, D)")
    _check_embeddings(cap, "cap", "(C, D)")
    if cap.shape[1] != img.shape[1]:
        raise ValueError(
            f"cap must have shape (C, D) with the same D as img (N, D), got img {tuple(img.shape)} "
            f"and cap {tuple(cap.shape)}"
        )
    if cap.device != img.device:
        raise ValueError(f"img and cap must be on the same device, got {img.device} and {cap.device}")


def _mapping(caption_to_image: Tensor | None, n: int, c: int, device: torch.device) -> Tensor:
    """The validated ``(C,)`` int64 caption -> image mapping on ``device``."""
    if caption_to_image is None:
        if c % n:
            raise ValueError(
                f"with caption_to_image=None the C = {c} captions must be k per image for the N = {n} images "
                f"(C a multiple of N, caption j of image j // k); pass caption_to_image of shape ({c},) otherwise"
            )
        return torch.arange(c, device=device) // (c // n)
    m = caption_to_image
    if not isinstance(m, Tensor):
        raise TypeError(f"caption_to_image must be a torch.Tensor of shape ({c},) or None, got {type(m).__name__}")
    if m.ndim != 1 or m.shape[0] != c:
        raise ValueError(
            f"caption_to_image must have shape (C,) = ({c},) (one image per caption), got {tuple(m.shape)}"
        )
    if m.is_floating_point() or m.is_complex() or m.dtype == torch.bool:
        raise ValueError(f"caption_to_image must be an integer tensor, got dtype {m.dtype}")
    m = m.to(device=device, dtype=torch.int64)
    bad = (m < 0) | (m >= n)
    if bool(bad.any()):
        raise ValueError(f"caption_to_image must hold image indices in [0, {n}) (N = {n}), found {m[bad][:5].tolist()}")
    missing = (torch.bincount(m, minlength=n) == 0).nonzero().squeeze(1)
    if missing.numel():
        raise ValueError(
            f"caption_to_image: every image needs at least one caption; images {missing[:5].tolist()} "
            f"({missing.numel()} in all) have none"
        )
    return m


def _chunk_rows(chunk_elements: int | None, width: int, device: torch.device) -> int:
    if chunk_elements is None:
        chunk_elements = CPU_CHUNK_ELEMENTS if device.type == "cpu" else DEVICE_CHUNK_ELEMENTS
    if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int) or chunk_elements < 1:
        raise ValueError(f"chunk_elements must be an integer >= 1 or None, got {chunk_elements!r}")
    return max(1, chunk_elements // max(1, width))


def caption_to_image_from_counts(counts: Tensor | Sequence[int], device: torch.device | str | None = None) -> Tensor:
    """The ``(C,)`` int64 caption -> image mapping of captions stored image by image, ``counts[i]`` (``>= 1``)
    captions for image ``i``: ``[0] * counts[0] + [1] * counts[1] + ...``, ``C = sum(counts)``.

    counts: ``(N,)`` integers. device: of the result (default: that of ``counts`` if a tensor, else the CPU).
    """
    t = counts if isinstance(counts, Tensor) else torch.as_tensor(list(counts), dtype=torch.int64)
    if t.ndim != 1 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"counts must be a 1-D integer sequence of shape (N,), got shape {tuple(t.shape)}, {t.dtype}")
    if t.numel() and int(t.min()) < 1:
        raise ValueError(f"counts must all be >= 1 (every image needs a caption), found {int(t.min())}")
    t = t.to(device=device if device is not None else t.device, dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(t.numel(), device=t.device), t)


# ------------------------------------------------------------------------------------------------- ranks


def _own_best(values: Tensor, m: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """From ``values[j] = sims[m_j, j]`` ``(C,)``: ``M (N,)``, the best similarity of each image's own captions,
    and ``ties (N,)`` int64, how many of its own captions reach it (``>= 1``)."""
    best = torch.full((n,), float("-inf"), dtype=values.dtype, device=values.device)
    best = best.scatter_reduce(0, m, values, reduce="amax", include_self=True)
    ties = torch.zeros(n, dtype=torch.int64, device=values.device)
    ties.index_add_(0, m, (values >= best[m]).to(torch.int64))
    return best, ties


def _nan_error(name: str) -> ValueError:
    return ValueError(f"{name} contains NaN values: ranks are undefined")


def retrieval_ranks(
    sims: Tensor, caption_to_image: Tensor | None = None, chunk_elements: int | None = None
) -> tuple[Tensor, Tensor]:
    """0-based ranks of every image query (i2t) and every caption query (t2i), ties against the query.

    sims: ``(N, C)`` similarities (rows: images, columns: captions), any floating dtype, any device.
    caption_to_image: ``(C,)`` integer image of each caption, or ``None`` for ``k = C / N`` captions per image
        in image order (see the module docstring).
    chunk_elements: about how many entries of ``sims`` are compared per step (default: 2**18 on the CPU, 2**26
        on other devices); the result does not depend on it.

    Returns ``(i2t_rank (N,), t2i_rank (C,))`` int64 on the device of ``sims``, in ``[0, C - 1]`` and
    ``[0, N - 1]``: ``i2t_rank[i] = #{j : m_j != i, sims[i, j] >= M_i}`` with ``M_i = max_{m_j = i} sims[i, j]``
    and ``t2i_rank[j] = #{i != m_j : sims[i, j] >= sims[m_j, j]}``.

    One pass over ``sims``, no sort and no loop over queries: the true similarities ``t_j = sims[m_j, j]`` are
    gathered (``(C,)``) and ``M`` is their per-image maximum; then, block of rows by block of rows, one
    comparison with ``t`` (broadcast along the rows) summed over the rows counts the t2i ranks and one comparison
    with ``M`` (broadcast along the columns) summed over the columns counts the i2t ranks. The true entry counts
    itself once in the t2i count, and an image's own captions equal to ``M_i`` are removed from the i2t count.
    Float32/float64 CPU blocks are compared by numpy in ``torch.get_num_threads()`` Python threads, each on its
    own range of rows; other dtypes and devices by torch operations (same results).
    """
    _check_sims(sims)
    n, c = sims.shape
    m = _mapping(caption_to_image, n, c, sims.device)
    s = sims.detach()
    cols = torch.arange(c, device=s.device)
    t = s[m, cols]  # (C,) similarity of each caption with its own image
    best, ties = _own_best(t, m, n)  # (N,), (N,)
    row_ge, col_ge = _ge_counts(s, best, t, chunk_elements, "sims")
    return row_ge - ties, col_ge - 1


def _product_dtype(img: Tensor, cap: Tensor) -> torch.dtype:
    dtype = torch.promote_types(img.dtype, cap.dtype)
    if img.device.type == "cpu" and dtype not in (torch.float32, torch.float64):
        dtype = torch.float32  # half-precision products are slow on the CPU
    return dtype


def retrieval_ranks_from_embeddings(
    img: Tensor,
    cap: Tensor,
    caption_to_image: Tensor | None = None,
    max_elements: int = MAX_ELEMENTS,
    chunk_elements: int | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`retrieval_ranks` of ``sims = img @ cap.T`` (cosine similarities if the caller L2-normalised).

    img: ``(N, D)`` image embeddings; cap: ``(C, D)`` caption embeddings, same device; caption_to_image as in
    :func:`retrieval_ranks`. The product runs in the promoted dtype of the two (float16/bfloat16 raised to
    float32 on the CPU).
    max_elements: if ``N * C <= max_elements`` (default :data:`MAX_ELEMENTS`), ``sims`` is computed by one
        matrix product and ranked by :func:`retrieval_ranks`: the cost is the product plus about one read of
        ``sims``. Otherwise no ``(N, C)`` matrix is held: the i2t ranks come from ``img @ cap.T`` and the t2i
        ranks from ``cap @ img.T``, each computed in blocks of rows, so the products cost twice as much; each
        direction is then exact for its own product (the two products may round a few entries differently).
    chunk_elements: see :func:`retrieval_ranks`.

    Returns ``(i2t_rank (N,), t2i_rank (C,))`` int64, 0-based, ties against the query.
    """
    _check_pair(img, cap)
    if isinstance(max_elements, bool) or not isinstance(max_elements, int) or max_elements < 1:
        raise ValueError(f"max_elements must be an integer >= 1, got {max_elements!r}")
    n, c = img.shape[0], cap.shape[0]
    m = _mapping(caption_to_image, n, c, img.device)
    dtype = _product_dtype(img, cap)
    a, e = img.detach().to(dtype), cap.detach().to(dtype)
    if n * c <= max_elements:
        return retrieval_ranks(a @ e.T, m, chunk_elements)

    # i2t: blocks of images against all captions; the own captions of a block's images lie in the block's rows.
    i2t = torch.empty(n, dtype=torch.int64, device=a.device)
    step = max(1, min(max_elements, PRODUCT_BLOCK_ELEMENTS) // c)
    for start in range(0, n, step):
        block = a[start : start + step] @ e.T  # (r, C)
        r = block.shape[0]
        own = ((m >= start) & (m < start + r)).nonzero().squeeze(1)  # captions of these images
        t = block[m[own] - start, own]
        best, ties = _own_best(t, m[own] - start, r)
        i2t[start : start + r] = _ge_counts(block, best, None, chunk_elements, "img @ cap.T")[0] - ties
    # t2i: blocks of captions against all images; each row holds its own true image.
    t2i = torch.empty(c, dtype=torch.int64, device=a.device)
    step = max(1, min(max_elements, PRODUCT_BLOCK_ELEMENTS) // n)
    for start in range(0, c, step):
        block = e[start : start + step] @ a.T  # (r, N)
        r = block.shape[0]
        t = block[torch.arange(r, device=a.device), m[start : start + r]]
        t2i[start : start + r] = _ge_counts(block, t, None, chunk_elements, "cap @ img.T")[0] - 1
    return i2t, t2i


def _ge_counts(
    s: Tensor, row_threshold: Tensor, col_threshold: Tensor | None, chunk_elements: int | None, name: str
) -> tuple[Tensor, Tensor | None]:
    """Counts of a matrix ``s (R, W)`` against per-row and per-column thresholds, one pass in blocks of rows:
    ``row_ge[i] = #{j : s[i, j] >= row_threshold[i]}`` ``(R,)`` and, if ``col_threshold (W,)`` is given,
    ``col_ge[j] = #{i : s[i, j] >= col_threshold[j]}`` ``(W,)``, both int64 on the device of ``s``. Raises a
    ``ValueError`` naming ``name`` if ``s`` holds a NaN.

    On the CPU (float32/float64) the blocks are compared by numpy in ``torch.get_num_threads()`` Python threads,
    each on its own contiguous range of rows (numpy releases the GIL): no synchronisation between the blocks,
    which keeps the speed when other processes share the cores (torch's parallel operations would meet at a
    barrier several times per block). Elsewhere, torch operations on the device, block by block.
    """
    r, w = s.shape
    rows = _chunk_rows(chunk_elements, w, s.device)
    if NUMPY_ON_CPU and s.device.type == "cpu" and s.dtype in (torch.float32, torch.float64):
        chunks = (r + rows - 1) // rows
        workers = max(1, min(torch.get_num_threads(), chunks))
        bounds = [min(r, rows * ((chunks * k) // workers)) for k in range(workers + 1)]
        args = (
            s.numpy(),
            row_threshold.numpy(),
            None if col_threshold is None else col_threshold.numpy(),
            rows,
        )
        if workers == 1:
            parts = [_ge_counts_numpy(*args, 0, r)]
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(_ge_counts_numpy, *args, lo, hi) for lo, hi in itertools.pairwise(bounds)]
                parts = [f.result() for f in futures]
        if any(p[2] for p in parts) and bool(np.isnan(args[0]).any()):
            raise _nan_error(name)
        row_ge = torch.from_numpy(np.concatenate([p[0] for p in parts]))
        col_ge = None if col_threshold is None else torch.from_numpy(sum(p[1] for p in parts).astype(np.int64))
        return row_ge, col_ge

    row_ge = torch.empty(r, dtype=torch.int64, device=s.device)
    col_ge = None if col_threshold is None else torch.zeros(w, dtype=torch.int32, device=s.device)
    mask = torch.empty(min(rows, r), w, dtype=torch.bool, device=s.device)
    sums = torch.empty((r + rows - 1) // rows, dtype=s.dtype, device=s.device)
    for k, start in enumerate(range(0, r, rows)):
        block = s[start : start + rows]  # (rows, W)
        b = mask[: block.shape[0]]
        if col_ge is not None:
            torch.ge(block, col_threshold, out=b)
            col_ge += b.sum(0, dtype=torch.int32)
        torch.ge(block, row_threshold[start : start + rows, None], out=b)
        row_ge[start : start + rows] = b.sum(1, dtype=torch.int32)
        sums[k] = block.sum()  # NaN iff the block holds a NaN (or both +inf and -inf)
    if bool(torch.isnan(sums).any()) and bool(torch.isnan(s).any()):
        raise _nan_error(name)
    return row_ge, None if col_ge is None else col_ge.to(torch.int64)


def _ge_counts_numpy(
    s: np.ndarray, row_threshold: np.ndarray, col_threshold: np.ndarray | None, rows: int, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray | None, bool]:
    """:func:`_ge_counts` of rows ``lo:hi`` in numpy: ``(row_ge (hi - lo,), col_ge (W,) or None, maybe_nan)``."""
    w = s.shape[1]
    row_ge = np.empty(hi - lo, dtype=np.int64)
    col_ge = None if col_threshold is None else np.zeros(w, dtype=np.int32)
    mask = np.empty((max(0, min(rows, hi - lo)), w), dtype=bool)
    maybe_nan = False
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, overflow in the NaN probe: no warnings
        for start in range(lo, hi, rows):
            stop = min(start + rows, hi)
            block = s[start:stop]
            b = mask[: stop - start]
            if col_ge is not None:
                np.greater_equal(block, col_threshold, out=b)  # s[i, j] >= col_threshold[j]
                col_ge += b.sum(0, dtype=np.int32)
            np.greater_equal(block, row_threshold[start:stop, None], out=b)  # s[i, j] >= row_threshold[i]
            row_ge[start - lo : stop - lo] = b.sum(1)
            maybe_nan = maybe_nan or bool(np.isnan(block.sum()))  # NaN iff a NaN (or both +inf and -inf)
    return row_ge, col_ge, maybe_nan


# ------------------------------------------------------------------------------------------------- metrics


def _check_ranks(ranks: Tensor, name: str, shape: str) -> Tensor:
    if not isinstance(ranks, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {shape}, got {type(ranks).__name__}")
    if ranks.ndim != 1 or ranks.shape[0] == 0:
        raise ValueError(f"{name} must have shape {shape} with at least one query, got {tuple(ranks.shape)}")
    if ranks.is_floating_point() or ranks.is_complex() or ranks.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of 0-based ranks, got dtype {ranks.dtype}")
    if bool((ranks < 0).any()):
        raise ValueError(f"{name} must hold 0-based ranks >= 0, found minimum {int(ranks.min())}")
    return ranks.to(torch.int64)


def _median(x: Tensor) -> float:
    """The median as numpy defines it: the middle value, or the mean of the two middle values of an even count."""
    v = torch.sort(x.to(torch.float64)).values
    k = v.numel()
    return float(v[k // 2]) if k % 2 else float((v[k // 2 - 1] + v[k // 2]) / 2)


def metrics_from_ranks(i2t_rank: Tensor, t2i_rank: Tensor) -> dict[str, float]:
    """The table metrics of 0-based ranks ``i2t_rank (N,)`` and ``t2i_rank (C,)`` (:func:`retrieval_ranks`).

    Returns the keys ``i2t_r1, i2t_r5, i2t_r10, i2t_medr, i2t_meanr, t2i_r1, t2i_r5, t2i_r10, t2i_medr,
    t2i_meanr, rsum``:

    * ``r{k} = 100 * #{queries with rank < k} / #queries``, in percent ``[0, 100]`` as the papers print them;
    * ``medr``: the median of the 1-based ranks ``rank + 1``, numpy's median (for an even number of queries,
      the mean of the two middle values, so it may end in .5; the VSE++/SCAN code prints
      ``floor(median(rank)) + 1``, which is ``floor`` of ours);
    * ``meanr``: the mean of the 1-based ranks;
    * ``rsum = i2t_r1 + i2t_r5 + i2t_r10 + t2i_r1 + t2i_r5 + t2i_r10``, exactly (summed in this order).
    """
    ranks = {
        "i2t": _check_ranks(i2t_rank, "i2t_rank", "(N,)"),
        "t2i": _check_ranks(t2i_rank, "t2i_rank", "(C,)"),
    }
    out: dict[str, float] = {}
    for d, r in ranks.items():
        for k in RECALL_KS:
            out[f"{d}_r{k}"] = 100.0 * float((r < k).to(torch.float64).mean())
        one_based = r + 1
        out[f"{d}_medr"] = _median(one_based)
        out[f"{d}_meanr"] = float(one_based.to(torch.float64).mean())
    out["rsum"] = _rsum(out)
    return {key: out[key] for key in METRIC_KEYS}


def _rsum(metrics: dict[str, float]) -> float:
    total = 0.0
    for d in ("i2t", "t2i"):
        for k in RECALL_KS:
            total += metrics[f"{d}_r{k}"]
    return total


def retrieval_metrics(
    sims: Tensor, caption_to_image: Tensor | None = None, chunk_elements: int | None = None
) -> dict[str, float]:
    """R@1/5/10 (percent), medr, meanr of both directions and rsum from ``sims (N, C)``: :func:`retrieval_ranks`
    then :func:`metrics_from_ranks` (see both for the arguments, the tie rule and the definitions)."""
    return metrics_from_ranks(*retrieval_ranks(sims, caption_to_image, chunk_elements))


def retrieval_metrics_from_embeddings(
    img: Tensor,
    cap: Tensor,
    caption_to_image: Tensor | None = None,
    max_elements: int = MAX_ELEMENTS,
    chunk_elements: int | None = None,
) -> dict[str, float]:
    """:func:`retrieval_metrics` of ``sims = img @ cap.T``; ``img (N, D)``, ``cap (C, D)``, the other arguments
    as in :func:`retrieval_ranks_from_embeddings`."""
    return metrics_from_ranks(
        *retrieval_ranks_from_embeddings(img, cap, caption_to_image, max_elements, chunk_elements)
    )


# ------------------------------------------------------------------------------------------------- protocols


def _sims_or_embeddings(sims: Tensor | None, img: Tensor | None, cap: Tensor | None) -> tuple[int, int]:
    """``(N, C)`` of whichever input was given (exactly one of ``sims`` and ``(img, cap)``)."""
    if sims is not None:
        if img is not None or cap is not None:
            raise ValueError("pass either sims (N, C) or img (N, D) and cap (C, D), not both")
        _check_sims(sims)
        return sims.shape[0], sims.shape[1]
    if img is None or cap is None:
        raise ValueError("pass either sims (N, C) or both img (N, D) and cap (C, D)")
    _check_pair(img, cap)
    return img.shape[0], cap.shape[0]


def coco_1k_folds(
    sims: Tensor | None = None,
    *,
    img: Tensor | None = None,
    cap: Tensor | None = None,
    caption_to_image: Tensor | None = None,
    folds: int = 5,
    chunk_elements: int | None = None,
) -> dict[str, float]:
    """The COCO 1K protocol: the metrics of each of ``folds`` folds of ``N / folds`` consecutive images (1,000
    for the 5,000 COCO test images) and their captions, averaged over the folds.

    sims: ``(N, C)``, or img ``(N, D)`` and cap ``(C, D)`` (then only the ``folds`` diagonal blocks of the
    similarity matrix are computed). caption_to_image: ``(C,)`` or ``None`` (``C / N`` captions per image in
    image order: fold ``f`` is images ``[f n, (f + 1) n)`` and captions ``[f n k, (f + 1) n k)``); with an
    explicit mapping, fold ``f`` holds the captions of its images, wherever they are. ``N`` must be a multiple
    of ``folds``.

    Returns the keys of :func:`metrics_from_ranks`, each the mean of the per-fold values, except ``rsum``, which
    is the sum of the six averaged recalls (equal to the mean of the per-fold rsums up to float rounding).
    """
    n, c = _sims_or_embeddings(sims, img, cap)
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 1:
        raise ValueError(f"folds must be an integer >= 1, got {folds!r}")
    if n % folds:
        raise ValueError(f"the number of images N = {n} must be a multiple of folds = {folds}")
    device = sims.device if sims is not None else img.device
    m = _mapping(caption_to_image, n, c, device)
    size = n // folds
    per_fold = []
    for f in range(folds):
        lo = f * size
        own = ((m >= lo) & (m < lo + size)).nonzero().squeeze(1)  # this fold's captions
        if sims is not None:
            block = sims[lo : lo + size].index_select(1, own)
            per_fold.append(retrieval_metrics(block, m[own] - lo, chunk_elements))
        else:
            per_fold.append(
                retrieval_metrics_from_embeddings(
                    img[lo : lo + size], cap[own], m[own] - lo, chunk_elements=chunk_elements
                )
            )
    out = {key: sum(r[key] for r in per_fold) / folds for key in METRIC_KEYS}
    out["rsum"] = _rsum(out)
    return out


def coco_5k(
    sims: Tensor | None = None,
    *,
    img: Tensor | None = None,
    cap: Tensor | None = None,
    caption_to_image: Tensor | None = None,
    max_elements: int = MAX_ELEMENTS,
    chunk_elements: int | None = None,
) -> dict[str, float]:
    """The COCO 5K protocol: the metrics of the whole test set at once (:func:`retrieval_metrics` of ``sims
    (N, C)``, or :func:`retrieval_metrics_from_embeddings` of ``img (N, D)`` and ``cap (C, D)``)."""
    _sims_or_embeddings(sims, img, cap)
    if sims is not None:
        return retrieval_metrics(sims, caption_to_image, chunk_elements)
    return retrieval_metrics_from_embeddings(img, cap, caption_to_image, max_elements, chunk_elements)
