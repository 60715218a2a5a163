"""The MSL emitter: a routine's optimized loop IR as Metal compute kernels
(docs/codegen.md, "Metal").

**Kernels.** The routine body is cut into kernels by the partitioner the Triton backend uses
(``ocannl/backends/partition.py``): a kernel runs a run of top-level statements over one
grid, whose points are independent, each statement with its grid loops removed. Metal launches
one thread per grid point (``thread_position_in_grid``, flattened row-major; grid = the product
of the parallel extents), in threadgroups of :attr:`Options.threads_per_threadgroup`. Kernels run
in order, each after the previous one finished. Whole-buffer fills become loop nests first, so
they are kernels like any other. A kernel holding a scatter-add (the gradient of ``oc.take``)
runs in one thread, in the interpreter's order: float atomics would make it nondeterministic.
A kernel of more than :data:`~ocannl.backends.codegen.PART_STATEMENTS` statements is launched
as several over the same grid, one after the other, each running that many of them in order:
the routine's own order, and a compiler's time grows faster than the length of a function (as
for the C backend's parts), unless a local declared at the kernel's top level spans them.

**Indices.** Loop indices, grid points and offsets are MSL ``int`` (32 bits, what a GPU counts
with fastest) unless the routine has a buffer of :data:`INT_INDEX_LIMIT` (``2**31``) cells or
more, a loop that long, or a kernel whose flat index counts that far: then every kernel of the
routine counts in ``long`` (:func:`index_dtype`), as the C backend always does; an ``int`` offset
would wrap around and read or write outside the buffer. A thread's position in the grid is a
32-bit ``uint``, so a kernel launches at most :attr:`Options.max_grid_threads` threads: on a
larger grid each thread loops over the points that many apart (:class:`Dispatch`).

**Threadgroup reductions.** A top-level statement that reduces many terms into few cells (at
least :attr:`Options.tree_min_reduction` terms per cell, at most :attr:`Options.tree_max_cells`
cells) gets a kernel of its own with one threadgroup per cell: each thread accumulates a strided
share of the terms (about :attr:`Options.tree_terms_per_thread`), the partial results go to ``threadgroup`` memory, and a tree of
``threadgroup_barrier``-separated halving steps combines them (:class:`TreeReduction`). The
terms are added in another order than the interpreter's, so float sums agree within rounding,
not bit for bit; max and min agree exactly. Through ``Context``, float sums of more than 64
terms reach this emitter already in the blocked summation order (docs/semantics.md, "Summation
order"), a shape no tree matches: each grid point runs the blocks in order and gets the
interpreter's bits; trees serve max, min, products and integer sums.

**Kernel signature.** Buffers first (``device T*``, ``device const T*`` when only read; sorted
by name), then static index symbols (``constant long&``: bindings are 64-bit), then
``device atomic_int* _status`` when the kernel has runtime checks (a dynamic index out of bounds,
an integer division by zero: the host raises the first recorded one after the run), then the
position attributes. Every pointer
has an address space (``device``; ``threadgroup`` arrays are declared in the kernel body).

**Argument buffers.** A kernel binds at most :data:`MAX_BUFFERS` arguments in Metal's buffer
table, and a fused kernel of a program of many small tensors (a network of scalar parameters,
as micrograd builds) reads more. Such a kernel takes one argument instead, ``constant
<kernel>_args& _args [[buffer(0)]]``: a struct declared before it holding every argument
above, pointers as ``device T* name [[id(k)]]`` members and index symbols by value, which the
host fills with the buffers' addresses (Metal 2 argument buffers; a Metal host writes the
struct with an argument encoder or the buffers' GPU addresses). The kernel's first lines copy
the members into locals of the usual names, so its body is printed as for any kernel. One
kernel can then run any number of statements, and the statements of a grid point stay together.

**Checked before printing**: no float64 anywhere (MSL has no ``double``: a
:class:`~ocannl.lowlevel.dtypes.DTypeError` naming the tensor), at most
:data:`MAX_ARGUMENT_BUFFER_ENTRIES` arguments in an argument buffer, at most 1024 threads per
threadgroup and 32 KiB of threadgroup memory.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from ocannl.backends.codegen import PART_STATEMENTS, Emitter, Site, comment_text
from ocannl.backends.metal.syntax import MetalSyntax, msl_type
from ocannl.backends.partition import grid_candidates, partition, without_loops
from ocannl.errors import OcannlError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import indices_symbols
from ocannl.lowlevel.dtypes import DType, DTypeError
from ocannl.lowlevel.indexing import Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local, LocalScope,
    LoopKind, RoutineIR, Seq, SetLocal, Stmt, Store, Ternary, Unary, iter_exprs, iter_stmts, loop, seq, stmt_exprs,
)
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.schedule import reduction_of
from ocannl.lowlevel.tnode import TNode, sanitize_identifier

MAX_BUFFERS = 31
"""Buffer arguments a Metal kernel may take (``[[buffer(0)]]`` to ``[[buffer(30)]]``); a kernel
that needs more takes an argument buffer (module docstring)."""
MAX_ARGUMENT_BUFFER_ENTRIES = 500_000
"""Buffers a kernel may reach through argument buffers on devices of tier 2 argument buffers
(``MTLArgumentBuffersTier.tier2``: Apple silicon and the Metal 3 GPUs)."""
MAX_THREADS_PER_THREADGROUP = 1024
MAX_THREADGROUP_BYTES = 32 * 1024


class KernelLimitError(OcannlError, ValueError):
    """A kernel would exceed a limit of Metal devices (buffer arguments, threads per
    threadgroup, threadgroup memory): the message names the kernel, the limit and the fix."""


@dataclass(frozen=True)
class Options:
    threads_per_threadgroup: int = 256
    """Threads per threadgroup of one-thread-per-point kernels (fewer when the grid is smaller);
    threadgroup reductions use the largest power of two not above it."""
    tree_min_reduction: int = 256
    """A reduction of at least this many terms per cell runs as a threadgroup tree..."""
    tree_max_cells: int = 256
    """...when it has at most this many cells: with more, one thread per cell keeps the GPU busy
    without barriers (and the shim, which runs one threadgroup at a time, fast)."""
    tree_terms_per_thread: int = 8
    """A tree's threadgroup has about one thread per this many terms (a power of two, at most
    the threadgroup size): each thread sums its share before the barriers."""
    max_grid_threads: int = 2**30
    """Threads a one-thread-per-point kernel launches at most. A thread's position in the grid
    is a 32-bit ``uint``: a grid of more points is walked by a loop in every thread, each taking
    the points ``launched`` apart (module docstring, "Indices")."""


@dataclass(frozen=True)
class Param:
    """One kernel argument: a node's buffer, a static index symbol, or the status buffer."""

    name: str
    kind: str  # "buffer", "symbol" or "status"
    msl_type: str
    node: TNode | None = None
    symbol: IndexSymbol | None = None
    writable: bool = False


