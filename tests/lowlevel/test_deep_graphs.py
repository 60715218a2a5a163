"""Deep graphs: chains of thousands of pointwise ops compile and run, and every compile pass
takes time linear in the routine.

Inlining stops where an expression would nest deeper than ``INLINE_NESTING_LIMIT`` (the node
keeps its buffer), so the walkers that recurse into expressions (the optimizer's rewriters, the
printer, the emitters, the interpreter) never go deeper than that, whatever the depth of the
graph. Linearity is checked by counting the work of the passes (statements traced, expressions
rebuilt) at two sizes, not by timing them. The frontend's walks over the graph are iterative, and
the C backend calls a routine touching thousands of buffers (a deep network's training step).
"""

from __future__ import annotations

import importlib.util
import os
from collections import Counter

import numpy as np
import pytest

import ocannl as oc
import ocannl.session
from ocannl import train
from ocannl.lowlevel import dtypes
from ocannl.lowlevel import optimize as opt
from ocannl.lowlevel.assignments import Block
from ocannl.lowlevel.indexing import Fixed, Iter, Symbol
from ocannl.lowlevel.ir import Binary, Const, Load, RoutineIR, Store, format_routine, loop, nesting, seq
from ocannl.lowlevel.lower import lower_routine
from ocannl.lowlevel.rewrite import Rewriter
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.tnode import TNode

START = np.linspace(-1.0, 1.0, 8, dtype=np.float32)


def context(name: str) -> oc.Context:
    if name == "triton" and (importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1"):
        pytest.skip("the Triton tests run Triton's interpreter: pip install 'ocannl[triton]', TRITON_INTERPRET=1")
    ctx = oc.Context(name)
    ok, why = ctx.backend.available()
    if not ok:
        pytest.skip(why)
    return ctx


def chain(x, n_ops: int):
    """``n_ops`` pointwise ops applied in turn to ``x``: ``* 0.5``, ``+ 0.25``, ``tanh``, ..."""
    y = x
    for k in range(n_ops):
        if k % 3 == 0:
            y = y * 0.5
        elif k % 3 == 1:
            y = y + 0.25
        else:
            y = oc.tanh(y)
    return y


def chain_reference(n_ops: int) -> np.ndarray:
    y = START.copy()
    for k in range(n_ops):
        if k % 3 == 0:
            y = y * np.float32(0.5)
        elif k % 3 == 1:
            y = y + np.float32(0.25)
        else:
            y = np.tanh(y)
    return y


def run_chain(backend: str, n_ops: int) -> None:
    ctx = context(backend)
    y = chain(oc.tensor(START), n_ops)
    ctx.compile(y).run()
    # tanh is a libm function: backends may differ from numpy in its last bit, not more.
    np.testing.assert_allclose(ctx.get(y.value), chain_reference(n_ops), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["interp", "c", "metal", "triton"])
def test_a_chain_of_2000_pointwise_ops_compiles_and_runs(backend):
    run_chain(backend, 2000)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["interp", "c"])
def test_a_chain_of_10000_pointwise_ops_compiles_and_runs(backend):
    run_chain(backend, 10_000)


@pytest.mark.parametrize("backend", ["interp", "c"])
def test_the_gradient_of_a_deep_chain_compiles_and_runs(backend):
    """1000 ops scaling by 2 and by 1/2 (exact): the gradient of the sum is 1 everywhere. The
    training step touches more than 1024 buffers (every intermediate gradient kept)."""
    ctx = context(backend)
    w = oc.param("w", output=8, init=START)
    y = w
    for k in range(1000):
        y = (y * 2.0 if k % 2 == 0 else y * 0.5).retain_grad()
    update = train.grad_update(y.sum())
    step = ctx.compile(update)
    step.run()
    assert len(set(step.ir.reads + step.ir.writes)) > 1024
    np.testing.assert_array_equal(ctx.get(w.grad), np.ones(8, np.float32))


def chain_routine(n_ops: int) -> RoutineIR:
    ocannl.session.reset()
    y = chain(oc.tensor(START), n_ops)
    return lower_routine("chain", y.to_computation().body)


def test_inlining_nests_no_deeper_than_the_limit():
    routine = chain_routine(450)
    virtualized = opt.virtualize(routine, opt.materialized_nodes(routine))
    statements = opt.top_level(virtualized.body)
    assert max(nesting(s) for s in statements) <= opt.INLINE_NESTING_LIMIT
    # Most of the chain is inlined; every few dozen ops a node keeps its buffer.
    kept = len(virtualized.writes)
    assert 450 // opt.INLINE_NESTING_LIMIT <= kept <= 450 // 10
    optimized = opt.optimize(routine)
    assert len(optimized.writes) == kept
    assert format_routine(optimized).count("tanh(") == 150  # each op computed once


