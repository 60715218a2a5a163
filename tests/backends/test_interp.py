"""The interpreter against numpy: hand-built programs lowered and run, compared with references
computed the same way (float32 sequential sums) or directly."""

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from handbuilt import accum, matvec, padded_conv1d, pointwise
from ocannl.backends.context import Context
from ocannl.errors import OutOfBoundsError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import (
    Block, Computation, Constant, EmbedSymbol, Fetch, Gather, RangeOverOffsets, ScatterAdd, Slice, Values,
)
from ocannl.lowlevel.indexing import Affine, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Const, DeclareLocal, Fill, GetLocal, Load, LoadDynamic, Local, LocalScope, RoutineIR, SetLocal, Store,
    Ternary, loop, seq,
)
from ocannl.lowlevel.scalar_ops import PRNG_OPS, Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode

RNG = np.random.default_rng(7)


def run(*assignments, inputs=None, **bindings) -> Context:
    ctx = Context("interp")
    for node, value in (inputs or {}).items():
        ctx.set(node, value)
    ctx.compile(Computation("test", Block(assignments))).run(**bindings)
    return ctx


def test_matvec_is_bit_exact_float32():
    a, v, c = TNode("a", (3, 4)), TNode("v", (4,)), TNode("c", (3,))
    A, V = RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal(4).astype(np.float32)
    ctx = run(matvec(a, v, c), inputs={a: A, v: V})
    expected = []
    for i in range(3):
        total = np.float32(0)
        for k in range(4):
            total = total + A[i, k] * V[k]  # one float32 rounding per operation, in loop order
        expected.append(total)
    assert ctx.get(c).tobytes() == np.array(expected, dtype=np.float32).tobytes()


def test_broadcast_add():
    x, b, y = TNode("x", (2, 3)), TNode("b", (1, 3)), TNode("y", (2, 3))
    i, j = Symbol(), Symbol()
    asg = accum(y, None, Binop.ADD, (x, b), [(i, 2), (j, 3)], (Iter(i), Iter(j)), ((Iter(i), Iter(j)),) * 2)
    X, B = RNG.standard_normal((2, 3)), RNG.standard_normal((1, 3))
    ctx = run(asg, inputs={x: X, b: B})
    np.testing.assert_array_equal(ctx.get(y), X.astype(np.float32) + B.astype(np.float32))


def test_sum_reduction():
    x, s = TNode("x", (4, 5)), TNode("s", ())
    i, j = Symbol(), Symbol()
    X = np.arange(20.0).reshape(4, 5)
    ctx = run(accum(s, Binop.ADD, Unop.ID, (x,), [(i, 4), (j, 5)], (), ((Iter(i), Iter(j)),), init=True),
              inputs={x: X})
    assert ctx.get(s).shape == () and ctx.get(s) == 190


@pytest.mark.parametrize("stride,pad,n_out", [(2, 1, 4), (2, 0, 3), (1, 1, 7)])
def test_padded_conv1d_matches_numpy(stride, pad, n_out):
    x, w, y = TNode("x", (7,)), TNode("w", (3,)), TNode("y", (n_out,))
    X, W = RNG.standard_normal(7), RNG.standard_normal(3)
    ctx = run(padded_conv1d(x, w, y, stride, pad), inputs={x: X, w: W})
    padded = np.pad(X.astype(np.float32), (pad, 3))
    expected = [padded[stride * o: stride * o + 3] @ W.astype(np.float32) for o in range(n_out)]
    np.testing.assert_allclose(ctx.get(y), expected, rtol=1e-6)


def test_max_reduction_and_neutral_fill():
    x, m, cell = TNode("x", (2, 3)), TNode("m", (2,)), TNode("cell", (3,))
    i, j, k = Symbol(), Symbol(), Symbol()
    X = -RNG.random((2, 3)) - 1  # all negative: a 0 reset would be wrong
    ctx = run(
        accum(m, Binop.MAX, Unop.ID, (x,), [(i, 2), (j, 3)], (Iter(i),), ((Iter(i), Iter(j)),), init=True),
        accum(cell, Binop.MAX, Unop.ID, (x,), [(k, 3)], (Fixed(0),), ((Fixed(1), Iter(k)),), init=True),
        inputs={x: X},
    )
    X32 = X.astype(np.float32)
    np.testing.assert_array_equal(ctx.get(m), X32.max(axis=1))
    np.testing.assert_array_equal(ctx.get(cell), [X32[1].max(), -np.inf, -np.inf])


