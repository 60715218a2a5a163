"""Counter-based random numbers as IR building blocks: the same bits on every backend.

Parameters are initialized inside the compiled init routine (docs/training.md, "Parameters and
random numbers") by standard Threefry-4x32-20, Random123's generator, not the original's variant.
A random fill is one accumulating assignment with no operands whose expression hashes each cell's
offset, for example a uniform fill::

    w =: -0.5 + (1.0 * (uniform1 (uint4x32(0, 7, 0, 0) ^^^^ (uint4x32_of cell_offset()))))

so a backend needs three scalar operators (``ocannl/lowlevel/scalar_ops.py``) and nothing else.

**The bit contract.** Every backend reproduces these exactly; the interpreter implements them on
plain Python ints and ``prng_reference.py`` (checked against Random123's known answers) is the
oracle. A uint4x32 value is four uint32 lanes ``(w0, w1, w2, w3)``; all lane arithmetic is
modulo 2**32.

* ``threefry4x32(key, counter)``: Random123's ``threefry4x32_R(20, counter, key)``, lane ``j``
  of the result being word ``j`` of its output. With ``ks = (k0, k1, k2, k3, k0^k1^k2^k3^
  0x1BD11BDA)`` and ``x = counter + key`` lane-wise, round ``r = 0..19`` uses the rotations
  ``R[r % 8]`` with ``R = ((10, 26), (11, 21), (13, 27), (23, 5), (6, 20), (17, 11), (25, 10),
  (18, 20))`` and mixes the lane pairs ``(x0, x1), (x2, x3)`` on even rounds and ``(x0, x3),
  (x2, x1)`` on odd ones (mixing ``(a, b)`` with rotation ``c`` is ``a += b; b = rotl(b, c) ^
  a``); after rounds 4, 8, 12, 16 and 20 injection ``s = 1..5`` adds ``(ks[s % 5], ks[(s+1) % 5],
  ks[(s+2) % 5], ks[(s+3) % 5] + s)``.
* ``uint4x32_of(x)`` for an integer ``x``: ``x`` converted to 64 bits (sign-extended if it is
  signed, as C's ``(uint64_t)x``), low word in lane 0, high word in lane 1, lanes 2 and 3 zero.
  For an offset (``0 <= x < 2**31``) that is ``(x, 0, 0, 0)``.
* ``uniform1(x)`` as float32: ``float32(w0 >> 8) * 2**-24``; as float64:
  ``float64(((w1 << 32) | w0) >> 11) * 2**-53``. Both conversions are exact, so the result is
  a multiple of 2**-24 (2**-53) in ``[0, 1 - 2**-24]`` (``[0, 1 - 2**-53]``). Float16 and
  bfloat16 nodes compute in float32 and round on store, as every expression does.
* ``cell_offset()`` is the written cell's row-major offset in its node (an index-sized integer).

**Key layout.** ``key(seed, stream, draw) = (seed, stream, draw, 0)``: ``seed`` is the session
seed (``oc.seed``), ``stream`` tells the random tensors of a session apart (the frontend uses the
tensor's id, its creation order), ``draw`` tells apart the independent uniforms one fill takes per
cell (0, and 1 for the second uniform of :func:`normal_fill`). The counter is
``uint4x32_of(cell_offset())``. Each argument must fit in 32 unsigned bits.

**Draws made at run time** (``ocannl/random.py``: dropout masks) are new on every run of a
routine. Their key folds a run number ``r`` (a uint32 the routine reads from a buffer) into the
stream's key by one more Threefry block, as JAX's ``fold_in``:
``run_key(k, r) = threefry4x32(k, uint4x32_of(r))``; the cell's bits are then
``threefry4x32(run_key(key(seed, stream), r), uint4x32_of(cell_offset()))``.

The arithmetic around the uniforms is ordinary IR in the node's compute type, one rounding per
operation and no contraction (docs/design.md, "Arithmetic"). It uses only exactly rounded
operators, never the libm ones (``scalar_ops.LIBM_OPS``, whose last bits differ between
backends), so every fill is bit-exact on every backend: the normal fill's Box-Muller transform
computes its log and cosine itself (:func:`box_muller`).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np

from ocannl.lowlevel.assignments import Accum, Apply, Arg, CellOffset
from ocannl.lowlevel.dtypes import DType, DTypeError
from ocannl.lowlevel.indexing import AxisIndex, Fixed, Iter, Projections, Symbol
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode

_U32 = 2**32

Expression = Apply | Arg | CellOffset | float
"""An operand of an :class:`Apply`: the random fills' expressions are built from these."""


