"""Writes that the next write to the same cells makes redundant (docs/compiler.md, "Overwrites").

A training step resets every gradient to zero with a fill, then adds each contribution into it
(docs/training.md, "Tensors and their code"): ``fill g := 0`` and later ``g[I] := g[I] + e``.
The fill costs a pass over memory (in an MLP, tens of megabytes of gradients) and, on a GPU, a
kernel launch, only to produce zeros that the first contribution reads once. Two passes move
such values into the write that consumes them; every cell keeps its final value bit for bit.

:func:`fold_fills` (before inlining, on the lowered nests, which are perfect):

1. **The first contribution overwrites.** A top-level ``fill g := c`` whose next access to
   ``g`` is a loop nest writing every cell of ``g`` and nothing else (:func:`first_write`) goes,
   and ``c`` moves into the nest. Without reduction loops each cell is written once, and ``g[I]
   := g[I] op e`` becomes ``g[I] := c op e``. With reduction loops, the loops that index ``g``
   move outside the others and the cell is reset inside them, ``for I { g[I] := c; for k { g[I]
   := g[I] op e } }``: each cell's terms keep their order, so its sum keeps its bits, and the
   nest has the reduction-with-reset shape of ``schedule.py``. The constant stays in ``c op e``:
   ``0.0 + e`` is not ``e`` when ``e`` is ``-0.0`` (``+0.0 + -0.0`` is ``+0.0``), and one addition
   costs nothing beside the pass over memory the fill cost; the simplifier removes it where that
   is exact (``1.0 * e``). So a gradient that passes another's values on is the copy ``a.grad[I]
   := 0.0 + b.grad[I]``, which the optimizer inlines where ``a.grad`` may be virtual.
2. **A fill overwritten by a fill** (``fill loss.grad := 0; fill loss.grad := 1``) goes. A fill
   that stays gives its constant to the reads of its node up to the node's next write
   (``loss.grad[] * 0.25`` becomes ``1.0 * 0.25``, which folds).

:func:`forward_stores` (after inlining, which shows the terms of the reductions):

3. **A store overwritten by the next statement** of a sequence, at the same cell, goes: when
   the next store does not read the cell, the first one was dead; when it reads it once,
   unconditionally, the stored value is forwarded into that read. For that, a top-level nest
   computing each cell of a node on its own, followed by a nest updating each of those cells,
   becomes one nest (:func:`_fused`). A gradient's two contributions (``g := 0.0 + a * b`` and
   ``g := g + b * a``, from ``x * x``) become one store, ``g := (0.0 + a * b) + b * a``. A mean
   (``mean[I] := 0; for k { mean[I] := mean[I] + x[I, k] }``, then ``mean[I] := mean[I] *
   0.03125``) stores each cell once, ``mean[I] := v { v := 0; for k { v := v + x[I, k] } } *
   0.03125``: the reduction inlined into its consumer, a shape every backend schedules as one
   reduction. Reductions whose terms are reductions themselves stay in their cell.

"Every cell" (:func:`_owning_loops`): each axis of the store indexed by one loop spanning it, or
by loops that are the digits of a mixed-radix number (``2*oh + wh``, ``wh`` over 2, ``oh`` over
half the axis): the gradient of a pooling whose window equals its stride writes each cell of its
input once, so it needs neither the zeros nor a read of the cell.

Refused, each time: partial coverage (a slice, a fixed index, a strided index that skips cells or
reaches one twice, an index symbol bound at run time, a data-dependent index: scatter-adds), a
read of the node between the two writes or
at another cell, a store that skips out-of-bounds cells, a nest that writes other nodes too, and
nodes of a storage type (float16, bfloat16: a load of a stored value rounds it, which a constant
or a local would skip). The first write covers every cell, so no rewrite needs the value a node
had before the routine: routine inputs and outputs, and gradients the user reads, keep their
values; only how their zeros are produced changes.

The summation order (``summation.py``) runs after the optimizer and blocks the rewritten
reductions as it blocked the originals: each cell's blocks are summed from zero and added to
the start value, which the reset now writes instead of the fill.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import (
    accesses, all_exprs, all_stmts, loop_chain, nodes_read, nodes_written, substitute_index,
)
from ocannl.lowlevel.indexing import Affine, AxisIndex, Fixed, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local, LocalScope, RoutineIR, Seq, SetLocal, Stmt,
    Store, StoreDynamic, iter_stmts, nest, seq, top_level, unconditional_exprs,
)
from ocannl.lowlevel.rewrite import Rewriter
from ocannl.lowlevel.schedule import update_of
from ocannl.lowlevel.tnode import TNode


def fold_fills(routine: RoutineIR) -> RoutineIR:
    """``routine`` with rewrites 1 and 2 of the module docstring: each fill folded into the first
    write of its node, or dropped when a fill overwrites it, or else its constant forwarded to
    the reads before the next write."""
    statements = top_level(routine.body)
    folded = _fold_fills(list(statements))
    if len(folded) == len(statements) and all(a is b for a, b in zip(folded, statements)):
        return routine
    return replace(routine, body=seq(*folded))


def forward_stores(routine: RoutineIR) -> RoutineIR:
    """``routine`` with rewrite 3 of the module docstring: a store that the next statement
    overwrites removed, its value forwarded into that statement."""
    statements = top_level(routine.body)
    fused = _fuse_updates(list(statements))
    body = _Forwarding().stmt(seq(*fused))
    after = top_level(body)
    if len(after) == len(statements) and all(a is b for a, b in zip(after, statements)):
        return routine
    return replace(routine, body=body)


# ---------------------------------------------------------------------------------------------
# Rewrites 1 and 2: fills


def _fold_fills(statements: list[Stmt]) -> list[Stmt]:
    """Rewrites 1 and 2 on the top-level ``statements``. Each statement's accessed nodes are
    collected once, so the pass takes time linear in the routine."""
    accessed_at: dict[TNode, list[int]] = {}
    for position, s in enumerate(statements):
        for node in nodes_read(s) | nodes_written(s):
            accessed_at.setdefault(node, []).append(position)
    out: list[Stmt | None] = list(statements)
    for position, s in enumerate(statements):
        if not isinstance(s, Fill):
            continue
        positions = accessed_at[s.tnode]
        following = bisect.bisect_right(positions, position)
        if following == len(positions):
            continue  # the fill is the node's last write: its value is the result
        q = positions[following]
        later = out[q]
        if isinstance(later, Fill):
            out[position] = None
            continue
        rewritten = first_write(later, s)
        if rewritten is not None:
            out[q], out[position] = rewritten, None
        elif _compute_typed(s.tnode):
            _forward_fill(out, s, positions[following:])
    return [s for s in out if s is not None]


def _forward_fill(statements: list[Stmt | None], fill: Fill, readers: list[int]) -> None:
    """The fill's constant in place of the reads of its node in the statements at ``readers``
    up to the next one that writes the node (``loss.grad[] * 0.25`` becomes ``1.0 * 0.25``, which
    folds). Reads that may fall outside the node or go through a data-dependent index stay."""
    forward = _Substitute(fill.tnode, None, fill.value)
    for q in readers:
        stmt = statements[q]
        if stmt is None or any(a.write and a.node is fill.tnode for a in accesses(stmt, fills=True)):
            return
        statements[q] = forward.stmt(stmt)


def first_write(nest: Stmt, fill: Fill) -> Stmt | None:
    """``nest`` computing from the start value ``fill`` writes, so that the fill can go (rewrite
    1 of the module docstring), or ``None`` when ``nest`` does not write every cell of the
    filled node before reading it, or writes another node."""
    node, start = fill.tnode, fill.value
    if not _compute_typed(node):
        return None
    chain, body = loop_chain(nest)
    if not isinstance(body, Store) or body.tnode is not node or body.skip_oob:
        return None
    owned = _owning_loops(body, chain)
    if owned is None:
        return None
    reads = [e for e in all_exprs(body.value) if isinstance(e, (Load, LoadDynamic)) and e.tnode is node]
    if any(not isinstance(e, Load) or e.indices != body.indices or e.oob_value is not None for e in reads):
        return None  # it reads other cells of the node, whose start value it would need
    if not reads:
        return nest  # a plain overwrite: the fill is dead
    reductions = [f for f in chain if f.symbol not in owned]
    if not reductions:
        return _rebuild(chain, replace(body, value=_Substitute(node, body.indices, start).expr(body.value)))
    reset = Store(node, body.indices, start)
    inner = _rebuild(reductions, body)
    return _rebuild([f for f in chain if f.symbol in owned], seq(reset, inner))


def _owning_loops(store: Store, chain: list[For]) -> set[Symbol] | None:
    """The loops of ``chain`` that index ``store``'s cell, when together they reach every cell of
    its node exactly once per run of the other loops (each axis indexed by loops of its own that
    enumerate it, :func:`_axis_loops`, or by 0 on a size-1 axis), and every other loop runs at
    least once; else ``None``."""
    extents = {f.symbol: f.extent for f in chain}
    owned: set[Symbol] = set()
    for idx, dim in zip(store.indices, store.tnode.dims):
        if isinstance(idx, Fixed) and idx.index == 0 and dim == 1:
            continue
        axis_loops = _axis_loops(idx, dim, extents)
        if axis_loops is None or not owned.isdisjoint(axis_loops):
            return None
        owned.update(axis_loops)
    if any(n < 1 for s, n in extents.items() if s not in owned):
        return None
    return owned


def _axis_loops(idx: AxisIndex, dim: int, extents: dict[Symbol, int]) -> list[Symbol] | None:
    """The loops indexing an axis of ``dim`` cells, when their values reach each cell exactly
    once, else ``None``: one loop spanning the axis (``i``), or loops read as the digits of a
    mixed-radix number (``s*o + w`` with ``extent(w) == s`` and ``s * extent(o) == dim``: the
    gradient of a pooling whose window equals its stride writes each input cell once). Sorted by
    coefficient, the first must be 1 and each next one the product of the extents before it, the
    last product ``dim``, the offset 0. Overlapping windows (``2*o + w``, ``w`` over 3), gaps
    (``2*o``), a ragged end (the last cell of an odd axis never written) and index symbols
    bound at run time fail it."""
    if isinstance(idx, Iter):
        terms = ((1, idx.symbol),)
    elif isinstance(idx, Affine) and idx.offset == 0:
        terms = tuple(sorted(idx.terms, key=lambda term: term[0]))
    else:
        return None
    span = 1
    for coefficient, symbol in terms:
        if coefficient != span or symbol not in extents:
            return None
        span *= extents[symbol]
    symbols = [symbol for _, symbol in terms]
    if span != dim or len(set(symbols)) != len(symbols):
        return None
    return symbols


def _rebuild(loops: list[For], body: Stmt) -> Stmt:
    """``body`` inside ``loops`` (outermost first), each loop's kind decided anew."""
    return nest([(f.symbol, f.extent) for f in loops], body)


