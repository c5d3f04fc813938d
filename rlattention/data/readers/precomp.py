"""Pre-computed image-text retrieval data in the VSE++ / SCAN / VSRN ``precomp`` layout.

Layout. One folder per dataset (``f30k_precomp``, ``coco_precomp``, ...) holding, for each split, two files::

    {split}_ims.npy    image features: float32 (N, R, D), R regions of D values per image (bottom-up
                       attention: R = 36, D = 2048), or (N, D), one vector per image (read as R = 1)
    {split}_caps.txt   captions: UTF-8 text, one caption per line, ``captions_per_image`` (5) lines per image in
                       image order: caption ``j`` describes image ``j // 5``

The splits are ``train``, ``dev`` (validation), ``test`` and, for COCO, ``testall`` (the 5K test images; the
1K protocol averages its five folds of 1,000 images). Any name of letters, digits, ``_`` and ``-`` is accepted
as a split. The shared ``../shared/data/f30k_precomp`` holds the captions only (``dev_caps.txt``: 5,070 =
1,014 x 5, ``test_caps.txt``: 5,000 = 1,000 x 5), so :func:`read_captions` works on it and
:func:`read_precomp_split` says that ``{split}_ims.npy`` is missing.

Captions (:func:`read_captions`). The whole file must be UTF-8 (a leading byte-order mark is dropped). Lines
end at ``\\n`` (a ``\\r`` just before it is dropped too); the last line may lack its ``\\n`` (the SCAN
``test_caps.txt`` does). Nothing else is stripped: the caption is the line as written (tokenise it with
:func:`rlattention.data.text.tokenize`). A blank line (empty or whitespace only) is an error, as it would
shift every later caption onto the wrong image.

Features (:func:`read_precomp_split`). Read with ``numpy.load`` (``allow_pickle=False``), memory-mapped
read-only by default (the COCO train features are about 33 GB). They must be float32 with ``N, R, D >= 1``.
Finiteness is checked on all values when the array is at most :data:`FULL_CHECK_BYTES` (in chunks), else on a
deterministic sample of :data:`SAMPLE_IMAGES` images evenly spaced from the first to the last (``check_finite``
chooses). The caption count must be exactly ``captions_per_image * N``; some old VSE++ files repeat each
image's features once per caption (``N`` = number of captions): keep every fifth row to read them.

Writing (:func:`write_precomp_split`): both files are checked as the reader would, written to temporary files
in the folder and renamed into place (``os.replace``), so a reader never sees half a file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from rlattention.data.base import DataSplits
from rlattention.data.image_text import _split_items
from rlattention.data.registry import register_dataset
from rlattention.data.text import Vocabulary, atomic_write

__all__ = [
    "CAPTIONS_PER_IMAGE",
    "FULL_CHECK_BYTES",
    "PRECOMP_SPLITS",
    "SAMPLE_IMAGES",
    "PrecompFormatError",
    "PrecompSplit",
    "available_splits",
    "build_precomp",
    "captions_path",
    "features_path",
    "load_precomp_splits",
    "read_captions",
    "read_precomp_split",
    "write_precomp_split",
]

#: The usual splits, in the order :func:`available_splits` lists them (other names follow alphabetically).
PRECOMP_SPLITS: tuple[str, ...] = ("train", "dev", "test", "testall")
#: Captions per image in Flickr30k and COCO.
CAPTIONS_PER_IMAGE = 5
#: ``check_finite="auto"`` checks every value of feature arrays up to this size, a sample of larger ones.
FULL_CHECK_BYTES = 256 * 2**20
#: How many images ``check_finite="sample"`` looks at (evenly spaced, the first and last included).
SAMPLE_IMAGES = 256

_SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_FEATURES_SUFFIX = "_ims.npy"
_CAPTIONS_SUFFIX = "_caps.txt"
_CHUNK_BYTES = 16 * 2**20


class PrecompFormatError(ValueError):
    """A malformed precomp file; the message names the file (and line or image) and what was expected."""


class PrecompSplit(NamedTuple):
    """One split of a precomp folder.

    features: float32 ``(N, R, D)``, a read-only ``np.memmap`` when read with ``mmap=True``.
    captions: the ``C = captions_per_image * N`` captions, in file order.
    caption_to_image: int64 ``(C,)``, the image of every caption (``j // captions_per_image``).
    """

    features: np.ndarray
    captions: list[str]
    caption_to_image: np.ndarray

    @property
    def num_images(self) -> int:
        return int(self.features.shape[0])

    @property
    def captions_per_image(self) -> int:
        return len(self.captions) // max(self.num_images, 1)


def _check_split(split: str) -> str:
    if not isinstance(split, str) or not _SPLIT_NAME.match(split):
        raise ValueError(f"a split name is letters, digits, '_' and '-' (e.g. 'train', 'dev', 'test'), got {split!r}")
    return split


def features_path(folder: str | os.PathLike, split: str) -> Path:
    """``folder/{split}_ims.npy``."""
    return Path(folder) / f"{_check_split(split)}{_FEATURES_SUFFIX}"


def captions_path(folder: str | os.PathLike, split: str) -> Path:
    """``folder/{split}_caps.txt``."""
    return Path(folder) / f"{_check_split(split)}{_CAPTIONS_SUFFIX}"


def _split_order(split: str) -> tuple[int, str]:
    return (PRECOMP_SPLITS.index(split), "") if split in PRECOMP_SPLITS else (len(PRECOMP_SPLITS), split)


def available_splits(folder: str | os.PathLike, need_features: bool = True) -> list[str]:
    """The splits of a precomp folder: those with both ``{split}_ims.npy`` and ``{split}_caps.txt``, or with
    ``{split}_caps.txt`` alone when ``need_features`` is false. Known splits first (``train``, ``dev``,
    ``test``, ``testall``), then the others alphabetically; ``[]`` for a missing folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    splits = []
    for entry in folder.iterdir():
        name = entry.name
        if not (name.endswith(_CAPTIONS_SUFFIX) and entry.is_file()):
            continue
        split = name[: -len(_CAPTIONS_SUFFIX)]
        if _SPLIT_NAME.match(split) and (not need_features or (folder / f"{split}{_FEATURES_SUFFIX}").is_file()):
            splits.append(split)
    return sorted(splits, key=_split_order)


# ------------------------------------------------------------------------------------------------- captions


def read_captions(path: str | os.PathLike) -> list[str]:
    """The captions of a ``{split}_caps.txt`` file, one per line (see the module docstring).

    Raises ``FileNotFoundError`` naming a missing file, and :class:`PrecompFormatError` naming the file for
    bytes that are not UTF-8 (with the byte offset, the line and the bytes), a blank line (its number) or a
    file without captions.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"caption file not found: {path}")
    blob = path.read_bytes()
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as err:
        line = blob.count(b"\n", 0, err.start) + 1
        column = err.start - (blob.rfind(b"\n", 0, err.start) + 1) + 1
        raise PrecompFormatError(
            f"{path}: not UTF-8 text: byte offset {err.start} (line {line}, byte {column} of the line) holds "
            f"{blob[err.start : err.end]!r} ({err.reason}); caption files must be UTF-8"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final line break
    if not lines:
        raise PrecompFormatError(f"{path}: no captions (an empty file); expected one caption per line")
    captions = []
    for number, line in enumerate(lines, start=1):
        if line.endswith("\r"):
            line = line[:-1]
        if not line.strip():
            raise PrecompFormatError(
                f"{path}: line {number} is blank; every line must hold one caption (a blank line would shift the "
                "later captions onto the wrong images)"
            )
        captions.append(line)
    return captions


# ------------------------------------------------------------------------------------------------- features


def _first_non_finite(features: np.ndarray, rows: np.ndarray | None) -> tuple[int, tuple[int, ...]] | None:
    """``(image, index within the image)`` of the first non-finite value among ``rows`` (all when ``None``)."""
    per_image = max(int(np.prod(features.shape[1:])) * features.itemsize, 1)
    step = max(1, _CHUNK_BYTES // per_image)
    if rows is None:
        chunks = [np.arange(start, min(start + step, len(features))) for start in range(0, len(features), step)]
    else:
        chunks = [rows[start : start + step] for start in range(0, len(rows), step)]
    for chunk in chunks:
        block = np.asarray(features[chunk[0] : chunk[-1] + 1] if rows is None else features[chunk])
        bad = ~np.isfinite(block)
        if bad.any():
            where = np.unravel_index(int(np.argmax(bad)), block.shape)
            return int(chunk[where[0]]), tuple(int(i) for i in where[1:])
    return None


def _check_features(features: np.ndarray, what: str, check_finite: str) -> np.ndarray:
    """``features`` as ``(N, R, D)`` float32 after the checks of the module docstring."""
    if features.dtype != np.float32:
        raise PrecompFormatError(
            f"{what}: image features must be float32, found {features.dtype}; convert the file once with "
            "np.save(path, np.load(path).astype(np.float32))"
        )
    if features.ndim == 2:
        features = features.reshape(features.shape[0], 1, features.shape[1])  # one vector per image: R = 1
    elif features.ndim != 3:
        raise PrecompFormatError(
            f"{what}: image features must be (N, R, D) regions or (N, D) vectors, found {features.ndim}-D "
            f"shape {features.shape}"
        )
    if min(features.shape) < 1:
        raise PrecompFormatError(f"{what}: image features must have N, R, D >= 1, found shape {features.shape}")
    if check_finite == "auto":
        check_finite = "all" if features.nbytes <= FULL_CHECK_BYTES else "sample"
    if check_finite != "off":
        rows = None
        if check_finite == "sample" and len(features) > SAMPLE_IMAGES:
            rows = np.unique(np.linspace(0, len(features) - 1, SAMPLE_IMAGES).round().astype(np.int64))
        found = _first_non_finite(features, rows)
        if found is not None:
            image, (region, dim) = found
            value = features[image, region, dim]
            raise PrecompFormatError(
                f"{what}: image features must be finite, found {value} at image {image}, region {region}, value {dim}"
            )
    return features


def _wrong_count_message(caps: Path | str, ims: Path | str, captions: int, images: int, per_image: int) -> str:
    message = (
        f"wrong caption count per image: {caps} has {captions} captions and {ims} has {images} images; "
        f"expected captions_per_image x images = {per_image} x {images} = {per_image * images} captions "
        f"(found {captions / images:.4g} per image)"
    )
    if captions == images and per_image > 1:
        message += (
            f"; the features look repeated once per caption (old VSE++ layout): keep every {per_image}th row "
            f"(features[::{per_image}])"
        )
    return message


def read_precomp_split(
    folder: str | os.PathLike,
    split: str,
    captions_per_image: int = CAPTIONS_PER_IMAGE,
    mmap: bool = True,
    check_finite: Literal["auto", "all", "sample", "off"] = "auto",
) -> PrecompSplit:
    """Read ``{split}_ims.npy`` and ``{split}_caps.txt`` of a precomp folder (see the module docstring).

    mmap: memory-map the features read-only (``np.memmap``) instead of reading them into memory.
    check_finite: ``"all"`` values, a ``"sample"`` of images, ``"auto"`` (all up to :data:`FULL_CHECK_BYTES`),
    or ``"off"``.

    Raises ``FileNotFoundError`` naming the missing folder or file(s) and listing the splits the folder does
    have (and whether it holds captions only), and :class:`PrecompFormatError` naming the file for an
    unreadable ``.npy``, features that are not float32 2-D/3-D finite values, caption file errors
    (:func:`read_captions`) and a caption count other than ``captions_per_image * N`` ("wrong caption count
    per image").
    """
    if int(captions_per_image) < 1:
        raise ValueError(f"captions_per_image must be >= 1, got {captions_per_image}")
    if check_finite not in ("auto", "all", "sample", "off"):
        raise ValueError(f"check_finite must be 'auto', 'all', 'sample' or 'off', got {check_finite!r}")
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"precomp folder not found: {folder}")
    ims, caps = features_path(folder, split), captions_path(folder, split)
    missing = [path.name for path in (ims, caps) if not path.is_file()]
    if missing:
        complete = available_splits(folder)
        captions_only = [s for s in available_splits(folder, need_features=False) if s not in complete]
        found = f"complete splits here: {', '.join(complete) or 'none'}"
        if captions_only:
            found += f"; captions only (no *_ims.npy features): {', '.join(captions_only)}"
        raise FileNotFoundError(
            f"precomp split {split!r} needs {ims.name} (image features) and {caps.name} (captions) in {folder}; "
            f"missing: {', '.join(missing)} ({found})"
        )
    try:
        features = np.load(ims, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise PrecompFormatError(
            f"{ims}: not a readable .npy array ({err}); expected float32 (N, R, D) image features"
        ) from None
    if not isinstance(features, np.ndarray):
        raise PrecompFormatError(f"{ims}: expected one .npy array, found {type(features).__name__}")
    features = _check_features(features, str(ims), check_finite)
    captions = read_captions(caps)
    per_image = int(captions_per_image)
    if len(captions) != per_image * len(features):
        raise PrecompFormatError(_wrong_count_message(caps, ims, len(captions), len(features), per_image))
    caption_to_image = np.arange(len(captions), dtype=np.int64) // per_image
    return PrecompSplit(features, captions, caption_to_image)


def write_precomp_split(
    folder: str | os.PathLike,
    split: str,
    features: np.ndarray,
    captions: Sequence[str],
    captions_per_image: int = CAPTIONS_PER_IMAGE,
) -> tuple[Path, Path]:
    """Write ``{split}_ims.npy`` and ``{split}_caps.txt`` into ``folder`` (created if needed), atomically.

    features: ``(N, R, D)`` or ``(N, D)`` real numbers, stored as float32 in the shape given; they must be
    finite. captions: ``captions_per_image * N`` strings in image order, each non-blank and without line breaks
    (``\\n``, ``\\r``). Raises :class:`PrecompFormatError` (before writing anything) when a check fails.
    Returns ``(features_path, captions_path)``.
    """
    if int(captions_per_image) < 1:
        raise ValueError(f"captions_per_image must be >= 1, got {captions_per_image}")
    ims, caps = features_path(folder, split), captions_path(folder, split)
    array = np.asarray(features)
    if array.dtype.kind not in "iuf":
        raise PrecompFormatError(f"{ims}: image features must be real numbers, got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    _check_features(array, f"{ims} (writing)", "all")
    if isinstance(captions, str):
        raise TypeError("captions must be a sequence of str, got one str")
    captions = list(captions)
    for number, caption in enumerate(captions, start=1):
        if not isinstance(caption, str):
            raise PrecompFormatError(f"{caps} (writing): caption {number} must be a str, got {type(caption).__name__}")
        if "\n" in caption or "\r" in caption:
            raise PrecompFormatError(f"{caps} (writing): caption {number} holds a line break: {caption[:60]!r}")
        if not caption.strip():
            raise PrecompFormatError(f"{caps} (writing): caption {number} is blank")
    per_image = int(captions_per_image)
    if len(captions) != per_image * len(array):
        raise PrecompFormatError(_wrong_count_message(f"{caps} (writing)", ims, len(captions), len(array), per_image))
    text = ("\n".join(captions) + "\n").encode("utf-8")
    atomic_write(ims, lambda f: np.save(f, array, allow_pickle=False))
    atomic_write(caps, lambda f: f.write(text))
    return ims, caps


def load_precomp_splits(folder: Path, cfg: Any, name: str) -> DataSplits:
    test_split = str(getattr(cfg, "test_split", "test") or "test")
    parts = {split: read_precomp_split(folder, split) for split in ("train", "dev", test_split)}
    vocab = Vocabulary.build(parts["train"].captions)  # training captions only
    max_len = int(getattr(cfg, "max_caption_len", 0) or 0)
    limits = {"train": int(getattr(cfg, "num_train", 0) or 0), "dev": int(getattr(cfg, "num_test", 0) or 0)}
    limits[test_split] = limits["dev"]
    out = {}
    for split, part in parts.items():
        feats, caps, c2i = part.features, list(part.captions), np.asarray(part.caption_to_image)
        if limits[split] > 0:  # the first images only (smoke runs), with all their captions
            keep = c2i < limits[split]
            feats, caps, c2i = feats[: limits[split]], [c for c, k in zip(caps, keep, strict=True) if k], c2i[keep]
        out[split] = _split_items(np.asarray(feats), caps, c2i, vocab, max_len)
    num_train = int(out["train"].targets[:, 0].max()) + 1
    meta = {"vocab_size": len(vocab), "vocab": vocab.words[4:]}
    return DataSplits(out["train"], out["dev"], out[test_split], num_train, name=name, meta=meta)


@register_dataset("precomp")
def build_precomp(cfg: Any, data_dir: Path | None) -> DataSplits:
    if data_dir is None:
        raise ValueError(
            "precomp needs a folder with {train,dev,test}_ims.npy and _caps.txt: pass --data-dir or set "
            "RLATTENTION_DATA (e.g. a VSE++/SCAN data/f30k_precomp folder)"
        )
    return load_precomp_splits(Path(data_dir), cfg, "precomp")
