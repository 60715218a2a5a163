"""Scatter-accumulations rewritten as gathers (docs/compiler.md, "Gathers").

The gradient of a convolution with respect to its input is lowered as a *scatter*: a loop nest
over the output positions and the kernel offsets, each iteration adding its term into the input
cell the two address together,

    for b, oh, ow, oc, kh, kw, ic:  g[b, oh+kh-1, ow+kw-1, ic] := g[...] + d[b, oh, ow, oc] * k[oc, kh, kw, ic]

Many iterations write each cell, so the nest is a read-modify-write of scattered cells, with a
bounds test per term (the margins of a padded convolution have no cells): no iteration owns a
cell, nothing can be kept in registers, and no loop can run on threads.

:func:`gather_scatters` turns such a nest around: it iterates over the written cells and, for
each, over the terms that land in it, so each cell is owned by one iteration of the outer loops
and its sum is an ordinary reduction, which the summation order (summation.py) blocks and the
CPU scheduler (cpu_schedule.py) works in register tiles like any other contraction. For every
axis of the cell written at ``c_e * e + c_r * r + offset`` (two loops, ``|c_e| = 1``), ``e`` is
*eliminated*: a new loop ``w`` runs over the axis, and ``e = (w - offset - c_r * r) / c_e``, an
affine index again. The loops that index the cell directly stay; the loops left run inside, and
a term exists only where every eliminated loop falls in its range: the term is
``where(0 <= e < n_e, term, neutral)``, with the neutral element ``-0.0`` of ``+`` (``+0.0`` of
``-``), which leaves every float bit for bit as it was, NaNs and signed zeros included; the
loads addressed through ``e`` read a placeholder outside their buffer, since some backends
evaluate both branches of a ``where``.

**Order of the terms.** The original nest adds the terms of a cell in the lexicographic order of
its loops. For a fixed cell, ``e`` is a function of ``r``, so that order is the order of ``r`` at
the outer of the two loops' positions: the loop of ``r`` takes that position, running downwards
when ``e`` is the outer loop and decreases as ``r`` grows (the convolution's ``oh = ih + 1 -
kh``: ``kh`` from 2 down to 0). Each cell therefore receives its terms in the order the scatter
added them; what changes is that the sum is a reduction, so the summation order blocks it.

Refused, each time (the nest stays a scatter): a data-dependent position (``StoreDynamic``, the
gradient of ``oc.take``; a dynamic load in the term), an axis of three or more loops (a dilated
strided index), a coefficient other than ``+-1`` on both loops of an axis, a loop indexing two
axes (a diagonal), an index symbol bound at run time, a term that reads the written node or a
local, a node of a storage type (float16, bfloat16: each partial sum stored rounds), a write
that may leave the node without skipping out-of-bounds cells (an error, which stays one), a
fixed or direct index outside the node, and a nest whose gather form would run more than
:data:`MAX_EXPANSION` times as many iterations (a strided convolution, a pooling window: for each
cell most of the values of the remaining loop give no term).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import affine_form, loop_chain, make_index, provably_within, substitute_index
from ocannl.lowlevel.indexing import AnySymbol, AxisIndex, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Const, EmbedIndex, Expr, For, GetLocal, Load, LoadDynamic, LocalScope, RoutineIR, Seq, Store,
    Ternary, iter_exprs, nest, seq,
)
from ocannl.lowlevel.rewrite import Rewriter
from ocannl.lowlevel.scalar_ops import Binop, Ternop

MAX_EXPANSION = 2
"""A scatter becomes a gather only when the gather runs at most this many times as many
iterations: the padded convolution's input gradient runs exactly as many (a stride-1 kernel
reaches every input row from as many output rows as it has rows), a 2x2 pooling window's four
times as many."""


def gather_scatters(routine: RoutineIR) -> RoutineIR:
    """``routine`` with every top-level scatter-accumulation it can invert computed as a gather
    (module docstring); each cell gets the same terms, in the same order."""
    stmts = routine.body.stmts if isinstance(routine.body, Seq) else (routine.body,)
    out = [gathered(s) or s if isinstance(s, For) else s for s in stmts]
    if all(a is b for a, b in zip(out, stmts)):
        return routine
    return replace(routine, body=seq(*out))


@dataclass(frozen=True)
class _Axis:
    """One written axis addressed ``c_e * e + c_r * r + offset``, and how it is inverted."""

    e: Symbol
    c_e: int
    r: Symbol
    c_r: int
    offset: int
    w: Symbol
    """The new loop over the axis."""


def gathered(scatter: For) -> For | None:
    """The gather form of the scatter-accumulation loop nest ``scatter``, or ``None`` when it is
    not one (or is refused: module docstring)."""
    loops, leaf = loop_chain(scatter)
    if not isinstance(leaf, Store) or not isinstance(leaf.value, Binary) or leaf.value.op not in (Binop.ADD, Binop.SUB):
        return None
    node, indices, op, term = leaf.tnode, leaf.indices, leaf.value.op, leaf.value.b
    own = leaf.value.a
    if not (isinstance(own, Load) and own.tnode is node and own.indices == indices):
        return None
    if node.dtype is not node.dtype.compute:
        return None  # a storage type rounds each partial sum stored: keep the scatter's roundings
    for e in iter_exprs(term):
        if isinstance(e, (LoadDynamic, GetLocal, LocalScope)) or (isinstance(e, Load) and e.tnode is node):
            return None
    extents = {f.symbol: f.extent for f in loops}
    if not leaf.skip_oob and not all(provably_within(i, d, extents) for i, d in zip(indices, node.dims)):
        return None  # an out-of-bounds write stays the error it is
    axes = _inverted_axes(indices, extents)
    if axes is None:
        return None
    if not all(provably_within(i, d, extents) for k, (i, d) in enumerate(zip(indices, node.dims)) if k not in axes):
        return None  # a fixed or direct index that skips cells outside the node
    cell_loops = [i.symbol for i in indices if isinstance(i, Iter)]
    eliminated = {a.e for a in axes.values()}
    inner = [s for s in extents if s not in eliminated and s not in cell_loops]
    new_iterations = math.prod(node.dims[k] for k in axes) * math.prod(extents[s] for s in cell_loops + inner)
    if new_iterations > MAX_EXPANSION * math.prod(extents.values()):
        return None

    # The loops of the gather: the remaining loops in nest order, each ``r`` moved to the outer
    # of its and its eliminated partner's positions, running downwards where that keeps the
    # order of the terms (module docstring).
    position = {f.symbol: k for k, f in enumerate(loops)}
    partner = {a.r: a for a in axes.values()}
    env: dict[AnySymbol, AxisIndex] = {}
    order: list[tuple[int, Symbol, int]] = []
    for s in inner:
        a, symbol = partner.get(s), s
        if a is not None and position[a.e] < position[s] and a.c_r * a.c_e > 0:
            symbol = Symbol()  # e falls as r grows: r runs downwards
            env[s] = make_index({symbol: -1}, extents[s] - 1)
        at = position[s] if a is None else min(position[s], position[a.e])
        order.append((at, symbol, extents[s]))
    for a in axes.values():
        r_index = env.get(a.r, Iter(a.r))
        # c_e * e = w - offset - c_r * r, with c_e = +-1
        env[a.e] = substitute_index(make_index({a.w: a.c_e, a.r: -a.c_r * a.c_e}, -a.offset * a.c_e), {a.r: r_index})

    new_extents: dict[AnySymbol, int] = {s: extents[s] for s in cell_loops}
    new_extents.update({symbol: n for _, symbol, n in order})
    new_extents.update({a.w: node.dims[k] for k, a in axes.items()})
    guard = _in_range([(env[a.e], extents[a.e]) for a in axes.values()], new_extents)
    new_term = _Substitute(env, new_extents).expr(term)
    neutral = _neutral(op, term)
    value = new_term if guard is None else Ternary(Ternop.WHERE, guard, new_term, neutral)
    cell = tuple(Iter(axes[k].w) if k in axes else i for k, i in enumerate(indices))
    gather_loops = []
    for k, index in enumerate(indices):
        if k in axes:
            gather_loops.append((axes[k].w, node.dims[k]))
        elif isinstance(index, Iter):
            gather_loops.append((index.symbol, extents[index.symbol]))
    gather_loops += [(symbol, n) for _, symbol, n in sorted(order, key=lambda item: item[0])]
    body = nest(gather_loops, Store(node, cell, Binary(op, Load(node, cell), value)))
    assert isinstance(body, For)  # at least one axis is inverted
    return body


def _inverted_axes(indices: tuple[AxisIndex, ...], extents: dict[Symbol, int]) -> dict[int, _Axis] | None:
    """For each axis of the written cell that two loops address, which loop is eliminated; or
    ``None`` when the cell's indices are not of the form the gather inverts."""
    axes: dict[int, _Axis] = {}
    used: set[AnySymbol] = set()
    for k, idx in enumerate(indices):
        terms, offset = affine_form(idx)
        symbols = [s for _, s in terms]
        if any(s not in extents for s in symbols) or used & set(symbols) or len(set(symbols)) != len(symbols):
            return None  # an index symbol bound at run time, a diagonal
        used |= set(symbols)
        if len(terms) <= 1:
            if terms and not isinstance(idx, Iter):
                return None  # a shifted or strided single loop: an injective write, not a scatter
            continue
        if len(terms) > 2:
            return None
        (c0, s0), (c1, s1) = terms
        candidates = [(c, s, co, so) for c, s, co, so in ((c0, s0, c1, s1), (c1, s1, c0, s0)) if abs(c) == 1]
        if not candidates:
            return None
        # Eliminate the longer loop: fewer iterations of the one left give no term.
        c_e, e, c_r, r = max(candidates, key=lambda x: extents[x[1]])
        axes[k] = _Axis(e, c_e, r, c_r, offset, Symbol())
    return axes or None


