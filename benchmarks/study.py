"""Run a study: rows (a config plus overrides) x seeds, each a separate ``rlattention fit`` process, recorded as it
finishes, then ``summary.json`` (schema: ../shared/RESULTS.md) and ``summary.md`` from every recorded run.

A study spans sessions: each finished run appends one line to ``<out>/runs.jsonl`` (row, seed, command, test
metrics, times) and a run already recorded there is not run again, so the same command continues where a killed
or interrupted study stopped, and rows run in separate sessions merge into one summary. A run killed half-way
(the session ended) is continued from its last checkpoint by the next study command, exactly, when its config is
still the row's; otherwise its folder is renamed aside (see :func:`run_one`). Model selection is the
engine's: the best validation checkpoint; the test split is evaluated once, by ``fit``, on that checkpoint.

A study module defines its rows and calls :func:`main`::

    ROWS = [Row("scratch", "configs/darp_triplet_chairv2.yaml", ["data.completion_steps=1"]), ...]
    if __name__ == "__main__":
        raise SystemExit(main(STUDY, ROWS, METRICS, description="...", argv=None))
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Row:
    name: str  # the row name of the issue, exactly (variants: any other name)
    config: str  # configs/<...>.yaml
    overrides: list[str] = field(default_factory=list)  # "{seed}" and "{work}" (the runs folder) are filled in
    note: str = ""  # what the variant is, one line for the markdown table
    issue_row: bool = True  # a row the issue names (False: a variant we tried)
    selection: str = ""  # how this row's checkpoint is chosen, when not the study's default (best validation)
    # a row chosen on validation among variant rows (e.g. the same method at two learning rates): it runs nothing
    # itself; its figures are those of the candidate with the best mean of ``report[select_key]`` over its seeds
    candidates: tuple[str, ...] = ()
    select_key: str = ""
    # with candidates: the seeds on which they are compared; the other seeds run only for the chosen candidate
    # (empty: every candidate runs every seed, compared on the seeds they share)
    select_seeds: tuple[int, ...] = ()
    # (study, row): this row is that row of another study, the same config key by key; its runs are that study's
    # records of the same seed (read from ``<out>/../<study>/runs.jsonl``), copied here, never trained twice
    same_as: tuple[str, str] = ()
    # a run recorded at a smaller epoch cap than the row's is continued to the row's cap (see :func:`extend_one`)
    # instead of being kept as it is; only for rows whose training does not depend on the cap (checked)
    extendable: bool = False


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux) and machine type, else the machine type alone: times, and the
    exact weights a seed gives, differ between CPUs."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f", {platform.machine()}"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def append_record(log: Path, rec: dict) -> None:
    """Append one finished run's record to ``log`` (a study's runs.jsonl), stamped with the CPU it ran on; a record
    that already names one (``None``: not recorded) keeps it, as a run copied from another study's records does."""
    with log.open("a") as f:
        f.write(json.dumps(rec if "cpu" in rec else {**rec, "cpu": cpu_model()}) + "\n")


def machine(records: Sequence[dict] = ()) -> str:
    """The torch threads the recorded runs used (``trainer.num_threads`` of their commands), the machine writing the
    summary (named as such: a summary is often rewritten elsewhere than its runs ran) and the CPUs the runs ran on (a
    record's ``cpu``; records written before 2026-11-28 have none)."""
    import torch

    threads = sorted({part.split("=", 1)[1] for r in records for part in r["command"].split()
                      if part.startswith("trainer.num_threads=")})  # fmt: skip
    used = "/".join(threads) if threads else os.environ.get("STUDY_THREADS", "2")
    here = f"{os.cpu_count()} cores, {cpu_model()}"  # the machine writing the summary, not necessarily the runs'
    line = f"{used} torch thread(s) per run; this summary written on {here}, torch {torch.__version__}"
    cpus: dict[str, int] = {}
    for r in records:
        cpus[r.get("cpu") or "not recorded"] = cpus.get(r.get("cpu") or "not recorded", 0) + 1
    if any(c != "not recorded" for c in cpus):
        line += "; the runs' CPUs: " + ", ".join(f"{c} ({n} run{'s' * (n > 1)})" for c, n in cpus.items())
    return line


def _records(path: Path) -> list[dict]:
    """The records of a JSON-lines file (empty when there is none); a line that is not a JSON object is an error
    naming the file and the line."""
    if not path.is_file():
        return []
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not a JSON record ({e.msg}): {line[:120]!r}") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{number}: a record must be a JSON object, got {line[:120]!r}")
            out.append(rec)
    return out


#: the sketch-retrieval metrics (darp) that reports held as fractions before they said their units
SKETCH_FRACTIONS = ("auir", "percentile", *(f"acc@{k}{s}" for k in (1, 5, 10) for s in ("", "_steps")))


def in_percent(report: dict, fraction_keys: Sequence[str]) -> dict:
    """``report`` (a ``report.json``) with its metrics in percent, as every report written since it says
    ``"units": "percent"`` holds them. A report without ``units`` was written when some methods reported fractions
    in [0, 1]: its ``fraction_keys`` in every split section (``val``, ``test``) and its ``best_val_<key>`` come
    back times 100. A new dict: the record on disk is never rewritten."""
    if report.get("units") == "percent" or not fraction_keys:
        return report
    out = dict(report)
    for section in ("val", "test"):
        if isinstance(out.get(section), dict):
            out[section] = {k: 100.0 * v if k in fraction_keys else v for k, v in out[section].items()}
    for key in fraction_keys:
        if f"best_val_{key}" in out and out[f"best_val_{key}"] is not None:
            out[f"best_val_{key}"] = 100.0 * out[f"best_val_{key}"]
    out["units"] = "percent"
    return out


