"""Issue 22's PGD table on the converged models: the test accuracy of every row of a finished unified study
(``unified_cluttered60`` by default: cnn, ram, topdown, entropy, entropy_context) under an L-inf PGD attack, per
seed, at several budgets epsilon, the same attack as docs/unified.md's first table::

    nice -n 10 python benchmarks/unified_pgd.py --data-dir ../shared/data/mnist
    nice -n 10 python benchmarks/unified_pgd.py --data-dir ../shared/data/mnist --summary-only

Each (row, seed) of the source study's ``runs.jsonl`` is evaluated from its ``best.ckpt`` (the checkpoint chosen on
validation that the study tested) with ``rlattention eval CKPT --data-dir D --limit N --json --no-save`` (clean) and
``... --attack pgd --epsilon E --step-size E/4 --steps 10`` for each E: the first N test images (1,000 by default),
mean locations, one pass; the attack differentiates through the glimpse patches and the mean locations. A
checkpoint's figures are recorded in ``benchmarks/results/unified_pgd/runs.jsonl`` once all its epsilons are done,
so the same command continues an interrupted table and picks up rows or seeds the source study adds later. A
source run whose ``best.ckpt`` is gone (run folders live in ``runs/``, which does not outlive the machine that
trained them) is skipped: the summary names it and the command exits with 1 after writing the rest; with
``--retrain-missing`` it is trained again first, by its recorded command and seed, and the summary gives the new
checkpoint's test accuracy beside the recorded one.

Study ``unified_pgd`` (another ``--source``: ``unified_pgd_<source>``, e.g. ``--source unified_cluttered100`` writes
``benchmarks/results/unified_pgd_cluttered100``; a study is named after its folder): rows named as the source
study's rows; metrics ``accuracy_clean`` and ``accuracy_eps<E>`` (percent, test images), and ``kept_eps<E>`` (the
accuracy under attack as a percentage of the clean accuracy).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from study import (
    ROOT,
    Row,
    _records,
    append_record,
    checkpoint_of,
    current_records,
    fit_argv,
    run_dir_of,
    run_one,
    summarise,
)

EPSILONS = (0.01, 0.02, 0.05, 0.1, 0.2)
STEPS = 10
STUDY = "unified_pgd"
DEFAULT_SOURCE = "unified_cluttered60"


def eval_argv(checkpoint: Path, data_dir: str | None, limit: int, epsilon: float | None) -> list[str]:
    """``rlattention eval`` of a checkpoint on the first ``limit`` test images; ``epsilon`` None: clean."""
    argv = ["rlattention", "eval", str(checkpoint), "--limit", str(limit), "--json", "--no-save"]
    argv += ["--data-dir", data_dir] if data_dir else []
    if epsilon is not None:
        argv += ["--attack", "pgd", "--epsilon", f"{epsilon:g}", "--step-size", f"{epsilon / 4:g}"]
        argv += ["--steps", str(STEPS)]
    return argv


def run_eval(argv: list[str], threads: int) -> dict[str, float]:
    """The metrics that ``rlattention eval --json`` prints (its last stdout line); raises naming the command."""
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return json.loads(lines[-1])


def metric_name(epsilon: float | None, kind: str = "accuracy") -> str:
    return f"{kind}_clean" if epsilon is None else f"{kind}_eps{epsilon:g}"


def metrics(report: dict) -> dict[str, float]:
    """The study's metrics of one checkpoint's record: accuracies in percent and the share of the clean accuracy
    kept under each attack (percent; 0 when the clean accuracy is 0)."""
    acc = report["accuracy"]
    out = {metric_name(None): float(acc["clean"])}
    for eps in report["epsilons"]:
        out[metric_name(eps)] = float(acc[f"{eps:g}"])
    for eps in report["epsilons"]:
        clean = out[metric_name(None)]
        out[metric_name(eps, "kept")] = 100.0 * out[metric_name(eps)] / clean if clean > 0 else 0.0
    return out


def missing_md(missing: Sequence[dict], lead: str = "Not attacked") -> str:
    """The summary's line on the source runs not attacked (``lead``: what was not done) because their checkpoint is
    gone."""
    if not missing:
        return ""
    runs = ", ".join(f"{m['row']} seed {m['seed']} ({checkpoint_of(m)})" for m in missing)
    return (
        f"{lead}, their best.ckpt missing when this table was made (a run folder does not outlive the machine "
        f"that trained it; `--retrain-missing` trains each again by its recorded command): {runs}."
    )


def retrain(source: dict, data_dir: str | None, threads: int) -> dict:
    """Train a source record's run again where its folder is gone: the same ``rlattention fit`` command (rebuilt from
    the record and checked against its ``command``; only the thread count may differ), into the same folder (a killed
    retraining is continued, as the study continues its runs). Returns what the PGD record keeps of it: the recorded
    and the new test accuracy (equal when training reproduces; the attack is on the new checkpoint either way)."""
    run_dir = run_dir_of(source["command"])
    filled = [o.replace("{", "{{").replace("}", "}}") for o in source.get("overrides", [])]  # kept as recorded
    row = Row(source["row"], source["config"], filled)
    argv = fit_argv(row, source["seed"], data_dir, run_dir.parent, threads, [])
    recorded = shlex.split(source["command"])
    if argv[:-1] != recorded[:-1]:  # the last word is trainer.num_threads
        raise SystemExit(
            f"{source['row']} seed {source['seed']}: cannot retrain, its recorded command\n  {source['command']}\n"
            f"is not the one rebuilt from its record\n  {shlex.join(argv)}\n(another --data-dir?)"
        )
    print(f"[pgd] {run_dir}/checkpoints/best.ckpt is missing: training it again", flush=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)  # the study's work folder may be gone with the run's
    new = run_one(row, source["seed"], data_dir, run_dir.parent, threads, [])
    was, now = source["report"]["test"]["accuracy"], new["report"]["test"]["accuracy"]
    print(f"[pgd] {source['row']} seed {source['seed']} retrained: test accuracy {now} (recorded {was})", flush=True)
    return {"command": new["command"], "test_accuracy_recorded": was, "test_accuracy_retrained": now,
            "best_val_accuracy_recorded": source["report"].get("best_val_accuracy"),
            "best_val_accuracy_retrained": new["report"].get("best_val_accuracy"),
            "wall_seconds": new["wall_seconds"]}  # fmt: skip


def retrained_md(records: Sequence[dict]) -> str:
    """The summary's line on the checkpoints that were trained again for this table, and whether they reproduced."""
    again = [r for r in records if r.get("retrained")]
    if not again:
        return ""
    runs = []
    for r in again:
        was, now = r["retrained"]["test_accuracy_recorded"], r["retrained"]["test_accuracy_retrained"]
        same = round(was, 6) == round(now, 6)
        runs.append(f"{r['row']} seed {r['seed']} ({'the same' if same else f'{now:.2f}% against {was:.2f}%'})")
    return (
        "Trained again for this table, their run folders being gone (`--retrain-missing`: the recorded command, the "
        f"same seed), with the test accuracy of the new checkpoint against the recorded one: {', '.join(runs)}."
    )


