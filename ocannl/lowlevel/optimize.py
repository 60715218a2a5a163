"""Backend-independent optimization of the loop IR (docs/compiler.md, "Optimization").

:func:`optimize` sits between lowering and the backends; ``Context.compile`` prints its input as
``<routine>-unoptimized.ll`` and its output as ``<routine>.ll``. It composes passes that can each
be run and tested alone:

0. :func:`~ocannl.lowlevel.gather.gather_scatters` — a scatter-accumulation whose written
   index is a sum of two loops (a convolution's input gradient) iterates over the written cells
   instead, each cell's terms in their order: a reduction each cell owns. It runs first, so
   that the fill before the scatter can fold into the gather.
   Then :func:`~ocannl.lowlevel.overwrite.fold_fills` — a fill whose node the next access writes
   in every cell moves into that write: a gradient's zero fill into its first contribution, which
   then overwrites instead of adding to zeros. It runs before inlining, so that a gradient which only
   passes another's values on (``a.grad[I] := 0.0 + b.grad[I]``) is a copy that
   :func:`virtualize` can inline.
1. :func:`trace` — per node, which top-level statements write it and with which index patterns,
   where it is read, and whether some read may see a value from before the routine (then the node
   is a routine *input* and must persist).
2. :func:`virtualize` — a node that the runtime does not need to keep (not in ``keep``), written
   by one loop nest whose store indices are a bijection of its loop indices (a pointwise nest, or
   a reduction nest with its reset) and read only after it, without a cell being computed twice,
   gets no buffer: each read ``n[J]`` becomes a local scope computing the value of that cell.
   After it, :func:`~ocannl.lowlevel.overwrite.forward_stores`: a store that the next statement
   overwrites goes, its value forwarded into the overwrite (a mean and its scaling: one store).
   It runs after inlining, which shows the terms of the reductions it rewrites.
3. :func:`simplify` — local scopes of one assignment collapse to their value; constants fold
   where IEEE arithmetic rounds exactly once (never libm functions); identities that hold bit for
   bit (``x * 1``, ``x / 1``, ``x - 0``, ``x + -0``, never ``x + 0`` nor ``x * 0``); affine
   indices normalize.
4. :func:`eliminate_common_subexpressions` — an expression evaluated twice in a sequence of
   statements, with no store in between to what it reads, is computed once into a local.
5. :func:`form_fma` — ``a * b + c`` becomes ``fma(a, b, c)``, which rounds once instead of
   twice and so changes results: only when the caller asks (``fast_math=True``; the runtime
   passes the ``fast_math`` setting, ``OCANNL_FAST_MATH=1``: this layer reads no settings).
   Every backend, the interpreter included, runs the optimized IR, so backends still agree with
   each other.

Without the fast setting every pass keeps the interpreter's results bit for bit
(docs/design.md, "Arithmetic": one rounding per operation, no contraction).

**What persists (the keep/virtual contract).** Only the runtime knows which nodes must outlive a
routine, so :func:`optimize` takes ``keep``: nodes that must stay materialized. The default
(:func:`materialized_nodes`) keeps every node whose ``memory_mode`` is not
``MemoryMode.VIRTUAL``: an undecided node (``None``) is kept, so nothing is virtualized unless
someone asked for it. The frontend is to mark the intermediate results the user never reads
with :func:`~ocannl.lowlevel.tnode.mark_virtual` (a request: a node the optimizer cannot inline
keeps its buffer); ``mark_materialized`` undoes it. ``Context`` also keeps every node that a routine
it compiled earlier reads as an input. A node marked virtual is still kept where it is an output
(written, never read in the routine), so ``t.numpy()`` on it compiles a routine that stores it.
After a routine that inlined a node runs, ``ctx.get`` of that node raises an error that says so.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field, is_dataclass, replace
from typing import Any, Callable, Collection, Iterable

import numpy as np

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import (
    all_exprs, locals_read, locals_written, nodes_read, nodes_written, normalize_index, under_constant_arithmetic,
)
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.gather import gather_scatters
from ocannl.lowlevel.indexing import Affine, AnySymbol, AxisIndex, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local,
    LocalScope, RoutineIR, Seq, SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary, iter_exprs, iter_stmts,
    nesting, scope_bodies, seq, stmt_exprs, top_level, unconditional_exprs,
)
from ocannl.lowlevel.op_semantics import fold_binary, fold_unary
from ocannl.lowlevel.overwrite import fold_fills, forward_stores
from ocannl.lowlevel.rewrite import FreshCopy, Rewriter, rebuilt
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.structure import field_values
from ocannl.lowlevel.tnode import MemoryMode, TNode


def optimize(
    routine: RoutineIR, keep: Collection[TNode] | None = None, *, fast_math: bool = False
) -> RoutineIR:
    """The optimized form of ``routine``: :func:`~ocannl.lowlevel.gather.gather_scatters`,
    :func:`~ocannl.lowlevel.overwrite.fold_fills`,
    :func:`virtualize` (nodes outside ``keep``; ``None``: :func:`materialized_nodes`),
    :func:`~ocannl.lowlevel.overwrite.forward_stores`, :func:`simplify`,
    :func:`eliminate_common_subexpressions`, and with ``fast_math`` :func:`form_fma`."""
    keep = materialized_nodes(routine) if keep is None else keep
    routine = gather_scatters(routine)
    routine = fold_fills(routine)
    routine = virtualize(routine, keep)
    routine = forward_stores(routine)
    routine = simplify(routine)
    routine = eliminate_common_subexpressions(routine)
    if fast_math:
        routine = form_fma(routine)
    return routine


def materialized_nodes(routine: RoutineIR) -> set[TNode]:
    """The nodes of ``routine`` that must keep a buffer by default: all but those marked
    ``MemoryMode.VIRTUAL``."""
    return {n for n in routine.reads + routine.writes if n.memory_mode is not MemoryMode.VIRTUAL}


def inlined_nodes(unoptimized: RoutineIR, optimized: RoutineIR) -> frozenset[TNode]:
    """The nodes the optimizer virtualized: written by ``unoptimized``, not by ``optimized`` (the
    other passes never remove a store; simplification may remove a read, in a dead branch)."""
    return frozenset(unoptimized.writes) - set(optimized.writes)


def routine_inputs(routine: RoutineIR) -> frozenset[TNode]:
    """The nodes whose value before the routine runs may be read by it (see :func:`trace`)."""
    return frozenset(trace(routine).inputs)


# =============================================================================================
# 1. Tracing


@dataclass(frozen=True)
class Access:
    """One read or write of a node: the top-level statement it occurs in (``position``), its
    indices (``None``: every cell, a :class:`~ocannl.lowlevel.ir.Fill`), the loops around it
    inside that statement (outermost first, loops of local scopes included), and whether an axis
    is data-dependent (``dynamic``) or the read may fall outside the buffer (``padded``)."""

    position: int
    indices: tuple[AxisIndex, ...] | None
    loops: tuple[Symbol, ...]
    dynamic: bool = False
    padded: bool = False


@dataclass
class NodeTrace:
    """Everything a routine does to one node, in program order."""

    node: TNode
    reads: list[Access] = field(default_factory=list)
    writes: list[Access] = field(default_factory=list)
    read_before_write: bool = False
    """Some read may see the value the node had before the routine: the node is an input."""

    @property
    def writer_positions(self) -> tuple[int, ...]:
        return tuple(sorted({w.position for w in self.writes}))

    @property
    def store_patterns(self) -> tuple[tuple[AxisIndex, ...], ...]:
        """The distinct index tuples the node is stored at (fills excluded)."""
        patterns: dict[tuple[AxisIndex, ...], None] = {}
        for w in self.writes:
            if w.indices is not None:
                patterns.setdefault(w.indices, None)
        return tuple(patterns)


@dataclass
class Trace:
    """The result of :func:`trace`: the top-level statements and each node's accesses."""

    statements: tuple[Stmt, ...]
    nodes: dict[TNode, NodeTrace]
    extents: dict[Symbol, int]

    @property
    def inputs(self) -> tuple[TNode, ...]:
        """Nodes the routine may read before writing them: they must persist across runs."""
        return tuple(n for n, t in self.nodes.items() if t.read_before_write)

    @property
    def outputs(self) -> tuple[TNode, ...]:
        return tuple(n for n, t in self.nodes.items() if t.writes)