def test_max_pool_padding_reads_minus_infinity():
    x, y = TNode("x", (4,)), TNode("y", (2,))
    o, k = Symbol(), Symbol()
    asg = accum(y, Binop.MAX, Unop.ID, (x,), [(o, 2), (k, 3)], (Iter(o),),
                ((Affine(((2, o), (1, k)), -1),),), init=True)
    ctx = run(asg, inputs={x: [-5.0, -6.0, -7.0, -8.0]})
    np.testing.assert_array_equal(ctx.get(y), [-5.0, -6.0])  # the margin is -inf, not 0


def test_gather_and_scatter_add():
    table, ids = TNode("table", (5, 3)), TNode("ids", (2, 2))
    emb, g, table_grad = TNode("emb", (2, 2, 3)), TNode("g", (2, 2, 3)), TNode("table grad", (5, 3))
    T, ID, G = RNG.standard_normal((5, 3)), np.array([[4, 0], [4, 2]]), RNG.standard_normal((2, 2, 3))
    ctx = run(Gather(emb, table, ids), ScatterAdd(table_grad, ids, g), inputs={table: T, ids: ID, g: G})
    np.testing.assert_array_equal(ctx.get(emb), T.astype(np.float32)[ID])
    expected = np.zeros((5, 3), np.float32)
    np.add.at(expected, ID, G.astype(np.float32))
    np.testing.assert_array_equal(ctx.get(table_grad), expected)


def test_gather_with_integer_indices_and_out_of_range():
    table, ids, out = TNode("table", (3, 2)), TNode("ids", (2,), dtypes.int32), TNode("out", (2, 2))
    ctx = run(Gather(out, table, ids), inputs={table: np.arange(6.0).reshape(3, 2), ids: [2, 0]})
    np.testing.assert_array_equal(ctx.get(out), [[4, 5], [0, 1]])
    with pytest.raises(OutOfBoundsError, match=r"read of table at index \(3, 0\): its dims are \(3, 2\)"):
        run(Gather(out, table, ids), inputs={table: np.zeros((3, 2)), ids: [1, 3]})


def test_slice_by_index_symbol_bound_at_run_time():
    batch_n = IndexSymbol("batch_n", 4)
    xs, x, doubled = TNode("xs", (4, 3)), TNode("x", (3,)), TNode("doubled", (3,))
    XS = RNG.standard_normal((4, 3))
    ctx = Context("interp")
    ctx.set(xs, XS)
    routine = ctx.compile(Computation("step", Block((Fetch(x, Slice(xs, batch_n)),
                                                     pointwise(doubled, Binop.MUL, x, 2.0)))))
    for n in (2, 0, 3):
        routine.run(batch_n=n)
        np.testing.assert_array_equal(ctx.get(doubled), XS[n].astype(np.float32) * 2)
    assert ctx.stats.compilations == 1 and ctx.stats.runs == 3


