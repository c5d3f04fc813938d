"""The ``sketchy`` raster sketch dataset on tiny hand-made folders of real PNG/JPEG files: pairing by name with and
without the variant level and with ``photo/`` or ``image/``, the item layout (ink 255 on 0, then the photo; the
target is the sketch's photo), splits by photo and the whole folder as test, the complete-sketch-only protocol,
every kind of bad input (an error naming it, or skipped with a count), ``data info`` (scans, decodes nothing),
the cache, and ``rlattention eval --data sketchy`` of a checkpoint trained on (tiny) QMUL-Chair-V2."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rlattention.cli import main
from rlattention.data.config import DataConfig
from rlattention.data.readers.sketchy import (
    SketchyInputError,
    build_sketchy,
    describe_sketchy,
    find_sketchy_dir,
    read_sketch,
    scan_sketchy,
)
from rlattention.data.registry import available_datasets, build_dataset

SIZE = 16  # sketches and photos are drawn at this size, so nothing is resampled and pixels can be compared exactly
#: photo id -> photo colour; the sketches of photo i are a black square in corner i (see ``corner``)
PHOTOS = {"cat/c1": (200, 0, 0), "cat/c2": (0, 200, 0), "dog/d1": (0, 0, 200), "dog/d2": (200, 200, 0)}
IDS = sorted(PHOTOS)


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLATTENTION_CACHE", str(tmp_path / "default_cache"))


def corner(i: int) -> tuple[int, int, int, int]:
    """The box ``(x0, y0, x1, y1)`` of photo ``i``'s square: one 8 x 8 quadrant each."""
    x, y = 8 * (i % 2), 8 * (i // 2)
    return (x, y, x + 8, y + 8)


def sketch_image(i: int) -> Image.Image:
    img = Image.new("L", (SIZE, SIZE), 255)
    img.paste(0, corner(i))
    return img


def write_tree(
    root: Path,
    variant: str | None = None,
    photo_dir: str = "photo",
    ext: str = ".png",
    sketches: int = 2,
    photo_variant: str | None = None,
) -> Path:
    """``root/sketch[/variant]/<class>/<stem>-<k>.png`` and ``root/<photo_dir>[/variant]/<class>/<stem><ext>``."""
    sketch_top = root / "sketch" / (variant or "")
    photo_top = root / photo_dir / (photo_variant or variant or "")
    for i, (photo_id, colour) in enumerate(PHOTOS.items()):
        cls, stem = photo_id.split("/")
        (sketch_top / cls).mkdir(parents=True, exist_ok=True)
        (photo_top / cls).mkdir(parents=True, exist_ok=True)
        for k in range(1, sketches + 1):
            sketch_image(i).save(sketch_top / cls / f"{stem}-{k}.png")
        Image.new("RGB", (SIZE, SIZE), colour).save(
            photo_top / cls / f"{stem}{ext}", format="PNG" if ext == ".png" else "JPEG"
        )
    (sketch_top / "cat" / ".DS_Store").write_bytes(b"\0junk")  # hidden: ignored
    return root


def config(**kw) -> DataConfig:
    return DataConfig(
        **{"name": "sketchy", "image_size": SIZE, "sketchy_split": "all_test", "render_cache": "none", **kw}
    )


def check_items(splits, exact: bool = True) -> None:
    """Layout (N, 4, H, W) uint8; channel 0 is the square of the target's photo (ink 255 on 0); channels 1..3 the
    target's colour."""
    for part in (splits.train, splits.val, splits.test):
        assert part.images.dtype == torch.uint8 and part.images.shape[1:] == (4, SIZE, SIZE)
        assert part.targets.dtype == torch.int64
        for image, target in zip(part.images.numpy(), part.targets.tolist(), strict=True):
            expected = np.zeros((SIZE, SIZE), dtype=np.uint8)
            x0, y0, x1, y1 = corner(list(PHOTOS).index(IDS[target]))
            expected[y0:y1, x0:x1] = 255
            np.testing.assert_array_equal(image[0], expected)
            colour = np.array(PHOTOS[IDS[target]], dtype=np.int16)[:, None, None]
            assert np.abs(image[1:].astype(np.int16) - colour).max() <= (0 if exact else 3)  # JPEG: nearly exact


# ------------------------------------------------------------------------------------------------ pairing


@pytest.mark.parametrize(
    ("variant", "photo_dir", "ext"),
    [
        (None, "photo", ".png"),
        (None, "image", ".jpg"),
        ("tx_000000000000", "photo", ".JPEG"),
        ("tx_0", "image", ".png"),
    ],
)
def test_pairing_and_items(tmp_path: Path, variant, photo_dir, ext) -> None:
    root = write_tree(tmp_path / "data", variant, photo_dir, ext)
    assert "sketchy" in available_datasets()
    splits = build_dataset("sketchy", config(), root)
    assert splits.name == "sketchy" and splits.num_classes == 4
    assert (len(splits.train), len(splits.val), len(splits.test)) == (0, 0, 8)  # all_test
    assert splits.test.targets.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # sorted by photo id, then k
    check_items(splits, exact=ext == ".png")
    index = scan_sketchy(root)
    assert index.photo_ids == IDS and index.classes == ["cat", "dog"] and not index.bad
    assert index.sketch_variant == variant and index.photo_variant == variant
    assert index.photo_dir == root.resolve() / photo_dir / (variant or "")
    assert [p.name for p in index.sketch_paths[:2]] == ["c1-1.png", "c1-2.png"]
    assert find_sketchy_dir(tmp_path / "data") == root
    nested = write_tree(tmp_path / "outer" / "sketchy")
    assert find_sketchy_dir(tmp_path / "outer") == nested


def test_photo_ids_sort_as_strings(tmp_path: Path) -> None:
    """``cat-2/x`` sorts before ``cat/x`` ('-' < '/'): targets index the sorted list of id strings."""
    for cls, stem in (("cat", "x"), ("cat-2", "x"), ("cat", "a")):
        (tmp_path / "sketch" / cls).mkdir(parents=True, exist_ok=True)
        (tmp_path / "photo" / cls).mkdir(parents=True, exist_ok=True)
        sketch_image(0).save(tmp_path / "sketch" / cls / f"{stem}-1.png")
        Image.new("RGB", (SIZE, SIZE)).save(tmp_path / "photo" / cls / f"{stem}.png")
    index = scan_sketchy(tmp_path)
    assert index.photo_ids == ["cat-2/x", "cat/a", "cat/x"] and index.targets.tolist() == [0, 1, 2]
    assert [p.parent.name + "/" + p.name for p in index.sketch_paths] == ["cat-2/x-1.png", "cat/a-1.png", "cat/x-1.png"]


def test_variants(tmp_path: Path) -> None:
    root = write_tree(tmp_path, "tx_b", sketches=1)  # sorted second: 1 sketch per photo
    write_tree(tmp_path, "tx_a", sketches=2)  # sorted first: the default
    write_tree(tmp_path, "tx_c", sketches=3, photo_variant="tx_a")  # no photo variant tx_c
    assert len(build_sketchy(config(), root).test) == 8
    index = scan_sketchy(root, "tx_b")
    assert (index.sketch_variant, index.photo_variant, len(index.sketch_paths)) == ("tx_b", "tx_b", 4)
    assert index.sketch_variants == ["tx_a", "tx_b", "tx_c"] and index.photo_variants == ["tx_a", "tx_b"]
    index = scan_sketchy(root, "tx_c")  # the photo folder has no tx_c: its first variant
    assert (index.photo_variant, len(index.sketch_paths)) == ("tx_a", 12)
    assert scan_sketchy(root, "tx_a", "tx_b").photo_dir.name == "tx_b"
    splits = build_sketchy(config(sketchy_variant="tx_c", sketchy_photo_variant="tx_b"), root)
    assert len(splits.test) == 12
    check_items(splits)
    with pytest.raises(ValueError, match=r"data\.sketchy_variant='tx_z': no such variant in .*sketch \(variants: tx_a"):
        build_sketchy(config(sketchy_variant="tx_z"), root)
    flat = write_tree(tmp_path / "flat")
    with pytest.raises(ValueError, match=r"sketchy_variant='tx_a', but .*flat/sketch has no variant level"):
        scan_sketchy(flat, "tx_a")


def test_sketch_modes_become_ink_on_black(tmp_path: Path) -> None:
    """Every Pillow mode gives the same ink 255 on 0 (transparent background composited on white)."""
    gray = sketch_image(1)
    expected = 255 - np.asarray(gray)
    rgba = Image.new("RGBA", (SIZE, SIZE), (0, 0, 0, 0))  # black but transparent paper
    rgba.paste((0, 0, 0, 255), corner(1))
    la = Image.new("LA", (SIZE, SIZE), (0, 0))
    la.paste((0, 255), corner(1))
    sixteen = Image.fromarray(np.asarray(gray).astype(np.uint16) * 257)
    assert sixteen.mode.startswith("I")
    palette_t = gray.convert("P")
    palette_t.info["transparency"] = int(palette_t.getpixel((SIZE - 1, SIZE - 1)))  # the paper's index
    images = {
        "L": gray,
        "RGB": gray.convert("RGB"),
        "RGBA": rgba,
        "LA": la,
        "P": gray.convert("P"),
        "P_transparent": palette_t,
        "1": gray.convert("1"),
        "I16": sixteen,
        "JPEG": gray.convert("RGB"),
    }
    for name, img in images.items():
        path = tmp_path / f"{name}.{'jpg' if name == 'JPEG' else 'png'}"
        img.save(path, **({"transparency": img.info["transparency"]} if name == "P_transparent" else {}))
        ink = read_sketch(path, SIZE)
        assert ink.dtype == np.uint8 and ink.shape == (SIZE, SIZE)
        if name == "JPEG":
            assert np.abs(ink.astype(int) - expected).max() < 40
        else:
            np.testing.assert_array_equal(ink, expected, err_msg=name)
    small = read_sketch(tmp_path / "L.png", 8)  # resized: the square fills a 4 x 4 quadrant
    assert small.shape == (8, 8) and small[1, 5] == 255 and small[6, 1] == 0


# ------------------------------------------------------------------------------------------------ splits


def test_split_by_photo(tmp_path: Path) -> None:
    root = write_tree(tmp_path)
    cfg = config(sketchy_split="by_photo", val_size=1, test_fraction=0.25, seed=3)
    splits = build_sketchy(cfg, root)
    check_items(splits)
    sets = [set(part.targets.tolist()) for part in (splits.train, splits.val, splits.test)]
    assert [len(s) for s in sets] == [2, 1, 1] and set.union(*sets) == {0, 1, 2, 3}
    assert not sets[0] & sets[1] and not sets[2] & (sets[0] | sets[1])
    assert (len(splits.train), len(splits.val), len(splits.test)) == (4, 2, 2)  # every sketch of a photo together
    again = build_sketchy(cfg, root)
    assert torch.equal(again.test.targets, splits.test.targets) and torch.equal(again.val.images, splits.val.images)
    head = build_sketchy(config(sketchy_split="by_photo", val_size=1, seed=3, num_train=1, num_test=1), root)
    assert (len(head.train), len(head.val), len(head.test)) == (1, 1, 1)
    with pytest.raises(ValueError, match=r"val_size=3 must be in 0\.\.2"):
        build_sketchy(config(sketchy_split="by_photo", val_size=3), root)
    with pytest.raises(ValueError, match="sketchy_split must be one of by_photo, all_test, got 'random'"):
        build_sketchy(config(sketchy_split="random"), root)


@pytest.mark.parametrize("steps", [0, 3, 17])
def test_only_complete_sketches(tmp_path: Path, steps: int) -> None:
    root = write_tree(tmp_path)
    pattern = (
        rf"completion_steps must be 1 \(or null\), got {steps}: raster sketches have no stroke order.*"
        r"needs stroke data \(qmul_chairv2, omniglot_sketch\)"
    )
    with pytest.raises(ValueError, match=pattern):
        build_sketchy(config(completion_steps=steps), root)
    assert len(build_sketchy(config(completion_steps=1), root).test) == 8
    assert DataConfig().completion_steps is None  # the default: 1 for sketchy, 17 for the stroke datasets


# ------------------------------------------------------------------------------------------------ bad input


def test_missing_and_empty_folders(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sketchy needs its data files: pass --data-dir"):
        build_sketchy(config(), None)
    with pytest.raises(
        FileNotFoundError, match=r"expected a sketch/ folder .* in one of: .*nothing, .*nothing/sketchy"
    ):
        build_sketchy(config(), tmp_path / "nothing")
    (tmp_path / "a" / "sketch").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"photo folder not found: expected .*a/photo or .*a/image"):
        scan_sketchy(tmp_path / "a")
    (tmp_path / "a" / "photo").mkdir()
    with pytest.raises(ValueError, match=r"no class folders in .*a/sketch: expected .*<class>/<photo_stem>-<k>\.png"):
        scan_sketchy(tmp_path / "a")
    (tmp_path / "a" / "sketch" / "cat").mkdir()
    (tmp_path / "a" / "sketch" / "cat" / ".DS_Store").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"no images found under .*a/sketch: expected"):
        scan_sketchy(tmp_path / "a")


