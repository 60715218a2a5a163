"""A contraction's cells as the C backend's printers read them (register tiles,
``tile_printer.py``; packed GEMMs, ``gemm_printer.py``): a reset of the cells
(:attr:`~ocannl.lowlevel.cpu_schedule.ContractionPlan.reset`) is never stored, the first step
of each cell starts from its value instead."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ocannl.lowlevel.cpu_schedule import ContractionPlan

if TYPE_CHECKING:
    from ocannl.backends.codegen import Emitter


def reset_value(emitter: Emitter, plan: ContractionPlan) -> str:
    """The reset constant as the cell would read it back after storing it (rounded to the
    node's storage where that is narrower)."""
    out = plan.store.tnode
    return emitter.syntax.from_storage(out.dtype, emitter.stored(out, plan.reset))


def cell_start(emitter: Emitter, plan: ContractionPlan, fresh: str | None) -> str:
    """A cell's value where its sum reads it (at the current symbol texts): the reset value
    when ``fresh`` (a condition; ``""``: always) holds, the cell otherwise."""
    out, idx = plan.store.tnode, plan.store.indices
    cell = emitter.syntax.from_storage(out.dtype, emitter.access(out, idx))
    if fresh is None or plan.reset is None:
        return cell
    reset = reset_value(emitter, plan)
    return reset if not fresh else f"({fresh} ? {reset} : {cell})"
