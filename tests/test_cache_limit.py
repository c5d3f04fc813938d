"""Cache builds say what they write and never write gigabytes unasked (issue 24): the announcement line, the
refusal over ``$RLATTENTION_CACHE_LIMIT`` with nothing written (sha256 of the cache folder before and after),
``data info`` of the render-cached datasets counting without rendering, the default limit against the project's
own largest builds, and the progress bars' rules (rank 0, a terminal, ``trainer.progress``)."""

from __future__ import annotations

import hashlib
import io
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rlattention import cache_limit
from rlattention.cache_limit import CacheTooLarge, format_bytes, parse_size
from rlattention.cli import main
from rlattention.data.config import DataConfig
from rlattention.data.readers import sketch_retrieval
from rlattention.data.readers.sketch_retrieval import build_qmul_chairv2
from rlattention.progress import progress_bar, progress_bars
from rlattention.vision.feature_cache import FeatureCache

SKETCHES = {
    "/train/chair_a_1": [[40, 40, 0], [200, 60, 1], [60, 200, 1]],
    "/train/chair_a_2": [[100, 40, 0], [100, 200, 1]],
    "/train/chair_b_1": [[40, 200, 0], [200, 200, 1]],
    "/train/chair_c_1": [[128, 128, 1]],
    "/test/stool_x_1": [[60, 60, 0], [180, 60, 0], [180, 180, 1]],
}


def write_chairv2(root: Path) -> Path:
    """A tiny QMUL-Chair-V2 folder: 5 sketches (4 /train, 1 /test) of 4 photos."""
    folder = root / "qmul_chairv2"
    (folder / "photo").mkdir(parents=True)
    data = {key: np.array(points, dtype=np.float64) for key, points in SKETCHES.items()}
    (folder / "ChairV2_Coordinate").write_bytes(pickle.dumps(data, protocol=3))
    for name in ("chair_a", "chair_b", "chair_c", "stool_x"):
        Image.new("RGB", (20, 20), (90, 20, 200)).save(folder / "photo" / f"{name}.png")
    return folder


def folder_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (links included, as links), by relative path."""
    if not folder.exists():
        return {}
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(folder))] = f"link to {p.readlink()}"
        elif p.is_file():
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def tiny_cfg(cache: Path, size: int = 8) -> DataConfig:
    return DataConfig(image_size=size, completion_steps=3, val_size=1, seed=0, render_cache=str(cache))


# ------------------------------------------------------------------------------------------------ the limit


def test_sizes_and_the_limit_setting(monkeypatch) -> None:
    assert parse_size("2GB") == 2 * 10**9 and parse_size("1.5GiB") == 3 * 2**29 and parse_size("500 MB") == 5 * 10**8
    assert parse_size("12345") == 12345 and parse_size("unlimited") is None
    for bad in ("two", "5XB", "-1", ""):
        with pytest.raises(ValueError, match="RLATTENTION_CACHE_LIMIT"):
            parse_size(bad)
    monkeypatch.delenv("RLATTENTION_CACHE_LIMIT", raising=False)
    assert cache_limit.cache_limit() == cache_limit.DEFAULT_CACHE_LIMIT == 2 * 10**9
    monkeypatch.setenv("RLATTENTION_CACHE_LIMIT", "unlimited")
    assert cache_limit.cache_limit() is None
    assert format_bytes(1_087_564_800) == "1.1 GB" and format_bytes(1344) == "1.3 kB" and format_bytes(12) == "12 bytes"


def test_the_default_limit_allows_the_projects_own_builds() -> None:
    """The largest caches of the configs and benchmarks, estimated as the builds estimate them: ChairV2's renders at
    224 px (the Lite0 configs) and 260 px (Lite2 in benchmarks/sbir_backbones.py), and the frozen Lite0 features of
    configs/rarl_clutter.yaml (12,000 canvases x 40 x 16 x 16 float16) and of ChairV2's partials (6,128 float16)."""
    for size in (224, 240, 260):
        opts = sketch_retrieval._render_options(DataConfig(image_size=size, completion_steps=17))
        assert sketch_retrieval._render_bytes(1275, opts) < cache_limit.DEFAULT_CACHE_LIMIT
    assert 12_000 * (8 + 40 * 16 * 16 * 2) < cache_limit.DEFAULT_CACHE_LIMIT
    assert 1275 * 18 * (8 + 6128 * 2) < cache_limit.DEFAULT_CACHE_LIMIT


