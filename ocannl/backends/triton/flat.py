"""The writers of flat kernels (plan.py: :class:`~ocannl.backends.triton.plan.FillPlan` and
:class:`~ocannl.backends.triton.plan.FlatPlan`): whole-buffer fills, and grids flattened into
``XBLOCK`` tiles with their inner ``RBLOCK`` stages and split reductions; the statements,
stores and expressions are the base writers' (writer.py).

**Tiles.** A *flat* kernel flattens its grid axes into one index ``xindex`` (``XBLOCK`` points a
program, masked by ``xmask`` at the ragged end) and recovers each axis by ``//`` and ``%``
(``x0``, ``x1``, ...). What remains of each statement after its grid loops is emitted by
``KernelWriter.stmt`` (writer.py):

* a chain of inner loops over which the body is pointwise (every store indexes each of them) is
  a *stage*: its points are flattened into ``rindex`` (``RBLOCK`` a chunk, looped over unless
  one chunk holds them all) and computed as ``[XBLOCK, RBLOCK]`` tiles;
* a chain of loops accumulating one cell or a local (``c[I] := c[I] op v``) is a reduction
  stage when its operator may be regrouped (``schedule.regrouping``): the terms of each
  ``rindex`` tile are combined by ``tl.sum``, ``tl.max``, ``tl.min`` or ``tlib.product`` and the
  result applied to the cell's value with ``op`` (a subtraction subtracts the sum of its terms,
  a float division divides by their product). A long one the plan splits (``FlatPlan.split``:
  few rows, many terms) combines one slice of its terms per program, and the tile's last
  program combines the slices (``KernelWriter.combine_slices``), applies them to the cell and
  alone runs the rest of the kernel. Integer divisions, float sums of fewer than
  :data:`~ocannl.backends.triton.stages.SHORT_SUM` terms and half-precision accumulators, which
  round on every store, take the sequential path below instead;
* any other loop runs sequentially inside the program (``for s0 in range(n)``).
"""

from __future__ import annotations

import math
from typing import Any

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.ir import Expr, For, SetLocal, Stmt, Store
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.schedule import regrouping

from ocannl.backends.triton import stages, tiling
from ocannl.backends.triton.plan import FlatPlan
from ocannl.backends.triton.stages import accumulator_dtype
from ocannl.backends.triton.tile_expr import Val, literal_code
from ocannl.backends.triton.writer import KernelWriter, Region, decompose


class FillKernelWriter(KernelWriter):
    """Fills whole buffers, ``XBLOCK`` cells a program."""

    def tiles(self) -> None:
        self.constexprs["XBLOCK"] = self.plan.blocks.xblock
        xindex = self.names.word("xindex")
        self.line(f"{xindex} = {self.program_id(self.plan.numel)} * XBLOCK + tl.arange(0, XBLOCK)")
        for f in self.plan.fills:
            self.fill(f, xindex, "XBLOCK")


