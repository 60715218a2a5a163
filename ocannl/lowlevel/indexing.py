"""Index symbols, axis indices and projections: the contract between shape inference and lowering.

Shape inference (``ocannl/shape/projections.py``) derives, for every accumulating assignment, a
:class:`Projections` value: the loops of the assignment (its *product space*) and, for the result
and each operand, how every axis is indexed by those loops. Lowering (``lower.py``) turns it into
loop nests and needs nothing else. See docs/shapes.md, "Projections".

This module knows nothing of tensors or shapes, so the compiler half can use it alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

from ocannl import session
from ocannl.errors import IndexBindingError
from ocannl.lowlevel.identifiers import sanitize_identifier

_symbol_ids = session.Counter()


@dataclass(frozen=True, eq=False)
class Symbol:
    """A loop iterator of one assignment's product space. Identity is the object itself."""

    id: int = field(default_factory=lambda: next(_symbol_ids))

    def __repr__(self) -> str:
        return f"i{self.id}"


class IndexSymbol:
    """A static index bound at run time, such as the batch number or the training step.

    ``xs[batch_n]`` slices the leftmost batch axis of ``xs`` at the bound value; a routine is
    compiled once and run with different bindings (``routine.run(batch_n=3)``). Used in
    arithmetic, an index symbol acts as a scalar tensor holding its bound value (the tensor
    frontend provides that conversion). ``size`` is the exclusive upper bound of its values, or
    ``None`` when unknown.

    ``name`` is the key ``routine.run`` binds the symbol by and may be any non-empty string
    (``run(**{"def": 3})`` binds a symbol named ``def``). Generated code never spells it: emitters
    name the symbol after :attr:`identifier`, made unique in their scope (identifiers.py).
    """

    __slots__ = ("name", "size")

    def __init__(self, name: str, size: int | None = None):
        if not isinstance(name, str) or not name:
            raise IndexBindingError(
                "IndexSymbol: the name is the key routine.run(...) binds the symbol by, a non-empty "
                f"string; got {name!r}"
            )
        if size is not None and (not isinstance(size, int) or size <= 0):
            raise IndexBindingError(f"IndexSymbol {name!r}: size must be a positive int, got {size!r}")
        self.name = name
        self.size = size

    @property
    def identifier(self) -> str:
        """The base of the symbol's names in generated code: its name sanitized (``sym`` when
        nothing is left). It may be reserved, or shared by symbols whose names differ only in
        what sanitizing drops, so an emitter claims it in its scope's
        :class:`~ocannl.lowlevel.identifiers.Namespace`."""
        return sanitize_identifier(self.name) or "sym"

    def __repr__(self) -> str:
        return f"IndexSymbol({self.name!r}, {self.size})"


AnySymbol = Union[Symbol, IndexSymbol]


@dataclass(frozen=True)
class Fixed:
    """A constant position along an axis."""

    index: int

    def __str__(self) -> str:
        return str(self.index)


@dataclass(frozen=True)
class Iter:
    """The axis is indexed by a loop iterator or a static index symbol."""

    symbol: AnySymbol

    def __str__(self) -> str:
        return symbol_name(self.symbol)


@dataclass(frozen=True)
class Affine:
    """``sum(coeff * symbol) + offset``: strided and convolution axes (``stride*o + dilation*k -
    pad``). Produced for operand (input-side) axes only; an index that may fall outside the
    operand's dims reads the assignment's neutral element there (padded convolution)."""

    terms: tuple[tuple[int, AnySymbol], ...]
    offset: int = 0

    def __str__(self) -> str:
        parts = [symbol_name(s) if c == 1 else f"{c}*{symbol_name(s)}" for c, s in self.terms]
        if self.offset or not parts:
            parts.append(str(self.offset))
        return "+".join(parts).replace("+-", "-")


AxisIndex = Union[Fixed, Iter, Affine]


def symbol_name(s: AnySymbol) -> str:
    return s.name if isinstance(s, IndexSymbol) else f"i{s.id}"


def index_symbols(idx: AxisIndex) -> tuple[AnySymbol, ...]:
    """The symbols an axis index depends on."""
    if isinstance(idx, Iter):
        return (idx.symbol,)
    if isinstance(idx, Affine):
        return tuple(s for _, s in idx.terms)
    return ()


