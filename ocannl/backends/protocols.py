"""What a backend is to the runtime: the protocols a backend, its executables and its buffers
keep (docs/backends.md, "What a backend receives and returns"), and the numpy buffers of the
backends that keep no memory of their own. The runtime that uses them is ``context.py`` and
``routine.py`` beside this module."""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import numpy as np

from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.ir import RoutineIR
from ocannl.lowlevel.tnode import TNode


class Executable(Protocol):
    """A compiled routine: runs over the context's buffers (numpy arrays, or what the backend's
    :class:`BufferOwner` makes) with the index symbols bound.

    Two methods are optional; :class:`~ocannl.backends.routine.Routine` works without them
    (docs/backends.md):

    - ``prepare(buffers) -> call``: ``call(bindings)`` runs as ``run(buffers, bindings)`` does,
      with the buffers checked once, in ``prepare``; a routine keeps the call while the context's
      buffers stay the same, so each ``run()`` pays only for its bindings. The call may also
      offer a direct path, four attributes: ``order`` (every index symbol of the routine),
      ``values`` (a mutable sequence of ints, one per symbol of ``order``, where the native code
      reads the bindings), ``invoke()`` (runs on ``values`` as they stand, returning a nonzero
      failure status or a false value) and ``fail(status)`` (raises that status's error): a
      ``run()`` then stores its bindings in ``values`` and calls ``invoke``, no mapping built.
    - ``run_many(buffers, symbols, steps, records) -> outputs``: the contract of
      :func:`~ocannl.backends.routine.run_steps`, in one native call.

    And one optional attribute: ``stops_at_failure`` (true), when a run that fails a check runs
    no statement after the routine's last check (:func:`~ocannl.lowlevel.analysis.last_check`;
    the interpreter raises at once, the C code returns there): a failed run then restores only
    the buffers written up to it. Without it, a failed run may have written every buffer the
    routine writes, and restores them all.
    """

    def run(self, buffers: Mapping[TNode, Any], bindings: Mapping[IndexSymbol, int]) -> None: ...


class BufferOwner(Protocol):
    """How a backend holds buffers, when not as numpy arrays (its ``buffers`` attribute): the
    Triton backend keeps torch tensors on the GPU. ``from_host`` takes a fresh C-contiguous array
    of the node's storage dtype; ``to_host`` returns an array the caller copies. ``snapshot``
    copies a buffer where it lives and ``restore`` copies a snapshot back into it, in place: what
    undoes a failed run (:meth:`~ocannl.backends.routine.Routine.run`). A backend whose kernels
    report failures lazily also has ``check_errors()``, raising those of the runs so far: a run
    that can fail calls it at once, so that its error is its own and its buffers can still be
    restored."""

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def from_host(self, array: np.ndarray) -> Any: ...

    def to_host(self, buffer: Any) -> np.ndarray: ...

    def snapshot(self, buffer: Any) -> Any: ...

    def restore(self, buffer: Any, snapshot: Any) -> None: ...


class NumpyBuffers:
    """The buffers of a backend that has no :class:`BufferOwner`: numpy arrays on the host."""

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_host(self, buffer: np.ndarray) -> np.ndarray:
        return buffer

    def snapshot(self, buffer: np.ndarray) -> np.ndarray:
        return buffer.copy()

    def restore(self, buffer: np.ndarray, snapshot: np.ndarray) -> None:
        np.copyto(buffer, snapshot)


class Backend(Protocol):
    """A backend may also have ``buffers`` (a :class:`BufferOwner`; default: numpy arrays),
    ``tree_sums`` (true when it adds long float sums in its own tree order, as Triton's
    ``tl.sum``: its loop IR is not rewritten to the blocked summation order of
    ``ocannl/lowlevel/summation.py``), and
    ``emulated`` (true when it runs through an emulator, such as the Triton interpreter:
    :meth:`~ocannl.backends.context.Context.auto` never picks it), and
    ``compile_init(routine)`` (the C backend's): :meth:`compile` for an init routine, which runs
    once per context, so that its build may cost less and its run more; the work that needs this
    thread is done now, and the function returned finishes the rest, which may run meanwhile (a
    C compiler's processes) while the caller prepares its next routine."""

    name: str

    def available(self) -> tuple[bool, str]:
        """Whether the backend works here, and a sentence saying why (or why not)."""
        ...

    def compile(self, routine: RoutineIR) -> Executable: ...
