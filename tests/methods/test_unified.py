"""The unified model: every switch, the context weights, the entropy weighting, Q-learning, sequences."""

from __future__ import annotations

import pytest
import torch

from rlattention.engine.method import DataInfo
from rlattention.methods.unified import Unified, UnifiedConfig


def _model(shape=(1, 28, 28), classes=10, **kw) -> Unified:
    torch.manual_seed(0)
    return Unified(UnifiedConfig(**kw), DataInfo(shape, classes))


SWITCHES = [
    dict(),
    dict(entropy=True),
    dict(entropy=True, context=True),
    dict(top_down=True),
    dict(top_down=True, entropy=True, context=True, glimpse_net="conv", num_scales=2, glimpse_size=12),
    dict(top_down=True, exploration="softmax", pyramid_levels=3),
]


@pytest.mark.parametrize("kw", SWITCHES)
def test_every_switch_trains_and_predicts(kw):
    shape = (1, 60, 60)
    m = _model(shape, **kw)
    x, y = torch.rand(6, *shape), torch.randint(0, 10, (6,))
    out = m(x, y)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert ("context" in out.terms) == kw.get("context", False)
    assert ("q" in out.terms) == kw.get("top_down", False)
    m.eval()
    p1 = m.predict(x, generator=torch.Generator().manual_seed(0))
    p2 = m.predict(x, generator=torch.Generator().manual_seed(0))
    assert p1.shape == (6, 10) and torch.equal(p1, p2)


def test_context_weights_sum_to_one():
    m = _model(context=True, num_glimpses=6)
    ep = m.episode(torch.rand(5, 1, 28, 28))
    w = m.context_weights(ep.hidden, torch.randint(0, 10, (5, 1)))
    assert w.shape == (5, 1, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(5, 1))
    assert (w >= 0).all()


def test_entropy_weights_the_reinforce_term(monkeypatch):
    """With entropy on, the policy gradient of action t is scaled by entropy(x_{t+1}) + lambda."""
    import rlattention.methods.unified as U

    seen = {}
    real = U.policy_gradient_losses

    def spy(log_pi, returns, baseline, weights=None, mask=None):
        seen["weights"] = weights
        return real(log_pi, returns, baseline, weights, mask)

    monkeypatch.setattr(U, "policy_gradient_losses", spy)
    m = _model(entropy=True, entropy_lambda=0.5, num_glimpses=4)
    x = torch.zeros(3, 1, 28, 28)  # blank images: every patch has entropy 0
    m(x, torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(seen["weights"], torch.full((3, 3), 0.5))
    m = _model(entropy=False, num_glimpses=4)
    m(x, torch.zeros(3, dtype=torch.long))
    assert seen["weights"] is None


def test_q_target_frozen_between_syncs():
    m = _model((1, 28, 28), top_down=True, target_sync_every=3)
    x, y = torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,))
    target_before = {k: v.clone() for k, v in m.q_target.state_dict().items()}
    with torch.no_grad():
        for p in m.q_net.parameters():
            p.add_(0.1)
    m(x, y)
    m(x, y)  # two updates: no sync yet
    assert all(torch.equal(v, m.q_target.state_dict()[k]) for k, v in target_before.items())
    m(x, y)  # third update synchronises
    assert all(torch.equal(v, m.q_net.state_dict()[k.removeprefix("net.")]) for k, v in m.q_target.state_dict().items())


def test_initial_location_lies_in_chosen_region():
    m = _model((1, 40, 40), top_down=True, pyramid_levels=2)
    x = torch.rand(8, 1, 40, 40)
    td = m.top_down(x, greedy=False, generator=torch.Generator().manual_seed(0))
    start = m._start_in(td.region, deterministic=False, generator=torch.Generator().manual_seed(1))
    assert ((start >= td.region[:, :2]) & (start <= td.region[:, 2:])).all()
    side = td.region[:, 2:] - td.region[:, :2]
    torch.testing.assert_close(side, torch.full((8, 2), 0.5))  # 2 levels of a 2x2 split: a quarter side


