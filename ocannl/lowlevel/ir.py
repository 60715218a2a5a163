"""The loop IR: what every backend consumes (docs/compiler.md, "The loop IR and .ll").

Statements are loops, sequences, stores and whole-buffer fills; scalar expressions are typed
trees. The IR is built for four consumers — the interpreter, C, Triton and MSL emitters — so it
keeps explicit what each of them needs:

* Loops run ``0 <= i < extent`` and know whether they are ``PARALLEL`` (every store in the body
  writes a cell indexed by the loop's own index, so iterations touch disjoint cells) or
  ``REDUCTION`` (:func:`loop` decides).
* Every expression knows its :class:`~ocannl.lowlevel.dtypes.DType`, always a compute type
  (dtypes.py): a :class:`Load` of a float16 or bfloat16 node yields float32, and a store rounds
  to the node's precision. Operands of an operator have the operator's type; conversions are
  explicit :class:`Cast` nodes, so emitters never infer a type. The PRNG operators are the
  exception, each with fixed types: ``threefry4x32`` on uint4x32 values, the conversions
  ``uniform1`` and ``uint4x32_of``, :class:`Unary` nodes that state their result type (their bits:
  ``ocannl/lowlevel/prng.py``), and ``uint4x32_pack`` and ``uint4x32_word``, the :class:`Binary`
  nodes that build a uint4x32 from its words and read one back.
* Buffer indices are :data:`~ocannl.lowlevel.indexing.AxisIndex` values, affine in loop symbols
  and static index symbols (bound at run time), except one axis of :class:`LoadDynamic` /
  :class:`StoreDynamic`, indexed by a data-dependent integer (``oc.take`` and its gradient).
* A :class:`Load` with ``oob_value`` reads that value where its index leaves the buffer (the
  margins of padded convolutions); any other out-of-bounds access is an error.

Locals (:class:`Local`, :class:`DeclareLocal`, :class:`SetLocal`, :class:`GetLocal`,
:class:`LocalScope`) are scalar variables for the optimizer's virtualization and CSE passes
(docs/compiler.md, "Optimization"); lowering does not produce them.

The ``.ll`` printer (:func:`format_routine`) numbers loop indices ``i0, i1, ...`` and locals
``v0, v1, ...`` by first appearance in each routine, so printed files do not depend on the global
symbol counter.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, Union

from ocannl.errors import ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import format_number, format_static_symbols
from ocannl.lowlevel.dtypes import DType, DTypeError
from ocannl.lowlevel.indexing import (
    Affine,
    AnySymbol,
    AxisIndex,
    Fixed,
    IndexSymbol,
    Iter,
    Symbol,
    index_symbols,
)
from ocannl.lowlevel.scalar_ops import UINT4X32_LANES, Binop, Ternop, Unop, operand_dtypes
from ocannl.lowlevel.tnode import TNode

# ---------------------------------------------------------------------------------------------
# Scalar expressions


@dataclass(frozen=True, eq=False)
class Local:
    """A scalar variable of one routine. Identity is the object."""

    dtype: DType


@dataclass(frozen=True)
class Const:
    """A constant; for uint4x32, ``value`` is a tuple of its four lanes."""

    value: float | int | tuple[int, int, int, int]
    dtype: DType = dtypes.DEFAULT

    def __post_init__(self) -> None:
        _require_compute(self.dtype, "a constant")


@dataclass(frozen=True)
class Load:
    """``tnode[indices]``; with ``oob_value``, an index outside the dims reads ``oob_value``."""

    tnode: TNode
    indices: tuple[AxisIndex, ...]
    oob_value: float | int | None = None

    def __post_init__(self) -> None:
        _check_rank(self.tnode, len(self.indices))

    @property
    def dtype(self) -> DType:
        return self.tnode.dtype.compute


@dataclass(frozen=True)
class LoadDynamic:
    """``tnode[indices[:axis] + (position,) + indices[axis:]]``: axis ``axis`` is indexed by the
    integer value of ``position`` (``oc.take``). A position outside ``[0, dims[axis])`` is an
    error: the interpreter raises ``OutOfBoundsError``; emitters check or clamp (documented per
    backend)."""

    tnode: TNode
    axis: int
    position: Expr
    indices: tuple[AxisIndex, ...]

    def __post_init__(self) -> None:
        _check_dynamic(self.tnode, self.axis, self.position, self.indices)

    @property
    def dtype(self) -> DType:
        return self.tnode.dtype.compute


@dataclass(frozen=True)
class Unary:
    """``op(x)``, of ``x``'s type, except the PRNG conversions: ``uniform1`` yields ``to``
    (float32 or float64) from a uint4x32, ``uint4x32_of`` a uint4x32 from an integer (its ``to``
    is left out). See ``ocannl/lowlevel/prng.py`` for their bits."""

    op: Unop
    x: Expr
    to: DType | None = None

    def __post_init__(self) -> None:
        if self.op is Unop.UNIFORM1:
            if self.x.dtype is not dtypes.uint4x32 or self.to not in (dtypes.float32, dtypes.float64):
                got = self.to.name if self.to else "no type"
                raise DTypeError(
                    f"uniform1 converts a uint4x32 to float32 or float64, got {self.x.dtype.name} to {got}"
                )
        elif self.op is Unop.UINT4X32_OF:
            if self.x.dtype.is_float or self.x.dtype is dtypes.uint4x32 or self.to not in (None, dtypes.uint4x32):
                raise DTypeError(f"uint4x32_of takes an integer, got {self.x.dtype.name}: cast it")
        else:
            if self.to is not None:
                raise DTypeError(f"{self.op.value} is not a conversion: its result has its operand's type")
            _check_operator(self.op, (self.x.dtype,))

    @property
    def dtype(self) -> DType:
        if self.op is Unop.UINT4X32_OF:
            return dtypes.uint4x32
        return self.to or self.x.dtype


@dataclass(frozen=True)
class Binary:
    """``op(a, b)``, of ``a``'s type, except the uint4x32 word operators: ``uint4x32_pack`` makes
    a uint4x32 of two int64 halves, ``uint4x32_word`` reads lane ``b`` (a uint32 constant from 0
    to 3) of a uint4x32 as a uint32 (``ocannl/lowlevel/scalar_ops.py``)."""

    op: Binop
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        if self.op in (Binop.UINT4X32_PACK, Binop.UINT4X32_WORD):
            _check_word_operator(self.op, self.a, self.b)
        else:
            _check_operator(self.op, (self.a.dtype, self.b.dtype))

    @property
    def dtype(self) -> DType:
        if self.op is Binop.UINT4X32_PACK:
            return dtypes.uint4x32
        if self.op is Binop.UINT4X32_WORD:
            return dtypes.uint32
        return self.a.dtype


@dataclass(frozen=True)
class Ternary:
    """``where(a, b, c)`` (``a`` may have any scalar type; only the chosen branch is evaluated),
    ``fma(a, b, c)`` or ``mul3(a, b, c)``."""

    op: Ternop
    a: Expr
    b: Expr
    c: Expr

    def __post_init__(self) -> None:
        if self.op is Ternop.WHERE:
            _check_operator(self.op, (self.b.dtype, self.c.dtype))
            _require_compute(self.a.dtype, "a where condition")
        else:
            _check_operator(self.op, (self.a.dtype, self.b.dtype, self.c.dtype))

    @property
    def dtype(self) -> DType:
        return self.b.dtype


@dataclass(frozen=True)
class Cast:
    """``x`` converted to ``dtype``: floats round to nearest even, floats to integers truncate
    toward zero, integers wrap (dtypes.round_to)."""

    x: Expr
    dtype: DType

    def __post_init__(self) -> None:
        _require_compute(self.dtype, "a cast")
        if dtypes.uint4x32 in (self.x.dtype, self.dtype):
            raise DTypeError("uint4x32 values convert only through the PRNG operations, not casts")


@dataclass(frozen=True)
class EmbedIndex:
    """The integer value of an index expression (a loop index, a static index symbol, an affine
    combination) as a scalar of ``dtype``."""

    index: AxisIndex
    dtype: DType = dtypes.INDEX

    def __post_init__(self) -> None:
        if self.dtype.is_float or self.dtype is dtypes.uint4x32:
            raise DTypeError(f"an embedded index is an integer, not {self.dtype.name}")


@dataclass(frozen=True)
class GetLocal:
    local: Local

    @property
    def dtype(self) -> DType:
        return self.local.dtype


@dataclass(frozen=True)
class LocalScope:
    """``let local = 0 in (run body; local)``: an expression computed by statements."""

    local: Local
    body: Stmt

    @property
    def dtype(self) -> DType:
        return self.local.dtype


Expr = Union[Const, Load, LoadDynamic, Unary, Binary, Ternary, Cast, EmbedIndex, GetLocal, LocalScope]

# ---------------------------------------------------------------------------------------------
# Statements


class LoopKind(enum.Enum):
    PARALLEL = "parallel"
    REDUCTION = "reduction"


@dataclass(frozen=True)
class For:
    """``for symbol in range(extent): body``. Build with :func:`loop`, which sets ``kind``."""

    symbol: Symbol
    extent: int
    body: Stmt
    kind: LoopKind


@dataclass(frozen=True)
class Seq:
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True)
class Store:
    """``tnode[indices] := value``, rounding ``value`` to the node's precision. With
    ``skip_oob`` a store whose index falls outside the dims does nothing (the gradient of a
    padded convolution lands partly in the margins, which have no cells); otherwise an
    out-of-bounds store is an error. Emitters generate a bounds test for it."""

    tnode: TNode
    indices: tuple[AxisIndex, ...]
    value: Expr
    skip_oob: bool = False

    def __post_init__(self) -> None:
        _check_rank(self.tnode, len(self.indices))
        _check_store_type(self.tnode, self.value)


@dataclass(frozen=True)
class StoreDynamic:
    """The store counterpart of :class:`LoadDynamic` (scatter-add of the ``oc.take`` gradient)."""

    tnode: TNode
    axis: int
    position: Expr
    indices: tuple[AxisIndex, ...]
    value: Expr

    def __post_init__(self) -> None:
        _check_dynamic(self.tnode, self.axis, self.position, self.indices)
        _check_store_type(self.tnode, self.value)


@dataclass(frozen=True)
class Fill:
    """Every cell of ``tnode`` := ``value``."""

    tnode: TNode
    value: Const

    def __post_init__(self) -> None:
        _check_store_type(self.tnode, self.value)


@dataclass(frozen=True)
class Comment:
    text: str


@dataclass(frozen=True)
class DeclareLocal:
    """Introduce ``local`` (initialized to 0) for the rest of the enclosing sequence."""

    local: Local


@dataclass(frozen=True)
class SetLocal:
    local: Local
    value: Expr

    def __post_init__(self) -> None:
        if self.value.dtype is not self.local.dtype:
            raise DTypeError(f"a {self.local.dtype.name} local cannot hold a {self.value.dtype.name} value")


Stmt = Union[For, Seq, Store, StoreDynamic, Fill, Comment, DeclareLocal, SetLocal]


def seq(*stmts: Stmt) -> Stmt:
    """A statement running ``stmts`` in order: nested sequences flattened, a single statement
    returned as itself, none as the empty sequence."""
    flat: list[Stmt] = []
    for s in stmts:
        flat.extend(s.stmts if isinstance(s, Seq) else (s,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def loop(symbol: Symbol, extent: int, body: Stmt) -> For:
    """A loop, ``PARALLEL`` when its iterations write disjoint cells: every store in ``body``
    indexes some axis by the bare loop index, and the body sets no local declared outside it.
    Otherwise ``REDUCTION``."""
    result = nest(((symbol, extent),), body)
    assert isinstance(result, For)
    return result


def nest(loops: Sequence[tuple[Symbol, int]], body: Stmt) -> Stmt:
    """``body`` inside the loops ``(symbol, extent)`` of ``loops``, outermost first, each kinded as
    :func:`loop` kinds it: the loops add no store nor local, so one walk of ``body`` decides them
    all (lowering builds every loop nest so, and a nest wrapped loop by loop would walk its body
    once per loop)."""
    stores: list[tuple[AxisIndex, ...]] = []
    declared: set[Local] = set()
    set_locals: list[Local] = []
    for s in iter_stmts(body):
        kind = type(s)
        if kind is Store or kind is StoreDynamic:
            stores.append(s.indices)
        elif kind is DeclareLocal:
            declared.add(s.local)
        elif kind is SetLocal:
            set_locals.append(s.local)
    disjoint = bool(stores) and all(local in declared for local in set_locals)
    for symbol, extent in reversed(loops):
        index = Iter(symbol)
        parallel = disjoint and all(index in indices for indices in stores)
        body = For(symbol, extent, body, LoopKind.PARALLEL if parallel else LoopKind.REDUCTION)
    return body


def iter_stmts(stmt: Stmt) -> Iterator[Stmt]:
    """``stmt`` and every statement nested in it (also inside local scopes), in program order.

    Like :func:`iter_exprs`, it keeps its own stack: a recursive generator would cost each item
    one step per level of nesting, and Python frames."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        yield s
        kind = type(s)  # by class, not ``match``, as in the walkers below: they visit every node
        if kind is For:
            stack.append(s.body)
        elif kind is Seq:
            stack.extend(reversed(s.stmts))
        else:
            bodies = scope_bodies(s)
            if bodies:
                stack.extend(reversed(bodies))