@dataclass(frozen=True)
class Kernel:
    """One kernel and how to launch it: ``threadgroups`` x ``threads_per_threadgroup`` threads
    (a 1-D dispatch); ``positions`` are the attributes of its trailing position parameters, in
    order; a ``cooperative`` kernel uses threadgroup memory and barriers."""

    name: str
    params: tuple[Param, ...]
    positions: tuple[str, ...]
    threadgroups: int
    threads_per_threadgroup: int
    threadgroup_bytes: int
    cooperative: bool
    text: str
    argument_buffer: str | None = None
    """The name of the struct the kernel's ``params`` travel in, as its one ``[[buffer(0)]]``
    argument (module docstring, "Argument buffers"); ``None`` when each is an argument."""


@dataclass(frozen=True)
class MetalProgram:
    """A routine as a ``.metal`` source: its kernels in launch order, the routine's buffers (the
    order a host passes them in) and static index symbols, and its runtime checks."""

    name: str
    text: str
    kernels: tuple[Kernel, ...]
    nodes: tuple[TNode, ...]
    symbols: tuple[IndexSymbol, ...]
    sites: tuple[Site, ...]
    index_dtype: DType
    """The type of every kernel's indices and offsets (module docstring, "Indices")."""


# ---------------------------------------------------------------------------------------------
# Threadgroup tree reductions


