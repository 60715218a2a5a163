"""Checkpoints: tensor values saved to and loaded from safetensors files.

``save(path, items)`` writes the values of tensors (or of blocks' ``.params``) under their
labels; ``load(path, items)`` reads them back into the same tensors, after checking that every
name is there with the tensor's dims and precision, so a checkpoint of another model (or of the
same model with a layer resized) is an error naming the tensor that does not fit, never a
silently misassigned value. ``train.save_checkpoint`` / ``train.load_checkpoint`` build on the
same two steps for parameters plus optimizer state.

The file is standard safetensors, readable by other frameworks. Values are stored in their
precision's own safetensors type (``BF16`` for bfloat16, whose bit patterns are stored as they
are, so bfloat16 values round-trip exactly); the header's metadata also records each entry's
ocannl precision, which tells ``uint4x32`` (stored as ``U32`` with a trailing axis of 4) from
``uint32``.

Writing is atomic: the bytes go to a temporary file in the destination's directory, which is
flushed to disk and then renamed over the destination, so a failure at any point leaves either
the old file or the new one, never a partial file.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from ocannl.errors import CheckpointError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.tnode import TNode
from ocannl.tensor import Tensor

Items = Union[Tensor, Any, Mapping[str, Any], Iterable[Any]]
"""What ``save`` and ``load`` take: a tensor, a block (an object with ``.params``), a mapping
from names to tensors or blocks, or a list of any of these."""

_DTYPES_KEY = "ocannl.dtypes"
"""The metadata entry holding ``{name: ocannl precision}`` as JSON."""

_SAFETENSORS_TYPE = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
                     "int32": "I32", "int64": "I64", "uint32": "U32", "uint4x32": "U32"}
"""Each precision's type code in a safetensors header (a file written elsewhere has no ocannl
metadata: its entries are checked against these)."""


class Entry:
    """One value of a checkpoint: its name, its node, and the tensor owning the node (``None``
    for optimizer state, which no tensor owns)."""

    __slots__ = ("name", "node", "tensor")

    def __init__(self, name: str, node: TNode, tensor: Tensor | None):
        self.name, self.node, self.tensor = name, node, tensor

    @property
    def shape(self) -> tuple[int, ...]:
        """The stored shape: the node's dims, plus a trailing 4 for uint4x32."""
        return self.node.dims + ((4,) if self.node.dtype is dtypes.uint4x32 else ())


def entries(items: Items) -> list[Entry]:
    """The tensors of ``items`` under their checkpoint names: a tensor's label, a block's
    parameters' labels; in a mapping, the key names a tensor and prefixes a block's parameter
    labels (``{"enc": block}`` gives ``enc.w1``...). Two different tensors under one name are an
    error that says how to tell them apart; one tensor listed twice counts once."""
    found: list[Entry] = []

    def add(item: Any, name: str | None, prefix: str) -> None:
        if isinstance(item, Tensor):
            found.append(Entry(name if name is not None else prefix + item.label, item.value, item))
        elif isinstance(getattr(item, "params", None), (list, tuple)):
            for p in item.params:
                add(p, None, prefix + (f"{name}." if name is not None else ""))
        elif isinstance(item, Mapping):
            for key, value in item.items():
                if not isinstance(key, str) or not key:
                    raise CheckpointError(f"checkpoint names must be non-empty strings, got {key!r}")
                add(value, key, prefix)
        elif isinstance(item, Iterable) and not isinstance(item, (str, bytes)):
            for x in item:
                add(x, None, prefix)
        else:
            raise TypeError(f"a checkpoint holds tensors, blocks (objects with .params), mappings from "
                            f"names to those, or lists of them; got {type(item).__name__}")

    add(items, None, "")
    return unique(found)


def unique(found: list[Entry]) -> list[Entry]:
    """``found`` without repeats of one node; two nodes under one name are a
    :class:`CheckpointError` naming both."""
    by_name: dict[str, Entry] = {}
    result = []
    for e in found:
        other = by_name.get(e.name)
        if other is None:
            by_name[e.name] = e
            result.append(e)
        elif other.node is not e.node:
            raise CheckpointError(
                f"two different tensors are both named {e.name!r} in this checkpoint ({other.node.debug_name} and "
                f"{e.node.debug_name}): give them distinct labels, or pass a mapping {{name: tensor}}")
    return result


def save(path: str | os.PathLike, items: Items, *, context=None) -> None:
    """Write the values of ``items`` (see :func:`entries`) to the safetensors file ``path``,
    atomically. Each value is read as ``t.numpy()`` reads it (from the context that last
    computed it, computing it when none did), or from ``context`` when given."""
    write(path, entries(items), context=context)


def load(path: str | os.PathLike, items: Items, *, context=None, strict: bool = True) -> None:
    """Give ``items`` (see :func:`entries`) the values saved in ``path``. Every name must be in
    the file with the tensor's dims and precision, and with ``strict`` the file may hold no other
    names; nothing is assigned unless everything fits. Values go to ``context`` when given, else
    as ``t.set`` puts them: to every context holding the tensor, and to those compiling it later."""
    assign(read(path, entries(items), strict=strict), context=context)


