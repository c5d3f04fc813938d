"""Behaviour check for refactors: one short training run per registered method, final metrics + a weight checksum.

A refactor that moves code around must not change what training does. This script trains every registered method
for a few steps on tiny data (the embedded ``digits``, generated canvases, or the real data of ``../shared/data``
where the method needs it), one torch thread, each run in a fresh process of ``rlattention fit``, and writes, per
method, the final report's metrics (validation and test) and a SHA-256 of the final weights
(``checkpoints/last.ckpt``) to a JSON file. Compare the file written before a refactor with the one written after:
identical metrics and checksums mean identical behaviour on these runs.

Record the state before a refactor from a worktree of the commit it starts from::

    git worktree add /tmp/wt-base HEAD
    PYTHONPATH=/tmp/wt-base python /tmp/wt-base/benchmarks/refactor_check.py \\
        benchmarks/results/refactor_check/before.json --data-dir ../shared/data

(the script of this checkout works too: ``PYTHONPATH=/tmp/wt-base python benchmarks/refactor_check.py ...``
runs the worktree's library with this file's ``CASES``, reading the configs of ``--configs``, by default this
checkout's ``configs/``). After the refactor, in the checkout itself::

    python benchmarks/refactor_check.py benchmarks/results/refactor_check/after.json \\
        --against benchmarks/results/refactor_check/before.json

prints one line per difference and exits 1 if there is any (``--diff A.json B.json`` compares two files without
training). ``--methods ram scal`` runs a subset. A method registered but missing from :data:`CASES` is reported
as such (add a case for it). About 3-5 minutes on one thread in all.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data"

#: Overrides every run gets: a few optimiser steps, small batches, one thread, no figures, deterministic kernels.
COMMON = [
    "trainer.epochs=1",
    "trainer.max_steps=6",
    "trainer.log_every=2",
    "trainer.batch_size=16",
    "trainer.eval_batch_size=32",
    "trainer.progress=false",
    "trainer.num_threads=1",
    "trainer.deterministic=true",
    "trainer.seed=0",
    "eval.viz_images=0",
    "eval.seed=1234",
]
_SKETCH = ["data.val_size=4", "data.image_size=32", "data.completion_steps=4", "data.num_train=64", "data.num_test=32"]

#: method -> its run: ``config`` (a file of configs/), ``data`` (a folder of the shared data, or None: generated
#: or embedded data), ``overrides`` (on top of :data:`COMMON`) and ``phase1`` (the method whose run writes the
#: ``phase1.safetensors`` this one loads).
CASES: dict[str, dict[str, Any]] = {
    "ram": {
        "config": "ram_digits.yaml",
        "data": None,
        "overrides": ["data.num_train=96", "data.val_size=32", "data.num_test=32"],
    },
    "cnn": {
        "config": "cnn_cluttered60.yaml",
        "data": None,
        "overrides": ["data.name=digits", "data.num_train=96", "data.val_size=32", "data.num_test=32"],
    },
    "unified": {
        "config": "unified_cluttered60_entropy_context.yaml",
        "data": None,
        "overrides": ["data.name=digits", "data.num_train=96", "data.val_size=32", "data.num_test=32"],
    },
    "rarl": {
        "config": "rarl_digits.yaml",
        "data": "mnist",
        "overrides": ["data.num_train=96", "data.val_size=32", "data.num_test=32"],
    },
    "dcpg": {
        "config": "dcpg_digit_scenes.yaml",
        "data": "mnist",
        "overrides": ["data.num_train=64", "data.num_test=32", "model.embed_dim=32", "model.num_bins=10"],
    },
    "scal": {
        "config": "scal_omniglot.yaml",
        "data": "omniglot",
        "overrides": ["data.num_train=64", "data.num_test=32", "data.reid_val_ids=4"],
    },
    "darp_triplet": {"config": "darp_triplet_omniglot.yaml", "data": "omniglot", "overrides": _SKETCH},
    "darp": {"config": "darp_omniglot.yaml", "data": "omniglot", "overrides": _SKETCH, "phase1": "darp_triplet"},
    "darp_policy": {
        "config": "darp_vanilla_rl_omniglot.yaml",
        "data": "omniglot",
        "overrides": _SKETCH,
        "phase1": "darp_triplet",
    },
}

#: report entries that are timings or paths, not behaviour
_VOLATILE = {"run_dir", "train_seconds", "prepare_seconds", "epoch_seconds", "figures", "artifacts"}


def weights_sha256(checkpoint: Path) -> str:
    """SHA-256 over the checkpoint's model state: every entry in key order, its name, dtype, shape and bytes."""
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]
    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key]
        h.update(key.encode())
        if isinstance(t, torch.Tensor):
            t = t.detach().cpu().contiguous().reshape(-1)
            h.update(f"{t.dtype}{tuple(state[key].shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr(t).encode())
    return h.hexdigest()


def _clean(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in _VOLATILE}


def run_case(method: str, configs: Path, data_root: Path, work: Path, runs: dict[str, Path]) -> dict[str, Any]:
    """Train ``method`` as :data:`CASES` says (in a new process) and return its entry of the results file."""
    case = CASES[method]
    argv = [sys.executable, "-m", "rlattention.cli", "fit", "--config", str(configs / case["config"])]
    if case["data"]:
        folder = data_root / case["data"]
        if not folder.is_dir():
            return {"skipped": f"data folder {folder} not found (--data-dir)"}
        argv += ["--data-dir", str(folder)]
    argv += [*COMMON, *case["overrides"], f"trainer.out_dir={work}", f"trainer.run_name={method}"]
    if "render_cache" not in " ".join(case["overrides"]):
        argv.append(f"data.render_cache={work / 'render_cache'}")
    if case.get("phase1"):
        source = runs.get(case["phase1"])
        if source is None:
            return {"skipped": f"needs the phase-1 run of {case['phase1']}, which did not run"}
        argv.append(f"model.phase1={source / 'phase1.safetensors'}")
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{method}: rlattention fit exited with {done.returncode}:\n{tail}")
    run_dir = work / method
    runs[method] = run_dir
    report = json.loads((run_dir / "report.json").read_text())
    print(f"  {method}: {seconds:.1f} s", file=sys.stderr, flush=True)
    return {
        "config": case["config"],
        "report": _clean(report),
        "last_weights_sha256": weights_sha256(run_dir / "checkpoints" / "last.ckpt"),
        "best_weights_sha256": weights_sha256(run_dir / "checkpoints" / "best.ckpt"),
    }


def registered_methods() -> list[str]:
    from rlattention.engine.registry import available_methods

    return available_methods()


def run_all(methods: list[str], configs: Path, data_root: Path) -> dict[str, Any]:
    import torch

    import rlattention

    results: dict[str, Any] = {}
    order = sorted(methods, key=lambda m: (bool(CASES.get(m, {}).get("phase1")), m))  # phase 1 before phase 2
    with tempfile.TemporaryDirectory(prefix="rlattention-refactor-check-") as tmp:
        work = Path(tmp)
        env_cache = os.environ.get("RLATTENTION_CACHE")
        os.environ["RLATTENTION_CACHE"] = str(work / "cache")  # a fresh cache: no hit/miss difference between runs
        os.environ.setdefault("MPLCONFIGDIR", str(work / "mpl"))
        runs: dict[str, Path] = {}
        try:
            for method in order:
                if method not in CASES:
                    results[method] = {"skipped": "no case in benchmarks/refactor_check.py CASES: add one"}
                    continue
                print(f"refactor_check: {method} ...", file=sys.stderr, flush=True)
                results[method] = run_case(method, configs, data_root, work, runs)
        finally:
            if env_cache is None:
                os.environ.pop("RLATTENTION_CACHE", None)
            else:
                os.environ["RLATTENTION_CACHE"] = env_cache
    return {
        "library": str(Path(rlattention.__file__).resolve().parent),
        "torch": torch.__version__,
        "common_overrides": COMMON,
        "methods": {m: results[m] for m in sorted(results)},
    }


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: obj}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _note(x: Any, y: Any) -> str:
    """The size of a numeric change, and whether it is a change of unit (a fraction now in percent: x100)."""
    if not (isinstance(x, int | float) and isinstance(y, int | float)) or isinstance(x, bool):
        return ""
    if x != 0 and math.isclose(y, 100 * x, rel_tol=1e-12):
        return "  (x100: a fraction now in percent)"
    return f"  (delta {y - x:+.3g})"


