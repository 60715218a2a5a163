"""The shared loop-IR facts (ocannl/lowlevel/analysis.py): index forms, symbols, ranges and
accesses, on hand-built indices and statements."""

from ocannl.lowlevel import analysis as an
from ocannl.lowlevel.indexing import Affine, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.analysis import all_exprs, all_stmts, under_constant_arithmetic
from ocannl.lowlevel.ir import (
    Binary, Cast, Const, DeclareLocal, EmbedIndex, Fill, GetLocal, Load, LoadDynamic, Local, LocalScope, SetLocal,
    Store, StoreDynamic, Ternary, Unary, iter_exprs, loop, seq,
)
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode


def test_affine_form_of_every_index_case():
    i = Symbol()
    assert an.affine_form(Fixed(3)) == ((), 3)
    assert an.affine_form(Iter(i)) == (((1, i),), 0)
    assert an.affine_form(Affine(((2, i),), -1)) == (((2, i),), -1)


def test_make_index_is_canonical():
    i, j = Symbol(), Symbol()
    assert an.make_index({}, 4) == Fixed(4)
    assert an.make_index({i: 0, j: 1}, 0) == Iter(j)
    assert an.make_index({i: 1}, 2) == Affine(((1, i),), 2)
    assert an.make_index({i: 2, j: -1}, 0) == Affine(((2, i), (-1, j)), 0)


def test_scaled_sum_merges_terms_of_one_symbol():
    i, j = Symbol(), Symbol()
    # 3 * (2i + 1) + 2 * (j - i) + 1 * 5 = 4i + 2j + 8
    parts = ((3, Affine(((2, i),), 1)), (2, Affine(((1, j), (-1, i)), 0)), (1, Fixed(5)))
    assert an.scaled_sum(parts) == Affine(((4, i), (2, j)), 8)
    # Terms that cancel leave a constant.
    assert an.scaled_sum(((1, Iter(i)), (-1, Iter(i)))) == Fixed(0)


def test_row_major_strides_and_offset():
    i, j = Symbol(), Symbol()
    assert an.row_major_strides((2, 3, 4)) == (12, 4, 1)
    assert an.row_major_strides(()) == ()
    assert an.row_major_offset((Iter(i), Fixed(1), Iter(j)), (2, 3, 4)) == Affine(((12, i), (1, j)), 4)
    assert an.row_major_offset((Fixed(0), Iter(j)), (1, 5)) == Iter(j)


def test_normalize_and_substitute_index():
    i, j = Symbol(), Symbol()
    simplest = Affine(((2, j),), 1)
    assert an.normalize_index(simplest) is simplest
    assert an.normalize_index(Affine(((1, i), (2, i)), 0)) == Affine(((3, i),), 0)
    assert an.substitute_index(Iter(i), {i: Fixed(2)}) == Fixed(2)
    assert an.substitute_index(Affine(((2, i), (1, j)), -1), {i: Affine(((3, j),), 1)}) == Affine(((7, j),), 1)


def test_symbols_of_indices_and_expressions():
    i, j, k = Symbol(), Symbol(), Symbol()
    step = IndexSymbol("step", 10)
    a, b = TNode("a", (4, 4)), TNode("b", (4,))
    assert an.indices_symbols((Iter(i), None, Affine(((2, j), (1, step)), 0), Fixed(1))) == {i, j, step}
    e = Binary(
        Binop.ADD,
        Load(a, (Iter(i), Affine(((1, j),), 1))),
        Binary(
            Binop.MUL,
            LoadDynamic(b, 0, Const(0, dtypes.int32), ()),
            Cast(EmbedIndex(Iter(k), dtypes.int32), dtypes.float32),
        ),
    )
    assert an.expr_symbols(e) == {i, j, k}


