"""Reductions recognized once, for every emitter that schedules them.

After optimization (and the summation order of ``summation.py``), a loop nest that reduces many
terms into each cell of a node reaches the backends in one of three shapes:

* a perfect nest, loops in any order, around ``out[I] := out[I] <op> term`` (``I`` indexed by the
  nest's *parallel* loops only; the others are its *reduction* loops);
* the same after a reset of the cell, ``out[I] := c`` followed by the reduction loops (the
  lowering of ``=:+``);
* loops around ``out[I] := f(v { v := init; <reduction loops> { v := v <op> term } })``: a
  reduction the optimizer inlined into its consumer ``f``.

:func:`reduction_of` recognizes all three and returns one :class:`Reduction` record: the store
of the cell, the operator and term, the loops (around the store and, for the third shape, inside
the local scope), and the start of the sum. A long float sum that the summation order has put
in blocks is read back by :func:`blocked_reduction_of` as the same record, its blocks attached.

Consumers decide what they can do with a record by their own limits -- the summation order
blocks it (``summation.find_accumulation``), C tiles it in registers
(``cpu_schedule.plan_contraction``), Metal sums it as a threadgroup tree (``metal/emit.py``) -- but
never re-derive its shape, so that a shape one of them learns every other sees the same way.
Recognition here is structural only: which operators, dtypes and sizes are worth scheduling is
the consumer's choice. :attr:`Reduction.separable` is the one semantic condition all of them
need (each cell owned by one parallel iteration and reset at most once).

:func:`update_of` is the innermost step alone (``x := x <op> term``), for passes that walk the
nest themselves (Triton's in-kernel reductions and its ``tl.dot`` contractions).

A sum of products ``a * b`` whose factors split the parallel loops into rows (read by ``a``
only) and columns (read by ``b`` only) is a :class:`Contraction`, recognized by
:func:`contraction_of` for both planners of matrix products: the CPU's packed GEMM
(``cpu_schedule.plan_gemm``, on the terms of a :class:`Reduction`) and Triton's ``tl.dot``
kernels (``backends/partition.py``, on an update statement found by walking the kernel's body).
Each keeps its own limits (dtypes, sizes, which factor comes first) and its own plan.
:func:`regrouping` says, for each accumulation operator, how its terms may be combined out of
loop order, and whether that is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from ocannl.lowlevel.analysis import expr_symbols, indices_symbols, loop_chain
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import AnySymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Const, Expr, For, GetLocal, Load, LoadDynamic, Local, LocalScope, LoopKind, Seq, SetLocal, Stmt, Store,
    Ternary, iter_exprs, iter_stmts, seq, total_over_executions,
)
from ocannl.lowlevel.scalar_ops import Binop, Ternop


@dataclass(frozen=True)
class Update:
    """One step of a reduction: ``statement`` sets its target (a cell or a local) to
    ``op(old, term)``; ``old`` is the target's current value."""

    op: Binop
    statement: Store | SetLocal
    term: Expr


def update_of(stmt: Stmt, commutative: frozenset[Binop] = frozenset()) -> Update | None:
    """The :class:`Update` ``stmt`` is when it is ``c[I] := op(c[I], term)`` or ``l := op(l,
    term)`` -- or ``op(term, old)`` for an ``op`` in ``commutative`` -- else ``None``. Whether
    ``term`` may read the target is the caller's question."""
    if isinstance(stmt, Store):
        old: Expr = Load(stmt.tnode, stmt.indices)
    elif isinstance(stmt, SetLocal):
        old = GetLocal(stmt.local)
    else:
        return None
    match stmt.value:
        case Binary(op=op, a=a, b=b) if a == old:
            return Update(op, stmt, b)
        case Binary(op=op, a=a, b=b) if b == old and op in commutative:
            return Update(op, stmt, a)
    return None


def product_factors(update: Store | SetLocal) -> tuple[Expr, Expr] | None:
    """``(a, b)`` when ``update`` sets its target to ``old + a * b`` (the sum in either order, or
    ``fma(a, b, old)``), else ``None``."""
    found = update_of(update, frozenset({Binop.ADD}))
    if found is not None:
        match found:
            case Update(op=Binop.ADD, term=Binary(op=Binop.MUL, a=a, b=b)):
                return a, b
        return None
    old = Load(update.tnode, update.indices) if isinstance(update, Store) else GetLocal(update.local)
    match update.value:
        case Ternary(op=Ternop.FMA, a=a, b=b, c=x) if x == old:
            return a, b
    return None


