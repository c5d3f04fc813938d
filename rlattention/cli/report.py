"""The console line of a split's metrics, as ``fit`` and ``eval`` print it."""

from __future__ import annotations


def format_metrics(m: dict) -> str:
    """One line of a split's metrics, every percentage with 2 decimals as in report.json (which holds the same
    numbers): ``accuracy 97.90% (error 2.10%)`` for classification, ``rank-1 ..., mAP ...`` for re-id, recalls
    and rsum for image-text retrieval, ``mAP 61.20%, CF1 ...`` for multi-label and sketch retrieval."""
    if "accuracy" in m:
        return f"accuracy {m['accuracy']:.2f}% (error {m['error']:.2f}%)"
    if "rank1" in m and "mAP" in m:
        cmc = ", ".join(f"rank-{k[4:]} {m[k]:.2f}%" for k in m if k.startswith("rank") and k[4:].isdigit())
        return (
            f"{cmc}, mAP {m['mAP']:.2f}% ({int(m.get('num_queries', 0))} queries, {int(m.get('num_skipped', 0))} "
            f"skipped, gallery {int(m.get('gallery', 0))})"
        )
    if "rsum" in m:  # image-text retrieval: recalls in percent, rsum their sum (0-600), ranks 1-based
        recalls = ", ".join(f"{k} {m[k]:.2f}%" for k in m if k[4:] in ("r1", "r5", "r10"))
        return f"{recalls}, rsum {m['rsum']:.2f}, medr {m['i2t_medr']:g}/{m['t2i_medr']:g} (i2t/t2i)"
    counts = ("count", "gallery", "mean_rank", "mean_rank_steps", "images")  # not percentages
    text = ", ".join(f"{k} {v:.2f}%" for k, v in m.items() if k not in counts)
    if "mean_rank" in m:
        text += f", mean rank {m['mean_rank']:.2f} of {int(m.get('gallery', 0))}"
    if "mean_rank_steps" in m:
        text += f" ({m['mean_rank_steps']:.2f} over the completion steps)"
    return text
