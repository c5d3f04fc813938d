"""Documented maximum sizes of inputs: checked before anything is inflated or allocated.

Compressed files, archives, json and YAML files and size settings are checked against these caps before the
memory they describe is allocated, so that a small hostile file (a gzip or zip "bomb", a json declaring a huge
number of categories, a YAML "billion laughs") fails at once with one line naming the file (or config key), what
was found and the limit, instead of exhausting memory.

=============================  ===========  ================================================================
constant                       default      checked in
=============================  ===========  ================================================================
``MAX_DECOMPRESSED_BYTES``     1 GiB        gzip streams (``mnist.read_idx``): running count while inflating
                                            in chunks (and the size of the IDX file itself, before reading);
                                            also the cap on one zip member (declared ``file_size``, before
                                            reading; ``reid``, ``sketch_retrieval``)
``MAX_ARCHIVE_TOTAL_BYTES``    8 GiB        zip archives: sum of the declared sizes of all members, checked
                                            when the archive is opened (``reid``, ``sketch_retrieval``)
``MAX_ARCHIVE_MEMBERS``        200,000      zip archives: number of members (the Omniglot zips hold ~3,300)
``MAX_COMPRESSION_RATIO``      200          gzip streams and zip members, once their inflated size passes
                                            ``RATIO_CHECK_BYTES`` (MNIST gzips ~5, Omniglot strokes zips ~35;
                                            a zeros bomb ~1000)
``RATIO_CHECK_BYTES``          16 MiB       below this inflated size the ratio is not checked
``MAX_JSON_BYTES``             1 GiB        file size of a json before parsing (``coco`` instances, the
                                            ``text`` vocabulary, ``digit_scenes`` scene descriptions);
                                            COCO's instances_train2017.json is 448 MB
``MAX_CATEGORIES``             10,000       ``coco``: categories of an instances json (COCO has 80)
``MAX_IMAGES``                 10,000,000   ``coco``: images of an instances json (train2017 has 118k)
``MAX_TARGET_ELEMENTS``        2**28        ``coco``: images x categories of the float32 targets (1 GiB)
``MAX_YAML_BYTES``             1 MiB        a config file, before parsing (``engine.config``)
``MAX_YAML_DEPTH``             32           nesting of mappings / lists in a config file or override
YAML aliases / anchors         refused      configs (``&name`` / ``*name``): they allow exponential expansion
``MAX_IMAGE_SIDE``             4096 px      every image / canvas / glimpse side setting: ``data.canvas_size``,
                                            ``data.image_size``, ``data.clutter_size``, ``data.reid_size``,
                                            ``model.glimpse_size``, ``model.region_size`` (``engine.config``
                                            and the dataset builders)
=============================  ===========  ================================================================

Overriding: the environment variable ``RLATTENTION_MAX_BYTES`` (a byte count, read at import) replaces the byte
caps of a whole input, ``MAX_DECOMPRESSED_BYTES`` and ``MAX_JSON_BYTES`` (``MAX_ARCHIVE_TOTAL_BYTES`` becomes at
least that value), for a deliberately large dataset; a value that is not a positive integer fails at import.
Every other cap is a module constant, looked up when it is checked: assign ``rlattention.data.limits.MAX_... =
value`` to change it.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

__all__ = [
    "MAX_ARCHIVE_MEMBERS",
    "MAX_ARCHIVE_TOTAL_BYTES",
    "MAX_CATEGORIES",
    "MAX_COMPRESSION_RATIO",
    "MAX_DECOMPRESSED_BYTES",
    "MAX_IMAGES",
    "MAX_IMAGE_SIDE",
    "MAX_JSON_BYTES",
    "MAX_TARGET_ELEMENTS",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "RATIO_CHECK_BYTES",
    "YamlLimitError",
    "InputLimitError",
    "check_archive",
    "check_count",
    "check_file_size",
    "check_side",
    "gunzip_limited",
    "read_member",
    "safe_load_limited",
]

_MIB = 1 << 20
_GIB = 1 << 30


def _env_bytes(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 1:
        raise ValueError(f"${name}={value!r}: expected a positive byte count (e.g. {default})")
    return number


MAX_DECOMPRESSED_BYTES: int = _env_bytes("RLATTENTION_MAX_BYTES", _GIB)
MAX_ARCHIVE_TOTAL_BYTES: int = max(8 * _GIB, MAX_DECOMPRESSED_BYTES)
MAX_ARCHIVE_MEMBERS: int = 200_000
MAX_COMPRESSION_RATIO: float = 200.0
RATIO_CHECK_BYTES: int = 16 * _MIB
MAX_JSON_BYTES: int = _env_bytes("RLATTENTION_MAX_BYTES", _GIB)
MAX_CATEGORIES: int = 10_000
MAX_IMAGES: int = 10_000_000
MAX_TARGET_ELEMENTS: int = 1 << 28
MAX_YAML_BYTES: int = _MIB
MAX_YAML_DEPTH: int = 32
MAX_IMAGE_SIDE: int = 4096

_CHUNK = 1 << 20  # inflate at most this many bytes per step


class InputLimitError(ValueError):
    """An input over one of the documented limits of this module; the message names the file or key, what was
    found and the limit."""


@cache
def _error_class(error: type[Exception]) -> type[Exception]:
    """A subclass of both :class:`InputLimitError` and a reader's own error (so either ``except`` catches it)."""
    if error is InputLimitError or issubclass(error, InputLimitError):
        return error
    return type(f"{error.__name__}Limit", (InputLimitError, error), {"__module__": error.__module__})


