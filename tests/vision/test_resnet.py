"""Plain-torch ResNets (ResNet-50 layout and weight loading) and the re-id image transforms."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from rlattention.vision.resnet import ResNet, narrow_resnet, resnet50
from rlattention.vision.transforms import random_erasing, random_shift


def test_resnet50_has_the_standard_layout():
    m = resnet50(last_stride=2)
    # 25,557,032 parameters with the 1000-way fc head (2048 * 1000 + 1000) of the ImageNet model
    assert sum(p.numel() for p in m.parameters()) == 25_557_032 - 2_049_000
    names = set(m.state_dict())
    assert {"conv1.weight", "bn1.running_var", "layer1.0.downsample.0.weight", "layer4.2.conv3.weight"} <= names
    assert m.stage_channels == [64, 256, 512, 1024, 2048]
    assert m(torch.rand(1, 3, 64, 32)).shape == (1, 2048, 2, 1)
    assert resnet50(last_stride=1)(torch.rand(1, 3, 64, 32)).shape == (1, 2048, 4, 2)


def test_stages_compose_to_forward():
    m = narrow_resnet(1, width=8).eval()
    x = torch.rand(2, 1, 32, 32)
    y = x
    shapes = []
    for stage in m.stages():
        y = stage(y)
        shapes.append(y.shape[1])
    assert torch.equal(y, m(x)) and shapes == m.stage_channels == [8, 8, 16, 32, 64]


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_weights_load_from_a_local_file_ignoring_the_head(tmp_path, fmt):
    src = ResNet("basic", (1, 1, 1, 1), 8, 3, "imagenet")
    for p in src.parameters():
        p.data.normal_()
    state = {k: v.clone() for k, v in src.state_dict().items()}
    state["fc.weight"] = torch.zeros(10, 64)  # an ImageNet head is ignored
    path = tmp_path / f"w.{fmt}"
    save_file(state, str(path)) if fmt == "safetensors" else torch.save({"state_dict": state}, path)
    dst = ResNet("basic", (1, 1, 1, 1), 8, 3, "imagenet")
    dst.load_weights(path)
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values(), strict=True))


def test_bad_weight_files_are_named(tmp_path):
    m = ResNet("basic", (1, 1, 1, 1), 8, 3, "imagenet")
    with pytest.raises(FileNotFoundError, match="ResNet weights not found"):
        m.load_weights(tmp_path / "missing.safetensors")
    state = m.state_dict()
    state.pop("layer2.0.conv1.weight")
    save_file(dict(state), str(tmp_path / "partial.safetensors"))
    with pytest.raises(ValueError, match="missing ResNet tensors.*layer2.0.conv1.weight"):
        m.load_weights(tmp_path / "partial.safetensors")
    state = dict(m.state_dict())
    state["conv1.weight"] = torch.zeros(8, 3, 3, 3)
    save_file(state, str(tmp_path / "shape.safetensors"))
    with pytest.raises(ValueError, match="conv1.weight has shape"):
        m.load_weights(tmp_path / "shape.safetensors")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="junk.pt: not a weights-only torch file"):
        m.load_weights(tmp_path / "junk.pt")


def test_bad_architecture_is_named():
    with pytest.raises(ValueError, match="block"):
        ResNet("wide")
    with pytest.raises(ValueError, match="last_stride"):
        ResNet(last_stride=3)
    with pytest.raises(ValueError, match="layers"):
        ResNet(layers=(1, 1))


def test_random_shift_moves_content_without_changing_it():
    x = torch.zeros(64, 1, 12, 10)
    x[:, :, 5, 4] = 1.0
    y = random_shift(x, 2, generator=torch.Generator().manual_seed(0))
    assert y.shape == x.shape and torch.equal(y.sum((1, 2, 3)), x.sum((1, 2, 3)))
    pos = y[:, 0].flatten(1).argmax(1)
    rows, cols = pos // 10, pos % 10
    assert rows.min() == 3 and rows.max() == 7 and cols.min() == 2 and cols.max() == 6  # every shift in [-2, 2]
    assert torch.equal(random_shift(x, 0), x)


def test_random_erasing_areas_and_probability():
    x = torch.ones(2000, 3, 20, 10)
    y = random_erasing(x, p=0.5, area=(0.1, 0.3), generator=torch.Generator().manual_seed(0))
    erased = (y == 0).all(1).float().mean((1, 2))  # fraction of pixels erased, per image (all channels)
    hit = erased > 0
    assert 0.45 < hit.float().mean() < 0.55
    assert erased[hit].min() > 0.03 and erased[hit].max() <= 0.3 + 0.1  # clipped rectangles can only be smaller
    assert torch.equal(random_erasing(x, p=0.0), x)
    with pytest.raises(ValueError, match="probability"):
        random_erasing(x, p=1.5)
