"""rarl with ``locator=map``: a categorical policy over the cells of the feature map, checked against its claims
(REINFORCE learns a bandit and its expected gradient is the true gradient; the drawn cell is where the regions look;
inhibition visits every cell once; it trains end to end; the default Gaussian locator is unchanged; bad values are
named)."""

from __future__ import annotations

import pytest
import torch

from rlattention.engine.method import DataInfo
from rlattention.methods.rarl import RARL, RARLConfig
from rlattention.rl import MapCategoricalPolicy, grid_cell_centres
from rlattention.vision.anchors import grid_centres

ANCHORS = dict(anchor_areas=[16.0**2, 24.0**2], anchor_ratios=[1.0])
SMALL = dict(backbone_channels=[4, 8, 8], region_dim=16, hidden_size=16, **ANCHORS)
MAP = dict(locator="map", locator_grid=4, locator_hidden=8)


def _model(size: int = 64, **kw) -> RARL:
    torch.manual_seed(0)
    return RARL(RARLConfig(**{**SMALL, **kw}), DataInfo((1, size, size), 10))


def _batch(n: int = 3, size: int = 64):
    torch.manual_seed(1)
    x = torch.rand(n, 1, size, size)
    y = torch.zeros(n, 10)
    y[:, 2] = 1
    y[0, 5] = 1
    return x, y


# ------------------------------------------------------------------------------------------------- the policy
def test_cell_centres_follow_the_anchor_convention():
    # (x, y) row by row, as the cells of grid_centres and the order of a flattened (g, g) pooled map
    torch.testing.assert_close(grid_cell_centres(3), grid_centres(9))
    fmap = torch.zeros(1, 1, 8, 8)
    fmap[0, 0, 0:2, 6:8] = 1.0  # top-right corner: row 0, column 3 of a 4 x 4 grid
    pol = MapCategoricalPolicy(1, 1, grid=4)
    j = int(pol.cell_features(fmap)[0, :, 0].argmax())
    assert j == 3 and grid_cell_centres(4)[j].tolist() == [0.75, -0.75]  # x right, y up (top = -1)
    assert int(pol.cell_index(grid_cell_centres(4)).eq(torch.arange(16)).all())


