"""A compiled routine's shared library, mapped into the process while the routine lives.

``ctypes.CDLL`` never unmaps what it loads: a process compiling routine after routine (a
hyperparameter search, a test suite) would keep every library mapped forever. A
:class:`SharedLibrary` closes its handle when it is garbage-collected, and each function taken
from it keeps it alive, so the code cannot be unmapped while anything can still call it. Two
loads of one path share one mapping (the dynamic loader counts them); it goes when both are
closed.

Only a verified entry of the kernel cache is loaded: :func:`ocannl.backends.cache.loading`
checks the file, holds it open and makes sure its path still names it when the dynamic loader
opens it, so the code that runs is the code that was verified.
"""

from __future__ import annotations

import ctypes
import weakref
from pathlib import Path
from typing import Sequence

import _ctypes

from ocannl.backends import cache
from ocannl.errors import CompileError

_close = getattr(_ctypes, "dlclose", None) or getattr(_ctypes, "FreeLibrary")


class SharedLibrary:
    """``path``, a file of the kernel cache, verified and loaded (``compiler`` names what built
    it, for messages); a :class:`~ocannl.backends.cache.CacheError` when it does not verify."""

    def __init__(self, path: Path, compiler: str):
        self.path = Path(path)
        try:
            with cache.loading(self.path):
                self._cdll = ctypes.CDLL(str(path))
        except OSError as e:
            raise CompileError(f"{compiler} built {path}, which cannot be loaded: {e}") from None
        self._unload = weakref.finalize(self, _close, self._cdll._handle)
        # Not at interpreter exit: the process is going away and its mappings with it, while
        # threads of a runtime the library pulled in (OpenMP's pool) may still be winding down
        # in it. Unloading there gains nothing and can crash the exit.
        self._unload.atexit = False

    def function(self, name: str, restype, argtypes: Sequence) -> ctypes._CFuncPtr:
        """The exported function ``name``, typed; it holds the library mapped while it lives."""
        try:
            function = self._cdll[name]  # not getattr: CDLL would keep it, a cycle back to self
        except AttributeError:
            raise CompileError(f"{self.path} exports no function {name}") from None
        function.restype = restype
        function.argtypes = list(argtypes)
        function.library = self
        return function

    @property
    def loaded(self) -> bool:
        return self._unload.alive
