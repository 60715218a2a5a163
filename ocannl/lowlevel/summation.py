"""The summation order of floating-point reductions (docs/semantics.md, "Summation order").

Adding many float32 terms one at a time loses the small ones once the running sum is large
(2^25 terms of 0.25 stall at 2^22). :func:`block_sums` rewrites every long float accumulation of
the loop IR into blocks: each block of at most :data:`BLOCK` consecutive terms is summed from
zero in loop order, and the block sums are combined by the same rule, level after level, until at
most :data:`BLOCK` values remain, which are added to the destination one at a time. The error
then grows with the number of levels, not with the number of terms.

A block is made of whole iterations of one reduction loop, so every block is a box of loop
iterations with affine indices (no index arithmetic the loop IR lacks): with reduction loops of
extents ``n_1 .. n_m`` (outermost first), the block loop is the outermost loop ``j`` whose body
runs at most ``BLOCK`` terms per iteration (``V_j = n_{j+1} ... n_m <= BLOCK``), and a block is
``c = BLOCK // V_j`` consecutive iterations of it (fewer at its end) under fixed values of the
loops outside it. The block sums, in loop order, form a reduction over ``n_1 .. n_{j-1}`` and
``ceil(n_j / c)``, blocked again by the same rule. For a single reduction loop (a sum, a
matrix product's ``k``) this is the classic rule: blocks of ``BLOCK`` consecutive terms.

Reductions of at most ``BLOCK`` terms per cell keep adding one term at a time, so small programs
compute what they always did. The rewrite applies to float accumulations with ``+`` and ``-`` (a sum of negated
terms) in two shapes: a nest of loops around ``out[I] := out[I] + term`` (optionally with the
reset ``out[I] := 0`` after the loops that index ``out``), and loops around ``v := v + term`` on
a local (a reduction the optimizer inlined into its consumer). Each cell's terms keep their
order; the reduction loops move inside the loops that index the cell, which only changes which
cell is worked on when. Max, min and integer sums are exact in any order and stay as they are;
so do accumulations whose cell is not a plain function of the loops (scatter-adds, the input
gradient of a strided convolution).

Every backend that executes the loop IR (the interpreter, C, Metal) runs the rewritten IR, so
they agree bit for bit. Triton reduces long sums with ``tl.sum`` trees instead: its backend says
so (``tree_sums``) and ``Context`` leaves its IR unblocked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ocannl.errors import OcannlError
from ocannl.lowlevel.analysis import locals_read, loop_chain, nodes_read, scaled_sum
from ocannl.lowlevel.indexing import AnySymbol, AxisIndex, Fixed, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Expr, For, GetLocal, Load, LoadDynamic, Local, LocalScope, LoopKind, RoutineIR, Seq,
    SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary, iter_exprs, seq,
)
from ocannl.lowlevel.rewrite import FreshCopy
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.schedule import reduction_of, update_of

BLOCK = 64
"""Terms per block. With 64, float32 sums of 2^25 terms stay within about 1e-7 relative (256 is
too coarse: about 4e-6 on a constant series); a contraction with ``K <= 4096`` gets exactly the
register-blocked shape of a fast GEMM (each 64-wide ``k`` block summed from zero, the block sums
added to the output in order)."""

_SUM_OPS = (Binop.ADD, Binop.SUB)


def block_sums(routine: RoutineIR, block: int = BLOCK) -> RoutineIR:
    """``routine`` with every float accumulation of more than ``block`` terms per cell summed in
    blocks (module docstring). The result computes the same cells with the same terms."""
    if block < 2:
        raise OcannlError(f"block_sums of routine {routine.name}: a block holds at least 2 terms, got {block}")
    body = _Blocker(block).stmt(routine.body)
    return routine if body is routine.body else replace(routine, body=body)


# ---------------------------------------------------------------------------------------------
# Finding the accumulations


@dataclass(frozen=True)
class Accumulation:
    """``target op= term`` over ``reductions`` (nest order: each cell's term order), inside
    ``parallel`` loops that index the target cell, after the optional ``reset`` of that cell.
    ``target`` is a :class:`~ocannl.lowlevel.ir.Store` (its cell) or a
    :class:`~ocannl.lowlevel.ir.Local`."""

    target: Store | Local
    op: Binop
    term: Expr
    parallel: tuple[For, ...]
    reductions: tuple[tuple[Symbol, int], ...]
    reset: Store | None = None

    @property
    def volume(self) -> int:
        """Terms per cell."""
        return math.prod(n for _, n in self.reductions)


def find_accumulation(nest: For) -> Accumulation | None:
    """The float sum that the nest headed by ``nest`` computes, or ``None`` when it is not one of
    the two shapes of the module docstring: a reduction into a cell
    (:func:`~ocannl.lowlevel.schedule.reduction_of`, its first two shapes: a local scope in the
    value is reached on its own when the blocker walks into it), or loops around an update of a
    local."""
    chain, body = loop_chain(nest)
    if isinstance(body, SetLocal):
        update = update_of(body)
        if update is None or body.local in locals_read(update.term):
            return None
        op, term, loops, parallel, target, reset = update.op, update.term, tuple(chain), (), body.local, None
    else:
        r = reduction_of(nest, inlined=False)
        if r is None or not r.separable:
            return None  # a reset inside a reduction loop restarts the sum: not one sum
        out, cell = r.store.tnode, r.store.indices
        if out in nodes_read(r.term):
            return None  # a term reading the sum would see it added in another order
        if not all(isinstance(i, (Fixed, Iter)) for i in cell):
            return None
        owned = [i.symbol for i in cell if isinstance(i, Iter)]
        if len(set(owned)) != len(owned):
            return None
        op, term, loops, parallel, target, reset = r.op, r.term, r.around, r.parallel, r.store, r.reset
    if op not in _SUM_OPS or not term.dtype.is_float:
        return None
    reductions = tuple((f.symbol, f.extent) for f in loops if all(f is not g for g in parallel))
    return Accumulation(target, op, term, parallel, reductions, reset)


# ---------------------------------------------------------------------------------------------
# The block levels


@dataclass(frozen=True, eq=False)
class Axis:
    """One axis of a level's index space (the terms, then the block sums of each level):
    ``size`` values; ``ragged`` when its last value is a shorter block or holds one, so that its
    code differs from the other values'."""

    size: int
    ragged: bool = False


@dataclass(frozen=True)
class Split:
    """How a level's space becomes the next one: its axis ``j`` is cut into chunks of ``c``."""

    axes: tuple[Axis, ...]
    j: int
    c: int


def plan_levels(extents: tuple[int, ...], block: int = BLOCK) -> tuple[list[Split], tuple[Axis, ...]]:
    """The splits from the terms' space (the reduction loops' ``extents``) to the top space of at
    most ``block`` values, which are added to the destination in order."""
    space = tuple(Axis(n) for n in extents)
    splits: list[Split] = []
    while math.prod(a.size for a in space) > block:
        inner = 1
        j = len(space) - 1
        while j > 0 and inner * space[j].size <= block:
            inner *= space[j].size
            j -= 1
        c = block // inner
        axis = space[j]
        chunks = -(-axis.size // c)
        splits.append(Split(space, j, c))
        space = space[:j] + (Axis(chunks, axis.size % c != 0 or axis.ragged),)
    return splits, space


# ---------------------------------------------------------------------------------------------
# Rewriting


class _Blocker:
    def __init__(self, block: int):
        self.block = block

    def stmt(self, s: Stmt) -> Stmt:
        match s:
            case For(body=body):
                acc = find_accumulation(s)
                if acc is not None and acc.volume > self.block:
                    return self.blocked(acc)
                new = self.stmt(body)
                return s if new is body else replace(s, body=new)
            case Seq(stmts=stmts):
                parts = [self.stmt(x) for x in stmts]
                return s if all(a is b for a, b in zip(parts, stmts)) else seq(*parts)
            case Store(value=v) | SetLocal(value=v):
                new = self.expr(v)
                return s if new is v else replace(s, value=new)
            case StoreDynamic(position=p, value=v):
                new_p, new_v = self.expr(p), self.expr(v)
                return s if new_p is p and new_v is v else replace(s, position=new_p, value=new_v)
        return s

    def expr(self, e: Expr) -> Expr:
        """``e`` with the local scopes it holds rewritten."""
        if not any(isinstance(x, LocalScope) for x in iter_exprs(e)):
            return e
        return _map_expr(e, lambda x: replace(x, body=self.stmt(x.body)) if isinstance(x, LocalScope) else None)

    def blocked(self, acc: Accumulation) -> Stmt:
        term = self.expr(acc.term)
        splits, top = plan_levels(tuple(n for _, n in acc.reductions), self.block)
        symbols = tuple(s for s, _ in acc.reductions)

        def add(target: Store | Local, op: Binop, value: Expr) -> Stmt:
            if isinstance(target, Local):
                return SetLocal(target, Binary(op, GetLocal(target), value))
            return Store(target.tnode, target.indices, Binary(op, Load(target.tnode, target.indices), value))

        def value_at(level: int, coords: list[AxisIndex]) -> Expr:
            """The value of one point of level ``level``'s space: a term, or a block sum."""
            if level == 0:
                return _instantiate(term, dict(zip(symbols, coords)))
            split = splits[level - 1]
            axis = split.axes[split.j]
            position = coords[split.j]
            count = split.c
            last = -(-axis.size // split.c) - 1
            if isinstance(position, Fixed) and position.index == last and axis.size % split.c:
                count = axis.size % split.c
            box = [("at", x) for x in coords[: split.j]]
            box.append(("range", _scaled(position, split.c), count))
            box += [("range", Fixed(0), a.size) for a in split.axes[split.j + 1 :]]
            v = Local(term.dtype)
            return LocalScope(v, sum_box(v, Binop.ADD if level > 1 else acc.op, level - 1, split.axes, box))

        def sum_box(target: Store | Local, op: Binop, level: int, axes: tuple[Axis, ...], box: list) -> Stmt:
            """Statements adding the values of ``box`` (per axis ``("at", index)`` or
            ``("range", start, count)``) of level ``level``'s space to ``target``, in order."""
            for k, entry in enumerate(box):
                if entry[0] == "range":
                    break
            else:
                return add(target, op, value_at(level, [x for _, x in box]))
            _, start, count = entry
            axis = axes[k]
            special = axis.ragged and isinstance(start, Fixed) and start.index + count == axis.size
            uniform = count - 1 if special else count
            parts: list[Stmt] = []
            if uniform >= 2:
                x = Symbol()
                inner = sum_box(target, op, level, axes, box[:k] + [("at", _plus(start, x))] + box[k + 1 :])
                parts.append(For(x, uniform, inner, LoopKind.REDUCTION))
            elif uniform == 1:
                parts.append(sum_box(target, op, level, axes, box[:k] + [("at", start)] + box[k + 1 :]))
            if special:
                parts.append(sum_box(target, op, level, axes, box[:k] + [("at", Fixed(axis.size - 1))] + box[k + 1 :]))
            return seq(*parts)

        target = acc.target
        reduction = sum_box(target, Binop.ADD if splits else acc.op, len(splits), top,
                            [("range", Fixed(0), a.size) for a in top])
        body = reduction if acc.reset is None else seq(acc.reset, reduction)
        for f in reversed(acc.parallel):
            body = For(f.symbol, f.extent, body, f.kind)
        return body


def _plus(start: AxisIndex, x: Symbol) -> AxisIndex:
    """``start + x``."""
    return scaled_sum(((1, start), (1, Iter(x))))


def _scaled(position: AxisIndex, c: int) -> AxisIndex:
    """``c * position``."""
    return scaled_sum(((c, position),))


# ---------------------------------------------------------------------------------------------
# Copying a term at new indices


def _instantiate(term: Expr, env: dict[AnySymbol, AxisIndex]) -> Expr:
    """``term`` with its reduction symbols replaced by ``env``; loops and locals bound inside it
    are renamed, so that each copy of the term binds its own."""
    return FreshCopy(env).expr(term)


def _map_expr(e: Expr, visit) -> Expr:
    """``e`` rebuilt bottom-up, each node replaced by ``visit(node)`` unless that is ``None``."""
    match e:
        case LoadDynamic(position=p):
            e = replace(e, position=_map_expr(p, visit))
        case Unary(x=x) | Cast(x=x):
            e = replace(e, x=_map_expr(x, visit))
        case Binary(a=a, b=b):
            e = replace(e, a=_map_expr(a, visit), b=_map_expr(b, visit))
        case Ternary(a=a, b=b, c=c):
            e = replace(e, a=_map_expr(a, visit), b=_map_expr(b, visit), c=_map_expr(c, visit))
    new = visit(e)
    return e if new is None else new