def validation_curves(run_dir: str | Path, prefix: str = "val/") -> dict[str, list[float]]:
    """``{key: values}`` of every metric of a run whose name starts with ``prefix``, one value after each validation
    (one per epoch, in step order; the last value of a step counts), from ``logs/metrics.csv`` or, while the run
    trains, its TensorBoard events; empty when the run folder holds none. Image counts (``*/count``) are left out."""
    import csv

    run_dir = Path(run_dir)
    by_key: dict[str, dict[int, float]] = {}
    path = run_dir / "logs" / "metrics.csv"
    if path.is_file():
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                step = (row.get("step") or "").strip()
                for key, value in row.items():
                    if step and key and key.startswith(prefix) and (value or "").strip():
                        by_key.setdefault(key, {})[int(float(step))] = float(value)
    if not by_key and (run_dir / "tb").is_dir():
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
        events.Reload()
        for key in events.Tags().get("scalars", []):
            if key.startswith(prefix):
                by_key[key] = {int(e.step): float(e.value) for e in events.Scalars(key)}
    return {key: [v[s] for s in sorted(v)] for key, v in by_key.items() if not key.endswith("/count")}


def validation_curve(run_dir: str | Path, key: str) -> list[float]:
    """``key`` after each validation of a run (see :func:`validation_curves`); empty when there is none."""
    return validation_curves(run_dir, prefix=key).get(key, [])


def _settled(report: dict) -> dict:
    """A report without what differs between two runs of the same training (times)."""
    return {k: v for k, v in report.items() if not k.endswith("_seconds")}


