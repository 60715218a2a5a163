"""The ``c`` backend: a routine's C source (emit.py), compiled into the kernel cache
(compiler.py), loaded with ctypes and called on the context's numpy arrays in place; the library
is unloaded when the executable is garbage-collected (ocannl/backends/shared_library.py).

Each run gets as many OpenMP threads as there are cores other processes leave free
(``threads.py``); they spin briefly after a parallel loop, then sleep
(``compiler.openmp_wait_settings``, unless the environment says otherwise): spinning longer would
compete with numpy's and torch's own thread pools (docs/codegen.md, "Threads"). As
with any OpenMP program, a process that forks after running a kernel must not run kernels in the
child (use the ``spawn`` start method of multiprocessing), or set ``OCANNL_C_OPENMP=0``.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
from typing import Callable, Mapping, Sequence

import numpy as np

from ocannl.backends.bindings import at_step
from ocannl.backends.c.compiler import compile_shared, openmp_wait_settings, run_once, toolchain
from ocannl.backends.c.emit import CSource, emit_c
from ocannl.backends.c.threads import adapts, free_cores
from ocannl.backends.native import buffer_address, raise_for_status
from ocannl.backends.profile import Counters
from ocannl.backends.shared_library import SharedLibrary
from ocannl.errors import BackendUnavailable, CompileError, OcannlError
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.ir import RoutineIR
from ocannl.lowlevel.tnode import TNode


class CBackend:
    """The ``c`` backend (registered in ``ocannl.backends.registry``)."""

    name = "c"
    profiles = True
    """It compiles profiling executables (ocannl/backends/profile.py)."""

    def available(self) -> tuple[bool, str]:
        try:
            tc = toolchain()
        except BackendUnavailable as e:
            return False, str(e)
        extras = ", OpenMP" if tc.openmp else ", no OpenMP"
        return True, f"{tc.description}, flags {' '.join(tc.flags)}{extras}"

    def compile(self, routine: RoutineIR, *, profile: bool = False) -> CExecutable:
        tc = toolchain()
        source = emit_c(routine, parallel=tc.openmp, vector_bytes=tc.vector_bytes, profile=profile)
        return CExecutable(routine, source, compile_shared(source.text, tc))

    def compile_init(self, routine: RoutineIR) -> Callable[[], CExecutable]:
        """An init routine (it runs once per context): its C source printed now, and compiled on
        a thread of its own (the thread only waits for the compiler's processes) at the
        optimization level of a routine run once (``compiler.run_once``); the function returned
        waits for the library, loads it, and gives the executable or raises the build's error.
        ``Context.compile`` prepares the routine it compiles for meanwhile."""
        tc = toolchain()
        source = emit_c(routine, parallel=tc.openmp, vector_bytes=tc.vector_bytes)
        library = _background().submit(compile_shared, source.text, run_once(tc))
        return lambda: CExecutable(routine, source, library.result())


class CExecutable:
    """A loaded kernel. ``run`` passes each buffer's memory (no copy) and the index symbols;
    ``source`` is the C text, also written to the context's debug directory as ``<routine>.c``."""

    stops_at_failure = True
    """A failed check returns after the routine's last check (``target.py``, ``CTarget.body``)."""

    def __init__(self, routine: RoutineIR, source: CSource, library: str):
        self.routine = routine
        self.source = source
        self.debug_files = {".c": source.text}
        openmp_wait_settings()  # read when libgomp loads
        # The only reference to the library's code: unmapped when this executable is collected.
        # Called through its packed entries (emit.py): buffers and symbols as arrays, since a
        # ctypes call takes at most 1024 arguments.
        shared = SharedLibrary(library, "the C compiler")
        self._function = shared.function(source.entry, ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p])
        self._function.argtypes = None  # called with ctypes arrays only, passed as pointers unconverted
        self._steps_function = shared.function(source.steps_entry, ctypes.c_int, [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_void_p, ctypes.c_void_p])
        self._sizes = [n.size * n.dtype.lanes for n in source.nodes]
        # A routine without a parallel region (the moons step) runs on the calling thread alone:
        # it pays nothing for the thread count.
        self._set_threads = _thread_count_setter(shared) if "#pragma omp parallel" in source.text else None
        self._prepared: Callable[[Mapping[IndexSymbol, int]], None] | None = None
        self.profiling = source.profile_entry is not None
        """A profiling build (ocannl/backends/profile.py): :meth:`take_profile` reads its counters."""
        if self.profiling:
            self._profile_function = shared.function(source.profile_entry, None, [ctypes.c_void_p])

    def take_profile(self) -> Counters:
        """A profiling build's counters since the last call (ocannl/backends/profile.py)."""
        values = (ctypes.c_double * (self.source.timers + 2))()
        self._profile_function(values)
        timers = self.source.timers
        return Counters(int(values[timers + 1]), values[timers], tuple(values[:timers]))

    def run(self, buffers: Mapping[TNode, np.ndarray], bindings: Mapping[IndexSymbol, int]) -> None:
        self.prepare(buffers)(bindings)

    def prepare(self, buffers: Mapping[TNode, np.ndarray]) -> Callable[[Mapping[IndexSymbol, int]], None]:
        """A call running the kernel on ``buffers``, checked here once: each call then only
        stores the bindings and calls C. The call holds the arrays, so their addresses stay
        valid while it lives; the same arrays next time reuse it."""
        arrays = [buffers[node] for node in self.source.nodes]
        if self._prepared is None or any(a is not b for a, b in zip(arrays, self._prepared.arrays)):
            self._prepared = self._call_on(arrays)
        return self._prepared

    def _call_on(self, arrays: list[np.ndarray]) -> Callable[[Mapping[IndexSymbol, int]], None]:
        """The prepared call, with the direct path of ``ocannl.backends.protocols.Executable``: the
        symbols' values live in one int64 array whose address the kernel gets at every call
        (the symbols the C code reads first, in its parameter order; the routine's others after
        them, stored but not read), and ``invoke`` is the ctypes call on the two arrays, bound
        here so that a run calls no Python function of ours."""
        addresses = (ctypes.c_void_p * len(arrays))(*self._check_buffers(arrays))
        order = self.source.symbols + tuple(s for s in self.routine.static_symbols if s not in self.source.symbols)
        symbols = (ctypes.c_int64 * len(order))()
        slots, function, sites = tuple(enumerate(self.source.symbols)), self._function, self.source.sites

        def call(bindings: Mapping[IndexSymbol, int]) -> None:
            # Bindings were checked by Routine.run (base.check_binding): each fits in 64 bits.
            for k, symbol in slots:
                symbols[k] = bindings[symbol]
            status = invoke()
            if status:
                raise_for_status(status, sites)

        call.arrays, call.addresses = arrays, addresses
        call.order, call.values = order, symbols
        invoke = call.invoke = self._on_free_cores(functools.partial(function, addresses, symbols))
        call.fail = functools.partial(raise_for_status, sites=sites)
        return call

    def run_many(self, buffers: Mapping[TNode, np.ndarray], symbols: Sequence[IndexSymbol], steps: np.ndarray,
                 records: Sequence[TNode]) -> list[np.ndarray]:
        """Every step in one call of the ``_steps`` entry (emit.py), which copies the recorded
        buffers after each step: the contract of ``ocannl.backends.routine.run_steps``."""
        addresses = self.prepare(buffers).addresses
        table = np.ascontiguousarray(steps[:, [symbols.index(s) for s in self.source.symbols]], np.int64)
        n, sources, sizes, outputs = len(table), [], [], []
        for node in records:
            array = buffers[node]
            sources.append(buffer_address(node, node.size * node.dtype.lanes, array, self.routine))
            sizes.append(array.nbytes)
            outputs.append(np.empty((n, *array.shape), array.dtype))
        pointers = ctypes.c_void_p * len(records)
        failed = ctypes.c_int64(-1)
        status = self._on_free_cores(self._steps_function)(
            addresses, table.ctypes.data, n, len(records), pointers(*sources),
            pointers(*(out.ctypes.data for out in outputs)), (ctypes.c_int64 * len(records))(*sizes),
            ctypes.byref(failed))
        if status:
            try:
                raise_for_status(status, self.source.sites)
            except (OcannlError, ZeroDivisionError) as e:
                raise at_step(e, failed.value) from None
        return outputs

    def _on_free_cores(self, entry: Callable[..., int]) -> Callable[..., int]:
        """``entry``, setting the OpenMP thread count to the free cores first (``threads.py``);
        ``entry`` itself where the library runs no threads or the count is fixed."""
        if self._set_threads is None:
            return entry
        (get_threads, set_threads), for_run = self._set_threads, free_cores().for_run

        def on_free_cores(*args) -> int:
            set_threads(for_run(get_threads()))
            return entry(*args)

        return on_free_cores

    def _check_buffers(self, arrays: list[np.ndarray]) -> list[int]:
        """The arrays' addresses, after checking each fits its node and none overlap."""
        args: list[int] = []
        spans = []
        for node, size, array in zip(self.source.nodes, self._sizes, arrays):
            address = buffer_address(node, size, array, self.routine)
            args.append(address)
            spans.append((address, address + array.nbytes, node))
        _check_disjoint(spans)
        return args


@functools.cache
def _background() -> concurrent.futures.ThreadPoolExecutor:
    """The thread :meth:`CBackend.compile_init` builds on, made on first use."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ocannl-cc")


def _thread_count_setter(shared: SharedLibrary) -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """OpenMP's ``omp_get_max_threads`` and ``omp_set_num_threads``, found through the library's
    dependencies, when the library was built with OpenMP and the count follows the free cores
    (``threads.adapts``)."""
    if not adapts():
        return None
    try:
        return (shared.function("omp_get_max_threads", ctypes.c_int, []),
                shared.function("omp_set_num_threads", None, [ctypes.c_int]))
    except CompileError:
        return None


def _check_disjoint(spans: list[tuple[int, int, TNode]]) -> None:
    """The kernel declares its pointers ``restrict``: two nodes must not share memory."""
    spans = sorted((s for s in spans if s[1] > s[0]), key=lambda s: s[0])
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise ValueError(f"the buffers of {a.debug_name} and {b.debug_name} overlap: give each node its own array")