def _fail(error: type[Exception], message: str) -> None:
    raise _error_class(error)(message)


def _size(n: float) -> str:
    return f"{int(n):,} bytes"


def check_file_size(path: str | os.PathLike, limit: int, what: str, error: type[Exception] = InputLimitError) -> int:
    """The size of ``path``; raises if it exceeds ``limit`` (before the file is read)."""
    size = Path(path).stat().st_size
    if size > limit:
        _fail(error, f"{path}: {what} of {_size(size)} exceeds the limit of {_size(limit)} (rlattention.data.limits)")
    return size


def check_count(source: str, what: str, count: int, limit: int, error: type[Exception] = InputLimitError) -> None:
    """Raise if ``count`` (of ``what`` in ``source``) exceeds ``limit``."""
    if count > limit:
        _fail(error, f"{source}: {count:,} {what} exceed the limit of {limit:,} (rlattention.data.limits)")


def check_side(key: str, value: Any, error: type[Exception] = InputLimitError) -> None:
    """Raise if a size setting ``key`` (an int or a list of ints) has a side above :data:`MAX_IMAGE_SIDE`."""
    values = value if isinstance(value, list | tuple) else [value]
    for v in values:
        if isinstance(v, int | float) and not isinstance(v, bool) and v > MAX_IMAGE_SIDE:
            _fail(
                error,
                f"{key}={value!r}: a side of {v} px exceeds the maximum of {MAX_IMAGE_SIDE} px "
                "(MAX_IMAGE_SIDE, rlattention.data.limits)",
            )


def check_name_inside(source: str, what: str, name: Any, error: type[Exception] = ValueError) -> str:
    """``name`` (a file name or image id read from a dataset file) if it stays inside its folder: a relative path
    with no ``..`` part, no NUL byte and not empty; else one line naming ``source``, ``what`` and the name. Paths
    built from a dataset's own files can then never read (or, in a cache, write) outside the dataset folder."""
    text = name if isinstance(name, str) else None
    parts = PurePosixPath(text.replace("\\", "/")).parts if text else ()
    if (
        text is None
        or not text.strip()
        or "\0" in text
        or ".." in parts
        or text.startswith(("/", "\\"))
        or (len(text) > 1 and text[1] == ":")
    ):
        raise error(
            f"{source}: {what} {name!r} is not a name inside its folder (expected a relative path with no '..' "
            "part, not absolute, not empty)"
        )
    return text


