"""The ``triton`` backend: the optimized loop IR partitioned into tiled Triton kernels over torch
tensors (docs/codegen.md, "Triton").

* ``ocannl/backends/partition.py`` (shared with Metal) cuts a routine into kernels (which loops
  run as grid axes, which statements share a kernel, which nests are contractions for ``tl.dot``);
* ``emit.py`` writes one Python module per routine: the kernels and a ``launch`` function;
* ``plan.py`` plans each kernel (tiling, blocks, grid) from the block-size table of ``tiling.py``
  and, for flat kernels, from ``stages.py``'s survey of which inner loops the writer tiles;
  ``autotune.py``, a pre-pass of :meth:`TritonBackend.compile`, may choose a contraction's on a GPU;
* ``tlib.py`` holds the device functions the modules import;
* ``runtime.py`` owns the buffers (torch tensors), loads modules and runs them.

It needs ``triton`` and ``torch`` (``pip install 'ocannl[triton]'``) and a GPU, or
``TRITON_INTERPRET=1`` to run the kernels in Triton's CPU interpreter: slow, for tests, and never
chosen by ``Context.auto()``. Settings (ocannl/config.py): ``triton_fp32_dot`` (``ieee``, the
default: exact float32 products; ``tf32`` or ``tf32x3`` for tensor cores), ``fast_math`` (lets
Triton contract multiply-adds), ``triton_autotune`` (measure contraction tiles on the GPU:
autotune.py), ``triton_cuda_graphs`` (``run_many`` replays a CUDA graph: runtime.py),
``cache_dir`` (where the measured choices are kept; the modules themselves are never written).
"""

from __future__ import annotations

from ocannl import config
from ocannl.errors import OcannlError
from ocannl.lowlevel.ir import RoutineIR

FP32_DOT_CHOICES = ("ieee", "tf32", "tf32x3")


def options():
    """The emitter options from the settings."""
    from ocannl.backends.triton.emit import Options

    fp32_dot = (config.get("triton_fp32_dot") or "ieee").strip().lower()
    if fp32_dot not in FP32_DOT_CHOICES:
        raise OcannlError(f"setting triton_fp32_dot must be one of {', '.join(FP32_DOT_CHOICES)}, got {fp32_dot!r}")
    return Options(fp32_dot=fp32_dot, fp_fusion=config.flag("fast_math"))


def generate(routine: RoutineIR):
    """The Triton module source of ``routine`` (a :class:`~ocannl.backends.triton.emit.ModuleSource`)
    with the table's plans, without loading it: for tests, golden files and the compile checks."""
    from ocannl.backends.triton.emit import emit_module
    from ocannl.backends.partition import partition

    return emit_module(routine, partition(routine.body), options())


class TritonBackend:
    """The ``triton`` backend (registered in ``ocannl.backends.registry``)."""

    name = "triton"
    tree_sums = True
    """Long sums are ``tl.sum`` trees over tiles (docs/semantics.md, "Summation order"), not the
    blocked loop order the other backends run."""

    def __init__(self) -> None:
        self._buffers = None

    @property
    def emulated(self) -> bool:
        """Kernels run in Triton's CPU interpreter: never picked by ``Context.auto()``."""
        from ocannl.backends.triton.runtime import interpreting

        return interpreting()

    def available(self) -> tuple[bool, str]:
        from ocannl.backends.triton.runtime import availability

        return availability()

    @property
    def buffers(self):
        """The context's buffers are torch tensors on the kernels' device."""
        if self._buffers is None:
            from ocannl.backends.triton.runtime import TorchBuffers

            self._buffers = TorchBuffers()
        return self._buffers

    def compile(self, routine: RoutineIR):
        """The routine's kernels planned, the contractions' plans tuned when tuning is on
        (autotune.py: a pre-pass choosing among plans, measured on the GPU), then written and
        loaded."""
        from ocannl.backends.partition import partition
        from ocannl.backends.triton import autotune
        from ocannl.backends.triton.emit import emit_module
        from ocannl.backends.triton.plan import plan_kernel
        from ocannl.backends.triton.runtime import TritonExecutable

        kernels = partition(routine.body)
        plans = autotune.tuned(kernels, [plan_kernel(k) for k in kernels])
        return TritonExecutable(routine.name, emit_module(routine, kernels, options(), plans), self.buffers)


__all__ = ["TritonBackend", "generate", "options"]
