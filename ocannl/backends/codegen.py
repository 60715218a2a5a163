"""The C-family code generator: one walk over the loop IR, shared by the C and Metal emitters (a
backend is small, and a renderer is a table; Triton works on tiles and has its own writers).

:class:`Emitter` walks a :class:`~ocannl.lowlevel.ir.RoutineIR` and prints statements and
expressions; every piece of language-specific text comes from a :class:`Syntax` table (type names,
literals, the operator table, conversions, checked indices, the parallel-loop pragma). A backend
supplies its table and wraps the printed body in its own function signature and launch code.

What the walk decides for every language:

* **Names.** Loop indices and locals are numbered as in the ``.ll`` printer (``i0``, ``v0``...),
  so a generated source reads side by side with ``<routine>.ll``. Nodes keep their sanitized
  :attr:`~ocannl.lowlevel.tnode.TNode.name`; static index symbols become ``_s_<identifier>``
  (:attr:`~ocannl.lowlevel.indexing.IndexSymbol.identifier`, unique in the routine). Every other
  identifier the walk invents starts with ``_`` (node names never do), and node names are reserved
  in no target (ocannl/lowlevel/identifiers.py), so nothing a user labels can clash with
  generated code. Comments carry user text only through
  :func:`~ocannl.lowlevel.identifiers.comment_text`.
* **Offsets** are row-major linear forms over the loop indices (``x[12*i0 + 4*i1 + i2]``). An
  axis index that the loop extents cannot prove inside its dimension is checked:
  ``Load.oob_value`` reads become ``(in bounds ? x[...] : v)``; other accesses (dynamic positions
  of ``oc.take``, index symbols of unknown size) go through the table's checked index, which
  records a *site* number and clamps, and the runtime raises the site's error after the call.
* **Evaluation order** follows the interpreter: ``where`` evaluates only its chosen branch (or
  both, into a select, where its test reads data and both are free of effects, failures and
  unproven reads, which is then indistinguishable); a
  :class:`~ocannl.lowlevel.ir.LocalScope` runs its statements just before the statement that
  uses it (a where branch holding one becomes an ``if``).
* **Contractions** and **parallel loops**: which nests print as register tiles, with which tile
  sizes and vector lanes, which loops get the table's parallel pragma (OpenMP in C) and where
  selects print without branches, is decided by ``ocannl/lowlevel/cpu_schedule.py``: one
  :class:`~ocannl.lowlevel.cpu_schedule.NestPlan` per nest the walk reaches
  (:meth:`Emitter.for_loop`). The walk prints its :class:`ContractionPlan` as tiles of
  accumulators in scalar variables (in vectors where the plan's ``TileNest.lanes`` says so),
  each cell adding its terms in the interpreter's order, and a
  parallel loop's iterations writing disjoint cells, so results do not depend on the thread count.
  A language with a :class:`GemmTarget` (C) gets GEMM-class contractions as packed GEMMs
  (``ocannl/backends/c/gemm_printer.py``, docs/codegen.md "Packed GEMM"), in the same order per cell.
"""

from __future__ import annotations

from contextlib import contextmanager
import abc
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Protocol

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import affine_form, provably_within, row_major_strides
from ocannl.lowlevel.cost import timed_statements
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.identifiers import Namespace, comment_text
from ocannl.lowlevel.indexing import Affine, AnySymbol, AxisIndex, Fixed, IndexSymbol, Iter, Symbol, index_symbols
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local,
    LocalScope, Namer, RoutineIR, Seq, SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary,
    format_routine, format_stmt, iter_exprs, iter_stmts, seq, stmt_exprs,
)
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.cpu_schedule import (
    ContractionPlan, GemmPlan, MicroKernel, NestPlan, TileNest, gemm_with_epilogue, plan_contraction, plan_loop,
    plan_nest, vector_factors,
)
from ocannl.lowlevel.tnode import TNode

PART_STATEMENTS = 32
"""Top-level statements per part of a long routine (:meth:`Emitter.body`): enough that the parts'
calls cost nothing next to their work, few enough that the C compiler's time stays linear."""

class Syntax(abc.ABC):
    """The table of a C-family language: everything the walk prints that is not structure.

    Methods receive already-printed operand text. ``dtype`` arguments are compute types
    (dtypes.py) except for :meth:`storage_type`, :meth:`from_storage` and :meth:`to_storage`.
    """

    index_type = "int"
    index_dtype = dtypes.int32
    """The type of loop indices and offsets, in the language and as a precision."""
    restrict = "restrict"

    @abc.abstractmethod
    def storage_type(self, dtype: DType) -> str:
        """The language's type of a buffer element of ``dtype``."""

    @abc.abstractmethod
    def compute_type(self, dtype: DType) -> str:
        """The language's type of a value computed in ``dtype``."""

    @abc.abstractmethod
    def literal(self, value: float | int | tuple[int, ...], dtype: DType) -> str:
        ...

    @abc.abstractmethod
    def unary(self, op: Unop, dtype: DType, x: str, *, branchless: bool = False) -> str:
        """``op x``. ``branchless``: no chain runs from one value to the next where it is printed
        (``cpu_schedule.NestPlan.branchless``), so a select may print without a branch."""

    @abc.abstractmethod
    def binary(self, op: Binop, dtype: DType, a: str, b: str, *, branchless: bool = False) -> str:
        """``a op b``; ``branchless`` as for :meth:`unary`."""

    @abc.abstractmethod
    def int_division(self, op: Binop, dtype: DType, a: str, b: str, site: int) -> str:
        """Integer ``div``/``mod``, which must report a zero divisor as error ``site``."""

    @abc.abstractmethod
    def ternary(self, op: Ternop, dtype: DType, a: str, b: str, c: str) -> str:
        ...

    @abc.abstractmethod
    def where(self, cond: str, a: str, b: str) -> str:
        ...

    @abc.abstractmethod
    def cast(self, x: str, source: DType, target: DType) -> str:
        ...

    @abc.abstractmethod
    def from_storage(self, dtype: DType, cell: str) -> str:
        """A stored cell of a ``dtype`` node as a value of ``dtype.compute``."""

    @abc.abstractmethod
    def to_storage(self, dtype: DType, value: str) -> str:
        """A ``dtype.compute`` value rounded to what a ``dtype`` node stores."""

    @abc.abstractmethod
    def checked_index(self, index: str, extent: int, site: int) -> str:
        """``index`` if it is in ``[0, extent)``; otherwise records error ``site`` and gives 0."""

    def parallel_for(self, collapse: int) -> str | None:
        """The line put before a parallel loop (``None``: the language has no such loops)."""
        return None


