"""Parameter initializers and the session seed: how a parameter gets its first value.

An initializer is a callable taking the parameter and returning its init code, which the runtime
runs in the init routine of each context the parameter is compiled on (:func:`init_code`)::

    w = oc.param("w", output=16, init=oc.init.normal(std=0.1))
    v = oc.param("v", output=16, init=oc.init.glorot_uniform(gain=2.0))

Random values come from counter-based Threefry-4x32-20 built into the IR
(``ocannl/lowlevel/prng.py``), turned into values by exactly rounded operations only (normal draws
too: their log and cosine are computed from ``+ - * /`` and ``sqrt``, not by the math library),
so every backend produces the same bits. A parameter's key is
``(seed, stream, draw, 0)`` with ``seed`` the session seed and ``stream`` the parameter's tensor
id (its creation order in the session): the same program under the same seed gives the same
values, bit for bit. The seed is read when the init code is built, i.e. when a routine reading
the parameter is compiled; set it first with :func:`seed`. A session reset
(``ocannl.session.reset``) restores :data:`DEFAULT_SEED`.

Without ``init``, a weight (a parameter with input axes) gets :func:`glorot_uniform` and a bias 0
(:func:`default_init`).

This module sits below ``tensor.py``, which asks it for a parameter's init code: it reads a
parameter only through its attributes (value node, id, dims, rows), so it imports no tensor.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Callable

import numpy as np

from ocannl import session
from ocannl.errors import SessionError, ShapeError
from ocannl.lowlevel import dtypes, prng
from ocannl.lowlevel.assignments import Constant, Fetch

if TYPE_CHECKING:
    from ocannl.tensor import Tensor

DEFAULT_SEED = 0
"""The seed of a fresh session: the moons demo and every test run under it."""

_seed = DEFAULT_SEED

Initializer = Callable[["Tensor"], object]
"""Takes the parameter, returns its init code (an assignment)."""


@session.on_reset
def _reset_seed() -> None:
    global _seed
    _seed = DEFAULT_SEED


def seed(n: int) -> None:
    """Set the session seed (``oc.seed(n)``) for the parameters compiled from now on; ``n`` is an
    int in ``[0, 2**32)``."""
    global _seed
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < 2**32:
        raise ValueError(f"oc.seed takes an int in [0, 2**32), got {n!r}")
    _seed = n


def current_seed() -> int:
    """The session seed in effect."""
    return _seed


def stream(t: Tensor) -> int:
    """The random stream of parameter ``t``: its tensor id, stable for a given program."""
    return t.id


def uniform(low: float = -1.0, high: float = 1.0) -> Initializer:
    """Uniform in ``[low, high)``."""
    if not low <= high:
        raise ValueError(f"init.uniform: low must be <= high, got low={low}, high={high}")
    return lambda t: prng.uniform_fill(t.value, _seed, stream(t), low, high)


def normal(mean: float = 0.0, std: float = 1.0) -> Initializer:
    """Normal with this mean and standard deviation: Box-Muller from exactly rounded operations
    (``prng.box_muller``), so the same bits on every backend."""
    if not std >= 0:
        raise ValueError(f"init.normal: std must be >= 0, got {std}")
    return lambda t: prng.normal_fill(t.value, _seed, stream(t), mean, std)


def glorot_uniform(t: Tensor | float | None = None, *, gain: float = 1.0):
    """Glorot (Xavier) uniform: U(-a, a) with ``a = gain * sqrt(6 / (fan_in + fan_out))``, the
    fans being the products of the parameter's input and output dims.

    ``glorot_uniform(t)`` returns ``t``'s init code (the default of a weight);
    ``glorot_uniform(gain=2.0)`` or ``glorot_uniform(2.0)`` returns an initializer."""
    if t is None or isinstance(t, numbers.Real):
        g = gain if t is None else float(t)
        return lambda p: glorot_uniform(p, gain=g)
    a = gain * glorot_limit(t)
    return prng.uniform_fill(t.value, _seed, stream(t), -a, a)


def glorot_limit(t: Tensor) -> float:
    """``sqrt(6 / (fan_in + fan_out))`` for parameter ``t`` (finalizes its shape)."""
    t.dims  # noqa: B018 - finalizes shape inference
    fan_in, fan_out = math.prod(t.shape.input), math.prod(t.shape.output)
    return math.sqrt(6.0 / (fan_in + fan_out))


def constant(value: float) -> Initializer:
    """Every cell holds ``value``."""
    return lambda t: Fetch(t.value, Constant(float(value)))


def default_init(t: Tensor):
    """Glorot uniform for a weight (a parameter with input axes), 0 for a bias."""
    if not t._shape.input.dims:
        return Fetch(t.value, Constant(0.0))
    return glorot_uniform(t)


def init_code(t: Tensor):
    """Parameter ``t``'s init code, from its ``init=``: a number fills it, an array is its
    value, an initializer builds the code, and none is :func:`default_init`."""
    init = t.init
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return Fetch(t.value, Constant(float(init)))
    if isinstance(init, (np.ndarray, list, tuple)):
        arr = np.asarray(init)
        if arr.shape != t.dims:
            raise ShapeError(f"parameter {t.label!r}: init array of shape {arr.shape} does not match its dims {t.dims}")
        # Host values (bfloat16 as float32), rounded to the precision and range-checked here.
        return dtypes.from_storage(t.dtype, dtypes.to_storage(t.dtype, arr, f"parameter {t.label!r}"))
    if callable(init):
        return init(t)
    if init is None:
        return default_init(t)
    raise SessionError(f"parameter {t.label!r}: init={init!r} is not a number, an array or an initializer "
                       f"(oc.param accepts those)")