def evaluate_run(source: dict, data_dir: str | None, limit: int, epsilons: Sequence[float], threads: int) -> dict:
    """One record: the clean and attacked accuracies of a source study record's ``best.ckpt``."""
    ckpt = checkpoint_of(source)
    if not ckpt.is_file():
        raise FileNotFoundError(f"{ckpt} (row {source['row']}, seed {source['seed']}) is missing")
    t0 = time.time()
    accuracy, commands = {}, []
    for eps in (None, *epsilons):
        argv = eval_argv(ckpt, data_dir, limit, eps)
        m = run_eval(argv, threads)
        if "accuracy" not in m:
            raise KeyError(f"{shlex.join(argv)} printed no accuracy: {sorted(m)}")
        accuracy["clean" if eps is None else f"{eps:g}"] = m["accuracy"]
        commands.append(shlex.join(argv))
    return {
        "row": source["row"],
        "seed": source["seed"],
        "config": source["config"],
        "overrides": [f"--limit {limit}", f"pgd steps {STEPS}, step epsilon/4"],
        "command": " && ".join(commands),
        "checkpoint": str(ckpt),
        "settings": settings(limit, epsilons),
        # "train_seconds": the attack's time (the summary's "train s" column), no training happens here
        "report": {"accuracy": accuracy, "epsilons": list(epsilons), "train_seconds": round(time.time() - t0, 1)},
    }


