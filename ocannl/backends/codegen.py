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
  (:meth:`Emitter.for_loop`). A language with a :class:`ContractionTarget` (C,
  ``ocannl/backends/c/target.py``) prints the plan's contractions as register tiles
  (``c/tile_printer.py``) or packed GEMMs (``c/gemm_printer.py``, docs/codegen.md "Packed
  GEMM"); a language without one prints every nest as its loops.
* **Walk state** (where lines go, their depth, the declared locals, what the loop symbols print
  as and are known to stay below) is an immutable :class:`Scope`, entered for a block and left
  with it (:meth:`Emitter.entering`), never attributes saved and restored by hand.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
import abc
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Protocol

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import affine_form, provably_within, row_major_strides
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.identifiers import Namespace, comment_text
from ocannl.lowlevel.indexing import Affine, AnySymbol, AxisIndex, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local,
    LocalScope, Namer, RoutineIR, Seq, SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary,
    format_stmt, iter_exprs, number_names,
)
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.cpu_schedule import NestPlan, plan_loop, plan_nest
from ocannl.lowlevel.tnode import TNode

PART_STATEMENTS = 32
"""Top-level statements per part of a long routine (C: ``CTarget.body``, ``ocannl/backends/c/target.py``; Metal: per kernel): enough that the parts'
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

    def parallel_for(self, collapse: int, simd: bool = False) -> str | None:
        """The line put before a parallel loop (``None``: the language has no such loops);
        ``simd``: it asks for a vector loop too (:meth:`simd_loop`)."""
        return None

    def simd_loop(self) -> str | None:
        """The line put before a loop whose iterations are independent, asking the compiler for a
        vector loop (``NestPlan.simd``; ``None``: the language has no such request)."""
        return None


class ContractionTarget(Protocol):
    """What a language that prints contractions by their plan gives the walk (C:
    ``ocannl/backends/c/target.py``, register tiles and packed GEMMs): the width of its vector
    registers for the plan (``None``: it runs no packed GEMMs) and the printer of a contraction.
    A walk without one prints every nest as its loops."""

    vector_bytes: int | None

    def contraction(self, emitter: Emitter, nest: NestPlan) -> None:
        """Prints the contraction of ``nest`` (:attr:`~NestPlan.contraction` set) through ``emitter``."""


@dataclass(frozen=True)
class Site:
    """A runtime check of the generated code: ``kind`` is ``"index"``, ``"division"`` or
    ``"memory"`` (working memory the code could not allocate)."""

    kind: str
    message: str


# ---------------------------------------------------------------------------------------------
# The walk


@dataclass(frozen=True)
class Scope:
    """Where the walk prints and what it knows there, as Triton's ``Region`` does: a block, a
    loop, a tile or a helper function enters a scope of its own (:meth:`Emitter.entering`), and the
    one around it is back when it ends.

    ``out``: the printed lines, each already indented ``depth`` levels; ``declared``: the locals
    the enclosing block declares (a block copies it, so that its declarations end with it; these
    two are the block's own, added to as it prints);
    ``env``: loop symbols printed as ``(base, offset)``, ``base + offset`` (a tile's cell, a
    packed GEMM's flat index digits); ``extents``: loop symbols known to stay below these (bounds
    proofs); ``in_parallel``: inside a parallel loop; ``in_scope``: inside a local scope's
    statements; ``branchless``: :attr:`~NestPlan.branchless` of the nest printed or of one around
    it; ``scope_values``: local scopes whose value is already computed, by ``id``, and its text;
    ``statement``: the statement runtime check messages name."""

    out: list[str] = field(default_factory=list)
    depth: int = 1
    declared: set[Local] = field(default_factory=set)
    env: Mapping[Symbol, tuple[str | None, int]] = field(default_factory=dict)
    extents: Mapping[Symbol, int] = field(default_factory=dict)
    in_parallel: bool = False
    in_scope: bool = False
    branchless: bool = False
    scope_values: Mapping[int, str] = field(default_factory=dict)
    statement: Stmt | None = None

    def replace(self, **changes: object) -> Scope:
        """This scope with ``changes``, as :func:`dataclasses.replace` gives it at a fraction of
        its cost (the walk enters a scope per statement and per tile cell)."""
        unknown = changes.keys() - self.__dict__.keys()
        if unknown:
            raise TypeError(f"Scope has no field {', '.join(sorted(unknown))}")
        scope = object.__new__(Scope)
        scope.__dict__.update(self.__dict__)
        scope.__dict__.update(changes)
        return scope


class _Entering:
    """The context of :meth:`Emitter.entering`: a class rather than a generator, since the walk
    enters a scope per statement and per tile cell, and a generator's context costs several
    times more."""

    __slots__ = ("emitter", "scope", "outer")

    def __init__(self, emitter: Emitter, scope: Scope):
        self.emitter, self.scope = emitter, scope

    def __enter__(self) -> Scope:
        self.outer, self.emitter.scope = self.emitter.scope, self.scope
        return self.scope

    def __exit__(self, *exc: object) -> None:
        self.emitter.scope = self.outer


class Emitter:
    """Prints one routine's statements through a :class:`Syntax` table.

    :attr:`sites` lists the runtime checks (site ``k`` is reported as ``k + 1``), and
    :attr:`nodes`/:attr:`symbols` the buffers and index symbols the routine takes, each with its
    printed name. A language prints the routine's body through the walk (C:
    ``ocannl/backends/c/target.py``) or each kernel's statements (:meth:`statement_lines`).
    """

    def __init__(
        self,
        syntax: Syntax,
        routine: RoutineIR,
        *,
        function_name: str = "routine",
        reserved: Iterable[str] = (),
        parallel: bool = True,
        target: ContractionTarget | None = None,
    ):
        """``function_name``: the routine's function, also the prefix of its helper functions'
        names; ``reserved``: other identifiers node names must avoid; ``parallel``: the
        language's parallel loops may run on threads; ``target``: the printer of contractions
        (without one, contractions print as their loops)."""
        self.syntax = syntax
        self.function_name = function_name
        self.routine = routine
        self.parallel = parallel
        self.target = target
        self.namer = Namer()
        number_names(routine.body, self.namer)  # loops and locals numbered exactly as in the .ll file
        # Node names are already reserved nowhere; this scope adds the function, its tile
        # helpers and the caller's names, and separates nodes that share a name (nodes made in
        # two sessions).
        helpers = [f"{function_name}_{kind}" for kind in ("tile", "nest", "part")]
        names = Namespace({*reserved, function_name}, prefixes=helpers)
        self.nodes: dict[TNode, str] = {
            node: names.claim(node.name, node.id)
            for node in sorted(set(routine.reads + routine.writes), key=lambda n: (n.name, n.id))
        }
        self.written = set(routine.writes)
        symbol_names = Namespace()
        self.symbols: dict[IndexSymbol, str] = {
            s: f"_s_{symbol_names.claim(s.identifier)}"
            for s in sorted(routine.static_symbols, key=lambda s: s.name)
        }
        self.sites: list[Site] = []
        self.scope = Scope()
        self._temps = 0

    # -- output ----------------------------------------------------------------------------------

    def line(self, text: str, indent: bool = True) -> None:
        """Prints ``text`` at the current depth (``indent=False``: in the first column, as a
        preprocessor line must be)."""
        self.scope.out.append("  " * self.scope.depth + text if indent else text)

    def entering(self, scope: Scope) -> AbstractContextManager[Scope]:
        """Inside, the walk prints in ``scope``; the current scope is back after."""
        return _Entering(self, scope)

    def indented(self) -> AbstractContextManager[Scope]:
        """Lines printed inside are one level deeper."""
        return self.entering(self.scope.replace(depth=self.scope.depth + 1))

    def symbol_texts(self, texts: Mapping[Symbol, tuple[str | None, int]]) -> AbstractContextManager[Scope]:
        """Inside, each loop symbol of ``texts`` prints as ``(base, offset)``: ``base + offset``
        (a tile's cell, a packed GEMM's flat index digits)."""
        return self.entering(self.scope.replace(env=dict(texts)))

    def known_extents(self, extents: Mapping[Symbol, int]) -> AbstractContextManager[Scope]:
        """Inside, the loop symbols of ``extents`` are known to stay below them (bounds proofs)."""
        return self.entering(self.scope.replace(extents={**self.scope.extents, **extents}))

    def scope_value(self, scope: LocalScope, text: str) -> AbstractContextManager[Scope]:
        """Inside, the local scope ``scope`` prints as ``text`` (its value already computed)."""
        return self.entering(self.scope.replace(scope_values={**self.scope.scope_values, id(scope): text}))

    def statement_lines(self, stmt: Stmt, bound: Mapping[Symbol, int], depth: int = 1) -> list[str]:
        """The lines of ``stmt`` alone, indented ``depth`` levels. ``bound`` maps loop symbols
        the caller declares itself (a GPU thread's grid point) to their extents, which let the
        walk prove accesses in bounds. Kernel languages (the MSL emitter) print each kernel's
        statements this way."""
        with self._printing_apart(bound, depth) as scope:
            self.stmt(stmt)
        return scope.out

    def expression_lines(
        self, e: Expr, bound: Mapping[Symbol, int], depth: int = 1, statement: Stmt | None = None
    ) -> tuple[list[str], str]:
        """``e`` printed with the loop symbols ``bound`` as in :meth:`statement_lines`, and the
        lines that must run before it (the local scopes it holds); ``statement`` is the one
        runtime check messages name."""
        with self._printing_apart(bound, depth, statement=statement) as scope:
            text = self.expr(e)
        return scope.out, text

    def _printing_apart(self, bound: Mapping[Symbol, int], depth: int, **changes: object) -> AbstractContextManager[Scope]:
        """Inside, lines go to a list of their own, from ``depth`` on, the loop symbols ``bound``
        known to stay below their extents."""
        return self.entering(self.scope.replace(out=[], depth=depth, extents={**self.scope.extents, **bound}, **changes))

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
            case DeclareLocal(local=local):
                self.declare(local)
            case Store() | StoreDynamic() | Fill() | SetLocal():
                with self.entering(self.scope.replace(statement=s)):
                    self._assignment(s)
            case _:
                raise TypeError(f"not a loop IR statement: {s!r}")

    def _assignment(self, s: Store | StoreDynamic | Fill | SetLocal) -> None:
        """A statement that writes a cell, a buffer or a local (the current scope's ``statement``)."""
        match s:
            case Store(tnode=node, indices=indices, value=value, skip_oob=True):
                conditions = self.bounds_conditions(node, indices)
                if not conditions:
                    self.stmt(Store(node, indices, value))
                    return
                self.line(f"if ({conditions}) {{  /* a store into the margin does nothing */")
                with self.indented():
                    self.with_prelude(lambda: f"{self.access(node, indices, unchecked=True)} = {self.stored(node, value)};")
                self.line("}")
            case Store(tnode=node, indices=indices, value=value):
                self.with_prelude(lambda: f"{self.access(node, indices)} = {self.stored(node, value)};")
            case StoreDynamic(tnode=node, axis=axis, position=position, indices=indices, value=value):

                def text() -> str:
                    cell = self.access(node, indices, dynamic=(axis, position))
                    return f"{cell} = {self.stored(node, value)};"

                self.with_prelude(text)
            case Fill(tnode=node, value=value):
                stored = self.stored(node, value)
                if node.size == 1:
                    self.line(f"{self.nodes[node]}[0] = {stored};")
                else:
                    it = self.syntax.index_type
                    self.line(f"for ({it} _n = 0; _n < {node.size}; ++_n) {self.nodes[node]}[_n] = {stored};")
            case SetLocal(local=local, value=value):
                self.with_prelude(lambda: f"{self.namer.local(local)} = {self.expr(value)};")

    def declare(self, local: Local) -> None:
        name = self.namer.local(local)
        zero = self.syntax.literal(zero_value(local.dtype), local.dtype)
        if local in self.scope.declared:
            self.line(f"{name} = {zero};")
        else:
            self.scope.declared.add(local)
            self.line(f"{self.syntax.compute_type(local.dtype)} {name} = {zero};")

    def with_prelude(self, build: Callable[[], str]) -> None:
        """Prints the statement ``build()`` returns, preceded (inside a block) by the lines its
        expressions need first (local scopes, branches of a where holding them)."""
        scope = self.scope
        with self.entering(scope.replace(out=[], depth=scope.depth + 1, declared=set(scope.declared))) as block:
            text = build()
        if not block.out:
            self.line(text)
            return
        self.line("{")
        scope.out.extend(block.out)
        with self.indented():
            self.line(text)
        self.line("}")

    def for_loop(self, loop: For) -> None:
        """Prints ``loop`` as its :class:`~ocannl.lowlevel.cpu_schedule.NestPlan` says (inside
        a local scope or a tile: as it is, :func:`~ocannl.lowlevel.cpu_schedule.plan_loop`)."""
        scope = self.scope
        threads = self.parallel and not scope.in_parallel and not scope.in_scope
        if scope.in_scope or scope.env:
            self._loop(plan_loop(loop, threads))
            return
        vector_bytes = self.target.vector_bytes if self.target is not None else None
        self.nest(plan_nest(loop, vector_bytes, threads, tiles=self.target is not None,
                            in_parallel=scope.in_parallel))

    def nest(self, plan: NestPlan) -> None:
        """Prints a nest the walk reaches outside local scopes and tiles as ``plan`` says: its
        contraction through :attr:`target`, else its loop."""
        with self.entering(self.scope.replace(branchless=self.scope.branchless or plan.branchless)):
            if plan.contraction is not None:
                self.target.contraction(self, plan)
            else:
                self._loop(plan)

    def _loop(self, plan: NestPlan) -> None:
        """Prints ``plan.nest``'s loop, with the parallel pragma where the plan runs it on threads."""
        loop, scope = plan.nest, self.scope
        pragma = self.syntax.parallel_for(1, simd=plan.simd) if plan.parallel else None
        # OpenMP's pragmas are read only where the parallel ones are
        simd = self.syntax.simd_loop() if plan.simd and self.parallel and not pragma else None
        for line in (pragma, simd):
            if line:
                self.line(line)
        var = self.namer.symbol(loop.symbol)
        it = self.syntax.index_type
        self.line(f"for ({it} {var} = 0; {var} < {loop.extent}; ++{var}) {{")
        body = scope.replace(depth=scope.depth + 1, declared=set(scope.declared),
                             extents={**scope.extents, loop.symbol: loop.extent},
                             in_parallel=scope.in_parallel or bool(pragma))
        with self.entering(body):
            self.stmt(loop.body)
        self.line("}")

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
                return syn.unary(op, e.dtype, self.expr(x), branchless=self.scope.branchless)
            case Binary(op=op, a=a, b=b):
                left, right = self.expr(a), self.expr(b)
                if op in (Binop.DIV, Binop.MOD) and not e.dtype.is_float:
                    where = format_stmt(self.scope.statement, self.namer) if self.scope.statement else "?"
                    site = self.site("division", f"integer {op.value} by zero in `{where}`")
                    return syn.int_division(op, e.dtype, left, right, site)
                return syn.binary(op, e.dtype, left, right, branchless=self.scope.branchless)
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
            case LocalScope() if id(e) in self.scope.scope_values:
                return self.scope.scope_values[id(e)]
            case LocalScope(local=local, body=body):
                self.declare(local)
                with self.entering(self.scope.replace(in_scope=True)):
                    self.stmt(body)
                return self.namer.local(local)
        raise TypeError(f"not a loop IR expression: {e!r}")

    def bounds_conditions(self, node: TNode, indices: tuple[AxisIndex, ...]) -> str:
        """The test that ``indices`` are inside ``node`` (only the axes not provably so), or ``""``."""
        return " && ".join(
            f"{i} >= 0 && {i} < {d}"
            for idx, d in zip(indices, node.dims)
            if not provably_within(idx, d, self.scope.extents)
            for i in [self.axis_value(idx)]
        )

    def where(self, cond: Expr, then: Expr, other: Expr) -> str:
        """``where`` evaluates only the chosen branch: a conditional expression, or an ``if``
        when a branch needs statements first."""
        c = self.expr(cond)
        zero = self.syntax.literal(zero_value(cond.dtype), cond.dtype)
        test = f"{c} != {zero}"
        branches = []
        for branch in (then, other):
            with self._printing_apart({}, self.scope.depth + 1) as scope:
                text = self.expr(branch)
            branches.append((scope.out, text))
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
            self.scope.out.extend(lines)
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
                return all(isinstance(i, (Fixed, Iter, Affine)) and provably_within(i, d, self.scope.extents)
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
        return self.scope.env.get(s, (self.namer.symbol(s), 0))

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
                where = where or (format_stmt(self.scope.statement, self.namer) if self.scope.statement else "?")
                site = self.site("index", f"a dynamic index into {node.debug_name} (dims {dims}) is out of bounds in `{where}`")
                checked.append(_scaled(stride, self.syntax.checked_index(position, d, site)))
            elif unchecked or provably_within(axis, d, self.scope.extents):
                axis_terms, axis_offset = affine_form(axis)
                terms.extend((stride * c, s) for c, s in axis_terms)
                constant += stride * axis_offset
            else:
                where = where or (format_stmt(self.scope.statement, self.namer) if self.scope.statement else "?")
                site = self.site("index", f"an index into {node.debug_name} (dims {dims}) is out of bounds in `{where}`")
                checked.append(_scaled(stride, self.syntax.checked_index(self.axis_value(axis), d, site)))
        offset = self.linear(terms, constant)
        if checked:
            offset = " + ".join(([] if offset == "0" else [offset]) + checked)
        return f"{self.nodes[node]}[{offset}]"


def _reads_memory(e: Expr) -> bool:
    """Whether ``e`` reads a buffer or a local (its value depends on data, not only on the
    loop indices)."""
    return any(isinstance(x, (Load, LoadDynamic, GetLocal, LocalScope)) for x in iter_exprs(e))


def _scaled(stride: int, text: str) -> str:
    return text if stride == 1 else f"{stride}*{text}"


def zero_value(dtype: DType) -> float | int | tuple[int, int, int, int]:
    """The zero of ``dtype`` as :meth:`Syntax.literal` takes it (a local's first value, a sum's start)."""
    if dtype is dtypes.uint4x32:
        return (0, 0, 0, 0)
    return 0.0 if dtype.is_float else 0
