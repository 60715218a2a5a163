"""Writes folded into the next write (ocannl/lowlevel/overwrite.py): each rewrite and each refusal
on hand-built loop IR, checked against the interpreter running the routine before the pass, bit
for bit; then the training steps, whose gradients no longer start from a zero fill, on every
backend."""

from functools import partial

import numpy as np
import pytest

import helpers
from helpers import run_ir, same_bits
import ocannl as oc
from backend_params import backend_param
from ocannl import nn, session, train
from ocannl.lowlevel import dtypes
from ocannl.lowlevel import optimize as opt
from ocannl.lowlevel.indexing import Affine, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Const, Fill, GetLocal, Load, LoadDynamic, Local, LocalScope, LoopKind, RoutineIR, SetLocal,
    Store, StoreDynamic, Ternary, Unary, iter_exprs, iter_stmts, loop, seq,
)
from ocannl.lowlevel.analysis import loop_chain
from ocannl.lowlevel.schedule import reduction_of
from ocannl.lowlevel.summation import block_sums
from ocannl.lowlevel.overwrite import first_write, fold_fills, forward_stores
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode, mark_virtual
from test_gather import _cnn_step

RNG = np.random.default_rng(17)
# values with negative zeros among them, so that a lost sign of zero shows
data = partial(helpers.data, rng=RNG, negative_zeros=True)


def assert_same_results(before: RoutineIR, after: RoutineIR, values: dict) -> None:
    want, got = run_ir(before, values), run_ir(after, values)
    for node, array in got.items():
        assert same_bits(array, want[node]), f"{node.debug_name}: {array} != {want[node]}"


def fills(routine: RoutineIR) -> list[Fill]:
    return [s for s in iter_stmts(routine.body) if isinstance(s, Fill)]


def stores_of(routine: RoutineIR, node: TNode) -> list[Store]:
    return [s for s in iter_stmts(routine.body) if isinstance(s, Store) and s.tnode is node]


def at(*symbols: Symbol) -> tuple[Iter, ...]:
    return tuple(Iter(s) for s in symbols)


def accumulate(node: TNode, cell: tuple, term, op: Binop = Binop.ADD) -> Store:
    return Store(node, cell, Binary(op, Load(node, cell), term))


# ---------------------------------------------------------------------------------------------
# 1. The first contribution overwrites


@pytest.mark.parametrize("op, start", [(Binop.ADD, 0.0), (Binop.SUB, 0.0), (Binop.MAX, float("-inf")),
                                       (Binop.MUL, 1.0)])
def test_a_pointwise_first_contribution_takes_the_fill_constant_in(op, start):
    """``fill g := c; g[i, j] := g[i, j] op e`` is ``g[i, j] := c op e``: the fill goes, the
    constant stays in the expression (``0.0 + -0.0`` is ``+0.0``, not ``-0.0``)."""
    x, g = TNode("x", (3, 4)), TNode("g", (3, 4))
    i, j = Symbol(), Symbol()
    nest = loop(i, 3, loop(j, 4, accumulate(g, at(i, j), Load(x, at(i, j)), op)))
    routine = RoutineIR("pointwise", seq(Fill(g, Const(start)), nest))
    after = fold_fills(routine)
    assert fills(after) == []
    (store,) = stores_of(after, g)
    assert store.value == Binary(op, Const(start), Load(x, at(i, j)))
    assert_same_results(routine, after, {x: data(3, 4)})
    assert_same_results(routine, opt.optimize(routine), {x: data(3, 4)})


def test_a_reduction_resets_each_cell_inside_the_loops_that_index_it():
    """The batch loop of a weight gradient runs outermost; the rewrite puts the loops indexing
    the gradient outside it and resets each cell there: the reduction-with-reset shape, each
    cell's terms in their order (so the same bits, here over 100 terms, blocked afterwards)."""
    dy, x, gw = TNode("dy", (100, 3)), TNode("x", (100, 4)), TNode("gw", (3, 4))
    b, i, j = Symbol(), Symbol(), Symbol()
    term = Binary(Binop.MUL, Load(dy, at(b, i)), Load(x, at(b, j)))
    nest = loop(b, 100, loop(i, 3, loop(j, 4, accumulate(gw, at(i, j), term))))
    routine = RoutineIR("weight grad", seq(Fill(gw, Const(0.0)), nest))
    after = fold_fills(routine)
    assert fills(after) == []
    outer = after.body
    assert [outer.symbol, outer.body.symbol] == [i, j]
    assert outer.kind is LoopKind.PARALLEL and outer.body.kind is LoopKind.PARALLEL
    reset, reduction = outer.body.body.stmts
    assert reset == Store(gw, at(i, j), Const(0.0))
    assert reduction.symbol == b and reduction.kind is LoopKind.REDUCTION
    values = {dy: data(100, 3), x: data(100, 4)}
    assert_same_results(routine, after, values)
    assert_same_results(block_sums(routine), block_sums(opt.optimize(routine)), values)


