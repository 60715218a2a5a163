"""The summation order of float reductions (docs/semantics.md, "Summation order";
ocannl/lowlevel/summation.py): every backend executing the loop IR gets the same bits, equal to
a direct numpy simulation of the documented rule, and long float32 sums stay accurate."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ocannl as oc
from helpers import data
import ocannl.session
from ocannl.backends.registry import get_backend
from ocannl.backends.c import CBackend
from ocannl.backends.c.emit import emit_c
from ocannl.backends.interp import InterpBackend
from ocannl.backends.metal import MetalBackend
from ocannl.errors import BackendUnavailable
from ocannl.lowlevel import dtypes, summation
from ocannl.lowlevel.indexing import Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, For, GetLocal, Load, Local, LocalScope, RoutineIR, SetLocal, Store, Unary, iter_exprs, iter_stmts, loop,
)
from ocannl.lowlevel.scalar_ops import Binop, Unop
from ocannl.lowlevel.tnode import TNode

B = summation.BLOCK
HAVE_METAL = MetalBackend().available()[0]
needs_metal = pytest.mark.skipif(not HAVE_METAL, reason="no C++20 compiler for the Metal shim here")


def reference_sum(start: np.float32, terms: np.ndarray) -> np.float32:
    """The documented rule, simulated in numpy float32: ``terms`` has one axis per reduction
    loop (outermost first)."""
    f32 = np.float32
    if terms.size <= B:
        acc = f32(start)
        for t in terms.reshape(-1):
            acc = f32(acc + t)
        return acc
    shape = terms.shape
    j = len(shape) - 1
    inner = 1
    while j > 0 and inner * shape[j] <= B:
        inner *= shape[j]
        j -= 1
    c = B // inner
    chunks = -(-shape[j] // c)
    sums = np.empty(shape[:j] + (chunks,), np.float32)
    for prefix in np.ndindex(*shape[:j]):
        for q in range(chunks):
            sums[prefix + (q,)] = reference_sum(f32(0), terms[prefix][q * c:(q + 1) * c])
    return reference_sum(start, sums)


def run(t: oc.Tensor, backend: str, **options) -> np.ndarray:
    ctx = oc.Context(backend, **options)
    ctx.compile(t).run()
    return ctx.get(t.value)


def run_ir(backend, routine: RoutineIR, inputs: dict[TNode, np.ndarray]) -> dict[TNode, np.ndarray]:
    """``routine`` in the summation order, run directly on ``backend``."""
    routine = summation.block_sums(routine)
    buffers = {n: np.array(inputs.get(n, np.zeros(n.dims)), dtype=n.dtype.storage) for n in routine.reads + routine.writes}
    backend.compile(routine).run(buffers, {})
    return buffers


def ir_backends():
    backends = [InterpBackend("scalar"), InterpBackend("vectorized"), CBackend()]
    return backends + ([MetalBackend()] if HAVE_METAL else [])


def results(build, backends=("interp", "c")) -> list[np.ndarray]:
    out = []
    for backend in backends:
        ocannl.session.reset()
        out.append(run(build(), backend))
    return out


def assert_bits(expected: np.ndarray, got: np.ndarray) -> None:
    assert expected.dtype == got.dtype and expected.shape == got.shape
    assert np.array_equal(expected.view(np.uint32), got.view(np.uint32)), (expected, got)


# ---------------------------------------------------------------------------------------------
# The rewrite itself


def test_plan_levels_single_loop_is_blocks_of_consecutive_terms():
    splits, top = summation.plan_levels((5000,))
    assert [(s.j, s.c) for s in splits] == [(0, 64), (0, 64)]
    assert [a.size for a in top] == [2] and top[0].ragged
    splits, top = summation.plan_levels((64, 3, 3))  # conv: 7 channels x 3 x 3 per block
    assert [(s.j, s.c) for s in splits] == [(0, 7)] and [a.size for a in top] == [10]
    assert summation.plan_levels((64,))[0] == []


def test_short_sums_are_left_as_they_are():
    x, out = TNode("x", (64,)), TNode("out", ())
    k = Symbol()
    nest = loop(k, 64, Store(out, (), Binary(Binop.ADD, Load(out, ()), Load(x, (Iter(k),)))))
    routine = RoutineIR("r", nest)
    assert summation.block_sums(routine) is routine


@pytest.mark.parametrize("op,dtype", [(Binop.MAX, dtypes.float32), (Binop.ADD, dtypes.int32)])
def test_max_and_integer_sums_are_left_as_they_are(op, dtype):
    """Exact in any order: no blocks."""
    x, out = TNode("x", (1000,), dtype=dtype), TNode("out", (), dtype=dtype)
    k = Symbol()
    nest = loop(k, 1000, Store(out, (), Binary(op, Load(out, ()), Load(x, (Iter(k),)))))
    assert summation.block_sums(RoutineIR("r", nest)).body is nest


def test_reduction_loops_move_inside_the_cell_loops():
    """A gradient puts the batch reduction outermost; blocking runs it inside the cell loops."""
    x, out = TNode("x", (200, 8)), TNode("out", (8,))
    b, i = Symbol(), Symbol()
    store = Store(out, (Iter(i),), Binary(Binop.ADD, Load(out, (Iter(i),)), Load(x, (Iter(b), Iter(i)))))
    blocked = summation.block_sums(RoutineIR("r", loop(b, 200, loop(i, 8, store)))).body
    assert isinstance(blocked, For) and blocked.symbol is i and blocked.extent == 8
    assert any(isinstance(e, LocalScope) for s in iter_stmts(blocked) if isinstance(s, Store) for e in iter_exprs(s.value))


# ---------------------------------------------------------------------------------------------
# Bits: interp = c = the rule


@pytest.mark.parametrize("n", [65, 1000, 4097, 1 << 16])
def test_one_dimensional_sum(n):
    values = data(n, rng=0, mean=3)
    interp, c = results(lambda: oc.sum(oc.tensor(values)))
    assert_bits(interp, c)
    assert_bits(interp, np.asarray(reference_sum(np.float32(0), values)))


def test_column_sums_over_a_batch_axis():
    values = data(3000, 5, rng=1, mean=3)
    interp, c = results(lambda: oc.einsum("b|i => i", oc.tensor(values, batch=1)))
    assert_bits(interp, c)
    expected = np.array([reference_sum(np.float32(0), values[:, i]) for i in range(5)])
    assert_bits(interp, expected)


def test_sum_over_two_loops_with_a_ragged_inner_loop():
    values = data(30, 100, rng=2, mean=3)
    interp, c = results(lambda: oc.einsum("b|i => ", oc.tensor(values, batch=1)))
    assert_bits(interp, c)
    assert_bits(interp, np.asarray(reference_sum(np.float32(0), values)))


@pytest.mark.parametrize("k", [1000, 5000])
def test_matmul(k):
    a_np, b_np = data(6, k, rng=3, mean=3), data(k, 5, rng=4, mean=3)
    interp, c = results(lambda: oc.tensor(a_np, input=1) @ oc.tensor(b_np, input=1))
    assert_bits(interp, c)
    products = a_np[:, :, None] * b_np[None, :, :]
    expected = np.array([[reference_sum(np.float32(0), products[i, :, j]) for j in range(5)] for i in range(6)])
    assert_bits(interp, expected)


@pytest.mark.parametrize("k", [1000, 5000])
def test_tiled_matmul_on_c_matches_the_rule(k):
    """Large enough for the C backend's register tiles: K blocks of 64 with a ragged last one,
    and beyond 64 x 64 terms, blocks of blocks."""
    a_np, b_np = data(37, k, rng=5, mean=3), data(k, 45, rng=6, mean=3)
    interp, c = results(lambda: oc.tensor(a_np, input=1) @ oc.tensor(b_np, input=1))
    assert_bits(interp, c)
    ocannl.session.reset()
    product = oc.tensor(a_np, input=1) @ oc.tensor(b_np, input=1)
    assert "each block of terms sums from zero" in emit_c(oc.Context("c").compile(product).ir).text


def test_convolution_with_many_channels():
    x_np, w_np = data(2, 10, 200, rng=7, mean=3), data(3, 3, 200, rng=8, mean=3)

    def build():
        x, w = oc.tensor(x_np, batch=1), oc.tensor(w_np, input=2)
        return oc.einsum("... | 1*o<+k, ..ic..; k, ..ic.. -> ..oc.. => ... | o, ..oc..", x, w)

    interp, c = results(build)
    assert_bits(interp, c)
    ocannl.session.reset()
    assert "each block of terms sums from zero" in emit_c(oc.Context("c").compile(build()).ir).text
    for b in range(2):
        for o in range(8):
            for oc_ in range(3):
                terms = x_np[b, o:o + 3, :] * w_np[oc_]
                assert_bits(interp[b, o, oc_:oc_ + 1], np.array([reference_sum(np.float32(0), terms)]))


@pytest.mark.parametrize("extents", [(130, 70), (3, 7, 200), (65, 65, 3), (5, 4097), (2, 9, 9, 9), (33, 2, 33)])
def test_nested_reductions_follow_the_rule(extents):
    """Several reduction loops, ragged at several levels: each backend equals the simulation."""
    x, out = TNode("x", extents), TNode("out", ())
    symbols = [Symbol() for _ in extents]
    nest = Store(out, (), Binary(Binop.ADD, Load(out, ()), Load(x, tuple(Iter(s) for s in symbols))))
    for s, n in reversed(list(zip(symbols, extents))):
        nest = loop(s, n, nest)
    values = data(*extents, rng=sum(extents), mean=3)
    expected = np.asarray(reference_sum(np.float32(0), values))
    for backend in ir_backends():
        assert_bits(expected, run_ir(backend, RoutineIR("r", nest), {x: values})[out])


def test_tiled_contraction_inlined_into_its_consumer_on_c():
    """``relu(a @ b + c)`` with the product computed inline: the tile keeps the sum in registers
    and adds each block to it."""
    a_np, b_np, c_np = data(40, 300, rng=15, mean=3), data(300, 33, rng=16, mean=3), data(40, 33, rng=17, mean=3)

    def build():
        return oc.relu(oc.tensor(a_np, input=1) @ oc.tensor(b_np, input=1) + oc.tensor(c_np, input=1))

    interp, c = results(build)
    assert_bits(interp, c)
    ocannl.session.reset()
    y = build()
    routine = oc.Context("c").compile(y)
    inlined = [s for s in iter_stmts(routine.ir.body) if isinstance(s, Store) and s.tnode is y.value]
    assert inlined and any(isinstance(e, LocalScope) for e in iter_exprs(inlined[0].value))
    assert "each block of terms sums from zero" in emit_c(routine.ir).text


def test_interpreter_modes_agree():
    values = data(700, 3, rng=10, mean=3)
    scalar, vectorized = [], []
    for out, mode in ((scalar, "scalar"), (vectorized, "vectorized")):
        ocannl.session.reset()
        out.append(run(oc.einsum("b|i => i", oc.tensor(values, batch=1)), "interp", interp_mode=mode))
    assert_bits(scalar[0], vectorized[0])


def test_a_difference_is_a_sum_of_negated_terms():
    x, out = TNode("x", (300,)), TNode("out", ())
    k = Symbol()
    nest = loop(k, 300, Store(out, (), Binary(Binop.SUB, Load(out, ()), Load(x, (Iter(k),)))))
    values = data(300, rng=11, mean=3)
    start = np.float32(5.0)
    expected = reference_sum(start, -values)
    for backend in ir_backends():
        got = run_ir(backend, RoutineIR("r", nest), {x: values, out: np.array(start)})[out]
        assert_bits(np.asarray(expected), got)


def test_a_sum_inlined_into_its_consumer():
    """``out[i] := -v { for k: v := v + x[i, k] }``: a reduction on a local."""
    x, out = TNode("x", (3, 500)), TNode("out", (3,))
    i, k, v = Symbol(), Symbol(), Local(dtypes.float32)
    accumulate = loop(k, 500, SetLocal(v, Binary(Binop.ADD, GetLocal(v), Load(x, (Iter(i), Iter(k))))))
    nest = loop(i, 3, Store(out, (Iter(i),), Unary(Unop.NEG, LocalScope(v, accumulate))))
    values = data(3, 500, rng=12, mean=3)
    results = [run_ir(b, RoutineIR("r", nest), {x: values})[out] for b in ir_backends()]
    for got in results[1:]:
        assert_bits(results[0], got)
    assert_bits(results[0], np.array([-reference_sum(np.float32(0), values[r]) for r in range(3)]))


def test_half_precision_cells_round_once_per_block_sum():
    x, out = TNode("x", (8, 1000)), TNode("out", (8,), dtype=dtypes.float16)
    i, k = Symbol(), Symbol()
    term = Load(x, (Iter(i), Iter(k)))
    nest = loop(i, 8, loop(k, 1000, Store(out, (Iter(i),), Binary(Binop.ADD, Load(out, (Iter(i),)), term))))
    values = data(8, 1000, rng=13, mean=3)
    results = [run_ir(b, RoutineIR("r", nest), {x: values})[out] for b in ir_backends()]
    for got in results[1:]:
        assert np.array_equal(results[0].view(np.uint16), got.view(np.uint16))
    np.testing.assert_allclose(results[0], values.astype(np.float64).sum(1), rtol=2e-3)


@needs_metal
def test_metal_gives_the_same_bits():
    values = data(2000, 3, rng=9, mean=3)
    interp, c, metal = results(lambda: oc.einsum("b|i => i", oc.tensor(values, batch=1)), ("interp", "c", "metal"))
    assert_bits(interp, c)
    assert_bits(interp, metal)


# ---------------------------------------------------------------------------------------------
# Accuracy


def relative_error(got: np.ndarray, exact: float) -> float:
    return abs(float(got) - exact) / abs(exact)


def accurate_2_to_the_25(value: float, backends: tuple[str, ...]) -> None:
    n = 1 << 25
    got = []
    for backend in backends:
        ocannl.session.reset()
        got.append(run(oc.sum(oc.tensor(np.full(n, value, np.float32))), backend))
        assert relative_error(got[-1], n * float(np.float32(value))) < 1e-6, backend
    for other in got[1:]:
        assert_bits(got[0], other)


def test_2_to_the_25_terms_are_accurate_and_the_same_on_interp_and_c():
    accurate_2_to_the_25(math.e ** 3, ("interp", "c"))


@pytest.mark.slow
def test_2_to_the_25_quarters_are_exact_on_interp_and_c():
    accurate_2_to_the_25(0.25, ("interp", "c"))


@needs_metal
def test_2_to_the_25_terms_on_metal_are_accurate_and_the_same_as_on_c():
    accurate_2_to_the_25(math.e ** 3, ("c", "metal"))


def triton_available() -> bool:
    try:
        get_backend("triton")
    except BackendUnavailable:
        return False
    return True


needs_triton = pytest.mark.skipif(not triton_available(), reason="no Triton backend here (GPU, or TRITON_INTERPRET=1)")


@needs_triton
@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
@pytest.mark.parametrize("n", [1 << 14, pytest.param(1 << 20, marks=pytest.mark.slow)])
def test_triton_long_sums_are_as_accurate(n):
    """Triton keeps its tree order; its tile sums are added with compensation."""
    from ocannl.backends.triton import generate
    from ocannl.backends.triton.gpu_check import compile_for_gpu

    rng = np.random.default_rng(14)
    for values in (np.full(n, math.e ** 3, np.float32), (rng.standard_normal(n) + 3).astype(np.float32)):
        ocannl.session.reset()
        total = oc.sum(oc.tensor(values))
        ctx = oc.Context("triton")
        routine = ctx.compile(total)
        routine.run()
        assert relative_error(ctx.get(total.value), float(values.astype(np.float64).sum())) < 1e-6
    assert compile_for_gpu([generate(routine.ir)])  # the compensated loop compiles for a GPU too
