"""The optimizer (ocannl/lowlevel/optimize.py): each pass alone on hand-built loop IR and on
frontend programs, always checked against the interpreter running the routine before the pass,
bit for bit (docs/design.md, "Arithmetic")."""

import math

from functools import partial

import numpy as np
import pytest

import helpers
from helpers import assert_pass_keeps_bits, run_ir, same_bits
import ocannl as oc
from handbuilt import accum, pointwise
from ocannl import config, session, testing
from ocannl.backends.context import Context, set_default_context
from ocannl.errors import OcannlError, SessionError
from ocannl.lowlevel.assignments import Block, Computation
from ocannl.lowlevel import dtypes
from ocannl.lowlevel import optimize as opt
from ocannl.lowlevel.analysis import substitute_index
from ocannl.lowlevel.indexing import Affine, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Fill, For, GetLocal, Load, Local, LocalScope, RoutineIR,
    SetLocal, Store, Ternary, Unary, format_routine, iter_exprs, iter_stmts, loop, seq, stmt_exprs,
)
from ocannl.lowlevel import op_semantics
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import MemoryMode, TNode, mark_materialized, mark_virtual

RNG = np.random.default_rng(11)
data = partial(helpers.data, rng=RNG)


@pytest.fixture(autouse=True)
def no_settings(monkeypatch, tmp_path):
    """No OCANNL_* variable nor config file changes what the optimizer does."""
    for key in ("OCANNL_FAST_MATH", "OCANNL_BACKEND", "OCANNL_DEBUG_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)


def top(routine: RoutineIR) -> list:
    """The top-level statements, comments left out."""
    return [s for s in opt.top_level(routine.body) if not isinstance(s, Comment)]


def exprs_of(routine: RoutineIR) -> list:
    return [e for s in iter_stmts(routine.body) for x in stmt_exprs(s) for e in iter_exprs(x)]


def count_ops(routine: RoutineIR, op) -> int:
    return sum(1 for e in exprs_of(routine) if getattr(e, "op", None) is op)


def pointwise_chain():
    """``m = a * b; s = m + c; y = relu(s)``: three loop nests, as lowering makes them."""
    a, b, c = (TNode(n, (2, 3)) for n in "abc")
    m, s, y = TNode("m", (2, 3)), TNode("s", (2, 3)), TNode("y", (2, 3))

    def nest(lhs, value):
        i, j = Symbol(), Symbol()
        return loop(i, 2, loop(j, 3, Store(lhs, (Iter(i), Iter(j)), value(Iter(i), Iter(j)))))

    body = seq(
        nest(m, lambda i, j: Binary(Binop.MUL, Load(a, (i, j)), Load(b, (i, j)))),
        nest(s, lambda i, j: Binary(Binop.ADD, Load(m, (i, j)), Load(c, (i, j)))),
        nest(y, lambda i, j: Unary(Unop.RELU, Load(s, (i, j)))),
    )
    return RoutineIR("chain", body), (a, b, c), (m, s), y


def matvec_then_square(reset_outside=False):
    """``c[i] = sum_k a[i, k] * v[k]; d[i] = c[i] * c[i]`` (docs/compiler.md, "Optimization"); with
    ``reset_outside`` the reduction loop comes first and ``c`` is reset by a fill."""
    a, v, c, d = TNode("a", (3, 4)), TNode("v", (4,)), TNode("c", (3,)), TNode("d", (3,))
    i, k, j = Symbol(), Symbol(), Symbol()
    acc = Store(c, (Iter(i),), Binary(Binop.ADD, Load(c, (Iter(i),)),
                                      Binary(Binop.MUL, Load(a, (Iter(i), Iter(k))), Load(v, (Iter(k),)))))
    if reset_outside:
        producer = seq(Fill(c, Const(0.0)), loop(k, 4, loop(i, 3, acc)))
    else:
        producer = loop(i, 3, seq(Store(c, (Iter(i),), Const(0.0)), loop(k, 4, acc)))
    square = loop(j, 3, Store(d, (Iter(j),), Binary(Binop.MUL, Load(c, (Iter(j),)), Load(c, (Iter(j),)))))
    return RoutineIR("square", seq(producer, square)), (a, v), c, d


# ---------------------------------------------------------------------------------------------
# 1. Tracing


def test_trace_records_writers_patterns_and_inputs():
    routine, (a, v), c, d = matvec_then_square()
    t = opt.trace(routine)
    assert t.nodes[c].writer_positions == (0,)
    assert len(t.nodes[c].store_patterns) == 1 and len(t.nodes[c].reads) == 3  # self-read + 2 uses
    assert not t.nodes[c].read_before_write and not t.nodes[d].read_before_write
    assert set(t.inputs) == {a, v}
    assert set(t.outputs) == {c, d}
    assert opt.routine_inputs(routine) == {a, v}


def test_trace_fill_then_accumulate_is_not_an_input():
    routine, (a, v), c, _ = matvec_then_square(reset_outside=True)
    t = opt.trace(routine)
    assert t.nodes[c].writer_positions == (0, 1)
    assert not t.nodes[c].read_before_write


def test_trace_accumulating_without_reset_reads_before_write():
    x, g = TNode("x", (3,)), TNode("g", (3,))
    i = Symbol()
    body = loop(i, 3, Store(g, (Iter(i),), Binary(Binop.ADD, Load(g, (Iter(i),)), Load(x, (Iter(i),)))))
    assert opt.trace(RoutineIR("acc", body)).inputs == (g, x)


def test_trace_partial_write_then_read_is_an_input():
    """A store that reaches only some cells does not define the node: a later read of the
    others sees the old value."""
    x, y, z = TNode("x", (3,)), TNode("y", (4,)), TNode("z", (4,))
    i, j = Symbol(), Symbol()
    body = seq(loop(i, 3, Store(y, (Iter(i),), Load(x, (Iter(i),)))),
               loop(j, 4, Store(z, (Iter(j),), Load(y, (Iter(j),)))))
    assert y in opt.trace(RoutineIR("partial", body)).inputs


def test_trace_read_at_other_indices_in_the_defining_nest_is_an_input():
    """``for i { y[i] := x[i]; z[i] := y[2 - i] }``: at i = 0, y[2] is not written yet."""
    x, y, z = TNode("x", (3,)), TNode("y", (3,)), TNode("z", (3,))
    i = Symbol()
    mirrored = Affine(((-1, i),), 2)
    body = loop(i, 3, seq(Store(y, (Iter(i),), Load(x, (Iter(i),))), Store(z, (Iter(i),), Load(y, (mirrored,)))))
    assert y in opt.trace(RoutineIR("mirror", body)).inputs
    same_cell = loop(i, 3, seq(Store(y, (Iter(i),), Load(x, (Iter(i),))), Store(z, (Iter(i),), Load(y, (Iter(i),)))))
    assert y not in opt.trace(RoutineIR("same cell", same_cell)).inputs


# ---------------------------------------------------------------------------------------------
# 2. Virtualization


def test_pointwise_chain_becomes_one_loop_nest():
    routine, inputs, (m, s), y = pointwise_chain()
    after = opt.virtualize(routine, keep={y, *inputs})
    (nest,) = top(after)
    assert isinstance(nest, For) and isinstance(nest.body, For) and isinstance(nest.body.body, Store)
    assert m not in after.reads + after.writes and s not in after.reads + after.writes
    assert opt.inlined_nodes(routine, after) == {m, s}
    assert_pass_keeps_bits(routine, after, {n: data(2, 3) for n in inputs})
    simplified = opt.simplify(after)
    assert "relu(((a[i0, i1] * b[i0, i1]) + c[i0, i1]))" in format_routine(simplified)
    assert_pass_keeps_bits(routine, simplified, {n: data(2, 3) for n in inputs})


def test_keep_prevents_virtualization():
    routine, inputs, (m, s), y = pointwise_chain()
    after = opt.virtualize(routine, keep={m, y, *inputs})
    assert m in after.writes and s not in after.writes
    assert opt.virtualization_obstacle(routine, m, keep={m}) == "it must stay materialized (kept)"


@pytest.mark.parametrize("reset_outside", [False, True])
def test_reduction_is_inlined_as_a_local_scope(reset_outside):
    routine, (a, v), c, d = matvec_then_square(reset_outside)
    after = opt.virtualize(routine, keep={a, v, d})
    assert c not in after.reads + after.writes
    (nest,) = top(after)
    scopes = [e for e in exprs_of(after) if isinstance(e, LocalScope)]
    assert len(scopes) == 2 and all(isinstance(opt.top_level(sc.body)[-1], For) for sc in scopes)
    assert_pass_keeps_bits(routine, after, {a: data(3, 4), v: data(4)})


def test_outputs_and_inputs_are_never_virtualized():
    routine, (a, v), c, d = matvec_then_square()
    after = opt.virtualize(routine, keep=())
    assert d in after.writes  # written, never read: an output
    assert a in after.reads and v in after.reads  # inputs
    assert opt.virtualization_obstacle(routine, d) == "it is not read after it is written (an output)"
    assert opt.virtualization_obstacle(routine, a) == "the routine does not write it"


def test_overwritten_source_blocks_inlining():
    """``m = x * 2; x := 0; y = m``: inlining m after the store to x would read the new x."""
    x, m, y = TNode("x", (3,)), TNode("m", (3,)), TNode("y", (3,))
    i, j, k = Symbol(), Symbol(), Symbol()
    body = seq(
        loop(i, 3, Store(m, (Iter(i),), Binary(Binop.MUL, Load(x, (Iter(i),)), Const(2.0)))),
        loop(j, 3, Store(x, (Iter(j),), Const(0.0))),
        loop(k, 3, Store(y, (Iter(k),), Load(m, (Iter(k),)))),
    )
    routine = RoutineIR("overwrite", body)
    after = opt.virtualize(routine, keep={x, y})
    assert m in after.writes
    assert "overwritten" in opt.virtualization_obstacle(routine, m)
    assert_pass_keeps_bits(routine, after, {x: data(3)})


def test_a_reduction_read_by_a_broadcast_stays_materialized():
    """``e[i, j] = c[i] + w[j]``: inlining c would compute each of its sums once per j."""
    a, v, c, w, e = TNode("a", (3, 4)), TNode("v", (4,)), TNode("c", (3,)), TNode("w", (5,)), TNode("e", (3, 5))
    i, k, p, q = Symbol(), Symbol(), Symbol(), Symbol()
    producer = loop(i, 3, seq(Store(c, (Iter(i),), Const(0.0)), loop(k, 4, Store(c, (Iter(i),), Binary(
        Binop.ADD, Load(c, (Iter(i),)), Binary(Binop.MUL, Load(a, (Iter(i), Iter(k))), Load(v, (Iter(k),))))))))
    consumer = loop(p, 3, loop(q, 5, Store(e, (Iter(p), Iter(q)), Binary(Binop.ADD, Load(c, (Iter(p),)),
                                                                         Load(w, (Iter(q),))))))
    routine = RoutineIR("broadcast", seq(producer, consumer))
    assert "broadcast" in opt.virtualization_obstacle(routine, c)


def test_a_node_read_by_two_statements_stays_materialized_unless_cheap():
    x, m, y, z, k = TNode("x", (3,)), TNode("m", (3,)), TNode("y", (3,)), TNode("z", (3,)), TNode("k", (3,))
    s = [Symbol() for _ in range(5)]
    body = seq(
        loop(s[0], 3, Store(m, (Iter(s[0]),), Unary(Unop.EXP, Load(x, (Iter(s[0]),))))),
        loop(s[1], 3, Store(k, (Iter(s[1]),), Const(2.0))),  # cheap: a constant
        loop(s[2], 3, Store(y, (Iter(s[2]),), Binary(Binop.MUL, Load(m, (Iter(s[2]),)), Load(k, (Iter(s[2]),))))),
        loop(s[3], 3, Store(z, (Iter(s[3]),), Binary(Binop.ADD, Load(m, (Iter(s[3]),)), Load(k, (Iter(s[3]),))))),
    )
    routine = RoutineIR("two readers", body)
    after = opt.virtualize(routine, keep={x, y, z})
    assert m in after.writes and k not in after.writes
    assert_pass_keeps_bits(routine, opt.simplify(after), {x: data(3)})


def test_half_precision_nodes_keep_their_buffer():
    """A float16 node rounds on store; a float32 local would not."""
    x, h, y = TNode("x", (3,)), TNode("h", (3,), dtypes.float16), TNode("y", (3,))
    i, j = Symbol(), Symbol()
    body = seq(loop(i, 3, Store(h, (Iter(i),), Binary(Binop.MUL, Load(x, (Iter(i),)), Const(3.0)))),
               loop(j, 3, Store(y, (Iter(j),), Load(h, (Iter(j),)))))
    routine = RoutineIR("half", body)
    assert opt.virtualize(routine, keep={x, y}).writes == (h, y)


def test_inlining_substitutes_affine_and_static_indices():
    """The producer's loop index is replaced by the reader's index expression, here a static
    index symbol plus an offset."""
    n = IndexSymbol("n", 2)
    x, m, y = TNode("x", (4,)), TNode("m", (4,)), TNode("y", ())
    i = Symbol()
    body = seq(loop(i, 4, Store(m, (Iter(i),), Binary(Binop.MUL, Load(x, (Iter(i),)), Cast(EmbedIndex(Iter(i)), dtypes.float32)))),
               Store(y, (), Load(m, (Affine(((1, n),), 2),))))
    routine = RoutineIR("affine", body)
    after = opt.simplify(opt.virtualize(routine, keep={x, y}))
    assert top(after) == [Store(y, (), Binary(Binop.MUL, Load(x, (Affine(((1, n),), 2),)),
                                               Cast(EmbedIndex(Affine(((1, n),), 2)), dtypes.float32)))]
    for value in (0, 1):
        assert_pass_keeps_bits(routine, after, {x: data(4)}, n=value)


def test_nested_virtual_nodes_inline_through_each_other():
    """A reduction over an inlined pointwise node, read by a pointwise consumer."""
    x, e, s, y = TNode("x", (3, 4)), TNode("e", (3, 4)), TNode("s", (3,)), TNode("y", (3,))
    i, j, p, k, q = (Symbol() for _ in range(5))
    body = seq(
        loop(i, 3, loop(j, 4, Store(e, (Iter(i), Iter(j)), Unary(Unop.EXP, Load(x, (Iter(i), Iter(j))))))),
        loop(p, 3, seq(Store(s, (Iter(p),), Const(0.0)), loop(k, 4, Store(s, (Iter(p),), Binary(
            Binop.ADD, Load(s, (Iter(p),)), Load(e, (Iter(p), Iter(k)))))))),
        loop(q, 3, Store(y, (Iter(q),), Unary(Unop.LOG, Load(s, (Iter(q),))))),
    )
    routine = RoutineIR("logsumexp", body)
    after = opt.optimize(routine, keep={x, y})
    assert after.writes == (y,) and len(top(after)) == 1
    assert_pass_keeps_bits(routine, after, {x: data(3, 4)})


# ---------------------------------------------------------------------------------------------
# 3. Simplification


def simplified_value(value, node_dtype=dtypes.float32):
    out = TNode("out", (), node_dtype)
    routine = RoutineIR("s", Store(out, (), value))
    after = opt.simplify(routine)
    assert_pass_keeps_bits(routine, after, {})
    return after.body.value


def test_constant_folding_in_the_expression_type():
    x, y = TNode("x", (3,)), TNode("y", (3,))
    i = Symbol()
    body = loop(i, 3, Store(y, (Iter(i),), Binary(Binop.MUL, Load(x, (Iter(i),)),
                                                  Binary(Binop.MUL, Const(2.0), Const(3.0)))))
    routine = RoutineIR("fold", body)
    after = opt.simplify(routine)
    assert after.body.body.value == Binary(Binop.MUL, Load(x, (Iter(i),)), Const(6.0))
    assert "x[i0] * 6.0" in format_routine(after)
    assert_pass_keeps_bits(routine, after, {x: data(3)})
    # float32 rounding, not Python's double: 0.1 + 0.2 folds to the float32 sum
    third = simplified_value(Binary(Binop.ADD, Const(0.1), Const(0.2)))
    assert third == Const(float(np.float32(0.1) + np.float32(0.2)))


SPECIAL = [0.0, -0.0, 1.0, -1.5, 3.0, 1e-45, 3.4e38, math.inf, -math.inf, math.nan, 0.1]
FOLDED_BINARY = sorted(op_semantics.FOLDED_BINARY, key=lambda op: op.value)
FOLDED_UNARY = sorted(op_semantics.FOLDED_UNARY, key=lambda op: op.value)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64])
@pytest.mark.parametrize("op", FOLDED_BINARY)
def test_folding_matches_the_interpreter_bit_for_bit(op, dtype):
    """Folded or not (NaN results stay), the stored bits are the interpreter's."""
    for a in SPECIAL:
        for b in SPECIAL:
            simplified_value(Binary(op, Const(a, dtype), Const(b, dtype)), dtype)


