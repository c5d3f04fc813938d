"""``rlattention eval``: the metrics of a checkpoint on a split (optionally of another dataset, or under a PGD
attack), printed and kept in the run folder's ``eval.json``."""

from __future__ import annotations

import datetime
import json
import shlex
import sys
import time
from pathlib import Path

from rlattention.cli.report import format_metrics


def command(args) -> int:
    from rlattention.engine.loading import evaluate_checkpoint

    started = time.time()
    attack = None
    if args.attack == "pgd":
        attack = {"epsilon": args.epsilon, "step_size": args.step_size, "steps": args.steps}
    record: dict = {}
    if args.data or args.overrides:
        m = _evaluate_on_data(args, attack, record)
    else:
        m = evaluate_checkpoint(
            args.checkpoint,
            args.data_dir,
            args.split,
            args.mc_samples,
            args.seed,
            args.batch_size,
            args.accelerator,
            attack=attack,
            limit=args.limit,
            devices=args.devices,
            strategy=args.strategy,
            record=record,
        )
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if rank_zero_only.rank != 0:  # every process has the metrics of the whole split; one prints (and saves) them
        return 0
    how = f"average of {args.mc_samples} sampled episodes" if args.mc_samples else "mean locations"
    if attack:
        how += f", PGD eps={args.epsilon} step={args.step_size} steps={args.steps}"
    on = f" of {args.data}" if args.data else ""
    line = f"{args.split}{on}: {format_metrics(m)} ({int(m['count'])} images, {how}, seed {args.seed})"
    print(json.dumps(m) if args.json else line, flush=True)
    if not args.no_save:
        path = _save_eval(args, m, line, attack, record, started)
        # --json: stdout stays the metrics' JSON line alone
        print(f"results: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _eval_config(config: dict, data: str | None, overrides: list[str], source: str) -> dict:
    """The checkpoint's ``config`` with its ``data`` section swapped to dataset ``data`` (``data_dir`` cleared,
    ``completion_steps`` back to the dataset's default) and ``data.key=value`` ``overrides`` applied, checked
    against the schema."""
    from rlattention.engine.config import ConfigError, build_config, parse_overrides, to_dict

    pairs = parse_overrides(overrides)
    bad = [k for k in pairs if not k.startswith("data.") or k in ("data.name", "data.data_dir")]
    if bad:
        raise ConfigError(
            f"{', '.join(bad)}: only data.key=value overrides are accepted (not data.name or "
            "data.data_dir: use --data NAME and --data-dir)"
        )
    config = dict(config)
    section = dict(config.get("data") or {})
    if data and data != section.get("name"):
        section.update(name=data, data_dir=None, completion_steps=None)
    config["data"] = section
    return to_dict(build_config(config, pairs, source=source))


def _evaluate_on_data(args, attack: dict | None, record: dict) -> dict:
    """``evaluate_checkpoint`` with the checkpoint's data settings replaced (``--data``, ``data.*`` overrides);
    ``record`` is filled as ``evaluate_checkpoint`` fills it."""
    import torch

    from rlattention.engine.checkpoint import load_checkpoint_file
    from rlattention.engine.config import from_dict
    from rlattention.engine.distributed import _collectives_fail_clearly
    from rlattention.engine.evaluate import evaluate, evaluate_under_attack
    from rlattention.engine.loading import _build_for_eval, _eval_fabric, _resolve_checkpoint, eval_record

    ckpt = load_checkpoint_file(_resolve_checkpoint(args.checkpoint))
    source = f"{args.checkpoint} (config with --data/overrides)"
    ckpt["config"] = _eval_config(ckpt["config"], args.data, args.overrides, source)
    cfg = from_dict(ckpt["config"], source=source)
    fabric = _eval_fabric(cfg, args.accelerator, args.devices, args.strategy)
    with _collectives_fail_clearly(fabric, cfg.trainer.collective_timeout_minutes):
        cfg, model, splits = _build_for_eval(ckpt, args.checkpoint, args.data_dir, fabric)
        dataset = getattr(splits, args.split)
        if len(dataset) == 0:
            raise ValueError(f"the {args.split} split of {cfg.data.name} is empty with these data settings")
        if args.limit > 0:
            dataset = dataset.subset(torch.arange(min(args.limit, len(dataset))))
        record.update(eval_record(args.checkpoint, cfg, args.data_dir, len(dataset)))
        model = fabric.setup_module(model)
        if attack:
            return evaluate_under_attack(
                fabric, model, dataset, args.batch_size, seed=args.seed, progress=True, **attack
            )
        return evaluate(fabric, model, dataset, args.batch_size, args.mc_samples, args.seed, progress=True)


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _save_eval(args, metrics: dict, line: str, attack: dict | None, record: dict, started: float) -> Path:
    """Write ``eval.json`` (see ``_eval_target``) and return its path: the metrics as printed (the ``--json``
    line: same names, same values) and the console's line, the checkpoint (absolute path, sha256, method), the
    split, seed, mc_samples, batch size, limit, processes, attack settings, dataset, data folder and overrides,
    the command line, the working folder, the time and the versions."""
    import platform

    import torch

    import rlattention
    from rlattention.engine.rundir import write_new_text
    from rlattention.metrics import METRIC_UNITS

    ckpt = Path(record["checkpoint"])
    result = {
        "metrics": metrics,
        "units": METRIC_UNITS,
        "summary": line,
        "checkpoint": str(ckpt),
        "checkpoint_sha256": _sha256(ckpt),
        "method": record.get("method"),
        "split": args.split,
        "seed": args.seed,
        "mc_samples": args.mc_samples,
        "batch_size": args.batch_size,
        "limit": args.limit,
        "devices": args.devices,
        "attack": None if attack is None else {"name": args.attack, **attack},
        "dataset": record.get("dataset"),
        "data_dir": record.get("data_dir"),
        "data_overrides": list(args.overrides),
        "images": record.get("images"),
        "command": shlex.join(["rlattention", *args.argv]),
        "cwd": str(Path.cwd()),
        "time": datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 2),
        "versions": {
            "rlattention": rlattention.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }
    target, numbered = _eval_target(args, ckpt)
    return write_new_text(target, json.dumps(result, indent=2) + "\n", numbered=numbered)


def _eval_target(args, ckpt: Path) -> tuple[Path, bool]:
    """Where ``eval`` writes: ``(path, numbered)``. ``--out FILE``: that new file (its folder is created);
    else ``eval.json`` in the checkpoint's run folder, or next to a checkpoint outside any run folder, numbered
    ``eval-2.json``, ``eval-3.json``... when taken."""
    from rlattention.engine.rundir import find_run_dir

    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        return out, False
    run = find_run_dir(ckpt)
    return (run if run is not None else ckpt.parent) / "eval.json", True
