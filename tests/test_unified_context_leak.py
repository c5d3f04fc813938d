"""benchmarks/unified_context_leak.py on tiny runs of the drawn digits (no data folder): a unified run with the
context constraint is measured on its whole test split, its ``accuracy`` being the test accuracy its study recorded;
a run without the constraint is left out; a run whose checkpoint is gone is named; a recorded run is not measured
again."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from tiny_runs import config_of, tiny_ram

TINY = tiny_ram(train=128, val=32, test=48, extra=["optim.lr=0.01", "trainer.epochs=2", "trainer.deterministic=true"])


@pytest.fixture(scope="module")
def leak(benchmark_module):
    return benchmark_module("unified_context_leak")


def test_a_context_run_is_measured_once_and_the_others_left_out(leak, benchmark_module, tmp_path, capsys):
    study = benchmark_module("study")
    source = tmp_path / "unified_tiny"
    source.mkdir()
    (tmp_path / "runs").mkdir()
    records = []
    for name, method, extra in (("ctx", "unified", {"context": True, "context_hidden": 16}), ("ram", "ram", {})):
        config = tmp_path / f"{name}.yaml"
        body = config_of(TINY)
        body["model"].update(extra)
        config.write_text(yaml.safe_dump({"method": method, **body}))
        records.append(study.run_one(study.Row(name, str(config)), 0, None, tmp_path / "runs", 1, []))
    (source / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "leak"
    argv = ["--sources", str(source), "--out", str(out)]
    assert leak.main(argv) == 0
    (rec,) = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert rec["row"] == "unified_tiny:ctx" and rec["report"]["tokens"] == 48  # the whole test split, one token each
    assert rec["report"]["accuracy"] == pytest.approx(records[0]["report"]["test"]["accuracy"], abs=1e-3)
    assert rec["report"]["token_accuracy"] == rec["report"]["accuracy"]  # one label per image
    for key in ("context_accuracy", "context_follows_wrong_label", "context_accuracy_confidence"):
        assert 0.0 <= rec["report"][key] <= 100.0
    doc = json.loads((out / "summary.json").read_text())
    assert [r["name"] for r in doc["rows"]] == ["unified_tiny:ctx"]  # the RAM run has no context: left out
    assert "(= " in (out / "summary.md").read_text()  # its accuracy is the recorded one
    capsys.readouterr()
    shutil.rmtree(tmp_path / "runs" / "ctx_s0")
    assert leak.main(argv) == 0  # recorded: kept, not measured again, although its folder is gone now
    assert "[context_leak]" not in capsys.readouterr().out
    (out / "runs.jsonl").unlink()
    assert leak.main(argv) == 0
    assert (
        "Not measured, their best.ckpt gone from this machine: unified_tiny:ctx seed 0"
        in (out / "summary.md").read_text()
    )