def folder_curves(record: dict) -> dict[str, list[float]]:
    """The validation curves in a record's run folder (from its command) if that folder holds the recorded run: its
    ``report.json`` equals the record's report apart from times (a run retrained there that did not reproduce, or
    another run under the same name, does not lend its curves); empty otherwise."""
    try:
        run_dir = run_dir_of(record["command"])
    except KeyError:  # a command without trainer.out_dir / run_name: no run folder
        return {}
    try:
        have = json.loads((run_dir / "report.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    if not isinstance(have, dict) or _settled(have) != _settled(record.get("report") or {}):
        return {}
    return validation_curves(run_dir)


def recorded_curve(record: dict, key: str) -> list[float]:
    """A recorded run's validation curve of ``key``: the one its record keeps (``validation_curves``, written by
    :func:`run_one`, or merged from ``curves.jsonl`` by :func:`with_kept_curves`), else its run folder's when that
    holds the recorded run (:func:`folder_curves`); empty when neither has it."""
    kept = record.get("validation_curves")
    return list(kept.get(key, [])) if kept else folder_curves(record).get(key, [])


def _curve_key(record: dict) -> str:
    """Which record a kept curve belongs to: its command and its test figures."""
    return json.dumps([record.get("command"), (record.get("report") or {}).get("test")], sort_keys=True)


def _kept_key(line: dict) -> str:
    """:func:`_curve_key` of the record a line of curves.jsonl belongs to."""
    return _curve_key({"command": line.get("command"), "report": {"test": line.get("test")}})


def keep_validation_curves(log: Path) -> int:
    """Keep the validation curves of the records of ``log`` (a study's runs.jsonl) written before records held them,
    while their run folders still hold those runs (:func:`folder_curves`), in ``curves.jsonl`` beside it: one line
    per record (its command, its test figures, its curves), only ever appended to. ``runs.jsonl`` itself is never
    rewritten (a study may be appending to it). Returns how many records gained their curves."""
    side = log.with_name("curves.jsonl")
    have = {_kept_key(c) for c in _records(side)}
    new = []
    for rec in _records(log):
        if rec.get("validation_curves") or "command" not in rec or _curve_key(rec) in have:
            continue
        curves = folder_curves(rec)
        if curves:
            new.append(
                {"command": rec["command"], "test": rec.get("report", {}).get("test"), "validation_curves": curves}
            )
            have.add(_curve_key(rec))
    if new:
        with side.open("a") as f:
            f.write("".join(json.dumps(c) + "\n" for c in new))
    return len(new)


def with_kept_curves(records: list[dict], log: Path) -> list[dict]:
    """The records of ``log`` with the curves that ``curves.jsonl`` beside it keeps for them merged in."""
    kept = {_kept_key(c): c["validation_curves"] for c in _records(log.with_name("curves.jsonl"))}
    return [
        {**r, "validation_curves": kept[_curve_key(r)]}
        if not r.get("validation_curves") and _curve_key(r) in kept
        else r
        for r in records
    ]


def run_dir_of(command: str) -> Path:
    """The run folder of a recorded ``rlattention fit`` command (its trainer.out_dir / trainer.run_name)."""
    opts = dict(part.split("=", 1) for part in shlex.split(command) if part.startswith("trainer.") and "=" in part)
    out = Path(opts["trainer.out_dir"])
    return (out if out.is_absolute() else ROOT / out) / opts["trainer.run_name"]


def checkpoint_of(record: dict) -> Path:
    """The best-validation checkpoint of a recorded run (its folder read off the record's command):
    ``checkpoints/best.ckpt``, or ``checkpoints/best.cap<N>.ckpt`` once the run has been extended beyond its N epochs
    (:func:`extend_one`: the folder then keeps the recorded run's report as ``report.cap<N>.json``)."""
    run_dir = run_dir_of(record["command"])
    epochs = (record.get("report") or {}).get("epochs")
    kept = run_dir / f"report.cap{epochs}.json"
    try:
        extended = _settled(json.loads(kept.read_text())) == _settled(record.get("report") or {})
    except (OSError, ValueError, AttributeError):
        extended = False
    return run_dir / "checkpoints" / (f"best.cap{epochs}.ckpt" if extended else "best.ckpt")


#: keys a study may pass differently when it continues a run (how it is run, not what is trained)
RESUME_FREE_KEYS = ("trainer.progress", "trainer.num_threads")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resolved_config(config: str, overrides: Sequence[str], data_dir: str | None = None) -> dict:
    """The flat config (``section.key`` -> value) that ``config`` (relative to the repository) and ``overrides``
    build, its ``data.data_dir`` the real path of ``data_dir`` (``--data-dir``, relative to the repository, where
    the runs start) or of the config's own."""
    from rlattention.data.registry import resolve_data_dir
    from rlattention.engine.config import load_config, to_dict

    cfg = load_config(ROOT / config, list(overrides))
    flat = _flat(to_dict(cfg))
    used = resolve_data_dir(data_dir or cfg.data.data_dir)
    if used is not None:
        flat["data.data_dir"] = os.path.realpath(ROOT / used)
    return flat


def config_differences(have: dict, want: dict, have_is: str, want_is: str) -> str:
    """The keys (but :data:`RESUME_FREE_KEYS`) on which two flat configs differ, the first four shown with both
    values; empty when they agree."""
    differ = sorted(k for k in set(want) | set(have) if k not in RESUME_FREE_KEYS and want.get(k) != have.get(k))
    shown = ", ".join(f"{k}: {have.get(k)!r} {have_is}, {want.get(k)!r} {want_is}" for k in differ[:4])
    return shown + (", ..." if len(differ) > 4 else "")


def data_dir_of(command: str) -> str | None:
    """The ``--data-dir`` of a recorded ``rlattention fit`` command, None without one."""
    parts = shlex.split(command)
    return parts[parts.index("--data-dir") + 1] if "--data-dir" in parts else None


def shared_record(row: Row, seed: int, data_dir: str | None, out: Path, extra: Sequence[str]) -> dict | None:
    """The record of ``row`` (a row with ``same_as``) for ``seed``: the other study's record of that row and seed,
    when it has one, as this row's (``reused_from`` names where it comes from); None while it has none. A
    :class:`ValueError` naming the differing keys when the two rows no longer build the same config."""
    study, other = row.same_as
    source = out.parent / study / "runs.jsonl"
    theirs = [r for r in _records(source) if r["row"] == other and r["seed"] == seed]
    if not theirs:
        return None
    rec = theirs[-1]
    mine = [o.format(seed=seed, work="") for o in row.overrides] + list(extra)
    want = resolved_config(row.config, mine, data_dir)
    have = resolved_config(rec["config"], rec["overrides"], data_dir_of(rec["command"]))
    differ = config_differences(have, want, f"in {study}'s {other}", f"in {row.name}")
    if differ:
        raise ValueError(
            f"row {row.name} is declared the same as {study}'s {other} ({source}), but its config differs: {differ}; "
            "fix the row's definition (it is not run twice)"
        )
    return {"cpu": None, **rec, "row": row.name, "reused_from": {"study": study, "row": other, "runs": str(source)}}


def resume_state(
    run_dir: Path, config: str, overrides: Sequence[str], data_dir: str | None = None
) -> tuple[dict | None, str]:
    """Whether the folder ``run_dir`` that a killed study left can be continued: ``(its checkpoint's progress, "")``
    when it has ``checkpoints/last.ckpt``, no ``report.json`` and a checkpoint config equal, key by key (but
    :data:`RESUME_FREE_KEYS`), to the one ``config``, ``overrides`` and ``data_dir`` (``--data-dir``, relative to the
    repository, where the runs start; the run records it as an absolute path) build now; else ``(None, why not)``. A
    :class:`~rlattention.engine.rundir.RunFolderBusy` when another process holds the folder's lock (it still
    trains: the study stops rather than move a live run aside)."""
    from rlattention.engine.checkpoint import CheckpointError, load_checkpoint_file
    from rlattention.engine.rundir import lock_run_dir

    lock = lock_run_dir(run_dir, record_pid=False)  # RunFolderBusy while a process trains in it
    lock.release()
    if (run_dir / "report.json").exists():
        return None, "it has a report.json but no record in runs.jsonl"
    ckpt_path = run_dir / "checkpoints" / "last.ckpt"
    if not ckpt_path.is_file():
        return None, "it has no checkpoints/last.ckpt (killed before its first save)"
    try:
        ckpt = load_checkpoint_file(ckpt_path)
    except CheckpointError as e:
        return None, str(e)
    from rlattention.engine.config import ConfigError, from_dict, to_dict

    want = resolved_config(config, overrides, data_dir)
    try:  # through today's schema: a key added since the checkpoint was written reads as its default
        have = _flat(to_dict(from_dict(ckpt["config"], source=f"{ckpt_path} (config)")))
    except ConfigError as e:
        return None, f"its config no longer fits the schema ({e})"
    if want.get("data.data_dir"):  # set (resolved) when a data folder is used: one folder however it is spelled
        have["data.data_dir"] = os.path.realpath(ROOT / str(have.get("data.data_dir")))
    differ = config_differences(have, want, "in the checkpoint", "now")
    if differ:
        return None, f"its config differs from the row's ({differ})"
    progress = ckpt.get("progress")
    if not isinstance(progress, dict):
        return None, f"{ckpt_path} holds no training progress"
    return progress, ""


def fit_argv(row: Row, seed: int, data_dir: str | None, work: Path, threads: int, extra: Sequence[str]) -> list[str]:
    """The ``rlattention fit`` command of a fresh run of ``row`` and ``seed`` in ``work/<row>_s<seed>``; its last two
    arguments (progress, threads) are how it runs, the rest what it trains."""
    overrides = [o.format(seed=seed, work=work) for o in row.overrides]  # e.g. {work}/triplet_s{seed}/phase1...
    return [
        "rlattention", "fit", "--config", row.config,
        *(["--data-dir", data_dir] if data_dir else []),
        *overrides, *extra,
        f"trainer.seed={seed}", f"trainer.out_dir={work}", f"trainer.run_name={row.name}_s{seed}",
        "trainer.progress=false", f"trainer.num_threads={threads}",
    ]  # fmt: skip


def _fit_logged(argv: Sequence[str], log_path: Path, mode: str, run_dir: Path) -> dict:
    """Run ``rlattention fit`` (``argv``) with its output in ``log_path`` (opened with ``mode``: ``"x"`` a new log,
    ``"a"`` one that goes on), under a first line with the command; returns the run's ``report.json``, or a
    ``RuntimeError`` naming the command and the log."""
    with log_path.open(mode) as f:
        f.write(f"# {shlex.join(argv)}\n")
        f.flush()
        code = subprocess.run(list(argv), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, text=True).returncode
    if code != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({code}); see {log_path}")
    return json.loads((run_dir / "report.json").read_text())


def run_one(row: Row, seed: int, data_dir: str | None, work: Path, threads: int, extra: Sequence[str]) -> dict:
    """``rlattention fit`` of one row and seed in ``work/<row>_s<seed>``; returns its record.

    A folder that a killed study left there is continued (``rlattention fit --resume``, exact: the same batches
    and optimiser state) when :func:`resume_state` allows it, and the record says so (``resumed``: the step and
    epoch it continued from, its command); otherwise it is renamed aside, never overwritten or written into.
    ``command`` is always the fresh run's command, which reproduces the run; ``wall_seconds`` is this process's;
    ``validation_curves`` every ``val/*`` metric by epoch (:func:`validation_curves`)."""
    run_name = f"{row.name}_s{seed}"
    run_dir = work / run_name
    overrides = [o.format(seed=seed, work=work) for o in row.overrides]  # e.g. {work}/triplet_s{seed}/phase1...
    argv = fit_argv(row, seed, data_dir, work, threads, extra)
    resumed, run_argv = None, argv
    if run_dir.exists():
        fixed = argv[6 if data_dir else 4 : -2]  # the overrides that say what is trained
        progress, why_not = resume_state(run_dir, row.config, fixed, data_dir)
        if progress is None:  # keep it aside, never overwrite it
            aside = work / f"{run_name}.incomplete-{int(time.time())}"
            print(f"[study] {run_dir} cannot be continued: {why_not}; renamed to {aside.name}", flush=True)
            run_dir.rename(aside)
            if (work / f"{run_name}.log").exists():  # its log goes with it
                (work / f"{run_name}.log").rename(work / f"{aside.name}.log")
        else:
            run_argv = [
                "rlattention", "fit", "--resume", str(run_dir),
                *(["--data-dir", data_dir] if data_dir else []),
                "trainer.progress=false", f"trainer.num_threads={threads}",
            ]  # fmt: skip
            resumed = {"step": progress.get("step"), "epoch": progress.get("epoch"), "command": shlex.join(run_argv)}
            print(f"[study] {run_dir}: continuing from step {resumed['step']} (epoch {resumed['epoch']})", flush=True)
    t0 = time.time()
    log_path = work / f"{run_name}.log"  # written as the run goes, so a killed run leaves its log
    if not resumed and log_path.exists():  # the log of an attempt that left no run folder (e.g. a config error)
        log_path.rename(work / f"{run_name}.earlier-{int(time.time())}.log")
    report = _fit_logged(run_argv, log_path, "a" if resumed else "x", run_dir)  # a continued run's log goes on
    return {
        "row": row.name,
        "seed": seed,
        "config": row.config,
        "overrides": overrides + list(extra),
        "command": shlex.join(argv),
        **({"resumed": resumed} if resumed else {}),
        "report": report,
        "wall_seconds": round(time.time() - t0, 1),
        "validation_curves": _curves_or_none(run_dir),  # kept here: a summary must not need the run folder
    }


def _curves_or_none(run_dir: Path) -> dict[str, list[float]]:
    """:func:`validation_curves` of a finished run, or empty with a warning when its logs cannot be read (the run's
    record is still written: its test figures are what matters)."""
    try:
        return validation_curves(run_dir)
    except (OSError, ValueError) as e:
        print(f"[study] {run_dir}: its validation curves could not be read ({e}); the record keeps none", flush=True)
        return {}


#: the keys an extension changes (:func:`extend_one`): the epoch cap and, with it, the first epoch early stopping
#: monitors (a study sets it from the cap)
EXTEND_KEYS = ("trainer.epochs", "trainer.early_stop_start_epoch")
#: the settings under which a run's training depends on its cap (the schedules' horizon), so that continuing it to a
#: larger cap is not the run a larger cap would have trained: key -> the value that keeps it independent. Checked for
#: the methods of :data:`EXTENDABLE_METHODS` only, whose every cap-dependent setting this lists (another method's,
#: e.g. darp's epsilon decay, would need its own entries)
HORIZON_FREE = {"optim.schedule": "none", "trainer.max_steps": 0, "model.std_final": None, "model.top_down": False}
EXTENDABLE_METHODS = ("ram", "unified")


def row_cap(row: Row, seed: int, data_dir: str | None, work: Path, extra: Sequence[str]) -> int:
    """The epoch cap that ``row`` trains ``seed`` with now (its last ``trainer.epochs=``, else its config's)."""
    argv = fit_argv(row, seed, data_dir, work, 1, extra)
    given = [a.split("=", 1)[1] for a in argv if a.startswith("trainer.epochs=")]
    if given:
        return int(given[-1])
    from rlattention.engine.config import load_config

    return load_config(ROOT / row.config, []).trainer.epochs


def _identity(row: str, seed: int, command: str | None, test: object) -> str:
    """What tells one record from another: its row, seed, command and test figures."""
    return json.dumps([row, seed, command, test], sort_keys=True)


def current_records(records: Sequence[dict]) -> list[dict]:
    """The records without those that an extension replaced (its record names the command and test figures of the
    run it extended, see :func:`extend_one`); ``runs.jsonl`` keeps both."""
    replaced = {
        _identity(r["row"], r["seed"], r["extended"]["from_command"], r["extended"].get("earlier_test"))
        for r in records
        if "extended" in r
    }
    return [
        r
        for r in records
        if _identity(r["row"], r["seed"], r.get("command"), (r.get("report") or {}).get("test")) not in replaced
    ]


def needs_extension(row: Row, record: dict, data_dir: str | None, work: Path, extra: Sequence[str]) -> bool:
    """Whether ``record`` is a run of an ``extendable`` row that trained fewer epochs than the row's cap now (its
    report's ``epochs``) and did not stop early (a run that converged before its cap is done)."""
    report = record["report"]
    if not row.extendable or report.get("early_stopped") or not isinstance(report.get("epochs"), int):
        return False
    return report["epochs"] < row_cap(row, record["seed"], data_dir, work, extra)


def runs_below_cap(rows: Sequence[Row], records: Sequence[dict], data_dir: str | None, work: Path,
                   extra: Sequence[str]) -> list[str]:  # fmt: skip
    """The current records that trained fewer epochs than their row's cap now (:func:`needs_extension`): not yet
    extended, or refused (the study says why when it runs), each as ``"row seed N (E of its cap of C epochs)"``."""
    by_name = {row.name: row for row in rows}
    said = []
    for r in records:
        row = by_name.get(r["row"])
        if row is not None and needs_extension(row, r, data_dir, work, extra):
            cap = row_cap(row, r["seed"], data_dir, work, extra)
            said.append(f"{row.name} seed {r['seed']} ({r['report']['epochs']} of its cap of {cap} epochs)")
    return said


def _replay(curve: Sequence[float], start: int, mode: str, patience: int, min_delta: float) -> tuple[tuple, int | None]:
    """The early-stopping state (reference value, its epoch, stale validations) after ``curve`` (one validation an
    epoch) under the trainer's rule monitored from epoch ``start``, and the epoch after which that rule would have
    ended the run (None: it would not have within the curve)."""
    from types import SimpleNamespace

    from rlattention.engine import stopping

    cfg = SimpleNamespace(early_stop_patience=patience, early_stop_min_delta=min_delta, early_stop_start_epoch=start)
    state = SimpleNamespace(stop_value=None, stop_epoch=-1, stale_validations=0, epoch=0, step=0, total_steps=1 << 62)
    stop = None
    for epoch, value in enumerate(curve, 1):
        state.epoch = state.step = epoch
        if stopping.update(state, value, mode, cfg) and stop is None:
            stop = epoch
    return (state.stop_value, state.stop_epoch, state.stale_validations), stop


def extension_plan(
    row: Row, record: dict, data_dir: str | None, work: Path, extra: Sequence[str]
) -> tuple[dict | None, str]:
    """Whether the recorded run of ``record`` can be continued to ``row``'s cap as :func:`extend_one` does:
    ``(plan, "")`` or ``(None, why not)``. It can when its folder holds that run (its ``report.json`` equals the
    record's, or, an extension under way, the kept ``report.cap<N>.json`` does), with ``checkpoints/last.ckpt``
    whose config is the row's but for :data:`EXTEND_KEYS`; when its training does not depend on the cap
    (:data:`HORIZON_FREE`); when it validated every epoch; and when its early-stopping state is the one a run
    monitored from the new start epoch has at the same epoch (replayed on its validation curve), so that the
    continued run is the run the larger cap trains from the start."""
    from rlattention.engine.checkpoint import CheckpointError, load_checkpoint_file
    from rlattention.engine.config import ConfigError, from_dict, to_dict
    from rlattention.engine.registry import get_method
    from rlattention.engine.rundir import lock_run_dir

    if row.same_as or row.candidates:
        return None, "a row that copies another study's runs or chooses among candidates is not extended itself"
    seed = record["seed"]
    argv = fit_argv(row, seed, data_dir, work, 1, extra)
    want = resolved_config(row.config, argv[6 if data_dir else 4 : -2], data_dir)
    old_cap, new_cap = int(record["report"]["epochs"]), int(want["trainer.epochs"])
    if want.get("method") not in EXTENDABLE_METHODS:
        return None, f"method {want.get('method')!r}: only {', '.join(EXTENDABLE_METHODS)} runs are extended"
    try:
        run_dir = run_dir_of(record["command"])
    except KeyError:
        return None, "its command names no run folder"
    if not run_dir.is_dir():
        return None, f"{run_dir} is gone"
    lock_run_dir(run_dir, record_pid=False).release()  # RunFolderBusy while a process trains in it: the study stops
    kept = run_dir / f"report.cap{old_cap}.json"
    if kept.is_file():  # an extension under way (or finished with no record: its resume only tests again)
        have, first = kept, False
    elif (run_dir / "report.json").is_file():
        have, first = run_dir / "report.json", True
    else:
        return None, f"{run_dir} holds neither its report.json nor {kept.name} (gone, or another run)"
    try:
        report = json.loads(have.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return None, f"{have} cannot be read ({e})"
    if not isinstance(report, dict) or _settled(report) != _settled(record["report"]):
        return None, f"{have} is not the recorded run's report (another run in that folder?)"
    tied = {k: want.get(k) for k in HORIZON_FREE if k in want and want.get(k) != HORIZON_FREE[k]}
    if tied:
        return None, f"its training depends on the cap ({', '.join(f'{k}={v!r}' for k, v in tied.items())})"
    if want.get("trainer.val_every") != 1:
        return None, f"it validates every {want.get('trainer.val_every')} epochs (an extension needs every epoch)"
    ckpt_path = run_dir / "checkpoints" / "last.ckpt"
    if not ckpt_path.is_file():
        return None, f"{ckpt_path} is gone"
    try:
        ckpt = load_checkpoint_file(ckpt_path)
        have_cfg = _flat(to_dict(from_dict(ckpt["config"], source=f"{ckpt_path} (config)")))
    except (CheckpointError, ConfigError) as e:
        return None, str(e)
    if want.get("data.data_dir"):
        have_cfg["data.data_dir"] = os.path.realpath(ROOT / str(have_cfg.get("data.data_dir")))
    differ = config_differences(have_cfg, {**want, **{k: have_cfg.get(k) for k in EXTEND_KEYS}}, "then", "now")
    if differ:
        return None, f"its config differs from the row's in more than the cap ({differ})"
    progress = ckpt.get("progress") or {}
    if first and progress.get("step") != report.get("steps"):
        return None, f"{ckpt_path} is at step {progress.get('step')}, not at the recorded run's end"
    metric, mode = get_method(want["method"]).selection_metric
    curve = validation_curve(run_dir, f"val/{metric}")
    epoch = progress.get("epoch", 0)
    if len(curve) < epoch:
        return None, f"its logs hold {len(curve)} validations of val/{metric}, fewer than its {epoch} epochs"
    rule = (mode, int(want["trainer.early_stop_patience"]), float(want["trainer.early_stop_min_delta"]))
    then = (progress.get("stop_value"), progress.get("stop_epoch"), progress.get("stale_validations"))
    old_start, new_start = int(have_cfg["trainer.early_stop_start_epoch"]), int(want["trainer.early_stop_start_epoch"])
    if _replay(curve[:epoch], old_start, *rule)[0] != then:
        return None, f"its early-stopping state {then} is not a replay of its val/{metric} curve"
    state, stop = _replay(curve[:epoch], new_start, *rule)
    if stop is not None and stop < epoch:
        return None, (
            f"monitored from epoch {new_start}, early stopping would have ended the run after epoch {stop}, before "
            f"its {epoch}: the continued run would not be the run of the larger cap"
        )
    if state != then:
        return None, (
            f"monitored from epoch {new_start}, early stopping would be in another state at epoch {epoch} "
            f"({state}) than the run's {then}: the continued run would not be the run of the larger cap"
        )
    return {"run_dir": run_dir, "first": first, "old_cap": old_cap, "new_cap": new_cap, "start_epoch": new_start}, ""


def extend_one(row: Row, record: dict, data_dir: str | None, work: Path, threads: int, extra: Sequence[str]) -> dict:
    """Continue the recorded run of ``record`` (fewer epochs than ``row``'s cap) to the row's cap:
    ``rlattention fit --resume`` with the new ``trainer.epochs`` and ``trainer.early_stop_start_epoch``, when
    :func:`extension_plan` allows it (else a ``RuntimeError`` saying why). With a cap-independent training (checked
    there) this is exactly the run that the row's cap trains from the start (at the same ``--threads`` as the
    recorded run), so the new record's ``command`` is that fresh run's command; ``extended`` says what was continued
    (``from_epochs``, ``from_command``, the step and epoch of the recorded run's end, the ``command`` that continued
    it, the earlier ``test`` figures, what was kept) and :func:`current_records` then drops the earlier record
    (``runs.jsonl`` keeps it). Before anything is trained, the earlier run's ``report.json``, ``figures/`` and
    ``checkpoints/best.ckpt`` are kept beside as ``report.cap<N>.json``, ``figures.cap<N>/`` and
    ``best.cap<N>.ckpt``; its ``last.ckpt`` and ``config.yaml`` move on as a resumed run's do, and its
    ``logs/metrics.csv`` loses the test rows logged after the last epoch (they are in ``report.cap<N>.json``). A
    killed extension continues from its last checkpoint the same way; the folder's lock is checked first."""
    import shutil

    plan, why = extension_plan(row, record, data_dir, work, extra)
    if plan is None:
        raise RuntimeError(f"{row.name} seed {record['seed']} cannot be extended: {why}")
    run_dir, cap = plan["run_dir"], plan["old_cap"]
    if plan["first"]:  # keep the earlier run's outputs; report.json last, so that a kill in between repeats this
        best, best_kept = run_dir / "checkpoints" / "best.ckpt", run_dir / "checkpoints" / f"best.cap{cap}.ckpt"
        if best.is_file() and not best_kept.exists():
            shutil.copy2(best, best_kept.with_suffix(".partial"))
            best_kept.with_suffix(".partial").rename(best_kept)
        figures, figures_kept = run_dir / "figures", run_dir / f"figures.cap{cap}"
        if figures.is_dir() and not figures_kept.exists():
            figures.rename(figures_kept)
        (run_dir / "report.json").rename(run_dir / f"report.cap{cap}.json")
    run_argv = [
        "rlattention", "fit", "--resume", str(run_dir), *(["--data-dir", data_dir] if data_dir else []),
        f"trainer.epochs={plan['new_cap']}", f"trainer.early_stop_start_epoch={plan['start_epoch']}",
        "trainer.progress=false", f"trainer.num_threads={threads}",
    ]  # fmt: skip
    kept = [f"report.cap{cap}.json", f"figures.cap{cap}", f"checkpoints/best.cap{cap}.ckpt"]
    print(f"[study] {run_dir}: extending its run of {cap} epochs to the cap {plan['new_cap']}", flush=True)
    t0 = time.time()
    log_path = work / f"{run_dir.name}.log"
    report = _fit_logged(run_argv, log_path, "a", run_dir)
    overrides = [o.format(seed=record["seed"], work=work) for o in row.overrides]
    return {
        "row": row.name,
        "seed": record["seed"],
        "config": row.config,
        "overrides": overrides + list(extra),
        "command": shlex.join(fit_argv(row, record["seed"], data_dir, work, threads, extra)),
        "extended": {
            "from_epochs": cap,
            "from_command": record["command"],
            "from_cpu": record.get("cpu"),
            "step": record["report"].get("steps"),
            "epoch": record["report"].get("epochs"),
            "command": shlex.join(run_argv),
            "earlier_test": record["report"].get("test"),
            "kept": [name for name in kept if (run_dir / name).exists()],
        },
        "report": report,
        "wall_seconds": round(time.time() - t0, 1),
        "validation_curves": _curves_or_none(run_dir),
    }


def select_candidate(row: Row, records: list[dict]) -> tuple[str, str] | None:
    """``(candidate row, how it was chosen)`` for a row with ``candidates``: the candidate with the highest mean
    validation figure ``report[row.select_key]``, over the seeds that every candidate with records has run (so that
    a candidate taken to more seeds is compared on the same ones; each candidate's own seeds when they share none).
    Candidates without records are left out and named; ``None`` when none has records."""
    key = row.select_key
    by_seed = {
        name: {
            r["seed"]: r["report"][key]
            for r in records
            if r["row"] == name and key in r["report"] and (not row.select_seeds or r["seed"] in row.select_seeds)
        }
        for name in row.candidates
    }
    ran = {name: vals for name, vals in by_seed.items() if vals}
    if not ran:
        return None
    shared = sorted(set.intersection(*(set(vals) for vals in ran.values())))
    means = {name: statistics.mean(vals[s] for s in shared) if shared else statistics.mean(vals.values())
             for name, vals in ran.items()}  # fmt: skip
    best = max(means, key=means.__getitem__)
    over = f"seeds {', '.join(map(str, shared))}" if shared else "each candidate's own seeds"
    listed = ", ".join(f"{n} {m:.4g}" for n, m in means.items())
    unrun = [n for n in row.candidates if n not in ran]
    if len(ran) == 1 and unrun:  # no choice was made: say so
        return best, f"{best}, the only candidate run so far (not yet run: {', '.join(unrun)}); its mean " + (
            f"{row.select_key} over {over}: {listed}"
        )
    note = f" (not yet run: {', '.join(unrun)})" if unrun else ""
    return best, f"{best}, chosen on validation: the mean {row.select_key} over {over} of {listed}{note}"


def waits_for(row: Row, seed: int, rows: Sequence[Row], records: list[dict]) -> str:
    """Why ``row`` (a candidate of a row with ``select_seeds``) does not run ``seed`` yet, empty when it can: a seed
    outside the comparison runs only for the chosen candidate, once every candidate has run every compared seed."""
    parent = next((r for r in rows if row.name in r.candidates), None)
    if parent is None or not parent.select_seeds or seed in parent.select_seeds:
        return ""
    done = {(r["row"], r["seed"]) for r in records}
    missing = [f"{c} seed {s}" for c in parent.candidates for s in parent.select_seeds if (c, s) not in done]
    if missing:
        return f"it waits for the comparison of {parent.name}'s candidates ({', '.join(missing)} not yet run)"
    chosen = select_candidate(parent, records)
    if chosen is not None and chosen[0] != row.name:
        seeds = ", ".join(map(str, parent.select_seeds))
        return f"{parent.name} chose {chosen[0]} on validation of seed(s) {seeds}: only the chosen runs other seeds"
    return ""


def summarise(
    study: str,
    rows: Sequence[Row],
    records: list[dict],
    metrics: Callable[[dict], dict[str, float]],
    description: str,
    command: str,
    out: Path,
    extra_md: str = "",
    primary: str | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    curve_key: str | None = None,
    below_cap: Sequence[str] = (),
) -> dict:
    """``summary.json`` and ``summary.md`` from the records (rows in the order of ``rows``; seeds sorted). An issue
    row missing some of ``seeds`` (or missing altogether) makes the description say PARTIAL and which, and so does
    each run named in ``below_cap`` (a record of fewer epochs than its row's cap now, see :func:`runs_below_cap`). With
    ``curve_key`` (e.g. ``val/accuracy``) each row also holds ``validation_curves``, one curve of that key per seed
    (:func:`recorded_curve`; empty for a run whose curve is neither recorded nor in its folder), and the summary
    ``validation_curve_key``: what a budget check or a curves figure reads, with no run folder needed."""
    doc_rows, lines = [], []
    keys: list[str] = []
    chosen = {row.name: select_candidate(row, records) for row in rows if row.candidates}
    for row in rows:
        pick = chosen.get(row.name)
        source = pick[0] if pick else row.name
        mine = sorted((r for r in records if r["row"] == source), key=lambda r: r["seed"])
        if not mine:
            continue
        per = [metrics(r["report"]) for r in mine]
        keys = keys or list(per[0])
        doc_rows.append(
            {
                "name": row.name,
                "config": row.config,
                "overrides": mine[0]["overrides"],
                "seeds": [r["seed"] for r in mine],
                "metrics": {k: [round(p[k], 2) for p in per] for k in per[0]},
                "train_seconds": [r["report"].get("train_seconds") for r in mine],
                "prepare_seconds": [r["report"].get("prepare_seconds") for r in mine],
                "epoch_seconds": [r["report"].get("epoch_seconds") for r in mine],
                "best_epoch": [r["report"].get("best_epoch") for r in mine],
                "commands": [r["command"] for r in mine],
                "issue_row": row.issue_row,
                "note": row.note,
                **({"selection": row.selection} if row.selection else {}),
                **({"selection": pick[1], "selected_from": source} if pick else {}),
                **({"same_as": f"{row.same_as[0]}/{row.same_as[1]}"} if row.same_as else {}),
                **(
                    {"validation_curves": [[round(v, 4) for v in recorded_curve(r, curve_key)] for r in mine]}
                    if curve_key
                    else {}
                ),
            }
        )
    short = []
    for row in rows:
        if not row.issue_row:
            continue
        pick = chosen.get(row.name)
        have = {r["seed"] for r in records if r["row"] == (pick[0] if pick else row.name)}
        if not set(seeds) <= have:
            short.append(f"{row.name} ({len(have & set(seeds))} of {len(seeds)} seeds)")
        need = set(row.select_seeds or seeds)  # the chosen candidate needs every seed (checked above)
        for name in row.candidates:  # a row chosen among candidates is partial while one of them has not run
            ran = {r["seed"] for r in records if r["row"] == name}
            if not need <= ran:
                short.append(f"{row.name}'s candidate {name} ({len(ran & need)} of {len(need)} seeds)")
    short += below_cap
    if short:
        description += "; PARTIAL, not yet run to its budget: " + ", ".join(short)
    doc = {
        "study": study,
        "description": description,
        "command": command,
        "selection": "validation (the checkpoint with the best validation metric; the test split evaluated once)"
        + ("; a row's own `selection` says where it differs" if any(r.get("selection") for r in doc_rows) else ""),
        "machine": machine(records),
        **({"validation_curve_key": curve_key} if curve_key else {}),
        "rows": doc_rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out / "summary.json")
    head = "| row | " + " | ".join(f"{k} (mean ± sd)" for k in keys) + " | per seed | train s | what |"
    lines = [f"# {study}", "", description, "", f"Command: `{command}`", "", head, "|" + "---|" * (len(keys) + 4)]
    for r in doc_rows:
        cells = []
        for k in keys:
            v = r["metrics"][k]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{statistics.mean(v):.2f} ± {sd:.2f}")
        first = primary or (keys[0] if keys else "")
        per_seed = ", ".join(f"{x:.2f}" for x in r["metrics"].get(first, []))
        secs = statistics.mean(t for t in r["train_seconds"] if t is not None)
        name = r["name"] if r["issue_row"] else f"_{r['name']}_"
        how = "chosen on validation" if "chosen on validation" in r.get("selection", "") else "the only candidate run"
        note = r["note"] + (f" (= {r['selected_from']}, {how})" if r.get("selected_from") else "")
        note += f" (the runs of {r['same_as']}: the same config)" if r.get("same_as") else ""
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {first}: {per_seed} | {secs:.0f} | {note} |")
    lines += ["", "Rows in italics are variants we tried besides the issue's rows.", "", f"Machine: {doc['machine']}."]
    if extra_md:
        lines += ["", extra_md]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return doc


def main(
    study: str,
    rows: Sequence[Row],
    metrics: Callable[[dict], dict[str, float]],
    description: str,
    argv: Sequence[str] | None = None,
    default_seeds: Sequence[int] = (0, 1, 2),
    extra_md: Callable[[dict], str] | None = None,
    script: str | None = None,
    primary: str | None = None,
    fraction_keys: Sequence[str] = (),
    curve_key: str | None = None,
) -> int:
    """Run the study's rows and seeds not yet recorded and write its summary. ``fraction_keys``: the metrics that
    this study's reports held as fractions before reports said their units (see :func:`in_percent`); every record's
    report is read through :func:`in_percent`, so ``metrics`` always sees percentages. ``curve_key``: the validation
    metric whose curves the summary keeps (see :func:`summarise`); before summarising, records that lack their
    curves gain them from their run folders while those exist, in ``curves.jsonl`` (:func:`keep_validation_curves`)."""
    ap = argparse.ArgumentParser(description=f"study {study}: {description}")
    ap.add_argument("--data-dir")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(default_seeds))
    ap.add_argument("--rows", nargs="+", help="run only these rows (default: all)")
    ap.add_argument("--work", default=f"runs/studies/{study}", help="folder of the study's run folders")
    ap.add_argument("--out", default=f"benchmarks/results/{study}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--summary-only", action="store_true", help="only rewrite the summary from the records")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run (recorded)")
    args = ap.parse_args(argv)
    names = {r.name for r in rows}
    bad = [r for r in args.rows or [] if r not in names]
    if bad:
        ap.error(f"unknown rows {bad}; rows: {', '.join(r.name for r in rows)}")
    out, work = ROOT / args.out, ROOT / args.work
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    os.environ["STUDY_THREADS"] = str(args.threads)
    command = (script or f"python benchmarks/{study}.py") + (f" --data-dir {args.data_dir}" if args.data_dir else "")
    command += " --seeds " + " ".join(map(str, default_seeds))
    if not args.summary_only:
        wanted = set(args.rows or ())
        wanted |= {c for row in rows if row.name in wanted for c in row.candidates}  # a selected row: its candidates
        waiting: dict[tuple[str, int], str] = {}
        ran_one = True
        while ran_one:  # again after a run: it may complete a comparison that lets the chosen candidate go on
            ran_one = False
            raw = current_records(_records(log))
            records = [{**r, "report": in_percent(r["report"], fraction_keys)} for r in raw]
            by_name = {row.name: row for row in rows}
            # recorded at a smaller cap than their extendable row's (and with no record at the row's cap): continued
            # to it (extend_one); the records as written, which the run folder's report.json must equal
            extend = [
                r["row"] in by_name and needs_extension(by_name[r["row"]], r, args.data_dir, work, args.overrides)
                for r in raw
            ]
            done = {(r["row"], r["seed"]) for r, e in zip(raw, extend, strict=True) if not e}
            short = {
                (r["row"], r["seed"]): r
                for r, e in zip(raw, extend, strict=True)
                if e and (r["row"], r["seed"]) not in done
            }
            for row in rows:
                if row.candidates or (args.rows and row.name not in wanted):
                    continue
                for seed in args.seeds:
                    if (row.name, seed) in done:
                        continue
                    why = waits_for(row, seed, rows, records)
                    if why:
                        waiting[row.name, seed] = why
                        continue
                    if (row.name, seed) in short:
                        plan, why = extension_plan(row, short[row.name, seed], args.data_dir, work, args.overrides)
                        if plan is None:
                            waiting[row.name, seed] = f"recorded at a smaller cap, which cannot be extended: {why}"
                            continue
                        print(f"[{study}] {row.name} seed {seed}: extending its run to the row's cap ...", flush=True)
                        rec = extend_one(row, short[row.name, seed], args.data_dir, work, args.threads, args.overrides)
                    elif row.same_as:
                        rec = shared_record(row, seed, args.data_dir, out, args.overrides)
                        if rec is None:
                            waiting[row.name, seed] = (
                                f"it is {row.same_as[0]}'s {row.same_as[1]}, not yet run for seed {seed} (run that "
                                f"study's row; this one copies its record)"
                            )
                            continue
                        print(f"[{study}] {row.name} seed {seed}: the run of {row.same_as[0]}'s {row.same_as[1]}")
                    else:
                        print(f"[{study}] {row.name} seed {seed} ...", flush=True)
                        rec = run_one(row, seed, args.data_dir, work, args.threads, args.overrides)
                    append_record(log, rec)
                    print(f"[{study}] {row.name} seed {seed}: {metrics(in_percent(rec['report'], fraction_keys))}")
                    waiting.pop((row.name, seed), None)
                    ran_one = True
                    break
                if ran_one:
                    break
        for (name, seed), why in waiting.items():
            print(f"[{study}] {name} seed {seed} not run: {why}", flush=True)
    added = keep_validation_curves(log)
    if added:
        print(f"[{study}] kept the validation curves of {added} earlier record(s) in {log.with_name('curves.jsonl')}")
    records = [
        {**r, "report": in_percent(r["report"], fraction_keys)}
        for r in with_kept_curves(current_records(_records(log)), log)
    ]
    below = runs_below_cap(rows, records, args.data_dir, work, args.overrides)
    doc = summarise(
        study, rows, records, metrics, description, command, out, primary=primary, seeds=default_seeds,
        curve_key=curve_key, below_cap=below,
    )  # fmt: skip
    if extra_md is not None:
        summarise(
            study, rows, records, metrics, description, command, out, extra_md(doc), primary, default_seeds, curve_key,
            below,
        )  # fmt: skip
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run a study module, e.g. python benchmarks/sbir_backbones.py")