class _Substitute(Rewriter):
    """Replaces every read of one cell (``cell``; ``None``: of every cell) by a value; reads that
    may fall outside the node keep their own value there, and stay."""

    def __init__(self, node: TNode, cell: tuple[AxisIndex, ...] | None, value: Expr):
        self.node, self.cell, self.value = node, cell, value

    def expr(self, e: Expr) -> Expr:
        if (isinstance(e, Load) and e.tnode is self.node and e.oob_value is None
                and (self.cell is None or e.indices == self.cell)):
            return self.value
        return self.rebuild_expr(e)


# ---------------------------------------------------------------------------------------------
# Rewrite 3: stores overwritten by the next statement


def _fuse_updates(statements: list[Stmt]) -> list[Stmt]:
    """Rewrite 3's first step: a top-level nest that computes each cell of a node on its own,
    directly followed by a nest updating each of those cells (``mean[I] := mean[I] * 0.03125``,
    a gradient's second contribution), becomes one nest running the update right after the cell
    is computed, where :class:`_Forwarding` then forwards the cell. A comment between the two
    (a new section of the step) keeps them apart."""
    out: list[Stmt] = []
    for s in statements:
        fused = _fused(out[-1], s) if out else None
        if fused is not None:
            out[-1] = fused
        else:
            out.append(s)
    return out


