"""``Routine.run``'s fast path when the prepared call has a direct path (the C backend's: each
binding stored straight into the int64 array the kernel reads, the ctypes call bound once): it
must see every binding however it was made (``run``, a non-int value through the checked path,
``run_many``'s last step), refuse what the checks refuse, and raise the kernel's own errors."""

from __future__ import annotations

import numpy as np
import pytest

import ocannl as oc
from ocannl.errors import IndexBindingError, OutOfBoundsError
from tests.backend_params import backend_param

BACKENDS = [backend_param(name) for name in ("interp", "c", "metal", "triton")]

TABLE = np.arange(20, dtype=np.float32).reshape(4, 5)


def _cell(backend: str):
    """A routine copying ``TABLE[a, b]``, ``b`` without a size (so its range is checked in the
    kernel): (ctx, routine, cell)."""
    ctx = oc.Context(backend)
    a, b = oc.IndexSymbol("a", 4), oc.IndexSymbol("b")
    cell = (oc.tensor(TABLE, batch=2, label="table")[a][b] * 1.0).materialize()
    return ctx, ctx.compile(cell), cell


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_reads_bindings_made_every_way(backend):
    ctx, routine, cell = _cell(backend)
    routine.run(a=1, b=2)
    assert float(ctx.get(cell)) == TABLE[1, 2]
    routine.run(a=3)  # b stays bound
    assert float(ctx.get(cell)) == TABLE[3, 2]
    routine.run(b=np.int64(4))  # a numpy integer takes the checked path
    assert float(ctx.get(cell)) == TABLE[3, 4]
    recorded = routine.run_many(a=[0, 2], b=[1, 3], record=cell)
    assert recorded.tolist() == [TABLE[0, 1], TABLE[2, 3]]
    routine.run(a=1)  # b keeps run_many's last value
    assert float(ctx.get(cell)) == TABLE[1, 3]
    routine.run(b=0)
    assert float(ctx.get(cell)) == TABLE[1, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fast_runs_refuse_bad_bindings_and_raise_kernel_errors(backend):
    ctx, routine, cell = _cell(backend)
    routine.run(a=2, b=1)
    runs = ctx.stats.runs
    with pytest.raises(IndexBindingError, match=r"has no index symbol 'c' \(it reads: a, b\)"):
        routine.run(c=0)
    with pytest.raises(IndexBindingError, match=r"a = 4 is outside \[0, 4\)"):
        routine.run(a=4)
    with pytest.raises(IndexBindingError, match=r"a must be bound to an int, got 1.5 \(float\)"):
        routine.run(a=1.5)
    assert ctx.stats.runs == runs and float(ctx.get(cell)) == TABLE[2, 1]
    with pytest.raises(OutOfBoundsError):  # past the table's row: the kernel's check fails
        routine.run(b=5)
    routine.run(b=4)  # and the routine still runs afterwards
    assert float(ctx.get(cell)) == TABLE[2, 4]
