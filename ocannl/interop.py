"""Exchanging arrays with other libraries: DLPack out of tensors, foreign arrays into them.

Out: ``Tensor.__dlpack__`` hands out the value ``t.numpy()`` would read (from the context whose
routine last computed it, computing it when none did), but without copying where the backend's
buffer allows: on the CPU backends the consumer sees the context's own buffer, so
``np.from_dlpack(t)`` or ``torch.from_dlpack(t)`` is a view that later runs of the context write
into; on Triton it is the torch tensor on the kernels' device. A value with no buffer (a number,
or a node the context does not hold) goes out as a fresh copy. bfloat16 values cannot go out:
numpy has no such type, and ocannl keeps them as uint16 bit patterns that a consumer would take
for integers.

In: ``oc.tensor(x)`` takes any object speaking DLPack or the array interface (a torch, jax or
cupy array on the host, anything with ``__array__``) and keeps its precision: a float64 torch
tensor becomes a float64 tensor. Plain numpy arrays and nested lists keep numpy's conventions
instead (float data becomes float32 unless ``dtype=`` says otherwise), because numpy's float64
default is rarely a choice the user made.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ocannl.backends.session_state import session_state
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType

_ARRAY_PROTOCOLS = ("__dlpack__", "__array_interface__", "__array__")


def is_foreign_array(x: Any) -> bool:
    """Whether ``x`` is another library's array (not numpy's, not a Python number or list) that
    numpy can read through DLPack or the array interface."""
    if isinstance(x, (np.ndarray, np.generic, list, tuple, numbers.Number)):
        return False
    return any(hasattr(x, name) for name in _ARRAY_PROTOCOLS)


def host_array(x: Any, what: str) -> np.ndarray:
    """``x``'s values as a numpy array of its own dtype: through DLPack when it speaks it (no
    copy), else through the array interface. An array numpy cannot read (on a GPU, or of a type
    numpy lacks, such as bfloat16) is a ``TypeError`` saying how to hand it over."""
    errors = []
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            errors.append(str(e))
    if hasattr(x, "__array__") or hasattr(x, "__array_interface__"):
        try:
            return np.asarray(x)
        except (RuntimeError, TypeError, ValueError) as e:
            errors.append(str(e))
    raise TypeError(
        f"{what}: cannot read a {type(x).__name__} as a host array ({'; '.join(errors) or 'no array protocol'}). "
        f"Move it to the CPU first (e.g. x.cpu() for torch); a bfloat16 array goes in as float32 values "
        f"with dtype='bfloat16' (e.g. oc.tensor(x.float(), dtype='bfloat16'))")


def kept_dtype(array: np.ndarray) -> DType:
    """The ocannl precision keeping a foreign array's own: float16/32/64 as they are; integers as
    ``dtypes.default_for`` widens them; booleans become the default float (as numpy's do)."""
    if array.dtype.kind == "f":
        return dtypes.by_name(array.dtype.name)
    return dtypes.default_for(array)


def dlpack_source(t) -> Any:
    """The object ``t.__dlpack__`` delegates to: the buffer of the context that last computed
    ``t``'s value (computing it as ``t.numpy()`` does when none did); a number's value is a fresh
    host array, as it has no buffer."""

    _check_exportable(t)
    if t.is_constant:
        return t.numpy()
    node = t.value
    ctx = session_state.last_writer(node)
    if ctx is None or not ctx.has_value(node):
        ctx = next(iter(session_state.contexts_holding(node)), None)
    if ctx is None:
        t.numpy()  # computes the value where its parameters live, and stores it there
        ctx = session_state.last_writer(node) or next(iter(session_state.contexts_holding(node)), None)
    if ctx is None:
        return np.array(t.numpy(), order="C")
    return ctx.buffer(node)


def export(t, stream=None, max_version=None, dl_device=None, copy=None):
    """``t.__dlpack__(...)``: the capsule of :func:`dlpack_source`, or of a host copy when
    ``copy`` is true. Only the keywords the caller gave are passed on, so producers that predate
    some of them still answer."""
    if copy:
        _check_exportable(t)
        source = np.array(t.numpy(), order="C")
    else:
        source = dlpack_source(t)
    kwargs = {k: v for k, v in (("stream", stream), ("max_version", max_version), ("dl_device", dl_device),
                                ("copy", copy)) if v is not None}
    return source.__dlpack__(**kwargs)


def export_device(t) -> tuple[int, int]:
    """``t.__dlpack_device__()``: the DLPack (device type, device id) of :func:`dlpack_source`."""
    return dlpack_source(t).__dlpack_device__()


def _check_exportable(t) -> None:
    if t.dtype is dtypes.bfloat16:
        raise dtypes.DTypeError(
            f"tensor {t.label!r} is bfloat16, which DLPack consumers on the host cannot read here (ocannl "
            f"stores it as uint16 bit patterns); read its values as float32 with {t.label}.numpy()")
