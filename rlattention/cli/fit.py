"""``rlattention fit``: train a method (a new run, or ``--resume`` one in progress)."""

from __future__ import annotations

from pathlib import Path

from rlattention.cli.report import format_metrics


def command(args) -> int:
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
    stopped = " (stopped early)" if report.get("early_stopped") else ""
    print(
        f"\nfinal {split} {format_metrics(report[split])} ({how}) after {report['epochs']} epochs{stopped}, "
        f"{report['train_seconds']:.0f}s; best epoch {report['best_epoch']}"
    )
    print(f"run folder: {report['run_dir']}")
    if report.get("figures"):
        print(f"figures: {Path(report['figures'][0]).parent}")
    return 0
