"""``Routine.run_many``: n steps in one call, bit for bit the results of n calls of ``run``, with
tensors recorded after every step; and ``Routine.run``'s fast path (a repeated run skips the
checks of the first), which must still see every buffer ``ctx.set`` replaces."""

from __future__ import annotations

import numpy as np
import pytest

import ocannl as oc
from ocannl import train
from ocannl.errors import BackendUnavailable, IndexBindingError, OutOfBoundsError, SessionError

BACKENDS = ("interp", "c", "metal", "triton")


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    try:
        oc.Context(request.param)
    except BackendUnavailable as e:
        pytest.skip(str(e))
    return request.param


def _training(backend: str, n_batches: int = 4, steps: int = 6):
    """A small SGD training routine reading a batch by ``batch_n`` and a learning rate falling with
    ``step_n``; returns (ctx, routine, loss, weight)."""
    oc.seed(3)
    ctx = oc.Context(backend)
    rng = np.random.default_rng(0)
    xs = oc.tensor(rng.uniform(-1, 1, (n_batches, 5, 3)).astype(np.float32), batch=2, label="xs")
    ys = oc.tensor(rng.uniform(-1, 1, (n_batches, 5, 1)).astype(np.float32), batch=2, label="ys")
    batch_n, step_n = oc.IndexSymbol("batch_n", n_batches), oc.IndexSymbol("step_n", steps)
    w = oc.param("w", output=4)
    v = oc.param("v", output=1)
    error = v @ oc.relu(w @ xs[batch_n]) - ys[batch_n]
    loss = (error * error).mean(label="loss")
    update = train.grad_update(loss)
    sgd = train.sgd_update(update, lr=0.1 * (2 * steps - step_n) / steps, momentum=0.5)
    return ctx, ctx.compile(update, sgd), loss, w


def test_run_many_gives_the_bits_of_n_runs(backend):
    batches, steps = [1, 3, 0, 2, 2, 1], range(6)
    ctx, routine, loss, w = _training(backend)
    expected_losses, expected_weights = [], []
    for b, s in zip(batches, steps):
        routine.run(batch_n=b, step_n=s)
        expected_losses.append(ctx.get(loss))
        expected_weights.append(ctx.get(w))
    routine.run()  # the last values stay bound
    expected_after = ctx.get(loss)

    oc.session.reset()
    ctx, routine, loss, w = _training(backend)
    before = ctx.stats.runs
    losses, weights = routine.run_many(batch_n=batches, step_n=steps, record=[loss, w])
    assert ctx.stats.runs - before == 6
    assert losses.shape == (6, *loss.dims) and losses.dtype == np.float32
    assert weights.shape == (6, *w.dims) == (6, 4, 3)
    assert len({row.tobytes() for row in weights}) == 6  # every step trained
    assert losses.tobytes() == np.array(expected_losses).tobytes()
    assert weights.tobytes() == np.array(expected_weights).tobytes()
    assert ctx.get(w).tobytes() == expected_weights[-1].tobytes()
    routine.run()
    assert ctx.get(loss).tobytes() == expected_after.tobytes()


def test_run_many_in_several_calls_continues_the_training(backend):
    ctx, routine, loss, w = _training(backend)
    first = routine.run_many(batch_n=[0, 1, 2], step_n=[0, 1, 2], record=loss)
    second = routine.run_many(batch_n=np.array([3, 0, 1], np.int32), step_n=range(3, 6), record=loss)
    oc.session.reset()
    ctx, routine, loss, w = _training(backend)
    whole = routine.run_many(batch_n=[0, 1, 2, 3, 0, 1], step_n=range(6), record=loss)
    assert np.concatenate([first, second]).tobytes() == whole.tobytes()


def test_a_symbol_not_given_keeps_its_bound_value(backend):
    ctx, routine, loss, w = _training(backend)
    routine.run(batch_n=2, step_n=0)
    recorded = routine.run_many(step_n=[1, 2], record=loss)
    oc.session.reset()
    ctx, routine, loss, w = _training(backend)
    expected = []
    for s in (0, 1, 2):
        routine.run(batch_n=2, step_n=s)
        expected.append(ctx.get(loss))
    assert recorded.tobytes() == np.array(expected[1:]).tobytes()


def test_an_empty_sequence_runs_nothing(backend):
    ctx, routine, loss, w = _training(backend)
    weights = ctx.get(w)
    runs = ctx.stats.runs
    assert routine.run_many(batch_n=[], step_n=[]) is None
    losses, recorded = routine.run_many(batch_n=range(0), step_n=range(0), record=[loss, w])
    assert losses.shape == (0, *loss.dims) and recorded.shape == (0, 4, 3)
    assert ctx.stats.runs == runs and (ctx.get(w) == weights).all()
    with pytest.raises(IndexBindingError, match="that have no value"):
        routine.run()  # run_many bound nothing