def test_provably_within_uses_extents_and_symbol_sizes():
    i, j = Symbol(), Symbol()
    extents = {i: 4, j: 3}
    assert an.provably_within(Iter(i), 4, extents)
    assert not an.provably_within(Iter(i), 3, extents)
    assert an.provably_within(Affine(((2, j),), -1), 4, {j: 1}) is False  # -1 is outside
    assert an.provably_within(Affine(((1, i), (1, j)), 0), 6, extents)
    assert not an.provably_within(Iter(Symbol()), 100, extents)  # unknown loop
    assert an.provably_within(Iter(IndexSymbol("b", 5)), 5, {})
    assert not an.provably_within(Iter(IndexSymbol("b")), 5, {})  # no size: any value
    # A loop of extent 0 runs no iteration: nothing it indexes is ever outside.
    assert an.provably_within(Iter(i), 1, {i: 0})


def test_provably_within_answers_as_the_index_range_does():
    """Its quick answers for a fixed index and a bare loop index (the printers ask it of every
    access) agree with the interval of :func:`index_range`."""
    i, j, unknown = Symbol(), Symbol(), Symbol()
    for extent in range(-1, 6):
        extents = {i: extent, j: 3}
        ranges = {s: (0, e - 1) for s, e in extents.items()}
        sized = [Iter(IndexSymbol("b", extent))] if extent > 0 else []
        for idx in [Fixed(k) for k in range(-2, 7)] + [Iter(i), Iter(unknown)] + sized:
            for dim in range(0, 7):
                expected = an.range_within(an.index_range(idx, ranges), dim)
                assert an.provably_within(idx, dim, extents) is expected, (idx, extent, dim)


def test_index_range_over_closed_intervals():
    i = Symbol()
    assert an.index_range(Affine(((3, i),), 1), {i: (2, 5)}) == (7, 16)
    assert an.index_range(Iter(i), {}) is None
    assert an.range_within((0, 3), 4) and not an.range_within((0, 4), 4) and not an.range_within(None, 4)


def test_accesses_lists_reads_before_the_write_with_dynamic_axes_open():
    i = Symbol()
    a, p = TNode("a", (3,)), TNode("p", (3,), dtypes.int32)
    b, c = TNode("b", (2, 3)), TNode("c", (2, 3))
    position = Load(p, (Iter(i),))
    body = seq(
        Store(c, (Fixed(0), Iter(i)), Binary(Binop.ADD, Load(a, (Iter(i),)), LoadDynamic(b, 0, position, (Iter(i),)))),
        StoreDynamic(b, 0, position, (Iter(i),), Const(1.0, dtypes.float32)),
        Fill(a, Const(0.0, dtypes.float32)),
    )
    nest = loop(i, 3, body)
    expected = [
        an.Access(a, (Iter(i),), False),
        an.Access(b, (None, Iter(i)), False),
        an.Access(p, (Iter(i),), False),
        an.Access(c, (Fixed(0), Iter(i)), True),
        an.Access(p, (Iter(i),), False),
        an.Access(b, (None, Iter(i)), True),
    ]
    assert list(an.accesses(nest)) == expected
    assert list(an.accesses(nest, fills=True)) == expected + [an.Access(a, (None,), True)]


def test_loop_chain_stops_at_the_first_non_loop():
    i, j = Symbol(), Symbol()
    c = TNode("c", (2, 3))
    store = Store(c, (Iter(i), Iter(j)), Const(1.0, dtypes.float32))
    chain, body = an.loop_chain(loop(i, 2, loop(j, 3, store)))
    assert [f.symbol for f in chain] == [i, j] and body is store
    assert an.loop_chain(store) == ([], store)


def test_cell_provably_within_needs_every_axis():
    i, j = Symbol(), Symbol()
    extents = {i: 2, j: 3}
    assert an.cell_provably_within((Iter(i), Iter(j)), (2, 3), extents)
    assert not an.cell_provably_within((Iter(i), Affine(((1, j),), 1)), (2, 3), extents)
    assert an.cell_provably_within((), (), {})


