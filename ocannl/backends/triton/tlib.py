"""Device functions the generated Triton modules import: the operators of the scalar catalog that
Triton has no single instruction for (ocannl/lowlevel/scalar_ops.py), and the PRNG.

Everything here is built from core ``triton.language`` operations only, so the same code runs
compiled on a GPU and under the Triton interpreter (``TRITON_INTERPRET=1``), which supports no
``libdevice`` calls. Precision: ``tanh`` and ``pow`` are a few ulps from libm (the conformance
kit's float tolerance), the PRNG operations are exact (the bit contract of
ocannl/lowlevel/prng.py).

A uint4x32 value is carried as four uint32 tensors (lanes ``w0 .. w3``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tanh(x):
    """``tanh x`` as ``sign(x) * (1 - e) / (1 + e)`` with ``e = exp(-2|x|)`` (no overflow)."""
    e = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -y, y)


@triton.jit
def pow(a, b):  # noqa: A001 - the catalog's name
    """``a ** b`` with the special values of C's ``pow`` (docs/semantics.md, "Numerics"): 1 when
    ``b`` is 0 or ``a`` is 1 (NaNs included) and for ``(-1) ** ±inf``; NaN for a finite negative
    ``a`` and a non-integer ``b``; otherwise ``exp2(b * log2|a|)``, negated for a negative ``a``
    (-0.0 and -inf included) and an odd integer ``b``. So ``(-0.0) ** 0.5`` is +0.0 and
    ``(-inf) ** 0.5`` is +inf, as C's ``pow`` (not ``sqrt``) gives. Infinities are recognised as
    the nonzero values that doubling leaves unchanged, which holds in every float type."""
    a, b = tl.broadcast(a, b)  # a 0-d exponent (a literal) takes a's shape before the masks combine
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    whole = tl.floor(b) == b
    odd = whole & (tl.floor(b * 0.5) * 2.0 != b)
    negative = (a < 0) | ((a == 0) & (1.0 / a < 0))
    r = tl.where(negative & odd, -r, r)
    finite_negative = (a < 0) & (a != 2.0 * a)
    nan = (r - r) / (r - r)
    r = tl.where(finite_negative & ~whole, nan, r)
    infinite_b = (b == 2.0 * b) & (b != 0)
    r = tl.where((tl.abs(a) == 1.0) & infinite_b, 1.0, r)
    return tl.where((b == 0) | (a == 1.0), 1.0, r)


@triton.jit
def _multiply(a, b):
    return a * b


@triton.jit
def product(x, axis: tl.constexpr, keep_dims: tl.constexpr = False):
    """The product of ``x`` along ``axis`` (a tree, as ``tl.sum`` adds): Triton has a reduction
    for sums, maxima and minima only. Integer products wrap, so any order gives the same bits;
    float products agree with the loop's order up to rounding."""
    return tl.reduce(x, axis, _multiply, keep_dims=keep_dims)


