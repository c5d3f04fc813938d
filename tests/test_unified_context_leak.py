"""benchmarks/unified_context_leak.py on tiny runs of the drawn digits (no data folder): a unified run with the
context constraint is measured on its whole test split, its ``accuracy`` being the test accuracy its study recorded;
a run without the constraint is left out; a run whose checkpoint is gone, or (``--summary-only``) one not yet measured,
is named; a recorded run is not measured again."""

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
    assert leak.main([*argv, "--summary-only"]) == 0  # measures nothing; names the context run it would measure
    assert not (out / "runs.jsonl").exists()
    said = (out / "summary.md").read_text()
    assert "not yet measured (run without --summary-only): unified_tiny:ctx seed 0." in said and ":ram" not in said
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


def test_a_sequence_run_is_measured_per_token_against_a_reference(leak, benchmark_module, require_data, tmp_path):
    """A unified sequence model (tokens padded with -1 after the end token): ``tokens`` counts the valid tokens of
    the whole test split, ``accuracy`` is the recorded whole-sequence accuracy and ``token_accuracy`` the share of
    valid tokens that the model's own prediction (centre start, no randomness) gets right, recomputed here."""
    import torch

    from rlattention.engine.loading import load_for_eval

    data_dir = str(require_data("mnist"))
    study = benchmark_module("study")
    overrides = [
        "data.num_train=64", "data.val_size=32", "data.num_test=40", "data.max_digits=2", "data.canvas_size=40",
        "model.num_glimpses=6", "model.glimpses_per_token=2", "model.hidden_size=16", "model.conv_channels=[4,4,4]",
        "model.context_hidden=16", "trainer.epochs=1", "trainer.batch_size=16", "trainer.eval_batch_size=16",
        "trainer.deterministic=true", "eval.viz_images=0",
    ]  # fmt: skip
    row = study.Row("seq", "configs/unified_mnist_sequences.yaml", overrides)
    (tmp_path / "runs").mkdir()
    rec = study.run_one(row, 0, data_dir, tmp_path / "runs", 1, [])
    source = tmp_path / "unified_seq"
    source.mkdir()
    (source / "runs.jsonl").write_text(json.dumps(rec) + "\n")
    out = tmp_path / "leak"
    assert leak.main(["--data-dir", data_dir, "--sources", str(source), "--out", str(out)]) == 0
    (got,) = [json.loads(line)["report"] for line in (out / "runs.jsonl").read_text().splitlines()]
    assert got["accuracy"] == pytest.approx(rec["report"]["test"]["accuracy"], abs=1e-3)
    _, model, splits = load_for_eval(tmp_path / "runs" / "seq_s0" / "checkpoints" / "best.ckpt", data_dir)
    model.eval()
    targets = splits.test.targets
    valid = targets >= 0
    assert (~valid).any() and valid.sum(1).min() >= 2  # padded sequences (a digit and the end token at least)
    assert got["tokens"] == int(valid.sum()) and got["num_classes"] == 11
    with torch.no_grad():
        probs = model.predict(splits.test.images.float() / 255.0)  # (N, J, K), the mean locations
    right = (probs.argmax(-1) == targets) & valid
    assert got["token_accuracy"] == pytest.approx(100.0 * int(right.sum()) / int(valid.sum()), abs=1e-3)
    whole = (right | ~valid).all(-1).float().mean().item() * 100.0
    assert got["accuracy"] == pytest.approx(whole, abs=1e-3)
    for key in ("context_accuracy", "context_follows_wrong_label", "context_accuracy_confidence"):
        assert 0.0 <= got[key] <= 100.0