def test_can_fail_names_the_checks_a_run_makes():
    """A routine can fail where an access may leave its buffer with no defined outcome, or an
    integer division may meet 0: the routines whose failed runs are undone (routine.Routine)."""
    i = Symbol()
    x, ids = TNode("x", (4,)), TNode("ids", (4,), dtypes.int32)
    a, q = TNode("a", (4,), dtypes.int32), TNode("q", (4,), dtypes.int32)
    sized, unsized = IndexSymbol("n", 4), IndexSymbol("u")

    def each(value, store=x):
        return loop(i, 4, Store(store, (Iter(i),), value))

    assert not an.can_fail(each(Load(x, (Iter(i),))))
    assert not an.can_fail(Store(x, (Iter(sized),), Const(1.0)))  # a run checks the binding first
    assert an.can_fail(Store(x, (Iter(unsized),), Const(1.0)))
    assert not an.can_fail(each(Load(x, (Affine(((1, i),), 2),), oob_value=0.0)))  # a margin reads 0
    assert an.can_fail(each(Load(x, (Affine(((1, i),), 2),))))
    assert not an.can_fail(Store(x, (Affine(((1, i),), 2),), Const(1.0), skip_oob=True))
    assert an.can_fail(each(LoadDynamic(x, 0, Load(ids, (Iter(i),)), ())))
    assert an.can_fail(loop(i, 4, StoreDynamic(x, 0, Load(ids, (Iter(i),)), (), Const(1.0))))
    assert an.can_fail(each(Binary(Binop.DIV, Load(a, (Iter(i),)), Load(ids, (Iter(i),))), q))
    assert not an.can_fail(each(Binary(Binop.DIV, Load(a, (Iter(i),)), Const(2, dtypes.int32)), q))
    assert not an.can_fail(each(Binary(Binop.DIV, Load(x, (Iter(i),)), Const(0.0))))  # a float: inf
    assert not an.can_fail(seq(each(Load(x, (Iter(i),))), Fill(x, Const(0.0))))
    failing = Store(x, (Iter(unsized),), Const(1.0))
    zero = Const(0, dtypes.int32)
    assert an.writes_before_failure(seq(Fill(q, zero), failing, Fill(a, zero))) == (q, x)
    assert an.writes_before_failure(seq(Fill(q, zero), Fill(a, zero))) == ()
    assert an.writes_before_failure(seq(Fill(q, zero), failing, Fill(a, zero)), stops_at_failure=False) == (q, x, a)


def test_positions_a_gather_checked_need_no_second_check():
    """``y[i] := table[ids[batch, i]]`` checks every id of the batch's row (its loop covers the
    row, the gather runs at every iteration): a scatter by the same ids after it cannot fail,
    unless something wrote ``ids`` in between, its loop read only part of them, the gather sat
    in a ``where`` branch, or the scatter's table is shorter."""
    i, j = Symbol(), Symbol()
    batch = IndexSymbol("batch", 2)
    table, grad, short = TNode("table", (5, 3)), TNode("grad", (5, 3)), TNode("short", (4, 3))
    ids, y, g = TNode("ids", (2, 4), dtypes.int32), TNode("y", (4, 3)), TNode("g", (4, 3))

    def position(k):
        return Load(ids, (Iter(batch), Iter(k)))

    def gather(extent=4, guarded=False):
        value = LoadDynamic(table, 0, position(i), (Iter(j),))
        if guarded:
            value = Ternary(Ternop.WHERE, Load(g, (Iter(i), Iter(j))), value, Const(0.0))
        return loop(i, extent, loop(j, 3, Store(y, (Iter(i), Iter(j)), value)))

    def scatter(into=grad):
        return loop(i, 4, loop(j, 3, StoreDynamic(into, 0, position(i), (Iter(j),), Load(g, (Iter(i), Iter(j))))))

    rewrite_ids = loop(i, 4, Store(ids, (Iter(batch), Iter(i)), Const(0, dtypes.int32)))
    assert an.last_check([gather(), scatter()]) == 0
    assert an.last_check([gather(), rewrite_ids, scatter()]) == 2
    assert an.last_check([gather(extent=3), scatter()]) == 1
    assert an.last_check([gather(guarded=True), scatter()]) == 1
    assert an.last_check([gather(), scatter(short)]) == 1
    assert an.writes_before_failure(seq(gather(), scatter())) == (y,)


