"""Captioned digit scenes: a CPU-sized stand-in for image-text matching benchmarks (Flickr30k, COCO), written
to disk in the VSE++/SCAN/VSRN ``precomp`` layout (:mod:`rlattention.data.readers.precomp`), so that a matching model
trains through the same reader as real bottom-up region features.

Scenes. A black ``canvas x canvas`` RGB image holds 2 to 4 real MNIST digits of *distinct* classes (so a
digit's class names it uniquely in its scene). Each digit has

* a size: ``small`` or ``large``, the 28 px MNIST glyph resized to ``round(0.25 * canvas)`` or
  ``round(0.42 * canvas)`` px (24 and 40 px on the default 96 px canvas; :func:`digit_sides`);
* a colour: one of the six named colours of :data:`PALETTE` (drawn independently, so two digits may share
  one); the grey ink is tinted, ``pixel = ink / 255 * rgb`` with ``rgb`` the named colour plus a uniform
  per-channel jitter of at most :data:`COLOUR_JITTER`;
* a position: the resized glyph squares never overlap (uniform positions by rejection, larger glyphs first; a
  scene that cannot be packed after a few restarts falls back to a ``2 x 2`` grid with jitter inside the
  cells). A digit's *box* is the tight box of its non-zero pixels, ``(x0, y0, x1, y1)`` in pixels with
  exclusive ends; boxes of one scene are therefore disjoint.

Splits: ``train`` scenes use the 60,000 MNIST training digits; ``dev`` and ``test`` scenes use the MNIST test
digits, split into two disjoint halves by a seeded permutation (dev: the first 5,000, test: the rest), so no
evaluation scene shares a glyph with training or with the other evaluation split. Every split is drawn from
its own ``numpy`` generators seeded with ``split_seed(seed, split)`` (:func:`rlattention.data.splits.split_seed`).

Relations (:func:`relation`): ``a`` is ``"left of"`` ``b`` when ``a.x1 <= b.x0`` (``"right of"``: ``a.x0 >=
b.x1``; ``"above"``: ``a.y1 <= b.y0``; ``"below"``: ``a.y0 >= b.y1``), on the axis along which the two boxes
are separated by the larger gap (x on ties). Every relation stated in a caption therefore holds strictly for the
boxes.

Captions (:func:`scene_captions`): 5 distinct captions per image from a small grammar with paraphrases. A digit
is mentioned as ``[a|an|the] [size word] [colour] [digit|number] <class>``, the class as a number word
(``seven``) or a numeral (``7``), size and colour each present or omitted (a digit mentioned alone always has
its colour); size words are ``small / little / tiny`` and ``large / big``. The five are drawn from these
templates, two of them relational (with different ordered pairs where the scene allows), one listing every
digit, one mentioning a subset, one from any template, then shuffled::

    {A} {rel} {B}                       a small red seven left of a large blue 2
    there is {A} {rel} {B}              there is a blue two to the right of a small red seven
    the {A} is {rel} the {B}            the red number 7 is above the big green four
    {count} {digits|numbers}: {all}     two digits: a red 7 and a blue 2
    {a picture of|...} {all}            an image with a tiny cyan 3, a yellow eight and a big red zero
    {some} [on a black background]      a little magenta nine and a green 1   (1 of 2, 1-2 of 3, 2-3 of 4)
    {count} {digits|numbers} including {some}   three numbers including a big red 4 and a cyan two

with ``rel`` one of ``left of / to the left of / on the left of``, ``right of / ...``, ``above / over``,
``below / under / beneath``. Lower case ASCII; ``,`` and ``:`` are the only punctuation.

Regions. Each image has ``regions`` boxes (default 6): its digits' boxes plus distractors up to that number,
in a shuffled order. A distractor is, with equal chance, a random box anywhere (background, possibly cutting
digits) or a box shifted and rescaled from one digit's box so that it covers part of that digit; a distractor
overlapping a digit box with IoU > 0.5 is redrawn (up to 20 times). Region features (``D = 64 + 5``): a
:class:`RegionCNN` sees a square crop around each box (side ``1.15 * max(w, h) + 2`` px, same centre; pixels
outside the canvas are black), resized to ``32 x 32`` by exact area averaging
(:func:`rlattention.vision.crops.crop_boxes`); its 64 global-average-pooled channels are followed by the box
geometry ``(x0, y0, x1, y1, area)`` normalised by the canvas side.

The CNN is trained in a preparation step on crops of the first ``cnn_scenes`` *training* scenes (default 4,000):
every digit crop and a seeded 20 % of the distractor crops (so that digit classes dominate the training), 10 % of
them held out to report accuracies in the manifest. It learns each crop's digit class (10 classes, or
"background" for distractors) and colour (6 colours, or "none": a distractor takes the colour of the digit box
covering most of it when that is at least 10 % of its area), 5 epochs of Adam by default, seeded, on the CPU
(about 95 % digit-class accuracy on dev digit regions with the defaults). Its weights are saved as
``region_cnn.safetensors`` next to the data (:func:`load_region_cnn`; :func:`region_features` recomputes the
features of saved scenes).

Output folder (:func:`generate_digit_scenes`), for each split ``s`` of ``train``, ``dev``, ``test``:

* ``{s}_ims.npy`` float32 ``(N, R, D)`` and ``{s}_caps.txt`` (``5 N`` lines), the precomp pair;
* ``{s}_boxes.npy`` float32 ``(N, R, 4)``: the region boxes ``(x0, y0, x1, y1) / canvas`` in the order of the
  features;
* ``{s}_scenes.json``: ``{"canvas": H, "scenes": [{"digits": [{"label", "colour", "rgb", "size", "box",
  "region"}, ...]}, ...]}``, box in pixels, region the index of the digit's box among the image's regions
  (:func:`read_scene_descriptions`);
* ``{s}_scenes.npy`` uint8 ``(N, 3, H, W)``, the rendered scenes, only for the splits in ``image_splits``
  (default dev and test: 27.6 MB per 1,000 scenes at 96 px; :func:`find_scene_images` finds the scenes
  behind given region features, for figures);

plus ``region_cnn.safetensors`` and ``manifest.json`` (generator name and version, parameters, MNIST file
sizes, counts, feature dimension, CNN accuracies, file sizes, timings).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlattention.data import limits
from rlattention.data.base import DataSplits
from rlattention.data.cache import resolve_cache_dir
from rlattention.data.readers.mnist import find_mnist_files, load_mnist
from rlattention.data.readers.precomp import CAPTIONS_PER_IMAGE, load_precomp_splits, write_precomp_split
from rlattention.data.registry import register_dataset
from rlattention.data.splits import split_seed
from rlattention.data.synthetic.scene_captions import (
    COLOUR_JITTER,
    PALETTE,
    SceneDigit,
)
from rlattention.data.synthetic.scene_drawing import _BACKGROUND, _draw_split, _render, digit_sides
from rlattention.data.synthetic.scene_regions import (
    _CHUNK,
    _CNN_CHANNELS,
    CROP_SIZE,
    GEOMETRY_DIM,
    WEIGHTS_NAME,
    _cnn_features,
    _crops,
    _geometry,
    _save_region_cnn,
    _train_region_cnn,
)
from rlattention.progress import progress_bar

__all__ = [
    "GENERATOR_VERSION",
    "MANIFEST_NAME",
    "SPLITS",
    "SceneImages",
    "build_digit_scenes",
    "estimated_bytes",
    "find_scene_images",
    "generate_digit_scenes",
    "read_scene_descriptions",
]

#: Bumped whenever the output for the same parameters changes; part of the manifest check.
GENERATOR_VERSION = 1
#: The splits written, in order, and the MNIST split each one draws its digits from.
SPLITS: tuple[str, ...] = ("train", "dev", "test")
MANIFEST_NAME = "manifest.json"
_TEXT_BYTES_PER_SCENE = 550  # its 5 captions (~245 bytes) and its digits in {split}_scenes.json (~290 bytes)
_DISTRACTOR_FRACTION = 0.2  # of the distractor crops kept to train the region CNN (all digit crops are)
_DEV_DIGITS = 5000  # MNIST test digits (of a seeded permutation) reserved for dev scenes; test gets the rest


# ------------------------------------------------------------------------------------------- dataset folder


def read_scene_descriptions(folder: str | os.PathLike, split: str) -> list[list[SceneDigit]]:
    """The digits of every scene of ``{split}_scenes.json`` in a generated folder, in image order."""
    path = Path(folder) / f"{split}_scenes.json"
    if not path.is_file():
        raise FileNotFoundError(f"scene descriptions not found: {path}")
    limits.check_file_size(path, limits.MAX_JSON_BYTES, "scene descriptions json")
    data = json.loads(path.read_text(encoding="utf-8"))
    return [
        [
            SceneDigit(
                label=int(d["label"]),
                colour=str(d["colour"]),
                size=str(d["size"]),
                box=tuple(int(c) for c in d["box"]),  # type: ignore[arg-type]
                rgb=tuple(int(c) for c in d["rgb"]),  # type: ignore[arg-type]
                region=int(d["region"]),
            )
            for d in scene["digits"]
        ]
        for scene in data["scenes"]
    ]


def _split_files(split: str, with_images: bool) -> list[str]:
    names = [f"{split}_ims.npy", f"{split}_caps.txt", f"{split}_boxes.npy", f"{split}_scenes.json"]
    return [*names, f"{split}_scenes.npy"] if with_images else names


def _known_names() -> set[str]:
    return {MANIFEST_NAME, WEIGHTS_NAME, *(name for s in SPLITS for name in _split_files(s, True))}


def _mnist_fingerprint(mnist_root: str | os.PathLike) -> dict[str, int]:
    """``{file name: size}`` of the four MNIST files used (names only, so moving the folder changes nothing)."""
    paths = [p for split in ("train", "test") for p in find_mnist_files(mnist_root, split)]  # type: ignore[arg-type]
    return {p.name: p.stat().st_size for p in paths}


def _manifest_matches(out_dir: Path, params: dict[str, Any], mnist: dict[str, int]) -> bool:
    """Whether ``out_dir`` holds a complete generation with exactly these parameters (files at their sizes)."""
    try:
        manifest = json.loads((out_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("generator") != "digit_scenes":
        return False
    if manifest.get("version") != GENERATOR_VERSION or manifest.get("params") != params:
        return False
    if manifest.get("mnist") != mnist or not isinstance(manifest.get("files"), dict):
        return False
    expected = {WEIGHTS_NAME, *(n for s in SPLITS for n in _split_files(s, s in params["image_splits"]))}
    if set(manifest["files"]) != expected:
        return False
    for name, size in manifest["files"].items():
        path = out_dir / name
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def _check_replaceable(out_dir: Path) -> None:
    """Refuse to replace a folder holding anything this generator does not write."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a folder; expected a digit-scenes dataset folder")
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in _known_names())
    if foreign:
        raise FileExistsError(
            f"{out_dir} holds files that generate_digit_scenes does not write ({', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}); it would replace the whole folder: choose an empty or new folder"
        )