def test_a_binding_out_of_range_is_refused_before_any_step(backend):
    ctx, routine, loss, w = _training(backend)
    weights, runs = ctx.get(w), ctx.stats.runs
    with pytest.raises(IndexBindingError, match=r"routine .*: index symbol batch_n = 4 is outside \[0, 4\), the range "
                                                r"of its size 4 \(at step 2 of run_many\)"):
        routine.run_many(batch_n=[0, 1, 4], step_n=[0, 1, 2])
    with pytest.raises(IndexBindingError, match=r"step_n = -1 is outside \[0, 6\).*\(at step 1 of run_many\)"):
        routine.run_many(batch_n=np.array([0, 1]), step_n=np.array([0, -1]))
    with pytest.raises(IndexBindingError, match=r"batch_n must be bound to an int, got the bool True \(at step 0"):
        routine.run_many(batch_n=[True], step_n=[0])
    with pytest.raises(IndexBindingError, match=r"got 1.0 \(float\) \(at step 1 of run_many\)"):
        routine.run_many(batch_n=[0, 1.0], step_n=[0, 1])
    assert ctx.stats.runs == runs and ctx.get(w).tobytes() == weights.tobytes()


def test_malformed_bindings_are_refused(backend):
    ctx, routine, loss, w = _training(backend)
    with pytest.raises(IndexBindingError, match=r"all sequences of one length; batch_n has 2, step_n has 3"):
        routine.run_many(batch_n=[0, 1], step_n=[0, 1, 2])
    with pytest.raises(IndexBindingError, match=r"binds batch_n to a sequence of ints, one per step; got 1 \(int\)"):
        routine.run_many(batch_n=1, step_n=[0])
    with pytest.raises(IndexBindingError, match=r"has no index symbol 'epoch_n' \(it reads: batch_n, step_n\)"):
        routine.run_many(epoch_n=[0])
    with pytest.raises(IndexBindingError, match=r"reads index symbol\(s\) step_n that have no value"):
        routine.run_many(batch_n=[0])
    with pytest.raises(IndexBindingError, match=r"takes the number of steps from its bindings, a sequence per "
                                                r"index symbol, and got none: e.g. run_many\(batch_n=range\(10\)\)"):
        routine.run_many(record=loss)
    constant = ctx.compile((oc.tensor(np.ones(2, np.float32)) * 2.0).materialize())
    with pytest.raises(IndexBindingError, match=r"reads no index symbol, .*call run\(\) once per step"):
        constant.run_many()


def test_record_names_only_what_the_routine_stores():
    ctx, routine, loss, w = _training("interp")
    other = oc.param("other", output=2, init=1.0)
    ctx.compile(other * 1.0).run()
    with pytest.raises(SessionError, match=r"neither reads nor writes other"):
        routine.run_many(batch_n=[0], step_n=[0], record=other)
    x = oc.tensor(np.ones((2,), np.float32))
    hidden = x * 2.0  # computed inline by the routine reading it: never stored
    reader = ctx.compile(hidden + 1.0)
    assert hidden.value in reader._inlined
    with pytest.raises(SessionError, match=r"was virtualized: routine .* computes it inline"):
        reader.run_many(record=hidden)
    with pytest.raises(TypeError, match=r"expected a tensor"):
        routine.run_many(batch_n=[0], step_n=[0], record="loss")


def test_a_failing_step_is_named_and_the_steps_before_it_ran(backend):
    """An index symbol without a size, past the axis it indexes: the kernel's check fails at
    step 2; steps 0 and 1 ran and count, as two calls of run() would have, and step 2's values
    stay bound."""
    ctx = oc.Context(backend)
    rows = oc.tensor(np.arange(12, dtype=np.float32).reshape(4, 3), batch=1, label="rows")
    b = oc.IndexSymbol("b")
    row = (rows[b] * 1).materialize()
    routine = ctx.compile(row)
    np.testing.assert_array_equal(routine.run_many(b=[2, 1], record=row), [[6, 7, 8], [3, 4, 5]])
    runs = ctx.stats.runs
    with pytest.raises(OutOfBoundsError, match=r"at step 2 of run_many"):
        routine.run_many(b=[1, 3, 7, 0], record=row)
    assert ctx.stats.runs == runs + 2 and routine._bindings == {b: 7}
    routine.run(b=3)  # the routine still runs afterwards
    np.testing.assert_array_equal(ctx.get(row), [9, 10, 11])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_records_read_as_ctx_get_reads(backend, dtype):
    """A 16-bit parameter trained by SGD: each recorded value is what ctx.get returns after that
    step (bfloat16 widened to float32)."""
    s = oc.IndexSymbol("s", 10)

    def build():
        ctx = oc.Context(backend)
        w = oc.param("w", output=2, dtype=dtype, init=np.array([1.1, -2.3], np.float32))
        update = train.grad_update((w * s).sum())
        return ctx, ctx.compile(update, train.sgd_update(update, lr=0.1)), w

    ctx, routine, w = build()
    recorded = routine.run_many(s=[1, 3, 9], record=w)
    oc.session.reset()
    ctx, routine, w = build()
    expected = []
    for v in (1, 3, 9):
        routine.run(s=v)
        expected.append(ctx.get(w))
    assert recorded.dtype == expected[0].dtype and recorded.shape == (3, 2)
    assert recorded.tobytes() == np.array(expected).tobytes()


