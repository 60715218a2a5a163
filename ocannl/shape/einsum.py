"""The generalized einsum language: spec strings parsed to a small AST (spec/frontend.md §2).

A spec such as ``"b|i->o; b|h->i => b|h->o"`` lists operand shape specs separated by ``;`` and the
result after ``=>``. Each shape spec has up to three rows: ``batch|input->output`` (``|`` ends the
batch part, ``->`` separates input from output; a kind not written is an empty, closed row). A
row lists axes, and may hold one row variable (``...`` or ``..name..``) standing for any number of
further axes; a row without one is closed.

The AST produced here is consumed by shape inference (``solver.py``) and the projections. It
carries the character offset of every axis so errors can point at the spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ocannl.errors import EinsumSyntaxError

__all__ = [
    "Label",
    "FixedIndex",
    "ConvTerm",
    "ConcatAxis",
    "Axis",
    "RowSpec",
    "ShapeSpec",
    "EinsumSpec",
    "parse_einsum",
    "parse_shape_spec",
    "is_multichar",
    "EinsumSyntaxError",
]


@dataclass(frozen=True)
class Label:
    """A dimension variable local to the spec; equal names are the same axis (same size, same
    loop). ``_`` is an ordinary label name."""

    name: str
    pos: int = 0


@dataclass(frozen=True)
class FixedIndex:
    """An integer in an axis slot. In an einsum it is a fixed index (the axis is read/written at
    that position only, and its size must exceed it); in a plain shape spec it is a dim size."""

    value: int
    pos: int = 0


@dataclass(frozen=True)
class ConvTerm:
    """An input-side axis indexed ``stride*over + offset + dilation*kernel``.

    ``kernel is None`` is a pure strided axis (``2*o`` or ``2*o+1``, no kernel). ``use_padding``
    is ``True`` for ``=+`` (padded: ``in = stride*out``), ``False`` for ``<+`` (valid:
    ``in = stride*(out-1) + dilation*(k-1) + 1``) and ``None`` when the spec leaves it out (then
    ``oc.einsum(..., use_padding=...)`` must say). ``offset`` (0 <= offset < stride) shifts the
    index only.
    """

    over: str
    stride: int = 1
    kernel: str | None = None
    dilation: int = 1
    offset: int = 0
    use_padding: bool | None = None
    pos: int = 0


@dataclass(frozen=True)
class ConcatAxis:
    """``a^b^c``: one axis of size ``|a|+|b|+|c|`` made of the labelled component axes."""

    parts: tuple[str, ...]
    pos: int = 0


Axis = Union[Label, FixedIndex, ConvTerm, ConcatAxis]


@dataclass(frozen=True)
class RowSpec:
    """One row of a shape spec.

    ``before`` are the axes left of the row variable (anchored at the row's left edge), ``after``
    those right of it (anchored at the right edge). ``row_var`` is ``None`` for a closed row (then
    every axis is in ``before`` and ``after`` is empty); for ``...`` it is the row's kind name
    (``"batch"``, ``"input"`` or ``"output"``), for ``..r..`` it is ``"r"``. Row variables of one
    spec are shared by name, also across kinds.
    """

    before: tuple[Axis, ...] = ()
    row_var: str | None = None
    after: tuple[Axis, ...] = ()
    row_var_pos: int = 0

    @property
    def closed(self) -> bool:
        return self.row_var is None

    @property
    def axes(self) -> tuple[Axis, ...]:
        return self.before + self.after


@dataclass(frozen=True)
class ShapeSpec:
    """A shape spec: three rows (a kind absent from the text is closed and empty)."""

    batch: RowSpec = RowSpec()
    input: RowSpec = RowSpec()
    output: RowSpec = RowSpec()
    text: str = ""
    pos: int = 0

    def row(self, kind: str) -> RowSpec:
        return getattr(self, kind)


@dataclass(frozen=True)
class EinsumSpec:
    """``operands[0]; operands[1]; ... => result``."""

    operands: tuple[ShapeSpec, ...]
    result: ShapeSpec
    text: str
    multichar: bool


def is_multichar(spec: str) -> bool:
    """Multi-character mode iff the spec contains any of ``, * + ^ & <`` or an ``=`` not followed
    by ``>`` (spec/frontend.md §2.1). Otherwise every letter is its own axis label."""
    raise NotImplementedError  # written by the parser


def parse_einsum(spec: str) -> EinsumSpec:
    """Parse ``operand; ... => result``. Raises :class:`EinsumSyntaxError` pointing at the
    offending character."""
    raise NotImplementedError  # written by the parser


def parse_shape_spec(spec: str) -> ShapeSpec:
    """Parse a single shape spec (no ``=>``), as used for layouts and label specs."""
    raise NotImplementedError  # written by the parser
