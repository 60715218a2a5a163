"""The runtime: backends, contexts and routines (spec/backend.md §8, simplified).

A :class:`Backend` turns a :class:`~ocannl.lowlevel.ir.RoutineIR` into an executable; it sees the
loop IR and the nodes, nothing of the tensor frontend. A :class:`Context` owns one backend and a
buffer per node (a numpy array in the node's storage dtype, zero-filled when first used), and
compiles computations into :class:`Routine` objects, each compiled once and run many times with
different index symbol bindings (shared/DESIGN.md §4)::

    ctx = Context.auto()                      # OCANNL_BACKEND, else the best available backend
    step = ctx.compile(update, sgd)           # Computations, or objects with .to_computation()
    step.run(batch_n=3)                       # bindings by index symbol name; they persist
    ctx.get(w)                                # a copy of w's buffer; ctx.set(w, array)

Compiling also initializes: each computation's ``inits`` runs once per context for the nodes
that have no value on the context yet (host data is copied in; code runs in an init routine of
its own). With ``debug_dir`` set
(or ``OCANNL_DEBUG_DIR``), compiling writes ``<routine>.cd``, ``<routine>-unoptimized.ll`` and
``<routine>.ll`` there (spec/backend.md §9).
"""

from __future__ import annotations

import keyword

import operator
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from ocannl import config, session
from ocannl.errors import BackendUnavailable, IndexBindingError, OcannlError, SessionError, ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import ASSIGNMENT_TYPES, Assignment, Block, Computation, Init, format_cd
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.ir import RoutineIR, format_routine
from ocannl.lowlevel.lower import lower_routine
from ocannl.lowlevel.optimize import inlined_nodes, materialized_nodes, optimize, routine_inputs
from ocannl.lowlevel.tnode import TNode, sanitize_identifier


class Executable(Protocol):
    """A compiled routine: runs over the context's buffers (numpy arrays, or what the backend's
    :class:`BufferOwner` makes) with the index symbols bound."""

    def run(self, buffers: Mapping[TNode, Any], bindings: Mapping[IndexSymbol, int]) -> None: ...


class BufferOwner(Protocol):
    """How a backend holds buffers, when not as numpy arrays (its ``buffers`` attribute): the
    Triton backend keeps torch tensors on the GPU. ``from_host`` takes a fresh C-contiguous array
    of the node's storage dtype; ``to_host`` returns an array the caller copies."""

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def from_host(self, array: np.ndarray) -> Any: ...

    def to_host(self, buffer: Any) -> np.ndarray: ...


class _NumpyBuffers:
    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_host(self, buffer: np.ndarray) -> np.ndarray:
        return buffer


class Backend(Protocol):
    """A backend may also have ``buffers`` (a :class:`BufferOwner`; default: numpy arrays) and
    ``emulated`` (true when it runs through an emulator, such as the Triton interpreter:
    :meth:`Context.auto` never picks it)."""

    name: str

    def available(self) -> tuple[bool, str]:
        """Whether the backend works here, and a sentence saying why (or why not)."""
        ...

    def compile(self, routine: RoutineIR) -> Executable: ...


@dataclass(frozen=True)
class _Registration:
    factory: Callable[[], Backend]
    preference: int


_registry: dict[str, _Registration] = {}


def register_backend(name: str, factory: Callable[[], Backend], *, preference: int = 0) -> None:
    """Make backend ``name`` selectable; :meth:`Context.auto` picks the available backend of
    highest ``preference`` (interp has 0; shared/DESIGN.md §4 orders triton > c > interp)."""
    _registry[name] = _Registration(factory, preference)


def registered_backends() -> tuple[str, ...]:
    """Backend names, most preferred first."""
    return tuple(sorted(_registry, key=lambda n: -_registry[n].preference))


def get_backend(name: str) -> Backend:
    """A fresh instance of backend ``name``; :class:`BackendUnavailable` if it cannot run here."""
    if name not in _registry:
        raise BackendUnavailable(
            f"unknown backend {name!r}; known backends: {', '.join(registered_backends())}"
        )
    backend = _registry[name].factory()
    ok, reason = backend.available()
    if not ok:
        raise BackendUnavailable(f"backend {name!r} cannot run here: {reason}")
    return backend


