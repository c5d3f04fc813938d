"""Loading pickled dataset files without letting them run code.

Several datasets are distributed as pickles (CIFAR-10 batches, the QMUL sketch coordinate files). Unpickling
calls whatever global a file names (``os.system``, ``builtins.eval``, ...), so a plain ``pickle.load`` of a
tampered file runs arbitrary code. :func:`load_restricted_pickle` resolves only the globals needed to rebuild
numpy arrays (:data:`ALLOWED_GLOBALS`: ``_reconstruct``, ``ndarray`` and ``dtype`` for protocols 0-4, and
``_frombuffer`` for numpy's protocol-5 pickles, each under its numpy 1.x and numpy 2 module name; none of them
can run code) and refuses any other *before* calling it, raising :class:`UnsafePickleError` with the file and
the refused global named. Dicts, lists, tuples, strings, bytes, numbers, booleans and ``None`` need no global
and load as usual.

``encoding`` is passed to :class:`pickle.Unpickler`: ``"bytes"`` keeps the 8-bit strings of a Python 2 pickle
as ``bytes`` (CIFAR-10); the default ``"ASCII"`` suits Python 3 pickles (protocol 3 and up store ``str`` as
unicode), such as the QMUL coordinate files.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

try:  # numpy >= 2 keeps the implementation in numpy._core; numpy.core is a deprecated alias there
    from numpy._core.multiarray import _reconstruct
    from numpy._core.numeric import _frombuffer
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct
    from numpy.core.numeric import _frombuffer

__all__ = ["ALLOWED_GLOBALS", "PickleReadError", "UnsafePickleError", "load_restricted_pickle"]

#: (module, name) -> object: the only globals the restricted unpickler resolves. The objects are imported
#: here once, so that a pickle naming the deprecated ``numpy.core`` alias does not import it.
ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,  # pickles written by numpy 1.x
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,  # pickles written by numpy >= 2
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,  # protocol >= 5 pickles (out-of-band buffers), numpy 1.x
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,  # the same, numpy >= 2
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class PickleReadError(ValueError):
    """A pickle that cannot be read (truncated, corrupt, not a pickle); the message names the file."""


class UnsafePickleError(PickleReadError):
    """A pickle that references a global other than the numpy array reconstruction ones (:data:`ALLOWED_GLOBALS`);
    the message names the file and the refused global."""


class _RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`ALLOWED_GLOBALS` and raises :class:`UnsafePickleError`
    naming the file for anything else."""

    def __init__(self, file: io.BufferedIOBase, path: Path, what: str, encoding: str) -> None:
        super().__init__(file, encoding=encoding)
        self._path = path
        self._what = what

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            allowed = ", ".join(f"{m}.{n}" for m, n in ALLOWED_GLOBALS)
            raise UnsafePickleError(
                f"{self._path}: refused global {module}.{name}: a {self._what} holds only dicts, lists, strings, "
                f"numbers and numpy arrays (allowed globals: {allowed}); the file is not a genuine {self._what}"
            ) from None


def load_restricted_pickle(path: str | os.PathLike, what: str, encoding: str = "ASCII", *, hint: str = "") -> Any:
    """Load one pickle file, resolving only the numpy array globals of :data:`ALLOWED_GLOBALS`.

    what: what the file should be, for messages (e.g. ``"CIFAR batch"``, ``"QMUL coordinate pickle"``).
    encoding: how Python 2 8-bit strings are decoded (see :class:`pickle.Unpickler`; ``"bytes"`` keeps them).
    hint: appended to the message of a :class:`PickleReadError` (e.g. how to get an intact copy).

    Returns the unpickled object. Raises ``FileNotFoundError`` naming the file if it is missing,
    :class:`UnsafePickleError` naming the file and the global for a refused global (nothing it names is
    called), and :class:`PickleReadError` naming the file for a truncated or corrupt stream.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    with path.open("rb") as f:
        try:
            return _RestrictedUnpickler(f, path, what, encoding).load()
        except UnsafePickleError:
            raise
        except Exception as err:  # EOFError, UnpicklingError, ValueError, ... from a damaged stream
            size = path.stat().st_size
            raise PickleReadError(
                f"{path}: not a readable pickle ({type(err).__name__}: {err}; {size} bytes); the file may be "
                f"truncated or corrupt{': ' + hint if hint else ''}"
            ) from err