@dataclass(frozen=True)
class Contraction:
    """A sum of products ``a * b`` into one cell per iteration of the parallel loops, over the
    reduction loops ``k`` (``(symbol, extent)``, the order of each cell's terms). The parallel
    loops split into ``rows`` (read by ``a`` only), ``cols`` (read by ``b`` only) and ``batch``
    (read by both or neither), each in the order the planner gave them.

    ``update`` and ``site`` are set where the sum is one statement inside a chain of loops: the
    statement adding each product (a store into the cell, or the setting of a local the
    optimizer inlined the cell into) and the outermost loop of ``k``. A planner that reads the
    terms out of the summation order's blocks has no such statement."""

    a: Expr
    b: Expr
    rows: tuple[Symbol, ...]
    cols: tuple[Symbol, ...]
    batch: tuple[Symbol, ...]
    k: tuple[tuple[Symbol, int], ...]
    update: Store | SetLocal | None = None
    site: For | None = None

    def swapped(self) -> Contraction:
        """The same sum as ``b * a`` (bit for bit the same products): rows and columns trade
        places. Planners swap to put the output's contiguous direction in the columns."""
        return replace(self, a=self.b, b=self.a, rows=self.cols, cols=self.rows)


def contraction_of(
    a: Expr, b: Expr, parallel: Sequence[Symbol], k: Sequence[tuple[Symbol, int]], *,
    update: Store | SetLocal | None = None, site: For | None = None,
) -> Contraction | None:
    """The :class:`Contraction` of the products ``a * b`` over the reduction loops ``k`` with
    the parallel loops ``parallel``, or ``None`` when no parallel loop is read by ``a`` alone
    or none by ``b`` alone (a product of a matrix with a vector, or an outer product without
    rows: nothing to tile on both sides)."""
    sa, sb = expr_symbols(a), expr_symbols(b)
    rows = tuple(s for s in parallel if s in sa and s not in sb)
    cols = tuple(s for s in parallel if s in sb and s not in sa)
    if not rows or not cols:
        return None
    batch = tuple(s for s in parallel if s not in rows and s not in cols)
    return Contraction(a, b, rows, cols, batch, tuple(k), update, site)


@dataclass(frozen=True)
class Regrouping:
    """How a reduction ``x := x op t`` over the terms ``t_1 .. t_n`` may be computed out of loop
    order: as ``x op (t_1 combine t_2 combine .. combine t_n)``, the terms combined among
    themselves in any grouping (a tree, chunks) and the result applied to the start once with
    ``op`` itself. A subtraction is a sum of negated terms (``x - t_1 - t_2 = x - (t_1 + t_2)``),
    a division by each term a division by their product.

    ``exact``: every grouping gives the loop's result bit for bit (integer arithmetic wraps, so
    it is associative; max and min pick one of their operands). Otherwise the results agree up to
    rounding, as reordered float sums do (a few ulps on moderate sums)."""

    combine: Binop
    exact: bool


def regrouping(op: Binop, dtype: DType) -> Regrouping | None:
    """The :class:`Regrouping` of an accumulation with ``op`` carried in ``dtype``, or ``None``
    when the loop's order is part of the result: an integer division truncates at every step,
    and its divisors' product may wrap. Whether a consumer regroups is its own choice (a float16
    accumulator, rounded on every store, follows the loop whatever this says)."""
    match op:
        case Binop.MAX | Binop.MIN:
            return Regrouping(op, exact=True)
        case Binop.ADD | Binop.SUB:
            return Regrouping(Binop.ADD, exact=not dtype.is_float)
        case Binop.MUL:
            return Regrouping(Binop.MUL, exact=not dtype.is_float)
        case Binop.DIV if dtype.is_float:
            return Regrouping(Binop.MUL, exact=False)
    return None


