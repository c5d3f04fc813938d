"""``retrieval``: image-text retrieval metrics at the size of COCO 5K, one matrix pass vs a per-query argsort
loop (:func:`bench_retrieval`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from .common import _machine_line, _ms, _row, _table, time_interleaved


def _retrieval_ranks_public_loop(sims: Tensor, caption_to_image: Tensor, images: int, captions: int):
    """The VSE++/SCAN evaluation loop on a given similarity matrix ``(N, C)``: per image query (the first
    ``images``), a numpy argsort of its row and the best position of its captions; per caption query (the first
    ``captions``), an argsort of its column and the position of its image. Returns ``(i2t (images,), t2i
    (captions,))`` 0-based ranks; ties are broken however argsort puts them."""
    import numpy as np

    d = sims.numpy()
    m = caption_to_image.numpy()
    i2t = np.empty(images, dtype=np.int64)
    for i in range(images):
        inds = np.argsort(d[i])[::-1]
        i2t[i] = min(np.where(inds == j)[0][0] for j in np.nonzero(m == i)[0])
    t2i = np.empty(captions, dtype=np.int64)
    for j in range(captions):
        inds = np.argsort(d[:, j])[::-1]
        t2i[j] = np.where(inds == m[j])[0][0]
    return torch.from_numpy(i2t), torch.from_numpy(t2i)


RETRIEVAL_FROM_SIMS_TARGET_S = 0.5


RETRIEVAL_FROM_SIMS_TARGET_S = 0.5
RETRIEVAL_EMBEDDINGS_RATIO_TARGET = 1.2


def bench_retrieval(
    quick: bool = False, seed: int = 0, images: int | None = None, dim: int = 1024, reference_fraction: float = 0.1
) -> dict[str, Any]:
    """Image-text retrieval metrics of the COCO 5K test set's size: N = 5,000 images, C = 25,000 captions (5 per
    image), D = 1024 (``--quick``: N = 500). Embeddings: random unit image vectors, captions = their image plus
    Gaussian noise (norm about 9), renormalised (R@1 of a few tens of percent).

    Timed interleaved (median): the product ``img @ cap.T`` alone; ``retrieval_metrics(sims)`` (ranks and all
    metrics of both directions from the given similarity matrix; target <= 0.5 s); and
    ``retrieval_metrics_from_embeddings(img, cap)`` (product + metrics; target <= 1.2x the product alone).
    Reference: the public-code loop (:func:`_retrieval_ranks_public_loop`, numpy argsort per query) on the same
    similarity matrix, once; without ``--quick`` on the first ``reference_fraction`` of the image and caption
    queries only, its time multiplied by ``1 / reference_fraction`` (linear in the number of queries).
    """
    from rlattention.metrics.retrieval import retrieval_metrics, retrieval_metrics_from_embeddings, retrieval_ranks

    n = images if images is not None else (500 if quick else 5000)
    k = 5
    c = k * n
    g = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    noise = torch.randn(c, dim, generator=g) * (9.0 / dim**0.5)
    cap = torch.nn.functional.normalize(img.repeat_interleave(k, 0) + noise, dim=1)
    del noise
    sims = img @ cap.T
    m = torch.arange(c) // k
    t = time_interleaved(
        {
            "product": lambda: img @ cap.T,
            "from_sims": lambda: retrieval_metrics(sims),
            "from_embeddings": lambda: retrieval_metrics_from_embeddings(img, cap),
        },
        repeat=5,
        warmup=1,
    )
    fraction = 1.0 if quick else reference_fraction
    ref_images, ref_captions = max(1, round(n * fraction)), max(1, round(c * fraction))
    extrapolated = ref_images < n or ref_captions < c
    t0 = time.perf_counter()
    ref_i2t, ref_t2i = _retrieval_ranks_public_loop(sims, m, ref_images, ref_captions)
    ref_measured = time.perf_counter() - t0
    scale = (n + c) / (ref_images + ref_captions)
    i2t, t2i = retrieval_ranks(sims)
    mismatched = int((i2t[:ref_images] != ref_i2t).sum() + (t2i[:ref_captions] != ref_t2i).sum())
    reference_s = ref_measured * scale
    ratio = t["from_embeddings"] / t["product"]
    return {
        "settings": {
            "quick": quick,
            "images": n,
            "captions": c,
            "captions_per_image": k,
            "dim": dim,
            "dtype": "float32",
            "statistic": "median of 5 after 1 warm-up; reference: one run",
            "reference_image_queries": ref_images,
            "reference_caption_queries": ref_captions,
            "reference_extrapolated": extrapolated,
        },
        "product_s": t["product"],
        "metrics_from_sims_s": t["from_sims"],
        "metrics_from_embeddings_s": t["from_embeddings"],
        "embeddings_over_product": ratio,
        "reference_measured_s": ref_measured,
        "reference_s": reference_s,
        "speedup_vs_reference": reference_s / t["from_sims"],
        "reference_mismatched_queries": mismatched,
        "metrics": retrieval_metrics(sims),
        "targets": {
            "metrics_from_sims_s_max": RETRIEVAL_FROM_SIMS_TARGET_S,
            "embeddings_over_product_max": RETRIEVAL_EMBEDDINGS_RATIO_TARGET,
        },
        "meets_from_sims_target": t["from_sims"] <= RETRIEVAL_FROM_SIMS_TARGET_S,
        "meets_embeddings_target": ratio <= RETRIEVAL_EMBEDDINGS_RATIO_TARGET,
    }


def retrieval_markdown(r: dict) -> str:
    s = r["settings"]
    if s["reference_extrapolated"]:
        ref_note = (
            f"measured on {s['reference_image_queries']:,} of {s['images']:,} image and "
            f"{s['reference_caption_queries']:,} of {s['captions']:,} caption queries "
            f"({r['reference_measured_s']:.3g} s), extrapolated linearly"
        )
    else:
        ref_note = "all queries, measured"
    rows = [
        ["product `img @ cap.T` alone", r["product_s"], 1.0, "", ""],
        [
            "`retrieval_metrics(sims)`: ranks + all metrics, both directions",
            r["metrics_from_sims_s"],
            r["metrics_from_sims_s"] / r["product_s"],
            f"<= {r['targets']['metrics_from_sims_s_max']:g} s",
            r["meets_from_sims_target"],
        ],
        [
            "`retrieval_metrics_from_embeddings(img, cap)`: product + metrics",
            r["metrics_from_embeddings_s"],
            r["embeddings_over_product"],
            f"<= {r['targets']['embeddings_over_product_max']:g}x product",
            r["meets_embeddings_target"],
        ],
        [f"per-query numpy argsort loop (public code) on `sims`: {ref_note}", r["reference_s"], "", "", ""],
    ]
    mm = r["metrics"]
    return (
        f"### retrieval: image-text retrieval metrics, {s['images']:,} images x {s['captions']:,} captions, "
        f"D = {s['dim']}\n\n"
        f"{_table(['step', 'time (s)', 'x product', 'target', 'met'], rows)}\n\n"
        f"Speed-up of `retrieval_metrics(sims)` over the per-query loop: {r['speedup_vs_reference']:,.0f}x; "
        f"ranks differing from the loop's on the queries it ran: {r['reference_mismatched_queries']} "
        f"(only exact ties can differ: the loop breaks them arbitrarily). Metrics of the synthetic set: "
        f"i2t R@1 {mm['i2t_r1']:.1f}, t2i R@1 {mm['t2i_r1']:.1f}, rsum {mm['rsum']:.1f}.\n\n{_machine_line(r)}\n"
    )


def summary_rows(r: dict) -> list[dict]:
    s, t = r["settings"], r["targets"]
    size = f"{s['images']:,} x {s['captions']:,}"
    return [
        _row(
            f"{size}: `retrieval_metrics(sims)` vs per-query argsort loop"
            + (" (extrapolated)" if s["reference_extrapolated"] else ""),
            _ms(r["metrics_from_sims_s"]),
            _ms(r["reference_s"]),
            r["speedup_vs_reference"],
            f"<= {t['metrics_from_sims_s_max']:g} s",
            r["meets_from_sims_target"],
        ),
        _row(
            f"{size}: metrics from embeddings vs the product alone",
            _ms(r["metrics_from_embeddings_s"]),
            _ms(r["product_s"]),
            r["product_s"] / r["metrics_from_embeddings_s"],
            f"<= {t['embeddings_over_product_max']:g}x product",
            r["meets_embeddings_target"],
        ),
    ]
