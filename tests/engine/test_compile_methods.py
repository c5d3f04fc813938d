"""``trainer.compile=true`` (``Module.compile`` of the training step) changes no method's training step beyond
float tolerance.

For every registered method, on the tiny models and synthetic data of ``tests/engine/test_precision.py``: one
eager training step and one compiled step of a copy of the same model, from the same seed, give the same loss,
the same terms and the same gradients (``rtol = 1e-4``, ``atol = 1e-5``: compiled code reorders float sums), and
draw the same random numbers.

The backend is ``aot_eager`` by default: dynamo's graph capture (with the graph breaks each method has) and
AOTAutograd's joint forward/backward graph, executed by eager kernels: everything in ``torch.compile`` that can
change a method's semantics, in seconds. Set ``RLATTENTION_COMPILE_BACKEND=inductor`` to run it with generated
C++ code as ``trainer.compile`` does (minutes on 2 cores; inductor's ``fallback_random`` keeps eager's random
stream); ``tests/engine/test_compile.py`` runs a whole compiled ``fit`` with inductor in the suite.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from rlattention.engine.registry import available_methods

BACKEND = os.environ.get("RLATTENTION_COMPILE_BACKEND", "aot_eager")
RTOL, ATOL = 1e-4, 1e-5

if BACKEND == "inductor" and shutil.which("cc") is None and shutil.which("gcc") is None:
    pytest.skip("inductor needs a C compiler", allow_module_level=True)


def _precision_module():
    """The tiny cases of ``test_precision.py`` (by path: the tests folder is not a package)."""
    key = "_compile_precision_cases"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("test_precision.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@pytest.fixture(scope="module")
def phase1_path(tmp_path_factory) -> Path:
    return _precision_module().phase1_path.__wrapped__(tmp_path_factory)


def _step(model, images, targets):
    torch.manual_seed(7)
    out = model(images, targets)
    state = torch.get_rng_state()
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, state, grads


@pytest.mark.parametrize("name", available_methods())
def test_compiled_training_step_matches_eager(name, phase1_path):
    import torch._inductor.config as inductor_config

    case = _precision_module().build(name, phase1_path)
    eager, compiled = case.model.train(), copy.deepcopy(case.model).train()
    options = dict(type(case.model).cpu_compile_options) if BACKEND == "inductor" else {}  # as trainer.compile
    compiled.compile(backend=BACKEND, options=options or None)
    torch._dynamo.reset()
    try:
        out_e, rng_e, grads_e = _step(eager, case.images, case.targets)
        with inductor_config.patch(fallback_random=True):
            out_c, rng_c, grads_c = _step(compiled, case.images, case.targets)
    finally:
        torch._dynamo.reset()
    assert torch.equal(rng_e, rng_c), f"{name}: the compiled step consumed the RNG stream differently"
    assert set(out_c.terms) == set(out_e.terms)
    for key in ("loss", *sorted(out_e.terms)):
        a = out_e.loss if key == "loss" else out_e.terms[key]
        b = out_c.loss if key == "loss" else out_c.terms[key]
        torch.testing.assert_close(b.detach().float(), a.detach().float(), rtol=RTOL, atol=ATOL, msg=f"{name} {key}")
    assert set(grads_c) == set(grads_e), f"{name}: different parameters received gradients"
    for n, g in grads_e.items():
        torch.testing.assert_close(grads_c[n], g, rtol=RTOL, atol=ATOL, msg=f"{name} gradient of {n}")
    # a compiled module keeps its parameter names (checkpoints load anywhere)
    assert [n for n, _ in compiled.named_parameters()] == [n for n, _ in eager.named_parameters()]
