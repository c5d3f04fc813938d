"""``ram_throughput``: RAM with the default ``RAMConfig`` (6 glimpses of 8x8, 28x28 inputs, 10 classes), batch 128,
Adam. (i) model only: forward + backward + optimiser step on one pre-made batch; (ii) engine: the real
training loop (:func:`rlattention.engine.trainer.fit`), read from the ``train/images_per_s`` it logs; the
engine overhead is ``1 - engine / model-only``; (iii) model only with the glimpses extracted by
:func:`glimpse_public_reference` (locations clamped to [-1, 1], as public code does). Targets: >= 7,000
images/s in the engine and an overhead <= 10%.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlattention.vision import GlimpseSensor
from rlattention.vision.reference import glimpse_public_reference

from .common import (
    _machine_line,
    _rate,
    _row,
    _table,
    _trainer_section,
    engine_images_per_s,
    engine_rate,
    mnist_dir,
    time_interleaved,
)

SENSOR_SPEEDUP_TARGET = 10.0
RAM_IMAGES_PER_S_TARGET = 7000.0


RAM_IMAGES_PER_S_TARGET = 7000.0
RAM_OVERHEAD_TARGET = 0.10


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


def summary_rows(r: dict) -> list[dict]:
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
