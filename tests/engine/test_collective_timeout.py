"""``trainer.collective_timeout_minutes`` and ``trainer.setup_timeout_minutes``: the first (10 minutes by default)
reaches Lightning's DDP strategy (the process group's timeout), and a rank that stalls makes the other rank's
collective fail after that time with one line naming its rank (exit code 4) instead of hanging; the second
(4 hours by default) is the timeout of the gloo group of the setup waits, so that rank 0 building the data first
for longer than a collective timeout does not fail the run. Two CPU processes over gloo, as
tests/engine/test_multiprocess.py (each 2-process test: about 20 s)."""

from __future__ import annotations

import datetime
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from rlattention.engine import trainer
from rlattention.engine.config import ConfigError, load_config
from rlattention.engine.distributed import CollectiveTimeout, _collective_failure, _strategy
from rlattention.engine.trainer import _make_fabric

REPO = Path(__file__).resolve().parents[2]
KEYS = ("trainer.collective_timeout_minutes", "trainer.setup_timeout_minutes")
#: the collective timeout of the two-process runs (minutes) and how long the "slow" ranks build, or the "late" rank
#: starts after the other, longer than it (s)
TIMEOUT_MIN, SLOW_S = 0.25, 20


def test_defaults_are_ten_minutes_and_four_hours():
    tc = load_config(None).trainer
    assert tc.collective_timeout_minutes == 10.0 and tc.setup_timeout_minutes == 240.0
    assert _strategy("ddp", 2)._timeout == datetime.timedelta(minutes=10)
    cfg = load_config(None, ["trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu"])
    strategy = _make_fabric(cfg, None).strategy
    assert strategy._timeout == datetime.timedelta(minutes=10)
    assert strategy.rendezvous_timeout == datetime.timedelta(hours=4)  # the start-up: setup_timeout_minutes
    # the setup group's 240 minutes, as a 2-process run makes it: test_rank_0_building_longer_than_the_timeout...


@pytest.mark.parametrize(
    "strategy", ["ddp", "auto", "ddp_find_unused_parameters_false", "ddp_find_unused_parameters_true", "ddp_spawn"]
)
def test_timeout_reaches_the_ddp_strategy(strategy):
    cfg = load_config(
        None,
        [f"trainer.strategy={strategy}", "trainer.devices=2", "trainer.accelerator=cpu",
         "trainer.collective_timeout_minutes=0.25"],
    )  # fmt: skip
    fabric = _make_fabric(cfg, None)
    assert fabric.strategy._timeout == datetime.timedelta(seconds=15)
    assert fabric.strategy.rendezvous_timeout == datetime.timedelta(hours=4)


def test_the_named_strategies_keep_their_settings():
    assert _strategy("ddp", 2, 1.0)._ddp_kwargs == {"find_unused_parameters": True}
    assert _strategy("ddp_find_unused_parameters_false", 2, 1.0)._ddp_kwargs == {"find_unused_parameters": False}
    assert _strategy("ddp_spawn", 2, 1.0)._start_method == "spawn"
    assert _strategy("auto", 1, 1.0) == "auto" and _strategy("dp", 2, 1.0) == "dp"
    spawn = _strategy("ddp_spawn", 2, 1.0, 30.0)  # spawn pickles the strategy into the processes it starts
    again = pickle.loads(pickle.dumps(spawn))
    assert again._start_method == "spawn" and again.rendezvous_timeout == datetime.timedelta(minutes=30)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("value", ["0", "-1", ".nan", ".inf", "20000"])
def test_timeouts_must_be_positive_and_at_most_a_week(key, value):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={value}"])
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"defaults: {key}=") and "is out of range: it must be in (0, 10080]" in msg, msg


# torch 2.13's own words (gloo over TCP), as the 2-process runs of tests/engine raise them
GLOO_TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 6000ms for "
    "recv operation to complete"
)
GLOO_LOST = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:37567. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
    "before reporting an error. GLHF!"
)
GLOO_CLOSED = "Application timeout caused pair closure"  # the other operations of the process that timed out
NCCL_TIMEOUT = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds before timing out."
)


@pytest.fixture
def two_ranks(monkeypatch):
    """This process seen as rank 1 of a 2-process group (no group is made)."""
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)


