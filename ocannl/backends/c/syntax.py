"""The C table of the shared walk (spec/backend.md §7.2, with the semantics of the interpreter).

Every operator prints so that the compiled code computes the interpreter's bits
(scalar_ops.py, backends/interp): arithmetic is plain C in the compute type (the compiler runs
with ``-ffp-contract=off``, so no fused multiply-add appears that the IR did not ask for, and
``-fwrapv``, so integer results wrap around); ``max``/``min``/``relu`` and the gates are small
inline functions with the interpreter's NaN and signed-zero rules (``fmaxf`` leaves the sign of a
zero result unspecified); integer ``div``/``mod`` check for a zero divisor. The transcendental
functions are the C library's ``expf``, ``logf``...: they agree with the interpreter (numpy) to
within ``scalar_ops.LIBM_MAX_ULPS`` ulps, not always bit for bit; ``pow`` is the C library's
``powf``/``pow`` as in the interpreter, bit for bit (docs/semantics.md, "Numerics").

Storage formats: float16 is ``_Float16`` where the compiler has it, else ``uint16_t`` bit
patterns with software conversions (round to nearest even, numpy's NaN handling); bfloat16 is
``uint16_t`` bit patterns converted like ``dtypes.float32_to_bfloat16_bits``; uint4x32 is a
struct of four uint32 lanes, laid out as numpy's trailing axis of 4.

:data:`BUILTINS` holds the helper code; a source includes the helpers whose names it uses
(spec/backend.md §7.1, "Builtins").
"""

from __future__ import annotations

import math

import numpy as np

from ocannl.backends.codegen import Syntax
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.prng_reference import DEFAULT_ROUNDS, KEY_SCHEDULE_PARITY, ROTATIONS
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop

_TAG = {
    dtypes.float32: "f32",
    dtypes.float64: "f64",
    dtypes.int32: "i32",
    dtypes.int64: "i64",
    dtypes.uint32: "u32",
}

_STORAGE = {
    dtypes.float32: "float",
    dtypes.float64: "double",
    dtypes.float16: "ocannl_half",
    dtypes.bfloat16: "uint16_t",
    dtypes.int32: "int32_t",
    dtypes.int64: "int64_t",
    dtypes.uint32: "uint32_t",
    dtypes.uint4x32: "uint4x32_t",
}

_LIBM = {
    Unop.EXP: "exp",
    Unop.LOG: "log",
    Unop.EXP2: "exp2",
    Unop.LOG2: "log2",
    Unop.SIN: "sin",
    Unop.COS: "cos",
    Unop.SQRT: "sqrt",
    Unop.TANH: "tanh",
}

_INFIX = {
    Binop.ADD: "+",
    Binop.SUB: "-",
    Binop.MUL: "*",
    Binop.DIV: "/",
}

_COMPARISONS = {Binop.LT: "<", Binop.GT: ">", Binop.EQ: "==", Binop.NE: "!="}

_HELPER_OPS = {
    Unop.RELU: "relu",
    Unop.SAT01: "sat01",
    Unop.NOT: "not",
    Binop.MAX: "max",
    Binop.MIN: "min",
    Binop.RELU_GATE: "relu_gate",
    Binop.SAT01_GATE: "sat01_gate",
}


def _fn(name: str, dtype: DType) -> str:
    """libm's name for ``dtype``: ``expf`` for float32, ``exp`` for float64."""
    return f"{name}f" if dtype is dtypes.float32 else name


