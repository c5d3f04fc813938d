"""Run the speed benchmarks by name and write their tables; one summary table when several ran.

``python benchmarks/run_speed.py [NAME ...] --threads 2 [--quick] [--out DIR] [--methods M ...]`` from a source
checkout, or ``rlattention bench`` with the same arguments (a thin entry that imports this package).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from . import anchor_crop, ram_throughput, rarl_inference, reid, retrieval, sensor, sketch_ranks, training
from .common import _table, _timestamp, machine_info

#: benchmark -> the rows it contributes to ``summary.md``: one per comparison, read from its stored result.
SUMMARY_ROWS: dict[str, Callable[[dict], list[dict]]] = {
    "sensor": sensor.summary_rows,
    "ram_throughput": ram_throughput.summary_rows,
    "anchor_crop": anchor_crop.summary_rows,
    "rarl_inference": rarl_inference.summary_rows,
    "sketch_ranks": sketch_ranks.summary_rows,
    "retrieval": retrieval.summary_rows,
    "reid": reid.summary_rows,
    "training": training.summary_rows,
}


def summary_rows(name: str, result: dict) -> list[dict]:
    """The summary rows of benchmark ``name`` from its result dict (``out/<name>.json``), each with ``benchmark``,
    ``case``, ``fast``, ``reference``, ``ratio`` (reference / fast for times, fast / reference for rates: above 1
    when the fast code is faster), ``target`` and ``met`` (None: no target)."""
    if name not in SUMMARY_ROWS:
        raise ValueError(f"no summary rows for benchmark {name!r}; known: {', '.join(SUMMARY_ROWS)}")
    return [{"benchmark": name, **row} for row in SUMMARY_ROWS[name](result)]


def summary_markdown(results: Mapping[str, dict], command: str = "", threads: int | None = None) -> str:
    """One table of every comparison in ``results`` (name -> result dict), the machine and the command."""
    rows = []
    for name, result in results.items():
        for row in summary_rows(name, result):
            ratio = row["ratio"]
            met = "" if row["met"] is None else ("met" if row["met"] else "**not met**")
            rows.append(
                [
                    name,
                    row["case"],
                    row["fast"],
                    row["reference"],
                    "" if ratio is None else f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x",
                    row["target"],
                    met,
                ]
            )
    first = next(iter(results.values()), None)
    m = dict(first["machine"]) if first else machine_info(threads or torch.get_num_threads())
    loads = [r["machine"].get("load_average_1min") for r in results.values() if "machine" in r]
    loads = [x for x in loads if x is not None]
    load = f"{min(loads):g}-{max(loads):g}" if loads else "?"
    quick = any(r.get("settings", {}).get("quick") for r in results.values())
    stamps = [r["timestamp"] for r in results.values() if "timestamp" in r]
    ends = [r.get("finished", r.get("timestamp")) for r in results.values() if "timestamp" in r]
    when = f"{min(stamps)} to {max(ends)}" if stamps else _timestamp()
    return (
        "### summary: fast code vs in-repo references\n\n"
        + _table(["benchmark", "case", "fast", "reference", "ratio", "target", "met"], rows)
        + "\n\nratio: reference time / fast time, or fast rate / reference rate (above 1: the fast code is faster; "
        "for `training`, engine / model only = 1 - engine overhead; for `rarl_inference`, what ten views cost "
        "over one).\n\n"
        f"Machine: {m['cpu']}, {m['cpu_count']} CPUs ({m.get('cpus_available', '?')} available), "
        f"torch threads {m['threads']}, torch {m['torch']}, Python {m['python']}, {m['uname']}; load average "
        f"(1 min) {load} during the run{'; quick mode' if quick else ''}. {when}.\n\n"
        + (f"Command: `{command}`\n" if command else "")
    )


BENCHMARKS: dict[str, tuple[Callable[..., dict], Callable[[dict], str]]] = {
    "sensor": (sensor.bench_sensor, sensor.sensor_markdown),
    "ram_throughput": (ram_throughput.bench_ram_throughput, ram_throughput.ram_markdown),
    "anchor_crop": (anchor_crop.bench_anchor_crop, anchor_crop.anchor_crop_markdown),
    "rarl_inference": (rarl_inference.bench_rarl_inference, rarl_inference.rarl_inference_markdown),
    "sketch_ranks": (sketch_ranks.bench_sketch_ranks, sketch_ranks.sketch_ranks_markdown),
    "retrieval": (retrieval.bench_retrieval, retrieval.retrieval_markdown),
    "reid": (reid.bench_reid, reid.reid_markdown),
    "training": (training.bench_training, training.training_markdown),
}


def run_benchmarks(
    which: list[str],
    out: Path,
    threads: int = 2,
    quick: bool = False,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict]:
    """Run the named benchmarks (all when ``which`` is empty) on ``threads`` torch threads.

    Prints a markdown table per benchmark and writes ``out/<name>.json`` and ``out/<name>.md``; when more than
    one ran, also ``out/summary.md``: one table of every comparison (:func:`summary_markdown`). ``options``:
    extra keyword arguments per benchmark (e.g. ``{"ram_throughput": {"engine_steps": 30}}``). Returns the
    results by name.
    """
    names = list(which) or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(BENCHMARKS)}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    results = {}
    try:
        for name in names:
            run, markdown = BENCHMARKS[name]
            kwargs = dict((options or {}).get(name, {}))
            if name in ("ram_throughput", "training"):
                kwargs.setdefault("threads", threads)
            started = _timestamp()
            body = run(quick=quick, **kwargs)
            result = {"benchmark": name, "timestamp": started, "machine": machine_info(threads), **body}
            result["finished"] = _timestamp()
            md = markdown(result)
            (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
            (out / f"{name}.md").write_text(md)
            print(md, flush=True)
            results[name] = result
        if len(names) > 1:
            command = f"rlattention bench {' '.join(which)}{' ' if which else ''}--threads {threads} --out {out}"
            summary = summary_markdown(results, command + (" --quick" if quick else ""))
            (out / "summary.md").write_text(summary)
            print(summary, flush=True)
    finally:
        torch.set_num_threads(previous)
    return results


def main(argv: list[str] | None = None, prog: str = "run_speed.py") -> int:
    """The command line of ``rlattention bench`` and ``benchmarks/run_speed.py``."""
    p = argparse.ArgumentParser(prog=prog, description="run speed benchmarks (ratios against in-repo references)")
    p.add_argument("which", nargs="*", default=[], help=f"benchmarks to run (default: all): {', '.join(BENCHMARKS)}")
    p.add_argument("--out", default="benchmarks/results", help="folder for the JSON/markdown tables")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="fewer repetitions (smoke)")
    p.add_argument("--methods", nargs="+", metavar="METHOD", help="training: only these methods (default: all)")
    args = p.parse_args(argv)
    options = {"training": {"methods": args.methods}} if args.methods else None
    try:
        run_benchmarks(args.which, Path(args.out), threads=args.threads, quick=args.quick, options=options)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    return 0
