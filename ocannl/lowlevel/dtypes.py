"""Precisions: their storage, their names in every backend language, and their rounding rules.

ocannl has float32, float64, float16, bfloat16, int32, int64, uint32 and uint4x32 (the PRNG's);
the original also has byte, uint16, uint64 and fp8.
Two rules fix the arithmetic of the whole compiler (docs/design.md, "Arithmetic"):

* float32 and float64 arithmetic runs in that type, one rounding per operation, no contraction,
  so generated C equals the interpreter bit for bit;
* float16 and bfloat16 are *storage* formats: values are loaded as float32, computed in float32
  and rounded to the node's precision on every store. :attr:`DType.compute` says which type an
  expression of a given node type computes in.

bfloat16 has no numpy type: buffers hold its bit patterns as ``uint16`` and
:func:`float32_to_bfloat16_bits` / :func:`bfloat16_bits_to_float32` convert (round to nearest
even). Host arrays never show those bit patterns: values cross between the host and a buffer only
through :func:`to_storage` and :func:`from_storage`, which also refuse integers that do not fit
their precision instead of wrapping them (docs/precisions.md). uint4x32 is the 128-bit state of
the Threefry-4x32 PRNG: one value is four uint32 lanes, stored as a trailing axis of length 4 in
numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ocannl.errors import OcannlError


class DTypeError(OcannlError, TypeError):
    """A precision used where it is not supported (e.g. float64 on Metal, exp on an integer)."""


@dataclass(frozen=True, eq=False)
class DType:
    """One precision. Instances are the module-level singletons below; compare them with ``is``.

    ``rank`` orders precisions for promotion (:func:`promote`): uint4x32 dominates, then
    float64 > float32 > bfloat16 > float16 > int64 > uint32 > int32, as in the original.
    """

    name: str
    storage: np.dtype
    itemsize: int
    is_float: bool
    rank: int
    c_name: str
    triton_name: str
    _msl_name: str | None
    lanes: int = 1

    @property
    def msl_name(self) -> str:
        if self._msl_name is None:
            raise DTypeError(f"Metal has no {self.name} type: use float32 for tensors run on Metal")
        return self._msl_name

    @property
    def compute(self) -> DType:
        """The type expressions producing values of this type compute in: float32 for the 16-bit
        floats (rounded on store), the type itself otherwise."""
        return float32 if self in (float16, bfloat16) else self

    @property
    def is_compute_type(self) -> bool:
        return self.compute is self

    @property
    def scalar(self) -> type:
        """The numpy scalar type the interpreter computes with (a compute type only)."""
        if not self.is_compute_type or self is uint4x32:
            raise DTypeError(f"{self.name} values are not numpy scalars")
        return self.storage.type

    def __repr__(self) -> str:
        return self.name


float32 = DType("float32", np.dtype(np.float32), 4, True, 7, "float", "tl.float32", "float")
float64 = DType("float64", np.dtype(np.float64), 8, True, 8, "double", "tl.float64", None)
float16 = DType("float16", np.dtype(np.float16), 2, True, 5, "_Float16", "tl.float16", "half")
bfloat16 = DType("bfloat16", np.dtype(np.uint16), 2, True, 6, "uint16_t", "tl.bfloat16", "bfloat")
int32 = DType("int32", np.dtype(np.int32), 4, False, 2, "int32_t", "tl.int32", "int")
int64 = DType("int64", np.dtype(np.int64), 8, False, 4, "int64_t", "tl.int64", "long")
uint32 = DType("uint32", np.dtype(np.uint32), 4, False, 3, "uint32_t", "tl.uint32", "uint")
# Triton has no 128-bit type: its emitter carries the four lanes as four uint32 values.
uint4x32 = DType("uint4x32", np.dtype(np.uint32), 16, False, 9, "uint4x32_t", "tl.uint32", "uint4", lanes=4)

ALL: tuple[DType, ...] = (float32, float64, float16, bfloat16, int32, int64, uint32, uint4x32)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL}

DEFAULT = float32
INDEX = int32
"""The type of index values (``EmbedIndex``, dynamic gather positions); buffers are limited to
2**31 - 1 cells. Values that may pass it stay int64: gather positions read from int64 or uint32
indices, and index symbols without a size (bindings are 64-bit), see docs/precisions.md."""


def by_name(name: str) -> DType:
    try:
        return BY_NAME[name]
    except KeyError:
        raise DTypeError(f"unknown precision {name!r}; known: {', '.join(BY_NAME)}") from None


def promote(a: DType, b: DType) -> DType:
    """The precision two operands of a mixed operation compute in (the higher ``rank``)."""
    return a if a.rank >= b.rank else b


def float32_to_bfloat16_bits(x: np.ndarray | np.floating | float) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest, ties to even) and return the uint16 bit patterns.
    NaNs stay (quiet) NaNs; values past the largest bfloat16 round to infinity."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def bfloat16_bits_to_float32(bits: np.ndarray | np.integer | int) -> np.ndarray:
    """The float32 values of bfloat16 bit patterns (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(dtype: DType, value: float | int) -> np.generic:
    """``value`` as stored in a ``dtype`` node, returned as a scalar of ``dtype.compute``.

    Floats round to nearest even (float16/bfloat16 values come back as the float32 holding the
    rounded value). Integers convert as C does for in-range values: floats truncate toward zero;
    out-of-range results wrap around (two's complement), a choice C leaves undefined for floats.
    """
    if dtype is uint4x32:
        raise DTypeError("uint4x32 values are 4-lane vectors, not scalars")
    if dtype is bfloat16:
        return np.float32(bfloat16_bits_to_float32(float32_to_bfloat16_bits(np.float32(value))))
    if dtype is float16:
        return np.float32(np.float16(value))
    if dtype.is_float:
        return dtype.scalar(value)
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            raise DTypeError(f"cannot convert {value} to {dtype.name}")
        value = int(value)  # truncates toward zero
    return wrap_int(dtype, int(value))


def wrap_int(dtype: DType, value: int) -> np.generic:
    """A Python int reduced modulo 2**bits into ``dtype``'s range (two's complement)."""
    info = np.iinfo(dtype.storage)
    span = info.max - info.min + 1
    return dtype.scalar((value - info.min) % span + info.min)


def lowest(dtype: DType) -> float | int:
    """-inf for floats, the smallest value for integers (the neutral element of max)."""
    return -np.inf if dtype.is_float else int(np.iinfo(dtype.storage).min)


def highest(dtype: DType) -> float | int:
    """+inf for floats, the largest value for integers (the neutral element of min)."""
    return np.inf if dtype.is_float else int(np.iinfo(dtype.storage).max)


def default_for(array: np.ndarray) -> DType:
    """The precision of host data given without one: float32 for floats and booleans, and for
    integers the narrowest of int32, uint32 and int64 that holds the numpy type's whole range
    (uint64 maps to int64: :func:`to_storage` then refuses values past 2**63 - 1)."""
    kind, size = array.dtype.kind, array.dtype.itemsize
    if kind in "fb":
        return DEFAULT
    if kind == "i":
        return int32 if size <= 4 else int64
    if kind == "u":
        return int32 if size <= 2 else uint32 if size == 4 else int64
    raise DTypeError(f"expected numeric data, got numpy dtype {array.dtype}")


def to_storage(dtype: DType, values: object, what: str) -> np.ndarray:
    """Host values as a buffer of ``dtype`` holds them: floats rounded to nearest even (bfloat16
    as its uint16 bit patterns), integers exactly. A value an integer precision cannot hold is an
    error naming ``what`` (the tensor or node receiving it), the value and the range, never a
    silent wrap-around; so are NaN and infinities bound for an integer precision. Float values bound
    for an integer precision truncate toward zero, as C converts them. uint4x32 values are uint32
    lanes (a trailing axis of 4)."""
    array = np.asarray(values)
    if array.dtype.kind not in "fiub":
        raise DTypeError(f"{what}: expected numeric values for a {dtype.name} buffer, got numpy dtype {array.dtype}")
    if dtype is bfloat16:
        return float32_to_bfloat16_bits(_to_float32_round_to_odd(array))
    if dtype.is_float:
        return array.astype(dtype.storage)
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array)
        if bad.any():
            raise DTypeError(f"{what}: the value {array[bad].flat[0]} has no {dtype.name} equivalent")
        array = np.trunc(array)
    info = np.iinfo(dtype.storage)
    if array.size:
        # Compared as Python ints: numpy would compare uint64 with int64 through float64.
        low, high = int(array.min()), int(array.max())
        for v in (low, high):
            if not info.min <= v <= info.max:
                fits_int64 = dtype is not int64 and -(2**63) <= v < 2**63
                hint = " (an int64 tensor holds it: dtype='int64')" if fits_int64 else ""
                raise DTypeError(
                    f"{what}: the value {v} does not fit {dtype.name} [{info.min}, {info.max}]{hint}"
                )
    return array.astype(dtype.storage)


def _to_float32_round_to_odd(array: np.ndarray) -> np.ndarray:
    """``array`` as float32 rounded to odd: truncated toward zero, the last bit set when inexact.
    Rounding that to bfloat16 (nearest even) gives the nearest bfloat16 of the original value,
    where rounding to nearest twice could land one bfloat16 step off at a tie of the second
    rounding: float32 keeps 16 more bits than bfloat16, enough for the sticky bit."""
    if array.dtype.kind != "f" or array.dtype.itemsize <= 4:
        return array.astype(np.float32)
    wide = array.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # past float32: inf, truncated just below
        nearest = wide.astype(np.float32)
        inexact = np.isfinite(wide) & (nearest.astype(np.float64) != wide)
        overshoot = inexact & (np.abs(nearest.astype(np.float64)) > np.abs(wide))
    truncated = np.where(overshoot, np.nextafter(nearest, np.float32(0)), nearest)
    bits = truncated.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32)


def from_storage(dtype: DType, array: np.ndarray) -> np.ndarray:
    """A buffer's values as the host sees them: a new array, bfloat16 widened to float32."""
    if dtype is bfloat16:
        return bfloat16_bits_to_float32(array)
    return array.astype(dtype.storage)  # a copy: astype copies unless told not to
