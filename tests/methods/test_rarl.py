"""rarl: anchors, reward, max pooling over regions, ten views, switches, and the crop against a per-region loop."""

from __future__ import annotations

import math

import pytest
import torch

from rlattention.engine.method import DataInfo
from rlattention.methods.rarl import RARL, RARLConfig
from rlattention.rl import topn_label_reward
from rlattention.vision.anchors import anchor_boxes, anchor_shapes, ten_view_boxes
from rlattention.vision.crops import crop_boxes
from rlattention.vision.transforms import random_crop_flip


def test_anchor_geometry():
    areas, ratios = [80.0**2, 160.0**2, 320.0**2], [2.0, 1.0, 0.5]
    shapes = anchor_shapes(areas, ratios)
    assert len(shapes) == 9
    for (w, h), (a, r) in zip(shapes, [(a, r) for a in areas for r in ratios], strict=True):
        assert w * h == pytest.approx(a) and w / h == pytest.approx(r)
    boxes = anchor_boxes(torch.zeros(2, 2), areas, ratios, (512, 512))
    assert boxes.shape == (2, 9, 4)
    w_px = (boxes[0, :, 2] - boxes[0, :, 0]) * 512 / 2
    h_px = (boxes[0, :, 3] - boxes[0, :, 1]) * 512 / 2
    torch.testing.assert_close(w_px * h_px, torch.tensor([a for a in areas for _ in ratios]))
    torch.testing.assert_close((boxes[..., :2] + boxes[..., 2:]) / 2, torch.zeros(2, 9, 2))  # centred


def test_ten_view_boxes():
    b = ten_view_boxes(512, 448)
    side = 2 * 448 / 512
    torch.testing.assert_close(b[:, 2] - b[:, 0], torch.full((5,), side))
    assert b[0, :2].tolist() == [-1.0, -1.0] and b[3, 2:].tolist() == [1.0, 1.0]
    torch.testing.assert_close(b[4, :2] + b[4, 2:], torch.zeros(2))


