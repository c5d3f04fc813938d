"""``rarl_inference``: rarl's time per image, single view vs ten views (:func:`bench_rarl_inference`)."""

from __future__ import annotations

from typing import Any

import torch

from .common import _machine_line, _ms, _row, _table, time_interleaved


def bench_rarl_inference(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """rarl inference time per image, single view vs ten views (one backbone pass per image either way)."""
    from rlattention.engine.method import DataInfo
    from rlattention.methods.rarl import RARL, RARLConfig

    torch.manual_seed(seed)
    cases = [
        {
            "case": "small CNN, 64x64 digits (configs/rarl_digits.yaml)",
            "shape": (1, 64, 64),
            "classes": 10,
            "cfg": dict(
                backbone_channels=[16, 32, 64],
                anchor_areas=[256.0, 1024.0, 4096.0],
                region_dim=128,
                hidden_size=128,
                crop_margin=8,
            ),
            "batch": 64,
        },
        {
            "case": "VGG16, 512x512, paper sizes",
            "shape": (3, 512, 512),
            "classes": 20,
            "cfg": dict(
                backbone="vgg16",
                anchor_areas=[6400.0, 25600.0, 102400.0],
                region_size=7,
                region_dim=1024,
                hidden_size=512,
                crop_margin=64,
            ),
            "batch": 1 if quick else 2,
        },
    ]
    rows = []
    for c in cases:
        if quick and c["cfg"].get("backbone") == "vgg16":
            continue
        times = {}
        for views in (1, 10):
            model = RARL(RARLConfig(test_views=views, **c["cfg"]), DataInfo(c["shape"], c["classes"])).eval()
            x = torch.rand(c["batch"], *c["shape"])
            times[views] = (
                time_interleaved({"p": lambda model=model, x=x: model.predict(x)}, repeat=2 if quick else 5, warmup=1)[
                    "p"
                ]
                / c["batch"]
            )
        rows.append(
            {"case": c["case"], "batch": c["batch"], "single_view_ms": 1e3 * times[1], "ten_view_ms": 1e3 * times[10]}
        )
    return {"settings": {"quick": quick, "statistic": "median per image", "T": 5, "regions": 9}, "cases": rows}


def rarl_inference_markdown(r: dict) -> str:
    rows = [[c["case"], c["batch"], c["single_view_ms"], c["ten_view_ms"]] for c in r["cases"]]
    return (
        "### rarl_inference: time per image, T = 5, 9 regions (median)\n\n"
        + _table(["model", "batch", "single view ms/image", "ten views ms/image"], rows)
        + f"\n\n{_machine_line(r)}\n"
    )


def summary_rows(r: dict) -> list[dict]:
    return [
        _row(
            f"{c['case']}: single view vs ten views, per image",
            _ms(c["single_view_ms"] / 1e3),
            _ms(c["ten_view_ms"] / 1e3),
            c["ten_view_ms"] / c["single_view_ms"],
        )
        for c in r["cases"]
    ]
