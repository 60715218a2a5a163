"""Reductions recognized once (ocannl/lowlevel/schedule.py): the three nest shapes, their loops
and start, what is refused, and the emitters that consume the record."""

import numpy as np

from ocannl.lowlevel import cpu_schedule
from ocannl.backends.c import CBackend
from ocannl.backends.interp import InterpBackend
from ocannl.backends.metal import MetalBackend
from ocannl.backends.metal import emit as metal_emit
from ocannl.lowlevel import dtypes, summation
from ocannl.lowlevel.indexing import Fixed, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Const, For, GetLocal, Load, Local, LocalScope, RoutineIR, SetLocal, Store, Ternary, Unary, loop, seq,
)
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.schedule import (
    Contraction, Reduction, blocked_reduction_of, contraction_of, product_factors, reduction_of, update_of,
)
from ocannl.lowlevel.tnode import TNode

M, N, K = 16, 16, 32


def matmul_nodes():
    return TNode("a", (M, K)), TNode("b", (K, N)), TNode("c", (M, N))


def product(a, b, i, j, k):
    return Binary(Binop.MUL, Load(a, (Iter(i), Iter(k))), Load(b, (Iter(k), Iter(j))))


def accumulate(c, i, j, term, op=Binop.ADD):
    cell = (Iter(i), Iter(j))
    return Store(c, cell, Binary(op, Load(c, cell), term))


def test_update_of_both_targets_and_commuted_operands():
    i = Symbol()
    x = TNode("x", (4,))
    v = Local(dtypes.float32)
    term = Load(x, (Iter(i),))
    cell = TNode("s", (1,))
    store = Store(cell, (Fixed(0),), Binary(Binop.ADD, Load(cell, (Fixed(0),)), term))
    assert update_of(store).term == term and update_of(store).op is Binop.ADD
    set_local = SetLocal(v, Binary(Binop.MAX, GetLocal(v), term))
    assert update_of(set_local).statement is set_local
    commuted = SetLocal(v, Binary(Binop.ADD, term, GetLocal(v)))
    assert update_of(commuted) is None
    assert update_of(commuted, frozenset({Binop.ADD})).term == term
    assert update_of(SetLocal(v, term)) is None


def test_first_shape_any_loop_order():
    a, b, c = matmul_nodes()
    i, j, k = Symbol(), Symbol(), Symbol()
    nest = loop(k, K, loop(i, M, loop(j, N, accumulate(c, i, j, product(a, b, i, j, k)))))
    r = reduction_of(nest)
    assert isinstance(r, Reduction) and r.separable
    assert [f.symbol for f in r.parallel] == [i, j]
    assert r.loop_extents == ((k, K),) and r.volume == K
    assert r.reset is None and r.scope is None and r.op is Binop.ADD
    assert r.dtype is c.dtype


def test_second_shape_reset_inside_the_parallel_loops():
    a, b, c = matmul_nodes()
    i, j, k = Symbol(), Symbol(), Symbol()
    cell = (Iter(i), Iter(j))
    reset = Store(c, cell, Const(0.0, dtypes.float32))
    nest = loop(i, M, loop(j, N, seq(reset, loop(k, K, accumulate(c, i, j, product(a, b, i, j, k))))))
    r = reduction_of(nest)
    assert r.reset is reset and r.reset_depth == 2 and r.separable
    assert r.loop_extents == ((k, K),)
    assert cpu_schedule.plan_contraction(nest) is not None


def test_a_reset_inside_a_reduction_loop_is_not_separable():
    """``for k0: c := 0; for k1: c += ..`` resets the cell at every ``k0``: no scheduler may
    read it as one sum over ``k0`` and ``k1`` from zero."""
    a, b, c = matmul_nodes()
    i, j, k0, k1 = Symbol(), Symbol(), Symbol(), Symbol()
    cell = (Iter(i), Iter(j))
    term = Binary(Binop.MUL, Load(a, (Iter(i), Iter(k1))), Load(b, (Iter(k0), Iter(j))))
    inner = seq(Store(c, cell, Const(0.0, dtypes.float32)), loop(k1, K, accumulate(c, i, j, term)))
    nest = loop(i, M, loop(j, N, For(k0, K, inner, loop(k0, K, inner).kind)))
    r = reduction_of(nest)
    assert r is not None and r.reset_depth == 3 and not r.separable
    assert cpu_schedule.plan_contraction(nest) is None
    assert metal_emit.tree_reduction(For(k0, K, inner, loop(k0, K, inner).kind)) is None
    assert summation.find_accumulation(nest) is None


