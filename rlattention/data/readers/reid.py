"""Person re-identification: the ``market1501`` / ``dukemtmc`` readers and ``omniglot_reid``, a small
identity-disjoint re-id task built from Omniglot.

Layout of every split (the contract with the ``scal`` method). With ``(H, W) = cfg.reid_size`` (default
``[256, 128]``, Market's usual size):

* ``images``: uint8 ``(N, C, H, W)``, ``C = 3`` (RGB) for Market / Duke, ``C = 1`` for ``omniglot_reid``. Every
  image is resized to ``H x W`` with Pillow's antialiased bilinear filter (the aspect ratio is not kept).
* ``targets``: int64 ``(N, 3)`` = ``[pid, camid, role]``. ``camid`` is 0-based (file camera ``c1`` -> 0).
  ``role`` is 0 for a training image, 1 for a query, 2 for a gallery image.
* ``train``: role 0 only, pids relabelled to ``0 .. K-1`` in the order of the original ids; ``num_classes = K``.
* ``val`` and ``test``: the query rows first, then the gallery rows (each in file-name order), with the
  *original* pids: Market's junk images keep pid ``-1`` and its distractors pid ``0`` (both gallery only; the
  metric ignores junk and treats distractors as non-matches). The identities of train, val and test are disjoint
  (except with ``reid_val_ids = 0``, below).
* ``meta``: ``{"reid": True, "train_ids": K}`` plus the identity and image counts ``val_ids``, ``test_ids``,
  ``train_images``, ``val_query``, ``val_gallery``, ``test_query``, ``test_gallery``, and ``num_cameras``,
  ``channels``, ``val_overlaps_train``, ``folder``; Market / Duke add ``test_junk``, ``test_distractors`` (gallery
  images with pid -1 / 0) and ``dropped_train``, ``dropped_queries`` (pid -1 or 0 images left out).

Validation (both datasets): ``cfg.reid_val_ids`` identities of the training set (default 100; drawn with
:func:`rlattention.data.photos.holdout_split`, seeded by ``cfg.seed``) are held out of training and split into
query and gallery like Market's test set by :func:`split_query_gallery`: per (identity, camera) pair, the first
image (by file name) is a query and the others are gallery images. A query whose identity would have no gallery
image from *another* camera (an identity seen by one camera only, or by several cameras once each) is put in the
gallery instead, so every query has at least one valid match. ``reid_val_ids = 0`` trains on all identities (the
papers' protocol) and the validation split is a seeded 10 % of the training identities that *overlaps*
training: it only monitors training and must not be used for model selection (``meta["val_overlaps_train"]``).

``market1501`` (Zheng et al. ICCV 2015) and ``dukemtmc`` (DukeMTMC-reID, Zheng et al. ICCV 2017), one reader.
The folder ``data_dir/<name>`` holds ``bounding_box_train/``, ``query/`` and ``bounding_box_test/`` (``data_dir``
itself may be that folder). ``market1501`` looks for ``market1501``, ``Market-1501-v15.09.15`` and then
``DukeMTMC-reID``; ``dukemtmc`` for ``DukeMTMC-reID`` and ``dukemtmc-reid``. File names: Market
``PPPP_cCsS_FFFFFF_NN.jpg`` (``0002_c1s1_000451_03.jpg``; junk ``-1_c1s1_...``), Duke ``PPPP_cC_fFFFFFFF.jpg``
(``0005_c2_f0046985.jpg``); pid ``-1`` is junk, ``0`` a distractor, cameras are numbered from 1. Files whose
suffix is not an image suffix (``Thumbs.db``, ...) and hidden files are ignored; an image file with another name
is an error naming it. Standard protocol: junk and distractor images are dropped from training (and from the
queries; Market and Duke have none there) and kept in the test gallery; the test split is ``query/`` then
``bounding_box_test/``. Market: 751 training identities (12,936 images), 3,368 queries and 19,732 gallery images
(2,793 distractors, 3,819 junk); Duke: 702 identities (16,522 images), 2,228 queries, 17,661 gallery images.
Memory: ``N * 3 * H * W`` bytes, about 3.5 GB for all of Market at 256 x 128.

``reid_folder``: a re-id folder of one's own (``docs/own-data.md``), ``data_dir`` holding ``train/`` and, optionally,
``query/`` and ``gallery/`` (both or neither), with files named ``<pid>_c<cam>[_<anything>].<ext>``
(:func:`parse_person_name`; Market and Duke names fit too), junk and distractors as in Market. It is read as
Market is, with one addition: without ``query/`` and ``gallery/``, a seeded ``cfg.test_fraction`` of the training
identities (by identity, seed ``split_seed(seed, "test")``) is the test split, cut into query and gallery by
:func:`split_query_gallery` like the validation identities.

``omniglot_reid`` (Omniglot, Lake et al. Science 2015): identities are characters, "cameras" are disjoint groups of
drawers. The folder ``omniglot/`` (or ``data_dir`` itself) holds ``images_background_small1.zip`` (136 characters of
5 alphabets) and ``images_background_small2.zip`` (156 characters of 5 alphabets, 50 of them also in small1), read
in place. A character was drawn by 20 drawers; its drawings sorted by name (``<image id>_<drawer>.png``, i.e. by
drawer) are cut into ``cfg.reid_cameras`` contiguous groups (default 4: drawers 01-05, 06-10, 11-15, 16-20 are
cameras 0-3), so a query and its matches always come from different people. ``reid_cameras`` must divide the number
of drawings (20) and be >= 2. Training identities are the characters of small1 minus the ``reid_val_ids`` held out
for validation. The test identities are the characters of small2 that are not in small1: the two small sets overlap,
small2's Greek (24) and Latin (26) characters are the same characters as small1's, with byte-identical drawings, so
they are left out and the test split is the 106 characters of Japanese (katakana), Sanskrit and Tagalog, alphabets
never seen in training (``meta["shared_characters_dropped"] = 50``). Val and test queries: one per (character,
camera), the first drawing of the group, so 4 queries and 16 gallery drawings per character by default. A
character's pid is its global index + 1 over the characters of small1 then the test characters of small2, each
sorted by ``(alphabet, character)`` (small1: 1..136, test: 137..242; pid 0 is never used). Images: the 105 x 105 PNG
(black ink on white) inverted, ink 255 on background 0, one channel, resized to ``reid_size`` (the configs use
``[64, 64]``); 64 x 64 takes about 1 s and 20 MB. With the defaults (``reid_val_ids = 100``, ``reid_cameras = 4``):
train 36 characters (720 drawings), val 100 characters (400 queries, 1600 gallery), test 106 characters (424
queries, 1696 gallery); a smaller ``reid_val_ids`` (e.g. 20) leaves more training characters.

Smoke runs (both datasets): ``cfg.num_train > 0`` keeps only the first ``num_train`` training identities (in the
order of their original ids, after the validation hold-out) and all their images; ``cfg.num_test > 0`` keeps only
the first ``num_test`` validation identities and the first ``num_test`` test identities (by pid, among the
identities with a query), with all their query and gallery images. Market's junk and distractor images, and
gallery identities without a query, are dropped from the test gallery when ``num_test > 0``.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

from rlattention.data.base import ArrayDataset, DataSplits
from rlattention.data.limits import check_archive, check_side, read_member
from rlattention.data.photos import ImageDecodeError, holdout_split
from rlattention.data.readers.sketch_retrieval import find_omniglot_folder
from rlattention.data.registry import register_dataset

__all__ = [
    "IMAGE_SUFFIXES",
    "OMNIGLOT_REID_ZIPS",
    "REID_FOLDERS",
    "REID_SUBDIRS",
    "ROLE_GALLERY",
    "ROLE_QUERY",
    "ROLE_TRAIN",
    "ReidFormatError",
    "ReidImage",
    "build_dukemtmc",
    "build_market1501",
    "build_omniglot_reid",
    "find_omniglot_reid_dir",
    "find_reid_dir",
    "list_reid_images",
    "parse_person_name",
    "parse_reid_name",
    "split_query_gallery",
]

ROLE_TRAIN, ROLE_QUERY, ROLE_GALLERY = 0, 1, 2
#: The three subfolders of a Market-1501 / DukeMTMC-reID style folder: training, query and gallery images.
REID_SUBDIRS: tuple[str, str, str] = ("bounding_box_train", "query", "bounding_box_test")
#: dataset -> folder names looked for under ``data_dir``, in order.
REID_FOLDERS: dict[str, tuple[str, ...]] = {
    "market1501": ("market1501", "Market-1501-v15.09.15", "DukeMTMC-reID"),
    "dukemtmc": ("DukeMTMC-reID", "dukemtmc-reid"),
}
#: Suffixes of the files read as images; other files (``Thumbs.db``, ``readme.txt``) are ignored.
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp"})
#: The Omniglot zips of ``omniglot_reid``: small1 gives the train / val characters, small2 the test characters.
OMNIGLOT_REID_ZIPS: tuple[str, str] = ("images_background_small1.zip", "images_background_small2.zip")

# Market "0002_c1s1_000451_03.jpg" / "-1_c3s2_..." and Duke "0005_c2_f0046985.jpg".
_NAME_RE = re.compile(r"^(?P<pid>-1|\d+)_c(?P<cam>\d+)(?:s\d+_\d+_\d+|_f\d+)$")
# reid_folder: "<pid>_c<cam>", then optionally Market's "s<seq>" and anything after an underscore
_PERSON_RE = re.compile(r"^(?P<pid>-1|\d+)_c(?P<cam>\d+)(?:s\d+)?(?:_.*)?$")
_MISSING_DIR_MSG = (
    "{name} needs its data files: pass --data-dir or set RLATTENTION_DATA (a folder holding {what}, e.g. "
    "../shared/data)"
)


class ReidFormatError(ValueError):
    """A re-id file or archive whose name or layout is not the expected one; the message names it."""


class ReidImage(NamedTuple):
    path: Path
    pid: int  # original id: -1 junk, 0 distractor
    camid: int  # 0-based


# ------------------------------------------------------------------------------------------- query / gallery


def split_query_gallery(pids: Sequence[int] | np.ndarray, camids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Roles (``ROLE_QUERY`` or ``ROLE_GALLERY``, int64 ``(N,)``) of held-out images given in file-name order.

    Per (pid, camid) pair the first image is a query candidate and the others are gallery images. Candidates are
    then visited by camera, then by pid: one with no gallery image of its pid from another camera (counting the
    candidates already put in the gallery) is put in the gallery. Every query then has a valid match; an identity
    seen by a single camera has no query, and one seen once by each of several cameras loses only the query of its
    first camera (it becomes the match of the others).
    """
    pids, camids = np.asarray(pids, dtype=np.int64), np.asarray(camids, dtype=np.int64)
    roles = np.full(len(pids), ROLE_GALLERY, dtype=np.int64)
    first: dict[tuple[int, int], int] = {}
    for row, key in enumerate(zip(pids.tolist(), camids.tolist(), strict=True)):
        first.setdefault(key, row)
    gallery_cams: dict[int, dict[int, int]] = {}  # pid -> camid -> gallery images
    for row, (pid, cam) in enumerate(zip(pids.tolist(), camids.tolist(), strict=True)):
        if first[(pid, cam)] != row:
            cams = gallery_cams.setdefault(pid, {})
            cams[cam] = cams.get(cam, 0) + 1
    for (pid, cam), row in sorted(first.items(), key=lambda item: (item[0][1], item[0][0])):
        cams = gallery_cams.setdefault(pid, {})
        if any(n > 0 for c, n in cams.items() if c != cam):
            roles[row] = ROLE_QUERY
        else:
            cams[cam] = cams.get(cam, 0) + 1
    return roles


