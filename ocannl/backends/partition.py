"""Kernel partitioning: the optimized loop IR of a routine cut into GPU kernels, shared by the
Triton and Metal backends (each renders the kernels its own way).

A routine body is a sequence of top-level statements (loop nests, fills, scalar stores). Each
kernel runs some of them, in order (a run of consecutive statements, and statements moved up into
it: see below), over one *grid*: a tuple of axes whose points are
independent, each mapped to one loop of every statement in the kernel (that statement's *grid
loops*). A program of the kernel takes a tile of grid points and runs, for each statement in
turn, the statement with its grid loops removed (the remaining loops run inside the program:
vectorized over an inner tile, or sequentially, as the backend's emitter decides).

**Which loops can be grid loops** (:func:`grid_candidates`). A loop of the outermost perfect
chain of a nest (each loop's body is the next loop), such that every node the nest writes is
written with the loop's bare index on one axis, and read, wherever the nest reads it, with the
bare index on that same axis: then different iterations touch disjoint cells and can run in any
order (a reduction loop outside a parallel one, ``for r: for p: b[p] += a[r, p]``, keeps its
order inside each program). A scatter-add (``t[@(p), j] += v``, the gradient of ``oc.take``) is
done with atomic adds, so it constrains no loop.

**Which statements share a kernel** (:func:`partition`). A statement joins the kernel before it
when its grid loops have the kernel's extents and the *signature rule* holds over the whole
kernel: every access to a node some statement of the kernel writes has, for each grid axis, that
axis's index at one common array axis. Then no program reads or overwrites a cell another
program writes, so running each program's statements in order computes what the sequential
loops compute. A statement whose grid would be longer joins with its first grid loops as the
kernel's grid (the rest run inside each program) when it reads what the kernel wrote (the row
softmax: a max over each row, then pointwise work on the row, then a sum, all one kernel); a
kernel whose grid is longer than a following statement's is shortened to it on the same
condition, never to no axis at all; either way only when what each program then runs of every
statement is *stages* (each loop nest a perfect chain over a loop-free body: pointwise work or a
reduction a program tiles), not a parallel loop around another loop, which a program would run
one iteration at a time. Anything else starts a new kernel, so a later nest that reads what an
earlier one wrote through another index pattern runs after it in its own kernel.

**Moving a statement up** (:func:`_hoist`). A statement that cannot join the last kernel joins
the latest earlier kernel whose rules above accept it, provided it *conflicts* with none of the
kernels after that one: two statements conflict when one writes a node the other reads or writes.
Statements that do not conflict commute (each reads the same values and leaves the same values
whichever runs first), so moving it above kernels it does not conflict with computes what the
routine's order computes; a statement conflicting with a kernel stops the search there. This is
how a pointwise gradient joins the epilogue of the contraction producing its input when other
kernels were emitted between them. Statements using a local declared at the top level stay put.

**Which kernels share a launch** (:func:`group`). Kernels conflict as statements do (one writes a
node the other reads or writes; nodes, not cells, so the test is conservative). A launch
finishes, all its stores visible, before the next starts: that is the only synchronization
between programs a GPU has. Kernels are grouped so that running launches one after the other is
running the kernels in order:

1. *Segments.* A launch's programs are its segments' programs one after the other (program
   ``p`` is program ``p - start`` of the segment whose range holds it). No two segments of a
   launch conflict, so no program reads or overwrites a cell that a program of another segment
   writes, and the programs may run in any order or at once, as the programs of one kernel may
   (the signature rule).
2. *Chains.* A segment of several kernels requires that each runs a single program: that one
   program runs them in order, with a barrier before a kernel that conflicts with one since the
   previous barrier (a barrier makes the program's stores visible to all its threads). One
   program running the kernels in order is the routine's order.
3. *Order.* Kernels are taken in routine order; each joins the launch being formed when every
   earlier kernel it conflicts with runs in an earlier launch, or, for a single-program kernel,
   in single-program segments of this launch, which are then merged into one chain that it
   ends. A kernel that cannot join waits for a later launch, and so does every later kernel
   conflicting with it: a kernel only ever moves before kernels it does not conflict with. So
   the launches run the kernels in an order that keeps every conflicting pair in routine order.

Each launch thus takes every kernel that can run as soon as what it depends on has run: the
optimizer's updates of all parameters (independent of each other) become segments of one
launch, so do the gradient kernels of a layer's weight and bias, and every single-program kernel
of a small model folds into one chain. Segments are listed longest programs first (a GPU starts
programs roughly in order of their number). :func:`launch_hazards` checks a grouping against
these rules (the tests run it on the training steps). Metal launches the kernels one by one.

**Contractions** (:class:`~ocannl.lowlevel.schedule.Contraction`): a nest ``c[I] (:= 0;) for k..: c[I] += a * b`` whose
``a`` and ``b`` split the grid loops into rows (in ``a`` only) and columns (in ``b`` only) and
share the reduction loops becomes a kernel over row x column tiles (``tl.dot`` on Triton). Pointwise nests
that follow with the same grid (a bias add, a relu) join it as its epilogue, computed on the
accumulator tile before it leaves the registers.

Consecutive fills form one kernel of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import AbstractSet, Iterable, Iterator

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import (
    Access, accesses, expr_symbols, indices_symbols, locals_read, locals_written, loop_chain, sets_outer_local,
)
from ocannl.lowlevel.indexing import AnySymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, Fill, For, Load, LoadDynamic,
    LocalScope, Seq, SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary, iter_exprs, iter_stmts, stmt_exprs,
)
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.schedule import Contraction, contraction_of, product_factors
from ocannl.lowlevel.tnode import TNode

# ---------------------------------------------------------------------------------------------
# Accesses


def scatter_add_nodes(stmt: Stmt) -> frozenset[TNode]:
    """Nodes that ``stmt`` only updates by scatter-adds ``t[@(p), J] := t[@(p), J] + v`` (``v``
    not reading ``t``), done with atomic adds on a dtype that has them."""
    found: set[TNode] = set()
    other: set[TNode] = set()
    for s in iter_stmts(stmt):
        if isinstance(s, StoreDynamic) and scatter_add_value(s) is not None:
            found.add(s.tnode)
    for a in accesses(stmt):
        if a.node in found:
            continue
        other.add(a.node)
    atomic = {dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64}
    # Reads of t inside a scatter-add's own value are part of the atomic update.
    ok = set()
    for node in found:
        if node.dtype not in atomic:
            continue
        plain = [a for s in iter_stmts(stmt) for a in _non_atomic_accesses(s, node)]
        if not plain:
            ok.add(node)
    return frozenset(ok)


def scatter_add_value(s: StoreDynamic) -> Expr | None:
    """The added value ``v`` of a scatter-add ``t[@(p), J] := t[@(p), J] + v``, else ``None``."""
    match s.value:
        case Binary(op=Binop.ADD, a=LoadDynamic() as old, b=v) | Binary(op=Binop.ADD, a=v, b=LoadDynamic() as old):
            if (old.tnode, old.axis, old.position, old.indices) == (s.tnode, s.axis, s.position, s.indices):
                if not any(isinstance(e, (Load, LoadDynamic)) and e.tnode is s.tnode for e in iter_exprs(v)):
                    return v
    return None


def _non_atomic_accesses(s: Stmt, node: TNode) -> Iterator[Access]:
    """The accesses of ``node`` by statement ``s`` itself that are not part of a scatter-add."""
    if isinstance(s, StoreDynamic) and s.tnode is node and scatter_add_value(s) is not None:
        exprs: tuple[Expr, ...] = (s.position, scatter_add_value(s))
    else:
        exprs = stmt_exprs(s)
        if isinstance(s, (Store, StoreDynamic)) and s.tnode is node:
            yield Access(node, (), True)
    for e in exprs:
        for sub in iter_exprs(e):
            if isinstance(sub, (Load, LoadDynamic)) and sub.tnode is node:
                yield Access(node, (), False)


# ---------------------------------------------------------------------------------------------
# Loop chains and grid candidates


def axis_positions(access: Access, symbol: AnySymbol) -> frozenset[int]:
    return frozenset(k for k, idx in enumerate(access.indices) if idx == Iter(symbol))


@dataclass(frozen=True)
class Footprint:
    """The nodes a statement accesses, found once per statement: the partitioner consults them at
    every kernel it tries the statement in, and walking the statement each time made partitioning
    a routine of many statements quadratic."""

    accesses: tuple[Access, ...]
    """Its loads and stores, fills aside (:func:`~ocannl.lowlevel.analysis.accesses`)."""
    reads: frozenset[TNode]
    stores: frozenset[TNode]
    """The nodes it stores into (plainly or by scatter-adds)."""
    writes: frozenset[TNode]
    """The nodes it stores into or fills."""

    @staticmethod
    def of(stmt: Stmt) -> Footprint:
        found = tuple(accesses(stmt))
        stores = frozenset(a.node for a in found if a.write)
        filled = frozenset(s.tnode for s in iter_stmts(stmt) if isinstance(s, Fill))
        return Footprint(found, frozenset(a.node for a in found if not a.write), stores, stores | filled)


class SignatureRule:
    """The signature rule (module docstring) over statements added one at a time, each checked in
    time proportional to its own accesses, not the kernel's: the nodes written so far, those
    updated atomically and those accessed plainly, and for every node the array axes at which
    each plain access so far has each grid axis's bare index (the rule holds while that is a
    common axis, for every axis, for every written node)."""

    def __init__(self, n_axes: int):
        self.n_axes = n_axes
        self.written: set[TNode] = set()
        self.atomic: set[TNode] = set()
        self.plain: set[TNode] = set()
        self.common: dict[TNode, tuple[frozenset[int], ...]] = {}
        self.holds = True

    def admit(self, footprint: Footprint, grid: tuple[Symbol, ...], scatter: frozenset[TNode]) -> bool:
        """Adds a statement (its grid loops, one per axis, and its atomically updated nodes) if
        the rule holds with it; else leaves the rule as it was and returns ``False``."""
        common = self._check(footprint, grid, scatter)
        if common is None:
            return False
        self._add(footprint, scatter, common)
        return True

    def record(self, footprint: Footprint, grid: tuple[Symbol, ...], scatter: frozenset[TNode]) -> None:
        """Adds a statement whether or not the rule holds with it (a statement pinned to its kernel
        by a local): if it does not, no later statement is admitted, as none would have been had
        the rule been checked over the whole kernel."""
        common = self._check(footprint, grid, scatter)
        if common is None:
            self.holds = False
            common = self._intersected(footprint, grid, scatter)
        self._add(footprint, scatter, common)

    def _intersected(self, footprint: Footprint, grid: tuple[Symbol, ...],
                     scatter: frozenset[TNode]) -> dict[TNode, tuple[frozenset[int], ...]]:
        """The common axes of the nodes the statement accesses plainly, with its accesses."""
        common: dict[TNode, tuple[frozenset[int], ...]] = {}
        for a in footprint.accesses:
            if a.node in scatter:
                continue
            positions = tuple(axis_positions(a, grid[t]) for t in range(self.n_axes))
            before = common.get(a.node, self.common.get(a.node))
            common[a.node] = positions if before is None else tuple(p & q for p, q in zip(before, positions))
        return common

    def _check(self, footprint: Footprint, grid: tuple[Symbol, ...],
               scatter: frozenset[TNode]) -> dict[TNode, tuple[frozenset[int], ...]] | None:
        """The updated common axes if the rule holds with the statement, else ``None``."""
        if not self.holds:
            return None
        plain = {a.node for a in footprint.accesses if a.node not in scatter}
        if not scatter.isdisjoint(self.plain) or not self.atomic.isdisjoint(plain):
            return None  # updated atomically by one statement, accessed plainly by another
        common = self._intersected(footprint, grid, scatter)
        for node, positions in common.items():
            if (node in self.written or node in footprint.writes) and not all(positions):
                return None
        for node in footprint.writes:
            if node not in common and not all(self.common.get(node, ())):
                return None  # written now, accessed before through another index pattern
        return common

    def _add(self, footprint: Footprint, scatter: frozenset[TNode],
             common: dict[TNode, tuple[frozenset[int], ...]]) -> None:
        self.written |= footprint.writes
        self.atomic |= scatter
        self.plain.update(a.node for a in footprint.accesses if a.node not in scatter)
        self.common.update(common)


def signature_ok(statements: Iterable[tuple[Stmt, tuple[Symbol, ...], frozenset[TNode]]], n_axes: int) -> bool:
    """The signature rule (module docstring): each statement comes with its grid loops (one per
    kernel axis) and its atomically updated nodes."""
    rule = SignatureRule(n_axes)
    return all(rule.admit(Footprint.of(stmt), grid, scatter) for stmt, grid, scatter in statements)


def grid_candidates(stmt: Stmt) -> list[For]:
    """The loops of ``stmt``'s outer perfect chain that may run as grid axes, in chain order."""
    return _grid_candidates(stmt, Footprint.of(stmt), scatter_add_nodes(stmt))