def test_a_node_whose_inlining_would_nest_too_deep_keeps_its_buffer():
    x, a, b = TNode("x", (4,)), TNode("a", (4,)), TNode("b", (4,))
    half = Const(0.5, dtypes.float32)

    def routine(depth: int) -> RoutineIR:
        i, j = Symbol(), Symbol()
        value = Load(x, (Iter(i),))
        for _ in range(depth):
            value = Binary(Binop.MUL, value, half)
        produce = loop(i, 4, Store(a, (Iter(i),), value))
        consume = loop(j, 4, Store(b, (Iter(j),), Binary(Binop.ADD, Load(a, (Iter(j),)), half)))
        return RoutineIR("r", seq(produce, consume))

    assert opt.virtualization_obstacle(routine(10), a, keep={x, b}) is None
    deep = routine(opt.INLINE_NESTING_LIMIT)
    assert "INLINE_NESTING_LIMIT" in opt.virtualization_obstacle(deep, a, keep={x, b})
    assert opt.virtualize(deep, {x, b}) is deep


class Visits:
    """Counts calls of the optimizer's walkers: statements traced by virtualization, statements
    and expressions visited by the tracer and the rewriters."""

    WALKERS = [
        (opt._Virtualization, "_trace"),
        (opt._Tracer, "stmt"),
        (opt._Tracer, "expr"),
        (Rewriter, "rebuild_stmt"),
        (Rewriter, "rebuild_expr"),
    ]

    def __init__(self, monkeypatch):
        self.counts: Counter[str] = Counter()
        for cls, name in self.WALKERS:
            monkeypatch.setattr(cls, name, self._counted(f"{cls.__name__}.{name}", getattr(cls, name)))

    def _counted(self, key, fn):
        def counted(*args, **kwargs):
            self.counts[key] += 1
            return fn(*args, **kwargs)

        return counted

    def measure(self, routine: RoutineIR) -> Counter[str]:
        self.counts.clear()
        opt.optimize(routine)
        return Counter(self.counts)


def assert_linear(small: Counter[str], large: Counter[str], factor: int) -> None:
    """Each walker does at most ``factor`` (and a little slack) times the work on a routine
    ``factor`` times larger: a pass re-tracing the routine per node would do ``factor**2``."""
    for key, count in large.items():
        assert count <= 1.25 * factor * max(small[key], 1), (key, small[key], count)


def test_the_passes_visit_a_chain_a_bounded_number_of_times_per_op(monkeypatch):
    small, large = chain_routine(150), chain_routine(600)
    visits = Visits(monkeypatch)
    counts_small, counts_large = visits.measure(small), visits.measure(large)
    assert counts_small["_Virtualization._trace"] <= 3 * len(opt.top_level(small.body))
    assert_linear(counts_small, counts_large, 4)


def mlp_training_routine(n_layers: int) -> RoutineIR:
    ocannl.session.reset()
    x = oc.tensor(np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(8, 2), batch=1)
    h = x
    for i in range(n_layers):
        h = oc.tanh(oc.param(f"w{i}", output=16) @ h + oc.param(f"b{i}", output=16, init=0.0))
    loss = (oc.param("w_out", output=1) @ h).mean()
    update = train.grad_update(loss)
    sgd = train.sgd_update(update, lr=0.01)
    return lower_routine("step", Block((update.to_computation().body, sgd.to_computation().body)))


def test_the_passes_visit_an_mlp_training_step_a_bounded_number_of_times_per_layer(monkeypatch):
    small, large = mlp_training_routine(8), mlp_training_routine(32)
    visits = Visits(monkeypatch)
    assert_linear(visits.measure(small), visits.measure(large), 4)


def test_c_calls_a_routine_with_more_buffers_than_a_ctypes_call_takes():
    """One ctypes call passes at most 1024 arguments; the C backend packs them in two arrays."""
    ctx = context("c")
    xs = [TNode(f"x{k}", (1,), dtypes.float32) for k in range(1100)]
    total = TNode("total", (1,), dtypes.float32)
    terms = [Load(x, (Fixed(0),)) for x in xs]
    while len(terms) > 1:  # a balanced sum: shallow, one statement
        terms = [Binary(Binop.ADD, *terms[k:k + 2]) if k + 1 < len(terms) else terms[k] for k in range(0, len(terms), 2)]
    executable = ctx.backend.compile(RoutineIR("many_buffers", Store(total, (Fixed(0),), terms[0])))
    assert len(executable.source.nodes) == len(xs) + 1 > 1024
    buffers = {x: np.full(1, k, np.float32) for k, x in enumerate(xs)} | {total: np.zeros(1, np.float32)}
    executable.run(buffers, {})
    assert buffers[total][0] == sum(range(len(xs)))  # exact: integers below 2**24
