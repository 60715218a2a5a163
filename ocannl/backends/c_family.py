"""What C and the Metal Shading Language print alike: the C-family base of their syntax tables.

The shared walk (:class:`~ocannl.backends.codegen.Emitter`) asks a
:class:`~ocannl.backends.codegen.Syntax` for every piece of text that is not structure. C and MSL
agree on nearly all of it: infix arithmetic, comparisons as 0/1 values of the operands' type,
conditional expressions, the helper functions that carry the interpreter's NaN, signed-zero and
wrap-around rules (``docs/semantics.md``, "Numerics"), the checked index and integer division
that record a failure site instead of trapping, and the Threefry-4x32 generator with its
conversions (``ocannl/lowlevel/prng.py``). :class:`CFamilySyntax` holds all of that once, and one
generator prints the helper functions from the same templates for both languages. A language
gives only its deltas:

* its type names, and the 64-bit unsigned type the PRNG conversions use;
* how it spells a conversion (C's ``((T)x)``, MSL's ``T(x)``), a four-lane uint4x32 value, a
  64-bit integer constant, the most negative int32 and int64, and a function of its math
  library (C's ``logf``/``log``, MSL's ``precise::log``) or the helper printed in its place
  (MSL's ``erf``, C's float32 ``exp``);
* how a helper is declared (``static inline``, ``inline``) and how a large one is kept out of
  line; where the failure status lives (a host pointer, a device atomic);
* whether it overloads functions: MSL prints one ``ocannl_max`` per type, C, which has no
  overloading, ``ocannl_max_f32``, ``ocannl_max_i64``...

Helper functions are recorded as the walk prints them, with the compute types they are printed
for; :meth:`CFamilySyntax.builtins` then writes exactly those, definitions before uses, in the
order of :data:`_HELPERS`. Nothing is read back out of printed text.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ocannl.backends.codegen import Syntax
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.prng_reference import DEFAULT_ROUNDS, KEY_SCHEDULE_PARITY, ROTATIONS
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop

MATH_FUNCTIONS = {
    Unop.EXP: "exp",
    Unop.LOG: "log",
    Unop.EXP2: "exp2",
    Unop.LOG2: "log2",
    Unop.SIN: "sin",
    Unop.COS: "cos",
    Unop.SQRT: "sqrt",
    Unop.TANH: "tanh",
    Unop.ERF: "erf",
}
"""Unary operators that are one call of the math library, by the library's float64 name (a
language's :meth:`CFamilySyntax.math_function` spells it for a precision, or names the helper
that stands in for it: MSL's ``erf``, which its library lacks, :func:`_erf`; C's float32 ``exp``,
which vectorizes where ``expf`` does not, :func:`_exp`)."""

INFIX = {Binop.ADD: "+", Binop.SUB: "-", Binop.MUL: "*", Binop.DIV: "/"}
"""The float arithmetic C-family languages write infix (the C tiles apply it to vectors too)."""

_COMPARISONS = {Binop.LT: "<", Binop.GT: ">", Binop.EQ: "==", Binop.NE: "!="}

_RULES: dict[Unop | Binop, tuple[str, str]] = {
    Unop.SAT01: ("x", "!(x > {zero}) ? {zero} : x < {one} ? x : {one}"),
    Unop.NOT: ("x", "x == {zero} ? {one} : {zero}"),
    Binop.SAT01_GATE: ("a, b", "{zero} < a && a < {one} ? b : {zero}"),
}
"""Operators printed as a call of a helper ``ocannl_<op>``: its parameters and the expression it
returns, the interpreter's rule written with comparisons."""

_SELECTS: dict[Unop | Binop, tuple[str, str, str, str]] = {
    Binop.MAX: ("a, b", "a > b", "a", "b"),
    Binop.MIN: ("a, b", "a < b", "a", "b"),
    Unop.RELU: ("x", "x > {zero}", "x", "{zero}"),
    Binop.RELU_GATE: ("a, b", "a > {zero}", "b", "{zero}"),
}
"""Operators whose helper returns one of two values already computed: parameters, the test, the
value where it holds and the value where it does not. With one NaN operand ``max`` and ``min``
return the other (a NaN ``a`` fails the comparison; a second test catches a NaN ``b``), as the
math library's ``fmax``/``fmin`` do, but these also fix which zero ``max(-0.0, 0.0)`` gives.

Each has two helpers. ``ocannl_max`` is a conditional expression: in a serial chain (a maximum
over a row) a predicted branch keeps the select's latency off the chain. ``ocannl_max_blend``,
printed where no chain runs (the ``branchless`` argument of :meth:`CFamilySyntax.binary`, from
``NestPlan.branchless`` in ocannl/lowlevel/cpu_schedule.py: wide register tiles, nests storing
one cell per iteration), is :meth:`CFamilySyntax.select`, the tests joined
with ``|`` so both are evaluated: GCC keeps a conditional expression a branch per cell in a
tile's straight-line code, and GCC 12 built for AVX2 left relu's gradient loop a branch per
element too (the MLP step of bench/cpu_steps.py: 610-630 µs, 425-450 µs with the blend), where
it vectorizes the select of bits."""