def add_bad_files(root: Path) -> dict[str, list[Path]]:
    """One or more offenders of each kind the scan finds (kind -> paths)."""
    files = {
        "no_photo": [root / "sketch" / "cat" / f"c{n}-1.png" for n in range(3, 10)],  # 7: more than listed
        "bad_name": [root / "sketch" / "dog" / "d1.png"],
        "no_sketch": [root / "photo" / "dog" / "d9.png"],
        "duplicate_photo": [root / "photo" / "cat" / "c2.jpg", root / "photo" / "cat" / "c2.png"],
        "not_image": [root / "sketch" / "cat" / "README.txt", root / "photo" / "notes.md"],
    }
    for kind, paths in files.items():
        for path in paths:
            if path.suffix in (".txt", ".md"):
                path.write_text("not an image")
            elif kind != "duplicate_photo" or path.suffix == ".jpg":
                sketch_image(0).convert("RGB").save(path)
    return files


def test_bad_files_are_listed_or_skipped(tmp_path: Path) -> None:
    root = write_tree(tmp_path)
    files = add_bad_files(root)
    with pytest.raises(SketchyInputError) as err:
        build_sketchy(config(), root)
    msg = str(err.value)
    assert msg.startswith(f"{root.resolve()}: 15 bad input file(s)") and "data.skip_bad=true" in msg
    # the sketches of the ambiguous photo cat/c2 count as without a photo: 7 + 2
    assert "9 sketch(es) without a photo: " in msg and "(4 more)" in msg and str(files["no_photo"][0]) in msg
    assert str(files["no_photo"][-1]) not in msg  # only the first 5 of a kind are named
    for kind in ("bad_name", "no_sketch", "duplicate_photo", "not_image"):
        assert all(str(p) in msg for p in files[kind]), kind
    assert "2 photo(s) sharing their class and stem" in msg and ".DS_Store" not in msg
    counts = {kind: len(paths) for kind, paths in err.value.bad.items()}
    assert counts == {k: len(v) + 2 * (k == "no_photo") for k, v in files.items()}

    with pytest.warns(UserWarning, match=r"skipped bad input .*: 9 sketch\(es\) without a photo, 1 sketch file\(s\) "
                      r"not named <photo_stem>-<k>, 1 photo\(s\) without a sketch, 2 photo\(s\) sharing"):  # fmt: skip
        splits = build_sketchy(config(skip_bad=True), root)
    assert splits.num_classes == 3 and len(splits.test) == 6  # cat/c2 (ambiguous) lost its sketches
    assert scan_sketchy(root).photo_ids == ["cat/c1", "dog/d1", "dog/d2"]


