"""Integer arithmetic (docs/precisions.md, "Integer arithmetic"): integer operands keep an integer
precision, as PyTorch promotes; results wrap around (two's complement) alike on every backend; an
integer division by zero is an ``IntegerDivisionError`` naming where it happened; integers take
no gradient.

The tests that run code run on every backend available here (the Triton one under
``TRITON_INTERPRET=1``), against values numpy computes with the same wrap-around.
"""

from __future__ import annotations

import numpy as np
import pytest

from backend_params import default_context, runs_here
import ocannl as oc
from ocannl import train
from ocannl.backends.c.syntax import CSyntax
from ocannl.backends.metal.syntax import MetalSyntax
from ocannl.errors import IntegerDivisionError, OcannlError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DTypeError
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop

BACKENDS = ("interp", "c", "metal", "triton")

INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's and Triton's overflow warnings


@pytest.fixture(params=BACKENDS)
def ctx(request) -> oc.Context:
    """A context on the backend, made the default one (``t.numpy()`` runs there)."""
    return default_context(request.param)


def run_all(ctx: oc.Context, *tensors: oc.Tensor) -> list[np.ndarray]:
    """The values of ``tensors``, computed by one routine on ``ctx``."""
    for t in tensors:
        t.materialize()
    ctx.compile(*tensors).run()
    return [ctx.get(t.value) for t in tensors]


# ---------------------------------------------------------------------------------------------
# Integers stay integers, on every backend


def test_int64_sum_of_two_tensors_is_exact(ctx):
    """16777217 is not a float32: through float32 it became 16777216."""
    a = oc.tensor(np.array([16777217, 2**62 + 3, -5]), label="a")
    b = oc.tensor(np.array([0, 2**61, 7]), label="b")
    total, difference = run_all(ctx, a + b, a - b)
    assert (a + b).dtype is dtypes.int64
    assert total.dtype == np.int64
    assert total.tolist() == [16777217, 2**62 + 2**61 + 3, 2]
    assert difference.tolist() == [16777217, 2**61 + 3, -12]


def test_int32_sum_negation_and_abs_keep_int32(ctx):
    x = oc.tensor(np.array([16777217, -3, 5, 1000000], np.int32), label="x")
    total, negated, absolute, plus_one = run_all(ctx, x.sum(), -x, oc.abs(x), x + 1)
    for t in (x.sum(), -x, oc.abs(x), x + 1):
        assert t.dtype is dtypes.int32
    assert total.dtype == negated.dtype == np.int32
    assert int(total) == 16777217 + 2 + 1000000
    assert negated.tolist() == [-16777217, 3, -5, -1000000]
    assert absolute.tolist() == [16777217, 3, 5, 1000000]
    assert plus_one.tolist() == [16777218, -2, 6, 1000001]


def test_int32_overflow_wraps_alike_on_every_backend(ctx):
    """Two's complement, as numpy's int32 arithmetic: the same bits on every backend."""
    values = np.array([INT32_MAX, INT32_MIN, 46341, -7], np.int32)
    x = oc.tensor(values, label="x")
    y = oc.tensor(np.array([1, -1, 46341, 3], np.int32), label="y")
    results = run_all(ctx, x + y, x - y, x * y, -x, oc.abs(x), x.sum(), oc.fma(x, y, x),
                      oc.einsum("i;i=>", x, y), oc.div(x, y))
    with np.errstate(over="ignore"):
        expected = [values + y.data, values - y.data, values * y.data, -values, np.abs(values),
                    values.sum(dtype=np.int32), values * y.data + values, (values * y.data).sum(dtype=np.int32),
                    np.array([INT32_MAX, INT32_MIN, 1, -2], np.int32)]  # INT32_MIN / -1 wraps; -7 / 3 truncates
    for got, want in zip(results, expected):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_int64_overflow_wraps(ctx):
    big = oc.tensor(np.array([2**63 - 1, -(2**63)]), label="big")
    wrapped, negated = run_all(ctx, big + 1, -big)
    assert wrapped.tolist() == [-(2**63), -(2**63) + 1]
    assert negated.tolist() == [-(2**63) + 1, -(2**63)]


# ---------------------------------------------------------------------------------------------
# Division