@dataclass(frozen=True)
class Reduction:
    """A nest reducing ``term`` with ``op`` into the cell ``store`` writes (module docstring).

    ``around`` are the loops around ``store``, outermost first; ``inner`` the loops inside the
    local ``scope`` (third shape only). The sum starts from the constant the ``reset`` store
    writes when there is one (second shape; it sits inside the first ``reset_depth`` loops of
    ``around``), from ``init`` in the scope's variable (third shape; ``None``: the variable's
    zero), else from the cell's current value.
    """

    store: Store
    op: Binop
    term: Expr
    around: tuple[For, ...]
    inner: tuple[For, ...] = ()
    reset: Store | None = None
    reset_depth: int = 0
    scope: LocalScope | None = None
    init: Const | None = None
    blocks: Stmt | None = None
    """The reduction in blocks of the summation order (:func:`blocked_reduction_of`): loops around
    leaves that each add one block sum to the cell (or to the scope's variable); ``term`` is then
    the term of the innermost blocks, and every loop of ``around`` is parallel."""

    @property
    def dtype(self) -> DType:
        """The type the sum is carried in."""
        return self.scope.local.dtype if self.scope is not None else self.store.tnode.dtype

    @property
    def parallel(self) -> tuple[For, ...]:
        """The loops of ``around`` that index the cell bare (``out[.., i, ..]``), nest order."""
        bare = {i.symbol for i in self.store.indices if isinstance(i, Iter)}
        return tuple(f for f in self.around if f.symbol in bare)

    @property
    def reductions(self) -> tuple[For, ...]:
        """The loops over a cell's terms, in nest order -- each cell's summation order: those of
        ``around`` the cell's indices do not use, then ``inner``."""
        used: set[AnySymbol] = indices_symbols(self.store.indices)
        return tuple(f for f in self.around if f.symbol not in used) + self.inner

    @property
    def separable(self) -> bool:
        """Every loop of ``around`` either indexes the cell bare or not at all, no loop of
        ``inner`` indexes it, and a reset sits inside exactly the parallel loops: each cell is
        owned by one iteration of the parallel loops, its terms are the reduction loops'
        iterations, and it is reset once. What every scheduler of the reduction relies on."""
        used = indices_symbols(self.store.indices)
        parallel = self.parallel
        if len(parallel) + sum(1 for f in self.around if f.symbol not in used) != len(self.around):
            return False
        if any(f.symbol in used for f in self.inner):
            return False
        return self.reset is None or self.around[: self.reset_depth] == parallel

    @property
    def loop_extents(self) -> tuple[tuple[Symbol, int], ...]:
        """``(symbol, extent)`` of :attr:`reductions`."""
        return tuple((f.symbol, f.extent) for f in self.reductions)

    @property
    def volume(self) -> int:
        """Terms per cell."""
        if self.blocks is not None:
            return block_terms(self.blocks)
        return math.prod(f.extent for f in self.reductions)


def reduction_of(stmt: Stmt, *, inlined: bool = True) -> Reduction | None:
    """The :class:`Reduction` the nest ``stmt`` computes, or ``None`` when it has none of the
    three shapes (module docstring). A value holding exactly one local scope is read as the
    third shape when it fits it, else as the first; with ``inlined=False`` only the first two
    shapes are looked for (a pass that reaches the scope's own loops by itself)."""
    chain, body = loop_chain(stmt)
    reset: Store | None = None
    if isinstance(body, Seq) and len(body.stmts) == 2 and isinstance(body.stmts[0], Store):
        first, rest = body.stmts
        if not isinstance(first.value, Const) or first.skip_oob or not isinstance(rest, For):
            return None
        depth = len(chain)
        more, body = loop_chain(rest)
        chain = chain + more
        if not isinstance(body, Store) or (first.tnode, first.indices) != (body.tnode, body.indices):
            return None
        reset = first
    if not isinstance(body, Store) or body.skip_oob:
        return None
    if reset is None and inlined:
        found = _inlined(body, tuple(chain))
        if found is not None:
            return found
    update = update_of(body)
    if update is None:
        return None
    if reset is None:
        return Reduction(body, update.op, update.term, tuple(chain))
    return Reduction(body, update.op, update.term, tuple(chain), reset=reset, reset_depth=depth)


def _inlined(store: Store, around: tuple[For, ...]) -> Reduction | None:
    """The third shape: ``store``'s value reads one local scope holding the reduction."""
    scopes = [e for e in iter_exprs(store.value) if isinstance(e, LocalScope)]
    if len(scopes) != 1 or any(isinstance(e, GetLocal) for e in iter_exprs(store.value)):
        return None
    scope = scopes[0]
    init, steps = _start_and_steps(scope)
    if len(steps) != 1 or not isinstance(steps[0], For):
        return None
    inner, step = loop_chain(steps[0])
    update = update_of(step)
    if update is None or not isinstance(step, SetLocal) or step.local is not scope.local:
        return None
    return Reduction(store, update.op, update.term, around, tuple(inner), scope=scope, init=init)


def _start_and_steps(scope: LocalScope) -> tuple[Const | None, list[Stmt]]:
    """The constant a local scope's body first sets its variable to (``None``: no such first
    statement) and the statements after it."""
    steps = list(scope.body.stmts) if isinstance(scope.body, Seq) else [scope.body]
    first = steps[0] if steps else None
    if isinstance(first, SetLocal) and first.local is scope.local and isinstance(first.value, Const):
        return first.value, steps[1:]
    return None, steps