def test_a_plain_overwrite_drops_the_fill_and_keeps_the_nest():
    x, g = TNode("x", (3,)), TNode("g", (3,))
    i = Symbol()
    nest = loop(i, 3, Store(g, at(i), Unary(Unop.NEG, Load(x, at(i)))))
    routine = RoutineIR("overwrite", seq(Fill(g, Const(0.0)), nest))
    after = fold_fills(routine)
    assert after.body is nest


def test_statements_between_that_do_not_touch_the_node_are_passed_over():
    """The zero fills of a training step all come first; each moves into its node's first
    contribution, however far."""
    x, g, h = TNode("x", (3,)), TNode("g", (3,)), TNode("h", (3,))
    i, j = Symbol(), Symbol()
    body = seq(Fill(g, Const(0.0)), Fill(h, Const(0.0)),
               loop(i, 3, accumulate(h, at(i), Load(x, at(i)))),
               loop(j, 3, accumulate(g, at(j), Load(h, at(j)))))
    routine = RoutineIR("two grads", body)
    after = fold_fills(routine)
    assert fills(after) == []
    assert_same_results(routine, after, {x: data(3)})


def test_size_one_axes_indexed_by_zero_are_covered():
    x, g = TNode("x", (4, 5)), TNode("g", (4, 1))
    i, k = Symbol(), Symbol()
    nest = loop(i, 4, loop(k, 5, accumulate(g, (Iter(i), Fixed(0)), Load(x, at(i, k)), Binop.SUB)))
    routine = RoutineIR("row sums", seq(Fill(g, Const(0.0)), nest))
    after = fold_fills(routine)
    assert fills(after) == []
    assert_same_results(routine, after, {x: data(4, 5)})


def _pool_gradient(dims: tuple[int, int], stride: int, window: int, windows: tuple[int, int]):
    """``fill g := 0`` and the gradient of a max-pool's window points, ``g[b, s*oh+wh, s*ow+ww]
    += dy[b, oh, ow] * mask[b, oh, ow, wh, ww]`` (``windows`` windows per axis), with its
    inputs."""
    (oh_n, ow_n), (h, w) = windows, dims
    dy, mask, g = TNode("dy", (2, oh_n, ow_n)), TNode("mask", (2, oh_n, ow_n, window, window)), TNode("g", (2, h, w))
    b, oh, ow, wh, ww = (Symbol() for _ in range(5))
    cell = (Iter(b), Affine(((stride, oh), (1, wh))), Affine(((stride, ow), (1, ww))))
    term = Binary(Binop.MUL, Load(dy, at(b, oh, ow)), Load(mask, at(b, oh, ow, wh, ww)))
    nest = loop(b, 2, loop(oh, oh_n, loop(ow, ow_n, loop(wh, window, loop(ww, window, accumulate(g, cell, term))))))
    values = {dy: data(2, oh_n, ow_n), mask: (RNG.random((2, oh_n, ow_n, window, window)) < 0.3).astype(np.float32)}
    return RoutineIR("pool grad", seq(Fill(g, Const(0.0)), nest)), g, values


def test_a_pool_gradient_whose_window_equals_its_stride_overwrites():
    """``2*oh + wh`` with ``wh`` over 2 and ``oh`` over half the axis reaches each cell once: the
    fill goes, each point stores ``0.0 + term``, the loops stay in their order. The same with
    three digits (``6*a + 2*o + w``) and the coefficients listed in any order."""
    routine, g, values = _pool_gradient((8, 6), stride=2, window=2, windows=(4, 3))
    after = fold_fills(routine)
    assert fills(after) == []
    (store,) = stores_of(after, g)
    assert isinstance(store.value, Binary) and store.value.a == Const(0.0)
    assert [f.symbol for f in loop_chain(after.body)[0]] == [f.symbol for f in loop_chain(routine.body.stmts[1])[0]]
    assert_same_results(routine, after, values)
    assert_same_results(routine, opt.optimize(routine), values)

    x, h = TNode("x", (12,)), TNode("h", (12,))
    a, o, w = Symbol(), Symbol(), Symbol()
    digits = (Affine(((2, o), (6, a), (1, w))),)
    nest = loop(a, 2, loop(o, 3, loop(w, 2, accumulate(h, digits, Load(x, digits)))))
    three = RoutineIR("digits", seq(Fill(h, Const(-0.0)), nest))
    assert fills(fold_fills(three)) == []
    assert_same_results(three, fold_fills(three), {x: data(12)})