def _grid_candidates(stmt: Stmt, footprint: Footprint, scatter: frozenset[TNode]) -> list[For]:
    chain, _ = loop_chain(stmt)
    out = []
    for loop in chain:
        if loop.extent < 1 or sets_outer_local(loop.body):
            continue
        if not footprint.stores and not scatter:
            continue
        if SignatureRule(1).admit(footprint, (loop.symbol,), scatter):
            out.append(loop)
    return out


def without_loops(stmt: Stmt, removed: Iterable[Symbol]) -> Stmt:
    """``stmt`` with the loops of its outer chain over ``removed`` taken out (the grid loops)."""
    removed = set(removed)
    chain, body = loop_chain(stmt)
    for loop in reversed(chain):
        if loop.symbol not in removed:
            body = For(loop.symbol, loop.extent, body, loop.kind)
    return body


# ---------------------------------------------------------------------------------------------
# Contractions


def _plain(e: Expr) -> bool:
    """An operand the dot template can tile: loads (affine, maybe padded) and arithmetic on them,
    no locals, gathers or PRNG."""
    return all(isinstance(x, (Load, Const, Unary, Binary, Ternary, Cast, EmbedIndex)) for x in iter_exprs(e)) and all(
        x.dtype is not dtypes.uint4x32 for x in iter_exprs(e)
    )


