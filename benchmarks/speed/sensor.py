"""``sensor``: one episode of 6 glimpses at fixed random locations in [-1, 1], batch 128, (a) 28x28 images, 8x8
glimpses, 1 scale and (b) 100x100 images, 12x12 glimpses, 4 scales (factor 2). Fast: ``GlimpseSensor.prepare``
once and 6 ``extract`` calls ("area" and "nearest" modes); reference: :func:`glimpse_public_reference` called 6
times, which redoes everything per glimpse as public RAM code does. Target: >= 10x on 2 cores.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlattention.vision import GlimpseSensor
from rlattention.vision.reference import glimpse_public_reference

from .common import _machine_line, _ms, _row, _table, time_interleaved

SENSOR_SPEEDUP_TARGET = 10.0


SENSOR_CASES = [
    {"case": "a", "height": 28, "width": 28, "glimpse_size": 8, "num_scales": 1},
    {"case": "b", "height": 100, "width": 100, "glimpse_size": 12, "num_scales": 4},
]


def bench_sensor(quick: bool = False, batch: int = 128, glimpses: int = 6, seed: int = 0) -> dict[str, Any]:
    """Glimpse sensor per episode: prepare once + ``glimpses`` extracts vs the public-style reference."""
    repeat, warmup = (5, 1) if quick else (21, 3)
    scale_factor = 2
    gen = torch.Generator().manual_seed(seed)
    locations = torch.rand(glimpses, batch, 2, generator=gen) * 2 - 1  # the same for every case and method
    cases = []
    for case in SENSOR_CASES:
        H, W, g, k = case["height"], case["width"], case["glimpse_size"], case["num_scales"]
        images = torch.rand(batch, 1, H, W, generator=gen)
        sensors = {mode: GlimpseSensor(g, k, scale_factor, mode) for mode in ("area", "nearest")}
        prepared = {mode: s.prepare(images) for mode, s in sensors.items()}

        def episode(sensor: GlimpseSensor, images: Tensor = images) -> None:
            p = sensor.prepare(images)
            for t in range(glimpses):
                sensor.extract(p, locations[t])

        def extracts(sensor: GlimpseSensor, p: Tensor) -> None:
            for t in range(glimpses):
                sensor.extract(p, locations[t])

        def reference(images: Tensor = images, g: int = g, k: int = k) -> None:
            for t in range(glimpses):
                glimpse_public_reference(images, locations[t], g, k, scale_factor)

        med = time_interleaved(
            {
                "area": lambda s=sensors["area"]: episode(s),
                "nearest": lambda s=sensors["nearest"]: episode(s),
                "reference": reference,
                "extract_area": lambda s=sensors["area"], p=prepared["area"]: extracts(s, p),
                "extract_nearest": lambda s=sensors["nearest"], p=prepared["nearest"]: extracts(s, p),
                "prepare": lambda s=sensors["area"], x=images: s.prepare(x),
            },
            repeat,
            warmup,
        )
        nearest_glimpse = sensors["nearest"](images, locations[0])
        diff = (nearest_glimpse - glimpse_public_reference(images, locations[0], g, k, scale_factor)).abs().max()
        speedup_area = med["reference"] / med["area"]
        cases.append(
            {
                **case,
                "scale_factor": scale_factor,
                "channels": 1,
                "fast_area_ms_per_episode": 1e3 * med["area"],
                "fast_nearest_ms_per_episode": 1e3 * med["nearest"],
                "reference_ms_per_episode": 1e3 * med["reference"],
                "speedup_area": speedup_area,
                "speedup_nearest": med["reference"] / med["nearest"],
                "prepare_ms": 1e3 * med["prepare"],
                "extract_area_ms_per_glimpse": 1e3 * med["extract_area"] / glimpses,
                "extract_nearest_ms_per_glimpse": 1e3 * med["extract_nearest"] / glimpses,
                "max_abs_diff_nearest_vs_reference": float(diff),
                "meets_target": bool(speedup_area >= SENSOR_SPEEDUP_TARGET),
            }
        )
    return {
        "settings": {
            "batch": batch,
            "glimpses_per_episode": glimpses,
            "locations": "fixed, uniform in [-1, 1]",
            "repeat": repeat,
            "warmup": warmup,
            "statistic": "median",
            "quick": quick,
        },
        "targets": {"speedup_min": SENSOR_SPEEDUP_TARGET},
        "cases": cases,
    }


def sensor_markdown(r: dict) -> str:
    s = r["settings"]
    rows = [
        [
            f"({c['case']}) {c['height']}x{c['width']}, g={c['glimpse_size']}, k={c['num_scales']}",
            c["fast_area_ms_per_episode"],
            c["fast_nearest_ms_per_episode"],
            c["reference_ms_per_episode"],
            c["speedup_area"],
            c["speedup_nearest"],
            c["extract_area_ms_per_glimpse"],
            c["prepare_ms"],
            c["meets_target"],
        ]
        for c in r["cases"]
    ]
    headers = [
        "case",
        "area ms/episode",
        "nearest ms/episode",
        "public reference ms/episode",
        "speed-up (area)",
        "speed-up (nearest)",
        "extract ms/glimpse (area)",
        "prepare ms",
        f">= {r['targets']['speedup_min']:g}x",
    ]
    return (
        f"### sensor: one episode of {s['glimpses_per_episode']} glimpses, batch {s['batch']} "
        f"(median of {s['repeat']})\n\n{_table(headers, rows)}\n\n{_machine_line(r)}\n"
    )


def summary_rows(r: dict) -> list[dict]:
    rows = []
    target = f">= {r['targets']['speedup_min']:g}x"
    for c in r["cases"]:
        name = f"({c['case']}) {c['height']}x{c['width']}, g={c['glimpse_size']}, k={c['num_scales']}"
        ref = _ms(c["reference_ms_per_episode"] / 1e3)
        rows.append(
            _row(
                f"{name}, area",
                _ms(c["fast_area_ms_per_episode"] / 1e3),
                ref,
                c["speedup_area"],
                target,
                c["speedup_area"] >= r["targets"]["speedup_min"],
            )
        )
        rows.append(
            _row(
                f"{name}, nearest",
                _ms(c["fast_nearest_ms_per_episode"] / 1e3),
                ref,
                c["speedup_nearest"],
                target,
                c["speedup_nearest"] >= r["targets"]["speedup_min"],
            )
        )
    return rows
