"""What every scalar operator computes, as executable Python: the one place an operator's meaning
is written down as code.

:mod:`ocannl.lowlevel.scalar_ops` names the operators and states their meaning in prose; this
module is that meaning, run. Each operator has two forms side by side:

* the *scalar* form (:func:`scalar_unary`, :func:`scalar_binary`, :func:`scalar_fma`) on numpy
  scalars of the node's compute type; the scalar interpreter calls it once per cell and constant
  folding (:func:`fold_unary`, :func:`fold_binary`) calls it at compile time;
* the *array* form (:func:`array_unary`, :func:`array_binary`, :func:`array_fma`) on numpy arrays
  of the same type, bit for bit the scalar form applied to every element; the vectorized
  interpreter calls it once per loop nest. Where numpy has no array routine with exactly the
  scalar's bits, the array form applies the scalar form elementwise.

Exactness rules the two forms share (and which the compiled backends reproduce):

* ``pow`` is C99's ``pow`` through ``operator.pow`` on numpy scalars, never ``np.power`` on
  arrays, whose loops compute a broadcast exponent of 0.5 or 2 as ``sqrt`` or a square;
* the libm operators (``scalar_ops.LIBM_OPS``) are numpy's, within ``scalar_ops.LIBM_MAX_ULPS``
  of the C library's; they are never folded, since the backend computing them may round
  differently from the compiler's host;
* integer ``div`` and ``mod`` truncate toward zero; a zero divisor raises ``ZeroDivisionError``
  (the interpreter's runtime fault; folding leaves such an expression alone);
* every other integer result wraps around modulo 2**bits.

The uint4x32 word operators (``uint4x32_pack``, ``uint4x32_word``) have their scalar and array
forms apart from the tables, since their values are not scalars of one compute type.

Adding an operator: its member in ``scalar_ops``, one entry in each of the two tables here, and
one rendering line per emitter (``docs/operators.md``).
"""

from __future__ import annotations

import math
import operator
import struct
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.scalar_ops import Binop, Unop

# ---------------------------------------------------------------------------------------------
# Scalar forms.

_UFUNC_UNARY: dict[Unop, Callable[[Any], Any]] = {
    Unop.EXP: np.exp,
    Unop.LOG: np.log,
    Unop.EXP2: np.exp2,
    Unop.LOG2: np.log2,
    Unop.SIN: np.sin,
    Unop.COS: np.cos,
    Unop.SQRT: np.sqrt,
    Unop.TANH: np.tanh,
}
"""The unary operators that are one numpy ufunc, which is both their scalar and their array form
(the same inner loop on one value as on many)."""


def scalar_unary(op: Unop, dtype: DType) -> Callable[[Any], Any]:
    """``op`` on one value of ``dtype``'s compute type."""
    t = dtype.scalar
    zero, one = t(0), t(1)
    table: dict[Unop, Callable[[Any], Any]] = {
        Unop.ID: lambda x: x,
        Unop.RELU: lambda x: x if x > zero else zero,
        Unop.SAT01: lambda x: zero if not x > zero else (x if x < one else one),
        **_UFUNC_UNARY,
        Unop.RECIP: lambda x: one / x,
        Unop.RECIP_SQRT: lambda x: one / np.sqrt(x),
        Unop.NEG: operator.neg,
        Unop.SIGMOID: lambda x: one / (one + np.exp(-x)),
        Unop.ERF: lambda x: t(math.erf(x)),
        Unop.ABS: abs,
        Unop.NOT: lambda x: one if x == zero else zero,
    }
    return table[op]


