"""The loggers of a run folder: ``logs/metrics.csv`` (Lightning's CSV logger, every row written as it is logged and
appended to on resume) and ``tb/`` (TensorBoard)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from lightning.fabric.loggers import CSVLogger, TensorBoardLogger


def _csv_logger(run_dir: Path, resume: bool) -> CSVLogger:
    """Lightning's CSV logger, writing every row as it is logged (its default keeps up to 100 in memory, which a
    killed run loses); on resume it appends to the run's metrics.csv instead of replacing it."""
    logger = CSVLogger(run_dir, name="logs", version="", flush_logs_every_n_steps=1)
    csv_path = run_dir / "logs" / "metrics.csv"
    if resume and csv_path.is_file():
        aside = run_dir / ".metrics.csv.previous"
        os.replace(csv_path, aside)
        writer = logger.experiment  # created now, while there is no metrics.csv for it to delete
        os.replace(aside, csv_path)
        with open(csv_path, newline="") as f:
            header = next(csv.reader(f), [])
        writer.metrics_keys = sorted(header)  # append under the existing columns
    return logger


def make_loggers(run_dir: Path | None, resume: bool = False) -> list:
    """The loggers of a run written to ``run_dir`` (none without one): CSV, then TensorBoard."""
    if run_dir is None:
        return []
    return [_csv_logger(run_dir, resume), TensorBoardLogger(run_dir, name="tb", version="")]


def truncate_metrics_csv(path: Path, step: int, final_prefix: str = "") -> int:
    """Drop the rows of ``path`` that a run killed after its checkpoint at ``step`` logged after that checkpoint,
    and that the resumed run logs again: every row of a later step, and the final evaluation's rows (keys starting
    with ``final_prefix``, e.g. ``test/``) at ``step`` itself. Atomic. Returns how many rows were dropped; a
    missing file drops none."""
    if not path.is_file():
        return 0
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames or [], list(reader)

    def logged_after(row: dict) -> bool:
        try:
            at = int(float(row.get("step") or -1))
        except ValueError:  # not a number: keep it, it is not ours to judge
            return False
        final = bool(final_prefix) and any(k.startswith(final_prefix) and v not in ("", None) for k, v in row.items())
        return at > step or (at == step and final)

    kept = [r for r in rows if not logged_after(r)]
    if len(kept) == len(rows):
        return 0
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(kept)
    os.replace(tmp, path)
    return len(rows) - len(kept)
