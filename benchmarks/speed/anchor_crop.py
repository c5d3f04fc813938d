"""``anchor_crop``: rarl's anchor-region crops, one batched ``crop_boxes`` call vs a loop of ``grid_sample``
(:func:`bench_anchor_crop`).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import _machine_line, _ms, _row, _table, time_interleaved


def bench_anchor_crop(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Cropping k = 9 anchor regions per image from feature maps to a fixed size: one batched ``crop_boxes``
    call vs a Python loop over images and regions (:func:`crop_boxes_loop_reference`, one ``grid_sample`` per
    region on the NCHW map). The batched call is timed on a channels-last map, as ``rarl`` holds it (converted
    once per image, then cropped T times); also timed: the same call on an NCHW map, the conversion itself, and
    one ``grid_sample`` over all regions on the NCHW map (the implementation before the gather). Every call is
    timed after an untimed one of the same function (``settle``)."""
    from rlattention.vision.anchors import anchor_boxes
    from rlattention.vision.crops import _bilinear_grid_sample, crop_boxes
    from rlattention.vision.reference import crop_boxes_loop_reference

    g = torch.Generator().manual_seed(seed)
    cases = [
        {
            "case": "VGG16 conv5_3 of 512x512, batch 16",
            "batch": 16,
            "channels": 512,
            "side": 32,
            "input": 512,
            "areas": [80.0**2, 160.0**2, 320.0**2],
            "out": 7,
        },
        {
            "case": "small CNN on 64x64 digit canvases, batch 64",
            "batch": 64,
            "channels": 64,
            "side": 8,
            "input": 64,
            "areas": [16.0**2, 32.0**2, 64.0**2],
            "out": 4,
        },
    ]
    rows = []
    for c in cases:
        fmap = torch.randn(c["batch"], c["channels"], c["side"], c["side"], generator=g)
        fmap_cl = fmap.contiguous(memory_format=torch.channels_last)
        centres = torch.rand(c["batch"], 2, generator=g) * 2 - 1
        boxes = anchor_boxes(centres, c["areas"], [2.0, 1.0, 0.5], (c["input"], c["input"]))
        size = (c["out"], c["out"])
        loop = crop_boxes_loop_reference(fmap, boxes, size)
        max_diff = max(float((crop_boxes(m, boxes, size, mode="bilinear") - loop).abs().max()) for m in (fmap, fmap_cl))
        t = time_interleaved(
            {
                "batched": lambda m=fmap_cl, b=boxes, s=size: crop_boxes(m, b, s, mode="bilinear"),
                "batched_nchw": lambda m=fmap, b=boxes, s=size: crop_boxes(m, b, s, mode="bilinear"),
                "to_channels_last": lambda m=fmap: m.contiguous(memory_format=torch.channels_last),
                "grid_sample": lambda m=fmap, b=boxes, s=size: _bilinear_grid_sample(m, b, *s),
                "loop": lambda m=fmap, b=boxes, s=size: crop_boxes_loop_reference(m, b, s),
            },
            repeat=5 if quick else 21,
            warmup=1 if quick else 3,
            settle=True,
        )
        rows.append(
            {
                **c,
                "batched_ms": 1e3 * t["batched"],
                "batched_nchw_ms": 1e3 * t["batched_nchw"],
                "to_channels_last_ms": 1e3 * t["to_channels_last"],
                "grid_sample_ms": 1e3 * t["grid_sample"],
                "loop_ms": 1e3 * t["loop"],
                "speedup": t["loop"] / t["batched"],
                "speedup_nchw": t["loop"] / t["batched_nchw"],
                "speedup_grid_sample": t["loop"] / t["grid_sample"],
                "max_abs_diff": max_diff,
            }
        )
    return {
        "settings": {"regions_per_image": 9, "quick": quick, "statistic": "median", "batched_layout": "channels_last"},
        "cases": rows,
        "target_speedup": 20.0,
    }


def anchor_crop_markdown(r: dict) -> str:
    rows = [
        [
            c["case"],
            c["batched_ms"],
            c.get("batched_nchw_ms", float("nan")),
            c.get("grid_sample_ms", float("nan")),
            c["loop_ms"],
            c["speedup"],
            c.get("speedup_nchw", float("nan")),
            c["max_abs_diff"],
            c["speedup"] >= 20,
        ]
        for c in r["cases"]
    ]
    head = ["case", "batched ms (channels-last map)", "batched ms (NCHW map)", "one grid_sample ms"]
    head += ["per-region loop ms", "speed-up", "speed-up (NCHW)", "max abs diff", ">= 20x"]
    return (
        "### anchor_crop: 9 anchor regions per image cropped from feature maps (median)\n\n"
        + _table(head, rows)
        + f"\n\n{_machine_line(r)}\n"
    )


def summary_rows(r: dict) -> list[dict]:
    target = r.get("target_speedup", 20.0)
    return [
        _row(
            c["case"],
            _ms(c["batched_ms"] / 1e3),
            _ms(c["loop_ms"] / 1e3),
            c["speedup"],
            f">= {target:g}x",
            c["speedup"] >= target,
        )
        for c in r["cases"]
    ]