def best_available() -> str:
    for name in registered_backends():
        backend = _registry[name].factory()
        if backend.available()[0] and not getattr(backend, "emulated", False):
            return name
    raise BackendUnavailable("no backend can run here")


def _interp() -> Backend:
    from ocannl.backends.interp import InterpBackend

    return InterpBackend()


register_backend("interp", _interp, preference=0)


def _c() -> Backend:
    from ocannl.backends.c import CBackend

    return CBackend()


register_backend("c", _c, preference=10)


def _triton() -> Backend:
    from ocannl.backends.triton import TritonBackend

    return TritonBackend()


register_backend("triton", _triton, preference=20)


def _metal() -> Backend:
    from ocannl.backends.metal import MetalBackend

    return MetalBackend()


register_backend("metal", _metal, preference=-1)  # emulated (the C++ shim): never a default


@dataclass
class ContextStats:
    compilations: int = 0
    """Calls of :meth:`Context.compile` (a routine with its init routine counts once)."""
    runs: int = 0
    """Routine runs, init routines included."""


class Context:
    """Buffers on one backend, and the routines compiled for them."""

    def __init__(self, backend: str | None = None, *, debug_dir: str | Path | None = None):
        """``backend`` (else the ``backend`` setting, else ``interp``) names the backend."""
        self.backend = get_backend(config.get("backend", backend, "interp"))
        self._memory: BufferOwner = getattr(self.backend, "buffers", None) or _NumpyBuffers()
        self.stats = ContextStats()
        self.debug_dir = config.get("debug_dir", None if debug_dir is None else str(debug_dir))
        self._buffers: dict[TNode, Any] = {}
        self._inputs: set[TNode] = set()
        """Nodes some routine compiled here reads as an input: later routines keep them."""
        self._inlined: dict[TNode, str] = {}
        """Node -> the routine that last computed it inline, without storing it (optimize.py)."""
        _contexts.add(self)

    @classmethod
    def auto(cls) -> Context:
        """A context on the configured backend, else the best available one, made the process
        default (:func:`default_context`)."""
        ctx = cls(config.get("backend") or best_available())
        set_default_context(ctx)
        return ctx

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def debug_dir(self) -> Path | None:
        return self._debug_dir

    @debug_dir.setter
    def debug_dir(self, path: str | Path | None) -> None:
        self._debug_dir = None if path is None else Path(path)

    # -- data -----------------------------------------------------------------------------------

    def has_value(self, tnode: TNode) -> bool:
        """Whether ``tnode`` has a buffer here: set by :meth:`set`, or used by a routine run."""
        return tnode in self._buffers

    def get(self, tnode: TNode) -> np.ndarray:
        """A copy of ``tnode``'s value, of shape ``tnode.dims`` (bfloat16 values come back as
        float32; uint4x32 values as uint32 with a trailing axis of 4). A node marked virtual that
        the last routine computing it inlined has no value: the error says how to keep it."""
        if tnode in self._inlined:
            raise SessionError(_inlined_message(tnode, self._inlined[tnode]))
        if tnode not in self._buffers:
            raise SessionError(
                f"{tnode.debug_name} has no value on this context: run a routine that computes it, or set it"
            )
        array = self._memory.to_host(self._buffers[tnode])
        if tnode.dtype is dtypes.bfloat16:
            return dtypes.bfloat16_bits_to_float32(array).copy()
        return array.copy()

    def set(self, tnode: TNode, array: Any) -> None:
        """Give ``tnode`` the value ``array`` (converted to the node's precision; its shape must
        be ``tnode.dims``, plus a trailing 4 for uint4x32)."""
        value = np.asarray(array)
        shape = _buffer_shape(tnode)
        if value.shape != shape:
            raise ShapeError(
                f"cannot set {tnode.debug_name} (dims {tnode.dims}) from an array of shape {value.shape}"
            )
        if tnode.dtype is dtypes.bfloat16:
            stored = dtypes.float32_to_bfloat16_bits(value.astype(np.float32))
        else:
            stored = value.astype(tnode.dtype.storage)
        self._buffers[tnode] = self._memory.from_host(np.ascontiguousarray(stored).copy())
        self._inlined.pop(tnode, None)

    def _buffer(self, tnode: TNode) -> Any:
        if tnode not in self._buffers:
            self._buffers[tnode] = self._memory.zeros(_buffer_shape(tnode), tnode.dtype.storage)
        return self._buffers[tnode]

    # -- compilation ----------------------------------------------------------------------------

    def compile(self, *items: Computation | Any) -> Routine:
        """One routine running ``items`` in order: :class:`Computation` objects, or objects with
        a ``to_computation()`` method (tensors, compiled as their forward code). First runs the
        ``inits`` of nodes without a value here."""
        if not items:
            raise OcannlError("Context.compile needs at least one computation")
        computations = [item if isinstance(item, Computation) else item.to_computation() for item in items]
        name = "_then_".join(sanitize_identifier(c.name) or "routine" for c in computations)
        self._initialize(name, computations)
        body = computations[0].body if len(computations) == 1 else Block(tuple(c.body for c in computations))
        routine = self._routine(name, body)
        self.stats.compilations += 1
        return routine

    def _initialize(self, name: str, computations: list[Computation]) -> None:
        """Give the nodes of ``inits`` without a value theirs: host data first, then one init
        routine running the initialization code in order."""
        pending: dict[TNode, Init] = {}
        for c in computations:
            for node, init in c.inits:
                if not self.has_value(node):
                    pending.setdefault(node, init)
        code = []
        for node, init in pending.items():
            if isinstance(init, ASSIGNMENT_TYPES):
                code.append(init)
            else:
                self.set(node, init)
        if code:
            self._routine(f"{name}_init", Block(tuple(code))).run()

    def _routine(self, name: str, body: Assignment) -> Routine:
        unoptimized = lower_routine(name, body)
        names = [s.name for s in unoptimized.static_symbols]
        if len(set(names)) != len(names):
            raise IndexBindingError(
                f"routine {name} uses two different index symbols of the same name: {names}"
            )
        # Keep what the user did not mark virtual, and what routines compiled here read as input.
        inputs = routine_inputs(unoptimized)
        optimized = optimize(unoptimized, materialized_nodes(unoptimized) | self._inputs)
        self._inputs |= inputs
        if self.debug_dir is not None:
            self.debug_dir.mkdir(parents=True, exist_ok=True)
            (self.debug_dir / f"{name}.cd").write_text(format_cd(name, body))
            (self.debug_dir / f"{name}-unoptimized.ll").write_text(format_routine(unoptimized))
            (self.debug_dir / f"{name}.ll").write_text(format_routine(optimized))
        executable = self.backend.compile(optimized)
        if self.debug_dir is not None:  # generated sources, e.g. {".c": text}
            for suffix, text in getattr(executable, "debug_files", {}).items():
                (self.debug_dir / f"{name}{suffix}").write_text(text)
        routine = Routine(self, optimized, executable)
        routine._inputs, routine._inlined = inputs, inlined_nodes(unoptimized, optimized)
        return routine

    def __repr__(self) -> str:
        return f"Context({self.backend_name!r}, {len(self._buffers)} buffers)"


