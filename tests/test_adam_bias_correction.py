"""Adam's bias corrections, ``lr / (1 - b1**t)`` and ``sqrt(1 - b2**t)``, depend on the step count
alone: ``train.adam_update`` computes each once per step into a scalar, which the update of every
cell reads, rather than two ``pow`` calls per cell. The arithmetic is the per-cell formula's, so
the backends still agree bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import ocannl as oc
from ocannl import train
from tests.backend_params import backend_param, runs_here


def _adam(ctx: oc.Context, decoupled: bool = False):
    """Three parameters (two float32, one float16) of a relu network, the learning rate an
    expression of the step: (routine, params)."""
    rng = np.random.default_rng(2)
    x = oc.tensor(rng.standard_normal((6, 5)).astype(np.float32), batch=1, label="x")
    w = oc.param("w", output=4, init=rng.standard_normal((4, 5)).astype(np.float32))
    h = oc.param("h", output=4, dtype="float16", init=rng.standard_normal(4).astype(np.float32))
    v = oc.param("v", output=1, init=rng.standard_normal((1, 4)).astype(np.float32))
    y = v @ oc.relu(w @ x + h)
    loss = (y * y).mean(label="loss")
    update = train.grad_update(loss)
    step_n = oc.IndexSymbol("step_n", 10)
    adam = train.adam_update(update, lr=0.01 * (10 - step_n) / 10, weight_decay=0.01, decoupled=decoupled)
    return ctx.compile(update, adam), (w, h, v)


@pytest.mark.skipif(not runs_here("c"), reason="reads the C backend's source")
def test_the_bias_corrections_are_computed_once_per_step():
    routine, params = _adam(oc.Context("c"))
    source = routine._executable.source.text
    # Two pow calls per parameter, each storing one scalar: none in a loop over the cells.
    calls = [line.strip() for line in source.splitlines() if "powf(" in line]
    assert len(calls) == 2 * len(params)
    assert all(line.split(" = ")[0].endswith(("_adam_step_size[0]", "_adam_bc2[0]")) for line in calls), calls


@pytest.mark.parametrize("backend", [backend_param(b) for b in ("c", "metal")])  # Triton sums in its own order
@pytest.mark.parametrize("decoupled", [False, True], ids=["l2", "adamw"])
def test_adam_steps_agree_with_the_interpreter_bit_for_bit(backend, decoupled):
    results = []
    for name in ("interp", backend):
        oc.session.reset()
        ctx = oc.Context(name)
        routine, params = _adam(ctx, decoupled)
        for step in range(4):
            routine.run(step_n=step)
        results.append([ctx.get(p).tobytes() for p in params])
    assert results[0] == results[1]


@pytest.mark.parametrize("backend", [backend_param(b) for b in ("interp", "c")])
def test_a_learning_rate_of_any_scalar_shape_gives_the_same_bits(backend):
    """A number, a tensor of dims () and one of dims (1,): the bias-corrected step size takes the
    learning rate's dims, and all three train alike."""
    results = set()
    for lr in (lambda: 0.01, lambda: oc.tensor(np.float32(0.01)), lambda: oc.tensor(np.array([0.01], np.float32))):
        oc.session.reset()
        w = oc.param("w", output=3, init=np.array([1.0, -2.0, 0.5], np.float32))
        update = train.grad_update((w * w * w).sum())
        ctx = oc.Context(backend)
        routine = ctx.compile(update, train.adam_update(update, lr=lr(), weight_decay=0.1, decoupled=True))
        for _ in range(3):
            routine.run()
        results.add(ctx.get(w).tobytes())
    assert len(results) == 1