def test_fetches():
    step = IndexSymbol("step_n", 10)
    r, e, v, c = TNode("r", (2, 3)), TNode("e", (2,)), TNode("v", (2, 2)), TNode("c", (2,), dtypes.int32)
    ctx = run(Fetch(r, RangeOverOffsets()), Fetch(e, EmbedSymbol(step)), Fetch(v, Values((1.5, -2.0, 3.0))),
              Fetch(c, Constant(7)), step_n=6)
    np.testing.assert_array_equal(ctx.get(r), np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(ctx.get(e), [6.0, 6.0])
    np.testing.assert_array_equal(ctx.get(v), [[1.5, -2.0], [3.0, 1.5]])
    np.testing.assert_array_equal(ctx.get(c), [7, 7])


def test_float16_and_bfloat16_round_on_every_store():
    x = TNode("x", (4,))
    h, b = TNode("h", (4,), dtypes.float16), TNode("b", (4,), dtypes.bfloat16)
    h2 = TNode("h2", (4,), dtypes.float16)
    X = np.array([0.1, 1 / 3, 1000.7, -2.3e-3], dtype=np.float32)
    third = np.float32(1 / 3)
    ctx = run(pointwise(h, Binop.MUL, x, 1 / 3), pointwise(b, Binop.MUL, x, 1 / 3),
              pointwise(h2, Binop.ADD, h, h), inputs={x: X})
    products = X * third  # computed in float32 ...
    assert ctx.get(h).dtype == np.float16
    np.testing.assert_array_equal(ctx.get(h), products.astype(np.float16))  # ... rounded on store
    bits = dtypes.float32_to_bfloat16_bits(products)
    np.testing.assert_array_equal(ctx.get(b), dtypes.bfloat16_bits_to_float32(bits))
    halves = products.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(ctx.get(h2), (halves + halves).astype(np.float16))


def test_int32_arithmetic_follows_c():
    a, b = TNode("a", (4,), dtypes.int32), TNode("b", (4,), dtypes.int32)
    q, r, s = (TNode(n, (4,), dtypes.int32) for n in "qrs")
    A, B = [-7, 7, -7, 2**31 - 1], [2, -2, -2, 1]
    ctx = run(pointwise(q, Binop.DIV, a, b), pointwise(r, Binop.MOD, a, b), pointwise(s, Binop.ADD, a, b),
              inputs={a: A, b: B})
    assert ctx.get(q).tolist() == [-3, -3, 3, 2**31 - 1]  # truncation toward zero
    assert ctx.get(r).tolist() == [-1, 1, -1, 0]  # the sign of the dividend
    assert ctx.get(s).tolist() == [-5, 5, -9, -(2**31)]  # wraps around
    assert ctx.get(q).dtype == np.int32


def test_reset_then_subtract_or_divide_once():
    x, neg, inv = TNode("x", (2,)), TNode("neg", (2,)), TNode("inv", (2,))
    ctx = run(pointwise(neg, Unop.ID, x, acc=Binop.SUB, init=True),
              pointwise(inv, Unop.ID, x, acc=Binop.DIV, init=True), inputs={x: [2.0, -4.0]})
    assert ctx.get(neg).tolist() == [-2.0, 4.0] and ctx.get(inv).tolist() == [0.5, -0.25]


def test_float_to_int_store_truncates():
    x, k = TNode("x", (3,)), TNode("k", (3,), dtypes.int32)
    ctx = run(pointwise(k, Unop.ID, x), inputs={x: [2.7, -2.7, 0.5]})
    assert ctx.get(k).tolist() == [2, -2, 0]


FLOAT32_UNARY = {
    Unop.EXP: np.exp, Unop.LOG: np.log, Unop.EXP2: np.exp2, Unop.LOG2: np.log2, Unop.SIN: np.sin,
    Unop.COS: np.cos, Unop.SQRT: np.sqrt, Unop.TANH: np.tanh, Unop.NEG: np.negative, Unop.ABS: np.abs,
    Unop.RECIP: lambda x: np.float32(1) / x, Unop.RECIP_SQRT: lambda x: np.float32(1) / np.sqrt(x),
    Unop.SIGMOID: lambda x: np.float32(1) / (np.float32(1) + np.exp(-x)),
    Unop.ERF: np.vectorize(math.erf, otypes=[np.float64]),
    Unop.RELU: lambda x: np.maximum(x, np.float32(0)),
    Unop.SAT01: lambda x: np.minimum(np.maximum(x, np.float32(0)), np.float32(1)),
    Unop.NOT: lambda x: (x == 0).astype(np.float32), Unop.ID: lambda x: x,
}


@pytest.mark.parametrize("op", [op for op in Unop if op not in PRNG_OPS], ids=lambda op: op.value)
def test_unary_ops(op):
    X = np.array([0.25, 0.5, 1.5, 3.0, 0.0, 2.0, -0.75], dtype=np.float32)
    x, y = TNode("x", (7,)), TNode("y", (7,))
    ctx = run(pointwise(y, op, x), inputs={x: X})
    with np.errstate(all="ignore"):
        expected = FLOAT32_UNARY[op](X).astype(np.float32)
    np.testing.assert_array_equal(ctx.get(y), expected)


FLOAT32_BINARY = {
    Binop.ADD: np.add, Binop.SUB: np.subtract, Binop.MUL: np.multiply, Binop.DIV: np.divide,
    Binop.POW: np.power, Binop.MAX: np.fmax, Binop.MIN: np.fmin, Binop.MOD: np.fmod,
    Binop.LT: np.less, Binop.GT: np.greater, Binop.EQ: np.equal, Binop.NE: np.not_equal,
    Binop.AND: np.logical_and, Binop.OR: np.logical_or,
    Binop.RELU_GATE: lambda a, b: np.where(a > 0, b, 0),
    Binop.SAT01_GATE: lambda a, b: np.where((0 < a) & (a < 1), b, 0),
}


@pytest.mark.parametrize("op", [op for op in Binop if op not in PRNG_OPS], ids=lambda op: op.value)
def test_binary_ops(op):
    A = np.array([0.5, -1.5, 2.0, 0.0, 3.0, np.nan], dtype=np.float32)
    B = np.array([2.0, 0.25, 2.0, -1.0, np.nan, 1.0], dtype=np.float32)
    a, b, y = TNode("a", (6,)), TNode("b", (6,)), TNode("y", (6,))
    ctx = run(pointwise(y, op, a, b), inputs={a: A, b: B})
    with np.errstate(all="ignore"):
        expected = FLOAT32_BINARY[op](A, B).astype(np.float32)
    np.testing.assert_array_equal(ctx.get(y), expected)


def correctly_rounded_float32(exact: Fraction) -> np.float32:
    """The float32 nearest to ``exact``, ties to even, found by comparing neighbours."""
    guess = np.float32(float(exact))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    best = min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), int(c.view(np.uint32)) & 1))
    return np.float32(best)


