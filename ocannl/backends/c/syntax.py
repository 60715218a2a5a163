"""The C deltas of the C-family syntax table (ocannl/backends/c_family.py).

Every operator prints so that the compiled code computes the interpreter's bits
(ocannl/lowlevel/scalar_ops.py, backends/interp): arithmetic is plain C in the compute type (the
compiler runs with ``-ffp-contract=off``, so no fused multiply-add appears that the IR did not
ask for), except signed integer arithmetic, computed in unsigned types so that it wraps around
without relying on ``-fwrapv`` (``CFamilySyntax._wrapping``). The transcendental functions are the
C library's ``logf``, ``sinf``..., except float32 ``exp``, a helper of the project's own that
vectorizes (:data:`OWN_FLOAT32_FUNCTIONS`): they agree with the interpreter (numpy) to within
``scalar_ops.LIBM_MAX_ULPS`` ulps, not always bit for bit; ``pow`` is the C library's
``powf``/``pow`` as in the interpreter, bit for bit (docs/semantics.md, "Numerics").

What C spells its own way: conversions are casts ``((T)x)``; helpers are ``static inline`` and,
C having no overloading, named per type (``ocannl_max_f32``); the failure status is a host
``int`` stored with GCC's atomic builtin; 64-bit constants use ``INT64_C``.

Storage formats: float16 is ``_Float16`` where the compiler has it, else ``uint16_t`` bit
patterns with software conversions (round to nearest even, numpy's NaN handling); bfloat16 is
``uint16_t`` bit patterns converted like ``dtypes.float32_to_bfloat16_bits``; uint4x32 is a
struct of four uint32 lanes, laid out as numpy's trailing axis of 4. Their definitions print
before the helpers, where a source uses them (:meth:`CSyntax.definitions`).
"""

from __future__ import annotations

from typing import Sequence

from ocannl.backends.c_family import CFamilySyntax
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType

_TYPES = {
    dtypes.float32: "float",
    dtypes.float64: "double",
    dtypes.float16: "ocannl_half",
    dtypes.bfloat16: "uint16_t",
    dtypes.int32: "int32_t",
    dtypes.int64: "int64_t",
    dtypes.uint32: "uint32_t",
    dtypes.uint4x32: "uint4x32_t",
}

OWN_FLOAT32_FUNCTIONS = frozenset({"exp"})
"""Math functions whose float32 form C prints as a helper of its own, ``ocannl_<name>_f32``
(ocannl/backends/c_family.py), in place of the C library's: ``expf`` is a call per element, which
keeps GCC from vectorizing a softmax's loop, where ``ocannl_exp_f32`` vectorizes (computed in
double, within 1 ulp of the correctly rounded result)."""

_STORAGE_CONVERSIONS = {
    dtypes.float16: ("ocannl_half", "ocannl_f16_to_f32", "ocannl_f32_to_f16"),
    dtypes.bfloat16: ("bfloat16", "ocannl_bf16_to_f32", "ocannl_f32_to_bf16"),
}
"""A 16-bit float's definition (in :data:`_DEFINITIONS`), and its functions converting a stored
cell to float and a float to the stored cell."""


class CSyntax(CFamilySyntax):
    """The C table: :class:`CFamilySyntax` with C's spellings and storage-format definitions."""

    language = "C"
    index_type = "int64_t"
    index_dtype = dtypes.int64
    """64-bit indices: with ``-fwrapv``, 32-bit index arithmetic would have to wrap, which keeps
    the compiler from folding ``x[4*i + 1]`` into an address plus a constant."""
    restrict = "restrict"
    overloads = False
    uint64_type = "uint64_t"
    int64_format = "INT64_C({})"
    int32_min = "INT32_MIN"
    int64_min = "INT64_MIN"
    inline = "static inline"
    out_of_line = (
        "/* Out of line: each loop nest drawing random bits calls this one copy, where an inlined copy per\n"
        "   nest would cost the C compiler more than the call costs at run time. */\n"
        "#if defined(__GNUC__)\n__attribute__((noinline))\n#endif\nstatic"
    )
    local_constant = "static const"
    lanes = ("v[0]", "v[1]", "v[2]", "v[3]")
    lane_subscript = ".v[{}]"
    status_param = "int *status"
    store_status = "__atomic_store_n(status, site, __ATOMIC_RELAXED)"

    def __init__(self) -> None:
        super().__init__()
        self._defined: set[str] = set()
        """Names of :data:`_DEFINITIONS` the printed code uses."""

    def storage_type(self, dtype: DType) -> str:
        name = _TYPES[dtype]
        if name in _DEFINITIONS:
            self._defined.add(name)
        return name

    def convert(self, type_name: str, x: str, *, compound: bool = False) -> str:
        return f"(({type_name})({x}))" if compound else f"(({type_name}){x})"

    def vector(self, lanes: Sequence[str]) -> str:
        return f"(({self.storage_type(dtypes.uint4x32)}){{{{{', '.join(lanes)}}}}})"

    def math_function(self, name: str, dtype: DType) -> str:
        """libm's name for ``dtype`` (``logf`` for float32, ``log`` for float64), or the helper of
        one of :data:`OWN_FLOAT32_FUNCTIONS`."""
        if dtype is dtypes.float32 and name in OWN_FLOAT32_FUNCTIONS:
            return self.helper(f"ocannl_{name}", dtype)
        return f"{name}f" if dtype is dtypes.float32 else name

    def from_storage(self, dtype: DType, cell: str) -> str:
        return self._storage_conversion(dtype, 1, cell)

    def to_storage(self, dtype: DType, value: str) -> str:
        return self._storage_conversion(dtype, 2, value)

    def _storage_conversion(self, dtype: DType, direction: int, x: str) -> str:
        if dtype not in _STORAGE_CONVERSIONS:
            return x
        self._defined.add(_STORAGE_CONVERSIONS[dtype][0])
        return f"{_STORAGE_CONVERSIONS[dtype][direction]}({x})"

    def select_body(self, dtype: DType) -> str:
        """The test widened to a mask of all ones or all zeros and the two values' bits combined
        through it (``memcpy`` is how C reads a float's bits; the compiler turns it into
        register moves), which GCC's straight-line vectorizer turns into a vector blend."""
        bits, size = ("uint32_t", 4) if dtype.compute is dtypes.float32 else ("uint64_t", 8)
        return (
            f"  {bits} mask = ({bits})0 - ({bits})(cond != 0), x, y;\n"
            f"  {self.compute_type(dtype)} r;\n"
            f"  memcpy(&x, &a, {size});\n"
            f"  memcpy(&y, &b, {size});\n"
            f"  x = (x & mask) | (y & ~mask);\n"
            f"  memcpy(&r, &x, {size});\n"
            f"  return r;"
        )

    def parallel_for(self, collapse: int, simd: bool = False) -> str | None:
        return "#pragma omp parallel for" + (" simd" if simd else "") + (f" collapse({collapse})" if collapse > 1 else "")

    def simd_loop(self) -> str | None:
        return "#pragma omp simd"

    def definitions(self) -> list[str]:
        return [code for name, code in _DEFINITIONS.items() if name in self._defined]


# ---------------------------------------------------------------------------------------------
# Storage-format definitions: printed before the helpers, where a source uses the type.


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

_DEFINITIONS = {
    "uint4x32_t": "typedef struct { uint32_t v[4]; } uint4x32_t;  /* a Threefry-4x32 value */",
    "ocannl_half": _HALF,
    "bfloat16": _BFLOAT16,
}
"""The code C needs for a storage type it lacks, by the name the printed code uses, in print
order."""
