"""What C adds to the shared C-family walk (``ocannl/backends/codegen.py``): a routine's body as
calls of helper functions, and contractions printed as their plan says, register tiles
(``tile_printer.py``) or packed GEMMs (``gemm.py``, ``gemm_printer.py``).

Each top-level loop nest that uses no local of the code around it becomes a helper function,
and a routine of more than :data:`~ocannl.backends.codegen.PART_STATEMENTS` top-level statements
runs them in parts, a helper function each (the decisions are the CPU plan's,
:func:`~ocannl.lowlevel.cpu_schedule.plan_top_level` and
:func:`~ocannl.lowlevel.cpu_schedule.plan_parts`, which cuts every repetition of a deep
network's block alike, so its parts are printed once). The C compiler then optimizes many short
functions instead of one as long as the routine: the time its optimizer takes grows faster than
linearly in the length of a function (alias queries between memory accesses, register allocation
across a long sequence of calls), and a training routine holds a few nests per layer. A
contraction is a helper function of its own too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from ocannl.backends.c.gemm import CGemm
from ocannl.backends.c.tile_printer import TilePrinter
from ocannl.backends.codegen import PART_STATEMENTS, Emitter
from ocannl.lowlevel.analysis import last_check
from ocannl.lowlevel.cost import timed_statements
from ocannl.lowlevel.cpu_schedule import (
    PACK_K_BLOCK, GemmPlan, MicroKernel, NestPlan, TopLevelPlan, plan_parts, plan_top_level,
)
from ocannl.lowlevel.indexing import AnySymbol, IndexSymbol, Symbol, index_symbols
from ocannl.lowlevel.ir import (
    DeclareLocal, EmbedIndex, Fill, For, Load, LoadDynamic, Stmt, Store, StoreDynamic, iter_exprs, iter_stmts, seq,
    stmt_exprs, top_level,
)
from ocannl.lowlevel.structure import Structure, fingerprint, sequence_structure, structure
from ocannl.lowlevel.tnode import TNode

NEST_FN = "OCANNL_NEST_FN"
NEST_FN_DEFINITION = (
    "/* A function kept out of line per loop nest: the optimizer works on one short function at */\n"
    "/* a time, so the build time grows linearly with the routine. */\n"
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
    "/* A routine run in parts only calls them, and a part only calls its nests: nothing in them */\n"
    "/* for -O2 to improve over -O1, nor for alias analysis to find, and GCC's points-to analysis */\n"
    "/* of a function of a thousand restrict pointers is slow. */\n"
    "#if defined(__GNUC__) && !defined(__clang__)\n"
    "#define OCANNL_CALLS_FN __attribute__((optimize(\"O1\", \"no-tree-pta\")))\n"
    "#else\n#define OCANNL_CALLS_FN\n#endif"
)
PART_FN = "OCANNL_PART_FN"
PART_FN_DEFINITION = (
    "/* A part of a long routine: a function of its own that only calls (see OCANNL_CALLS_FN). */\n"
    "#if defined(__GNUC__)\n#define OCANNL_PART_FN OCANNL_NEST_FN OCANNL_CALLS_FN\n"
    "#else\n#define OCANNL_PART_FN\n#endif"
)
"""Parts are ``noinline`` as nests are (at ``-O1`` GCC would inline a function called once into
the routine) and built as the routine is: the 12-block GPT's step source built in 1.39 s of
compiler time instead of 1.63, the 2-block one's in 1.28 instead of 1.33 (GCC 12, one core, best
of eight builds)."""


def _function(macro: str, name: str, params: list[str], body: list[str]) -> list[str]:
    """The lines of the helper function ``name``, marked with ``macro`` (:data:`NEST_FN`,
    :data:`TILE_FN`, :data:`PART_FN`)."""
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
        self._gemm_shared: set[object] = set()  # what shared GEMM loops need, printed (_declare_shared_loops)
        self._vector_lanes: set[int] = set()
        self.in_parts = False
        """After :meth:`body`: the body only calls its parts' helper functions."""
        self._printed: dict[Hashable, _Printed] = {}
        self._structures: dict[int, tuple[Stmt, Structure]] = {}
        """Each statement's structure (:meth:`_statement_structure`), by the statement's identity
        (kept alive with it)."""
        self._skipped = 0
        """Helper functions not printed (:meth:`helper`), counted in the numbers of those printed
        after them: the source is the one printing them all would give once ``shared_helpers.py``
        has merged them, but for the numbers of loop indices and temporaries first named in a
        helper not printed."""

    def body(self, emitter: Emitter, around: Callable[[int], tuple[str, str]] | None = None) -> list[str]:
        """The lines of the routine's body (indented one level): calls of helper functions
        (module docstring), and after the routine's last check, when statements follow it, a
        return if a check failed: a failed run writes nothing after it, so undoing the run
        restores only what the statements up to it write (``CExecutable.stops_at_failure``).

        ``around(k)`` gives a line to print before and one after the ``k``-th of the routine's
        :func:`~ocannl.lowlevel.cost.timed_statements` (a profile's timer); the body is then
        printed without parts."""
        top = list(top_level(emitter.routine.body))
        timed = {id(s): k for k, s in enumerate(timed_statements(emitter.routine.body))} if around else None
        parts = around is None and not any(isinstance(s, DeclareLocal) for s in top)  # no local crosses a part
        last = last_check(top)
        gate = last + 1 if 0 <= last < len(top) - 1 else len(top)
        self._segment(emitter, top[:gate], parts, around, timed)
        if gate < len(top):
            emitter.line("if (_status_cell) return _status_cell;  /* a check failed: run nothing after it */")
            self._segment(emitter, top[gate:], parts, around, timed)
        return emitter.scope.out

    def _segment(self, emitter: Emitter, top: list[Stmt], parts: bool,
                 around: Callable[[int], tuple[str, str]] | None, timed: dict[int, int] | None) -> None:
        """Prints consecutive top-level statements of the routine (:meth:`body`): in parts when
        ``parts`` allows and they are many, each top-level statement declaring its own locals;
        with ``around``'s lines around those ``timed`` numbers."""
        if around is not None:
            for s in top:
                k = timed.get(id(s))
                before, after = ("", "") if k is None else around(k)
                if before:
                    emitter.line(before)
                self.statements(emitter, [s])
                if after:
                    emitter.line(after)
        elif not parts or len(top) <= PART_STATEMENTS:
            self.statements(emitter, top)
        else:
            self.in_parts = True
            for cut in plan_parts([fingerprint(self._statement_structure(emitter, s).key) for s in top]):
                part = top[cut.start : cut.stop]
                self.helper(emitter, "part", seq(*part), lambda part=part: self.statements(emitter, part), PART_FN,
                            parts=part)

    def statements(self, emitter: Emitter, stmts: list[Stmt]) -> None:
        """Prints top-level statements as their :class:`~ocannl.lowlevel.cpu_schedule.TopLevelPlan` says.

        A plan is decided from what the statement's structure holds, so a statement whose loop
        nest has the structure of one printed as a helper function is planned as that one was,
        as a call of that helper: it is printed so without planning it again (a deep network's
        blocks repeat their nests; planning one takes as long as printing its call many times)."""
        for s in stmts:
            if not self._call_printed_nest(emitter, s):
                self.top_level(emitter, plan_top_level(s, self.vector_bytes, emitter.parallel))

    def _call_printed_nest(self, emitter: Emitter, stmt: Stmt) -> bool:
        """Prints a call of the helper function printed for a loop nest of ``stmt``'s structure
        (:meth:`helper`, kind ``"nest"``) and says so; ``False`` (nothing printed) if there is none."""
        if not isinstance(stmt, For):
            return False
        shape = self._structure(emitter, "nest", NEST_FN, stmt)
        printed = self._printed.get(shape.key) if shape is not None else None
        if printed is None:
            return False
        self._call(emitter, printed, shape)
        return True

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
               macro: str = NEST_FN, parts: Sequence[Stmt] | None = None) -> None:
        """Prints a call of a new helper function ``<function>_<kind><k>`` whose body
        ``print_body`` prints: the code of ``stmt``, which names the parameters; or a call of the
        helper printed for a statement of the same structure (:meth:`_structure`), unless printing
        that one numbered runtime checks (their messages name their statement: such helpers are
        printed, and ``shared_helpers.py`` passes them their check numbers). ``parts``: the
        statements ``stmt`` runs in sequence, whose structures make its own."""
        shape = self._structure(emitter, kind, macro, stmt, parts)
        printed = self._printed.get(shape.key) if shape is not None else None
        if printed is not None:
            self._call(emitter, printed, shape)
            return
        before = (len(emitter.sites), len(self.functions) + self._skipped)
        with emitter.entering(emitter.scope.replace(out=[], depth=1, declared=set())) as scope:
            print_body()
        name = f"{emitter.function_name}_{kind}{len(self.functions) + self._skipped}"
        inputs = self.helper_inputs(emitter, stmt)
        params, args = self.helper_params(emitter, inputs)
        self.functions.append(_function(macro, name, params, scope.out))
        emitter.line(f"{name}({', '.join(args)});")
        if shape is not None and len(emitter.sites) == before[0]:  # checks name their statement
            helpers = len(self.functions) + self._skipped - before[1]
            self._printed[shape.key] = _Printed(name, tuple(_position(shape, x) for x in inputs[:-1]), helpers)

    def _call(self, emitter: Emitter, printed: _Printed, shape: Structure) -> None:
        """Prints a call of the helper ``printed`` for a statement of its structure, ``shape``."""
        args = [*(printed.argument(emitter, shape, k) for k in range(len(printed.inputs))), "_status"]
        self._skipped += printed.helpers
        emitter.line(f"{printed.name}({', '.join(args)});")

    def _structure(self, emitter: Emitter, kind: str, macro: str, stmt: Stmt,
                   parts: Sequence[Stmt] | None = None) -> Structure | None:
        """The structure (``ocannl/lowlevel/structure.py``) under which ``stmt``'s helper is
        printed once: with the kind, the macro, what the walk knows around it and, per node,
        whether the routine writes it (its pointer is ``const`` if not). ``None`` where the
        walk prints with values of the code around it (a tile's cell, a local scope).
        ``parts``: the statements ``stmt`` runs in sequence (:func:`sequence_structure`)."""
        scope = emitter.scope
        if scope.env or scope.scope_values or scope.in_scope:
            return None
        if parts is None:
            shape = self._statement_structure(emitter, stmt)
        else:
            shape = sequence_structure([self._statement_structure(emitter, s) for s in parts])
        extents = tuple(scope.extents.get(s) for s in shape.symbols)
        key = (kind, macro, scope.in_parallel, scope.branchless, extents, shape.key)
        return Structure(key, shape.nodes, shape.symbols, shape.locals)

    def _statement_structure(self, emitter: Emitter, stmt: Stmt) -> Structure:
        """``stmt``'s structure with the facts :meth:`_structure` adds per node, walked once per
        statement: a long routine's statements are walked for the cuts between its parts
        (:func:`plan_parts`), for the parts, and again for their nests' helpers."""
        known = self._structures.get(id(stmt))
        if known is None or known[0] is not stmt:
            known = self._structures[id(stmt)] = (stmt, structure(stmt, lambda node: node in emitter.written))
        return known[1]

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
        """Adds the GEMM declarations and the cutting of units (once per source) and ``g``'s
        micro-kernel (once per shape) to :attr:`functions`."""
        if not self._gemm_kernels:
            self.functions += [self.gemm.declarations(), self.gemm.shares()]
        if g.kernel not in self._gemm_kernels:
            if g.lanes > 1:
                self.declare_vector_type(g.lanes)
            self._gemm_kernels.add(g.kernel)
            self.functions.append(self.gemm.kernel(g.kernel))
        if g.shared is not None:
            self._declare_shared_loops(g)

    def _declare_shared_loops(self, g: GemmPlan) -> None:
        """Adds what shared GEMM loops of ``g``'s tile shape need to :attr:`functions`, each once
        per source: their types, the packing of strips as wide as its tile, and the loops."""
        wanted = [("types", lambda: self.gemm.shared_declarations())]
        wanted += [(("pack", w), lambda w=w: self.gemm.pack(w, PACK_K_BLOCK)) for w in dict.fromkeys((g.nr, g.mr))]
        wanted.append((("loops", g.mr, g.nr), lambda: self.gemm.shared_loops(g.mr, g.nr)))
        for key, lines in wanted:
            if key not in self._gemm_shared:
                self._gemm_shared.add(key)
                self.functions.append(lines())

    def declare_vector_type(self, lanes: int) -> None:
        """Declares the vector types of ``lanes`` floats (:attr:`types`), once."""
        if lanes not in self._vector_lanes:
            self._vector_lanes.add(lanes)
            self.types.append(CGemm.vector_types(lanes))

    def helper_inputs(self, emitter: Emitter, nest: Stmt) -> list[TNode | IndexSymbol | Symbol | None]:
        """What the helper function printing ``nest`` (a contraction or a top-level loop nest)
        takes, in parameter order: nodes (by name), index symbols (by name), enclosing loop
        indices, then ``None``, the status cell."""
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
        free = [s for s in symbols if isinstance(s, Symbol) and s in emitter.scope.extents]
        return [*sorted(nodes, key=lambda n: emitter.nodes[n]),
                *sorted((s for s in symbols if isinstance(s, IndexSymbol)), key=lambda s: s.name), *free, None]

    def helper_params(self, emitter: Emitter, inputs: list[TNode | IndexSymbol | Symbol | None]
                      ) -> tuple[list[str], list[str]]:
        """The parameters of a helper function taking ``inputs`` (:meth:`helper_inputs`), and the
        arguments passing them."""
        index_type = emitter.syntax.index_type
        params = [pointer_param(emitter, x) if isinstance(x, TNode) else "int *_status" if x is None
                  else f"{index_type} {_argument(emitter, x)}" for x in inputs]
        return params, [_argument(emitter, x) for x in inputs]