def write(path: str | os.PathLike, found: list[Entry], *, context=None) -> None:
    """Save ``found``'s values to ``path`` atomically (the work of :func:`save`)."""
    TensorSpec, serialize = _safetensors("TensorSpec", "serialize")
    arrays = [_stored_value(e, context) for e in found]  # every value read before anything is written
    specs = {e.name: TensorSpec(dtype=_spec_dtype(e.node.dtype), shape=list(a.shape), data_ptr=a.ctypes.data,
                                data_len=a.nbytes)
             for e, a in zip(found, arrays)}
    metadata = {_DTYPES_KEY: json.dumps({e.name: e.node.dtype.name for e in found}, sort_keys=True)}
    data = serialize(specs, metadata=metadata)  # ``arrays`` keeps the specs' memory alive until here
    write_atomically(Path(path), bytes(data))


def _safetensors(*names: str) -> tuple:
    """The safetensors package's ``names``. It is the ``checkpoints`` extra, not a dependency of
    the core (which needs only numpy), so its absence is an error saying how to install it."""
    try:
        import safetensors
    except ImportError:
        raise CheckpointError(
            "checkpoints are safetensors files and need the safetensors package: "
            "pip install 'ocannl[checkpoints]'"
        ) from None
    return tuple(getattr(safetensors, name) for name in names)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``: written next to it, flushed, then renamed."""
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read(path: str | os.PathLike, found: list[Entry], *, strict: bool) -> list[tuple[Entry, np.ndarray]]:
    """Each entry of ``found`` with its value from ``path`` (in the form ``ctx.set`` takes),
    after checking names, dims and precisions (the work of :func:`load`)."""
    (deserialize,) = _safetensors("deserialize")
    data = Path(path).read_bytes()
    try:
        stored = {name: info for name, info in deserialize(data)}
    except Exception as e:  # the package raises its own error type for a malformed file
        raise CheckpointError(f"{path} is not a readable safetensors file: {e}") from e
    recorded = _recorded_dtypes(data)
    wanted = {e.name for e in found}
    missing = [e.name for e in found if e.name not in stored]
    if missing:
        raise CheckpointError(f"{path} has no value for {', '.join(map(repr, missing))} "
                              f"(it holds: {', '.join(sorted(stored)) or 'nothing'})")
    extra = sorted(set(stored) - wanted)
    if strict and extra:
        raise CheckpointError(f"{path} holds values for names not being loaded: {', '.join(map(repr, extra))}; "
                              f"pass strict=False to load a part of a checkpoint")
    values = []
    for e in found:
        info = stored[e.name]
        shape = tuple(info["shape"])
        if shape != e.shape:
            raise CheckpointError(f"{path}: {e.name!r} has dims {shape} in the file, but {e.node.debug_name} has "
                                  f"dims {e.shape}")
        saved_as = recorded.get(e.name)
        fits = saved_as == e.node.dtype.name if saved_as is not None else \
            info["dtype"] == _SAFETENSORS_TYPE[e.node.dtype.name]
        if not fits:
            raise CheckpointError(f"{path}: {e.name!r} is {saved_as or info['dtype']} in the file, but "
                                  f"{e.node.debug_name} is {e.node.dtype.name}")
        bits = np.frombuffer(bytes(info["data"]), dtype=e.node.dtype.storage.newbyteorder("<")).reshape(shape)
        values.append((e, dtypes.from_storage(e.node.dtype, bits.astype(e.node.dtype.storage))))
    return values


def assign(values: list[tuple[Entry, np.ndarray]], *, context=None) -> None:
    """Set each entry's node to its value: on ``context`` when given; else a tensor through
    ``t.set`` and a node no tensor owns on every context holding it (see ``train``, which keeps
    it for contexts that compile it later)."""
    from ocannl.backends.base import contexts_holding

    for e, value in values:
        if context is not None:
            context.set(e.node, value)
        elif e.tensor is not None:
            e.tensor.set(value)
        else:
            for ctx in contexts_holding(e.node):
                ctx.set(e.node, value)


def _stored_value(e: Entry, context) -> np.ndarray:
    """``e``'s value as the bits a buffer of its precision holds, little-endian and contiguous.
    A node no tensor owns (optimizer state) with no value on any context is zero, the value its
    initializer gives it."""
    from ocannl.backends.base import contexts_holding, last_writer

    node = e.node
    if context is not None:
        value = context.get(node)
    elif e.tensor is not None:
        value = e.tensor.numpy()
    else:
        ctx = last_writer(node) or next(iter(contexts_holding(node)), None)
        value = ctx.get(node) if ctx is not None else np.zeros(e.shape, dtype=node.dtype.storage)
    bits = dtypes.to_storage(node.dtype, value, e.name)
    # (np.ascontiguousarray would turn a 0-d value into a 1-d one)
    return np.array(bits, dtype=node.dtype.storage.newbyteorder("<"), order="C")


def _spec_dtype(dtype: DType) -> str:
    """The package's name of a precision's stored type."""
    return "uint32" if dtype is dtypes.uint4x32 else dtype.name


def _recorded_dtypes(data: bytes) -> dict[str, str]:
    """The ocannl precisions a file's header records (none for a file written elsewhere). The
    header is the JSON object after the file's first 8 bytes, its length as a little-endian u64."""
    if len(data) < 8:
        return {}
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + n])
        return json.loads(header.get("__metadata__", {}).get(_DTYPES_KEY, "{}"))
    except (ValueError, AttributeError):
        return {}
