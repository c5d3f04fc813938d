"""A second metric for a finished unified study: the error of each issue row's checkpoints when the class scores of
several sampled episodes are averaged (``rlattention eval --mc-samples K``), beside the single pass of mean
locations that the study reports::

    nice -n 10 python benchmarks/unified_episodes.py --data-dir ../shared/data/mnist
    nice -n 10 python benchmarks/unified_episodes.py --data-dir ../shared/data/mnist --summary-only

The issue's metric stays the single pass (``unified_mnist``'s ``test_error``); this table is reported beside it, never
in its place. RAM's paper-budget run goes from 1.30% to 0.66% test error this way (docs/ram.md), so the question it
answers is whether the unified rows keep their order (or reach the 1.0% target) once the sampling noise of one
episode is averaged out.

Each run behind an issue row of the source study's ``summary.json`` (the chosen candidate's runs, as the summary
reports them) is evaluated from its ``best.ckpt``, the checkpoint chosen on the single-pass validation accuracy:

- ``test_error``: ``rlattention eval CKPT --split test --json --no-save``, the single pass measured again: it must
  equal the source record's figure (it does when the checkpoint is the one the study tested; a retrained one may
  differ, and the summary says so);
- ``val_error_mcK`` and ``test_error_mcK``: ``... --split val|test --mc-samples K --seed S``, K episodes of sampled
  locations (K = 10 and S = 1234 by default, fixed before any figure was seen);
- ``val_error``: 100 - the source record's ``best_val_accuracy`` (single pass), for reference.

A run's figures are recorded in ``benchmarks/results/<source>_episodes/runs.jsonl`` once all are measured, so the same
command continues an interrupted table. A run whose ``best.ckpt`` is gone is skipped, named in the summary, and the
command exits 1; ``--retrain-missing`` trains it again first, by its recorded command and seed (as
benchmarks/unified_pgd.py does).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from study import ROOT, Row, _records, append_record, summarise
from unified_pgd import checkpoint_of, missing_md, recorded, retrain, retrained_md, run_eval

DEFAULT_SOURCE = "unified_mnist"
MC_SAMPLES = 10
EVAL_SEED = 1234


def eval_argv(checkpoint: Path, data_dir: str | None, split: str, mc_samples: int, seed: int) -> list[str]:
    """``rlattention eval`` of a checkpoint on a whole split; ``mc_samples`` 0: the single pass of mean locations."""
    argv = ["rlattention", "eval", str(checkpoint), "--split", split, "--json", "--no-save"]
    argv += ["--data-dir", data_dir] if data_dir else []
    return argv + (["--mc-samples", str(mc_samples), "--seed", str(seed)] if mc_samples else [])


def metrics(report: dict) -> dict[str, float]:
    """The table's metrics of one record (percent): the single pass, then the K-episode figures."""
    k = report["mc_samples"]
    return {
        "test_error": float(report["test_error"]),
        f"test_error_mc{k}": float(report["test_error_mc"]),
        "val_error": float(report["val_error"]),
        f"val_error_mc{k}": float(report["val_error_mc"]),
    }


def settings(mc_samples: int, seed: int) -> dict:
    """What makes two records comparable: the number of episodes and the sampling seed (whole splits)."""
    return {"mc_samples": mc_samples, "eval_seed": seed}


def source_runs(folder: Path, rows: Sequence[str] | None) -> list[tuple[str, dict]]:
    """``(issue row, source record)`` of every run behind the issue rows of ``folder/summary.json`` (or only
    ``rows``), in the summary's order; the records are those of ``folder/runs.jsonl`` with the summary's commands."""
    summary, log = folder / "summary.json", folder / "runs.jsonl"
    if not summary.is_file():
        sys.exit(f"{summary}: no summary of the source study (run benchmarks/unified_study.py first)")
    doc = json.loads(summary.read_text())
    by_command = {r.get("command"): r for r in _records(log)}
    known = [r["name"] for r in doc["rows"]]
    unknown = [name for name in rows or () if name not in known]
    if unknown:
        sys.exit(f"{summary}: no row(s) {unknown}; its rows: {', '.join(known)}")
    out = []
    for row in doc["rows"]:
        if (rows and row["name"] not in rows) or (not rows and not row["issue_row"]):
            continue
        for command in row["commands"]:
            if command not in by_command:
                sys.exit(f"{log}: no record with the command of {summary}'s row {row['name']}: {command}")
            rec = by_command[command]
            report = rec.get("report") or {}
            for key, value in (("best_val_accuracy", report.get("best_val_accuracy")),
                               ("test.error", (report.get("test") or {}).get("error"))):  # fmt: skip
                if not isinstance(value, (int, float)):
                    sys.exit(f"{log}: the record of {row['name']} seed {rec.get('seed')} has no number at report.{key} "
                             f"(got {value!r}); it is needed beside the figures measured here")  # fmt: skip
            out.append((row["name"], rec))
    return out


