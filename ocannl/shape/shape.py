"""Shapes: three rows of dims (batch, input, output), with variables for what is not known yet.

A :class:`Shape` has one :class:`Row` per axis kind (docs/shapes.md). The memory layout of a
tensor is batch axes, then output axes, then input axes, row-major. A row is a tuple of dims, each
an ``int`` or a :class:`DimVar`, and may be *open*: a :class:`RowVar` stands for any number of
further axes between its left flank ``beg`` and its right flank ``end``. Variables are solved
by ``solver.py``; a shape read before inference finishes shows ``?`` for an unknown dim and ``...``
for an open row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ocannl import session

KINDS = ("batch", "output", "input")
"""Axis kinds in memory order."""

_var_ids = session.Counter()


class _Variable:
    """An unknown of shape inference. Identity is the object; ``id`` numbers the variables of a
    session in order of creation and ``name`` (a spec label, or the parameter's label) is for
    messages only."""

    __slots__ = ("id", "name")

    def __init__(self, name: str = ""):
        self.id = next(_var_ids)
        self.name = name


class DimVar(_Variable):
    """An unknown dimension."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"?{self.name}{self.id}" if self.name else f"?{self.id}"


class RowVar(_Variable):
    """An unknown number of axes (a row variable: ``...`` or ``..r..`` in specs)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"..{self.name or 'r'}{self.id}.."


Dim = Union[int, DimVar]


@dataclass(frozen=True)
class Row:
    """``beg + (axes of var) + end``; closed (``var is None``) rows keep every axis in ``end``, so
    a closed operand aligns to the right when broadcasting, as in numpy."""

    beg: tuple[Dim, ...] = ()
    var: RowVar | None = None
    end: tuple[Dim, ...] = ()

    def __post_init__(self) -> None:
        if self.var is None and self.beg:
            object.__setattr__(self, "end", self.beg + self.end)
            object.__setattr__(self, "beg", ())

    @staticmethod
    def closed(dims: tuple[Dim, ...] | list[Dim]) -> "Row":
        return Row((), None, tuple(dims))

    @staticmethod
    def open(name: str = "") -> "Row":
        return Row((), RowVar(name), ())

    @property
    def is_closed(self) -> bool:
        return self.var is None

    @property
    def dims(self) -> tuple[Dim, ...]:
        """The axes of a closed row."""
        assert self.var is None, "dims of an open row"
        return self.end

    @property
    def n_known_axes(self) -> int:
        return len(self.beg) + len(self.end)

    def is_concrete(self) -> bool:
        return self.var is None and all(isinstance(d, int) for d in self.end)

    def __str__(self) -> str:
        def show(d: Dim) -> str:
            return str(d) if isinstance(d, int) else "?"

        parts = [show(d) for d in self.beg]
        if self.var is not None:
            parts.append("...")
        parts += [show(d) for d in self.end]
        return "[" + ", ".join(parts) + "]"


EMPTY_ROW = Row()


@dataclass(eq=False, repr=False, slots=True)
class Shape:
    """The three rows of one tensor. Rows are replaced (never mutated) as inference learns more;
    a shape is the same shape only as the same object (the solver tracks shapes by identity)."""

    batch: Row
    output: Row
    input: Row
    tensor_label: str = ""
    is_param: bool = False
    is_terminal: bool = False
    explanations: list[str] = field(default_factory=list, init=False)
    """Why each axis closed as it did, for ``oc.explain_shapes``."""
    used: bool = field(default=False, init=False)
    """Some operation reads this tensor."""

    def row(self, kind: str) -> Row:
        return getattr(self, kind)

    def set_row(self, kind: str, row: Row) -> None:
        setattr(self, kind, row)

    def rows(self) -> tuple[Row, Row, Row]:
        return (self.batch, self.output, self.input)

    def is_concrete(self) -> bool:
        return all(r.is_concrete() for r in self.rows())

    def dims(self) -> tuple[int, ...]:
        """All axes in memory order (batch, output, input); only valid once concrete."""
        assert self.is_concrete(), f"shape not inferred yet: {self}"
        return tuple(self.batch.end + self.output.end + self.input.end)  # type: ignore[operator]

    def __str__(self) -> str:
        return format_rows(self.batch, self.output, self.input)


def format_rows(batch: Row, output: Row, input: Row) -> str:
    """``batch [10] output [16] input [2]``; empty rows are left out (a scalar prints ``[]``)."""
    parts = [f"{kind} {row}" for kind, row in zip(KINDS, (batch, output, input))
             if not (row.is_closed and not row.end)]
    return " ".join(parts) if parts else "[]"
