"""RAM: shapes, the actions it is trained on are the ones it used, deterministic evaluation."""

from __future__ import annotations

import pytest
import torch

from rlattention.engine.method import DataInfo
from rlattention.engine.registry import available_methods, get_method
from rlattention.methods.ram import RAM, RAMConfig


def _model(**kw) -> RAM:
    torch.manual_seed(0)
    return RAM(RAMConfig(**kw), DataInfo((1, 28, 28), 10))


@pytest.mark.parametrize("core", ["rnn", "lstm"])
@pytest.mark.parametrize("k,T", [(1, 6), (3, 4), (2, 1)])
def test_episode_shapes(core, k, T):
    m = _model(core=core, num_scales=k, num_glimpses=T)
    ep = m.episode(torch.rand(5, 1, 28, 28))
    assert ep.logits.shape == (5, 10)
    assert ep.log_pi.shape == (5, T - 1) and ep.baseline.shape == (5, T - 1)
    assert ep.locations.shape == (5, T, 2)
    assert ep.patches.shape == (5, T, k, 1, 8, 8)
    assert ep.hidden.shape == (5, T, m.cfg.hidden_size)
    out = m(torch.rand(5, 1, 28, 28), torch.randint(0, 10, (5,)))
    out.loss.backward()
    assert torch.isfinite(out.loss)


def test_log_prob_is_of_the_location_the_sensor_used(monkeypatch):
    m = _model(num_glimpses=5, std=0.3)
    seen = []
    real = m.sensor.extract
    monkeypatch.setattr(m.sensor, "extract", lambda p, loc, dtype: seen.append(loc.clone()) or real(p, loc, dtype))
    means = []
    real_mean = m.locator.mean
    monkeypatch.setattr(m.locator, "mean", lambda h: means.append(real_mean(h)) or means[-1])
    ep = m.episode(torch.rand(7, 1, 28, 28))
    used = torch.stack(seen, 1)  # (B, T, 2): what the sensor actually looked at
    assert torch.equal(used, ep.locations)
    for t in range(4):  # the action of step t is the location of glimpse t + 1
        ref = torch.distributions.Normal(means[t], 0.3).log_prob(used[:, t + 1]).sum(-1)
        torch.testing.assert_close(ep.log_pi[:, t], ref)


def test_prepare_once_per_episode(monkeypatch):
    m = _model(num_glimpses=6)
    calls = []
    real = m.sensor.prepare
    monkeypatch.setattr(m.sensor, "prepare", lambda x: calls.append(1) or real(x))
    m.episode(torch.rand(3, 1, 28, 28))
    assert len(calls) == 1


def test_policy_gradient_routing_switch():
    x = torch.rand(8, 1, 28, 28)
    for to_core in (True, False):
        m = _model(policy_grad_to_core=to_core, num_glimpses=3)
        ep = m.episode(x)
        from rlattention.rl import reinforce_loss

        reinforce_loss(ep.log_pi, torch.ones_like(ep.log_pi), ep.baseline).backward()
        core_grad = m.core.fc_in.weight.grad
        assert (core_grad is not None and core_grad.abs().sum() > 0) == to_core
        assert m.locator.fc.weight.grad.abs().sum() > 0
        assert m.baseline.fc.weight.grad is None  # the policy term never trains the baseline


def test_predict_is_deterministic_and_seeded():
    m = _model().eval()
    x = torch.rand(6, 1, 28, 28)
    p1 = m.predict(x, generator=torch.Generator().manual_seed(3))
    p2 = m.predict(x, generator=torch.Generator().manual_seed(3))
    assert torch.equal(p1, p2)
    torch.testing.assert_close(p1.sum(-1), torch.ones(6))
    mc1 = m.predict(x, mc_samples=4, generator=torch.Generator().manual_seed(5))
    mc2 = m.predict(x, mc_samples=4, generator=torch.Generator().manual_seed(5))
    assert torch.equal(mc1, mc2) and not torch.equal(mc1, p1)


def test_std_anneals_with_progress():
    m = _model(std=0.2, std_final=0.05)
    m.set_progress(0.0)
    assert m.locator.std == pytest.approx(0.2)
    m.set_progress(0.5)
    assert m.locator.std == pytest.approx(0.125)
    m.set_progress(1.0)
    assert m.locator.std == pytest.approx(0.05)


@pytest.mark.parametrize("name", available_methods())
def test_every_registered_method_builds_and_steps(name):
    cls = get_method(name)
    if cls.task in ("sketch_retrieval", "image_text", "reid"):
        pytest.skip("needs its own data layout: tests/methods/test_{darp,dcpg,scal}.py")
    m = cls.from_config(cls.Config(), DataInfo((1, 28, 28), 10))
    if cls.task == "multilabel":
        y = torch.zeros(4, 10)
        y[:, 3] = 1
    else:
        y = torch.randint(0, 10, (4,))
    out = m(torch.rand(4, 1, 28, 28), y)
    out.loss.backward()
    m.eval()
    p = m.predict(torch.rand(4, 1, 28, 28))
    assert p.shape == (4, 10)
    assert set(m.metrics(p, y)) >= {m.selection_metric[0], "count"}


def test_bad_model_config():
    with pytest.raises(ValueError, match="core"):
        _model(core="gru")
    with pytest.raises(ValueError, match="init_location"):
        _model(init_location="corner")


@pytest.mark.parametrize("method", ["ram", "unified"])
def test_augment_shift_translates_training_images_only(method, monkeypatch):
    cls = get_method(method)
    model = cls.from_config(cls.Config(augment_shift=2), DataInfo((1, 12, 12), 10))
    seen = []
    real_episode = RAM.episode

    def spy(self, images, *args, **kwargs):
        seen.append(images.clone())
        return real_episode(self, images, *args, **kwargs)

    monkeypatch.setattr(RAM, "episode", spy)
    images = torch.zeros(64, 1, 12, 12)
    images[:, 0, 5, 6] = 1.0  # one bright pixel
    torch.manual_seed(0)
    model(images, torch.zeros(64, dtype=torch.long))
    shifted = seen[-1]
    assert shifted.shape == images.shape and torch.equal(shifted.sum((1, 2, 3)), torch.ones(64))  # moved, not lost
    where = shifted[:, 0].flatten(1).argmax(1)
    dy, dx = where // 12 - 5, where % 12 - 6
    assert dy.abs().max() <= 2 and dx.abs().max() <= 2
    assert len(set(zip(dy.tolist(), dx.tolist(), strict=True))) > 5  # different shifts per image
    model.eval().predict(images)
    assert torch.equal(seen[-1], images)  # evaluation sees the images as they are
    with pytest.raises(ValueError, match="model.augment_shift"):
        cls.from_config(cls.Config(augment_shift=-1), DataInfo((1, 12, 12), 10))