_SIGNED = (dtypes.int32, dtypes.int64)
"""The signed integer compute types, whose arithmetic is written through unsigned
(:meth:`CFamilySyntax._wrapping`)."""

_TAGS = {dtypes.float32: "f32", dtypes.float64: "f64", dtypes.int32: "i32", dtypes.int64: "i64", dtypes.uint32: "u32"}
"""The compute types a typed helper is written for, in print order, and the suffix that names a
helper's copy for each in a language without overloading."""


def helper_name(name: str, dtype: DType, overloads: bool) -> str:
    """The name a typed helper has for ``dtype``: ``name`` itself where the language overloads
    functions, else ``name`` with the type's tag (``ocannl_max_f32``)."""
    return name if overloads else f"{name}_{_TAGS[dtype]}"


class CFamilySyntax(Syntax):
    """The operator table of a C-family language, less its spelling deltas (module docstring).

    Operators on float16/bfloat16 never reach it: the IR computes those in float32 and converts on
    load and store (:meth:`from_storage`, :meth:`to_storage`).
    """

    language: str
    """The language's name, for error messages."""
    overloads: bool
    """Whether the language overloads functions by parameter type (see :func:`helper_name`)."""
    uint64_type: str
    int64_format: str
    """A non-negative int64 constant, ``{}`` standing for its digits."""
    int32_min: str
    int64_min: str
    """The most negative value: its digits alone would be an out-of-range positive constant."""
    inline: str
    """The declaration prefix of a small helper function."""
    out_of_line: str
    """The declaration prefix of a helper kept out of line (the Threefry generator)."""
    local_constant: str
    """The qualifiers of a constant table inside a function."""
    lanes: tuple[str, str, str, str]
    """The members of a uint4x32 value holding its lanes 0 to 3."""
    lane_subscript: str
    """What follows a uint4x32 value to read the lane numbered by an expression, ``{}`` standing
    for it: C subscripts its struct's array, MSL its vector."""
    status_param: str
    """The parameter through which a helper records a failed check."""
    store_status: str
    """The statement storing ``site`` into ``status``: atomic, since parallel iterations may fail
    at once (one of their sites is reported), and relaxed, since nothing else is ordered by it."""

    def __init__(self) -> None:
        self._used: dict[str, set[DType]] = {}
        """Helper function -> the compute types it was printed for."""

    # -- the deltas ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def convert(self, type_name: str, x: str, *, compound: bool = False) -> str:
        """``x`` converted to ``type_name``; ``compound``: ``x`` is an operator expression, not an
        operand, and may need parentheses."""

    @abc.abstractmethod
    def vector(self, lanes: Sequence[str]) -> str:
        """A uint4x32 value made of four uint32 expressions."""

    @abc.abstractmethod
    def math_function(self, name: str, dtype: DType) -> str:
        """The math library's function ``name`` (its float64 name) for ``dtype`` values."""

    # -- the shared table ---------------------------------------------------------------------------

    def helper(self, name: str, dtype: DType | None = None) -> str:
        """The printed name of helper ``name`` (typed: for ``dtype``), recorded for
        :meth:`builtins`. A type the language lacks is refused here, at the call."""
        if dtype is not None:
            self.compute_type(dtype)
        self._used.setdefault(name, set())
        if dtype is None:
            return name
        self._used[name].add(dtype)
        return helper_name(name, dtype, self.overloads)

    def compute_type(self, dtype: DType) -> str:
        return self.storage_type(dtype.compute)

    def literal(self, value, dtype: DType) -> str:
        if dtype is dtypes.uint4x32:
            return self.vector([f"{int(v) & 0xFFFFFFFF}u" for v in value])
        if dtype.is_float:
            return self._float_literal(float(value), dtype)
        v = int(value)
        if dtype is dtypes.uint32:
            return f"{v & 0xFFFFFFFF}u"
        if dtype is dtypes.int64:
            if v == -(2**63):
                return self.int64_min
            return self.int64_format.format(v) if v >= 0 else f"(-{self.int64_format.format(-v)})"
        if v == -(2**31):
            return self.int32_min
        return str(v) if v >= 0 else f"({v})"

    def _float_literal(self, v: float, dtype: DType) -> str:
        type_name = self.compute_type(dtype)
        single = dtype.compute is dtypes.float32
        if math.isnan(v):
            return "(-NAN)" if math.copysign(1.0, v) < 0 else "NAN"
        if math.isinf(v):
            text = "INFINITY" if single else self.convert(type_name, "INFINITY")
            return text if v > 0 else f"(-{text})"
        if single:
            text = str(np.float32(v))  # the shortest digits that read back as this float32
            text = (text if any(ch in text for ch in ".e") else text + ".0") + "f"
        else:
            text = repr(v)
        return f"({text})" if text.startswith("-") else text

    def unary(self, op: Unop, dtype: DType, x: str, *, branchless: bool = False) -> str:
        if op is Unop.UNIFORM1:
            return f"{self.helper('ocannl_uniform1', dtype)}({x})"
        if op is Unop.UINT4X32_OF:
            return f"{self.helper('ocannl_uint4x32_of')}({x})"
        if op is Unop.ID:
            return x
        if op in _RULES or op in _SELECTS:
            return f"{self.helper(self._rule_name(op, dtype, branchless), dtype)}({x})"
        if op is Unop.NEG:
            return self._wrapping(dtype, "-", self.literal(0, dtype), x) if dtype in _SIGNED else f"(-{x})"
        if op is Unop.ABS:
            if dtype.is_float:
                return f"{self.math_function('fabs', dtype)}({x})"
            return x if dtype is dtypes.uint32 else f"{self.helper('ocannl_abs', dtype)}({x})"
        if op in MATH_FUNCTIONS:
            return f"{self.math_function(MATH_FUNCTIONS[op], dtype)}({x})"
        one = self.literal(1, dtype)
        if op is Unop.RECIP:
            return f"({one} / {x})"
        if op is Unop.RECIP_SQRT:
            return f"({one} / {self.math_function('sqrt', dtype)}({x}))"
        if op is Unop.SIGMOID:
            return f"({one} / ({one} + {self.math_function('exp', dtype)}(-{x})))"
        raise AssertionError(f"{op.value} is missing from the {self.language} operator table")

    def binary(self, op: Binop, dtype: DType, a: str, b: str, *, branchless: bool = False) -> str:
        if op is Binop.THREEFRY4X32:
            return f"{self.helper('ocannl_threefry4x32')}({a}, {b})"
        if op is Binop.UINT4X32_PACK:
            return f"{self.helper('ocannl_uint4x32_pack')}({a}, {b})"
        if op is Binop.UINT4X32_WORD:
            return f"({a}){self.lane_subscript.format(b)}"
        if op in INFIX:
            if dtype in _SIGNED and op is not Binop.DIV:
                return self._wrapping(dtype, INFIX[op], a, b)
            return f"({a} {INFIX[op]} {b})"
        if op in _RULES or op in _SELECTS:
            return f"{self.helper(self._rule_name(op, dtype, branchless), dtype)}({a}, {b})"
        t = self.compute_type(dtype)
        if op in _COMPARISONS:
            return self.convert(t, f"{a} {_COMPARISONS[op]} {b}", compound=True)
        zero = self.literal(0, dtype)
        if op is Binop.AND:
            return self.convert(t, f"{a} != {zero} && {b} != {zero}", compound=True)
        if op is Binop.OR:
            return self.convert(t, f"{a} != {zero} || {b} != {zero}", compound=True)
        if op is Binop.POW:
            return f"{self.math_function('pow', dtype)}({a}, {b})"
        if op is Binop.MOD:
            return f"{self.math_function('fmod', dtype)}({a}, {b})"
        raise AssertionError(f"{op.value} is missing from the {self.language} operator table")

    def int_division(self, op: Binop, dtype: DType, a: str, b: str, site: int) -> str:
        return f"{self.helper(f'ocannl_{op.value}', dtype)}({a}, {b}, _status, {site})"

    def ternary(self, op: Ternop, dtype: DType, a: str, b: str, c: str) -> str:
        if op is Ternop.FMA:
            if dtype.is_float:
                return f"{self.math_function('fma', dtype)}({a}, {b}, {c})"
            product = self._wrapping(dtype, "*", a, b) if dtype in _SIGNED else f"{a} * {b}"
            return self._wrapping(dtype, "+", product, c) if dtype in _SIGNED else f"({product} + {c})"
        if op is Ternop.MUL3:
            return self._wrapping(dtype, "*", a, b, c) if dtype in _SIGNED else f"({a} * {b} * {c})"
        raise AssertionError(f"{op.value} is missing from the {self.language} operator table")

    def _wrapping(self, dtype: DType, infix: str, *operands: str) -> str:
        """``operands`` joined by ``infix`` in the signed integer ``dtype``, wrapping around as the
        interpreter does (docs/precisions.md, "Integer arithmetic"): computed in the unsigned type
        of the same width, whose arithmetic is modulo 2**bits, and converted back. Signed
        overflow is undefined behaviour in C and MSL; ``-fwrapv`` defines it for GCC and Clang
        only, and not for the Metal compiler."""
        unsigned = _unsigned(self, dtype)
        terms = f" {infix} ".join(self.convert(unsigned, x) for x in operands)
        return self.convert(self.compute_type(dtype), terms, compound=True)

    def where(self, cond: str, a: str, b: str) -> str:
        return f"({cond} ? {a} : {b})"

    def _rule_name(self, op: Unop | Binop, dtype: DType, branchless: bool) -> str:
        """The helper of a rule operator: for a float select where no chain runs
        (``branchless``), the one that selects without a branch (``ocannl_max_blend``)."""
        blend = op in _SELECTS and branchless and dtype.is_float
        return f"ocannl_{op.value}_blend" if blend else f"ocannl_{op.value}"

    def select(self, dtype: DType, cond: str, a: str, b: str) -> str:
        """``a`` where the int ``cond`` is nonzero, else ``b``, both already evaluated (free of
        effects and of failures). Floats go through the helper ``ocannl_select``
        (:meth:`select_body`): a select without a branch, which the compiler vectorizes, where
        a conditional expression in straight-line code stays a branch per cell."""
        if dtype.is_float:
            return f"{self.helper('ocannl_select', dtype)}({cond}, {a}, {b})"
        return f"({cond}) ? {a} : {b}"

    @abc.abstractmethod
    def select_body(self, dtype: DType) -> str:
        """The statements of ``ocannl_select`` for the float ``dtype``: parameters ``int cond``,
        ``a`` and ``b``; returns ``a`` where ``cond`` is nonzero, else ``b``, bit for bit."""

    def cast(self, x: str, source: DType, target: DType) -> str:
        if source is target:
            return x
        if source.is_float and not target.is_float:
            # Through int64, so out-of-range values wrap as in the interpreter (dtypes.round_to)
            # instead of the language's undefined behaviour.
            wide = self.convert(self.storage_type(dtypes.int64), x)
            return wide if target is dtypes.int64 else self.convert(self.storage_type(target), wide)
        return self.convert(self.storage_type(target), x)

    def checked_index(self, index: str, extent: int, site: int) -> str:
        return f"{self.helper('ocannl_index')}({index}, {extent}, _status, {site})"

    # -- builtins -----------------------------------------------------------------------------------

    def builtins(self) -> list[str]:
        """The code of the helper functions printed so far, each once, in :data:`_HELPERS` order,
        preceded by the language's own definitions they and the walk need
        (:meth:`definitions`)."""
        while True:  # writing a helper may use another (a select): again until none is added
            used = {name: set(types) for name, types in self._used.items()}
            needed = {name: set(types) for name, types in used.items()}
            for name in list(needed):
                for dependency in _HELPERS[name].requires:
                    needed.setdefault(dependency, set())
            helpers = []
            for name, helper in _HELPERS.items():
                if name in needed:
                    types = [d for d in _TAGS if d in needed[name]] or [None]
                    helpers.append("\n".join(helper.write(self, d) for d in types))
            if self._used == used:
                return [*self.definitions(), *helpers]

    def definitions(self) -> list[str]:
        """Code the language needs before any helper: type definitions of printed types. Called
        after the helpers are written, so it sees the types they use too."""
        return []


