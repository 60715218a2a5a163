"""CPU scheduling decisions for the C-family emitters (C, and the loops inside a Metal thread):
which contraction nests become register tiles, with which tile and block sizes, and which loops
run in parallel. It reads the loop IR and the reduction records of schedule.py and returns plain
data (:class:`ContractionPlan`); ``ocannl/backends/codegen.py`` prints what it decides.

**Register tiles** (:func:`plan_contraction`): a nest of parallel loops around reduction loops
accumulating into one cell per parallel iteration (matmul ``c[i,j] += a[i,k]*b[k,j]``) is worked
as ``mr x nr`` tiles of cells held in registers, the reduction loops inside, the column loop
unit-stride, the outermost reduction loop blocked for the cache. Each cell still adds its terms
in the interpreter's order, so results stay bit-identical; only which cell is worked on when
changes. A sum in blocks (summation.py) is tiled as it is written.

**Parallel loops** (:func:`parallel_safe`, :data:`PARALLEL_MIN_WORK`): a parallel loop whose
iterations write disjoint cells and read no cell another iteration writes may run on threads;
it is worth it from :data:`PARALLEL_MIN_WORK` innermost iterations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import AxisIndex, Iter, Symbol
from ocannl.lowlevel.ir import (
    Const, Expr, Fill, For, GetLocal, Load, LoadDynamic, LocalScope, LoopKind, Stmt, Store, StoreDynamic, iter_exprs,
    iter_stmts, stmt_exprs, total_over_executions,
)
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.schedule import block_terms, blocked_reduction_of, reduction_of
from ocannl.lowlevel.tnode import TNode

PARALLEL_MIN_WORK = 1 << 17
"""A loop nest gets a parallel pragma when it runs at least this many innermost iterations
(about 0.1 ms of single-threaded work): below that, starting the threads costs more than it
saves."""

TILE_MIN_WORK = 4096
"""A contraction is register-tiled when (parallel cells) x (reduction steps) reaches this; smaller
ones print as plain loops, which read better and run as fast."""

TILE_ROWS = 4
TILE_BYTES = 64
"""A register tile is ``TILE_ROWS`` cells of the row loop by ``TILE_BYTES / itemsize`` cells of
the unit-stride column loop (4 x 16 floats): 64 independent accumulators, enough to hide the
adder latency that an in-order sum per cell would otherwise expose."""

REDUCTION_BLOCK = 128
"""The reduction steps a tile runs before moving on to the next tile (cache blocking of the
outermost reduction loop)."""


@dataclass(frozen=True)
class ContractionPlan:
    """How a contraction nest is worked in register tiles (see :func:`plan_contraction`; printed by
    ``codegen.Emitter.contraction``).

    ``parallel`` are the loops that index the written cell, ``reductions`` the others, each in
    nest order (the order of ``reductions`` is each cell's summation order and never changes).
    ``rows`` and ``cols`` are the parallel loops tiled ``mr x nr`` (``cols`` unit-stride),
    ``outer`` the other parallel loops; the first reduction loop runs in blocks of ``block`` steps
    when ``block`` is set. The accumulator of a cell starts from the cell itself (after ``reset``,
    hoisted into a nest of its own, when there is one), or, when ``scope`` is set, from ``init``
    in that local scope's variable, and the store's value is then computed from it.
    """

    nest: For
    parallel: tuple[tuple[Symbol, int], ...]
    outer: tuple[tuple[Symbol, int], ...]
    rows: tuple[Symbol, int] | None
    cols: tuple[Symbol, int] | None
    mr: int
    nr: int
    reductions: tuple[tuple[Symbol, int], ...]
    block: int | None
    store: Store
    op: Binop
    term: Expr
    reset: Const | None = None
    scope: LocalScope | None = None
    init: Const | None = None
    blocks: Stmt | None = None
    """The reduction in blocks (ocannl/lowlevel/summation.py): loops around leaf stores
    ``out[I] := out[I] + v { loops { v := v op term } }``; each leaf sums its block from zero in
    the tile's registers and adds it to the cell (``reductions`` is then empty)."""

    @property
    def work(self) -> int:
        terms = math.prod(n for _, n in self.reductions) if self.blocks is None else block_terms(self.blocks)
        return math.prod(n for _, n in self.parallel) * terms

    @property
    def accumulator_dtype(self) -> DType:
        return self.scope.local.dtype if self.scope is not None else self.store.tnode.dtype.compute


def plan_contraction(loop: For) -> ContractionPlan | None:
    """The register-tiling plan of the nest headed by ``loop``, or ``None`` when it is not a
    contraction worth tiling.

    A contraction accumulates into one cell per iteration of its *parallel* loops, the loops
    that index the written cell, over its *reduction* loops. Three forms reach the emitter, read
    as one :class:`~ocannl.lowlevel.schedule.Reduction` record:

    * a perfect nest of loops, in any order, around ``out[I] := out[I] <op> term`` (``I`` indexed
      by the parallel loops only; gradients put the batch reduction outermost);
    * parallel loops around ``out[I] := neutral`` followed by reduction loops around that store
      (the lowering of ``=:+``);
    * parallel loops around ``out[I] := f(v { v := init; <reduction loops> { v := v <op> term } })``
      (a reduction inlined into its consumer by the optimizer).

    ``term`` must not read ``out`` nor use other locals. Each parallel iteration owns its cell, so
    cells can be computed in any order, and in registers, as long as each cell's own steps keep
    their order: reduction loops stay in their nest order, inside the parallel ones.
    """
    blocked = _plan_blocked_contraction(loop)
    if blocked is not None:
        return blocked
    found = reduction_of(loop)
    if found is None or not found.separable or (found.scope is not None and found.parallel != found.around):
        return None
    store, op, term, scope, init = found.store, found.op, found.term, found.scope, found.init
    reset = found.reset.value if found.reset is not None else None
    out, idx = store.tnode, store.indices
    if scope is not None and any(isinstance(e, (Load, LoadDynamic)) and e.tnode is out and e.indices != idx
                                 for e in iter_exprs(store.value)):
        return None
    for e in iter_exprs(term):
        if isinstance(e, (GetLocal, LocalScope)) or (isinstance(e, (Load, LoadDynamic)) and e.tnode is out):
            return None
    parallel = [(f.symbol, f.extent) for f in found.parallel]
    reductions = list(found.loop_extents)
    if not reductions:
        return None
    p_volume = math.prod(n for _, n in parallel)
    r_volume = math.prod(n for _, n in reductions)
    if not parallel or p_volume < 8 or r_volume < 4 or p_volume * r_volume < TILE_MIN_WORK:
        return None

    cols = _choose_cols(parallel, idx, term)
    others = [p for p in parallel if cols is None or p[0] is not cols[0]]
    rows = others[-1] if others else None
    outer = tuple(p for p in others if rows is None or p[0] is not rows[0])
    itemsize = (scope.local.dtype if scope is not None else out.dtype.compute).itemsize
    nr = min(TILE_BYTES // itemsize, cols[1]) if cols else 1
    mr = min(TILE_ROWS, rows[1]) if rows else 1
    inner = math.prod(n for _, n in reductions[1:])
    block = max(1, REDUCTION_BLOCK // inner)
    return ContractionPlan(
        nest=loop,
        parallel=tuple(parallel),
        outer=outer,
        rows=rows,
        cols=cols,
        mr=mr,
        nr=nr,
        reductions=tuple(reductions),
        block=block if block < reductions[0][1] else None,
        store=store,
        op=op,
        term=term,
        reset=reset,
        scope=scope,
        init=init,
    )


def _plan_blocked_contraction(loop: For) -> ContractionPlan | None:
    """The plan of a contraction whose reduction is in blocks of the summation order
    (``ContractionPlan.blocks``, recognized by
    :func:`~ocannl.lowlevel.schedule.blocked_reduction_of`), when it is worth tiling."""
    found = blocked_reduction_of(loop)
    if found is None:
        return None
    parallel = [(f.symbol, f.extent) for f in found.around]
    p_volume = math.prod(n for _, n in parallel)
    if p_volume < 8 or p_volume * found.volume < TILE_MIN_WORK:
        return None
    store, term = found.store, found.term
    cols = _choose_cols(parallel, store.indices, term)
    others = [p for p in parallel if cols is None or p[0] is not cols[0]]
    rows = others[-1] if others else None
    return ContractionPlan(
        nest=loop,
        parallel=tuple(parallel),
        outer=tuple(p for p in others if rows is None or p[0] is not rows[0]),
        rows=rows,
        cols=cols,
        mr=min(TILE_ROWS, rows[1]) if rows else 1,
        nr=min(TILE_BYTES // store.tnode.dtype.compute.itemsize, cols[1]) if cols else 1,
        reductions=(),
        block=None,
        store=store,
        op=found.op,
        term=term,
        reset=found.reset.value if found.reset is not None else None,
        scope=found.scope,
        init=found.init,
        blocks=found.blocks,
    )


def _choose_cols(
    parallel: list[tuple[Symbol, int]], out_idx: tuple[AxisIndex, ...], term: Expr
) -> tuple[Symbol, int] | None:
    """The column (vector) loop: the one indexing the result's last axis, where cells are
    adjacent; else the one indexing the last axis of the most loads of ``term``."""
    by_symbol = {s: (s, n) for s, n in parallel}
    if out_idx and isinstance(out_idx[-1], Iter) and out_idx[-1].symbol in by_symbol:
        return by_symbol[out_idx[-1].symbol]
    counts: dict[Symbol, int] = {}
    for e in iter_exprs(term):
        if isinstance(e, Load) and e.indices and isinstance(e.indices[-1], Iter):
            s = e.indices[-1].symbol
            if s in by_symbol:
                counts[s] = counts.get(s, 0) + 1
    if not counts:
        return None
    return by_symbol[max(counts, key=lambda s: counts[s])]


def work(stmt: Stmt) -> int:
    """The number of innermost statement executions of ``stmt`` (a loop nest's cost); a fill
    counts one per cell."""
    return total_over_executions(stmt, lambda s: s.tnode.size if isinstance(s, Fill) else 1)


def parallel_safe(loop: For) -> bool:
    """Whether the iterations of ``loop`` may run concurrently: it is a parallel loop (its stores
    index their node by the loop's own index, so iterations write disjoint cells), and every node
    it writes is read back only at the cell the same iteration writes."""
    if loop.kind is not LoopKind.PARALLEL:
        return False
    written: dict[TNode, set[tuple[AxisIndex, ...] | None]] = {}  # None: a dynamic index
    for s in iter_stmts(loop.body):
        if isinstance(s, Fill):
            return False
        if isinstance(s, (Store, StoreDynamic)):
            written.setdefault(s.tnode, set()).add(s.indices if isinstance(s, Store) else None)
    for s in iter_stmts(loop.body):
        for e in (sub for top in stmt_exprs(s) for sub in iter_exprs(top)):
            if isinstance(e, LoadDynamic) and e.tnode in written:
                return False
            if isinstance(e, Load) and e.tnode in written:
                if written[e.tnode] != {e.indices}:
                    return False
    return True
