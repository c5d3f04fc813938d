"""The frozen-feature cache: content fingerprints, disk files keyed by weights / preprocessing / inputs, damage
detection, atomic writes, and a trunk that reads its frozen features instead of computing them."""

from __future__ import annotations

import os
import time

import pytest
import torch
from safetensors.torch import load_file

from rlattention.vision.feature_cache import FeatureCache, fingerprints
from rlattention.vision.trunk import Trunk, feature_cache_dir


def _images(n: int, seed: int = 0, size: int = 32, channels: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, channels, size, size), generator=g, dtype=torch.uint8)


class Counting(torch.nn.Module):
    """A frozen 'network' that counts the images it is asked to compute."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += len(x)
        with torch.no_grad():
            return self.conv(x).mean(dim=(-2, -1))


def test_fingerprints_are_exact_and_independent_of_the_batch():
    x = _images(10)
    keys, exact = fingerprints(x)
    assert exact.all() and len(set(keys.tolist())) == 10
    alone = torch.cat([fingerprints(x[i : i + 1])[0] for i in range(10)])
    floats, exact_f = fingerprints(x.float() / 255.0)
    assert torch.equal(keys, alone) and torch.equal(keys, floats) and exact_f.all()
    y = x.clone()
    y[3, 0, 5, 7] ^= 1  # one pixel, one bit
    assert fingerprints(y)[0][3] != keys[3]
    off = x.float() / 255.0
    off[2, 0, 0, 0] += 0.3 / 255.0  # not an 8-bit image: its key must not be used
    assert fingerprints(off)[1].tolist() == [i != 2 for i in range(10)]


def test_fingerprints_do_not_change_under_autocast_or_in_low_precision():
    """Mixed-precision training must find the features cached in float32 (a bf16 matmul rounds the sums)."""
    x = _images(6, size=48)
    keys = fingerprints(x)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(fingerprints(x.float() / 255.0)[0], keys)
        assert torch.equal(fingerprints(x)[0], keys)
    half = (x.float() / 255.0).half()  # 8-bit values survive fp16 exactly enough to round back
    assert torch.equal(fingerprints(half)[0], keys)


def test_second_pass_computes_nothing_and_equals_the_network(tmp_path):
    net = Counting()
    cache = FeatureCache(net, net, "counting", dtype=torch.float32)
    x = _images(12)
    cache.build(x, tmp_path, batch_size=5, progress=False)
    assert net.calls == 12
    out = cache(x.float() / 255.0)
    assert net.calls == 12 and cache.hits == 12  # read, not computed
    assert torch.allclose(out, net(x.float() / 255.0), atol=1e-6)
    # a mix of cached and new images: only the new ones are computed, in place
    new = _images(3, seed=1)
    mixed = torch.cat((x[:2], new, x[5:6])).float() / 255.0
    net.calls = 0
    out = cache(mixed)
    assert net.calls == 3
    assert torch.allclose(out, net(mixed), atol=1e-6)


def test_the_file_is_reused_and_keyed_by_weights_and_inputs(tmp_path):
    net = Counting()
    x = _images(6)
    first = FeatureCache(net, net, "counting").build(x, tmp_path, progress=False)
    mtime = first.path.stat().st_mtime_ns
    net.calls = 0
    again = FeatureCache(net, net, "counting").build(x[torch.randperm(6)], tmp_path, progress=False)
    assert again.path == first.path and net.calls == 0  # same images in another order: same file, nothing computed
    assert again.path.stat().st_mtime_ns == mtime  # not rewritten
    assert FeatureCache(net, net, "other preprocessing").file_for(x, tmp_path) != first.path
    with torch.no_grad():
        net.conv.weight.add_(1.0)
    assert FeatureCache(net, net, "counting").file_for(x, tmp_path) != first.path
    assert FeatureCache(net, net, "counting").file_for(_images(6, seed=3), tmp_path) != first.path


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "foreign", "empty"])
def test_a_damaged_file_is_reported_and_rebuilt(tmp_path, damage):
    net = Counting()
    x = _images(8)
    path = FeatureCache(net, net, "counting", dtype=torch.float32).build(x, tmp_path, progress=False).path
    good = path.read_bytes()
    good_tensors = {k: v.clone() for k, v in load_file(str(path)).items()}
    if damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "flipped byte":
        raw = bytearray(good)
        raw[-5] ^= 0xFF
        path.write_bytes(bytes(raw))
    elif damage == "foreign":
        from safetensors.torch import save_file

        save_file({"keys": torch.zeros(8, dtype=torch.long), "values": torch.zeros(8, 4)}, str(path))
    else:
        path.write_bytes(b"")
    net.calls = 0
    with pytest.warns(UserWarning, match="damaged.*rebuilding"):
        cache = FeatureCache(net, net, "counting", dtype=torch.float32).build(x, tmp_path, progress=False)
    assert net.calls == 8
    rebuilt = load_file(str(path))
    assert torch.equal(rebuilt["keys"], good_tensors["keys"])
    assert torch.allclose(rebuilt["values"], good_tensors["values"], atol=1e-6)
    assert torch.allclose(cache(x.float() / 255.0), net(x.float() / 255.0), atol=1e-6)


def test_writes_never_follow_a_symlink(tmp_path):
    net = Counting()
    x = _images(4)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    cache = FeatureCache(net, net, "counting")
    path = cache.build(x, tmp_path / "c", progress=False).path
    path.unlink()
    os.symlink(victim, path)  # a planted link where the cache file goes
    with pytest.warns(UserWarning, match="symlink"):
        cache.build(x, tmp_path / "c", progress=False)
    assert victim.read_text() == "mine" and not path.is_symlink()
    linked = tmp_path / "linked"
    os.symlink(tmp_path / "elsewhere", linked)
    (tmp_path / "elsewhere").mkdir()
    (linked / "features").mkdir()
    os.replace(linked / "features", tmp_path / "elsewhere" / "moved")
    os.symlink(tmp_path / "elsewhere" / "moved", linked / "features")  # the features folder itself is a link
    with pytest.raises(ValueError, match="symlink"):
        FeatureCache(net, net, "counting").build(x, linked, progress=False)
    assert not any((tmp_path / "elsewhere" / "moved").iterdir())


def test_cache_settings():
    assert feature_cache_dir("none") is False and feature_cache_dir("memory") is None
    assert str(feature_cache_dir("/x/y")) == "/x/y"
    assert feature_cache_dir("auto") is not False


def test_a_frozen_trunk_reads_its_features_and_is_20x_faster(tmp_path):
    """The claim of the cache: with every unit frozen, the second epoch reads instead of computing."""
    torch.manual_seed(0)
    trunk = Trunk("efficientnet_lite0", freeze="all", in_chans=1, pooled=True)
    x = _images(48, size=64)
    t0 = time.perf_counter()
    trunk.build_cache(x, tmp_path, batch_size=16, progress=False)
    first = time.perf_counter() - t0
    xf = x.float() / 255.0
    t0 = time.perf_counter()
    for i in range(0, 48, 16):
        cached = trunk.feature_map(xf[i : i + 16])
    second = time.perf_counter() - t0
    assert trunk.cache.hits == 48 and trunk.cache.misses == 0
    assert first / second >= 20, (first, second)
    computed = trunk._frozen(xf[32:48])
    assert torch.allclose(cached, computed, atol=2e-2, rtol=1e-2)  # stored as float16
    # a fine-tuned trunk caches only its frozen units and still trains the rest
    tuned = Trunk("efficientnet_lite0", freeze=2, in_chans=1)
    tuned.build_cache(x[:8], tmp_path, progress=False)
    y = tuned.feature_map(xf[:8])
    assert tuned.cache.hits == 8 and y.requires_grad
