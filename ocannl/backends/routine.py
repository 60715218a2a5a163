"""Routines: a context's compiled computations, each run many times (docs/compiler.md, "The
runtime"). A run binds index symbols (``bindings.py``), prepares the context's buffers and the
executable once while nothing changes (the fast path of :meth:`Routine.run`, kept by the epoch of
``session_state.py``), and undoes the writes of a run that fails a check (docs/semantics.md,
"Failed runs")."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from ocannl.backends.bindings import at_step, binding_limit, check_binding, run_call_example, step_bindings
from ocannl.backends.profile import Profile, profile_of
from ocannl.backends.protocols import Executable
from ocannl.backends.session_state import session_state
from ocannl.errors import IndexBindingError, OcannlError, SessionError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import writes_before_failure
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.ir import RoutineIR
from ocannl.lowlevel.tnode import TNode

if TYPE_CHECKING:
    from ocannl.backends.context import Context


class Routine:
    """A compiled routine of a context. Bindings persist between runs.

    A run that fails a check (an ``OutOfBoundsError``, an integer division by zero) leaves
    every buffer as it was before it, on every backend: a routine that can fail a check copies
    the buffers a failed run may have written
    (:func:`~ocannl.lowlevel.analysis.writes_before_failure`) before each run, and copies them
    back when the run fails (docs/semantics.md, "Failed runs"); a routine that cannot fail pays
    nothing."""

    def __init__(self, context: Context, ir: RoutineIR, executable: Executable):
        self.context = context
        self._stats = context.stats
        self.ir = ir
        self._executable = executable
        self._profiling: Executable | None = None
        """The profiling build of the routine (:meth:`profile`), once made."""
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
        self._guarded = writes_before_failure(ir.body, getattr(executable, "stops_at_failure", False))
        """The buffers a failed run restores (none when no run can fail)."""
        self._lock = context._lock
        self._context_ref = weakref.ref(context)
        self._buffers: dict[TNode, Any] = {}
        self._epoch = -1
        """``session_state.epoch`` after this routine's last full run."""

    @property
    def name(self) -> str:
        return self.ir.name

    def run(self, /, **bindings: int) -> None:
        """Bind index symbols by name (a value stays bound until changed), then run. ``self`` is
        positional-only so that any name binds, ``self`` included (``run(**{"def": 3})`` for a
        name that is a Python keyword).

        A run repeating the last one but for its bindings (nothing set, created or inlined on
        any context since) goes straight to the executable: its checks passed last time and its
        records would not change (see ``SessionState.epoch``). Each binding is also stored where the native
        code reads it (``_slots``), so that run costs one call. The context's lock is held
        throughout: binding, running and recording are one step for other threads."""
        with self._lock:
            symbols, values, slots = self._symbols, self._bindings, self._slots
            for key, value in bindings.items():
                entry = symbols.get(key)
                if entry is not None and type(value) is int and 0 <= value < entry[1]:  # _bind's common case
                    values[entry[0]] = slots[entry[2]] = value
                else:
                    self._bind(key, value)
            if self._epoch == session_state.epoch:
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

    def profile(self, runs: int = 10, /, **bindings: int) -> Profile:
        """Run the routine ``runs`` times (binding ``bindings`` as :meth:`run` does; the runs take
        effect) on a build that times each of its loop nests, and return the
        :class:`~ocannl.backends.profile.Profile`: per nest, its share of the time, FLOPs and
        bytes, GFLOP/s and GB/s (``print(routine.profile(10))``; README, "Profiling"). The
        profiling build is compiled on first use and kept."""
        if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
            raise OcannlError(f"routine {self.name}: profile takes a number of runs >= 1, got {runs!r}")
        backend = self.context.backend
        if not getattr(backend, "profiles", False):
            raise OcannlError(f"the {self.context.backend_name} backend cannot time the loop nests of routine "
                              f"{self.name}: profile it on a context of the c backend (oc.Context('c'))")
        if self._profiling is None:
            self._profiling = (self._executable if getattr(self._executable, "profiling", False)
                               else backend.compile(self.ir, profile=True))
        plain, self._executable, self._epoch = self._executable, self._profiling, -1  # -1: prepare it anew
        try:
            self._profiling.take_profile()  # count these runs only
            for _ in range(runs):
                self.run(**bindings)
        finally:
            self._executable, self._epoch = plain, -1
        return profile_of(self.ir, self.context.backend_name, self._profiling.take_profile())

    def run_many(self, /, record: Any = None, **bindings: Sequence[int]) -> np.ndarray | list[np.ndarray] | None:
        """Run ``n`` steps in one call: each binding is a sequence of ``n`` ints, step ``i``
        binding the ``i``-th values (symbols not given keep their bound value); the results are
        those of ``n`` calls of :meth:`run`, bit for bit, and the last step's values stay bound.
        ``record``: a tensor (or a list of them) read after every step; returns an array of
        shape ``(n, *t.dims)`` (or a list of them, in order), as :meth:`Context.get` reads it;
        ``None`` without ``record``. The C backend runs the steps in one C call, the others
        loop over their run; an empty sequence runs nothing. Every value is checked before the
        first step; one out of range is refused naming its symbol and step, and a step that
        fails raises its error naming the step, after the steps before it, its own changes
        undone as :meth:`run` undoes them. A symbol named ``record`` can be bound only through
        :meth:`run`. The context's lock is held throughout."""
        with self._lock:
            single = record is not None and not isinstance(record, (list, tuple))
            records = () if record is None else tuple(self._recorded(r) for r in ([record] if single else record))
            steps = self._steps(bindings)
            n = len(steps)
            if n:
                symbols = self.ir.static_symbols
                if self._epoch != session_state.epoch:
                    self._bindings.update(zip(symbols, steps[0].tolist()))  # as run() binds before its checks
                    self._prepare()
                snapshots = self._snapshot()
                try:
                    outputs = self._run_steps(steps, records)
                except (OcannlError, ZeroDivisionError) as e:
                    failed = getattr(e, "step", None)
                    if failed is not None:  # steps before it ran, as n calls of run() would have
                        if self._guarded:  # undo the failed step's changes: restore, run the others again
                            self._restore(snapshots)
                            if failed:
                                self._run_steps(steps[:failed], ())
                        self._bindings.update(zip(symbols, steps[failed].tolist()))
                        self._sync_slots()
                        if failed:
                            self._finish(failed)
                    raise
                self._bindings.update(zip(symbols, steps[-1].tolist()))
                self._sync_slots()
                self._finish(n)
            else:
                outputs = [np.empty((0, *buffer_shape(node)), node.dtype.storage) for node in records]
        values = [dtypes.from_storage(node.dtype, out) for node, out in zip(records, outputs)]
        return None if record is None else values[0] if single else values

    def _run_steps(self, steps: np.ndarray, records: Sequence[TNode]) -> list[np.ndarray]:
        """The executable's ``run_many`` on ``steps``, or :func:`run_steps` where it has none."""
        symbols, native = self.ir.static_symbols, getattr(self._executable, "run_many", None)
        if native is not None:
            return native(self._buffers, symbols, steps, records)
        return run_steps(self._executable, self._buffers, symbols, steps, records, self.context._memory.to_host)

    def _snapshot(self) -> list[Any]:
        """Copies of the buffers a failed run restores (none if the routine cannot fail)."""
        memory = self.context._memory
        return [memory.snapshot(self._buffers[node]) for node in self._guarded]

    def _restore(self, snapshots: list[Any]) -> None:
        memory = self.context._memory
        for node, snapshot in zip(self._guarded, snapshots):
            memory.restore(self._buffers[node], snapshot)

    def _guard(self, invoke: Callable[[], int | None]) -> Callable[[], int | None]:
        """``invoke``, made to leave the buffers as they were when the run fails (an error raised,
        a failure status returned, or one reported lazily, which is read at once), for a routine
        that can fail; ``invoke`` itself for the others."""
        if not self._guarded:
            return invoke
        check_errors = getattr(self.context._memory, "check_errors", None)

        def guarded() -> int | None:
            snapshots = self._snapshot()
            try:
                status = invoke()
                if not status and check_errors is not None:
                    check_errors()
            except Exception:
                self._restore(snapshots)
                raise
            if status:
                self._restore(snapshots)
            return status

        return guarded

    def _prepare(self) -> None:
        """The checks of a full run, then the buffers and the executable bound to them."""
        missing = [s.name for s in self.ir.static_symbols if s not in self._bindings]
        if missing:
            raise IndexBindingError(
                f"routine {self.name} reads index symbol(s) {', '.join(missing)} that have no value: "
                f"pass them to run(), e.g. {run_call_example(missing[0])}"
            )
        inlined = self.context._inlined
        for node in self._inputs:
            if node in inlined:
                raise SessionError(
                    f"routine {self.name} reads {node.debug_name}, but routine {inlined[node]} computed it inline "
                    f"(virtualized) without storing it. {how_to_keep(node, inlined[node])}"
                )
        self._buffers = {node: self.context._buffer(node) for node in self._nodes}
        prepare = getattr(self._executable, "prepare", None)
        call = (prepare(self._buffers) if prepare is not None
                else functools.partial(self._executable.run, self._buffers))
        order = getattr(call, "order", None)
        if order is None:
            self._invoke, self._fail = self._guard(functools.partial(call, self._bindings)), None
            return
        if call.values is not self._slots:
            position = {symbol: k for k, symbol in enumerate(order)}
            self._symbols = {key: (s, limit, position[s]) for key, (s, limit, _) in self._symbols.items()}
            self._slots, self._invoke, self._fail = call.values, self._guard(call.invoke), call.fail
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
        if self._epoch == session_state.epoch:  # recorded by the last full run, and nothing changed since
            return
        inlined = self.context._inlined
        changed = False
        for node in self._inlined:
            if inlined.get(node) != self.name:
                inlined[node] = self.name
                changed = True
        for node in self.ir.writes:
            if inlined.pop(node, None) is not None:
                changed = True
            if session_state.record_writer(node, self._context_ref):
                changed = True
        if changed:
            session_state.advance_epoch()
        self._epoch = session_state.epoch

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
        node = node_of(item)
        if node in self._inlined:
            raise SessionError(inlined_message(node, self.name))
        if node not in self._nodes:
            raise SessionError(
                f"routine {self.name} neither reads nor writes {node.debug_name}, so run_many cannot record it: "
                f"record tensors the routine computes (read any other with ctx.get)"
            )
        return node

    def __repr__(self) -> str:
        return f"Routine({self.name!r})"