@pytest.mark.parametrize("op", FOLDED_UNARY)
def test_unary_folding_matches_the_interpreter(op):
    for a in SPECIAL:
        simplified_value(Unary(op, Const(a)))


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint32, dtypes.int64])
def test_integer_folding_wraps_and_keeps_division_by_zero(dtype):
    big = int(np.iinfo(dtype.storage).max)
    for op in (Binop.ADD, Binop.SUB, Binop.MUL, Binop.DIV, Binop.MOD, Binop.MAX, Binop.LT):
        for a, b in [(big, 1), (7, -2 if dtype is not dtypes.uint32 else 2), (-7 if dtype is not dtypes.uint32 else 7, 2)]:
            simplified_value(Binary(op, Const(a, dtype), Const(b, dtype)), dtype)
    divide_by_zero = Binary(Binop.DIV, Const(1, dtype), Const(0, dtype))
    out = TNode("out", (), dtype)
    assert opt.simplify(RoutineIR("z", Store(out, (), divide_by_zero))).body.value == divide_by_zero


def test_libm_functions_and_nans_are_not_folded():
    for value in (Unary(Unop.EXP, Const(1.0)), Unary(Unop.SIN, Const(1.0)), Binary(Binop.POW, Const(2.0), Const(0.5)),
                  Binary(Binop.DIV, Const(0.0), Const(0.0)), Binary(Binop.ADD, Const(math.nan), Const(1.0))):
        assert simplified_value(value) == value