def test_a_pool_gradient_followed_by_an_update_of_its_cells_keeps_its_bits():
    """The folded strided nest and a pointwise update of the same node after it (a relu's
    gradient gate): the update is not fused into the strided nest, whose loops do not map one to
    one onto its own, and the whole optimizer keeps the bits."""
    routine, g, values = _pool_gradient((4, 4), stride=2, window=2, windows=(2, 2))
    i, j, k = Symbol(), Symbol(), Symbol()
    gate = loop(i, 2, loop(j, 4, loop(k, 4, Store(g, at(i, j, k), Binary(Binop.MUL, Load(g, at(i, j, k)),
                                                                         Const(0.5))))))
    routine = RoutineIR("pool grad then gate", seq(*routine.body.stmts, gate))
    after = forward_stores(fold_fills(routine))
    assert fills(after) == [] and len(stores_of(after, g)) == 2
    assert_same_results(routine, after, values)
    assert_same_results(routine, opt.optimize(routine), values)


@pytest.mark.parametrize("dims, stride, window, windows", [
    ((7, 7), 2, 3, (3, 3)),  # overlapping windows: cells 2 and 4 of each axis are written twice
    ((5, 7), 2, 2, (2, 3)),  # a ragged end: the last row and column are never written
    ((8, 6), 2, 2, (3, 3)),  # too few windows along the first axis
], ids=["overlapping", "ragged", "short"])
def test_a_pool_gradient_that_does_not_write_each_cell_once_keeps_the_fill(dims, stride, window, windows):
    routine, g, values = _pool_gradient(dims, stride, window, windows)
    _refused(routine, values)


def test_strided_indices_that_do_not_enumerate_the_axis_keep_the_fill():
    """An offset (``2*o + w + 1``), a gap (``3*o + w``, ``w`` over 2), a repeated loop
    (``2*o + o``), an index symbol among the digits: each leaves cells unwritten or writes one
    twice."""
    x, g, four = TNode("x", (6,)), TNode("g", (6,)), TNode("four", (4,))
    o, w = Symbol(), Symbol()
    n = IndexSymbol("n", 3)
    cells = [
        loop(o, 2, loop(w, 2, accumulate(g, (Affine(((2, o), (1, w)), 1),), Load(x, at(o))))),
        loop(o, 2, loop(w, 2, accumulate(g, (Affine(((3, o), (1, w))),), Load(x, at(o))))),
        loop(o, 2, accumulate(four, (Affine(((2, o), (1, o))),), Load(x, at(o)))),  # cells 0 and 3
        loop(w, 2, accumulate(g, (Affine(((2, n), (1, w))),), Load(x, at(w)))),
    ]
    for nest in cells:
        g = loop_chain(nest)[1].tnode
        assert first_write(nest, Fill(g, Const(0.0))) is None
        routine = RoutineIR("strided", seq(Fill(g, Const(0.0)), nest))
        if not routine.static_symbols:
            _refused(routine, {x: data(6)})


def _refused(routine: RoutineIR, values: dict) -> None:
    after = fold_fills(routine)
    assert len(fills(after)) == len(fills(routine)), "the fill must stay"
    assert_same_results(routine, after, values)


def test_partial_coverage_keeps_the_fill():
    """A slice (a loop shorter than the axis), a fixed index, a strided index, a static index
    symbol: some cells keep the fill's value."""
    x, g = TNode("x", (4,)), TNode("g", (4,))
    i = Symbol()
    n = IndexSymbol("n", 4)
    slices = [
        loop(i, 3, accumulate(g, at(i), Load(x, at(i)))),
        accumulate(g, (Fixed(1),), Load(x, (Fixed(1),))),
        loop(i, 2, accumulate(g, (Affine(((2, i),), 0),), Load(x, at(i)))),
        accumulate(g, (Iter(n),), Load(x, (Iter(n),))),
    ]
    for nest in slices:
        routine = RoutineIR("slice", seq(Fill(g, Const(0.0)), nest))
        assert first_write(nest, Fill(g, Const(0.0))) is None
        if not routine.static_symbols:
            _refused(routine, {x: data(4)})


