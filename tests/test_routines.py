"""Routines are compiled once and run many times with different index bindings (docs/training.md,
"Routines and index symbols"): compilation counts, the training loops' bindings, binding errors."""

from __future__ import annotations

import numpy as np
import pytest

import ocannl as oc
from ocannl import train
from ocannl.errors import IndexBindingError

N_BATCHES, BATCH, STEPS = 5, 4, 100

RNG = np.random.default_rng(11)
XS = RNG.normal(size=(N_BATCHES, BATCH, 2))
YS = RNG.normal(size=(N_BATCHES, BATCH, 1))
W0 = np.array([[0.3, -0.2]])
B0 = np.array([0.1])


def schedule(k: int) -> float:
    """``0.1 * (2*STEPS - step_n) / STEPS`` in float32, as the routine computes it from the
    float32 ``step_n`` scalar."""
    f32 = np.float32
    return float(f32(f32(0.1) * f32(f32(2 * STEPS) - f32(k))) / f32(STEPS))


def count_backend_compiles(ctx: oc.Context, monkeypatch) -> list:
    """Record every call of the backend's compiler (a recompilation would show here even if it
    bypassed ``ctx.stats``)."""
    calls: list = []
    compile_ir = ctx.backend.compile

    def counted(routine_ir):
        calls.append(routine_ir.name)
        return compile_ir(routine_ir)

    monkeypatch.setattr(ctx.backend, "compile", counted)
    return calls


def test_training_routine_compiles_once_for_100_steps(monkeypatch):
    """One SGD routine over ``xs[batch_n]`` with a ``step_n`` learning-rate schedule: 100 runs
    with changing bindings, no recompilation, and each run used its bindings (the loss and the
    parameters follow a numpy reference that reads batch ``k % 5`` at step ``k``)."""
    batch_n = oc.IndexSymbol("batch_n", N_BATCHES)
    step_n = oc.IndexSymbol("step_n", STEPS)
    xs = oc.tensor(XS, batch=2, dtype="float64")
    ys = oc.tensor(YS, batch=2, dtype="float64")
    w = oc.param("w", output=1, input=2, init=W0, dtype="float64")
    b = oc.param("b", output=1, init=B0, dtype="float64")
    loss = ((w @ xs[batch_n] + b - ys[batch_n]) ** 2).mean()
    update = train.grad_update(loss)
    sgd = train.sgd_update(update, lr=0.1 * (2 * STEPS - step_n) / STEPS)

    ctx = oc.Context("interp")
    calls = count_backend_compiles(ctx, monkeypatch)
    routine = ctx.compile(update, sgd)
    assert ctx.stats.compilations == 1
    compiled = len(calls)

    ref_w, ref_b = W0.copy(), B0.copy()
    for k in range(STEPS):
        n = (3 * k) % N_BATCHES
        routine.run(batch_n=n, step_n=k)
        err = XS[n] @ ref_w.T + ref_b - YS[n]
        np.testing.assert_allclose(loss.numpy(), (err ** 2).mean(), rtol=1e-12, err_msg=f"loss at step {k}")
        ref_w = ref_w - schedule(k) * (2 / BATCH) * err.T @ XS[n]
        ref_b = ref_b - schedule(k) * (2 / BATCH) * err.sum(axis=0)
    assert ctx.stats.compilations == 1
    assert len(calls) == compiled, f"recompiled while running: {calls[compiled:]}"
    assert ctx.stats.runs >= STEPS
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-10)
    np.testing.assert_allclose(b.numpy(), ref_b, rtol=1e-10)


def offsets_routine(ctx: oc.Context, n_batches: int = 3, steps: int = 6):
    """``y = xs[batch_n] + 10 * step_n`` with ``xs[j] = (100 j, 100 j + 1)``: y reveals both
    bindings of the run that computed it."""
    xs = oc.tensor(100.0 * np.arange(n_batches)[:, None] + np.arange(2.0)[None, :], batch=1, dtype="float64")
    batch_n = oc.IndexSymbol("batch_n", n_batches)
    step_n = oc.IndexSymbol("step_n", steps)
    y = xs[batch_n] + 10 * step_n
    return ctx.compile(y), y


def expected_offsets(batch: int, step: int) -> list[float]:
    return [100.0 * batch + 10.0 * step, 100.0 * batch + 10.0 * step + 1]


