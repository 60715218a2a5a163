"""Random draws made at run time: a new draw on every run of a routine, reproducible from the seed.

Parameters draw their initial values once, in the init routine (``ocannl/init.py``). Dropout needs
the opposite: a new mask each time the training step runs, as consecutive forward passes of a
PyTorch module in training mode draw new masks, without the user passing anything. So each random
tensor owns a *run counter*, a uint32 data tensor holding 0 on every context where it is first
compiled; the tensor's forward code adds 1 to it, then draws its cells from it
(docs/semantics.md, "Random draws at run time")::

    counter =+ 1
    u =: uniform1(threefry4x32(threefry4x32(key, uint4x32_of(counter)), uint4x32_of(cell_offset)))

with ``key = (seed, stream, 0, 0)``, ``seed`` the session seed when the routine is compiled
(``oc.seed``) and ``stream`` the random tensor's id (``ocannl/lowlevel/prng.py``, "Draws made at
run time"). Hence:

- run ``r`` of a routine on a context draws with counter ``r`` (1, 2, ...), so consecutive runs
  draw independent values, and two contexts compiled under one seed draw the same sequence, bit
  for bit, whatever their backends;
- every read of the draw within one run (the forward product and the gradient of a dropout) sees
  the same values, since the counter changes only before the draw;
- the counter is an ordinary tensor (:func:`run_counter`): ``oc.save`` keeps it and ``oc.load``
  restores it, so a resumed run continues the sequence. It wraps around after 2**32 runs.

Random tensors are not differentiable: a gradient never flows into a draw.
"""

from __future__ import annotations

import numpy as np

from ocannl import init
from ocannl.lowlevel import dtypes, prng
from ocannl.lowlevel.assignments import Accum, Arg, Assignment, Block
from ocannl.lowlevel.indexing import Projections
from ocannl.lowlevel.scalar_ops import Binop, Unop
from ocannl.ops import OpDef, define
from ocannl.shape.logic import Pointwise
from ocannl.shape.projections import identity_projections
from ocannl.tensor import Tensor, as_tensor, tensor


def _draw_dtype(operands) -> dtypes.DType:
    """A draw compares exactly against probabilities: float32 (53-bit float64 next to a float64
    operand), never a half precision that would round the uniforms."""
    return dtypes.float64 if operands[0].dtype is dtypes.float64 else dtypes.float32


def _draw_forward(t: Tensor) -> Assignment:
    """Count the run, then draw every cell from the count (see the module docstring)."""
    counter = run_counter(t)
    increment = Accum(counter.value, Binop.ADD, Unop.ID, (1,), lambda: identity_projections((), [()]), spec=".")
    key = prng.run_key(prng.key(init.current_seed(), init.stream(t)), Arg(0))

    def every_cell() -> Projections:
        """Each cell of the draw once, reading the run counter (dims ``()``) at every cell."""
        cells = prng.every_cell(t.value)()
        return Projections(cells.product_space, cells.product_iterators, cells.lhs_dims, ((),),
                           cells.project_lhs, ((),), f"draw {t.label}")

    draw = Accum(t.value, None, prng.uniform_of_key(key), (counter.value,), every_cell, spec=".")
    return Block((increment, draw), comment=f"{t.label}: draw {init.stream(t)} of run {counter.label}")


RUN_UNIFORM = define(OpDef("run_uniform", shape=lambda operands: Pointwise(), forward=_draw_forward,
                           gradient=None, dtype=_draw_dtype))
"""Uniforms in [0, 1), drawn anew on every run; operands: the tensor whose shape it takes, then
its run counter. No gradient flows into a draw."""


def uniform_like(x, *, label: str | None = None) -> Tensor:
    """Uniforms in [0, 1) with ``x``'s shape, drawn anew on every run of a routine computing
    them (float32; float64 for a float64 ``x``): a multiple of 2**-24 (2**-53), so
    ``u < p`` holds with probability ``p`` rounded up to that grid."""
    x = as_tensor(x)
    name = label or f"{x.label}_uniform"
    counter = tensor(np.zeros((), np.uint32), label=f"{name}_run", dtype=dtypes.uint32)
    return RUN_UNIFORM(x, counter, label=name)


def run_counter(t: Tensor) -> Tensor:
    """The run counter of a random tensor made by this module: the number of runs that drew it
    on a context (``run_counter(u).numpy()``), to save with a checkpoint or to ``set``."""
    if t.definition is not RUN_UNIFORM:
        raise TypeError(f"run_counter: {t.label!r} ({t.op}) is not a run-time random tensor "
                        f"(ocannl.random.uniform_like makes them)")
    return t.operands[1]


__all__ = ["RUN_UNIFORM", "uniform_like", "run_counter"]