def test_a_read_in_between_keeps_the_fill_and_reads_its_constant():
    """``fill g; y := g * 2; g += e``: the read between needs the zeros; it reads the constant
    directly now, and the fill stays for the accumulation."""
    x, g, y = TNode("x", (3,)), TNode("g", (3,)), TNode("y", (3,))
    i, j = Symbol(), Symbol()
    body = seq(Fill(g, Const(0.0)),
               loop(i, 3, Store(y, at(i), Binary(Binop.MUL, Load(g, at(i)), Const(2.0)))),
               loop(j, 3, accumulate(g, at(j), Load(x, at(j)))))
    routine = RoutineIR("read between", body)
    after = fold_fills(routine)
    assert fills(after) == [Fill(g, Const(0.0))]
    (y_store,) = stores_of(after, y)
    assert y_store.value == Binary(Binop.MUL, Const(0.0), Const(2.0))
    assert_same_results(routine, after, {x: data(3)})


def test_a_scatter_add_keeps_the_fill():
    """The gradient of ``oc.take`` adds rows at data-dependent positions: not every row."""
    table_grad, g_out, ids = TNode("table_grad", (5, 2)), TNode("g_out", (3, 2)), TNode("ids", (3,), dtypes.int32)
    i, j = Symbol(), Symbol()
    position = Load(ids, at(i))
    scatter = loop(i, 3, loop(j, 2, StoreDynamic(
        table_grad, 0, position, at(j),
        Binary(Binop.ADD, LoadDynamic(table_grad, 0, position, at(j)), Load(g_out, at(i, j))))))
    routine = RoutineIR("scatter add", seq(Fill(table_grad, Const(0.0)), scatter))
    _refused(routine, {g_out: data(3, 2), ids: np.array([4, 0, 4], np.int32)})


def test_a_nest_reading_other_cells_of_the_node_keeps_the_fill():
    x, g = TNode("x", (4,)), TNode("g", (4,))
    i = Symbol()
    neighbour = Load(g, (Affine(((1, i),), 1),), oob_value=0.0)
    nest = loop(i, 4, Store(g, at(i), Binary(Binop.ADD, Load(g, at(i)), Binary(Binop.ADD, Load(x, at(i)), neighbour))))
    _refused(RoutineIR("neighbour", seq(Fill(g, Const(0.0)), nest)), {x: data(4)})


def test_half_precision_nodes_keep_their_fill():
    """A float16 node rounds what it stores: a constant in the expression would skip that."""
    x, g = TNode("x", (3,)), TNode("g", (3,), dtypes.float16)
    i = Symbol()
    nest = loop(i, 3, Store(g, at(i), Cast(Binary(Binop.ADD, Cast(Load(g, at(i)), dtypes.float32),
                                                    Load(x, at(i))), dtypes.float32)))
    routine = RoutineIR("half", seq(Fill(g, Const(0.1, dtypes.float32)), nest))
    assert fold_fills(routine) is routine


# ---------------------------------------------------------------------------------------------
# 2. Fills overwritten by fills


def test_a_fill_overwritten_by_a_fill_goes_and_the_last_is_read_as_a_constant():
    """``fill loss.grad := 0; fill loss.grad := 1``, then reads of ``loss.grad``: one fill, and the
    reads see 1.0, which folds with the constant beside it."""
    lg, g = TNode("loss_grad", ()), TNode("g", (3,))
    i = Symbol()
    body = seq(Fill(lg, Const(0.0)), Fill(lg, Const(1.0)),
               loop(i, 3, Store(g, at(i), Binary(Binop.MUL, Load(lg, ()), Const(0.25)))))
    routine = RoutineIR("loss grad", body)
    after = fold_fills(routine)
    assert fills(after) == [Fill(lg, Const(1.0))]
    assert_same_results(routine, after, {})
    (store,) = stores_of(opt.optimize(routine), g)
    assert store.value == Const(0.25)


# ---------------------------------------------------------------------------------------------
# 3. Stores overwritten by the next statement


