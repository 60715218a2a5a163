"""Index symbol bindings, checked once here for every backend (docs/precisions.md, "Index symbol
bindings"): a ``run()``'s values one by one, a ``run_many``'s steps as int64 columns, and the
error of a step named with its step."""

from __future__ import annotations

import keyword
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ocannl.errors import IndexBindingError
from ocannl.lowlevel.indexing import IndexSymbol


BINDING_LIMIT = 2**63
"""Bindings are passed to every backend as signed 64-bit integers: values are below this."""


def binding_limit(symbol: IndexSymbol) -> int:
    """The exclusive bound of ``symbol``'s values: its size, else :data:`BINDING_LIMIT`."""
    return symbol.size if symbol.size is not None and symbol.size <= BINDING_LIMIT else BINDING_LIMIT


def check_binding(symbol: IndexSymbol, value: Any, routine: str) -> int:
    """``value`` as the binding of ``symbol``, checked once here for every backend: an int (numpy
    integers too; never a bool or a float, whose meaning as a position is a guess), in
    ``[0, symbol.size)`` when the symbol has a size, else in ``[0, 2**63)``: the value reaches
    every backend as a 64-bit integer. A symbol without a size can still be bound past the axis
    it indexes: the routine's own bounds checks report that (OutOfBoundsError) on every backend
    (docs/precisions.md, "Index symbol bindings")."""
    if isinstance(value, (bool, np.bool_)):
        raise IndexBindingError(
            f"routine {routine}: index symbol {symbol.name} must be bound to an int, got the bool {value!r}"
        )
    try:
        v = operator.index(value)
    except TypeError:
        raise IndexBindingError(
            f"routine {routine}: index symbol {symbol.name} must be bound to an int, got {value!r} "
            f"({type(value).__name__})"
        ) from None
    sized = symbol.size is not None and symbol.size <= BINDING_LIMIT
    limit = binding_limit(symbol)
    if not 0 <= v < limit:
        what = f"its size {symbol.size}" if sized else "a 64-bit index (2**63)"
        raise IndexBindingError(
            f"routine {routine}: index symbol {symbol.name} = {v} is outside [0, {limit}), the range of {what}"
        )
    return v


def step_bindings(symbol: IndexSymbol, values: Any, routine: str) -> np.ndarray:
    """``values``, one binding of ``symbol`` per step of a ``run_many``, as an int64 array: each
    checked as :func:`check_binding` checks a single one, the first it refuses named with its step.
    Python ints (in a list, tuple or range) and numpy integer arrays are checked at once; other
    elements one at a time."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise IndexBindingError(f"routine {routine}: run_many binds {symbol.name} to one value per step, a "
                                    f"sequence; got an array of shape {values.shape}")
        if values.dtype.kind in "iu":
            return _step_integers(symbol, values, routine)
        items = values
    elif isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise IndexBindingError(
            f"routine {routine}: run_many binds {symbol.name} to a sequence of ints, one per step; got {values!r} "
            f"({type(values).__name__}): for a value kept at every step, pass [value] * n or bind it with run()"
        )
    elif isinstance(values, range):
        if not values or 0 <= min(values[0], values[-1]) and max(values[0], values[-1]) < binding_limit(symbol):
            return np.arange(values.start, values.stop, values.step, dtype=np.int64)
        items = values
    else:
        items = list(values)
        if set(map(type, items)) <= {int} and (not items or 0 <= min(items) and max(items) < binding_limit(symbol)):
            return np.array(items, np.int64)
    checked = []
    for step, value in enumerate(items):
        try:
            checked.append(check_binding(symbol, value, routine))
        except IndexBindingError as e:
            raise at_step(e, step) from None
    return np.array(checked, np.int64)


def _step_integers(symbol: IndexSymbol, values: np.ndarray, routine: str) -> np.ndarray:
    """A numpy integer array of bindings, range-checked as a whole (see :func:`step_bindings`)."""
    limit = binding_limit(symbol)
    if values.dtype.kind == "u":
        wide = values.astype(np.uint64)
        refused = wide >= np.uint64(limit)
    else:
        wide = values.astype(np.int64)
        refused = wide < 0
        if limit < BINDING_LIMIT:
            refused |= wide >= limit
    if refused.any():
        step = int(np.flatnonzero(refused)[0])
        try:
            check_binding(symbol, values[step], routine)
        except IndexBindingError as e:
            raise at_step(e, step) from None
    return wide.astype(np.int64, copy=False)


def at_step(error: Exception, step: int) -> Exception:
    """``error``, raised at step ``step`` of a ``run_many``, as an error of its type whose message
    names the step, with the step in its ``step`` attribute (the routine then knows which steps
    completed)."""
    try:
        stepped = type(error)(f"{error} (at step {step} of run_many)")
    except TypeError:  # an error type whose constructor takes more than a message
        stepped = error
        error.add_note(f"at step {step} of run_many")
    stepped.step = step
    return stepped


def run_call_example(name: str) -> str:
    """How a user binds ``name``: as a keyword argument when Python allows, else through ``**``."""
    if name.isidentifier() and not keyword.iskeyword(name):
        return f"run({name}=0)"
    return f"run(**{{{name!r}: 0}})"