def test_reinforce_learns_the_paying_cell_of_a_bandit():
    torch.manual_seed(0)
    pol = MapCategoricalPolicy(feature_dim=3, state_dim=5, grid=2, hidden=8)
    fmap, h = torch.randn(1, 3, 2, 2), torch.randn(1, 5)
    reward = torch.tensor([0.0, 0.0, 1.0, 0.0])  # cell 2 pays
    opt = torch.optim.Adam(pol.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    b = 0.0
    for _ in range(300):
        act = pol(pol.encode_cells(fmap), h, generator=gen)
        r = reward[pol.cell_index(act.action)]
        loss = -((r - b) * act.log_prob).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        b = 0.9 * b + 0.1 * float(r)
    p = pol.logits(pol.encode_cells(fmap), h).softmax(-1)[0]
    assert p[2] > 0.9


@pytest.mark.parametrize("visited", [None, torch.tensor([[False, True, False, False]])])
def test_expected_score_function_gradient_is_the_true_gradient(visited):
    torch.manual_seed(1)
    pol = MapCategoricalPolicy(feature_dim=3, state_dim=5, grid=2, hidden=8)
    fmap, h = torch.randn(1, 3, 2, 2), torch.randn(1, 5)
    reward = torch.tensor([0.3, -1.0, 2.0, 0.5])
    params = list(pol.parameters())
    log_p = torch.log_softmax(pol.logits(pol.encode_cells(fmap), h, visited), -1)[0]
    p = log_p.exp()
    true = torch.autograd.grad((p * reward).sum(), params, retain_graph=True)  # d E[R]
    # sum_j p_j R_j d log p_j, enumerating the cells the policy can draw
    expected = [torch.zeros_like(q) for q in params]
    for j in range(4):
        if visited is not None and visited[0, j]:
            assert p[j] == 0
            continue
        g = torch.autograd.grad(log_p[j], params, retain_graph=True)
        expected = [e + p[j].detach() * reward[j] * gj for e, gj in zip(expected, g, strict=True)]
    for e, t in zip(expected, true, strict=True):
        torch.testing.assert_close(e, t)
    assert max(float(t.abs().max()) for t in true) > 1e-3  # not trivially zero


def test_entropy_excludes_masked_cells_and_has_a_finite_gradient():
    logits = torch.tensor([[0.0, 0.0, float("-inf"), 0.0]], requires_grad=True)
    H = MapCategoricalPolicy.entropy(logits)
    torch.testing.assert_close(H, torch.log(torch.tensor([3.0])))  # uniform over the 3 unmasked cells
    (g,) = torch.autograd.grad(H.sum(), logits)
    assert torch.isfinite(g).all()


# ------------------------------------------------------------------------------- the drawn cell drives the model
def test_sampled_cells_are_where_the_regions_look(monkeypatch):
    m = _model(**MAP).eval()
    x, _ = _batch(2)
    fmap = m.backbone.feature_map(x)
    import rlattention.methods.rarl as rarl_module

    seen = []
    real = rarl_module.anchor_boxes
    monkeypatch.setattr(rarl_module, "anchor_boxes", lambda c, *a: seen.append(c.clone()) or real(c, *a))
    out1 = m.episode(fmap, (64, 64), False, torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.stack(seen, 1), out1[3])  # the drawn centre is the centre of R_t
    centres = grid_cell_centres(4)
    assert ((out1[3][..., None, :] - centres).abs().sum(-1) == 0).any(-1).all()  # always a cell centre
    # another draw: other cells, other region features, other scores
    for seed in range(1, 20):
        out2 = m.episode(fmap, (64, 64), False, torch.Generator().manual_seed(seed))
        if not torch.equal(out1[3], out2[3]):
            break
    assert not torch.equal(out1[3], out2[3])
    assert not torch.allclose(out1[0], out2[0])
    # the same seed: the same episode
    torch.testing.assert_close(m.episode(fmap, (64, 64), False, torch.Generator().manual_seed(0))[0], out1[0])


def test_forcing_a_cell_changes_the_scores_and_deterministic_is_the_argmax(monkeypatch):
    m = _model(**MAP).eval()
    x, _ = _batch(2)
    fmap = m.backbone.feature_map(x)
    logged = []
    real = m.locator.logits
    monkeypatch.setattr(m.locator, "logits", lambda *a: logged.append(real(*a)) or logged[-1])
    locs = m.episode(fmap, (64, 64), True)[3]
    argmax = torch.stack([lg.argmax(-1) for lg in logged], 1)  # (B, T)
    torch.testing.assert_close(locs, grid_cell_centres(4)[argmax])
    scores = {}
    for cell in (0, 15):  # top-left vs bottom-right cell at every step (no inhibition, so it can be repeated)
        m.cfg.locator_inhibit = False
        bias = torch.full((16,), -1e4)
        bias[cell] = 0.0
        monkeypatch.setattr(m.locator, "logits", lambda c, h, v=None, b=bias: real(c, h, v) + b)
        a, _, _, locs = m.episode(fmap, (64, 64), False, torch.Generator().manual_seed(0))
        assert (locs == grid_cell_centres(4)[cell]).all()
        scores[cell] = a
    assert not torch.allclose(scores[0], scores[15])


# ------------------------------------------------------------------------------------------------- inhibition
@pytest.mark.parametrize("deterministic", [False, True])
def test_inhibition_visits_every_cell_exactly_once(deterministic):
    m = _model(num_iterations=9, locator="map", locator_grid=3, locator_hidden=8).eval()
    x, _ = _batch(3)
    fmap = m.backbone.feature_map(x)
    a, log_pi, _, locs, H = m.episode(fmap, (64, 64), deterministic, torch.Generator().manual_seed(0), True)
    cells = torch.stack([m.locator.cell_index(locs[:, t]) for t in range(9)], 1)  # (B, T)
    for row in cells:
        assert sorted(row.tolist()) == list(range(9))
    torch.testing.assert_close(log_pi[:, -1], torch.zeros(3))  # the last cell is forced: log pi = 0
    torch.testing.assert_close(H[:, -1], torch.zeros(3))
    assert (H[:, 0] > 0).all()


def test_inhibition_needs_enough_cells():
    with pytest.raises(ValueError, match="num_iterations.*9|locator_grid"):
        _model(num_iterations=10, locator="map", locator_grid=3)
    _model(num_iterations=10, locator="map", locator_grid=3, locator_inhibit=False)  # revisits allowed


# ------------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize(
    "kw",
    [dict(), dict(entropy_weight=0.01, baseline="loo", train_episodes=2), dict(policy_grad_to_core=True)],
)
def test_map_locator_trains_and_predicts(kw):
    m = _model(**MAP, **kw)
    x, y = _batch()
    out = m(x, y)
    out.loss.backward()
    assert torch.isfinite(out.loss) and "reinforce" in out.terms
    assert ("baseline" in out.terms) == (kw.get("baseline", "learned") == "learned")
    assert ("entropy" in out.terms) == ("entropy_weight" in kw) and out.stats["entropy"] > 0
    for name, p in m.locator.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    if kw.get("baseline", "learned") == "learned":
        assert m.baseline.fc.weight.grad.abs().sum() > 0
    backbone_grad = sum(float(p.grad.abs().sum()) for p in m.backbone.parameters() if p.grad is not None)
    assert backbone_grad > 0  # the classification loss trains the backbone either way
    m.eval()
    p1 = m.predict(x, mc_samples=2, generator=torch.Generator().manual_seed(0))
    p2 = m.predict(x, mc_samples=2, generator=torch.Generator().manual_seed(0))
    assert p1.shape == (3, 10) and torch.equal(p1, p2)


