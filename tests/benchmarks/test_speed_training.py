"""The ``training`` benchmark (model-only step vs the engine, per method) and the summary table of all
benchmarks: a real quick run of two cheap methods, fake result dicts for the formatting, and clear errors."""

from __future__ import annotations

import json
import math

import pytest
from speed import (
    BENCHMARKS,
    SUMMARY_ROWS,
    TRAINING_CASES,
    bench_training,
    run_benchmarks,
    summary_markdown,
    summary_rows,
)

from rlattention.engine.registry import available_methods

CHEAP = ["ram", "scal"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    options = {"training": {"methods": CHEAP, "windows": 2, "window_s": 0.1}}
    results = run_benchmarks(["training", "sketch_ranks"], out, threads=1, quick=True, options=options)
    return out, results


def test_every_method_has_a_training_case():
    assert sorted(TRAINING_CASES) == available_methods()


def test_training_benchmark_quick(quick_run):
    out, results = quick_run
    r = results["training"]
    assert json.loads((out / "training.json").read_text()) == json.loads(json.dumps(r))
    assert [m["method"] for m in r["methods"]] == CHEAP
    for m in r["methods"]:
        assert "skipped" not in m
        for key in ("model_only_items_per_s", "engine_items_per_s", "model_only_ms_per_step", "engine_ms_per_step"):
            assert math.isfinite(m[key]) and m[key] > 0, (m["method"], key)
        assert m["engine_overhead"] < 1
        assert m["engine_overhead"] == pytest.approx(1 - m["engine_items_per_s"] / m["model_only_items_per_s"])
        assert m["engine_windows_used"] == len(m["engine_windows_items_per_s"]) - 1 >= 1
    md = (out / "training.md").read_text()
    assert md.startswith("### training")
    for method in CHEAP:
        assert f"| {method} |" in md


def test_summary_of_a_real_run(quick_run):
    out, results = quick_run
    summary = (out / "summary.md").read_text()
    assert summary == summary_markdown(results, summary.split("Command: `")[1].split("`")[0])
    header = "| benchmark | case | fast | reference | ratio | target | met |"
    assert header in summary
    lines = [ln for ln in summary.splitlines() if ln.startswith("| training |")]
    assert len(lines) == len(CHEAP) and all(f"| {m} (" in ln for m, ln in zip(CHEAP, lines, strict=True))
    assert len([ln for ln in summary.splitlines() if ln.startswith("| sketch_ranks |")]) == 1
    assert (
        "Machine:" in summary and "torch" in summary and "Command: `rlattention bench training sketch_ranks" in summary
    )
    assert "--quick" in summary


def _fake_results() -> dict[str, dict]:
    machine = {
        "cpu": "Test CPU",
        "cpu_count": 2,
        "cpus_available": 2,
        "threads": 2,
        "torch": "2.x",
        "python": "3.11",
        "uname": "Linux",
        "load_average_1min": 0.5,
    }
    common = {"machine": machine, "timestamp": "2026-01-01T00:00:00+00:00", "finished": "2026-01-01T00:01:00+00:00"}
    sensor_case = {
        "case": "a",
        "height": 28,
        "width": 28,
        "glimpse_size": 8,
        "num_scales": 1,
        "fast_area_ms_per_episode": 1.0,
        "fast_nearest_ms_per_episode": 0.5,
        "reference_ms_per_episode": 20.0,
        "speedup_area": 20.0,
        "speedup_nearest": 40.0,
    }
    return {
        "sensor": {**common, "settings": {}, "targets": {"speedup_min": 10.0}, "cases": [sensor_case]},
        "ram_throughput": {
            **common,
            "settings": {"engine_dataset": "digits"},
            "targets": {"images_per_s_min": 7000.0, "engine_overhead_max": 0.1},
            "model_only_images_per_s": 10000.0,
            "public_reference_images_per_s": 2000.0,
            "speedup_vs_public_reference": 5.0,
            "engine_images_per_s": 6000.0,
            "meets_images_per_s_target": False,
            "meets_overhead_target": False,
        },
        "anchor_crop": {
            **common,
            "cases": [{"case": "small", "batched_ms": 1.0, "loop_ms": 30.0, "speedup": 30.0}],
            "target_speedup": 20.0,
        },
        "rarl_inference": {**common, "cases": [{"case": "cpu", "single_view_ms": 2.0, "ten_view_ms": 5.0}]},
        "sketch_ranks": {
            **common,
            "cases": [{"case": "c", "fast_ms": 1.0, "loop_ms": 500.0, "speedup": 500.0, "equal": True}],
        },
        "retrieval": {
            **common,
            "settings": {"images": 500, "captions": 2500, "reference_extrapolated": False},
            "targets": {"metrics_from_sims_s_max": 0.5, "embeddings_over_product_max": 1.2},
            "metrics_from_sims_s": 0.1,
            "reference_s": 10.0,
            "speedup_vs_reference": 100.0,
            "meets_from_sims_target": True,
            "metrics_from_embeddings_s": 0.2,
            "product_s": 0.18,
            "meets_embeddings_target": True,
        },
        "reid": {
            **common,
            "settings": {"queries": 269, "gallery": 1272, "reference_extrapolated": True},
            "targets": {"metrics_s_max": 1.0},
            "metrics_s": 0.01,
            "reference_s": 2.0,
            "speedup_vs_reference": 200.0,
            "meets_target": True,
        },
        "training": {
            **common,
            "methods": [
                {
                    "method": "ram",
                    "config": "ram_digits.yaml",
                    "batch": 128,
                    "engine_items_per_s": 9000.0,
                    "model_only_items_per_s": 10000.0,
                },
                {"method": "scal", "config": "scal_omniglot.yaml", "skipped": "no data"},
            ],
        },
    }


def test_summary_rows_from_stored_results():
    fake = _fake_results()
    assert set(SUMMARY_ROWS) == set(BENCHMARKS) == set(fake)  # every benchmark has a row extractor
    for name, result in fake.items():
        rows = summary_rows(name, result)
        assert rows and all(r["benchmark"] == name for r in rows)
    ram = summary_rows("ram_throughput", fake["ram_throughput"])
    assert ram[1]["ratio"] == pytest.approx(0.6) and ram[1]["met"] is False
    md = summary_markdown(fake, "rlattention bench --threads 2")
    lines = md.splitlines()
    assert "| sensor | (a) 28x28, g=8, k=1, area | 1 ms | 20 ms | 20x | >= 10x | met |" in lines
    assert (
        "| training | ram (`ram_digits.yaml`, batch 128): engine vs model only | 9,000 items/s | 10,000 items/s "
        "| 0.9x |  |  |" in lines
    )
    assert any(ln.startswith("| training | scal: skipped (no data)") for ln in lines)
    assert "**not met**" in md
    assert "Test CPU, 2 CPUs" in md and "Python 3.11" in md and "Command: `rlattention bench --threads 2`" in md
    with pytest.raises(ValueError, match="no summary rows for benchmark 'nope'"):
        summary_rows("nope", {})


def test_unknown_training_method_is_named():
    with pytest.raises(ValueError, match=r"unknown method\(s\) for the training benchmark: nope; available: ram, cnn"):
        bench_training(quick=True, methods=["ram", "nope"])
