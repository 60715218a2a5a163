"""The assignments IR: what each tensor operation computes, before loops exist (docs/compiler.md).

Its one workhorse is the accumulating assignment :class:`Accum`, ``lhs <accum>= fn(rhs...)``,
iterated over the product space of its :class:`~ocannl.lowlevel.indexing.Projections`.
Every op's forward and gradient code is written with it (docs/training.md). Beside it:
:class:`Fetch` fills a node from a constant, its own offsets, a slice of another node, an index
symbol or explicit values; :class:`Gather` and :class:`ScatterAdd` are ``oc.take`` and its
gradient, the one data-dependent access.

A :class:`Computation` is what ``Context.compile`` accepts: a named body plus the initializers of
nodes (parameters) that must hold a value before the body first runs.

The ``.cd`` printer (:func:`format_cd`) mirrors the original's ``%cd`` notation, e.g.::

    update (batch_n : [0..79]):
      # "forward";
      moons_input =: moons_flat @| batch_n;
      n35 =:+ w1 * moons_input ~logic:"@";
      w3 =- learning_rate * sgd_delta_w3;
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable, Iterator, Union

from numpy.typing import ArrayLike

from ocannl.errors import OcannlError
from ocannl.lowlevel.indexing import IndexSymbol, Projections, index_symbols
from ocannl.lowlevel.scalar_ops import ACCUMULATORS, Binop, ScalarOp, Ternop, Unop
from ocannl.lowlevel.tnode import TNode

Operand = Union[TNode, float, int]
"""A right-hand side operand: a node read through its projection, or a scalar constant."""


@dataclass(frozen=True)
class Arg:
    """The ``index``-th right-hand side operand, inside an :class:`Apply` expression."""

    index: int


@dataclass(frozen=True)
class CellOffset:
    """Inside an :class:`Apply` expression: the row-major offset of the left-hand side cell being
    written (``0, 1, 2, ...``), the counter of a random fill (``ocannl/lowlevel/prng.py``)."""


@dataclass(frozen=True)
class Apply:
    """A scalar expression over the operands of an accumulating assignment: ``op(args...)``,
    where each argument is an :class:`Arg`, a nested :class:`Apply`, a number, a uint4x32
    constant (a tuple of four ints, e.g. a PRNG key) or :class:`CellOffset`. Gradients need
    it (``g2 =- g * (v1 / (v2 * v2))`` is one assignment); a single
    operator applied to every operand in order is written as the bare operator."""

    op: ScalarOp
    args: tuple["Apply | Arg | CellOffset | float | int | tuple[int, int, int, int]", ...]

    def __post_init__(self) -> None:
        if len(self.args) != self.op.arity:
            raise OcannlError(f"{self.op.value} takes {self.op.arity} operands, got {len(self.args)}")

    def arg_indices(self) -> set[int]:
        out: set[int] = set()
        for a in self.args:
            if isinstance(a, Arg):
                out.add(a.index)
            elif isinstance(a, Apply):
                out |= a.arg_indices()
        return out


Fn = Union[ScalarOp, Apply]


@dataclass(frozen=True, eq=False)
class Accum:
    """``lhs <accum>= fn(rhs...)`` at every point of ``projections()``'s product space.

    ``accum`` is ``None`` for a plain set (``=:``) or one of :data:`ACCUMULATORS`; with
    ``initialize_neutral`` (``=:+``, ``=:@^``...) the whole ``lhs`` is first reset to the
    accumulator's neutral element. ``projections`` is called when the assignment is lowered or
    printed, after shape inference; its ``project_rhs[j]`` indexes ``rhs[j]`` (a constant operand
    has the entry ``()`` and dims ``()``). ``spec`` is the op's logic (``"@"``, ``"."``, an einsum
    spec) for the ``.cd`` printout only.
    """

    lhs: TNode
    accum: Binop | None
    fn: Fn
    rhs: tuple[Operand, ...]
    projections: Callable[[], Projections]
    initialize_neutral: bool = False
    spec: str = ""

    def __post_init__(self) -> None:
        if self.accum is not None and self.accum not in ACCUMULATORS:
            allowed = ", ".join(sorted(b.value for b in ACCUMULATORS))
            raise OcannlError(
                f"{self.lhs.debug_name}: cannot accumulate with {self.accum.value}; use one of {allowed}"
            )
        if self.initialize_neutral and self.accum is None:
            raise OcannlError(f"{self.lhs.debug_name}: initialize_neutral needs an accumulator (=:+, not =:)")
        if isinstance(self.fn, Apply):
            if self.fn.arg_indices() != set(range(len(self.rhs))):
                raise OcannlError(f"{self.lhs.debug_name}: the expression must use each of its {len(self.rhs)} operands")
        elif len(self.rhs) != self.fn.arity:
            raise OcannlError(f"{self.fn.value} takes {self.fn.arity} operands, got {len(self.rhs)}")


@dataclass(frozen=True)
class Constant:
    """Every cell holds ``value``."""

    value: float | int


@dataclass(frozen=True)
class RangeOverOffsets:
    """Every cell holds its row-major offset (``0, 1, 2, ...``)."""


@dataclass(frozen=True)
class Slice:
    """``lhs = parent[index, ...]``: the cells of ``parent`` at position ``index`` of its leftmost
    axis (``xs[batch_n]``). ``parent.dims`` is ``(n,) + lhs.dims``."""

    parent: TNode
    index: IndexSymbol


@dataclass(frozen=True)
class EmbedSymbol:
    """Every cell holds the value ``symbol`` is bound to when the routine runs."""

    symbol: IndexSymbol


@dataclass(frozen=True)
class Values:
    """The cells, in row-major order, hold ``values`` (cycling when there are fewer values than
    cells). Lowered to one store per cell: use ``Context.set`` for data of any size."""

    values: tuple[float | int, ...]


FetchSource = Union[Constant, RangeOverOffsets, Slice, EmbedSymbol, Values]


@dataclass(frozen=True, eq=False)
class Fetch:
    """``lhs =: <source>`` over all of ``lhs``."""

    lhs: TNode
    source: FetchSource


@dataclass(frozen=True, eq=False)
class Gather:
    """``lhs[i..., r...] = table[indices[i...], r...]``: ``oc.take(table, indices)``.

    Axis convention: the integer values of ``indices`` select along ``table``'s leftmost axis;
    the result's axes are ``indices``' axes followed by ``table``'s remaining axes, so
    ``lhs.dims == indices.dims + table.dims[1:]``. ``indices`` may hold integers or floats
    (truncated toward zero); a value outside ``[0, table.dims[0])``, NaN and infinities
    included, is an ``OutOfBoundsError`` on every backend (docs/semantics.md, "Numerics").
    """

    lhs: TNode
    table: TNode
    indices: TNode


@dataclass(frozen=True, eq=False)
class ScatterAdd:
    """``target[indices[i...], r...] += source[i..., r...]``: the gradient of :class:`Gather`
    (``target`` is the table's gradient, ``source`` the result's). Same axis convention; rows
    picked several times receive the sum of their contributions. It accumulates: the target is
    not reset first.
    """

    target: TNode
    indices: TNode
    source: TNode


@dataclass(frozen=True)
class Block:
    """A sequence of assignments; ``comment`` names it in printouts (``# "forward";``)."""

    items: tuple[Assignment, ...]
    comment: str = ""


@dataclass(frozen=True)
class Noop:
    pass


Assignment = Union[Accum, Fetch, Gather, ScatterAdd, Block, Noop]
ASSIGNMENT_TYPES = (Accum, Fetch, Gather, ScatterAdd, Block, Noop)

Init = Union[Assignment, ArrayLike]
"""How a node gets its first value: code (a parameter's initializer) or host data (an array of
the node's dims, copied in as ``Context.set`` does)."""


@dataclass(frozen=True, eq=False)
class Computation:
    """A named top-level assignment plus node initializers.

    ``inits`` pairs a node with its :data:`Init`; the runtime runs it once per context, before
    the body, for each node that has no value on that context yet (docs/training.md,
    "Parameters and random numbers").
    """

    name: str
    body: Assignment
    inits: tuple[tuple[TNode, Init], ...] = ()


def walk(asg: Assignment) -> Iterator[Assignment]:
    """The non-block assignments of ``asg`` in program order."""
    if isinstance(asg, Block):
        for item in asg.items:
            yield from walk(item)
    elif not isinstance(asg, Noop):
        yield asg


def nodes_written(asg: Assignment) -> tuple[TNode, ...]:
    """Nodes ``asg`` writes, in order of first write."""
    seen: dict[TNode, None] = {}
    for a in walk(asg):
        seen[a.target if isinstance(a, ScatterAdd) else a.lhs] = None
    return tuple(seen)


def nodes_read(asg: Assignment) -> tuple[TNode, ...]:
    """Nodes whose value before ``asg`` runs may affect its result, in order of first read.

    An accumulating assignment reads its own left side unless it sets (``=:``) or resets it
    first (``=:+``).
    """
    seen: dict[TNode, None] = {}
    for a in walk(asg):
        match a:
            case Accum():
                if a.accum is not None and not a.initialize_neutral:
                    seen[a.lhs] = None
                seen.update((r, None) for r in a.rhs if isinstance(r, TNode))
            case Fetch(source=Slice(parent=parent)):
                seen[parent] = None
            case Gather():
                seen.update({a.table: None, a.indices: None})
            case ScatterAdd():
                seen.update({a.target: None, a.indices: None, a.source: None})
    return tuple(seen)


def static_symbols(asg: Assignment) -> tuple[IndexSymbol, ...]:
    """Index symbols ``asg`` depends on, in order of first use (forces projections)."""
    seen: dict[IndexSymbol, None] = {}
    for a in walk(asg):
        match a:
            case Accum():
                proj = a.projections()
                for idx in proj.project_lhs + tuple(i for p in proj.project_rhs for i in p):
                    seen.update((s, None) for s in index_symbols(idx) if isinstance(s, IndexSymbol))
            case Fetch(source=Slice(index=sym)) | Fetch(source=EmbedSymbol(symbol=sym)):
                seen[sym] = None
    return tuple(seen)


# ---------------------------------------------------------------------------------------------
# The .cd printer


def format_cd(name: str, asg: Assignment) -> str:
    """The ``.cd`` text of ``asg`` as routine ``name``: a header naming the index symbols it
    uses, then one statement per line, indented by two spaces."""
    lines = [f"{name} ({format_static_symbols(static_symbols(asg))}):"]
    _cd_lines(asg, lines)
    return "\n".join(lines) + "\n"


def format_static_symbols(symbols: tuple[IndexSymbol, ...]) -> str:
    return ", ".join(s.name if s.size is None else f"{s.name} : [0..{s.size - 1}]" for s in symbols)


def _cd_lines(asg: Assignment, out: list[str]) -> None:
    match asg:
        case Block(items=items, comment=comment):
            if comment:
                out.append(f"  # {_quote(comment)};")
            for item in items:
                _cd_lines(item, out)
        case Noop():
            pass
        case _:
            out.append(f"  {format_cd_statement(asg)};")


def format_cd_statement(asg: Accum | Fetch | Gather | ScatterAdd) -> str:
    """One statement of the ``.cd`` notation, without the trailing ``;``."""
    match asg:
        case Accum():
            return _format_accum(asg)
        case Fetch(lhs=lhs, source=source):
            return f"{lhs.debug_name} =: {_format_fetch(source)}"
        case Gather(lhs=lhs, table=table, indices=indices):
            return f"{lhs.debug_name} =: take({table.debug_name}, {indices.debug_name})"
        case ScatterAdd(target=target, indices=indices, source=source):
            return f"{target.debug_name} =+ scatter({indices.debug_name}, {source.debug_name})"
    raise TypeError(f"not an assignment statement: {asg!r}")


def _format_accum(a: Accum) -> str:
    if a.accum is None:
        op = "=:"
    else:
        op = ("=:" if a.initialize_neutral else "=") + a.accum.symbol
    args = [_format_operand(r) for r in a.rhs]
    rhs = _format_fn(a.fn, args, top=True) if isinstance(a.fn, Apply) else _format_op(a.fn, args)
    logic = ""
    if a.spec and (a.spec != "." or a.fn in (Binop.MUL, Binop.DIV)):
        logic = f" ~logic:{_quote(a.spec)}"
    return f"{a.lhs.debug_name} {op} {rhs}{logic}"


def _format_op(op: ScalarOp, args: list[str]) -> str:
    match op:
        case Unop.ID:
            return args[0]
        case Unop():
            return f"{op.value} {args[0]}"
        case Binop() if op.symbol is not None:
            return f"{args[0]} {op.symbol} {args[1]}"
    return f"{op.value}({', '.join(args)})"


def _format_fn(fn: Apply | Arg | CellOffset | float | int | tuple, args: list[str], top: bool = False) -> str:
    if isinstance(fn, Arg):
        return args[fn.index]
    if isinstance(fn, CellOffset):
        return "cell_offset()"
    if isinstance(fn, tuple):
        return f"uint4x32({', '.join(str(int(v)) for v in fn)})"
    if not isinstance(fn, Apply):
        return format_number(fn)
    text = _format_op(fn.op, [_format_fn(x, args) for x in fn.args])
    call = isinstance(fn.op, Ternop) or (isinstance(fn.op, Binop) and fn.op.symbol is None)
    return text if top or call or fn.op is Unop.ID else f"({text})"


def _format_fetch(source: FetchSource) -> str:
    match source:
        case Constant(value=v):
            return format_number(v)
        case RangeOverOffsets():
            return "range_over_offsets()"
        case Slice(parent=parent, index=index):
            return f"{parent.debug_name} @| {index.name}"
        case EmbedSymbol(symbol=symbol):
            return f"!@{symbol.name}"
        case Values(values=values):
            return f"constant_fill([{', '.join(format_number(v) for v in values)}])"
    raise TypeError(f"not a fetch source: {source!r}")


def _format_operand(r: Operand) -> str:
    return r.debug_name if isinstance(r, TNode) else format_number(r)


def format_number(v: float | int) -> str:
    """Shortest round-trip text of a constant: ``2``, ``0.5``, ``-inf``, ``nan``."""
    return repr(int(v)) if isinstance(v, numbers.Integral) else repr(float(v))


def _quote(text: str) -> str:
    """A double-quoted string literal; user text cannot end the quote or the line."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'
