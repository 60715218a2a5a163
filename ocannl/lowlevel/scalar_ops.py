"""The scalar operator catalog shared by the assignments IR and the loop IR.

Each operator is an enum member whose value is its catalog name (``relu``, ``add``, ...). The
meaning of each one, for float operands of a compute type (dtypes.py):

* unary: ``id``; ``relu x = max(x, 0)``; ``sat01 x = min(max(x, 0), 1)``; ``exp``, ``log``,
  ``exp2``, ``log2``, ``sin``, ``cos``, ``sqrt``, ``tanh`` and ``erf`` (the error function) as in
  libm; ``recip x = 1 / x``; ``recip_sqrt x = 1 / sqrt(x)`` (two roundings); ``neg``;
  ``sigmoid x = 1 / (1 + exp(-x))`` evaluated in that order; ``abs``; ``not x = (x == 0)``.
* binary: ``add sub mul div``; ``pow`` (float only) is C99's ``pow``, special values included
  (``pow(-0.0, 0.5) = +0.0`` and ``pow(-inf, 0.5) = +inf``, where ``sqrt`` gives -0.0 and NaN;
  ``pow(x, ±0) = pow(1, y) = pow(-1, ±inf) = 1`` even for a NaN ``x`` or ``y``), whether the
  exponent is a constant or a tensor: no backend rewrites it as ``sqrt`` or a product;
  ``max``/``min`` return the non-NaN operand
  when one is NaN, as C's ``fmax``/``fmin``; ``lt gt eq ne`` and ``and or`` yield 1 or 0 in the
  operands' type (nonzero is true); ``relu_gate a b = b if a > 0 else 0``;
  ``sat01_gate a b = b if 0 < a < 1 else 0``; ``mod`` is C's ``fmod`` (the sign of the dividend).
* ternary: ``where c a b = a if c != 0 else b`` (only the chosen branch is evaluated);
  ``fma a b c = a * b + c`` with a single rounding; ``mul3 a b c = (a * b) * c`` (two roundings,
  the three-operand einsum's product).

On integers, ``div`` and ``mod`` truncate toward zero as C does and every result wraps around;
the transcendental ops, the reciprocals and ``pow`` are float-only (:data:`FLOAT_ONLY_OPS`).

The PRNG operators (:data:`PRNG_OPS`) are the only ones on uint4x32 values and have their own
types: ``threefry4x32 key counter`` (uint4x32, uint4x32 -> uint4x32), ``uniform1 x`` (uint4x32 ->
float32 or float64, the type the consumer asks for) and ``uint4x32_of x`` (an integer ->
uint4x32). Their bit-level contract, which every backend reproduces exactly, is the docstring of
``ocannl/lowlevel/prng.py``. Two more move whole words in and out of a uint4x32, so that a
program can hash words it holds in uint32 tensors (``oc.threefry4x32``):
``uint4x32_pack lo hi`` (int64, int64 -> uint4x32) is the value whose lanes 0 and 1 are the low
and high 32 bits of ``lo``'s two's complement and lanes 2 and 3 those of ``hi`` (so words
``w0..w3`` pack as ``lo = w0 + w1 * 2**32``, ``hi = w2 + w3 * 2**32``, the products wrapping),
and ``uint4x32_word x j`` (uint4x32, uint32 -> uint32) is lane ``j`` of ``x``, where ``j`` is a
constant from 0 to 3.

``ocannl/lowlevel/op_semantics.py`` is the executable form of this table (a scalar and an array
form of every operator), which the interpreters run and constant folding calls; adding an operator
is described in ``docs/operators.md``. The C and Metal backends
compute the interpreter's bits for every operator except those of :data:`LIBM_OPS`, which agree
to within :data:`LIBM_MAX_ULPS` (docs/semantics.md, "Numerics").
"""

from __future__ import annotations

import enum

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType


class _Operator(enum.Enum):
    """What every operator answers, whichever of the three enums it is in."""

    @property
    def arity(self) -> int:
        """How many operands it takes: 1, 2 or 3, by its enum."""
        return _ARITIES[type(self)]

    @property
    def float_only(self) -> bool:
        """Whether it is defined on float operands only (:data:`FLOAT_ONLY_OPS`)."""
        return self in FLOAT_ONLY_OPS


class Unop(_Operator):
    ID = "id"
    RELU = "relu"
    SAT01 = "sat01"
    EXP = "exp"
    LOG = "log"
    EXP2 = "exp2"
    LOG2 = "log2"
    SIN = "sin"
    COS = "cos"
    SQRT = "sqrt"
    RECIP = "recip"
    RECIP_SQRT = "recip_sqrt"
    NEG = "neg"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    ERF = "erf"
    ABS = "abs"
    NOT = "not"
    UNIFORM1 = "uniform1"
    UINT4X32_OF = "uint4x32_of"


class Binop(_Operator):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAX = "max"
    MIN = "min"
    LT = "lt"
    GT = "gt"
    EQ = "eq"
    NE = "ne"
    RELU_GATE = "relu_gate"
    SAT01_GATE = "sat01_gate"
    MOD = "mod"
    AND = "and"
    OR = "or"
    THREEFRY4X32 = "threefry4x32"
    UINT4X32_PACK = "uint4x32_pack"
    UINT4X32_WORD = "uint4x32_word"

    @property
    def symbol(self) -> str | None:
        """The infix form of the ``.cd`` notation, also used by ``.ll``; ``None`` for the
        uint4x32 word operators, which both notations print as calls, ``name(a, b)``."""
        return _BINOP_SYMBOLS.get(self)

    @property
    def infix(self) -> bool:
        """Printed ``(a <symbol> b)`` in ``.ll``; the others print ``name(a, b)``."""
        return self.symbol is not None and self not in (
            Binop.MAX, Binop.MIN, Binop.RELU_GATE, Binop.SAT01_GATE, Binop.THREEFRY4X32)


