"""The executable operator table: for every operator of the catalogue, the scalar form, the array
form and constant folding compute the same bits over a grid of special values."""

import math

import numpy as np
import pytest

from ocannl.lowlevel import dtypes, op_semantics as ops
from ocannl.lowlevel.scalar_ops import PRNG_OPS, Binop, Unop

FLOAT_GRID = [0.0, -0.0, 1.0, -1.0, 0.5, -1.5, 2.0, 3.0, 0.1, 1e-45, 5e-324, 3.4e38, 1.7e308,
              math.inf, -math.inf, math.nan]
COMPUTE_TYPES = [dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64]
UNARY = [op for op in Unop if op not in PRNG_OPS]
BINARY = [op for op in Binop if op not in PRNG_OPS]


def grid(dtype):
    """Special values of ``dtype``: NaN, infinities, signed zeros, subnormals and the extremes for
    a float; 0, ±1, small values and both ends of the range for an integer."""
    if dtype.is_float:
        with np.errstate(all="ignore"):
            return np.array(FLOAT_GRID, dtype.storage)
    info = np.iinfo(dtype.storage)
    values = {0, 1, 2, 7, int(info.max), int(info.max) - 1, int(info.min), int(info.min) + 1}
    if info.min < 0:
        values |= {-1, -2, -7}
    return np.array(sorted(values), dtype.storage)


def bits(value, dtype):
    """The stored bits of one result (every NaN is one value: numpy may pick another payload)."""
    v = np.asarray(value, dtype.storage)
    if dtype.is_float and np.isnan(v):
        return "nan"
    return v.tobytes()


def applies(op, dtype):
    return dtype.is_float or not op.float_only


@pytest.mark.parametrize("op, dtype", [(op, dtype) for op in UNARY for dtype in COMPUTE_TYPES if applies(op, dtype)],
                         ids=lambda x: getattr(x, "name", None) or x.value)
def test_unary_forms_and_folding_agree(op, dtype):
    xs = grid(dtype)
    scalar, t = ops.scalar_unary(op, dtype), dtype.scalar
    with np.errstate(all="ignore"):
        array = ops.array_unary(op, dtype)(xs)
        for j, x in enumerate(xs):
            expected = bits(scalar(t(x)), dtype)
            assert bits(array[j], dtype) == expected, (op, dtype.name, x)
            folded = ops.fold_unary(op, t(x), dtype)
            assert (folded is not None) == (op in ops.FOLDED_UNARY), (op, dtype.name, x)
            if folded is not None:
                assert bits(folded, dtype) == expected, (op, dtype.name, x)


@pytest.mark.parametrize("op, dtype", [(op, dtype) for op in BINARY for dtype in COMPUTE_TYPES if applies(op, dtype)],
                         ids=lambda x: getattr(x, "name", None) or x.value)
def test_binary_forms_and_folding_agree(op, dtype):
    xs = grid(dtype)
    a, b = (g.ravel() for g in np.meshgrid(xs, xs, indexing="ij"))
    scalar, t = ops.scalar_binary(op, dtype), dtype.scalar
    quotient = op in (Binop.DIV, Binop.MOD) and not dtype.is_float
    with np.errstate(all="ignore"):
        if quotient:
            with pytest.raises(ZeroDivisionError):
                ops.array_binary(op, dtype)(a, b)
            keep = b != 0
            array = ops.array_binary(op, dtype)(a[keep], b[keep])
            a, b = a[keep], b[keep]
        else:
            array = ops.array_binary(op, dtype)(a, b)
        for j, (x, y) in enumerate(zip(a, b)):
            expected = bits(scalar(t(x), t(y)), dtype)
            assert bits(array[j], dtype) == expected, (op, dtype.name, x, y)
            folded = ops.fold_binary(op, t(x), t(y), dtype)
            assert (folded is not None) == (op in ops.FOLDED_BINARY), (op, dtype.name, x, y)
            if folded is not None:
                assert bits(folded, dtype) == expected, (op, dtype.name, x, y)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint32, dtypes.int64], ids=lambda d: d.name)
def test_integer_quotients_truncate_wrap_and_leave_zero_divisors_unfolded(dtype):
    t, low = dtype.scalar, int(np.iinfo(dtype.storage).min)
    div, mod = ops.scalar_binary(Binop.DIV, dtype), ops.scalar_binary(Binop.MOD, dtype)
    if low < 0:
        assert int(div(t(-7), t(2))) == -3 and int(mod(t(-7), t(2))) == -1  # toward zero, as C
        assert int(div(t(low), t(-1))) == low  # wraps around
    with pytest.raises(ZeroDivisionError):
        div(t(1), t(0))
    assert ops.fold_binary(Binop.DIV, t(1), t(0), dtype) is None
    assert ops.fold_binary(Binop.MOD, t(1), t(0), dtype) is None


@pytest.mark.parametrize("dtype", COMPUTE_TYPES, ids=lambda d: d.name)
def test_fma_forms_agree(dtype):
    xs = grid(dtype)[:8]
    a, b, c = (g.ravel() for g in np.meshgrid(xs, xs, xs, indexing="ij"))
    scalar, t = ops.scalar_fma(dtype), dtype.scalar
    with np.errstate(all="ignore"):
        array = ops.array_fma(dtype)(a, b, c)
        for j, (x, y, z) in enumerate(zip(a, b, c)):
            assert bits(array[j], dtype) == bits(scalar(t(x), t(y), t(z)), dtype), (dtype.name, x, y, z)


def test_pow_is_the_c_library_pow_not_sqrt():
    """``pow(-0.0, 0.5)`` is +0.0 and ``pow(-inf, 0.5)`` is +inf in both forms (``sqrt`` would
    give -0.0 and NaN)."""
    for dtype in (dtypes.float32, dtypes.float64):
        t = dtype.scalar
        base, half = np.array([-0.0, -math.inf], dtype.storage), np.array([0.5, 0.5], dtype.storage)
        array = ops.array_binary(Binop.POW, dtype)(base, half)
        assert [math.copysign(1, v) for v in array] == [1, 1] and array[1] == math.inf
        assert math.copysign(1, ops.scalar_binary(Binop.POW, dtype)(t(-0.0), t(0.5))) == 1