def test_casts_fold_as_the_interpreter_converts():
    assert simplified_value(Cast(Const(16777217, dtypes.int32), dtypes.float32)) == Const(16777216.0)
    assert simplified_value(Cast(Const(-2.7), dtypes.int32), dtypes.int32) == Const(-2, dtypes.int32)
    assert simplified_value(Cast(Cast(EmbedIndex(Fixed(3)), dtypes.float32), dtypes.float64), dtypes.float64) == \
        Const(3.0, dtypes.float64)


@pytest.mark.parametrize("x", [0.0, -0.0, 1.5, math.inf, -math.inf, math.nan])
def test_identities_are_exact_and_inexact_ones_stay(x):
    node = TNode("x", ())
    load = Load(node, ())
    out = TNode("out", ())
    exact = {
        "x*1": Binary(Binop.MUL, load, Const(1.0)), "1*x": Binary(Binop.MUL, Const(1.0), load),
        "x/1": Binary(Binop.DIV, load, Const(1.0)), "x-0": Binary(Binop.SUB, load, Const(0.0)),
        "x+-0": Binary(Binop.ADD, load, Const(-0.0)), "-0+x": Binary(Binop.ADD, Const(-0.0), load),
        "--x": Unary(Unop.NEG, Unary(Unop.NEG, load)),
    }
    inexact = {
        "x+0": Binary(Binop.ADD, load, Const(0.0)), "0+x": Binary(Binop.ADD, Const(0.0), load),
        "x*0": Binary(Binop.MUL, load, Const(0.0)), "x-(-0)": Binary(Binop.SUB, load, Const(-0.0)),
        "0-x": Binary(Binop.SUB, Const(0.0), load),
    }
    for name, value in {**exact, **inexact}.items():
        routine = RoutineIR(name, Store(out, (), value))
        after = opt.simplify(routine)
        assert (after.body.value == load) == (name in exact), name
        assert_pass_keeps_bits(routine, after, {node: np.float32(x)})


