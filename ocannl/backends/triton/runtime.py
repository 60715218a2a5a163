"""The Triton runtime: where buffers live, how a generated module is loaded, how it is run.

* **Buffers are torch tensors**, on ``cuda`` when a GPU runs the kernels, on the CPU under the
  Triton interpreter (``TRITON_INTERPRET=1``, which runs each program in turn on the CPU and reads
  CPU tensors in place). torch serves only to allocate and to move data; values cross to the host
  through numpy (:class:`TorchBuffers`, the context's buffer ownership hook).
* **A module per routine.** ``@triton.jit`` reads the source of its functions, so the generated
  module is written to a file under the kernel cache (``OCANNL_CACHE_DIR``, default
  ``~/.cache/ocannl``; ``triton/<routine>-<hash>.py``, written atomically) and imported from
  there. Triton compiles each kernel for the GPU on its first launch and caches the binary itself.
* **Errors.** A gather or scatter position outside its axis sets a one-cell error flag; the run
  then raises :class:`~ocannl.errors.OutOfBoundsError` (one device-to-host read after the run, only
  for routines with data-dependent positions).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

import numpy as np

from ocannl.backends import cache
from ocannl.backends.base import at_step
from ocannl.errors import OutOfBoundsError
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.tnode import TNode

from ocannl.backends.triton.emit import ModuleSource

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

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.torch.zeros(shape, dtype=_torch_dtype(self.torch, dtype), device=self.device)

    def from_host(self, array: np.ndarray) -> Any:
        return self.torch.from_numpy(np.asarray(array, order="C")).to(self.device)  # a 0-d value stays 0-d

    def to_host(self, buffer: Any) -> np.ndarray:
        return buffer.detach().cpu().numpy()


def _torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    return {
        "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "int32": torch.int32,
        "int64": torch.int64, "uint32": torch.uint32, "uint16": torch.uint16,
    }[np.dtype(dtype).name]


def cache_dir() -> Path:
    """``<cache>/triton`` in the kernel cache the compiled backends share (ocannl/backends/cache.py:
    a directory only the current user can write, so the module compared below is the one imported)."""
    return cache.directory("triton")


def load_module(source: ModuleSource) -> ModuleType:
    """Write the module's source under the cache (atomically) and import it."""
    digest = hashlib.sha256(source.text.encode()).hexdigest()[:16]
    stem = f"{source.routine[:60]}-{digest}"
    directory = cache_dir()
    path = directory / f"{stem}.py"
    if not path.exists() or path.read_text() != source.text:
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source.text)
        os.replace(tmp, path)
    name = f"ocannl_triton_{stem.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class TritonExecutable:
    """A routine's kernels, launched in order over the context's tensors."""

    def __init__(self, routine_name: str, source: ModuleSource):
        import torch

        self.name = routine_name
        self.source = source
        self.module = load_module(source)
        self._error = torch.zeros(1, dtype=torch.int32, device=device())

    @property
    def debug_files(self) -> dict[str, str]:
        """Files for the context's debug directory: the generated module."""
        return {".triton.py": self.source.text}

    def run(self, buffers: Mapping[TNode, Any], bindings: Mapping[IndexSymbol, int]) -> None:
        named = {node.name: buffer for node, buffer in buffers.items()}
        symbols = {symbol.name: int(value) for symbol, value in bindings.items()}
        self.module.launch(named, symbols, self._error)
        if self.source.checks_positions and int(self._error.item()):
            self._error.zero_()
            raise OutOfBoundsError(
                f"routine {self.name}: an index is outside its axis (an oc.take position, or an index symbol "
                f"without a size bound past the axis it indexes); the Triton backend skipped or clamped those "
                f"accesses (run the routine on the interp backend to see where)"
            )

    def run_many(self, buffers: Mapping[TNode, Any], symbols: Sequence[IndexSymbol], steps: np.ndarray,
                 records: Sequence[TNode]) -> list[np.ndarray]:
        """The steps launched from Python (ocannl/backends/base.py, ``run_steps``), each recorded
        tensor copied on the device after every step and brought to the host once, at the end:
        a GPU is not made to wait for the host at every step."""
        outputs = [buffers[node].new_empty((len(steps), *buffers[node].shape)) for node in records]
        for step, row in enumerate(steps.tolist()):
            try:
                self.run(buffers, dict(zip(symbols, row)))
            except OutOfBoundsError as e:
                raise at_step(e, step) from None
            for output, node in zip(outputs, records):
                output[step].copy_(buffers[node])
        return [output.cpu().numpy() for output in outputs]