def test_unreadable_images(tmp_path: Path) -> None:
    root = write_tree(tmp_path)
    broken_sketch = root / "sketch" / "cat" / "c1-2.png"
    broken_sketch.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    broken_photo = root / "photo" / "dog" / "d2.png"
    broken_photo.write_bytes(b"GIF89a? no")
    cache = tmp_path / "cache"
    with pytest.raises(SketchyInputError, match=r"2 bad input file\(s\).*\n  2 unreadable image\(s\): ") as err:
        build_sketchy(config(render_cache=str(cache)), root)
    assert str(broken_sketch) in str(err.value) and str(broken_photo) in str(err.value)
    with pytest.warns(UserWarning, match=r"2 unreadable image\(s\), 2 sketch\(es\) whose photo is unreadable$"):
        splits = build_sketchy(config(render_cache=str(cache), skip_bad=True), root)
    assert splits.num_classes == 3 and splits.test.targets.tolist() == [0, 1, 1, 2, 2]  # c1-1, c2-1/2, d1-1/2
    left = ["cat/c1", "cat/c2", "dog/d1"]
    for image, target in zip(splits.test.images.numpy(), splits.test.targets.tolist(), strict=True):
        assert tuple(image[1:, 0, 0]) == PHOTOS[left[target]]
    assert not list(cache.glob("*.safetensors"))  # a stack with undecodable rows is never cached