def _params(
    num_train: int,
    num_dev: int,
    num_test: int,
    regions: int,
    seed: int,
    canvas: int,
    digits: Sequence[int],
    cnn_epochs: int,
    cnn_scenes: int,
    image_splits: Sequence[str],
) -> dict[str, Any]:
    """The validated generation parameters, as recorded in (and compared with) the manifest."""
    for name, value in (("num_train", num_train), ("num_dev", num_dev), ("num_test", num_test)):
        if int(value) < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if int(num_train) < 1:
        raise ValueError(f"num_train must be >= 1 (the region CNN is trained on training scenes), got {num_train}")
    if len(digits) != 2:
        raise ValueError(f"digits must be (low, high) digits per scene, got {digits!r}")
    low, high = int(digits[0]), int(digits[1])
    if not 2 <= low <= high <= 4:
        raise ValueError(f"digits must be (low, high) with 2 <= low <= high <= 4 digits per scene, got {digits}")
    if int(regions) < high:
        raise ValueError(f"regions must be >= the most digits per scene ({high}), got {regions}")
    sides = digit_sides(int(canvas))
    if int(canvas) < 32:
        raise ValueError(f"canvas must be >= 32 px (small digits are a quarter of it), got {canvas}")
    if sides["large"] > int(canvas) // math.ceil(math.sqrt(high)):
        raise ValueError(f"canvas {canvas} cannot hold {high} large digits of {sides['large']} px")
    if int(cnn_epochs) < 1 or int(cnn_scenes) < 1:
        raise ValueError(f"cnn_epochs and cnn_scenes must be >= 1, got {cnn_epochs} and {cnn_scenes}")
    bad = [s for s in image_splits if s not in SPLITS]
    if bad or isinstance(image_splits, str):
        raise ValueError(f"image_splits must be a sequence of split names among {SPLITS}, got {image_splits!r}")
    return {
        "seed": int(seed),
        "num_train": int(num_train),
        "num_dev": int(num_dev),
        "num_test": int(num_test),
        "regions": int(regions),
        "canvas": int(canvas),
        "digits": [low, high],
        "digit_sides": sides,
        "palette": {k: list(v) for k, v in PALETTE.items()},
        "colour_jitter": COLOUR_JITTER,
        "captions_per_image": CAPTIONS_PER_IMAGE,
        "crop_size": CROP_SIZE,
        "cnn": {
            "channels": list(_CNN_CHANNELS),
            "epochs": int(cnn_epochs),
            "scenes": int(cnn_scenes),
            "distractor_fraction": _DISTRACTOR_FRACTION,
        },
        "image_splits": [s for s in SPLITS if s in image_splits],
    }