def test_a_mean_stores_each_cell_once():
    """A sum nest and its scaling nest become one nest storing ``v { sum } * 0.25`` per cell:
    the reduction inlined into its consumer, recognized as one reduction."""
    x, mean = TNode("x", (3, 100)), TNode("mean", (3,))
    i, k, j = Symbol(), Symbol(), Symbol()
    sum_k = loop(k, 100, accumulate(mean, at(i), Load(x, at(i, k))))
    reduction = loop(i, 3, seq(Store(mean, at(i), Const(0.0)), sum_k))
    scaling = loop(j, 3, Store(mean, at(j), Binary(Binop.MUL, Load(mean, at(j)), Const(0.01))))
    routine = RoutineIR("mean", seq(reduction, scaling))
    after = forward_stores(routine)
    (store,) = stores_of(after, mean)
    assert isinstance(store.value, Binary) and isinstance(store.value.a, LocalScope)
    found = reduction_of(after.body)
    assert found is not None and found.scope is not None and found.op is Binop.ADD
    values = {x: data(3, 100)}
    assert_same_results(routine, after, values)
    assert_same_results(block_sums(routine), block_sums(after), values)  # the same blocks of 64 terms


def test_consecutive_contributions_to_a_gradient_store_it_once():
    """``g := 0.0 + a * b``, then ``g := g + b * a`` (the two contributions of ``x * x``), then
    ``g := g + a``: one nest, one store per cell, the additions in their order."""
    a, b, g = TNode("a", (3, 4)), TNode("b", (3, 4)), TNode("g", (3, 4))
    terms = [lambda c: Binary(Binop.MUL, Load(a, c), Load(b, c)),
             lambda c: Binary(Binop.MUL, Load(b, c), Load(a, c)),
             lambda c: Load(a, c)]
    nests = []
    for k, term in enumerate(terms):
        i, j = Symbol(), Symbol()
        cell = at(i, j)
        start = Const(0.0) if k == 0 else Load(g, cell)
        nests.append(loop(i, 3, loop(j, 4, Store(g, cell, Binary(Binop.ADD, start, term(cell))))))
    routine = RoutineIR("contributions", seq(*nests))
    after = forward_stores(routine)
    (store,) = stores_of(after, g)
    assert not any(isinstance(e, Load) and e.tnode is g for e in iter_exprs(store.value))
    assert_same_results(routine, after, {a: data(3, 4), b: data(3, 4)})


def test_a_dead_store_goes_and_a_read_store_is_forwarded():
    x, n = TNode("x", (3,)), TNode("n", (3,))
    i = Symbol()
    dead = loop(i, 3, seq(Store(n, at(i), Load(x, at(i))), Store(n, at(i), Const(2.0))))
    after = forward_stores(RoutineIR("dead", dead))
    assert stores_of(after, n) == [Store(n, at(i), Const(2.0))]
    read = loop(i, 3, seq(Store(n, at(i), Unary(Unop.EXP, Load(x, at(i)))),
                          Store(n, at(i), Binary(Binop.MUL, Load(n, at(i)), Const(3.0)))))
    routine = RoutineIR("forwarded", read)
    after = forward_stores(routine)
    assert stores_of(after, n) == [Store(n, at(i), Binary(Binop.MUL, Unary(Unop.EXP, Load(x, at(i))), Const(3.0)))]
    assert_same_results(routine, after, {x: data(3)})


def test_stores_read_conditionally_or_twice_or_at_other_cells_stay():
    x, n = TNode("x", (3,)), TNode("n", (3,))
    i = Symbol()
    first = Store(n, at(i), Unary(Unop.EXP, Load(x, at(i))))
    seconds = [
        Ternary(Ternop.WHERE, Load(x, at(i)), Load(n, at(i)), Const(1.0)),
        Binary(Binop.MUL, Load(n, at(i)), Load(n, at(i))),
        Binary(Binop.ADD, Load(n, at(i)), Load(n, (Fixed(0),))),
    ]
    for value in seconds:
        routine = RoutineIR("kept", loop(i, 3, seq(first, Store(n, at(i), value))))
        after = forward_stores(routine)
        assert len(stores_of(after, n)) == 2
        assert_same_results(routine, after, {x: data(3)})


