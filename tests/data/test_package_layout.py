"""The data package's layout holds: readers never import a generator, and the shared modules at the top of
``rlattention/data/`` import neither (only ``__init__`` does, to register the built-in datasets)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "rlattention" / "data"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (top-level and lazy imports alike), as dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


@pytest.mark.parametrize("path", sorted((DATA / "readers").glob("*.py")), ids=lambda p: p.name)
def test_readers_import_no_generator(path: Path) -> None:
    bad = sorted(m for m in _imports(path) if m.startswith("rlattention.data.synthetic"))
    assert not bad, f"{path.name} (a reader) imports {bad}: move what both need up to rlattention/data/"


@pytest.mark.parametrize("path", sorted(p for p in DATA.glob("*.py") if p.name != "__init__.py"), ids=lambda p: p.name)
def test_shared_modules_import_no_dataset(path: Path) -> None:
    bad = sorted(m for m in _imports(path) if m.startswith(("rlattention.data.readers", "rlattention.data.synthetic")))
    assert not bad, f"rlattention/data/{path.name} (shared by every dataset) imports {bad}"
