"""The moving average of the weights (``trainer.ema_decay``, rlattention/engine/averaging.py): the fused update
against its slow statement, its claim (the average of noisy iterates sits closer to the optimum than the last
iterate), and tiny real runs: validation and the test evaluate the average, checkpoints keep both, a stopped run
resumes to the uninterrupted one's average, bad entries are refused by name."""

from __future__ import annotations

import pytest
import torch
from lightning.fabric import Fabric
from tiny_runs import sigterm_at_step, tiny_ram

from rlattention import load_model
from rlattention.data.registry import build_dataset
from rlattention.engine import trainer
from rlattention.engine.averaging import EMA_KEY, WeightAverage, evaluation_weights, reference_update, warmup_decay
from rlattention.engine.checkpoint import CheckpointError, load_checkpoint_file
from rlattention.engine.config import ConfigError, load_config
from rlattention.engine.evaluate import evaluate
from rlattention.engine.loading import evaluate_checkpoint, load_for_eval
from rlattention.engine.trainer import TrainingInterrupted, fit

TINY = tiny_ram(batch=32, extra=["optim.lr=0.01", "trainer.deterministic=true"])  # 2 steps an epoch


# ------------------------------------------------------------------------------------------ the average alone
def test_warmup_decay_starts_short_and_reaches_the_decay():
    assert warmup_decay(0.999, 0) == pytest.approx(0.1)  # the first update keeps 90% of the new weights
    assert warmup_decay(0.999, 90) == pytest.approx(91 / 100)
    assert warmup_decay(0.999, 10**6) == 0.999
    assert warmup_decay(0.5, 0) == pytest.approx(0.1) and warmup_decay(0.5, 100) == 0.5


def test_the_fused_update_equals_the_slow_statement():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    module[2].bias.requires_grad_(False)  # frozen: not averaged
    avg = WeightAverage(module, 0.9)
    assert avg.names == ["0.weight", "0.bias", "2.weight"]
    slow = {n: a.clone().double() for n, a in avg.weights.items()}
    for _ in range(40):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(torch.randn_like(p))
        reference_update(slow, dict(module.named_parameters()), warmup_decay(0.9, avg.updates))
        avg.update()
    for n in avg.names:
        torch.testing.assert_close(avg.weights[n].double(), slow[n], rtol=1e-5, atol=1e-5)
    assert avg.updates == 40


def test_the_average_of_noisy_iterates_is_closer_to_the_optimum_than_the_last_iterate():
    """SGD on a quadratic with noisy gradients wanders around the optimum; the average of its iterates does not."""
    gen = torch.Generator().manual_seed(1)
    w = torch.nn.Parameter(torch.zeros(2000))
    optimum = torch.randn(2000, generator=gen)
    module = torch.nn.Module()
    module.w = w
    avg = WeightAverage(module, 0.99)
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(1500):
        opt.zero_grad()
        w.grad = (w.detach() - optimum) + torch.randn(2000, generator=gen)  # the gradient of 0.5|w - w*|^2 + noise
        opt.step()
        avg.update()
    last = float(((w.detach() - optimum) ** 2).mean())
    averaged = float(((avg.weights["w"] - optimum) ** 2).mean())
    # stationary variance of the iterate: lr / (2 - lr) ~ 0.053; of a 100-step average about 20x smaller
    assert last == pytest.approx(0.1 / 1.9, rel=0.15)
    assert averaged < last / 8


def test_swapped_in_evaluates_the_average_and_restores_the_trained_weights_even_on_an_error():
    module = torch.nn.Linear(3, 1, bias=False)
    avg = WeightAverage(module, 0.5)
    with torch.no_grad():
        module.weight.fill_(1.0)
    trained = module.weight.detach().clone()
    with avg.swapped_in():
        assert torch.equal(module.weight, avg.weights["weight"]) and not torch.equal(module.weight, trained)
    assert torch.equal(module.weight, trained)
    with pytest.raises(RuntimeError, match="boom"), avg.swapped_in():
        raise RuntimeError("boom")
    assert torch.equal(module.weight, trained)


