"""Numeric edge cases every backend computes alike (docs/semantics.md, "Numerics"), each on
interp (vectorized and scalar), c, metal (the C++ shim) and triton (its CPU interpreter):

* a gather position with no index value (NaN, an infinity, a float past the index range) is an
  ``OutOfBoundsError``, not row 0;
* size-0 axes: a sum over one is 0, a max -inf, a result with one has no cells;
* ``pow`` is C99's, special values included, whether the exponent is a constant or a tensor;
* the math-library operators stay within the stated bound of the interpreter, the correctly
  rounded ones are bit for bit the interpreter's, and ``python -m ocannl doctor`` says so;
* C's float32 ``exp`` is its own helper, within 1 ulp of the correctly rounded result.
"""

from __future__ import annotations

import contextlib
import io
import math
import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import ocannl as oc  # noqa: E402
from backend_params import context  # noqa: E402
from ocannl import train  # noqa: E402
from ocannl.__main__ import doctor  # noqa: E402
from ocannl.backends.c.syntax import CSyntax  # noqa: E402
from ocannl.backends.metal.syntax import MetalSyntax  # noqa: E402
from ocannl.errors import OutOfBoundsError  # noqa: E402
from ocannl.lowlevel import dtypes  # noqa: E402
from ocannl.lowlevel.scalar_ops import LIBM_MAX_ULPS, LIBM_OPS, Unop  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

BACKENDS = ("interp", "interp-scalar", "c", "metal", "triton")
"""``interp`` runs vectorized; ``interp-scalar`` is its literal walk, the executable semantics."""
CPU_BACKENDS = ("c", "metal")  # compiled for this CPU against its C library, as the interpreter


def run(ctx: oc.Context, *tensors: oc.Tensor) -> list[np.ndarray]:
    ctx.compile(*tensors).run()
    return [ctx.get(t.value) for t in tensors]