def scalar_binary(op: Binop, dtype: DType) -> Callable[[Any, Any], Any]:
    """``op`` on two values of ``dtype``'s compute type."""
    t = dtype.scalar
    zero, one = t(0), t(1)
    table: dict[Binop, Callable[[Any, Any], Any]] = {
        Binop.ADD: operator.add,
        Binop.SUB: operator.sub,
        Binop.MUL: operator.mul,
        Binop.DIV: operator.truediv if dtype.is_float else _int_div(dtype),
        # C's pow through numpy's scalar power, special values included; not np.power, whose
        # ufunc computes a broadcast exponent of 0.5 as sqrt (sqrt(-0.0) is -0.0, pow gives +0.0).
        Binop.POW: operator.pow,
        Binop.MAX: lambda a, b: a if a > b or b != b else b,
        Binop.MIN: lambda a, b: a if a < b or b != b else b,
        Binop.LT: lambda a, b: one if a < b else zero,
        Binop.GT: lambda a, b: one if a > b else zero,
        Binop.EQ: lambda a, b: one if a == b else zero,
        Binop.NE: lambda a, b: one if a != b else zero,
        Binop.RELU_GATE: lambda a, b: b if a > zero else zero,
        Binop.SAT01_GATE: lambda a, b: b if zero < a < one else zero,
        Binop.MOD: np.fmod if dtype.is_float else _int_mod(dtype),
        Binop.AND: lambda a, b: one if a != zero and b != zero else zero,
        Binop.OR: lambda a, b: one if a != zero or b != zero else zero,
    }
    return table[op]


def truncated_quotient(a: int, b: int) -> int:
    """C's integer quotient: rounded toward zero (``ZeroDivisionError`` when ``b`` is 0)."""
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def _int_div(dtype: DType) -> Callable[[Any, Any], Any]:
    return lambda a, b: dtypes.wrap_int(dtype, truncated_quotient(int(a), int(b)))


def _int_mod(dtype: DType) -> Callable[[Any, Any], Any]:
    def mod(a: Any, b: Any) -> Any:
        a, b = int(a), int(b)
        return dtypes.wrap_int(dtype, a - b * truncated_quotient(a, b))

    return mod


def scalar_fma(dtype: DType) -> Callable[[Any, Any, Any], Any]:
    """``a * b + c`` with one rounding (exact, then wrapped, on integers)."""
    if dtype is dtypes.float32:
        return _fma_float32
    if dtype is dtypes.float64:
        return _fma_float64
    return lambda a, b, c: dtypes.wrap_int(dtype, int(a) * int(b) + int(c))


