"""The ``interp`` backend: the loop IR run by a Python interpreter over numpy buffers; the
reference every other backend is compared to (docs/interpreter.md)."""

from ocannl.backends.interp.interpreter import InterpBackend, InterpExecutable

__all__ = ["InterpBackend", "InterpExecutable"]
