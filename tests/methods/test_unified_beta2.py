"""beta_2 (``model.reinforce_weight``) weighs the policy gradient in the core (issue 22).

Adam is invariant to the scale of a parameter's gradient, so beta_2 can only change training where the
REINFORCE term shares parameters with the other terms: the core and glimpse networks, which it reaches when
``policy_grad_to_core`` is true (the unified default, eq. 14). These tests assert that claim on the gradients and
on a few Adam steps, not shapes.
"""

from __future__ import annotations

import pytest
import torch

from rlattention.engine.config import OptimConfig
from rlattention.engine.method import DataInfo
from rlattention.engine.optim import make_optimizer
from rlattention.methods.unified import Unified, UnifiedConfig
from rlattention.rl import GaussianPolicy

SHAPE = (1, 28, 28)
#: every switch that changes what reaches the core: plain, entropy + context, top-down + conv glimpses
VARIANTS = [
    dict(),
    dict(entropy=True, context=True),
    dict(top_down=True, entropy=True, context=True, glimpse_net="conv", conv_channels=[8, 8, 16], num_scales=2),
]


def _model(beta2: float, routed: bool, dtype=torch.float32, **kw) -> Unified:
    torch.manual_seed(0)  # the same initial weights for every beta_2
    cfg = UnifiedConfig(reinforce_weight=beta2, policy_grad_to_core=routed, num_glimpses=4, **kw)
    return Unified(cfg, DataInfo(SHAPE, 10)).to(dtype)


def _batch(dtype=torch.float32, n=12):
    gen = torch.Generator().manual_seed(1)
    return torch.rand(n, *SHAPE, generator=gen, dtype=dtype), torch.randint(0, 10, (n,), generator=gen)


@pytest.fixture
def float64_policy(monkeypatch):
    """The location policy's mean without its cast to float32 (kept for autocast), so a float64 model stays float64."""
    monkeypatch.setattr(GaussianPolicy, "mean", lambda self, h: torch.tanh(self.fc(h)))


def _core_grads(beta2: float, routed: bool, dtype=torch.float64, **kw) -> dict[str, torch.Tensor]:
    """Gradients of the whole training loss on the core and glimpse networks, from the same weights and draws
    (float64: use with the ``float64_policy`` fixture)."""
    m = _model(beta2, routed, dtype, **kw)
    x, y = _batch(dtype)
    torch.manual_seed(2)  # L_0 and the location noise
    m(x, y).loss.backward()
    named = [*m.core.named_parameters("core"), *m.glimpse.named_parameters("glimpse")]
    return {name: p.grad.clone() for name, p in named}


def test_unified_routes_the_policy_gradient_by_default():
    assert UnifiedConfig().policy_grad_to_core is True
    assert UnifiedConfig().reinforce_weight == 0.01  # the paper's beta_2


@pytest.mark.parametrize("kw", VARIANTS)
@pytest.mark.usefixtures("float64_policy")
def test_routed_policy_gradient_in_the_core_is_beta2_times_that_at_one(kw):
    """Core gradient = classification (+ context) part + beta_2 x policy part: the part beyond beta_2 = 0 is exactly
    beta_2 times that at beta_2 = 1 (float64), and non-zero."""
    zero = _core_grads(0.0, True, **kw)
    one = {k: g - zero[k] for k, g in _core_grads(1.0, True, **kw).items()}
    scale = max(g.abs().max().item() for g in [*one.values(), *zero.values()])
    assert max(g.abs().max() for g in one.values()) > 1e-6 * scale
    for beta2 in (0.01, 0.1, 3.0):
        part = {k: g - zero[k] for k, g in _core_grads(beta2, True, **kw).items()}
        for k in part:  # float64 rounding of the sum, relative to the largest gradient of the network
            torch.testing.assert_close(part[k], beta2 * one[k], rtol=0, atol=1e-12 * scale)


@pytest.mark.usefixtures("float64_policy")
def test_routed_policy_gradient_is_zero_at_beta2_zero():
    """At beta_2 = 0 routing adds nothing: the core's gradient is that of the unrouted model."""
    torch.testing.assert_close(_core_grads(0.0, True), _core_grads(0.0, False), rtol=0, atol=0)


@pytest.mark.parametrize("kw", VARIANTS)
@pytest.mark.usefixtures("float64_policy")
def test_unrouted_core_gradient_is_independent_of_beta2(kw):
    base = _core_grads(0.01, False, **kw)
    for beta2 in (0.0, 0.1, 1.0):
        torch.testing.assert_close(_core_grads(beta2, False, **kw), base, rtol=0, atol=0)


def _trajectory(beta2: float, routed: bool, steps: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """The core's input weights before and after ``steps`` Adam steps (the engine's optimiser) on one tiny batch."""
    m = _model(beta2, routed)
    opt = make_optimizer(m.named_parameters(), OptimConfig(lr=1e-3))
    x, y = _batch()
    w0 = m.core.fc_in.weight.detach().clone()
    torch.manual_seed(2)
    for _ in range(steps):
        opt.zero_grad()
        m(x, y).loss.backward()
        opt.step()
    return w0, m.core.fc_in.weight.detach().clone()


def test_adam_trajectory_depends_on_beta2_only_when_routed():
    """Routed, beta_2 = 0.01 and 0.1 move the core apart by more than half of what 5 steps move it (1.9x here);
    not routed, by under 5% of it: only through Adam's epsilon (1e-8), which the tiny policy gradient of the
    locator is not far above (0.7% here; with epsilon 1e-30 it is 2e-5, float rounding)."""
    gaps = {}
    for routed in (True, False):
        w0, a = _trajectory(0.01, routed)
        _, b = _trajectory(0.1, routed)
        gaps[routed] = ((a - b).abs().max() / (a - w0).abs().max()).item()
    assert gaps[True] > 0.5, gaps
    assert gaps[False] < 0.05, gaps