DOT_MIN_K = 16
"""``tl.dot`` tiles are at least 16 deep; shorter contractions are plain reductions."""


def loop_sites(stmt: Stmt) -> Iterator[For]:
    """The loops of ``stmt`` not nested in another loop (inside local scopes too), in order."""
    match stmt:
        case For():
            yield stmt
            return
        case Seq(stmts=stmts):
            for s in stmts:
                yield from loop_sites(s)
            return
    for e in stmt_exprs(stmt):
        for x in iter_exprs(e):
            if isinstance(x, LocalScope):
                yield from loop_sites(x.body)


def find_contraction(stmt: Stmt, grid: tuple[Symbol, ...]) -> Contraction | None:
    """The first contraction of ``stmt`` (its grid loops removed) the dot template applies to:
    a float32 accumulator, operands that split the grid into non-empty rows and columns and both
    read every reduction loop."""
    for site in loop_sites(without_loops(stmt, grid)):
        found = _contraction_at(site, grid)
        if found is not None:
            return _columns_last(found, stmt, grid)
    return None


def _contraction_at(site: For, grid: tuple[Symbol, ...]) -> Contraction | None:
    """The contraction (``schedule.contraction_of``) whose reduction loops are the chain headed by
    ``site``, when the dot template applies to it (:func:`find_contraction`)."""
    chain, update = loop_chain(site)
    if isinstance(update, Store):
        if update.skip_oob or update.tnode.dtype is not dtypes.float32:
            return None
    elif isinstance(update, SetLocal):
        if update.local.dtype is not dtypes.float32:
            return None
    else:
        return None
    factors = product_factors(update)
    if factors is None or not all(_plain(f) for f in factors):
        return None
    a, b = factors
    if isinstance(update, Store) and any(isinstance(x, Load) and x.tnode is update.tnode
                                         for e in factors for x in iter_exprs(e)):
        return None
    if math.prod(loop.extent for loop in chain) < DOT_MIN_K:
        return None  # a short sum: computed in the loop's order instead (emit.py)
    k_symbols = {loop.symbol for loop in chain}
    if isinstance(update, Store) and k_symbols & indices_symbols(update.indices):
        return None
    sa, sb = expr_symbols(a), expr_symbols(b)
    if not k_symbols <= (sa & sb):
        return None
    if any(isinstance(s, Symbol) and s not in k_symbols and s not in grid for s in sa | sb):
        return None
    return contraction_of(a, b, grid, tuple((loop.symbol, loop.extent) for loop in chain), update=update, site=site)