@triton.jit
def _rotl(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _round(x0, x1, x2, x3, a: tl.constexpr, b: tl.constexpr):
    """One Threefry round, mixing (x0, x1) with rotation ``a`` and (x2, x3) with ``b``. It returns
    the lanes with x1 and x3 exchanged, so that the next round, by the same code, mixes (x0, x3)
    and (x2, x1) as Threefry's odd rounds do; four rounds restore the lane order."""
    x0 = x0 + x1
    x1 = _rotl(x1, a) ^ x0
    x2 = x2 + x3
    x3 = _rotl(x3, b) ^ x2
    return x0, x3, x2, x1


@triton.jit
def _four_rounds(x0, x1, x2, x3, a0: tl.constexpr, b0: tl.constexpr, a1: tl.constexpr, b1: tl.constexpr,
                 a2: tl.constexpr, b2: tl.constexpr, a3: tl.constexpr, b3: tl.constexpr):
    """Four Threefry rounds: even rounds mix (x0, x1), (x2, x3); odd rounds (x0, x3), (x2, x1)."""
    x0, x1, x2, x3 = _round(x0, x1, x2, x3, a0, b0)
    x0, x1, x2, x3 = _round(x0, x1, x2, x3, a1, b1)
    x0, x1, x2, x3 = _round(x0, x1, x2, x3, a2, b2)
    return _round(x0, x1, x2, x3, a3, b3)


@triton.jit
def threefry4x32(k0, k1, k2, k3, c0, c1, c2, c3):
    """Random123's ``threefry4x32_R(20, counter, key)`` on uint32 lanes (prng.py's contract):
    five groups of four rounds, each followed by a key injection."""
    k4 = k0 ^ k1 ^ k2 ^ k3 ^ 0x1BD11BDA
    x0, x1, x2, x3 = c0 + k0, c1 + k1, c2 + k2, c3 + k3
    x0, x1, x2, x3 = _four_rounds(x0, x1, x2, x3, 10, 26, 11, 21, 13, 27, 23, 5)
    x0, x1, x2, x3 = x0 + k1, x1 + k2, x2 + k3, x3 + k4 + 1
    x0, x1, x2, x3 = _four_rounds(x0, x1, x2, x3, 6, 20, 17, 11, 25, 10, 18, 20)
    x0, x1, x2, x3 = x0 + k2, x1 + k3, x2 + k4, x3 + k0 + 2
    x0, x1, x2, x3 = _four_rounds(x0, x1, x2, x3, 10, 26, 11, 21, 13, 27, 23, 5)
    x0, x1, x2, x3 = x0 + k3, x1 + k4, x2 + k0, x3 + k1 + 3
    x0, x1, x2, x3 = _four_rounds(x0, x1, x2, x3, 6, 20, 17, 11, 25, 10, 18, 20)
    x0, x1, x2, x3 = x0 + k4, x1 + k0, x2 + k1, x3 + k2 + 4
    x0, x1, x2, x3 = _four_rounds(x0, x1, x2, x3, 10, 26, 11, 21, 13, 27, 23, 5)
    return x0 + k0, x1 + k1, x2 + k2, x3 + k3 + 5


@triton.jit
def uint4x32_of(x):
    """An integer as a uint4x32 value: its 64-bit two's complement, low word in lane 0."""
    v = x.to(tl.int64)
    lo = v.to(tl.uint32)
    hi = (v >> 32).to(tl.uint32)
    return lo, hi, lo * 0, lo * 0


@triton.jit
def uint4x32_pack(lo, hi):
    """Two int64 halves as a uint4x32 value: the 64-bit two's complement of ``lo`` in lanes 0
    (low) and 1, of ``hi`` in lanes 2 and 3."""
    a = lo.to(tl.int64)
    b = hi.to(tl.int64)
    return a.to(tl.uint32), (a >> 32).to(tl.uint32), b.to(tl.uint32), (b >> 32).to(tl.uint32)


@triton.jit
def uniform1_float32(w0):
    """``float32(w0 >> 8) * 2**-24``: exact, in ``[0, 1 - 2**-24]``."""
    return (w0 >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def uniform1_float64(w0, w1):
    """``float64(((w1 << 32) | w0) >> 11) * 2**-53``: exact, in ``[0, 1 - 2**-53]``."""
    v = (w1.to(tl.uint64) << 32) | w0.to(tl.uint64)
    return (v >> 11).to(tl.float64) * 1.1102230246251565e-16


@triton.jit
def bfloat16_bits(x):
    """float32 values rounded to bfloat16 (nearest, ties to even) as uint16 bit patterns, NaNs
    kept quiet: the integer form of dtypes.float32_to_bfloat16_bits, so the interpreter (whose
    float conversion truncates) and the GPU round alike."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return tl.where(x != x, (bits >> 16) | 0x40, rounded).to(tl.uint16)


@triton.jit
def bfloat16_round(x):
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32: the rounding
    of a bfloat16 accumulator after each step, the same on the interpreter and the GPU."""
    return (bfloat16_bits(x).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