def evaluate_run(
    name: str,
    source: dict,
    data_dir: str | None,
    mc_samples: int,
    seed: int,
    threads: int,
    best_val: float | None = None,
) -> dict:
    """One record: the single-pass test error and the K-episode validation and test errors of a run's best.ckpt;
    ``val_error`` from ``best_val`` (a retrained run's best validation accuracy) or the source record's."""
    ckpt = checkpoint_of(source)
    if not ckpt.is_file():
        raise FileNotFoundError(f"{ckpt} (row {name}, seed {source['seed']}) is missing")
    t0 = time.time()
    figures, commands = {}, []
    for key, split, k in (("test_error", "test", 0), ("val_error_mc", "val", mc_samples), ("test_error_mc", "test",
                                                                                             mc_samples)):  # fmt: skip
        argv = eval_argv(ckpt, data_dir, split, k, seed)
        m = run_eval(argv, threads)
        if "error" not in m:
            raise KeyError(f"{shlex.join(argv)} printed no error: {sorted(m)}")
        figures[key] = round(float(m["error"]), 4)
        figures[f"{split}_count"] = int(m.get("count", 0))  # the images evaluated: the whole split
        commands.append(shlex.join(argv))
    report = source["report"]
    return {
        "row": name,
        "seed": source["seed"],
        "config": source["config"],
        "overrides": source.get("overrides", []),
        "command": " && ".join(commands),
        "checkpoint": str(ckpt),
        "source_row": source["row"],
        "source_command": source["command"],
        "settings": settings(mc_samples, seed),
        # "train_seconds": the evaluations' time (the summary's "train s" column), no training happens here
        "report": {
            **figures,
            "mc_samples": mc_samples,
            "val_error": round(100.0 - float(report["best_val_accuracy"] if best_val is None else best_val), 4),
            "test_error_recorded": float(report["test"]["error"]),
            "train_seconds": round(time.time() - t0, 1),
        },
    }


def agreement_md(records: Sequence[dict]) -> str:
    """Whether every re-measured single pass equals its recorded figure (the checkpoint is the one tested)."""
    differ = []
    for r in records:
        now, was = r["report"]["test_error"], r["report"]["test_error_recorded"]
        if abs(now - was) > 1e-4:  # the figures are kept to 4 decimals
            why = "retrained" if "retrained" in r else "not retrained: its best.ckpt may not be the one tested"
            differ.append(f"{r['row']} seed {r['seed']} ({now:.2f} against {was:.2f}; {why})")
    if not differ:
        return "Every re-measured single-pass test error equals the source study's recorded one."
    return "The re-measured single pass differs from the source study's record for: " + ", ".join(differ)