def test_sequences():
    m = _model(
        (1, 54, 54), classes=11, num_glimpses=18, glimpses_per_token=3, num_scales=2, glimpse_size=12, context=True
    )
    y = torch.tensor([[3, 10, -1, -1, -1, -1], [1, 2, 3, 4, 5, 10]])
    out = m(torch.rand(2, 1, 54, 54), y)
    out.loss.backward()
    m.eval()
    p = m.predict(torch.rand(2, 1, 54, 54))
    assert p.shape == (2, 6, 11)
    perfect = torch.nn.functional.one_hot(y.clamp(min=0), 11).float()
    assert m.metrics(perfect, y)["error"] == 0.0
    with pytest.raises(ValueError, match="multiple"):
        _model(num_glimpses=7, glimpses_per_token=3)


def test_evaluation_descends_greedily_even_with_mc_samples(monkeypatch):
    m = _model((1, 40, 40), top_down=True).eval()
    greedy_flags = []
    real = m.top_down
    monkeypatch.setattr(m, "top_down", lambda *a, **k: greedy_flags.append(k["greedy"]) or real(*a, **k))
    m.predict(torch.rand(3, 1, 40, 40), mc_samples=2, generator=torch.Generator().manual_seed(0))
    assert greedy_flags == [True, True]


def test_sequence_targets_must_match_emitted_tokens():
    m = _model((1, 54, 54), classes=11, num_glimpses=6, glimpses_per_token=3)  # emits 2 tokens
    y = torch.tensor([[1, 2, 3, 10]])  # a 3-digit target needs 4 tokens
    with pytest.raises(ValueError, match="4 positions but the model emits 2"):
        m(torch.rand(1, 1, 54, 54), y)


# ---------------------------------------------------------------- the top-down path's fast kernels (vision/pyramid)
def _reference_features(net, regions):
    """The region encoder as first written: ``nn.Conv2d``, ReLU, ``nn.AdaptiveAvgPool2d``."""
    side = min(4, regions.shape[-1])
    return torch.nn.AdaptiveAvgPool2d(side)(torch.relu(net.conv(regions))).flatten(1)


def _clutter(n, shape, seed=0):
    """Dark images with 6 bright random squares of a sixth of the side (well-separated Q-values, unlike noise)."""
    g = torch.Generator().manual_seed(seed)
    x, side = torch.zeros(n, *shape), shape[-1] // 6
    for b in range(n):
        for _ in range(6):
            i, j = torch.randint(0, shape[-1] - side, (2,), generator=g).tolist()
            x[b, :, i : i + side, j : j + side] = torch.rand(shape[0], side, side, generator=g)
    return x


@pytest.mark.parametrize("size,out", [(25, 4), (7, 4), (3, 3), (10, 4), (50, 4)])
def test_adaptive_pool_matrix_is_adaptive_avg_pool(size, out):
    from rlattention.vision.pyramid import adaptive_pool_matrix

    x = torch.rand(5, size, dtype=torch.float64)
    ref = torch.nn.functional.adaptive_avg_pool1d(x[:, None], out)[:, 0]
    assert torch.allclose(x @ adaptive_pool_matrix(size, out).double().t(), ref)


@pytest.mark.parametrize("channels,px,n,chunk", [(1, 25, 70, 32), (3, 7, 40, 32), (1, 3, 5, 32), (2, 10, 33, 8)])
def test_region_features_match_conv_relu_pool(channels, px, n, chunk):
    """Values and gradients (regions, weight, bias) of the kernel against nn.Conv2d, ReLU, nn.AdaptiveAvgPool2d;
    n not a multiple of the chunk (zero regions complete the last one), several chunks."""
    from rlattention.methods.unified import RegionQNetwork
    from rlattention.vision.pyramid import conv_relu_pool

    torch.manual_seed(0)
    net = RegionQNetwork(channels, px, 4, 16)
    x = torch.randn(n, channels, px, px, requires_grad=True)
    w = torch.randn(n, 16 * min(4, px) ** 2)
    results = []
    for f in (_reference_features, lambda net, x: conv_relu_pool(x, net.conv.weight, net.conv.bias, net.pool, chunk)):
        net.zero_grad()
        x.grad = None
        y = f(net, x)
        (y * w).sum().backward()
        results.append((y.detach(), x.grad.clone(), net.conv.weight.grad.clone(), net.conv.bias.grad.clone()))
    for a, b in zip(
        *results, strict=True
    ):  # sums over n * px * px terms in another order: float rounding of the largest
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(a.abs().max()))
    with torch.no_grad():  # the target network's path
        assert torch.allclose(net.features(x), results[0][0], rtol=1e-4, atol=1e-5)


