"""Contexts: buffers on one backend, and the routines compiled for them (docs/compiler.md, "The
runtime").

A :class:`Context` owns one backend (``registry.py``) and a buffer per node (a numpy array in
the node's storage dtype, zero-filled when first used, or what the backend's
:class:`~ocannl.backends.protocols.BufferOwner` holds), and compiles computations into
:class:`~ocannl.backends.routine.Routine` objects, each compiled once and run many times with
different index symbol bindings::

    ctx = Context.auto()                      # OCANNL_BACKEND, else the best available backend
    step = ctx.compile(update, sgd)           # Computations, or objects with .to_computation()
    step.run(batch_n=3)                       # bindings by index symbol name; they persist
    losses = step.run_many(batch_n=range(80), record=loss)  # 80 steps in one call
    ctx.get(w)                                # a copy of w's buffer; ctx.set(w, array)

Compiling also initializes: each computation's ``inits`` runs once per context for the nodes
that have no value on the context yet (host data is copied in; code runs in an init routine of
its own). With ``debug_dir`` set
(or ``OCANNL_DEBUG_DIR``), compiling writes ``<routine>.cd``, ``<routine>-unoptimized.ll`` and
``<routine>.ll`` there.
"""

from __future__ import annotations

import numbers
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ocannl import collector, config
from ocannl.backends.profile import report_at_exit
from ocannl.backends.protocols import BufferOwner, NumpyBuffers
from ocannl.backends.registry import best_available, get_backend
from ocannl.backends.routine import Routine, buffer_shape, inlined_message, node_of
from ocannl.backends.session_state import session_state
from ocannl.errors import IndexBindingError, OcannlError, SessionError, ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import ASSIGNMENT_TYPES, Assignment, Block, Computation, Init, format_cd
from ocannl.lowlevel.ir import format_routine
from ocannl.lowlevel.lower import lower_routine
from ocannl.lowlevel.optimize import inlined_nodes, materialized_nodes, optimize, routine_inputs
from ocannl.lowlevel.summation import block_sums
from ocannl.lowlevel.tnode import TNode, sanitize_identifier


@dataclass
class ContextStats:
    compilations: int = 0
    """Calls of :meth:`Context.compile` (a routine with its init routine counts once)."""
    runs: int = 0
    """Routine runs, init routines included."""