def test_topn_reward_on_hand_made_label_sets():
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.0], [0.1, 0.2, 0.9, 0.8], [0.5, 0.4, 0.3, 0.2]])
    targets = torch.tensor([[1, 0, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    # image 0: n = 2, top-2 = {0, 1}, g = {0, 2}: 1/2; image 1: top-2 = {2, 3} = g: 1; image 2: no labels: 0
    torch.testing.assert_close(topn_label_reward(scores, targets), torch.tensor([0.5, 1.0, 0.0]))


def _crop_loop_reference(fmap, boxes, size):
    """One region at a time, RoIAlign-style: bilinear samples at the bin centres, computed per region."""
    B, k = boxes.shape[:2]
    C, H, W = fmap.shape[1:]
    out = torch.zeros(B, k, C, size, size)
    for b in range(B):
        for r in range(k):
            x0, y0, x1, y1 = boxes[b, r].tolist()
            for i in range(size):
                for j in range(size):
                    # continuous pixel coordinates (pixel centres at integers) of the bin centre
                    x = ((x0 + (x1 - x0) * (j + 0.5) / size) + 1) * W / 2 - 0.5
                    y = ((y0 + (y1 - y0) * (i + 0.5) / size) + 1) * H / 2 - 0.5
                    xf, yf = math.floor(x), math.floor(y)
                    val = torch.zeros(C)
                    for dy, wy in ((0, 1 - (y - yf)), (1, y - yf)):
                        for dx, wx in ((0, 1 - (x - xf)), (1, x - xf)):
                            yy, xx = yf + dy, xf + dx
                            if 0 <= yy < H and 0 <= xx < W:
                                val += wy * wx * fmap[b, :, yy, xx]
                    out[b, r, :, i, j] = val
    return out


def test_feature_crop_matches_per_region_reference():
    torch.manual_seed(0)
    fmap = torch.randn(2, 3, 9, 11)
    centres = torch.rand(2, 2) * 1.6 - 0.8
    boxes = anchor_boxes(centres, [20.0**2, 40.0**2], [2.0, 1.0, 0.5], (72, 88))
    out = crop_boxes(fmap, boxes, (3, 3), mode="bilinear")
    torch.testing.assert_close(out, _crop_loop_reference(fmap, boxes, 3), atol=1e-5, rtol=0)


def test_feature_crop_exact_on_aligned_boxes():
    fmap = torch.arange(2 * 8 * 8, dtype=torch.float32).reshape(1, 2, 8, 8)
    box = torch.tensor([[[-0.5, -0.5, 0.5, 0.5]]])  # pixels 2..5 of 8: each bin centre is a pixel centre
    out = crop_boxes(fmap, box, (4, 4), mode="bilinear")
    assert torch.equal(out[0, 0], fmap[0, :, 2:6, 2:6])


def test_random_crop_flip_copies_pixels():
    x = torch.arange(2 * 10 * 10, dtype=torch.float32).reshape(2, 1, 10, 10)
    out = random_crop_flip(x, 6, flip=False, generator=torch.Generator().manual_seed(0))
    for b in range(2):  # each output is an exact window of its image
        windows = x[b, 0].unfold(0, 6, 1).unfold(1, 6, 1).reshape(-1, 6, 6)
        assert any(torch.equal(out[b, 0], w) for w in windows)
    flipped = random_crop_flip(x, 10, flip=True, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(flipped[b], x[b]) or torch.equal(flipped[b], x[b].flip(-1)) for b in range(2))


def _model(**kw) -> RARL:
    torch.manual_seed(0)
    return RARL(RARLConfig(**kw), DataInfo((1, 64, 64), 10))


def _batch():
    x = torch.rand(4, 1, 64, 64)
    y = torch.zeros(4, 10)
    y[:, 1] = 1
    y[:2, 7] = 1
    return x, y


def test_max_pooling_over_regions(monkeypatch):
    m = _model(num_iterations=2, anchor_areas=[16.0**2], anchor_ratios=[2.0, 0.5])
    seen = []
    real = m.classifier.forward
    monkeypatch.setattr(m.classifier, "forward", lambda h: seen.append(real(h)) or seen[-1])
    fmap = m.backbone.feature_map(_batch()[0])
    a = m.episode(fmap, (64, 64), deterministic=True)[0]
    per_region = torch.cat(seen, 1)  # (B, T * k, K)
    assert per_region.shape == (4, 4, 10)
    torch.testing.assert_close(a, per_region.max(1).values)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(policy="random"),
        dict(recurrent=False),
        dict(mode="global"),
        dict(anchor_areas=[32.0**2], anchor_ratios=[1.0]),
        dict(num_iterations=1),
        dict(cls_loss="bce", crop_margin=16, hflip=True, test_views=10),
    ],
)
def test_switches_train_and_predict(kw):
    m = _model(**kw)
    x, y = _batch()
    out = m(x, y)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert ("reinforce" in out.terms) == (kw.get("policy", "learned") == "learned" and kw.get("mode") != "global")
    m.eval()
    p1 = m.predict(x, generator=torch.Generator().manual_seed(0))
    p2 = m.predict(x, generator=torch.Generator().manual_seed(0))
    assert p1.shape == (4, 10) and torch.equal(p1, p2)
    assert set(m.metrics(p1, y)) >= {"mAP", "CF1", "OF1"}


def test_ten_view_uses_one_backbone_pass(monkeypatch):
    m = _model(crop_margin=16, test_views=10).eval()
    calls = []
    real = m.backbone.feature_map
    monkeypatch.setattr(m.backbone, "feature_map", lambda x: calls.append(x.shape) or real(x))
    m.predict(_batch()[0])
    assert calls == [torch.Size([4, 1, 64, 64])]


def test_softmax_mse_loss_is_eq_9_10():
    m = _model(policy="random")
    x, y = _batch()
    torch.manual_seed(5)
    out = m(x, y)
    torch.manual_seed(5)  # the same random locations again
    a = m._scores(x, deterministic=False)[0]
    expected = (a.softmax(-1) - y / y.sum(-1, keepdim=True)).pow(2).sum(-1).mean()  # ||softmax(a) - y/|y|_1||^2
    torch.testing.assert_close(out.terms["cls"], expected)


def test_vgg16_structure_and_weight_loading(tmp_path):
    from safetensors.torch import save_file

    from rlattention.vision.backbones import VGG16Features

    vgg = VGG16Features()
    convs = [m for m in vgg.features if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 13
    assert vgg.feature_map(torch.rand(1, 3, 64, 64)).shape == (1, 512, 4, 4)  # stride 16
    state = {k: torch.full_like(v, 0.5) for k, v in vgg.state_dict().items()}
    save_file(state, str(tmp_path / "vgg.safetensors"))
    vgg.load_weights(str(tmp_path / "vgg.safetensors"))
    assert torch.equal(vgg.features[0].weight, state["features.0.weight"])
    del state["features.28.bias"]
    save_file(state, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match="features.28.bias"):
        VGG16Features().load_weights(str(tmp_path / "bad.safetensors"))


def test_images_without_labels_give_no_policy_gradient():
    m = _model()
    x = torch.rand(3, 1, 64, 64)
    out = m(x, torch.zeros(3, 10))  # no labels at all
    out.loss.backward()
    assert m.locator.fc.weight.grad is None or m.locator.fc.weight.grad.abs().sum() == 0


def test_random_policy_has_no_unused_policy_parameters():
    m = _model(policy="random")
    assert not hasattr(m, "locator") and not hasattr(m, "baseline")