# ----------------------------------------------------------------------------------------- the render cache


def test_a_render_cache_build_is_announced_once(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("RLATTENTION_CACHE_LIMIT", raising=False)
    write_chairv2(tmp_path)
    cache = tmp_path / "cache"
    first = build_qmul_chairv2(tiny_cfg(cache), tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    written = re.fullmatch(r"rendering 5 sketches x 3 partials at 8 px into (\S+) \(about 960 bytes\)", err[0])
    assert written and Path(written.group(1)).parent == cache and Path(written.group(1)).is_file()
    assert err[1].startswith("resizing 4 photos to 8 px into ") and err[1].endswith("(about 768 bytes)")
    assert len(err) == 2
    again = build_qmul_chairv2(tiny_cfg(cache), tmp_path)  # read from the cache: nothing to announce
    assert capsys.readouterr().err == "" and torch.equal(first.test.images, again.test.images)


@pytest.mark.parametrize("how", ["environment", "module constant"])
def test_a_build_over_the_limit_writes_nothing(tmp_path: Path, capsys, monkeypatch, how: str) -> None:
    write_chairv2(tmp_path)
    cache = tmp_path / "cache"
    build_qmul_chairv2(tiny_cfg(cache), tmp_path)  # 8 px: cached
    before = folder_digest(cache)
    if how == "environment":
        monkeypatch.setenv("RLATTENTION_CACHE_LIMIT", "1kB")
    else:
        monkeypatch.delenv("RLATTENTION_CACHE_LIMIT", raising=False)
        monkeypatch.setattr(cache_limit, "DEFAULT_CACHE_LIMIT", 1000)

    def never(*args, **kwargs):
        raise AssertionError("rendered although the cache build was refused")

    monkeypatch.setattr(sketch_retrieval, "render_partials_batch", never)
    capsys.readouterr()
    with pytest.raises(CacheTooLarge) as info:
        build_qmul_chairv2(tiny_cfg(cache, size=16), tmp_path)  # 5 x 3 x 16 x 16 = 3,840 bytes
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ValueError)  # the CLI: one line, exit code 2
    for part in ("rendering 5 sketches x 3 partials at 16 px", "3.8 kB (3,840 bytes)", str(cache), "1.0 kB"):
        assert part in message, (part, message)
    assert "RLATTENTION_CACHE_LIMIT=1MB" in message and "data.render_cache=none" in message
    assert folder_digest(cache) == before and capsys.readouterr().err == ""
    build_qmul_chairv2(tiny_cfg(cache), tmp_path)  # an existing cache file is read whatever the limit
    no_cache = DataConfig(image_size=16, completion_steps=3, val_size=1, render_cache="none")
    monkeypatch.undo()
    build_qmul_chairv2(no_cache, tmp_path)  # no cache: nothing written, nothing to limit
    assert folder_digest(cache) == before


def test_a_feature_cache_over_the_limit_writes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    net = torch.nn.Conv2d(1, 4, 3)
    calls = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(len(x))
        with torch.no_grad():
            return net(x).mean(dim=(-2, -1))

    images = torch.randint(0, 256, (20, 1, 8, 8), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    monkeypatch.setenv("RLATTENTION_CACHE_LIMIT", "100")
    (tmp_path / "features").mkdir()
    (tmp_path / "features" / "other.safetensors").write_bytes(b"someone else's")
    before = folder_digest(tmp_path)
    with pytest.raises(
        CacheTooLarge, match=r"caching tests of 20 images \(4 float16 each\) would write about 320 bytes"
    ):
        FeatureCache(fn, net, "tiny").build(images, tmp_path, batch_size=5, progress=False, what="tests")
    assert calls == [5] and folder_digest(tmp_path) == before  # stopped after the first batch
    monkeypatch.delenv("RLATTENTION_CACHE_LIMIT")
    capsys.readouterr()
    cache = FeatureCache(fn, net, "tiny").build(images, tmp_path, batch_size=5, progress=False, what="tests")
    assert (
        capsys.readouterr().err.strip()
        == f"caching tests of 20 images (4 float16 each) into {cache.path} (about 320 bytes)"
    )
    FeatureCache(fn, net, "tiny").build(images, None, progress=False)  # memory only: nothing to announce
    assert capsys.readouterr().err == ""


def test_digit_scenes_over_the_limit_generate_nothing(tmp_path: Path, require_data, monkeypatch) -> None:
    from rlattention.data.synthetic.digit_scenes import _params, estimated_bytes, generate_digit_scenes

    mnist = require_data("mnist")
    monkeypatch.setenv("RLATTENTION_CACHE_LIMIT", "10MB")
    out = tmp_path / "cache" / "digit_scenes_s0_10000_1000"
    with pytest.raises(CacheTooLarge, match=r"generating 12,000 digit scenes \(10,000 train, 1,000 dev, 1,000 test\)"):
        generate_digit_scenes(out, mnist)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())
    defaults = _params(10000, 1000, 1000, 6, 0, 96, (2, 4), 5, 4000, ("dev", "test"))
    assert 60e6 < estimated_bytes(defaults) < 110e6  # ~83 MB measured; well under the default limit


# ---------------------------------------------------------------------------------------------- data info


def test_data_info_counts_without_rendering_or_writing(tmp_path: Path, capsys, monkeypatch) -> None:
    write_chairv2(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("RLATTENTION_CACHE", str(cache))

    def never(*args, **kwargs):
        raise AssertionError("data info rendered or decoded")

    monkeypatch.setattr(sketch_retrieval, "render_partials_batch", never)
    monkeypatch.setattr(sketch_retrieval, "load_resized_images", never)
    args = ["data", "info", "qmul_chairv2", "--data-dir", str(tmp_path), "data.completion_steps=3"]
    assert main([*args, "data.image_size=16", "data.val_size=1"]) == 0
    out = capsys.readouterr().out
    assert "5 sketches (4 /train, 1 /test) of 4 photos (3 of /train sketches, 1 of /test)" in out
    assert "splits (by photo, data.val_size=1): train " in out and "test 1 sketches of 1 photos" in out
    assert "15 renders, about 3.8 kB" in out and "render cache, partials" in out and "not written yet" in out
    assert "nothing was rendered, decoded or written" in out
    assert list(cache.iterdir()) == []
    # the default val_size (6,000 MNIST images) does not fit: said, not a failure after a 1 GB render
    monkeypatch.setenv("RLATTENTION_CACHE_LIMIT", "1kB")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "splits: not computed: val_size=6000 must be in 0..2" in out
    assert "over the cache limit of 1.0 kB" in out and list(cache.iterdir()) == []


def test_data_info_of_the_real_sketch_datasets(shared_data: Path, require_data, tmp_path: Path, capsys, monkeypatch):
    require_data("qmul_chairv2")
    monkeypatch.setenv("RLATTENTION_CACHE", str(tmp_path))
    monkeypatch.delenv("RLATTENTION_CACHE_LIMIT", raising=False)
    assert main(["data", "info", "qmul_chairv2", "--data-dir", str(shared_data), "data.val_size=30"]) == 0
    out = capsys.readouterr().out
    assert "1,275 sketches (952 /train, 323 /test) of 400 photos" in out
    assert "21,675 renders, about 1.1 GB" in out and "over the cache limit" not in out
    require_data("omniglot")
    assert main(["data", "info", "omniglot_sketch", "--data-dir", str(shared_data), "data.val_size=10"]) == 0
    assert "2,584 query sketches of 136 characters" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------- progress bars


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_only_on_rank_0_on_a_terminal_when_enabled(monkeypatch) -> None:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 0, raising=False)
    with progress_bar(total=3, desc="x") as bar:  # pytest captures stderr: not a terminal
        assert bar.disable
    monkeypatch.setattr("sys.stderr", _Terminal())
    with progress_bar(total=3, desc="x") as bar:
        assert not bar.disable
    with progress_bar(total=3, desc="x", enabled=False) as bar:
        assert bar.disable
    with progress_bars(False), progress_bar(total=3, desc="x") as bar:  # trainer.progress=false
        assert bar.disable
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    with progress_bar(total=3, desc="x") as bar:
        assert bar.disable
    assert list(progress_bar(range(3), desc="x")) == [0, 1, 2]  # a silent bar still iterates
