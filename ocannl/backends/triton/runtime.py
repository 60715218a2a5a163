"""The Triton runtime: where buffers live, how a generated module is loaded, how it is run.

* **Buffers are torch tensors**, on ``cuda`` when a GPU runs the kernels, on the CPU under the
  Triton interpreter (``TRITON_INTERPRET=1``, which runs each program in turn on the CPU and reads
  CPU tensors in place). torch serves only to allocate and to move data; values cross to the host
  through numpy (:class:`TorchBuffers`, the context's buffer ownership hook).
* **A module per routine**, executed from its generated text in memory (:func:`load_module`):
  no source or bytecode file is written or read, so none can be swapped or planted (an
  unchecked-hash ``.pyc`` beside a module would otherwise run in its place). ``@triton.jit``
  reads the source of its functions through ``linecache``, which is handed the text under the
  module's file name, ``<ocannl triton ROUTINE-HASH>``: a name in angle brackets, which
  ``linecache`` never looks up on disk. Triton compiles each kernel for the GPU on its first
  launch and caches the binary in its own cache (``TRITON_CACHE_DIR``, Triton's business).
* **Launches** (:class:`TritonExecutable`). Index symbols are not kernel arguments: each routine
  has a *symbol table*, an int64 tensor on the device holding its symbols' values (in the order of
  ``ModuleSource.symbols``), written before a run, from which the kernels load them. A launch's
  arguments are thus the same at every run, so they are built once per set of buffers
  (``prepare``). The first launch of a kernel goes through Triton's JIT, which compiles it; on a
  GPU, later launches call the compiled kernel's launcher directly with those prebuilt arguments,
  skipping the JIT's per-call argument binding and cache lookup. Under the interpreter every
  launch goes through the JIT (there is no compiled kernel).
* **Error flags.** A gather or scatter position outside its axis, an index symbol without a
  size past its axis, or an integer divisor of zero, raises the routine's error flag on the
  device to the number of the failed check (writer.py, ``ExpressionWriter.site``). Flags are read,
  and :class:`~ocannl.errors.OutOfBoundsError` (:class:`~ocannl.errors.IntegerDivisionError`)
  raised naming the routine and the check, by :meth:`TorchBuffers.check_errors`: right after each
  ``run()`` of a routine with checks (which then waits for the GPU, and restores its buffers if
  it failed: ocannl/backends/routine.py, ``Routine``), when a value is read back
  (``Context.get``, ``Tensor.numpy``, through :meth:`TorchBuffers.to_host`), by
  :meth:`TorchBuffers.synchronize`, at the start of a ``run_many`` (errors of earlier runs) and
  at its end (naming the first failing step, whose changes the routine undoes).
* **CUDA graphs** (setting ``triton_cuda_graphs``, off by default): ``run_many`` on a GPU records
  the routine's launches once as a CUDA graph and replays it at every step, after copying that
  step's row of symbol values into the table the graph reads. Under the interpreter the setting is
  refused (:class:`~ocannl.errors.BackendUnavailable`): there is no CUDA to record.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import linecache
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ocannl import config
from ocannl.backends.bindings import at_step
from ocannl.errors import BackendUnavailable, IntegerDivisionError, OutOfBoundsError
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.tnode import TNode

from ocannl.backends.triton.emit import ModuleSource
from ocannl.backends.triton.writer import KernelSource, Param

INSTALL_HINT = "pip install 'ocannl[triton]'"


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def _gpu_device_files() -> bool:
    """A cheap test before importing torch: NVIDIA or AMD device files, or an explicit
    ``CUDA_VISIBLE_DEVICES``."""
    return any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/kfd")) or bool(
        os.environ.get("CUDA_VISIBLE_DEVICES"))


def availability() -> tuple[bool, str]:
    """Whether the Triton backend can run here, and why (not)."""
    missing = [m for m in ("triton", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        return False, f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: {INSTALL_HINT}"
    if interpreting():
        return True, "the Triton interpreter (TRITON_INTERPRET=1) runs kernels on the CPU, slowly: for tests"
    if not _gpu_device_files():
        return False, ("no GPU here; set TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter "
                       "(slow, for tests)")
    import torch

    if not torch.cuda.is_available():
        return False, "torch sees no CUDA/ROCm GPU (a CPU-only torch build?); set TRITON_INTERPRET=1 for the interpreter"
    return True, f"GPU {torch.cuda.get_device_name()}"


def device() -> Any:
    import torch

    return torch.device("cpu" if interpreting() else "cuda")


class TorchBuffers:
    """Buffer ownership for a context on the Triton backend: torch tensors on the kernels'
    device, holding what the numpy arrays of other backends hold (the node's storage dtype;
    bfloat16 as uint16 bits, uint4x32 as uint32 with a trailing axis of 4)."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.device = device()
        self.pending: dict[TritonExecutable, None] = {}
        """Executables that may have set their error flag since the last check (in run order)."""

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.torch.zeros(shape, dtype=_torch_dtype(self.torch, dtype), device=self.device)

    def from_host(self, array: np.ndarray) -> Any:
        return self.torch.from_numpy(np.asarray(array, order="C")).to(self.device)  # a 0-d value stays 0-d

    def to_host(self, buffer: Any) -> np.ndarray:
        """The buffer's values, after the errors of the runs so far (:meth:`check_errors`)."""
        self.check_errors()
        return buffer.detach().cpu().numpy()

    def snapshot(self, buffer: Any) -> Any:
        return buffer.clone()

    def restore(self, buffer: Any, snapshot: Any) -> None:
        buffer.copy_(snapshot)

    def synchronize(self) -> None:
        """Wait for the device, and raise the errors of the runs so far."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        self.check_errors()

    def check_errors(self) -> None:
        """Read the error flags of the executables that ran since the last check (one transfer),
        clear them, and raise the error of the first one set, naming its routine."""
        if not self.pending:
            return
        pending, self.pending = list(self.pending), {}
        flags = self.torch.cat([e.error_flag for e in pending]).cpu().tolist()
        failed = [(e, flag) for e, flag in zip(pending, flags) if flag]
        for e, _ in failed:
            e.error_flag.zero_()
        if failed:
            raise failed[0][0].flag_error(failed[0][1])


def _torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    return {
        "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "int32": torch.int32,
        "int64": torch.int64, "uint32": torch.uint32, "uint16": torch.uint16,
    }[np.dtype(dtype).name]


def load_module(source: ModuleSource) -> ModuleType:
    """The module of ``source``, executed from its text (module docstring, "A module per
    routine"); registered in ``sys.modules`` under a name of the routine and the text's digest."""
    stem = f"{source.routine[:60]}-{hashlib.sha256(source.text.encode()).hexdigest()[:16]}"
    name = f"ocannl_triton_{stem.replace('-', '_')}"
    filename = f"<ocannl triton {stem}>"
    linecache.cache[filename] = (len(source.text), None, source.text.splitlines(keepends=True), filename)
    module = ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    exec(compile(source.text, filename, "exec"), module.__dict__)
    return module


SYMBOL_ROW = 2
"""Symbol table rows are padded to a multiple of this many int64 values (16 bytes): Triton
specializes a kernel on its pointers' 16-byte alignment, so every row passed must keep it."""


def cuda_graphs() -> bool:
    """The ``triton_cuda_graphs`` setting (module docstring); refused where no GPU runs the kernels."""
    if not config.flag("triton_cuda_graphs"):
        return False
    if interpreting():
        raise BackendUnavailable(
            f"the setting triton_cuda_graphs (from {config.origin('triton_cuda_graphs')}) records run_many's launches "
            f"as a CUDA graph, which needs a GPU; the Triton interpreter (TRITON_INTERPRET=1) runs kernels on the "
            f"CPU: unset it")
    return True


def symbol_rows(values: np.ndarray) -> np.ndarray:
    """``values`` (``(n, k)`` int64: one row of symbol values per run) padded to rows of a
    multiple of :data:`SYMBOL_ROW` (at least one), as the symbol table holds them."""
    n, k = values.shape
    width = max(SYMBOL_ROW, -(-k // SYMBOL_ROW) * SYMBOL_ROW)
    rows = np.zeros((n, width), np.int64)
    rows[:, :k] = values
    return rows


_SCRATCH_TYPES = {"fp32": "float32", "fp64": "float64", "i32": "int32", "i64": "int64", "u32": "uint32"}
"""The torch type of a scratch buffer of each Triton element type."""


class KernelCall:
    """One kernel's launch with its arguments built once (the buffers of a prepared run, the
    symbol table, the error flag; its constexprs and launch options).

    :meth:`launch` goes through Triton's JIT (``kernel[grid](...)``), which compiles the kernel
    on its first call and returns the compiled kernel; on a GPU the calls after that go straight
    to the compiled kernel's launcher (``CompiledKernel.run`` in Triton 3.x: grid, stream, function
    handle, packed metadata, launch metadata and hooks, then every argument in signature order,
    constexprs included). That direct path runs only on a GPU: the test suite, under the
    interpreter, exercises the JIT path and the argument building, not the direct call."""

    def __init__(self, jit: Any, source: KernelSource, arguments: list[Any], fp_fusion: bool):
        self.jit = jit
        self.source = source
        self.arguments = arguments
        self.options = {**source.constexprs, "num_warps": source.num_warps, "enable_fp_fusion": fp_fusion}
        if source.num_stages is not None:
            self.options["num_stages"] = source.num_stages
        self._direct: tuple | None = None
        """The compiled kernel's launcher and what it takes besides grid and stream."""

    def launch(self, stream: Any = None) -> None:
        """Launch on ``stream`` (``None``: the interpreter, which has no streams)."""
        if self._direct is not None:
            run, function, metadata, args = self._direct
            run(self.source.grid, 1, 1, stream, function, metadata, None, None, None, *args)
            return
        compiled = self.jit[(self.source.grid,)](*self.arguments, **self.options)
        if stream is not None and compiled is not None and not _launch_hooks():
            self._direct = (compiled.run, compiled.function, compiled.packed_metadata,
                            (*self.arguments, *self.source.constexprs.values()))


def _launch_hooks() -> bool:
    """Whether launch hooks are installed (a profiler): the JIT calls them with launch metadata,
    so launches keep going through it. Triton 3.9 keeps the hooks as chains of callables, empty
    when none is installed; older versions as a callable or ``None``."""
    from triton import knobs

    return any(hook is not None and bool(getattr(hook, "calls", True))
               for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


class TritonExecutable:
    """A routine's kernels, launched in order over the context's tensors (module docstring)."""

    def __init__(self, routine_name: str, source: ModuleSource, owner: TorchBuffers):
        import torch

        self.torch = torch
        self.name = routine_name
        self.source = source
        self.module = load_module(source)
        self.owner = owner
        self.graphs = cuda_graphs()
        self.error_flag = torch.zeros(1, dtype=torch.int32, device=owner.device)
        self.table = torch.zeros(symbol_rows(np.zeros((1, len(source.symbols)), np.int64)).shape[1],
                                 dtype=torch.int64, device=owner.device)
        """The symbol table every launch reads: run() writes its bindings there, run_many each
        step's row."""
        self.scratch = {p.scratch[0]: torch.zeros(p.scratch[1], dtype=getattr(torch, _SCRATCH_TYPES[p.scratch[2]]),
                                                  device=owner.device)
                        for k in source.kernels for p in k.params if p.scratch is not None}
        """The kernels' own buffers (writer.Param.scratch), allocated with the executable."""
        self._written: tuple[int, ...] | None = None
        """The values last written to :attr:`table` by run() (the same bindings write nothing)."""
        self._bound: dict[TNode, Any] = {}
        self._calls: list[KernelCall] = []
        self._graph: Any = None
        """run_many's CUDA graph of one run over the buffers of :attr:`_bound`."""

    @property
    def debug_files(self) -> dict[str, str]:
        """Files for the context's debug directory: the generated module."""
        return {".triton.py": self.source.text}

    def flag_error(self, flag: int) -> OutOfBoundsError | IntegerDivisionError:
        """The error of error-flag value ``flag``: the check it names (emit.ModuleSource.sites)."""
        what = self.source.sites.get(flag, "an index is outside its axis")
        if flag in self.source.division_sites:
            return IntegerDivisionError(
                f"routine {self.name}: {what}; the Triton backend divided by 1 there (run the routine on the "
                f"interp backend to see the statement and the indices)")
        return OutOfBoundsError(
            f"routine {self.name}: {what}; the Triton backend skipped or clamped those accesses (run the routine "
            f"on the interp backend to see the indices)"
        )

    # -- launches ----------------------------------------------------------------------------

    def prepare(self, buffers: Mapping[TNode, Any]) -> Callable[[Mapping[IndexSymbol, int]], None]:
        """``run`` over ``buffers``, its kernel calls built now (ocannl/backends/protocols.py, ``Executable``)."""
        self._bind(buffers)
        return functools.partial(self.run, buffers)

    def _bind(self, buffers: Mapping[TNode, Any]) -> None:
        """Build the kernel calls over ``buffers``, unless they are built over these tensors."""
        if len(buffers) == len(self._bound) and all(self._bound.get(n) is b for n, b in buffers.items()):
            return
        self._bound = dict(buffers)
        self._graph = None
        named = {node.name: buffer for node, buffer in buffers.items()}
        self._calls = [KernelCall(getattr(self.module, k.name), k, [self._argument(p, named) for p in k.params],
                                  self.module.FP_FUSION) for k in self.source.kernels]

    def _argument(self, p: Param, named: Mapping[str, Any]) -> Any:
        if p.node is not None:
            return named[p.node.name]
        if p.symbols:
            return self.table
        if p.scratch is not None:
            return self.scratch[p.scratch[0]]
        return self.error_flag

    def _launch(self) -> None:
        stream = None
        if self.owner.device.type == "cuda":
            from triton.runtime import driver

            stream = driver.active.get_current_stream(driver.active.get_current_device())
        for call in self._calls:
            call.launch(stream)

    def run(self, buffers: Mapping[TNode, Any], bindings: Mapping[IndexSymbol, int]) -> None:
        """Launch the kernels; an error surfaces later (module docstring)."""
        self._bind(buffers)
        values = tuple(int(bindings[s]) for s in self.source.symbols)
        if values != self._written:
            row = symbol_rows(np.array(values, np.int64).reshape(1, len(values)))[0]
            self.table.copy_(self.torch.from_numpy(row), non_blocking=True)
            self._written = values
        self._launch()
        if self.source.checks_positions:
            self.owner.pending[self] = None

    def run_many(self, buffers: Mapping[TNode, Any], symbols: Sequence[IndexSymbol], steps: np.ndarray,
                 records: Sequence[TNode]) -> list[np.ndarray]:
        """The steps launched from Python (ocannl/backends/routine.py, ``run_steps``) without waiting
        for the device: the steps' symbol values go to the device at once, one row per step
        copied into the table before it; each recorded tensor is copied on the device after every
        step; the host reads the records and the error flags once, at the end, and an error names
        the first step that set the flag. With the ``triton_cuda_graphs`` setting, the launches
        are recorded once as a CUDA graph (after a first, eager run compiled them) and replayed."""
        torch = self.torch
        self.owner.check_errors()  # errors of earlier runs are theirs: raised before any step
        self._bind(buffers)
        order = [list(symbols).index(s) for s in self.source.symbols]
        rows = torch.from_numpy(symbol_rows(steps[:, order].astype(np.int64))).to(self.owner.device)
        outputs = [buffers[node].new_empty((len(steps), *buffers[node].shape)) for node in records]
        step_flags = torch.zeros(len(steps), dtype=torch.int32, device=self.owner.device)
        self._written = None  # the table will hold the steps' rows
        for step in range(len(steps)):
            self.table.copy_(rows[step])
            if self._graph is not None:
                self._graph.replay()
            else:
                self._launch()
                if self.graphs:  # compiled now: record the launches for the next steps
                    self._graph = self._record()
            if self.source.checks_positions:
                step_flags[step:step + 1].copy_(self.error_flag)  # the flag accumulates over steps
            for output, node in zip(outputs, records):
                output[step].copy_(buffers[node])
        if self.source.checks_positions:
            flags = step_flags.cpu().numpy()
            failed = np.flatnonzero(flags)
            if len(failed):
                self.error_flag.zero_()
                raise at_step(self.flag_error(int(flags[failed[0]])), int(failed[0]))
        return [output.cpu().numpy() for output in outputs]

    def _record(self) -> Any:
        """A CUDA graph of one run of the bound calls (recorded, not run). GPU only: not
        exercised by the test suite."""
        graph = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.graph(graph):  # makes the capture stream current: _launch uses it
            self._launch()
        return graph