def blocked_reduction_of(stmt: Stmt) -> Reduction | None:
    """The :class:`Reduction` the nest ``stmt`` computes when its sum is in the blocks of the
    summation order (``summation.py``), else ``None``: parallel loops indexing one cell, then
    either an optional reset of the cell and loops around leaf stores each adding one block sum
    to the cell, or the store ``out[I] := f(v { v := init; <loops around leaves v := v + block
    sum> })`` (the reduction inlined into its consumer). A block sum adds terms, or the sums of
    smaller blocks (beyond 64 x 64 terms), each from zero, all with one operator."""
    chain, body = loop_chain(stmt)
    stores = [s for s in iter_stmts(stmt) if isinstance(s, Store)]
    if not stores:
        return None
    store = stores[-1]
    out, idx = store.tnode, store.indices
    bare = {i.symbol for i in idx if isinstance(i, Iter)}
    used = indices_symbols(idx)
    depth = 0
    while depth < len(chain) and chain[depth].symbol in bare:
        depth += 1
    if not depth or depth != len(bare):
        return None
    rest: Stmt = body
    for f in reversed(chain[depth:]):
        rest = For(f.symbol, f.extent, rest, LoopKind.REDUCTION)
    steps = list(rest.stmts) if isinstance(rest, Seq) else [rest]
    reset: Store | None = None
    scope: LocalScope | None = None
    init: Const | None = None
    if steps and isinstance(steps[0], Store) and isinstance(steps[0].value, Const):
        if (steps[0].tnode, steps[0].indices) != (out, idx) or steps[0].skip_oob:
            return None
        reset = steps.pop(0)
    elif len(steps) == 1 and isinstance(steps[0], Store) and (steps[0].tnode, steps[0].indices) == (out, idx):
        scope = _consumer_scope(steps[0])
        if scope is None:
            return None
        init, steps = _start_and_steps(scope)
    updates: list[SetLocal] = []  # the statements adding a term to a block sum

    def block_sum(s: Stmt, local: Local) -> bool:
        """Whether ``s`` (a block's body) adds terms, or block sums of its own, to ``local``."""
        match s:
            case Seq(stmts=parts):
                return all(block_sum(x, local) for x in parts)
            case For(symbol=symbol, body=inner):
                return symbol not in used and block_sum(inner, local)
            case SetLocal(local=target, value=Binary(op=op, a=old, b=value)) if (
                target is local and old == GetLocal(local)
            ):
                if isinstance(value, LocalScope):
                    return op is Binop.ADD and block_sum(value.body, value.local)
                if any(isinstance(e, (GetLocal, LocalScope)) or (isinstance(e, (Load, LoadDynamic)) and e.tnode is out)
                       for e in iter_exprs(value)):
                    return False
                updates.append(s)
                return True
        return False

    def leaf_blocks(s: Stmt) -> bool:
        """Whether ``s`` is loops around leaves adding one block sum each to the cell or to the
        inlined reduction's local."""
        match s:
            case Seq(stmts=parts):
                return all(leaf_blocks(x) for x in parts)
            case For(symbol=symbol, body=inner):
                return symbol not in used and leaf_blocks(inner)
            case Store(tnode=node, indices=cell, value=Binary(op=Binop.ADD, a=old, b=LocalScope() as block)):
                return (scope is None and (node, cell) == (out, idx) and old == Load(out, idx) and not s.skip_oob
                        and block_sum(block.body, block.local))
            case SetLocal(local=local, value=Binary(op=Binop.ADD, a=old, b=LocalScope() as block)):
                return (scope is not None and local is scope.local and old == GetLocal(local)
                        and block_sum(block.body, block.local))
        return False

    blocks = seq(*steps)
    if not steps or not leaf_blocks(blocks) or len({u.value.op for u in updates}) != 1:
        return None
    update = updates[0]
    return Reduction(store, update.value.op, update.value.b, tuple(chain[:depth]), reset=reset, reset_depth=depth,
                     scope=scope, init=init, blocks=blocks)


def _consumer_scope(store: Store) -> LocalScope | None:
    """The one local scope of a store's value that holds the reduction inlined into its consumer,
    when the value reads no other local and not the stored node itself."""
    scopes = [e for e in iter_exprs(store.value) if isinstance(e, LocalScope)]
    if len(scopes) != 1 or store.skip_oob or any(
        isinstance(e, GetLocal) or (isinstance(e, (Load, LoadDynamic)) and e.tnode is store.tnode)
        for e in iter_exprs(store.value)
    ):
        return None
    return scopes[0]


def block_terms(blocks: Stmt) -> int:
    """The terms a cell adds in a :attr:`Reduction.blocks` (or in a block's body)."""
    return total_over_executions(blocks, _step_terms)


def _step_terms(step: Stmt) -> int:
    """The terms one step of a block adds: those of the block it sums, or its own one term."""
    match step:
        case Store(value=Binary(b=LocalScope(body=body))) | SetLocal(value=Binary(b=LocalScope(body=body))):
            return block_terms(body)
        case SetLocal():
            return 1
    return 0
