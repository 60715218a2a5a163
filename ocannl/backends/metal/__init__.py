"""The ``metal`` backend: the loop IR printed as Metal Shading Language kernels (emit.py, through
the shared walk of ``ocannl/backends/codegen.py`` and the MSL table of syntax.py), and, without a
Mac, those kernels compiled as C++20 against a shim header (``shim/metal_shim.hpp``) and run over
their grids on the CPU with real threadgroup barriers (harness.py, ``shim/launcher.cpp``). See
docs/codegen.md, "Metal".
"""

from ocannl.backends.metal.backend import MetalBackend, MetalExecutable
from ocannl.backends.metal.emit import KernelLimitError, MetalProgram, Options, emit_metal

__all__ = ["KernelLimitError", "MetalBackend", "MetalExecutable", "MetalProgram", "Options", "emit_metal"]