def test_third_shape_inlined_into_its_consumer():
    a, b, c = matmul_nodes()
    i, j, k = Symbol(), Symbol(), Symbol()
    v = Local(dtypes.float32)
    step = SetLocal(v, Binary(Binop.ADD, GetLocal(v), product(a, b, i, j, k)))
    body = seq(SetLocal(v, Const(0.0, dtypes.float32)), loop(k, K, step))
    store = Store(c, (Iter(i), Iter(j)), Unary(Unop.RELU, LocalScope(v, body)))
    nest = loop(i, M, loop(j, N, store))
    r = reduction_of(nest)
    assert r.scope is not None and r.scope.local is v and r.init == Const(0.0, dtypes.float32)
    assert [f.symbol for f in r.parallel] == [i, j] and r.loop_extents == ((k, K),) and r.separable
    plan = cpu_schedule.plan_contraction(nest)
    assert plan is not None and plan.scope is r.scope
    tree = metal_emit.tree_reduction(store)
    assert tree is not None and tree.loops == ((k, K),) and tree.init == r.init


def test_shapes_that_are_no_reduction():
    a, b, c = matmul_nodes()
    i, j = Symbol(), Symbol()
    cell = (Iter(i), Iter(j))
    assert reduction_of(loop(i, M, loop(j, N, Store(c, cell, Load(a, (Iter(i), Fixed(0))))))) is None
    other_cell = Store(c, (Iter(i), Fixed(0)), Load(c, cell))
    reset_then_other_cell = seq(Store(c, cell, Const(0.0, dtypes.float32)), loop(j, N, other_cell))
    assert reduction_of(loop(i, M, reset_then_other_cell)) is None
    assert reduction_of(Store(c, cell, Load(c, cell), skip_oob=True)) is None


def test_blocked_sum_is_read_back_as_one_reduction():
    """The summation order's blocks of a long contraction: one record whose volume counts every
    term once, and which the C tiler plans."""
    a, b, c = TNode("a", (M, 300)), TNode("b", (300, N)), TNode("c", (M, N))
    i, j, k = Symbol(), Symbol(), Symbol()
    cell = (Iter(i), Iter(j))
    term = Binary(Binop.MUL, Load(a, (Iter(i), Iter(k))), Load(b, (Iter(k), Iter(j))))
    reset = Store(c, cell, Const(0.0, dtypes.float32))
    nest = loop(i, M, loop(j, N, seq(reset, loop(k, 300, accumulate(c, i, j, term)))))
    blocked = summation.block_sums(RoutineIR("r", nest)).body
    assert reduction_of(blocked) is None  # no longer one loop of terms
    r = blocked_reduction_of(blocked)
    assert r is not None and r.blocks is not None and r.volume == 300
    assert [f.symbol for f in r.around] == [i, j] and r.reset is not None and r.op is Binop.ADD
    plan = cpu_schedule.plan_contraction(blocked)
    assert plan is not None and plan.blocks == r.blocks and plan.work == M * N * 300


def _reset_in_a_reduction_loop(k0: int, k1: int):
    """``c[i, j] := 0`` inside ``for k0`` and before ``for k1``: only the last ``k0`` counts."""
    a, b, c = TNode("a", (M, k1)), TNode("b", (k0, N)), TNode("c", (M, N))
    i, j, s0, s1 = Symbol(), Symbol(), Symbol(), Symbol()
    cell = (Iter(i), Iter(j))
    term = Binary(Binop.MUL, Load(a, (Iter(i), Iter(s1))), Load(b, (Iter(s0), Iter(j))))
    inner = seq(Store(c, cell, Const(0.0, dtypes.float32)), loop(s1, k1, accumulate(c, i, j, term)))
    return RoutineIR("reset_inside", loop(i, M, loop(j, N, loop(s0, k0, inner)))), (a, b, c)


def _backends():
    """Every backend that runs hand-built loop IR here (Triton reads no Reduction record)."""
    found = [InterpBackend("scalar"), InterpBackend("vectorized"), CBackend()]
    return found + ([MetalBackend()] if MetalBackend().available()[0] else [])


