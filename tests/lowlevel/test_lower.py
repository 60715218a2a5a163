"""Lowering of hand-built assignments: structure checks, and the printed ``.cd`` / ``.ll`` of each
program pinned under golden/lower/."""

import pytest

from golden import check_golden
from handbuilt import accum, broadcast_add, matvec, padded_conv1d
from ocannl.errors import ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel import prng
from ocannl.lowlevel.assignments import (
    Apply, Arg, Block, Constant, EmbedSymbol, Fetch, Gather, RangeOverOffsets, ScatterAdd, Slice, Values, format_cd,
)
from ocannl.lowlevel.indexing import Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    DeclareLocal, Fill, For, GetLocal, Load, LoopKind, Seq, SetLocal, Store, Unary, format_routine, iter_exprs,
    iter_stmts, stmt_exprs,
)
from ocannl.lowlevel.lower import lower, lower_routine
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode


def broadcast_add_2x3():
    return broadcast_add(TNode("x", (2, 3)), TNode("b", (1, 3)), TNode("y", (2, 3)))


def sum_all():
    x, s = TNode("x", (2, 3)), TNode("s", ())
    i, j = Symbol(), Symbol()
    return accum(s, Binop.ADD, Unop.ID, (x,), [(i, 2), (j, 3)], (), ((Iter(i), Iter(j)),),
                 init=True, spec="ij => ")


def max_rows():
    x, m = TNode("x", (2, 3)), TNode("m", (2,))
    i, j = Symbol(), Symbol()
    return accum(m, Binop.MAX, Unop.ID, (x,), [(i, 2), (j, 3)], (Iter(i),), ((Iter(i), Iter(j)),),
                 init=True, spec="ij => i")


def max_into_fixed_cell():
    """``m =:@^ x`` written at position 0 of a size-3 axis (``=> 0`` closed to a larger size):
    the other cells keep the neutral -inf."""
    x, m = TNode("x", (4,)), TNode("m", (3,))
    j = Symbol()
    return accum(m, Binop.MAX, Unop.ID, (x,), [(j, 4)], (Fixed(0),), ((Iter(j),),),
                 init=True, spec="j => 0")


def reduction_outermost():
    """The reduction iterator comes first: a per-cell reset cannot go inside the nest."""
    a, v, c = TNode("a", (3, 4)), TNode("v", (4,)), TNode("c", (3,))
    k, i = Symbol(), Symbol()
    return accum(c, Binop.ADD, Binop.MUL, (a, v), [(k, 4), (i, 3)], (Iter(i),),
                 ((Iter(i), Iter(k)), (Iter(k),)), init=True)


def pointwise_neutral():
    """``=:+`` with an injective, surjective projection: a plain store, no reset."""
    x, y = TNode("x", (3,)), TNode("y", (3,))
    i = Symbol()
    return accum(y, Binop.ADD, Unop.EXP, (x,), [(i, 3)], (Iter(i),), ((Iter(i),),), init=True)


def mixed_precision():
    h, b = TNode("h", (2,), dtypes.float16), TNode("b", (2,), dtypes.bfloat16)
    y = TNode("y", (2,), dtypes.int32)
    i = Symbol()
    return Block((
        accum(h, None, Binop.MUL, (b, 3.0), [(i, 2)], (Iter(i),), ((Iter(i),), ())),
        accum(y, None, Binop.DIV, (h, 2), [(i, 2)], (Iter(i),), ((Iter(i),), ())),
    ))


def fetches():
    batch_n = IndexSymbol("batch_n", 4)
    xs, x, r = TNode("xs", (4, 2, 3)), TNode("x", (2, 3)), TNode("r", (2, 3))
    e, v = TNode("e", (2,)), TNode("v", (2, 2))
    return Block((
        Fetch(r, Constant(0.5)),
        Fetch(r, RangeOverOffsets()),
        Fetch(x, Slice(xs, batch_n)),
        Fetch(e, EmbedSymbol(batch_n)),
        Fetch(v, Values((1.0, 2.0, 3.0))),
    ), "fetches")


def take():
    table, ids = TNode("table", (5, 3)), TNode("ids", (2, 2))
    emb, emb_grad = TNode("emb", (2, 2, 3)), TNode("emb grad", (2, 2, 3))
    table_grad = TNode("table grad", (5, 3))
    return Block((Gather(emb, table, ids), ScatterAdd(table_grad, ids, emb_grad)))


