"""Checkpoints: tensor values saved to and loaded from safetensors files.

``save(path, items)`` writes the values of tensors (or of blocks' ``.params`` and ``.state``)
under their labels; ``load(path, items)`` reads them back into the same tensors, after checking
that every name is there with the tensor's dims and precision, so a checkpoint of another model
(or of the same model with a layer resized) is an error naming the tensor that does not fit,
never a silently misassigned value. ``train.save_checkpoint`` / ``train.load_checkpoint`` build
on the same two steps for parameters plus the state the training step updates.

A checkpoint holds every value a routine updates across runs (docs/training.md, "Checkpoints"):
a block's ``.state`` beside its ``.params`` (batch norm's running statistics), and in a training
checkpoint dropout's run counters and the optimizer state too. A file without some of that
state (written before ocannl saved it) is an error naming it, unless loaded with
``allow_missing_state=True``: then the state keeps its current value, with a
:class:`CheckpointWarning` naming it, and the run no longer continues the saved one bit for bit.

The file is standard safetensors, readable by other frameworks. Values are stored in their
precision's own safetensors type (``BF16`` for bfloat16, whose bit patterns are stored as they
are, so bfloat16 values round-trip exactly); the header's metadata also records each entry's
ocannl precision, which tells ``uint4x32`` (stored as ``U32`` with a trailing axis of 4) from
``uint32``.

The header's types are the truth: metadata recording another precision than the header's type
(a file edited, or written by a faulty tool) is an error naming the entry, never a reason to
read its bytes as another type.

Writing is atomic: the bytes go to a temporary file in the destination's directory, which is
flushed to disk and then renamed over the destination, so a failure at any point leaves either
the old file or the new one, never a partial file. A save killed between the two steps leaves its
temporary file; the next save into that directory removes the temporary files of saves more than
an hour old. A path that is a link is followed: the save replaces the file it points to.
"""

from __future__ import annotations

import json
import os
import struct
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from ocannl.backends.session_state import session_state
from ocannl.errors import CheckpointError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.tnode import TNode
from ocannl.tempfiles import remove_stale_temporaries, write_atomically
from ocannl.tensor import Tensor

Items = Union[Tensor, Any, Mapping[str, Any], Iterable[Any]]
"""What ``save`` and ``load`` take: a tensor, a block (an object with ``.params``, and
``.state`` when it updates values as it runs), a mapping from names to tensors or blocks, or a
list of any of these."""

_DTYPES_KEY = "ocannl.dtypes"
"""The metadata entry holding ``{name: ocannl precision}`` as JSON."""

_SAFETENSORS_TYPE = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
                     "int32": "I32", "int64": "I64", "uint32": "U32", "uint4x32": "U32"}
"""Each precision's type code in a safetensors header (a file written elsewhere has no ocannl
metadata: its entries are checked against these)."""

class CheckpointWarning(UserWarning):
    """A checkpoint was loaded without some of the state it should hold (``allow_missing_state``)."""


class Entry:
    """One value of a checkpoint: its name, its node, the tensor owning the node (``None``
    for optimizer state, which no tensor owns), and whether it is state a routine updates as it
    runs (a block's ``.state``, a run counter, optimizer state), which ``allow_missing_state``
    lets a file lack, rather than a parameter or a tensor asked for by name."""

    __slots__ = ("name", "node", "tensor", "is_state")

    def __init__(self, name: str, node: TNode, tensor: Tensor | None, *, is_state: bool = False):
        self.name, self.node, self.tensor, self.is_state = name, node, tensor, is_state

    @property
    def shape(self) -> tuple[int, ...]:
        """The stored shape: the node's dims, plus a trailing 4 for uint4x32."""
        return self.node.dims + ((4,) if self.node.dtype is dtypes.uint4x32 else ())


def entries(items: Items) -> list[Entry]:
    """The tensors of ``items`` under their checkpoint names: a tensor's label, the labels of a
    block's parameters and state; in a mapping, the key names a tensor and prefixes a block's
    labels (``{"enc": block}`` gives ``enc.w1``...). Two different tensors under one name are an
    error that says how to tell them apart; one tensor listed twice counts once."""
    found: list[Entry] = []

    def add(item: Any, name: str | None, prefix: str, is_state: bool = False) -> None:
        if isinstance(item, Tensor):
            found.append(Entry(name if name is not None else prefix + item.label, item.value, item, is_state=is_state))
        elif isinstance(getattr(item, "params", None), (list, tuple)):
            block_prefix = prefix + (f"{name}." if name is not None else "")
            for p in item.params:
                add(p, None, block_prefix)
            for t in getattr(item, "state", ()):
                add(t, None, block_prefix, is_state=True)
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


