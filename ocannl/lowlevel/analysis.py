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
* what a statement or an expression **reads, writes and binds**, local scope bodies included
  (:func:`all_stmts` and :func:`all_exprs` walk into them, where :func:`~ocannl.lowlevel.ir.iter_exprs`
  stops): the nodes (:func:`nodes_read`, :func:`nodes_written`), the locals
  (:func:`locals_read`, :func:`locals_written`, :func:`locals_bound`, :func:`sets_outer_local`);
* the **accesses** of a statement or an expression (:class:`Access`, :func:`accesses`): which
  node, at which indices, read or written -- what dependence tests and kernel grouping are built
  on -- and a nest's perfect :func:`loop_chain`;
* whether a run **can fail** a run-time check (:func:`can_fail`), and what a failed run may have
  written (:func:`writes_before_failure`).

Keeping one definition matters beyond tidiness: the interpreter, which is the reference, and the
compiled backends must agree on which accesses are checked and how offsets are formed, or the
same program would fault on one backend and not another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, get_args

from ocannl.lowlevel.indexing import Affine, AnySymbol, AxisIndex, Fixed, IndexSymbol, Iter, index_bounds, index_symbols
from ocannl.lowlevel.ir import (
    Binary,
    Cast,
    Const,
    EmbedIndex,
    Expr,
    DeclareLocal,
    Fill,
    For,
    GetLocal,
    Load,
    LoadDynamic,
    Local,
    LocalScope,
    Seq,
    SetLocal,
    Stmt,
    Store,
    StoreDynamic,
    Unary,
    iter_exprs,
    iter_stmts,
    stmt_exprs,
    top_level,
    unconditional_exprs,
)
from ocannl.lowlevel.scalar_ops import Binop, Unop
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


def under_constant_arithmetic(e: Expr, ops: frozenset[Binop], *, casts: bool) -> Expr:
    """What ``e`` applies its outer negations, ``ops`` with a constant operand and (``casts``)
    conversions to: ``g[i]`` for ``0.0 + g[i]`` or ``-(2.0 * g[i])``. A gradient passed on by an
    addition is such a copy; the optimizer recomputes them freely, a packed product's operand or a
    vector tile's factor computes them as it reads the load."""
    while True:
        match e:
            case Unary(op=Unop.NEG, x=x):
                e = x
            case Cast(x=x) if casts:
                e = x
            case Binary(op=op, a=Const(), b=b) if op in ops:
                e = b
            case Binary(op=op, a=a, b=Const()) if op in ops:
                e = a
            case _:
                return e


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
    if isinstance(idx, Fixed):  # the printers ask it of every access: the common indices answered first
        return 0 <= idx.index < dim
    if isinstance(idx, Iter) and not isinstance(idx.symbol, IndexSymbol):
        extent = extents.get(idx.symbol)
        return extent is not None and extent - 1 < dim
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
# Reads, writes and bindings, local scopes included

_STMT_TYPES = get_args(Stmt)


def all_stmts(node: Stmt | Expr) -> Iterator[Stmt]:
    """Every statement ``node`` runs, local scope bodies included, in program order: a statement
    and those nested in it (:func:`~ocannl.lowlevel.ir.iter_stmts`), or the statements of an
    expression's local scopes."""
    if isinstance(node, _STMT_TYPES):
        yield from iter_stmts(node)
        return
    for sub in iter_exprs(node):
        if isinstance(sub, LocalScope):
            yield from iter_stmts(sub.body)


def all_exprs(node: Stmt | Expr) -> Iterator[Expr]:
    """Every expression ``node`` evaluates, with its sub-expressions and the expressions of its
    local scope bodies, in program order. :func:`~ocannl.lowlevel.ir.iter_exprs` stops at a
    local scope, as an emitter printing one expression wants; what an expression reads or binds
    must count its scopes too."""
    if not isinstance(node, _STMT_TYPES):
        yield from iter_exprs(node)
    for s in all_stmts(node):
        for e in stmt_exprs(s):
            yield from iter_exprs(e)


def nodes_read(node: Stmt | Expr) -> set[TNode]:
    """The nodes ``node`` loads from."""
    return {e.tnode for e in all_exprs(node) if isinstance(e, (Load, LoadDynamic))}


def nodes_written(node: Stmt | Expr) -> set[TNode]:
    """The nodes ``node`` stores into or fills."""
    return {s.tnode for s in all_stmts(node) if isinstance(s, (Store, StoreDynamic, Fill))}


def locals_read(node: Stmt | Expr) -> set[Local]:
    """The locals whose value ``node`` reads."""
    return {e.local for e in all_exprs(node) if isinstance(e, GetLocal)}