def _sources(mnist_root: str | os.PathLike, seed: int) -> dict[str, tuple[Tensor, Tensor]]:
    """MNIST digits of each split: train from the MNIST training set, dev / test from disjoint halves of t10k."""
    train = load_mnist(mnist_root, "train")
    test_images, test_labels = load_mnist(mnist_root, "test")
    perm = torch.from_numpy(
        np.random.default_rng([split_seed(seed, "mnist-test-halves"), 0]).permutation(len(test_images))
    )
    dev_idx, test_idx = perm[:_DEV_DIGITS], perm[_DEV_DIGITS:]
    return {
        "train": train,
        "dev": (test_images[dev_idx], test_labels[dev_idx]),
        "test": (test_images[test_idx], test_labels[test_idx]),
    }


def _write_all(tmp: Path, mnist_root: str | os.PathLike, params: dict[str, Any], progress: bool) -> dict[str, Any]:
    """Generate every file into ``tmp``; returns the manifest entries besides params and files."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    sources = _sources(mnist_root, params["seed"])
    canvas, regions = params["canvas"], params["regions"]
    digits = (int(params["digits"][0]), int(params["digits"][1]))
    sizes = {"train": params["num_train"], "dev": params["num_dev"], "test": params["num_test"]}
    layouts = {}
    for split in SPLITS:
        glyphs, labels = sources[split]
        seed = split_seed(params["seed"], split)
        layouts[split] = _draw_split(
            glyphs,
            labels,
            sizes[split],
            canvas,
            digits,
            regions,
            seed,
            progress,
            f"{split} layout",
        )
    timings["layout_and_captions"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    train = layouts["train"]
    m = min(params["cnn"]["scenes"], sizes["train"])
    keep_rng = np.random.default_rng([split_seed(params["seed"], "region-cnn"), 0])
    keep = (train.identity[:m] != _BACKGROUND) | (keep_rng.random((m, regions)) < params["cnn"]["distractor_fraction"])
    crops = []
    for i in range(0, m, _CHUNK):
        stop = min(i + _CHUNK, m)
        crops.append(_crops(_render(train, i, stop, canvas), train.boxes[i:stop])[keep[i:stop]])
    model, metrics = _train_region_cnn(
        np.concatenate(crops),
        train.identity[:m][keep],
        train.colour[:m][keep],
        params["cnn"]["epochs"],
        split_seed(params["seed"], "region-cnn"),
        progress,
    )
    _save_region_cnn(model, tmp / WEIGHTS_NAME)
    timings["region_cnn"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    counts = {}
    for split in SPLITS:
        layout, n = layouts[split], sizes[split]
        keep_images = split in params["image_splits"]
        feats = np.zeros((n, regions, model.out_features + GEOMETRY_DIM), dtype=np.float32)
        images = np.zeros((n, 3, canvas, canvas), dtype=np.uint8) if keep_images else None
        for i in progress_bar(range(0, n, _CHUNK), desc=f"{split} features", unit="chunk", enabled=progress):
            stop = min(i + _CHUNK, n)
            scenes = _render(layout, i, stop, canvas)
            feats[i:stop, :, : model.out_features] = _cnn_features(model, _crops(scenes, layout.boxes[i:stop]))
            feats[i:stop, :, model.out_features :] = _geometry(layout.boxes[i:stop], canvas)
            if images is not None:
                images[i:stop] = scenes
        write_precomp_split(tmp, split, feats, layout.captions)
        np.save(tmp / f"{split}_boxes.npy", (layout.boxes / canvas).astype(np.float32), allow_pickle=False)
        if images is not None:
            np.save(tmp / f"{split}_scenes.npy", images, allow_pickle=False)
        scenes_json = {"canvas": canvas, "scenes": [{"digits": [asdict(d) for d in scene]} for scene in layout.scenes]}
        (tmp / f"{split}_scenes.json").write_text(json.dumps(scenes_json, separators=(",", ":")), encoding="utf-8")
        counts[split] = {"images": n, "captions": len(layout.captions), "digits": len(layout.patches)}
    timings["render_and_features"] = time.perf_counter() - t0
    return {
        "feature_dim": model.out_features + GEOMETRY_DIM,
        "cnn_feature_dim": model.out_features,
        "geometry": ["x0", "y0", "x1", "y1", "area"],
        "counts": counts,
        "cnn_metrics": metrics,
        "seconds": {k: round(v, 3) for k, v in timings.items()},
    }


def generate_digit_scenes(
    out_dir: str | os.PathLike,
    mnist_root: str | os.PathLike,
    num_train: int = 10000,
    num_dev: int = 1000,
    num_test: int = 1000,
    regions: int = 6,
    seed: int = 0,
    canvas: int = 96,
    progress: bool = False,
    *,
    digits: tuple[int, int] = (2, 4),
    cnn_epochs: int = 5,
    cnn_scenes: int = 4000,
    image_splits: Sequence[str] = ("dev", "test"),
    force: bool = False,
) -> Path:
    """Write a captioned digit-scenes dataset in the precomp layout into ``out_dir`` (see the module docstring).

    mnist_root: the MNIST folder (as for :func:`rlattention.data.readers.mnist.load_mnist`).
    num_train / num_dev / num_test: scenes per split (the test protocol is 1,000 images, as for Flickr30k).
    regions: regions per image (digit boxes + distractors), at least ``digits[1]``.
    seed: the seed of everything (layouts, captions, the region CNN's initialisation and batches).
    canvas: side of the square RGB canvas in pixels. digits: ``(fewest, most)`` digits per scene, within 2..4.
    cnn_epochs / cnn_scenes: training of the region CNN, on the crops of the first ``cnn_scenes`` train scenes.
    image_splits: splits whose rendered scenes are saved as ``{split}_scenes.npy`` (for figures).
    progress: show progress bars (:func:`rlattention.progress.progress_bar`: rank 0, on a terminal). force:
    regenerate even when the folder is up to date.

    When ``out_dir`` already holds a generation whose manifest records the same parameters, generator version
    and MNIST file sizes, and every listed file has its recorded size, nothing is done. Otherwise everything is
    generated into a temporary folder beside ``out_dir`` which then replaces it, so an interrupted run never
    leaves a half-written dataset. Before that, one line on stderr says how many scenes go where and about how
    many bytes (:func:`estimated_bytes`); over ``$RLATTENTION_CACHE_LIMIT`` (default 2 GB) nothing is generated
    or written (:class:`~rlattention.cache_limit.CacheTooLarge`). A folder holding files this generator does not
    write is never replaced (``FileExistsError``). Returns ``out_dir`` as a ``Path``.

    Reproducibility: layouts and captions are bit-identical for a seed everywhere; the region CNN's training
    is seeded, and bit-identical features need the same torch build and thread count (the saved weights let
    :func:`region_features` recompute them from saved scenes).
    """
    out_dir = Path(out_dir).expanduser()
    params = _params(num_train, num_dev, num_test, regions, seed, canvas, digits, cnn_epochs, cnn_scenes, image_splits)
    params = json.loads(json.dumps(params))  # the form it has after a round trip through the manifest
    mnist = _mnist_fingerprint(mnist_root)
    if not force and _manifest_matches(out_dir, params, mnist):
        return out_dir
    _check_replaceable(out_dir)
    from rlattention.cache_limit import announce_cache_build

    n = params["num_train"] + params["num_dev"] + params["num_test"]
    announce_cache_build(
        f"generating {n:,} digit scenes ({params['num_train']:,} train, {params['num_dev']:,} dev, "
        f"{params['num_test']:,} test)",
        out_dir,
        estimated_bytes(params),
        "generate fewer scenes (data.num_train, data.num_test)",
    )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        start = time.perf_counter()
        info = _write_all(tmp, mnist_root, params, progress)
        info["seconds"]["total"] = round(time.perf_counter() - start, 3)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        manifest = {"generator": "digit_scenes", "version": GENERATOR_VERSION, "params": params, "mnist": mnist}
        manifest.update(info)
        manifest["files"] = files
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        umask = os.umask(0)
        os.umask(umask)
        for path in tmp.iterdir():  # temporary files and folders are private (0600 / 0700): the usual modes
            path.chmod(0o666 & ~umask)
        tmp.chmod(0o777 & ~umask)
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def estimated_bytes(params: dict[str, Any]) -> int:
    """About the bytes :func:`generate_digit_scenes` writes for ``params`` (see :func:`_params`), from the shapes:
    region features float32 ``(N, R, 64 + 5)``, boxes float32 ``(N, R, 4)``, the scenes of ``image_splits``
    uint8 ``(N, 3, H, W)``, plus about :data:`_TEXT_BYTES_PER_SCENE` of captions and scene descriptions per scene
    (measured on the defaults) and the region CNN's weights (about 0.1 MB)."""
    counts = {"train": params["num_train"], "dev": params["num_dev"], "test": params["num_test"]}
    per_scene = params["regions"] * 4 * (_CNN_CHANNELS[-1] + GEOMETRY_DIM + 4) + _TEXT_BYTES_PER_SCENE
    scenes = sum(counts[s] for s in params["image_splits"]) * 3 * params["canvas"] ** 2
    return sum(counts.values()) * per_scene + scenes + 100_000


def _swap_in(new: Path, out_dir: Path) -> None:
    """Rename the folder ``new`` to ``out_dir``; a previous ``out_dir`` is moved aside first and deleted after
    (or moved back if the rename fails)."""
    if not out_dir.exists():
        os.replace(new, out_dir)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    old = aside / out_dir.name
    os.replace(out_dir, old)
    try:
        os.replace(new, out_dir)
    except BaseException:
        if not out_dir.exists():
            os.replace(old, out_dir)
            aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class SceneImages:
    """The rendered scenes of some items, found by :func:`find_scene_images` (for figures only)."""

    folder: Path  # the generated dataset folder
    split: str
    images: np.ndarray  # uint8 (B, 3, H, W), the rendered canvases
    boxes: np.ndarray  # float32 (B, R, 4), the region boxes (x0, y0, x1, y1) / canvas, in feature order
    digits: list[list[SceneDigit]]  # the digits of each scene (``region``: the index of the digit's box)


def _scene_folders(roots: Sequence[str | os.PathLike]) -> list[Path]:
    """Generated dataset folders: each root that is one (holds a manifest), else its ``digit_scenes_*`` folders."""
    found = []
    for root in (Path(r).expanduser() for r in roots):
        if (root / MANIFEST_NAME).is_file():
            found.append(root)
        elif root.is_dir():
            found.extend(p for p in sorted(root.glob("digit_scenes_*")) if (p / MANIFEST_NAME).is_file())
    return found


def find_scene_images(
    features: np.ndarray | Tensor,
    image_ids: np.ndarray | Tensor,
    roots: Sequence[str | os.PathLike] | None = None,
    atol: float = 1e-5,
) -> SceneImages | None:
    """The rendered scenes behind region features, for figures; ``None`` when none is found.

    features: ``(B, R, D)`` region features of ``B`` items; image_ids: ``(B,)`` the index of each item's image
    in its split (column 0 of the image-text targets). Searched: every generated folder in ``roots`` (a root is
    either such a folder or a cache folder holding ``digit_scenes_*`` folders; default: the default cache,
    :func:`rlattention.data.cache.default_cache_dir`) and every split of it whose scenes were saved
    (``image_splits``, dev and test by default). A split matches when its saved features of those images equal
    ``features`` (within ``atol``), so a figure never shows the wrong scene. Nothing is generated or written;
    the feature files are memory-mapped, only the rows of ``image_ids`` are read.
    """
    if roots is None:
        from rlattention.data.cache import default_cache_dir

        default = default_cache_dir()
        roots = [default] if default is not None else []
    feats = np.asarray(features.detach().cpu() if isinstance(features, Tensor) else features, dtype=np.float32)
    ids = np.asarray(image_ids.detach().cpu() if isinstance(image_ids, Tensor) else image_ids, dtype=np.int64)
    if feats.ndim != 3 or ids.shape != feats.shape[:1] or len(ids) == 0 or ids.min() < 0:
        return None
    for folder in _scene_folders(roots):
        for split in SPLITS:
            if not all((folder / name).is_file() for name in _split_files(split, with_images=True)):
                continue
            try:
                saved = np.load(folder / f"{split}_ims.npy", mmap_mode="r", allow_pickle=False)
                if saved.shape[1:] != feats.shape[1:] or ids.max() >= len(saved):
                    continue
                if not np.allclose(saved[ids], feats, rtol=0.0, atol=atol):
                    continue
                images = np.load(folder / f"{split}_scenes.npy", mmap_mode="r", allow_pickle=False)
                boxes = np.load(folder / f"{split}_boxes.npy", mmap_mode="r", allow_pickle=False)
                scenes = read_scene_descriptions(folder, split)
            except (OSError, ValueError):
                continue
            return SceneImages(
                folder, split, np.array(images[ids]), np.array(boxes[ids], dtype=np.float32), [scenes[i] for i in ids]
            )
    return None


@register_dataset("digit_scenes")
def build_digit_scenes(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Generate (once, cached) captioned digit scenes from real MNIST digits in ``data_dir`` and read them
    through the precomp path."""
    if data_dir is None:
        raise ValueError("digit_scenes needs the MNIST idx files: pass --data-dir or set RLATTENTION_DATA")
    cache = resolve_cache_dir(getattr(cfg, "render_cache", None))
    if cache is None:
        raise ValueError("digit_scenes writes a precomp folder: data.render_cache must not disable the cache")
    n_train = int(getattr(cfg, "num_train", 0) or 0) or 10000
    n_test = int(getattr(cfg, "num_test", 0) or 0) or 1000
    seed = int(getattr(cfg, "seed", 0))
    folder = Path(cache) / f"digit_scenes_s{seed}_{n_train}_{n_test}"
    generate_digit_scenes(
        folder, data_dir, num_train=n_train, num_dev=n_test, num_test=n_test, seed=seed, progress=True
    )  # announced first (what, where, about how many bytes); over $RLATTENTION_CACHE_LIMIT: refused
    sub = type("Cfg", (), {"test_split": "test", "max_caption_len": getattr(cfg, "max_caption_len", 0)})()
    return load_precomp_splits(folder, sub, "digit_scenes")