def settings(limit: int, epsilons: Sequence[float]) -> dict:
    """What makes two records comparable: the test images, the budgets and the attack's steps."""
    return {"limit": limit, "epsilons": [float(e) for e in epsilons], "steps": STEPS}


def recorded(records: Sequence[dict], wanted: dict, log: Path, done: str = "attacked") -> set[tuple[str, int]]:
    """The (row, seed) already ``done`` (attacked, measured) with the ``wanted`` settings; a record made with others
    is an error (its figures would not share a table with the new ones), naming it and both settings."""
    for r in records:
        if r.get("settings") != wanted:
            raise SystemExit(
                f"{log}: {r['row']} seed {r['seed']} was {done} with {r.get('settings')}, not {wanted}; run with "
                "those settings, or give another --out for these"
            )
    return {(r["row"], r["seed"]) for r in records}


def table_md(doc: dict) -> str:
    """Markdown: mean accuracy (percent) per row and epsilon, the seeds' spread, and the share kept."""
    rows = doc["rows"]
    if not rows:
        return ""
    keys = [k for k in rows[0]["metrics"] if k.startswith("accuracy_")]
    head = "| row | " + " | ".join(k.removeprefix("accuracy_") for k in keys) + " |"
    lines = ["Test accuracy (%, mean ± sd over seeds) under L-inf PGD:", "", head, "|---|" + "---|" * len(keys)]
    for r in rows:
        cells = []
        for k in keys:
            v = r["metrics"][k]
            sd = f" ± {statistics.stdev(v):.1f}" if len(v) > 1 else ""
            cells.append(f"{statistics.mean(v):.1f}{sd}")
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draw(doc: dict, out: Path) -> Path:
    """``figures/pgd_accuracy.png``: accuracy against epsilon per row (mean, seeds as dots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in doc["rows"]:
        eps = [0.0] + [float(k.removeprefix("accuracy_eps")) for k in r["metrics"] if k.startswith("accuracy_eps")]
        keys = ["accuracy_clean"] + [k for k in r["metrics"] if k.startswith("accuracy_eps")]
        means = [statistics.mean(r["metrics"][k]) for k in keys]
        (line,) = ax.plot(eps, means, "o-", label=r["name"])
        for e, k in zip(eps, keys, strict=True):
            ax.plot([e] * len(r["metrics"][k]), r["metrics"][k], ".", color=line.get_color(), alpha=0.5)
    ax.set(xlabel="PGD epsilon (L-inf, pixels in [0, 1])", ylabel="test accuracy (%)", title=doc["study"])
    ax.set_xscale("symlog", linthresh=0.01)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "figures" / "pgd_accuracy.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def row_order(source: str, recorded_rows: Sequence[str]) -> list[str]:
    """The recorded rows in the order the source study defines them (benchmarks/unified_study.py), not the order
    their runs finished; rows that study does not define (another source) follow in the order they were recorded."""
    from unified_study import STUDIES

    present = list(dict.fromkeys(recorded_rows))
    defined = [row.name for row in STUDIES[source].rows] if source in STUDIES else []
    return [n for n in defined if n in present] + [n for n in present if n not in defined]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir")
    ap.add_argument(
        "--source",
        default=DEFAULT_SOURCE,
        help="the study whose checkpoints are attacked (benchmarks/results/SOURCE), or a folder with its runs.jsonl",
    )
    ap.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    ap.add_argument("--limit", type=int, default=1000, help="the first N test images")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--out",
        help=f"the table's folder, whose name is the study's (default: benchmarks/results/{STUDY} for the default "
        f"source, else benchmarks/results/{STUDY}_<source without 'unified_'>, e.g. {STUDY}_cluttered100)",
    )
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument(
        "--rows", nargs="+", help="attack (and retrain) only these source rows now; the table has every run"
    )
    ap.add_argument("--seeds", type=int, nargs="+", help="attack (and retrain) only these seeds now")
    ap.add_argument(
        "--retrain-missing",
        action="store_true",
        help="train a source run again (its recorded command, the same seed) where its best.ckpt is gone, then attack "
        "it; the summary gives its new test accuracy beside the recorded one",
    )
    args = ap.parse_args(argv)
    if any(e <= 0 for e in args.epsilons) or args.limit <= 0:
        ap.error(f"--epsilons must be > 0 and --limit > 0, got {args.epsilons} and {args.limit}")
    folder = Path(args.source) if Path(args.source).is_dir() else ROOT / "benchmarks" / "results" / args.source
    source_log = folder / "runs.jsonl"
    sources = current_records(_records(source_log))  # an extended run's earlier record does not count
    if not sources:
        sys.exit(f"{source_log}: no finished runs of {args.source} to attack (run benchmarks/unified_study.py first)")
    unknown = sorted(set(args.rows or ()) - {s["row"] for s in sources})
    if unknown:
        ap.error(f"--rows {unknown}: not rows of {source_log} (it has {sorted({s['row'] for s in sources})})")
    now = [
        s
        for s in sources
        if (not args.rows or s["row"] in args.rows) and (args.seeds is None or s["seed"] in args.seeds)
    ]
    default_out = STUDY if args.source == DEFAULT_SOURCE else f"{STUDY}_{folder.name.removeprefix('unified_')}"
    out = ROOT / (args.out or f"benchmarks/results/{default_out}")
    study = out.name  # the results schema names a study after its folder
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    wanted = settings(args.limit, args.epsilons)
    done = recorded(_records(log), wanted, log)
    os.environ["STUDY_THREADS"] = str(args.threads)  # the summary's machine line (eval commands carry no threads)
    missing = [s for s in sources if (s["row"], s["seed"]) not in done and not checkpoint_of(s).is_file()]
    if not args.summary_only:
        for src in now:  # --rows / --seeds: two processes may take disjoint runs of one table
            if (src["row"], src["seed"]) in done or (src in missing and not args.retrain_missing):
                continue
            again = retrain(src, args.data_dir, args.threads) if src in missing else None
            print(f"[{study}] {src['row']} seed {src['seed']} ...", flush=True)
            rec = evaluate_run(src, args.data_dir, args.limit, args.epsilons, args.threads)
            rec.update({"retrained": again} if again else {})
            append_record(log, rec)
            print(f"[{study}] {src['row']} seed {src['seed']}: {metrics(rec['report'])}", flush=True)
    records = _records(log)
    attacked = {(r["row"], r["seed"]) for r in records}
    missing = [s for s in sources if (s["row"], s["seed"]) not in attacked and not checkpoint_of(s).is_file()]
    names = row_order(folder.name, [r["row"] for r in sources])
    rows = [Row(n, next(r["config"] for r in sources if r["row"] == n), note=f"{args.source} row {n}") for n in names]
    command = f"nice -n 10 python benchmarks/unified_pgd.py --source {args.source}"
    command += (f" --data-dir {args.data_dir}" if args.data_dir else "") + f" --limit {args.limit} --epsilons "
    command += " ".join(f"{e:g}" for e in args.epsilons) + (f" --out {args.out}" if args.out else "")
    command += " --retrain-missing" if any(r.get("retrained") for r in records) else ""
    description = (
        f"test accuracy under L-inf PGD ({STEPS} steps of epsilon/4, mean locations) of every row and seed of "
        f"{args.source}, its best.ckpt (chosen on validation), the first {args.limit} test images; the 'train s' "
        "column is the time of a checkpoint's attacks"
    )
    seeds = sorted({r["seed"] for r in sources})
    notes = "\n\n".join(md for md in (retrained_md(records), missing_md(missing)) if md)
    doc = summarise(study, rows, records, metrics, description, command, out, notes, "accuracy_clean", seeds)
    if doc["rows"]:
        draw(doc, out)
        extra = table_md(doc) + "\n\n![accuracy against epsilon](figures/pgd_accuracy.png)"
        summarise(
            study,
            rows,
            records,
            metrics,
            description,
            command,
            out,
            f"{extra}\n\n{notes}".strip(),
            "accuracy_clean",
            seeds,
        )
    print((out / "summary.md").read_text())
    if missing:  # the table is written, but it is not the whole source study: say so, and in the exit status
        print(f"[{study}] {missing_md(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