def test_torch_timeouts_and_lost_peers_become_one_line(two_ranks):
    key = "trainer.collective_timeout_minutes"
    for error in (RuntimeError(GLOO_TIMEOUT), RuntimeError(GLOO_CLOSED), dist.DistBackendError(NCCL_TIMEOUT)):
        failure = _collective_failure(error, 10, key)
        assert isinstance(failure, CollectiveTimeout) and failure.exit_code == 4
        assert str(failure) == (
            "rank 1 of 2: a collective waited more than 10 min for the other ranks "
            "(trainer.collective_timeout_minutes); a rank stalled or died (see its own output)"
        )
    lost = _collective_failure(RuntimeError(GLOO_LOST), 0.5, key, "a setup barrier", absent=[0])
    assert str(lost) == (
        "rank 1 of 2: a setup barrier lost its connection to another rank; rank 0 did not arrive: it ended or died "
        "(see its own output)"
    )
    three = CollectiveTimeout(0, 4, 0.05, "trainer.setup_timeout_minutes", "a setup barrier", absent=[3, 1])
    assert str(three).endswith("(trainer.setup_timeout_minutes); ranks 1, 3 did not arrive: they stalled or died "
                               "(see their own output)")  # fmt: skip
    # anything else is left as it is
    assert _collective_failure(RuntimeError("CUDA out of memory"), 10, key) is None
    assert _collective_failure(RuntimeError("the data loader timed out"), 10, key) is None
    assert _collective_failure(ValueError(GLOO_TIMEOUT), 10, key) is None


def test_one_process_leaves_torch_errors_alone():
    assert not dist.is_initialized()
    assert _collective_failure(RuntimeError(GLOO_TIMEOUT), 10, "trainer.collective_timeout_minutes") is None
    assert trainer._setup_group(None, 1.0) is None
    assert trainer.leave_after_collective_failure(4) is None  # no process group: it returns instead of exiting


# A child `rlattention fit` with two processes (Lightning's launcher starts rank 1 by re-running this script with the
# same arguments). MODE "stall": rank 1 never calls its first backward (alive, silent, until rank 0 has ended);
# "slow": rank 0 builds the data for SLOW_S s more, then rank 1 builds its model for SLOW_S s more; "stuck": rank 0
# never ends building the data; "late": rank 1 starts SLOW_S s after rank 0 (a loaded machine). Every rank appends
# the backend and timeout of each process group it makes with new_group to RECORD.<rank>.
CHILD = textwrap.dedent(
    """
    import os, sys, time
    import lightning.fabric
    import torch.distributed as dist
    import rlattention.engine.trainer as trainer
    from rlattention.cli import main

    MODE, RECORD = sys.argv[1], sys.argv[2]
    SLOW_S = float(os.environ["SLOW_S"])
    if MODE == "late" and os.environ.get("LOCAL_RANK") == "1":  # before it imports the library or meets rank 0
        time.sleep(SLOW_S)

    def stall_until_rank_0_ends():  # rank 1 is rank 0's child
        parent, deadline = os.getppid(), time.monotonic() + 120
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)

    real_new_group = dist.new_group
    def new_group(*args, **kwargs):
        with open(f"{RECORD}.{dist.get_rank()}", "a") as f:
            f.write(f"{kwargs.get('backend')} {kwargs.get('timeout')}\\n")
        return real_new_group(*args, **kwargs)
    dist.new_group = new_group

    real_build = trainer.build_dataset
    def build(*args, **kwargs):
        if dist.get_rank() == 0 and MODE == "slow":
            time.sleep(SLOW_S)
        if dist.get_rank() == 0 and MODE == "stuck":  # until Lightning's launcher kills it (rank 1 failed)
            time.sleep(120)
        return real_build(*args, **kwargs)
    trainer.build_dataset = build

    real_build_model = trainer.build_model
    def build_model(*args, **kwargs):
        if dist.get_rank() == 1 and MODE == "slow":  # e.g. a cache of frozen features that only rank 1 computes
            time.sleep(SLOW_S)
        return real_build_model(*args, **kwargs)
    trainer.build_model = build_model

    real_backward = lightning.fabric.Fabric.backward
    def backward(self, *args, **kwargs):
        if MODE == "stall" and dist.get_rank() == 1:
            stall_until_rank_0_ends()
        return real_backward(self, *args, **kwargs)
    lightning.fabric.Fabric.backward = backward

    sys.exit(main(sys.argv[3:]))
    """
)
TINY = [
    "--config",
    str(REPO / "configs" / "ram_digits.yaml"),
    "data.num_train=64",
    "data.val_size=16",
    "data.num_test=16",
    "trainer.batch_size=16",
    "trainer.max_steps=2",
    "trainer.num_threads=1",
    "trainer.progress=false",
    "eval.viz_images=0",
    "trainer.strategy=ddp",
    "trainer.devices=2",
    "trainer.accelerator=cpu",
]


