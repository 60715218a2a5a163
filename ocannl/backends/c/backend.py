"""The ``c`` backend: a routine's C source (emit.py), compiled into the kernel cache
(compiler.py), loaded with ctypes and called on the context's numpy arrays in place; the library
is unloaded when the executable is garbage-collected (ocannl/backends/shared_library.py).

OpenMP threads sleep between parallel loops (``OMP_WAIT_POLICY=PASSIVE`` unless the environment
says otherwise): spinning threads would compete with numpy's and torch's own thread pools. As
with any OpenMP program, a process that forks after running a kernel must not run kernels in the
child (use the ``spawn`` start method of multiprocessing), or set ``OCANNL_C_OPENMP=0``.
"""

from __future__ import annotations

import ctypes
import os
from typing import Mapping

import numpy as np

from ocannl.backends.c.compiler import compile_shared, toolchain
from ocannl.backends.c.emit import CSource, emit_c
from ocannl.backends.native import buffer_address, raise_for_status
from ocannl.backends.shared_library import SharedLibrary
from ocannl.errors import BackendUnavailable
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.ir import RoutineIR
from ocannl.lowlevel.tnode import TNode


class CBackend:
    """The ``c`` backend (registered in ``ocannl.backends.base``)."""

    name = "c"

    def available(self) -> tuple[bool, str]:
        try:
            tc = toolchain()
        except BackendUnavailable as e:
            return False, str(e)
        extras = ", OpenMP" if tc.openmp else ", no OpenMP"
        return True, f"{tc.description}, flags {' '.join(tc.flags)}{extras}"

    def compile(self, routine: RoutineIR) -> CExecutable:
        tc = toolchain()
        source = emit_c(routine, parallel=tc.openmp)
        return CExecutable(routine, source, compile_shared(source.text, tc))


class CExecutable:
    """A loaded kernel. ``run`` passes each buffer's memory (no copy) and the index symbols;
    ``source`` is the C text, also written to the context's debug directory as ``<routine>.c``."""

    def __init__(self, routine: RoutineIR, source: CSource, library: str):
        self.routine = routine
        self.source = source
        self.debug_files = {".c": source.text}
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when libgomp loads
        # The only reference to the library's code: unmapped when this executable is collected.
        # Called through its packed entry (emit.py): buffers and symbols as two arrays, since a
        # ctypes call takes at most 1024 arguments.
        self._function = SharedLibrary(library, "the C compiler").function(
            source.entry, ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p])
        self._sizes = [n.size * n.dtype.lanes for n in source.nodes]
        self._checked: list[np.ndarray] | None = None
        self._addresses = (ctypes.c_void_p * len(source.nodes))()
        self._symbols = (ctypes.c_int64 * len(source.symbols))()

    def run(self, buffers: Mapping[TNode, np.ndarray], bindings: Mapping[IndexSymbol, int]) -> None:
        arrays = [buffers[node] for node in self.source.nodes]
        if self._checked is None or any(a is not b for a, b in zip(arrays, self._checked)):
            self._addresses[:] = self._check_buffers(arrays)
            self._checked = arrays  # the same arrays next run: their addresses stay valid
        # Bindings were checked by Routine.run (base.check_binding): each fits in 64 bits.
        self._symbols[:] = [bindings[symbol] for symbol in self.source.symbols]
        status = self._function(self._addresses, self._symbols)
        raise_for_status(status, self.source.sites)

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


def _check_disjoint(spans: list[tuple[int, int, TNode]]) -> None:
    """The kernel declares its pointers ``restrict``: two nodes must not share memory."""
    spans = sorted((s for s in spans if s[1] > s[0]), key=lambda s: s[0])
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise ValueError(f"the buffers of {a.debug_name} and {b.debug_name} overlap: give each node its own array")