def trace(routine: RoutineIR) -> Trace:
    """Trace the accesses of every node of ``routine``, by index patterns
    (the original traces concrete positions).

    A node is read before written unless its first access in program order is a write that
    covers every cell (a fill, or a store whose indices are distinct loop indices spanning the
    dims, or 0 on size-1 axes) and any later read in that same top-level statement is at the
    store's own indices (the accumulation of a reduction nest)."""
    return trace_statements(top_level(routine.body))


def trace_statements(statements: Iterable[Stmt]) -> Trace:
    tracer = _Tracer()
    statements = tuple(statements)
    for position, s in enumerate(statements):
        tracer.stmt(s, position, ())
    for node, events in tracer.events.items():
        tracer.nodes[node].read_before_write = _read_before_write(node, events, tracer.extents)
    return Trace(statements, tracer.nodes, tracer.extents)


class _Tracer:
    def __init__(self, node_traces: bool = True) -> None:
        """``node_traces``: also sort each node's accesses into its :class:`NodeTrace`
        (:attr:`nodes`); :class:`_Virtualization` assembles those from :attr:`events`."""
        self.nodes: dict[TNode, NodeTrace] = {}
        self.events: dict[TNode, list[tuple[bool, Access]]] = {}
        self.extents: dict[Symbol, int] = {}
        self._node_traces = node_traces

    def _record(self, node: TNode, is_write: bool, access: Access) -> None:
        if self._node_traces:
            t = self.nodes.setdefault(node, NodeTrace(node))
            (t.writes if is_write else t.reads).append(access)
        events = self.events.get(node)
        if events is None:
            events = self.events[node] = []
        events.append((is_write, access))

    def stmt(self, s: Stmt, position: int, loops: tuple[Symbol, ...]) -> None:
        match s:
            case For(symbol=symbol, extent=extent, body=body):
                self.extents[symbol] = extent
                self.stmt(body, position, loops + (symbol,))
            case Seq(stmts=stmts):
                for x in stmts:
                    self.stmt(x, position, loops)
            case Store(tnode=node, indices=indices, value=value):
                self.expr(value, position, loops)
                self._record(node, True, Access(position, indices, loops))
            case StoreDynamic(tnode=node, position=p, indices=indices, value=value):
                self.expr(p, position, loops)
                self.expr(value, position, loops)
                self._record(node, True, Access(position, indices, loops, dynamic=True))
            case Fill(tnode=node):
                self._record(node, True, Access(position, None, loops))
            case SetLocal(value=value):
                self.expr(value, position, loops)
            case Comment() | DeclareLocal():
                pass
            case _:
                raise TypeError(f"the optimizer does not know the statement {s!r}")

    def expr(self, e: Expr, position: int, loops: tuple[Symbol, ...]) -> None:
        kind = type(e)  # by class, not ``match``: every sub-expression of a routine comes here
        if kind is Load:
            self._record(e.tnode, False, Access(position, e.indices, loops, padded=e.oob_value is not None))
        elif kind is Binary:
            self.expr(e.a, position, loops)
            self.expr(e.b, position, loops)
        elif kind is LoadDynamic:
            self.expr(e.position, position, loops)
            self._record(e.tnode, False, Access(position, e.indices, loops, dynamic=True))
        elif kind is LocalScope:
            self.stmt(e.body, position, loops)
        else:
            for child in _child_exprs(e):
                self.expr(child, position, loops)