def diff(before: dict, after: dict) -> list[str]:
    """One line per difference in the methods' entries (metrics, steps, checksums); [] when identical."""
    a, b = _flatten(before.get("methods", {})), _flatten(after.get("methods", {}))
    lines = []
    for key in sorted(set(a) | set(b)):
        if key not in a:
            lines.append(f"+ {key}: {b[key]!r} (only after)")
        elif key not in b:
            lines.append(f"- {key}: {a[key]!r} (only before)")
        elif not _same(a[key], b[key]):
            x, y = a[key], b[key]
            lines.append(f"~ {key}: {x!r} -> {y!r}{_note(x, y)}")
    return lines


def report_diff(before_path: Path, after: dict, after_name: str) -> int:
    before = json.loads(Path(before_path).read_text())
    lines = diff(before, after)
    n = len(before.get("methods", {}))
    if lines:
        print(f"refactor_check: {len(lines)} difference(s) between {before_path} and {after_name}:")
        print("\n".join(lines))
        return 1
    print(f"refactor_check: identical ({n} methods: metrics and weight checksums) {before_path} == {after_name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", help="JSON file to write the results to")
    p.add_argument("--against", metavar="BEFORE.json", help="after writing OUT, compare it with this file")
    p.add_argument("--diff", nargs=2, metavar=("A.json", "B.json"), help="only compare two results files")
    p.add_argument("--methods", nargs="+", help="only these methods (default: every registered one)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ["RLATTENTION_DATA"]) if os.environ.get("RLATTENTION_DATA") else DEFAULT_DATA,
        help=f"the shared data folder (default: $RLATTENTION_DATA, else {DEFAULT_DATA})",
    )
    p.add_argument("--configs", type=Path, default=REPO / "configs", help="configs folder (default: this checkout's)")
    args = p.parse_args(argv)
    if args.diff:
        return report_diff(Path(args.diff[0]), json.loads(Path(args.diff[1]).read_text()), args.diff[1])
    if not args.out:
        p.error("give OUT (a JSON file to write) or --diff A.json B.json")
    methods = args.methods or registered_methods()
    result = run_all(methods, args.configs.resolve(), args.data_dir.resolve())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"refactor_check: wrote {out}", file=sys.stderr)
    if args.against:
        return report_diff(Path(args.against), result, str(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