def gunzip_limited(path: str | os.PathLike, raw: bytes, error: type[Exception] = InputLimitError) -> bytes:
    """Inflate a gzip file's bytes (concatenated members too, as ``gzip.decompress``) in chunks of at most 1 MiB,
    raising once the output passes :data:`MAX_DECOMPRESSED_BYTES` or, past :data:`RATIO_CHECK_BYTES`, the ratio
    passes :data:`MAX_COMPRESSION_RATIO`: memory never exceeds the cap by more than a chunk. The ISIZE trailer
    is not trusted. Corrupt data raises ``zlib.error`` / ``EOFError`` as ``gzip.decompress`` would."""
    limit, out, total, data = MAX_DECOMPRESSED_BYTES, [], 0, raw
    while True:
        inflater = zlib.decompressobj(wbits=31)
        pending = data
        while not inflater.eof:
            before = len(pending)
            chunk = inflater.decompress(pending, _CHUNK)
            pending = inflater.unconsumed_tail
            if not chunk and pending and len(pending) == before:  # no progress: never loop forever
                raise zlib.error("the gzip stream does not advance")
            total += len(chunk)
            if total > limit:
                _fail(
                    error,
                    f"{path}: gzip data inflates beyond {_size(limit)} from {_size(len(raw))} compressed "
                    f"(limit MAX_DECOMPRESSED_BYTES, rlattention.data.limits; $RLATTENTION_MAX_BYTES raises it)",
                )
            if total > RATIO_CHECK_BYTES and total > MAX_COMPRESSION_RATIO * len(raw):
                _fail(
                    error,
                    f"{path}: gzip data inflates more than {MAX_COMPRESSION_RATIO:g}x ({_size(total)} so far from "
                    f"{_size(len(raw))}; limit MAX_COMPRESSION_RATIO, rlattention.data.limits)",
                )
            out.append(chunk)
            if not chunk and not pending:
                if not inflater.eof:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                break
        data = inflater.unused_data.lstrip(b"\x00")  # gzip.decompress skips zero padding between members
        if not data:
            return b"".join(out)


def check_archive(archive: zipfile.ZipFile, path: str | os.PathLike, error: type[Exception] = InputLimitError) -> None:
    """Check a zip's member count and the declared total inflated size (before reading any member)."""
    infos = archive.infolist()
    check_count(str(path), "zip members", len(infos), MAX_ARCHIVE_MEMBERS, error)
    total = sum(info.file_size for info in infos)
    if total > MAX_ARCHIVE_TOTAL_BYTES:
        _fail(
            error,
            f"{path}: zip members declare {_size(total)} in all, over the limit of {_size(MAX_ARCHIVE_TOTAL_BYTES)} "
            "(MAX_ARCHIVE_TOTAL_BYTES, rlattention.data.limits)",
        )


def read_member(
    archive: zipfile.ZipFile, name: str, path: str | os.PathLike, error: type[Exception] = InputLimitError
) -> bytes:
    """``archive.read(name)``, after checking the member's declared size and compression ratio; the read is also
    bounded by the declared size (``zipfile`` stops there and checks the CRC), so a lying header cannot inflate
    more."""
    info = archive.getinfo(name)
    source = f"{path}:{name}"
    if info.file_size > MAX_DECOMPRESSED_BYTES:
        _fail(
            error,
            f"{source}: zip member declares {_size(info.file_size)}, over the limit of "
            f"{_size(MAX_DECOMPRESSED_BYTES)} (MAX_DECOMPRESSED_BYTES, rlattention.data.limits)",
        )
    if info.file_size > RATIO_CHECK_BYTES and info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1):
        _fail(
            error,
            f"{source}: zip member inflates {info.file_size / max(info.compress_size, 1):.0f}x "
            f"({_size(info.compress_size)} -> {_size(info.file_size)}), over the limit of "
            f"{MAX_COMPRESSION_RATIO:g}x (MAX_COMPRESSION_RATIO, rlattention.data.limits)",
        )
    with archive.open(info) as member:
        data = member.read(info.file_size + 1)
    if len(data) > info.file_size:  # not reached with zipfile, which stops at the declared size
        _fail(error, f"{source}: zip member holds more than its declared {_size(info.file_size)}")
    return data


# ------------------------------------------------------------------------------------------------- YAML
class YamlLimitError(yaml.YAMLError):
    """YAML refused by :class:`_LimitedLoader`: an alias or anchor, or nesting deeper than
    :data:`MAX_YAML_DEPTH`."""


class _LimitedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses anchors and aliases (``&a`` / ``*a``: their expansion can be exponential,
    the "billion laughs") at the first one met, and mappings / lists nested deeper than ``MAX_YAML_DEPTH``;
    both before anything is built from them."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark else 0
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            kind = "alias" if isinstance(event, yaml.AliasEvent) else "anchor"
            raise YamlLimitError(
                f"line {line}: YAML {kind} '{'*' if kind == 'alias' else '&'}{event.anchor}' refused "
                "(anchors and aliases are not allowed in config files: write the values out)"
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YamlLimitError(
                    f"line {line}: nested more than {MAX_YAML_DEPTH} levels deep "
                    "(MAX_YAML_DEPTH, rlattention.data.limits)"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def safe_load_limited(text: str) -> Any:
    """``yaml.safe_load`` with :class:`_LimitedLoader` (no aliases, bounded depth)."""
    loader = _LimitedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