@dataclass(frozen=True)
class TreeReduction:
    """A grid point's statement that accumulates ``term`` with ``op`` over the ``loops`` into
    one cell of ``store``'s node. Three forms (those of ``cpu_schedule.plan_contraction``):
    ``out[I] := start; loops { out[I] := out[I] op term }`` (``start`` set), the same without the
    reset (the cell's value starts the sum), and ``out[I] := f(v { v := init; loops { v := v op
    term } })`` (``scope`` set: a reduction the optimizer inlined into its consumer)."""

    store: Store
    op: Binop
    term: Expr
    loops: tuple[tuple[Symbol, int], ...]
    start: Const | None = None
    scope: LocalScope | None = None
    init: Const | None = None

    @property
    def volume(self) -> int:
        return math.prod(n for _, n in self.loops)

    @property
    def dtype(self) -> DType:
        return self.scope.local.dtype if self.scope is not None else self.store.tnode.dtype

    def identity(self) -> float | int:
        """The value a thread with no term left contributes."""
        if self.op is Binop.ADD:
            return 0.0 if self.dtype.is_float else 0
        if self.op is Binop.MUL:
            return 1.0 if self.dtype.is_float else 1
        return dtypes.lowest(self.dtype) if self.op is Binop.MAX else dtypes.highest(self.dtype)


_TREE_OPS = (Binop.ADD, Binop.MUL, Binop.MAX, Binop.MIN)


def tree_reduction(body: Stmt) -> TreeReduction | None:
    """The :class:`TreeReduction` ``body`` (a statement without its grid loops) computes, or
    ``None``. Reductions into float16/bfloat16 cells are left alone: the interpreter rounds the
    cell after every term, which a tree cannot reproduce."""
    r = reduction_of(body)
    if r is None or not r.separable:
        return None
    if r.scope is None:
        # The grid loops are gone: every loop left is a reduction loop.
        if not r.around or r.store.tnode.dtype.compute is not r.store.tnode.dtype:
            return None
        found = TreeReduction(r.store, r.op, r.term, tuple((f.symbol, f.extent) for f in r.around),
                              r.reset.value if r.reset is not None else None)
    elif not r.around:
        found = TreeReduction(r.store, r.op, r.term, r.loop_extents, scope=r.scope, init=r.init)
    else:
        return None
    if found.op not in _TREE_OPS or found.dtype not in (dtypes.float32, dtypes.int32, dtypes.int64, dtypes.uint32):
        return None
    for e in iter_exprs(found.term):
        if isinstance(e, (GetLocal, LocalScope)) or (isinstance(e, (Load, LoadDynamic)) and e.tnode is found.store.tnode):
            return None
    written = indices_symbols(found.store.indices)
    if any(s in written for s, _ in found.loops):
        return None
    return found


def in_register(stmt: Stmt) -> Stmt:
    """A reduction into a cell (:func:`tree_reduction`'s first two forms) rewritten to
    accumulate in a local and store once: ``out[I] := v { v := start; loops { v := v op term }
    }``. The terms are added in the same order, so the result is the same, but a GPU thread
    keeps the sum in a register instead of reading and writing device memory at every term."""
    tree = tree_reduction(stmt)
    if tree is None or tree.scope is not None:
        return stmt
    store = tree.store
    v = Local(tree.dtype)
    update: Stmt = SetLocal(v, Binary(tree.op, GetLocal(v), tree.term))
    for s, n in reversed(tree.loops):
        update = For(s, n, update, LoopKind.REDUCTION)
    start = tree.start if tree.start is not None else Load(store.tnode, store.indices)
    return Store(store.tnode, store.indices, LocalScope(v, seq(SetLocal(v, start), update)))


# ---------------------------------------------------------------------------------------------
# Planning: which statements run in which kernel, over which grid


@dataclass
class _Plan:
    """A kernel to print: ``parts`` are (statement without its grid loops, grid loop symbols)
    run in order at each grid point of ``extents``."""

    parts: list[tuple[Stmt, tuple[Symbol, ...]]]
    extents: tuple[int, ...]
    comments: list[str] = field(default_factory=list)
    tree: TreeReduction | None = None


