"""The MSL table of the shared walk (spec/backend.md §7.5, with the semantics of the interpreter).

Every operator prints so that the kernel computes the interpreter's values: float arithmetic in
float (the backend asks Metal for IEEE semantics, no fast math; the shim compiles with
``-ffp-contract=off``), the transcendental functions as their ``precise::`` variants, integer
results wrapping around. ``max``/``min``/``relu`` and the gates are small overloaded inline
functions with the interpreter's NaN and signed-zero rules; integer ``div``/``mod`` record a zero
divisor in the kernel's status buffer. Where differs from the original emitter: ``where`` is a
conditional expression (the original's ``select`` evaluates both branches, and a gather in the
branch not taken may read out of bounds).

Types: float32 ``float``, float16 ``half``, bfloat16 ``bfloat`` (storage only: loads convert to
float, stores round to nearest even), int32 ``int``, int64 ``long``, uint32 ``uint``, uint4x32
``uint4``. MSL has no ``double``: float64 is a :class:`~ocannl.lowlevel.dtypes.DTypeError`
(emit.py checks every node and value before printing).

A :class:`MetalSyntax` records the helper functions it prints and the types it prints them for;
:meth:`MetalSyntax.builtins` is the code defining exactly those (spec/backend.md §7.6).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ocannl.backends.codegen import Syntax
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType, DTypeError
from ocannl.lowlevel.prng_reference import DEFAULT_ROUNDS, KEY_SCHEDULE_PARITY, ROTATIONS
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop

_TYPES = {
    dtypes.float32: "float",
    dtypes.float16: "half",
    dtypes.bfloat16: "bfloat",
    dtypes.int32: "int",
    dtypes.int64: "long",
    dtypes.uint32: "uint",
    dtypes.uint4x32: "uint4",
}

_PRECISE = {
    Unop.EXP: "exp",
    Unop.LOG: "log",
    Unop.EXP2: "exp2",
    Unop.LOG2: "log2",
    Unop.SIN: "sin",
    Unop.COS: "cos",
    Unop.SQRT: "sqrt",
    Unop.TANH: "tanh",
}

_INFIX = {Binop.ADD: "+", Binop.SUB: "-", Binop.MUL: "*", Binop.DIV: "/"}

_COMPARISONS = {Binop.LT: "<", Binop.GT: ">", Binop.EQ: "==", Binop.NE: "!="}

_HELPER_OPS = {
    Unop.RELU: "ocannl_relu",
    Unop.SAT01: "ocannl_sat01",
    Unop.NOT: "ocannl_not",
    Binop.MAX: "ocannl_max",
    Binop.MIN: "ocannl_min",
    Binop.RELU_GATE: "ocannl_relu_gate",
    Binop.SAT01_GATE: "ocannl_sat01_gate",
}


def msl_type(dtype: DType) -> str:
    """The MSL name of a precision; float64 is a :class:`DTypeError` (MSL has no double)."""
    if dtype not in _TYPES:
        raise DTypeError(f"Metal has no {dtype.name} type (MSL has no double): use float32 on the metal backend")
    return _TYPES[dtype]


class MetalSyntax(Syntax):
    """The MSL table. Operators on float16/bfloat16 never reach it: the IR computes those in
    float and converts on load and store."""

    index_type = "int"
    index_dtype = dtypes.int32
    restrict = ""

    def __init__(self) -> None:
        self.helpers: dict[str, set[DType]] = {}
        """Helper function name -> the compute types it was printed for."""

    def _helper(self, name: str, dtype: DType | None = None) -> str:
        self.helpers.setdefault(name, set())
        if dtype is not None:
            self.helpers[name].add(dtype)
        return name

    def storage_type(self, dtype: DType) -> str:
        return msl_type(dtype)

    def compute_type(self, dtype: DType) -> str:
        return msl_type(dtype.compute)

    def literal(self, value, dtype: DType) -> str:
        if dtype is dtypes.uint4x32:
            return f"uint4({', '.join(f'{int(v) & 0xFFFFFFFF}u' for v in value)})"
        if dtype.is_float:
            msl_type(dtype)
            return _float_literal(float(value))
        v = int(value)
        if dtype is dtypes.uint32:
            return f"{v & 0xFFFFFFFF}u"
        if dtype is dtypes.int64:
            if v == -(2**63):
                return "(-9223372036854775807l - 1l)"
            return f"{v}l" if v >= 0 else f"({v}l)"
        if v == -(2**31):
            return "(-2147483647 - 1)"
        return str(v) if v >= 0 else f"({v})"

    def unary(self, op: Unop, dtype: DType, x: str) -> str:
        if op is Unop.UNIFORM1:
            if dtype is not dtypes.float32:
                raise DTypeError(f"Metal has no {dtype.name}: uniform1 makes float32 values on the metal backend")
            return f"{self._helper('ocannl_uniform1')}({x})"
        if op is Unop.UINT4X32_OF:
            return f"{self._helper('ocannl_uint4x32_of')}({x})"
        one = self.literal(1, dtype)
        if op is Unop.ID:
            return x
        if op in _HELPER_OPS:
            return f"{self._helper(_HELPER_OPS[op], dtype)}({x})"
        if op is Unop.NEG:
            return f"(-{x})"
        if op is Unop.ABS:
            if dtype.is_float:
                return f"fabs({x})"
            return x if dtype is dtypes.uint32 else f"{self._helper('ocannl_abs', dtype)}({x})"
        if op in _PRECISE:
            return f"precise::{_PRECISE[op]}({x})"
        if op is Unop.RECIP:
            return f"({one} / {x})"
        if op is Unop.RECIP_SQRT:
            return f"({one} / precise::sqrt({x}))"
        if op is Unop.SIGMOID:
            return f"({one} / ({one} + precise::exp(-{x})))"
        raise AssertionError(f"{op.value} is missing from the metal operator table")

    def binary(self, op: Binop, dtype: DType, a: str, b: str) -> str:
        if op is Binop.THREEFRY4X32:
            return f"{self._helper('ocannl_threefry4x32')}({a}, {b})"
        if op in _INFIX:
            return f"({a} {_INFIX[op]} {b})"
        if op in _HELPER_OPS:
            return f"{self._helper(_HELPER_OPS[op], dtype)}({a}, {b})"
        t = self.compute_type(dtype)
        if op in _COMPARISONS:
            return f"{t}({a} {_COMPARISONS[op]} {b})"
        zero = self.literal(0, dtype)
        if op is Binop.AND:
            return f"{t}({a} != {zero} && {b} != {zero})"
        if op is Binop.OR:
            return f"{t}({a} != {zero} || {b} != {zero})"
        if op is Binop.POW:
            return f"precise::pow({a}, {b})"
        if op is Binop.MOD:
            return f"precise::fmod({a}, {b})"
        raise AssertionError(f"{op.value} is missing from the metal operator table")

    def int_division(self, op: Binop, dtype: DType, a: str, b: str, site: int) -> str:
        return f"{self._helper(f'ocannl_{op.value}', dtype)}({a}, {b}, _status, {site})"

    def ternary(self, op: Ternop, dtype: DType, a: str, b: str, c: str) -> str:
        if op is Ternop.FMA:
            return f"fma({a}, {b}, {c})" if dtype.is_float else f"({a} * {b} + {c})"
        if op is Ternop.MUL3:
            return f"({a} * {b} * {c})"
        raise AssertionError(f"{op.value} is missing from the metal operator table")

    def where(self, cond: str, a: str, b: str) -> str:
        return f"({cond} ? {a} : {b})"

    def cast(self, x: str, source: DType, target: DType) -> str:
        if source is target:
            return x
        t = msl_type(target)
        if source.is_float and not target.is_float:
            # Through long, so out-of-range values wrap as in the interpreter (dtypes.round_to).
            return f"long({x})" if target is dtypes.int64 else f"{t}(long({x}))"
        return f"{t}({x})"

    def from_storage(self, dtype: DType, cell: str) -> str:
        return f"float({cell})" if dtype in (dtypes.float16, dtypes.bfloat16) else cell

    def to_storage(self, dtype: DType, value: str) -> str:
        return f"{msl_type(dtype)}({value})" if dtype in (dtypes.float16, dtypes.bfloat16) else value

    def checked_index(self, index: str, extent: int, site: int) -> str:
        return f"{self._helper('ocannl_index')}({index}, {extent}, _status, {site})"

    # -- builtins --------------------------------------------------------------------------------

    def builtins(self) -> list[str]:
        """The code of the helper functions printed so far, each once, in a fixed order."""
        needed = dict(self.helpers)
        for name in list(needed):
            for dep in _DEPENDENCIES.get(name, ()):
                needed.setdefault(dep, set())
        out = []
        for name, make in _BUILTINS:
            if name in needed:
                types = sorted(needed[name], key=lambda d: _TYPE_ORDER.index(d))
                out.append(make(types))
        return out


def _float_literal(v: float) -> str:
    if math.isnan(v):
        return "(-NAN)" if math.copysign(1.0, v) < 0 else "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    text = str(np.float32(v))  # the shortest digits that read back as this float32
    text = (text if any(ch in text for ch in ".e") else text + ".0") + "f"
    return f"({text})" if text.startswith("-") else text


# ---------------------------------------------------------------------------------------------
# Builtins: (name, code maker) in the order a source prints them; typed helpers get one overload
# per compute type the kernels use.

_TYPE_ORDER = [dtypes.float32, dtypes.int32, dtypes.int64, dtypes.uint32]


def _typed(make_one: Callable[[str, DType], str]) -> Callable[[list[DType]], str]:
    return lambda types: "\n".join(make_one(_TYPES[t], t) for t in types)


def _zero_one(dtype: DType) -> tuple[str, str]:
    syn = MetalSyntax()
    return syn.literal(0, dtype), syn.literal(1, dtype)


def _max_min(name: str, cmp: str):
    def make(t: str, dtype: DType) -> str:
        nan = " || b != b" if dtype.is_float else ""
        return f"inline {t} {name}({t} a, {t} b) {{ return (a {cmp} b{nan}) ? a : b; }}"

    return _typed(make)


def _relu(t: str, dtype: DType) -> str:
    zero, _ = _zero_one(dtype)
    return f"inline {t} ocannl_relu({t} x) {{ return x > {zero} ? x : {zero}; }}"


def _sat01(t: str, dtype: DType) -> str:
    zero, one = _zero_one(dtype)
    return f"inline {t} ocannl_sat01({t} x) {{ return !(x > {zero}) ? {zero} : x < {one} ? x : {one}; }}"


def _not(t: str, dtype: DType) -> str:
    zero, one = _zero_one(dtype)
    return f"inline {t} ocannl_not({t} x) {{ return x == {zero} ? {one} : {zero}; }}"


def _relu_gate(t: str, dtype: DType) -> str:
    zero, _ = _zero_one(dtype)
    return f"inline {t} ocannl_relu_gate({t} a, {t} b) {{ return a > {zero} ? b : {zero}; }}"


def _sat01_gate(t: str, dtype: DType) -> str:
    zero, one = _zero_one(dtype)
    return f"inline {t} ocannl_sat01_gate({t} a, {t} b) {{ return {zero} < a && a < {one} ? b : {zero}; }}"


def _unsigned(t: str) -> str:
    return {"int": "uint", "long": "ulong"}.get(t, t)


def _abs(t: str, dtype: DType) -> str:
    return f"inline {t} ocannl_abs({t} x) {{ return x < 0 ? {t}(0u - {_unsigned(t)}(x)) : x; }}"


def _division(op: str):
    def make(t: str, dtype: DType) -> str:
        signed = dtype is not dtypes.uint32
        if op == "div":
            result = f"b == -1 ? {t}(0u - {_unsigned(t)}(a)) : a / b;  /* MIN / -1 wraps */" if signed else "a / b;"
        else:
            result = "b == -1 ? 0 : a % b;" if signed else "a % b;"
        return (
            f"inline {t} ocannl_{op}({t} a, {t} b, device atomic_int* status, int site) {{\n"
            f"  if (b == 0) {{ ocannl_fail(status, site); return 0; }}\n"
            f"  return {result}\n}}"
        )

    return _typed(make)


_FAIL = """inline void ocannl_fail(device atomic_int* status, int site) {
  atomic_store_explicit(status, site, memory_order_relaxed);  /* reported by the host after the run */
}"""

_INDEX = """inline int ocannl_index(long i, long n, device atomic_int* status, int site) {
  if (i < 0 || i >= n) { ocannl_fail(status, site); return 0; }  /* clamped: never outside */
  return int(i);  /* within a buffer: below 2**31 */
}"""


def _threefry(_types) -> str:
    """Standard Threefry-4x32-20: the bit contract of ``ocannl/lowlevel/prng.py`` (constants
    from ``prng_reference.py``, checked against Random123's known answers)."""
    rotations = ", ".join(f"{{{a}u, {b}u}}" for a, b in ROTATIONS)
    return f"""inline uint ocannl_rotl32(uint x, uint r) {{ return (x << r) | (x >> (32u - r)); }}
inline uint4 ocannl_threefry4x32(uint4 key, uint4 counter) {{
  const uint rot[8][2] = {{{rotations}}};
  const uint ks[5] = {{key.x, key.y, key.z, key.w, key.x ^ key.y ^ key.z ^ key.w ^ 0x{KEY_SCHEDULE_PARITY:X}u}};
  uint x0 = counter.x + ks[0], x1 = counter.y + ks[1], x2 = counter.z + ks[2], x3 = counter.w + ks[3];
  for (uint s = 1u; s <= {DEFAULT_ROUNDS // 4}u; ++s) {{  /* four rounds, then key injection s */
    for (uint j = 0u; j < 4u; ++j) {{
      const uint r0 = rot[(4u * (s - 1u) + j) % 8u][0], r1 = rot[(4u * (s - 1u) + j) % 8u][1];
      if (j % 2u == 0u) {{ x0 += x1; x1 = ocannl_rotl32(x1, r0) ^ x0; x2 += x3; x3 = ocannl_rotl32(x3, r1) ^ x2; }}
      else {{ x0 += x3; x3 = ocannl_rotl32(x3, r0) ^ x0; x2 += x1; x1 = ocannl_rotl32(x1, r1) ^ x2; }}
    }}
    x0 += ks[s % 5u]; x1 += ks[(s + 1u) % 5u]; x2 += ks[(s + 2u) % 5u]; x3 += ks[(s + 3u) % 5u] + s;
  }}
  return uint4(x0, x1, x2, x3);
}}"""


_UINT4X32_OF = """inline uint4 ocannl_uint4x32_of(ulong x) { return uint4(uint(x), uint(x >> 32), 0u, 0u); }
inline uint4 ocannl_uint4x32_of(long x) { return ocannl_uint4x32_of(ulong(x)); }  /* sign-extended */
inline uint4 ocannl_uint4x32_of(int x) { return ocannl_uint4x32_of(ulong(long(x))); }
inline uint4 ocannl_uint4x32_of(uint x) { return ocannl_uint4x32_of(ulong(x)); }"""

_UNIFORM1 = "inline float ocannl_uniform1(uint4 x) { return float(x.x >> 8) * 5.9604644775390625e-8f; }  /* 2^-24 */"

_BUILTINS = [
    ("ocannl_fail", lambda _: _FAIL),
    ("ocannl_index", lambda _: _INDEX),
    ("ocannl_threefry4x32", _threefry),
    ("ocannl_uint4x32_of", lambda _: _UINT4X32_OF),
    ("ocannl_uniform1", lambda _: _UNIFORM1),
    ("ocannl_max", _max_min("ocannl_max", ">")),
    ("ocannl_min", _max_min("ocannl_min", "<")),
    ("ocannl_relu", _typed(_relu)),
    ("ocannl_sat01", _typed(_sat01)),
    ("ocannl_not", _typed(_not)),
    ("ocannl_relu_gate", _typed(_relu_gate)),
    ("ocannl_sat01_gate", _typed(_sat01_gate)),
    ("ocannl_abs", _typed(_abs)),
    ("ocannl_div", _division("div")),
    ("ocannl_mod", _division("mod")),
]

_DEPENDENCIES = {"ocannl_index": ("ocannl_fail",), "ocannl_div": ("ocannl_fail",), "ocannl_mod": ("ocannl_fail",)}