def test_an_update_reading_another_cell_is_not_fused_into_the_reduction():
    """``mean[j] := mean[j] + mean[0]`` reads a cell the fused nest would not have finished."""
    x, mean = TNode("x", (3, 4)), TNode("mean", (3,))
    i, k, j = Symbol(), Symbol(), Symbol()
    reduction = loop(i, 3, seq(Store(mean, at(i), Const(0.0)), loop(k, 4, accumulate(mean, at(i), Load(x, at(i, k))))))
    update = loop(j, 3, Store(mean, at(j), Binary(Binop.ADD, Load(mean, at(j)), Load(mean, (Fixed(2),)))))
    routine = RoutineIR("other cell", seq(reduction, update))
    after = forward_stores(routine)
    assert after is routine
    assert_same_results(routine, after, {x: data(3, 4)})


def test_a_nest_updating_another_node_is_passed_over_before_the_first_is_traced(monkeypatch):
    """Most pairs of neighbouring nests are no update of the first one's node: that is asked
    first, before the accesses of the first nest are traced (a training step has thousands of
    pairs)."""
    from ocannl.lowlevel import overwrite

    traced = []
    monkeypatch.setattr(overwrite, "accesses", lambda *a, **k: traced.append(a) or [])
    x, y, z = TNode("x", (3,)), TNode("y", (3,)), TNode("z", (3,))
    i, j = Symbol(), Symbol()
    first = loop(i, 3, Store(y, at(i), Unary(Unop.EXP, Load(x, at(i)))))
    assert overwrite._fused(first, loop(j, 3, Store(z, at(j), Load(y, at(j))))) is None
    assert overwrite._fused(first, Fill(z, Const(0.0))) is None
    assert traced == []


def test_a_sum_of_reductions_stays_in_its_cell():
    """``loss := 0; for b { loss += v { inner sum } }; loss := loss * c``: the outer sum stays
    in the cell (tree-summing backends reduce it across lanes); only the scaling is kept apart."""
    x, loss = TNode("x", (8, 5)), TNode("loss", ())
    b, k = Symbol(), Symbol()
    v = Local(dtypes.float32)
    inner = LocalScope(v, seq(SetLocal(v, Const(0.0)),
                              loop(k, 5, SetLocal(v, Binary(Binop.ADD, GetLocal(v), Load(x, at(b, k)))))))
    body = seq(Store(loss, (), Const(0.0)), loop(b, 8, accumulate(loss, (), inner)),
               Store(loss, (), Binary(Binop.MUL, Load(loss, ()), Const(0.125))))
    routine = RoutineIR("loss", body)
    after = forward_stores(routine)
    assert len(stores_of(after, loss)) == 3
    assert_same_results(routine, after, {x: data(8, 5)})


# ---------------------------------------------------------------------------------------------
# Gradient copies (item: no stores of gradient aliases)


def test_a_gradient_copy_is_inlined_where_it_may_be_virtual():
    """``a.grad[I] := 0.0 + b.grad[I]`` is a copy: cheap to recompute at each read, even a
    broadcast one, so a virtual gradient that only passes values on gets no buffer."""
    bg, ag, x, w = TNode("b_grad", (4, 3)), TNode("a_grad", (4, 3)), TNode("x", (4, 5)), TNode("w_grad", (3, 5))
    i, j, b, p, q = Symbol(), Symbol(), Symbol(), Symbol(), Symbol()
    copy = loop(i, 4, loop(j, 3, accumulate(ag, at(i, j), Load(bg, at(i, j)))))
    product = loop(b, 4, loop(p, 3, loop(q, 5, accumulate(w, at(p, q), Binary(Binop.MUL, Load(ag, at(b, p)),
                                                                                Load(x, at(b, q)))))))
    routine = RoutineIR("copy", seq(Fill(ag, Const(0.0)), Fill(w, Const(0.0)), copy, product))
    after = opt.optimize(routine, keep={bg, x, w})
    assert ag not in after.writes
    assert_same_results(routine, after, {bg: data(4, 3), x: data(4, 5)})


def _alias_step():
    session.reset()
    oc.seed(0)
    p = oc.param("p", output=3, init=np.array([1.5, -2.0, 0.25], np.float32))
    a = p * 2.0
    s = a + 1.0
    loss = (s * s).sum(label="loss")
    return p, a, s, train.grad_update(loss)