def run_steps(executable: Executable, buffers: Mapping[TNode, Any], symbols: Sequence[IndexSymbol],
              steps: np.ndarray, records: Sequence[TNode], to_host: Callable[[Any], np.ndarray]) -> list[np.ndarray]:
    """``run_many`` for an executable without a native one: ``executable.run`` once per row of
    ``steps`` (an ``(n, len(symbols))`` int64 array, row ``i`` binding step ``i``'s values, all
    checked). Returns, per node of ``records``, an array ``(n, *buffer shape)`` in the node's
    storage dtype holding its buffer after each step (read through ``to_host``, the context's
    :class:`BufferOwner`). An error at step ``i`` is raised through :func:`at_step`."""
    outputs = [np.empty((len(steps), *buffer_shape(node)), node.dtype.storage) for node in records]
    for step, row in enumerate(steps.tolist()):
        try:
            executable.run(buffers, dict(zip(symbols, row)))
        except (OcannlError, ZeroDivisionError) as e:
            raise at_step(e, step) from None
        for output, node in zip(outputs, records):
            output[step] = np.asarray(to_host(buffers[node])).reshape(output.shape[1:])
    return outputs


def node_of(x: Any) -> TNode:
    """The node ``x`` names: a :class:`TNode`, or a tensor's value node (found by duck typing:
    the backends never import the frontend)."""
    if isinstance(x, TNode):
        return x
    value = getattr(x, "value", None)
    if isinstance(value, TNode):
        return value
    raise TypeError(f"expected a tensor or a tensor node, got {type(x).__name__}")


def inlined_message(tnode: TNode, routine: str) -> str:
    what = (f"{tnode.debug_name} was virtualized: routine {routine} computes it inline where it is used and never "
            f"stores it, so it has no value to read. {how_to_keep(tnode, routine)}")
    if tnode.grad_of is not None:  # a gradient is not recomputed on its own
        return what
    return (f"{what}; or read it with t.numpy(), which recomputes it from the current parameters, given the "
            f"index symbols it reads as keywords (e.g. t.numpy(batch_n=3))")


def how_to_keep(tnode: TNode, routine: str) -> str:
    """The fix, in the tensor API's words: nodes are what the user's tensors hold."""
    keep, tensor = ("t.retain_grad()", tnode.grad_of) if tnode.grad_of is not None else ("t.materialize()", tnode)
    return f"To keep it, call {keep} on its tensor t (labelled {tensor.label!r}) before compiling {routine}"


def buffer_shape(tnode: TNode) -> tuple[int, ...]:
    return tnode.dims + ((4,) if tnode.dtype is dtypes.uint4x32 else ())
