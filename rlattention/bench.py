"""Speed benchmarks: ``rlattention bench [sensor|ram_throughput|...|training] --threads 2 [--quick]``.

Every benchmark times the fast code and a simple reference *in the same run* (interleaved, so background load
hits both alike, except the engine runs of ``ram_throughput`` and ``training``: a whole ``fit`` follows the
model-only timing, so a load change between the two shows as engine overhead) and reports a ratio next to the
absolute times. Timing: :func:`time.perf_counter`, warm-up
calls first, then the median of the repetitions. Each result records the machine (CPU, cores, torch version,
threads, load average) and a time stamp, and is written to ``<out>/<name>.json`` and ``<out>/<name>.md``.

``sensor``: one episode of 6 glimpses at fixed random locations in [-1, 1], batch 128, (a) 28x28 images, 8x8
glimpses, 1 scale and (b) 100x100 images, 12x12 glimpses, 4 scales (factor 2). Fast: ``GlimpseSensor.prepare``
once and 6 ``extract`` calls ("area" and "nearest" modes); reference: :func:`glimpse_public_reference` called 6
times, which redoes everything per glimpse as public RAM code does. Target: >= 10x on 2 cores.

``ram_throughput``: RAM with the default ``RAMConfig`` (6 glimpses of 8x8, 28x28 inputs, 10 classes), batch 128,
Adam. (i) model only: forward + backward + optimiser step on one pre-made batch; (ii) engine: the real
training loop (:func:`rlattention.engine.trainer.fit`), read from the ``train/images_per_s`` it logs; the
engine overhead is ``1 - engine / model-only``; (iii) model only with the glimpses extracted by
:func:`glimpse_public_reference` (locations clamped to [-1, 1], as public code does). Targets: >= 7,000
images/s in the engine and an overhead <= 10%.

``training``: every method on its config of ``configs/`` (:data:`TRAINING_CASES`) with generated data shaped like
the config's dataset: the bare training step (forward + backward + optimiser step on one pre-made batch) vs the
engine (``fit``, read from its logged ``train/images_per_s`` windows); engine overhead = 1 - engine / model only.

When more than one benchmark runs, ``<out>/summary.md`` holds one table of every comparison (:func:`summary_rows`
per benchmark, from the stored results), the machine and the command.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlattention.vision import GlimpseSensor
from rlattention.vision.reference import glimpse_public_reference

SENSOR_SPEEDUP_TARGET = 10.0
RAM_IMAGES_PER_S_TARGET = 7000.0
RAM_OVERHEAD_TARGET = 0.10


# ----------------------------------------------------------------------------------------------- helpers


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int) -> dict[str, Any]:
    """Where and with what a benchmark ran."""
    uname = platform.uname()
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "processor": platform.processor(),
        "uname": f"{uname.system} {uname.release} {uname.machine}",
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "torch_num_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_available"] = len(os.sched_getaffinity(0))
    if hasattr(os, "getloadavg"):
        info["load_average_1min"] = round(os.getloadavg()[0], 2)
    return info


def _timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]], repeat: int, warmup: int, settle: bool = False
) -> dict[str, float]:
    """Median wall time in seconds of each function; the functions take turns, so load affects all alike.

    ``settle``: call each function once untimed right before its timed call. A sub-millisecond call timed right
    after a long one of many small ops (a per-item Python loop) is slowed by what that left behind (measured:
    0.90 vs 0.69 ms for the same crop call); settling removes that order effect."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            if settle:
                fn()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _machine_line(r: dict) -> str:
    m = r["machine"]
    return (
        f"{r['timestamp']}; {m['cpu']} ({m['cpu_count']} CPUs), torch {m['torch']}, {m['threads']} threads, "
        f"load average {m.get('load_average_1min', '?')}{', quick' if r['settings'].get('quick') else ''}"
    )


# ----------------------------------------------------------------------------------------------- sensor

SENSOR_CASES = [
    {"case": "a", "height": 28, "width": 28, "glimpse_size": 8, "num_scales": 1},
    {"case": "b", "height": 100, "width": 100, "glimpse_size": 12, "num_scales": 4},
]


def bench_sensor(quick: bool = False, batch: int = 128, glimpses: int = 6, seed: int = 0) -> dict[str, Any]:
    """Glimpse sensor per episode: prepare once + ``glimpses`` extracts vs the public-style reference."""
    repeat, warmup = (5, 1) if quick else (21, 3)
    scale_factor = 2
    gen = torch.Generator().manual_seed(seed)
    locations = torch.rand(glimpses, batch, 2, generator=gen) * 2 - 1  # the same for every case and method
    cases = []
    for case in SENSOR_CASES:
        H, W, g, k = case["height"], case["width"], case["glimpse_size"], case["num_scales"]
        images = torch.rand(batch, 1, H, W, generator=gen)
        sensors = {mode: GlimpseSensor(g, k, scale_factor, mode) for mode in ("area", "nearest")}
        prepared = {mode: s.prepare(images) for mode, s in sensors.items()}

        def episode(sensor: GlimpseSensor, images: Tensor = images) -> None:
            p = sensor.prepare(images)
            for t in range(glimpses):
                sensor.extract(p, locations[t])

        def extracts(sensor: GlimpseSensor, p: Tensor) -> None:
            for t in range(glimpses):
                sensor.extract(p, locations[t])

        def reference(images: Tensor = images, g: int = g, k: int = k) -> None:
            for t in range(glimpses):
                glimpse_public_reference(images, locations[t], g, k, scale_factor)

        med = time_interleaved(
            {
                "area": lambda s=sensors["area"]: episode(s),
                "nearest": lambda s=sensors["nearest"]: episode(s),
                "reference": reference,
                "extract_area": lambda s=sensors["area"], p=prepared["area"]: extracts(s, p),
                "extract_nearest": lambda s=sensors["nearest"], p=prepared["nearest"]: extracts(s, p),
                "prepare": lambda s=sensors["area"], x=images: s.prepare(x),
            },
            repeat,
            warmup,
        )
        nearest_glimpse = sensors["nearest"](images, locations[0])
        diff = (nearest_glimpse - glimpse_public_reference(images, locations[0], g, k, scale_factor)).abs().max()
        speedup_area = med["reference"] / med["area"]
        cases.append(
            {
                **case,
                "scale_factor": scale_factor,
                "channels": 1,
                "fast_area_ms_per_episode": 1e3 * med["area"],
                "fast_nearest_ms_per_episode": 1e3 * med["nearest"],
                "reference_ms_per_episode": 1e3 * med["reference"],
                "speedup_area": speedup_area,
                "speedup_nearest": med["reference"] / med["nearest"],
                "prepare_ms": 1e3 * med["prepare"],
                "extract_area_ms_per_glimpse": 1e3 * med["extract_area"] / glimpses,
                "extract_nearest_ms_per_glimpse": 1e3 * med["extract_nearest"] / glimpses,
                "max_abs_diff_nearest_vs_reference": float(diff),
                "meets_target": bool(speedup_area >= SENSOR_SPEEDUP_TARGET),
            }
        )
    return {
        "settings": {
            "batch": batch,
            "glimpses_per_episode": glimpses,
            "locations": "fixed, uniform in [-1, 1]",
            "repeat": repeat,
            "warmup": warmup,
            "statistic": "median",
            "quick": quick,
        },
        "targets": {"speedup_min": SENSOR_SPEEDUP_TARGET},
        "cases": cases,
    }


