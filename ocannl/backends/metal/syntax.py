"""The MSL deltas of the C-family syntax table (ocannl/backends/c_family.py).

Every operator prints so that the kernel computes the interpreter's values: float arithmetic in
float (the backend asks Metal for IEEE semantics, no fast math; the shim compiles with
``-ffp-contract=off``), the transcendental functions as their ``precise::`` variants (``erf``,
which MSL lacks, as a helper of the C-family table), integer results wrapping around. ``where``
is a conditional expression (``select`` would evaluate both branches, and a gather in the branch
not taken may read out of bounds), except where the walk proves both branches safe to compute
(ocannl/backends/codegen.py, ``Emitter.where``): then it is ``ocannl_select``, MSL's ``select``.

What MSL spells its own way: conversions are constructor casts ``T(x)``; helpers are ``inline``
and overloaded, one ``ocannl_max`` per compute type; the failure status is a ``device
atomic_int``; a uint4x32 is the native ``uint4``.

Types: float32 ``float``, float16 ``half``, bfloat16 ``bfloat`` (storage only: loads convert to
float, stores round to nearest even), int32 ``int``, int64 ``long``, uint32 ``uint``, uint4x32
``uint4``. MSL has no ``double``: float64 is a :class:`~ocannl.lowlevel.dtypes.DTypeError`
(emit.py checks every node and value before printing).
"""

from __future__ import annotations

from typing import Sequence

from ocannl.backends.c_family import CFamilySyntax
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType, DTypeError

_TYPES = {
    dtypes.float32: "float",
    dtypes.float16: "half",
    dtypes.bfloat16: "bfloat",
    dtypes.int32: "int",
    dtypes.int64: "long",
    dtypes.uint32: "uint",
    dtypes.uint4x32: "uint4",
}

_PRECISE = frozenset({"exp", "log", "exp2", "log2", "sin", "cos", "sqrt", "tanh", "pow", "fmod"})
"""Math functions that Metal also has in a fast, inexact form: the kernels call their
``precise::`` variants."""

MISSING_MATH_FUNCTIONS = frozenset({"erf"})
"""Math functions of C's library that MSL lacks: the kernels call the C-family helper of the same
name (``ocannl_erf``, ocannl/backends/c_family.py), written for float only."""


def msl_type(dtype: DType) -> str:
    """The MSL name of a precision; float64 is a :class:`DTypeError` (MSL has no double)."""
    if dtype not in _TYPES:
        raise DTypeError(f"Metal has no {dtype.name} type (MSL has no double): use float32 on the metal backend")
    return _TYPES[dtype]


class MetalSyntax(CFamilySyntax):
    """The MSL table: :class:`CFamilySyntax` with MSL's spellings. :meth:`builtins` is the code of
    the helper functions printed so far."""

    language = "metal"
    restrict = ""
    overloads = True
    uint64_type = "ulong"
    int64_format = "{}l"
    int32_min = "(-2147483647 - 1)"
    int64_min = "(-9223372036854775807l - 1l)"
    inline = "inline"
    out_of_line = "inline"
    """MSL declares its Threefry generator as it declares every other helper."""
    local_constant = "const"
    lanes = ("x", "y", "z", "w")
    lane_subscript = "[{}]"
    status_param = "device atomic_int* status"
    store_status = "atomic_store_explicit(status, site, memory_order_relaxed)"

    def __init__(self, index_dtype: DType = dtypes.int32) -> None:
        """``index_dtype``: the type of loop indices and offsets, int32 unless the routine's
        buffers or grids need int64 (emit.py, "Indices")."""
        super().__init__()
        self.index_dtype = index_dtype
        self.index_type = msl_type(index_dtype)

    def select_body(self, dtype: DType) -> str:
        return "  return select(b, a, cond != 0);  /* MSL's select: no branch */"

    def storage_type(self, dtype: DType) -> str:
        return msl_type(dtype)

    def convert(self, type_name: str, x: str, *, compound: bool = False) -> str:
        return f"{type_name}({x})"

    def vector(self, lanes: Sequence[str]) -> str:
        return f"{msl_type(dtypes.uint4x32)}({', '.join(lanes)})"

    def math_function(self, name: str, dtype: DType) -> str:
        if name in MISSING_MATH_FUNCTIONS:
            return self.helper(f"ocannl_{name}", dtype)
        return f"precise::{name}" if name in _PRECISE else name

    def from_storage(self, dtype: DType, cell: str) -> str:
        return self.convert(self.compute_type(dtype), cell) if dtype in (dtypes.float16, dtypes.bfloat16) else cell

    def to_storage(self, dtype: DType, value: str) -> str:
        return self.convert(msl_type(dtype), value) if dtype in (dtypes.float16, dtypes.bfloat16) else value
