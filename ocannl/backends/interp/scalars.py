"""The interpreter's scalar values, shared by its two modes (``interpreter.py``, the literal walk,
and ``vectorized.py``, whole nests as numpy operations): how a constant of each precision is held,
a local's zero, and the conversions of a cast (docs/interpreter.md). One definition, so that the
two modes cannot disagree on a value's type or on how an integer wraps."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType, DTypeError


def constant(value: Any, dtype: DType) -> Any:
    """``value`` as the interpreter holds a ``dtype`` scalar: a numpy float scalar, a wrapped
    Python int, or the four uint32 words of a uint4x32."""
    if dtype is dtypes.uint4x32:
        return np.array(value, dtype=np.uint32)
    if dtype.is_float:
        return dtype.scalar(value)
    return dtypes.wrap_int(dtype, int(value))


def zero(dtype: DType) -> Any:
    """The value a local of ``dtype`` starts from."""
    return constant((0, 0, 0, 0) if dtype is dtypes.uint4x32 else 0, dtype)


def cast(source: DType, target: DType) -> Callable[[Any], Any]:
    """The conversion of a cast from ``source`` to ``target``: floats round to nearest even,
    floats to integers truncate toward zero (a non-finite one is an error), integers wrap."""
    if target.is_float:
        return target.scalar
    if source.is_float:

        def float_to_int(v: Any) -> Any:
            if not math.isfinite(v):
                raise DTypeError(f"cannot convert {v} to {target.name}")
            return dtypes.wrap_int(target, int(v))

        return float_to_int
    return lambda v: dtypes.wrap_int(target, int(v))
