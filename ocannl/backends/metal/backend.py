"""The ``metal`` backend: the routine's MSL (emit.py) run on the CPU through the C++ shim
(harness.py), on the context's numpy buffers in place.

There is no Metal runtime here, only the shim, so the backend is *emulated*: ``Context("metal")``
and ``OCANNL_BACKEND=metal`` use it, ``Context.auto()`` never picks it. Settings:
``metal_sanitize`` (``OCANNL_METAL_SANITIZE=address,undefined`` or ``thread``: every routine runs
as a sanitizer executable, see harness.py), ``metal_threads`` (threads per threadgroup, default
256), ``metal_tree_min`` (terms per cell from which a reduction is a threadgroup tree, default
256), ``metal_cxx`` (the compiler).
"""

from __future__ import annotations

import ctypes
from typing import Mapping

import numpy as np

from ocannl import config
from ocannl.backends.metal import harness
from ocannl.backends.native import buffer_address, raise_for_status
from ocannl.backends.metal.emit import MetalProgram, Options, emit_metal
from ocannl.errors import BackendUnavailable, OcannlError
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.ir import RoutineIR
from ocannl.lowlevel.tnode import TNode


def options() -> Options:
    """The emitter options from the settings: each a count, so a positive integer."""
    values = {}
    for setting, field_name in (("metal_threads", "threads_per_threadgroup"), ("metal_tree_min", "tree_min_reduction")):
        value = config.get(setting)
        if value:
            try:
                count = int(value)
            except ValueError:
                count = 0
            if count < 1:
                raise OcannlError(f"setting {setting} ({config.origin(setting)}) must be a positive integer, "
                                  f"got {value!r}: unset it for its default ({getattr(Options, field_name)})")
            values[field_name] = count
    return Options(**values)


class MetalBackend:
    """The ``metal`` backend (registered in ``ocannl.backends.registry``)."""

    name = "metal"
    emulated = True
    """MSL kernels run through the C++ shim on the CPU: never picked by ``Context.auto()``."""
    unsupported_dtypes = frozenset({"float64"})
    """Precisions Metal lacks (MSL has no double): a routine using one is a ``DTypeError``."""

    def available(self) -> tuple[bool, str]:
        try:
            tc = harness.toolchain(harness.sanitize_setting())
        except (BackendUnavailable, OcannlError) as e:
            return False, str(e)
        mode = f", under {tc.sanitize} sanitizers" if tc.sanitize else ""
        return True, f"MSL run on the CPU through the C++20 shim ({tc.description}{mode}); never picked by Context.auto()"

    def compile(self, routine: RoutineIR) -> MetalExecutable:
        tc = harness.toolchain(harness.sanitize_setting())
        program = emit_metal(routine, options())
        return MetalExecutable(routine, program, harness.load(program, tc))


class MetalExecutable:
    """A loaded routine. ``run`` passes each buffer's memory and the index symbols; ``program``
    is the MSL and its launch plan, written to the debug directory as ``<routine>.metal``."""

    def __init__(self, routine: RoutineIR, program: MetalProgram, runner):
        self.routine = routine
        self.program = program
        self.debug_files = {".metal": program.text}
        self._runner = runner
        self._sizes = [n.size * n.dtype.lanes for n in program.nodes]
        self._checked: list[np.ndarray] | None = None
        self._addresses = (ctypes.c_void_p * max(1, len(program.nodes)))()

    def run(self, buffers: Mapping[TNode, np.ndarray], bindings: Mapping[IndexSymbol, int]) -> None:
        arrays = [buffers[node] for node in self.program.nodes]
        if self._checked is None or any(a is not b for a, b in zip(arrays, self._checked)):
            self._check_buffers(arrays)
            self._checked = arrays
        # Checked by Routine.run (base.check_binding): each fits in 64 bits.
        symbols = np.array([bindings[s] for s in self.program.symbols], np.int64)
        status = self._runner(self._addresses, symbols, arrays)
        raise_for_status(status, self.program.sites)

    def _check_buffers(self, arrays: list[np.ndarray]) -> None:
        for k, (node, size, array) in enumerate(zip(self.program.nodes, self._sizes, arrays)):
            self._addresses[k] = buffer_address(node, size, array, self.routine)