def test_fma_rounds_once():
    a, b, c, y = (TNode(n, (1,)) for n in "abcy")
    one_plus = np.float32(1 + 2**-12)
    ctx = run(pointwise(y, Ternop.FMA, a, b, c), inputs={a: [one_plus], b: [one_plus], c: [-1.0]})
    assert ctx.get(y)[0] == 2**-11 + 2**-24  # a * b + c with two roundings gives 2**-11
    scales = 1e3 ** RNG.integers(-2, 3, (200, 3))
    triples = (RNG.standard_normal((200, 3)) * scales).astype(np.float32)
    n = len(triples)
    a, b, c, y = TNode("a", (n,)), TNode("b", (n,)), TNode("c", (n,)), TNode("y", (n,))
    ctx = run(pointwise(y, Ternop.FMA, a, b, c),
              inputs={a: triples[:, 0], b: triples[:, 1], c: triples[:, 2]})
    expected = [correctly_rounded_float32(Fraction(float(p)) * Fraction(float(q)) + Fraction(float(r)))
                for p, q, r in triples]
    np.testing.assert_array_equal(ctx.get(y), expected)


def test_mul3_multiplies_left_to_right():
    a, b, c, y = (TNode(n, (2,)) for n in "abcy")
    A, B, C = (RNG.standard_normal(2).astype(np.float32) for _ in range(3))
    ctx = run(pointwise(y, Ternop.MUL3, a, b, c), inputs={a: A, b: B, c: C})
    np.testing.assert_array_equal(ctx.get(y), (A * B) * C)


def test_fma_float64():
    a, b, c, y = (TNode(n, (1,), dtypes.float64) for n in "abcy")
    x = 1 + 2**-30
    ctx = run(pointwise(y, Ternop.FMA, a, b, c), inputs={a: [x], b: [x], c: [-1.0]})
    assert ctx.get(y)[0] == 2**-29 + 2**-60


