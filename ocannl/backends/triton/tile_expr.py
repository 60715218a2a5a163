"""Tile values and the rendering of the scalar catalogue's operators on them, as Triton code.

A kernel writer (emit.py) decides where values come from (loads, registers, locals) and where
they go; this module only says how each operator of ``ocannl/lowlevel/scalar_ops.py`` is written
in Triton for values of a given type, the one rendering table of the Triton backend
(``docs/operators.md`` lists what a new operator needs here).

A :class:`Val` is a value in generated code. A constant keeps its number (``value``) beside its
code, so folding a negation or a cast of a constant, or storing one in a 16-bit buffer, works on
the number and never reads generated text back.

Exactness (the interpreter's bits, ``ocannl/lowlevel/op_semantics.py``): float32 division and
square roots are the correctly rounded ``tl.div_rn``/``tl.sqrt_rn``; ``max``/``min`` return the
non-NaN operand as C's ``fmax``/``fmin`` (Triton's default propagation); ``pow`` and ``tanh`` are
device functions of ``tlib.py``; Python number literals combine with a tensor without changing
its type only for the 32/64-bit types Triton treats as "weak" partners, so other operands are
made 0-d tensors of their own type first.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.scalar_ops import Binop, Unop

NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Val:
    """A value in generated code: ``code`` (a literal, a name, or an expression), the tile axes
    it varies along, and its type. A constant also has its number, ``value``; a uint4x32 value
    has four ``lanes`` instead of ``code``."""

    code: str
    axes: frozenset[str]
    dtype: DType
    value: float | int | None = None
    lanes: tuple[str, str, str, str] | None = None

    @property
    def literal(self) -> bool:
        return self.value is not None

    @staticmethod
    def constant(value: float | int, dtype: DType, code: str | None = None) -> Val:
        """The constant ``value`` of ``dtype`` (written as ``code`` when given)."""
        return Val(literal_code(value, dtype) if code is None else code, frozenset(), dtype, value=value)

    def computed(self, code: str) -> Val:
        """A value with ``self``'s axes and type, computed by ``code`` (no longer a constant)."""
        return replace(self, code=code, value=None)


def literal_code(value: float | int, dtype: DType) -> str:
    """``value`` as a Python literal in a kernel (NaN and infinities through ``float``)."""
    if dtype.is_float:
        v = float(value)
        if math.isnan(v):
            return '-float("nan")' if math.copysign(1.0, v) < 0 else 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return str(int(value))


def stored_value(value: float | int, dtype: DType) -> int | float:
    """A constant as stored in a ``dtype`` buffer (bfloat16: its bits)."""
    if dtype is dtypes.bfloat16:
        return int(dtypes.float32_to_bfloat16_bits(np.float32(value)))
    v = dtypes.round_to(dtype, value)
    return float(v) if dtype.is_float else int(v)


def stored_literal(value: float | int, dtype: DType) -> str:
    """The code of ``value`` as a ``dtype`` buffer holds it (bfloat16: its bits as an integer;
    uint4x32: a zero word)."""
    if dtype is dtypes.uint4x32:
        return literal_code(0, dtypes.uint32)
    stored = stored_value(value, dtype)
    return str(stored) if dtype is dtypes.bfloat16 else literal_code(stored, dtype)


def from_storage(dtype: DType) -> str:
    """The conversion appended to a load of a ``dtype`` buffer: 16-bit floats compute in float32."""
    if dtype is dtypes.float16:
        return ".to(tl.float32)"
    if dtype is dtypes.bfloat16:
        return ".to(tl.bfloat16, bitcast=True).to(tl.float32)"
    return ""


def paren(code: str) -> str:
    """``code`` parenthesized unless it is a name, a number or already one parenthesized group."""
    return code if NAME_PATTERN.match(code) or re.fullmatch(r"-?[0-9.e+-]+", code) or (
        code.startswith("(") and _balanced_outer(code)) else f"({code})"


def _balanced_outer(code: str) -> bool:
    depth = 0
    for k, ch in enumerate(code):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and k < len(code) - 1:
            return False
    return True


def _clamp_select(x: str, inside: str, outside: str, above_one: str | None = None) -> str:
    """``inside`` where ``x > 0`` (and ``x < 1`` when ``above_one`` is given, which is taken
    where ``x >= 1``), else ``outside``: the selection of the relu and sat01 clamps and of their
    gradients' gates (``RELU_GATE``, ``SAT01_GATE``), which pass through on the same ranges."""
    if above_one is None:
        return f"tl.where({x} > 0, {inside}, {outside})"
    return f"tl.where({x} > 0, tl.where({x} < 1, {inside}, {above_one}), {outside})"


_COMPARISONS = {Binop.LT: "<", Binop.GT: ">", Binop.EQ: "==", Binop.NE: "!="}
_INFIX = {Binop.ADD: "+", Binop.SUB: "-", Binop.MUL: "*", Binop.MOD: "%"}
_TRITON_UNARY = frozenset({Unop.EXP, Unop.LOG, Unop.EXP2, Unop.LOG2, Unop.SIN, Unop.COS, Unop.ERF})
"""Unary operators that are the ``tl`` function of the same name."""


