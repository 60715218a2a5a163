"""Facts about loop IR that every pass and backend asks for, defined once.

An axis index (:data:`~ocannl.lowlevel.indexing.AxisIndex`) is one algebraic value, an affine
form ``sum(c * s) + offset`` over loop iterators and index symbols; ``Fixed`` (no term) and
``Iter`` (one unit term) are its two small cases. Passes and emitters reason about it in four
ways, each here:

* its **form**: :func:`affine_form` (terms and offset, whatever the case) and :func:`make_index`
  (the canonical index of a form: zero terms dropped, ``Fixed``/``Iter`` when it is one), so that
  arithmetic on indices (:func:`scaled_sum`, :func:`row_major_offset`, :func:`normalize_index`,
  :func:`substitute_index`) never matches on cases;
* its **symbols**: :func:`~ocannl.lowlevel.indexing.index_symbols` for one index (defined beside
  the index types, since projections use it), :func:`indices_symbols` and :func:`expr_symbols`
  for index tuples and expressions;
* its **range**: :func:`index_range` over given loop ranges (index symbols within their declared
  size, as every run checks) and :func:`provably_within`, whether an index stays inside an axis
  over given loop extents -- what lets an interpreter or an emitter drop a bounds check;
* the **accesses** of a statement (:class:`Access`, :func:`accesses`): which node, at which
  indices, read or written -- what dependence tests and kernel grouping are built on -- and its
  perfect :func:`loop_chain`.

Keeping one definition matters beyond tidiness: the interpreter, which is the reference, and the
compiled backends must agree on which accesses are checked and how offsets are formed, or the
same program would fault on one backend and not another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

from ocannl.lowlevel.indexing import Affine, AnySymbol, AxisIndex, Fixed, IndexSymbol, Iter, index_bounds, index_symbols
from ocannl.lowlevel.ir import (
    EmbedIndex,
    Expr,
    Fill,
    For,
    Load,
    LoadDynamic,
    Stmt,
    Store,
    StoreDynamic,
    iter_exprs,
    iter_stmts,
    stmt_exprs,
)
from ocannl.lowlevel.tnode import TNode

Terms = tuple[tuple[int, AnySymbol], ...]
"""``((coefficient, symbol), ...)`` of an affine form."""


# ---------------------------------------------------------------------------------------------
# The affine form of an index


def affine_form(idx: AxisIndex) -> tuple[Terms, int]:
    """``(terms, offset)`` with ``idx == sum(c * s for c, s in terms) + offset``."""
    match idx:
        case Fixed(index=i):
            return (), i
        case Iter(symbol=s):
            return ((1, s),), 0
        case Affine(terms=terms, offset=offset):
            return terms, offset
    raise TypeError(f"not an axis index: {idx!r}")


def make_index(coefficients: Mapping[AnySymbol, int], offset: int) -> AxisIndex:
    """The canonical index of ``sum(c * s) + offset``: terms with a zero coefficient dropped, a
    :class:`Fixed` when none is left, an :class:`Iter` for a bare symbol. Equal forms built in
    the same symbol order compare equal, which passes rely on to recognize the same cell."""
    terms = tuple((c, s) for s, c in coefficients.items() if c)
    if not terms:
        return Fixed(offset)
    if len(terms) == 1 and terms[0][0] == 1 and offset == 0:
        return Iter(terms[0][1])
    return Affine(terms, offset)


def scaled_sum(parts: Iterable[tuple[int, AxisIndex]]) -> AxisIndex:
    """``sum(scale * idx for scale, idx in parts)`` as one canonical index."""
    coefficients: dict[AnySymbol, int] = {}
    offset = 0
    for scale, idx in parts:
        terms, k = affine_form(idx)
        offset += scale * k
        for c, s in terms:
            coefficients[s] = coefficients.get(s, 0) + scale * c
    return make_index(coefficients, offset)


def normalize_index(idx: AxisIndex) -> AxisIndex:
    """``idx`` in its simplest form: an affine index with the terms of one symbol merged and its
    zero terms dropped, then a single unit term without offset an :class:`Iter` and no term a
    :class:`Fixed`. An index already simplest is returned as is."""
    if not isinstance(idx, Affine):
        return idx
    new = scaled_sum(((1, idx),))
    return idx if new == idx else new


def substitute_index(idx: AxisIndex, env: Mapping[AnySymbol, AxisIndex]) -> AxisIndex:
    """``idx`` with each symbol ``s`` in ``env`` replaced by the index ``env[s]``, normalized."""
    if isinstance(idx, Fixed):
        return idx
    if isinstance(idx, Iter):
        return env.get(idx.symbol, idx)
    terms, offset = affine_form(idx)
    if not any(s in env for _, s in terms):
        return normalize_index(idx)
    return scaled_sum(((1, Fixed(offset)), *((c, env.get(s, Iter(s))) for c, s in terms)))


def row_major_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    """The stride of each axis of a row-major buffer of ``dims`` (the last axis is contiguous)."""
    strides, acc = [], 1
    for d in reversed(dims):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def row_major_offset(indices: tuple[AxisIndex, ...], dims: tuple[int, ...]) -> AxisIndex:
    """The offset of the cell ``indices`` of a row-major buffer of ``dims``, as one index."""
    return scaled_sum(zip(row_major_strides(dims), indices))


# ---------------------------------------------------------------------------------------------
# Symbols


def indices_symbols(indices: Iterable[AxisIndex | None]) -> set[AnySymbol]:
    """The symbols an index tuple depends on (``None``, a data-dependent axis, has none)."""
    return {s for idx in indices if idx is not None for s in index_symbols(idx)}


def expr_symbols(e: Expr) -> set[AnySymbol]:
    """The symbols ``e`` reads: through the indices of its loads and its embedded indices."""
    out: set[AnySymbol] = set()
    for sub in iter_exprs(e):
        if isinstance(sub, (Load, LoadDynamic)):
            out |= indices_symbols(sub.indices)
        elif isinstance(sub, EmbedIndex):
            out |= set(index_symbols(sub.index))
    return out


# ---------------------------------------------------------------------------------------------
# Ranges


def index_range(idx: AxisIndex, loop_ranges: Mapping[AnySymbol, tuple[int, int]]) -> tuple[int, int] | None:
    """The closed interval ``idx`` ranges over when each loop iterator ``s`` in ``loop_ranges``
    takes the values of the closed interval ``loop_ranges[s]`` and each index symbol those of
    ``[0, size)`` (a run rejects a binding outside it); ``None`` when a symbol's range is
    unknown (not in ``loop_ranges``, or an index symbol without a size)."""

    def bounds(s: AnySymbol) -> tuple[int, int] | None:
        if isinstance(s, IndexSymbol):
            return None if s.size is None else (0, s.size - 1)
        return loop_ranges.get(s)

    return index_bounds(idx, bounds)


def provably_within(idx: AxisIndex, dim: int, extents: Mapping[AnySymbol, int]) -> bool:
    """Whether ``idx`` stays in ``[0, dim)`` whenever each loop iterator ``s`` in ``extents``
    ranges over ``[0, extents[s])`` (see :func:`index_range`; an unknown range gives ``False``)."""
    ranges = {s: (0, extents[s] - 1) for s in index_symbols(idx) if s in extents}
    return range_within(index_range(idx, ranges), dim)


def cell_provably_within(
    indices: tuple[AxisIndex, ...], dims: tuple[int, ...], extents: Mapping[AnySymbol, int]
) -> bool:
    """Whether every index of an access provably stays inside its axis (:func:`provably_within`):
    the access then needs no bounds check."""
    return all(provably_within(i, d, extents) for i, d in zip(indices, dims))


def range_within(interval: tuple[int, int] | None, dim: int) -> bool:
    """Whether the closed ``interval`` (``None``: unknown) lies in ``[0, dim)``."""
    return interval is not None and 0 <= interval[0] and interval[1] < dim


# ---------------------------------------------------------------------------------------------
# Accesses


@dataclass(frozen=True)
class Access:
    """One read or write of a node, with its full index tuple: ``None`` stands at a
    data-dependent axis, and at every axis of a fill (it writes all cells)."""

    node: TNode
    indices: tuple[AxisIndex | None, ...]
    write: bool


def _with_dynamic(axis: int, indices: tuple[AxisIndex, ...]) -> tuple[AxisIndex | None, ...]:
    return indices[:axis] + (None,) + indices[axis:]


def accesses(stmt: Stmt, *, fills: bool = False) -> Iterator[Access]:
    """Every node access of ``stmt``, local scope bodies included, each statement's reads before
    its write. Fills are listed only with ``fills``: a pass that groups loop nests treats them
    apart, a dependence test must see them."""
    for s in iter_stmts(stmt):
        for e in stmt_exprs(s):
            for sub in iter_exprs(e):
                if isinstance(sub, Load):
                    yield Access(sub.tnode, sub.indices, False)
                elif isinstance(sub, LoadDynamic):
                    yield Access(sub.tnode, _with_dynamic(sub.axis, sub.indices), False)
        if isinstance(s, Store):
            yield Access(s.tnode, s.indices, True)
        elif isinstance(s, StoreDynamic):
            yield Access(s.tnode, _with_dynamic(s.axis, s.indices), True)
        elif fills and isinstance(s, Fill):
            yield Access(s.tnode, (None,) * len(s.tnode.dims), True)


def loop_chain(stmt: Stmt) -> tuple[list[For], Stmt]:
    """The perfect chain of loops starting at ``stmt`` (each loop's body the next loop),
    outermost first, and the body of the innermost one."""
    chain: list[For] = []
    while isinstance(stmt, For):
        chain.append(stmt)
        stmt = stmt.body
    return chain, stmt