class CSyntax(Syntax):
    """The C table. Operators on float16/bfloat16 never reach it: the IR computes those in
    float32 and converts on load and store (:meth:`from_storage`, :meth:`to_storage`)."""

    index_type = "int64_t"
    index_dtype = dtypes.int64
    """64-bit indices: with ``-fwrapv``, 32-bit index arithmetic would have to wrap, which keeps
    the compiler from folding ``x[4*i + 1]`` into an address plus a constant."""
    restrict = "restrict"

    def storage_type(self, dtype: DType) -> str:
        return _STORAGE[dtype]

    def compute_type(self, dtype: DType) -> str:
        return _STORAGE[dtype.compute]

    def literal(self, value, dtype: DType) -> str:
        if dtype is dtypes.uint4x32:
            lanes = ", ".join(f"{int(v) & 0xFFFFFFFF}u" for v in value)
            return f"((uint4x32_t){{{{{lanes}}}}})"
        if dtype.is_float:
            return _float_literal(float(value), dtype)
        v = int(value)
        if dtype is dtypes.uint32:
            return f"{v & 0xFFFFFFFF}u"
        if dtype is dtypes.int64:
            if v == -(2**63):
                return "INT64_MIN"
            return f"INT64_C({v})" if v >= 0 else f"(-INT64_C({-v}))"
        if v == -(2**31):
            return "INT32_MIN"
        return str(v) if v >= 0 else f"({v})"

    def unary(self, op: Unop, dtype: DType, x: str) -> str:
        if op is Unop.UNIFORM1:
            return f"ocannl_uniform1_{_TAG[dtype]}({x})"
        if op is Unop.UINT4X32_OF:
            return f"ocannl_uint4x32_of({x})"
        one = self.literal(1, dtype)
        if op is Unop.ID:
            return x
        if op in _HELPER_OPS:
            return f"ocannl_{_HELPER_OPS[op]}_{_TAG[dtype]}({x})"
        if op is Unop.NEG:
            return f"(-{x})"
        if op is Unop.ABS:
            if dtype.is_float:
                return f"{_fn('fabs', dtype)}({x})"
            return x if dtype is dtypes.uint32 else f"ocannl_abs_{_TAG[dtype]}({x})"
        if op in _LIBM:
            return f"{_fn(_LIBM[op], dtype)}({x})"
        if op is Unop.RECIP:
            return f"({one} / {x})"
        if op is Unop.RECIP_SQRT:
            return f"({one} / {_fn('sqrt', dtype)}({x}))"
        if op is Unop.SIGMOID:
            return f"({one} / ({one} + {_fn('exp', dtype)}(-{x})))"
        raise AssertionError(f"{op.value} is missing from the C operator table")

    def binary(self, op: Binop, dtype: DType, a: str, b: str) -> str:
        if op is Binop.THREEFRY4X32:
            return f"ocannl_threefry4x32({a}, {b})"
        if op in _INFIX:
            return f"({a} {_INFIX[op]} {b})"
        if op in _HELPER_OPS:
            return f"ocannl_{_HELPER_OPS[op]}_{_TAG[dtype]}({a}, {b})"
        if op in _COMPARISONS:
            return f"(({self.compute_type(dtype)})({a} {_COMPARISONS[op]} {b}))"
        zero = self.literal(0, dtype)
        if op is Binop.AND:
            return f"(({self.compute_type(dtype)})({a} != {zero} && {b} != {zero}))"
        if op is Binop.OR:
            return f"(({self.compute_type(dtype)})({a} != {zero} || {b} != {zero}))"
        if op is Binop.POW:
            return f"{_fn('pow', dtype)}({a}, {b})"
        if op is Binop.MOD:
            return f"{_fn('fmod', dtype)}({a}, {b})"
        raise AssertionError(f"{op.value} is missing from the C operator table")

    def int_division(self, op: Binop, dtype: DType, a: str, b: str, site: int) -> str:
        return f"ocannl_{op.value}_{_TAG[dtype]}({a}, {b}, _status, {site})"

    def ternary(self, op: Ternop, dtype: DType, a: str, b: str, c: str) -> str:
        if op is Ternop.FMA:
            if dtype.is_float:
                return f"{_fn('fma', dtype)}({a}, {b}, {c})"
            return f"({a} * {b} + {c})"
        if op is Ternop.MUL3:
            return f"({a} * {b} * {c})"
        raise AssertionError(f"{op.value} is missing from the C operator table")

    def where(self, cond: str, a: str, b: str) -> str:
        return f"({cond} ? {a} : {b})"

    def cast(self, x: str, source: DType, target: DType) -> str:
        if source is target:
            return x
        if source.is_float and not target.is_float:
            # Through int64, so out-of-range values wrap as in the interpreter (dtypes.round_to)
            # instead of C's undefined behaviour.
            if target is dtypes.int64:
                return f"((int64_t){x})"
            return f"(({_STORAGE[target]})(int64_t){x})"
        return f"(({_STORAGE[target]}){x})"

    def from_storage(self, dtype: DType, cell: str) -> str:
        if dtype is dtypes.float16:
            return f"ocannl_f16_to_f32({cell})"
        if dtype is dtypes.bfloat16:
            return f"ocannl_bf16_to_f32({cell})"
        return cell

    def to_storage(self, dtype: DType, value: str) -> str:
        if dtype is dtypes.float16:
            return f"ocannl_f32_to_f16({value})"
        if dtype is dtypes.bfloat16:
            return f"ocannl_f32_to_bf16({value})"
        return value

    def checked_index(self, index: str, extent: int, site: int) -> str:
        return f"ocannl_index({index}, {extent}, _status, {site})"

    def parallel_for(self, collapse: int) -> str | None:
        return "#pragma omp parallel for" + (f" collapse({collapse})" if collapse > 1 else "")