class Routine:
    """A compiled routine of a context. Bindings persist between runs."""

    def __init__(self, context: Context, ir: RoutineIR, executable: Executable):
        self.context = context
        self.ir = ir
        self._executable = executable
        self._symbols = {s.name: s for s in ir.static_symbols}
        self._bindings: dict[IndexSymbol, int] = {}
        self._inputs: frozenset[TNode] = frozenset()
        self._inlined: frozenset[TNode] = frozenset()
        """Nodes this routine computes inline (virtualized): they get no buffer."""
        self._nodes = tuple(dict.fromkeys(ir.reads + ir.writes))
        self._context_ref = weakref.ref(context)

    @property
    def name(self) -> str:
        return self.ir.name

    def run(self, /, **bindings: int) -> None:
        """Bind index symbols by name (a value stays bound until changed), then run. ``self`` is
        positional-only so that any name binds, ``self`` included (``run(**{"def": 3})`` for a
        name that is a Python keyword)."""
        for key, value in bindings.items():
            self._bind(key, value)
        missing = [s.name for s in self.ir.static_symbols if s not in self._bindings]
        if missing:
            raise IndexBindingError(
                f"routine {self.name} reads index symbol(s) {', '.join(missing)} that have no value: "
                f"pass them to run(), e.g. {_run_call_example(missing[0])}"
            )
        inlined = self.context._inlined
        for node in self._inputs:
            if node in inlined:
                raise SessionError(
                    f"routine {self.name} reads {node.debug_name}, but routine {inlined[node]} computed it inline "
                    f"(virtualized) without storing it: call mark_materialized on it (ocannl.lowlevel.tnode) "
                    f"before compiling {inlined[node]}"
                )
        buffers = {node: self.context._buffer(node) for node in self._nodes}
        self._executable.run(buffers, self._bindings)
        self.context.stats.runs += 1
        for node in self._inlined:
            inlined[node] = self.name
        context_ref = self._context_ref
        for node in self.ir.writes:
            inlined.pop(node, None)
            _last_writer[node.id] = context_ref

    def _bind(self, key: str, value: Any) -> None:
        symbol = self._symbols.get(key)
        if symbol is None:
            known = ", ".join(self._symbols) or "none"
            raise IndexBindingError(f"routine {self.name} has no index symbol {key!r} (it reads: {known})")
        try:
            v = operator.index(value)
        except TypeError:
            raise IndexBindingError(f"index symbol {key} must be bound to an int, got {value!r}") from None
        if v < 0 or (symbol.size is not None and v >= symbol.size):
            bound = f"[0, {symbol.size})" if symbol.size is not None else "[0, ...)"
            raise IndexBindingError(f"index symbol {key} = {v} is outside {bound}")
        self._bindings[symbol] = v

    def __repr__(self) -> str:
        return f"Routine({self.name!r})"