def test_cache(tmp_path: Path) -> None:
    root = write_tree(tmp_path)
    cache = tmp_path / "cache"
    first = build_sketchy(config(render_cache=str(cache)), root)
    assert len(list(cache.glob("renders-*.safetensors"))) == 2  # sketches and photos
    again = build_sketchy(config(render_cache=str(cache)), root)
    assert torch.equal(first.test.images, again.test.images)
    assert not (tmp_path / "default_cache").exists()
    build_sketchy(config(render_cache=None), root)  # null: $RLATTENTION_CACHE, here inside tmp_path
    assert len(list((tmp_path / "default_cache").glob("*.safetensors"))) == 2


# ------------------------------------------------------------------------------------------------ data info


def test_data_info_only_scans(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_tree(tmp_path / "data", "tx_000000000000", "image")
    write_tree(tmp_path / "data", "tx_000100000000", "image", sketches=1)

    def no_decoding(*args, **kwargs):
        raise AssertionError("data info decoded an image")

    monkeypatch.setattr(Image, "open", no_decoding)
    assert main(["data", "info", "sketchy", "--data-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "8 sketches, 4 photos, 2 classes" in out
    assert "variant tx_000000000000, of 2: tx_000000000000, tx_000100000000" in out
    assert main(["data", "info", "sketchy", "--data-dir", str(root), "data.sketchy_variant=tx_000100000000"]) == 0
    assert "4 sketches, 4 photos, 2 classes" in capsys.readouterr().out
    (root / "sketch" / "tx_000000000000" / "cat" / "README.txt").write_text("hello")
    lines = describe_sketchy(DataConfig(), root)
    assert "1 non-image file(s)" in lines[-2] and "README.txt" in lines[-1]
    assert not (tmp_path / "default_cache").exists()
    assert main(["data", "info", "sketchy", "--data-dir", str(tmp_path / "missing")]) == 2
    assert "Sketchy layout not found" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ eval --data


def write_chairv2(root: Path) -> Path:
    """A tiny QMUL-Chair-V2 folder (coordinates pickle + photos) to train a darp_triplet checkpoint on."""
    folder = root / "qmul_chairv2"
    (folder / "photo").mkdir(parents=True)
    lines = {"a": [[40, 40, 0], [200, 60, 1]], "b": [[40, 200, 0], [200, 200, 1]], "c": [[128, 40, 0], [128, 200, 1]]}
    data = {}
    for split, photos in (("train", "abc"), ("test", "ab")):
        for i, name in enumerate(photos):
            for n in (1, 2):
                data[f"/{split}/{split}_{name}_{n}"] = np.array(lines[name], dtype=np.float64)
            Image.new("RGB", (20, 20), (80 * i, 100, 7)).save(folder / "photo" / f"{split}_{name}.png")
    (folder / "ChairV2_Coordinate").write_bytes(pickle.dumps(data, protocol=3))
    return folder


def test_eval_a_chairv2_checkpoint_on_sketchy(tmp_path: Path, capsys) -> None:
    chair = write_chairv2(tmp_path)
    fit = [
        "fit",
        "method=darp_triplet",
        "data.name=qmul_chairv2",
        f"data.data_dir={chair}",
        f"data.image_size={SIZE}",
        "data.completion_steps=3",
        "data.val_size=1",
        "data.render_cache=none",
        "model.channels=[4,8]",
        "model.embed_dim=8",
        "trainer.max_steps=2",
        "trainer.batch_size=4",
        "trainer.progress=false",
        "trainer.num_threads=1",
        "eval.viz_images=0",
        f"trainer.out_dir={tmp_path / 'runs'}",
        "trainer.run_name=chair",
    ]
    assert main(fit) == 0
    ckpt = str(tmp_path / "runs" / "chair" / "checkpoints" / "best.ckpt")
    root = str(write_tree(tmp_path / "sketchy"))
    capsys.readouterr()
    data = ["--data", "sketchy", "--data-dir", root, "data.render_cache=none"]
    assert main(["eval", ckpt, *data, "data.sketchy_split=all_test", "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["count"] == 8 and whole["gallery"] == 4 and 0 <= whole["acc@1"] <= 100  # percent
    assert main(["eval", ckpt, *data, "data.sketchy_split=all_test"]) == 0
    assert capsys.readouterr().out.startswith("test of sketchy: ")
    assert main(["eval", ckpt, *data, "--json"]) == 0  # by_photo: val_size 1 from the checkpoint, 1 test photo
    assert json.loads(capsys.readouterr().out)["count"] == 2
    assert main(["eval", ckpt, *data, "data.sketchy_split=all_test", "--split", "val"]) == 2
    assert "the val split of sketchy is empty" in capsys.readouterr().err
    assert main(["eval", ckpt, *data, "data.completion_steps=3"]) == 2
    assert "raster sketches have no stroke order" in capsys.readouterr().err
    assert main(["eval", ckpt, *data, "data.name=coco"]) == 2
    assert "only data.key=value overrides" in capsys.readouterr().err
    assert main(["eval", ckpt, *data, "data.bogus=1"]) == 2
    assert "unknown key 'data.bogus'" in capsys.readouterr().err
    assert main(["eval", ckpt, "--json"]) == 0  # without --data: the checkpoint's own data
    assert json.loads(capsys.readouterr().out)["count"] == 4
