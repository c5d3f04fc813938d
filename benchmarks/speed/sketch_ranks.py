"""``sketch_ranks``: ranks of the true photo in sketch retrieval, ``true_ranks`` vs the per-query loop
(:func:`bench_sketch_ranks`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .common import _machine_line, _ms, _row, _table, time_interleaved


def _ranks_per_query(queries: Tensor, gallery: Tensor, target: Tensor) -> Tensor:
    """The obvious implementation: one query (and completion step) at a time."""
    Q, S, _ = queries.shape
    out = torch.empty(Q, S, dtype=torch.long)
    for q in range(Q):
        for s in range(S):
            d = (gallery.double() - queries[q, s].double()).pow(2).sum(-1)  # exact enough to agree on ties
            out[q, s] = int((d <= d[target[q]]).sum())
    return out


def bench_sketch_ranks(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Ranks of the true photo for every (query, completion step): one matrix pass vs a per-query loop."""
    from rlattention.metrics.sketch import true_ranks

    g = torch.Generator().manual_seed(seed)
    cases = [("ChairV2 test: 323 sketches x 17 steps, 100 photos", 323, 17, 100)]
    if not quick:
        cases.append(("ChairV2 train reward: 32 sketches x 204 glimpses, 270 photos", 32, 204, 270))
        cases.append(("5,000 sketches x 17 steps, 1,000 photos", 5000, 17, 1000))
    rows = []
    for name, Q, S, G in cases:
        gallery = torch.nn.functional.normalize(torch.randn(G, 64, generator=g), dim=-1)
        target = torch.randint(G, (Q,), generator=g)
        queries = gallery[target][:, None] + 0.5 * torch.randn(Q, S, 64, generator=g)
        same = bool(torch.equal(true_ranks(queries, gallery, target), _ranks_per_query(queries, gallery, target)))
        t = time_interleaved(
            {
                "fast": lambda q=queries, e=gallery, y=target: true_ranks(q, e, y),
                "loop": lambda q=queries, e=gallery, y=target: _ranks_per_query(q, e, y),
            },
            repeat=1 if Q * S > 20000 else 3,
            warmup=0 if Q * S > 20000 else 1,
        )
        rows.append(
            {
                "case": name,
                "fast_ms": 1e3 * t["fast"],
                "loop_ms": 1e3 * t["loop"],
                "speedup": t["loop"] / t["fast"],
                "equal": same,
            }
        )
    return {"settings": {"quick": quick, "dim": 64, "statistic": "median"}, "cases": rows}


def sketch_ranks_markdown(r: dict) -> str:
    rows = [[c["case"], c["fast_ms"], c["loop_ms"], c["speedup"], c["equal"]] for c in r["cases"]]
    return (
        "### sketch_ranks: rank of the true photo for every (query, completion step)\n\n"
        + _table(["case", "one matrix pass ms", "per-query loop ms", "speed-up", "identical ranks"], rows)
        + f"\n\n{_machine_line(r)}\n"
    )


def summary_rows(r: dict) -> list[dict]:
    return [
        _row(c["case"], _ms(c["fast_ms"] / 1e3), _ms(c["loop_ms"] / 1e3), c["speedup"], "identical ranks", c["equal"])
        for c in r["cases"]
    ]