def _columns_last(c: Contraction, stmt: Stmt, grid: tuple[Symbol, ...]) -> Contraction:
    """``c`` with its operands swapped (``a * b == b * a`` bit for bit) when the statement's
    first store varies fastest along a row symbol: tiles then store along their columns, the
    contiguous direction."""
    stores = [s for s in iter_stmts(without_loops(stmt, grid)) if isinstance(s, Store)]
    if stores and stores[0].indices:
        last = stores[0].indices[-1]
        if isinstance(last, Iter) and last.symbol in c.rows:
            return c.swapped()
    return c


# ---------------------------------------------------------------------------------------------
# Kernels


@dataclass(frozen=True)
class Part:
    """One top-level statement of a kernel: ``grid`` are its loops running as the kernel's grid
    axes (one per axis, in axis order), ``body`` what each grid point runs (the statement without
    those loops), ``scatter`` the nodes it updates with atomic adds, ``footprint`` the nodes it
    accesses."""

    stmt: Stmt
    grid: tuple[Symbol, ...]
    body: Stmt
    scatter: frozenset[TNode]
    footprint: Footprint = field(compare=False, repr=False)


@dataclass
class Kernel:
    """A run of top-level statements launched as one Triton kernel. ``tiling`` is ``"flat"``
    (grid points flattened into one tiled axis), ``"dot"`` (a contraction: row x column tiles)
    or ``"fill"`` (whole-buffer fills). Parts join through :meth:`add`, which keeps the nodes
    read and written and the signature rule up to date."""

    tiling: str
    extents: tuple[int, ...]
    parts: list[Part] = field(default_factory=list)
    contraction: Contraction | None = None
    comments: list[str] = field(default_factory=list)
    locals: set = field(default_factory=set)
    """Locals declared by a top-level statement of the kernel."""
    reads: set[TNode] = field(init=False, default_factory=set, compare=False, repr=False)
    """The nodes its parts read."""
    writes: set[TNode] = field(init=False, default_factory=set, compare=False, repr=False)
    """The nodes its parts store into or fill."""
    rule: SignatureRule = field(init=False, compare=False, repr=False)
    """The signature rule over its parts, on its grid axes."""

    def __post_init__(self) -> None:
        parts, self.parts = self.parts, []
        self.rule = SignatureRule(len(self.extents))
        for part in parts:
            self.add(part, checked=False)

    @property
    def fills(self) -> list[Fill]:
        return [p.stmt for p in self.parts if isinstance(p.stmt, Fill)]

    def add(self, part: Part, comments: Iterable[str] = (), *, checked: bool = True) -> bool:
        """Appends ``part`` if the signature rule holds with it (``checked``; else in any case: a
        statement pinned to the kernel by a local)."""
        if checked:
            if not self.rule.admit(part.footprint, part.grid, part.scatter):
                return False
        else:
            self.rule.record(part.footprint, part.grid, part.scatter)
        self._append(part, comments)
        return True

    def shorten(self, m: int, part: Part, comments: list[str]) -> bool:
        """Runs the kernel on its first ``m`` grid axes, the others inside each program, and
        appends ``part`` (its ``m`` grid loops), if the signature rule holds for all on them."""
        shortened = [replace(p, grid=p.grid[:m], body=without_loops(p.stmt, p.grid[:m])) for p in self.parts]
        if not all(_stages(p.body) for p in shortened + [part]):
            return False
        rule = SignatureRule(m)
        if not all(rule.admit(p.footprint, p.grid, p.scatter) for p in shortened + [part]):
            return False
        self.parts, self.extents, self.rule = shortened, self.extents[:m], rule
        self._append(part, comments)
        return True

    def _append(self, part: Part, comments: Iterable[str]) -> None:
        self.parts.append(part)
        self.reads |= part.footprint.reads
        self.writes |= part.footprint.writes
        self.comments.extend(comments)


