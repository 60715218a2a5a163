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

Weights: ``load_torch_state_dict(model, torch_module.state_dict())`` gives a model's parameters
the values of a PyTorch state dict, converting PyTorch's layouts to ocannl's (docs/training.md,
"Weights from PyTorch").
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from ocannl.backends.session_state import session_state
from ocannl.errors import CheckpointError, ShapeError
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


def parameters(model_or_params) -> list:
    """The parameters of a block (an object with ``.params``, as ``oc.save`` reads blocks), of a
    parameter, or of a list or tuple of these, nested as deep as need be, in order, each once (a
    weight two blocks share counts once): what ``nn.summary`` lists and
    :func:`load_torch_state_dict` fills. Tensors are recognised by their ``is_param``, since this
    module sits below ``ocannl/tensor.py``. Anything else is a ``TypeError`` saying what is
    accepted."""
    found: dict[int, Any] = {}

    def add(item) -> None:
        if isinstance(getattr(type(item), "is_param", None), property):  # a tensor
            if not item.is_param:
                raise TypeError(f"{item.label!r} ({item.op}) is not a parameter: give blocks (objects with "
                                f".params) or parameters made with oc.param")
            found.setdefault(id(item), item)
        elif isinstance(getattr(item, "params", None), (list, tuple)):
            for p in item.params:
                add(p)
        elif isinstance(item, (list, tuple)):
            for x in item:
                add(x)
        else:
            raise TypeError(f"expected a block (an object with .params), a parameter or a list of them, "
                            f"got {type(item).__name__}")

    add(model_or_params)
    return list(found.values())


TORCH_LAYOUTS = ("channels_first", "row_major")
"""How a PyTorch weight orders the axes a parameter calls its input axes. ``channels_first``:
channels, then the spatial axes (a ``Conv2d`` weight ``[oc, ic, kh, kw]``, or a ``Linear``
weight reading a conv's output through ``torch.flatten``, whose columns run over ``(c, h, w)``),
where ocannl puts the channels last (``nn.conv2d``'s kernel ``[oc, kh, kw, ic]``, its output
``... | h, w, c``). ``row_major``: the parameter's own order, possibly flattened (a ``Linear``
weight ``[out, in]``, an attention projection ``[heads * d, d_model]``)."""


def load_torch_state_dict(params, state_dict: Mapping[str, Any], mapping: Mapping[str, Any] | None = None) -> None:
    """Give the parameters of ``params`` (a block, a parameter or a list of them:
    :func:`parameters`) the values of a PyTorch ``state_dict`` (``module.state_dict()``: torch
    tensors or numpy arrays by key), converted to ocannl's layouts (:func:`from_torch_layout`)
    and to each parameter's precision.

    Without ``mapping`` the parameters pair with the entries in order: PyTorch's registration
    order, which for an ``nn.Sequential`` of the same layers is the ocannl model's ``.params``
    order (``nn.linear``: weight, bias; ``nn.mlp`` ends in a weight without a bias), and the
    counts must agree. ``mapping`` maps a parameter's label to its key, or to a pair ``(key,
    layout)`` naming the entry's layout (:data:`TORCH_LAYOUTS`) where its shape cannot tell:
    then every parameter given needs an entry; keys it does not name are left alone. Every value
    is read and checked before any is assigned: a missing key or a shape that does not map is an
    error naming the parameter and the entry, and nothing changes. Dims are inferred from use:
    call the model once before loading into it."""
    targets = parameters(params)
    converted = []
    for p, key, layout in _paired_keys(targets, state_dict, mapping):
        value = state_dict[key]
        value = value.detach() if callable(getattr(value, "detach", None)) else value  # named_parameters() too
        converted.append((p, from_torch_layout(p, key, host_array(value, f"state dict entry {key!r}"), layout)))
    for p, values in converted:
        p.set(values)