def test_policy_gradient_reaches_the_backbone_only_with_policy_grad_to_core():
    x, y = _batch()
    for to_core in (False, True):
        m = _model(**MAP, policy_grad_to_core=to_core)
        torch.manual_seed(2)
        out = m(x, y)
        params = list(m.backbone.parameters())
        grads = torch.autograd.grad(out.terms["reinforce"], params, allow_unused=True)
        reached = any(g is not None and g.abs().sum() > 0 for g in grads)
        assert reached == to_core


def test_entropy_bonus_raises_the_map_policy_entropy():
    m = _model(**MAP, entropy_weight=1.0, reinforce_weight=0.0)
    x, y = _batch(2)
    opt = torch.optim.SGD(m.locator.parameters(), lr=0.5)
    H = []
    for _ in range(3):
        torch.manual_seed(2)
        out = m(x, y)
        H.append(float(out.stats["entropy"]))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert H[2] > H[1] > H[0]


def test_gaussian_locator_is_unchanged():
    """The default (``locator=gaussian``) reproduces values recorded with the code before ``locator`` existed."""
    kw = dict(backbone_channels=[4, 8, 8], region_dim=16, hidden_size=16)
    kw.update(anchor_areas=[576.0, 1600.0, 4096.0], anchor_ratios=[2.0, 1.0, 0.5])
    outs = []
    for extra in (dict(), dict(locator="gaussian", locator_grid=3, locator_hidden=5)):
        torch.manual_seed(0)
        m = RARL(RARLConfig(**kw, **extra), DataInfo((1, 64, 64), 10))
        m.set_progress(0.5)
        torch.manual_seed(1)
        x = torch.rand(3, 1, 64, 64)
        y = torch.zeros(3, 10)
        y[:, 2] = 1
        y[0, 5] = 1
        torch.manual_seed(2)
        out = m(x, y)
        out.loss.backward()
        assert type(m.locator).__name__ == "GaussianPolicy" and "entropy" not in out.stats
        outs.append((out, m.locator.fc.weight.grad.abs().sum()))
    (out, g), (out2, g2) = outs
    assert torch.equal(out.loss, out2.loss) and torch.equal(g, g2)
    recorded = dict(cls=0.7318585515022278, baseline=0.1666666716337204, reinforce=3.128485918045044)
    for k, v in recorded.items():
        assert float(out.terms[k].detach()) == pytest.approx(v, rel=1e-5)
    assert float(out.loss.detach()) == pytest.approx(4.027010917663574, rel=1e-5)
    assert float(g) == pytest.approx(16.235530853271484, rel=1e-4)


# ------------------------------------------------------------------------------------------------- bad values
@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(locator="attention"), r"model\.locator .*gaussian.*map"),
        (dict(locator="map", locator_grid=0), r"model\.locator_grid"),
        (dict(locator="map", locator_hidden=0), r"model\.locator_hidden"),
        (dict(locator="map", learn_std=True), r"model\.learn_std.*model\.locator=map"),
        (dict(locator="map", std_final=0.05), r"model\.std_final"),
        (dict(entropy_weight=0.1), "learn_std"),  # the Gaussian locator still needs a learned sigma
    ],
)
def test_bad_values_name_their_key(kw, match):
    with pytest.raises(ValueError, match=match):
        _model(**kw)
