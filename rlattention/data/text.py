"""Captions as word ids: the tokenizer, the vocabulary (with its JSON file), padded id batches and GloVe vectors.

Tokenizer (:func:`tokenize`). A caption is normalised with Unicode NFKC (full-width letters, ligatures and
compatibility forms become their plain equivalents), typographic apostrophes (U+2018, U+2019, U+02BC, U+0060,
U+00B4) become ``'``, and the text is lower-cased with ``str.lower``. The tokens are then the matches, left to
right, of :data:`TOKEN_PATTERN`::

    [^\\W_]+|'(?:s|re|ve|ll|d|m|t)(?![^\\W_])

that is, runs of Unicode letters and digits (``[^\\W_]`` is ``\\w`` without the underscore, so ``café`` and
``37`` are words, ``37,000`` is ``37``, ``000``), and the English clitics ``'s 're 've 'll 'd 'm 't`` as tokens
of their own. Everything else (punctuation, symbols, a lone ``'``, whitespace) separates tokens and is dropped.
The clitic rule makes the two spellings found in caption files agree: ``woman's`` and the pre-tokenised
``woman 's`` of the SCAN/VSRN ``precomp`` files both give ``woman``, ``'s``; ``they’re`` gives ``they``, ``'re``
and ``don't`` gives ``don``, ``'t``. The tokenizer has no state and does not depend on the locale.

Vocabulary (:class:`Vocabulary`). Ids 0..3 are the special tokens ``<pad>``, ``<start>``, ``<end>`` and
``<unk>`` (:data:`SPECIAL_TOKENS`); the words follow from id 4. :meth:`Vocabulary.build` counts the tokens of the
training captions (build it from the training split only: the validation and test words then map to ``<unk>``,
as they would for a deployed model) and keeps the words seen at least ``min_count`` times, ordered by
decreasing count, ties broken alphabetically (by code point), so the same captions always give the same ids.

Vocabulary file (:meth:`Vocabulary.save` / :meth:`Vocabulary.load`): UTF-8 JSON ::

    {"format": "rlattention.vocabulary", "version": 1,
     "specials": ["<pad>", "<start>", "<end>", "<unk>"], "words": ["a", "in", ...]}

``words`` lists the ordinary words in id order (the word ``words[i]`` has id ``4 + i``). It is written to a
temporary file in the same folder and renamed into place (``os.replace``), so a reader never sees half a file.

GloVe (:func:`load_glove`). A GloVe text file (``glove.6B.300d.txt``, ``glove.840B.300d.txt``, ...) holds one
word per line followed by its vector, separated by single spaces, in UTF-8, without a header line. Only the
vectors of vocabulary words are kept; the file is never downloaded by this module.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Literal

import numpy as np
import torch
from torch import Tensor

from rlattention.data import limits

__all__ = [
    "END",
    "END_ID",
    "PAD",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "START",
    "START_ID",
    "TOKEN_PATTERN",
    "UNK",
    "UNK_ID",
    "VOCABULARY_FORMAT",
    "GloveFormatError",
    "Vocabulary",
    "VocabularyError",
    "atomic_write",
    "encode_batch",
    "load_glove",
    "normalize_text",
    "tokenize",
]

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
#: The special tokens, in id order.
SPECIAL_TOKENS: tuple[str, ...] = (PAD, START, END, UNK)
#: Letters-and-digits runs, and the English clitics as tokens of their own (see the module docstring).
TOKEN_PATTERN = re.compile(r"[^\W_]+|'(?:s|re|ve|ll|d|m|t)(?![^\W_])")
#: ``format`` value of a vocabulary file.
VOCABULARY_FORMAT = "rlattention.vocabulary"
_VOCABULARY_VERSION = 1
_APOSTROPHES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'", "\u0060": "'", "\u00b4": "'"})


class VocabularyError(ValueError):
    """A malformed vocabulary or vocabulary file; the message names the file, the key and what was expected."""


class GloveFormatError(ValueError):
    """A malformed GloVe text file; the message names the file, the line and what was expected."""


# ------------------------------------------------------------------------------------------------ tokenizer


def normalize_text(text: str) -> str:
    """NFKC, typographic apostrophes -> ``'``, then ``str.lower``: the text :func:`tokenize` splits."""
    return unicodedata.normalize("NFKC", text).translate(_APOSTROPHES).lower()


