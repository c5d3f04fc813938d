"""The engine stays a house a newcomer can find their way in: no module over 600 lines, no function over 80."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "rlattention" / "engine"
MODULES = sorted(ENGINE.glob("*.py"))
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_engine_modules_and_functions_are_short(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name}: {len(text.splitlines())} lines"
    long = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                long.append(f"{node.name} ({node.end_lineno - start + 1} lines)")
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