# ---------------------------------------------------------------------------------------------
# The helper generator: one template per helper, spelled through the language's deltas.


@dataclass(frozen=True)
class _Helper:
    write: Callable[[CFamilySyntax, DType | None], str]
    """The helper's code in a language, for one compute type (``None``: an untyped helper)."""
    requires: tuple[str, ...] = ()
    """Helpers its code calls."""


def _rule(op: Unop | Binop) -> _Helper:
    params, result = _RULES[op]

    def write(s: CFamilySyntax, dtype: DType) -> str:
        t = s.compute_type(dtype)
        name = helper_name(f"ocannl_{op.value}", dtype, s.overloads)
        signature = ", ".join(f"{t} {p}" for p in params.split(", "))
        body = result.format(zero=s.literal(0, dtype), one=s.literal(1, dtype))
        return f"{s.inline} {t} {name}({signature}) {{ return {body}; }}"

    return _Helper(write)


def _select_rule(op: Unop | Binop, blend: bool) -> _Helper:
    """The helper of a select operator: a conditional expression (``||`` joining the tests), or
    with ``blend`` a select without a branch (``|``: both tests evaluated;
    :meth:`CFamilySyntax.select`)."""
    params, test, then, other = _SELECTS[op]

    def write(s: CFamilySyntax, dtype: DType) -> str:
        t = s.compute_type(dtype)
        name = helper_name(f"ocannl_{op.value}" + "_blend" * blend, dtype, s.overloads)
        signature = ", ".join(f"{t} {p}" for p in params.split(", "))
        zero = s.literal(0, dtype)
        cond, a, b = test.format(zero=zero), then.format(zero=zero), other.format(zero=zero)
        if op in (Binop.MAX, Binop.MIN) and dtype.is_float:
            cond = f"({cond}) | (b != b)" if blend else f"({cond} || b != b)"
        body = s.select(dtype, cond, a, b) if blend else f"{cond} ? {a} : {b}"
        return f"{s.inline} {t} {name}({signature}) {{ return {body}; }}"

    return _Helper(write)