def test_integer_identities():
    n = TNode("n", (), dtypes.int32)
    load = Load(n, ())
    for value in (Binary(Binop.ADD, load, Const(0, dtypes.int32)), Binary(Binop.SUB, load, Const(0, dtypes.int32)),
                  Binary(Binop.MUL, Const(1, dtypes.int32), load)):
        assert simplified_value(value, dtypes.int32) == load


def test_index_arithmetic_simplifies():
    i, j = Symbol(), Symbol()
    assert opt.normalize_index(Affine(((1, i),), 0)) == Iter(i)
    assert opt.normalize_index(Affine(((0, i), (2, j)), 1)) == Affine(((2, j),), 1)
    assert opt.normalize_index(Affine(((0, i),), 4)) == Fixed(4)
    assert opt.normalize_index(Affine(((1, i), (2, i)), 0)) == Affine(((3, i),), 0)
    assert substitute_index(Affine(((2, i),), 1), {i: Affine(((3, j),), 1)}) == Affine(((6, j),), 3)
    assert substitute_index(Affine(((2, i), (1, j)), -1), {i: Fixed(1)}) == Affine(((1, j),), 1)
    x, y = TNode("x", (4,)), TNode("y", (4,))
    body = loop(i, 4, Store(y, (Iter(i),), Load(x, (Affine(((1, i), (0, j)), 0),))))
    after = opt.simplify(RoutineIR("idx", body))
    assert after.body.body.value == Load(x, (Iter(i),))