class GemmTarget(Protocol):
    """What a language that runs packed GEMMs (C: ``ocannl/backends/c/gemm.py``) gives the walk:
    the width of its vector registers, its micro-kernels, and the printer of a packed GEMM's
    loops (``ocannl/backends/c/gemm_printer.py``)."""

    vector_bytes: int

    def kernel(self, shape: MicroKernel) -> list[str]:
        """The lines of the micro-kernel function of ``shape``."""

    def declarations(self) -> list[str]:
        """File-scope lines the first GEMM of a source needs."""

    def vector_types(self, lanes: int) -> list[str]:
        """The vector types of ``lanes`` floats the micro-kernels use."""

    def vector_type(self, lanes: int, aligned: bool = True) -> str:
        """The name of one of them (``aligned=False``: the one read at any float address)."""

    def print_gemm(self, emitter: Emitter, plan: ContractionPlan) -> None:
        """Prints the contraction ``plan``, whose :attr:`~ContractionPlan.gemm` is set, through
        ``emitter``, its micro-kernel already declared."""


@dataclass(frozen=True)
class Site:
    """A runtime check of the generated code: ``kind`` is ``"index"``, ``"division"`` or
    ``"memory"`` (working memory the code could not allocate)."""

    kind: str
    message: str


def _self_contained(stmt: Stmt) -> bool:
    """Whether every local ``stmt`` uses is declared inside it (it can move into a function)."""
    declared: set[Local] = set()
    used: set[Local] = set()
    for s in iter_stmts(stmt):
        if isinstance(s, DeclareLocal):
            declared.add(s.local)
        elif isinstance(s, SetLocal):
            used.add(s.local)
        for e in (sub for top in stmt_exprs(s) for sub in iter_exprs(top)):
            if isinstance(e, LocalScope):
                declared.add(e.local)
            elif isinstance(e, GetLocal):
                used.add(e.local)
    return used <= declared


# ---------------------------------------------------------------------------------------------
# The walk


@dataclass
class _Output:
    """Printed lines, each already indented."""

    lines: list[str] = field(default_factory=list)