def _fused(first: Stmt, update: Stmt) -> Stmt | None:
    """``first`` (loops ``P`` reaching each cell ``I`` of a node once, around statements that
    write only that cell and read the node only there: a pointwise store, a reduction with its
    reset, earlier updates) and ``update`` (loops of the same extents around one store ``n[J] :=
    f(n[J])``, ``J`` reaching each cell once) as one nest, or ``None``.

    Running each cell's update right after its computation is the same computation: the first
    nest's other iterations neither read nor write that cell, and the update touches nothing
    else the first nest reads or writes."""
    update_chain, update_body = loop_chain(update)
    if not (isinstance(update_body, Store) and update_body.tnode in nodes_written(first) and not update_body.skip_oob):
        return None  # most pairs of statements: asked first, since it costs less than tracing ``first``
    chain, body = loop_chain(first)
    cells = {(a.node, a.indices) for a in accesses(body, fills=True) if a.write}
    if len(cells) != 1 or any(isinstance(s, (Fill, StoreDynamic)) or (isinstance(s, Store) and s.skip_oob)
                              for s in iter_stmts(body)):
        return None
    ((node, cell),) = cells
    defining = next(s for s in iter_stmts(body) if isinstance(s, Store))
    owned = _owning_loops(defining, chain)
    if owned is None or len(owned) != len(chain):
        return None
    if any(a.node is node and a.indices != cell for a in accesses(body)):
        return None  # some iteration reads a cell another one computes
    if update_body.tnode is not node:
        return None
    updated = _owning_loops(update_body, update_chain)
    if updated is None or len(updated) != len(update_chain) or len(update_chain) != len(chain):
        return None  # the update does not run once per cell
    if any(isinstance(mine, Affine) for mine in update_body.indices):
        return None  # a strided update: its loops do not map one to one onto the first nest's
    env: dict[Symbol, Iter] = {}  # the update's loops renamed to the first nest's, axis by axis
    for mine, theirs in zip(update_body.indices, cell):
        if isinstance(mine, Iter):
            if not isinstance(theirs, Iter):
                return None
            env[mine.symbol] = theirs
    extents = {f.symbol: f.extent for f in chain}
    if any(extents.get(env[f.symbol].symbol) != f.extent for f in update_chain):
        return None
    moved = _Rename(env).stmt(update_body)
    if any(a.node is node and a.indices != cell for a in accesses(moved)):
        return None  # the update reads other cells, which the first nest has not finished
    return _rebuild(chain, seq(body, moved))


