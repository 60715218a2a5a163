"""Which loops of a kernel the writers tile, decided on the IR before any code is written.

Inside a kernel, a loop nest accumulating into one cell or local (:func:`accumulation`) is a
*reduction*: tiled over ``RBLOCK`` chunks when its operator regroups exactly enough
(:func:`tiled_reduction`), else run in order. Any other nest is an inner *stage* when its body
is pointwise over it (:func:`pointwise_stage`), else a sequential loop. A flat kernel's
``RBLOCK`` and its split reduction are only worth planning when its writer will use them:
:func:`survey` walks the kernel's statements as the writer does (flat.py, writer.py) and says
whether any loop becomes a stage and whether the reduction a split plan would split is reached
where it can be split (plan.py, ``plan_kernel``). The writers ask the same predicates, so that
the walk and the survey cannot disagree about a loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Container, Mapping

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import accesses, loop_chain, nodes_written
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import Affine, AnySymbol, AxisIndex, Fixed, IndexSymbol, Iter, index_symbols
from ocannl.lowlevel.ir import (
    DeclareLocal, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local, LocalScope, Seq, SetLocal, Stmt, Store,
    StoreDynamic, iter_exprs, iter_stmts, stmt_exprs,
)
from ocannl.lowlevel.scalar_ops import ACCUMULATORS, Binop
from ocannl.lowlevel.schedule import regrouping, update_of

from ocannl.backends.partition import Kernel, scatter_add_nodes, signature_ok

_COMMUTATIVE = frozenset({Binop.ADD, Binop.MUL, Binop.MAX, Binop.MIN})

EXACT_ACCUMULATORS = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.uint32})
"""Accumulator types a tiled reduction computes as the loop does (half precision rounds on every
store, so it stays sequential)."""

SHORT_SUM = 16
"""Sums, differences, products and quotients over fewer points run in the loop's order (bit for
bit the interpreter's); longer ones are tiled (a tree order, within the conformance tolerance).
Max and min are exact in any order and tiled at every length."""


Accumulation = tuple[Binop, Store | SetLocal, Expr]
"""``(op, statement, v)``: a loop nest's accumulation of ``v`` by ``statement`` with ``op``."""

Canon = Mapping[AnySymbol, Any]
"""What each loop symbol of a kernel runs as in its writer (a grid axis, an inner tile's
position...), for comparing cells across loops (:func:`canon_indices`)."""


def accumulation(chain: list[For], body: Stmt, declared: Container[Local]) -> Accumulation | None:
    """``(op, statement, v)`` when the loops of ``chain`` accumulate ``v`` into one cell or into
    a local of ``declared`` (those the kernel has declared so far) with ``op``: ``body`` is ``c[I]
    := op(c[I], v)`` or ``l := op(l, v)`` (or ``op(v, old)`` for a commutative ``op``), the
    cell's indices and ``v``'s reads independent of the loop order, ``v`` writing nothing."""
    found = update_of(body, _COMMUTATIVE)
    if found is None or found.op not in ACCUMULATORS:
        return None
    target, value = found.statement, found.term
    old = Load(target.tnode, target.indices) if isinstance(target, Store) else GetLocal(target.local)
    if _mentions(value, old):
        return None
    syms = {loop.symbol for loop in chain}
    if isinstance(target, Store):
        if target.skip_oob or any(s in syms for i in target.indices for s in index_symbols(i)):
            return None
    elif target.local not in declared or target.local.dtype is dtypes.uint4x32:
        return None
    if nodes_written(value):
        return None
    return found.op, target, value


def _mentions(e: Expr, old: Expr) -> bool:
    if isinstance(old, GetLocal):
        return any(isinstance(x, GetLocal) and x.local is old.local for x in iter_exprs(e)) or any(
            isinstance(x, LocalScope) for x in iter_exprs(e))
    return any(isinstance(x, (Load, LoadDynamic)) and x.tnode is old.tnode for x in iter_exprs(e))


def accumulator_dtype(target: Store | SetLocal) -> DType:
    """The type a reduction accumulates in: its cell's node's, or its local's."""
    return target.tnode.dtype if isinstance(target, Store) else target.local.dtype


def tiled_reduction(op: Binop, target: Store | SetLocal, chain: list[For]) -> bool:
    """Whether a reduction the kernel may tile runs as ``RBLOCK`` chunks combined by its
    operator's regrouping (``schedule.regrouping``): on an exact accumulator, and for a sum,
    product or quotient over at least :data:`SHORT_SUM` points; else in the loop's order."""
    dtype = accumulator_dtype(target)
    total = math.prod(loop.extent for loop in chain)
    return (regrouping(op, dtype) is not None and dtype in EXACT_ACCUMULATORS
            and (op in (Binop.MAX, Binop.MIN) or total >= SHORT_SUM))


