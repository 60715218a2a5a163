"""What a run guarantees beyond its values (docs/semantics.md, "Failed runs" and "Threads"): a
run that fails leaves every tensor as it was, on every backend, and a context shared by threads
runs, reads and writes one at a time."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import ocannl as oc
from ocannl import train
from ocannl.errors import OutOfBoundsError
from tests.backend_params import backend_param

BACKENDS = [backend_param(name) for name in ("interp", "c", "metal", "triton")]

TABLE = np.arange(12, dtype=np.float32).reshape(4, 3)


def _failing_step(backend: str):
    """A routine of two statements, ``count =+ 1`` then ``total =+ table[j].sum()``: a ``j``
    past the table's 4 rows (``j`` has no size, so the kernel checks it) fails in the second,
    after the first has run. Returns (ctx, routine, count, total)."""
    ctx = oc.Context(backend)
    j = oc.IndexSymbol("j")
    table = oc.tensor(TABLE, batch=1, label="table")
    count = oc.tensor(np.zeros((), np.float32), label="count")
    total = oc.tensor(np.zeros((), np.float32), label="total")
    routine = ctx.compile(oc.cd.assign(count, "=+", 1.0), oc.cd.assign(total, "=+", table[j].sum()))
    return ctx, routine, count, total


def _values(ctx: oc.Context, *tensors) -> list[float]:
    return [float(ctx.get(t)) for t in tensors]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_run_leaves_every_tensor_as_it_was(backend):
    ctx, routine, count, total = _failing_step(backend)
    routine.run(j=1)
    assert _values(ctx, count, total) == [1.0, 12.0]
    with pytest.raises(OutOfBoundsError):
        routine.run(j=7)  # compiled code clamps to row 0 and goes on: its stores are undone
    assert _values(ctx, count, total) == [1.0, 12.0]
    routine.run(j=0)  # and the routine runs on from there
    assert _values(ctx, count, total) == [2.0, 15.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_gather_leaves_its_destination_as_it_was(backend):
    ctx = oc.Context(backend)
    ids = oc.tensor(np.array([1, 3]), label="ids")
    rows = oc.tensor(np.zeros((2, 3), np.float32), label="rows")
    routine = ctx.compile(oc.cd.assign(rows, "=+", oc.take(oc.tensor(TABLE, label="table"), ids)))
    routine.run()
    ctx.set(ids, np.array([2, 9]))  # the first row is gathered before the second fails
    with pytest.raises(OutOfBoundsError):
        routine.run()
    np.testing.assert_array_equal(ctx.get(rows), TABLE[[1, 3]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_run_leaves_what_follows_its_last_check_as_it_was(backend):
    """Compiled code went on past a failed check: a statement after the routine's last one ran
    and kept what it stored (``other`` became 2). On the C backend the routine now returns there,
    elsewhere the failed run's copies cover every buffer it writes."""
    ctx = oc.Context(backend)
    ids = oc.tensor(np.array([1, 3]), label="ids")
    rows = oc.tensor(np.zeros((2, 3), np.float32), label="rows")
    other = oc.tensor(np.zeros(5, np.float32), label="other")
    routine = ctx.compile(oc.cd.assign(rows, "=:", oc.take(oc.tensor(TABLE, label="table"), ids)),
                          oc.cd.assign(other, "=:", other + 1.0))
    routine.run()
    ctx.set(ids, np.array([1, 9]))
    with pytest.raises(OutOfBoundsError):
        routine.run()
    np.testing.assert_array_equal(ctx.get(other), np.ones(5, np.float32))
    np.testing.assert_array_equal(ctx.get(rows), TABLE[[1, 3]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_training_step_with_bad_token_ids_changes_nothing(backend):
    """An embedding's gather checks the ids and the gradient's scatter-add reuses them, so only
    the gather can fail (``analysis.last_check``): a failed step leaves the table, its gradient
    and every other tensor as they were, and a good step then trains as before."""
    ctx = oc.Context(backend)
    ids = oc.tensor(np.array([2, 0, 3]), label="ids")
    emb = oc.param("emb", output=(4, 3), init=TABLE)
    update = train.grad_update(oc.take(emb, ids).relu().sum())
    routine = ctx.compile(update, train.sgd_update(update, lr=0.5))
    routine.run()
    before = ctx.get(emb.value).copy(), ctx.get(emb.grad).copy(), float(ctx.get(update.loss))
    ctx.set(ids, np.array([2, 4, 3]))
    with pytest.raises(OutOfBoundsError):
        routine.run()
    after = ctx.get(emb.value), ctx.get(emb.grad), float(ctx.get(update.loss))
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])
    assert after[2] == before[2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_step_of_run_many_keeps_the_steps_before_it_only(backend):
    ctx, routine, count, total = _failing_step(backend)
    with pytest.raises(OutOfBoundsError, match="at step 2 of run_many"):
        routine.run_many(j=[1, 2, 7, 0])
    assert _values(ctx, count, total) == [2.0, 12.0 + 21.0]
    with pytest.raises(OutOfBoundsError):  # j stays bound to the failed step's 7, as after run(j=7)
        routine.run()
    routine.run(j=3)
    assert _values(ctx, count, total) == [3.0, 33.0 + 30.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_integer_division_by_zero_leaves_every_tensor_as_it_was(backend):
    ctx = oc.Context(backend)
    count = oc.tensor(np.zeros((), np.int32), label="count")
    quotients = oc.tensor(np.zeros(2, np.int32), label="quotients")
    divisors = oc.tensor(np.array([2, 1], np.int32), label="divisors")
    routine = ctx.compile(oc.cd.assign(count, "=+", oc.tensor(np.int32(1))),
                          oc.cd.assign(quotients, "=+", oc.div(oc.tensor(np.array([8, 8], np.int32)), divisors)))
    routine.run()
    ctx.set(divisors, np.array([4, 0]))
    with pytest.raises(ZeroDivisionError):  # oc.errors.IntegerDivisionError is one
        routine.run()
    assert int(ctx.get(count)) == 1 and ctx.get(quotients).tolist() == [4, 8]


def test_runs_copy_only_what_a_failure_may_have_written():
    """A training step whose symbols all have a size cannot fail: it runs as it is. One that
    gathers rows copies what its statements write up to its last check: the gather, since the
    scatter-add of the gradient reads the positions the gather checked, from a node nothing wrote
    since; not the gradient nor the parameters the optimizer updates after it."""
    ctx = oc.Context("interp")
    batch = oc.IndexSymbol("batch", 4)
    w = oc.param("w", output=3, init=1.0)
    update = train.grad_update(((oc.tensor(TABLE, batch=1)[batch] - w) ** 2).sum())
    assert ctx.compile(update, train.sgd_update(update))._guarded == ()
    emb = oc.param("emb", output=(4, 3), init=1.0)
    update = train.grad_update(oc.take(emb, oc.tensor(np.array([2, 0]), label="ids")).relu().sum())
    guarded = ctx.compile(update, train.sgd_update(update))._guarded
    assert guarded and emb.grad not in guarded and emb.value not in guarded
    _, routine, count, total = _failing_step("interp")
    assert routine._guarded == (count.value, total.value)


@pytest.fixture
def frequent_thread_switches():
    """Python switches threads every microsecond instead of every 5 ms, so that the threads of a
    test interleave inside runs and reads."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.parametrize("backend", BACKENDS[:3])  # the Triton interpreter takes minutes at this switch rate
def test_threads_sharing_a_context_see_whole_runs(backend, frequent_thread_switches):
    """Four threads run one routine, each with its own binding: every value recorded with a run
    is that run's, and every read between runs is some run's whole result (no half-written
    buffer, no other thread's binding)."""
    ctx = oc.Context(backend)
    rows = oc.IndexSymbol("row", 4)
    data = np.arange(4 * 512 * 512, dtype=np.float32).reshape(4, 512, 512)
    y = (oc.tensor(data, batch=1, label="xs")[rows] * 2.0 + 1.0).materialize()
    routine = ctx.compile(y)
    expected = [data[k] * 2 + 1 for k in range(4)]
    failures: list[str] = []

    def work(k: int) -> None:
        for _ in range(40):
            recorded = routine.run_many(row=[k], record=y)[0]
            if not np.array_equal(recorded, expected[k]):
                failures.append(f"thread {k} recorded another row's product")
            routine.run(row=k)
            seen = ctx.get(y)
            if not any(np.array_equal(seen, e) for e in expected):
                failures.append(f"thread {k} read a partial product")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]