def key(seed: int, stream: int, draw: int = 0) -> tuple[int, int, int, int]:
    """The Threefry key of uniform ``draw`` of random stream ``stream`` under ``seed`` (see the
    key layout above)."""
    for name, value in (("seed", seed), ("stream", stream), ("draw", draw)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < _U32:
            raise ValueError(f"a PRNG {name} is an int in [0, 2**32), got {value!r}")
    return (seed, stream, draw, 0)


def counter() -> Apply:
    """The counter of a random fill: the written cell's offset in lane 0."""
    return Apply(Unop.UINT4X32_OF, (CellOffset(),))


def uniform(k: tuple[int, int, int, int]) -> Apply:
    """A uniform in [0, 1) per cell: ``uniform1(threefry4x32(k, counter()))``."""
    return uniform_of_key(k)


def run_key(k: tuple[int, int, int, int], run) -> Apply:
    """The key of run ``run`` of the stream keyed ``k``: ``threefry4x32(k, uint4x32_of(run))``,
    with ``run`` an expression of type uint32 (an :class:`~ocannl.lowlevel.assignments.Arg`
    reading a run counter); see "Draws made at run time" above."""
    return Apply(Binop.THREEFRY4X32, (k, Apply(Unop.UINT4X32_OF, (run,))))


def uniform_of_key(k) -> Apply:
    """A uniform in [0, 1) per cell under the key expression ``k`` (a constant key or a
    :func:`run_key`): ``uniform1(threefry4x32(k, counter()))``."""
    return Apply(Unop.UNIFORM1, (Apply(Binop.THREEFRY4X32, (k, counter())),))


def uniform_fill(node: TNode, seed: int, stream: int, low: float = 0.0, high: float = 1.0) -> Accum:
    """``node =: low + (high - low) * u`` with ``u`` the cell's uniform under
    ``key(seed, stream)``: values in ``[low, high)`` (up to the rounding of the last step).
    ``low`` and ``high - low`` are computed in Python, then rounded to the node's compute type."""
    _check_float(node, "uniform_fill")
    scaled = Apply(Binop.MUL, (float(high) - float(low), uniform(key(seed, stream))))
    return _fill(node, Apply(Binop.ADD, (float(low), scaled)))


def normal_fill(node: TNode, seed: int, stream: int, mean: float = 0.0, std: float = 1.0) -> Accum:
    """``node =: mean + std * z`` with ``z`` standard normal: :func:`box_muller` of two
    independent uniforms of the cell, ``u1`` (draw 0) and ``u2`` (draw 1), in the node's compute
    type."""
    _check_float(node, "normal_fill")
    z = box_muller(uniform(key(seed, stream, 0)), uniform(key(seed, stream, 1)), node.dtype.compute)
    return _fill(node, _add(float(mean), _mul(float(std), z)))


def box_muller(u1: Expression, u2: Expression, dtype: DType) -> Apply:
    """``z = sqrt(-2 * log(1 - u1)) * cos(2 * pi * u2)`` in ``dtype`` (float32 or float64), for
    uniforms ``u1``, ``u2`` in ``[0, 1)`` on that type's grid (multiples of 2**-24, 2**-53), so
    that ``1 - u1`` is in ``(0, 1]`` and the log finite.

    Built from correctly rounded operators only (``+ - * /``, ``sqrt``, ``abs``, comparisons,
    ``where``), never the libm ``log`` and ``cos`` (``scalar_ops.LIBM_OPS``), whose last bits
    differ between backends: the log and the cosine are :func:`_log_of_unit` and
    :func:`_cos_of_turns`, within a few ulps of the exact values. Every backend rounds those
    operators alike and contracts nothing (docs/design.md, "Arithmetic"), so a normal draw has
    the same bits everywhere, as a uniform one does."""
    radius = Apply(Unop.SQRT, (_mul(-2.0, _log_of_unit(_sub(1.0, u1), dtype)),))
    return _mul(radius, _cos_of_turns(u2, dtype))


def _log_of_unit(v: Expression, dtype: DType) -> Apply:
    """``log(v)`` for ``v`` in ``(0, 1]`` on ``dtype``'s grid.

    Range reduction, exact: ``m = v * 2**e`` in ``[c/2, c)`` with ``c`` the constant
    ``sqrt(2)`` rounded to ``dtype``; ``e`` is found by binary search, step ``k`` (16, 8, 4, 2,
    1 for float32, from 32 for float64: at least the grid's smallest exponent in all) scaling by
    ``2**k`` when ``v < c * 2**-k``. Then ``log(v) = log(m) - e ln(2)``, with
    ``log(1 + t) = t * integral over s in [0, 1] of 1 / (1 + s t)`` for ``t = m - 1`` (exact),
    the integral summed by the Gauss-Legendre rule of :func:`_log_quadrature`: its terms are
    positive and their sum near 1, so the log stays a few ulps from the exact one even where it
    is tiny."""
    scalings = []
    for step in (1 << k for k in reversed(range(_grid_exponent(dtype).bit_length()))):
        below = Apply(Binop.LT, (v, math.sqrt(2) * 2.0**-step))
        v = _mul(v, Apply(Ternop.WHERE, (below, 2.0**step, 1.0)))
        scalings.append(_mul(float(step), below))
    t = _sub(v, 1.0)
    log_m = _mul(t, _sum([Apply(Binop.DIV, (w, _add(1.0, _mul(s, t)))) for s, w in _log_quadrature(dtype)]))
    return _sub(log_m, _mul(_sum(scalings), math.log(2)))


def _log_quadrature(dtype: DType) -> list[tuple[float, float]]:
    """The nodes and weights ``(s_i, w_i)`` on ``[0, 1]`` of the Gauss-Legendre rule giving
    ``log(1 + t) = t * sum w_i / (1 + s_i t)`` within ``eps / 8`` of ``dtype`` for ``1 + t`` in
    ``[sqrt(2)/2, sqrt(2)]``: 4 points for float32, 8 for float64. The integrand's pole
    ``s = -1/t`` maps to ``±(3 + 2 sqrt(2))`` on ``[-1, 1]``, so the ``n``-point rule's relative
    error is below ``2 rho**(-2 n)`` with ``rho`` (about 11.6) the parameter of the Bernstein
    ellipse through it (measured: 1.5 ``rho**(-2 n)``)."""
    pole = 3 + 2 * math.sqrt(2)
    rho = pole + math.sqrt(pole**2 - 1)
    n = 1
    while 2 * rho ** (-2 * n) > _eps(dtype) / 8:
        n += 1
    x, w = np.polynomial.legendre.leggauss(n)
    return [(float(xi + 1) / 2, float(wi) / 2) for xi, wi in zip(x, w)]


def _cos_of_turns(u: Expression, dtype: DType) -> Apply:
    """``cos(2 pi u)`` for ``u`` in ``[0, 1]`` on ``dtype``'s grid.

    Quadrant reduction, exact on the grid: ``cos(2 pi u) = sin(2 pi x)`` with
    ``x = |1/2 - u| - 1/4`` in ``[-1/4, 1/4]``, since the cosine is even about ``u = 1/2`` and
    ``cos(2 pi (1/2 - d)) = sin(2 pi (d - 1/4))``. The sine on ``[-pi/2, pi/2]`` is ``x`` times
    its Taylor series in ``x**2``, cut where the terms left out stay below ``eps / 8`` of
    ``dtype`` (the series alternates with decreasing terms): 7 terms for float32, 11 for
    float64. Being ``x`` times a sum near ``2 pi``, it stays relatively accurate at the zeros of
    the cosine."""
    x = _sub(Apply(Unop.ABS, (_sub(0.5, u),)), 0.25)
    x2_max = (1 / 4) ** 2

    def coefficient(k: int) -> float:
        return (-1) ** k * (2 * math.pi) ** (2 * k + 1) / math.factorial(2 * k + 1)

    terms = [coefficient(0)]
    while abs(coefficient(len(terms))) * x2_max ** len(terms) >= _eps(dtype) / 8 * terms[0]:
        terms.append(coefficient(len(terms)))
    return _mul(x, _horner(_mul(x, x), terms))


def _grid_exponent(dtype: DType) -> int:
    """``p`` such that ``dtype``'s uniforms are multiples of ``2**-p`` (24 or 53)."""
    return int(np.finfo(dtype.storage).nmant) + 1


def _eps(dtype: DType) -> float:
    return float(np.finfo(dtype.storage).eps)


def _horner(x: Expression, coefficients: list[float]) -> Expression:
    """``c_0 + x * (c_1 + x * (c_2 + ...))``."""
    acc: Expression = coefficients[-1]
    for c in reversed(coefficients[:-1]):
        acc = _add(c, _mul(x, acc))
    return acc


def _sum(terms: list[Expression]) -> Expression:
    """The terms added pairwise, a balanced tree (its depth grows as the log of their number)."""
    if len(terms) == 1:
        return terms[0]
    half = len(terms) // 2
    return _add(_sum(terms[:half]), _sum(terms[half:]))


def _add(a: Expression, b: Expression) -> Apply:
    return Apply(Binop.ADD, (a, b))


def _sub(a: Expression, b: Expression) -> Apply:
    return Apply(Binop.SUB, (a, b))


def _mul(a: Expression, b: Expression) -> Apply:
    return Apply(Binop.MUL, (a, b))


def _check_float(node: TNode, what: str) -> None:
    if not node.dtype.is_float:
        raise DTypeError(f"{what}: {node.debug_name} holds {node.dtype.name}; random fills make floats")


def _fill(node: TNode, fn: Apply) -> Accum:
    """``node =: fn`` once per cell."""
    return Accum(node, None, fn, (), every_cell(node))


def every_cell(node: TNode) -> Callable[[], Projections]:
    """Projections visiting each cell of ``node`` once, with no operands (a loop per axis of size
    above 1); computed when first asked, once ``node``'s dims are known."""

    @functools.cache
    def projections() -> Projections:
        indices: list[AxisIndex] = []
        loops: list[tuple[Symbol, int]] = []
        for d in node.dims:
            if d == 1:
                indices.append(Fixed(0))
            else:
                loops.append((Symbol(), d))
                indices.append(Iter(loops[-1][0]))
        return Projections(
            product_space=tuple(n for _, n in loops),
            product_iterators=tuple(s for s, _ in loops),
            lhs_dims=node.dims,
            rhs_dims=(),
            project_lhs=tuple(indices),
            project_rhs=(),
            debug=f"every cell of {node.debug_name}",
        )

    return projections