def pointwise_stage(s: For, chain: list[For], body: Stmt) -> bool:
    """Whether the nest ``s`` (loops ``chain`` around ``body``) is an inner stage: a body with no
    loop of its own that sets no local declared outside it, stores something, and accesses every
    node it writes at the same points of the loops (the signature rule of partition.py)."""
    if _has_loop(body) or _sets_undeclared_local(body):
        return False  # a nested loop nest, or a reduction into an enclosing local
    if not any(a.write for a in accesses(s)):
        return False
    syms = tuple(loop.symbol for loop in chain)
    return signature_ok([(s, syms, scatter_add_nodes(s))], len(syms))


def _has_loop(body: Stmt) -> bool:
    """Whether ``body`` has a loop of its own (local scopes aside)."""
    if isinstance(body, For):
        return True
    return isinstance(body, Seq) and any(_has_loop(s) for s in body.stmts)


def _sets_undeclared_local(body: Stmt) -> bool:
    declared = {s.local for s in iter_stmts(body) if isinstance(s, DeclareLocal)}
    for s in iter_stmts(body):
        for e in stmt_exprs(s):
            declared.update(x.local for x in iter_exprs(e) if isinstance(x, LocalScope))
    return any(isinstance(s, SetLocal) and s.local not in declared for s in iter_stmts(body))


def sets_first(s: Stmt, local: Local) -> bool:
    """Whether ``s`` assigns ``local`` a value that does not read it (so its zero is never seen)."""
    return isinstance(s, SetLocal) and s.local is local and not any(
        isinstance(x, GetLocal) and x.local is local for x in iter_exprs(s.value))


def reset_accumulation(store: Store, loop: For, declared: Container[Local]) -> Store | None:
    """The store accumulating into ``store``'s node in ``loop`` when the reset ``store`` just
    before it may start that accumulation from a register (the caller compares the two cells'
    indices), else ``None``."""
    if store.skip_oob or not store.tnode.dtype.is_compute_type or store.tnode.dtype is dtypes.uint4x32:
        return None
    found = accumulation(*loop_chain(loop), declared)
    if found is None or not isinstance(found[1], Store) or found[1].tnode is not store.tnode:
        return None
    return found[1]


def overwritten_accumulation(s: Stmt, following: Stmt, declared: Container[Local]) -> Store | None:
    """The store accumulating into a cell in the loop ``s`` when the statement ``following`` may
    overwrite that cell right after (the caller compares the two cells): the sum then stays in a
    register, which ``following`` reads."""
    if not (isinstance(s, For) and isinstance(following, Store)) or following.skip_oob:
        return None
    dtype = following.tnode.dtype
    if not dtype.is_compute_type or dtype is dtypes.uint4x32:
        return None  # a half-precision cell rounds on its store: the register would not
    found = accumulation(*loop_chain(s), declared)
    return found[1] if found is not None and isinstance(found[1], Store) else None


# ---------------------------------------------------------------------------------------------
# The survey of a flat kernel


@dataclass(frozen=True)
class Survey:
    """What a flat kernel's writer will do with ``RBLOCK`` tiles: whether any loop becomes an
    inner stage (a reduction or a pointwise one), and whether a reduction over the planned split's
    terms is reached at the kernel's top level before anything is stored (the one a split plan
    splits, flat.py ``FlatKernelWriter.splits``)."""

    stages: bool
    splits: bool


def survey(kernel: Kernel, split_terms: int | None) -> Survey:
    """The :class:`Survey` of the flat ``kernel``, its writer given ``RBLOCK`` tiles and a split
    of the reductions over ``split_terms`` points (``None``: no split)."""
    walk = _Walk(split_terms)
    parts = kernel.parts
    canons = [{s: ("grid", t) for t, s in enumerate(p.grid)} for p in parts]
    for n, part in enumerate(parts):
        following = (parts[n + 1].body, canons[n + 1]) if n + 1 < len(parts) else None
        if following is not None and walk.absorbs_reset(part.body, canons[n], *following, _Place()):
            continue
        walk.statement(part.body, canons[n], following, _Place())
    return Survey(walk.stages, walk.splits)


@dataclass(frozen=True)
class _Place:
    """Where the walk is: inside an inner stage (no loop in it is tiled again), and at the
    kernel's top level (not inside a loop the program runs in order)."""

    in_stage: bool = False
    top: bool = True