def _select(s: CFamilySyntax, dtype: DType) -> str:
    t = s.compute_type(dtype)
    name = helper_name("ocannl_select", dtype, s.overloads)
    return f"{s.inline} {t} {name}(int cond, {t} a, {t} b) {{\n{s.select_body(dtype)}\n}}"


def _unsigned(s: CFamilySyntax, dtype: DType) -> str:
    """The unsigned type of ``dtype``'s width: negating through it wraps instead of overflowing."""
    return s.uint64_type if dtype is dtypes.int64 else s.storage_type(dtypes.uint32)


def _abs(s: CFamilySyntax, dtype: DType) -> str:
    t = s.compute_type(dtype)
    negated = s.convert(t, f"0u - {s.convert(_unsigned(s, dtype), 'x')}", compound=True)
    return f"{s.inline} {t} {helper_name('ocannl_abs', dtype, s.overloads)}({t} x) {{ return x < 0 ? {negated} : x; }}"


def _division(op: Binop) -> _Helper:
    """Integer ``div`` or ``mod``: a zero divisor records the failure site and gives 0; the
    quotient truncates toward zero, and ``MIN / -1`` wraps to ``MIN`` as in the interpreter."""

    def write(s: CFamilySyntax, dtype: DType) -> str:
        t = s.compute_type(dtype)
        if dtype is dtypes.uint32:
            result = "a / b;" if op is Binop.DIV else "a % b;"
        elif op is Binop.DIV:
            negated = s.convert(t, f"0u - {s.convert(_unsigned(s, dtype), 'a')}", compound=True)
            result = f"b == -1 ? {negated} : a / b;  /* MIN / -1 wraps */"
        else:
            result = "b == -1 ? 0 : a % b;"
        name = helper_name(f"ocannl_{op.value}", dtype, s.overloads)
        return (
            f"{s.inline} {t} {name}({t} a, {t} b, {s.status_param}, int site) {{\n"
            f"  if (b == 0) {{ ocannl_fail(status, site); return 0; }}\n"
            f"  return {result}\n}}"
        )

    return _Helper(write, requires=("ocannl_fail",))