def test_a_reset_inside_a_reduction_loop_runs_as_written_on_every_backend():
    """Large enough for C's register tiles and past the summation blocks: every backend keeps
    the restart of the sum, so the cells hold the last ``k0``'s sum alone."""
    k0, k1 = 3, 100
    routine, (a, b, c) = _reset_in_a_reduction_loop(k0, k1)
    rng = np.random.default_rng(3)
    values = {a: rng.standard_normal((M, k1)).astype(np.float32), b: rng.standard_normal((k0, N)).astype(np.float32)}
    # c[i, j] = sum over k1 of a[i, k1] * b[k0 - 1, j]
    expected = values[a].astype(np.float64).sum(axis=1)[:, None] * values[b][k0 - 1].astype(np.float64)[None, :]
    results = []
    for backend in _backends():
        routine_here = summation.block_sums(routine)
        buffers = {n: np.array(values.get(n, np.zeros(n.dims)), dtype=n.dtype.storage)
                   for n in routine_here.reads + routine_here.writes}
        backend.compile(routine_here).run(buffers, {})
        results.append(buffers[c])
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-4)
    for got in results[1:]:
        assert np.array_equal(got.view(np.uint32), results[0].view(np.uint32))


def test_regrouping_says_how_each_accumulator_combines_its_terms():
    """A subtraction is a sum of negated terms, a division a division by the terms' product;
    integers regroup exactly (they wrap), floats up to rounding; integer division not at all."""
    from ocannl.lowlevel.schedule import Regrouping, regrouping

    for dtype in (dtypes.float32, dtypes.int32, dtypes.uint32):
        exact = not dtype.is_float
        assert regrouping(Binop.ADD, dtype) == regrouping(Binop.SUB, dtype) == Regrouping(Binop.ADD, exact)
        assert regrouping(Binop.MUL, dtype) == Regrouping(Binop.MUL, exact)
        assert regrouping(Binop.MAX, dtype) == Regrouping(Binop.MAX, True)
        assert regrouping(Binop.MIN, dtype) == Regrouping(Binop.MIN, True)
    assert regrouping(Binop.DIV, dtypes.float32) == Regrouping(Binop.MUL, False)
    assert regrouping(Binop.DIV, dtypes.int32) is None
    assert regrouping(Binop.POW, dtypes.float32) is None


# ---------------------------------------------------------------------------------------------
# Nest plans: the C-family printer's decisions as records, read here without printing C


def _matmul(m: int, n: int, k: int):
    """``c[i, j] := 0; for k: c[i, j] += a[i, k] * b[k, j]`` over ``m x n`` cells, in loop order."""
    a, b, c = TNode("a", (m, k)), TNode("b", (k, n)), TNode("c", (m, n))
    i, j, s = Symbol(), Symbol(), Symbol()
    reset = Store(c, (Iter(i), Iter(j)), Const(0.0, dtypes.float32))
    return loop(i, m, loop(j, n, seq(reset, loop(s, k, accumulate(c, i, j, product(a, b, i, j, s))))))


def test_nest_plan_of_a_small_matmul_holds_its_tiles_and_vector_lanes():
    plan = cpu_schedule.plan_nest(_matmul(M, N, K), vector_bytes=32, threads=True)
    assert plan.contraction is not None and plan.contraction.gemm is None, "too small to pack"
    assert not plan.parallel and plan.branchless, "16-column tiles: selects without branches"
    (group,) = plan.tile_nests
    (tiles,) = group
    assert tiles.rows == cpu_schedule.TileSpan(looped=True, start=0, stop=M, size=4)
    assert tiles.cols == cpu_schedule.TileSpan(looped=False, start=0, stop=N, size=16)
    assert tiles.lanes == 8 and not tiles.parallel, "two AVX2 vectors a row; 8192 multiply-adds"
    scalar = cpu_schedule.plan_nest(_matmul(M, N, K), vector_bytes=None, threads=True)
    assert scalar.tile_nests[0][0].lanes is None, "a target without vectors the walk writes"


def test_nest_plan_splits_ragged_tiles_and_keeps_narrow_ones_branching():
    plan = cpu_schedule.plan_nest(_matmul(10, 2, 256), vector_bytes=None, threads=True)
    assert not plan.branchless, "2-column tiles are serial chains: branches serve them better"
    spans = [(t.rows, t.cols) for t in plan.tile_nests[0]]
    assert spans == [(cpu_schedule.TileSpan(True, 0, 8, 4), cpu_schedule.TileSpan(False, 0, 2, 2)),
                     (cpu_schedule.TileSpan(False, 8, 10, 2), cpu_schedule.TileSpan(False, 0, 2, 2))]


def test_nest_plan_runs_big_nests_on_threads_only_where_a_region_may_open():
    big = _matmul(256, 256, 32)  # 2^21 multiply-adds: TILE_PARALLEL_MIN_WORK and GEMM_PARALLEL_MIN_WORK
    assert all(t.parallel for t in cpu_schedule.plan_nest(big, None, threads=True).tile_nests[0])
    assert not any(t.parallel for t in cpu_schedule.plan_nest(big, None, threads=False).tile_nests[0])
    packed = cpu_schedule.plan_nest(big, 32, threads=True).contraction.gemm
    assert packed is not None and packed.parallel and (packed.mr, packed.nr, packed.lanes) == (6, 16, 8)
    assert not cpu_schedule.plan_nest(big, 32, threads=False).contraction.gemm.parallel