def ulps_apart(expected: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Units in the last place between two float arrays of one type (NaNs equal each other)."""
    ints = np.int32 if expected.dtype == np.float32 else np.int64
    sign = ints(np.iinfo(ints).max)

    def ordered(a: np.ndarray) -> np.ndarray:
        i = a.view(ints).astype(np.int64)
        return np.where(i < 0, -(i & sign), i)

    apart = np.abs(ordered(expected) - ordered(got))
    both_nan = np.isnan(expected) & np.isnan(got)
    apart[both_nan] = 0
    apart[np.isnan(expected) != np.isnan(got)] = np.iinfo(np.int64).max
    return apart


def same_bits(expected: np.ndarray, got: np.ndarray) -> bool:
    """Equal values with equal signs (zeros included); any NaN equals any NaN."""
    signs = (np.signbit(expected) == np.signbit(got)) | np.isnan(expected)
    return bool((ulps_apart(expected, got) == 0).all() and signs.all())


# ---------------------------------------------------------------------------------------------
# Gather positions without an index value


TABLE = np.arange(12, dtype=np.float32).reshape(4, 3) + 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("position", [math.nan, math.inf, -math.inf, 2.0**32 + 1, 2.0**31, -1.0],
                         ids=["nan", "inf", "-inf", "2**32+1", "2**31", "-1"])
def test_a_gather_position_without_a_row_is_out_of_bounds(backend, position):
    ctx = context(backend)
    rows = oc.take(oc.tensor(TABLE), oc.tensor(np.array([1.0, position], dtype=np.float32)))
    with pytest.raises(OutOfBoundsError):
        run(ctx, rows)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_gather_positions_truncate_toward_zero(backend):
    ctx = context(backend)
    rows = oc.take(oc.tensor(TABLE), oc.tensor(np.array([-0.5, 3.9, 1.0, 2.5], dtype=np.float32)))
    (got,) = run(ctx, rows)
    np.testing.assert_array_equal(got, TABLE[[0, 3, 1, 2]])


# ---------------------------------------------------------------------------------------------
# Size-0 axes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(4, 0), (0, 3), (0,)])
def test_a_sum_over_no_cell_is_zero_and_a_max_is_minus_infinity(backend, shape):
    ctx = context(backend)
    x = oc.tensor(np.ones(shape, dtype=np.float32))
    total, largest = run(ctx, x.sum(), oc.max(x))
    assert total.shape == () and total == 0.0
    assert largest.shape == () and largest == -np.inf


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mean_over_no_cell_is_nan(backend):
    ctx = context(backend)
    (mean,) = run(ctx, oc.mean(oc.tensor(np.ones((4, 0), dtype=np.float32))))
    assert mean.shape == () and np.isnan(mean)


@pytest.mark.parametrize("backend", BACKENDS)
def test_results_with_a_size_0_axis_are_empty(backend):
    ctx = context(backend)
    a, b = oc.tensor(np.ones((0, 3), dtype=np.float32)), oc.tensor(np.ones((4, 0), dtype=np.float32))
    got = run(ctx, a * 2, b + 1, oc.relu(a), oc.einsum("ij=>j", b))
    assert [g.shape for g in got] == [(0, 3), (4, 0), (0, 3), (0,)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_empty_contraction_resets_its_result(backend):
    """Each cell of the result reduces no cell: it is the neutral element, even where the result's
    buffer held something before the run."""
    ctx = context(backend)
    a, b = oc.tensor(np.ones((2, 0), dtype=np.float32)), oc.tensor(np.ones((0, 3), dtype=np.float32))
    product, rows = oc.einsum("ij;jk=>ik", a, b), oc.einsum("ij=>i", a)
    routine = ctx.compile(product, rows)
    ctx.set(product.value, np.full((2, 3), 7.0, dtype=np.float32))
    ctx.set(rows.value, np.full((2,), 7.0, dtype=np.float32))
    routine.run()
    np.testing.assert_array_equal(ctx.get(product.value), np.zeros((2, 3), dtype=np.float32))
    np.testing.assert_array_equal(ctx.get(rows.value), np.zeros((2,), dtype=np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_empty_batch_contributes_no_gradient(backend):
    ctx = context(backend)
    w = oc.param("w", output=3, init=1.0)
    x = oc.tensor(np.ones((0, 3), dtype=np.float32), batch=1)
    loss = (w * x).sum() + (w * w).sum()
    ctx.compile(train.grad_update(loss)).run()
    np.testing.assert_array_equal(w.grad.numpy(), np.full(3, 2.0, dtype=np.float32))
    assert loss.numpy() == 3.0


# ---------------------------------------------------------------------------------------------
# pow: C99's, special values included


def c99_pow(x: float, y: float) -> float:
    """``pow(x, y)`` by the special-value rules of C99 (Annex F.9.4.4), written out; the finite
    cases by Python's float power of ``|x|`` in double precision."""
    integer = math.isfinite(y) and y == math.floor(y)
    odd = integer and abs(y) < 2.0**53 and int(y) % 2 == 1
    if y == 0 or x == 1:
        return 1.0
    if math.isnan(x) or math.isnan(y):
        return math.nan
    if x == 0:
        if y < 0:
            return math.copysign(math.inf, x) if odd else math.inf
        return math.copysign(0.0, x) if odd else 0.0
    if math.isinf(y):
        if abs(x) == 1:
            return 1.0
        return (0.0 if y > 0 else math.inf) if abs(x) < 1 else (math.inf if y > 0 else 0.0)
    if math.isinf(x):
        if x < 0:
            return (-0.0 if odd else 0.0) if y < 0 else (-math.inf if odd else math.inf)
        return 0.0 if y < 0 else math.inf
    if x < 0 and not integer:
        return math.nan
    try:
        r = abs(x) ** y
    except OverflowError:
        r = math.inf
    return -r if x < 0 and odd else r


BASES = [-math.inf, -4.0, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 4.0, math.inf, math.nan]
EXPONENTS = [-math.inf, -3.0, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, math.inf, math.nan]


@pytest.mark.parametrize("backend", BACKENDS)
def test_pow_follows_c99_special_values(backend):
    ctx = context(backend)
    xs, ys = (np.array(v, dtype=np.float32) for v in zip(*[(x, y) for x in BASES for y in EXPONENTS]))
    (got,) = run(ctx, oc.tensor(xs) ** oc.tensor(ys))
    expected = np.array([c99_pow(float(x), float(y)) for x, y in zip(xs, ys)], dtype=np.float32)
    special = ~np.isfinite(expected) | (expected == 0) | (np.abs(expected) == 1)
    for i in np.flatnonzero(special):
        assert same_bits(expected[i:i + 1], got[i:i + 1]), f"pow({xs[i]}, {ys[i]}) = {got[i]}, not {expected[i]}"
    # The others are libm's approximations: Triton's exp2(b * log2|a|) within a few ulps.
    tolerance = 4 if backend == "triton" else 1
    assert (ulps_apart(expected[~special], got[~special]) <= tolerance).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("exponent", [0.5, 2.0, 3.0, -1.0, -0.5, 1.5])
def test_pow_with_a_constant_exponent_equals_pow_with_a_tensor_one(backend, exponent):
    """No backend rewrites ``x ** 0.5`` as ``sqrt(x)`` (-0.0 and -inf differ) or ``x ** 2`` as
    ``x * x`` (``4097 ** 2`` is a tie that C's ``powf`` rounds up)."""
    ctx = context(backend)
    xs = np.array([-np.inf, -4.0, -1.0, -0.0, 0.0, 0.3, 3.0, 4097.0, np.inf, np.nan], dtype=np.float32)
    x = oc.tensor(xs)
    constant, tensor = run(ctx, x ** exponent, x ** oc.tensor(np.full(xs.shape, exponent, dtype=np.float32)))
    assert same_bits(constant, tensor)
    if exponent == 0.5:
        assert same_bits(constant[:5], np.array([np.inf, np.nan, np.nan, 0.0, 0.0], dtype=np.float32))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow_is_the_interpreters_bit_for_bit_on_cpu_backends(backend, dtype):
    if backend == "metal" and dtype == "float64":
        pytest.skip("Metal has no float64")
    ctx = context(backend)
    rng = np.random.default_rng(3)
    xs = np.concatenate([rng.uniform(0, 10, 3000), rng.uniform(-10, 0, 1000), [4097.0, 3.0]]).astype(dtype)
    ys = np.concatenate([rng.uniform(-8, 8, 3000), rng.integers(-4, 5, 1000), [2.0, 2.0]]).astype(dtype)
    x, y = oc.tensor(xs, dtype=dtype), oc.tensor(ys, dtype=dtype)
    (expected,) = run(oc.Context("interp"), x ** y)
    (got,) = run(ctx, x ** y)
    assert same_bits(expected, got)


def test_triton_kernels_of_these_edges_compile_for_a_gpu():
    """Triton's interpreter accepts what its compiler rejects (a scalar pointer under a block mask,
    as a size-0 axis's zero strides would give): the kernels above also compile for sm_90."""
    context("triton")
    from ocannl import session
    from ocannl.backends.triton import generate
    from ocannl.backends.triton.gpu_check import compile_for_gpu

    def routines(*tensors: oc.Tensor) -> list:
        ctx, irs = oc.Context("interp"), []
        compile_ir = ctx.backend.compile
        ctx.backend.compile = lambda ir: (irs.append(ir), compile_ir(ir))[1]
        ctx.compile(*tensors)
        return irs

    def ones(*shape: int) -> oc.Tensor:
        return oc.tensor(np.ones(shape, dtype=np.float32))

    session.reset()
    irs = routines(ones(5) ** 0.5, ones(5) ** ones(5), oc.take(ones(4, 3), oc.tensor(np.array([1.0, 2.0], np.float32))))
    irs += routines(ones(4, 0).sum(), oc.max(ones(3, 0)), ones(0, 3) * 2,
                    oc.einsum("ij;jk=>ik", ones(2, 0), ones(0, 3)))
    assert compile_for_gpu([generate(ir) for ir in irs])


# ---------------------------------------------------------------------------------------------
# The math-library operators: within the stated bound, every other operator exact


def probe(n: int, low: float, high: float, dtype: str, seed: int) -> np.ndarray:
    """Half of ``n`` values spread over ``[low, high]``, half random bit patterns of every finite
    magnitude and sign."""
    rng = np.random.default_rng(seed)
    ints = np.uint32 if dtype == "float32" else np.uint64
    bits = rng.integers(0, np.iinfo(ints).max, n - n // 2, dtype=ints, endpoint=True).view(dtype)
    return np.concatenate([rng.uniform(low, high, n // 2).astype(dtype), bits[np.isfinite(bits)]])


DOMAINS = {"exp": (-104, 89), "exp2": (-150, 128), "log": (0, 100), "log2": (0, 100), "sin": (-10, 10),
           "cos": (-10, 10), "tanh": (-10, 10), "sigmoid": (-20, 20), "erf": (-6, 6), "sqrt": (0, 100),
           "recip": (-10, 10), "recip_sqrt": (0, 100)}
EXACT = ("sqrt", "recip", "recip_sqrt")


def measure(backend: str, op: str, n: int, dtype: str) -> np.ndarray:
    xs = probe(n, *DOMAINS[op], dtype, seed=sorted(DOMAINS).index(op))
    x = oc.tensor(xs, dtype=dtype)
    (expected,) = run(oc.Context("interp"), getattr(oc, op)(x))
    (got,) = run(context(backend), getattr(oc, op)(x))
    return ulps_apart(expected, got)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("op", sorted(DOMAINS))
def test_math_library_operators_stay_within_the_stated_bound(backend, op):
    apart = measure(backend, op, 20_000, "float32")
    bound = LIBM_MAX_ULPS if any(o.value == op for o in LIBM_OPS) else 0
    assert apart.max() <= bound, f"{op} on {backend}: {apart.max()} ulps from the interpreter"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", sorted(DOMAINS))
def test_math_library_bound_over_a_million_values(op, dtype):
    """The measurement behind ``LIBM_MAX_ULPS``: 10^6 arguments per operator and precision."""
    apart = measure("c", op, 1_000_000, dtype)
    bound = LIBM_MAX_ULPS if op not in EXACT else 0
    assert apart.max() <= bound, f"{op} {dtype}: {apart.max()} ulps from the interpreter"


def test_doctor_states_what_is_bit_identical_and_the_bound():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        doctor()
    text = out.getvalue()
    if "C flags: deterministic" not in text:
        pytest.skip("no C compiler here, or the fast setting is on")
    line = next(line for line in text.splitlines() if line.startswith("C flags:"))
    assert "bit-identical to interp except" in line and f"within {LIBM_MAX_ULPS} ulps" in line
    for op in LIBM_OPS:
        assert op.value in line
    assert "pow" not in line.split("except", 1)[1]


# ---------------------------------------------------------------------------------------------
# C's float32 exp: a helper of the project's own (ocannl_exp_f32), not the C library's expf


def test_c_prints_its_own_float32_exp_and_metal_keeps_precise_exp():
    c, metal = CSyntax(), MetalSyntax()
    assert c.unary(Unop.EXP, dtypes.float32, "x") == "ocannl_exp_f32(x)"
    assert "ocannl_exp_f32(-x)" in c.unary(Unop.SIGMOID, dtypes.float32, "x")
    assert c.unary(Unop.EXP, dtypes.float64, "x") == "exp(x)"
    assert "static inline float ocannl_exp_f32(float x) {" in "\n".join(c.builtins())
    assert metal.unary(Unop.EXP, dtypes.float32, "x") == "precise::exp(x)"
    metal.unary(Unop.ERF, dtypes.float32, "x")  # MSL's erf helper calls exp
    assert "precise::exp(" in "\n".join(metal.builtins()) and "ocannl_exp" not in "\n".join(metal.builtins())


EXP_EDGES = np.array([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan,
                      88.72283, 88.72284, 89.0, 130.0, 131.0, 3.4e38,  # the largest finite result, then inf
                      -87.33654, -87.33655, -103.27893, -103.97207, -103.97208, -104.0, -130.0, -131.0, -3.4e38,
                      1.4e-45, -1.4e-45, 1e-30, -1e-30, 1e-7, -1e-7, 0.34657359, -0.34657359, 1.0, -1.0],
                     dtype=np.float32)
"""Signed zeros, infinities, NaNs, the overflow threshold (88.7228...), the smallest normal
(-87.3365...) and subnormal (-103.972...) results, the helper's clamp (130 at either sign), arguments
too small to move the result off 1, and the edges of the range reduction (``ln 2 / 2``)."""


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_float32_exp_is_within_the_bound_and_1_ulp_of_the_correctly_rounded_result(backend):
    xs = np.concatenate([EXP_EDGES, probe(100_000, *DOMAINS["exp"], "float32", seed=24),
                         np.linspace(-104, -87, 2_000, dtype=np.float32)])  # subnormal results
    x = oc.tensor(xs)
    (expected,) = run(oc.Context("interp"), oc.exp(x))
    (got,) = run(context(backend), oc.exp(x))
    with np.errstate(over="ignore"):
        correctly_rounded = np.exp(xs.astype(np.float64)).astype(np.float32)
    edges = slice(0, len(EXP_EDGES))
    special = ~np.isfinite(expected[edges]) | (expected[edges] == 0) | (expected[edges] == 1)
    assert same_bits(expected[edges][special], got[edges][special])
    assert ulps_apart(expected, got).max() <= LIBM_MAX_ULPS
    assert ulps_apart(correctly_rounded, got).max() <= 1