def test_a_state_that_does_not_fit_is_refused_by_name():
    avg = WeightAverage(torch.nn.Linear(3, 2), 0.9)
    state = avg.state_dict()
    before = {n: a.clone() for n, a in avg.weights.items()}
    with pytest.raises(ValueError, match=r"'ema' weight 'weight' is \[4, 3\], the model's is \[2, 3\]"):
        avg.load_state_dict({**state, "weights": {**state["weights"], "weight": torch.zeros(4, 3)}})
    with pytest.raises(ValueError, match="does not average this model's trained parameters"):
        avg.load_state_dict({**state, "weights": {"weight": torch.zeros(2, 3)}})
    bad_second = {"weight": torch.ones(2, 3), "bias": torch.zeros(5)}  # the first fits, the second does not
    with pytest.raises(ValueError, match=r"'ema' weight 'bias' is \[5\]"):
        avg.load_state_dict({**state, "weights": bad_second})
    assert all(torch.equal(before[n], avg.weights[n]) for n in before)  # nothing half-loaded
    with pytest.raises(ValueError, match=r"trainer.ema_decay must be in \(0, 1\)"):
        WeightAverage(torch.nn.Linear(3, 2), 1.0)


def test_a_shared_parameter_is_averaged_once_and_evaluated_under_every_name():
    """A module held under two names (darp's shared backbone): one average, written under both names, so that
    loading a checkpoint's evaluation weights replaces both copies."""
    net = torch.nn.Module()
    net.photo = torch.nn.Linear(3, 2)
    net.sketch = net.photo  # the same parameters under a second name
    avg = WeightAverage(net, 0.5)
    assert avg.names == ["photo.weight", "photo.bias"] and len(avg._live) == 2
    with torch.no_grad():
        net.photo.weight.add_(1.0)
    avg.update()
    state = avg.state_dict()
    assert set(state["weights"]) == {"photo.weight", "photo.bias", "sketch.weight", "sketch.bias"}
    fresh = torch.nn.Module()
    fresh.photo = torch.nn.Linear(3, 2)
    fresh.sketch = fresh.photo
    fresh.load_state_dict(evaluation_weights({"model": net.state_dict(), EMA_KEY: state}))
    assert torch.equal(fresh.photo.weight, avg.weights["photo.weight"])
    assert not torch.equal(fresh.photo.weight, net.photo.weight)  # the average, not the trained weights
    again = WeightAverage(fresh, 0.5)
    again.load_state_dict(state)
    assert torch.equal(again.weights["photo.weight"], avg.weights["photo.weight"])