@dataclass(frozen=True)
class Dispatch:
    """How a planned kernel is launched: ``threadgroups`` x ``threads_per_threadgroup`` threads
    (a 1-D dispatch); ``strided``: fewer threads than grid points, each thread looping over the
    points ``threadgroups * threads_per_threadgroup`` apart."""

    threadgroups: int
    threads_per_threadgroup: int
    index_limit: int
    """A bound (exclusive) of the flat indices the kernel counts with: the grid point, the
    threadgroup tree's term number, each one step past its last value."""
    strided: bool = False


def dispatch(plan: _Plan, options: Options) -> Dispatch:
    """The launch of ``plan``: for a threadgroup tree, one threadgroup per cell of a power of two
    threads (about one per :attr:`Options.tree_terms_per_thread` terms); else one thread per
    grid point in threadgroups of :attr:`Options.threads_per_threadgroup`, at most
    :attr:`Options.max_grid_threads` threads."""
    cells = math.prod(plan.extents)
    if plan.tree is not None:
        wanted = -(-plan.tree.volume // max(1, options.tree_terms_per_thread))
        threads = min(_power_of_two_below(options.threads_per_threadgroup), _power_of_two_above(wanted))
        return Dispatch(cells, threads, max(cells, plan.tree.volume + threads))
    threads = max(1, min(options.threads_per_threadgroup, cells, options.max_grid_threads))
    groups = -(-cells // threads)
    if groups * threads <= options.max_grid_threads:
        return Dispatch(groups, threads, groups * threads)
    groups = max(1, options.max_grid_threads // threads)
    return Dispatch(groups, threads, cells + groups * threads, strided=True)


INT_INDEX_LIMIT = 2**31
"""Indices and offsets below this fit MSL's ``int``; a routine with larger ones counts in ``long``."""


def index_dtype(routine: RoutineIR, dispatches: list[Dispatch]) -> DType:
    """The type of the routine's loop indices and offsets (module docstring, "Indices"): int32
    unless a buffer has :data:`INT_INDEX_LIMIT` cells or more, or a loop or a kernel's flat
    index counts that far; then int64 for every kernel of the routine."""
    limits = [n.size for n in set(routine.reads + routine.writes)]
    limits += [s.extent for s in iter_stmts(routine.body) if isinstance(s, For)]
    limits += [d.index_limit for d in dispatches]
    return dtypes.int64 if max(limits, default=0) >= INT_INDEX_LIMIT else dtypes.int32


def plan_kernels(body: Stmt, options: Options) -> list[_Plan]:
    """The kernels of a routine body (fills already loops), in launch order."""
    statements = [s for s in (body.stmts if isinstance(body, Seq) else (body,)) if s != Seq(())]
    live = _positions_inside_local_lifetimes(statements)
    plans: list[_Plan] = []
    run: list[Stmt] = []
    for position, stmt in enumerate(statements):
        tree = None if position in live or isinstance(stmt, Comment) else _tree_plan(stmt, options)
        if tree is None:
            run.append(stmt)
            continue
        comments = []
        while run and isinstance(run[-1], Comment):
            comments.insert(0, run.pop().text)
        plans += _partitioned(run)
        tree.comments = comments
        plans.append(tree)
        run = []
    plans += _partitioned(run)
    return plans


def _tree_plan(stmt: Stmt, options: Options) -> _Plan | None:
    loops = grid_candidates(stmt)
    grid = tuple(f.symbol for f in loops)
    tree = tree_reduction(without_loops(stmt, grid))
    cells = math.prod(f.extent for f in loops)
    if tree is None or tree.volume < max(2, options.tree_min_reduction) or cells > options.tree_max_cells:
        return None
    return _Plan([(without_loops(stmt, grid), grid)], tuple(f.extent for f in loops), tree=tree)


def _partitioned(run: list[Stmt]) -> list[_Plan]:
    if not any(not isinstance(s, Comment) for s in run):
        return []
    plans = []
    for k in partition(seq(*run)):
        if any(p.scatter for p in k.parts):  # one thread, in order (module docstring)
            parts, extents = [(p.stmt, ()) for p in k.parts], ()
        else:
            parts, extents = [(p.body, p.grid) for p in k.parts], k.extents
        # Launched as kernels of PART_STATEMENTS statements (module docstring, "Kernels").
        size = len(parts) if k.locals else PART_STATEMENTS
        for start in range(0, len(parts), size):
            plans.append(_Plan(parts[start:start + size], extents, list(k.comments) if start == 0 else []))
    return plans


def _positions_inside_local_lifetimes(statements: list[Stmt]) -> set[int]:
    """Positions of top-level statements that a local declared at the top level lives across
    (declared before, used after): they must stay in the kernel of the local."""
    first: dict[Local, int] = {}
    last: dict[Local, int] = {}
    for position, stmt in enumerate(statements):
        for s in iter_stmts(stmt):
            used = [s.local] if isinstance(s, (DeclareLocal, SetLocal)) else []
            used += [e.local for x in stmt_exprs(s) for e in iter_exprs(x) if isinstance(e, GetLocal)]
            if isinstance(s, DeclareLocal) and s is stmt:
                first.setdefault(s.local, position)
            for local in used:
                last[local] = position
    inside: set[int] = set()
    for local, start in first.items():
        inside.update(range(start, last[local] + 1))
    return inside


def fills_as_loops(stmt: Stmt) -> Stmt:
    """``stmt`` with every whole-buffer fill written as a loop nest storing into each cell."""
    match stmt:
        case Fill(tnode=node, value=value):
            if node.size == 0:
                return Seq(())
            symbols = [Symbol() if d > 1 else None for d in node.dims]
            body: Stmt = Store(node, tuple(Iter(s) if s else Fixed(0) for s in symbols), value)
            for s, d in reversed(list(zip(symbols, node.dims))):
                if s is not None:
                    body = loop(s, d, body)
            return body
        case Seq(stmts=stmts):
            return Seq(tuple(fills_as_loops(s) for s in stmts))
        case For(symbol=s, extent=n, body=body, kind=kind):
            return For(s, n, fills_as_loops(body), kind)
    return stmt


# ---------------------------------------------------------------------------------------------
# Checks


def check_dtypes(routine: RoutineIR) -> None:
    """:class:`DTypeError` naming the tensor when the routine stores or computes float64."""
    for node in sorted(set(routine.reads + routine.writes) | _filled(routine), key=lambda n: n.id):
        if node.dtype is dtypes.float64:
            raise DTypeError(
                f"tensor {node.debug_name} is float64, and Metal has no float64 (MSL has no double): "
                f"make it float32 (dtype='float32') to run routine {routine.name} on the metal backend, "
                f"or run it on the c backend"
            )
    for s in iter_stmts(routine.body):
        values = [e for x in stmt_exprs(s) for e in iter_exprs(x)]
        if isinstance(s, (DeclareLocal, SetLocal)) and s.local.dtype is dtypes.float64 or any(
            e.dtype is dtypes.float64 for e in values
        ):
            target = getattr(s, "tnode", None)
            where = f"while computing tensor {target.debug_name}" if target is not None else "in a local variable"
            raise DTypeError(
                f"routine {routine.name} computes a float64 value {where}, and Metal has no float64 "
                f"(MSL has no double): compute in float32 on the metal backend, or use the c backend"
            )


def _filled(routine: RoutineIR) -> set[TNode]:
    return {s.tnode for s in iter_stmts(routine.body) if isinstance(s, Fill)}


def check_limits(kernel: Kernel, routine: str) -> None:
    """:class:`KernelLimitError` when ``kernel`` exceeds what a Metal device allows."""
    where = f"kernel {kernel.name} of routine {routine}"
    limit = MAX_ARGUMENT_BUFFER_ENTRIES if kernel.argument_buffer else MAX_BUFFERS
    if len(kernel.params) > limit:
        names = [p.node.debug_name if p.node else p.name for p in kernel.params]
        listed = ", ".join(names[:40]) + (f" and {len(names) - 40} more" if len(names) > 40 else "")
        if kernel.argument_buffer:
            what, fix = f"its argument buffer {kernel.argument_buffer} holds", "split the computation into smaller routines"
        else:
            what, fix = "takes", "pass them in an argument buffer"
        raise KernelLimitError(f"{where} {what} {len(kernel.params)} buffer arguments ({listed}), and Metal "
                               f"allows at most {limit}: {fix}")
    if kernel.threads_per_threadgroup > MAX_THREADS_PER_THREADGROUP:
        raise KernelLimitError(
            f"{where} has {kernel.threads_per_threadgroup} threads per threadgroup, and Metal allows at most "
            f"{MAX_THREADS_PER_THREADGROUP}: lower threads_per_threadgroup (OCANNL_METAL_THREADS)"
        )
    if kernel.threadgroup_bytes > MAX_THREADGROUP_BYTES:
        raise KernelLimitError(
            f"{where} uses {kernel.threadgroup_bytes} bytes of threadgroup memory, and Metal allows at most "
            f"{MAX_THREADGROUP_BYTES}: lower threads_per_threadgroup (OCANNL_METAL_THREADS)"
        )


# ---------------------------------------------------------------------------------------------
# Printing


def kernel_prefix(routine_name: str) -> str:
    """The prefix of a routine's kernel names (``<prefix>_k0``, ``<prefix>_k1``...)."""
    name = sanitize_identifier(routine_name) or "routine"
    return f"r_{name}" if name.lower().startswith("ocannl") else name


def emit_metal(routine: RoutineIR, options: Options = Options()) -> MetalProgram:
    """The ``.metal`` source of ``routine`` and its launch plan (module docstring)."""
    check_dtypes(routine)
    lowered = RoutineIR(routine.name, fills_as_loops(routine.body))
    plans = plan_kernels(lowered.body, options)
    dispatches = [dispatch(plan, options) for plan in plans]
    prefix = kernel_prefix(routine.name)
    names = [f"{prefix}_k{k}" for k in range(len(plans))]
    syntax = MetalSyntax(index_dtype(lowered, dispatches))
    sites: list[Site] = []
    reserved = set(names) | {f"{name}_args" for name in names}  # the argument buffers' structs
    kernels = []
    emitter = None
    for plan, launch, name in zip(plans, dispatches, names):
        emitter = Emitter(syntax, lowered, function_name=name, reserved=reserved, parallel=False)
        emitter.sites = sites  # one numbering for the whole routine: the status buffer is shared
        kernel = _KernelPrinter(emitter, plan, launch, name).kernel()
        check_limits(kernel, routine.name)
        kernels.append(kernel)
    if emitter is None:
        emitter = Emitter(syntax, lowered, function_name=prefix, reserved=reserved, parallel=False)
    header = [
        f"/* {comment_text(routine.name)}: generated by ocannl from the loop IR; do not edit. */",
        "#include <metal_stdlib>",
        "using namespace metal;",
        "",
    ]
    builtins = syntax.builtins()
    text = "\n".join(header + ([*builtins, ""] if builtins else []) + [k.text + "\n" for k in kernels])
    return MetalProgram(routine.name, text.rstrip("\n") + "\n", tuple(kernels), tuple(emitter.nodes),
                        tuple(emitter.symbols), tuple(sites), syntax.index_dtype)


class _KernelPrinter:
    """Prints one planned kernel through the shared walk."""

    def __init__(self, emitter: Emitter, plan: _Plan, launch: Dispatch, name: str):
        self.e = emitter
        self.plan = plan
        self.launch = launch
        self.name = name
        self.cells = math.prod(plan.extents)
        self.index_type = emitter.syntax.index_type

    def kernel(self) -> Kernel:
        plan, e = self.plan, self.e
        groups, threads = self.launch.threadgroups, self.launch.threads_per_threadgroup
        if plan.tree is not None:
            body, scratch = self._tree_body(threads)
            positions = ("threadgroup_position_in_grid", "thread_position_in_threadgroup")
        else:
            body, scratch = self._pointwise_body(groups * threads), 0
            positions = ("thread_position_in_grid",) if plan.extents else ()
        statements = seq(*(s for s, _ in plan.parts))
        ir = RoutineIR(self.name, statements)
        params = [
            Param(e.nodes[n], "buffer", msl_type(n.dtype), node=n, writable=n in ir.writes)
            for n in sorted(set(ir.reads + ir.writes), key=lambda n: e.nodes[n])
        ]
        params += [Param(e.symbols[s], "symbol", "long", symbol=s) for s in sorted(ir.static_symbols, key=lambda s: s.name)]
        if any(re.search(r"\b_status\b", line) for line in body):
            params.append(Param("_status", "status", "atomic_int", writable=True))
        lines = [f"/* {comment_text(c)} */" for c in plan.comments]
        argument_buffer = None
        if len(params) <= MAX_BUFFERS:
            declarations = [f"{_declaration(p)} [[buffer({k})]]" for k, p in enumerate(params)]
        else:
            argument_buffer = f"{self.name}_args"
            lines.append(f"/* the {len(params)} arguments of {self.name}, more than the {MAX_BUFFERS} a kernel binds: "
                         f"one argument buffer */")
            lines.append(f"struct {argument_buffer} {{")
            lines += [f"  {_declaration(p, member=True)} [[id({k})]];" for k, p in enumerate(params)]
            lines.append("};")
            declarations = [f"constant {argument_buffer}& _args [[buffer(0)]]"]
            body = [f"  {_declaration(p, member=True)} = _args.{p.name};" for p in params] + body
        position_names = {"thread_position_in_grid": "gid", "threadgroup_position_in_grid": "gid",
                          "thread_position_in_threadgroup": "lid"}
        declarations += [f"uint3 {position_names[a]} [[{a}]]" for a in positions]
        grid = " x ".join(map(str, plan.extents)) or "1"
        launch = f"{groups} threadgroup{'s' if groups != 1 else ''} of {threads} thread{'s' if threads != 1 else ''}"
        if plan.tree is not None:
            what = "a threadgroup reduction per cell"
        elif self.launch.strided:
            what = f"each thread a point in every {groups * threads}"
        else:
            what = "one thread per point"
        lines.append(f"/* grid {grid}: {what}, {launch} */")
        lines.append(f"kernel void {self.name}(")
        lines += [f"    {d}," for d in declarations[:-1]] + [f"    {declarations[-1]}) {{" if declarations else "    ) {"]
        lines += body
        lines.append("}")
        return Kernel(self.name, tuple(params), positions, groups, threads, scratch, plan.tree is not None,
                      "\n".join(lines), argument_buffer)

    # -- the grid point ----------------------------------------------------------------------------

    def _grid_lines(self, grid: tuple[Symbol, ...], depth: int) -> list[str]:
        """Declarations of a part's grid loop indices from the flat grid point ``_g``."""
        pad = "  " * depth
        return [f"{pad}const {self.index_type} {self.e.namer.symbol(s)} = {expr};"
                for s, expr in zip(grid, _unflatten("_g", self.plan.extents))]

    def _pointwise_body(self, launched: int) -> list[str]:
        plan, e, it = self.plan, self.e, self.index_type
        lines = []
        strided = plan.extents and self.launch.strided
        if strided:
            lines.append(f"  for ({it} _g = {it}(gid.x); _g < {self.cells}; _g += {launched}) {{  /* this thread's grid points */")
        elif plan.extents:
            lines.append(f"  const {it} _g = {it}(gid.x);  /* this thread's grid point */")
            if launched > self.cells:
                lines.append(f"  if (_g >= {self.cells}) return;")
        outer = 2 if strided else 1
        braces = sum(1 for _, grid in plan.parts if grid) > 1
        for stmt, grid in plan.parts:
            bound = dict(zip(grid, plan.extents))
            depth = outer + 1 if braces and grid else outer
            if depth > outer:
                lines.append("  " * outer + "{")
            lines += self._grid_lines(grid, depth)
            lines += e.statement_lines(in_register(stmt), bound, depth)
            if depth > outer:
                lines.append("  " * outer + "}")
        if strided:
            lines.append("  }")
        return lines

    def _tree_body(self, threads: int) -> tuple[list[str], int]:
        """A threadgroup per cell: strided partial results, then a halving tree in threadgroup
        memory, each step after a barrier (module docstring)."""
        plan, e, it = self.plan, self.e, self.index_type
        tree = plan.tree
        (stmt, grid), = plan.parts
        dtype = tree.dtype
        t = msl_type(dtype)
        syn = e.syntax
        combine = lambda a, b: syn.binary(tree.op, dtype, a, b)  # noqa: E731
        bound = dict(zip(grid, plan.extents))
        lines = [f"  threadgroup {t} _red[{threads}];  /* one partial result per thread */"]
        if plan.extents:
            lines.append(f"  const {it} _g = {it}(gid.x);  /* this threadgroup's cell */")
        lines += self._grid_lines(grid, 1)
        lines.append(f"  {t} _acc = {syn.literal(tree.identity(), dtype)};")
        lines.append(f"  for ({it} _r = {it}(lid.x); _r < {tree.volume}; _r += {threads}) {{")
        terms = dict(tree.loops)
        extents = tuple(n for _, n in tree.loops)
        lines += [f"    const {it} {e.namer.symbol(s)} = {expr};" for (s, _), expr in zip(tree.loops, _unflatten("_r", extents))]
        prelude, term = e.expression_lines(tree.term, {**bound, **terms}, 2, tree.store)
        lines += prelude
        lines.append(f"    _acc = {combine('_acc', term)};")
        lines.append("  }")
        lines.append("  _red[lid.x] = _acc;")
        lines.append("  threadgroup_barrier(mem_flags::mem_threadgroup);")
        lines.append(f"  for (uint _s = {threads // 2}u; _s > 0u; _s >>= 1u) {{")
        lines.append("    if (lid.x < _s) {")
        lines.append(f"      _red[lid.x] = {combine('_red[lid.x]', '_red[lid.x + _s]')};")
        lines.append("    }")
        lines.append("    threadgroup_barrier(mem_flags::mem_threadgroup);")
        lines.append("  }")
        total = Local(dtype)
        lines.append("  if (lid.x == 0u) {")
        lines.append(f"    const {t} {e.namer.local(total)} = _red[0];")
        store = tree.store
        if tree.scope is not None:
            start = tree.init or Const(0.0 if dtype.is_float else 0, dtype)  # a local starts at 0
            value = _replace(store.value, tree.scope, Binary(tree.op, start, GetLocal(total)))
        elif tree.start is not None:
            value = Binary(tree.op, tree.start, GetLocal(total))
        else:
            value = Binary(tree.op, Load(store.tnode, store.indices), GetLocal(total))
        lines += e.statement_lines(Store(store.tnode, store.indices, value), bound, 2)
        lines.append("  }")
        return lines, threads * dtype.itemsize


def _declaration(p: Param, member: bool = False) -> str:
    """``p`` declared as a kernel parameter, or as a member of an argument buffer (and as the
    local the kernel copies it to): an index symbol is then held by value."""
    if p.kind == "symbol":
        return f"long {p.name}" if member else f"constant long& {p.name}"
    const = "" if p.writable else "const "
    return f"device {const}{p.msl_type}* {p.name}"


def _unflatten(flat: str, extents: tuple[int, ...]) -> list[str]:
    """The row-major coordinates of the flat index ``flat`` over ``extents``."""
    out = []
    for k, n in enumerate(extents):
        stride = math.prod(extents[k + 1:])
        if len(extents) == 1:
            out.append(flat)
        elif k == 0:
            out.append(f"{flat} / {stride}")
        elif stride == 1:
            out.append(f"{flat} % {n}")
        else:
            out.append(f"{flat} / {stride} % {n}")
    return out


def _power_of_two_below(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _power_of_two_above(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def _replace(e: Expr, old: Expr, new: Expr) -> Expr:
    """``e`` with the sub-expression ``old`` (by identity) replaced by ``new``."""
    if e is old:
        return new
    match e:
        case Unary(x=x):
            return dataclasses.replace(e, x=_replace(x, old, new))
        case Cast(x=x):
            return dataclasses.replace(e, x=_replace(x, old, new))
        case Binary(a=a, b=b):
            return dataclasses.replace(e, a=_replace(a, old, new), b=_replace(b, old, new))
        case Ternary(a=a, b=b, c=c):
            return dataclasses.replace(e, a=_replace(a, old, new), b=_replace(b, old, new), c=_replace(c, old, new))
        case LoadDynamic(position=p):
            return dataclasses.replace(e, position=_replace(p, old, new))
    return e
