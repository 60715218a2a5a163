"""Backend-independent optimization of the loop IR (spec/backend.md §5).

:func:`optimize` is the single entry point between lowering and the backends; ``Context.compile``
prints its input as ``<routine>-unoptimized.ll`` and its output as ``<routine>.ll``. It runs no
pass yet, so both files are equal: tracing, virtualization/inlining, simplification, CSE and FMA
introduction arrive with the C-backend work, each checked by running the interpreter on the
routine before and after it.
"""

from __future__ import annotations

from ocannl.lowlevel.ir import RoutineIR


def optimize(routine: RoutineIR) -> RoutineIR:
    """The optimized form of ``routine``; for now the routine itself."""
    return routine