def test_half_precision_weights_are_averaged_in_float32():
    """A step of 1 - d = 0.001 toward 1.2 from 1.0 is 0.0002, under half of bf16's spacing at 1 (0.0078)."""
    module = torch.nn.Linear(4, 1, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        module.weight.fill_(1.0)
    avg = WeightAverage(module, 0.999)
    avg.updates = 10**6  # past the warm-up: every step has the decay 0.999
    with torch.no_grad():
        module.weight.fill_(1.2)
    for _ in range(1000):
        avg.update()
    assert avg.weights["weight"].dtype == torch.float32
    target = 1.0 + (1.2 - 1.0) * (1 - 0.999**1000)  # 1.2 is 1.203125 in bf16
    assert float(avg.weights["weight"][0, 0]) == pytest.approx(target, abs=2e-3)


def test_the_decay_is_range_checked():
    with pytest.raises(ConfigError, match="trainer.ema_decay"):
        load_config(None, [*TINY, "trainer.ema_decay=1.0"])
    with pytest.raises(ConfigError, match="trainer.ema_decay"):
        load_config(None, [*TINY, "trainer.ema_decay=-0.1"])


# -------------------------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def splits():
    cfg = load_config(None, TINY)
    return build_dataset(cfg.data.name, cfg.data, None)


def _cfg(tmp_path, name, *overrides):
    return load_config(None, [*TINY, f"trainer.out_dir={tmp_path}", f"trainer.run_name={name}", *overrides])


def test_validation_and_test_evaluate_the_average_and_checkpoints_keep_both(tmp_path, splits, monkeypatch):
    seen = []  # (split, the first weight tensor the model held during the evaluation)

    def recording(fabric, model, dataset, *args, **kwargs):
        seen.append((dataset is splits.val, next(iter(model.parameters())).detach().clone()))
        return evaluate(fabric, model, dataset, *args, **kwargs)

    monkeypatch.setattr(trainer, "evaluate", recording)
    report = fit(_cfg(tmp_path, "ema", "trainer.epochs=4", "trainer.ema_decay=0.9"), splits=splits)
    run = tmp_path / "ema"
    last = load_checkpoint_file(run / "checkpoints" / "last.ckpt")
    best = load_checkpoint_file(run / "checkpoints" / "best.ckpt")
    assert last[EMA_KEY]["updates"] == 8 and last[EMA_KEY]["decay"] == 0.9
    name = next(iter(last[EMA_KEY]["weights"]))
    first = next(iter(last["model"]))
    assert name == first  # the first parameter is averaged
    assert not torch.equal(last[EMA_KEY]["weights"][name], last["model"][name])  # the average is not the weights
    assert seen[3][0] and torch.equal(seen[3][1], last[EMA_KEY]["weights"][name])  # epoch 4's validation: average
    best_epoch = report["best_epoch"]
    assert torch.equal(seen[best_epoch - 1][1], best[EMA_KEY]["weights"][name])  # best.ckpt: what was selected
    assert not seen[-1][0] and torch.equal(seen[-1][1], best[EMA_KEY]["weights"][name])  # the test: best's average
    assert torch.equal(evaluation_weights(best)[name], best[EMA_KEY]["weights"][name])
    # every later evaluation of the checkpoint reads the average: the same test figures, the same weights
    monkeypatch.setattr(trainer, "evaluate", evaluate)
    again = evaluate_checkpoint(run / "checkpoints" / "best.ckpt", split="test")
    assert again == pytest.approx(report["test"])
    loaded = load_model(run)
    assert torch.equal(dict(loaded.named_parameters())[name], best[EMA_KEY]["weights"][name])
    _, model, _ = load_for_eval(run / "checkpoints" / "best.ckpt")  # rlattention eval and viz build with this
    assert torch.equal(dict(model.named_parameters())[name], best[EMA_KEY]["weights"][name])


def test_without_a_decay_nothing_changes(tmp_path, splits):
    fit(_cfg(tmp_path, "plain", "trainer.epochs=2"), splits=splits)
    ckpt = load_checkpoint_file(tmp_path / "plain" / "checkpoints" / "best.ckpt")
    assert EMA_KEY not in ckpt and evaluation_weights(ckpt) is ckpt["model"]


def test_a_stopped_run_resumes_to_the_uninterrupted_runs_average(tmp_path, splits, monkeypatch):
    overrides = ("trainer.epochs=4", "trainer.ema_decay=0.9")
    reference = fit(_cfg(tmp_path, "ref", *overrides), splits=splits)
    cfg = _cfg(tmp_path, "r", *overrides)
    real_backward = Fabric.backward
    sigterm_at_step(monkeypatch, 5)
    with pytest.raises(TrainingInterrupted):
        fit(cfg, splits=splits)
    monkeypatch.setattr(Fabric, "backward", real_backward)
    assert load_checkpoint_file(tmp_path / "r" / "checkpoints" / "last.ckpt")[EMA_KEY]["updates"] == 5
    report = fit(cfg, splits=splits, resume=tmp_path / "r")
    assert report["test"] == reference["test"] and report["best_epoch"] == reference["best_epoch"]
    a, b = (load_checkpoint_file(tmp_path / n / "checkpoints" / "last.ckpt")[EMA_KEY] for n in ("ref", "r"))
    assert a["updates"] == b["updates"] == 8
    for n in a["weights"]:
        torch.testing.assert_close(a["weights"][n], b["weights"][n], rtol=0, atol=1e-6)


def test_a_resume_whose_average_does_not_fit_is_refused_and_leaves_the_checkpoint(tmp_path, splits):
    cfg = _cfg(tmp_path, "r", "trainer.epochs=3", "trainer.ema_decay=0.9")
    fit(cfg, splits=splits)
    last = tmp_path / "r" / "checkpoints" / "last.ckpt"
    ckpt = load_checkpoint_file(last)
    name = next(iter(ckpt[EMA_KEY]["weights"]))
    ckpt[EMA_KEY]["weights"][name] = torch.zeros(1)
    torch.save(ckpt, last)
    before = last.read_bytes()
    more = _cfg(tmp_path, "r", "trainer.epochs=5", "trainer.ema_decay=0.9")
    with pytest.raises(CheckpointError, match=rf"{last}: the checkpoint's 'ema' weight '{name}' is \[1\]"):
        fit(more, splits=splits, resume=tmp_path / "r")
    assert last.read_bytes() == before


def test_a_decay_set_on_resume_starts_the_average_there(tmp_path, splits, capsys):
    fit(_cfg(tmp_path, "r", "trainer.epochs=2"), splits=splits)
    report = fit(_cfg(tmp_path, "r", "trainer.epochs=4", "trainer.ema_decay=0.9"), splits=splits, resume=tmp_path / "r")
    assert report["epochs"] == 4
    assert "holds no weight average: trainer.ema_decay starts it from its weights" in capsys.readouterr().out
    assert load_checkpoint_file(tmp_path / "r" / "checkpoints" / "last.ckpt")[EMA_KEY]["updates"] == 4


def test_a_resume_without_the_decay_says_it_drops_the_average(tmp_path, splits, capsys):
    fit(_cfg(tmp_path, "r", "trainer.epochs=2", "trainer.ema_decay=0.9"), splits=splits)
    fit(_cfg(tmp_path, "r", "trainer.epochs=3"), splits=splits, resume=tmp_path / "r")
    assert "holds a weight average, but trainer.ema_decay is 0: the run continues without it" in capsys.readouterr().out
    assert EMA_KEY not in load_checkpoint_file(tmp_path / "r" / "checkpoints" / "last.ckpt")


def test_without_a_best_checkpoint_the_test_evaluates_the_last_average(tmp_path, splits, monkeypatch):
    """A finished run resumed after its best.ckpt was removed tests the average of last.ckpt, not its trained
    weights."""
    cfg = _cfg(tmp_path, "r", "trainer.epochs=2", "trainer.ema_decay=0.9")
    fit(cfg, splits=splits)
    run = tmp_path / "r"
    (run / "checkpoints" / "best.ckpt").unlink()
    tested = []

    def recording(fabric, model, dataset, *args, **kwargs):
        tested.append(next(iter(model.parameters())).detach().clone())
        return evaluate(fabric, model, dataset, *args, **kwargs)

    monkeypatch.setattr(trainer, "evaluate", recording)
    fit(cfg, splits=splits, resume=run)
    ckpt = load_checkpoint_file(run / "checkpoints" / "last.ckpt")
    name = next(iter(ckpt[EMA_KEY]["weights"]))
    assert len(tested) == 1 and torch.equal(tested[0], ckpt[EMA_KEY]["weights"][name])  # the test alone ran
    assert not torch.equal(ckpt["model"][name], ckpt[EMA_KEY]["weights"][name])
