"""``training``: every method on its config of ``configs/`` (:data:`TRAINING_CASES`) with generated data shaped like
the config's dataset: the bare training step (forward + backward + optimiser step on one pre-made batch) vs the
engine (``fit``, read from its logged ``train/images_per_s`` windows); engine overhead = 1 - engine / model only.
"""

from __future__ import annotations

import functools
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .common import (
    REPO,
    _machine_line,
    _quiet_fit,
    _rate,
    _row,
    _table,
    _trainer_section,
    engine_images_per_s,
    engine_rate,
    time_interleaved,
)

CONFIGS_DIR = REPO / "configs"


def _sketch_splits(train_items: int, seed: int = 0, small: bool = False, side: int = 64, steps: int = 17) -> Any:
    """Generated sketch-retrieval items the shape of QMUL-Chair-V2 at ``image_size: 64`` with 17 completion
    steps: ``(S + 3, 64, 64)`` uint8 = S partial renders (ink grows with the step) + the RGB photo; 270 training
    photos with one or two sketches each (``train_items`` clamped to 270..540 items, 82 kB each), 30 validation and 100
    test photos with one (``small``: 10 each)."""
    from rlattention.data.base import ArrayDataset, DataSplits

    g = torch.Generator().manual_seed(seed)
    n_train, n_val, n_test = (270, 10, 10) if small else (270, 30, 100)
    base = torch.rand(n_train + n_val + n_test, side, side, generator=g) > 0.85
    keep = torch.linspace(1.0 / steps, 1.0, steps)[None, :, None, None]
    tint = torch.tensor([255, 128, 64], dtype=torch.uint8)[None, :, None, None]

    def split(first: int, photos: int, n: int) -> ArrayDataset:
        ids = first + torch.arange(n) % photos
        full = base[ids] & (torch.rand(n, side, side, generator=g) > 0.2)
        partial = full[:, None] & (torch.rand(n, 1, side, side, generator=g) <= keep)
        photo = base[ids][:, None].to(torch.uint8) * tint
        return ArrayDataset(torch.cat((partial.to(torch.uint8) * 255, photo), 1), ids)

    train = split(0, n_train, min(max(train_items, n_train), 2 * n_train))  # every training photo
    val, test = split(n_train, n_val, n_val), split(n_train + n_val, n_test, n_test)
    return DataSplits(train, val, test, n_train + n_val + n_test, name="generated_sketches")


