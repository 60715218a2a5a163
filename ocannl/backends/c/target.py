"""What C adds to the shared C-family walk (``ocannl/backends/codegen.py``): a routine's body as
calls of helper functions, and contractions printed as their plan says, register tiles
(``tile_printer.py``) or packed GEMMs (``gemm.py``, ``gemm_printer.py``).

Each top-level loop nest that uses no local of the code around it becomes a helper function,
and a routine of more than :data:`~ocannl.backends.codegen.PART_STATEMENTS` top-level statements
runs them in parts, a helper function each (the decision is the CPU plan's,
:func:`~ocannl.lowlevel.cpu_schedule.plan_top_level`). The C compiler then optimizes many short
functions instead of one as long as the routine: the time its optimizer takes grows faster than
linearly in the length of a function (alias queries between memory accesses, register allocation
across a long sequence of calls), and a training routine holds a few nests per layer. A
contraction is a helper function of its own too.
"""

from __future__ import annotations

from typing import Callable

from ocannl.backends.c.gemm import CGemm
from ocannl.backends.c.tile_printer import TilePrinter
from ocannl.backends.codegen import PART_STATEMENTS, Emitter
from ocannl.lowlevel.cost import timed_statements
from ocannl.lowlevel.cpu_schedule import GemmPlan, MicroKernel, NestPlan, TopLevelPlan, plan_top_level
from ocannl.lowlevel.indexing import AnySymbol, IndexSymbol, Symbol, index_symbols
from ocannl.lowlevel.ir import (
    DeclareLocal, EmbedIndex, Fill, Load, LoadDynamic, Seq, Stmt, Store, StoreDynamic, iter_exprs, iter_stmts, seq,
    stmt_exprs,
)
from ocannl.lowlevel.tnode import TNode

NEST_FN = "OCANNL_NEST_FN"
NEST_FN_DEFINITION = (
    "/* A function kept out of line per loop nest, and per part of a long routine: the optimizer */\n"
    "/* works on one short function at a time, so the build time grows linearly with the routine. */\n"
    "#if defined(__GNUC__)\n#define OCANNL_NEST_FN __attribute__((noinline))\n"
    "#else\n#define OCANNL_NEST_FN\n#endif"
)
TILE_FN = "OCANNL_TILE_FN"
TILE_FN_DEFINITION = (
    "/* Tiles are vectorized across their cells; gcc would rather vectorize each cell's reduction\n"
    "   loop, which an in-order sum serializes. */\n"
    "#if defined(__GNUC__) && !defined(__clang__)\n"
    "#define OCANNL_TILE_FN __attribute__((optimize(\"no-tree-loop-vectorize\")))\n"
    "#else\n#define OCANNL_TILE_FN\n#endif"
)

CALLS_FN = "OCANNL_CALLS_FN"
CALLS_FN_DEFINITION = (
    "/* A routine run in parts only calls them: alias analysis has nothing to find in it, and */\n"
    "/* GCC's points-to analysis of a function of a thousand restrict pointers is slow. */\n"
    "#if defined(__GNUC__) && !defined(__clang__)\n"
    "#define OCANNL_CALLS_FN __attribute__((optimize(\"no-tree-pta\")))\n"
    "#else\n#define OCANNL_CALLS_FN\n#endif"
)


def _function(macro: str, name: str, params: list[str], body: list[str]) -> list[str]:
    """The lines of the helper function ``name``, marked with ``macro`` (:data:`NEST_FN`,
    :data:`TILE_FN`)."""
    lines = [f"static {macro} void {name}("]
    lines += [f"    {p}," for p in params[:-1]] + [f"    {params[-1]}) {{"]
    return lines + body + ["}"]


