"""Fixtures shared by the whole test suite: where the real data lives, and skipping when it is absent."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# matplotlib writes its font cache under ~/.cache (or ~/.config) unless told otherwise: the suite writes nothing
# outside temporary folders and the run folders it creates
if "MPLCONFIGDIR" not in os.environ:
    os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="rlattention-tests-mpl-")
    atexit.register(shutil.rmtree, os.environ["MPLCONFIGDIR"], ignore_errors=True)

# caches (renders, frozen features) default to ~/.cache/rlattention: the suite keeps them in a temporary folder
if "RLATTENTION_CACHE" not in os.environ:
    os.environ["RLATTENTION_CACHE"] = tempfile.mkdtemp(prefix="rlattention-tests-cache-")
    atexit.register(shutil.rmtree, os.environ["RLATTENTION_CACHE"], ignore_errors=True)

# pytest-xdist runs the suite in 2 worker processes (pyproject.toml): one torch thread each, and for the trainings
# they start, so that the workers do not oversubscribe the cores between them
if os.environ.get("PYTEST_XDIST_WORKER") and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

#: ``../shared/data`` next to the repository (the repository root is ``parents[1]`` of this file).
DEFAULT_SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def require_path(path: Path, what: str) -> Path:
    """Return ``path`` if it exists, else skip the calling test with a reason naming ``what`` and ``path``."""
    if not path.exists():
        pytest.skip(f"{what} not found at {path} (set RLATTENTION_DATA to the shared data folder)")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared real-data folder: ``$RLATTENTION_DATA`` if set, else ``../shared/data`` beside the repo."""
    env = os.environ.get("RLATTENTION_DATA")
    return Path(env).expanduser() if env else DEFAULT_SHARED_DATA


@pytest.fixture(scope="session")
def require_data(shared_data: Path) -> Callable[[str], Path]:
    """``require_data("mnist")``: ``shared_data / "mnist"``; skips the test when that folder is absent."""

    def require(relative: str) -> Path:
        return require_path(shared_data / relative, f"shared data folder {relative!r}")

    return require


@pytest.fixture(scope="session")
def benchmark_module() -> Iterator[Callable[[str], object]]:
    """``benchmark_module("dcpg_study")``: a script of ``benchmarks/`` imported as it runs, with ``benchmarks/`` on
    ``sys.path`` (the study scripts import their sibling ``study.py``) for the rest of the session."""
    path = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, path)
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(path)