def _paired_keys(targets: list, state_dict: Mapping[str, Any],
                 mapping: Mapping[str, Any] | None) -> list[tuple[Any, str, str | None]]:
    """Each parameter with its state-dict key and layout (``None``: told by the shape)."""
    keys = list(state_dict)
    labels = [p.label for p in targets]
    if mapping is None:
        if len(keys) != len(targets):
            raise CheckpointError(
                f"load_torch_state_dict: {len(targets)} parameters ({', '.join(labels)}) but {len(keys)} state-dict "
                f"entries ({', '.join(keys)}); without mapping= they pair in order, so the counts must agree: pass "
                f"mapping={{parameter label: state-dict key}}")
        return [(p, key, None) for p, key in zip(targets, keys)]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    unknown = [label for label in mapping if label not in labels]
    unmapped = [label for label in labels if label not in mapping]
    for problem, names in (("names no parameter given", unknown), ("has no entry for", unmapped),
                           ("cannot tell apart the parameters labelled", repeated)):
        if names:
            raise CheckpointError(f"load_torch_state_dict: mapping {problem} {', '.join(map(repr, names))} (the "
                                  f"parameters: {', '.join(labels)}); map each parameter's label to a state-dict key")
    paired = []
    for p in targets:
        key, layout = mapping[p.label] if isinstance(mapping[p.label], tuple) else (mapping[p.label], None)
        if key not in state_dict:
            raise CheckpointError(f"load_torch_state_dict: mapping gives parameter {p.label!r} the key {key!r}, which "
                                  f"the state dict lacks (its keys: {', '.join(keys)})")
        if layout not in (None, *TORCH_LAYOUTS):
            raise ValueError(f"load_torch_state_dict: layout {layout!r} of {p.label!r}: use one of "
                             f"{', '.join(TORCH_LAYOUTS)}")
        paired.append((p, key, layout))
    return paired


def from_torch_layout(p, key: str, array: np.ndarray, layout: str | None = None) -> np.ndarray:
    """``array``, state-dict entry ``key``, as parameter ``p``'s values: of ``p.dims`` (output
    axes, then input axes) and ``p``'s precision. ``layout`` (:data:`TORCH_LAYOUTS`) says how
    PyTorch ordered the input axes; left out, the shape tells: a parameter with several input
    axes whose entry has PyTorch's unflattened channels-first shape (a conv weight) is
    ``channels_first``, an entry of ``p.dims`` or with only one input axis to order is
    ``row_major``, and an entry flattening several input axes (a classifier after
    ``torch.flatten``) could be either, so it is an error asking for the layout. Any layout also
    takes the entry with its input axes flattened into one, and its output axes too."""
    dims = p.dims
    output, input_ = tuple(p.shape.output), tuple(p.shape.input)
    reordered = len(input_) >= 2  # with one input axis or none, both layouts are the parameter's own
    channels_first = output + (input_[-1],) + input_[:-1] if reordered else dims
    flattened = {output + (math.prod(input_),), (math.prod(output), math.prod(input_))} if input_ else set()
    shape = tuple(array.shape)
    allowed = {"channels_first": {channels_first} | flattened, "row_major": {dims} | flattened}

    def describe() -> str:
        return (f"state-dict entry {key!r} of shape {shape} onto parameter {p.label!r} of dims {dims} (output "
                f"{output}, input {input_})")

    if layout is None:
        if reordered and shape == channels_first:
            layout = "channels_first"
        elif shape == dims or (shape in flattened and not reordered):
            layout = "row_major"
        elif shape in flattened:
            raise ShapeError(
                f"load_torch_state_dict: {describe()}: the entry flattens the {len(input_)} input axes, in an order "
                f"its shape cannot tell; say which in mapping: {{{p.label!r}: ({key!r}, 'channels_first')}} for a "
                f"layer after torch.flatten of a convolution's output, ({key!r}, 'row_major') when PyTorch orders "
                f"them as ocannl does")
    if layout is None or shape not in allowed[layout]:
        shapes = sorted(allowed[layout] if layout else allowed["channels_first"] | allowed["row_major"])
        raise ShapeError(f"load_torch_state_dict: cannot map {describe()}"
                         + (f" as {layout}" if layout else "") + f": it takes the shapes {', '.join(map(str, shapes))}")
    if layout == "channels_first" and reordered:
        array = np.moveaxis(array.reshape(channels_first), len(output), -1)
    values = np.ascontiguousarray(array).reshape(dims)
    what = f"parameter {p.label!r} from state-dict entry {key!r}"
    return dtypes.from_storage(p.dtype, dtypes.to_storage(p.dtype, values, what))