class TileArithmetic:
    """Writes operators on :class:`Val` operands. ``temp(code)`` binds ``code`` to a fresh name
    in the kernel (for an operand used twice); ``helpers`` collects the ``tlib`` device functions
    the code calls."""

    def __init__(self, temp: Callable[[str], str], helpers: set[str]):
        self._temp = temp
        self.helpers = helpers

    # -- operands --------------------------------------------------------------------------

    def atom(self, v: Val) -> str:
        """``v``'s code, bound to a temporary first unless it is a name or a literal."""
        if v.literal or NAME_PATTERN.match(v.code):
            return v.code
        return self._temp(v.code)

    def tensor(self, v: Val) -> str:
        """``v`` as a tensor (a literal becomes a 0-d tensor of its type)."""
        if v.literal:
            return f"tl.full([], {v.code}, {v.dtype.triton_name})"
        return v.code

    def _named_tensor(self, v: Val) -> str:
        """``v`` as a tensor bound to a name (it is read twice)."""
        return self.atom(v.computed(self.tensor(v)))

    # -- constants -------------------------------------------------------------------------

    @staticmethod
    def negate(v: Val) -> Val:
        """``-v`` of a constant, as a constant."""
        return Val.constant(-v.value, v.dtype)

    @staticmethod
    def cast(v: Val, dtype: DType) -> Val:
        """A constant converted to ``dtype``, as a constant; any other value through ``.to``."""
        if v.literal:
            return Val.constant(dtypes.round_to(dtype, v.value), dtype)
        return Val(f"{paren(v.code)}.to({dtype.triton_name})", v.axes, dtype)

    # -- operators -------------------------------------------------------------------------

    def arith(self, x: Val, y: Val, symbol: str) -> str:
        """``x symbol y`` with Triton's infix operators; a literal operand stays a literal when
        the other is a tensor of a type that takes Python numbers without changing it."""
        weak = x.dtype in (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64)
        if x.literal and (y.literal or not weak):
            return f"({self.tensor(x)} {symbol} {y.code if weak else self.tensor(y)})"
        if y.literal and not weak:
            return f"({x.code} {symbol} {self.tensor(y)})"
        return f"({x.code} {symbol} {y.code})"

    def unary(self, op: Unop, v: Val) -> str:
        t = v.dtype
        zero, one = literal_code(0, t), literal_code(1, t)
        x = self.tensor(v)
        if op in _TRITON_UNARY:
            return f"tl.{op.value}({x})"
        match op:
            case Unop.ID:
                return v.code
            case Unop.NEG:
                return f"(-{paren(x)})"
            case Unop.RELU:
                a = self._named_tensor(v)
                return _clamp_select(a, a, zero)
            case Unop.SAT01:
                a = self._named_tensor(v)
                return _clamp_select(a, a, zero, above_one=one)
            case Unop.SQRT:
                return self._sqrt(x, t)
            case Unop.RECIP:
                return self.divide(Val.constant(1, t, one), v.computed(x))
            case Unop.RECIP_SQRT:
                return self.divide(Val.constant(1, t, one), Val(self._sqrt(x, t), v.axes, t))
            case Unop.TANH:
                self.helpers.add("tanh")
                return f"tanh({x})"
            case Unop.SIGMOID:
                return self.divide(Val.constant(1, t, one), Val(f"({one} + tl.exp(-{paren(x)}))", v.axes, t))
            case Unop.ABS:
                return f"tl.abs({x})"
            case Unop.NOT:
                return f"({paren(x)} == 0).to({t.triton_name})"
        raise TypeError(f"the Triton emitter does not know the operator {op.value}")

    @staticmethod
    def _sqrt(x: str, t: DType) -> str:
        return f"tl.sqrt_rn({x})" if t is dtypes.float32 else f"tl.sqrt({x})"

    def divide(self, x: Val, y: Val) -> str:
        t = x.dtype
        if t is dtypes.float32:
            return f"tl.div_rn({self.tensor(x) if x.literal and y.literal else x.code}, {y.code})"
        return self.arith(x, y, "/" if t.is_float else "//")

    def binary(self, op: Binop, x: Val, y: Val, t: DType) -> str:
        zero, one = literal_code(0, t), literal_code(1, t)
        tn = t.triton_name
        if op in _INFIX:
            return self.arith(x, y, _INFIX[op])
        if op in _COMPARISONS:
            return f"{self.arith(x, y, _COMPARISONS[op])}.to({tn})"
        match op:
            case Binop.DIV:
                return self.divide(x, y)
            case Binop.POW:
                self.helpers.add("pow")
                return f"pow({self.tensor(x)}, {self.tensor(y)})"
            case Binop.MAX | Binop.MIN:
                fn = "tl.maximum" if op is Binop.MAX else "tl.minimum"
                # C's fmax/fmin: the non-NaN operand when one is NaN (Triton's default).
                return f"{fn}({self.tensor(x)}, {y.code if not y.literal or t.is_float else self.tensor(y)})"
            case Binop.RELU_GATE:
                return _clamp_select(self.tensor(x), self.tensor(y), zero)
            case Binop.SAT01_GATE:
                a = self._named_tensor(x)
                return _clamp_select(a, self.tensor(y), zero, above_one=zero)
            case Binop.AND:
                return f"tl.where({self.tensor(x)} != 0, ({self.tensor(y)} != 0).to({tn}), {zero})"
            case Binop.OR:
                return (f"tl.where({self.tensor(x)} != 0, {self.tensor(Val.constant(1, t, one))}, "
                        f"({self.tensor(y)} != 0).to({tn}))")
        raise TypeError(f"the Triton emitter does not know the operator {op.value}")

    def fma(self, x: Val, y: Val, z: Val, t: DType) -> str:
        """``x * y + z``: one rounding for floats (``tl.fma``), wrapping for integers."""
        if t.is_float:
            return f"tl.fma({self.tensor(x)}, {self.tensor(y)}, {self.tensor(z)})"
        return f"({self.arith(x, y, '*')} + {z.code})"

    def where(self, cond: Val, then: Val, other: Val) -> str:
        """``then`` where ``cond`` is nonzero, else ``other``."""
        if then.literal and other.literal:
            then = then.computed(self.tensor(then))
        return f"tl.where({cond.code} != 0, {then.code}, {other.code})"