def _covers(node: TNode, access: Access, extents: dict[Symbol, int]) -> bool:
    """Whether a write reaches every cell of ``node`` (loops around it that do not index it
    must run at least once)."""
    if access.indices is None:
        return True
    if access.dynamic:
        return False
    used: list[Symbol] = []
    for idx, d in zip(access.indices, node.dims):
        if isinstance(idx, Fixed) and idx.index == 0 and d == 1:
            continue
        if not (isinstance(idx, Iter) and isinstance(idx.symbol, Symbol)):
            return False
        s = idx.symbol
        if s not in access.loops or s in used or extents.get(s) != d:
            return False
        used.append(s)
    return all(extents.get(s, 0) >= 1 for s in access.loops if s not in used)


def _read_before_write(node: TNode, events: list[tuple[bool, Access]], extents: dict[Symbol, int]) -> bool:
    defined: Access | None = None
    for is_write, access in events:
        if is_write:
            if defined is None and _covers(node, access, extents):
                defined = access
            continue
        if defined is None:
            return True
        same_statement = defined.indices is not None and access.position == defined.position
        if same_statement and (access.indices != defined.indices or access.dynamic or access.padded):
            return True
    return False


# =============================================================================================
# Rewriting helpers


def _child_exprs(e: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of ``e``, in evaluation order (not a local scope's body)."""
    match e:
        case Unary(x=x) | Cast(x=x):
            return (x,)
        case Binary(a=a, b=b):
            return (a, b)
        case Ternary(a=a, b=b, c=c):
            return (a, b, c)
        case LoadDynamic(position=p):
            return (p,)
        case Const() | Load() | EmbedIndex() | GetLocal() | LocalScope():
            return ()
    raise TypeError(f"the optimizer does not know the expression {e!r}")


def _seq(stmts: Iterable[Stmt]) -> Stmt:
    """A sequence of ``stmts`` with nested and empty sequences flattened away."""
    return seq(*stmts)


def _with_body(routine: RoutineIR, body: Stmt) -> RoutineIR:
    return routine if body is routine.body else replace(routine, body=body)


# =============================================================================================
# 2. Virtualization and inlining


@dataclass(frozen=True)
class _Plan:
    """How to inline ``node``: its producer statements, the store indices, and which axis each
    loop bound by the store indices stands for."""

    node: TNode
    producers: tuple[int, ...]
    pattern: tuple[AxisIndex, ...] | None
    bound: dict[Symbol, int]


def virtualize(routine: RoutineIR, keep: Collection[TNode]) -> RoutineIR:
    """Inline every node outside ``keep`` that can be.

    A node ``n`` is inlined when all of these hold (:func:`virtualization_obstacle` names the
    first that fails):

    * its type is a compute type other than uint4x32 (a local holds the value; float16 and
      bfloat16 nodes round on store, which a local would skip);
    * it is not read before written (:func:`trace`), and is read after its producer;
    * the top-level statements that write it (its producer: a loop nest, possibly preceded by a
      fill) write nothing else, store at one index tuple ``I``, and ``I`` is a bijection of loop
      indices onto the cells (each axis a distinct loop index spanning its dim, or 0 on a size-1
      axis); the producer reads ``n`` only at ``I``;
    * every other read ``n[J]`` comes after the producer, with plain indices (no data-dependent
      axis, no padding);
    * no statement between a producer statement and a read writes what that statement reads;
    * inlining computes no cell twice: unless the producer is cheap (no loop of its own; it
      stores constants and index values, or one load through negations, casts and arithmetic
      with constants, such as a gradient's copy ``0.0 + g[I]``), one statement reads the node, at
      one index tuple (CSE merges the repeated reads), reaching each cell once (every loop around
      the read indexes its own axis). So an intermediate read by the forward and the backward
      code stays materialized, as the original's visit count decides.

    Each read ``n[J]`` becomes a local scope running the producer with the bound loops replaced
    by ``J`` (their loops disappear), other loops renamed, ``n[I] := v`` turned into
    ``local := v`` and reads of ``n[I]`` into the local: the same operations in the same order,
    so the same bits. The producer statements are removed.

    One more condition bounds the result: the producer and a statement reading the node nest no
    deeper than :data:`INLINE_NESTING_LIMIT` together (:func:`~ocannl.lowlevel.ir.nesting`). A
    chain of thousands of pointwise ops thus keeps one node in every few dozen in a buffer,
    instead of growing one expression as deep as the chain.

    Nodes are decided once each, in the order of their first write; a decision sees the inlining
    done before it. Each top-level statement is traced once, and again only when a node is
    inlined into it, so the pass takes time linear in the routine (not one trace per node).
    """
    state = _Virtualization(top_level(routine.body))
    changed = False
    for node in state.nodes_by_first_write():
        plan = _plan(state, node, keep)
        if isinstance(plan, _Plan):
            state.inline(plan)
            changed = True
    return _with_body(routine, _seq(state.remaining())) if changed else routine


INLINE_NESTING_LIMIT = 64
"""The deepest nesting (:func:`~ocannl.lowlevel.ir.nesting`) that inlining may create in a
statement. Every walker of the loop IR recurses into sub-expressions (the passes here, the
printer, the emitters, the interpreter), and C compilers and Python's parser have nesting limits
of their own: a bound here bounds them all, however deep the tensor graph. 64 levels is about 20
chained binary ops in one expression, well within every one of them, and about three times what
the layers of an MLP reach."""


def virtualization_obstacle(routine: RoutineIR, node: TNode, keep: Collection[TNode] = ()) -> str | None:
    """Why ``node`` cannot be inlined in ``routine`` as it is, or ``None`` if it can."""
    found = _plan(_Virtualization(top_level(routine.body)), node, keep)
    return None if isinstance(found, _Plan) else found


class _Virtualization:
    """The top-level statements of a routine during :func:`virtualize`, each traced on its own.

    Positions are those of the original statements: a statement that inlining rewrites keeps
    its position (its accesses are traced again), a removed producer leaves ``None``. A node's
    trace is assembled from the statements that access it, so asking about one node costs time
    in its own accesses, not in the routine."""

    def __init__(self, statements: Iterable[Stmt]):
        self.statements: list[Stmt | None] = list(statements)
        self.extents: dict[Symbol, int] = {}
        self._events: list[dict[TNode, list[tuple[bool, Access]]]] = [{} for _ in self.statements]
        self._nesting: list[int | None] = [None] * len(self.statements)
        """Each statement's :func:`~ocannl.lowlevel.ir.nesting`, once asked (few nodes get that far)."""
        self._accessed_at: dict[TNode, set[int]] = {}
        """Node -> the positions of the statements that read or write it."""
        for position in range(len(self.statements)):
            self._trace(position)
        self._written_at: dict[TNode, list[int]] = {
            node: sorted(p for p in positions if any(w for w, _ in self._events[p][node]))
            for node, positions in self._accessed_at.items()
        }
        """Node -> the sorted positions of the statements that write it. Inlining never moves a
        write: a producer writes only the node it computes, which disappears with it."""

    def _trace(self, position: int) -> None:
        stmt = self.statements[position]
        if stmt is None:
            return
        tracer = _Tracer(node_traces=False)
        tracer.extents = self.extents
        tracer.stmt(stmt, position, ())
        self._events[position] = tracer.events
        self._nesting[position] = None
        for node in tracer.events:
            self._accessed_at.setdefault(node, set()).add(position)

    def _replace(self, position: int, stmt: Stmt | None) -> None:
        for node in self._events[position]:
            self._accessed_at[node].discard(position)
        self._events[position] = {}
        self.statements[position] = stmt
        self._trace(position)

    def nodes_by_first_write(self) -> list[TNode]:
        """The nodes the routine writes, in the order of their first write (first access for
        ties). Inlining never moves a write, so the order holds throughout the pass."""
        written = [n for n, ps in self._written_at.items() if ps]
        return sorted(written, key=lambda n: self._written_at[n][0])

    def node_trace(self, node: TNode) -> NodeTrace | None:
        positions = sorted(self._accessed_at.get(node, ()))
        if not positions:
            return None
        events = [event for p in positions for event in self._events[p][node]]
        nt = NodeTrace(node, read_before_write=_read_before_write(node, events, self.extents))
        for is_write, access in events:
            (nt.writes if is_write else nt.reads).append(access)
        return nt

    def written_between(self, nodes: Iterable[TNode], first: int, last: int, excluded: Collection[int]) -> bool:
        """Whether a statement at a position in ``[first, last]``, other than ``excluded``,
        writes one of ``nodes``."""
        for node in nodes:
            positions = self._written_at.get(node, [])
            for p in positions[bisect.bisect_left(positions, first):bisect.bisect_right(positions, last)]:
                if p not in excluded and self.statements[p] is not None:
                    return True
        return False

    def nesting(self, position: int) -> int:
        known = self._nesting[position]
        if known is None:
            known = self._nesting[position] = nesting(self.statements[position])
        return known

    def read_at(self, position: int) -> set[TNode]:
        """The nodes the statement at ``position`` reads (its
        :func:`~ocannl.lowlevel.analysis.nodes_read`, from its trace)."""
        return {n for n, events in self._events[position].items() if not all(w for w, _ in events)}

    def written_at(self, position: int) -> set[TNode]:
        """The nodes the statement at ``position`` writes (its
        :func:`~ocannl.lowlevel.analysis.nodes_written`, from its trace)."""
        return {n for n, events in self._events[position].items() if any(w for w, _ in events)}

    def inline(self, plan: _Plan) -> None:
        """Replace every read of the plan's node by its computation, and drop its producer."""
        producers = [self.statements[p] for p in plan.producers]
        readers = sorted(self._accessed_at[plan.node] - set(plan.producers))
        for position in readers:
            stmt = self.statements[position]
            assert stmt is not None
            self._replace(position, _InlineReads(plan, producers).stmt(stmt))
        for position in plan.producers:
            self._replace(position, None)
        del self._written_at[plan.node]

    def remaining(self) -> list[Stmt]:
        return [s for s in self.statements if s is not None]


def _plan(t: _Virtualization, node: TNode, keep: Collection[TNode]) -> _Plan | str:
    if node in keep:
        return "it must stay materialized (kept)"
    if not node.dtype.is_compute_type or node.dtype is dtypes.uint4x32:
        return f"its type {node.dtype.name} is rounded on store or is not a scalar"
    nt = t.node_trace(node)
    if nt is None or not nt.writes:
        return "the routine does not write it"
    if nt.read_before_write:
        return "the routine may read it before writing it (an input)"
    if any(w.dynamic for w in nt.writes):
        return "it is written through a data-dependent index"
    if any(getattr(s, "skip_oob", False) for p in nt.writer_positions for s in iter_stmts(t.statements[p])):
        return "a store to it may fall outside its cells"
    producers = nt.writer_positions
    for p in producers:
        if t.written_at(p) != {node}:
            return "a statement writing it writes other nodes too"
    patterns = nt.store_patterns
    if len(patterns) > 1:
        return "it is stored at several index patterns"
    pattern = patterns[0] if patterns else None
    bound: dict[Symbol, int] = {}
    for axis, (idx, d) in enumerate(zip(pattern or (), node.dims)):
        if isinstance(idx, Fixed) and idx.index == 0 and d == 1:
            continue
        if not (isinstance(idx, Iter) and isinstance(idx.symbol, Symbol)) or idx.symbol in bound:
            return "its store indices are not a bijection of loop indices"
        bound[idx.symbol] = axis
    producer_loops = [s for p in producers for s in iter_stmts(t.statements[p]) if isinstance(s, For)]
    for loop_ in producer_loops:
        if loop_.symbol in bound and loop_.extent != node.dims[bound[loop_.symbol]]:
            return "its producer does not write every cell"
    last = producers[-1]
    uses = []
    for r in nt.reads:
        if r.position in producers:
            if r.indices != pattern or r.dynamic or r.padded:
                return "its producer reads it at other indices"
        elif r.position < last:
            return "it is read between the statements that write it"
        elif r.dynamic or r.padded:
            return "it is read through a data-dependent or padded index"
        else:
            uses.append(r)
    if not uses:
        return "it is not read after it is written (an output)"
    last_use = max(r.position for r in uses)
    for p in producers:
        if t.written_between(t.read_at(p) - {node}, p + 1, last_use, producers):
            return "what it is computed from is overwritten before it is read"
    if not _cheap(node, [t.statements[p] for p in producers]):
        if len({r.position for r in uses}) > 1:
            return "several statements read it (each would compute it again)"
        if len({r.indices for r in uses}) > 1:
            return "it is read at several indices (each would compute it again)"
        if not all(_injective(r.indices or (), r.loops) for r in uses):
            return "a read reaches a cell more than once (a broadcast would compute it again)"
    depth = max(t.nesting(p) for p in producers) + max(t.nesting(r.position) for r in uses)
    if depth > INLINE_NESTING_LIMIT:
        return (f"inlined, its computation would nest {depth} levels deep, more than "
                f"INLINE_NESTING_LIMIT = {INLINE_NESTING_LIMIT}")
    return _Plan(node, producers, pattern, bound)


def _cheap(node: TNode, producers: list[Stmt]) -> bool:
    """Whether recomputing ``node`` costs no more than reading it: its producer has no loop of
    its own (nor its local scopes) and stores constants and index values, or one load through
    operations whose other operands are constants (a copy, ``0.0 + g[i]``, ``-g[i]``,
    ``0.5 * g[i]``: one operation per read instead of a buffer). A gradient that only passes
    on another's values (docs/compiler.md, "Overwrites") is such a copy."""
    for stmt in producers:
        bare: set[AnySymbol] | None = None
        for s in iter_stmts(stmt):
            if isinstance(s, For):
                if bare is None:
                    bare = _bare_loop_symbols(stmt, node)
                if s.symbol not in bare:
                    return False
            if isinstance(s, Store):
                value = s.value
                if _one_load_chain(value):
                    continue
                if any(isinstance(e, (Load, LoadDynamic, LocalScope)) for e in iter_exprs(value)):
                    return False
    return True


_CHEAP_BINOPS = frozenset({Binop.ADD, Binop.SUB, Binop.MUL, Binop.DIV, Binop.MAX, Binop.MIN})


def _one_load_chain(e: Expr) -> bool:
    """Whether ``e`` is a constant, an index value, or one load under casts, negations and
    arithmetic operations with a constant operand."""
    return isinstance(under_constant_arithmetic(e, _CHEAP_BINOPS, casts=True), (Load, Const, EmbedIndex))


def _bare_loop_symbols(stmt: Stmt, node: TNode) -> set[AnySymbol]:
    """The loop symbols that index the stores of ``node`` in ``stmt``."""
    return {
        i.symbol
        for s in iter_stmts(stmt)
        if isinstance(s, Store) and s.tnode is node
        for i in s.indices
        if isinstance(i, Iter)
    }


def _injective(indices: tuple[AxisIndex, ...], loops: tuple[Symbol, ...]) -> bool:
    """Whether a read at ``indices`` inside ``loops`` reaches each cell at most once: every loop
    indexes its own axis directly, and no axis mixes loop indices."""
    used: set[AnySymbol] = set()
    for idx in indices:
        if isinstance(idx, Iter) and isinstance(idx.symbol, Symbol):
            if idx.symbol in used:
                return False
            used.add(idx.symbol)
        elif isinstance(idx, Affine) and any(isinstance(s, Symbol) for _, s in idx.terms):
            return False
    return set(loops) <= used


class _InlineReads(Rewriter):
    """Replaces every read of the plan's node by a local scope computing that cell."""

    def __init__(self, plan: _Plan, producers: list[Stmt]):
        self.plan, self.producers = plan, producers

    def expr(self, e: Expr) -> Expr:
        if isinstance(e, Load) and e.tnode is self.plan.node:
            return self.instantiate(e.indices)
        return self.rebuild_expr(e)

    def instantiate(self, call: tuple[AxisIndex, ...]) -> LocalScope:
        local = Local(self.plan.node.dtype)
        env: dict[AnySymbol, AxisIndex] = {s: call[axis] for s, axis in self.plan.bound.items()}
        copy = _CopyProducer(self.plan, local, env)
        return LocalScope(local, _seq(copy.stmt(p) for p in self.producers))


class _CopyProducer(FreshCopy):
    """A producer rewritten for one read: bound loops dropped (their index substituted), other
    loops and inner locals renamed, stores of the node assigning the local."""

    def __init__(self, plan: _Plan, local: Local, env: dict[AnySymbol, AxisIndex]):
        super().__init__(env)
        self.plan, self.local = plan, local

    def stmt(self, s: Stmt) -> Stmt:
        node = self.plan.node
        match s:
            case For(symbol=symbol, body=body) if symbol in self.plan.bound:
                return self.stmt(body)
            case Store(tnode=t, value=value) if t is node:
                return SetLocal(self.local, self.expr(value))
            case Fill(tnode=t, value=value) if t is node:
                return SetLocal(self.local, value)
            case Comment():
                return Seq(())
        return super().stmt(s)

    def expr(self, e: Expr) -> Expr:
        if isinstance(e, Load) and e.tnode is self.plan.node:
            assert e.indices == self.plan.pattern
            return GetLocal(self.local)
        return super().expr(e)


# =============================================================================================
# 3. Simplification


def simplify(routine: RoutineIR) -> RoutineIR:
    """Simplify every statement of ``routine``, by rewrites
    that keep the interpreter's bits):

    * a local scope whose body is ``v := e`` is ``e``; ``v := e1; v := e2`` is ``e2`` with ``e1``
      for ``v`` when ``e1`` is a constant or ``v`` occurs once in ``e2``, outside conditional
      branches;
    * constants fold for operations IEEE rounds exactly once (add, sub, mul, div, sqrt, recip,
      comparisons, min/max, relu, conversions...), computed with numpy scalars of the
      expression's type as the interpreter does; never libm functions (exp, sin, pow...) whose
      last bit may differ between backends, nor when a NaN is involved or an integer divides by
      zero (that raises at run time);
    * ``x * 1``, ``1 * x``, ``x / 1``, ``x - 0.0``, ``x + -0.0``, ``-0.0 + x`` and integer
      ``x + 0``, ``x - 0`` become ``x``; ``neg(neg(x))`` is ``x``; a cast to the operand's own
      type disappears; ``where`` with a constant condition picks its branch. ``x + 0.0`` stays
      (``-0.0 + 0.0`` is ``+0.0``), as does ``x * 0`` (NaN and infinities);
    * affine indices normalize (:func:`normalize_index`); a loop with an empty body goes.
    """
    return _with_body(routine, _Simplifier().stmt(routine.body))


class _Simplifier(Rewriter):
    def index(self, i: AxisIndex) -> AxisIndex:
        return normalize_index(i)

    def stmt(self, s: Stmt) -> Stmt:
        s = self.rebuild_stmt(s)
        if isinstance(s, For) and s.body == Seq(()):
            return Seq(())
        return s

    def expr(self, e: Expr) -> Expr:
        kind = type(e)
        if kind is Load or kind is Const or kind is GetLocal:  # no rule rewrites these
            return self.rebuild_expr(e)
        return self.rule(self.rebuild_expr(e))

    def rule(self, e: Expr) -> Expr:
        match e:
            case LocalScope():
                return self.collapse_scope(e)
            case EmbedIndex(index=Fixed(index=k), dtype=t) if int(dtypes.wrap_int(t, k)) == k:
                return Const(k, t)
            case Cast(x=x, dtype=t) if x.dtype is t:
                return x
            case Unary(op=Unop.ID, x=x, to=None):
                return x
            case Unary(op=Unop.NEG, x=Unary(op=Unop.NEG, x=x)):
                return x
            case Ternary(op=Ternop.WHERE, a=Const(value=cond), b=then, c=other) if not isinstance(cond, tuple):
                return then if cond != 0 else other
        folded = _fold(e)
        if folded is not None:
            return folded
        return _identity(e) or e

    def collapse_scope(self, e: LocalScope) -> Expr:
        body = [s for s in top_level(e.body) if not isinstance(s, Comment)]
        local = e.local
        if len(body) == 1 and isinstance(body[0], SetLocal) and body[0].local is local:
            value = body[0].value
            if _local_uses(value, local) == 0:
                return value
        if len(body) == 2 and all(isinstance(s, SetLocal) and s.local is local for s in body):
            first, second = body[0].value, body[1].value
            if _local_uses(first, local) == 0:
                uses = _local_uses(second, local)
                if uses == 0 or isinstance(first, Const) or (uses == 1 and _unconditional_local(second, local)):
                    return self.expr(_ReplaceLocal(local, first).expr(second))
        return e


def _local_uses(e: Expr, local: Local) -> int:
    """How many times ``e`` reads ``local`` (local scope bodies included)."""
    return sum(1 for y in all_exprs(e) if isinstance(y, GetLocal) and y.local is local)


def _unconditional_local(e: Expr, local: Local) -> bool:
    """Whether ``local`` is read in ``e`` outside conditional branches and local scopes."""
    return any(isinstance(x, GetLocal) and x.local is local for x in unconditional_exprs(e))


class _ReplaceLocal(Rewriter):
    def __init__(self, local: Local, value: Expr):
        self.local, self.value = local, value

    def expr(self, e: Expr) -> Expr:
        if isinstance(e, GetLocal) and e.local is self.local:
            return self.value
        return self.rebuild_expr(e)


def _const_scalar(c: Const) -> Any:
    return c.dtype.scalar(c.value) if c.dtype.is_float else dtypes.wrap_int(c.dtype, int(c.value))


def _make_const(value: Any, dtype: DType) -> Const | None:
    if dtype.is_float:
        v = float(value)
        return None if math.isnan(v) else Const(v, dtype)
    return Const(int(value), dtype)


def _is_nan_const(c: Const) -> bool:
    return isinstance(c.value, float) and math.isnan(c.value)


def _fold(e: Expr) -> Const | None:
    """``e`` computed now, when its operands are constants and the operation rounds exactly
    once in IEEE arithmetic: the interpreter's own scalar form of the operator
    (``op_semantics``), so the folded bits are the ones the program would compute."""
    match e:
        case Unary(op=op, x=Const() as x, to=None) if x.dtype is not dtypes.uint4x32 and not _is_nan_const(x):
            value = fold_unary(op, _const_scalar(x), x.dtype)
            return None if value is None else _make_const(value, x.dtype)
        case Binary(op=op, a=Const() as a, b=Const() as b) if a.dtype is not dtypes.uint4x32:
            if _is_nan_const(a) or _is_nan_const(b):
                return None
            value = fold_binary(op, _const_scalar(a), _const_scalar(b), a.dtype)
            return None if value is None else _make_const(value, a.dtype)
        case Cast(x=Const() as x, dtype=t) if x.dtype is not dtypes.uint4x32 and not _is_nan_const(x):
            v = _const_scalar(x)
            with np.errstate(all="ignore"):
                if t.is_float:
                    return _make_const(t.scalar(v), t)
                if x.dtype.is_float and not math.isfinite(float(v)):
                    return None  # raises at run time
                return Const(int(dtypes.wrap_int(t, int(v))), t)
    return None


def _is_const(e: Expr, value: float, *, negative_zero: bool | None = None) -> bool:
    """Whether ``e`` is the constant ``value``; for a float zero, ``negative_zero`` says which
    sign it must have."""
    if not isinstance(e, Const) or isinstance(e.value, tuple) or e.value != value:
        return False
    if negative_zero is not None and e.dtype.is_float:
        return (math.copysign(1.0, float(e.value)) < 0) == negative_zero
    return True


def _identity(e: Expr) -> Expr | None:
    """``e`` without an operation that IEEE arithmetic makes exact (bit for bit, NaNs and signed
    zeros included)."""
    if not isinstance(e, Binary) or e.dtype is dtypes.uint4x32:
        return None
    a, b, is_float = e.a, e.b, e.dtype.is_float
    match e.op:
        case Binop.MUL:
            if _is_const(b, 1):
                return a
            if _is_const(a, 1):
                return b
        case Binop.DIV:
            if _is_const(b, 1):
                return a
        case Binop.SUB:
            if _is_const(b, 0, negative_zero=False):  # x - (+0) == x, also for x = -0
                return a
        case Binop.ADD:
            zero_sign = True if is_float else None  # only x + (-0) == x for every float x
            if _is_const(b, 0, negative_zero=zero_sign):
                return a
            if _is_const(a, 0, negative_zero=zero_sign):
                return b
    return None


# =============================================================================================
# 4. Common subexpressions


def eliminate_common_subexpressions(routine: RoutineIR) -> RoutineIR:
    """Compute once what a sequence of statements computes several times.

    In each sequence of sibling statements (the routine body, a loop body, a local scope's body),
    an expression evaluated unconditionally (not only inside a ``where`` branch) by the same
    statement twice, or by several statements with no store in between to a node or local it
    reads, is computed once before its first user: ``declare t; t := e;`` (a repeated local
    scope is hoisted as its own local and body), and its occurrences become ``t``. Expressions
    compare up to the renaming of their local scopes and inner loops. Loads, constants and index
    values stay as they are, and uint4x32 values are not cached in locals. The largest repeated
    expression goes first.
    """
    return _with_body(routine, _CSE().stmt(routine.body))


class _CSE(Rewriter):
    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, For):
            return rebuilt(s, body=_seq(self.sequence(top_level(s.body))))
        return _seq(self.sequence(top_level(s)))

    def sequence(self, stmts: Iterable[Stmt]) -> list[Stmt]:
        """The statements with their nested sequences done first (loop bodies, local scope
        bodies), then the repeated expressions of this one hoisted, largest first."""
        done: list[Stmt] = []
        for s in stmts:
            if isinstance(s, For):
                s = self.stmt(s)
            elif scope_bodies(s):  # the sequences in its local scopes
                s = self.rebuild_stmt(s)
            done.extend(top_level(s))
        keys, sizes = _KeyCache(), {}
        while True:
            hoisted = self.hoist_one(done, keys, sizes)
            if hoisted is None:
                return done
            done = hoisted

    def hoist_one(
        self, stmts: list[Stmt], keys: _KeyCache, sizes: dict[int, tuple[Expr, int]]
    ) -> list[Stmt] | None:
        """The statements with the largest hoistable repeated expression computed once, or
        ``None``. ``keys`` and ``sizes`` carry what earlier rounds learned about unchanged
        sub-expressions."""
        occurrences: dict[Any, list[tuple[int, Expr]]] = {}
        for position, s in enumerate(stmts):
            if not isinstance(s, (Store, StoreDynamic, SetLocal)):
                continue
            for root in stmt_exprs(s):
                for sub in unconditional_exprs(root):
                    if _worth_caching(sub):
                        occurrences.setdefault(keys.key(sub), []).append((position, sub))
        candidates = sorted(
            ((k, occ) for k, occ in occurrences.items() if len(occ) >= 2),
            key=lambda item: -_size(item[1][0][1], sizes),
        )
        for key, occ in candidates:
            users = sorted({p for p, _ in occ})
            sub = occ[0][1]
            if not self.hoistable(stmts, users, sub):
                continue
            if isinstance(sub, LocalScope):
                local, definition = sub.local, [DeclareLocal(sub.local), *top_level(sub.body)]
            else:
                local = Local(sub.dtype)
                definition = [DeclareLocal(local), SetLocal(local, sub)]
            replacer = _ReplaceByKey(key, GetLocal(local), keys)
            out = list(stmts[: users[0]]) + definition
            for position in range(users[0], len(stmts)):
                s = stmts[position]
                out.append(replacer.rebuild_stmt(s) if position in users else s)
            return out
        return None

    @staticmethod
    def hoistable(stmts: list[Stmt], users: list[int], sub: Expr) -> bool:
        reads, free = nodes_read(sub), locals_read(sub) - locals_written(sub)
        for q in range(users[0], users[-1]):
            s = stmts[q]
            if nodes_written(s) & reads or locals_written(s) & free:
                return False
        return True


def _worth_caching(e: Expr) -> bool:
    return isinstance(e, (Unary, Binary, Ternary, Cast, LoadDynamic, LocalScope)) and e.dtype is not dtypes.uint4x32


def _size(e: Expr, known: dict[int, tuple[Expr, int]] | None = None) -> int:
    """The number of expressions and statements in ``e`` (local scope bodies included), plus
    one. ``known`` remembers the sizes of sub-expressions (``id -> (expr, size)``), so sizing
    every sub-expression of a statement costs time linear in it."""
    known = {} if known is None else known

    def size(x: Expr) -> int:
        hit = known.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
        n = 1 + sum(size(c) for c in _child_exprs(x))
        if isinstance(x, LocalScope):
            n += sum(1 + sum(1 for y in stmt_exprs(s) for _ in iter_exprs(y)) for s in iter_stmts(x.body))
        known[id(x)] = (x, n)
        return n

    return size(e) + 1


class _KeyCache:
    """Alpha-equivalence keys: two expressions have equal keys when they are equal up to a
    bijective renaming of the locals and loop symbols they bind.

    A key is a small integer: each distinct structure is numbered once, so hashing and comparing
    keys costs the same for any size of expression. The key of an IR node computed with nothing
    bound around it depends on the node alone; it is remembered, so keying every sub-expression
    of a statement (as CSE does) costs time linear in the statement, not in its size times its
    depth."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[Any, int]] = {}
        """``id(node) -> (node, key)`` for the nodes keyed with nothing bound around them."""
        self._numbers: dict[Any, int] = {}

    def key(self, e: Expr) -> int:
        return _Keyer(self).key(e)

    def number(self, structure: Any) -> int:
        return self._numbers.setdefault(structure, len(self._numbers))


class _Keyer:
    def __init__(self, cache: _KeyCache) -> None:
        self.cache = cache
        self.bound: dict[Any, int] = {}

    def key(self, x: Any) -> Any:
        kind, getter = _key_kind(type(x))
        if self.bound or getter is None:
            return self.structure(x, kind, getter)
        hit = self.cache.known.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
        k = self.structure(x, kind, getter)
        self.cache.known[id(x)] = (x, k)
        return k

    def structure(self, x: Any, kind: int, getter: Callable[[Any], tuple] | None) -> Any:
        number = self.cache.number
        if type(x) is Load:  # the commonest node, and its indices those of the most values
            oob = None if x.oob_value is None else self.key(x.oob_value)
            return number(("Load", x.tnode, tuple(map(self.index, x.indices)), oob))
        if kind == _NODE:
            return number((type(x).__name__, *map(self.key, getter(x))))
        if kind == _AS_IS:
            return x
        if kind == _TUPLE:
            return number(tuple(map(self.key, x)))
        if kind == _BOUND_OR_FREE:
            return ("bound", self.bound[x]) if x in self.bound else ("free", x)
        if kind == _FLOAT:
            return ("float", x.hex() if not math.isnan(x) else "nan")
        match x:  # the binders: what they bind is numbered in order of binding
            case LocalScope(local=local, body=body):
                self.bound.setdefault(local, len(self.bound))
                return number(("LocalScope", self.key(local), self.key(body)))
            case For(symbol=symbol, extent=extent, body=body, kind=loop_kind):
                self.bound.setdefault(symbol, len(self.bound))
                return number(("For", self.key(symbol), extent, loop_kind, self.key(body)))
            case DeclareLocal(local=local):
                self.bound.setdefault(local, len(self.bound))
                return number(("DeclareLocal", self.key(local)))
        raise AssertionError(f"not a binder: {x!r}")

    def index(self, i: AxisIndex) -> Any:
        """The key of an index: a loop index's as :meth:`structure` gives it, others by their fields."""
        if type(i) is Iter:
            symbol = i.symbol
            return ("Iter", ("bound", self.bound[symbol]) if symbol in self.bound else ("free", symbol))
        return self.key(i)


_BINDER, _BOUND_OR_FREE, _FLOAT, _TUPLE, _AS_IS, _NODE = range(6)
"""How :class:`_Keyer` keys a value of a class (:func:`_key_kind`): a node binding a local or a
loop symbol, a local or loop symbol, a float (by its bits), a tuple (by its items), a value
standing for itself (a node, a type, an index symbol, an operator, a number), another IR node
(by its class and its fields' keys)."""


@functools.cache
def _key_kind(cls: type) -> tuple[int, Callable[[Any], tuple] | None]:
    """How :class:`_Keyer` keys the instances of ``cls``, and for dataclasses the getter of
    their fields (also what :meth:`_Keyer.key` remembers by identity). Decided once per class:
    CSE keys every sub-expression of a routine, and a ``match`` tries each case in turn."""
    getter = field_values(cls) if is_dataclass(cls) else None
    if issubclass(cls, (LocalScope, For, DeclareLocal)):
        return _BINDER, getter
    if issubclass(cls, (Local, Symbol)):
        return _BOUND_OR_FREE, getter
    if issubclass(cls, float):
        return _FLOAT, getter
    if issubclass(cls, tuple):
        return _TUPLE, getter
    if issubclass(cls, (DType, TNode, IndexSymbol)) or getter is None:
        return _AS_IS, getter
    return _NODE, getter


class _ReplaceByKey(Rewriter):
    """Replaces the sub-expressions with a given key (not inside local scopes' bodies)."""

    def __init__(self, key: Any, value: Expr, keys: _KeyCache):
        self.target, self.value, self.keys = key, value, keys

    def expr(self, e: Expr) -> Expr:
        if _worth_caching(e) and self.keys.key(e) == self.target:
            return self.value
        if isinstance(e, LocalScope):
            return e
        return self.rebuild_expr(e)


# =============================================================================================
# 5. FMA formation (fast setting only)


def form_fma(routine: RoutineIR) -> RoutineIR:
    """``a * b + c`` and ``c + a * b`` on floats become ``fma(a, b, c)``: one rounding instead of
    two, so results change. :func:`optimize` runs it only under the fast setting."""
    return _with_body(routine, _FMA().stmt(routine.body))


class _FMA(Rewriter):
    def expr(self, e: Expr) -> Expr:
        e = self.rebuild_expr(e)
        if isinstance(e, Binary) and e.op is Binop.ADD and e.dtype.is_float:
            if isinstance(e.a, Binary) and e.a.op is Binop.MUL:
                return Ternary(Ternop.FMA, e.a.a, e.a.b, e.b)
            if isinstance(e.b, Binary) and e.b.op is Binop.MUL:
                return Ternary(Ternop.FMA, e.b.a, e.b.b, e.a)
        return e