class Emitter:
    """Prints one routine's body through a :class:`Syntax` table.

    After :meth:`body`, :attr:`sites` lists the runtime checks (site ``k`` is reported as
    ``k + 1``), :attr:`functions` the helper functions the body calls (register-tiled
    contractions, printed by :meth:`contraction`), and :attr:`nodes`/:attr:`symbols` the
    buffers and index symbols the routine takes, each with its printed name; :attr:`types` the
    type declarations the functions use (vector types), printed before them.
    """

    def __init__(
        self,
        syntax: Syntax,
        routine: RoutineIR,
        *,
        function_name: str = "routine",
        reserved: Iterable[str] = (),
        parallel: bool = True,
        tile_function: Callable[[Emitter, str, list[str], list[str]], list[str]] | None = None,
        nest_function: Callable[[Emitter, str, list[str], list[str]], list[str]] | None = None,
        gemm: GemmTarget | None = None,
    ):
        """``function_name``: the routine's function, also the prefix of its helper functions'
        names; ``reserved``: other identifiers node names must avoid.
        ``tile_function(emitter, name, params, body)`` wraps a contraction's lines in a helper
        function of the language; without it, contractions print inline. ``nest_function`` does
        the same for every other top-level loop nest (:meth:`body`). ``gemm``: the language runs
        GEMM-class contractions as packed GEMMs (``GemmTarget.print_gemm``); the walk then prints them in
        helper functions through ``nest_function``."""
        self.syntax = syntax
        self.function_name = function_name
        self.routine = routine
        self.parallel = parallel
        self.tile_function = tile_function
        self.nest_function = nest_function
        self.gemm = gemm
        self._vector_bytes = gemm.vector_bytes if gemm is not None else None
        self._gemm_kernels: set[MicroKernel] = set()
        self._vector_lanes: set[int] = set()
        self.namer = Namer()
        format_routine(routine, self.namer)  # number loops and locals exactly as the .ll file
        # Node names are already reserved nowhere; this scope adds the function, its tile
        # helpers and the caller's names, and separates nodes that share a name (nodes made in
        # two sessions).
        helpers = [f"{function_name}_{kind}" for kind in ("tile", "nest", "part")]
        scope = Namespace({*reserved, function_name}, prefixes=helpers)
        self.nodes: dict[TNode, str] = {
            node: scope.claim(node.name, node.id)
            for node in sorted(set(routine.reads + routine.writes), key=lambda n: (n.name, n.id))
        }
        self.written = set(routine.writes)
        symbol_scope = Namespace()
        self.symbols: dict[IndexSymbol, str] = {
            s: f"_s_{symbol_scope.claim(s.identifier)}"
            for s in sorted(routine.static_symbols, key=lambda s: s.name)
        }
        self.sites: list[Site] = []
        self.types: list[list[str]] = []
        self.functions: list[list[str]] = []
        self._out = _Output()
        self._depth = 1
        self._extents: dict[Symbol, int] = {}
        self._env: dict[Symbol, tuple[str | None, int]] = {}
        self._statement: Stmt | None = None
        self._in_parallel = False
        self._branchless = False  # NestPlan.branchless of the nest being printed, or of one around it
        self._in_scope = 0
        self._temps = 0
        self._declared: set[Local] = set()
        self._scope_values: dict[int, str] = {}  # id(scope) -> its value in a tile

    # -- output ----------------------------------------------------------------------------------

    def line(self, text: str, indent: bool = True) -> None:
        """Prints ``text`` at the current depth (``indent=False``: in the first column, as a
        preprocessor line must be)."""
        self._out.lines.append("  " * self._depth + text if indent else text)

    @contextmanager
    def indented(self) -> Iterator[None]:
        """Lines printed inside are one level deeper."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    @contextmanager
    def symbol_texts(self, texts: Mapping[Symbol, tuple[str | None, int]]) -> Iterator[None]:
        """Inside, each loop symbol of ``texts`` prints as ``(base, offset)``: ``base + offset``
        (a tile's cell, a packed GEMM's flat index digits)."""
        saved, self._env = self._env, dict(texts)
        try:
            yield
        finally:
            self._env = saved

    @contextmanager
    def known_extents(self, extents: Mapping[Symbol, int]) -> Iterator[None]:
        """Inside, the loop symbols of ``extents`` are known to stay below them (bounds proofs)."""
        self._extents.update(extents)
        try:
            yield
        finally:
            for s in extents:
                self._extents.pop(s, None)

    @contextmanager
    def scope_value(self, scope: LocalScope, text: str) -> Iterator[None]:
        """Inside, the local scope ``scope`` prints as ``text`` (its value already computed)."""
        self._scope_values[id(scope)] = text
        try:
            yield
        finally:
            del self._scope_values[id(scope)]

    def body(self, around: Callable[[int], tuple[str, str]] | None = None) -> list[str]:
        """The lines of the routine's body (indented one level).

        Through ``nest_function``, the body is a list of calls of helper functions: each
        top-level loop nest that uses no local of the code around it becomes one, and a routine
        of more than :data:`PART_STATEMENTS` top-level statements runs them in parts, a helper
        function each. The C compiler then optimizes many short functions instead of one as long
        as the routine: the time its optimizer takes grows faster than linearly in the length of
        a function (alias queries between memory accesses, register allocation across a long
        sequence of calls), and a training routine holds a few nests per layer.

        ``around(k)`` gives a line to print before and one after the ``k``-th of the routine's
        :func:`~ocannl.lowlevel.cost.timed_statements` (a profile's timer); the body is then
        printed without parts."""
        top = list(self.routine.body.stmts) if isinstance(self.routine.body, Seq) else [self.routine.body]
        if around is not None:
            timed = {id(s): k for k, s in enumerate(timed_statements(self.routine.body))}
            for s in top:
                k = timed.get(id(s))
                before, after = ("", "") if k is None else around(k)
                if before:
                    self.line(before)
                if self.nest_function is None:
                    self.stmt(s)
                else:
                    self.statements([s])
                if after:
                    self.line(after)
        elif self.nest_function is None:
            self.stmt(self.routine.body)
        elif len(top) <= PART_STATEMENTS or any(isinstance(s, DeclareLocal) for s in top):
            self.statements(top)
        else:  # no local crosses a part: each top-level statement declares its own
            for k in range(0, len(top), PART_STATEMENTS):
                part = top[k : k + PART_STATEMENTS]
                self.helper("part", seq(*part), lambda part=part: self.statements(part))
        return self._out.lines

    def statements(self, stmts: list[Stmt]) -> None:
        """Prints ``stmts``, each self-contained loop nest as a helper function (:meth:`body`); a
        GEMM-class product inlined into its consumer as the GEMM, then the consumer
        (:func:`~ocannl.lowlevel.cpu_schedule.gemm_with_epilogue`)."""
        for s in stmts:
            plan = (plan_contraction(s, self._vector_bytes)
                    if isinstance(s, For) and self.tile_function is not None else None)
            split = gemm_with_epilogue(s, self._vector_bytes, plan) if self.gemm and plan is not None else None
            if split is not None:
                self.statements([part for part in split if part is not None])
            elif isinstance(s, For) and _self_contained(s) and plan is None:  # a contraction prints its own
                self.helper("nest", s, lambda s=s: self.stmt(s))
            else:
                self.stmt(s)

    def helper(self, kind: str, stmt: Stmt, print_body: Callable[[], None]) -> None:
        """Prints a call of a new helper function ``<function>_<kind><k>`` (``nest_function``)
        whose body ``print_body`` prints: the code of ``stmt``, which names the parameters."""
        saved_out, saved_depth, saved_declared = self._out, self._depth, self._declared
        self._out, self._depth, self._declared = _Output(), 1, set()
        print_body()
        lines, self._out, self._depth, self._declared = self._out.lines, saved_out, saved_depth, saved_declared
        name = f"{self.function_name}_{kind}{len(self.functions)}"
        params, args = self._helper_params(stmt)
        self.functions.append(self.nest_function(self, name, params, lines))
        self.line(f"{name}({', '.join(args)});")

    def statement_lines(self, stmt: Stmt, bound: Mapping[Symbol, int], depth: int = 1) -> list[str]:
        """The lines of ``stmt`` alone, indented ``depth`` levels. ``bound`` maps loop symbols
        the caller declares itself (a GPU thread's grid point) to their extents, which let the
        walk prove accesses in bounds. Kernel languages (the MSL emitter) print each kernel's
        statements this way instead of calling :meth:`body`."""
        with self._printing_apart(bound, depth) as out:
            self.stmt(stmt)
        return out.lines

    def expression_lines(
        self, e: Expr, bound: Mapping[Symbol, int], depth: int = 1, statement: Stmt | None = None
    ) -> tuple[list[str], str]:
        """``e`` printed with the loop symbols ``bound`` as in :meth:`statement_lines`, and the
        lines that must run before it (the local scopes it holds); ``statement`` is the one
        runtime check messages name."""
        self._statement = statement
        with self._printing_apart(bound, depth) as out:
            text = self.expr(e)
        return out.lines, text

    @contextmanager
    def _printing_apart(self, bound: Mapping[Symbol, int], depth: int) -> Iterator[_Output]:
        saved_out, saved_depth = self._out, self._depth
        self._out, self._depth = _Output(), depth
        self._extents.update(bound)
        try:
            yield self._out
        finally:
            for s in bound:
                self._extents.pop(s, None)
            self._out, self._depth = saved_out, saved_depth

    def site(self, kind: str, message: str) -> int:
        """The number of the runtime check ``message`` (reused when already registered)."""
        s = Site(kind, f"{message} in routine {self.routine.name}")
        if s not in self.sites:
            self.sites.append(s)
        return self.sites.index(s) + 1

    # -- statements ------------------------------------------------------------------------------

    def stmt(self, s: Stmt) -> None:
        match s:
            case Seq(stmts=stmts):
                for x in stmts:
                    self.stmt(x)
            case Comment(text=text):
                self.line(f"/* {comment_text(text)} */")
            case For():
                self.for_loop(s)
            case Store(tnode=node, indices=indices, value=value, skip_oob=True):
                self._statement = s
                conditions = self.bounds_conditions(node, indices)
                if not conditions:
                    self.stmt(Store(node, indices, value))
                    return
                self.line(f"if ({conditions}) {{  /* a store into the margin does nothing */")
                with self.indented():
                    self.with_prelude(lambda: f"{self.access(node, indices, unchecked=True)} = {self.stored(node, value)};")
                self.line("}")
            case Store(tnode=node, indices=indices, value=value):
                self._statement = s
                self.with_prelude(lambda: f"{self.access(node, indices)} = {self.stored(node, value)};")
            case StoreDynamic(tnode=node, axis=axis, position=position, indices=indices, value=value):
                self._statement = s

                def text() -> str:
                    cell = self.access(node, indices, dynamic=(axis, position))
                    return f"{cell} = {self.stored(node, value)};"

                self.with_prelude(text)
            case Fill(tnode=node, value=value):
                self._statement = s
                stored = self.stored(node, value)
                if node.size == 1:
                    self.line(f"{self.nodes[node]}[0] = {stored};")
                else:
                    it = self.syntax.index_type
                    self.line(f"for ({it} _n = 0; _n < {node.size}; ++_n) {self.nodes[node]}[_n] = {stored};")
            case DeclareLocal(local=local):
                self.declare(local)
            case SetLocal(local=local, value=value):
                self._statement = s
                self.with_prelude(lambda: f"{self.namer.local(local)} = {self.expr(value)};")
            case _:
                raise TypeError(f"not a loop IR statement: {s!r}")

    def declare(self, local: Local) -> None:
        name = self.namer.local(local)
        zero = self.syntax.literal(_zero(local.dtype), local.dtype)
        if local in self._declared:
            self.line(f"{name} = {zero};")
        else:
            self._declared.add(local)
            self.line(f"{self.syntax.compute_type(local.dtype)} {name} = {zero};")

    def with_prelude(self, build: Callable[[], str]) -> None:
        """Prints the statement ``build()`` returns, preceded (inside a block) by the lines its
        expressions need first (local scopes, branches of a where holding them)."""
        saved, declared = self._out, set(self._declared)
        self._out = _Output()
        self._depth += 1
        text = build()
        self._depth -= 1
        prelude, self._out = self._out.lines, saved
        if not prelude:
            self.line(text)
            return
        self._declared = declared
        self.line("{")
        self._out.lines.extend(prelude)
        self._depth += 1
        self.line(text)
        self._depth -= 1
        self.line("}")

    def for_loop(self, loop: For) -> None:
        """Prints ``loop`` as its :class:`~ocannl.lowlevel.cpu_schedule.NestPlan` says (inside
        a local scope or a tile: as it is, :func:`~ocannl.lowlevel.cpu_schedule.plan_loop`)."""
        threads = self.parallel and not self._in_parallel and not self._in_scope
        if self._in_scope or self._env:
            self._loop(plan_loop(loop, threads))
            return
        plan = plan_nest(loop, self._vector_bytes, threads)
        branchless, self._branchless = self._branchless, self._branchless or plan.branchless
        try:
            if plan.contraction is not None:
                self.contraction(plan)
            else:
                self._loop(plan)
        finally:
            self._branchless = branchless

    def _loop(self, plan: NestPlan) -> None:
        """Prints ``plan.nest``'s loop, with the parallel pragma where the plan runs it on threads."""
        loop = plan.nest
        pragma = self.syntax.parallel_for(1) if plan.parallel else None
        if pragma:
            self.line(pragma)
        var = self.namer.symbol(loop.symbol)
        it = self.syntax.index_type
        self.line(f"for ({it} {var} = 0; {var} < {loop.extent}; ++{var}) {{")
        with self.indented(), self.known_extents({loop.symbol: loop.extent}):
            was_parallel, self._in_parallel = self._in_parallel, self._in_parallel or bool(pragma)
            declared = set(self._declared)
            self.stmt(loop.body)
            self._declared = declared
            self._in_parallel = was_parallel
        self.line("}")

    # -- contractions ----------------------------------------------------------------------------

    def contraction(self, nest: NestPlan) -> None:
        """Prints a contraction as register tiles or a packed GEMM (``nest.contraction``, see
        :func:`plan_contraction`); through ``tile_function`` the tiles live in a helper function
        the body calls.

        A reset of the cells (``out[I] := 0.0`` before the sum, :attr:`ContractionPlan.reset`)
        prints no store: where the cell's first step would read it back, the accumulator starts
        from the reset value instead (:meth:`reset_value`), so each cell is written once, at the
        end of its tile, and its bits are those of the reset and the sum in their order."""
        plan = nest.contraction
        saved_out, saved_depth = self._out, self._depth
        self._out, self._depth = _Output(), 1 if self.tile_function else self._depth
        self._statement = plan.store
        packed = plan.gemm is not None and self.gemm is not None
        if packed:
            self._declare_gemm_kernel(plan.gemm)
            self.gemm.print_gemm(self, plan)
        else:
            self.line(
                f"/* {comment_text(format_stmt(plan.store, self.namer))} in {plan.mr}x{plan.nr} register tiles; "
                + ("each block of terms sums from zero, then adds to the cell */" if plan.blocks is not None
                   else "each cell sums in loop order */")
            )
            if plan.blocks is not None:
                self._block_contraction(plan, nest.tile_nests)
            else:
                self._loop_order_contraction(plan, nest.tile_nests[0])
        lines, self._out, self._depth = self._out.lines, saved_out, saved_depth
        if self.tile_function is None:
            self._out.lines.extend(lines)
            return
        name = f"{self.function_name}_tile{len(self.functions)}"
        params, args = self._helper_params(plan.nest)
        wrap = self.nest_function if packed and self.nest_function is not None else self.tile_function
        self.functions.append(wrap(self, name, params, lines))
        self.line(f"{name}({', '.join(args)});")

    def _block_contraction(self, plan: ContractionPlan, groups: tuple[tuple[TileNest, ...], ...]) -> None:
        """The tiles of a reduction in blocks: the outermost loop of each top-level statement
        of ``plan.blocks`` runs around the tiles (a block of operands stays in cache while every
        tile uses it), the rest inside them (:meth:`_tile_blocks`). ``groups``: the nests of
        tiles of each top-level statement (``NestPlan.tile_nests``)."""
        it = self.syntax.index_type
        if plan.scope is not None:  # the sum lives in the tile's registers until the cell's store
            for tiles in groups[0]:
                self._tile_nest(plan, tiles, plan.blocks)
            return
        tops = plan.blocks.stmts if isinstance(plan.blocks, Seq) else (plan.blocks,)
        for n_top, (top, group) in enumerate(zip(tops, groups, strict=True)):
            inner = top
            # The conditions under which a leaf adds the cell's first block (None: never).
            fresh: tuple[str, ...] | None = () if n_top == 0 and plan.reset is not None else None
            if isinstance(top, For):
                var = self.namer.symbol(top.symbol)
                self.line(f"for ({it} {var} = 0; {var} < {top.extent}; ++{var}) {{")
                self._depth += 1
                self._extents[top.symbol] = top.extent
                inner = top.body
                fresh = None if fresh is None else (f"{var} == 0",)
            for tiles in group:
                self._tile_nest(plan, tiles, inner, fresh)
            if isinstance(top, For):
                del self._extents[top.symbol]
                self._depth -= 1
                self.line("}")

    def _loop_order_contraction(self, plan: ContractionPlan, group: tuple[TileNest, ...]) -> None:
        """The tiles of a reduction in loop order (the nests of ``group``), its first loop in
        cache blocks of ``plan.block`` steps."""
        it = self.syntax.index_type
        first, first_extent = plan.reductions[0]
        k = self.namer.symbol(first)
        blocked = plan.block is not None
        if blocked:
            self.line(f"for ({it} _{k} = 0; _{k} < {first_extent}; _{k} += {plan.block}) {{")
            self._depth += 1
            if first_extent % plan.block:
                self.line(
                    f"const {it} _end_{k} = _{k} + {plan.block} < {first_extent} ? _{k} + {plan.block} : {first_extent};"
                )
        for tiles in group:
            self._tile_nest(plan, tiles)
        if blocked:
            self._depth -= 1
            self.line("}")

    def _declare_gemm_kernel(self, g: GemmPlan) -> None:
        """Adds the GEMM declarations (once per source) and ``g``'s micro-kernel (once per
        shape) to :attr:`functions`."""
        if not self._gemm_kernels:
            self.functions.append(self.gemm.declarations())
        if g.kernel not in self._gemm_kernels:
            if g.lanes > 1:
                self._declare_vector_type(g.lanes)
            self._gemm_kernels.add(g.kernel)
            self.functions.append(self.gemm.kernel(g.kernel))

    def _helper_params(self, nest: Stmt) -> tuple[list[str], list[str]]:
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
        for node in sorted(nodes, key=lambda n: self.nodes[n]):
            params.append(self.pointer_param(node))
            args.append(self.nodes[node])
        free = [s for s in symbols if isinstance(s, Symbol) and s in self._extents]
        for s in sorted((s for s in symbols if isinstance(s, IndexSymbol)), key=lambda s: s.name):
            params.append(f"{self.syntax.index_type} {self.symbols[s]}")
            args.append(self.symbols[s])
        for s in free:
            params.append(f"{self.syntax.index_type} {self.namer.symbol(s)}")
            args.append(self.namer.symbol(s))
        params.append("int *_status")
        args.append("_status")
        return params, args

    def pointer_param(self, node: TNode) -> str:
        const = "" if node in self.written else "const "
        return f"{const}{self.syntax.storage_type(node.dtype)} *{self.syntax.restrict} {self.nodes[node]}"

    def _tile_nest(self, plan: ContractionPlan, tiles: TileNest, blocks: Stmt | None = None,
                   fresh: tuple[str, ...] | None = None) -> None:
        """One nest of equal tiles (``tiles``, on threads where it says so); ``blocks``: the part
        of ``plan.blocks`` each tile runs, ``fresh`` the conditions under which its first leaf
        adds the cell's first block (:meth:`_tile_blocks`)."""
        it = self.syntax.index_type
        loops: list[str] = []
        env: dict[Symbol, tuple[str | None, int]] = {}
        extents = dict(plan.outer)
        for s, n in plan.parallel:
            if any(s is o for o, _ in plan.outer):
                var = self.namer.symbol(s)
                loops.append(f"for ({it} {var} = 0; {var} < {n}; ++{var}) {{")
        for axis, span in ((plan.rows, tiles.rows), (plan.cols, tiles.cols)):
            if axis is None:
                continue
            s, n = axis
            extents[s] = n
            if span.looped:
                base = f"_{self.namer.symbol(s)}"
                loops.append(f"for ({it} {base} = 0; {base} < {span.stop}; {base} += {span.size}) {{")
                env[s] = (base, 0)
            else:
                env[s] = (None, span.start)
        mr, nr = tiles.rows.size, tiles.cols.size
        pragma = self.syntax.parallel_for(len(loops)) if tiles.parallel else None
        if pragma:
            self.line(pragma)
        for text in loops or ["{"]:
            self.line(text)
            self._depth += 1
        self._extents.update(extents)
        cells = [(r, q) for r in range(mr) for q in range(nr)]

        def cell_env(r: int, q: int) -> dict[Symbol, tuple[str | None, int]]:
            e = dict(env)
            for axis, offset in ((plan.rows, r), (plan.cols, q)):
                if axis is not None:
                    base, start = env[axis[0]]
                    e[axis[0]] = (base, start + offset)
            return e

        lanes = tiles.lanes
        if lanes:
            self._declare_vector_type(lanes)
        if blocks is not None and plan.scope is not None:
            dtype = plan.accumulator_dtype
            first = self.syntax.literal(plan.init.value if plan.init else _zero(dtype), dtype)
            for r, q in cells:
                self.line(f"{self.syntax.compute_type(dtype)} _c{r}_{q} = {first};")
            self._tile_blocks(plan, blocks, cells, cell_env, lanes=lanes)
            out, idx = plan.store.tnode, plan.store.indices
            for r, q in cells:
                self._env = cell_env(r, q)
                self._scope_values[id(plan.scope)] = f"_c{r}_{q}"
                self.line(f"{self.access(out, idx)} = {self.stored(out, plan.store.value)};")
        elif blocks is not None:
            self._tile_blocks(plan, blocks, cells, cell_env, fresh, lanes=lanes)
        else:
            self._tile_loop_order(plan, cells, cell_env, lanes)
        self._scope_values.clear()
        self._env = {}
        for s in extents:
            self._extents.pop(s, None)
        for _ in loops or ["{"]:
            self._depth -= 1
            self.line("}")

    def _tile_loop_order(self, plan: ContractionPlan, cells: list[tuple[int, int]], cell_env: Callable,
                         lanes: int | None = None) -> None:
        """A tile's cells accumulated in registers from their first value, in loop order (in
        vectors of ``lanes`` cells of a row when set, ``cpu_schedule.tile_lanes``)."""
        it = self.syntax.index_type
        out, idx = plan.store.tnode, plan.store.indices
        acc_dtype = plan.accumulator_dtype
        ctype = self.syntax.compute_type(acc_dtype)

        def acc(r: int, q: int) -> str:
            return f"_c{r}_{q}"

        fresh = None  # the condition under which the cells hold no value yet ("": always)
        if plan.scope is None and plan.reset is not None:
            fresh = "" if plan.block is None else f"_{self.namer.symbol(plan.reductions[0][0])} == 0"
        for r, q in cells:
            self._env = cell_env(r, q)
            if plan.scope is not None:
                first = self.syntax.literal(plan.init.value if plan.init else _zero(acc_dtype), acc_dtype)
            else:
                first = self.cell_start(plan, fresh)
            self.line(f"{ctype} {acc(r, q)} = {first};")
        if lanes:
            rows, nv = _vector_shape(cells, lanes)
            for r in range(rows):
                for v in range(nv):
                    firsts = ", ".join(acc(r, v * lanes + lane) for lane in range(lanes))
                    self.line(f"{self.gemm.vector_type(lanes)} _vc{r}_{v} = {{{firsts}}};")
        depth_before = self._depth
        for n_loop, (s, n) in enumerate(plan.reductions):
            var = self.namer.symbol(s)
            self._extents[s] = n
            if n_loop == 0 and plan.block is not None:
                end = f"_end_{var}" if n % plan.block else f"_{var} + {plan.block}"
                self.line(f"for ({it} {var} = _{var}; {var} < {end}; ++{var}) {{")
            else:
                self.line(f"for ({it} {var} = 0; {var} < {n}; ++{var}) {{")
            self._depth += 1
        if lanes:
            self._vector_step(plan, plan.term, lambda r, v: f"_vc{r}_{v}", cells, cell_env, lanes)
        else:
            for r, q in cells:
                self._env = cell_env(r, q)
                term = self.expr(plan.term)
                value = self.syntax.binary(plan.op, acc_dtype, acc(r, q), term, branchless=self._branchless)
                if plan.scope is None and out.dtype.compute is not out.dtype:  # each step rounds, as a store
                    value = self.syntax.from_storage(out.dtype, self.syntax.to_storage(out.dtype, value))
                self.line(f"{acc(r, q)} = {value};")
        while self._depth > depth_before:
            self._depth -= 1
            self.line("}")
        if lanes:
            for r, q in cells:
                self.line(f"{acc(r, q)} = _vc{r}_{q // lanes}[{q % lanes}];")
        for s, _ in plan.reductions:
            del self._extents[s]
        for r, q in cells:
            self._env = cell_env(r, q)
            if plan.scope is not None:
                self._scope_values[id(plan.scope)] = acc(r, q)
                self.line(f"{self.access(out, idx)} = {self.stored(out, plan.store.value)};")
            else:
                self.line(f"{self.access(out, idx)} = {self.syntax.to_storage(out.dtype, acc(r, q))};")

    def _tile_blocks(self, plan: ContractionPlan, blocks: Stmt, cells: list[tuple[int, int]], cell_env: Callable,
                     fresh: tuple[str, ...] | None = None, lanes: int | None = None) -> None:
        """A tile's part of a reduction in blocks: loops as loops; at each leaf, every cell sums
        its block from zero in a register, then adds the block sum to the cell. ``fresh``: the
        conditions (all true) under which the leaf adds the cell's first block, which then
        starts from the reset value rather than from the cell (``None``: never)."""
        match blocks:
            case Seq(stmts=stmts):
                for n_stmt, x in enumerate(stmts):
                    self._tile_blocks(plan, x, cells, cell_env, fresh if n_stmt == 0 else None, lanes)
                return
            case For(symbol=symbol, extent=n, body=body):
                inner = None if fresh is None else (*fresh, f"{self.namer.symbol(symbol)} == 0")
                self._block_loop(symbol, n, lambda: self._tile_blocks(plan, body, cells, cell_env, inner, lanes))
                return
        block = blocks.value.b  # a leaf: the cell or the tile's accumulator += a block sum
        self.line("{")
        with self.indented():
            self._tile_leaf(plan, block, cells, cell_env, fresh, lanes)
        self.line("}")

    def _tile_leaf(self, plan: ContractionPlan, block: LocalScope, cells: list[tuple[int, int]], cell_env: Callable,
                   fresh: tuple[str, ...] | None, lanes: int | None) -> None:
        """A leaf of :meth:`_tile_blocks`: each cell's block ``block`` summed from zero, then added
        to the cell (or to the tile's accumulator of an inlined reduction)."""
        out, idx, dtype = plan.store.tnode, plan.store.indices, block.local.dtype
        for r, q in cells:  # the cell is read before the block's loop: C compilers vectorize that
            self._env = cell_env(r, q)
            start = f"_c{r}_{q}" if plan.scope is not None else self.cell_start(plan, None if fresh is None else " && ".join(fresh))
            self.line(f"{self.syntax.compute_type(dtype)} _d{r}_{q} = {start};")
        self._env = {}
        if lanes:
            self._tile_block_sum_vector(plan, block, cells, cell_env, lanes)
        else:
            self._tile_block_sum(block, cells, cell_env, 0)
        for r, q in cells:
            self._env = cell_env(r, q)
            total = self.syntax.binary(Binop.ADD, dtype, f"_d{r}_{q}", f"_b0_{r}_{q}")
            if plan.scope is not None:
                self.line(f"_c{r}_{q} = {total};")
            else:
                self.line(f"{self.access(out, idx)} = {self.syntax.to_storage(out.dtype, total)};")
        self._env = {}

    def reset_value(self, plan: ContractionPlan) -> str:
        """The reset constant as the cell would read it back after storing it (rounded to the
        node's storage where that is narrower)."""
        out = plan.store.tnode
        return self.syntax.from_storage(out.dtype, self.stored(out, plan.reset))

    def cell_start(self, plan: ContractionPlan, fresh: str | None) -> str:
        """A cell's value where its sum reads it (at the current ``_env``): the reset value when
        ``fresh`` (a condition; ``""``: always) holds, the cell otherwise."""
        out, idx = plan.store.tnode, plan.store.indices
        cell = self.syntax.from_storage(out.dtype, self.access(out, idx))
        if fresh is None or plan.reset is None:
            return cell
        return self.reset_value(plan) if not fresh else f"({fresh} ? {self.reset_value(plan)} : {cell})"

    def _tile_block_sum(self, block: LocalScope, cells: list[tuple[int, int]], cell_env: Callable, level: int) -> None:
        """Each cell's sum of ``block`` from zero in the register ``_b<level>_<r>_<q>``: its loops
        as loops, its terms added in order, the sums of its own blocks (one level up) added as
        each is done."""
        dtype = block.local.dtype
        zero = self.syntax.literal(_zero(dtype), dtype)
        for r, q in cells:
            self.line(f"{self.syntax.compute_type(dtype)} _b{level}_{r}_{q} = {zero};")

        def walk(stmt: Stmt) -> None:
            match stmt:
                case Seq(stmts=stmts):
                    for x in stmts:
                        walk(x)
                case For(symbol=symbol, extent=n, body=body):
                    self._block_loop(symbol, n, lambda: walk(body))
                case SetLocal(value=Binary(b=LocalScope() as inner)):
                    self.line("{")
                    with self.indented():
                        self._tile_block_sum(inner, cells, cell_env, level + 1)
                        for r, q in cells:
                            total = self.syntax.binary(Binop.ADD, dtype, f"_b{level}_{r}_{q}", f"_b{level + 1}_{r}_{q}")
                            self.line(f"_b{level}_{r}_{q} = {total};")
                    self.line("}")
                case SetLocal(value=Binary(op=op, b=term)):
                    for r, q in cells:
                        self._env = cell_env(r, q)
                        step = self.syntax.binary(op, dtype, f"_b{level}_{r}_{q}", self.expr(term), branchless=self._branchless)
                        self.line(f"_b{level}_{r}_{q} = {step};")
                    self._env = {}

        walk(block.body)

    def _block_loop(self, symbol: Symbol, extent: int, body: Callable[[], None]) -> None:
        """A loop of a block's sum around what ``body`` prints, its extent known inside."""
        var = self.namer.symbol(symbol)
        self.line(f"for ({self.syntax.index_type} {var} = 0; {var} < {extent}; ++{var}) {{")
        with self.indented(), self.known_extents({symbol: extent}):
            body()
        self.line("}")

    def _tile_block_sum_vector(self, plan: ContractionPlan, block: LocalScope, cells: list[tuple[int, int]],
                               cell_env: Callable, lanes: int) -> None:
        """:meth:`_tile_block_sum` in vectors of ``lanes`` cells of a row (``cpu_schedule.tile_lanes``):
        the same sums lane by lane, each block of blocks summed from zero and added as it is
        done; the block's sums are then the scalars ``_b0_<r>_<q>`` the caller adds to the cells."""
        rows, nv = _vector_shape(cells, lanes)
        vector = self.gemm.vector_type(lanes)

        def declare(level: int) -> None:
            for r in range(rows):
                for v in range(nv):
                    self.line(f"{vector} _vb{level}_{r}_{v} = {{0}};")

        def walk(stmt: Stmt, level: int) -> None:
            match stmt:
                case Seq(stmts=stmts):
                    for x in stmts:
                        walk(x, level)
                case For(symbol=symbol, extent=n, body=body):
                    self._block_loop(symbol, n, lambda: walk(body, level))
                case SetLocal(value=Binary(b=LocalScope() as inner)):
                    self.line("{")
                    with self.indented():
                        declare(level + 1)
                        walk(inner.body, level + 1)
                        for r in range(rows):
                            for v in range(nv):
                                self.line(f"_vb{level}_{r}_{v} = _vb{level}_{r}_{v} + _vb{level + 1}_{r}_{v};")
                    self.line("}")
                case SetLocal(value=Binary(b=term)):
                    self._vector_step(plan, term, lambda r, v: f"_vb{level}_{r}_{v}", cells, cell_env, lanes)

        declare(0)
        walk(block.body, 0)
        dtype = self.syntax.compute_type(block.local.dtype)
        for r, q in cells:
            self.line(f"{dtype} _b0_{r}_{q} = _vb0_{r}_{q // lanes}[{q % lanes}];")

    def _vector_step(self, plan: ContractionPlan, term: Expr, acc: Callable[[int, int], str],
                     cells: list[tuple[int, int]], cell_env: Callable, lanes: int) -> None:
        """One step of a vector tile (``cpu_schedule.tile_lanes``): each row's accumulators
        ``acc(r, v)`` (vector ``v`` of the row) add the row's term."""
        row = plan.rows[0] if plan.rows is not None else None
        test, x, y, x_first, other = vector_factors(term, row, plan.cols[0])
        vector = self.gemm.vector_type(lanes)
        rows, nv = _vector_shape(cells, lanes)
        for v in range(nv):
            self.line(f"const {vector} _y{v} = {self._vector_load(y, plan.cols[0], v * lanes, lanes, cell_env)};")
        for r in range(rows):
            self._env = cell_env(r, 0)
            factor = self.expr(x)
            condition = None
            if test is not None:
                zero = self.syntax.literal(_zero(test.dtype), test.dtype)
                condition = f"({self.expr(test)} != {zero})"
            for v in range(nv):
                value = f"{factor} * _y{v}" if x_first else f"_y{v} * {factor}"
                if condition is not None:
                    k = self.syntax.literal(other, dtypes.float32)
                    value = f"({condition} ? {value} : ({vector}){{{', '.join([k] * lanes)}}})"
                self.line(f"{acc(r, v)} = {acc(r, v)} + {value};")
        self._env = {}

    def _vector_load(self, y: Load, col: Symbol, q0: int, lanes: int, cell_env: Callable) -> str:
        """The vector of ``y`` at the columns ``q0 ..< q0 + lanes`` of the tile: one load where
        the columns are adjacent in memory and no bounds test depends on them, else the lanes
        one by one."""
        self._env = cell_env(0, q0)
        strides = row_major_strides(y.tnode.dims)
        col_stride = sum(stride * c for idx, stride in zip(y.indices, strides)
                         for c, s in affine_form(idx)[0] if s is col)
        tested_cols = any(col in index_symbols(idx) and not provably_within(idx, d, self._extents)
                          for idx, d in zip(y.indices, y.tnode.dims))
        vector = self.gemm.vector_type(lanes)
        if col_stride == 1 and not tested_cols:
            address = self.access(y.tnode, y.indices, unchecked=y.oob_value is not None)
            load = f"*(const {self.gemm.vector_type(lanes, aligned=False)} *)&{address}"
            conditions = self.bounds_conditions(y.tnode, y.indices) if y.oob_value is not None else ""
            if conditions:
                outside = self.syntax.literal(y.oob_value, dtypes.float32)
                load = f"(({conditions}) ? {load} : ({vector}){{{', '.join([outside] * lanes)}}})"
            return load
        values = []
        for lane in range(lanes):
            self._env = cell_env(0, q0 + lane)
            values.append(self.expr(y))
        return f"({vector}){{{', '.join(values)}}}"

    def _declare_vector_type(self, lanes: int) -> None:
        """Declares the vector types of ``lanes`` floats (:attr:`types`), once."""
        if lanes not in self._vector_lanes:
            self._vector_lanes.add(lanes)
            self.types.append(self.gemm.vector_types(lanes))

    # -- expressions -----------------------------------------------------------------------------

    def stored(self, node: TNode, value: Expr) -> str:
        return self.syntax.to_storage(node.dtype, self.expr(value))

    def expr(self, e: Expr) -> str:
        syn = self.syntax
        match e:
            case Const(value=value, dtype=dtype):
                return syn.literal(value, dtype)
            case Load(tnode=node, indices=indices, oob_value=None):
                return syn.from_storage(node.dtype, self.access(node, indices))
            case Load(tnode=node, indices=indices, oob_value=oob):
                conditions = self.bounds_conditions(node, indices)
                cell = syn.from_storage(node.dtype, self.access(node, indices, unchecked=True))
                if not conditions:
                    return cell
                outside = syn.literal(oob, node.dtype.compute)
                return f"(({conditions}) ? {cell} : {outside})"
            case LoadDynamic(tnode=node, axis=axis, position=position, indices=indices):
                return syn.from_storage(node.dtype, self.access(node, indices, dynamic=(axis, position)))
            case Unary(op=op, x=x):
                return syn.unary(op, e.dtype, self.expr(x), branchless=self._branchless)
            case Binary(op=op, a=a, b=b):
                left, right = self.expr(a), self.expr(b)
                if op in (Binop.DIV, Binop.MOD) and not e.dtype.is_float:
                    where = format_stmt(self._statement, self.namer) if self._statement else "?"
                    site = self.site("division", f"integer {op.value} by zero in `{where}`")
                    return syn.int_division(op, e.dtype, left, right, site)
                return syn.binary(op, e.dtype, left, right, branchless=self._branchless)
            case Ternary(op=Ternop.WHERE, a=a, b=b, c=c):
                return self.where(a, b, c)
            case Ternary(op=op, a=a, b=b, c=c):
                return syn.ternary(op, e.dtype, self.expr(a), self.expr(b), self.expr(c))
            case Cast(x=x, dtype=dtype):
                return syn.cast(self.expr(x), x.dtype, dtype)
            case EmbedIndex(index=index, dtype=dtype):
                return syn.cast(self.axis_value(index), syn.index_dtype, dtype)
            case GetLocal(local=local):
                return self.namer.local(local)
            case LocalScope() if id(e) in self._scope_values:
                return self._scope_values[id(e)]
            case LocalScope(local=local, body=body):
                self.declare(local)
                self._in_scope += 1
                statement = self._statement
                self.stmt(body)
                self._statement = statement
                self._in_scope -= 1
                return self.namer.local(local)
        raise TypeError(f"not a loop IR expression: {e!r}")

    def bounds_conditions(self, node: TNode, indices: tuple[AxisIndex, ...]) -> str:
        """The test that ``indices`` are inside ``node`` (only the axes not provably so), or ``""``."""
        return " && ".join(
            f"{i} >= 0 && {i} < {d}"
            for idx, d in zip(indices, node.dims)
            if not provably_within(idx, d, self._extents)
            for i in [self.axis_value(idx)]
        )

    def where(self, cond: Expr, then: Expr, other: Expr) -> str:
        """``where`` evaluates only the chosen branch: a conditional expression, or an ``if``
        when a branch needs statements first."""
        c = self.expr(cond)
        zero = self.syntax.literal(_zero(cond.dtype), cond.dtype)
        test = f"{c} != {zero}"
        branches = []
        for branch in (then, other):
            with self._printing_apart({}, self._depth + 1) as out:
                text = self.expr(branch)
            branches.append((out.lines, text))
        if not branches[0][0] and not branches[1][0]:
            if (then.dtype.is_float and _reads_memory(cond)
                    and self._speculable(then) and self._speculable(other)):
                # A test on data is a branch the processor cannot predict: where both values are
                # safe to compute, a select instead (a test on loop indices alone stays a
                # branch, predictable and often hoisted out of the inner loop by the compiler).
                return self.syntax.select(then.dtype, test, branches[0][1], branches[1][1])
            return self.syntax.where(test, branches[0][1], branches[1][1])
        temp = f"_w{self._temps}"
        self._temps += 1
        self.line(f"{self.syntax.compute_type(then.dtype)} {temp};")
        for k, (lines, text) in enumerate(branches):
            self.line(f"if ({test}) {{" if k == 0 else "} else {")
            self._out.lines.extend(lines)
            self.line(f"  {temp} = {text};")
        self.line("}")
        return temp

    def _speculable(self, e: Expr) -> bool:
        """Whether computing ``e`` where the interpreter would not can change nothing: no
        statements, no checked index (it records an error), no integer division (a zero divisor
        is an error), no conversion of a float to an integer (undefined out of range in C), and
        every read provably inside its buffer (a read with its own bounds test is a branch
        already)."""
        match e:
            case Const() | GetLocal() | EmbedIndex():
                return True
            case Load(tnode=node, indices=indices):
                return all(isinstance(i, (Fixed, Iter, Affine)) and provably_within(i, d, self._extents)
                           for i, d in zip(indices, node.dims))
            case Unary(x=x):
                return x.dtype.is_float == e.dtype.is_float and self._speculable(x)
            case Binary(op=op, a=a, b=b):
                if op in (Binop.DIV, Binop.MOD) and not e.dtype.is_float:
                    return False
                return self._speculable(a) and self._speculable(b)
            case Ternary(a=a, b=b, c=c):
                return self._speculable(a) and self._speculable(b) and self._speculable(c)
            case Cast(x=x, dtype=dtype):
                return (dtype.is_float or not x.dtype.is_float) and self._speculable(x)
        return False

    # -- indices ---------------------------------------------------------------------------------

    def symbol_text(self, s: AnySymbol) -> tuple[str | None, int]:
        if isinstance(s, IndexSymbol):
            return self.symbols[s], 0
        return self._env.get(s, (self.namer.symbol(s), 0))

    def linear(self, terms: Iterable[tuple[int, AnySymbol]], constant: int) -> str:
        """``sum(c * symbol) + constant`` printed with the current symbol texts."""
        coefficients: dict[str, int] = {}
        for c, s in terms:
            base, offset = self.symbol_text(s)
            constant += c * offset
            if base is not None:
                coefficients[base] = coefficients.get(base, 0) + c
        parts = []
        for base, c in coefficients.items():
            if c == 0:
                continue
            term = base if abs(c) == 1 else f"{abs(c)}*{base}"
            parts.append(("-" if c < 0 else "+", term))
        if constant:
            parts.append(("-" if constant < 0 else "+", str(abs(constant))))
        if not parts:
            return "0"
        text = ("-" if parts[0][0] == "-" else "") + parts[0][1]
        for sign, term in parts[1:]:
            text += f" {sign} {term}"
        return text

    def axis_value(self, idx: AxisIndex) -> str:
        """The value of one axis index, parenthesized unless it is a single name or number."""
        if isinstance(idx, Fixed):
            return self.linear((), idx.index)
        text = self.linear(*affine_form(idx))
        return text if text.replace("_", "a").isalnum() else f"({text})"

    def access(
        self,
        node: TNode,
        indices: tuple[AxisIndex, ...],
        *,
        dynamic: tuple[int, Expr] | None = None,
        unchecked: bool = False,
    ) -> str:
        """``name[offset]``: the row-major offset of ``indices`` (with the dynamic axis and its
        position expression inserted), each axis not provably in bounds checked."""
        axes: list[AxisIndex | Expr] = list(indices)
        if dynamic is not None:
            axes.insert(dynamic[0], dynamic[1])
        dims = node.dims
        strides = row_major_strides(dims)
        terms: list[tuple[int, AnySymbol]] = []
        constant = 0
        checked: list[str] = []
        where = None
        for axis, d, stride in zip(axes, dims, strides):
            if not isinstance(axis, (Fixed, Iter, Affine)):
                position = self.expr(axis)
                where = where or (format_stmt(self._statement, self.namer) if self._statement else "?")
                site = self.site("index", f"a dynamic index into {node.debug_name} (dims {dims}) is out of bounds in `{where}`")
                checked.append(_scaled(stride, self.syntax.checked_index(position, d, site)))
            elif unchecked or provably_within(axis, d, self._extents):
                axis_terms, axis_offset = affine_form(axis)
                terms.extend((stride * c, s) for c, s in axis_terms)
                constant += stride * axis_offset
            else:
                where = where or (format_stmt(self._statement, self.namer) if self._statement else "?")
                site = self.site("index", f"an index into {node.debug_name} (dims {dims}) is out of bounds in `{where}`")
                checked.append(_scaled(stride, self.syntax.checked_index(self.axis_value(axis), d, site)))
        offset = self.linear(terms, constant)
        if checked:
            offset = " + ".join(([] if offset == "0" else [offset]) + checked)
        return f"{self.nodes[node]}[{offset}]"


def _vector_shape(cells: list[tuple[int, int]], lanes: int) -> tuple[int, int]:
    """The rows of a tile's ``cells`` and the vectors of ``lanes`` cells in each row."""
    return max(r for r, _ in cells) + 1, max(q for _, q in cells) // lanes + 1


def _reads_memory(e: Expr) -> bool:
    """Whether ``e`` reads a buffer or a local (its value depends on data, not only on the
    loop indices)."""
    return any(isinstance(x, (Load, LoadDynamic, GetLocal, LocalScope)) for x in iter_exprs(e))


def _scaled(stride: int, text: str) -> str:
    return text if stride == 1 else f"{stride}*{text}"


def _zero(dtype: DType) -> float | int | tuple[int, int, int, int]:
    if dtype is dtypes.uint4x32:
        return (0, 0, 0, 0)
    return 0.0 if dtype.is_float else 0