def _fail(s: CFamilySyntax, _: None) -> str:
    return (
        f"{s.inline} void ocannl_fail({s.status_param}, int site) {{\n"
        f"  {s.store_status};  /* reported by the host after the run */\n}}"
    )


def _index(s: CFamilySyntax, _: None) -> str:
    wide = s.storage_type(dtypes.int64)
    if s.index_dtype is dtypes.int64:
        result = "return i;"
    else:
        result = f"return {s.convert(s.index_type, 'i')};  /* within a buffer: below 2**31 */"
    return (
        f"{s.inline} {s.index_type} ocannl_index({wide} i, {wide} n, {s.status_param}, int site) {{\n"
        f"  if (i < 0 || i >= n) {{ ocannl_fail(status, site); return 0; }}  /* clamped: never outside */\n"
        f"  {result}\n}}"
    )


def _threefry(s: CFamilySyntax, _: None) -> str:
    """Standard Threefry-4x32-20, the bit contract of ``ocannl/lowlevel/prng.py`` (constants from
    ``prng_reference.py``, which is checked against Random123's known answers).

    The rounds are printed one by one, each with its rotation constants: the C compilers keep
    the loops of a compact version, whose rotations are read from a table, and it runs three
    times slower (35 against 12 ns a call on x86-64 with GCC 12: a parameter initialization
    draws one value a cell)."""
    u, v = s.storage_type(dtypes.uint32), s.storage_type(dtypes.uint4x32)
    k = [f"key.{lane}" for lane in s.lanes]
    c = [f"counter.{lane}" for lane in s.lanes]
    body = []
    for injection in range(1, DEFAULT_ROUNDS // 4 + 1):  # four rounds, then a key injection
        for j in range(4):
            r0, r1 = ROTATIONS[(4 * (injection - 1) + j) % len(ROTATIONS)]
            a, b = ("x1", "x3") if j % 2 == 0 else ("x3", "x1")
            body.append(f"  x0 += {a}; {a} = ocannl_rotl32({a}, {r0}u) ^ x0; "
                        f"x2 += {b}; {b} = ocannl_rotl32({b}, {r1}u) ^ x2;")
        lanes = [f"x{m} += ks[{(injection + m) % 5}]" for m in range(4)]
        body.append(f"  {'; '.join(lanes)} + {injection}u;  /* key injection {injection} */")
    rounds = "\n".join(body)
    return f"""{s.inline} {u} ocannl_rotl32({u} x, {u} r) {{ return (x << r) | (x >> (32u - r)); }}
{s.out_of_line} {v} ocannl_threefry4x32({v} key, {v} counter) {{
  const {u} ks[5] = {{{k[0]}, {k[1]}, {k[2]}, {k[3]}, {k[0]} ^ {k[1]} ^ {k[2]} ^ {k[3]} ^ 0x{KEY_SCHEDULE_PARITY:X}u}};
  {u} x0 = {c[0]} + ks[0], x1 = {c[1]} + ks[1], x2 = {c[2]} + ks[2], x3 = {c[3]} + ks[3];
{rounds}
  return {s.vector(["x0", "x1", "x2", "x3"])};
}}"""


def _uint4x32_of(s: CFamilySyntax, _: None) -> str:
    """An integer as a counter: its 64 bits (a signed argument converts sign-extended) in lanes
    0 and 1."""
    u, v = s.storage_type(dtypes.uint32), s.storage_type(dtypes.uint4x32)
    lanes = [s.convert(u, "x"), s.convert(u, "x >> 32", compound=True), "0u", "0u"]
    return f"{s.inline} {v} ocannl_uint4x32_of({s.uint64_type} x) {{ return {s.vector(lanes)}; }}"


def _uint4x32_pack(s: CFamilySyntax, _: None) -> str:
    """Two int64 halves as a uint4x32: the 64 bits of each (converted as two's complement) in
    two lanes, low word first, ``lo`` in lanes 0 and 1."""
    u, v = s.storage_type(dtypes.uint32), s.storage_type(dtypes.uint4x32)
    lanes = [s.convert(u, half) if k % 2 == 0 else s.convert(u, f"{half} >> 32", compound=True)
             for k, half in enumerate(("lo", "lo", "hi", "hi"))]
    w = s.uint64_type
    return f"{s.inline} {v} ocannl_uint4x32_pack({w} lo, {w} hi) {{ return {s.vector(lanes)}; }}"


def _uniform1(s: CFamilySyntax, dtype: DType) -> str:
    """The top 24 bits of lane 0 (float32) or 53 bits of lanes 1:0 (float64), scaled into [0, 1):
    every value exact, as ``prng.py`` states."""
    t, v = s.compute_type(dtype), s.storage_type(dtypes.uint4x32)
    low, high = f"x.{s.lanes[0]}", f"x.{s.lanes[1]}"
    if dtype is dtypes.float32:
        bits, scale = s.convert(t, f"{low} >> 8", compound=True), s.literal(2.0**-24, dtype)
    else:
        wide = f"({s.convert(s.uint64_type, high)} << 32) | {low}"
        bits, scale = s.convert(t, f"({wide}) >> 11", compound=True), s.literal(2.0**-53, dtype)
    return f"{s.inline} {t} {helper_name('ocannl_uniform1', dtype, s.overloads)}({v} x) {{ return {bits} * {scale}; }}"


_ERF_COEFFICIENTS = {
    "far": (-1.72853470e-5, 3.83197126e-4, -3.88396438e-3, 2.42546219e-2, -1.06777877e-1, -6.34846687e-1,
            -1.28717512e-1),
    "near": (-5.96761703e-4, 4.99119423e-3, -2.67681349e-2, 1.12819925e-1, -3.76125336e-1, 1.28379166e-1),
}
"""The float32 polynomials of :func:`_erf`: beyond 0.927734375, ``erf |x| = 1 - exp(p(|x|))``
with ``p`` of degree 7 (its linear term ``-|x|`` added last); within, ``erf x = x + x p(x^2)``
with ``p`` of degree 5. They are N. Juffa's ("Efficient faithfully rounded implementation of
error function erff", Stack Overflow question 35148198), each branch under 1 ulp with fused
multiply-adds; measured here against the interpreter, 1 ulp at most (docs/semantics.md)."""


def _erf(s: CFamilySyntax, dtype: DType) -> str:
    """The error function for a language whose math library has none (MSL; C has ``erff``), float
    only: within ``LIBM_MAX_ULPS`` of the interpreter's (the C library's ``erf`` rounded to
    float32, op_semantics.py), through :data:`_ERF_COEFFICIENTS` with the language's precise
    ``exp``."""
    t = s.compute_type(dtype)
    fma, exp, copysign = (s.math_function(f, dtype) for f in ("fma", "exp", "copysign"))
    far, near = ([s.literal(v, dtype) for v in _ERF_COEFFICIENTS[k]] for k in ("far", "near"))
    far_steps = "".join(f"    r = {fma}(r, t, {v});\n" for v in far[4:])
    near_steps = "".join(f"  r = {fma}(r, s, {v});\n" for v in near[1:])
    return (
        f"{s.inline} {t} {helper_name('ocannl_erf', dtype, s.overloads)}({t} x) {{\n"
        f"  {t} t = {s.math_function('fabs', dtype)}(x), s = x * x, r;\n"
        f"  if (t > {s.literal(0.927734375, dtype)}) {{  /* 1 - exp(p(t)), with the sign of x */\n"
        f"    r = {fma}({fma}({far[0]}, t, {far[1]}), s, {fma}({far[2]}, t, {far[3]}));\n"
        f"{far_steps}"
        f"    r = {fma}(r, t, -t);\n"
        f"    return {copysign}({s.literal(1, dtype)} - {exp}(r), x);\n"
        f"  }}\n"
        f"  r = {near[0]};  /* x + x p(x^2) */\n"
        f"{near_steps}"
        f"  return {fma}(r, x, x);\n}}"
    )


_EXP_LIMIT = 130.0
"""Where :func:`_exp` clamps its argument, at either sign: beyond it the float32 result is already
infinite (from 88.73) or 0 (from -103.98), and within it ``2**n`` is a normal double, whose
exponent field the helper writes directly."""

_EXP_DEGREE = 8
"""The degree of :func:`_exp`'s Taylor polynomial: on ``|r| <= ln 2 / 2`` its remainder is below
``2**-31`` of the result, a 128th of float32's half ulp (``2**-24``)."""


def _estrin(coefficients: list[str], powers: list[str]) -> str:
    """The polynomial ``c0 + c1 r + c2 r**2 + ...`` in Estrin's scheme: pairs ``c0 + c1 r`` joined
    by ``r**2``, those pairs by ``r**4``..., ``powers`` naming ``r``, ``r**2``, ``r**4``... Its
    dependency chain grows with the logarithm of the degree, Horner's with the degree, which
    matters in a loop the compiler leaves scalar: the core overlaps only a few elements' chains."""
    terms = coefficients
    for power in powers[:(len(coefficients) - 1).bit_length()]:
        terms = [f"({a} + {b} * {power})" if b else a for a, b in zip(terms[::2], [*terms[1::2], None])]
    (polynomial,) = terms
    return polynomial


def _exp(s: CFamilySyntax, dtype: DType) -> str:
    """C's float32 ``exp`` (``OWN_FLOAT32_FUNCTIONS`` in ocannl/backends/c/syntax.py), in place of
    the C library's ``expf``: a call per element, which GCC cannot vectorize, where this
    straight-line helper vectorizes (a softmax's loops). MSL has no double: the Metal backend
    keeps ``precise::exp``.

    Computed in double, rounded to float once: ``x = n ln 2 + r`` with ``n`` rounded to the nearest
    integer by adding ``1.5 * 2**52`` (``n`` lands in the low bits, read without a conversion, so a
    NaN stays a NaN without undefined behaviour), ``exp r`` by its Taylor polynomial
    (:data:`_EXP_DEGREE`, :func:`_estrin`), ``2**n`` written into a double's exponent field. Its
    error before the final rounding is far below float32's, so the result is at most 1 ulp from
    the correctly rounded one (docs/semantics.md, "Numerics"). The clamp is a bit select, not a
    conditional expression, which GCC keeps a branch (a float comparison may trap, by its default
    ``-ftrapping-math``). In a loop the compiler leaves scalar it is slower than ``expf``, which
    reads a table: at ``-O2`` GCC vectorizes only a loop whose trip count is a multiple of the
    vector's lanes, so the C backend asks for a vector loop where it is not
    (``cpu_schedule.NestPlan.simd``, OpenMP's ``simd``). Only IEEE operations, never contracted under the default flags
    (``-ffp-contract=off``): the same bits on every machine, in scalar and vector code."""
    t, wide, bits = s.compute_type(dtype), s.storage_type(dtypes.float64), s.uint64_type
    fabs, copysign = (s.math_function(f, dtype) for f in ("fabs", "copysign"))
    limit = s.literal(_EXP_LIMIT, dtype)
    log2e, ln2 = s.literal(1 / math.log(2), dtypes.float64), s.literal(math.log(2), dtypes.float64)
    taylor = [s.literal(1 / math.factorial(k), dtypes.float64) for k in range(_EXP_DEGREE + 1)]
    powers = ["r"] + [f"r{2**k}" for k in range(1, _EXP_DEGREE.bit_length())]
    squares = ", ".join(f"{p} = {q} * {q}" for q, p in zip(powers, powers[1:]))
    return (
        f"/* exp for float32, within 1 ulp of the correctly rounded result: x = n ln 2 + r, exp r by its\n"
        f"   Taylor polynomial in double, times 2**n, rounded once. Not the C library's expf, a call per\n"
        f"   element: this vectorizes. IEEE operations only, not contracted: the same bits everywhere. */\n"
        f"{s.inline} {t} {helper_name('ocannl_exp', dtype, s.overloads)}({t} x) {{\n"
        f"  x = {s.select(dtype, f'{fabs}(x) > {limit}', f'{copysign}({limit}, x)', 'x')};"
        f"  /* still inf, or 0; NaN passes */\n"
        f"  {wide} d = x, shifted = d * {log2e} + 0x1.8p52;  /* n = round(d / ln 2), in the low bits */\n"
        f"  {wide} n = shifted - 0x1.8p52, r = d - n * {ln2}, {squares}, scale;\n"
        f"  {wide} p = {_estrin(taylor, powers)};  /* Estrin's scheme */\n"
        f"  {bits} e;\n"
        f"  memcpy(&e, &shifted, 8);\n"
        f"  e = (e - 0x4338000000000000u + 1023u) << 52;  /* 2**n: 0x1.8p52's bits off, n + 1023 in the exponent */\n"
        f"  memcpy(&scale, &e, 8);\n"
        f"  return ({t})(p * scale);\n}}"
    )


_HELPERS: dict[str, _Helper] = {
    "ocannl_fail": _Helper(_fail),
    "ocannl_index": _Helper(_index, requires=("ocannl_fail",)),
    "ocannl_threefry4x32": _Helper(_threefry),
    "ocannl_uint4x32_of": _Helper(_uint4x32_of),
    "ocannl_uint4x32_pack": _Helper(_uint4x32_pack),
    "ocannl_uniform1": _Helper(_uniform1),
    "ocannl_select": _Helper(_select),
    "ocannl_exp": _Helper(_exp),
    "ocannl_erf": _Helper(_erf),
    **{f"ocannl_{op.value}": _rule(op) for op in _RULES},
    **{f"ocannl_{op.value}": _select_rule(op, blend=False) for op in _SELECTS},
    **{f"ocannl_{op.value}_blend": _select_rule(op, blend=True) for op in _SELECTS},
    "ocannl_abs": _Helper(_abs),
    "ocannl_div": _division(Binop.DIV),
    "ocannl_mod": _division(Binop.MOD),
}
"""Every helper, in the order a source prints them (a helper after those it calls)."""
