"""The runtime: backends, contexts and routines (docs/compiler.md, "The runtime").

A :class:`Backend` turns a :class:`~ocannl.lowlevel.ir.RoutineIR` into an executable; it sees the
loop IR and the nodes, nothing of the tensor frontend. A :class:`Context` owns one backend and a
buffer per node (a numpy array in the node's storage dtype, zero-filled when first used), and
compiles computations into :class:`Routine` objects, each compiled once and run many times with
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

import functools
import keyword
import operator
import weakref
from collections.abc import Sequence
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
from ocannl.lowlevel.summation import block_sums
from ocannl.lowlevel.tnode import TNode, sanitize_identifier


class Executable(Protocol):
    """A compiled routine: runs over the context's buffers (numpy arrays, or what the backend's
    :class:`BufferOwner` makes) with the index symbols bound.

    Two methods are optional; :class:`Routine` works without them (docs/backends.md):

    - ``prepare(buffers) -> call``: ``call(bindings)`` runs as ``run(buffers, bindings)`` does,
      with the buffers checked once, in ``prepare``; a routine keeps the call while the context's
      buffers stay the same, so each ``run()`` pays only for its bindings. The call may also
      offer a direct path, four attributes: ``order`` (every index symbol of the routine),
      ``values`` (a mutable sequence of ints, one per symbol of ``order``, where the native code
      reads the bindings), ``invoke()`` (runs on ``values`` as they stand, returning a nonzero
      failure status or a false value) and ``fail(status)`` (raises that status's error): a
      ``run()`` then stores its bindings in ``values`` and calls ``invoke``, no mapping built.
    - ``run_many(buffers, symbols, steps, records) -> outputs``: :func:`run_steps`'s contract,
      in one native call.
    """

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
    """A backend may also have ``buffers`` (a :class:`BufferOwner`; default: numpy arrays),
    ``tree_sums`` (true when it adds long float sums in its own tree order, as Triton's
    ``tl.sum``: its loop IR is not rewritten to the blocked summation order of
    ``ocannl/lowlevel/summation.py``), and
    ``emulated`` (true when it runs through an emulator, such as the Triton interpreter:
    :meth:`Context.auto` never picks it)."""

    name: str

    def available(self) -> tuple[bool, str]:
        """Whether the backend works here, and a sentence saying why (or why not)."""
        ...

    def compile(self, routine: RoutineIR) -> Executable: ...


@dataclass(frozen=True)
class _Registration:
    factory: Callable[..., Backend]
    preference: int
    options: tuple[str, ...] = ()


_registry: dict[str, _Registration] = {}


def register_backend(name: str, factory: Callable[..., Backend], *, preference: int = 0,
                     options: tuple[str, ...] = ()) -> None:
    """Make backend ``name`` selectable; :meth:`Context.auto` picks the available backend of
    highest ``preference`` (interp has 0; the built-in ones order triton > c > interp).
    ``options`` are the keyword arguments ``factory`` takes (``Context(name, option=...)``)."""
    _registry[name] = _Registration(factory, preference, options)


ENTRY_POINT_GROUP = "ocannl.backends"
_plugin_errors: dict[str, str] = {}
_plugins_loaded = False


def _load_plugins() -> None:
    """Register the backends of installed distributions, once, on first need: each entry point
    of the ``ocannl.backends`` group names a backend and a factory (a callable returning the
    backend, taking the keyword arguments listed in its ``options`` attribute, if any; its
    ``preference`` attribute, default -1, ranks it for :meth:`Context.auto`). Loading is lazy so
    that importing ocannl never imports a plugin; a plugin that fails to load is remembered and
    named when someone asks for it, and the other backends stay usable."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _registry:
            continue  # built-in names and explicit registrations win
        try:
            factory = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure makes the plugin unusable
            _plugin_errors[ep.name] = (f"plugin entry point {ep.name} = {ep.value!r} failed to load: "
                                       f"{type(exc).__name__}: {exc}")
            continue
        register_backend(ep.name, factory, preference=getattr(factory, "preference", -1),
                         options=tuple(getattr(factory, "options", ())))


def reload_plugins() -> None:
    """Look at the installed entry points again (after installing a plugin in a running process)."""
    global _plugins_loaded
    _plugins_loaded = False
    _plugin_errors.clear()
    _load_plugins()


def registered_backends() -> tuple[str, ...]:
    """Backend names, most preferred first (plugins included)."""
    _load_plugins()
    return tuple(sorted(_registry, key=lambda n: -_registry[n].preference))


def get_backend(name: str, **options: Any) -> Backend:
    """A fresh instance of backend ``name`` made with ``options``; :class:`BackendUnavailable`
    if it cannot run here."""
    if name not in _registry:
        _load_plugins()
    if name in _plugin_errors:
        raise BackendUnavailable(f"backend {name!r} is unusable: {_plugin_errors[name]}")
    if name not in _registry:
        raise BackendUnavailable(
            f"unknown backend {name!r}; known backends: {', '.join(registered_backends())}"
        )
    registration = _registry[name]
    unknown = sorted(set(options) - set(registration.options))
    if unknown:
        accepted = ", ".join(registration.options) or "none"
        raise OcannlError(f"backend {name!r} has no option {', '.join(unknown)} (its options: {accepted})")
    backend = registration.factory(**options)
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


def _interp(interp_mode: str | None = None) -> Backend:
    from ocannl.backends.interp import InterpBackend

    return InterpBackend(interp_mode)


register_backend("interp", _interp, preference=0, options=("interp_mode",))


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


_epoch = 0
"""Advanced by every change to what a full :meth:`Routine.run` checks or records: a buffer
created or replaced, a node inlined, a routine's writes recorded (:func:`last_writer`). While
it stays at the value a routine saw after its last full run, running it again would check and
record nothing new, so :meth:`Routine.run` skips straight to the executable."""


def _advance_epoch() -> None:
    global _epoch
    _epoch += 1


@dataclass
class ContextStats:
    compilations: int = 0
    """Calls of :meth:`Context.compile` (a routine with its init routine counts once)."""
    runs: int = 0
    """Routine runs, init routines included."""


class Context:
    """Buffers on one backend, and the routines compiled for them."""

    def __init__(self, backend: str | None = None, *, debug_dir: str | Path | None = None, **options: Any):
        """``backend`` (else the ``backend`` setting, else ``interp``) names the backend;
        ``options`` are its own (``Context("interp", interp_mode="scalar")``)."""
        self.backend = get_backend(config.get("backend", backend, "interp"), **options)
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
        return _node(tnode) in self._buffers

    def get(self, tnode: TNode) -> np.ndarray:
        """A copy of ``tnode``'s value, of shape ``tnode.dims`` (bfloat16 values come back as
        float32; uint4x32 values as uint32 with a trailing axis of 4). A node marked virtual that
        the last routine computing it inlined has no value: the error says how to keep it.
        ``tnode`` may also be a tensor (its value node)."""
        tnode = _node(tnode)
        buffer = self._buffers.get(tnode)
        if buffer is None or tnode in self._inlined:
            if tnode in self._inlined:
                raise SessionError(_inlined_message(tnode, self._inlined[tnode]))
            raise SessionError(
                f"{tnode.debug_name} has no value on this context: run a routine that computes it, or set it"
            )
        return dtypes.from_storage(tnode.dtype, self._memory.to_host(buffer))

    def buffer(self, tnode: TNode) -> Any:
        """``tnode``'s buffer itself, not a copy: a numpy array in the node's storage dtype, or
        what the backend's :class:`BufferOwner` holds (a torch tensor on Triton). Runs of this
        context's routines write into it; :meth:`set` replaces it. For zero-copy exchange
        (``Tensor.__dlpack__``); :meth:`get` is the safe read."""
        tnode = _node(tnode)
        if tnode in self._inlined or tnode not in self._buffers:
            self.get(tnode)  # raises the error saying why there is no value
        return self._buffers[tnode]

    def set(self, tnode: TNode, array: Any) -> None:
        """Give ``tnode`` the value ``array`` (converted to the node's precision; its shape must
        be ``tnode.dims``, plus a trailing 4 for uint4x32). Values the precision cannot hold are a
        :class:`~ocannl.lowlevel.dtypes.DTypeError`, not wrapped. ``tnode`` may also be a tensor."""
        tnode = _node(tnode)
        value = np.asarray(array)
        shape = _buffer_shape(tnode)
        if value.shape != shape:
            raise ShapeError(
                f"cannot set {tnode.debug_name} (dims {tnode.dims}) from an array of shape {value.shape}"
            )
        stored = dtypes.to_storage(tnode.dtype, value, tnode.debug_name)
        # A copy in C order that keeps a 0-d value 0-d (np.ascontiguousarray would make it 1-d).
        self._buffers[tnode] = self._memory.from_host(np.array(stored, order="C"))
        self._inlined.pop(tnode, None)
        _advance_epoch()

    def _buffer(self, tnode: TNode) -> Any:
        if tnode not in self._buffers:
            self._buffers[tnode] = self._memory.zeros(_buffer_shape(tnode), tnode.dtype.storage)
            _advance_epoch()
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
        if not getattr(self.backend, "tree_sums", False):
            optimized = block_sums(optimized)
        self._inputs |= inputs
        if self.debug_dir is not None:
            self._write_debug(name, {".cd": format_cd(name, body), "-unoptimized.ll": format_routine(unoptimized),
                                     ".ll": format_routine(optimized)})
        executable = self.backend.compile(optimized)
        if self.debug_dir is not None:  # generated sources, e.g. {".c": text}
            self._write_debug(name, getattr(executable, "debug_files", {}))
        routine = Routine(self, optimized, executable)
        routine._inputs, routine._inlined = inputs, inlined_nodes(unoptimized, optimized)
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


class Routine:
    """A compiled routine of a context. Bindings persist between runs."""

    def __init__(self, context: Context, ir: RoutineIR, executable: Executable):
        self.context = context
        self._stats = context.stats
        self.ir = ir
        self._executable = executable
        self._symbols = {s.name: (s, binding_limit(s), k) for k, s in enumerate(ir.static_symbols)}
        """Name -> the symbol, the bound of its values and its position in ``_slots``."""
        self._bindings: dict[IndexSymbol, int] = {}
        self._slots: Any = [0] * len(ir.static_symbols)
        """The bound values again, where the prepared call reads them when it has a direct path
        (see :class:`Executable`); else a list nothing reads."""
        self._invoke: Callable[[], int | None] | None = None
        """The executable bound to ``_buffers`` and the current bindings (made by
        :meth:`_prepare`); a nonzero result is a failure status, raised by ``_fail``."""
        self._fail: Callable[[int], None] | None = None
        self._inputs: frozenset[TNode] = frozenset()
        self._inlined: frozenset[TNode] = frozenset()
        """Nodes this routine computes inline (virtualized): they get no buffer."""
        self._nodes = tuple(dict.fromkeys(ir.reads + ir.writes))
        self._context_ref = weakref.ref(context)
        self._buffers: dict[TNode, Any] = {}
        self._epoch = -1
        """The module's ``_epoch`` after this routine's last full run."""

    @property
    def name(self) -> str:
        return self.ir.name

    def run(self, /, **bindings: int) -> None:
        """Bind index symbols by name (a value stays bound until changed), then run. ``self`` is
        positional-only so that any name binds, ``self`` included (``run(**{"def": 3})`` for a
        name that is a Python keyword).

        A run repeating the last one but for its bindings (nothing set, created or inlined on
        any context since) goes straight to the executable: its checks passed last time and its
        records would not change (see ``_epoch``). Each binding is also stored where the native
        code reads it (``_slots``), so that run costs one call."""
        symbols, values, slots = self._symbols, self._bindings, self._slots
        for key, value in bindings.items():
            entry = symbols.get(key)
            if entry is not None and type(value) is int and 0 <= value < entry[1]:  # _bind's common case
                values[entry[0]] = slots[entry[2]] = value
            else:
                self._bind(key, value)
        if self._epoch == _epoch:
            status = self._invoke()
            if status:
                self._fail(status)
            self._stats.runs += 1
            return
        self._prepare()
        status = self._invoke()
        if status:
            self._fail(status)
        self._finish(1)

    def run_many(self, /, record: Any = None, **bindings: Sequence[int]) -> np.ndarray | list[np.ndarray] | None:
        """Run ``n`` steps in one call: each binding is a sequence of ``n`` ints, step ``i``
        binding the ``i``-th values (symbols not given keep their bound value); the results are
        those of ``n`` calls of :meth:`run`, bit for bit, and the last step's values stay bound.
        ``record``: a tensor (or a list of them) read after every step; returns an array of
        shape ``(n, *t.dims)`` (or a list of them, in order), as :meth:`Context.get` reads it;
        ``None`` without ``record``. The C backend runs the steps in one C call, the others
        loop over their run; an empty sequence runs nothing. Every value is checked before the
        first step; one out of range is refused naming its symbol and step, and a step that
        fails raises its error naming the step, after the steps before it. A symbol named
        ``record`` can be bound only through :meth:`run`."""
        single = record is not None and not isinstance(record, (list, tuple))
        records = () if record is None else tuple(self._recorded(r) for r in ([record] if single else record))
        steps = self._steps(bindings)
        n = len(steps)
        if n:
            symbols = self.ir.static_symbols
            if self._epoch != _epoch:
                self._bindings.update(zip(symbols, steps[0].tolist()))  # as run() binds before its checks
                self._prepare()
            native = getattr(self._executable, "run_many", None)
            try:
                if native is not None:
                    outputs = native(self._buffers, symbols, steps, records)
                else:
                    outputs = run_steps(self._executable, self._buffers, symbols, steps, records,
                                        self.context._memory.to_host)
            except (OcannlError, ZeroDivisionError) as e:
                failed = getattr(e, "step", None)
                if failed is not None:  # steps before it ran, as n calls of run() would have
                    self._bindings.update(zip(symbols, steps[failed].tolist()))
                    self._sync_slots()
                    if failed:
                        self._finish(failed)
                raise
            self._bindings.update(zip(symbols, steps[-1].tolist()))
            self._sync_slots()
            self._finish(n)
        else:
            outputs = [np.empty((0, *_buffer_shape(node)), node.dtype.storage) for node in records]
        values = [dtypes.from_storage(node.dtype, out) for node, out in zip(records, outputs)]
        return None if record is None else values[0] if single else values

    def _prepare(self) -> None:
        """The checks of a full run, then the buffers and the executable bound to them."""
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
                    f"(virtualized) without storing it. {_how_to_keep(node, inlined[node])}"
                )
        self._buffers = {node: self.context._buffer(node) for node in self._nodes}
        prepare = getattr(self._executable, "prepare", None)
        call = (prepare(self._buffers) if prepare is not None
                else functools.partial(self._executable.run, self._buffers))
        order = getattr(call, "order", None)
        if order is None:
            self._invoke, self._fail = functools.partial(call, self._bindings), None
            return
        if call.values is not self._slots:
            position = {symbol: k for k, symbol in enumerate(order)}
            self._symbols = {key: (s, limit, position[s]) for key, (s, limit, _) in self._symbols.items()}
            self._slots, self._invoke, self._fail = call.values, call.invoke, call.fail
        self._sync_slots()

    def _sync_slots(self) -> None:
        """Store every bound value in ``_slots`` (after bindings changed other than by ``run``)."""
        slots, values = self._slots, self._bindings
        for symbol, _, k in self._symbols.values():
            if symbol in values:
                slots[k] = values[symbol]

    def _finish(self, runs: int) -> None:
        """Record ``runs`` completed runs: what they computed inline, and what they wrote. The
        epoch advances only if that changed the records, so routines run in alternation (a
        training step, then an evaluation) keep their fast paths."""
        self._stats.runs += runs
        if self._epoch == _epoch:  # recorded by the last full run, and nothing changed since
            return
        inlined, context = self.context._inlined, self.context
        changed = False
        for node in self._inlined:
            if inlined.get(node) != self.name:
                inlined[node] = self.name
                changed = True
        for node in self.ir.writes:
            if inlined.pop(node, None) is not None:
                changed = True
            writer = _last_writer.get(node.id)
            if writer is None or writer() is not context:
                _last_writer[node.id] = self._context_ref
                changed = True
        if changed:
            _advance_epoch()
        self._epoch = _epoch

    def _symbol(self, key: str) -> tuple[IndexSymbol, int, int]:
        """The symbol named ``key``, its bound (:func:`binding_limit`) and its slot."""
        entry = self._symbols.get(key)
        if entry is None:
            known = ", ".join(self._symbols) or "none"
            raise IndexBindingError(f"routine {self.name} has no index symbol {key!r} (it reads: {known})")
        return entry

    def _bind(self, key: str, value: Any) -> None:
        symbol, _, k = self._symbol(key)
        self._bindings[symbol] = self._slots[k] = check_binding(symbol, value, self.name)

    def _steps(self, bindings: Mapping[str, Any]) -> np.ndarray:
        """The ``(n, len(static_symbols))`` int64 table of ``run_many``'s steps, every value checked."""
        columns: dict[IndexSymbol, np.ndarray] = {}
        for key, values in bindings.items():
            symbol = self._symbol(key)[0]
            columns[symbol] = step_bindings(symbol, values, self.name)
        lengths = {len(c) for c in columns.values()}
        if len(lengths) > 1:
            given = ", ".join(f"{s.name} has {len(c)}" for s, c in columns.items())
            raise IndexBindingError(f"routine {self.name}: run_many needs one value per step for every symbol, "
                                    f"all sequences of one length; {given}")
        if not columns:
            if not self._symbols:
                raise IndexBindingError(f"routine {self.name} reads no index symbol, so run_many has no sequence to "
                                        f"take its number of steps from: call run() once per step")
            raise IndexBindingError(
                f"routine {self.name}: run_many takes the number of steps from its bindings, a sequence per index "
                f"symbol, and got none: e.g. run_many({next(iter(self._symbols))}=range(10))"
            )
        n = lengths.pop()
        symbols = self.ir.static_symbols
        if n:
            missing = [s.name for s in symbols if s not in columns and s not in self._bindings]
            if missing:
                raise IndexBindingError(
                    f"routine {self.name} reads index symbol(s) {', '.join(missing)} that have no value: pass a "
                    f"sequence to run_many(), or bind a value with run()"
                )
        steps = np.empty((n, len(symbols)), np.int64)
        for k, symbol in enumerate(symbols):
            steps[:, k] = columns[symbol] if symbol in columns else self._bindings.get(symbol, 0)
        return steps

    def _recorded(self, item: Any) -> TNode:
        """The node ``record=`` names, checked to hold a value after every step."""
        node = _node(item)
        if node in self._inlined:
            raise SessionError(_inlined_message(node, self.name))
        if node not in self._nodes:
            raise SessionError(
                f"routine {self.name} neither reads nor writes {node.debug_name}, so run_many cannot record it: "
                f"record tensors the routine computes (read any other with ctx.get)"
            )
        return node

    def __repr__(self) -> str:
        return f"Routine({self.name!r})"


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