def test_local_scopes_collapse():
    x = TNode("x", ())
    v, w = Local(dtypes.float32), Local(dtypes.float32)
    one_set = LocalScope(v, SetLocal(v, Binary(Binop.MUL, Load(x, ()), Const(2.0))))
    assert simplified_value(one_set) == Binary(Binop.MUL, Load(x, ()), Const(2.0))
    two_sets = LocalScope(w, seq(SetLocal(w, Const(0.0)), SetLocal(w, Ternary(
        Ternop.WHERE, Load(x, ()), Load(x, ()), GetLocal(w)))))
    assert simplified_value(two_sets) == Ternary(Ternop.WHERE, Load(x, ()), Load(x, ()), Const(0.0))
    u = Local(dtypes.float32)
    loop_scope = LocalScope(u, seq(SetLocal(u, Const(0.0)), loop(Symbol(), 3, SetLocal(u, Binary(
        Binop.ADD, GetLocal(u), Load(x, ()))))))
    assert simplified_value(loop_scope) == loop_scope


def test_where_with_a_constant_condition_picks_its_branch():
    x = TNode("x", ())
    assert simplified_value(Ternary(Ternop.WHERE, Const(1.0), Load(x, ()), Const(5.0))) == Load(x, ())
    assert simplified_value(Ternary(Ternop.WHERE, Const(0, dtypes.int32), Load(x, ()), Const(5.0))) == Const(5.0)


# ---------------------------------------------------------------------------------------------
# 4. Common subexpressions


def test_cse_computes_a_repeated_product_once():
    a, b, y = TNode("a", (3,)), TNode("b", (3,)), TNode("y", (3,))
    i = Symbol()
    product = lambda: Binary(Binop.MUL, Load(a, (Iter(i),)), Load(b, (Iter(i),)))  # noqa: E731
    routine = RoutineIR("cse", loop(i, 3, Store(y, (Iter(i),), Binary(Binop.ADD, product(), product()))))
    assert count_ops(routine, Binop.MUL) == 2
    after = opt.eliminate_common_subexpressions(routine)
    assert count_ops(after, Binop.MUL) == 1
    (body,) = top(after)
    declare, set_local, store = body.body.stmts
    assert isinstance(declare, DeclareLocal) and isinstance(set_local, SetLocal)
    assert store.value == Binary(Binop.ADD, GetLocal(declare.local), GetLocal(declare.local))
    assert_pass_keeps_bits(routine, after, {a: data(3), b: data(3)})


def test_cse_merges_alpha_equivalent_scopes_across_statements():
    """Two outputs summing the same source: one sum, declared before the
    first."""
    src, out1, out2 = TNode("src", (4,)), TNode("out1", ()), TNode("out2", ())

    def total():
        v, k = Local(dtypes.float32), Symbol()
        return LocalScope(v, loop(k, 4, SetLocal(v, Binary(Binop.ADD, GetLocal(v), Load(src, (Iter(k),))))))

    routine = RoutineIR("sums", seq(Store(out1, (), total()), Store(out2, (), total())))
    after = opt.eliminate_common_subexpressions(routine)
    declare, summing, store1, store2 = top(after)
    assert isinstance(declare, DeclareLocal) and isinstance(summing, For)
    assert store1.value == store2.value == GetLocal(declare.local)
    assert_pass_keeps_bits(routine, after, {src: data(4)})


def test_cse_does_not_merge_across_a_store_to_what_it_reads():
    x, y, z = TNode("x", ()), TNode("y", ()), TNode("z", ())
    twice = lambda: Binary(Binop.MUL, Load(x, ()), Const(2.0))  # noqa: E731
    routine = RoutineIR("barrier", seq(Store(y, (), twice()), Store(x, (), Const(5.0)), Store(z, (), twice())))
    assert opt.eliminate_common_subexpressions(routine) == routine
    # nor when the first user itself stores to what the expression reads
    routine = RoutineIR("self", seq(Store(x, (), twice()), Store(z, (), twice())))
    assert opt.eliminate_common_subexpressions(routine) == routine


def test_cse_does_not_hoist_out_of_conditional_branches_only():
    """``where(c, e, 0) + where(d, e, 1)``: neither occurrence always runs, so e stays."""
    c, x, y = TNode("c", ()), TNode("x", ()), TNode("y", ())
    e = lambda: Unary(Unop.EXP, Load(x, ()))  # noqa: E731
    value = Binary(Binop.ADD, Ternary(Ternop.WHERE, Load(c, ()), e(), Const(0.0)),
                   Ternary(Ternop.WHERE, Load(c, ()), e(), Const(1.0)))
    routine = RoutineIR("branches", Store(y, (), value))
    assert opt.eliminate_common_subexpressions(routine) == routine


