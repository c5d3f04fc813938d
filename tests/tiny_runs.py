"""The override list of a tiny training run, shared by the tests that train one: RAM on the drawn digits (no data
folder), one thread, no progress bar, sizes small enough for seconds. Each test picks its sizes; what every such
run has in common lives here once. Importable from every test folder (pytest puts ``tests/``, the folder of the root
conftest, on ``sys.path``)."""

from __future__ import annotations

from collections.abc import Sequence


def tiny_ram(
    *,
    train: int = 64,
    val: int = 32,
    test: int = 32,
    canvas: int = 32,
    glimpses: int = 2,
    hidden: int = 16,
    batch: int = 16,
    eval_batch: int | None = None,
    viz: int = 0,
    extra: Sequence[str] = (),
) -> list[str]:
    """``key=value`` overrides (on top of the defaults or of ``configs/ram_digits.yaml``) of a RAM run on ``train``
    drawn digits (``val`` validation, ``test`` test images) of ``canvas`` pixels, ``glimpses`` glimpses, hidden and
    glimpse sizes ``hidden``, batch ``batch``; ``viz`` figure images; ``extra`` appended as they are."""
    return [
        "data.name=digits",
        f"data.num_train={train}",
        f"data.val_size={val}",
        f"data.num_test={test}",
        f"data.canvas_size={canvas}",
        f"model.num_glimpses={glimpses}",
        f"model.hidden_size={hidden}",
        f"model.glimpse_dim={hidden}",
        f"trainer.batch_size={batch}",
        *([f"trainer.eval_batch_size={eval_batch}"] if eval_batch else []),
        "trainer.progress=false",
        "trainer.num_threads=1",
        f"eval.viz_images={viz}",
        *extra,
    ]


#: the run the crash-and-resume tests kill and continue: 512 / 32 = 16 steps an epoch, 64 steps in all, ``last``
#: saved every 3 steps (so mid-epoch checkpoints are resumed from), deterministic (a continued run must equal an
#: uninterrupted one)
RESUMABLE = tiny_ram(
    train=512,
    val=64,
    test=64,
    hidden=32,
    batch=32,
    eval_batch=64,
    extra=["optim.lr=0.01", "trainer.epochs=4", "trainer.checkpoint_every=3", "trainer.deterministic=true"],
)


def config_of(overrides: Sequence[str]) -> dict:
    """A YAML config's nested mapping with the values of ``key=value`` overrides (how a run is run, progress and
    threads, left out: a study passes those itself)."""
    import yaml

    nested: dict = {}
    for item in overrides:
        if item.startswith(("trainer.progress", "trainer.num_threads")):
            continue
        key, value = item.split("=", 1)
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return nested


def sigterm_at_step(monkeypatch, at: int) -> None:
    """This process sends itself SIGTERM inside optimiser step ``at`` of the next run (1-based; the run stops at that
    step's end and saves ``last``), by wrapping Fabric's backward pass."""
    import os
    import signal

    from lightning.fabric import Fabric

    real, calls = Fabric.backward, [0]

    def backward(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Fabric, "backward", backward)


def eval_in_process(argv: Sequence[str], threads: int) -> dict:
    """What the benchmarks' ``run_eval`` returns for ``argv`` (``rlattention eval ... --json``), from the CLI run in
    this process on ``threads`` torch threads: no interpreter start-up and torch import per evaluation (about 5 s
    each on the CI machine). ``run_eval`` itself, a subprocess of the recorded command, is run by
    tests/test_unified_episodes.py."""
    import contextlib
    import io
    import json
    import shlex

    import torch

    from rlattention.cli import main

    assert argv[0] == "rlattention" and argv[1] == "eval", argv
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = main(list(argv[1:]))
    finally:
        torch.set_num_threads(before)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        raise RuntimeError(f"{shlex.join(argv)} failed ({code}): {out.getvalue()[-800:]}")
    return json.loads(lines[-1])