def _float_literal(v: float, dtype: DType) -> str:
    if math.isnan(v):
        text = "NAN"
        return f"(-{text})" if math.copysign(1.0, v) < 0 else text
    if math.isinf(v):
        text = "INFINITY" if dtype is dtypes.float32 else "((double)INFINITY)"
        return text if v > 0 else f"(-{text})"
    if dtype is dtypes.float32:
        text = str(np.float32(v))  # shortest digits that read back as this float32
        text = text if any(ch in text for ch in ".e") else text + ".0"
        text += "f"
    else:
        text = repr(v)
    return f"({text})" if text.startswith("-") else text


# ---------------------------------------------------------------------------------------------
# Builtins: (name, dependencies, code), in the order a source prints them.


def _typed_helpers() -> list[tuple[str, tuple[str, ...], str]]:
    helpers = []
    for dtype, tag in _TAG.items():
        t = _STORAGE[dtype]
        syn = CSyntax()
        zero, one = syn.literal(0, dtype), syn.literal(1, dtype)
        nan_b = "b != b" if dtype.is_float else "0"
        helpers += [
            (f"ocannl_max_{tag}", (), f"static inline {t} ocannl_max_{tag}({t} a, {t} b) {{ return (a > b || {nan_b}) ? a : b; }}"),
            (f"ocannl_min_{tag}", (), f"static inline {t} ocannl_min_{tag}({t} a, {t} b) {{ return (a < b || {nan_b}) ? a : b; }}"),
            (f"ocannl_relu_{tag}", (), f"static inline {t} ocannl_relu_{tag}({t} x) {{ return x > {zero} ? x : {zero}; }}"),
            (f"ocannl_sat01_{tag}", (), f"static inline {t} ocannl_sat01_{tag}({t} x) {{ return !(x > {zero}) ? {zero} : x < {one} ? x : {one}; }}"),
            (f"ocannl_not_{tag}", (), f"static inline {t} ocannl_not_{tag}({t} x) {{ return x == {zero} ? {one} : {zero}; }}"),
            (f"ocannl_relu_gate_{tag}", (), f"static inline {t} ocannl_relu_gate_{tag}({t} a, {t} b) {{ return a > {zero} ? b : {zero}; }}"),
            (f"ocannl_sat01_gate_{tag}", (), f"static inline {t} ocannl_sat01_gate_{tag}({t} a, {t} b) {{ return {zero} < a && a < {one} ? b : {zero}; }}"),
        ]
        if dtype in (dtypes.int32, dtypes.int64):
            u = "uint32_t" if dtype is dtypes.int32 else "uint64_t"
            helpers += [
                (f"ocannl_abs_{tag}", (), f"static inline {t} ocannl_abs_{tag}({t} x) {{ return x < 0 ? ({t})(0u - ({u})x) : x; }}"),
                (f"ocannl_div_{tag}", ("ocannl_fail",),
                 f"static inline {t} ocannl_div_{tag}({t} a, {t} b, int *status, int site) {{\n"
                 f"  if (b == 0) {{ ocannl_fail(status, site); return 0; }}\n"
                 f"  return b == -1 ? ({t})(0u - ({u})a) : a / b;  /* MIN / -1 wraps */\n}}"),
                (f"ocannl_mod_{tag}", ("ocannl_fail",),
                 f"static inline {t} ocannl_mod_{tag}({t} a, {t} b, int *status, int site) {{\n"
                 f"  if (b == 0) {{ ocannl_fail(status, site); return 0; }}\n"
                 f"  return b == -1 ? 0 : a % b;\n}}"),
            ]
        elif dtype is dtypes.uint32:
            helpers += [
                (f"ocannl_div_{tag}", ("ocannl_fail",),
                 f"static inline {t} ocannl_div_{tag}({t} a, {t} b, int *status, int site) {{\n"
                 f"  if (b == 0) {{ ocannl_fail(status, site); return 0; }}\n  return a / b;\n}}"),
                (f"ocannl_mod_{tag}", ("ocannl_fail",),
                 f"static inline {t} ocannl_mod_{tag}({t} a, {t} b, int *status, int site) {{\n"
                 f"  if (b == 0) {{ ocannl_fail(status, site); return 0; }}\n  return a % b;\n}}"),
            ]
    return helpers


