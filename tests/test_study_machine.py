"""benchmarks/study.py: a record names the CPU it ran on, and a summary's machine line names the CPUs of its runs
(a seed's weights, not only its times, differ between CPUs)."""

from __future__ import annotations

import json
import os

import pytest


@pytest.fixture(scope="module")
def study(benchmark_module):
    return benchmark_module("study")


def test_a_record_is_stamped_with_this_cpu_unless_it_names_one(study, tmp_path):
    log = tmp_path / "runs.jsonl"
    study.append_record(log, {"row": "a", "command": "rlattention fit trainer.num_threads=1"})
    study.append_record(log, {"row": "b", "command": "rlattention fit trainer.num_threads=1", "cpu": "Other CPU"})
    study.append_record(log, {"row": "c", "command": "rlattention fit trainer.num_threads=1", "cpu": None})
    a, b, c = (json.loads(line) for line in log.read_text().splitlines())
    assert a["cpu"] == study.cpu_model() and a["cpu"]  # this machine ran it
    assert b["cpu"] == "Other CPU" and c["cpu"] is None  # copied records keep what their source said


def test_the_machine_line_counts_the_runs_of_each_cpu(study):
    cmd = "rlattention fit trainer.num_threads=1"
    cpus = ["AMD EPYC, x86_64", "AMD EPYC, x86_64", "Intel Xeon, x86_64", None]
    records = [{"command": cmd, "cpu": cpu} for cpu in cpus] + [{"command": cmd}]
    line = study.machine(records)
    assert line.startswith(f"1 torch thread(s) per run; this summary written on {os.cpu_count()} cores, ")
    assert study.cpu_model() in line.split("; the runs' CPUs")[0]  # this machine, named as the summary's writer
    assert line.endswith("the runs' CPUs: AMD EPYC, x86_64 (2 runs), Intel Xeon, x86_64 (1 run), not recorded (2 runs)")
    # records written before runs named their CPU: the line says nothing it does not know
    assert "CPUs" not in study.machine([{"command": cmd}])