@dataclass(frozen=True)
class _Candidate:
    """A top-level statement about to join a kernel, with what every kernel it is tried in asks
    of it, found once: its grid candidates, its contraction over them, its atomically updated
    nodes and the nodes it accesses."""

    stmt: Stmt
    loops: tuple[For, ...]
    contraction: Contraction | None
    scatter: frozenset[TNode]
    footprint: Footprint = field(compare=False, repr=False)

    @staticmethod
    def of(stmt: Stmt) -> _Candidate:
        footprint, scatter = Footprint.of(stmt), scatter_add_nodes(stmt)
        if isinstance(stmt, (Fill, DeclareLocal, SetLocal)):
            return _Candidate(stmt, (), None, frozenset() if isinstance(stmt, Fill) else scatter, footprint)
        loops = tuple(_grid_candidates(stmt, footprint, scatter))
        contraction = find_contraction(stmt, tuple(loop.symbol for loop in loops)) if loops else None
        return _Candidate(stmt, loops, contraction, scatter, footprint)

    def part(self, loops: Iterable[For] = ()) -> Part:
        """The statement run with ``loops`` as grid loops (a fill: as it is)."""
        if isinstance(self.stmt, Fill):
            return Part(self.stmt, (), self.stmt, frozenset(), self.footprint)
        grid = tuple(loop.symbol for loop in loops)
        return Part(self.stmt, grid, without_loops(self.stmt, grid), self.scatter, self.footprint)