class Context:
    """Buffers on one backend, and the routines compiled for them.

    A context may be shared by threads: its lock makes each :meth:`Routine.run`,
    :meth:`Routine.run_many`, :meth:`get`, :meth:`set` and :meth:`compile` whole, one at a time
    (docs/semantics.md, "Threads"). A read thus sees the values of a completed run, though not
    necessarily the caller's own last one: ``run_many(..., record=t)`` returns a run's values
    with the run."""

    def __init__(self, backend: str | None = None, *, debug_dir: str | Path | None = None, **options: Any):
        """``backend`` (else the ``backend`` setting, else ``interp``) names the backend;
        ``options`` are its own (``Context("interp", interp_mode="scalar")``)."""
        self.backend = get_backend(config.get("backend", backend, "interp"), **options)
        self._memory: BufferOwner = getattr(self.backend, "buffers", None) or NumpyBuffers()
        self.stats = ContextStats()
        self.debug_dir = config.get("debug_dir", None if debug_dir is None else str(debug_dir))
        self._buffers: dict[TNode, Any] = {}
        self._inputs: set[TNode] = set()
        """Nodes some routine compiled here reads as an input: later routines keep them."""
        self._inlined: dict[TNode, str] = {}
        """Node -> the routine that last computed it inline, without storing it (optimize.py)."""
        self._lock = threading.RLock()
        """Held by each run, read, write and compile (reentrant: compiling runs init routines)."""
        session_state.contexts.add(self)

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

    def inlined(self, tnode: TNode) -> bool:
        """Whether the last routine run here that computes ``tnode`` computed it inline, leaving
        no value to read (:meth:`get` says how to keep it)."""
        return node_of(tnode) in self._inlined

    def has_value(self, tnode: TNode) -> bool:
        """Whether ``tnode`` has a buffer here: set by :meth:`set`, or used by a routine run."""
        return node_of(tnode) in self._buffers

    def get(self, tnode: TNode) -> np.ndarray:
        """A copy of ``tnode``'s value, of shape ``tnode.dims`` (bfloat16 values come back as
        float32; uint4x32 values as uint32 with a trailing axis of 4). A node marked virtual that
        the last routine computing it inlined has no value: the error says how to keep it.
        ``tnode`` may also be a tensor (its value node)."""
        tnode = node_of(tnode)
        with self._lock:
            buffer = self._buffers.get(tnode)
            if buffer is None or tnode in self._inlined:
                if tnode in self._inlined:
                    raise SessionError(inlined_message(tnode, self._inlined[tnode]))
                raise SessionError(
                    f"{tnode.debug_name} has no value on this context: run a routine that computes it, or set it"
                )
            return dtypes.from_storage(tnode.dtype, self._memory.to_host(buffer))

    def buffer(self, tnode: TNode) -> Any:
        """``tnode``'s buffer itself, not a copy: a numpy array in the node's storage dtype, or
        what the backend's :class:`BufferOwner` holds (a torch tensor on Triton). Runs of this
        context's routines write into it; :meth:`set` replaces it. For zero-copy exchange
        (``Tensor.__dlpack__``); :meth:`get` is the safe read."""
        tnode = node_of(tnode)
        if tnode in self._inlined or tnode not in self._buffers:
            self.get(tnode)  # raises the error saying why there is no value
        return self._buffers[tnode]

    def set(self, tnode: TNode, array: Any) -> None:
        """Give ``tnode`` the value ``array`` (converted to the node's precision; its shape must
        be ``tnode.dims``, plus a trailing 4 for uint4x32). Values the precision cannot hold are a
        :class:`~ocannl.lowlevel.dtypes.DTypeError`, not wrapped. ``tnode`` may also be a tensor."""
        tnode = node_of(tnode)
        value = _host_array(array, f"ctx.set({tnode.debug_name}, ...)")
        shape = buffer_shape(tnode)
        if value.shape != shape:
            raise ShapeError(
                f"cannot set {tnode.debug_name} (dims {tnode.dims}) from an array of shape {value.shape}"
            )
        stored = dtypes.to_storage(tnode.dtype, value, tnode.debug_name)
        # A copy in C order that keeps a 0-d value 0-d (np.ascontiguousarray would make it 1-d).
        buffer = self._memory.from_host(np.array(stored, order="C"))
        with self._lock:
            self._buffers[tnode] = buffer
            self._inlined.pop(tnode, None)
            session_state.advance_epoch()

    def _buffer(self, tnode: TNode) -> Any:
        if tnode not in self._buffers:
            self._buffers[tnode] = self._memory.zeros(buffer_shape(tnode), tnode.dtype.storage)
            session_state.advance_epoch()
        return self._buffers[tnode]

    # -- compilation ----------------------------------------------------------------------------

    def compile(self, *items: Computation | Any) -> Routine:
        """One routine running ``items`` in order: :class:`Computation` objects, or objects with
        a ``to_computation()`` method (tensors, compiled as their forward code). First runs the
        ``inits`` of nodes without a value here."""
        if not items:
            raise OcannlError("Context.compile needs at least one computation")
        computations = [_computation(item, k) for k, item in enumerate(items)]
        name = "_then_".join(sanitize_identifier(c.name) or "routine" for c in computations)
        with self._lock, collector.paused():
            initialize = self._initialize(name, computations)
            try:
                body = computations[0].body if len(computations) == 1 else Block(tuple(c.body for c in computations))
                routine = self._build(name, body)()
            finally:  # the nodes get their values even when the routine fails to build, as they did first
                initialize()
            self.stats.compilations += 1
        return routine

    def _initialize(self, name: str, computations: list[Computation]) -> Callable[[], None]:
        """Give the nodes of ``inits`` without a value theirs: host data now, and one init
        routine running the initialization code in order, built now and run by the function
        returned. A backend told that a routine is an init routine (``compile_init``, C) may build
        it for a short build over a fast run, and in the background while :meth:`compile`
        prepares the routine it was asked for: a routine's C compiler and the Python preparing the
        next one each take a core."""
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
        if not code:
            return lambda: None
        finish = self._build(f"{name}_init", Block(tuple(code)), init=True)
        return lambda: finish().run()

    def _build(self, name: str, body: Assignment, init: bool = False) -> Callable[[], Routine]:
        """Lowers, optimizes and compiles ``body`` as the routine ``name``; the function returned
        gives the routine. ``init``: it is an init routine, which a backend with ``compile_init``
        builds its own way, possibly still building when this returns (:meth:`_initialize`)."""
        unoptimized = lower_routine(name, body)
        names = [s.name for s in unoptimized.static_symbols]
        if len(set(names)) != len(names):
            raise IndexBindingError(
                f"routine {name} uses two different index symbols of the same name: {names}"
            )
        # Keep what the user did not mark virtual, and what routines compiled here read as input.
        inputs = routine_inputs(unoptimized)
        optimized = optimize(unoptimized, materialized_nodes(unoptimized) | self._inputs,
                             fast_math=config.flag("fast_math"))
        if not getattr(self.backend, "tree_sums", False):
            optimized = block_sums(optimized)
        self._inputs |= inputs
        if self.debug_dir is not None:
            self._write_debug(name, {".cd": format_cd(name, body), "-unoptimized.ll": format_routine(unoptimized),
                                     ".ll": format_routine(optimized)})
        profile = config.flag("profile") and getattr(self.backend, "profiles", False)
        if init and not profile and hasattr(self.backend, "compile_init"):
            executable = self.backend.compile_init(optimized)
        else:
            built = self.backend.compile(optimized, profile=True) if profile else self.backend.compile(optimized)
            if profile:
                report_at_exit(optimized, self.backend_name, built)
            executable = lambda: built  # noqa: E731
        inlined = inlined_nodes(unoptimized, optimized)

        def routine() -> Routine:
            built = executable()
            if self.debug_dir is not None:  # generated sources, e.g. {".c": text}
                self._write_debug(name, getattr(built, "debug_files", {}))
            made = Routine(self, optimized, built)
            made._inputs, made._inlined = inputs, inlined
            return made

        return routine

    def _write_debug(self, name: str, files: Mapping[str, str]) -> None:
        """``<debug_dir>/<name><suffix>`` for each of ``files``; a directory that cannot be made or
        written is an error naming the path, not an ``OSError`` from the middle of a compile."""
        path = self.debug_dir
        try:
            path.mkdir(parents=True, exist_ok=True)
            for suffix, text in files.items():
                path = self.debug_dir / f"{name}{suffix}"
                path.write_text(text, encoding="utf-8")
        except OSError as e:
            raise OcannlError(f"cannot write {path} ({e.strerror or e}), debug output of routine {name}: set "
                              f"ctx.debug_dir (or OCANNL_DEBUG_DIR) to a writable directory, or to None") from None

    def __repr__(self) -> str:
        return f"Context({self.backend_name!r}, {len(self._buffers)} buffers)"