def gaps_md(doc: dict, key: str) -> str:
    """Each issue row against the first (the control, e.g. ``ram``) on ``key``: the gap of the means, and "no
    difference" when it lies within the larger of the two rows' seed standard deviations."""
    rows = [r for r in doc["rows"] if key in r["metrics"]]
    if len(rows) < 2:
        return ""
    base = rows[0]
    lines = [f"On `{key}`, against `{base['name']}`:", ""]
    for r in rows[1:]:
        a, b = r["metrics"][key], base["metrics"][key]
        gap = statistics.mean(a) - statistics.mean(b)
        gap = 0.0 if abs(gap) < 0.005 else gap  # no "-0.00"
        if min(len(a), len(b)) < 2:
            lines.append(f"- {r['name']}: gap {gap:+.2f} (fewer than 2 seeds: no spread)")
            continue
        spread = max(statistics.stdev(a), statistics.stdev(b))
        what = "no difference" if abs(gap) <= spread else ("lower" if gap < 0 else "higher")
        lines.append(f"- {r['name']}: {what}, gap {gap:+.2f}, larger seed sd {spread:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir")
    ap.add_argument(
        "--source",
        default=DEFAULT_SOURCE,
        help="the study whose checkpoints are evaluated (benchmarks/results/SOURCE), or a folder with its summary.json "
        "and runs.jsonl",
    )
    ap.add_argument("--rows", nargs="+", help="these rows of the source summary (default: its issue rows)")
    ap.add_argument("--mc-samples", type=int, default=MC_SAMPLES, help="episodes averaged per image")
    ap.add_argument("--seed", type=int, default=EVAL_SEED, help="the seed of the sampled locations")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="the table's folder, whose name is the study's (default: benchmarks/results/"
                    "<source folder>_episodes)")  # fmt: skip
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument(
        "--retrain-missing",
        action="store_true",
        help="train a source run again (its recorded command, the same seed) where its best.ckpt is gone",
    )
    args = ap.parse_args(argv)
    if args.mc_samples < 2:
        ap.error(f"--mc-samples must be at least 2 (the single pass is measured anyway), got {args.mc_samples}")
    folder = Path(args.source) if Path(args.source).is_dir() else ROOT / "benchmarks" / "results" / args.source
    sources = source_runs(folder, args.rows)
    out = ROOT / (args.out or f"benchmarks/results/{folder.name}_episodes")
    study = out.name  # the results schema names a study after its folder
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    wanted = settings(args.mc_samples, args.seed)
    done = recorded(_records(log), wanted, log, "measured")
    made_from = {(r["row"], r["seed"]): r.get("source_command") for r in _records(log)}
    for name, src in sources:  # a recorded figure is of the run the source summary now names, or an error
        was = made_from.get((name, src["seed"]))
        if was is not None and was != src["command"]:
            sys.exit(
                f"{log}: {name} seed {src['seed']} was measured on the run of\n  {was}\nbut {folder.name}'s summary "
                f"now names the run of\n  {src['command']}\n(another candidate chosen, or the seed run again); give "
                "another --out for the new table"
            )
    os.environ["STUDY_THREADS"] = str(args.threads)  # the summary's machine line (eval commands carry no threads)
    if not args.summary_only:
        for name, src in sources:
            gone = not checkpoint_of(src).is_file()
            if (name, src["seed"]) in done or (gone and not args.retrain_missing):
                continue
            again = retrain(src, args.data_dir, args.threads) if gone else None
            print(f"[{study}] {name} seed {src['seed']} ...", flush=True)
            best_val = again["best_val_accuracy_retrained"] if again else None
            rec = evaluate_run(name, src, args.data_dir, args.mc_samples, args.seed, args.threads, best_val)
            rec.update({"retrained": again} if again else {})
            append_record(log, rec)
            print(f"[{study}] {name} seed {src['seed']}: {metrics(rec['report'])}", flush=True)
    records = _records(log)
    measured = {(r["row"], r["seed"]) for r in records}
    missing = [{**s, "row": n} for n, s in sources if (n, s["seed"]) not in measured and not checkpoint_of(s).is_file()]
    names = list(dict.fromkeys(n for n, _ in sources))
    rows = [Row(n, next(s["config"] for m, s in sources if m == n), note=f"{folder.name} row {n}") for n in names]
    command = f"nice -n 10 python benchmarks/unified_episodes.py --source {args.source}"
    command += f" --data-dir {args.data_dir}" if args.data_dir else ""
    command += f" --rows {' '.join(args.rows)}" if args.rows else ""
    command += f" --mc-samples {args.mc_samples} --seed {args.seed}" + (f" --out {args.out}" if args.out else "")
    command += " --retrain-missing" if any(r.get("retrained") for r in records) else ""
    k = args.mc_samples
    description = (
        f"test error (%) of {folder.name}'s issue rows, the single pass of mean locations (the study's metric, "
        f"measured again) and the class scores averaged over {k} sampled episodes (seed {args.seed}; val_error_mc{k} "
        "on the validation split), each run's best.ckpt (chosen on the single-pass validation accuracy); the "
        "'train s' column is the time of a run's evaluations"
    )
    seeds = sorted({s["seed"] for _, s in sources})
    notes = "\n\n".join(md for md in (retrained_md(records), missing_md(missing, "Not measured")) if md)
    doc = summarise(study, rows, records, metrics, description, command, out, notes, f"test_error_mc{k}", seeds)
    if doc["rows"]:
        parts = [agreement_md(records), gaps_md(doc, "test_error"), gaps_md(doc, f"test_error_mc{k}"), notes]
        summarise(
            study, rows, records, metrics, description, command, out, "\n\n".join(p for p in parts if p),
            f"test_error_mc{k}", seeds,
        )  # fmt: skip
    print((out / "summary.md").read_text())
    if missing:
        print(f"[{study}] {missing_md(missing, 'Not measured')}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
