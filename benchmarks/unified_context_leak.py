"""The label leak of the unified model's context constraint (eq. 11), measured on trained checkpoints::

    nice -n 10 python benchmarks/unified_context_leak.py --data-dir ../shared/data/mnist

Eq. 11 weights the hidden states H_t by alpha_{t,y}, the classifier's probability of the true class y at step t, and
trains f_c to predict y from C = sum_t w_t H_t. Which steps get weight depends on y, so f_c can read y from the
weighting itself. On the test split (mean locations, a single pass), for every run of the source studies whose
``best.ckpt`` is on this machine and whose model has the context constraint:

- ``accuracy``: the model's prediction (alpha_T; a sequence is right when all its tokens are), the test accuracy its
  study recorded (the summary checks that it is: the same episodes as the run's own test);
- ``token_accuracy``: the same per token (equal to ``accuracy`` with one label per image);
- ``context_accuracy``: f_c(C) with the true label's weights, as in training;
- ``context_follows_wrong_label``: f_c(C) with the weights of a wrong label y' (y plus 1 to K-1, mod K, drawn with
  ``--seed``): how often f_c predicts y'. Without a leak f_c would mostly still see the image's class, so this would
  be near (100 - token_accuracy) / (K - 1);
- ``context_accuracy_confidence``: f_c(C) with label-free weights max_k alpha_{t,k} (``model.context_weights``
  ``confidence``). f_c was not trained with these weights, so this is only a lower bound of what C says about the
  image without the label.

The context figures are percent of the valid tokens (one per image, or the tokens of a sequence). Rows are named
``<source>:<row>``. A run whose ``best.ckpt`` is gone (run folders stay on the machine that trained them) is named in
the summary and left out; this is evidence for docs/unified.md, not a table of issue 22, so there is no retraining.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from study import ROOT, Row, _records, append_record, checkpoint_of, current_records, resolved_config, summarise

DEFAULT_SOURCES = ("unified_beta2", "unified_sequences")
BATCH = 500


def settings(seed: int) -> dict:
    return {"split": "test", "wrong_label_seed": seed}


@torch.no_grad()
def measure(checkpoint: Path, data_dir: str | None, seed: int) -> dict | None:
    """The figures of one checkpoint on its whole test split; None when its model has no context constraint. The
    episodes are those of the run's own test (``rlattention fit``'s): eval mode, mean locations, batches of
    ``trainer.eval_batch_size``, one stream of ``eval.seed`` for a random first glimpse."""
    from rlattention.engine.loader import unit_float
    from rlattention.engine.loading import load_for_eval

    cfg, model, splits = load_for_eval(checkpoint, data_dir)
    if not getattr(cfg.model, "context", False):
        return None
    model.eval()
    episodes = torch.Generator().manual_seed(cfg.eval.seed)
    g = torch.Generator().manual_seed(seed)  # the wrong labels
    keys = ("token_accuracy", "context_accuracy", "context_follows_wrong_label", "context_accuracy_confidence")
    counts, tokens, right = dict.fromkeys(keys, 0), 0, 0
    test = splits.test
    for a in range(0, len(test), cfg.trainer.eval_batch_size):
        images, targets = (
            test.images[a : a + cfg.trainer.eval_batch_size],
            test.targets[a : a + cfg.trainer.eval_batch_size],
        )
        ep, logits, _ = model.run(unit_float(images), deterministic=True, generator=episodes)
        y = model.token_targets(targets)  # (B, J), -1 where a sequence has no token
        valid = y >= 0
        K = logits.shape[-1]
        wrong = torch.where(valid, (y + torch.randint(1, K, y.shape, generator=g)) % K, y)
        hits = {
            "token_accuracy": logits.argmax(-1) == y,
            "context_accuracy": model.context_logits(ep.hidden, y, "label").argmax(-1) == y,
            "context_follows_wrong_label": model.context_logits(ep.hidden, wrong, "label").argmax(-1) == wrong,
            "context_accuracy_confidence": model.context_logits(ep.hidden, y, "confidence").argmax(-1) == y,
        }
        for k, h in hits.items():
            counts[k] += int((h & valid).sum())
        tokens += int(valid.sum())
        right += int((hits["token_accuracy"] | ~valid).all(-1).sum())  # every token of the image right
    figures = {k: round(100.0 * v / tokens, 4) for k, v in counts.items()}
    return {"accuracy": round(100.0 * right / len(test), 4), **figures, "tokens": tokens, "num_classes": K}


def metrics(report: dict) -> dict[str, float]:
    keys = ("accuracy", "token_accuracy", "context_accuracy", "context_follows_wrong_label",
            "context_accuracy_confidence")  # fmt: skip
    return {k: float(report[k]) for k in keys}


def agreement_md(records: Sequence[dict]) -> str:
    """Whether each run's ``accuracy`` is the test accuracy its study recorded (single-label runs)."""
    lines = []
    for r in records:
        was = r.get("recorded_test_accuracy")
        if was is None:
            continue
        same = abs(r["report"]["accuracy"] - was) < 0.01
        lines.append(f"{r['row']} seed {r['seed']}: {r['report']['accuracy']:.2f} ({'=' if same else '≠'} {was:.2f})")
    if not lines:
        return ""
    return "`accuracy` against the test accuracy each source study recorded for the run: " + "; ".join(lines) + "."


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--sources", nargs="+", default=list(DEFAULT_SOURCES),
                    help="studies under benchmarks/results, or folders holding a study's runs.jsonl")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0, help="the seed of the wrong labels")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/unified_context_leak", help="the table's folder")
    ap.add_argument("--summary-only", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["STUDY_THREADS"] = str(args.threads)
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    records = _records(log)
    for r in records:
        if r.get("settings") != settings(args.seed):
            sys.exit(f"{log}: {r['row']} seed {r['seed']} was measured with {r.get('settings')}, not "
                     f"{settings(args.seed)}; give another --out for these")  # fmt: skip
    done = {(r["row"], r["seed"], r["source_command"]) for r in records}  # a source run extended since is new
    current = set()  # the source runs that count now (an extended run replaces its earlier record)
    command = "nice -n 10 python benchmarks/unified_context_leak.py" + (f" --data-dir {args.data_dir}"
                                                                       if args.data_dir else "")  # fmt: skip
    if list(args.sources) != list(DEFAULT_SOURCES):
        command += " --sources " + " ".join(args.sources)
    missing, pending, rows = [], [], {}
    for given in args.sources:
        folder = Path(given) if Path(given).is_dir() else ROOT / "benchmarks" / "results" / given
        source = folder.name
        for src in current_records(_records(folder / "runs.jsonl")):
            name, ckpt = f"{source}:{src['row']}", checkpoint_of(src)
            rows.setdefault(name, Row(name, src["config"], note=f"{source} row {src['row']}", issue_row=False))
            current.add((name, src["seed"], src["command"]))
            if (name, src["seed"], src["command"]) in done:
                continue
            if not ckpt.is_file():
                missing.append(f"{name} seed {src['seed']}")
                continue
            if args.summary_only:
                if resolved_config(src["config"], src.get("overrides", [])).get("model.context"):
                    pending.append(f"{name} seed {src['seed']}")
                continue
            t0 = time.time()
            report = measure(ckpt, args.data_dir, args.seed)
            if report is None:  # no context constraint: nothing to measure (the row is left out below)
                continue
            report["train_seconds"] = round(time.time() - t0, 1)  # the evaluation's time ("train s" column)
            test = src.get("report", {}).get("test", {})
            rec = {"row": name, "seed": src["seed"], "config": src["config"], "overrides": src.get("overrides", []),
                   "command": command, "checkpoint": str(ckpt),
                   "source_command": src["command"], "settings": settings(args.seed), "report": report,
                   **({"recorded_test_accuracy": test["accuracy"]} if "accuracy" in test else {})}  # fmt: skip
            append_record(log, rec)
            records.append(rec)
            print(f"[context_leak] {name} seed {src['seed']}: {metrics(report)}", flush=True)
    records = [r for r in records if (r["row"], r["seed"], r["source_command"]) in current]
    measured = {r["row"] for r in records}
    description = (
        "the context constraint's label leak (eq. 11): on the whole test split, mean locations, single pass, the "
        "model's accuracy (%), f_c's accuracy with the true label's weights, how often f_c predicts a wrong label "
        "whose weights it is given, and f_c's accuracy with label-free (confidence) weights; every checkpoint of the "
        "source studies that is on this machine (no selection here: each is its study's best-validation checkpoint)"
    )
    seeds = sorted({r["seed"] for r in records}) or [0]
    gone = f"Not measured, their best.ckpt gone from this machine: {', '.join(missing)}." if missing else ""
    waits = f"On this machine, not yet measured (run without --summary-only): {', '.join(pending)}." if pending else ""
    notes = "\n\n".join(p for p in (agreement_md(records), gone, waits) if p)
    kept = [row for name, row in rows.items() if name in measured]
    summarise(out.name, kept, records, metrics, description, command, out, notes, "context_follows_wrong_label",
              seeds)  # fmt: skip
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
