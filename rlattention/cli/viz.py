"""``rlattention viz``: attention figures of a checkpoint, in a new folder."""

from __future__ import annotations

import contextlib
from pathlib import Path


class NoFigures(Exception):
    """``viz`` of a method that draws no figures: one line saying why, exit code 2."""


def command(args) -> int:
    import torch

    from rlattention.engine.checkpoint import load_checkpoint_file
    from rlattention.engine.loading import _build_for_eval, _resolve_checkpoint
    from rlattention.engine.registry import get_method

    ckpt = _resolve_checkpoint(args.checkpoint)
    state = load_checkpoint_file(ckpt)
    method = state["config"].get("method")
    reason = get_method(method).visualization_unavailable() if isinstance(method, str) else None
    if reason:  # before the data are built or a folder is made
        raise NoFigures(f"{method} draws no figures: {reason}")
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
        raise NoFigures(f"{cfg.method} draws no figures for {ckpt}: {e}") from None
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