def _fma_float32(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """``a * b + c`` rounded once to float32. The product is exact in double; the sum is rounded
    to odd in double (53 >= 24 + 2 bits), after which rounding to float32 is correct."""
    p, z = float(a) * float(b), float(c)
    s = p + z
    if math.isfinite(s):
        v = s - p
        err = (p - (s - v)) + (z - v)  # TwoSum: p + z == s + err exactly
        if err != 0 and not struct.unpack("<Q", struct.pack("<d", s))[0] & 1:
            s = math.nextafter(s, math.inf if err > 0 else -math.inf)
    return np.float32(s)


def _fma_float64(a: np.float64, b: np.float64, c: np.float64) -> np.float64:
    """``a * b + c`` rounded once, through exact rationals (``Fraction`` to float rounds
    correctly)."""
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return np.float64(float(a) * float(b) + float(c))
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    try:
        return np.float64(float(exact))
    except OverflowError:
        return np.float64(math.inf if exact > 0 else -math.inf)


# ---------------------------------------------------------------------------------------------
# Array forms: the scalar forms on every element, bit for bit.


def array_unary(op: Unop, dtype: DType) -> Callable[[Any], Any]:
    """:func:`scalar_unary` on every element of an array of ``dtype``'s compute type."""
    t = dtype.storage.type
    zero, one = t(0), t(1)
    table: dict[Unop, Callable[[Any], Any]] = {
        Unop.ID: lambda x: x,
        Unop.RELU: lambda x: np.where(x > zero, x, zero),
        Unop.SAT01: lambda x: np.where(x > zero, np.where(x < one, x, one), zero),
        **_UFUNC_UNARY,
        Unop.RECIP: lambda x: np.divide(one, x),
        Unop.RECIP_SQRT: lambda x: np.divide(one, np.sqrt(x)),
        Unop.NEG: np.negative,
        Unop.SIGMOID: lambda x: np.divide(one, np.add(one, np.exp(np.negative(x)))),
        Unop.ERF: _elementwise_erf(dtype),
        Unop.ABS: np.abs,
        Unop.NOT: lambda x: np.where(x == zero, one, zero),
    }
    return table[op]


def array_binary(op: Binop, dtype: DType) -> Callable[[Any, Any], Any]:
    """:func:`scalar_binary` on every pair of elements of two broadcastable arrays."""
    t = dtype.storage.type
    zero, one = t(0), t(1)
    table: dict[Binop, Callable[[Any, Any], Any]] = {
        Binop.ADD: np.add,
        Binop.SUB: np.subtract,
        Binop.MUL: np.multiply,
        Binop.DIV: np.divide if dtype.is_float else _elementwise_quotient(dtype, _int_div(dtype)),
        Binop.POW: _elementwise_pow(dtype),
        Binop.MAX: lambda a, b: np.where((a > b) | (b != b), a, b),
        Binop.MIN: lambda a, b: np.where((a < b) | (b != b), a, b),
        Binop.LT: lambda a, b: np.where(a < b, one, zero),
        Binop.GT: lambda a, b: np.where(a > b, one, zero),
        Binop.EQ: lambda a, b: np.where(a == b, one, zero),
        Binop.NE: lambda a, b: np.where(a != b, one, zero),
        Binop.RELU_GATE: lambda a, b: np.where(a > zero, b, zero),
        Binop.SAT01_GATE: lambda a, b: np.where((zero < a) & (a < one), b, zero),
        Binop.MOD: np.fmod if dtype.is_float else _elementwise_quotient(dtype, _int_mod(dtype)),
        Binop.AND: lambda a, b: np.where((a != zero) & (b != zero), one, zero),
        Binop.OR: lambda a, b: np.where((a != zero) | (b != zero), one, zero),
    }
    return table[op]


def _elementwise_pow(dtype: DType) -> Callable[[Any, Any], Any]:
    """The scalar ``pow`` (the C library's) on each element: ``np.power``'s array loops are
    other approximations, and for a broadcast exponent of 0.5 or 2 they compute ``sqrt`` or a
    square, which differ from ``pow`` at -0.0 and -inf and in the last bit."""
    scalar, t = scalar_binary(Binop.POW, dtype), dtype.scalar
    apply = np.frompyfunc(lambda a, b: scalar(t(a), t(b)), 2, 1)
    return lambda a, b: np.asarray(apply(*np.broadcast_arrays(a, b)), dtype=object).astype(dtype.storage)


def _elementwise_erf(dtype: DType) -> Callable[[Any], Any]:
    """The scalar ``erf`` on each element: numpy has no error function, and the scalar form's,
    the C library's float64 ``erf`` (``math.erf``) rounded to the compute type, is the one to
    repeat bit for bit."""
    apply = np.frompyfunc(math.erf, 1, 1)
    return lambda x: np.asarray(apply(np.asarray(x, dtype=np.float64)), dtype=np.float64).astype(dtype.storage)


def _elementwise_quotient(dtype: DType, scalar: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Integer ``div``/``mod`` (truncating, wrapping): the scalar operator on each element, after
    checking no divisor is zero, so that a zero divisor raises ``ZeroDivisionError`` before
    anything is computed."""
    apply = np.frompyfunc(scalar, 2, 1)
    storage = dtype.storage

    def quotient(a: Any, b: Any) -> Any:
        a, b = np.broadcast_arrays(np.asarray(a, dtype=storage), np.asarray(b, dtype=storage))
        if (b == 0).any():
            raise ZeroDivisionError(f"integer {dtype.name} division by zero")
        return np.asarray(apply(a.astype(object), b.astype(object)), dtype=object).astype(storage)

    return quotient


def array_fma(dtype: DType) -> Callable[[Any, Any, Any], Any]:
    """:func:`scalar_fma` on every triple of elements."""
    if dtype is dtypes.float32:
        return _array_fma_float32
    if dtype.is_float:
        apply = np.frompyfunc(scalar_fma(dtype), 3, 1)
        return lambda a, b, c: np.asarray(
            apply(*(np.asarray(x).astype(object) for x in np.broadcast_arrays(a, b, c))), dtype=object
        ).astype(dtype.storage)
    return lambda a, b, c: a * b + c  # wraps as the scalar form's exact product and sum do


def _array_fma_float32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """:func:`_fma_float32` on arrays: the exact double product, its sum with ``c`` rounded to
    odd, then rounded once to float32."""
    p = np.asarray(a).astype(np.float64) * np.asarray(b).astype(np.float64)
    z = np.asarray(c, dtype=np.float64)
    s = p + z
    v = s - p
    err = (p - (s - v)) + (z - v)
    even = (np.asarray(s).view(np.uint64) & np.uint64(1)) == 0
    nudge = np.isfinite(s) & (err != 0) & even
    s = np.where(nudge, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# The uint4x32 word operators: a uint4x32 built from two int64 halves, and one of its lanes read
# back. A uint4x32 value is, in the scalar form, an array of its four uint32 lanes (the scalar
# interpreter's value); in the array form, a tuple of four uint32 lane arrays that broadcast
# together (the vectorized interpreter's). The lane index is a Python int (the IR's constant).

_LOW32 = 0xFFFFFFFF


def scalar_uint4x32_pack(lo: Any, hi: Any) -> np.ndarray:
    """``uint4x32_pack lo hi``: the 64-bit two's complement of ``lo`` in lanes 0 (low) and 1,
    of ``hi`` in lanes 2 and 3."""
    lo, hi = int(lo) & 0xFFFFFFFFFFFFFFFF, int(hi) & 0xFFFFFFFFFFFFFFFF
    return np.array((lo & _LOW32, lo >> 32, hi & _LOW32, hi >> 32), dtype=np.uint32)


def scalar_uint4x32_word(x: np.ndarray, lane: int) -> np.uint32:
    """``uint4x32_word x lane``: lane ``lane`` of ``x``."""
    return np.uint32(x[lane])


def array_uint4x32_pack(lo: Any, hi: Any) -> tuple[np.ndarray, ...]:
    """:func:`scalar_uint4x32_pack` of every pair of elements (int64 arrays), as four lanes."""
    words = []
    for half in (lo, hi):
        bits = np.asarray(half, dtype=np.int64).astype(np.uint64)  # two's complement, as C converts
        words += [(bits & np.uint64(_LOW32)).astype(np.uint32), (bits >> np.uint64(32)).astype(np.uint32)]
    return tuple(words)


def array_uint4x32_word(x: tuple[np.ndarray, ...], lane: int) -> np.ndarray:
    """:func:`scalar_uint4x32_word` of every element: the lane array itself."""
    return x[lane]


# ---------------------------------------------------------------------------------------------
# Constant folding: the scalar forms, at compile time, for the operators every backend rounds
# exactly as the host does.

FOLDED_UNARY: frozenset[Unop] = frozenset(
    {Unop.NEG, Unop.ABS, Unop.RELU, Unop.SAT01, Unop.SQRT, Unop.RECIP, Unop.NOT}
)
"""The unary operators folded at compile time: each is exact or correctly rounded in IEEE
arithmetic (``sqrt`` and ``recip`` on floats only), so the host computes the backend's bits. Not
the libm operators (``scalar_ops.LIBM_OPS``), whose host results may differ from a backend's."""

FOLDED_BINARY: frozenset[Binop] = frozenset(
    {
        Binop.ADD, Binop.SUB, Binop.MUL, Binop.DIV, Binop.MOD, Binop.MAX, Binop.MIN, Binop.LT, Binop.GT,
        Binop.EQ, Binop.NE, Binop.AND, Binop.OR, Binop.RELU_GATE, Binop.SAT01_GATE,
    }
)
"""The binary operators folded at compile time: each rounds once (or not at all). Not ``pow``
(the C library's approximation) nor the PRNG operators (``threefry4x32`` and the uint4x32 word
operators), whose values are uint4x32 or come from one."""


def fold_unary(op: Unop, x: Any, dtype: DType) -> Any | None:
    """``op x`` computed now, or ``None`` where it must be left to run time."""
    if op not in FOLDED_UNARY or (op in (Unop.SQRT, Unop.RECIP) and not dtype.is_float):
        return None
    with np.errstate(all="ignore"):
        return scalar_unary(op, dtype)(x)


def fold_binary(op: Binop, a: Any, b: Any, dtype: DType) -> Any | None:
    """``a op b`` computed now, or ``None`` where it must be left to run time (an integer
    division by zero, which faults there)."""
    if op not in FOLDED_BINARY:
        return None
    try:
        with np.errstate(all="ignore"):
            return scalar_binary(op, dtype)(a, b)
    except ZeroDivisionError:
        return None