def tokenize(caption: str) -> list[str]:
    """The word tokens of ``caption`` (see the module docstring): lower-case, punctuation dropped.

    >>> tokenize("A man's dog, running!")
    ['a', 'man', "'s", 'dog', 'running']
    """
    if not isinstance(caption, str):
        raise TypeError(f"a caption must be a str, got {type(caption).__name__}")
    return TOKEN_PATTERN.findall(normalize_text(caption))


# ----------------------------------------------------------------------------------------------- atomic I/O


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(f)`` on a temporary binary file in ``path``'s folder, then rename it to ``path``.

    The folder is created if needed; on any error the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates owner-only files; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ---------------------------------------------------------------------------------------------- vocabulary


def _check_word(word: object, what: str) -> str:
    if not isinstance(word, str) or not word:
        raise VocabularyError(f"{what}: a word must be a non-empty str, found {word!r}")
    if any(ch.isspace() for ch in word):
        raise VocabularyError(f"{what}: a word must not hold whitespace, found {word!r}")
    if word in SPECIAL_TOKENS:
        raise VocabularyError(f"{what}: {word!r} is a special token (ids 0..3), not an ordinary word")
    return word


class Vocabulary:
    """Word <-> id mapping: ``<pad>`` 0, ``<start>`` 1, ``<end>`` 2, ``<unk>`` 3, then ``words`` from id 4.

    words: the ordinary words in id order (unique, non-empty, no whitespace, not a special token). Usually made
    with :meth:`build` or :meth:`load`.
    """

    def __init__(self, words: Iterable[str] = ()) -> None:
        self._words: list[str] = list(SPECIAL_TOKENS)
        self._index: dict[str, int] = {word: i for i, word in enumerate(SPECIAL_TOKENS)}
        for position, word in enumerate(words):
            _check_word(word, f"word {position}")
            if word in self._index:
                raise VocabularyError(f"word {position}: {word!r} is listed twice (first as id {self._index[word]})")
            self._index[word] = len(self._words)
            self._words.append(word)

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """The vocabulary of the (training) ``captions``: every token seen at least ``min_count`` times, by
        decreasing count then alphabetically; ``max_size``: keep at most that many ordinary words (the most
        frequent)."""
        if int(min_count) < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        if max_size is not None and int(max_size) < 0:
            raise ValueError(f"max_size must be >= 0 or None, got {max_size}")
        counts: Counter[str] = Counter()
        for caption in captions:
            counts.update(tokenize(caption))
        ranked = sorted((word for word, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
        return cls(ranked if max_size is None else ranked[: int(max_size)])

    # ---- lookups

    @property
    def words(self) -> list[str]:
        """Every token in id order, the four special tokens first (a copy)."""
        return list(self._words)

    def __len__(self) -> int:
        return len(self._words)

    def __contains__(self, word: object) -> bool:
        return word in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self._words == other._words

    def __hash__(self) -> int:
        return hash(tuple(self._words))

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens: {len(self) - len(SPECIAL_TOKENS)} words + 4 special)"

    def word_to_id(self, word: str) -> int:
        """The id of ``word`` (a token as :func:`tokenize` gives it); ``<unk>`` (3) for unknown words."""
        return self._index.get(word, UNK_ID)

    def id_to_word(self, index: int) -> str:
        """The token of id ``index``; ``ValueError`` outside ``0..len - 1``."""
        index = int(index)
        if not 0 <= index < len(self._words):
            raise ValueError(f"token id {index} is outside the vocabulary of {len(self._words)} tokens")
        return self._words[index]

    # ---- captions

    def encode(self, caption: str, add_start_end: bool = True) -> list[int]:
        """The ids of ``caption``'s tokens (unknown words -> ``<unk>``), between ``<start>`` and ``<end>``
        when ``add_start_end``."""
        ids = [self._index.get(token, UNK_ID) for token in tokenize(caption)]
        return [START_ID, *ids, END_ID] if add_start_end else ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """The tokens of ``ids`` joined by single spaces.

        skip_special: drop ``<pad>`` and ``<start>`` and stop at the first ``<end>`` (``<unk>`` is kept as the
        text ``<unk>``); else every id is written, special tokens included. Ids may be ints, or a 1-D array or
        tensor of them.
        """
        out: list[str] = []
        for raw in ids:
            index = int(raw)
            if skip_special and index == END_ID:
                break
            word = self.id_to_word(index)
            if skip_special and index in (PAD_ID, START_ID):
                continue
            out.append(word)
        return " ".join(out)

    # ---- file

    def save(self, path: str | os.PathLike) -> Path:
        """Write the vocabulary file (see the module docstring) atomically; returns its path."""
        document = {
            "format": VOCABULARY_FORMAT,
            "version": _VOCABULARY_VERSION,
            "specials": list(SPECIAL_TOKENS),
            "words": self._words[len(SPECIAL_TOKENS) :],
        }
        blob = (json.dumps(document, ensure_ascii=False, indent=0) + "\n").encode("utf-8")
        return atomic_write(path, lambda f: f.write(blob))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        """Read a vocabulary file written by :meth:`save`.

        Raises ``FileNotFoundError`` naming a missing file, and :class:`VocabularyError` naming the file for
        text that is not UTF-8 JSON (with the line and column), a wrong ``format``/``version``, ``specials``
        that are not ``<pad> <start> <end> <unk>``, or ``words`` that is not a list of unique words.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"vocabulary file not found: {path}")
        limits.check_file_size(path, limits.MAX_JSON_BYTES, "vocabulary json", VocabularyError)
        try:
            document = json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as err:
            raise VocabularyError(f"{path}: not UTF-8 text (byte offset {err.start}: {err.reason})") from None
        except json.JSONDecodeError as err:
            raise VocabularyError(
                f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
                "expected a vocabulary file written by Vocabulary.save"
            ) from None
        if not isinstance(document, dict):
            raise VocabularyError(f"{path}: expected a JSON object, found {type(document).__name__}")
        if document.get("format") != VOCABULARY_FORMAT:
            raise VocabularyError(
                f"{path}: key 'format' must be {VOCABULARY_FORMAT!r}, found {document.get('format')!r}"
            )
        if document.get("version") != _VOCABULARY_VERSION:
            raise VocabularyError(
                f"{path}: key 'version' must be {_VOCABULARY_VERSION}, found {document.get('version')!r}"
            )
        if document.get("specials") != list(SPECIAL_TOKENS):
            raise VocabularyError(
                f"{path}: key 'specials' must be {list(SPECIAL_TOKENS)}, found {document.get('specials')!r}"
            )
        words = document.get("words")
        if not isinstance(words, list):
            raise VocabularyError(f"{path}: key 'words' must be a list of words, found {type(words).__name__}")
        try:
            return cls(words)
        except VocabularyError as err:
            raise VocabularyError(f"{path}: key 'words': {err}") from None


def encode_batch(
    captions: Sequence[str], vocab: Vocabulary, max_len: int | None = None, add_start_end: bool = True
) -> tuple[Tensor, Tensor]:
    """Padded ids of ``captions``: ``(tokens, lengths)``.

    tokens: int64 ``(C, L)`` tensor, row ``i`` holds :meth:`Vocabulary.encode` of caption ``i`` followed by
    ``<pad>`` (0); ``L`` is the longest length (0 for no tokens at all). lengths: int64 ``(C,)``, the number of
    ids before the padding. max_len: keep only the first ``max_len`` ids of every caption (``<start>``
    included), so a cut caption loses its ``<end>``; ``None``: no limit.
    """
    if max_len is not None and int(max_len) < 1:
        raise ValueError(f"max_len must be >= 1 or None, got {max_len}")
    encoded = [vocab.encode(caption, add_start_end) for caption in captions]
    if max_len is not None:
        encoded = [ids[: int(max_len)] for ids in encoded]
    lengths = torch.tensor([len(ids) for ids in encoded], dtype=torch.int64)
    tokens = torch.full((len(encoded), int(lengths.max()) if len(encoded) else 0), PAD_ID, dtype=torch.int64)
    for row, ids in enumerate(encoded):
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return tokens, lengths


# ------------------------------------------------------------------------------------------------------ GloVe


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _glove_dim(line: str, path: Path, number: int) -> int:
    """The vector length of a GloVe file, from its first non-blank line."""
    fields = line.split(" ")
    if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
        raise GloveFormatError(
            f"{path}: line {number}: {line!r} looks like a word2vec header; a GloVe text file has none "
            "(remove the line)"
        )
    dim = len(fields) - 1
    if dim < 1:
        raise GloveFormatError(f"{path}: line {number}: expected a word followed by its vector, found {line[:60]!r}")
    return dim


def _glove_word(line: str, dim: int, path: Path, number: int) -> str:
    """The word of a GloVe line (a word may hold spaces: the vector is the last ``dim`` fields)."""
    spaces = line.count(" ")  # fields - 1, counted without splitting the line
    if spaces == dim:
        return line[: line.index(" ")]
    fields = line.split(" ")
    if spaces < dim or _is_float(fields[-dim - 1]):
        raise GloveFormatError(
            f"{path}: line {number}: expected a word and {dim} values, found {spaces} values "
            "(inconsistent vector dimension)"
        )
    return " ".join(fields[:-dim])  # a word holding spaces


def _glove_vector(line: str, dim: int, word: str, path: Path, number: int) -> np.ndarray:
    """The ``dim`` float32 values of a GloVe line, checked to be finite numbers."""
    values = line.rsplit(" ", dim)[1:]
    try:
        vector = np.array(values, dtype=np.float32)
    except ValueError:
        raise GloveFormatError(
            f"{path}: line {number}: the {dim} values after the word {word!r} must be numbers, "
            f"found {' '.join(values)[:60]!r}"
        ) from None
    if not np.isfinite(vector).all():
        raise GloveFormatError(f"{path}: line {number}: the vector of {word!r} holds non-finite values")
    return vector


def load_glove(
    path: str | os.PathLike,
    vocab: Vocabulary,
    dim: int | None = None,
    missing: Literal["random", "zeros"] = "random",
    seed: int = 0,
) -> tuple[np.ndarray, int]:
    """GloVe vectors of the vocabulary words: ``(embeddings, found)``.

    embeddings: float32 numpy ``(len(vocab), dim)`` (``torch.from_numpy`` it to initialise an embedding),
    row ``i`` the vector of token ``i``. found: how many ordinary words (ids >= 4) got a vector from the file.
    A word takes the vector of the line holding exactly that word; failing that, of the first line whose word
    normalises to it (:func:`normalize_text`: NFKC and lower case, for cased files such as 840B).

    Rows without a vector: ``<pad>`` is all zeros; the others (special tokens and words not in the file) are
    ``missing="random"``: uniform in ``[-0.1, 0.1)`` from ``numpy.random.default_rng(seed)``, drawn for the
    whole ``(len(vocab), dim)`` matrix at once (so the same vocabulary, ``dim`` and ``seed`` always give the
    same rows whichever words were found), or ``missing="zeros"``.

    dim: the vector length every line must have; ``None``: that of the first non-blank line. Blank lines are
    skipped. A word may hold spaces (840B has a few such lines): the vector is the last ``dim`` fields. Only
    the lines of vocabulary words are parsed as numbers, so a huge file is read at about the speed of
    splitting its lines; every line's field count is checked.

    Raises ``FileNotFoundError`` naming a missing file and :class:`GloveFormatError` naming the file and line
    for text that is not UTF-8, a line with the wrong number of values (the dimension found and expected),
    values that are not finite numbers, or a file without vectors.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GloVe file not found: {path} (a glove.*.txt text file; it is not downloaded here)")
    if dim is not None and int(dim) < 1:
        raise ValueError(f"dim must be >= 1 or None, got {dim}")
    if missing not in ("random", "zeros"):
        raise ValueError(f"missing must be 'random' or 'zeros', got {missing!r}")
    wanted = {word: i for i, word in enumerate(vocab.words) if i >= len(SPECIAL_TOKENS)}
    exact: dict[int, np.ndarray] = {}
    folded: dict[int, np.ndarray] = {}
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip()
            except UnicodeDecodeError as err:
                raise GloveFormatError(
                    f"{path}: line {number}: not UTF-8 text ({err.reason} at byte {err.start})"
                ) from None
            if not line:
                continue
            if dim is None:
                dim = _glove_dim(line, path, number)
            word = _glove_word(line, dim, path, number)
            if word in wanted:
                target, index = exact, wanted[word]
            else:
                index = wanted.get(normalize_text(word), -1)
                target = folded
            if index < 0 or index in target:
                continue
            target[index] = _glove_vector(line, dim, word, path, number)
    if dim is None:
        raise GloveFormatError(f"{path}: no vectors in the file (expected lines 'word v1 v2 ... vD')")
    if missing == "random":
        embeddings = np.random.default_rng(seed).uniform(-0.1, 0.1, size=(len(vocab), dim)).astype(np.float32)
    else:
        embeddings = np.zeros((len(vocab), dim), dtype=np.float32)
    embeddings[PAD_ID] = 0.0
    for index, vector in {**folded, **exact}.items():
        embeddings[index] = vector
    return embeddings, len(folded.keys() | exact.keys())