def _inlined_message(tnode: TNode, routine: str) -> str:
    return (
        f"{tnode.debug_name} was virtualized: routine {routine} computes it inline where it is used and never "
        f"stores it, so it has no value to read. To keep it, call mark_materialized on it "
        f"(ocannl.lowlevel.tnode) before compiling {routine}, or read it (t.numpy()) before that routine runs"
    )


def _buffer_shape(tnode: TNode) -> tuple[int, ...]:
    return tnode.dims + ((4,) if tnode.dtype is dtypes.uint4x32 else ())


_default: Context | None = None

_contexts: "weakref.WeakSet[Context]" = weakref.WeakSet()

_last_writer: dict[int, "weakref.ref[Context]"] = {}
"""Node id -> the context whose routine last wrote it (``t.numpy()`` reads from there)."""


def contexts_holding(tnode: TNode) -> list[Context]:
    """Every live context with a buffer for ``tnode`` (``t.set`` updates them all)."""
    return [ctx for ctx in list(_contexts) if ctx.has_value(tnode)]


def last_writer(tnode: TNode) -> Context | None:
    """The context whose routine last computed ``tnode``, if it is still alive."""
    ref = _last_writer.get(tnode.id)
    return ref() if ref is not None else None


def default_context() -> Context:
    """The process default context, made by :meth:`Context.auto` when there is none."""
    return _default if _default is not None else Context.auto()


def set_default_context(ctx: Context | None) -> None:
    global _default
    _default = ctx


@session.on_reset
def _forget_default_context() -> None:
    set_default_context(None)
    _last_writer.clear()


def _run_call_example(name: str) -> str:
    """How a user binds ``name``: as a keyword argument when Python allows, else through ``**``."""
    if name.isidentifier() and not keyword.iskeyword(name):
        return f"run({name}=0)"
    return f"run(**{{{name!r}: 0}})"
