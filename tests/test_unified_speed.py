"""benchmarks/unified_speed.py: another machine's run goes to files of its own name, never over the main table."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def speed(benchmark_module, tmp_path, monkeypatch):
    mod = benchmark_module("unified_speed")
    monkeypatch.setattr(mod, "OUT", tmp_path / "unified_speed")
    return mod


@pytest.mark.parametrize("name", ["../summary", "sub/zen3", ".hidden", ""])
def test_a_name_that_is_not_a_plain_stem_is_refused_before_anything_runs(speed, tmp_path, capsys, name):
    with pytest.raises(SystemExit):
        speed.main(["--name", name, "--steps", "2", "--warmup", "0", "--batch", "2"])
    assert f"--name {name!r}" in capsys.readouterr().err
    assert not (tmp_path / "unified_speed").exists()


def test_a_named_run_writes_its_own_files_and_names_the_cpu(speed, tmp_path):
    out = tmp_path / "unified_speed"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # the main table, which a named run must leave alone
    speed.main(["--name", "other_cpu", "--steps", "2", "--warmup", "0", "--batch", "2"])
    assert (out / "summary.json").read_text() == "{}"
    doc = json.loads((out / "other_cpu.json").read_text())
    assert doc["command"].endswith("--name other_cpu --steps 2 --warmup 0 --batch 2")
    assert speed.cpu_model() in doc["machine"]
    assert {r["name"] for r in doc["rows"]} == set(speed.ROWS)
    ram = next(r for r in doc["rows"] if r["name"] == "ram")
    assert ram["metrics"]["cpu_ratio_to_ram"] == [1.0] and len(ram["step_ms_all"]) == 2
    assert "other_cpu" in (out / "other_cpu.md").read_text()