def test_integer_division_by_zero_is_an_error_naming_the_divisor(ctx):
    x = oc.tensor(np.array([7, -7, 1], np.int32), label="numerators")
    y = oc.tensor(np.array([2, 2, 0], np.int32), label="divisors")
    with pytest.raises(IntegerDivisionError, match=r"(?s)integer div by zero.*divisors") as raised:
        oc.div(x, y, label="quotients").numpy()
    assert isinstance(raised.value, (OcannlError, ZeroDivisionError))
    y.set(np.array([2, 2, -1], np.int32))  # the context keeps working
    assert oc.div(x, y).numpy().tolist() == [3, -3, -1]


def test_a_division_where_the_divisor_is_zero_is_not_taken_raises_nothing(ctx):
    """``where`` computes only the branch it takes (Triton computes both, and checks the divisor
    only in the lanes that take the division)."""
    a = oc.tensor(np.array([7, 8, 9]), label="a")
    b = oc.tensor(np.array([2, 0, 3]), label="b")
    assert oc.where(b != 0, oc.div(a, b), 0).numpy().tolist() == [3, 0, 3]
    assert oc.where(b == 0, -1, oc.div(a, b)).numpy().tolist() == [3, -1, 3]
    with pytest.raises(IntegerDivisionError):
        oc.where(b == 0, oc.div(a, b), 0).numpy()


def test_true_division_of_integers_is_float32(ctx):
    """``/`` divides as Python, numpy and PyTorch do; ``oc.div`` keeps integers."""
    x = oc.tensor(np.array([7, -7, 1]), label="x")
    y = oc.tensor(np.array([2, 2, 0]), label="y")
    halves, quotients, by_zero = run_all(ctx, x / 2, oc.div(x, 2), x / y)
    assert (x / 2).dtype is dtypes.float32 and (x / y).dtype is dtypes.float32
    assert halves.tolist() == [3.5, -3.5, 0.5]
    assert quotients.dtype == np.int64 and quotients.tolist() == [3, -3, 0]
    assert by_zero.tolist() == [3.5, -3.5, np.inf]


# ---------------------------------------------------------------------------------------------
# Promotion


def test_mixed_operands_promote_as_pytorch():
    i32 = oc.tensor(np.array([1, 2], np.int32))
    i64 = oc.tensor(np.array([1, 2]))
    u32 = oc.tensor(np.array([1, 2], np.uint32))
    f32 = oc.tensor(np.array([1.0, 2.0], np.float32))
    f64 = oc.tensor(np.array([1.0, 2.0]), dtype="float64")
    cond = oc.tensor(np.array([1.0, 0.0], np.float32))
    cases = {
        "int32 + int64": (i32 + i64, dtypes.int64),
        "int32 * uint32": (i32 * u32, dtypes.uint32),
        "int64 + float32": (i64 + f32, dtypes.float32),
        "int32 * float64": (i32 * f64, dtypes.float64),
        "int32 + an int": (i32 + 3, dtypes.int32),
        "int32 * a float": (i32 * 0.5, dtypes.float32),
        "int32 + 1.0": (i32 + 1.0, dtypes.float32),
        "int64 / int64": (i64 / i64, dtypes.float32),
        "oc.div int64": (oc.div(i64, i64), dtypes.int64),
        "int64 ** 2": (i64**2, dtypes.float32),
        "exp of int32": (oc.exp(i32), dtypes.float32),
        "mean of int64": (i64.mean(), dtypes.float32),
        "max of int64": (i64.max(), dtypes.int64),
        "int64 < int64": (i64 < i64, dtypes.int64),
        "where, int64 branches": (oc.where(cond, i64, 0), dtypes.int64),
        "where, int32 condition": (oc.where(i32, f32, 0.0), dtypes.float32),
        "matmul of int32": (oc.einsum("i;i=>", i32, i32), dtypes.int32),
        "numbers only": (oc.number(2) + 3, dtypes.float32),
    }
    for name, (t, expected) in cases.items():
        assert t.dtype is expected, name


def test_a_number_an_integer_result_cannot_hold_is_refused():
    ids = oc.tensor(np.array([1, 2], np.int32), label="ids")
    with pytest.raises(DTypeError, match=r"mul: the number 1099511627776 does not fit .*int32.*dtype='int64'"):
        ids * 2**40
    with pytest.raises(DTypeError, match=r"add: the number -1 does not fit .*uint32"):
        oc.tensor(np.array([1], np.uint32)) + (-1)
    assert (ids * 2**40.0).dtype is dtypes.float32  # a float number asks for a float result


