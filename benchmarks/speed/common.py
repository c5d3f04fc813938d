"""Shared by the speed benchmarks: the machine record, interleaved timing, markdown tables, the cells of
the summary rows, and quiet engine runs (``fit`` with its logged ``train/images_per_s`` windows).

Every benchmark times the fast code and a simple reference *in the same run* (interleaved, so background load
hits both alike, except the engine runs of ``ram_throughput`` and ``training``: a whole ``fit`` follows the
model-only timing, so a load change between the two shows as engine overhead) and reports a ratio next to the
absolute times. Timing: :func:`time.perf_counter`, warm-up
calls first, then the median of the repetitions. Each result records the machine (CPU, cores, torch version,
threads, load average) and a time stamp, and is written to ``<out>/<name>.json`` and ``<out>/<name>.md``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

#: the source checkout these benchmarks belong to (``benchmarks/speed/`` lies two levels below it)
REPO = Path(__file__).resolve().parents[2]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int) -> dict[str, Any]:
    """Where and with what a benchmark ran."""
    uname = platform.uname()
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "processor": platform.processor(),
        "uname": f"{uname.system} {uname.release} {uname.machine}",
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "torch_num_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_available"] = len(os.sched_getaffinity(0))
    if hasattr(os, "getloadavg"):
        info["load_average_1min"] = round(os.getloadavg()[0], 2)
    return info


def _timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]], repeat: int, warmup: int, settle: bool = False
) -> dict[str, float]:
    """Median wall time in seconds of each function; the functions take turns, so load affects all alike.

    ``settle``: call each function once untimed right before its timed call. A sub-millisecond call timed right
    after a long one of many small ops (a per-item Python loop) is slowed by what that left behind (measured:
    0.90 vs 0.69 ms for the same crop call); settling removes that order effect."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            if settle:
                fn()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _machine_line(r: dict) -> str:
    m = r["machine"]
    return (
        f"{r['timestamp']}; {m['cpu']} ({m['cpu_count']} CPUs), torch {m['torch']}, {m['threads']} threads, "
        f"load average {m.get('load_average_1min', '?')}{', quick' if r['settings'].get('quick') else ''}"
    )


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _rate(v: float, unit: str) -> str:
    return f"{v:,.0f} {unit}/s" if abs(v) >= 100 else f"{v:.3g} {unit}/s"


def _row(
    case: str, fast: str, reference: str, ratio: float | None, target: str = "", met: bool | None = None
) -> dict[str, Any]:
    return {"case": case, "fast": fast, "reference": reference, "ratio": ratio, "target": target, "met": met}


def mnist_dir() -> Path | None:
    """``$RLATTENTION_DATA/mnist`` when set, else ``../shared/data/mnist`` beside the repository; None if absent."""
    env = os.environ.get("RLATTENTION_DATA")
    root = Path(env).expanduser() if env else REPO.parent / "shared" / "data"
    path = root / "mnist"
    return path if path.is_dir() else None


def _quiet_fit(cfg, data_dir: str | None = None, splits=None) -> dict:
    """:func:`rlattention.engine.trainer.fit` with Lightning's info messages and the final printout silenced."""
    from rlattention.engine.trainer import fit

    quiet = [logging.getLogger(n) for n in ("lightning.fabric", "lightning_fabric", "lightning")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return fit(cfg, data_dir=data_dir, splits=splits)
    finally:
        for lg, level in zip(quiet, levels, strict=True):
            lg.setLevel(level)


def engine_images_per_s(cfg, data_dir: str | None = None, splits=None) -> list[float]:
    """Run :func:`fit` on ``cfg`` quietly and return the ``train/images_per_s`` windows it logged to
    ``<run_dir>/logs/metrics.csv`` (what ``ram_throughput`` and ``training`` measure the engine by)."""
    report = _quiet_fit(cfg, data_dir=data_dir, splits=splits)
    windows = []
    with open(Path(report["run_dir"]) / "logs" / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            value = row.get("train/images_per_s", "")
            if value not in ("", None):
                windows.append(float(value))
    return windows


def engine_rate(windows: list[float]) -> tuple[float, int]:
    """Median of the engine's windows without the first (it holds the warm-up); NaN when there are none.
    Returns ``(images per second, windows used)``."""
    used = windows[1:] if len(windows) > 1 else windows
    return (statistics.median(used) if used else float("nan")), len(used)


def _trainer_section(threads: int, max_steps: int, log_every: int, batch: int, workdir: Path, name: str) -> dict:
    """The ``trainer:`` settings of a timed engine run: ``max_steps`` steps, no validation before the end, no
    progress bar, in ``workdir``."""
    return {
        "epochs": 1000,  # max_steps decides
        "max_steps": max_steps,
        "batch_size": batch,
        "accelerator": "cpu",
        "devices": 1,
        "num_threads": threads,
        "log_every": log_every,
        "val_every": 1_000_000,  # only the validation at the end
        "checkpoint_every": 0,
        "progress": False,
        "compile": False,
        "out_dir": str(workdir),
        "run_name": name,
    }
