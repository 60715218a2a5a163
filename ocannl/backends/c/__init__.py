"""The ``c`` backend: the loop IR printed as C (emit.py, through the shared walk of
``ocannl/backends/codegen.py`` and the C table of syntax.py), compiled by the system compiler
into an on-disk kernel cache (compiler.py), and called through ctypes on numpy buffers
(backend.py). See docs/codegen.md, "C"."""

from ocannl.backends.c.backend import CBackend, CExecutable

__all__ = ["CBackend", "CExecutable"]