def test_region_features_equal_the_reference_in_float64():
    """In float64 the kernel and the modules agree to 1e-12: the same function, summed in another order."""
    from rlattention.methods.unified import RegionQNetwork
    from rlattention.vision.pyramid import adaptive_pool_matrix

    torch.manual_seed(0)
    net = RegionQNetwork(1, 25, 4, 16).double()
    net.pool = adaptive_pool_matrix(25, 4, torch.float64)  # the averaging weights in float64 too (1/7)
    x = torch.randn(40, 1, 25, 25, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, 256, dtype=torch.float64)
    grads = []
    for f in (_reference_features, lambda net, x: net.features(x)):
        net.zero_grad()
        x.grad = None
        y = f(net, x)
        (y * w).sum().backward()
        grads.append((y.detach(), x.grad.clone(), net.conv.weight.grad.clone(), net.conv.bias.grad.clone()))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12 * float(a.abs().max()))


@pytest.mark.parametrize("cells", [(1, 1), (2, 2), (2, 3), (4, 1)])
def test_block_means_is_avg_pool2d(cells):
    from rlattention.vision.pyramid import block_means

    x = torch.rand(3, 2, 12, 12, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 12 // cells[0], 12 // cells[1], dtype=torch.float64)
    ref = torch.nn.functional.avg_pool2d(x, cells)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), x)
    got = block_means(x, *cells)
    (g_got,) = torch.autograd.grad((got * w).sum(), x)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(g_got, g_ref)


@pytest.mark.parametrize("shape,split", [((1, 100, 100), 2), ((3, 60, 40), 2), ((1, 54, 54), 3)])
def test_tile_views_match_area_crops(shape, split):
    """On the pixel grid, the tiles of the average-pooled image are the area crops, values and image gradients."""
    from rlattention.vision.crops import crop_boxes, grid_boxes
    from rlattention.vision.pyramid import pyramid_cells, tile_views

    C, H, W = shape
    x = torch.rand(4, *shape, dtype=torch.float64, requires_grad=True)
    view = min(H, W) // 2 // split
    region = x.new_tensor([-1.0, -1.0, 1.0, 1.0]).expand(4, 4)
    g = torch.Generator().manual_seed(0)
    for level in range(2):
        cells = (pyramid_cells(H, split ** (level + 1), view), pyramid_cells(W, split ** (level + 1), view))
        boxes = grid_boxes(region, split)
        if all(cells):
            ref, got = crop_boxes(x, boxes, (view, view)), tile_views(x, boxes, view, cells)
            w = torch.randn(ref.shape, dtype=torch.float64)
            (g_ref,) = torch.autograd.grad((ref * w).sum(), x)
            (g_got,) = torch.autograd.grad((got * w).sum(), x)
            torch.testing.assert_close(got, ref)
            torch.testing.assert_close(g_got, g_ref)
        region = boxes[torch.arange(4), torch.randint(0, split**2, (4,), generator=g)]


def test_pyramid_levels_take_tiles_only_on_the_pixel_grid():
    """100 x 100 at 25 x 25 views: cells of 2 then 1 pixels (tiles); a third level (12.5 pixels viewed at 25) and
    region_size 24 (12 x 12 views) are off the grid: area crops. Either way the views are the area crops."""
    from rlattention.vision.crops import crop_boxes, grid_boxes

    assert _model((1, 100, 100), top_down=True).view_cells == [(2, 2), (1, 1)]
    assert _model((1, 100, 100), top_down=True, pyramid_levels=3).view_cells == [(2, 2), (1, 1), None]
    assert _model((1, 100, 100), top_down=True, region_size=24).view_cells == [None, None]
    m = _model((1, 100, 100), top_down=True, pyramid_levels=3)
    x = _clutter(4, (1, 100, 100))
    region = x.new_tensor([-1.0, -1.0, 1.0, 1.0]).expand(4, 4)
    for level in range(3):
        boxes, views = m._level_views(x, None, region, level)
        torch.testing.assert_close(views, crop_boxes(x, grid_boxes(region, 2), (25, 25)))
        region = boxes[:, (level + 1) % 4]