def _threefry() -> str:
    """Standard Threefry-4x32-20, the bit contract of ``ocannl/lowlevel/prng.py`` (constants from
    ``prng_reference.py``, which is checked against Random123's known answers)."""
    rotations = ", ".join(f"{{{a}, {b}}}" for a, b in ROTATIONS)
    return f"""static inline uint32_t ocannl_rotl32(uint32_t x, int r) {{ return (x << r) | (x >> (32 - r)); }}
/* Out of line: each loop nest drawing random bits calls this one copy, where an inlined copy per
   nest would cost the C compiler more than the call costs at run time. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static uint4x32_t ocannl_threefry4x32(uint4x32_t key, uint4x32_t counter) {{
  static const int rot[8][2] = {{{rotations}}};
  const uint32_t ks[5] = {{key.v[0], key.v[1], key.v[2], key.v[3],
                          key.v[0] ^ key.v[1] ^ key.v[2] ^ key.v[3] ^ 0x{KEY_SCHEDULE_PARITY:X}u}};
  uint32_t x0 = counter.v[0] + ks[0], x1 = counter.v[1] + ks[1], x2 = counter.v[2] + ks[2], x3 = counter.v[3] + ks[3];
  for (int s = 1; s <= {DEFAULT_ROUNDS // 4}; ++s) {{  /* four rounds, then key injection s */
    for (int j = 0; j < 4; ++j) {{
      const int *r = rot[(4 * (s - 1) + j) % 8];
      if (j % 2 == 0) {{ x0 += x1; x1 = ocannl_rotl32(x1, r[0]) ^ x0; x2 += x3; x3 = ocannl_rotl32(x3, r[1]) ^ x2; }}
      else {{ x0 += x3; x3 = ocannl_rotl32(x3, r[0]) ^ x0; x2 += x1; x1 = ocannl_rotl32(x1, r[1]) ^ x2; }}
    }}
    x0 += ks[s % 5]; x1 += ks[(s + 1) % 5]; x2 += ks[(s + 2) % 5]; x3 += ks[(s + 3) % 5] + (uint32_t)s;
  }}
  uint4x32_t out = {{{{x0, x1, x2, x3}}}};
  return out;
}}"""


_PRNG_CONVERSIONS = r"""static inline uint4x32_t ocannl_uint4x32_of(uint64_t x) {  /* sign-extended, as (uint64_t)x */
  uint4x32_t out = {{(uint32_t)x, (uint32_t)(x >> 32), 0u, 0u}};
  return out;
}"""

_UNIFORM_F32 = r"""static inline float ocannl_uniform1_f32(uint4x32_t x) { return (float)(x.v[0] >> 8) * 0x1p-24f; }"""
_UNIFORM_F64 = r"""static inline double ocannl_uniform1_f64(uint4x32_t x) {
  return (double)((((uint64_t)x.v[1] << 32) | x.v[0]) >> 11) * 0x1p-53;
}"""