def _extents(loops: Iterable[For]) -> tuple[int, ...]:
    return tuple(loop.extent for loop in loops)


def partition(body: Stmt) -> list[Kernel]:
    """The kernels of a routine body, in launch order (module docstring)."""
    statements = [s for s in (body.stmts if isinstance(body, Seq) else (body,)) if s != Seq(())]
    last_use = _last_uses(statements)
    top_locals = set(last_use)
    kernels: list[Kernel] = []
    comments: list[str] = []
    current: Kernel | None = None
    for position, stmt in enumerate(statements):
        if isinstance(stmt, Comment):
            comments.append(stmt.text)
            continue
        candidate = _Candidate.of(stmt)
        pinned = current is not None and any(last_use.get(local, -1) >= position for local in current.locals)
        if pinned:
            # A local declared at the top level lives in one kernel: its users join it.
            current.add(candidate.part(), comments, checked=False)
        elif current is None or not _join(current, candidate, comments):
            if not _hoist(kernels, candidate, comments, top_locals):
                current = _new_kernel(candidate, comments)
                kernels.append(current)
        if isinstance(stmt, DeclareLocal):
            current.locals.add(stmt.local)
        comments = []
    if comments and kernels:
        kernels[-1].comments.extend(comments)
    return kernels


def _hoist(kernels: list[Kernel], candidate: _Candidate, comments: list[str], top_locals: set) -> bool:
    """Add a statement to an earlier kernel than the last (module docstring, "Moving a statement
    up"): the latest one it may join, provided it conflicts with no kernel after that one."""
    stmt = candidate.stmt
    if isinstance(stmt, (DeclareLocal, SetLocal)) or not top_locals.isdisjoint(locals_read(stmt)):
        return False  # a top-level local lives in the kernel of its declaration
    nodes = (candidate.footprint.reads, candidate.footprint.writes)
    for j in range(len(kernels) - 2, -1, -1):
        if conflicts(nodes, kernel_nodes(kernels[j + 1])):
            return False
        if _join(kernels[j], candidate, comments):
            return True
    return False


def _last_uses(statements: list[Stmt]) -> dict:
    """For each local declared at the top level, the position of the last statement using it."""
    out: dict = {}
    for position, stmt in enumerate(statements):
        for local in locals_written(stmt) | locals_read(stmt):
            out[local] = position
    return out


