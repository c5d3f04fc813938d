"""Speed benchmarks: ``rlattention bench [sensor|ram_throughput] --threads 2 [--quick]``.

Every benchmark times the fast code and a simple reference *in the same run* (interleaved, so background load
hits both alike) and reports a ratio next to the absolute times. Timing: :func:`time.perf_counter`, warm-up
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
"""

from __future__ import annotations

import csv
import json
import logging
import os
import platform
import statistics
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


def time_interleaved(fns: Mapping[str, Callable[[], Any]], repeat: int, warmup: int) -> dict[str, float]:
    """Median wall time in seconds of each function; the functions take turns, so load affects all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
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


def engine_images_per_s(
    threads: int, max_steps: int, log_every: int, batch: int, workdir: Path
) -> tuple[list[float], str]:
    """Run :func:`fit` and return the logged ``train/images_per_s`` windows and the dataset used."""
    from rlattention.engine.config import build_config
    from rlattention.engine.trainer import fit

    path = mnist_dir()
    data = {"name": "mnist"} if path else {"name": "digits", "canvas_size": 28, "num_train": 20000}
    cfg = build_config(
        {
            "method": "ram",
            "data": data,
            "optim": {"name": "adam", "lr": 1e-3},
            "trainer": {
                "epochs": 1000,  # max_steps decides
                "max_steps": max_steps,
                "batch_size": batch,
                "accelerator": "cpu",
                "num_threads": threads,
                "log_every": log_every,
                "val_every": 1_000_000,  # only the validation at the end
                "progress": False,
                "out_dir": str(workdir),
                "run_name": "ram_throughput",
            },
            "eval": {"viz_images": 0},
        },
        source="bench ram_throughput",
    )
    quiet = [logging.getLogger(n) for n in ("lightning.fabric", "lightning_fabric", "lightning")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.WARNING)
    try:
        report = fit(cfg, data_dir=str(path) if path else None)
    finally:
        for lg, level in zip(quiet, levels, strict=True):
            lg.setLevel(level)
    windows = []
    with open(Path(report["run_dir"]) / "logs" / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            value = row.get("train/images_per_s", "")
            if value not in ("", None):
                windows.append(float(value))
    return windows, data["name"]


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
        windows, dataset = engine_images_per_s(threads, engine_steps, log_every, batch, Path(tmp))
    used = windows[1:] if len(windows) > 1 else windows  # the first window holds the warm-up
    engine_ips = statistics.median(used) if used else float("nan")
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
        "engine_windows_used": len(used),
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


# ----------------------------------------------------------------------------------------------- entry point

# ------------------------------------------------------------------------------------ rarl: crops, inference


def bench_anchor_crop(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Cropping k = 9 anchor regions per image from feature maps to a fixed size: one batched ``crop_boxes``
    call vs a Python loop over images and regions (:func:`crop_boxes_loop_reference`)."""
    from rlattention.vision.anchors import anchor_boxes
    from rlattention.vision.crops import crop_boxes
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
        centres = torch.rand(c["batch"], 2, generator=g) * 2 - 1
        boxes = anchor_boxes(centres, c["areas"], [2.0, 1.0, 0.5], (c["input"], c["input"]))
        size = (c["out"], c["out"])
        fast = crop_boxes(fmap, boxes, size, mode="bilinear")
        max_diff = float((fast - crop_boxes_loop_reference(fmap, boxes, size)).abs().max())
        t = time_interleaved(
            {
                "batched": lambda fmap=fmap, boxes=boxes, size=size: crop_boxes(fmap, boxes, size, mode="bilinear"),
                "loop": lambda fmap=fmap, boxes=boxes, size=size: crop_boxes_loop_reference(fmap, boxes, size),
            },
            repeat=5 if quick else 21,
            warmup=1 if quick else 3,
        )
        rows.append(
            {
                **c,
                "batched_ms": 1e3 * t["batched"],
                "loop_ms": 1e3 * t["loop"],
                "speedup": t["loop"] / t["batched"],
                "max_abs_diff": max_diff,
            }
        )
    return {
        "settings": {"regions_per_image": 9, "quick": quick, "statistic": "median"},
        "cases": rows,
        "target_speedup": 20.0,
    }


def anchor_crop_markdown(r: dict) -> str:
    rows = [
        [c["case"], c["batched_ms"], c["loop_ms"], c["speedup"], c["max_abs_diff"], c["speedup"] >= 20]
        for c in r["cases"]
    ]
    return (
        "### anchor_crop: 9 anchor regions per image cropped from feature maps (median)\n\n"
        + _table(["case", "batched ms", "per-region loop ms", "speed-up", "max abs diff", ">= 20x"], rows)
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


BENCHMARKS: dict[str, tuple[Callable[..., dict], Callable[[dict], str]]] = {
    "sensor": (bench_sensor, sensor_markdown),
    "ram_throughput": (bench_ram_throughput, ram_markdown),
    "anchor_crop": (bench_anchor_crop, anchor_crop_markdown),
    "rarl_inference": (bench_rarl_inference, rarl_inference_markdown),
    "sketch_ranks": (bench_sketch_ranks, sketch_ranks_markdown),
    "retrieval": (bench_retrieval, retrieval_markdown),
    "reid": (bench_reid, reid_markdown),
}


def run_benchmarks(
    which: list[str],
    out: Path,
    threads: int = 2,
    quick: bool = False,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict]:
    """Run the named benchmarks (all when ``which`` is empty) on ``threads`` torch threads.

    Prints a markdown table per benchmark and writes ``out/<name>.json`` and ``out/<name>.md``. ``options``:
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
            if name == "ram_throughput":
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
    finally:
        torch.set_num_threads(previous)
    return results
