"""The profiler (ocannl/backends/profile.py): a routine's nests timed on c, their FLOPs and bytes
counted from the loop IR (ocannl/lowlevel/cost.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ocannl as oc
from ocannl import train
from ocannl.backends.profile import Counters, profile_of
from ocannl.errors import OcannlError
from ocannl.lowlevel.cost import timed_statements, work
from ocannl.lowlevel.indexing import Fixed, Iter, Symbol
from ocannl.lowlevel.ir import Binary, Const, Fill, Load, RoutineIR, Store, loop, seq
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.tnode import TNode
from tests.backend_params import default_context

M, K, N = 6, 5, 4


def matmul_nest(c: TNode, a: TNode, b: TNode) -> object:
    """``c[i, j] += a[i, k] * b[k, j]`` over loops i, j, k."""
    i, j, k = Symbol(), Symbol(), Symbol()
    value = Binary(Binop.ADD, Load(c, (Iter(i), Iter(j))),
                   Binary(Binop.MUL, Load(a, (Iter(i), Iter(k))), Load(b, (Iter(k), Iter(j)))))
    return loop(i, M, loop(j, N, loop(k, K, Store(c, (Iter(i), Iter(j)), value))))


def nodes() -> tuple[TNode, TNode, TNode]:
    return TNode("c", (M, N)), TNode("a", (M, K)), TNode("b", (K, N))


def test_a_matmul_nest_does_2mnk_flops_and_touches_each_cell_once():
    c, a, b = nodes()
    w = work(matmul_nest(c, a, b))
    assert w.flops == 2 * M * N * K
    # a and b read once each, c read and written: the traffic of an ideal cache
    assert w.bytes == 4 * (M * K + K * N + 2 * M * N)


def test_an_operation_repeated_by_a_loop_it_does_not_read_counts_once_a_value():
    """``c[i, j] += (0.0 + a[i, k]) * b[k, j]`` (an inlined gradient copy as a factor): the copy
    takes M K values, which a compiled backend computes once each (a packed GEMM, as it packs),
    so it counts M K FLOPs, the multiply and the add 2 M N K."""
    c, a, b = nodes()
    i, j, k = Symbol(), Symbol(), Symbol()
    copy = Binary(Binop.ADD, Const(0.0), Load(a, (Iter(i), Iter(k))))
    value = Binary(Binop.ADD, Load(c, (Iter(i), Iter(j))), Binary(Binop.MUL, copy, Load(b, (Iter(k), Iter(j)))))
    assert work(loop(i, M, loop(j, N, loop(k, K, Store(c, (Iter(i), Iter(j)), value))))).flops == M * K + 2 * M * N * K


def test_a_fixed_index_reaches_one_cell_and_a_fill_the_whole_node():
    c, a, _ = nodes()
    i = Symbol()
    row = loop(i, K, Store(c, (Fixed(0), Fixed(1)), Binary(Binop.MUL, Load(a, (Fixed(2), Iter(i))), Const(2.0))))
    w = work(row)
    assert w.flops == K
    assert w.bytes == 4 * (K + 1)
    assert work(Fill(c, Const(0.0))) == type(w)(0, 4 * M * N)


def test_timed_statements_are_the_top_level_nests_in_order():
    c, a, b = nodes()
    body = seq(Fill(c, Const(0.0)), matmul_nest(c, a, b))
    assert timed_statements(body) == [body.stmts[0], body.stmts[1]]
    p = profile_of(RoutineIR("mm", body), "c", Counters(runs=2, seconds=1.0, nest_seconds=(0.25, 0.5)))
    assert [n.flops for n in p.nests] == [0, 2 * M * N * K]
    assert p.nests[1].description == "c <- a, b [6x4x5]"
    table = str(p)
    assert "2 run(s)" in table and "c <- a, b [6x4x5]" in table
    # slowest first, each with its share of the routine's time
    assert table.splitlines()[2].split()[:4] == ["1", "250.000", "ms", "50.0%"]


def mlp_step():
    x = oc.tensor(np.linspace(-1, 1, 32 * 24, dtype=np.float32).reshape(32, 24), batch=1)
    w1, w2 = oc.param("w1", output=40), oc.param("w2", output=3)
    loss = (w2 @ oc.relu(w1 @ x)).relu().mean()
    update = train.grad_update(loss)
    return update, train.sgd_update(update, lr=0.1), (w1, w2)


def test_profile_on_c_times_every_nest_and_computes_what_run_computes():
    ctx = default_context("c")
    update, sgd, params = mlp_step()
    step = ctx.compile(update, sgd)
    plain = oc.Context("c")
    reference = plain.compile(update, sgd)
    for _ in range(3):
        reference.run()
    p = step.profile(3)
    assert p.runs == 3 and p.backend == "c"
    assert len(p.nests) == len(timed_statements(step.ir.body)) > 5
    assert all(n.seconds >= 0 for n in p.nests) and sum(n.seconds for n in p.nests) <= p.seconds
    # the forward product w1 @ x: 40 x 24 multiply-adds per example of 32
    assert max(n.flops for n in p.nests) >= 2 * 32 * 40 * 24
    for w in params:  # the profiled runs took effect, bit for bit those of plain runs
        np.testing.assert_array_equal(ctx.get(w.value), plain.get(w.value))
    step.run()  # the plain build again
    assert step.profile(1).runs == 1


def test_profile_refuses_a_backend_without_timers_and_bad_counts():
    ctx = default_context("interp")
    update, sgd, _ = mlp_step()
    step = ctx.compile(update, sgd)
    with pytest.raises(OcannlError, match="interp backend cannot time the loop nests"):
        step.profile(2)
    with pytest.raises(OcannlError, match="number of runs >= 1"):
        step.profile(0)


def test_ocannl_profile_prints_each_routine_at_exit(tmp_path):
    default_context("c")  # skips without a C compiler
    script = textwrap.dedent("""
        import numpy as np, ocannl as oc
        ctx = oc.Context("c")
        x = oc.tensor(np.ones((4, 3), np.float32), batch=1)
        w = oc.param("w", output=2)
        r = ctx.compile(w @ x)
        for _ in range(7):
            r.run()
    """)
    env = {**os.environ, "OCANNL_PROFILE": "1", "OCANNL_BACKEND": "c"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "7 run(s)" in out.stderr and "GFLOP/s" in out.stderr and "compose <- w, tensor" in out.stderr
