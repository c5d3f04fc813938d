"""The benchmarks are scripts beside the package (``benchmarks/``), not part of it: their tests import them as the
scripts do, with ``benchmarks/`` on the path (``from speed import run_benchmarks``)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