@dataclass
class _Walk:
    """The writer's walk (writer.py ``KernelWriter.stmt``), keeping only what decides tiles: the
    locals declared so far and whether anything was stored yet."""

    split_terms: int | None
    declared: set[Local] = field(default_factory=set)
    stored: bool = False
    stages: bool = False
    splits: bool = False

    def statement(self, s: Stmt, canon: Canon, following: tuple[Stmt, Canon] | None, place: _Place) -> None:
        """``s``, its reduction's store deferred when ``following`` overwrites the cell."""
        deferred = following is not None and self.overwrites(s, canon, *following)
        self.stmt(s, canon, place, deferred)

    def stmt(self, s: Stmt, canon: Canon, place: _Place, deferred: bool = False) -> None:
        match s:
            case Seq(stmts=stmts):
                for k, x in enumerate(stmts):
                    following = stmts[k + 1] if k + 1 < len(stmts) else None
                    if isinstance(x, DeclareLocal) and following is not None and sets_first(following, x.local):
                        continue
                    if following is not None and self.absorbs_reset(x, canon, following, canon, place):
                        continue
                    self.statement(x, canon, (following, canon) if following is not None else None, place)
            case DeclareLocal(local=local):
                self.declared.add(local)
            case SetLocal(local=local, value=value):
                self.expr(value, canon, place)
                self.declared.add(local)
            case Store(value=value):
                self.expr(value, canon, place)
                self.stored = True
            case StoreDynamic():
                self.stored = True
                for e in stmt_exprs(s):
                    self.expr(e, canon, place)
            case Fill():
                self.stored = True
            case For():
                self.loop(s, canon, place, deferred)

    def expr(self, e: Expr, canon: Canon, place: _Place) -> None:
        """The statements of the local scopes ``e`` evaluates."""
        for x in iter_exprs(e):
            if isinstance(x, LocalScope):
                self.declared.add(x.local)
                self.stmt(x.body, canon, place)

    def loop(self, s: For, canon: Canon, place: _Place, deferred: bool) -> None:
        """A reduction (tiled or in order), an inner stage, or a loop run in order."""
        chain, body = loop_chain(s)
        found = accumulation(chain, body, self.declared)
        if found is not None:
            op, target, value = found
            if not place.in_stage and tiled_reduction(op, target, chain):
                self.stages = True
                terms = math.prod(loop.extent for loop in chain)
                self.splits |= place.top and not self.stored and terms == self.split_terms
                self.expr(value, canon, _Place(in_stage=True, top=False))
            else:
                self.expr(value, canon, _Place(place.in_stage, top=False))
            self.stored |= isinstance(target, Store) and not deferred
        elif not place.in_stage and pointwise_stage(s, chain, body):
            self.stages = True
            self.stmt(body, canon, _Place(in_stage=True, top=False))
        else:
            self.stmt(s.body, canon, _Place(place.in_stage, top=False))

    def absorbs_reset(self, s: Stmt, canon: Canon, following: Stmt, following_canon: Canon, place: _Place) -> bool:
        """Whether ``s`` resets the cell the reduction ``following`` starts from (never stored)."""
        if not (isinstance(s, Store) and isinstance(following, For)):
            return False
        target = reset_accumulation(s, following, self.declared)
        if target is None or canon_indices(target.indices, following_canon) != canon_indices(s.indices, canon):
            return False
        self.expr(s.value, canon, place)
        return True

    def overwrites(self, s: Stmt, canon: Canon, following: Stmt, following_canon: Canon) -> bool:
        """Whether ``following`` overwrites the cell the reduction ``s`` accumulates into."""
        target = overwritten_accumulation(s, following, self.declared)
        return target is not None and (target.tnode, canon_indices(target.indices, canon)) == (
            following.tnode, canon_indices(following.indices, following_canon))


def canon_indices(indices: tuple[AxisIndex, ...], canon: Canon) -> tuple:
    """``indices`` in a form where two cells compare equal when they are the same cells of the
    kernel: each loop symbol replaced by what it runs as in the writer (``canon``: a grid axis,
    an inner tile's position...; a symbol not there stands for itself)."""

    def canonical(s: AnySymbol) -> Any:
        return s if isinstance(s, IndexSymbol) else canon.get(s, s)

    out = []
    for idx in indices:
        match idx:
            case Fixed(index=i):
                out.append(("fixed", i))
            case Iter(symbol=s):
                out.append(("iter", canonical(s)))
            case Affine(terms=terms, offset=off):
                out.append(("affine", tuple((c, canonical(s)) for c, s in terms), off))
    return tuple(out)
