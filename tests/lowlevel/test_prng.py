"""Threefry-4x32-20 and the uint4x32 conversions as IR, run by the interpreter, against the numpy
oracle (prng_reference.py) bit for bit; the random fills of ocannl/lowlevel/prng.py."""

import numpy as np
import pytest

from backend_params import backend_param
from handbuilt import accum, pointwise
from ocannl.backends.context import Context
from ocannl.backends.interp import InterpBackend
from ocannl.lowlevel import dtypes, prng
from ocannl.lowlevel.assignments import Accum, Apply, Arg, CellOffset, Computation, format_cd
from ocannl.lowlevel.dtypes import DTypeError
from ocannl.lowlevel.indexing import Iter, Symbol
from ocannl.lowlevel.ir import Binary, Const, Load, RoutineIR, Store, Unary, format_routine, loop
from ocannl.lowlevel.lower import lower_routine
from ocannl.lowlevel.prng_reference import threefry4x32, uniform1_float32, uniform1_float64
from ocannl.lowlevel.scalar_ops import Binop, Unop
from ocannl.lowlevel.tnode import TNode

U4 = dtypes.uint4x32
RNG = np.random.default_rng(2024)

# Random123's 20-round known answers (its kat_vectors file): counter, key, expected.
PI_COUNTER = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
PI_KEY = (0xA4093822, 0x299F31D0, 0x082EFA98, 0xEC4E6C89)
KNOWN_ANSWERS_20 = [
    ((0, 0, 0, 0), (0, 0, 0, 0), (0x9C6CA96A, 0xE17EAE66, 0xFC10ECD4, 0x5256A7D8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 4, (0x2A881696, 0x57012287, 0xF6C7446E, 0xA16A6732)),
    (PI_COUNTER, PI_KEY, (0x59CD1DBB, 0xB8879579, 0x86B5D00C, 0xAC8B6D84)),
]


def run(asg, inputs=None, interp_mode: str = "vectorized") -> Context:
    ctx = Context("interp", interp_mode=interp_mode)
    for node, value in (inputs or {}).items():
        ctx.set(node, value)
    ctx.compile(Computation("prng_test", asg)).run()
    return ctx


def ir_threefry(keys: np.ndarray, counters: np.ndarray, interp_mode: str = "vectorized") -> np.ndarray:
    n = len(keys)
    key, counter, out = TNode("key", (n,), U4), TNode("counter", (n,), U4), TNode("out", (n,), U4)
    ctx = run(pointwise(out, Binop.THREEFRY4X32, key, counter), {key: keys, counter: counters}, interp_mode)
    return ctx.get(out)


# The scalar interpreter computes Threefry on Python ints with its own loop over the rounds; the
# vectorized one runs the numpy oracle over the grid.
@pytest.mark.parametrize("interp_mode", ["scalar", "vectorized"])
def test_threefry_known_answers(interp_mode):
    counters = np.array([c for c, _, _ in KNOWN_ANSWERS_20], dtype=np.uint32)
    keys = np.array([k for _, k, _ in KNOWN_ANSWERS_20], dtype=np.uint32)
    expected = np.array([e for _, _, e in KNOWN_ANSWERS_20], dtype=np.uint32)
    np.testing.assert_array_equal(ir_threefry(keys, counters, interp_mode), expected)


def test_scalar_interpreter_threefry_equals_the_oracle():
    rng = np.random.default_rng(7)
    keys, counters = rng.integers(0, 2**32, (2, 64, 4), dtype=np.uint32)
    np.testing.assert_array_equal(ir_threefry(keys, counters, "scalar"), threefry4x32(keys, counters))


def test_threefry_random_inputs_equal_the_oracle():
    keys = RNG.integers(0, 2**32, (300, 4), dtype=np.uint32)
    counters = RNG.integers(0, 2**32, (300, 4), dtype=np.uint32)
    np.testing.assert_array_equal(ir_threefry(keys, counters), threefry4x32(keys, counters))


def test_uniform1_equals_the_reference_conversions():
    words = RNG.integers(0, 2**32, (200, 4), dtype=np.uint32)
    words[0], words[1] = 0, 0xFFFFFFFF  # the ends of the range: 0 and 1 - 2**-24 (1 - 2**-53)
    bits = TNode("bits", (200,), U4)
    f32, f64 = TNode("f32", (200,)), TNode("f64", (200,), dtypes.float64)
    ctx = run(pointwise(f32, Unop.UNIFORM1, bits), {bits: words})
    ctx64 = run(pointwise(f64, Unop.UNIFORM1, bits), {bits: words})
    np.testing.assert_array_equal(ctx.get(f32), uniform1_float32(words))
    np.testing.assert_array_equal(ctx64.get(f64), uniform1_float64(words))
    assert ctx.get(f32)[0] == 0 and ctx.get(f32)[1] == np.float32(1 - 2**-24)
    assert ctx64.get(f64)[1] == 1 - 2**-53


@pytest.mark.parametrize("dtype, values, expected", [
    (dtypes.int32, [0, 7, -1], [(0, 0, 0, 0), (7, 0, 0, 0), (0xFFFFFFFF, 0xFFFFFFFF, 0, 0)]),
    (dtypes.uint32, [0xFFFFFFFF], [(0xFFFFFFFF, 0, 0, 0)]),
    (dtypes.int64, [2**40 + 5, -2], [(5, 2**8, 0, 0), (0xFFFFFFFE, 0xFFFFFFFF, 0, 0)]),
], ids=lambda v: getattr(v, "name", ""))
def test_uint4x32_of_puts_the_integer_in_lanes_0_and_1(dtype, values, expected):
    n, i = len(values), Symbol()
    x, out = TNode("x", (n,), dtype), TNode("out", (n,), U4)
    routine = RoutineIR("of", loop(i, n, Store(out, (Iter(i),), Unary(Unop.UINT4X32_OF, Load(x, (Iter(i),))))))
    buffers = {x: np.array(values, dtype=dtype.storage), out: np.zeros((n, 4), np.uint32)}
    InterpBackend().compile(routine).run(buffers, {})
    np.testing.assert_array_equal(buffers[out], np.array(expected, dtype=np.uint32))


def test_lowered_uint4x32_of_reads_its_operand_as_uint32():
    x, out = TNode("x", (2,), dtypes.int32), TNode("out", (2,), U4)
    got = run(pointwise(out, Unop.UINT4X32_OF, x), {x: [3, -1]}).get(out)
    np.testing.assert_array_equal(got, [(3, 0, 0, 0), (0xFFFFFFFF, 0, 0, 0)])


def reference_uniform(key, n: int, dtype) -> np.ndarray:
    counters = np.zeros((n, 4), dtype=np.uint32)
    counters[:, 0] = np.arange(n)
    bits = threefry4x32(np.array(key, dtype=np.uint32), counters)
    return uniform1_float64(bits) if dtype is dtypes.float64 else uniform1_float32(bits)


@pytest.mark.parametrize("dims", [(3, 5), (4, 1, 3), (7,), ()])
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_uniform_fill_bits_equal_the_reference(dims, dtype):
    node = TNode("w", dims, dtype)
    n = int(np.prod(dims))
    got = run(prng.uniform_fill(node, seed=11, stream=3, low=-0.75, high=1.5)).get(node)
    t = dtype.storage.type
    expected = t(-0.75) + t(2.25) * reference_uniform((11, 3, 0, 0), n, dtype)
    assert got.dtype == dtype.storage
    np.testing.assert_array_equal(got.reshape(-1), expected)


def test_unit_uniform_fill_is_the_conversion_itself():
    node = TNode("u", (64,))
    got = run(prng.uniform_fill(node, seed=0, stream=0)).get(node)
    np.testing.assert_array_equal(got, reference_uniform((0, 0, 0, 0), 64, dtypes.float32))


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_uniform_fill_of_16_bit_floats_rounds_the_float32_value(dtype):
    node = TNode("h", (32,), dtype)
    got = run(prng.uniform_fill(node, seed=1, stream=2, low=-1, high=1)).get(node)
    in_float32 = np.float32(-1) + np.float32(2) * reference_uniform((1, 2, 0, 0), 32, dtypes.float32)
    if dtype is dtypes.float16:
        np.testing.assert_array_equal(got, in_float32.astype(np.float16))
    else:
        np.testing.assert_array_equal(got, dtypes.bfloat16_bits_to_float32(dtypes.float32_to_bfloat16_bits(in_float32)))


def test_normal_fill_is_box_muller_of_two_draws():
    node = TNode("z", (50,))
    got = run(prng.normal_fill(node, seed=4, stream=9, mean=1.0, std=2.0)).get(node)
    u1 = reference_uniform((4, 9, 0, 0), 50, dtypes.float32).astype(np.float64)
    u2 = reference_uniform((4, 9, 1, 0), 50, dtypes.float32).astype(np.float64)
    expected = 1.0 + 2.0 * np.sqrt(-2 * np.log(1 - u1)) * np.cos(2 * np.pi * u2)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_distributions():
    u, z = TNode("u", (100, 100)), TNode("z", (64, 64))
    values = run(prng.uniform_fill(u, seed=0, stream=1)).get(u)
    assert 0 <= values.min() and values.max() < 1
    assert abs(values.mean() - 0.5) < 0.01 and abs(values.std() - np.sqrt(1 / 12)) < 0.01
    assert len(np.unique(values)) > 9900
    normal = run(prng.normal_fill(z, seed=0, stream=1)).get(z)
    assert abs(normal.mean()) < 0.05 and abs(normal.std() - 1) < 0.05
    assert np.isfinite(normal).all()



def box_muller_of(u1: np.ndarray, u2: np.ndarray, dtype, backend: str = "interp") -> np.ndarray:
    """``prng.box_muller`` of the given uniforms, cell by cell, computed on ``backend``."""
    n, i = len(u1), Symbol()
    a, b, z = TNode("u1", (n,), dtype), TNode("u2", (n,), dtype), TNode("z", (n,), dtype)
    fill = accum(z, None, prng.box_muller(Arg(0), Arg(1), dtype), (a, b), [(i, n)], (Iter(i),), ((Iter(i),),) * 2)
    ctx = Context(backend)
    ctx.set(a, u1.astype(dtype.storage))
    ctx.set(b, u2.astype(dtype.storage))
    ctx.compile(Computation("box_muller", fill)).run()
    return ctx.get(z)


def grid_uniforms(dtype, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random pairs ``(u1, u2)`` on ``dtype``'s uniform grid (multiples of 2**-p), then
    every pairing of the extremes: ``1 - u1`` at 2**-p (the smallest), at 1, and at and beside
    each boundary ``sqrt(2) * 2**-k`` of the log's range reduction; ``u2`` at and beside each
    eighth of a turn (the cosine's zeros, extremes and quadrant boundaries)."""
    p = np.finfo(dtype.storage).nmant + 1
    step = 2.0**-p
    u1, u2 = RNG.integers(0, 2**p, (2, n)) * step
    boundaries = np.round(np.sqrt(2) * 2.0 ** -np.arange(1, p + 1) / step) * step
    v = np.clip(np.concatenate([[step, 1.0], boundaries, boundaries - step, boundaries + step]), step, 1.0)
    eighths = np.arange(8) / 8
    turns = np.clip(np.concatenate([eighths, eighths - step, eighths + step]), 0.0, 1.0 - step)
    edge1, edge2 = np.meshgrid(1.0 - v, turns)
    return np.concatenate([u1, edge1.ravel()]), np.concatenate([u2, edge2.ravel()])


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_box_muller_is_within_a_few_ulps_of_the_exact_transform(dtype):
    """Against the float64 transform of the same uniforms (for float64, numpy's few-ulp log and
    sine). The reference takes the cosine as ``sin(2 pi (|1/2 - u2| - 1/4))``, an identity, so
    that it stays relatively accurate near the cosine's zeros, where ``cos(2 pi u2)`` would
    round ``2 pi u2`` first."""
    u1, u2 = grid_uniforms(dtype, 100_000)
    z = box_muller_of(u1, u2, dtype).astype(np.float64)
    exact = np.sqrt(-2 * np.log1p(-u1)) * np.sin(2 * np.pi * (np.abs(0.5 - u2) - 0.25))
    eps = np.finfo(dtype.storage).eps
    assert np.all(np.abs(z - exact) <= 8 * eps * np.abs(exact))
    assert np.array_equal(z == 0, exact == 0)


@pytest.mark.parametrize("backend, dtype", [
    pytest.param(b, d, marks=backend_param(b).marks, id=f"{b}-{d.name}")
    for b, d in [("c", dtypes.float32), ("metal", dtypes.float32), ("triton", dtypes.float32),
                 ("c", dtypes.float64), ("triton", dtypes.float64)]  # Metal has no float64
])
def test_box_muller_has_the_interpreters_bits_on_every_backend(backend, dtype):
    """Only exactly rounded operators: the same bits everywhere, extremes included."""
    u1, u2 = grid_uniforms(dtype, 2000)
    np.testing.assert_array_equal(box_muller_of(u1, u2, dtype, backend), box_muller_of(u1, u2, dtype))


def test_normal_fill_statistics():
    node = TNode("z", (100_000,))
    z = run(prng.normal_fill(node, seed=0, stream=5)).get(node).astype(np.float64)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01  # about 3 standard errors
    assert abs(np.mean(np.abs(z) > 2) - 0.0455) < 0.003  # P(|z| > 2), within 4.5 standard errors
    assert np.abs(z).max() <= np.sqrt(-2 * np.log(2.0**-24)) * (1 + 1e-6)  # 1 - u1 >= 2**-24

def test_seeds_streams_and_draws_give_different_keys():
    node = TNode("w", (16,))
    fills = [run(prng.uniform_fill(node, seed, stream)).get(node) for seed, stream in [(0, 0), (1, 0), (0, 1)]]
    assert not np.array_equal(fills[0], fills[1]) and not np.array_equal(fills[0], fills[2])
    assert prng.key(5, 6, 1) == (5, 6, 1, 0)
    with pytest.raises(ValueError, match="seed"):
        prng.key(-1, 0)
    with pytest.raises(ValueError, match="stream"):
        prng.key(0, 2**32)


def test_printed_forms():
    node = TNode("w", (3, 5))
    fill = prng.uniform_fill(node, seed=0, stream=7, low=-0.5, high=0.5)
    assert format_cd("init", fill) == (
        "init ():\n"
        "  w =: -0.5 + (1.0 * (uniform1 (uint4x32(0, 7, 0, 0) ^^^^ (uint4x32_of cell_offset()))));\n"
    )
    assert format_routine(lower_routine("init", fill)) == (
        "init ():\n"
        "  for i0 = 0 to 2 {\n"
        "    for i1 = 0 to 4 {\n"
        "      w[i0, i1] := (-0.5 + (1.0 * uniform1(threefry4x32(uint4x32(0, 7, 0, 0), uint4x32_of(5*i0+i1)))));\n"
        "    }\n"
        "  }\n"
    )


def test_cell_offset_in_a_float_expression_is_the_offset():
    node = TNode("r", (2, 3))
    ctx = run(Accum(node, None, Apply(Binop.MUL, (CellOffset(), 2.0)), (), prng.every_cell(node)))
    np.testing.assert_array_equal(ctx.get(node), np.arange(6, dtype=np.float32).reshape(2, 3) * 2)


def test_apply_reads_uint4x32_operands_as_uint4x32():
    n = 8
    bits, out = TNode("bits", (n,), U4), TNode("out", (n,))
    words = RNG.integers(0, 2**32, (n, 4), dtype=np.uint32)
    fn = Apply(Binop.ADD, (Apply(Unop.UNIFORM1, (Apply(Binop.THREEFRY4X32, ((1, 2, 3, 4), Arg(0))),)), 1.0))
    i = Symbol()
    ctx = run(accum(out, None, fn, (bits,), [(i, n)], (Iter(i),), ((Iter(i),),)), {bits: words})
    expected = uniform1_float32(threefry4x32((1, 2, 3, 4), words)) + np.float32(1)
    np.testing.assert_array_equal(ctx.get(out), expected)


def test_type_errors():
    f = Const(0.5)
    bits = Const((1, 2, 3, 4), U4)
    with pytest.raises(DTypeError, match="threefry4x32 takes uint4x32"):
        Binary(Binop.THREEFRY4X32, f, f)
    with pytest.raises(DTypeError, match="not defined on uint4x32"):
        Binary(Binop.ADD, bits, bits)
    with pytest.raises(DTypeError, match="uniform1 converts a uint4x32"):
        Unary(Unop.UNIFORM1, f, to=dtypes.float32)
    with pytest.raises(DTypeError, match="uniform1 converts a uint4x32"):
        Unary(Unop.UNIFORM1, bits)
    with pytest.raises(DTypeError, match="uint4x32_of takes an integer"):
        Unary(Unop.UINT4X32_OF, f)
    with pytest.raises(DTypeError, match="not a conversion"):
        Unary(Unop.NEG, f, to=dtypes.float64)
    assert Unary(Unop.UINT4X32_OF, Const(3, dtypes.int32)).dtype is U4
    assert Unary(Unop.UNIFORM1, bits, to=dtypes.float64).dtype is dtypes.float64
    with pytest.raises(DTypeError, match="random fills make floats"):
        prng.uniform_fill(TNode("k", (2,), dtypes.int32), 0, 0)
    node = TNode("w", (2,))
    bad = Accum(node, None, Apply(Unop.UNIFORM1, (Apply(Binop.THREEFRY4X32, (3.0, 3.0)),)), (), prng.every_cell(node))
    with pytest.raises(DTypeError, match="tuple of four ints"):
        lower_routine("bad", bad)
