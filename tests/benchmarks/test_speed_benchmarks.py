"""The benchmarks run, write their tables and report sane ratios (loose: CI machines are noisy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from speed import run_benchmarks


def test_sensor_benchmark_writes_json_and_markdown(tmp_path):
    results = run_benchmarks(["sensor"], tmp_path, threads=1, quick=True)
    data = json.loads((tmp_path / "sensor.json").read_text())
    assert data == json.loads(json.dumps(results["sensor"]))
    assert (tmp_path / "sensor.md").read_text().startswith("### sensor")
    assert data["benchmark"] == "sensor" and data["timestamp"]
    for key in ("cpu", "cpu_count", "torch", "threads"):
        assert key in data["machine"]
    assert data["machine"]["threads"] == 1
    assert [c["case"] for c in data["cases"]] == ["a", "b"]
    for case in data["cases"]:
        for key in (
            "fast_area_ms_per_episode",
            "fast_nearest_ms_per_episode",
            "reference_ms_per_episode",
            "speedup_nearest",
            "extract_area_ms_per_glimpse",
            "extract_nearest_ms_per_glimpse",
        ):
            assert case[key] > 0
        assert case["speedup_area"] > 1
        assert case["max_abs_diff_nearest_vs_reference"] < 1e-5  # nearest mode = public reference values


def test_ram_throughput_benchmark_runs_the_engine(tmp_path):
    options = {"ram_throughput": {"engine_steps": 30, "log_every": 5}}
    run_benchmarks(["ram_throughput"], tmp_path, threads=1, quick=True, options=options)
    data = json.loads((tmp_path / "ram_throughput.json").read_text())
    assert data["settings"]["engine_max_steps"] == 30
    assert len(data["engine_windows_images_per_s"]) == 6 and data["engine_windows_used"] == 5
    for key in ("model_only_images_per_s", "public_reference_images_per_s", "engine_images_per_s"):
        assert data[key] > 0
    assert data["engine_overhead"] == 1 - data["engine_images_per_s"] / data["model_only_images_per_s"]
    assert "speedup_vs_public_reference" in data
    assert (tmp_path / "ram_throughput.md").is_file()


def test_unknown_benchmark_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark"):
        run_benchmarks(["nope"], tmp_path)


def test_anchor_crop_and_rarl_inference_benchmarks(tmp_path):
    results = run_benchmarks(["anchor_crop", "rarl_inference"], tmp_path, threads=1, quick=True)
    for case in results["anchor_crop"]["cases"]:
        assert case["max_abs_diff"] < 1e-4  # the batched crop equals the per-region loop
        assert case["batched_ms"] > 0 and case["loop_ms"] > 0
    (row,) = results["rarl_inference"]["cases"]  # quick: the CPU-sized model only
    assert row["single_view_ms"] > 0 and row["ten_view_ms"] > 0
    assert (tmp_path / "anchor_crop.md").is_file() and (tmp_path / "rarl_inference.json").is_file()


def test_sketch_ranks_benchmark_matches_the_loop(tmp_path):
    results = run_benchmarks(["sketch_ranks"], tmp_path, threads=1, quick=True)
    (row,) = results["sketch_ranks"]["cases"]
    assert row["equal"] and row["speedup"] > 1.0
    assert (tmp_path / "sketch_ranks.md").read_text().startswith("### sketch_ranks")


def test_retrieval_benchmark_matches_the_public_loop(tmp_path):
    results = run_benchmarks(["retrieval"], tmp_path, threads=1, quick=True, options={"retrieval": {"images": 60}})
    r = results["retrieval"]
    assert r["settings"]["images"] == 60 and r["settings"]["captions"] == 300
    assert not r["settings"]["reference_extrapolated"]  # quick: every query through the loop
    assert r["reference_mismatched_queries"] == 0
    for key in ("product_s", "metrics_from_sims_s", "metrics_from_embeddings_s", "reference_s"):
        assert r[key] > 0
    assert r["embeddings_over_product"] == r["metrics_from_embeddings_s"] / r["product_s"]
    assert r["speedup_vs_reference"] > 1.0
    m = r["metrics"]
    assert m["rsum"] == m["i2t_r1"] + m["i2t_r5"] + m["i2t_r10"] + m["t2i_r1"] + m["t2i_r5"] + m["t2i_r10"]
    assert (tmp_path / "retrieval.md").read_text().startswith("### retrieval")


def test_reid_benchmark_quick(tmp_path):
    results = run_benchmarks(["reid"], tmp_path, threads=1, quick=True)
    r = results["reid"]
    s = r["settings"]
    assert (s["queries"], s["gallery"], s["identities"]) == (269, 1272, 60)
    assert not s["reference_extrapolated"] and s["reference_queries"] == s["queries"]
    assert r["reference_equal"] and r["reference_max_abs_diff"] <= 1e-9
    for key in ("distances_s", "metrics_s", "reference_s"):
        assert r[key] > 0
    assert r["metrics"]["num_queries"] + r["metrics"]["num_skipped"] == s["queries"]
    assert r["meets_target"] == (r["metrics_s"] <= r["targets"]["metrics_s_max"])
    assert (tmp_path / "reid.md").read_text().startswith("### reid")
    assert (tmp_path / "reid.json").is_file()


# ------------------------------------------------------------------------------------ `rlattention bench` entry


def test_cli_bench_is_a_thin_entry(tmp_path, capsys):
    from rlattention.cli import main

    assert main(["bench", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown benchmark(s) nope" in capsys.readouterr().err
    assert main(["bench", "sketch_ranks", "--threads", "1", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "sketch_ranks.json").is_file() and (tmp_path / "sketch_ranks.md").is_file()


def test_cli_bench_without_a_checkout_is_one_clear_line(tmp_path, monkeypatch, capsys):
    """An installed wheel has no benchmarks/ beside the package: one line saying so, exit code 2."""
    import rlattention.cli as cli
    import rlattention.cli.bench as bench

    fake = tmp_path / "site-packages" / "rlattention" / "cli" / "bench.py"
    monkeypatch.setattr(bench, "__file__", str(fake))
    assert cli.main(["bench", "sensor", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "source checkout" in err, err
    assert not (tmp_path / "out").exists()


def test_every_benchmark_module_is_registered():
    import speed

    modules = sorted(p.stem for p in Path(speed.__file__).parent.glob("*.py"))
    assert sorted(speed.BENCHMARKS) == sorted(set(modules) - {"__init__", "common", "runner"})