def scope_bodies(stmt: Stmt) -> list[Stmt]:
    """The bodies of the local scopes in the expressions of ``stmt`` (not of those nested in a
    scope's body, nor of its nested statements), in the order of :func:`iter_exprs`."""
    return [x.body for e in stmt_exprs(stmt) for x in iter_exprs(e) if type(x) is LocalScope]


def stmt_exprs(stmt: Stmt) -> tuple[Expr, ...]:
    """The expressions a statement evaluates itself (not those of nested statements)."""
    kind = type(stmt)
    if kind is Store or kind is SetLocal or kind is Fill:
        return (stmt.value,)
    if kind is StoreDynamic:
        return (stmt.position, stmt.value)
    return ()


def top_level(body: Stmt) -> tuple[Stmt, ...]:
    """The statements of ``body`` as a sequence: its own, or itself alone."""
    return body.stmts if isinstance(body, Seq) else (body,)


def iter_exprs(e: Expr, unconditional: bool = False) -> Iterator[Expr]:
    """``e`` and its sub-expressions, pre-order (not entering local scope bodies:
    :func:`ocannl.lowlevel.analysis.all_exprs` does); ``unconditional``: only those evaluated
    whenever ``e`` is, not the branches of a ``where``."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        kind = type(x)
        if kind is Binary:
            stack += (x.b, x.a)
        elif kind is Unary or kind is Cast:
            stack.append(x.x)
        elif kind is LoadDynamic:
            stack.append(x.position)
        elif kind is Ternary:
            if unconditional and x.op is Ternop.WHERE:
                stack.append(x.a)
            else:
                stack += (x.c, x.b, x.a)


def unconditional_exprs(e: Expr) -> Iterator[Expr]:
    """``e`` and the sub-expressions evaluated whenever ``e`` is (:func:`iter_exprs`)."""
    return iter_exprs(e, unconditional=True)


def total_over_executions(stmt: Stmt, weight: Callable[[Stmt], int]) -> int:
    """``weight(s)`` summed over every execution of every statement ``s`` of ``stmt`` that is
    neither a loop nor a sequence (a loop repeats its body's total ``extent`` times). With a
    weight of 1 it is the number of innermost statements a nest runs, its cost; with the terms
    each statement adds, the number of terms of a reduction (``schedule.block_terms``)."""
    total = 0
    stack: list[tuple[Stmt, int]] = [(stmt, 1)]
    while stack:
        s, times = stack.pop()
        match s:
            case For(extent=n, body=body):
                stack.append((body, times * n))
            case Seq(stmts=stmts):
                stack.extend((x, times) for x in stmts)
            case _:
                total += times * weight(s)
    return total


def nesting(node: Stmt | Expr) -> int:
    """How many levels of statements and expressions nest in ``node`` (a leaf is 1, each nested
    statement, sub-expression and local scope body one more): how deep a walker that recurses
    into them goes. Computed without recursion, so it measures any depth.

    The optimizer keeps it bounded when it inlines (``optimize.INLINE_NESTING_LIMIT``): every
    walker of the IR recurses, as do C compilers and Python's parser on the emitted code."""
    deepest = 0
    stack: list[tuple[Stmt | Expr, int]] = [(node, 1)]
    while stack:
        x, depth = stack.pop()
        deepest = max(deepest, depth)
        match x:
            case For(body=body) | LocalScope(body=body):
                stack.append((body, depth + 1))
            case Seq(stmts=stmts):
                stack.extend((s, depth + 1) for s in stmts)
            case Store() | StoreDynamic() | SetLocal() | Fill():
                stack.extend((e, depth + 1) for e in stmt_exprs(x))
            case Unary(x=e) | Cast(x=e) | LoadDynamic(position=e):
                stack.append((e, depth + 1))
            case Binary(a=a, b=b):
                stack.extend(((a, depth + 1), (b, depth + 1)))
            case Ternary(a=a, b=b, c=c):
                stack.extend(((a, depth + 1), (b, depth + 1), (c, depth + 1)))
    return deepest


@dataclass(frozen=True)
class RoutineIR:
    """One compiled unit: a body plus what the runtime needs to know about it (the index symbols
    to bind before a run, and the nodes it reads and writes, in order of first access).

    Those three are found by one walk of the body, on first use: the passes of
    ``lowlevel/optimize.py`` make a routine per step and read them of few, and a walk of a deep
    network's routine takes tens of milliseconds."""

    name: str
    body: Stmt

    @property
    def static_symbols(self) -> tuple[IndexSymbol, ...]:
        return self._accesses[0]

    @property
    def reads(self) -> tuple[TNode, ...]:
        return self._accesses[1]

    @property
    def writes(self) -> tuple[TNode, ...]:
        return self._accesses[2]

    @functools.cached_property
    def _accesses(self) -> tuple[tuple[IndexSymbol, ...], tuple[TNode, ...], tuple[TNode, ...]]:
        symbols: dict[IndexSymbol, None] = {}
        reads: dict[TNode, None] = {}
        writes: dict[TNode, None] = {}

        def index_uses(indices: tuple[AxisIndex, ...]) -> None:
            for idx in indices:
                if type(idx) is not Fixed:  # a fixed index names no symbol
                    symbols.update((s, None) for s in index_symbols(idx) if type(s) is IndexSymbol)

        for stmt in iter_stmts(self.body):
            for e in stmt_exprs(stmt):
                for sub in iter_exprs(e):
                    kind = type(sub)
                    if kind is Load or kind is LoadDynamic:
                        reads[sub.tnode] = None
                        index_uses(sub.indices)
                    elif kind is EmbedIndex:
                        index_uses((sub.index,))
            kind = type(stmt)
            if kind is Store or kind is StoreDynamic:
                writes[stmt.tnode] = None
                index_uses(stmt.indices)
            elif kind is Fill:
                writes[stmt.tnode] = None
        return tuple(symbols), tuple(reads), tuple(writes)


# ---------------------------------------------------------------------------------------------
# Type checks: they catch a malformed IR where it is built, not in a backend.


def _require_compute(dtype: DType, what: str) -> None:
    if not dtype.is_compute_type:
        raise DTypeError(
            f"{what} cannot have type {dtype.name}: {dtype.name} is a storage type, computed as float32"
        )


def _check_rank(tnode: TNode, n: int) -> None:
    if n != len(tnode.dims):
        raise ShapeError(f"{tnode.debug_name} has dims {tnode.dims} but is accessed with {n} indices")


def _check_dynamic(tnode: TNode, axis: int, position: Expr, indices: tuple[AxisIndex, ...]) -> None:
    _check_rank(tnode, len(indices) + 1)
    if not 0 <= axis <= len(indices):
        raise ShapeError(f"{tnode.debug_name}: dynamic axis {axis} out of range for dims {tnode.dims}")
    if position.dtype.is_float or position.dtype is dtypes.uint4x32:
        raise DTypeError(f"a dynamic index must be an integer, not {position.dtype.name}: cast it")


def _check_store_type(tnode: TNode, value: Expr) -> None:
    if value.dtype is not tnode.dtype.compute:
        raise DTypeError(
            f"storing a {value.dtype.name} value into {tnode.debug_name} ({tnode.dtype.name}) "
            f"needs a {tnode.dtype.compute.name} value: cast it"
        )


def _check_operator(op: Unop | Binop | Ternop, operand_types: tuple[DType, ...]) -> None:
    first = operand_types[0]
    if any(t is not first for t in operand_types):
        names = ", ".join(t.name for t in operand_types)
        raise DTypeError(f"{op.value} needs operands of one type, got {names}: cast them")
    _require_compute(first, f"an operand of {op.value}")
    if (first is dtypes.uint4x32) != (op is Binop.THREEFRY4X32):
        if first is dtypes.uint4x32:
            raise DTypeError(f"{op.value} is not defined on uint4x32 values")
        raise DTypeError(f"threefry4x32 takes uint4x32 key and counter, got {first.name}")
    if op.float_only and not first.is_float:
        raise DTypeError(f"{op.value} is defined on floats only, got {first.name}: cast the operand")


def _check_word_operator(op: Binop, a: Expr, b: Expr) -> None:
    """The fixed operand types of ``uint4x32_pack`` and ``uint4x32_word``; the lane a word is read
    from must be a constant, since Triton keeps the four lanes in four variables."""
    expected = operand_dtypes(op, dtypes.uint4x32 if op is Binop.UINT4X32_PACK else dtypes.uint32)
    if (a.dtype, b.dtype) != expected:
        raise DTypeError(f"{op.value} takes {expected[0].name} and {expected[1].name} operands, got "
                         f"{a.dtype.name} and {b.dtype.name}")
    if op is Binop.UINT4X32_WORD and not (isinstance(b, Const) and 0 <= b.value < UINT4X32_LANES):
        raise DTypeError(f"uint4x32_word reads a lane given by a constant from 0 to {UINT4X32_LANES - 1}, "
                         f"got {b!r}")


# ---------------------------------------------------------------------------------------------
# The .ll printer

WIDTH = 100
"""Lines of a loop that fit in this many columns print on one line."""


class Namer:
    """Names loop symbols ``i0, i1, ...`` and locals ``v0, v1, ...`` in order of first request;
    static index symbols keep their own names."""

    def __init__(self) -> None:
        self._symbols: dict[Symbol, str] = {}
        self._locals: dict[Local, str] = {}

    def symbol(self, s: AnySymbol) -> str:
        if isinstance(s, IndexSymbol):
            return s.name
        return self._symbols.setdefault(s, f"i{len(self._symbols)}")

    def local(self, local: Local) -> str:
        return self._locals.setdefault(local, f"v{len(self._locals)}")


def number_names(stmt: Stmt, namer: Namer) -> None:
    """Has ``namer`` name every loop symbol and local of ``stmt`` in the order :func:`format_stmt`
    asks for them, printing nothing: a backend naming its loops as the ``.ll`` file does walks a
    deep network's routine once, without formatting it (a test keeps the two orders equal)."""
    match stmt:
        case For(symbol=s, body=body):
            namer.symbol(s)
            number_names(body, namer)
        case Seq(stmts=stmts):
            for x in stmts:
                number_names(x, namer)
        case Store(indices=idx, value=v):
            _number_indices(idx, namer)
            _number_expr(v, namer)
        case StoreDynamic(position=p, indices=idx, value=v):
            _number_indices(idx, namer)
            _number_expr(p, namer)
            _number_expr(v, namer)
        case Fill(value=v):
            _number_expr(v, namer)
        case DeclareLocal(local=local):
            namer.local(local)
        case SetLocal(local=local, value=v):
            namer.local(local)
            _number_expr(v, namer)


def _number_expr(e: Expr, namer: Namer) -> None:
    match e:
        case Load(indices=idx):
            _number_indices(idx, namer)
        case LoadDynamic(position=p, indices=idx):
            _number_indices(idx, namer)
            _number_expr(p, namer)
        case Unary(x=x) | Cast(x=x):
            _number_expr(x, namer)
        case Binary(a=a, b=b):
            _number_expr(a, namer)
            _number_expr(b, namer)
        case Ternary(a=a, b=b, c=c):
            _number_expr(a, namer)
            _number_expr(b, namer)
            _number_expr(c, namer)
        case EmbedIndex(index=index):
            _number_indices((index,), namer)
        case GetLocal(local=local):
            namer.local(local)
        case LocalScope(local=local, body=body):
            namer.local(local)
            number_names(body, namer)


def _number_indices(indices: tuple[AxisIndex, ...], namer: Namer) -> None:
    for idx in indices:
        if isinstance(idx, Iter):
            namer.symbol(idx.symbol)
        elif isinstance(idx, Affine):
            for _, s in idx.terms:
                namer.symbol(s)


def format_routine(routine: RoutineIR, namer: Namer | None = None) -> str:
    """The ``.ll`` text of a routine: a header naming its index symbols, then its statements."""
    namer = namer or Namer()
    lines = [f"{routine.name} ({format_static_symbols(routine.static_symbols)}):"]
    _stmt_lines(routine.body, namer, 1, lines)
    return "\n".join(lines) + "\n"


def format_stmt(stmt: Stmt, namer: Namer) -> str:
    """One statement on one line (nested statements included)."""
    match stmt:
        case For(symbol=s, extent=n, body=body):
            return f"for {namer.symbol(s)} = 0 to {n - 1} {_braced(format_stmt(body, namer))}"
        case Seq(stmts=stmts):
            return " ".join(format_stmt(s, namer) for s in stmts)
        case Store(tnode=t, indices=idx, value=v, skip_oob=skip):
            guard = "if in bounds: " if skip else ""
            return f"{guard}{_access(t, idx, namer)} := {format_expr(v, namer)};"
        case StoreDynamic(tnode=t, axis=axis, position=p, indices=idx, value=v):
            return f"{_dynamic_access(t, axis, p, idx, namer)} := {format_expr(v, namer)};"
        case Fill(tnode=t, value=v):
            return f"fill {t.debug_name} := {format_expr(v, namer)};"
        case Comment(text=text):
            return f"/* {_comment_text(text)} */"
        case DeclareLocal(local=local):
            return f"declare {namer.local(local)};"
        case SetLocal(local=local, value=v):
            return f"{namer.local(local)} := {format_expr(v, namer)};"
    raise TypeError(f"not a loop IR statement: {stmt!r}")


def _stmt_lines(stmt: Stmt, namer: Namer, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    match stmt:
        case Seq(stmts=stmts):
            for s in stmts:
                _stmt_lines(s, namer, depth, out)
        case For(symbol=s, extent=n, body=body):
            if not isinstance(body, (For, Seq)):
                flat = pad + format_stmt(stmt, namer)
                if len(flat) <= WIDTH:
                    out.append(flat)
                    return
            out.append(f"{pad}for {namer.symbol(s)} = 0 to {n - 1} {{")
            _stmt_lines(body, namer, depth + 1, out)
            out.append(pad + "}")
        case _:
            out.append(pad + format_stmt(stmt, namer))


def format_expr(e: Expr, namer: Namer) -> str:
    match e:
        case Const(value=tuple() as lanes):
            return f"uint4x32({', '.join(str(v) for v in lanes)})"
        case Const(value=v):
            return format_number(v)
        case Load(tnode=t, indices=idx, oob_value=None):
            return _access(t, idx, namer)
        case Load(tnode=t, indices=idx, oob_value=oob):
            return f"{t.debug_name}[{format_indices(idx, namer)} else {format_number(oob)}]"
        case LoadDynamic(tnode=t, axis=axis, position=p, indices=idx):
            return _dynamic_access(t, axis, p, idx, namer)
        case Unary(op=op, x=x):
            return f"{op.value}({format_expr(x, namer)})"
        case Binary(op=op, a=a, b=b) if op.infix:
            return f"({format_expr(a, namer)} {op.symbol} {format_expr(b, namer)})"
        case Binary(op=op, a=a, b=b):
            return f"{op.value}({format_expr(a, namer)}, {format_expr(b, namer)})"
        case Ternary(op=op, a=a, b=b, c=c):
            return f"{op.value}({', '.join(format_expr(x, namer) for x in (a, b, c))})"
        case Cast(x=x, dtype=dtype):
            return f"{dtype.name}({format_expr(x, namer)})"
        case EmbedIndex(index=index):
            return format_index(index, namer)
        case GetLocal(local=local):
            return namer.local(local)
        case LocalScope(local=local, body=body):
            return f"{namer.local(local)} {_braced(format_stmt(body, namer))}"
    raise TypeError(f"not a loop IR expression: {e!r}")


def format_index(idx: AxisIndex, namer: Namer) -> str:
    match idx:
        case Fixed(index=i):
            return str(i)
        case Iter(symbol=s):
            return namer.symbol(s)
        case Affine(terms=terms, offset=offset):
            parts = [namer.symbol(s) if c == 1 else f"{c}*{namer.symbol(s)}" for c, s in terms]
            if offset or not parts:
                parts.append(str(offset))
            return "+".join(parts).replace("+-", "-")
    raise TypeError(f"not an axis index: {idx!r}")


def format_indices(indices: tuple[AxisIndex, ...], namer: Namer) -> str:
    return ", ".join(format_index(i, namer) for i in indices)


def _access(t: TNode, indices: tuple[AxisIndex, ...], namer: Namer) -> str:
    return f"{t.debug_name}[{format_indices(indices, namer)}]"


def _dynamic_access(t: TNode, axis: int, position: Expr, indices: tuple[AxisIndex, ...], namer: Namer) -> str:
    parts = [format_index(i, namer) for i in indices]
    parts.insert(axis, f"@({format_expr(position, namer)})")
    return f"{t.debug_name}[{', '.join(parts)}]"


def _braced(text: str) -> str:
    return f"{{ {text} }}" if text else "{ }"


def _comment_text(text: str) -> str:
    """Comment text that cannot close the comment or break the line."""
    return " ".join(text.replace("*/", "* /").split())