def _child(tmp_path: Path, mode: str, *overrides: str) -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK")}
    env.pop("WORLD_SIZE", None)  # Lightning picks a free port and sets the rest for the processes it starts
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    env["SLOW_S"] = str(SLOW_S)
    argv = ["fit", *TINY, f"trainer.out_dir={tmp_path / 'runs'}", "trainer.run_name=run", *overrides]
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(tmp_path / "groups"), *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, time.monotonic() - start


def _our_line(stderr: str) -> str:
    """The one line of ours (Lightning's start-up banner goes to stderr too), last, and no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    ours = [line for line in stderr.splitlines() if line.startswith("rlattention")]
    assert len(ours) == 1, stderr[-3000:]
    return ours[0]


def test_a_stalled_rank_fails_the_other_after_the_timeout_with_one_line(tmp_path):
    """Rank 1 stays alive but never reaches its first backward: rank 0's gradient all-reduce fails after the
    timeout (0.25 min = 15 s, not Lightning's 30 minutes), with one line naming rank 0, the timeout and its key,
    and exit code 4 (rank 0 does not wait for rank 1 again on its way out)."""
    proc, elapsed = _child(tmp_path, "stall", f"trainer.collective_timeout_minutes={TIMEOUT_MIN}")
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert _our_line(proc.stderr) == (
        f"rlattention fit: error: rank 0 of 2: a collective waited more than {TIMEOUT_MIN} min for the other ranks "
        "(trainer.collective_timeout_minutes); a rank stalled or died (see its own output)"
    )
    assert proc.stderr.rstrip().endswith("(see its own output)")
    assert elapsed < 120, elapsed  # far below the default of 10 minutes
    assert not (tmp_path / "runs" / "run" / "report.json").exists()


def test_rank_0_building_longer_than_the_timeout_does_not_fail_the_run(tmp_path):
    """Rank 0 builds the data 20 s, longer than the collective timeout (0.25 min = 15 s), while rank 1 waits, then
    rank 1 builds its model 20 s longer while rank 0 waits for the first training collective: both waits are on the
    setup group (gloo, trainer.setup_timeout_minutes: 4 hours by default), so the run trains and ends."""
    proc, elapsed = _child(tmp_path, "slow", f"trainer.collective_timeout_minutes={TIMEOUT_MIN}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "runs" / "run" / "report.json").read_text())
    assert report["world_size"] == 2 and report["steps"] == 2 and report["params_in_sync"] is True
    assert elapsed > 2 * SLOW_S
    for rank in (0, 1):  # one group made by each rank: gloo, the setup timeout
        assert (tmp_path / f"groups.{rank}").read_text().splitlines() == ["gloo 4:00:00"]


def test_a_rank_starting_later_than_the_collective_timeout_does_not_fail_the_run(tmp_path):
    """Rank 1 starts 20 s after rank 0, longer than the collective timeout (0.25 min = 15 s), as the processes of a
    loaded machine can (CI beside two trainings once took more than 15 s): the start-up rendezvous waits for
    trainer.setup_timeout_minutes, not the collective timeout, so the run trains and ends. (With the one timeout
    Lightning gives both, rank 0 failed with torch's DistNetworkError: the store's connect timed out.)"""
    proc, elapsed = _child(tmp_path, "late", f"trainer.collective_timeout_minutes={TIMEOUT_MIN}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "runs" / "run" / "report.json").read_text())
    assert report["world_size"] == 2 and report["steps"] == 2 and report["params_in_sync"] is True
    assert elapsed > SLOW_S


def test_rank_0_building_longer_than_the_setup_timeout_fails_with_one_line(tmp_path):
    """Rank 0 never ends building the data: rank 1 waits on the setup group for trainer.setup_timeout_minutes
    (0.1 min), then fails with one line naming itself, the key and rank 0 as the rank that did not arrive; rank 1's
    exit makes Lightning's launcher kill rank 0 (the job's process)."""
    proc, elapsed = _child(tmp_path, "stuck", "trainer.setup_timeout_minutes=0.1")
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert _our_line(proc.stderr) == (
        "rlattention fit: error: rank 1 of 2: a setup barrier waited more than 0.1 min for the other ranks "
        "(trainer.setup_timeout_minutes); rank 0 did not arrive: it stalled or died (see its own output)"
    )
    assert elapsed < 100, elapsed  # rank 0's build alone would last 120 s