def locals_bound(node: Stmt | Expr) -> set[Local]:
    """The locals whose lifetime starts inside ``node``: declared there, or bound by one of its
    local scopes. Each run of ``node`` starts them afresh."""
    bound = {s.local for s in all_stmts(node) if isinstance(s, DeclareLocal)}
    bound.update(e.local for e in all_exprs(node) if isinstance(e, LocalScope))
    return bound


def locals_written(node: Stmt | Expr) -> set[Local]:
    """The locals ``node`` assigns, declares or binds: a statement between two reads of one of
    them may change what the second reads."""
    return {s.local for s in all_stmts(node) if isinstance(s, SetLocal)} | locals_bound(node)


def sets_outer_local(stmt: Stmt) -> bool:
    """Whether ``stmt`` sets a local it does not bind (a reduction into a local): one run of it,
    a loop's iteration, then passes a value to the next, so iterations cannot run apart."""
    bound = locals_bound(stmt)
    return any(isinstance(s, SetLocal) and s.local not in bound for s in all_stmts(stmt))


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


def _reads(e: Expr) -> Iterator[Access]:
    """The loads of ``e`` (not entering its local scopes)."""
    for sub in iter_exprs(e):
        if isinstance(sub, Load):
            yield Access(sub.tnode, sub.indices, False)
        elif isinstance(sub, LoadDynamic):
            yield Access(sub.tnode, _with_dynamic(sub.axis, sub.indices), False)


def accesses(node: Stmt | Expr, *, fills: bool = False) -> Iterator[Access]:
    """Every node access of a statement or an expression, local scope bodies included, each
    statement's reads before its write. Fills are listed only with ``fills``: a pass that groups
    loop nests treats them apart, a dependence test must see them."""
    if not isinstance(node, _STMT_TYPES):
        yield from _reads(node)
    for s in all_stmts(node):
        for e in stmt_exprs(s):
            yield from _reads(e)
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


# ---------------------------------------------------------------------------------------------
# Run-time checks


@dataclass(frozen=True)
class CheckedPositions:
    """What a run that got past a statement knows of the ``oc.take`` positions it checked: every
    value of ``node`` in the slice ``pattern`` lies in ``[0, bound)``. ``pattern`` has, per axis
    of ``node``, ``None`` (the whole axis) or the axis's fixed index (a :class:`Fixed` or a static
    index symbol's :class:`Iter`: one value in a run)."""

    node: TNode
    pattern: tuple[AxisIndex | None, ...]
    bound: int

    def covers(self, position: Expr, bound: int) -> bool:
        """Whether a position read as ``position`` within ``[0, bound)`` is one checked here."""
        pattern = _position_pattern(position, None)
        return (pattern is not None and pattern[0] is self.node and bound >= self.bound
                and all(p is None or p == q for p, q in zip(self.pattern, pattern[1])))


def _position_pattern(position: Expr, extents: Mapping[AnySymbol, int] | None
                      ) -> tuple[TNode, tuple[AxisIndex | None, ...]] | None:
    """The node and slice pattern of a position read straight from a node (:class:`CheckedPositions`):
    with ``extents``, the slice the loops of ``extents`` read whole (an axis whose loop index
    runs over all of it); without, the slice a read of any cells of the other axes falls in."""
    if not isinstance(position, Load) or position.oob_value is not None:
        return None
    pattern: list[AxisIndex | None] = []
    for index, dim in zip(position.indices, position.tnode.dims):
        if isinstance(index, Fixed) or (isinstance(index, Iter) and isinstance(index.symbol, IndexSymbol)):
            pattern.append(index)
        elif extents is None or (isinstance(index, Iter) and extents.get(index.symbol) == dim):
            pattern.append(None)
        else:
            return None
    return position.tnode, tuple(pattern)


def checked_positions(stmt: Stmt) -> list[CheckedPositions]:
    """The positions a run that got past ``stmt`` has checked: those of its ``oc.take`` accesses
    that every iteration makes (a perfect nest of loops around one store, the access not under a
    ``where``), each read from a node whose slice the loops cover whole."""
    loops, body = loop_chain(stmt)
    if not isinstance(body, (Store, StoreDynamic)):
        return []
    extents = {f.symbol: f.extent for f in loops}
    dynamic: list[LoadDynamic | StoreDynamic] = [body] if isinstance(body, StoreDynamic) else []
    dynamic += [e for root in stmt_exprs(body) for e in unconditional_exprs(root) if isinstance(e, LoadDynamic)]
    facts = []
    for access in dynamic:
        pattern = _position_pattern(access.position, extents)
        if pattern is not None:
            facts.append(CheckedPositions(pattern[0], pattern[1], access.tnode.dims[access.axis]))
    return facts