def test_fast_top_down_trains_as_the_reference(monkeypatch):
    """A few optimiser steps from one seed give the same losses and weights (up to float rounding) with the fast
    kernels as with the references: nn.Conv2d + nn.AdaptiveAvgPool2d, and area crops for every pyramid level."""
    import rlattention.methods.unified as U
    from rlattention.methods.unified import RegionQNetwork

    shape = (1, 60, 60)
    x, y = _clutter(16, shape), torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(1))

    def train():
        m = _model(shape, top_down=True, entropy=True, context=True, num_scales=2, glimpse_size=8)
        m.set_progress(0.5)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        torch.manual_seed(1)
        out = []
        for _ in range(4):
            step = m(x, y)
            opt.zero_grad()
            step.loss.backward()
            opt.step()
            out.append(torch.stack([v.detach() for v in step.terms.values()]))
        return torch.stack(out), m.state_dict()

    fast, fast_weights = train()
    monkeypatch.setattr(RegionQNetwork, "features", _reference_features)
    monkeypatch.setattr(U, "tile_views", lambda images, boxes, view, cells: U.crop_boxes(images, boxes, (view, view)))
    ref, ref_weights = train()
    assert torch.allclose(fast, ref, rtol=1e-5, atol=1e-6)
    for k, v in ref_weights.items():  # Adam steps of about lr = 1e-3: rounding of the gradients moves them ~1e-8
        assert torch.allclose(fast_weights[k].float(), v.float(), rtol=0, atol=1e-6), k


def _context_loss_on_noise(weights: str, detach: bool = False, steps: int = 150) -> float:
    """Train the classifier and f_c by the context loss alone on hidden states drawn afresh each step, independent of
    the labels (also drawn afresh): nothing can be learnt about y from them. Returns the mean loss of the last 30
    steps (chance: log 10 = 2.30)."""
    import math

    m = _model(context=True, num_glimpses=6, hidden_size=32, context_hidden=32, context_weights=weights)
    params = [*m.classifier.parameters(), *m.context_net.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        hidden = torch.randn(256, 6, 32, generator=g)
        y = torch.randint(0, 10, (256, 1), generator=g)
        if detach:  # eq. 11 with no gradient through the weights
            w = m.context_weights(hidden, y).detach()
            z = m.context_net((w[..., None] * hidden.reshape(256, 1, 6, 32)).sum(2))
        else:
            z = m.context_logits(hidden, y)
        loss = torch.nn.functional.cross_entropy(z.reshape(256, -1), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert math.isfinite(losses[-1])
    return sum(losses[-30:]) / 30


def test_the_papers_context_weights_leak_the_label_and_confidence_weights_do_not():
    """Eq. 11's alpha_{t,y} weights select hidden states by the true class, so f_c predicts labels that the hidden
    states know nothing about (well below chance), with or without a gradient through the weights; the confidence
    weights use no label and stay at chance."""
    import math

    chance = math.log(10)
    label, detached = _context_loss_on_noise("label"), _context_loss_on_noise("label", detach=True)
    confidence = _context_loss_on_noise("confidence")
    assert label < chance - 0.7  # measured 1.29: the classifier's scores at the steps become a code for y
    assert chance - 0.2 > detached > label  # 1.91: the classifier's scores still pick, by y, states it maps to y
    assert confidence > chance - 0.05


def test_confidence_weights_are_the_normalised_top_probability_and_ignore_the_label():
    m = _model(context=True, num_glimpses=6, context_weights="confidence")
    hidden = torch.randn(5, 6, 256)
    w = m.context_weights(hidden, torch.randint(0, 10, (5, 1)))
    torch.testing.assert_close(w, m.context_weights(hidden, torch.randint(0, 10, (5, 1))))
    top = m.classifier(hidden).softmax(-1).amax(-1)
    torch.testing.assert_close(w[:, 0], top / top.sum(-1, keepdim=True))
    with pytest.raises(ValueError, match="model.context_weights must be 'label' or 'confidence', got 'true'"):
        _model(context=True, context_weights="true")
    with pytest.raises(ValueError, match="context weights must be 'label' or 'confidence', got 'uniform'"):
        m.context_weights(hidden, torch.zeros(5, 1, dtype=torch.long), "uniform")