def test_a_repeated_run_sees_what_set_replaced(backend):
    """run()'s fast path (the checks and bookkeeping of the last run still hold) must notice a
    buffer replaced by ctx.set or t.set, an input's or the routine's own output's."""
    ctx = oc.Context(backend)
    s = oc.IndexSymbol("s", 100)
    x = oc.param("x", output=3, init=np.array([1.0, 2.0, 3.0], np.float32))
    y = (x * s).materialize()
    routine = ctx.compile(y)
    routine.run(s=2)
    routine.run(s=3)
    np.testing.assert_array_equal(ctx.get(y), [3, 6, 9])
    ctx.set(x, np.array([10.0, 20.0, 30.0], np.float32))
    routine.run(s=3)
    np.testing.assert_array_equal(ctx.get(y), [30, 60, 90])
    np.testing.assert_array_equal(routine.run_many(s=[1, 2], record=y), [[10, 20, 30], [20, 40, 60]])
    x.set(np.array([-1.0, 0.0, 1.0], np.float32))
    routine.run(s=4)
    np.testing.assert_array_equal(ctx.get(y), [-4, 0, 4])
    ctx.set(y, np.zeros(3, np.float32))  # the routine's output replaced: the next run writes the new buffer
    routine.run(s=5)
    np.testing.assert_array_equal(ctx.get(y), [-5, 0, 5])


def test_a_repeated_run_still_refuses_a_node_another_routine_inlined():
    """``later`` reads m; after it has run (its fast path ready), ``first`` computes m inline
    without storing it: ``later``'s next run must refuse, as a first run would."""
    from handbuilt import accum
    from ocannl.lowlevel.assignments import Block, Computation
    from ocannl.lowlevel.indexing import Iter, Symbol
    from ocannl.lowlevel.scalar_ops import Binop, Unop
    from ocannl.lowlevel.tnode import MemoryMode, TNode

    def pointwise(lhs, fn, *rhs):
        i = Symbol()
        return accum(lhs, None, fn, rhs, [(i, 3)], (Iter(i),),
                     tuple((Iter(i),) if isinstance(r, TNode) else () for r in rhs))

    x, m, y, z = TNode("x", (3,)), TNode("m", (3,), memory_mode=MemoryMode.VIRTUAL), TNode("y", (3,)), TNode("z", (3,))
    ctx = oc.Context("interp")
    ctx.set(x, np.arange(3, dtype=np.float32))
    first = ctx.compile(Computation("first", Block((pointwise(m, Binop.MUL, x, 2.0), pointwise(y, Unop.EXP, m)))))
    later = ctx.compile(Computation("later", pointwise(z, Unop.NEG, m)))
    later.run()
    later.run()
    first.run()
    with pytest.raises(SessionError, match="routine first computed it inline"):
        later.run()


def test_routines_run_in_alternation_stay_right_and_fast(backend):
    """A training step and an evaluation alternating: neither changes what the other checks, so
    both keep run()'s fast path (the module's epoch does not move); a set still reaches both."""
    from ocannl.backends.session_state import session_state

    ctx, step, loss, w = _training(backend)
    probe = oc.tensor(np.ones((2, 3), np.float32), batch=1, label="probe")
    scores = (w @ probe).materialize()
    evaluation = ctx.compile(scores)
    for s in range(3):
        step.run(batch_n=s, step_n=s)
        evaluation.run()
    epoch = session_state.epoch
    for s in range(3, 5):
        step.run(batch_n=s % 4, step_n=s)
        evaluation.run()
        np.testing.assert_allclose(ctx.get(scores), np.tile(ctx.get(w).sum(axis=1), (2, 1)), rtol=1e-6)
    assert session_state.epoch == epoch
    w.set(np.zeros((4, 3), np.float32))
    evaluation.run()
    np.testing.assert_array_equal(ctx.get(scores), np.zeros((2, 4), np.float32))
