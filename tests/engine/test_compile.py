"""``trainer.compile=true``: the training step runs through torch.compile (inductor) and trains the same model.

With inductor's ``fallback_random`` the compiled step draws the same random numbers as eager mode, so a few
steps give the same weights up to float tolerance; checkpoints keep their parameter names."""

from __future__ import annotations

import shutil

import pytest
import torch
from tiny_runs import tiny_ram

from rlattention.engine.checkpoint import load_checkpoint_file
from rlattention.engine.config import load_config
from rlattention.engine.trainer import fit

TINY = tiny_ram(train=160, canvas=28, batch=32, extra=["trainer.max_steps=3", "trainer.deterministic=false"])


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="inductor needs a C compiler")
def test_compiled_training_step_matches_eager(tmp_path, monkeypatch):
    import torch._inductor.config as inductor_config

    # the eager random stream, for comparison (config.patch: monkeypatch's undo deletes torch config entries)
    patch = inductor_config.patch(fallback_random=True)
    patch.__enter__()
    threads = torch.get_num_threads()
    try:
        eager = fit(load_config(None, [*TINY, f"trainer.out_dir={tmp_path}", "trainer.run_name=eager"]))
        torch._dynamo.reset()
        calls = []
        real_compile = torch.nn.Module.compile

        def spy(self, *args, **kwargs):
            calls.append(type(self).__name__)
            return real_compile(self, *args, **kwargs)

        monkeypatch.setattr(torch.nn.Module, "compile", spy)
        compiled = fit(
            load_config(
                None, [*TINY, f"trainer.out_dir={tmp_path}", "trainer.run_name=compiled", "trainer.compile=true"]
            )
        )
    finally:
        patch.__exit__(None, None, None)
        torch.set_num_threads(threads)
        torch._dynamo.reset()
    assert calls == ["RAM"]  # the compiled run compiled the method's training step, once
    a = load_checkpoint_file(tmp_path / "eager" / "checkpoints" / "last.ckpt")["model"]
    b = load_checkpoint_file(tmp_path / "compiled" / "checkpoints" / "last.ckpt")["model"]
    assert list(a) == list(b)  # same parameter names: a compiled run's checkpoint loads anywhere
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=1e-4, rtol=1e-3), k
    assert compiled["test"]["accuracy"] == pytest.approx(eager["test"]["accuracy"], abs=100 / 32 + 1e-9)  # percent