def run_steps(executable: Executable, buffers: Mapping[TNode, Any], symbols: Sequence[IndexSymbol],
              steps: np.ndarray, records: Sequence[TNode], to_host: Callable[[Any], np.ndarray]) -> list[np.ndarray]:
    """``run_many`` for an executable without a native one: ``executable.run`` once per row of
    ``steps`` (an ``(n, len(symbols))`` int64 array, row ``i`` binding step ``i``'s values, all
    checked). Returns, per node of ``records``, an array ``(n, *buffer shape)`` in the node's
    storage dtype holding its buffer after each step (read through ``to_host``, the context's
    :class:`BufferOwner`). An error at step ``i`` is raised through :func:`at_step`."""
    outputs = [np.empty((len(steps), *_buffer_shape(node)), node.dtype.storage) for node in records]
    for step, row in enumerate(steps.tolist()):
        try:
            executable.run(buffers, dict(zip(symbols, row)))
        except (OcannlError, ZeroDivisionError) as e:
            raise at_step(e, step) from None
        for output, node in zip(outputs, records):
            output[step] = np.asarray(to_host(buffers[node])).reshape(output.shape[1:])
    return outputs


def _node(x: Any) -> TNode:
    """The node ``x`` names: a :class:`TNode`, or a tensor's value node (found by duck typing:
    the backends never import the frontend)."""
    if isinstance(x, TNode):
        return x
    value = getattr(x, "value", None)
    if isinstance(value, TNode):
        return value
    raise TypeError(f"expected a tensor or a tensor node, got {type(x).__name__}")


def _inlined_message(tnode: TNode, routine: str) -> str:
    return (
        f"{tnode.debug_name} was virtualized: routine {routine} computes it inline where it is used and never "
        f"stores it, so it has no value to read. {_how_to_keep(tnode, routine)}; or read it with t.numpy(), "
        f"which recomputes it from the current parameters, given the index symbols it reads as keywords "
        f"(e.g. t.numpy(batch_n=3))"
    )


def _how_to_keep(tnode: TNode, routine: str) -> str:
    """The fix, in the tensor API's words: nodes are what the user's tensors hold."""
    return f"To keep it, call t.materialize() on its tensor t (labelled {tnode.label!r}) before compiling {routine}"


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
    _advance_epoch()


def _run_call_example(name: str) -> str:
    """How a user binds ``name``: as a keyword argument when Python allows, else through ``**``."""
    if name.isidentifier() and not keyword.iskeyword(name):
        return f"run({name}=0)"
    return f"run(**{{{name!r}: 0}})"