_HALF = r"""#if defined(__FLT16_MAX__) && !defined(OCANNL_NO_FLOAT16)
typedef _Float16 ocannl_half;
static inline float ocannl_f16_to_f32(ocannl_half h) { return (float)h; }
static inline ocannl_half ocannl_f32_to_f16(float f) { return (ocannl_half)f; }
#else
/* No _Float16: IEEE binary16 bit patterns, converted in software (round to nearest even). */
typedef uint16_t ocannl_half;
static inline float ocannl_f16_to_f32(ocannl_half h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, bits;
  if (exp == 0x1Fu) bits = sign | 0x7F800000u | (mant << 13);
  else if (exp) bits = sign | ((exp + 112u) << 23) | (mant << 13);
  else if (!mant) bits = sign;
  else {
    exp = 113u;
    while (!(mant & 0x400u)) { mant <<= 1; --exp; }
    bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static inline ocannl_half ocannl_f32_to_f16(float f) {
  uint32_t x, q, rem, half;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu, e = ax >> 23;
  if (ax > 0x7F800000u) {  /* NaN: keep the top payload bits, stay a NaN (as numpy) */
    q = 0x7C00u + ((ax & 0x7FFFFFu) >> 13);
    return (ocannl_half)(sign | (q == 0x7C00u ? 0x7C01u : q));
  }
  if (e >= 143u) return (ocannl_half)(sign | 0x7C00u);
  if (e < 113u) {  /* below the smallest normal half: a subnormal or zero */
    if (e < 101u) return (ocannl_half)sign;
    uint32_t m = (ax & 0x7FFFFFu) | 0x800000u, shift = 126u - e;
    q = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  } else {
    q = ((e - 112u) << 10) | ((ax >> 13) & 0x3FFu);
    rem = ax & 0x1FFFu;
    half = 0x1000u;
  }
  if (rem > half || (rem == half && (q & 1u))) ++q;  /* may carry into the exponent, or to inf */
  return (ocannl_half)(sign | q);
}
#endif"""

_BFLOAT16 = r"""static inline float ocannl_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static inline uint16_t ocannl_f32_to_bf16(float f) {  /* round to nearest even; NaNs stay NaNs */
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}"""

BUILTINS: list[tuple[str, tuple[str, ...], str]] = [
    ("uint4x32_t", (), "typedef struct { uint32_t v[4]; } uint4x32_t;  /* a Threefry-4x32 value */"),
    ("ocannl_threefry4x32", ("uint4x32_t",), _threefry()),
    ("ocannl_uint4x32_of", ("uint4x32_t",), _PRNG_CONVERSIONS),
    ("ocannl_uniform1_f32", ("uint4x32_t",), _UNIFORM_F32),
    ("ocannl_uniform1_f64", ("uint4x32_t",), _UNIFORM_F64),
    ("ocannl_half", (), _HALF),
    ("ocannl_f16_to_f32", ("ocannl_half",), ""),
    ("ocannl_f32_to_f16", ("ocannl_half",), ""),
    ("ocannl_bf16_to_f32", (), _BFLOAT16),
    ("ocannl_f32_to_bf16", ("ocannl_bf16_to_f32",), ""),
    ("ocannl_fail", (), "static inline void ocannl_fail(int *status, int site) {\n"
     "  __atomic_store_n(status, site, __ATOMIC_RELAXED);  /* reported by the caller after the run */\n}"),
    ("ocannl_index", ("ocannl_fail",),
     "static inline int64_t ocannl_index(int64_t i, int64_t n, int *status, int site) {\n"
     "  if (i < 0 || i >= n) { ocannl_fail(status, site); return 0; }  /* clamped: never outside */\n"
     "  return i;\n}"),
    *_typed_helpers(),
    ("OCANNL_TILE_FN", (),
     "/* Tiles are vectorized across their cells; gcc would rather vectorize each cell's reduction\n"
     "   loop, which an in-order sum serializes. */\n"
     "#if defined(__GNUC__) && !defined(__clang__)\n"
     "#define OCANNL_TILE_FN __attribute__((optimize(\"no-tree-loop-vectorize\")))\n"
     "#else\n#define OCANNL_TILE_FN\n#endif"),
]


def builtins_for(text: str) -> list[str]:
    """The builtin code ``text`` needs: every builtin whose name it mentions, with their
    dependencies, in :data:`BUILTINS` order."""
    by_name = {name: (deps, code) for name, deps, code in BUILTINS}
    needed: set[str] = set()

    def need(name: str) -> None:
        if name not in needed:
            needed.add(name)
            for dep in by_name[name][0]:
                need(dep)

    for name in by_name:
        if name in text:
            need(name)
    return [code for name, _, code in BUILTINS if name in needed and code]