def test_a_virtual_gradient_alias_is_not_stored():
    """``a.grad =+ s.grad`` (the gradient of an addition) copies ``s.grad``: with ``a.grad``
    virtual no statement stores it, and ``p.grad`` keeps its bits."""
    p, a, s, update = _alias_step()
    ctx = oc.Context("interp")
    ctx.compile(update).run()
    want = ctx.get(p.grad)

    p, a, s, update = _alias_step()
    mark_virtual(a.grad)
    ctx = oc.Context("interp")
    routine = ctx.compile(update)
    routine.run()
    assert a.grad not in routine.ir.writes
    assert same_bits(ctx.get(p.grad), want)


# ---------------------------------------------------------------------------------------------
# Training steps


def _mlp_step(batch: int = 8):
    """A relu MLP with a squared-error loss: IEEE operations only (no math-library function, whose
    last bit may differ between backends), so every backend computes the same bits."""
    session.reset()
    oc.seed(0)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((batch, 12)).astype(np.float32)
    ys = rng.standard_normal((batch, 4)).astype(np.float32)
    x, y = oc.tensor(xs, batch=1, label="x"), oc.tensor(ys, batch=1, label="y")
    diff = nn.mlp(hid_dims=(16, 16), label="mlp")(x) - y
    loss = (diff * diff).mean(label="loss")
    update = train.grad_update(loss)
    return update, train.sgd_update(update, lr=0.1)


def _classifier_step():
    """The MLP classifier step of the launch counts, narrower: softmax cross-entropy."""
    session.reset()
    oc.seed(0)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((16, 20)).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 16)]
    x, y = oc.tensor(xs, batch=1, label="x"), oc.tensor(onehot, batch=1, label="y")
    probs = nn.softmax(nn.mlp(hid_dims=(32, 32), label="mlp")(x))
    loss = (-(y * oc.log(probs + 1e-9)).sum(axes="output")).mean(label="loss")
    update = train.grad_update(loss)
    return update, train.sgd_update(update, lr=0.01)


def _moons_step():
    from examples import moons

    session.reset()
    oc.seed(0)
    _, _, update, sgd, _, _ = moons.build()
    return update, sgd


def _transformer_step():
    from bench.cc_time import transformer

    session.reset()
    oc.seed(0)
    return tuple(transformer()[0])


@pytest.mark.parametrize("build", [_moons_step, _classifier_step, _cnn_step, _transformer_step],
                         ids=["moons", "mlp", "cnn", "transformer"])
def test_training_steps_fill_no_gradient_with_zeros(build):
    """Every gradient of these steps is written in full by its first contribution: no zero fill
    remains, and the only fill is ``loss.grad := 1``."""
    update, step = build()
    routine = oc.Context("interp").compile(update, step)
    left = fills(routine.ir)
    assert [(f.tnode.grad_of is not None, f.value.value) for f in left] == [(True, 1.0)]


def _step_gradients(backend: str, fold: bool, monkeypatch, build=None) -> dict[str, np.ndarray]:
    if not fold:
        monkeypatch.setattr(opt, "fold_fills", lambda r: r)
        monkeypatch.setattr(opt, "forward_stores", lambda r: r)
    update, step = (build or _mlp_step)()
    ctx = oc.Context(backend)
    routine = ctx.compile(update, step)
    routine.run()
    routine.run()
    monkeypatch.undo()
    return {n.debug_name: ctx.get(n) for n in routine.ir.writes}