def _new_kernel(candidate: _Candidate, comments: list[str]) -> Kernel:
    if isinstance(candidate.stmt, Fill):
        k = Kernel("fill", (), [candidate.part()])
    elif isinstance(candidate.stmt, (DeclareLocal, SetLocal)):
        k = Kernel("flat", (), [candidate.part()])
    else:
        loops = candidate.loops
        k = Kernel("dot" if candidate.contraction else "flat", _extents(loops), [candidate.part(loops)],
                   candidate.contraction)
    k.comments.extend(comments)
    return k


def _join(kernel: Kernel, candidate: _Candidate, comments: list[str]) -> bool:
    """Add a statement to ``kernel`` if the rules of the module docstring allow it."""
    stmt = candidate.stmt
    if kernel.tiling == "fill" or isinstance(stmt, Fill):
        if kernel.tiling != "fill" or not isinstance(stmt, Fill):
            return False
        return kernel.add(candidate.part(), comments, checked=False)
    if isinstance(stmt, (DeclareLocal, SetLocal)):
        if kernel.tiling != "flat" or kernel.extents:
            return False
        return kernel.add(candidate.part(), comments)
    loops = candidate.loops
    n = len(kernel.extents)
    footprint = candidate.footprint
    # A read of what the kernel writes, or a write of what it reads.
    depends = not footprint.reads.isdisjoint(kernel.writes) or not footprint.stores.isdisjoint(kernel.reads)
    if kernel.tiling == "dot":
        if _extents(loops) != kernel.extents or candidate.contraction is not None:
            return False
        part = candidate.part(loops)
        if any(isinstance(s, For) for s in iter_stmts(part.body)):
            return False
        return kernel.add(part, comments)
    if _extents(loops) == kernel.extents:
        if candidate.contraction is not None:
            return False
        return kernel.add(candidate.part(loops), comments)
    if not depends or candidate.contraction is not None:
        return False
    if len(loops) > n >= 1 and _extents(loops[:n]) == kernel.extents:
        part = candidate.part(loops[:n])
        return _stages(part.body) and kernel.add(part, comments)
    m = len(loops)
    if 1 <= m < n and kernel.extents[:m] == _extents(loops):
        return kernel.shorten(m, candidate.part(loops), comments)
    return False


def _stages(body: Stmt) -> bool:
    """Whether what a statement runs inside each program is stages a program can tile: each
    loop nest a perfect chain over a body without loops (a pointwise stage or a reduction; loops
    in local scopes aside). A parallel loop around another loop would run one iteration at a
    time instead."""
    for s in body.stmts if isinstance(body, Seq) else (body,):
        if isinstance(s, For) and _nests_loop(loop_chain(s)[1]):
            return False
    return True


def _nests_loop(body: Stmt) -> bool:
    if isinstance(body, For):
        return True
    return isinstance(body, Seq) and any(_nests_loop(s) for s in body.stmts)


# ---------------------------------------------------------------------------------------------
# Launches


@dataclass(frozen=True)
class Launch:
    """Kernels run by one launch (module docstring, "Which kernels share a launch"): each of
    ``segments`` is a run of kernel numbers (positions in :func:`partition`'s list). The
    launch's programs are its segments' programs one after the other; every program of a
    segment runs the segment's kernels in order (more than one only when each runs a single
    program: a *chain*)."""

    segments: tuple[tuple[int, ...], ...]

    @property
    def kernels(self) -> tuple[int, ...]:
        return tuple(k for segment in self.segments for k in segment)


def kernel_nodes(kernel: Kernel) -> tuple[AbstractSet[TNode], AbstractSet[TNode]]:
    """The nodes ``kernel`` reads and those it writes (fills and atomic updates included): the
    kernel's own sets, not to be changed."""
    return kernel.reads, kernel.writes


