"""benchmarks/glimpse_spread.py: where a trained glimpse model looks, on tiny RAM runs of the drawn digits."""

from __future__ import annotations

import json

import pytest
from tiny_runs import tiny_ram

from rlattention.engine.config import load_config
from rlattention.engine.trainer import fit


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    folders = {}
    for start in ("random", "center"):
        extra = [
            f"model.init_location={start}",
            "trainer.epochs=1",
            f"trainer.out_dir={out}",
            f"trainer.run_name={start}",
        ]
        fit(load_config(None, tiny_ram(glimpses=3, extra=extra)))
        folders[start] = out / start
    return folders


@pytest.fixture
def gs(benchmark_module):
    return benchmark_module("glimpse_spread")


def test_a_start_at_the_centre_reads_zero_and_a_random_start_does_not(gs, runs):
    centre, random = gs.spread(runs["center"], None, 32), gs.spread(runs["random"], None, 32)
    assert len(centre["distance"]) == len(centre["spread"]) == 3  # one figure per glimpse
    assert centre["distance"][0] == 0.0 and centre["spread"][0] == 0.0  # every image: L_0 = (0, 0)
    # uniform in [-1, 1]^2: mean distance about 0.77, spread sqrt(2/3) = 0.82; 32 images
    assert 0.5 < random["distance"][0] < 1.0 and 0.6 < random["spread"][0] < 1.0
    assert all(s > 0 for s in centre["spread"][1:])  # the later glimpses follow each image


def test_the_accuracy_is_the_one_validation_measured(gs, runs):
    """On the whole validation split the pass is the evaluation's: the best checkpoint's accuracy is the run's best
    validation accuracy."""
    report = json.loads((runs["random"] / "report.json").read_text())
    assert gs.spread(runs["random"], None, 10_000)["accuracy"] == pytest.approx(report["best_val_accuracy"], abs=0.01)


def test_bad_input_is_named_and_nothing_is_overwritten(gs, runs, tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="no best checkpoint"):
        gs.spread(tmp_path, None, 8)
    out = tmp_path / "spread.json"
    assert gs.main([str(runs["center"]), "--limit", "8", "--out", str(out)]) == 0
    assert "| center | 8 |" in capsys.readouterr().out
    first = out.read_text()
    assert json.loads(first)[0]["images"] == 8
    with pytest.raises(SystemExit):
        gs.main([str(runs["center"]), "--limit", "8", "--out", str(out)])
    assert "exists" in capsys.readouterr().err and out.read_text() == first