def unique(found: list[Entry], fix: str = "give them distinct labels, or pass a mapping {name: tensor}"
           ) -> list[Entry]:
    """``found`` without repeats of one node; two nodes under one name are a
    :class:`CheckpointError` naming both, and saying how to tell them apart (``fix``)."""
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
                f"{e.node.debug_name}): {fix}")
    return result


def save(path: str | os.PathLike, items: Items, *, context=None) -> None:
    """Write the values of ``items`` (see :func:`entries`) to the safetensors file ``path``,
    atomically. Each value is read as ``t.numpy()`` reads it (from the context that last
    computed it, computing it when none did), or from ``context`` when given."""
    write(path, entries(items), context=context)


def load(path: str | os.PathLike, items: Items, *, context=None, strict: bool = True,
         allow_missing_state: bool = False) -> None:
    """Give ``items`` (see :func:`entries`) the values saved in ``path``. Every name must be in
    the file with the tensor's dims and precision, and with ``strict`` the file may hold no other
    names; nothing is assigned unless everything fits. Values go to ``context`` when given, else
    as ``t.set`` puts them: to every context holding the tensor, and to those compiling it later.
    With ``allow_missing_state``, a block's state the file lacks keeps its value, with a warning."""
    assign(read(path, entries(items), strict=strict, allow_missing_state=allow_missing_state), context=context)


def write(path: str | os.PathLike, found: list[Entry], *, context=None) -> None:
    """Save ``found``'s values to ``path`` atomically (the work of :func:`save`)."""
    target = _checkpoint_file(path, "save to")
    TensorSpec, serialize = _safetensors("TensorSpec", "serialize")
    arrays = [_stored_value(e, context) for e in found]  # every value read before anything is written
    specs = {e.name: TensorSpec(dtype=_spec_dtype(e.node.dtype), shape=list(a.shape), data_ptr=a.ctypes.data,
                                data_len=a.nbytes)
             for e, a in zip(found, arrays)}
    metadata = {_DTYPES_KEY: json.dumps({e.name: e.node.dtype.name for e in found}, sort_keys=True)}
    data = serialize(specs, metadata=metadata)  # ``arrays`` keeps the specs' memory alive until here
    remove_stale_temporaries(target.parent)  # left by killed saves: as large as a checkpoint
    write_atomically(target, bytes(data))


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


def _checkpoint_file(path: str | os.PathLike, action: str) -> Path:
    """The file ``path`` names, links followed: saving through a link replaces the file it points
    to, as writing to the link would, instead of putting a file in the link's place. A directory
    is a :class:`CheckpointError` saying to name a file (``action`` is what was asked of it)."""
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise CheckpointError(f"cannot {action} {os.fspath(path)}: it is a directory: name a file in it, such as "
                              f"{os.path.join(path, 'checkpoint.safetensors')}")
    return target