def test_where_evaluates_only_the_chosen_branch():
    table, out = TNode("table", (2,)), TNode("out", ())
    bad = LoadDynamic(table, 0, Const(5, dtypes.int32), ())
    routine = RoutineIR("guarded", Store(out, (), Ternary(Ternop.WHERE, Const(0.0), bad, Const(1.0))))
    ctx = Context("interp")
    ctx.backend.compile(routine).run({table: np.zeros(2, np.float32), out: np.zeros((), np.float32)}, {})


def test_out_of_bounds_store_names_buffer_index_and_statement():
    y = TNode("y", (3, 2))
    i, j = Symbol(), Symbol()
    body = loop(i, 4, loop(j, 2, Store(y, (Iter(i), Iter(j)), Const(1.0))))
    exe = Context("interp").backend.compile(RoutineIR("overflow", body))
    with pytest.raises(OutOfBoundsError) as info:
        exe.run({y: np.zeros((3, 2), np.float32)}, {})
    message = str(info.value)
    assert "write of y at index (3, 0): its dims are (3, 2)" in message
    assert "in routine overflow, statement: y[i0, i1] := 1.0;" in message
    assert "with i0=3, i1=0" in message


def test_out_of_bounds_read_through_an_index_symbol():
    s = IndexSymbol("k")  # no size: the run cannot check the binding
    x, y = TNode("x", (2,)), TNode("y", ())
    exe = Context("interp").backend.compile(RoutineIR("unsized", Store(y, (), Load(x, (Iter(s),)))))
    with pytest.raises(OutOfBoundsError, match=r"read of x at index \(2,\).*\n.*\n  with k=2"):
        exe.run({x: np.zeros(2, np.float32), y: np.zeros((), np.float32)}, {s: 2})


def test_locals():
    x, total, scoped = TNode("x", (4,)), TNode("total", ()), TNode("scoped", ())
    i, j = Symbol(), Symbol()
    acc, inner = Local(dtypes.float32), Local(dtypes.float32)
    body = seq(
        DeclareLocal(acc),
        loop(i, 4, SetLocal(acc, Binary(Binop.ADD, GetLocal(acc), Load(x, (Iter(i),))))),
        Store(total, (), GetLocal(acc)),
        Store(scoped, (), LocalScope(inner, loop(j, 4, SetLocal(inner, Binary(Binop.MAX, GetLocal(inner),
                                                                               Load(x, (Iter(j),))))))),
    )
    buffers = {x: np.array([1, 5, 2, 3], np.float32), total: np.zeros((), np.float32),
               scoped: np.zeros((), np.float32)}
    Context("interp").backend.compile(RoutineIR("locals", body)).run(buffers, {})
    assert (buffers[total], buffers[scoped]) == (11, 5)


def test_uint4x32_values_round_trip():
    seed, copy = TNode("seed", (2,), dtypes.uint4x32), TNode("copy", (2,), dtypes.uint4x32)
    i = Symbol()
    body = seq(Fill(seed, Const((1, 2, 3, 2**32 - 1), dtypes.uint4x32)),
               loop(i, 2, Store(copy, (Iter(i),), Load(seed, (Iter(i),)))))
    ctx = Context("interp")
    buffers = {seed: np.zeros((2, 4), np.uint32), copy: np.zeros((2, 4), np.uint32)}
    ctx.backend.compile(RoutineIR("bits", body)).run(buffers, {})
    assert buffers[copy].tolist() == [[1, 2, 3, 2**32 - 1]] * 2


def test_nan_semantics_of_max_and_relu():
    x, m, r = TNode("x", (1,)), TNode("m", (1,)), TNode("r", (1,))
    ctx = run(pointwise(m, Binop.MAX, x, 1.0), pointwise(r, Unop.RELU, x), inputs={x: [np.nan]})
    assert ctx.get(m)[0] == 1.0 and ctx.get(r)[0] == 0.0  # as C's fmaxf


def test_throughput_script_runs():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        import interp_throughput
    finally:
        sys.path.pop(0)
    rate = interp_throughput.matmul_ops_per_second(8)
    assert rate > 0 and math.isfinite(rate)