_BINOP_SYMBOLS = {
    Binop.ADD: "+", Binop.SUB: "-", Binop.MUL: "*", Binop.DIV: "/", Binop.POW: "**",
    Binop.MAX: "@^", Binop.MIN: "@-", Binop.LT: "<", Binop.GT: ">", Binop.EQ: "=",
    Binop.NE: "<>", Binop.RELU_GATE: "-?/", Binop.SAT01_GATE: "-?^", Binop.MOD: "%",
    Binop.AND: "&&", Binop.OR: "||", Binop.THREEFRY4X32: "^^^^",
}  # fmt: skip


class Ternop(_Operator):
    WHERE = "where"
    FMA = "fma"
    MUL3 = "mul3"


ScalarOp = Unop | Binop | Ternop

_ARITIES: dict[type[_Operator], int] = {Unop: 1, Binop: 2, Ternop: 3}

FLOAT_ONLY_OPS: frozenset[ScalarOp] = frozenset({
    Unop.EXP, Unop.LOG, Unop.EXP2, Unop.LOG2, Unop.SIN, Unop.COS, Unop.SQRT, Unop.RECIP, Unop.RECIP_SQRT,
    Unop.TANH, Unop.SIGMOID, Unop.ERF, Binop.POW})
"""The operators defined on float operands only: the transcendental ones, the reciprocals and
``pow``. The others take integer operands too (``div`` and ``mod`` truncating as C does), except
the PRNG operators, whose operand types are fixed (:func:`operand_dtypes`)."""

PRNG_OPS: frozenset[ScalarOp] = frozenset(
    {Binop.THREEFRY4X32, Unop.UNIFORM1, Unop.UINT4X32_OF, Binop.UINT4X32_PACK, Binop.UINT4X32_WORD})
"""The operators of counter-based random numbers: the only ones on uint4x32 values."""

UINT4X32_LANES = 4
"""The uint32 lanes of a uint4x32 value; ``uint4x32_word``'s lane index is below it."""


def operand_dtypes(op: ScalarOp, result: DType) -> tuple[DType, ...]:
    """The operand types of ``op`` when it yields a ``result`` value: those of the PRNG operators
    are fixed (a ``uint4x32_of`` operand is an index-sized ``uint32``, the halves of
    ``uint4x32_pack`` are int64, the lane index of ``uint4x32_word`` a uint32); every other
    operator computes in its result's type."""
    if op is Binop.THREEFRY4X32:
        return (dtypes.uint4x32, dtypes.uint4x32)
    if op is Unop.UNIFORM1:
        return (dtypes.uint4x32,)
    if op is Unop.UINT4X32_OF:
        return (dtypes.uint32,)
    if op is Binop.UINT4X32_PACK:
        return (dtypes.int64, dtypes.int64)
    if op is Binop.UINT4X32_WORD:
        return (dtypes.uint4x32, dtypes.uint32)
    return (result,) * op.arity


LIBM_OPS: frozenset[ScalarOp] = frozenset(
    {Unop.EXP, Unop.LOG, Unop.EXP2, Unop.LOG2, Unop.SIN, Unop.COS, Unop.TANH, Unop.SIGMOID, Unop.ERF})
"""The operators whose float results are a math library's approximations, not correctly rounded
results: the interpreter takes numpy's (its own vectorized routines on most x86-64 CPUs; for
``erf``, which numpy lacks, the C library's float64 one, rounded), the C backend and the Metal
shim the C library's (except two polynomials of the project's own, ocannl/backends/c_family.py:
C's float32 ``exp``, which vectorizes, and Metal's ``erf``, which MSL lacks), so the two may
differ in the last bits. ``sigmoid`` is here through its ``exp``. ``pow`` is not: every
CPU backend calls the C library's ``pow``."""

LIBM_MAX_ULPS = 4
"""The most the results of :data:`LIBM_OPS` differ between the interpreter and the C backend, in
units in the last place of the result's precision: measured over 10^6 float32 and 10^6 float64
arguments per operator (half spread over the operator's useful range, half random bit patterns
of every magnitude), the largest difference was 4 (``sigmoid``); ``exp2``, ``log``, ``tanh``
reached 3, ``exp``, ``log2``, ``sin`` 2, ``cos`` and ``erf`` 1 (Metal's ``erf`` 1 too)
(docs/semantics.md, "Numerics")."""

ACCUMULATORS: frozenset[Binop] = frozenset({Binop.ADD, Binop.SUB, Binop.MUL, Binop.DIV, Binop.MAX, Binop.MIN})
"""The operators an accumulating assignment may accumulate with (``=+``, ``=:*``, ...)."""


def neutral_element(accum: Binop | None, dtype: DType) -> float | int:
    """The value ``=:+``-style assignments reset their left side to, and that padded margins read:
    0 for add/sub and for a plain set, 1 for mul/div, the lowest value
    for max and the highest for min."""
    if accum in (Binop.MUL, Binop.DIV):
        return 1
    if accum is Binop.MAX:
        return dtypes.lowest(dtype)
    if accum is Binop.MIN:
        return dtypes.highest(dtype)
    return 0
