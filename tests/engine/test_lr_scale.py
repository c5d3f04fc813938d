"""``optim.lr_scale``: learning-rate multipliers by parameter-name prefix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from rlattention.engine.config import ConfigError, OptimConfig, from_dict, load_config, to_dict
from rlattention.engine.optim import make_optimizer


def _net() -> nn.Module:
    net = nn.Module()
    net.core = nn.Linear(3, 3)
    net.locator = nn.Linear(3, 2)
    net.locators = nn.Linear(3, 2)  # shares a prefix of letters, not of modules
    return net


def test_the_named_module_steps_at_its_own_rate():
    net = _net()
    opt = make_optimizer(
        net.named_parameters(), OptimConfig(name="sgd", lr=0.1, momentum=0.0, lr_scale={"locator": 10})
    )
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    moved = {n: float((before[n] - p.detach()).abs().max()) for n, p in net.named_parameters()}
    assert moved["locator.weight"] == pytest.approx(1.0)  # 10 x 0.1 x 1
    assert moved["locators.weight"] == pytest.approx(0.1)
    assert moved["core.weight"] == pytest.approx(0.1)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)  # the plain rate first (train/lr logs group 0)


def test_longest_prefix_wins():
    net = nn.Module()
    net.a = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    opt = make_optimizer(net.named_parameters(), OptimConfig(lr=1.0, lr_scale={"a": 2, "a.1": 5}))
    rates = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert rates[id(net.a[0].weight)] == 2.0 and rates[id(net.a[1].bias)] == 5.0


def test_bad_prefix_or_scale_is_a_clear_error():
    with pytest.raises(ValueError, match=r"optim.lr_scale.locatr: no parameter.*'core'"):
        make_optimizer(_net().named_parameters(), OptimConfig(lr_scale={"locatr": 10}))
    with pytest.raises(ValueError, match=r"optim.lr_scale.locator must be > 0, got 0"):
        make_optimizer(_net().named_parameters(), OptimConfig(lr_scale={"locator": 0}))
    with pytest.raises(ValueError, match="needs named parameters"):
        make_optimizer(_net().parameters(), OptimConfig(lr_scale={"locator": 10}))


def test_from_the_command_line():
    cfg = load_config("configs/darp_omniglot.yaml", ["optim.lr_scale.locator=10"])
    assert dict(cfg.optim.lr_scale) == {"locator": 10.0}
    with pytest.raises(ConfigError):
        load_config("configs/darp_omniglot.yaml", ["optim.lr_scale.locator=fast"])


def test_from_a_file_and_a_checkpoints_config(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "base: " + str(Path("configs/darp_omniglot.yaml").resolve()) + "\noptim:\n  lr_scale:\n    locator: 3\n"
    )
    cfg = load_config(str(tmp_path / "c.yaml"), [])
    assert dict(cfg.optim.lr_scale) == {"locator": 3.0}
    assert dict(from_dict(to_dict(cfg)).optim.lr_scale) == {"locator": 3.0}  # what a checkpoint stores, read back
    with pytest.raises(ConfigError):  # the other sections still refuse unknown keys
        load_config("configs/darp_omniglot.yaml", ["optim.lr_scal.locator=3"])


def test_a_methods_own_scales_apply_under_optim_lr_scale():
    """AttentionMethod.lr_scales (e.g. dcpg's model.policy_lr_scale) steps its modules at their rate; a prefix
    that optim.lr_scale also names takes optim's factor."""
    net = _net()
    opt = make_optimizer(
        net.named_parameters(), OptimConfig(name="sgd", lr=0.1, momentum=0.0), {"locator": 10, "core": 3}
    )
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt.step()
    moved = {n: float((before[n] - p.detach()).abs().max()) for n, p in net.named_parameters()}
    assert moved["locator.weight"] == pytest.approx(1.0) and moved["core.weight"] == pytest.approx(0.3)
    assert moved["locators.weight"] == pytest.approx(0.1)
    cfg = OptimConfig(name="sgd", lr=0.1, momentum=0.0, lr_scale={"core": 2})
    rates = {len(g["params"]): g["lr"] for g in make_optimizer(net.named_parameters(), cfg, {"core": 3}).param_groups}
    assert sorted(rates.values()) == pytest.approx([0.1, 0.2])  # optim.lr_scale's 2 replaces the method's 3


def test_dcpg_policy_lr_scale_is_optim_lr_scale_of_its_policies():
    from rlattention.engine.method import DataInfo
    from rlattention.methods.dcpg import DCPG, DCPGConfig

    info = DataInfo((1, 4, 12), 6, {"vocab_size": 20})
    cfg = {"embed_dim": 16, "word_dim": 8, "num_bins": 10, "gcn_layers": 1}
    model = DCPG(DCPGConfig(**cfg, policy_lr_scale=10.0), info)
    assert model.lr_scales() == {"image_policy": 10.0, "text_policy": 10.0}
    groups = make_optimizer(model.named_parameters(), OptimConfig(lr=1e-3), model.lr_scales()).param_groups
    same = make_optimizer(
        model.named_parameters(), OptimConfig(lr=1e-3, lr_scale={"image_policy": 10, "text_policy": 10})
    ).param_groups
    assert [(g["lr"], [id(p) for p in g["params"]]) for g in groups] == [
        (g["lr"], [id(p) for p in g["params"]]) for g in same
    ]
    policy = {id(p) for p in [*model.image_policy.parameters(), *model.text_policy.parameters()]}
    assert {id(p) for p in groups[1]["params"]} == policy and groups[1]["lr"] == pytest.approx(1e-2)
    assert DCPG(DCPGConfig(**cfg, pg="none", policy_lr_scale=10.0), info).lr_scales() == {}  # no policy to scale
    with pytest.raises(ValueError, match="model.policy_lr_scale must be > 0"):
        DCPG(DCPGConfig(**cfg, policy_lr_scale=0.0), info)