def test_cse_keys_distinguish_signed_zeros_and_bijective_renaming():
    t = TNode("t", (3, 3))
    a, b, c = Symbol(), Symbol(), Symbol()
    key = opt._KeyCache().key  # keys compare within one cache
    assert key(Const(0.0)) != key(Const(-0.0))

    def scope(i, j):
        v = Local(dtypes.float32)
        return LocalScope(v, loop(i, 3, loop(j, 3, SetLocal(v, Load(t, (Iter(i), Iter(j)))))))

    assert key(scope(a, b)) == key(scope(b, c))
    v = Local(dtypes.float32)
    diagonal = LocalScope(v, loop(c, 3, loop(c, 3, SetLocal(v, Load(t, (Iter(c), Iter(c)))))))
    assert key(scope(a, b)) != key(diagonal)


# ---------------------------------------------------------------------------------------------
# 5. FMA formation


def test_cse_keys_read_the_fields_of_each_class_once(monkeypatch):
    """Keying every sub-expression of a routine asks each IR class for its fields once, not each
    node (``dataclasses.fields`` builds the list anew at every call)."""
    asked = []
    field_values = opt.field_values
    monkeypatch.setattr(opt, "field_values", lambda cls: asked.append(cls) or field_values(cls))
    opt._key_kind.cache_clear()
    a, b, y = TNode("a", (3,)), TNode("b", (3,)), TNode("y", (3,))
    i = Symbol()
    product = lambda: Binary(Binop.MUL, Load(a, (Iter(i),)), Unary(Unop.EXP, Load(b, (Iter(i),))))  # noqa: E731
    routine = RoutineIR("cse", loop(i, 3, Store(y, (Iter(i),), Binary(Binop.ADD, product(), product()))))
    assert count_ops(opt.eliminate_common_subexpressions(routine), Binop.MUL) == 1
    assert Binary in asked and Load in asked and len(asked) == len(set(asked))
    opt._key_kind.cache_clear()


def test_fma_only_under_the_fast_setting(monkeypatch):
    routine, (a, v), c, d = matvec_then_square()
    assert count_ops(opt.optimize(routine, keep={a, v, d}), Ternop.FMA) == 0
    fused = opt.optimize(routine, keep={a, v, d}, fast_math=True)
    assert count_ops(fused, Ternop.FMA) == 1
    monkeypatch.setenv("OCANNL_FAST_MATH", "1")  # read by the runtime, which passes it on; not here
    assert count_ops(opt.optimize(routine, keep={a, v, d}), Ternop.FMA) == 0
    values = {a: data(3, 4), v: data(4)}
    np.testing.assert_allclose(run_ir(fused, values)[d], run_ir(routine, values)[d], rtol=1e-5)


def test_fast_math_setting_parses_yes_and_no(monkeypatch, tmp_path):
    assert config.flag("fast_math") is False
    (tmp_path / "ocannl_config").write_text("fast_math = yes\n")
    assert config.flag("fast_math") is True
    monkeypatch.setenv("OCANNL_FAST_MATH", "0")
    assert config.flag("fast_math") is False
    monkeypatch.setenv("OCANNL_FAST_MATH", "maybe")
    with pytest.raises(OcannlError, match="fast_math"):
        config.flag("fast_math")


# ---------------------------------------------------------------------------------------------
# Frontend programs through the Context


def unoptimized_context(monkeypatch, *items):
    """A context that ran ``items`` without the optimizer: the oracle."""
    with monkeypatch.context() as m:
        m.setattr("ocannl.backends.context.optimize", lambda routine, keep=None, **_: routine)
        ctx = Context("interp")
        ctx.compile(*items).run()
    return ctx


def test_frontend_relu_chain_is_one_nest_without_intermediate_buffers(monkeypatch):
    a, b, c = (oc.tensor(data(4, 3), label=n) for n in "abc")
    product = a * b
    total = product + c
    y = oc.relu(total)
    for t in (product, total):
        mark_virtual(t.value)
    ctx = Context("interp")
    routine = ctx.compile(y)
    routine.run()
    (nest,) = top(routine.ir)
    assert isinstance(nest, For) and isinstance(nest.body, For) and isinstance(nest.body.body, Store)
    for t in (product, total):
        assert t.value not in routine.ir.reads + routine.ir.writes and not ctx.has_value(t.value)
        with pytest.raises(SessionError, match="virtualized"):
            ctx.get(t.value)
    assert same_bits(ctx.get(y.value), unoptimized_context(monkeypatch, y).get(y.value))


def test_frontend_intermediates_are_inlined_unless_materialized(monkeypatch):
    da, db = data(3), data(3)
    a, b = oc.tensor(da, label="a"), oc.tensor(db, label="b")
    product = a * b
    y = oc.relu(product + 1.0)
    ctx = Context("interp")
    routine = ctx.compile(y)
    routine.run()
    assert len(top(routine.ir)) == 1  # the frontend marks op results virtual: one nest
    assert same_bits(ctx.get(y.value), unoptimized_context(monkeypatch, y).get(y.value))
    assert np.array_equal(product.numpy(), da * db)  # recomputed on demand

    a2, b2 = oc.tensor(data(3), label="a2"), oc.tensor(data(3), label="b2")
    kept = (a2 * b2).materialize()
    y2 = oc.relu(kept + 1.0)
    routine2 = ctx.compile(y2)
    routine2.run()
    assert len(top(routine2.ir)) == 2 and kept.value not in routine2._inlined


