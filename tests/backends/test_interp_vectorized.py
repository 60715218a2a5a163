"""The vectorized interpreter against the scalar one, bit for bit: the whole conformance catalog,
gathers and scatter-adds with repeated rows, the PRNG, conditionals, sums whose order shows in
the result, errors, and training steps of a CNN and a transformer."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocannl import testing
from ocannl.backends.context import Context
from ocannl.backends.interp.interpreter import InterpBackend, InterpExecutable
from ocannl.backends.interp.vectorized import VectorizedExecutable, carries_no_dependence
from ocannl.errors import OcannlError, OutOfBoundsError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.indexing import Affine, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Const, DeclareLocal, EmbedIndex, Fill, GetLocal, Load, LoadDynamic, Local, LocalScope, RoutineIR,
    SetLocal, Store, StoreDynamic, Ternary, Unary, loop, seq,
)
from ocannl.lowlevel.scalar_ops import PRNG_OPS, Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ and examples/

RNG = np.random.default_rng(11)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bits, except that a NaN equals any NaN: which NaN (sign, payload) an operation on two
    NaNs returns is left open, as IEEE 754 and C leave it (numpy's scalar and array loops pass
    on different operands)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        if not np.array_equal(nan, np.isnan(b)):
            return False
        a, b = np.where(nan, 0, a), np.where(nan, 0, b)
    return a.tobytes() == b.tobytes()


def run_both(routine: RoutineIR, inputs: dict, bindings: dict | None = None) -> dict:
    """Run ``routine`` on the scalar and the vectorized interpreter from the same buffers (zeros
    where ``inputs`` gives none); assert every buffer ends with the same bits, or both runs raise
    the same error with the same message and leave the same bits. Returns the scalar buffers."""
    nodes = dict.fromkeys(routine.reads + routine.writes)
    symbols = {s: v for s, v in (bindings or {}).items()}
    results = []
    for executable in (InterpExecutable(routine), VectorizedExecutable(routine)):
        buffers = {}
        for node in nodes:
            shape = node.dims + ((4,) if node.dtype is dtypes.uint4x32 else ())
            value = inputs.get(node)
            buffers[node] = (np.zeros(shape, node.dtype.storage) if value is None
                             else np.ascontiguousarray(np.asarray(value).astype(node.dtype.storage)).copy())
        try:
            executable.run(buffers, symbols)
            error = None
        except Exception as e:  # noqa: BLE001 - compared between the two modes
            error = (type(e), str(e))
        results.append((buffers, error))
    (scalar, scalar_error), (vector, vector_error) = results
    assert vector_error == scalar_error
    for node in nodes:
        assert same_bits(vector[node], scalar[node]), f"{node.debug_name}: {vector[node]} != {scalar[node]}"
    if scalar_error is not None:
        raise scalar_error[0](scalar_error[1])
    return scalar


# ---------------------------------------------------------------------------------------------
# The conformance catalog


def _run_in_mode(program: testing.Program, mode: str) -> dict[str, np.ndarray]:
    previous = os.environ.get("OCANNL_INTERP_MODE")
    os.environ["OCANNL_INTERP_MODE"] = mode
    try:
        return testing.run_program(program, "interp")
    finally:
        if previous is None:
            del os.environ["OCANNL_INTERP_MODE"]
        else:
            os.environ["OCANNL_INTERP_MODE"] = previous


def _programs() -> list[testing.Program]:
    rng = np.random.default_rng(3)
    return testing.catalog() + [testing.random_einsum_program(rng, i) for i in range(12)]


@pytest.mark.parametrize("program", _programs(), ids=lambda p: p.name)
def test_catalog_program_bit_for_bit(program):
    scalar, vector = _run_in_mode(program, "scalar"), _run_in_mode(program, "vectorized")
    assert scalar.keys() == vector.keys()
    for name, want in scalar.items():
        assert same_bits(vector[name], want), name


# ---------------------------------------------------------------------------------------------
# Gathers, scatter-adds, PRNG, conditionals


def _take_and_scatter(rows: int, ids: np.ndarray, width: int = 3):
    table, index = TNode("table", (rows, width)), TNode("ids", ids.shape, dtypes.int32)
    out, grad = TNode("out", ids.shape + (width,)), TNode("table.grad", (rows, width))
    source = TNode("out.grad", ids.shape + (width,))
    b, c = Symbol(), Symbol()
    position = Load(index, (Iter(b),))
    body = seq(
        loop(b, ids.shape[0], loop(c, width, Store(out, (Iter(b), Iter(c)),
                                                 LoadDynamic(table, 0, position, (Iter(c),))))),
        loop(b, ids.shape[0], loop(c, width, StoreDynamic(
            grad, 0, position, (Iter(c),),
            Binary(Binop.ADD, LoadDynamic(grad, 0, position, (Iter(c),)), Load(source, (Iter(b), Iter(c))))))),
    )
    return RoutineIR("take", body), table, index, grad, source


def test_scatter_add_with_repeated_rows_adds_in_loop_order():
    ids = np.array([2, 0, 2, 2, 1, 2], np.int32)
    routine, table, index, grad, source = _take_and_scatter(3, ids)
    magnitudes = np.array([1e8, 1.0, -1e8, 1.0, 3.0, 0.5], np.float32)[:, None] * np.ones(3, np.float32)
    out = run_both(routine, {table: RNG.standard_normal((3, 3)), index: ids, source: magnitudes})
    expected = np.zeros(3, np.float32)
    for v in magnitudes[ids == 2, 0]:
        expected[0] = expected[0] + v
    assert out[grad][2, 0] == expected[0]  # ((1e8 + -1e8) + 1) + 0.5, not a reassociated sum


def test_gather_out_of_range_raises_the_scalar_error_and_leaves_the_same_bits():
    routine, table, index, grad, source = _take_and_scatter(3, np.zeros(4, np.int32))
    with pytest.raises(OutOfBoundsError, match=r"read of table at index \(3, 0\): its dims are \(3, 3\)"):
        run_both(routine, {table: np.ones((3, 3)), index: np.array([1, 0, 3, 2])})


def test_where_skips_a_failing_branch_and_selects_lane_values():
    table, cond, out = TNode("table", (2,)), TNode("cond", (4,)), TNode("out", (4,))
    i = Symbol()
    bad = LoadDynamic(table, 0, Cast(Binary(Binop.MUL, Load(cond, (Iter(i),)), Const(9.0)), dtypes.int32), ())
    body = loop(i, 4, Store(out, (Iter(i),), Ternary(Ternop.WHERE, Load(cond, (Iter(i),)), Const(-1.0), bad)))
    run_both(RoutineIR("guarded", body), {cond: np.array([1.0, 0.0, np.nan, -0.0], np.float32),
                                          table: np.array([5.0, 6.0], np.float32)})


def test_prng_bits_over_a_grid():
    key, bits, u32, u64 = (TNode("key", (), dtypes.uint4x32), TNode("bits", (5, 3), dtypes.uint4x32),
                           TNode("u32", (5, 3)), TNode("u64", (5, 3), dtypes.float64))
    i, j = Symbol(), Symbol()
    counter = Unary(Unop.UINT4X32_OF, Binary(Binop.ADD, Binary(Binop.MUL, EmbedIndex(Iter(i), dtypes.int64),
                                                                Const(2**40 - 3, dtypes.int64)),
                                             EmbedIndex(Iter(j), dtypes.int64)))
    value = Binary(Binop.THREEFRY4X32, Load(key, ()), counter)
    ij = (Iter(i), Iter(j))
    body = seq(Fill(key, Const((1, 2**32 - 1, 7, 2**31), dtypes.uint4x32)),
               loop(i, 5, loop(j, 3, Store(bits, ij, value))),
               loop(i, 5, loop(j, 3, seq(Store(u32, ij, Unary(Unop.UNIFORM1, Load(bits, ij), dtypes.float32)),
                                         Store(u64, ij, Unary(Unop.UNIFORM1, Load(bits, ij), dtypes.float64))))))
    out = run_both(RoutineIR("prng", body), {})
    assert len(np.unique(out[bits].reshape(-1, 4), axis=0)) == 15


# ---------------------------------------------------------------------------------------------
# Sums, locals, errors


def _adversarial(shape) -> np.ndarray:
    """Terms whose sum depends on the order they are added in."""
    scales = 10.0 ** RNG.integers(-4, 9, shape)
    return (RNG.standard_normal(shape) * scales).astype(np.float32)


@pytest.mark.parametrize("op", [Binop.ADD, Binop.SUB, Binop.MAX])
def test_stored_sums_keep_the_loop_order(op):
    x, y, z = TNode("x", (3, 40, 5)), TNode("y", (3, 5)), TNode("z", ())
    i, k, j, a, b, c = (Symbol() for _ in range(6))
    term = Binary(Binop.MUL, Load(x, (Iter(i), Iter(k), Iter(j))), Const(1.5))
    body = seq(
        Fill(y, Const(-0.0)),
        loop(i, 3, loop(k, 40, loop(j, 5, Store(y, (Iter(i), Iter(j)),
                                                Binary(op, Load(y, (Iter(i), Iter(j))), term))))),
        loop(a, 3, loop(b, 40, loop(c, 5, Store(z, (), Binary(op, Load(z, ()), Load(x, (Iter(a), Iter(b), Iter(c))))))))
    )
    run_both(RoutineIR("sums", body), {x: _adversarial((3, 40, 5))})


def test_sums_too_large_to_evaluate_at_once_are_walked(monkeypatch):
    from ocannl.backends.interp import vectorized

    monkeypatch.setattr(vectorized, "ACCUMULATE_LIMIT", 16)
    test_stored_sums_keep_the_loop_order(Binop.ADD)
    test_local_sums_and_zero_signs()


def test_a_local_scope_that_stores_runs_its_nest_on_the_scalar_path():
    x, side, y = TNode("x", (4,)), TNode("side", (4,)), TNode("y", (4,))
    i = Symbol()
    v = Local(dtypes.float32)
    scope = LocalScope(v, seq(Store(side, (Iter(i),), Load(x, (Iter(i),))),
                              SetLocal(v, Binary(Binop.MUL, Load(side, (Iter(i),)), Const(2.0)))))
    body = loop(i, 4, Store(y, (Iter(i),), Binary(Binop.ADD, Load(side, (Iter(i),)), scope)))
    out = run_both(RoutineIR("storing scope", body), {x: RNG.standard_normal(4), side: np.full(4, 100.0)})
    np.testing.assert_array_equal(out[y], np.float32(100.0) + out[x] * np.float32(2.0))


def test_local_sums_and_zero_signs():
    x, y = TNode("x", (4, 6)), TNode("y", (4,))
    i, k, k2 = Symbol(), Symbol(), Symbol()
    v, w = Local(dtypes.float32), Local(dtypes.float32)
    scope = LocalScope(v, loop(k, 6, SetLocal(v, Binary(Binop.ADD, GetLocal(v), Load(x, (Iter(i), Iter(k)))))))
    nested = LocalScope(w, loop(k2, 2, loop(Symbol(), 1, SetLocal(w, Binary(Binop.ADD, GetLocal(w), Const(-0.0))))))
    body = loop(i, 4, Store(y, (Iter(i),), Binary(Binop.ADD, scope, nested)))
    data = _adversarial((4, 6))
    data[1] = -0.0
    out = run_both(RoutineIR("local sums", body), {x: data})
    assert np.signbit(out[y][1]) == np.signbit(np.float32(0.0) + np.float32(-0.0))


def test_declared_locals_across_grids_and_walked_loops():
    x, y = TNode("x", (3, 4)), TNode("y", (3, 4))
    i, j, k = Symbol(), Symbol(), Symbol()
    top, run_max = Local(dtypes.float32), Local(dtypes.float32)
    body = seq(
        DeclareLocal(top),
        SetLocal(top, Const(0.25)),
        loop(i, 3, seq(DeclareLocal(run_max), SetLocal(run_max, Const(-np.inf)),
                       loop(k, 4, SetLocal(run_max, Binary(Binop.MAX, GetLocal(run_max), Load(x, (Iter(i), Iter(k)))))),
                       loop(j, 4, Store(y, (Iter(i), Iter(j)), Binary(Binop.SUB, Load(x, (Iter(i), Iter(j))),
                                                                      Binary(Binop.MUL, GetLocal(run_max), GetLocal(top))))))),
    )
    run_both(RoutineIR("locals", body), {x: RNG.standard_normal((3, 4))})


def test_a_loop_reading_what_another_iteration_writes_is_walked():
    x = TNode("x", (8,))
    i = Symbol()
    body = loop(i, 7, Store(x, (Affine(((1, i),), 1),), Binary(Binop.ADD, Load(x, (Iter(i),)), Const(1.0))))
    assert not carries_no_dependence(body)
    out = run_both(RoutineIR("prefix", body), {})
    assert out[x].tolist() == list(range(8))


def test_integer_division_by_zero_and_wrapping():
    a, b, q, r = (TNode(n, (6,), dtypes.int32) for n in "abqr")
    i = Symbol()
    body = seq(loop(i, 6, Store(q, (Iter(i),), Binary(Binop.DIV, Load(a, (Iter(i),)), Load(b, (Iter(i),))))),
               loop(i, 6, Store(r, (Iter(i),), Binary(Binop.MOD, Load(a, (Iter(i),)), Load(b, (Iter(i),))))))
    A = np.array([-7, 7, -2**31, 2**31 - 1, 5, 0], np.int32)
    run_both(RoutineIR("ints", body), {a: A, b: np.array([2, -2, -1, 1, 3, 4], np.int32)})
    with pytest.raises(ZeroDivisionError):
        run_both(RoutineIR("ints", body), {a: A, b: np.array([2, -2, -1, 0, 3, 4], np.int32)})


def test_out_of_bounds_index_symbol_names_the_loop_values():
    s = IndexSymbol("k")
    x, y = TNode("x", (2, 3)), TNode("y", (4, 3))
    i, j = Symbol(), Symbol()
    body = loop(i, 4, loop(j, 3, Store(y, (Iter(i), Iter(j)), Load(x, (Iter(s), Iter(j))))))
    run_both(RoutineIR("sym", body), {x: RNG.standard_normal((2, 3))}, {s: 1})
    with pytest.raises(OutOfBoundsError, match=r"read of x at index \(2, 0\).*\n.*\n  with i0=0, i1=0, k=2"):
        run_both(RoutineIR("sym", body), {x: RNG.standard_normal((2, 3))}, {s: 2})


def test_padded_reads_and_skipped_stores():
    x, y, g = TNode("x", (5,)), TNode("y", (4,)), TNode("g", (5,))
    o, k = Symbol(), Symbol()
    window = Affine(((2, o), (1, k)), -1)
    body = seq(
        loop(o, 4, loop(k, 3, Store(y, (Iter(o),), Binary(Binop.MAX, Load(y, (Iter(o),)), Load(x, (window,), -np.inf))))),
        loop(o, 4, loop(k, 3, Store(g, (window,), Binary(Binop.ADD, Load(g, (window,), 0), Load(y, (Iter(o),))), skip_oob=True))),
    )
    run_both(RoutineIR("padded", body), {x: RNG.standard_normal(5)})


def test_storage_precisions_round_on_every_store():
    x = TNode("x", (6,))
    h, b = TNode("h", (6,), dtypes.float16), TNode("b", (6,), dtypes.bfloat16)
    s16 = TNode("s16", (), dtypes.float16)
    i, k = Symbol(), Symbol()
    third = Binary(Binop.MUL, Load(x, (Iter(i),)), Const(1 / 3))
    body = seq(loop(i, 6, seq(Store(h, (Iter(i),), third), Store(b, (Iter(i),), third))),
               loop(k, 6, Store(s16, (), Binary(Binop.ADD, Load(s16, ()), Load(h, (Iter(k),))))))
    run_both(RoutineIR("storage", body), {x: _adversarial(6) / 1e5})


_FLOATS = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(_FLOATS, _FLOATS, _FLOATS), min_size=1, max_size=12), st.sampled_from([dtypes.float32, dtypes.float64]))
def test_every_operator_elementwise(values, dtype):
    n = len(values)
    a, b, c = (TNode(name, (n,), dtype) for name in "abc")
    arrays = {t: np.array([v[j] for v in values], dtype.storage) for j, t in enumerate((a, b, c))}
    i = Symbol()
    args = [Load(t, (Iter(i),)) for t in (a, b, c)]
    exprs = [Unary(op, args[0]) for op in Unop if op not in PRNG_OPS]
    exprs += [Binary(op, args[0], args[1]) for op in Binop if op not in PRNG_OPS]
    exprs += [Ternary(op, *args) for op in Ternop]
    outs = [TNode(f"y{j}", (n,), dtype) for j in range(len(exprs))]
    body = seq(*(loop(i, n, Store(y, (Iter(i),), e)) for y, e in zip(outs, exprs)))
    run_both(RoutineIR("ops", body), arrays)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-2**31, 2**31 - 1), min_size=2, max_size=10), st.sampled_from([dtypes.int32, dtypes.uint32, dtypes.int64]))
def test_integer_operators_and_casts(values, dtype):
    n = len(values)
    a, b, f = TNode("a", (n,), dtype), TNode("b", (n,), dtype), TNode("f", (n,))
    A = np.array(values, np.int64).astype(dtype.storage)
    B = np.where(A[::-1] == 0, 3, A[::-1]).astype(dtype.storage)  # nonzero divisors
    i = Symbol()
    args = (Load(a, (Iter(i),)), Load(b, (Iter(i),)))
    ops = [Binop.ADD, Binop.SUB, Binop.MUL, Binop.DIV, Binop.MOD, Binop.MAX, Binop.LT, Binop.AND]
    outs = [TNode(f"y{j}", (n,), dtype) for j in range(len(ops) + 3)]
    exprs = [Binary(op, *args) for op in ops] + [Ternary(Ternop.FMA, args[0], args[1], args[0]), Unary(Unop.NEG, args[0]),
                                                 Cast(Binary(Binop.MUL, Load(f, (Iter(i),)), Const(1e3)), dtype)]
    body = seq(*(loop(i, n, Store(y, (Iter(i),), e)) for y, e in zip(outs, exprs)))
    run_both(RoutineIR("ints", body), {a: A, b: B, f: RNG.uniform(-1e3, 1e3, n)})


# ---------------------------------------------------------------------------------------------
# Choosing the mode


def test_mode_is_an_option_and_a_setting(monkeypatch):
    routine = RoutineIR("r", Fill(TNode("t", (2,)), Const(1.0)))
    assert type(Context("interp").backend.compile(routine)) is VectorizedExecutable
    assert type(Context("interp", interp_mode="scalar").backend.compile(routine)) is InterpExecutable
    monkeypatch.setenv("OCANNL_INTERP_MODE", "scalar")
    assert type(InterpBackend().compile(routine)) is InterpExecutable
    assert type(Context("interp", interp_mode="vectorized").backend.compile(routine)) is VectorizedExecutable
    monkeypatch.setenv("OCANNL_INTERP_MODE", "fast")
    with pytest.raises(OcannlError, match=r"setting interp_mode \(OCANNL_INTERP_MODE\) must be one of vectorized, scalar"):
        Context("interp")
    with pytest.raises(OcannlError, match=r"backend 'c' has no option interp_mode"):
        Context("c", interp_mode="scalar")


# ---------------------------------------------------------------------------------------------
# Whole training steps


def _step_bits(build, mode: str, runs: tuple[dict, ...]) -> dict[str, bytes]:
    program = testing.Program(f"step {mode}", build, runs)
    return {name: value.tobytes() for name, value in _run_in_mode(program, mode).items()}


def test_cnn_training_step_bit_for_bit():
    from bench import interp_throughput as bench

    def build():
        loss, items = bench.build_cnn(batch=4, channels=3)
        return items

    runs = ({"batch_n": 0}, {"batch_n": 1})
    vectorized = _step_bits(build, "vectorized", runs)
    assert len(vectorized) > 20 and vectorized == _step_bits(build, "scalar", runs)


def test_transformer_training_step_bit_for_bit():
    from bench import interp_throughput as bench

    def build():
        loss, items = bench.build_transformer(batch=2, seq=8, d=8, mlp=16)
        return items

    runs = ({"batch_n": 0}, {"batch_n": 1})
    vectorized = _step_bits(build, "vectorized", runs)
    assert len(vectorized) > 20 and vectorized == _step_bits(build, "scalar", runs)
