"""``reid``: re-identification metrics (CMC, mAP) at the size of Market-1501, ``reid_metrics`` vs a stable
sort per query (:func:`bench_reid`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from .common import _machine_line, _ms, _row, _table, time_interleaved

REID_METRICS_TARGET_S = 1.0


def _market_like_split(g: torch.Generator, identities: int, distractors: int, junk: int) -> dict[str, Tensor]:
    """Identities and cameras with the structure of the Market-1501 test split, scaled by ``identities`` (751 for
    the real size): 6 cameras; each identity seen by 4-6 of them; 4 or 5 queries per identity (387 of every 751
    identities have 4, the rest 5: 3,368 queries), each from a different camera of its identity; about 16.1
    gallery images per identity on that identity's cameras (12,115 for 751), plus ``distractors`` (identity 0)
    and ``junk`` (identity -1) images on random cameras. For 751 identities, 2,798 distractors and 1,000 junk:
    3,368 queries x 15,913 gallery images, the size of Market-1501 (whose real gallery has about 3,800 junk
    images more; torchreid drops them before evaluation)."""
    cameras = 6
    cams_of = torch.stack([torch.randperm(cameras, generator=g) for _ in range(identities)])  # (I, 6)
    four = round(identities * 387 / 751)
    per_id = torch.cat([torch.full((four,), 4), torch.full((identities - four,), 5)])
    per_id = per_id[torch.randperm(identities, generator=g)]
    seen_by = per_id + (torch.rand(identities, generator=g) * (cameras + 1 - per_id)).long()  # in [per_id, 6]
    query_pids = torch.repeat_interleave(torch.arange(1, identities + 1), per_id)
    query_cams = torch.cat([cams_of[i, :n] for i, n in enumerate(per_id.tolist())])
    images = round(identities * 12115 / 751)
    extra = torch.randint(1, identities + 1, (images - 16 * identities,), generator=g)
    gallery_ids = torch.cat([torch.arange(1, identities + 1).repeat_interleave(16), extra])
    slot = (torch.rand(gallery_ids.numel(), generator=g) * seen_by[gallery_ids - 1]).long()
    gallery_pids = torch.cat([gallery_ids, torch.zeros(distractors, dtype=torch.long), torch.full((junk,), -1)])
    gallery_cams = torch.cat(
        [cams_of[gallery_ids - 1, slot], torch.randint(cameras, (distractors + junk,), generator=g)]
    )
    return {"qp": query_pids, "qc": query_cams, "gp": gallery_pids, "gc": gallery_cams}


def bench_reid(
    quick: bool = False, seed: int = 0, identities: int | None = None, dim: int = 128, reference_fraction: float = 0.1
) -> dict[str, Any]:
    """Re-identification metrics (Market-1501 protocol) at the size of Market-1501: 3,368 queries x 15,913
    gallery images (751 identities, 6 cameras, 2,798 distractors, 1,000 junk; ``--quick``: 60 identities, 269
    queries x 1,272 gallery images), float32 distances (:func:`_market_like_split` has the structure).

    Embeddings, D = ``dim``: a standard normal centre per identity (each distractor and junk image its own),
    plus a per-camera offset (0.45 x standard normal; same-camera images of an identity are the nearest, as in
    real data, so the same-camera filter matters), plus noise (1.2 x standard normal), which gives rank-1 about
    94% and mAP about 68%; distances: ``pairwise_distances`` (squared Euclidean). Timed interleaved (median of
    5 after a warm-up): the distance matrix alone and ``reid_metrics(dist, ...)`` (target: <= 1 s). Reference:
    ``reid_metrics_reference`` (a stable sort per query), run once; without ``--quick`` on the first
    ``reference_fraction`` of the queries only, its time multiplied by the inverse of that fraction;
    ``reid_metrics`` on the same queries must give the same metrics.
    """
    from rlattention.metrics.reid import pairwise_distances, reid_metrics, reid_metrics_reference

    n_ids = identities if identities is not None else (60 if quick else 751)
    distractors, junk = round(n_ids * 2798 / 751), round(n_ids * 1000 / 751)
    g = torch.Generator().manual_seed(seed)
    s = _market_like_split(g, n_ids, distractors, junk)
    qp, qc, gp, gc = s["qp"], s["qc"], s["gp"], s["gc"]
    centres = torch.randn(n_ids + 1, dim, generator=g)
    cam_offset = 0.45 * torch.randn(6, dim, generator=g)

    def embed(pids: Tensor, cams: Tensor) -> Tensor:
        own = centres[pids.clamp(min=0)]
        other = torch.randn(pids.numel(), dim, generator=g)  # distractors and junk: each image its own person
        c = torch.where((pids <= 0)[:, None], other, own)
        return c + cam_offset[cams] + 1.2 * torch.randn(pids.numel(), dim, generator=g)

    query, gallery = embed(qp, qc), embed(gp, gc)
    dist = pairwise_distances(query, gallery)
    t = time_interleaved(
        {
            "distances": lambda: pairwise_distances(query, gallery),
            "metrics": lambda: reid_metrics(dist, qp, gp, qc, gc),
        },
        repeat=5,
        warmup=1,
    )
    q = qp.numel()
    fraction = 1.0 if quick else reference_fraction
    ref_q = max(1, round(q * fraction))
    sub = (dist[:ref_q], qp[:ref_q], gp, qc[:ref_q], gc)
    t0 = time.perf_counter()
    ref = reid_metrics_reference(*sub)
    ref_measured = time.perf_counter() - t0
    fast = reid_metrics(*sub)
    diff = max(abs(fast[k] - ref[k]) for k in ref)
    reference_s = ref_measured * q / ref_q
    return {
        "settings": {
            "quick": quick,
            "queries": q,
            "gallery": gp.numel(),
            "identities": n_ids,
            "cameras": 6,
            "distractors": distractors,
            "junk": junk,
            "dim": dim,
            "dtype": "float32",
            "distance": "squared euclidean",
            "statistic": "median of 5 after 1 warm-up; reference: one run",
            "reference_queries": ref_q,
            "reference_extrapolated": ref_q < q,
        },
        "distances_s": t["distances"],
        "metrics_s": t["metrics"],
        "reference_measured_s": ref_measured,
        "reference_s": reference_s,
        "speedup_vs_reference": reference_s / t["metrics"],
        "reference_metrics": ref,
        "fast_metrics_on_reference_queries": fast,
        "reference_max_abs_diff": diff,
        "reference_equal": fast.keys() == ref.keys() and diff <= 1e-9,
        "metrics": reid_metrics(dist, qp, gp, qc, gc),
        "targets": {"metrics_s_max": REID_METRICS_TARGET_S},
        "meets_target": t["metrics"] <= REID_METRICS_TARGET_S,
    }


def reid_markdown(r: dict) -> str:
    s = r["settings"]
    if s["reference_extrapolated"]:
        ref_note = (
            f"measured on {s['reference_queries']:,} of {s['queries']:,} queries "
            f"({r['reference_measured_s']:.3g} s), extrapolated linearly"
        )
    else:
        ref_note = "all queries, measured"
    rows = [
        [f"`pairwise_distances` (squared Euclidean, D = {s['dim']}) alone", r["distances_s"], "", ""],
        [
            "`reid_metrics(dist, ...)`: CMC rank-1/5/10 + mAP",
            r["metrics_s"],
            f"<= {r['targets']['metrics_s_max']:g} s",
            r["meets_target"],
        ],
        [f"`reid_metrics_reference` (stable sort per query): {ref_note}", r["reference_s"], "", ""],
    ]
    m = r["metrics"]
    return (
        f"### reid: Market-1501 protocol, {s['queries']:,} queries x {s['gallery']:,} gallery images "
        f"({s['identities']} identities, {s['distractors']:,} distractors, {s['junk']:,} junk), float32\n\n"
        f"{_table(['step', 'time (s)', 'target', 'met'], rows)}\n\n"
        f"Speed-up of `reid_metrics` over the per-query loop: {r['speedup_vs_reference']:,.0f}x; metrics equal "
        f"to the loop's on the queries it ran: {'yes' if r['reference_equal'] else 'NO'} (largest difference "
        f"{r['reference_max_abs_diff']:.2g}). Metrics of the synthetic set: rank-1 {m['rank1']:.1f}, rank-5 "
        f"{m['rank5']:.1f}, rank-10 {m['rank10']:.1f}, mAP {m['mAP']:.1f} ({m['num_queries']:,} queries, "
        f"{m['num_skipped']} skipped).\n\n{_machine_line(r)}\n"
    )


def summary_rows(r: dict) -> list[dict]:
    s = r["settings"]
    return [
        _row(
            f"{s['queries']:,} x {s['gallery']:,}: `reid_metrics` vs stable sort per query"
            + (" (extrapolated)" if s["reference_extrapolated"] else ""),
            _ms(r["metrics_s"]),
            _ms(r["reference_s"]),
            r["speedup_vs_reference"],
            f"<= {r['targets']['metrics_s_max']:g} s",
            r["meets_target"],
        )
    ]