def test_frontend_cse_computes_a_times_b_once(monkeypatch):
    a, b = oc.tensor(data(2, 3), label="a"), oc.tensor(data(2, 3), label="b")
    left, right = a * b, a * b
    y = left + right
    mark_virtual(left.value)
    mark_virtual(right.value)
    ctx = Context("interp")
    routine = ctx.compile(y)
    routine.run()
    assert count_ops(routine.ir, Binop.MUL) == 1
    assert same_bits(ctx.get(y.value), unoptimized_context(monkeypatch, y).get(y.value))


def test_frontend_constant_folding(monkeypatch):
    x = oc.tensor(data(2, 3), label="x")
    six = oc.number(2.0) * oc.number(3.0)
    y = x * six
    mark_virtual(six.value)
    ctx = Context("interp")
    routine = ctx.compile(y)
    routine.run()
    assert "(x[i0, i1] * 6.0)" in format_routine(routine.ir)
    assert six.value not in routine.ir.reads
    assert same_bits(ctx.get(y.value), unoptimized_context(monkeypatch, y).get(y.value))


def test_frontend_matmul_squared_is_the_worked_example(monkeypatch, tmp_path):
    """``c = a @ b`` virtual, ``d = c * c``: one loop over d, the reduction
    computed once per cell into a local, no buffer for c."""
    a = oc.tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 7, input=1, label="a")
    b = oc.tensor(np.arange(4, dtype=np.float32) / 3, label="b")
    c = a @ b
    d = c * c
    mark_virtual(c.value)
    ctx = Context("interp", debug_dir=tmp_path)
    routine = ctx.compile(d)
    routine.run()
    (nest,) = top(routine.ir)
    declare, reset, reduction, store = nest.body.stmts
    assert isinstance(declare, DeclareLocal) and reset == SetLocal(declare.local, Const(0.0))
    assert isinstance(reduction, For) and isinstance(store, Store)
    assert store.value == Binary(Binop.MUL, GetLocal(declare.local), GetLocal(declare.local))
    assert c.value not in routine.ir.reads + routine.ir.writes
    assert same_bits(ctx.get(d.value), unoptimized_context(monkeypatch, d).get(d.value))
    name = routine.name
    assert "compose[" in (tmp_path / f"{name}-unoptimized.ll").read_text()
    assert "compose" not in (tmp_path / f"{name}.ll").read_text()


def test_virtual_node_read_as_output_is_stored():
    """``t.numpy()`` of a node marked virtual compiles a routine where it is the output."""
    set_default_context(Context("interp"))
    a = oc.tensor(data(3), label="a")
    m = a * 2.0
    mark_virtual(m.value)
    assert same_bits(m.numpy(), (a.numpy() * np.float32(2.0)).astype(np.float32))


def test_mark_materialized_keeps_a_node():
    a = oc.tensor(data(3), label="a")
    m = a * 2.0
    y = m + 1.0
    mark_virtual(m.value)
    mark_materialized(m.value)
    assert m.value.memory_mode is MemoryMode.MATERIALIZED
    mark_virtual(m.value)  # a request to materialize wins
    assert m.value.memory_mode is MemoryMode.MATERIALIZED
    ctx = Context("interp")
    ctx.compile(y).run()
    assert same_bits(ctx.get(m.value), (ctx.get(a.value) * np.float32(2.0)).astype(np.float32))


def test_a_later_routine_reading_an_inlined_node_is_an_error():
    x, m, y, z = TNode("x", (3,)), TNode("m", (3,), memory_mode=MemoryMode.VIRTUAL), TNode("y", (3,)), TNode("z", (3,))
    ctx = Context("interp")
    ctx.set(x, np.arange(3, dtype=np.float32))
    first = ctx.compile(Computation("first", Block((pointwise(m, Binop.MUL, x, 2.0), pointwise(y, Unop.EXP, m)))))
    assert m not in first.ir.writes
    later = ctx.compile(Computation("later", pointwise(z, Unop.NEG, m)))
    first.run()
    with pytest.raises(SessionError, match="routine first computed it inline"):
        later.run()
    # a routine compiled after one that reads m as an input keeps m
    again = ctx.compile(Computation("again", Block((pointwise(m, Binop.MUL, x, 2.0), pointwise(y, Unop.EXP, m)))))
    assert m in again.ir.writes
    again.run()
    later.run()
    assert same_bits(ctx.get(z), -(np.arange(3, dtype=np.float32) * np.float32(2.0)))


def test_a_node_read_only_in_a_dead_branch_is_not_reported_virtualized():
    x, y = TNode("x", (3,)), TNode("y", (3,))
    i = Symbol()
    ctx = Context("interp")
    ctx.set(x, np.arange(3, dtype=np.float32))
    select = accum(y, None, Ternop.WHERE, (0.0, x, 1.0), [(i, 3)], (Iter(i),), ((), (Iter(i),), ()))
    routine = ctx.compile(Computation("dead", select))
    routine.run()
    assert x not in routine.ir.reads and routine._inlined == frozenset()
    assert same_bits(ctx.get(x), np.arange(3, dtype=np.float32))
    assert same_bits(ctx.get(y), np.ones(3, np.float32))


# ---------------------------------------------------------------------------------------------
# The whole optimizer on the conformance catalog, with every node allowed to be virtual