def sensor_markdown(r: dict) -> str:
    s = r["settings"]
    rows = [
        [
            f"({c['case']}) {c['height']}x{c['width']}, g={c['glimpse_size']}, k={c['num_scales']}",
            c["fast_area_ms_per_episode"],
            c["fast_nearest_ms_per_episode"],
            c["reference_ms_per_episode"],
            c["speedup_area"],
            c["speedup_nearest"],
            c["extract_area_ms_per_glimpse"],
            c["prepare_ms"],
            c["meets_target"],
        ]
        for c in r["cases"]
    ]
    headers = [
        "case",
        "area ms/episode",
        "nearest ms/episode",
        "public reference ms/episode",
        "speed-up (area)",
        "speed-up (nearest)",
        "extract ms/glimpse (area)",
        "prepare ms",
        f">= {r['targets']['speedup_min']:g}x",
    ]
    return (
        f"### sensor: one episode of {s['glimpses_per_episode']} glimpses, batch {s['batch']} "
        f"(median of {s['repeat']})\n\n{_table(headers, rows)}\n\n{_machine_line(r)}\n"
    )


# ----------------------------------------------------------------------------------------------- RAM


class PublicReferenceSensor(GlimpseSensor):
    """The glimpse sensor replaced by :func:`glimpse_public_reference`: nothing prepared, locations clamped."""

    def prepare(self, images: Tensor) -> Tensor:
        return images

    def extract(self, prepared: Tensor, locations: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        loc = locations.clamp(-1.0, 1.0)
        return glimpse_public_reference(prepared, loc, self.size, self.num_scales, self.scale_factor).to(dtype)


def _build_ram(public_reference: bool = False, seed: int = 0):
    from rlattention.engine.method import DataInfo
    from rlattention.methods.ram import RAM, RAMConfig

    torch.manual_seed(seed)
    cfg = RAMConfig()
    model = RAM(cfg, DataInfo((1, 28, 28), 10))
    if public_reference:
        model.sensor = PublicReferenceSensor(cfg.glimpse_size, cfg.num_scales, cfg.scale_factor, cfg.glimpse_mode)
    model.train()
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _train_steps(model, optimizer, images: Tensor, targets: Tensor, steps: int) -> None:
    for _ in range(steps):
        out = model(images, targets)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()


def mnist_dir() -> Path | None:
    """``$RLATTENTION_DATA/mnist`` when set, else ``../shared/data/mnist`` beside the repository; None if absent."""
    env = os.environ.get("RLATTENTION_DATA")
    root = Path(env).expanduser() if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"
    path = root / "mnist"
    return path if path.is_dir() else None


def _quiet_fit(cfg, data_dir: str | None = None, splits=None) -> dict:
    """:func:`rlattention.engine.trainer.fit` with Lightning's info messages and the final printout silenced."""
    from rlattention.engine.trainer import fit

    quiet = [logging.getLogger(n) for n in ("lightning.fabric", "lightning_fabric", "lightning")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return fit(cfg, data_dir=data_dir, splits=splits)
    finally:
        for lg, level in zip(quiet, levels, strict=True):
            lg.setLevel(level)


def engine_images_per_s(cfg, data_dir: str | None = None, splits=None) -> list[float]:
    """Run :func:`fit` on ``cfg`` quietly and return the ``train/images_per_s`` windows it logged to
    ``<run_dir>/logs/metrics.csv`` (what ``ram_throughput`` and ``training`` measure the engine by)."""
    report = _quiet_fit(cfg, data_dir=data_dir, splits=splits)
    windows = []
    with open(Path(report["run_dir"]) / "logs" / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            value = row.get("train/images_per_s", "")
            if value not in ("", None):
                windows.append(float(value))
    return windows


def engine_rate(windows: list[float]) -> tuple[float, int]:
    """Median of the engine's windows without the first (it holds the warm-up); NaN when there are none.
    Returns ``(images per second, windows used)``."""
    used = windows[1:] if len(windows) > 1 else windows
    return (statistics.median(used) if used else float("nan")), len(used)


def _trainer_section(threads: int, max_steps: int, log_every: int, batch: int, workdir: Path, name: str) -> dict:
    """The ``trainer:`` settings of a timed engine run: ``max_steps`` steps, no validation before the end, no
    progress bar, in ``workdir``."""
    return {
        "epochs": 1000,  # max_steps decides
        "max_steps": max_steps,
        "batch_size": batch,
        "accelerator": "cpu",
        "devices": 1,
        "num_threads": threads,
        "log_every": log_every,
        "val_every": 1_000_000,  # only the validation at the end
        "checkpoint_every": 0,
        "progress": False,
        "compile": False,
        "out_dir": str(workdir),
        "run_name": name,
    }


def _ram_engine_config(threads: int, max_steps: int, log_every: int, batch: int, workdir: Path):
    """The engine run of ``ram_throughput``: MNIST when present, else the embedded digits at 28x28."""
    from rlattention.engine.config import build_config

    path = mnist_dir()
    data = {"name": "mnist"} if path else {"name": "digits", "canvas_size": 28, "num_train": 20000}
    cfg = build_config(
        {
            "method": "ram",
            "data": data,
            "optim": {"name": "adam", "lr": 1e-3},
            "trainer": _trainer_section(threads, max_steps, log_every, batch, workdir, "ram_throughput"),
            "eval": {"viz_images": 0},
        },
        source="bench ram_throughput",
    )
    return cfg, (str(path) if path else None), data["name"]


def bench_ram_throughput(
    quick: bool = False, threads: int | None = None, engine_steps: int | None = None, log_every: int | None = None
) -> dict[str, Any]:
    """RAM training throughput: model only, model with public-style glimpses, and the real engine."""
    threads = threads or torch.get_num_threads()
    batch = 128
    block, repeat, warmup = (5, 3, 1) if quick else (20, 9, 2)
    engine_steps = engine_steps or (60 if quick else 300)
    log_every = log_every or (10 if quick else 50)

    gen = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 1, 28, 28, generator=gen)
    targets = torch.randint(0, 10, (batch,), generator=gen)
    fast, fast_opt = _build_ram()
    ref, ref_opt = _build_ram(public_reference=True)
    med = time_interleaved(
        {
            "model": lambda: _train_steps(fast, fast_opt, images, targets, block),
            "public_reference": lambda: _train_steps(ref, ref_opt, images, targets, block),
        },
        repeat,
        warmup,
    )
    model_ips = batch * block / med["model"]
    ref_ips = batch * block / med["public_reference"]

    with tempfile.TemporaryDirectory(prefix="rlattention-bench-") as tmp:
        cfg, data_dir, dataset = _ram_engine_config(threads, engine_steps, log_every, batch, Path(tmp))
        windows = engine_images_per_s(cfg, data_dir=data_dir)
    engine_ips, used = engine_rate(windows)
    overhead = 1.0 - engine_ips / model_ips
    return {
        "settings": {
            "model": "RAM, default RAMConfig (6 glimpses 8x8, 1 scale, area mode)",
            "input": "1x28x28, 10 classes",
            "batch": batch,
            "optimizer": "adam, lr 1e-3",
            "model_steps_per_timing": block,
            "repeat": repeat,
            "warmup": warmup,
            "engine_dataset": dataset,
            "engine_max_steps": engine_steps,
            "engine_log_every": log_every,
            "statistic": "median",
            "quick": quick,
        },
        "targets": {"images_per_s_min": RAM_IMAGES_PER_S_TARGET, "engine_overhead_max": RAM_OVERHEAD_TARGET},
        "model_only_images_per_s": model_ips,
        "model_only_ms_per_step": 1e3 * med["model"] / block,
        "public_reference_images_per_s": ref_ips,
        "public_reference_ms_per_step": 1e3 * med["public_reference"] / block,
        "speedup_vs_public_reference": model_ips / ref_ips,
        "engine_images_per_s": engine_ips,
        "engine_windows_images_per_s": windows,
        "engine_windows_used": used,
        "engine_overhead": overhead,
        "meets_images_per_s_target": bool(engine_ips >= RAM_IMAGES_PER_S_TARGET),
        "meets_overhead_target": bool(overhead <= RAM_OVERHEAD_TARGET),
    }


def ram_markdown(r: dict) -> str:
    s, t = r["settings"], r["targets"]
    rows = [
        ["model only (fast sensor)", r["model_only_images_per_s"], r["model_only_ms_per_step"], ""],
        [
            "model only (public-style glimpses)",
            r["public_reference_images_per_s"],
            r["public_reference_ms_per_step"],
            f"speed-up of the fast sensor {r['speedup_vs_public_reference']:.2f}x",
        ],
        [
            f"engine (`fit`, {s['engine_dataset']}, {s['engine_max_steps']} steps)",
            r["engine_images_per_s"],
            1e3 * s["batch"] / r["engine_images_per_s"],
            f"overhead {100 * r['engine_overhead']:.1f}% (target <= {100 * t['engine_overhead_max']:g}%)",
        ],
    ]
    return (
        f"### ram_throughput: RAM training step, batch {s['batch']}\n\n"
        f"{_table(['loop', 'images/s', 'ms/step', 'note'], rows)}\n\n"
        f"Engine target >= {t['images_per_s_min']:,.0f} images/s: "
        f"{'met' if r['meets_images_per_s_target'] else 'not met'}; overhead target: "
        f"{'met' if r['meets_overhead_target'] else 'not met'}.\n\n{_machine_line(r)}\n"
    )


# ----------------------------------------------------------------------------------------------- training

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"


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
    from rlattention.data.digits import make_digits
    from rlattention.data.multilabel_digits import make_multilabel_digits

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


# ------------------------------------------------------------------------------------ rarl: crops, inference


def bench_anchor_crop(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Cropping k = 9 anchor regions per image from feature maps to a fixed size: one batched ``crop_boxes``
    call vs a Python loop over images and regions (:func:`crop_boxes_loop_reference`, one ``grid_sample`` per
    region on the NCHW map). The batched call is timed on a channels-last map, as ``rarl`` holds it (converted
    once per image, then cropped T times); also timed: the same call on an NCHW map, the conversion itself, and
    one ``grid_sample`` over all regions on the NCHW map (the implementation before the gather). Every call is
    timed after an untimed one of the same function (``settle``)."""
    from rlattention.vision.anchors import anchor_boxes
    from rlattention.vision.crops import _bilinear_grid_sample, crop_boxes
    from rlattention.vision.reference import crop_boxes_loop_reference

    g = torch.Generator().manual_seed(seed)
    cases = [
        {
            "case": "VGG16 conv5_3 of 512x512, batch 16",
            "batch": 16,
            "channels": 512,
            "side": 32,
            "input": 512,
            "areas": [80.0**2, 160.0**2, 320.0**2],
            "out": 7,
        },
        {
            "case": "small CNN on 64x64 digit canvases, batch 64",
            "batch": 64,
            "channels": 64,
            "side": 8,
            "input": 64,
            "areas": [16.0**2, 32.0**2, 64.0**2],
            "out": 4,
        },
    ]
    rows = []
    for c in cases:
        fmap = torch.randn(c["batch"], c["channels"], c["side"], c["side"], generator=g)
        fmap_cl = fmap.contiguous(memory_format=torch.channels_last)
        centres = torch.rand(c["batch"], 2, generator=g) * 2 - 1
        boxes = anchor_boxes(centres, c["areas"], [2.0, 1.0, 0.5], (c["input"], c["input"]))
        size = (c["out"], c["out"])
        loop = crop_boxes_loop_reference(fmap, boxes, size)
        max_diff = max(float((crop_boxes(m, boxes, size, mode="bilinear") - loop).abs().max()) for m in (fmap, fmap_cl))
        t = time_interleaved(
            {
                "batched": lambda m=fmap_cl, b=boxes, s=size: crop_boxes(m, b, s, mode="bilinear"),
                "batched_nchw": lambda m=fmap, b=boxes, s=size: crop_boxes(m, b, s, mode="bilinear"),
                "to_channels_last": lambda m=fmap: m.contiguous(memory_format=torch.channels_last),
                "grid_sample": lambda m=fmap, b=boxes, s=size: _bilinear_grid_sample(m, b, *s),
                "loop": lambda m=fmap, b=boxes, s=size: crop_boxes_loop_reference(m, b, s),
            },
            repeat=5 if quick else 21,
            warmup=1 if quick else 3,
            settle=True,
        )
        rows.append(
            {
                **c,
                "batched_ms": 1e3 * t["batched"],
                "batched_nchw_ms": 1e3 * t["batched_nchw"],
                "to_channels_last_ms": 1e3 * t["to_channels_last"],
                "grid_sample_ms": 1e3 * t["grid_sample"],
                "loop_ms": 1e3 * t["loop"],
                "speedup": t["loop"] / t["batched"],
                "speedup_nchw": t["loop"] / t["batched_nchw"],
                "speedup_grid_sample": t["loop"] / t["grid_sample"],
                "max_abs_diff": max_diff,
            }
        )
    return {
        "settings": {"regions_per_image": 9, "quick": quick, "statistic": "median", "batched_layout": "channels_last"},
        "cases": rows,
        "target_speedup": 20.0,
    }


def anchor_crop_markdown(r: dict) -> str:
    rows = [
        [
            c["case"],
            c["batched_ms"],
            c.get("batched_nchw_ms", float("nan")),
            c.get("grid_sample_ms", float("nan")),
            c["loop_ms"],
            c["speedup"],
            c.get("speedup_nchw", float("nan")),
            c["max_abs_diff"],
            c["speedup"] >= 20,
        ]
        for c in r["cases"]
    ]
    head = ["case", "batched ms (channels-last map)", "batched ms (NCHW map)", "one grid_sample ms"]
    head += ["per-region loop ms", "speed-up", "speed-up (NCHW)", "max abs diff", ">= 20x"]
    return (
        "### anchor_crop: 9 anchor regions per image cropped from feature maps (median)\n\n"
        + _table(head, rows)
        + f"\n\n{_machine_line(r)}\n"
    )


def bench_rarl_inference(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """rarl inference time per image, single view vs ten views (one backbone pass per image either way)."""
    from rlattention.engine.method import DataInfo
    from rlattention.methods.rarl import RARL, RARLConfig

    torch.manual_seed(seed)
    cases = [
        {
            "case": "small CNN, 64x64 digits (configs/rarl_digits.yaml)",
            "shape": (1, 64, 64),
            "classes": 10,
            "cfg": dict(
                backbone_channels=[16, 32, 64],
                anchor_areas=[256.0, 1024.0, 4096.0],
                region_dim=128,
                hidden_size=128,
                crop_margin=8,
            ),
            "batch": 64,
        },
        {
            "case": "VGG16, 512x512, paper sizes",
            "shape": (3, 512, 512),
            "classes": 20,
            "cfg": dict(
                backbone="vgg16",
                anchor_areas=[6400.0, 25600.0, 102400.0],
                region_size=7,
                region_dim=1024,
                hidden_size=512,
                crop_margin=64,
            ),
            "batch": 1 if quick else 2,
        },
    ]
    rows = []
    for c in cases:
        if quick and c["cfg"].get("backbone") == "vgg16":
            continue
        times = {}
        for views in (1, 10):
            model = RARL(RARLConfig(test_views=views, **c["cfg"]), DataInfo(c["shape"], c["classes"])).eval()
            x = torch.rand(c["batch"], *c["shape"])
            times[views] = (
                time_interleaved({"p": lambda model=model, x=x: model.predict(x)}, repeat=2 if quick else 5, warmup=1)[
                    "p"
                ]
                / c["batch"]
            )
        rows.append(
            {"case": c["case"], "batch": c["batch"], "single_view_ms": 1e3 * times[1], "ten_view_ms": 1e3 * times[10]}
        )
    return {"settings": {"quick": quick, "statistic": "median per image", "T": 5, "regions": 9}, "cases": rows}


def rarl_inference_markdown(r: dict) -> str:
    rows = [[c["case"], c["batch"], c["single_view_ms"], c["ten_view_ms"]] for c in r["cases"]]
    return (
        "### rarl_inference: time per image, T = 5, 9 regions (median)\n\n"
        + _table(["model", "batch", "single view ms/image", "ten views ms/image"], rows)
        + f"\n\n{_machine_line(r)}\n"
    )


def _ranks_per_query(queries: Tensor, gallery: Tensor, target: Tensor) -> Tensor:
    """The obvious implementation: one query (and completion step) at a time."""
    Q, S, _ = queries.shape
    out = torch.empty(Q, S, dtype=torch.long)
    for q in range(Q):
        for s in range(S):
            d = (gallery.double() - queries[q, s].double()).pow(2).sum(-1)  # exact enough to agree on ties
            out[q, s] = int((d <= d[target[q]]).sum())
    return out


def bench_sketch_ranks(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Ranks of the true photo for every (query, completion step): one matrix pass vs a per-query loop."""
    from rlattention.metrics.sketch import true_ranks

    g = torch.Generator().manual_seed(seed)
    cases = [("ChairV2 test: 323 sketches x 17 steps, 100 photos", 323, 17, 100)]
    if not quick:
        cases.append(("ChairV2 train reward: 32 sketches x 204 glimpses, 270 photos", 32, 204, 270))
        cases.append(("5,000 sketches x 17 steps, 1,000 photos", 5000, 17, 1000))
    rows = []
    for name, Q, S, G in cases:
        gallery = torch.nn.functional.normalize(torch.randn(G, 64, generator=g), dim=-1)
        target = torch.randint(G, (Q,), generator=g)
        queries = gallery[target][:, None] + 0.5 * torch.randn(Q, S, 64, generator=g)
        same = bool(torch.equal(true_ranks(queries, gallery, target), _ranks_per_query(queries, gallery, target)))
        t = time_interleaved(
            {
                "fast": lambda q=queries, e=gallery, y=target: true_ranks(q, e, y),
                "loop": lambda q=queries, e=gallery, y=target: _ranks_per_query(q, e, y),
            },
            repeat=1 if Q * S > 20000 else 3,
            warmup=0 if Q * S > 20000 else 1,
        )
        rows.append(
            {
                "case": name,
                "fast_ms": 1e3 * t["fast"],
                "loop_ms": 1e3 * t["loop"],
                "speedup": t["loop"] / t["fast"],
                "equal": same,
            }
        )
    return {"settings": {"quick": quick, "dim": 64, "statistic": "median"}, "cases": rows}


def sketch_ranks_markdown(r: dict) -> str:
    rows = [[c["case"], c["fast_ms"], c["loop_ms"], c["speedup"], c["equal"]] for c in r["cases"]]
    return (
        "### sketch_ranks: rank of the true photo for every (query, completion step)\n\n"
        + _table(["case", "one matrix pass ms", "per-query loop ms", "speed-up", "identical ranks"], rows)
        + f"\n\n{_machine_line(r)}\n"
    )


def _retrieval_ranks_public_loop(sims: Tensor, caption_to_image: Tensor, images: int, captions: int):
    """The VSE++/SCAN evaluation loop on a given similarity matrix ``(N, C)``: per image query (the first
    ``images``), a numpy argsort of its row and the best position of its captions; per caption query (the first
    ``captions``), an argsort of its column and the position of its image. Returns ``(i2t (images,), t2i
    (captions,))`` 0-based ranks; ties are broken however argsort puts them."""
    import numpy as np

    d = sims.numpy()
    m = caption_to_image.numpy()
    i2t = np.empty(images, dtype=np.int64)
    for i in range(images):
        inds = np.argsort(d[i])[::-1]
        i2t[i] = min(np.where(inds == j)[0][0] for j in np.nonzero(m == i)[0])
    t2i = np.empty(captions, dtype=np.int64)
    for j in range(captions):
        inds = np.argsort(d[:, j])[::-1]
        t2i[j] = np.where(inds == m[j])[0][0]
    return torch.from_numpy(i2t), torch.from_numpy(t2i)


RETRIEVAL_FROM_SIMS_TARGET_S = 0.5
RETRIEVAL_EMBEDDINGS_RATIO_TARGET = 1.2


def bench_retrieval(
    quick: bool = False, seed: int = 0, images: int | None = None, dim: int = 1024, reference_fraction: float = 0.1
) -> dict[str, Any]:
    """Image-text retrieval metrics of the COCO 5K test set's size: N = 5,000 images, C = 25,000 captions (5 per
    image), D = 1024 (``--quick``: N = 500). Embeddings: random unit image vectors, captions = their image plus
    Gaussian noise (norm about 9), renormalised (R@1 of a few tens of percent).

    Timed interleaved (median): the product ``img @ cap.T`` alone; ``retrieval_metrics(sims)`` (ranks and all
    metrics of both directions from the given similarity matrix; target <= 0.5 s); and
    ``retrieval_metrics_from_embeddings(img, cap)`` (product + metrics; target <= 1.2x the product alone).
    Reference: the public-code loop (:func:`_retrieval_ranks_public_loop`, numpy argsort per query) on the same
    similarity matrix, once; without ``--quick`` on the first ``reference_fraction`` of the image and caption
    queries only, its time multiplied by ``1 / reference_fraction`` (linear in the number of queries).
    """
    from rlattention.metrics.retrieval import retrieval_metrics, retrieval_metrics_from_embeddings, retrieval_ranks

    n = images if images is not None else (500 if quick else 5000)
    k = 5
    c = k * n
    g = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    noise = torch.randn(c, dim, generator=g) * (9.0 / dim**0.5)
    cap = torch.nn.functional.normalize(img.repeat_interleave(k, 0) + noise, dim=1)
    del noise
    sims = img @ cap.T
    m = torch.arange(c) // k
    t = time_interleaved(
        {
            "product": lambda: img @ cap.T,
            "from_sims": lambda: retrieval_metrics(sims),
            "from_embeddings": lambda: retrieval_metrics_from_embeddings(img, cap),
        },
        repeat=5,
        warmup=1,
    )
    fraction = 1.0 if quick else reference_fraction
    ref_images, ref_captions = max(1, round(n * fraction)), max(1, round(c * fraction))
    extrapolated = ref_images < n or ref_captions < c
    t0 = time.perf_counter()
    ref_i2t, ref_t2i = _retrieval_ranks_public_loop(sims, m, ref_images, ref_captions)
    ref_measured = time.perf_counter() - t0
    scale = (n + c) / (ref_images + ref_captions)
    i2t, t2i = retrieval_ranks(sims)
    mismatched = int((i2t[:ref_images] != ref_i2t).sum() + (t2i[:ref_captions] != ref_t2i).sum())
    reference_s = ref_measured * scale
    ratio = t["from_embeddings"] / t["product"]
    return {
        "settings": {
            "quick": quick,
            "images": n,
            "captions": c,
            "captions_per_image": k,
            "dim": dim,
            "dtype": "float32",
            "statistic": "median of 5 after 1 warm-up; reference: one run",
            "reference_image_queries": ref_images,
            "reference_caption_queries": ref_captions,
            "reference_extrapolated": extrapolated,
        },
        "product_s": t["product"],
        "metrics_from_sims_s": t["from_sims"],
        "metrics_from_embeddings_s": t["from_embeddings"],
        "embeddings_over_product": ratio,
        "reference_measured_s": ref_measured,
        "reference_s": reference_s,
        "speedup_vs_reference": reference_s / t["from_sims"],
        "reference_mismatched_queries": mismatched,
        "metrics": retrieval_metrics(sims),
        "targets": {
            "metrics_from_sims_s_max": RETRIEVAL_FROM_SIMS_TARGET_S,
            "embeddings_over_product_max": RETRIEVAL_EMBEDDINGS_RATIO_TARGET,
        },
        "meets_from_sims_target": t["from_sims"] <= RETRIEVAL_FROM_SIMS_TARGET_S,
        "meets_embeddings_target": ratio <= RETRIEVAL_EMBEDDINGS_RATIO_TARGET,
    }


def retrieval_markdown(r: dict) -> str:
    s = r["settings"]
    if s["reference_extrapolated"]:
        ref_note = (
            f"measured on {s['reference_image_queries']:,} of {s['images']:,} image and "
            f"{s['reference_caption_queries']:,} of {s['captions']:,} caption queries "
            f"({r['reference_measured_s']:.3g} s), extrapolated linearly"
        )
    else:
        ref_note = "all queries, measured"
    rows = [
        ["product `img @ cap.T` alone", r["product_s"], 1.0, "", ""],
        [
            "`retrieval_metrics(sims)`: ranks + all metrics, both directions",
            r["metrics_from_sims_s"],
            r["metrics_from_sims_s"] / r["product_s"],
            f"<= {r['targets']['metrics_from_sims_s_max']:g} s",
            r["meets_from_sims_target"],
        ],
        [
            "`retrieval_metrics_from_embeddings(img, cap)`: product + metrics",
            r["metrics_from_embeddings_s"],
            r["embeddings_over_product"],
            f"<= {r['targets']['embeddings_over_product_max']:g}x product",
            r["meets_embeddings_target"],
        ],
        [f"per-query numpy argsort loop (public code) on `sims`: {ref_note}", r["reference_s"], "", "", ""],
    ]
    mm = r["metrics"]
    return (
        f"### retrieval: image-text retrieval metrics, {s['images']:,} images x {s['captions']:,} captions, "
        f"D = {s['dim']}\n\n"
        f"{_table(['step', 'time (s)', 'x product', 'target', 'met'], rows)}\n\n"
        f"Speed-up of `retrieval_metrics(sims)` over the per-query loop: {r['speedup_vs_reference']:,.0f}x; "
        f"ranks differing from the loop's on the queries it ran: {r['reference_mismatched_queries']} "
        f"(only exact ties can differ: the loop breaks them arbitrarily). Metrics of the synthetic set: "
        f"i2t R@1 {mm['i2t_r1']:.1f}, t2i R@1 {mm['t2i_r1']:.1f}, rsum {mm['rsum']:.1f}.\n\n{_machine_line(r)}\n"
    )


# ----------------------------------------------------------------------------------------------- reid

REID_METRICS_TARGET_S = 1.0


def _market_like_split(g: torch.Generator, identities: int, distractors: int, junk: int) -> dict[str, Tensor]:
    """Identities and cameras with the structure of the Market-1501 test split, scaled by ``identities`` (751 for
    the real size): 6 cameras; each identity seen by 4-6 of them; 4 or 5 queries per identity (387 of every 751
    identities have 4, the rest 5: 3,368 queries), each from a different camera of its identity; about 16.1
    gallery images per identity on that identity's cameras (12,115 for 751), plus ``distractors`` (identity 0)
    and ``junk`` (identity -1) images on random cameras. For 751 identities, 2,798 distractors and 1,000 junk:
    3,368 queries x 15,913 gallery images, the size of Market-1501 (whose real gallery has about 3,800 junk
    images more; torchreid drops them before evaluation)."""
    cameras = 6
    cams_of = torch.stack([torch.randperm(cameras, generator=g) for _ in range(identities)])  # (I, 6)
    four = round(identities * 387 / 751)
    per_id = torch.cat([torch.full((four,), 4), torch.full((identities - four,), 5)])
    per_id = per_id[torch.randperm(identities, generator=g)]
    seen_by = per_id + (torch.rand(identities, generator=g) * (cameras + 1 - per_id)).long()  # in [per_id, 6]
    query_pids = torch.repeat_interleave(torch.arange(1, identities + 1), per_id)
    query_cams = torch.cat([cams_of[i, :n] for i, n in enumerate(per_id.tolist())])
    images = round(identities * 12115 / 751)
    extra = torch.randint(1, identities + 1, (images - 16 * identities,), generator=g)
    gallery_ids = torch.cat([torch.arange(1, identities + 1).repeat_interleave(16), extra])
    slot = (torch.rand(gallery_ids.numel(), generator=g) * seen_by[gallery_ids - 1]).long()
    gallery_pids = torch.cat([gallery_ids, torch.zeros(distractors, dtype=torch.long), torch.full((junk,), -1)])
    gallery_cams = torch.cat(
        [cams_of[gallery_ids - 1, slot], torch.randint(cameras, (distractors + junk,), generator=g)]
    )
    return {"qp": query_pids, "qc": query_cams, "gp": gallery_pids, "gc": gallery_cams}


def bench_reid(
    quick: bool = False, seed: int = 0, identities: int | None = None, dim: int = 128, reference_fraction: float = 0.1
) -> dict[str, Any]:
    """Re-identification metrics (Market-1501 protocol) at the size of Market-1501: 3,368 queries x 15,913
    gallery images (751 identities, 6 cameras, 2,798 distractors, 1,000 junk; ``--quick``: 60 identities, 269
    queries x 1,272 gallery images), float32 distances (:func:`_market_like_split` has the structure).

    Embeddings, D = ``dim``: a standard normal centre per identity (each distractor and junk image its own),
    plus a per-camera offset (0.45 x standard normal; same-camera images of an identity are the nearest, as in
    real data, so the same-camera filter matters), plus noise (1.2 x standard normal), which gives rank-1 about
    94% and mAP about 68%; distances: ``pairwise_distances`` (squared Euclidean). Timed interleaved (median of
    5 after a warm-up): the distance matrix alone and ``reid_metrics(dist, ...)`` (target: <= 1 s). Reference:
    ``reid_metrics_reference`` (a stable sort per query), run once; without ``--quick`` on the first
    ``reference_fraction`` of the queries only, its time multiplied by the inverse of that fraction;
    ``reid_metrics`` on the same queries must give the same metrics.
    """
    from rlattention.metrics.reid import pairwise_distances, reid_metrics, reid_metrics_reference

    n_ids = identities if identities is not None else (60 if quick else 751)
    distractors, junk = round(n_ids * 2798 / 751), round(n_ids * 1000 / 751)
    g = torch.Generator().manual_seed(seed)
    s = _market_like_split(g, n_ids, distractors, junk)
    qp, qc, gp, gc = s["qp"], s["qc"], s["gp"], s["gc"]
    centres = torch.randn(n_ids + 1, dim, generator=g)
    cam_offset = 0.45 * torch.randn(6, dim, generator=g)

    def embed(pids: Tensor, cams: Tensor) -> Tensor:
        own = centres[pids.clamp(min=0)]
        other = torch.randn(pids.numel(), dim, generator=g)  # distractors and junk: each image its own person
        c = torch.where((pids <= 0)[:, None], other, own)
        return c + cam_offset[cams] + 1.2 * torch.randn(pids.numel(), dim, generator=g)

    query, gallery = embed(qp, qc), embed(gp, gc)
    dist = pairwise_distances(query, gallery)
    t = time_interleaved(
        {
            "distances": lambda: pairwise_distances(query, gallery),
            "metrics": lambda: reid_metrics(dist, qp, gp, qc, gc),
        },
        repeat=5,
        warmup=1,
    )
    q = qp.numel()
    fraction = 1.0 if quick else reference_fraction
    ref_q = max(1, round(q * fraction))
    sub = (dist[:ref_q], qp[:ref_q], gp, qc[:ref_q], gc)
    t0 = time.perf_counter()
    ref = reid_metrics_reference(*sub)
    ref_measured = time.perf_counter() - t0
    fast = reid_metrics(*sub)
    diff = max(abs(fast[k] - ref[k]) for k in ref)
    reference_s = ref_measured * q / ref_q
    return {
        "settings": {
            "quick": quick,
            "queries": q,
            "gallery": gp.numel(),
            "identities": n_ids,
            "cameras": 6,
            "distractors": distractors,
            "junk": junk,
            "dim": dim,
            "dtype": "float32",
            "distance": "squared euclidean",
            "statistic": "median of 5 after 1 warm-up; reference: one run",
            "reference_queries": ref_q,
            "reference_extrapolated": ref_q < q,
        },
        "distances_s": t["distances"],
        "metrics_s": t["metrics"],
        "reference_measured_s": ref_measured,
        "reference_s": reference_s,
        "speedup_vs_reference": reference_s / t["metrics"],
        "reference_metrics": ref,
        "fast_metrics_on_reference_queries": fast,
        "reference_max_abs_diff": diff,
        "reference_equal": fast.keys() == ref.keys() and diff <= 1e-9,
        "metrics": reid_metrics(dist, qp, gp, qc, gc),
        "targets": {"metrics_s_max": REID_METRICS_TARGET_S},
        "meets_target": t["metrics"] <= REID_METRICS_TARGET_S,
    }


def reid_markdown(r: dict) -> str:
    s = r["settings"]
    if s["reference_extrapolated"]:
        ref_note = (
            f"measured on {s['reference_queries']:,} of {s['queries']:,} queries "
            f"({r['reference_measured_s']:.3g} s), extrapolated linearly"
        )
    else:
        ref_note = "all queries, measured"
    rows = [
        [f"`pairwise_distances` (squared Euclidean, D = {s['dim']}) alone", r["distances_s"], "", ""],
        [
            "`reid_metrics(dist, ...)`: CMC rank-1/5/10 + mAP",
            r["metrics_s"],
            f"<= {r['targets']['metrics_s_max']:g} s",
            r["meets_target"],
        ],
        [f"`reid_metrics_reference` (stable sort per query): {ref_note}", r["reference_s"], "", ""],
    ]
    m = r["metrics"]
    return (
        f"### reid: Market-1501 protocol, {s['queries']:,} queries x {s['gallery']:,} gallery images "
        f"({s['identities']} identities, {s['distractors']:,} distractors, {s['junk']:,} junk), float32\n\n"
        f"{_table(['step', 'time (s)', 'target', 'met'], rows)}\n\n"
        f"Speed-up of `reid_metrics` over the per-query loop: {r['speedup_vs_reference']:,.0f}x; metrics equal "
        f"to the loop's on the queries it ran: {'yes' if r['reference_equal'] else 'NO'} (largest difference "
        f"{r['reference_max_abs_diff']:.2g}). Metrics of the synthetic set: rank-1 {m['rank1']:.1f}, rank-5 "
        f"{m['rank5']:.1f}, rank-10 {m['rank10']:.1f}, mAP {m['mAP']:.1f} ({m['num_queries']:,} queries, "
        f"{m['num_skipped']} skipped).\n\n{_machine_line(r)}\n"
    )


# ----------------------------------------------------------------------------------------------- summary


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _rate(v: float, unit: str) -> str:
    return f"{v:,.0f} {unit}/s" if abs(v) >= 100 else f"{v:.3g} {unit}/s"


def _row(
    case: str, fast: str, reference: str, ratio: float | None, target: str = "", met: bool | None = None
) -> dict[str, Any]:
    return {"case": case, "fast": fast, "reference": reference, "ratio": ratio, "target": target, "met": met}


def _sensor_rows(r: dict) -> list[dict]:
    rows = []
    target = f">= {r['targets']['speedup_min']:g}x"
    for c in r["cases"]:
        name = f"({c['case']}) {c['height']}x{c['width']}, g={c['glimpse_size']}, k={c['num_scales']}"
        ref = _ms(c["reference_ms_per_episode"] / 1e3)
        rows.append(
            _row(
                f"{name}, area",
                _ms(c["fast_area_ms_per_episode"] / 1e3),
                ref,
                c["speedup_area"],
                target,
                c["speedup_area"] >= r["targets"]["speedup_min"],
            )
        )
        rows.append(
            _row(
                f"{name}, nearest",
                _ms(c["fast_nearest_ms_per_episode"] / 1e3),
                ref,
                c["speedup_nearest"],
                target,
                c["speedup_nearest"] >= r["targets"]["speedup_min"],
            )
        )
    return rows


def _ram_rows(r: dict) -> list[dict]:
    t = r["targets"]
    return [
        _row(
            "model only: fast sensor vs public-style glimpses",
            _rate(r["model_only_images_per_s"], "img"),
            _rate(r["public_reference_images_per_s"], "img"),
            r["speedup_vs_public_reference"],
        ),
        _row(
            f"engine vs model only ({r['settings']['engine_dataset']})",
            _rate(r["engine_images_per_s"], "img"),
            _rate(r["model_only_images_per_s"], "img"),
            r["engine_images_per_s"] / r["model_only_images_per_s"],
            f">= {t['images_per_s_min']:,.0f} img/s, overhead <= {100 * t['engine_overhead_max']:g}%",
            r["meets_images_per_s_target"] and r["meets_overhead_target"],
        ),
    ]


def _anchor_crop_rows(r: dict) -> list[dict]:
    target = r.get("target_speedup", 20.0)
    return [
        _row(
            c["case"],
            _ms(c["batched_ms"] / 1e3),
            _ms(c["loop_ms"] / 1e3),
            c["speedup"],
            f">= {target:g}x",
            c["speedup"] >= target,
        )
        for c in r["cases"]
    ]


def _rarl_inference_rows(r: dict) -> list[dict]:
    return [
        _row(
            f"{c['case']}: single view vs ten views, per image",
            _ms(c["single_view_ms"] / 1e3),
            _ms(c["ten_view_ms"] / 1e3),
            c["ten_view_ms"] / c["single_view_ms"],
        )
        for c in r["cases"]
    ]


def _sketch_ranks_rows(r: dict) -> list[dict]:
    return [
        _row(c["case"], _ms(c["fast_ms"] / 1e3), _ms(c["loop_ms"] / 1e3), c["speedup"], "identical ranks", c["equal"])
        for c in r["cases"]
    ]


def _retrieval_rows(r: dict) -> list[dict]:
    s, t = r["settings"], r["targets"]
    size = f"{s['images']:,} x {s['captions']:,}"
    return [
        _row(
            f"{size}: `retrieval_metrics(sims)` vs per-query argsort loop"
            + (" (extrapolated)" if s["reference_extrapolated"] else ""),
            _ms(r["metrics_from_sims_s"]),
            _ms(r["reference_s"]),
            r["speedup_vs_reference"],
            f"<= {t['metrics_from_sims_s_max']:g} s",
            r["meets_from_sims_target"],
        ),
        _row(
            f"{size}: metrics from embeddings vs the product alone",
            _ms(r["metrics_from_embeddings_s"]),
            _ms(r["product_s"]),
            r["product_s"] / r["metrics_from_embeddings_s"],
            f"<= {t['embeddings_over_product_max']:g}x product",
            r["meets_embeddings_target"],
        ),
    ]


def _reid_rows(r: dict) -> list[dict]:
    s = r["settings"]
    return [
        _row(
            f"{s['queries']:,} x {s['gallery']:,}: `reid_metrics` vs stable sort per query"
            + (" (extrapolated)" if s["reference_extrapolated"] else ""),
            _ms(r["metrics_s"]),
            _ms(r["reference_s"]),
            r["speedup_vs_reference"],
            f"<= {r['targets']['metrics_s_max']:g} s",
            r["meets_target"],
        )
    ]


def _training_rows(r: dict) -> list[dict]:
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


#: benchmark -> the rows it contributes to ``summary.md``: one per comparison, read from its stored result.
SUMMARY_ROWS: dict[str, Callable[[dict], list[dict]]] = {
    "sensor": _sensor_rows,
    "ram_throughput": _ram_rows,
    "anchor_crop": _anchor_crop_rows,
    "rarl_inference": _rarl_inference_rows,
    "sketch_ranks": _sketch_ranks_rows,
    "retrieval": _retrieval_rows,
    "reid": _reid_rows,
    "training": _training_rows,
}


def summary_rows(name: str, result: dict) -> list[dict]:
    """The summary rows of benchmark ``name`` from its result dict (``out/<name>.json``), each with ``benchmark``,
    ``case``, ``fast``, ``reference``, ``ratio`` (reference / fast for times, fast / reference for rates: above 1
    when the fast code is faster), ``target`` and ``met`` (None: no target)."""
    if name not in SUMMARY_ROWS:
        raise ValueError(f"no summary rows for benchmark {name!r}; known: {', '.join(SUMMARY_ROWS)}")
    return [{"benchmark": name, **row} for row in SUMMARY_ROWS[name](result)]


def summary_markdown(results: Mapping[str, dict], command: str = "", threads: int | None = None) -> str:
    """One table of every comparison in ``results`` (name -> result dict), the machine and the command."""
    rows = []
    for name, result in results.items():
        for row in summary_rows(name, result):
            ratio = row["ratio"]
            met = "" if row["met"] is None else ("met" if row["met"] else "**not met**")
            rows.append(
                [
                    name,
                    row["case"],
                    row["fast"],
                    row["reference"],
                    "" if ratio is None else f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x",
                    row["target"],
                    met,
                ]
            )
    first = next(iter(results.values()), None)
    m = dict(first["machine"]) if first else machine_info(threads or torch.get_num_threads())
    loads = [r["machine"].get("load_average_1min") for r in results.values() if "machine" in r]
    loads = [x for x in loads if x is not None]
    load = f"{min(loads):g}-{max(loads):g}" if loads else "?"
    quick = any(r.get("settings", {}).get("quick") for r in results.values())
    stamps = [r["timestamp"] for r in results.values() if "timestamp" in r]
    ends = [r.get("finished", r.get("timestamp")) for r in results.values() if "timestamp" in r]
    when = f"{min(stamps)} to {max(ends)}" if stamps else _timestamp()
    return (
        "### summary: fast code vs in-repo references\n\n"
        + _table(["benchmark", "case", "fast", "reference", "ratio", "target", "met"], rows)
        + "\n\nratio: reference time / fast time, or fast rate / reference rate (above 1: the fast code is faster; "
        "for `training`, engine / model only = 1 - engine overhead; for `rarl_inference`, what ten views cost "
        "over one).\n\n"
        f"Machine: {m['cpu']}, {m['cpu_count']} CPUs ({m.get('cpus_available', '?')} available), "
        f"torch threads {m['threads']}, torch {m['torch']}, Python {m['python']}, {m['uname']}; load average "
        f"(1 min) {load} during the run{'; quick mode' if quick else ''}. {when}.\n\n"
        + (f"Command: `{command}`\n" if command else "")
    )


BENCHMARKS: dict[str, tuple[Callable[..., dict], Callable[[dict], str]]] = {
    "sensor": (bench_sensor, sensor_markdown),
    "ram_throughput": (bench_ram_throughput, ram_markdown),
    "anchor_crop": (bench_anchor_crop, anchor_crop_markdown),
    "rarl_inference": (bench_rarl_inference, rarl_inference_markdown),
    "sketch_ranks": (bench_sketch_ranks, sketch_ranks_markdown),
    "retrieval": (bench_retrieval, retrieval_markdown),
    "reid": (bench_reid, reid_markdown),
    "training": (bench_training, training_markdown),
}


def run_benchmarks(
    which: list[str],
    out: Path,
    threads: int = 2,
    quick: bool = False,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict]:
    """Run the named benchmarks (all when ``which`` is empty) on ``threads`` torch threads.

    Prints a markdown table per benchmark and writes ``out/<name>.json`` and ``out/<name>.md``; when more than
    one ran, also ``out/summary.md``: one table of every comparison (:func:`summary_markdown`). ``options``:
    extra keyword arguments per benchmark (e.g. ``{"ram_throughput": {"engine_steps": 30}}``). Returns the
    results by name.
    """
    names = list(which) or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(BENCHMARKS)}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    results = {}
    try:
        for name in names:
            run, markdown = BENCHMARKS[name]
            kwargs = dict((options or {}).get(name, {}))
            if name in ("ram_throughput", "training"):
                kwargs.setdefault("threads", threads)
            started = _timestamp()
            body = run(quick=quick, **kwargs)
            result = {"benchmark": name, "timestamp": started, "machine": machine_info(threads), **body}
            result["finished"] = _timestamp()
            md = markdown(result)
            (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
            (out / f"{name}.md").write_text(md)
            print(md, flush=True)
            results[name] = result
        if len(names) > 1:
            command = f"rlattention bench {' '.join(which)}{' ' if which else ''}--threads {threads} --out {out}"
            summary = summary_markdown(results, command + (" --quick" if quick else ""))
            (out / "summary.md").write_text(summary)
            print(summary, flush=True)
    finally:
        torch.set_num_threads(previous)
    return results