class CTarget:
    """The C target of one source: the walk's :class:`~ocannl.backends.codegen.ContractionTarget`,
    and the helper functions it prints. ``vector_bytes``: the width of the target's vector
    registers (0: none) when GEMM-class contractions run as packed GEMMs (``None``: as register
    tiles).

    After :meth:`body`, :attr:`functions` holds the helper functions the body calls (and the
    GEMM micro-kernels they call), :attr:`types` the type declarations they use (vector types),
    printed before them."""

    def __init__(self, vector_bytes: int | None):
        self.vector_bytes = vector_bytes
        self.gemm = CGemm(vector_bytes) if vector_bytes is not None else None
        self.functions: list[list[str]] = []
        self.types: list[list[str]] = []
        self._gemm_kernels: set[MicroKernel] = set()
        self._vector_lanes: set[int] = set()
        self.in_parts = False
        """After :meth:`body`: the body only calls its parts' helper functions."""

    def body(self, emitter: Emitter, around: Callable[[int], tuple[str, str]] | None = None) -> list[str]:
        """The lines of the routine's body (indented one level): calls of helper functions
        (module docstring).

        ``around(k)`` gives a line to print before and one after the ``k``-th of the routine's
        :func:`~ocannl.lowlevel.cost.timed_statements` (a profile's timer); the body is then
        printed without parts."""
        routine = emitter.routine
        top = list(routine.body.stmts) if isinstance(routine.body, Seq) else [routine.body]
        if around is not None:
            timed = {id(s): k for k, s in enumerate(timed_statements(routine.body))}
            for s in top:
                k = timed.get(id(s))
                before, after = ("", "") if k is None else around(k)
                if before:
                    emitter.line(before)
                self.statements(emitter, [s])
                if after:
                    emitter.line(after)
        elif len(top) <= PART_STATEMENTS or any(isinstance(s, DeclareLocal) for s in top):
            self.statements(emitter, top)
        else:  # no local crosses a part: each top-level statement declares its own
            self.in_parts = True
            for k in range(0, len(top), PART_STATEMENTS):
                part = top[k : k + PART_STATEMENTS]
                self.helper(emitter, "part", seq(*part), lambda part=part: self.statements(emitter, part))
        return emitter.scope.out

    def statements(self, emitter: Emitter, stmts: list[Stmt]) -> None:
        """Prints top-level statements as their :class:`~ocannl.lowlevel.cpu_schedule.TopLevelPlan` says."""
        for s in stmts:
            self.top_level(emitter, plan_top_level(s, self.vector_bytes, emitter.parallel))

    def top_level(self, emitter: Emitter, plan: TopLevelPlan) -> None:
        """Prints one top-level statement as ``plan`` says."""
        if plan.kind == "split":
            for part in plan.parts:
                self.top_level(emitter, part)
        elif plan.kind == "function":
            self.helper(emitter, "nest", plan.stmt, lambda: emitter.nest(plan.nest))
        elif plan.nest is not None:
            emitter.nest(plan.nest)
        else:
            emitter.stmt(plan.stmt)

    def helper(self, emitter: Emitter, kind: str, stmt: Stmt, print_body: Callable[[], None],
               macro: str = NEST_FN) -> None:
        """Prints a call of a new helper function ``<function>_<kind><k>`` whose body
        ``print_body`` prints: the code of ``stmt``, which names the parameters."""
        with emitter.entering(emitter.scope.replace(out=[], depth=1, declared=set())) as scope:
            print_body()
        name = f"{emitter.function_name}_{kind}{len(self.functions)}"
        params, args = self.helper_params(emitter, stmt)
        self.functions.append(_function(macro, name, params, scope.out))
        emitter.line(f"{name}({', '.join(args)});")

    def contraction(self, emitter: Emitter, nest: NestPlan) -> None:
        """Prints a contraction as register tiles or a packed GEMM (``nest.contraction``) in a
        helper function the body calls."""
        plan = nest.contraction
        packed = plan.gemm is not None

        def print_body() -> None:
            with emitter.entering(emitter.scope.replace(statement=plan.store)):
                if packed:
                    self._declare_gemm_kernel(plan.gemm)
                    self.gemm.print_gemm(emitter, plan)
                else:
                    TilePrinter(emitter, self, nest).print()

        self.helper(emitter, "tile", plan.nest, print_body, NEST_FN if packed else TILE_FN)

    def _declare_gemm_kernel(self, g: GemmPlan) -> None:
        """Adds the GEMM declarations (once per source) and ``g``'s micro-kernel (once per
        shape) to :attr:`functions`."""
        if not self._gemm_kernels:
            self.functions.append(self.gemm.declarations())
        if g.kernel not in self._gemm_kernels:
            if g.lanes > 1:
                self.declare_vector_type(g.lanes)
            self._gemm_kernels.add(g.kernel)
            self.functions.append(self.gemm.kernel(g.kernel))

    def declare_vector_type(self, lanes: int) -> None:
        """Declares the vector types of ``lanes`` floats (:attr:`types`), once."""
        if lanes not in self._vector_lanes:
            self._vector_lanes.add(lanes)
            self.types.append(CGemm.vector_types(lanes))

    def helper_params(self, emitter: Emitter, nest: Stmt) -> tuple[list[str], list[str]]:
        """The parameters of the helper function printing ``nest`` (a contraction or a top-level
        loop nest): nodes, index symbols, enclosing loop indices; and the arguments passing them."""
        nodes: dict[TNode, None] = {}
        symbols: dict[AnySymbol, None] = {}
        for s in iter_stmts(nest):
            exprs = [sub for e in stmt_exprs(s) for sub in iter_exprs(e)]
            if isinstance(s, (Store, StoreDynamic)):
                nodes[s.tnode] = None
                symbols.update((x, None) for i in s.indices for x in index_symbols(i))
            elif isinstance(s, Fill):
                nodes[s.tnode] = None
            for e in exprs:
                if isinstance(e, (Load, LoadDynamic)):
                    nodes[e.tnode] = None
                    symbols.update((x, None) for i in e.indices for x in index_symbols(i))
                elif isinstance(e, EmbedIndex):
                    symbols.update((x, None) for x in index_symbols(e.index))
        params, args = [], []
        for node in sorted(nodes, key=lambda n: emitter.nodes[n]):
            params.append(pointer_param(emitter, node))
            args.append(emitter.nodes[node])
        free = [s for s in symbols if isinstance(s, Symbol) and s in emitter.scope.extents]
        index_type = emitter.syntax.index_type
        for s in sorted((s for s in symbols if isinstance(s, IndexSymbol)), key=lambda s: s.name):
            params.append(f"{index_type} {emitter.symbols[s]}")
            args.append(emitter.symbols[s])
        for s in free:
            params.append(f"{index_type} {emitter.namer.symbol(s)}")
            args.append(emitter.namer.symbol(s))
        params.append("int *_status")
        args.append("_status")
        return params, args


def pointer_param(emitter: Emitter, node: TNode) -> str:
    """The parameter of a function that takes ``node``'s buffer (``const`` when the routine only
    reads it)."""
    const = "" if node in emitter.written else "const "
    return f"{const}{emitter.syntax.storage_type(node.dtype)} *{emitter.syntax.restrict} {emitter.nodes[node]}"