class FlatKernelWriter(KernelWriter):
    """Flattens the grid into ``XBLOCK`` tiles (module docstring)."""

    plan: FlatPlan

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rblock: int | None = self.plan.rblock
        self.two_d = self.rblock is not None
        """Whether tiles are ``[XBLOCK, RBLOCK]`` (a flat kernel with inner tiles)."""
        self.top = 0
        """The number of lines of the tile indices, which the lines of :meth:`line_at_top` follow."""
        self.shared_lines: list[str] = []
        self.persistent_rindex: str | None = None
        self.stage_vars: dict[Any, Any] = {}

    def tiles(self) -> None:
        k, plan = self.kernel, self.plan
        two_d = self.two_d
        pid = self.program_id(plan.numel * plan.split)
        if plan.split > 1:  # the slices of one tile are neighbouring programs
            self.line(f"# the reduction over {plan.split_terms} terms in {plan.split} slices of {plan.slice_terms}")
            self.split_pid = self.names.word("pid_r")
            self.line(f"{self.split_pid} = {pid} % {plan.split}")
            self.tile_pid = self.temp(f"{pid} // {plan.split}", "pid")
            pid = self.tile_pid
        if plan.has_grid:
            self.constexprs["XBLOCK"] = plan.blocks.xblock
            xindex, xmask = self.names.word("xindex"), self.names.word("xmask")
            expand = "[:, None]" if two_d else ""
            self.line(f"{xindex} = {pid} * XBLOCK + tl.arange(0, XBLOCK){expand}")
            ragged = plan.ragged
            if ragged:  # the last program's tile runs past the grid
                self.line(f"{xmask} = {xindex} < {plan.numel}")
            codes = decompose(xindex, k.extents)
            axes = []
            for code in codes:
                axes.append(code if len(k.extents) == 1 else self.temp(code, "x"))
            region = Region({}, {}, {}, {"x": xmask} if ragged else {}, frozenset({"x"}),
                            "[XBLOCK, 1]" if two_d else "[XBLOCK]")
            self.axis_codes = axes
        else:
            region = Region({}, {}, {}, {}, frozenset(), "[]")
            self.axis_codes = []
        if plan.rblock is not None:
            self.constexprs["RBLOCK"] = plan.rblock
        self.top = len(self.lines)  # the tile indices shared by persistent stages follow
        self.parts(region)

    def body(self) -> list[str]:
        return self.lines[:self.top] + self.shared_lines + self.lines[self.top:]

    def line_at_top(self, text: str) -> None:
        """Tile indices shared by persistent stages are defined once, before any statement."""
        self.shared_lines.append("    " + text)

    def shape_for_axes(self, axes: frozenset[str]) -> str:
        if axes == {"x"}:
            return "[XBLOCK, 1]" if self.two_d else "[XBLOCK]"
        if axes == {"x", "r"}:
            return "[XBLOCK, RBLOCK]"
        if axes == {"r"}:
            return "[1, RBLOCK]" if self.kernel.extents else "[RBLOCK]"
        return super().shape_for_axes(axes)

    def tiles_inner(self, region: Region) -> bool:
        """Whether loops in ``region`` may become inner ``RBLOCK`` tiles (not inside one already)."""
        return "r" not in region.axes and self.rblock is not None

    def stage(self, s: For, chain: list[For], body: Stmt, region: Region) -> bool:
        return self.tiles_inner(region) and self.pointwise_stage(s, chain, body, region)

    def reduction(self, chain: list[For], op: Binop, target: Store | SetLocal, value: Expr, region: Region,
                  deferred: tuple | None) -> None:
        """A reduction stage where the tiling tiles inner loops and the reduction regroups
        (stages.py, :func:`~ocannl.backends.triton.stages.tiled_reduction`); else in order."""
        if self.tiles_inner(region) and stages.tiled_reduction(op, target, chain):
            self.reduction_stage(chain, op, target, value, region, deferred)
        else:
            self.sequential_reduction(chain, op, target, value, region, deferred)

    def stage_index(self, extents: tuple[int, ...], region: Region,
                    piece: tuple[str, int] | None = None) -> tuple[Region, bool, list[str]]:
        """Enter an inner tile over ``extents``: returns its region and whether a loop over
        chunks was opened (the caller closes it with :meth:`end_stage`). ``piece``, ``(start,
        length)``: only the ``length`` points from ``start`` (code) on, a split reduction's slice
        (``length`` a multiple of ``RBLOCK``)."""
        total = math.prod(extents)
        persistent = total <= self.rblock and piece is None
        expand = "[None, :]" if self.kernel.extents else ""
        key = ("stage", extents)
        if persistent:
            if self.persistent_rindex is None:
                self.persistent_rindex = self.names.word("rindex")
                self.line_at_top(f"{self.persistent_rindex} = tl.arange(0, RBLOCK){expand}")
            rindex = self.persistent_rindex
            if key in self.stage_vars:
                mask, codes = self.stage_vars[key]
            else:
                mask = None
                if total != self.rblock:
                    mask = self.names.numbered("rmask")
                    self.line_at_top(f"{mask} = {rindex} < {total}")
                codes = []
                for d in decompose(rindex, extents):
                    if len(extents) == 1:
                        codes.append(d)
                    else:
                        n = self.names.numbered("r")
                        self.line_at_top(f"{n} = {d}")
                        codes.append(n)
                self.stage_vars[key] = (mask, codes)
        else:
            roffset = self.names.numbered("roffset")
            self.line(f"for {roffset} in range(0, {total if piece is None else piece[1]}, RBLOCK):")
            self.depth += 1
            self.push()
            start = "" if piece is None else f"{piece[0]} + "
            rindex = self.temp(f"{start}{roffset} + tl.arange(0, RBLOCK){expand}", "rindex")
            ragged = total % (self.rblock if piece is None else piece[1])
            mask = self.temp(f"{rindex} < {total}", "rmask") if ragged else None
            codes = [d if len(extents) == 1 else self.temp(d, "r") for d in decompose(rindex, extents)]
        axes = region.axes | {"r"}
        inner = region.child(axes=axes, shape=self.shape_for_axes(axes))
        if mask is not None:
            inner.masks["r"] = mask
        return inner, not persistent, codes

    def end_stage(self, looped: bool) -> None:
        if looped:
            self.pop()
            self.depth -= 1

    def pointwise_stage(self, s: For, chain: list[For], body: Stmt, region: Region) -> bool:
        """The nest ``s`` as an inner stage, when it is one (stages.py,
        :func:`~ocannl.backends.triton.stages.pointwise_stage`)."""
        if not stages.pointwise_stage(s, chain, body):
            return False
        extents = tuple(loop.extent for loop in chain)
        inner, looped, codes = self.stage_index(extents, region)
        for t, (loop, code) in enumerate(zip(chain, codes)):
            inner.symbols[loop.symbol] = (code, frozenset({"r"}))
            inner.bounds[loop.symbol] = (0, loop.extent - 1)
            inner.canon[loop.symbol] = ("inner", extents, t) if not looped else ("chunk", loop.symbol)
        self.stmt(body, inner)
        self.end_stage(looped)
        return True

    def reduction_stage(self, chain: list[For], op: Binop, target: Store | SetLocal, value: Expr,
                        region: Region, deferred: tuple | None = None) -> None:
        """The loops' points as ``rindex`` tiles, each tile's terms combined by the operator of
        ``op``'s :class:`~ocannl.lowlevel.schedule.Regrouping` (``tl.sum``, ``tl.max``,
        ``tl.min``, ``tlib.product``) and applied to the accumulator with ``op`` (a sum's or a
        product's order differs from the loop's)."""
        combine = regrouping(op, accumulator_dtype(target)).combine
        acc = self.accumulator(target, region)
        extents = tuple(loop.extent for loop in chain)
        dtype = value.dtype
        neutral = _NEUTRAL[combine](dtype)
        piece, chunk_op = None, op  # how each chunk's combined terms update ``acc``
        if self.splits(math.prod(extents)):
            # This program combines one slice's terms, from the operator's neutral value; the
            # tile's last program combines the slices and applies the result to the cell once.
            initial, chunk_op = acc, combine
            acc = self.names.word("partial")
            self.line(f"{acc} = tl.full({region.shape}, {literal_code(neutral, dtype)}, {dtype.triton_name})")
            plan = self.plan
            piece = (self.temp(f"{self.split_pid} * {plan.slice_terms}", "r_start"), plan.slice_terms)
        length = math.prod(extents) if piece is None else piece[1]
        compensated = combine is Binop.ADD and value.dtype.is_float and length > self.rblock
        if compensated:  # the chunk sums are added with Kahan's compensation (see below)
            carry = self.names.word("carry")
            self.line(f"{carry} = tl.zeros_like({acc})")
        inner, looped, codes = self.stage_index(extents, region, piece)
        for t, (loop, code) in enumerate(zip(chain, codes)):
            inner.symbols[loop.symbol] = (code, frozenset({"r"}))
            inner.bounds[loop.symbol] = (0, loop.extent - 1)
            inner.canon[loop.symbol] = ("inner", extents, t) if not looped else ("chunk", loop.symbol)
        v = self.expr(value, inner)
        tile = self.arithmetic.tensor(v)
        if "r" in inner.masks:  # lanes past the ragged end add nothing
            tile = f"tl.where({inner.masks['r']}, {tile}, {literal_code(neutral, dtype)})"
        elif "r" not in v.axes:
            tile = f"tl.broadcast_to({tile}, {inner.shape})"
        axis = "axis=1, keep_dims=True" if region.axes else "axis=0"
        reduced = self.combined(combine, tile, axis)
        if compensated:
            # Each chunk is a tl.sum tree; adding the chunk sums one after the other would lose
            # their low bits once the total is large (1.5e-5 relative on 2^20 equal float32
            # terms). Kahan's compensation carries the rounding error of each addition into the
            # next, so the sum stays as accurate as one tree; the carry is dropped once the total
            # is not finite, where it would turn an infinity into a NaN. A subtraction adds the
            # negated chunk sums (negation is exact).
            y, total = self.names.numbered("y"), self.names.numbered("t")
            self.line(f"{y} = {'-' if chunk_op is Binop.SUB else ''}{reduced} - {carry}")
            self.line(f"{total} = {acc} + {y}")
            self.line(f"{carry} = tl.where(tl.abs({total}) < float('inf'), ({total} - {acc}) - {y}, 0.0)")
            self.line(f"{acc} = {total}")
        else:
            self.line(f"{acc} = {self.apply(chunk_op, Val(acc, region.axes, dtype), Val(reduced, region.axes, dtype))}")
        self.end_stage(looped)
        if piece is not None:
            flat = bool(self.kernel.extents)
            self.combine_slices(acc, combine, dtype, "tl.arange(0, XBLOCK)[:, None]" if flat else None,
                                self.plan.blocks.xblock if flat else 1, self.plan.tiles)
            partials = Val(acc, region.axes, dtype)
            acc = initial
            self.line(f"{acc} = {self.apply(op, Val(acc, region.axes, dtype), partials)}")
        self.finish_accumulation(target, acc, region, deferred)

    def splits(self, terms: int) -> bool:
        """Whether the reduction stage about to be written over ``terms`` points is the one the
        plan splits (:attr:`FlatPlan.split`): the kernel's first of that length, run once per
        program (not inside a sequential loop), before the kernel stores anything (so that every
        program of a tile may run what comes before it, and only the last what follows)."""
        plan = self.plan
        return (isinstance(plan, FlatPlan) and plan.split > 1 and self.split_last is None and not self.stored
                and terms == plan.split_terms and self.depth == 1)

    def combine_partials(self, acc: str, combine: Binop, dtype: DType, base: str, at: str, split: int,
                         tile_cells: int) -> None:
        """The slices' partial results (at ``base``, each cell's at offset ``at``: none for a
        scalar reduction) loaded as one tile and combined by a tree, whose shape fixes its order."""
        width = tiling.next_power_of_2(split)
        slices = self.temp(f"tl.arange(0, {width})" + ("" if not at else "[None, :]"), "k")
        neutral = literal_code(_NEUTRAL[combine](dtype), dtype)
        mask = "" if width == split else f", mask={slices} < {split}, other={neutral}"
        loaded = self.temp(f'tl.load({base}{at} + {slices} * {tile_cells}{mask}, cache_modifier=".cg")', "p")
        self.line(f"{acc} = {self.combined(combine, loaded, 'axis=0' if not at else 'axis=1, keep_dims=True')}")

    def combined(self, combine: Binop, tile: str, axis: str) -> str:
        """The code combining a tile's terms along ``axis`` with ``combine``."""
        if combine is Binop.MUL:
            self.helpers.add("product")
        return f"{_TILE_COMBINE[combine]}({tile}, {axis})"


_TILE_COMBINE = {Binop.ADD: "tl.sum", Binop.MUL: "product", Binop.MAX: "tl.max", Binop.MIN: "tl.min"}
"""The tile operators of each combining operator (``product`` is tlib.py's)."""

_NEUTRAL = {Binop.ADD: lambda dtype: 0, Binop.MUL: lambda dtype: 1, Binop.MAX: dtypes.lowest, Binop.MIN: dtypes.highest}
"""The value each combining operator of a regrouped reduction starts from (what masked lanes add)."""