def _scoped_sum():
    """``c[0] := s { s := 0; for i: s := s + a[i] * t }`` with ``t`` a local of the caller, and
    the scope's body storing into ``d``: every query must see inside the scope."""
    i = Symbol()
    a, c, d = TNode("a", (3,)), TNode("c", (1,)), TNode("d", (3,))
    s, t = Local(dtypes.float32), Local(dtypes.float32)
    term = Binary(Binop.MUL, Load(a, (Iter(i),)), GetLocal(t))
    body = seq(SetLocal(s, Const(0.0, dtypes.float32)),
               loop(i, 3, seq(Store(d, (Iter(i),), term), SetLocal(s, Binary(Binop.ADD, GetLocal(s), term)))))
    scope = LocalScope(s, body)
    return Store(c, (Fixed(0),), scope), scope, (a, c, d), (s, t)


def test_all_exprs_and_all_stmts_enter_local_scopes_in_program_order():
    store, scope, (a, _, d), (s, _) = _scoped_sum()
    assert [type(x).__name__ for x in all_stmts(scope)] == ["Seq", "SetLocal", "For", "Seq", "Store", "SetLocal"]
    assert list(all_stmts(store))[1:] == list(all_stmts(scope))
    exprs = list(all_exprs(scope))
    assert exprs[0] is scope and exprs[1] == Const(0.0, dtypes.float32)
    assert [x.tnode for x in exprs if isinstance(x, Load)] == [a, a]
    assert list(all_exprs(store)) == exprs
    assert list(iter_exprs(scope)) == [scope]  # the expression walker alone stops at the scope


def test_reads_writes_and_bindings_of_a_statement_and_of_an_expression():
    store, scope, (a, c, d), (s, t) = _scoped_sum()
    assert an.nodes_read(scope) == an.nodes_read(store) == {a}
    assert an.nodes_written(scope) == {d} and an.nodes_written(store) == {c, d}
    assert an.locals_read(scope) == {s, t}
    assert an.locals_bound(scope) == an.locals_written(scope) == {s}
    assert an.locals_read(scope) - an.locals_written(scope) == {t}  # what the caller must provide
    assert [x.node for x in an.accesses(scope)] == [a, d, a]
    assert [x.node for x in an.accesses(store)] == [c, a, d, a]  # a statement, then its scopes
    u, j = Local(dtypes.float32), Symbol()
    declared = seq(DeclareLocal(u), SetLocal(u, GetLocal(t)))
    assert an.locals_bound(declared) == {u} and an.locals_written(declared) == {u}
    assert not an.sets_outer_local(store) and not an.sets_outer_local(declared)
    into_outer = loop(j, 2, SetLocal(t, Binary(Binop.ADD, GetLocal(t), Load(a, (Iter(j),)))))
    assert an.sets_outer_local(into_outer.body) and an.locals_written(into_outer) == {t}


def test_under_constant_arithmetic_peels_what_a_copy_applies_to_its_load():
    """``0.0 + g``, ``-(2.0 * g)``, a cast of it when asked: ``g``; not through another load, nor
    through an operator outside the set."""
    g, h = TNode("g", (4,)), TNode("h", (4,))
    i = Symbol()
    load = Load(g, (Iter(i),))
    ops = frozenset({Binop.ADD, Binop.MUL})
    copy = Binary(Binop.ADD, Const(0.0, dtypes.float32), load)
    assert under_constant_arithmetic(copy, ops, casts=False) is load
    assert under_constant_arithmetic(Unary(Unop.NEG, Binary(Binop.MUL, Const(2.0, dtypes.float32), load)), ops,
                                     casts=False) is load
    cast = Cast(load, dtypes.float64)
    assert under_constant_arithmetic(cast, ops, casts=True) is load
    assert under_constant_arithmetic(cast, ops, casts=False) is cast
    two = Binary(Binop.ADD, load, Load(h, (Iter(i),)))
    assert under_constant_arithmetic(two, ops, casts=True) is two
    divided = Binary(Binop.DIV, load, Const(2.0, dtypes.float32))
    assert under_constant_arithmetic(divided, ops, casts=True) is divided