def _in_range(bounds: list[tuple[AxisIndex, int]], extents: dict[AnySymbol, int]) -> Expr | None:
    """``0 <= index < n`` for each ``(index, n)`` that may leave its range, as one condition
    (``None`` when every index provably stays in it)."""
    conditions: list[Expr] = []
    for idx, n in bounds:
        if provably_within(idx, n, extents):
            continue
        value = EmbedIndex(idx, dtypes.INDEX)
        conditions.append(Binary(Binop.GT, value, Const(-1, dtypes.INDEX)))
        conditions.append(Binary(Binop.LT, value, Const(n, dtypes.INDEX)))
    if not conditions:
        return None
    guard = conditions[0]
    for c in conditions[1:]:
        guard = Binary(Binop.AND, guard, c)
    return guard


def _neutral(op: Binop, term: Expr) -> Const:
    """The value that ``x op value`` leaves as ``x`` bit for bit: ``x + -0.0`` and ``x - +0.0``
    are ``x`` for every float ``x``, which ``+0.0`` would not be for ``x = -0.0``."""
    if term.dtype.is_float:
        return Const(-0.0 if op is Binop.ADD else 0.0, term.dtype)
    return Const(0, term.dtype)


class _Substitute(Rewriter):
    """The term at the gather's loops: eliminated and reversed loops replaced by their indices;
    a load that may then leave its buffer reads a placeholder there (the guard discards it)."""

    def __init__(self, env: dict[AnySymbol, AxisIndex], extents: dict[AnySymbol, int]):
        self.env, self.extents = env, extents

    def index(self, i: AxisIndex) -> AxisIndex:
        return substitute_index(i, self.env)

    def expr(self, e: Expr) -> Expr:
        e = self.rebuild_expr(e)
        if isinstance(e, Load) and e.oob_value is None and not all(
            provably_within(i, d, self.extents) for i, d in zip(e.indices, e.tnode.dims)
        ):
            placeholder = 0.0 if e.tnode.dtype.compute.is_float else 0
            return replace(e, oob_value=placeholder)
        return e