def _image_text_splits(train_captions: int, seed: int = 0, small: bool = False, regions: int = 6, dim: int = 69) -> Any:
    """Generated precomp image-text items the shape of the captioned digit scenes: ``(1, R = 6, D = 69)``
    region features per image, 5 captions per image of up to 16 tokens over a vocabulary of 64; 200
    validation and test images (``small``: 20)."""
    from rlattention.data.base import ArrayDataset, DataSplits
    from rlattention.data.image_text import GatheredImages

    vocab, length = 64, 16
    g = torch.Generator().manual_seed(seed)

    def split(n_images: int) -> ArrayDataset:
        feats = torch.randn(n_images, 1, regions, dim, generator=g)
        ids = torch.arange(n_images).repeat_interleave(5)
        n = len(ids)
        words = torch.randint(4, vocab, (n, length), generator=g)
        ends = torch.randint(6, length, (n, 1), generator=g)  # position of the end token
        pos = torch.arange(length)[None]
        tokens = torch.where(pos < ends, words, torch.zeros_like(words))
        tokens = torch.where(pos == ends, torch.full_like(words, 2), tokens)
        tokens[:, 0] = 1
        return ArrayDataset(GatheredImages(feats, ids), torch.cat((ids[:, None], tokens), 1))

    train = split(max(1, train_captions // 5))
    n_eval = 20 if small else 200
    return DataSplits(
        train, split(n_eval), split(n_eval), len(train) // 5, "generated_image_text", {"vocab_size": vocab}
    )


def _reid_splits(train_items: int, seed: int = 0, small: bool = False, side: int = 32, cameras: int = 4) -> Any:
    """Generated re-id items the shape of ``omniglot_reid`` at ``reid_size: [32, 32]``: 1-channel images,
    ``[pid, camera, role]`` targets, 8 images per training identity (``train_items / 8`` identities, pids
    0..K-1); validation and test: 16 identities, one query per camera pair and 4 gallery images each."""
    from rlattention.data.base import ArrayDataset, DataSplits

    g = torch.Generator().manual_seed(seed)
    n_ids = max(16, train_items // 8)
    protos = torch.rand(n_ids + 32, 1, side, side, generator=g) > 0.7

    def items(protos_of: Tensor, pids: Tensor, roles: int) -> ArrayDataset:
        cams = torch.arange(len(pids)) % cameras
        x = protos[protos_of].float() * (0.6 + 0.1 * cams.float())[:, None, None, None]
        x = (x + 0.15 * torch.rand(x.shape, generator=g)).clamp(0, 1)
        targets = torch.stack([pids, cams, torch.full_like(pids, roles)], 1)
        return ArrayDataset((x * 255).to(torch.uint8), targets)

    ids = torch.arange(n_ids).repeat_interleave(8)
    train = items(ids, ids, 0)

    def eval_split(first: int) -> ArrayDataset:
        own = first + torch.arange(16)
        q = items(own.repeat_interleave(2), own.repeat_interleave(2) - first + 1, 1)
        gal = items(own.repeat_interleave(4), own.repeat_interleave(4) - first + 1, 2)
        return ArrayDataset(torch.cat([q.images, gal.images]), torch.cat([q.targets, gal.targets]))

    return DataSplits(
        train, eval_split(n_ids), eval_split(n_ids + 16), n_ids, name="generated_reid", meta={"reid": True}
    )


def _multilabel_splits(train_items: int, seed: int = 0, small: bool = False) -> Any:
    """``multilabel_digits`` as ``configs/rarl_digits.yaml`` sets it up (64x64 canvases, 2-4 digits scaled by
    0.8-1.1, no clutter), drawn from the embedded rendered digits instead of MNIST; 256 validation and test
    canvases (``small``: 64)."""
    from rlattention.data.base import ArrayDataset, DataSplits
    from rlattention.data.synthetic.digits import make_digits
    from rlattention.data.synthetic.multilabel_digits import make_multilabel_digits

    source, labels = make_digits(2000, canvas=28, seed=seed)
    opts = dict(canvas=64, min_digits=2, max_digits=4, scale_range=(0.8, 1.1), num_clutter=0)
    splits = [
        ArrayDataset(*make_multilabel_digits(source, labels, n, seed=seed + i, **opts))
        for i, n in enumerate((train_items, 64, 64) if small else (train_items, 256, 256))
    ]
    return DataSplits(*splits, 10, name="generated_multilabel_digits")


#: method -> the config it is measured with (a file of ``configs/``), what its items are, and its data: either
#: ``data`` (``data:`` overrides; a generated dataset of the registry, built as ``fit`` builds it) or ``splits``
#: (a generator of ``DataSplits`` shaped like the config's real dataset, given the training items wanted).
TRAINING_CASES: dict[str, dict[str, Any]] = {
    "ram": {
        "config": "ram_digits.yaml",
        "item": "40x40 digit image",
        "data": {"name": "digits", "canvas_size": 40, "val_size": 256, "num_test": 256},
    },
    "cnn": {
        "config": "cnn_cluttered60.yaml",
        "item": "60x60 digit image",
        "data": {"name": "digits", "canvas_size": 60, "val_size": 256, "num_test": 256},
    },
    "unified": {
        "config": "unified_cluttered60_entropy_context.yaml",
        "item": "60x60 digit image",
        "data": {"name": "digits", "canvas_size": 60, "val_size": 256, "num_test": 256},
    },
    "rarl": {"config": "rarl_digits.yaml", "item": "64x64 multi-label canvas", "splits": _multilabel_splits},
    "darp_triplet": {
        "config": "darp_triplet_chairv2.yaml",
        "item": "sketch (17 steps, 64x64)",
        "splits": _sketch_splits,
    },
    "darp": {
        "config": "darp_chairv2.yaml",
        "item": "sketch (17 steps, 64x64)",
        "splits": _sketch_splits,
        "phase1": True,
    },
    "darp_policy": {
        "config": "darp_vanilla_rl_chairv2.yaml",
        "item": "sketch (17 steps, 64x64)",
        "splits": _sketch_splits,
        "phase1": True,
    },
    "dcpg": {"config": "dcpg_digit_scenes.yaml", "item": "caption (6 regions x 69)", "splits": _image_text_splits},
    "scal": {"config": "scal_omniglot.yaml", "item": "32x32 re-id image", "splits": _reid_splits},
}


def _training_config(method: str, trainer: dict, extra: Mapping[str, Any] | None = None):
    """The method's config file with ``trainer`` (and ``extra`` dotted overrides) on top."""
    from rlattention.engine.config import build_config, read_config_file

    case = TRAINING_CASES[method]
    raw = read_config_file(CONFIGS_DIR / case["config"])
    raw["trainer"] = {**raw.get("trainer", {}), **trainer}
    raw["eval"] = {**raw.get("eval", {}), "viz_images": 0}
    raw["data"] = {**raw.get("data", {}), **case.get("data", {})}
    return build_config(raw, dict(extra or {}), source=f"bench training ({case['config']})")


def build_splits_and_model(cfg, splits=None, data_dir: str | None = None):
    """The data splits, the model and the optimiser of ``cfg`` built as :func:`fit` builds them (seeded with
    ``trainer.seed``, ``on_fit_start`` called); ``splits`` when given (as ``fit(splits=...)``)."""
    from rlattention.data.registry import build_dataset
    from rlattention.engine.trainer import build_model, make_optimizer

    torch.manual_seed(cfg.trainer.seed)
    if splits is None:
        splits = build_dataset(cfg.data.name, cfg.data, data_dir or cfg.data.data_dir)
    model = build_model(cfg, splits)
    model.train()
    return splits, model, make_optimizer(model.parameters(), cfg.optim)


def _first_batch(cfg, splits) -> tuple[Tensor, Tensor]:
    """The first training batch the engine's loader gives (same sampler, same uint8 -> float conversion)."""
    from rlattention.engine.loader import BatchLoader

    tc = cfg.trainer
    loader = BatchLoader(splits.train, tc.batch_size, True, tc.seed, sampler=tc.sampler, instances=tc.pk_instances)
    return next(iter(loader))


def _model_steps(model, optimizer, images: Tensor, targets: Tensor, steps: int, grad_clip: float) -> None:
    """The bare training step: forward, backward, (gradient clipping when the config asks for it), step."""
    for _ in range(steps):
        out = model(images, targets)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()


def _phase1_file(workdir: Path, threads: int, small: bool) -> Path:
    """A darp phase-1 file (``phase1.safetensors``) from a 2-step fit of ``configs/darp_triplet_chairv2.yaml``
    on the generated sketches: what phase 2 (``darp``, ``darp_policy``) loads; its speed does not depend on
    how well phase 1 was trained."""
    cfg = _training_config(
        "darp_triplet", _trainer_section(threads, 2, 1, 64, workdir, "phase1") | {"eval_batch_size": 128}
    )
    report = _quiet_fit(cfg, splits=_sketch_splits(540, small=small))  # the photos of phase 2's splits
    path = Path(report["run_dir"]) / "phase1.safetensors"
    if not path.is_file():
        raise RuntimeError(f"the darp_triplet fit wrote no phase-1 file at {path}")
    return path


def _training_skip_reason(method: str) -> str | None:
    case = TRAINING_CASES[method]
    path = CONFIGS_DIR / case["config"]
    if not path.is_file():
        return f"config {path} not found (the benchmark reads the repository's configs/)"
    return None


def bench_training(
    quick: bool = False,
    threads: int | None = None,
    methods: list[str] | tuple[str, ...] | None = None,
    windows: int | None = None,
    window_s: float | None = None,
) -> dict[str, Any]:
    """Training throughput of every method: the bare model step vs the engine (:func:`fit`).

    Per method, on its config of ``configs/`` (:data:`TRAINING_CASES`) with generated data shaped like the
    config's dataset and the config's batch size: (i) model only: forward + backward + optimiser step on one
    pre-made batch (the loader's first), timed in blocks sized to about 0.25 s (``--quick``: 0.1 s), median of 7
    (3); (ii) engine: ``fit`` for ``windows + 1`` logging windows of about ``window_s`` seconds each (the number
    of steps per window from the model-only step time), its rate the median of the ``train/images_per_s``
    windows without the first. Overhead = 1 - engine / model only. ``methods``: a subset (default: all).
    """
    threads = threads or torch.get_num_threads()
    names = list(methods) if methods else list(TRAINING_CASES)
    unknown = [m for m in names if m not in TRAINING_CASES]
    if unknown:
        raise ValueError(
            f"unknown method(s) for the training benchmark: {', '.join(unknown)}; "
            f"available: {', '.join(TRAINING_CASES)}"
        )
    windows = windows or (3 if quick else 6)
    window_s = window_s or (0.3 if quick else 1.5)
    block_s, repeat = (0.1, 3) if quick else (0.25, 7)
    epoch_steps = 12 if quick else 40  # training items generated: batch x this (the engine may run more epochs)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rlattention-bench-training-") as tmp:
        work = Path(tmp)
        phase1: Path | None = None
        for method in names:
            case = TRAINING_CASES[method]
            reason = _training_skip_reason(method)
            if reason:
                rows.append({"method": method, "config": case["config"], "skipped": reason})
                continue
            extra = {}
            if case.get("phase1"):
                phase1 = phase1 or _phase1_file(work / "phase1", threads, quick)
                extra["model.phase1"] = str(phase1)
            t_method = time.perf_counter()
            print(f"training: {method} ...", file=sys.stderr, flush=True)
            probe = _training_config(method, {"num_threads": threads}, extra)
            batch = probe.trainer.batch_size
            if quick:  # a smoke run: a quarter of the config's batch (a multiple of the pk sampler's K)
                k = probe.trainer.pk_instances if probe.trainer.sampler == "pk" else 1
                batch = max(2 * k, batch // 4 // k * k)
                probe.trainer.batch_size = batch
            n_train = batch * epoch_steps
            if "splits" in case:
                splits = case["splits"](n_train, seed=probe.data.seed, small=quick)
            else:
                if quick:
                    probe.data.val_size = probe.data.num_test = 64
                probe.data.num_train = n_train + probe.data.val_size
                splits = None
            splits, model, optimizer = build_splits_and_model(probe, splits)
            images, targets = _first_batch(probe, splits)
            model.set_progress(0.5)  # the engine sets the schedules before every step; mid-training here
            clip = probe.optim.grad_clip
            _model_steps(model, optimizer, images, targets, 1, clip)  # first call: lazy initialisation
            single = []  # the fastest of a few single steps sizes the blocks and windows (robust to load spikes)
            for _ in range(2 if quick else 3):
                t0 = time.perf_counter()
                _model_steps(model, optimizer, images, targets, 1, clip)
                single.append(time.perf_counter() - t0)
            step_s = max(min(single), 1e-4)
            block = max(1, round(block_s / step_s))
            reps = repeat if step_s * block <= 1.0 else 3  # slow methods (darp phase 2): 3 blocks of one step
            med = time_interleaved(
                {"model": functools.partial(_model_steps, model, optimizer, images, targets, block, clip)},
                reps,
                0,
            )["model"]
            model_step_s = med / block
            log_every = max(1, round(window_s / model_step_s))
            steps = log_every * (windows + 1)
            trainer = _trainer_section(threads, steps, log_every, batch, work, method)
            cfg = _training_config(method, trainer, extra)
            if "splits" not in case:
                cfg.data = probe.data
            del model, optimizer
            t_engine = time.perf_counter()
            logged = engine_images_per_s(cfg, splits=splits)
            engine_wall = time.perf_counter() - t_engine
            engine_ips, used = engine_rate(logged)
            model_ips = batch / model_step_s
            rows.append(
                {
                    "method": method,
                    "config": case["config"],
                    "item": case["item"],
                    "dataset": splits.name,
                    "item_shape": list(splits.image_shape),
                    "batch": batch,
                    "optimizer": f"{probe.optim.name}, lr {probe.optim.lr:g}" + (f", clip {clip:g}" if clip else ""),
                    "model_steps_per_timing": block,
                    "model_timings": reps,
                    "model_only_items_per_s": model_ips,
                    "model_only_ms_per_step": 1e3 * model_step_s,
                    "engine_items_per_s": engine_ips,
                    "engine_ms_per_step": 1e3 * batch / engine_ips,
                    "engine_max_steps": steps,
                    "engine_log_every": log_every,
                    "engine_windows_items_per_s": logged,
                    "engine_windows_used": used,
                    "engine_fit_s": engine_wall,
                    "engine_overhead": 1.0 - engine_ips / model_ips,
                    "seconds": time.perf_counter() - t_method,
                }
            )
            shutil.rmtree(work / method, ignore_errors=True)
    return {
        "settings": {
            "methods": names,
            "threads": threads,
            "model_block_s": block_s,
            "batch": "the config's" + (" / 4 (quick)" if quick else ""),
            "repeat": repeat,
            "engine_windows": windows,
            "engine_window_s": window_s,
            "train_items": f"batch x {epoch_steps}",
            "data": "generated (no downloads), shaped like each config's dataset",
            "statistic": "median",
            "quick": quick,
        },
        "methods": rows,
    }


def training_markdown(r: dict) -> str:
    s = r["settings"]
    rows, skipped = [], []
    for m in r["methods"]:
        if "skipped" in m:
            skipped.append(f"- {m['method']}: skipped, {m['skipped']}")
            continue
        rows.append(
            [
                m["method"],
                f"`{m['config']}`",
                m["item"],
                m["batch"],
                m["model_only_items_per_s"],
                m["engine_items_per_s"],
                m["model_only_ms_per_step"],
                m["engine_ms_per_step"],
                f"{100 * m['engine_overhead']:.1f}%",
            ]
        )
    headers = [
        "method",
        "config",
        "item",
        "batch",
        "model only items/s",
        "engine items/s",
        "model only ms/step",
        "engine ms/step",
        "engine overhead",
    ]
    notes = "\n".join(skipped) + ("\n\n" if skipped else "")
    return (
        f"### training: training step per method, model only vs engine (`fit`), generated data\n\n"
        f"{_table(headers, rows)}\n\n{notes}"
        f"Model only: forward + backward + optimiser step on one pre-made batch (median of {s['repeat']} blocks "
        f"of about {s['model_block_s']:g} s); engine: median of {s['engine_windows']} logged windows of about "
        f"{s['engine_window_s']:g} s after a warm-up window. Overhead = 1 - engine / model only.\n\n"
        f"{_machine_line(r)}\n"
    )


def summary_rows(r: dict) -> list[dict]:
    rows = []
    for m in r["methods"]:
        if "skipped" in m:
            rows.append(_row(f"{m['method']}: skipped ({m['skipped']})", "", "", None))
            continue
        rows.append(
            _row(
                f"{m['method']} (`{m['config']}`, batch {m['batch']}): engine vs model only",
                _rate(m["engine_items_per_s"], "items"),
                _rate(m["model_only_items_per_s"], "items"),
                m["engine_items_per_s"] / m["model_only_items_per_s"],
            )
        )
    return rows