class _Rename(Rewriter):
    """Replaces loop symbols by other loop indices."""

    def __init__(self, env: dict[Symbol, Iter]):
        self.env = env

    def index(self, i: AxisIndex) -> AxisIndex:
        return substitute_index(i, self.env)


class _Forwarding(Rewriter):
    """Rewrite 3 in every sequence of statements (loop bodies included)."""

    def stmt(self, s: Stmt) -> Stmt:
        s = self.rebuild_stmt(s)
        if not isinstance(s, Seq):
            return s
        forwarded = _forward(list(s.stmts))
        return s if len(forwarded) == len(s.stmts) else seq(*forwarded)


def _forward(stmts: list[Stmt]) -> list[Stmt]:
    """One sequence with every store overwritten by the next statement folded into it, left to
    right: ``n[I] := a; n[I] := f(n[I])`` is ``n[I] := f(a)``, and ``n[I] := a; loops { n[I] :=
    n[I] op e }; n[I] := f(n[I])`` is ``n[I] := f(v { v := a; loops { v := v op e } })``."""
    out: list[Stmt] = []
    for s in stmts:
        merged = _overwritten(out[-1], s) if out else None
        if merged is None and len(out) >= 2:
            scoped = _reduction_into_local(out[-2], out[-1])
            merged = _overwritten(scoped, s) if scoped is not None else None
            if merged is not None:
                del out[-1]
        if merged is not None:
            out[-1] = merged
        else:
            out.append(s)
    return out


def _overwritten(first: Stmt, second: Stmt) -> Store | None:
    """``second`` when it stores to the cell ``first`` stores to without reading it, ``second``
    with ``first``'s value in place of its one unconditional read of the cell, else ``None``."""
    if not (isinstance(first, Store) and isinstance(second, Store)):
        return None
    node, cell = first.tnode, first.indices
    if second.tnode is not node or second.indices != cell or first.skip_oob or second.skip_oob:
        return None
    if not _compute_typed(node):
        return None  # a load of the stored value rounds it to the node's precision
    reads = [a for a in accesses(second.value) if a.node is node]
    if not reads:
        return second
    if len(reads) != 1 or reads[0].indices != cell or not _read_unconditionally(second.value, node):
        return None
    return replace(second, value=_Substitute(node, cell, first.value).expr(second.value))


def _reduction_into_local(start: Stmt, nest: Stmt) -> Store | None:
    """``n[I] := a`` followed by loops around ``n[I] := n[I] op e`` (``e`` not reading ``n``) as
    ``n[I] := v { v := a; loops { v := v op e } }``, or ``None``: the same operations in the same
    order, the running value in a local instead of the cell."""
    if not (isinstance(start, Store) and isinstance(nest, For)) or start.skip_oob:
        return None
    node, cell = start.tnode, start.indices
    if not _compute_typed(node):
        return None
    chain, body = loop_chain(nest)
    if not (isinstance(body, Store) and body.tnode is node and body.indices == cell and not body.skip_oob):
        return None
    step = update_of(body)
    if step is None or any(a.node is node for a in accesses(step.term)):
        return None
    if any(isinstance(s, For) for s in all_stmts(step.term)):
        return None  # terms that are reductions themselves: the outer sum stays in the cell, where
        # tree-summing backends (Triton) reduce it across a program's lanes
    local = Local(node.dtype)
    update = SetLocal(local, Binary(step.op, GetLocal(local), step.term))
    return Store(node, cell, LocalScope(local, seq(SetLocal(local, start.value), _rebuild(chain, update))))


def _compute_typed(node: TNode) -> bool:
    """Whether a local can hold the node's values: a compute type other than uint4x32."""
    return node.dtype.is_compute_type and node.dtype is not dtypes.uint4x32


def _read_unconditionally(e: Expr, node: TNode) -> bool:
    """Whether a read of ``node`` in ``e`` is evaluated whenever ``e`` is: not in a branch of a
    ``where``, not in a local scope."""
    return any(isinstance(x, Load) and x.tnode is node for x in unconditional_exprs(e))