def test_nest_plan_of_plain_loops_decides_threads_and_store_order():
    n = cpu_schedule.PARALLEL_MIN_WORK
    x, y = TNode("x", (n,)), TNode("y", (n,))
    i = Symbol()
    scale = loop(i, n, Store(y, (Iter(i),), Binary(Binop.MUL, Load(x, (Iter(i),)), Const(2.0, dtypes.float32))))
    plan = cpu_schedule.plan_nest(scale, 32, threads=True)
    assert plan.contraction is None and plan.nest is scale and plan.parallel and plan.branchless
    assert not cpu_schedule.plan_nest(scale, 32, threads=False).parallel
    small = loop(i, 64, Store(y, (Iter(i),), Load(x, (Iter(i),))))
    assert not cpu_schedule.plan_nest(small, 32, threads=True).parallel, "below PARALLEL_MIN_WORK"
    a, b = TNode("a", (8, 4)), TNode("b", (8, 4))
    r, q = Symbol(), Symbol()
    transposed = loop(q, 4, loop(r, 8, Store(b, (Iter(r), Iter(q)), Load(a, (Iter(r), Iter(q))))))
    reordered = cpu_schedule.plan_nest(transposed, 32, threads=True)
    assert reordered.nest.symbol is r and reordered.nest.body.symbol is q and reordered.branchless


# ---------------------------------------------------------------------------------------------
# Contractions: one record for the CPU's packed GEMMs and Triton's tl.dot kernels


def test_product_factors_read_a_sum_in_either_order_and_an_fma():
    a, b, c = matmul_nodes()
    i, j, k = Symbol(), Symbol(), Symbol()
    x, y = product(a, b, i, j, k).a, product(a, b, i, j, k).b
    cell = (Iter(i), Iter(j))
    old = Load(c, cell)
    assert product_factors(accumulate(c, i, j, product(a, b, i, j, k))) == (x, y)
    assert product_factors(Store(c, cell, Binary(Binop.ADD, product(a, b, i, j, k), old))) == (x, y)
    assert product_factors(Store(c, cell, Ternary(Ternop.FMA, x, y, old))) == (x, y)
    v = Local(dtypes.float32)
    assert product_factors(SetLocal(v, Binary(Binop.ADD, GetLocal(v), product(a, b, i, j, k)))) == (x, y)
    assert product_factors(accumulate(c, i, j, Binary(Binop.ADD, x, y))) is None, "a sum of sums"
    assert product_factors(accumulate(c, i, j, product(a, b, i, j, k), op=Binop.MAX)) is None


def test_contraction_of_splits_the_parallel_loops_by_the_factor_reading_them():
    p, i, j, k = Symbol(), Symbol(), Symbol(), Symbol()
    a, b = TNode("a", (2, M, K)), TNode("b", (2, K, N))
    x, y = Load(a, (Iter(p), Iter(i), Iter(k))), Load(b, (Iter(p), Iter(k), Iter(j)))
    c = contraction_of(x, y, (p, i, j), ((k, K),))
    assert c == Contraction(x, y, rows=(i,), cols=(j,), batch=(p,), k=((k, K),))
    assert c.update is None and c.site is None, "no statement given: read from terms"
    assert c.swapped() == Contraction(y, x, rows=(j,), cols=(i,), batch=(p,), k=((k, K),))
    vector = Load(TNode("v", (K,)), (Iter(k),))
    assert contraction_of(x, vector, (p, i), ((k, K),)) is None, "a matrix times a vector has no columns"


def test_the_cpu_and_triton_planners_read_the_same_contraction():
    from ocannl.backends.partition import find_contraction

    nest = _matmul(256, 256, 32)
    i, j = nest.symbol, nest.body.symbol
    gpu = find_contraction(nest, (i, j))
    cpu = cpu_schedule.plan_nest(nest, 32, threads=True).contraction.gemm
    assert (gpu.rows, gpu.cols, gpu.batch, gpu.k) == ((i,), (j,), (), cpu.k)
    assert (gpu.a, gpu.b) == (cpu.a, cpu.b) and cpu.rows == ((i, 256),) and cpu.cols == ((j, 256),)
    assert isinstance(gpu.update, Store) and gpu.site is nest.body.body.stmts[1], "the loop over k"