def read(path: str | os.PathLike, found: list[Entry], *, strict: bool,
         allow_missing_state: bool = False) -> list[tuple[Entry, np.ndarray]]:
    """Each entry of ``found`` with its value from ``path`` (in the form ``ctx.set`` takes),
    after checking names, dims and precisions (the work of :func:`load`). With
    ``allow_missing_state``, state entries (:attr:`Entry.is_state`) the file lacks are left
    out, with a :class:`CheckpointWarning` naming them."""
    (deserialize,) = _safetensors("deserialize")
    try:
        data = _checkpoint_file(path, "load").read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"there is no checkpoint file {path}") from None
    try:
        stored = {name: info for name, info in deserialize(data)}
    except Exception as e:  # the package raises its own error type for a malformed file
        raise CheckpointError(f"{path} is not a readable safetensors file: {e}") from e
    recorded = _recorded_dtypes(path, data)
    wanted = {e.name for e in found}
    absent = [e for e in found if e.name not in stored]
    missing = [e.name for e in absent if not (allow_missing_state and e.is_state)]
    if missing:
        hint = ("; checkpoints written before ocannl saved the state routines update (run counters, running "
                "statistics) lack it: pass allow_missing_state=True to load such a file anyway, that state keeping "
                "its current value" if all(e.is_state for e in absent) else "")
        raise CheckpointError(f"{path} has no value for {', '.join(map(repr, missing))} "
                              f"(it holds: {', '.join(sorted(stored)) or 'nothing'}){hint}")
    if absent:
        warnings.warn(CheckpointWarning(
            f"{path} has no value for {', '.join(repr(e.name) for e in absent)}, state that keeps its current "
            f"value: training from here does not continue the saved run bit for bit"), stacklevel=3)
        found = [e for e in found if e.name in stored]
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
        if saved_as is not None and _SAFETENSORS_TYPE[saved_as] != info["dtype"]:
            raise CheckpointError(f"{path}: {e.name!r} is stored as {info['dtype']} in the file's header, but its "
                                  f"{_DTYPES_KEY} metadata records {saved_as}: the file contradicts itself (edited, or "
                                  f"written by a faulty tool); save it again from the model")
        if info["dtype"] != _SAFETENSORS_TYPE[e.node.dtype.name] or saved_as not in (None, e.node.dtype.name):
            raise CheckpointError(f"{path}: {e.name!r} is {saved_as or info['dtype']} in the file, but "
                                  f"{e.node.debug_name} is {e.node.dtype.name}")
        bits = np.frombuffer(bytes(info["data"]), dtype=e.node.dtype.storage.newbyteorder("<")).reshape(shape)
        values.append((e, dtypes.from_storage(e.node.dtype, bits.astype(e.node.dtype.storage))))
    return values


def assign(values: list[tuple[Entry, np.ndarray]], *, context=None) -> None:
    """Set each entry's node to its value: on ``context`` when given; else a tensor through
    ``t.set`` and a node no tensor owns on every context holding it (see ``train``, which keeps
    it for contexts that compile it later)."""

    for e, value in values:
        if context is not None:
            context.set(e.node, value)
        elif e.tensor is not None:
            e.tensor.set(value)
        else:
            for ctx in session_state.contexts_holding(e.node):
                ctx.set(e.node, value)


def _stored_value(e: Entry, context) -> np.ndarray:
    """``e``'s value as the bits a buffer of its precision holds, little-endian and contiguous.
    A node no tensor owns (optimizer state) with no value on any context is zero, the value its
    initializer gives it."""

    node = e.node
    if context is not None:
        value = context.get(node)
    elif e.tensor is not None:
        value = e.tensor.numpy()
    else:
        ctx = session_state.last_writer(node) or next(iter(session_state.contexts_holding(node)), None)
        value = ctx.get(node) if ctx is not None else np.zeros(e.shape, dtype=node.dtype.storage)
    bits = dtypes.to_storage(node.dtype, value, e.name)
    # (np.ascontiguousarray would turn a 0-d value into a 1-d one)
    return np.array(bits, dtype=node.dtype.storage.newbyteorder("<"), order="C")


def _spec_dtype(dtype: DType) -> str:
    """The package's name of a precision's stored type."""
    return "uint32" if dtype is dtypes.uint4x32 else dtype.name


def _recorded_dtypes(path: str | os.PathLike, data: bytes) -> dict[str, str]:
    """The ocannl precisions the header's metadata records by name (none for a file written
    elsewhere); metadata that is not such a record is a :class:`CheckpointError`. ``data`` is a
    file the safetensors package has read: its header, the JSON object after the first 8 bytes
    (its length as a little-endian u64), holds string metadata."""
    (n,) = struct.unpack("<Q", data[:8])
    text = (json.loads(data[8:8 + n]).get("__metadata__") or {}).get(_DTYPES_KEY)
    if text is None:
        return {}
    try:
        recorded = json.loads(text)
    except ValueError:
        recorded = None
    if not (isinstance(recorded, dict) and all(isinstance(v, str) and v in _SAFETENSORS_TYPE
                                               for v in recorded.values())):
        raise CheckpointError(f"{path}: the {_DTYPES_KEY} metadata in the header must be a JSON object mapping "
                              f"names to ocannl precisions ({', '.join(_SAFETENSORS_TYPE)}), but it is "
                              f"{text[:80]!r}; save the checkpoint again, or drop that entry to load the file by "
                              f"its header's types alone")
    return recorded