def _computation(item: Any, position: int) -> Computation:
    """Item ``position`` of ``Context.compile``: a :class:`Computation`, or what its
    ``to_computation()`` gives (a tensor's forward code)."""
    if isinstance(item, Computation):
        return item
    if not callable(getattr(item, "to_computation", None)):
        raise SessionError(
            f"Context.compile takes tensors and computations, got {item!r} ({type(item).__name__}) as item "
            f"{position}: pass a tensor (compiled as its forward code), a train.grad_update(...) or an "
            f"oc.cd.assign(...)"
        )
    return item.to_computation()


def _host_array(array: Any, what: str) -> np.ndarray:
    """``array`` (a numpy array, nested lists, a number, an object with ``__array__``) as a
    numpy array of numbers; a tensor, whose values live on a context, or anything else numpy can
    only hold as an object is an error naming ``what`` and the fix."""
    if isinstance(array, TNode) or isinstance(getattr(array, "value", None), TNode):
        raise SessionError(f"{what} takes values (a numpy array, nested lists, a number), got a tensor: to copy "
                           f"a tensor's value, pass ctx.get(t) or t.numpy()")
    value = np.asarray(array)
    numeric = value.dtype.kind in "biuf" or (
        value.dtype.kind == "O" and all(isinstance(v, numbers.Real) for v in value.flat))
    if not numeric:
        raise SessionError(f"{what} takes numbers, got {array!r} ({type(array).__name__}), which numpy holds as "
                           f"{value.dtype}")
    return value


def default_context() -> Context:
    """The session's default context, made by :meth:`Context.auto` when there is none."""
    return session_state.default if session_state.default is not None else Context.auto()


def set_default_context(ctx: Context | None) -> None:
    session_state.default = ctx
