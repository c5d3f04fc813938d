"""Two CPU processes (DDP over gloo): every method trains a few steps, the ranks end with the same weights, the
checkpoint loads in one process, and a 2-process evaluation gives the metrics of a 1-process one.

The CLI runs as a subprocess; Fabric's launcher starts rank 1 by re-running the same command line. Tiny data and
two steps keep each method to a few seconds (plus two interpreter start-ups per subprocess)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from rlattention.data.base import ArrayDataset
from rlattention.engine.distributed import leave_process_group
from rlattention.engine.evaluate import evaluate, evaluate_under_attack
from rlattention.engine.loading import evaluate_checkpoint
from rlattention.engine.method import AttentionMethod, StepOutput

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
EVAL_BATCH = 5  # small evaluation batches: several per split, shared unevenly between the two ranks
TIMEOUT = 600  # seconds per subprocess (generous: a loaded 2-core machine)

DDP = [
    "trainer.strategy=ddp",
    "trainer.devices=2",
    "trainer.accelerator=cpu",
    "trainer.max_steps=2",
    "trainer.num_threads=1",
    "trainer.progress=false",
    "eval.viz_images=0",
    f"trainer.eval_batch_size={EVAL_BATCH}",
]
DIGITS = ["data.num_train=64", "data.val_size=16", "data.num_test=24", "trainer.batch_size=16"]
SKETCH = ["data.val_size=4", "data.image_size=32", "data.completion_steps=4", "trainer.batch_size=8"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK")}
    env.pop("WORLD_SIZE", None)  # Lightning picks a free port and sets the rest for the processes it starts
    env.update(
        OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    )
    return env


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "rlattention.cli", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, f"rlattention {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _fit_2proc(tmp_path: Path, name: str, args: list[str]) -> tuple[Path, dict]:
    _cli(["fit", *args, *DDP, f"trainer.out_dir={tmp_path}", f"trainer.run_name={name}"], tmp_path)
    run = tmp_path / name
    report = json.loads((run / "report.json").read_text())
    assert report["world_size"] == 2
    assert report["params_in_sync"] is True
    assert report["steps"] == 2
    assert (run / "checkpoints" / "best.ckpt").is_file()
    return run, report


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9, nan_ok=True), k


def _eval_1proc(ckpt: Path, data_dir: Path | None, **kwargs) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the subprocesses: the same kernels, the same floats
    try:
        return evaluate_checkpoint(ckpt, str(data_dir) if data_dir else None, batch_size=EVAL_BATCH, **kwargs)
    finally:
        torch.set_num_threads(threads)


def _check_eval(tmp_path: Path, run: Path, report: dict, data_dir: Path | None, cli: bool = True) -> dict:
    """The 1-process evaluation of best.ckpt (in this process) equals the 2-process evaluation that ended the fit
    and (``cli``) a 2-process ``rlattention eval --devices 2``. That command shares the fit's gathered evaluation, so
    it runs for ram (with PGD), darp and scal, not for every method: two more interpreter start-ups a method."""
    split = next(s for s in ("test", "val") if s in report)
    ckpt = run / "checkpoints" / "best.ckpt"
    one = _eval_1proc(ckpt, data_dir, split=split)
    _same(one, report[split])
    assert one["count"] > 2 * EVAL_BATCH  # several batches per rank
    if not cli:
        return one
    data = ["--data-dir", str(data_dir)] if data_dir else []
    args = ["eval", str(ckpt), *data, "--split", split, "--batch-size", str(EVAL_BATCH), "--json", "--devices", "2"]
    out = _cli(args, tmp_path).stdout
    assert len(out.strip().splitlines()) == 1, f"stdout must be rank 0's JSON line alone, got: {out}"
    _same(one, json.loads(out))
    return one


def _data(shared_data: Path, folder: str) -> Path:
    path = shared_data / folder
    if not path.exists():
        pytest.skip(f"shared data folder {folder!r} not found at {path} (set RLATTENTION_DATA)")
    return path


# ------------------------------------------------------------------------------------------------- the methods
def test_ram_two_processes(tmp_path):
    run, report = _fit_2proc(tmp_path, "ram", ["--config", str(CONFIGS / "ram_digits.yaml"), *DIGITS])
    _check_eval(tmp_path, run, report, None)
    # PGD: rank r attacks every other batch; the random starts of the batches it skips are drawn and discarded
    ckpt = run / "checkpoints" / "best.ckpt"
    attack = ["--attack", "pgd", "--epsilon", "0.1", "--step-size", "0.05", "--steps", "2"]
    one = _eval_1proc(ckpt, None, attack={"epsilon": 0.1, "step_size": 0.05, "steps": 2})
    two = _cli(["eval", str(ckpt), "--batch-size", str(EVAL_BATCH), "--json", *attack, "--devices", "2"], tmp_path)
    _same(one, json.loads(two.stdout))


def test_cnn_two_processes(tmp_path):
    run, report = _fit_2proc(tmp_path, "cnn", ["method=cnn", "data.name=digits", *DIGITS])
    _check_eval(tmp_path, run, report, None, cli=False)


def test_unified_two_processes(tmp_path):
    cfg = CONFIGS / "unified_cluttered60_entropy_context.yaml"  # top-down Q-learning + entropy + context
    run, report = _fit_2proc(tmp_path, "unified", ["--config", str(cfg), "data.name=digits", *DIGITS])
    _check_eval(tmp_path, run, report, None, cli=False)


def test_rarl_two_processes(tmp_path, shared_data):
    mnist = _data(shared_data, "mnist")
    args = ["--config", str(CONFIGS / "rarl_digits.yaml"), "--data-dir", str(mnist), *DIGITS]
    run, report = _fit_2proc(tmp_path, "rarl", args)
    _check_eval(tmp_path, run, report, mnist, cli=False)


def test_darp_two_processes(tmp_path, shared_data):
    omniglot = _data(shared_data, "omniglot")
    common = ["--data-dir", str(omniglot), *SKETCH]  # renders: the suite's cache, $RLATTENTION_CACHE (conftest.py)
    phase1, report1 = _fit_2proc(tmp_path, "phase1", ["--config", str(CONFIGS / "darp_triplet_omniglot.yaml"), *common])
    assert (phase1 / "phase1.safetensors").is_file()  # written by rank 0 only
    _check_eval(tmp_path, phase1, report1, omniglot, cli=False)  # the CLI's 2-process evaluation: phase 2 below
    args = ["--config", str(CONFIGS / "darp_omniglot.yaml"), *common, f"model.phase1={phase1 / 'phase1.safetensors'}"]
    run, report = _fit_2proc(tmp_path, "darp", args)
    _check_eval(tmp_path, run, report, omniglot)


def test_dcpg_two_processes(tmp_path, shared_data):
    mnist = _data(shared_data, "mnist")
    args = [
        "--config",
        str(CONFIGS / "dcpg_digit_scenes.yaml"),
        "--data-dir",
        str(mnist),
        "model.embed_dim=32",
        "model.num_bins=10",
        "data.num_train=64",
        "data.num_test=8",
        "trainer.batch_size=16",
    ]
    run, report = _fit_2proc(tmp_path, "dcpg", args)
    _check_eval(tmp_path, run, report, mnist, cli=False)


def test_scal_two_processes(tmp_path, shared_data):
    omniglot = _data(shared_data, "omniglot")
    args = [
        "--config",
        str(CONFIGS / "scal_omniglot.yaml"),
        "--data-dir",
        str(omniglot),
        "data.num_train=12",
        "data.num_test=6",
        "data.reid_val_ids=4",
        "trainer.batch_size=16",
    ]
    run, report = _fit_2proc(tmp_path, "scal", args)
    _check_eval(tmp_path, run, report, omniglot)


# ------------------------------------------------------------------ gathering, exactly (spawned workers)
class _Probe(AttentionMethod):
    """Scores that differ per item (a fixed linear map), optionally plus a draw from the evaluation generator;
    metrics that depend on the order of the items, so a mis-ordered gather cannot pass."""

    def __init__(self, random_eval: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3 * 4 * 4, 5)
        self.random_eval = random_eval

    def forward(self, images: Tensor, targets: Tensor) -> StepOutput:  # pragma: no cover - not trained
        return StepOutput(self.fc(images.flatten(1)).sum())

    def predict(self, images: Tensor, mc_samples: int = 0, generator: torch.Generator | None = None) -> Tensor:
        s = self.fc(images.flatten(1))
        if self.random_eval or mc_samples > 0:
            s = s + torch.rand(s.shape, generator=generator, device=s.device)
        return s

    def attack_logits(self, images: Tensor, seed: int = 0) -> Tensor:
        return self.fc(images.flatten(1))

    def metrics(self, scores: Tensor, targets: Tensor) -> dict[str, float]:
        w = torch.arange(1, len(scores) + 1, dtype=torch.float64)[:, None]
        return {"weighted": float((scores.double() * w).sum()), "count": float(len(scores))}


def _probe_data(n: int = 23) -> ArrayDataset:
    g = torch.Generator().manual_seed(1)
    return ArrayDataset(torch.randint(0, 256, (n, 3, 4, 4), generator=g, dtype=torch.uint8), torch.arange(n) % 5)


def _probe_evals(fabric) -> list[dict]:
    torch.set_num_threads(1)
    data = _probe_data()
    out = []
    for random_eval, mc in ((False, 0), (True, 0), (False, 3)):
        model = _Probe(random_eval)
        for batch_size in (4, 100):  # 6 batches (uneven shares), 1 batch (rank 1 has none)
            out.append(evaluate(fabric, model, data, batch_size, mc_samples=mc, seed=7))
    attack = {"epsilon": 0.1, "step_size": 0.03, "steps": 2, "seed": 7}
    out.append(evaluate_under_attack(fabric, _Probe(), data, 4, **attack))
    return out


def _probe_worker(rank: int, port: int, out_dir: str) -> None:
    """One rank of a 2-process job, as a launcher (torchrun, SLURM) would start it: Fabric finds the rank in the
    environment. Rank 0 writes the metrics; every rank ends with ``leave_process_group`` (no gloo teardown)."""
    from lightning.fabric import Fabric

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", NODE_RANK="0")
    os.environ["LOCAL_RANK"] = str(rank)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    out = _probe_evals(fabric)
    if rank == 0:
        (Path(out_dir) / "two.json").write_text(json.dumps(out))
    leave_process_group(exit_code=0)


def test_gathered_evaluation_equals_one_process_exactly(tmp_path):
    import socket

    from lightning.fabric import Fabric

    threads = torch.get_num_threads()
    try:
        one = _probe_evals(Fabric(accelerator="cpu", devices=1))
    finally:
        torch.set_num_threads(threads)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.start_processes(_probe_worker, (port, str(tmp_path)), nprocs=2, start_method="spawn")
    two = json.loads((tmp_path / "two.json").read_text())  # floats round-trip through json exactly
    assert len(one) == len(two)
    for a, b in zip(one, two, strict=True):
        assert a == b  # same batches, same floats: bit-identical metrics
        assert math.isfinite(a["weighted"]) and a["count"] == 23


def test_leave_process_group_is_a_no_op_in_one_process():
    assert leave_process_group(exit_code=3) is None  # no process group: it returns instead of exiting