def run_catalog_program(program, monkeypatch, mode):
    session.reset()
    items = list(program.build())
    with monkeypatch.context() as m:
        if mode == "unoptimized":
            m.setattr("ocannl.backends.context.optimize", lambda routine, keep=None, **_: routine)
        else:
            m.setattr("ocannl.backends.context.materialized_nodes", lambda routine: set())
            if mode == "fast":
                m.setenv("OCANNL_FAST_MATH", "1")
        ctx = Context("interp")
        routine = ctx.compile(*items)
        for bindings in program.runs:
            routine.run(**bindings)
    return {n.name: ctx.get(n) for n in routine.ir.writes}, routine


def catalog_programs():
    return testing.catalog() + [testing.random_einsum_program(np.random.default_rng(3), i) for i in range(10)]


def test_catalog_is_bit_identical_with_everything_virtualizable(monkeypatch):
    inlined = 0
    for program in catalog_programs():
        want, _ = run_catalog_program(program, monkeypatch, "unoptimized")
        got, routine = run_catalog_program(program, monkeypatch, "all")
        inlined += len(routine._inlined)
        assert set(want) == set(got) | {n.name for n in routine._inlined}, program.name
        for name, array in got.items():
            assert same_bits(array, want[name]), f"{program.name}: {name}"
    assert inlined > 100


def test_catalog_under_fast_math_stays_close(monkeypatch):
    for program in catalog_programs():
        want, _ = run_catalog_program(program, monkeypatch, "unoptimized")
        got, _ = run_catalog_program(program, monkeypatch, "fast")
        for name, array in got.items():
            if array.dtype.kind == "f":
                np.testing.assert_allclose(array, want[name], rtol=1e-4, atol=1e-5, err_msg=f"{program.name}: {name}")
            else:
                assert same_bits(array, want[name]), f"{program.name}: {name}"


# ---------------------------------------------------------------------------------------------
# Random loop programs: pointwise nests, reductions (reset inside or filled first), accumulation
# into inputs, overwritten inputs, padded and shifted reads, with a random set of kept nodes.


def random_program(rng: np.random.Generator):
    shapes = [(3,), (3, 4), (), (1, 4), (4, 3)]
    nodes = [TNode(f"in{k}", shapes[rng.integers(len(shapes))]) for k in range(3)]
    statements = []
    for n in range(int(rng.integers(2, 7))):
        kind = ["pointwise", "pointwise", "reduce", "reduce after fill", "accumulate", "overwrite"][rng.integers(6)]
        if kind == "overwrite":
            out = nodes[rng.integers(len(nodes))]
        else:
            out = TNode(f"n{n}", shapes[rng.integers(len(shapes))])
        symbols = [Symbol() if d > 1 else None for d in out.dims]
        index = tuple(Fixed(0) if s is None else Iter(s) for s in symbols)
        loops = [(s, d) for s, d in zip(symbols, out.dims) if s is not None]
        reduction = [(Symbol(), 5)] if kind.startswith("reduce") else []
        readable = [m for m in nodes if m is not out or kind == "overwrite"]

        def read(node):
            indices, padded = [], False
            for d in node.dims:
                matching = [s for s, e in loops + reduction if e == d]
                r = rng.random()
                if d > 1 and matching and r < 0.75:
                    indices.append(Iter(matching[rng.integers(len(matching))]))
                elif d > 1 and matching and r < 0.9:
                    indices.append(Affine(((1, matching[rng.integers(len(matching))]),), int(rng.choice([1, -1]))))
                    padded = True
                else:
                    indices.append(Fixed(int(rng.integers(d))))
            return Load(node, tuple(indices), 0.0 if padded else None)

        def value(depth=0):
            r = rng.random()
            if r < 0.2 or depth > 2:
                return Const(float(rng.choice([0.0, -0.0, 1.0, 2.5, -1.0])))
            if r < 0.55:
                return read(readable[rng.integers(len(readable))])
            if r < 0.65:
                return Unary([Unop.EXP, Unop.RELU, Unop.NEG][rng.integers(3)], value(depth + 1))
            if r < 0.7:
                return Ternary(Ternop.WHERE, value(depth + 1), value(depth + 1), value(depth + 1))
            op = [Binop.ADD, Binop.MUL, Binop.SUB, Binop.MAX][rng.integers(4)]
            return Binary(op, value(depth + 1), value(depth + 1))

        def nest(body, extra=()):
            for s, d in reversed(list(loops) + list(extra)):
                body = loop(s, d, body)
            return body

        if kind in ("pointwise", "overwrite"):
            statements.append(nest(Store(out, index, value())))
        else:
            accumulate = Store(out, index, Binary(Binop.ADD, Load(out, index), value()))
            if kind == "accumulate":
                statements.append(nest(accumulate))
            elif kind == "reduce":
                statements.append(nest(seq(Store(out, index, Const(0.0)), loop(*reduction[0], accumulate))))
            else:
                statements += [Fill(out, Const(0.0)), loop(*reduction[0], nest(accumulate))]
        if out not in nodes:
            nodes.append(out)
    return RoutineIR("random", seq(*statements)), nodes


@pytest.mark.parametrize("seed", range(40))
def test_random_programs_keep_their_bits(seed):
    rng = np.random.default_rng(seed)
    inlined = 0
    for _ in range(10):
        routine, nodes = random_program(rng)
        keep = {n for n in nodes if rng.random() < 0.2}
        values = {n: rng.standard_normal(n.dims).astype(np.float32) for n in nodes}
        after = opt.optimize(routine, keep)
        inlined += len(opt.inlined_nodes(routine, after))
        assert not opt.inlined_nodes(routine, after) & keep
        assert_pass_keeps_bits(routine, after, values)