def _argument(emitter: Emitter, x: TNode | IndexSymbol | Symbol | None) -> str:
    """How the body passes ``x`` (:meth:`CTarget.helper_inputs`) to a helper function."""
    if isinstance(x, TNode):
        return emitter.nodes[x]
    if isinstance(x, IndexSymbol):
        return emitter.symbols[x]
    return "_status" if x is None else emitter.namer.symbol(x)


def _position(shape: Structure, x: TNode | IndexSymbol | Symbol) -> tuple[str, object]:
    """Where ``x`` stands in ``shape``: a node or loop symbol by its number, an index symbol as
    itself (one of the routine's, equal in every statement of the same structure)."""
    if isinstance(x, TNode):
        return "node", shape.nodes.index(x)
    if isinstance(x, Symbol):
        return "symbol", shape.symbols.index(x)
    return "index", x


@dataclass(frozen=True)
class _Printed:
    """A helper function printed for a structure: its ``name``, its inputs but the status cell
    (:func:`_position`), and the helper functions printing it made (itself and those it calls)."""

    name: str
    inputs: tuple[tuple[str, object], ...]
    helpers: int

    def argument(self, emitter: Emitter, shape: Structure, k: int) -> str:
        """The argument passing input ``k`` for a statement of structure ``shape``."""
        kind, at = self.inputs[k]
        x = shape.nodes[at] if kind == "node" else shape.symbols[at] if kind == "symbol" else at
        return _argument(emitter, x)


def pointer_param(emitter: Emitter, node: TNode) -> str:
    """The parameter of a function that takes ``node``'s buffer (``const`` when the routine only
    reads it)."""
    const = "" if node in emitter.written else "const "
    return f"{const}{emitter.syntax.storage_type(node.dtype)} *{emitter.syntax.restrict} {emitter.nodes[node]}"