def test_forward_routine_rebinds_without_recompiling(monkeypatch):
    ctx = oc.Context("interp")
    calls = count_backend_compiles(ctx, monkeypatch)
    routine, y = offsets_routine(ctx, n_batches=3, steps=STEPS)
    compiled = len(calls)
    for k in range(STEPS):
        routine.run(batch_n=k % 3, step_n=k)
        assert y.numpy().tolist() == expected_offsets(k % 3, k)
    assert ctx.stats.compilations == 1 and len(calls) == compiled


def test_a_binding_stays_until_changed():
    routine, y = offsets_routine(oc.Context("interp"))
    routine.run(batch_n=2, step_n=1)
    routine.run(step_n=4)
    assert y.numpy().tolist() == expected_offsets(2, 4)
    routine.run()
    assert y.numpy().tolist() == expected_offsets(2, 4)


def test_sequential_loop_visits_every_binding_last_fastest():
    ctx = oc.Context("interp")
    routine, y = offsets_routine(ctx)
    seen = []
    for bindings in train.sequential_loop(routine, batch_n=range(3), step_n=[5, 0]):
        assert y.numpy().tolist() == expected_offsets(bindings["batch_n"], bindings["step_n"])
        seen.append((bindings["batch_n"], bindings["step_n"]))
    assert seen == [(0, 5), (0, 0), (1, 5), (1, 0), (2, 5), (2, 0)]
    assert ctx.stats.compilations == 1


def test_train_epochs_binds_batch_and_global_step():
    ctx = oc.Context("interp")
    routine, y = offsets_routine(ctx, n_batches=3, steps=6)
    seen = []

    def on_step(epoch, batch, step):
        assert y.numpy().tolist() == expected_offsets(batch, step)
        seen.append((epoch, batch, step))

    train.train_epochs(routine, epochs=2, batch_symbol="batch_n", n_batches=3, step_symbol="step_n", on_step=on_step)
    assert seen == [(0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 0, 3), (1, 1, 4), (1, 2, 5)]
    assert ctx.stats.compilations == 1


def test_train_epochs_without_a_step_symbol():
    batch_n = oc.IndexSymbol("batch_n", 4)
    xs = oc.tensor(np.arange(4.0)[:, None], batch=1, dtype="float64")
    y = xs[batch_n] * 2
    routine = oc.Context("interp").compile(y)
    values = []
    train.train_epochs(routine, epochs=3, batch_symbol="batch_n", n_batches=4,
                       on_step=lambda epoch, batch, step: values.append((epoch, batch, step, float(y.numpy()[0]))))
    assert values == [(e, j, 4 * e + j, 2.0 * j) for e in range(3) for j in range(4)]


def test_missing_binding_names_the_symbol():
    routine, _ = offsets_routine(oc.Context("interp"))
    with pytest.raises(IndexBindingError, match="batch_n") as info:
        routine.run()
    assert "step_n" in str(info.value)
    with pytest.raises(IndexBindingError, match="step_n"):
        routine.run(batch_n=1)


@pytest.mark.parametrize("name, value", [("batch_n", 3), ("batch_n", -1), ("step_n", 6), ("step_n", 1000)])
def test_out_of_range_binding_names_the_symbol(name, value):
    routine, y = offsets_routine(oc.Context("interp"), n_batches=3, steps=6)
    routine.run(batch_n=1, step_n=2)
    with pytest.raises(IndexBindingError, match=rf"{name}.*{value}"):
        routine.run(**{name: value})
    routine.run()  # the rejected value was not kept
    assert y.numpy().tolist() == expected_offsets(1, 2)


def test_out_of_range_binding_in_a_loop_names_the_symbol():
    routine, _ = offsets_routine(oc.Context("interp"), n_batches=3, steps=6)
    with pytest.raises(IndexBindingError, match="batch_n"):
        list(train.sequential_loop(routine, batch_n=range(4), step_n=range(1)))
    with pytest.raises(IndexBindingError, match="step_n"):
        train.train_epochs(routine, epochs=3, batch_symbol="batch_n", n_batches=3, step_symbol="step_n")


@pytest.mark.parametrize("bindings, match", [({"steps": 1}, "steps"), ({"batch_n": 1.5}, "batch_n")])
def test_unknown_symbol_or_non_integer_value_is_an_error(bindings, match):
    routine, _ = offsets_routine(oc.Context("interp"))
    with pytest.raises(IndexBindingError, match=match):
        routine.run(**bindings)


def test_each_compile_counts():
    ctx = oc.Context("interp")
    offsets_routine(ctx)
    x = oc.param("x", output=2, init=np.array([1.0, 2.0]), dtype="float64")
    routine = ctx.compile(train.grad_update((x * x).sum()))
    for _ in range(5):
        routine.run()
    assert ctx.stats.compilations == 2