PROGRAMS = {
    "matvec": lambda: matvec(TNode("a", (3, 4)), TNode("v", (4,)), TNode("c", (3,))),
    "broadcast_add": broadcast_add_2x3,
    "sum_all": sum_all,
    "max_rows": max_rows,
    "max_into_fixed_cell": max_into_fixed_cell,
    "reduction_outermost": reduction_outermost,
    "pointwise_neutral": pointwise_neutral,
    "conv1d_stride2_padded": lambda: padded_conv1d(TNode("x", (7,)), TNode("w", (3,)), TNode("y", (4,)), 2, 1),
    "mixed_precision": mixed_precision,
    "fetches": fetches,
    "take": take,
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_golden(name, update_golden):
    asg = PROGRAMS[name]()
    check_golden(f"lower/{name}.cd", format_cd(name, asg), update_golden)
    check_golden(f"lower/{name}.ll", format_routine(lower_routine(name, asg)), update_golden)


def stores(stmt):
    return [s for s in iter_stmts(stmt) if isinstance(s, Store)]


def test_matvec_resets_inside_the_nest():
    body = lower(PROGRAMS["matvec"]())
    assert isinstance(body, For) and body.kind is LoopKind.PARALLEL
    reset, inner = body.body.stmts
    assert reset.value.value == 0.0 and inner.kind is LoopKind.REDUCTION


def test_reset_falls_back_to_fill():
    for program, neutral in ((reduction_outermost, 0.0), (max_into_fixed_cell, float("-inf"))):
        body = lower(program())
        assert isinstance(body, Seq) and isinstance(body.stmts[0], Fill)
        assert body.stmts[0].value.value == neutral


def test_injective_neutral_is_a_plain_store():
    (store,) = stores(lower(pointwise_neutral()))
    assert not any(isinstance(e, Load) and e.tnode is store.tnode for e in iter_exprs(store.value))


def test_size_one_operand_axis_broadcasts():
    (store,) = stores(lower(broadcast_add_2x3()))
    loads = [e for e in iter_exprs(store.value) if isinstance(e, Load)]
    assert loads[1].tnode.name == "b" and loads[1].indices[0] == Fixed(0)


def test_padding_reads_the_neutral_element():
    (_, store) = stores(lower(PROGRAMS["conv1d_stride2_padded"]()))
    x_load, w_load = [e for e in iter_exprs(store.value) if isinstance(e, Load) and e.tnode.name in "xw"]
    assert (x_load.oob_value, w_load.oob_value) == (0, None)


def test_valid_convolution_has_no_padding():
    from handbuilt import padded_conv1d as conv

    (_, store) = stores(lower(conv(TNode("x", (9,)), TNode("w", (3,)), TNode("y", (4,)), 2, 0)))
    assert all(e.oob_value is None for e in iter_exprs(store.value) if isinstance(e, Load))


def test_dims_mismatch_is_reported():
    i = Symbol()
    x, y = TNode("x", (3,)), TNode("y", (3,))
    asg = accum(y, None, Unop.ID, (x,), [(i, 3)], (Iter(i),), ((Iter(i),),))
    y2 = TNode("y2", (4,))
    bad = type(asg)(y2, None, Unop.ID, (x,), asg.projections)
    with pytest.raises(ShapeError, match=r"the projections give result dims \(3,\) but the node has \(4,\)"):
        lower(bad)


def test_take_shapes_are_checked():
    with pytest.raises(ShapeError, match="indices.dims \\+ table.dims\\[1:\\]"):
        lower(Gather(TNode("out", (2, 4)), TNode("table", (5, 3)), TNode("ids", (2,))))


# ---------------------------------------------------------------------------------------------
# An Apply graph: a sub-expression read by several arguments is lowered once


def lowered_exprs(stmt) -> list:
    return [e for s in iter_stmts(stmt) for root in stmt_exprs(s) for e in iter_exprs(root)]


def test_a_shared_sub_expression_is_lowered_once_into_a_local():
    x, y = TNode("x", (4,)), TNode("y", (4,))
    i = Symbol()
    e = Apply(Unop.EXP, (Arg(0),))
    fn = Apply(Binop.ADD, (Apply(Binop.MUL, (e, e)), e))  # exp(x) read three times
    stmt = lower(accum(y, None, fn, (x,), [(i, 4)], (Iter(i),), ((Iter(i),),)))
    body = stmt.body.stmts
    assert [type(s) for s in body] == [DeclareLocal, SetLocal, Store]
    assert body[1].value == Unary(Unop.EXP, Load(x, (Iter(stmt.symbol),)))
    assert sum(isinstance(e, GetLocal) for e in lowered_exprs(body[2])) == 3


def test_a_sub_expression_shared_only_by_where_branches_stays_in_them():
    """A ``where`` evaluates only the branch it takes: what only its branches read is not
    computed before it."""
    x, y = TNode("x", (4,)), TNode("y", (4,))
    i = Symbol()
    e = Apply(Unop.LOG, (Arg(0),))
    fn = Apply(Ternop.WHERE, (Apply(Binop.GT, (Arg(0), 0.0)), e, Apply(Unop.NEG, (e,))))
    stmt = lower(accum(y, None, fn, (x,), [(i, 4)], (Iter(i),), ((Iter(i),),)))
    assert isinstance(stmt.body, Store)
    assert sum(isinstance(e, Unary) and e.op is Unop.LOG for e in lowered_exprs(stmt)) == 2


def test_normal_fill_lowers_to_as_many_operations_as_its_graph_has():
    """``prng.box_muller`` reads its reduced argument at every step of a binary search: lowered
    as a tree, the loop IR held each operation once per path to it (some 2,600 expressions),
    which common-subexpression elimination then merged at a compile cost of 65 ms per
    parameter."""
    fill = prng.normal_fill(TNode("p", (8,)), seed=0, stream=1)
    applies, stack = {}, [fill.fn]
    while stack:
        a = stack.pop()
        if isinstance(a, Apply) and id(a) not in applies:
            applies[id(a)] = a
            stack.extend(a.args)
    assert len(lowered_exprs(lower(fill))) < 3 * len(applies)
