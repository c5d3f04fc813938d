"""``rlattention bench``: a thin entry to the speed benchmarks of a source checkout (``benchmarks/speed/``)."""

from __future__ import annotations

import sys
from pathlib import Path


def command(args) -> int:
    """A thin entry: the speed benchmarks live beside the package, in a source checkout's benchmarks/speed/."""
    folder = Path(__file__).resolve().parents[2] / "benchmarks"
    if not (folder / "speed" / "runner.py").is_file():
        raise FileNotFoundError(
            f"the speed benchmarks are not part of the installed package (no {folder / 'speed'}): run rlattention "
            "bench from a source checkout of the repository"
        )
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    from speed import run_benchmarks

    options = {"training": {"methods": args.methods}} if args.methods else None
    run_benchmarks(args.which, Path(args.out), threads=args.threads, quick=args.quick, options=options)
    return 0