def _kept_by_both(folded: dict[str, np.ndarray], unfolded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The buffers of the step without the rewrites that the step with them keeps too: without
    them a gradient keeps its fill and accumulation, and stays a buffer the optimizer would
    otherwise inline."""
    return {name: array for name, array in unfolded.items() if name in folded}


@pytest.mark.parametrize("backend", [backend_param("interp"), backend_param("c"), backend_param("metal"),
                                     backend_param("triton", slow=True)])
def test_training_step_keeps_its_bits_on_every_backend(backend, monkeypatch):
    """Two SGD steps of an MLP: every kept buffer (parameters, all gradients) equals, bit for
    bit, what the same backend computes without the rewrites, and what the interpreter computes
    with them (Triton sums long reductions in trees: there, up to rounding)."""
    folded = _step_gradients(backend, True, monkeypatch)
    assert any(name.endswith(".grad") for name in folded)
    for name, array in _kept_by_both(folded, _step_gradients(backend, False, monkeypatch)).items():
        assert same_bits(folded[name], array), name
    for name, array in _step_gradients("interp", True, monkeypatch).items():
        if backend == "triton":
            np.testing.assert_allclose(folded[name], array, rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            assert same_bits(folded[name], array), name


@pytest.mark.parametrize("backend", [backend_param("interp"), backend_param("c"), backend_param("metal"),
                                     backend_param("triton", slow=True)])
def test_the_cnn_steps_pool_gradient_overwrites_and_keeps_its_bits(backend, monkeypatch):
    """The max-pool of the small CNN (2x2 windows, stride 2, over a 6x6 map) writes its input's
    gradient once per cell, with no fill before it: two SGD steps keep every buffer's bits against
    the same backend without the rewrites (Triton: up to rounding, its trees sum the other
    gradients in another order)."""
    routine = oc.Context("interp").compile(*_cnn_step())
    (pool_grad,) = [s for s in iter_stmts(routine.ir.body) if isinstance(s, Store) and s.tnode.debug_name == "relu.grad"]
    assert any(isinstance(i, Affine) for i in pool_grad.indices)
    assert not [f for f in fills(routine.ir) if f.tnode is pool_grad.tnode]
    assert not [e for e in iter_exprs(pool_grad.value) if isinstance(e, Load) and e.tnode is pool_grad.tnode]
    folded = _step_gradients(backend, True, monkeypatch, _cnn_step)
    assert "relu.grad" in folded
    for name, array in _kept_by_both(folded, _step_gradients(backend, False, monkeypatch, _cnn_step)).items():
        if backend == "triton":
            np.testing.assert_allclose(folded[name], array, rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            assert same_bits(folded[name], array), name


# ---------------------------------------------------------------------------------------------
# Random programs


def _random_program(rng) -> tuple[RoutineIR, list[TNode]]:
    """A sequence of nests over a few nodes of one shape: fills, pointwise stores, updates of the
    own cell or reading a neighbour, reductions (reset inside, or batch loop outermost; some
    longer than a block of the summation order), slices, back-to-back stores."""
    rows, cols, depth = 3, 4, int(rng.choice([2, 70]))
    nodes = [TNode(f"n{k}", (rows, cols)) for k in range(3)]
    src = TNode("src", (rows, cols, depth))
    statements = []
    for _ in range(rng.integers(3, 9)):
        n, other = nodes[rng.integers(3)], nodes[rng.integers(3)]
        i, j, k = Symbol(), Symbol(), Symbol()
        cell = at(i, j)
        neighbour = (Iter(i), Affine(((1, j),), 1))
        term = [Load(src, (Iter(i), Iter(j), Fixed(0))), Load(other, cell), Load(other, neighbour, oob_value=0.0),
                Unary(Unop.NEG, Load(src, (Iter(i), Iter(j), Fixed(1))))][rng.integers(4)]
        op = [Binop.ADD, Binop.SUB, Binop.MUL, Binop.MAX][rng.integers(4)]
        summed = accumulate(n, cell, Load(src, (Iter(i), Iter(j), Iter(k))))
        statements.append([
            Fill(n, Const(float(rng.choice([0.0, 1.0, -0.0])))),
            loop(i, rows, loop(j, cols, Store(n, cell, term))),
            loop(i, rows, loop(j, cols, accumulate(n, cell, term, op))),
            loop(i, rows, loop(j, cols, seq(Store(n, cell, Const(0.0)), loop(k, depth, summed)))),
            loop(k, depth, loop(i, rows, loop(j, cols, summed))),
            loop(i, rows - 1, loop(j, cols, accumulate(n, cell, term, op))),
            loop(i, rows, loop(j, cols, accumulate(n, cell, Load(n, neighbour, oob_value=0.0)))),
            loop(i, rows, loop(j, cols, seq(Store(n, cell, term), accumulate(n, cell, Const(2.0), op)))),
        ][rng.integers(8)])
    return RoutineIR("random", seq(*statements)), nodes + [src]


@pytest.mark.parametrize("seed", range(4))
def test_random_programs_keep_their_bits(seed):
    """Both passes, and the whole optimizer, on random programs with initial values in every
    node, before and after the summation order's blocks."""
    rng = np.random.default_rng(seed)
    rewritten = 0
    for _ in range(40):
        routine, nodes = _random_program(rng)
        values = {n: rng.standard_normal(n.dims).astype(np.float32) for n in nodes}
        folded = forward_stores(fold_fills(routine))
        rewritten += folded is not routine
        for after in (folded, opt.optimize(routine, keep=set(nodes))):
            assert_same_results(routine, after, values)
            assert_same_results(block_sums(routine), block_sums(after), values)
    assert rewritten >= 10