def _query_first(rows: np.ndarray, roles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` reordered queries first (stable), and their roles."""
    order = np.argsort(roles != ROLE_QUERY, kind="stable")
    return rows[order], roles[order]


# -------------------------------------------------------------------------------------------- image decoding


def _reid_size(cfg: Any) -> tuple[int, int]:
    value = _option(cfg, "reid_size", [256, 128])
    try:
        height, width = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"reid_size must be [height, width], got {value!r}") from None
    if height < 1 or width < 1:
        raise ValueError(f"reid_size must be positive, got {[height, width]}")
    check_side("data.reid_size", [height, width])
    return height, width


def _decode(source: Path | bytes, name: str, size: tuple[int, int], gray_ink: bool) -> np.ndarray:
    """One image as ``(C, H, W)`` uint8: RGB (``gray_ink`` False), or 1 channel inverted so that dark ink on a
    white page is bright on black (``gray_ink`` True). ``name`` names the file in errors."""
    height, width = size
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
            if gray_ink:
                pixels = img.convert("L")
            else:
                img.draft("RGB", (width, height))  # JPEG: decode at 1/2, 1/4 or 1/8 scale when still >= size
                pixels = img.convert("RGB")
        if gray_ink:
            pixels = ImageOps.invert(pixels)
        pixels = pixels.resize((width, height), Image.Resampling.BILINEAR)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ImageDecodeError(f"{name}: cannot decode the image ({type(err).__name__}: {err})") from err
    array = np.array(pixels, dtype=np.uint8)
    return array[None] if gray_ink else array.transpose(2, 0, 1)


def _load_files(paths: Sequence[Path], size: tuple[int, int], workers: int | None = None) -> Tensor:
    """Decode ``paths`` (in order) into a ``(N, 3, H, W)`` uint8 tensor with a thread pool (Pillow releases the
    GIL while decoding)."""
    out = torch.empty(len(paths), 3, *size, dtype=torch.uint8)
    if not paths:
        return out
    workers = workers or min(8, os.cpu_count() or 1)

    def decode(item: tuple[int, Path]) -> None:
        i, path = item
        if not path.is_file():
            raise FileNotFoundError(f"image file not found: {path}")
        out[i] = torch.from_numpy(_decode(path, str(path), size, gray_ink=False))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(decode, enumerate(paths)):  # re-raises the first error, in order
            pass
    return out


# ----------------------------------------------------------------------------------------- Market-1501 / Duke


def parse_reid_name(name: str, source: str | os.PathLike | None = None) -> tuple[int, int]:
    """``(pid, camid)`` of a Market (``0002_c1s1_000451_03.jpg``) or Duke (``0005_c2_f0046985.jpg``) file name;
    camid is 0-based. Raises :class:`ReidFormatError` naming the file (``source``, default ``name``) otherwise."""
    source = name if source is None else source
    match = _NAME_RE.match(Path(name).stem)
    if match is None:
        raise ReidFormatError(
            f"{source}: not a Market-1501 (PPPP_cCsS_FFFFFF_NN.jpg) or DukeMTMC-reID (PPPP_cC_fFFFFFFF.jpg) file name"
        )
    cam = int(match["cam"])
    if cam < 1:
        raise ReidFormatError(f"{source}: camera numbers start at 1, got c{cam}")
    return int(match["pid"]), cam - 1


def parse_person_name(name: str, source: str | os.PathLike | None = None) -> tuple[int, int]:
    """``(pid, camid)`` of a ``reid_folder`` file name ``<pid>_c<cam>[_<anything>].<ext>`` (``0007_c2_0001.jpg``;
    Market and Duke names fit too); camid is 0-based. Raises :class:`ReidFormatError` naming the file (``source``,
    default ``name``) otherwise."""
    source = name if source is None else source
    match = _PERSON_RE.match(Path(name).stem)
    if match is None:
        raise ReidFormatError(
            f"{source}: not a re-id file name (expected <person id>_c<camera>[_<anything>], e.g. 0007_c2_0001.jpg)"
        )
    cam = int(match["cam"])
    if cam < 1:
        raise ReidFormatError(f"{source}: camera numbers start at 1, got c{cam}")
    return int(match["pid"]), cam - 1


def list_reid_images(folder: str | os.PathLike, parse: Any = parse_reid_name) -> list[ReidImage]:
    """The images of one Market / Duke subfolder, sorted by file name. Hidden files, subfolders and files without
    an image suffix are ignored; an image with an unexpected name raises :class:`ReidFormatError` naming it.
    ``parse``: the file-name parser (:func:`parse_person_name` for ``reid_folder``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"re-id image folder not found: {folder}")
    out = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.startswith(".") or not entry.is_file() or Path(entry.name).suffix.lower() not in IMAGE_SUFFIXES:
            continue
        pid, camid = parse(entry.name, folder / entry.name)
        out.append(ReidImage(folder / entry.name, pid, camid))
    return out


def find_reid_dir(root: str | os.PathLike, names: Sequence[str] = REID_FOLDERS["market1501"]) -> Path:
    """The re-id folder: ``root`` itself if it holds ``bounding_box_train/``, else the first ``root/<name>`` of
    ``names`` that exists. Raises ``FileNotFoundError`` naming every folder searched, or the first missing
    subfolder of the folder found."""
    root = Path(root).expanduser()
    folders = [root / name for name in names]
    found = root if (root / REID_SUBDIRS[0]).is_dir() else next((f for f in folders if f.is_dir()), None)
    if found is None:
        raise FileNotFoundError(
            f"re-id dataset folder not found: expected {', '.join(s + '/' for s in REID_SUBDIRS)} in one of: "
            f"{', '.join(str(f) for f in [root, *folders])}"
        )
    for sub in REID_SUBDIRS:
        if not (found / sub).is_dir():
            raise FileNotFoundError(
                f"re-id folder {found} has no {sub}/ (expected {', '.join(s + '/' for s in REID_SUBDIRS)}: training, "
                "query and gallery images)"
            )
    return found


def _targets(pids: np.ndarray, camids: np.ndarray, roles: np.ndarray) -> Tensor:
    return torch.from_numpy(np.stack([pids, camids, roles], axis=1).astype(np.int64)).reshape(-1, 3)


def _first_ids(ids: np.ndarray, count: int) -> np.ndarray:
    return ids[:count] if count > 0 else ids


def _held_out_ids(ids: np.ndarray, cfg: Any, source: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(train ids, val ids, overlapping)``: ``cfg.reid_val_ids`` of the sorted ``ids`` held out (seeded)."""
    val_ids, seed = int(_option(cfg, "reid_val_ids", 100)), int(_option(cfg, "seed", 0))
    if not 0 <= val_ids < len(ids):
        raise ValueError(
            f"reid_val_ids={val_ids} must be in 0..{len(ids) - 1}: {source} has {len(ids)} training identities "
            "(set data.reid_val_ids; 0 trains on all of them with an overlapping 10% monitoring split)"
        )
    train_idx, val_idx = holdout_split(len(ids), val_ids, seed, source)
    return ids[train_idx.numpy()], ids[val_idx.numpy()], val_ids == 0


def _build_folder(cfg: Any, data_dir: Path | None, name: str) -> DataSplits:
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG.format(name=name, what=f"{REID_FOLDERS[name][0]}/{REID_SUBDIRS[0]}/"))
    folder = find_reid_dir(data_dir, REID_FOLDERS[name])
    size = _reid_size(cfg)
    train_all, query_all, gallery_all = (list_reid_images(folder / sub) for sub in REID_SUBDIRS)
    if not train_all:
        raise FileNotFoundError(f"no training images in {folder / REID_SUBDIRS[0]}")
    if not query_all:
        raise FileNotFoundError(f"no query images in {folder / REID_SUBDIRS[1]}")
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))

    # training folder: junk / distractors dropped, identities held out for validation
    train_recs = [r for r in train_all if r.pid > 0]
    ids = np.array(sorted({r.pid for r in train_recs}), dtype=np.int64)
    train_ids, val_ids, overlap = _held_out_ids(ids, cfg, str(folder / REID_SUBDIRS[0]))
    train_ids, val_ids = _first_ids(train_ids, num_train), _first_ids(val_ids, num_test)
    rec_pids = np.array([r.pid for r in train_recs], dtype=np.int64)
    rec_cams = np.array([r.camid for r in train_recs], dtype=np.int64)
    train_rows = np.flatnonzero(np.isin(rec_pids, train_ids))
    val_rows = np.flatnonzero(np.isin(rec_pids, val_ids))
    val_rows, val_roles = _query_first(val_rows, split_query_gallery(rec_pids[val_rows], rec_cams[val_rows]))

    # test: query/ then bounding_box_test/
    queries = [r for r in query_all if r.pid > 0]
    test_ids = _first_ids(np.array(sorted({r.pid for r in queries}), dtype=np.int64), num_test)
    kept = set(test_ids.tolist())
    queries = [r for r in queries if r.pid in kept]
    gallery = gallery_all if num_test <= 0 else [r for r in gallery_all if r.pid in kept]
    shared = set(ids.tolist()) & {r.pid for r in query_all + gallery_all if r.pid > 0}
    if shared:
        raise ReidFormatError(
            f"{folder}: {len(shared)} identities (e.g. {min(shared)}) appear in both {REID_SUBDIRS[0]}/ and "
            f"{REID_SUBDIRS[1]}/ or {REID_SUBDIRS[2]}/; train and test identities must be disjoint"
        )
    test_recs = queries + gallery

    paths = [train_recs[i].path for i in train_rows] + [train_recs[i].path for i in val_rows]
    images = _load_files(paths + [r.path for r in test_recs], size)
    n_train, n_val = len(train_rows), len(val_rows)
    relabel = np.searchsorted(train_ids, rec_pids[train_rows])  # train_ids is sorted
    train = ArrayDataset(
        images[:n_train], _targets(relabel, rec_cams[train_rows], np.full(n_train, ROLE_TRAIN, dtype=np.int64))
    )
    val = ArrayDataset(images[n_train : n_train + n_val], _targets(rec_pids[val_rows], rec_cams[val_rows], val_roles))
    test_roles = np.array([ROLE_QUERY] * len(queries) + [ROLE_GALLERY] * len(gallery), dtype=np.int64)
    test = ArrayDataset(
        images[n_train + n_val :],
        _targets(
            np.array([r.pid for r in test_recs], dtype=np.int64),
            np.array([r.camid for r in test_recs], dtype=np.int64),
            test_roles,
        ),
    )
    all_recs = train_all + query_all + gallery_all
    meta = _meta(train, val, test, len(train_ids), len(val_ids), len(test_ids), overlap, 3)
    meta.update(
        num_cameras=max(r.camid for r in all_recs) + 1,
        folder=str(folder),
        test_junk=sum(r.pid == -1 for r in gallery),
        test_distractors=sum(r.pid == 0 for r in gallery),
        dropped_train=len(train_all) - len(train_recs),
        dropped_queries=sum(r.pid <= 0 for r in query_all),
    )
    return DataSplits(train, val, test, num_classes=len(train_ids), name=name, meta=meta)


def _meta(
    train: ArrayDataset,
    val: ArrayDataset,
    test: ArrayDataset,
    train_ids: int,
    val_ids: int,
    test_ids: int,
    overlap: bool,
    channels: int,
) -> dict[str, Any]:
    def count(part: ArrayDataset, role: int) -> int:
        return int((part.targets[:, 2] == role).sum())

    return {
        "reid": True,
        "train_ids": train_ids,
        "val_ids": val_ids,
        "test_ids": test_ids,
        "channels": channels,
        "train_images": len(train),
        "val_query": count(val, ROLE_QUERY),
        "val_gallery": count(val, ROLE_GALLERY),
        "test_query": count(test, ROLE_QUERY),
        "test_gallery": count(test, ROLE_GALLERY),
        "val_overlaps_train": overlap,
    }


@register_dataset("market1501")
def build_market1501(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Market-1501 (or any Market / DukeMTMC-reID style folder) person re-id; see the module docstring.

    Config: ``reid_size`` (``[H, W]``, default ``[256, 128]``), ``reid_val_ids`` (training identities held out for
    validation, default 100), ``seed``, ``num_train`` / ``num_test`` (first identities only, when > 0).
    """
    return _build_folder(cfg, data_dir, "market1501")


@register_dataset("dukemtmc")
def build_dukemtmc(cfg: Any, data_dir: Path | None) -> DataSplits:
    """DukeMTMC-reID person re-id: the ``market1501`` reader on ``data_dir/DukeMTMC-reID``."""
    return _build_folder(cfg, data_dir, "dukemtmc")


# -------------------------------------------------------------------------------------------------- Omniglot


def find_omniglot_reid_dir(root: str | os.PathLike) -> Path:
    """``root`` itself or ``root/omniglot``, the first holding both :data:`OMNIGLOT_REID_ZIPS`. Raises
    ``FileNotFoundError`` naming the zips and every folder searched."""
    return find_omniglot_folder(root, OMNIGLOT_REID_ZIPS)


def _omniglot_characters(zip_path: Path) -> list[tuple[str, list[str]]]:
    """``[(alphabet/character, sorted png members)]`` of one images zip, sorted by character."""
    out: dict[str, list[str]] = {}
    try:
        with zipfile.ZipFile(zip_path) as archive:
            check_archive(archive, zip_path, ReidFormatError)
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile) as err:
        raise ReidFormatError(f"{zip_path}: cannot read the zip ({type(err).__name__}: {err})") from err
    for name in names:
        if name.startswith(("/", "\\")) or ".." in name.split("/") or ".." in name.split("\\"):
            raise ReidFormatError(
                f"{zip_path}: refused: member {name!r} has an absolute or '..' path (not an Omniglot archive)"
            )
        if name.endswith("/") or not name.lower().endswith(".png"):
            continue
        parts = name.split("/")
        if len(parts) != 4:
            raise ReidFormatError(f"{zip_path}: member {name!r} is not <folder>/<alphabet>/<character>/<drawing>.png")
        out.setdefault(f"{parts[1]}/{parts[2]}", []).append(name)
    if not out:
        raise ReidFormatError(f"{zip_path}: no <folder>/<alphabet>/<character>/<drawing>.png members")
    return [(key, sorted(members)) for key, members in sorted(out.items())]


@register_dataset("omniglot_reid")
def build_omniglot_reid(cfg: Any, data_dir: Path | None) -> DataSplits:
    """Omniglot characters as identities, groups of drawers as cameras (see the module docstring).

    Config: ``reid_size`` (the configs use ``[64, 64]``), ``reid_cameras`` (drawer groups, default 4; must divide
    20), ``reid_val_ids`` (small1 characters held out for validation, default 100), ``seed``, ``num_train`` /
    ``num_test`` (first characters only, when > 0).
    """
    if data_dir is None:
        raise ValueError(_MISSING_DIR_MSG.format(name="omniglot_reid", what=f"omniglot/{OMNIGLOT_REID_ZIPS[0]}"))
    folder = find_omniglot_reid_dir(data_dir)
    size = _reid_size(cfg)
    cameras = int(_option(cfg, "reid_cameras", 4))
    zips = [folder / name for name in OMNIGLOT_REID_ZIPS]
    subsets = [_omniglot_characters(path) for path in zips]
    # small2 repeats 50 characters of small1 (all of Greek and Latin, byte-identical drawings): test keeps the others
    known = {key for key, _ in subsets[0]}
    shared = sum(key in known for key, _ in subsets[1])
    subsets[1] = [(key, members) for key, members in subsets[1] if key not in known]
    # (zip index, alphabet/character, sorted drawings) of small1 then small2; a character's pid is its index + 1
    characters = [(z, key, members) for z, chars in enumerate(subsets) for key, members in chars]
    for z, key, members in characters:
        if cameras < 2 or len(members) % cameras:
            raise ValueError(
                f"reid_cameras={cameras} must be >= 2 and divide the {len(members)} drawings of each character "
                f"(e.g. {key} in {zips[z]}): a query needs gallery drawings from another camera"
            )
    num_train, num_test = int(_option(cfg, "num_train", 0)), int(_option(cfg, "num_test", 0))
    n1 = len(subsets[0])
    train_chars, val_chars, overlap = _held_out_ids(np.arange(n1), cfg, f"{zips[0]} (characters)")
    train_chars, val_chars = _first_ids(train_chars, num_train), _first_ids(val_chars, num_test)
    test_chars = _first_ids(np.arange(n1, len(characters)), num_test)

    def rows(chars: np.ndarray) -> tuple[list[tuple[int, str]], np.ndarray, np.ndarray]:
        members, pids, cams = [], [], []
        for c in chars.tolist():
            z, _, drawings = characters[c]
            group = len(drawings) // cameras
            members += [(z, m) for m in drawings]
            pids += [c + 1] * len(drawings)
            cams += [i // group for i in range(len(drawings))]
        return members, np.array(pids, dtype=np.int64), np.array(cams, dtype=np.int64)

    parts = []
    for role, chars in ((ROLE_TRAIN, train_chars), (None, val_chars), (None, test_chars)):
        members, pids, cams = rows(chars)
        if role is None:
            order, roles = _query_first(np.arange(len(members)), split_query_gallery(pids, cams))
        else:
            order, roles = np.arange(len(members)), np.full(len(members), role, dtype=np.int64)
        parts.append(([members[i] for i in order], pids[order], cams[order], roles))

    archives = [zipfile.ZipFile(path) for path in zips]
    try:
        splits = []
        for members, pids, cams, roles in parts:
            images = np.empty((len(members), 1, *size), dtype=np.uint8)
            for i, (z, member) in enumerate(members):
                data = read_member(archives[z], member, zips[z], ReidFormatError)
                images[i] = _decode(data, f"{zips[z]}:{member}", size, gray_ink=True)
            splits.append((torch.from_numpy(images), pids, cams, roles))
    finally:
        for archive in archives:
            archive.close()
    (train_x, train_p, train_c, train_r), val, test = splits
    relabel = np.searchsorted(train_chars + 1, train_p)  # train_chars is sorted
    train = ArrayDataset(train_x, _targets(relabel, train_c, train_r))
    val_set, test_set = (ArrayDataset(x, _targets(p, c, r)) for x, p, c, r in (val, test))
    meta = _meta(train, val_set, test_set, len(train_chars), len(val_chars), len(test_chars), overlap, 1)
    meta.update(num_cameras=cameras, folder=str(folder), shared_characters_dropped=shared)
    return DataSplits(train, val_set, test_set, num_classes=len(train_chars), name="omniglot_reid", meta=meta)


def _option(cfg: Any, name: str, default: Any) -> Any:
    """``cfg.name`` for a DataConfig, an OmegaConf node or any namespace; ``default`` if absent or None."""
    value = getattr(cfg, name, None)
    return default if value is None else value