def conflicts(a: tuple[AbstractSet[TNode], AbstractSet[TNode]], b: tuple[AbstractSet[TNode], AbstractSet[TNode]]) -> bool:
    """Whether two kernels, given by :func:`kernel_nodes`, must keep their order: one writes a
    node the other reads or writes."""
    (reads_a, writes_a), (reads_b, writes_b) = a, b
    return not (writes_a.isdisjoint(reads_b) and writes_a.isdisjoint(writes_b) and writes_b.isdisjoint(reads_a))


def group(kernels: list[Kernel], programs: list[int]) -> list[Launch]:
    """The launches running ``kernels`` (in :func:`partition`'s order; ``programs[i]``: how many
    programs kernel ``i`` runs), in launch order, by the rules of the module docstring."""
    nodes = [kernel_nodes(k) for k in kernels]
    earlier = [[d for d in range(i) if conflicts(nodes[d], nodes[i])] for i in range(len(kernels))]
    placed: set[int] = set()
    launches: list[Launch] = []
    while len(placed) < len(kernels):
        segments: list[list[int]] = []
        segment_of: dict[int, int] = {}
        for i in range(len(kernels)):
            if i in placed:
                continue
            pending = [d for d in earlier[i] if d not in placed]
            if any(d not in segment_of for d in pending):
                continue  # it waits for a kernel that a later launch runs
            joined = sorted({segment_of[d] for d in pending})
            if not joined:
                segments.append([i])
            elif programs[i] == 1 and all(programs[k] == 1 for s in joined for k in segments[s]):
                chain = [k for s in joined for k in segments[s]] + [i]
                for s in reversed(joined[1:]):
                    del segments[s]
                segments[joined[0]] = chain
            else:
                continue
            segment_of = {k: s for s, segment in enumerate(segments) for k in segment}
        # Longest programs first: a GPU starts programs roughly in order of their number, so a
        # long single-program chain starts at once instead of running on after the rest.
        segments.sort(key=lambda s: -sum(iterations(kernels[k]) / max(programs[k], 1) for k in s))
        launches.append(Launch(tuple(tuple(s) for s in segments)))
        placed.update(segment_of)
    return launches


def iterations(kernel: Kernel) -> int:
    """How many times the kernel's innermost statements run in all (its work, roughly)."""
    def count(stmt: Stmt) -> int:
        match stmt:
            case For(extent=extent, body=body):
                return extent * count(body)
            case Seq(stmts=stmts):
                return sum(count(s) for s in stmts)
        inner = [x.body for e in stmt_exprs(stmt) for x in iter_exprs(e) if isinstance(x, LocalScope)]
        return 1 + sum(count(b) for b in inner)

    return sum(count(p.stmt) for p in kernel.parts)


def launch_hazards(kernels: list[Kernel], programs: list[int], launches: list[Launch]) -> list[str]:
    """What makes ``launches`` differ from running ``kernels`` one after another in order, when
    the programs of a launch run in any order or at once (none: the grouping is sound). Checks
    that every kernel runs exactly once, that two conflicting kernels run in their order (in
    launches one after the other, or in that order in one chain), that segments of a launch do
    not conflict, and that only single-program kernels share a segment."""
    nodes = [kernel_nodes(k) for k in kernels]
    where: dict[int, tuple[int, int, int]] = {}
    problems: list[str] = []
    for n, launch in enumerate(launches):
        for s, segment in enumerate(launch.segments):
            if len(segment) > 1 and any(programs[k] != 1 for k in segment):
                problems.append(f"launch {n}: segment {list(segment)} chains a kernel of several programs")
            for position, k in enumerate(segment):
                if k in where:
                    problems.append(f"kernel {k} runs twice")
                where[k] = (n, s, position)
    problems += [f"kernel {k} never runs" for k in range(len(kernels)) if k not in where]
    for j in range(len(kernels)):
        for i in range(j):
            if i not in where or j not in where or not conflicts(nodes[i], nodes[j]):
                continue
            (li, si, pi), (lj, sj, pj) = where[i], where[j]
            if li < lj or (li == lj and si == sj and pi < pj):
                continue
            if li == lj and si != sj:
                problems.append(f"launch {li}: kernels {i} and {j} conflict in different segments")
            else:
                problems.append(f"kernel {j} runs before kernel {i}, with which it conflicts")
    return problems