def test_large_integer_numbers_stay_exact(ctx):
    """A number meeting int64 data is inlined as an integer, not through a float."""
    x = oc.tensor(np.array([0, 1]), label="x")
    assert (x + (2**53 + 1)).numpy().tolist() == [2**53 + 1, 2**53 + 2]


# ---------------------------------------------------------------------------------------------
# Gradients


def test_integers_take_no_gradient():
    """PyTorch refuses gradients to integer tensors; here they have none, and a float
    parameter meeting integer data gets its gradient as usual."""
    counts = oc.param("counts", output=2, init=np.array([1, 2]), dtype="int64")
    assert not counts.requires_grad and not (counts * 3).requires_grad
    w = oc.param("w", output=2, init=np.array([0.5, -1.0]))
    data = oc.tensor(np.array([3, 4]), label="data")
    loss = (w * data).sum()
    assert loss.dtype is dtypes.float32 and loss.requires_grad
    ctx = oc.Context("interp")
    ctx.compile(train.grad_update(loss)).run()
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 4.0])


# ---------------------------------------------------------------------------------------------
# How the C family and Triton spell integer arithmetic


@pytest.mark.parametrize("syntax", [CSyntax, MetalSyntax], ids=["c", "metal"])
def test_signed_arithmetic_is_printed_through_unsigned(syntax):
    """Signed overflow is undefined behaviour in C and MSL: signed sums, differences, products
    and negations are computed in the unsigned type of their width and converted back."""
    s = syntax()
    for dtype in (dtypes.int32, dtypes.int64):
        unsigned = s.uint64_type if dtype is dtypes.int64 else s.storage_type(dtypes.uint32)
        printed = [s.binary(op, dtype, "a", "b") for op in (Binop.ADD, Binop.SUB, Binop.MUL)]
        printed += [s.unary(Unop.NEG, dtype, "a"), s.ternary(Ternop.FMA, dtype, "a", "b", "c"),
                    s.ternary(Ternop.MUL3, dtype, "a", "b", "c")]
        for text in printed:
            assert unsigned in text, text
    assert s.binary(Binop.ADD, dtypes.uint32, "a", "b") == "(a + b)"
    assert s.binary(Binop.ADD, dtypes.float32, "a", "b") == "(a + b)"


@pytest.mark.skipif(not runs_here("triton"), reason="the Triton backend is not available here")
def test_triton_division_check_compiles_for_the_gpu():
    """The divisor check of an integer division (an atomic on the error flag, a select), alone
    and in a ``where`` branch, is code Triton's compiler accepts for an H100, for every integer
    type."""
    from ocannl.backends.triton import generate
    from ocannl.backends.triton.gpu_check import compile_for_gpu
    from ocannl.lowlevel.lower import lower_routine
    from ocannl.lowlevel.optimize import materialized_nodes, optimize

    sources = []
    for dtype in ("int32", "int64", "uint32"):
        x = oc.tensor(np.array([7, 9, 4]), dtype=dtype, label="x")
        y = oc.tensor(np.array([2, 3, 1]), dtype=dtype, label="y")
        for k, q in enumerate((oc.div(x, y), oc.where(y != 0, oc.div(x, y), 0))):
            unoptimized = lower_routine(f"div_{dtype}_{k}", q.to_computation().body)
            sources.append(generate(optimize(unoptimized, materialized_nodes(unoptimized) | {q.value})))
    assert all("tl.atomic_max(error" in s.text for s in sources)
    assert compile_for_gpu(sources)


def test_an_integer_parameter_is_left_out_of_the_optimizer_step():
    scale = oc.param("scale", output=3, dtype=dtypes.int32, init=np.array([1, 2, 3], np.int32))
    w = oc.param("w", output=3, init=np.ones(3, np.float32))
    update = train.grad_update((w * scale).sum())
    assert [p.label for p in update.params] == ["w"]
    ctx = oc.Context("interp")
    ctx.compile(update, train.sgd_update(update, lr=0.5)).run()
    np.testing.assert_array_equal(ctx.get(w.value), [0.5, 0.0, -0.5])
    np.testing.assert_array_equal(ctx.get(scale.value), [1, 2, 3])