def index_bounds(
    idx: AxisIndex, symbol_bounds: Callable[[AnySymbol], tuple[int, int] | None]
) -> tuple[int, int] | None:
    """The least and greatest value ``idx`` takes when each symbol ``s`` ranges over the closed
    interval ``symbol_bounds(s)`` (``None``: unknown, and then so is the result). Lowering uses
    it to find padded reads, the interpreter to skip bounds checks it can prove.

    A symbol over an empty interval (the index of a loop of extent 0, ``(0, -1)``) gives ``idx``
    no value at all: the result is then the empty interval ``(0, -1)``, inside every axis, since
    no access through it ever happens."""
    if isinstance(idx, Fixed):
        return idx.index, idx.index
    terms, lo = (((1, idx.symbol),), 0) if isinstance(idx, Iter) else (idx.terms, idx.offset)
    hi = lo
    empty = False
    for c, s in terms:
        bounds = symbol_bounds(s)
        if bounds is None:
            return None
        empty |= bounds[0] > bounds[1]
        lo += min(c * bounds[0], c * bounds[1])
        hi += max(c * bounds[0], c * bounds[1])
    return (0, -1) if empty else (lo, hi)


@dataclass(frozen=True)
class Projections:
    """How one accumulating assignment iterates.

    ``product_space[k]`` is the extent of loop ``product_iterators[k]``; loops are nested in this
    order. ``project_lhs`` has one index per axis of the result (memory order: batch, output,
    input), ``project_rhs[j]`` one per axis of operand ``j``. A product iterator absent from
    ``project_lhs`` is a reduction: the assignment accumulates over it. An axis of size 1 is never
    a loop (it gets ``Fixed(0)``). Index symbols (static) may appear in any index; they are not
    part of the product space.
    """

    product_space: tuple[int, ...]
    product_iterators: tuple[Symbol, ...]
    lhs_dims: tuple[int, ...]
    rhs_dims: tuple[tuple[int, ...], ...]
    project_lhs: tuple[AxisIndex, ...]
    project_rhs: tuple[tuple[AxisIndex, ...], ...]
    debug: str = ""

    def __post_init__(self) -> None:
        assert len(self.product_space) == len(self.product_iterators)
        assert len(self.lhs_dims) == len(self.project_lhs), (self.lhs_dims, self.project_lhs)
        assert len(self.rhs_dims) == len(self.project_rhs)
        for dims, proj in zip(self.rhs_dims, self.project_rhs):
            assert len(dims) == len(proj), (dims, proj)

    def reduction_iterators(self) -> tuple[Symbol, ...]:
        written = {s for idx in self.project_lhs for s in index_symbols(idx)}
        return tuple(s for s in self.product_iterators if s not in written)

    def is_surjective(self) -> bool:
        """Every cell of the result is written by some iteration."""
        covered = 0
        seen: set[AnySymbol] = set()
        iter_extent = dict(zip(self.product_iterators, self.product_space))
        for idx, d in zip(self.project_lhs, self.lhs_dims):
            if isinstance(idx, Fixed):
                if d > 1 or idx.index != 0:
                    return False
            elif isinstance(idx, Iter):
                if isinstance(idx.symbol, IndexSymbol) or iter_extent.get(idx.symbol) != d:
                    return False
                if idx.symbol in seen:  # a repeated loop (a diagonal) leaves cells unwritten
                    return False
                seen.add(idx.symbol)
            else:
                return False
            covered += 1
        return covered == len(self.lhs_dims)

    def is_injective(self) -> bool:
        """No two iterations write the same cell of the result: every product iterator (of
        extent other than 1) indexes its own result axis directly. An iterator of extent 0 that
        indexes no result axis is an empty reduction: no iteration writes the result, so it is
        not injective and lowering resets the result to the neutral element."""
        seen: set[Symbol] = set()
        for idx in self.project_lhs:
            if isinstance(idx, Iter) and isinstance(idx.symbol, Symbol):
                if idx.symbol in seen:
                    return False
                seen.add(idx.symbol)
            elif isinstance(idx, Affine):
                return False
        return all(s in seen for s, n in zip(self.product_iterators, self.product_space) if n != 1)

    def __str__(self) -> str:
        def idxs(p: tuple[AxisIndex, ...]) -> str:
            return "[" + ", ".join(str(i) for i in p) + "]"

        loops = ", ".join(f"{symbol_name(s)}<{n}" for s, n in zip(self.product_iterators, self.product_space))
        rhs = "; ".join(idxs(p) for p in self.project_rhs)
        return f"for {loops}: {idxs(self.project_lhs)} <- {rhs}"
