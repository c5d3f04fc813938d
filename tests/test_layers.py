"""The layers are a contract: ``[tool.importlinter]`` in pyproject.toml (cli > api > methods > engine > data | metrics
> vision > rl > helpers, and no import cycle between the modules of any package), checked with import-linter.
A broken contract fails with import-linter's report: which module imports which, and on which line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUN = (
    "import sys\n"
    "from importlinter.cli import lint_imports\n"
    "sys.exit(lint_imports(config_filenames=('pyproject.toml',), no_cache=True, no_logo=True))\n"
)


def test_import_contracts_are_kept():
    try:
        import importlinter  # noqa: F401
    except ImportError:
        pytest.fail("import-linter is not installed: pip install -e '.[test]'")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    report = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, f"import contracts broken (pyproject.toml [tool.importlinter]):\n{report}"
    assert "0 broken" in done.stdout, done.stdout


def test_registries_import_no_leaf_by_name():
    """The contract sees static imports only; a registry must not reach its leaves by name either (the leaves
    register themselves; rlattention/data/__init__.py and rlattention/methods/__init__.py import the built-in ones)."""
    for path in (ROOT / "rlattention" / "engine" / "registry.py", ROOT / "rlattention" / "data" / "registry.py"):
        text = path.read_text()
        assert "importlib" not in text and "__import__" not in text, f"{path} imports modules by name"