def can_fail(stmt: Stmt, extents: Mapping[AnySymbol, int] | None = None,
             checked: Iterable[CheckedPositions] = ()) -> bool:
    """Whether running ``stmt`` (inside loops of ``extents``) can stop on a failed run-time
    check: an access with no defined outcome outside its buffer whose indices are not provably
    inside (an index symbol without a size, an ``oc.take`` position not among ``checked``), or an
    integer division or remainder by a divisor that may be 0. The checks every backend makes are
    these (the interpreter, codegen.py's sites, Triton's error flag): a routine that cannot fail
    needs no protection against a run stopped halfway (docs/semantics.md, "Failed runs")."""
    extents = {} if extents is None else extents
    checked = tuple(checked)

    def unchecked(access: LoadDynamic | StoreDynamic) -> bool:
        bound = access.tnode.dims[access.axis]
        return not any(fact.covers(access.position, bound) for fact in checked)

    if isinstance(stmt, For):
        return can_fail(stmt.body, {**extents, stmt.symbol: stmt.extent}, checked)
    if isinstance(stmt, Seq):
        return any(can_fail(s, extents, checked) for s in stmt.stmts)
    if isinstance(stmt, StoreDynamic) and unchecked(stmt):
        return True
    if isinstance(stmt, Store) and not stmt.skip_oob and not cell_provably_within(stmt.indices, stmt.tnode.dims, extents):
        return True
    for e in stmt_exprs(stmt):
        for sub in iter_exprs(e):
            if isinstance(sub, LoadDynamic) and unchecked(sub):
                return True
            if isinstance(sub, Load) and sub.oob_value is None:
                if not cell_provably_within(sub.indices, sub.tnode.dims, extents):
                    return True
            elif isinstance(sub, Binary) and sub.op in (Binop.DIV, Binop.MOD) and not sub.dtype.is_float:
                if not (isinstance(sub.b, Const) and sub.b.value != 0):
                    return True
            elif isinstance(sub, LocalScope) and can_fail(sub.body, extents, checked):
                return True
    return False


def last_check(stmts: tuple[Stmt, ...] | list[Stmt]) -> int:
    """The index of the last of a routine's top-level statements that :func:`can_fail`, -1 for
    none, counting as checked the ``oc.take`` positions earlier statements checked
    (:func:`checked_positions`) from nodes no statement wrote since: a training step's embedding
    gradient scatters by the token ids its forward gather checked, so only the gather can fail.

    Remembered for the last few bodies (by the identity of their statements, which the memo keeps
    alive): a routine's executable and its backend's printer both ask, and a deep network's
    answer takes a walk over every access of the routine."""
    stmts = tuple(stmts)
    ids = tuple(map(id, stmts))
    known = _LAST_CHECKS.get(ids)
    if known is not None:
        return known[1]
    last = _last_check(stmts)
    if len(_LAST_CHECKS) >= 4:
        del _LAST_CHECKS[next(iter(_LAST_CHECKS))]
    _LAST_CHECKS[ids] = (stmts, last)
    return last


_LAST_CHECKS: dict[tuple[int, ...], tuple[tuple[Stmt, ...], int]] = {}
""":func:`last_check`'s memo: the ids of a body's statements -> the statements (kept alive, so
the ids stay theirs) and the answer."""


def _last_check(stmts: tuple[Stmt, ...]) -> int:
    checked: list[CheckedPositions] = []
    last = -1
    for k, s in enumerate(stmts):
        if can_fail(s, checked=checked):
            last = k
        if checked:
            written = nodes_written(s)
            checked = [fact for fact in checked if fact.node not in written]
        checked += checked_positions(s)
    return last


def writes_before_failure(body: Stmt, stops_at_failure: bool = True) -> tuple[TNode, ...]:
    """The nodes a failed run of ``body`` (a routine's) may have written, in order of first write;
    none when no statement can fail. A backend that ``stops_at_failure`` (the interpreter raises,
    the C code returns after the :func:`last_check`) runs the statements up to the last one that
    can fail, not those after (an optimizer's updates after the gradients, typically); one that
    runs on to the end may have written every node the routine writes."""
    stmts = top_level(body)
    last = last_check(stmts)
    if last < 0:
        return ()
    ran = stmts[:last + 1] if stops_at_failure else stmts
    return tuple(dict.fromkeys(a.node for s in ran for a in accesses(s, fills=True) if a.write))
