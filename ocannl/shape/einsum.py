"""The generalized einsum language: spec strings parsed to a small AST (docs/shapes.md).

A spec such as ``"b|i->o; b|h->i => b|h->o"`` lists operand shape specs separated by ``;`` and the
result after ``=>``. Each shape spec has up to three rows: ``batch|input->output`` (``|`` ends the
batch part, ``->`` separates input from output; a kind not written is an empty, closed row). A
row lists axes, and may hold one row variable (``...`` or ``..name..``) standing for any number of
further axes; a row without one is closed.

The AST produced here is consumed by shape inference (``solver.py``) and the projections. It
carries the character offset of every axis so errors can point at the spec.

The parser is hand-written (a lexer, then recursive descent with one method per rule of the
grammar in docs/shapes.md, "Einsum grammar") because the grammar is small and every error must
name the exact character and what was expected there; a parser generator would add a dependency
and lose that precision.
:func:`format_einsum` prints an AST back to a spec that parses to the same AST.
"""

from __future__ import annotations

import re
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
    "format_einsum",
    "format_shape_spec",
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


# --- Lexing ------------------------------------------------------------------------------------

_MULTICHAR_TRIGGER = re.compile(r"[,*+^&<]|=(?!>)")
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DIGITS = frozenset("0123456789")
_IDENT_TAIL = _LETTERS | _DIGITS | {"_"}
# Longest first, so that "..." wins over "..", and "->"/"=>" over a lone "-"/"=".
_PUNCTUATION = ("...", "->", "=>", "..", ",", "|", ";", "+", "*", "^", "=", "<")
_ROW_END = ("|", "->", ";", "=>", "eof")
_KINDS_BY_SEPARATORS = {
    (): ("output",),
    ("|",): ("batch", "output"),
    ("->",): ("input", "output"),
    ("|", "->"): ("batch", "input", "output"),
}


def is_multichar(spec: str) -> bool:
    """Multi-character mode iff the spec contains any of ``, * + ^ & <`` or an ``=`` not followed
    by ``>``. Otherwise every letter is its own axis label."""
    return _MULTICHAR_TRIGGER.search(spec) is not None


@dataclass(frozen=True)
class _Token:
    kind: str  # "ident", "int", "_", "eof", or the punctuation itself ("->", "...", ...)
    text: str
    pos: int

    @property
    def end(self) -> int:
        return self.pos + len(self.text)

    def describe(self) -> str:
        return "the end of the spec" if self.kind == "eof" else repr(self.text)


def _lex(spec: str, multichar: bool) -> list[_Token]:
    """Split ``spec`` into tokens, ending with an ``eof`` token at ``len(spec)``.

    The two modes differ only in identifiers: in single-char mode each letter is a label of its
    own (``ijk`` is three axes), in multichar mode an identifier is ``[A-Za-z][A-Za-z0-9_]*`` and
    axes are separated by commas. The characters that would need multichar mode cannot occur in a
    single-char spec, since they are exactly what selects multichar mode.
    """
    tokens: list[_Token] = []
    i, n = 0, len(spec)
    while i < n:
        c = spec[i]
        if c.isspace():
            i += 1
            continue
        if c in _LETTERS:
            j = i + 1
            while multichar and j < n and spec[j] in _IDENT_TAIL:
                j += 1
            tokens.append(_Token("ident", spec[i:j], i))
        elif c in _DIGITS:
            j = i + 1
            while j < n and spec[j] in _DIGITS:
                j += 1
            tokens.append(_Token("int", spec[i:j], i))
        elif c == "_":
            tokens.append(_Token("_", "_", i))
        elif c == "&":
            raise EinsumSyntaxError(spec, i, "'&' is reserved and cannot be used in a spec")
        else:
            punct = next((p for p in _PUNCTUATION if spec.startswith(p, i)), None)
            if punct is None:
                raise EinsumSyntaxError(spec, i, _unexpected_character(spec, i, multichar))
            tokens.append(_Token(punct, punct, i))
        i = tokens[-1].end
    tokens.append(_Token("eof", "", n))
    return tokens


def _unexpected_character(spec: str, i: int, multichar: bool) -> str:
    c = spec[i]
    if c == ".":
        return "expected '...' or '..name..': a lone '.' is not a row variable"
    if c == "-" and spec[i + 1 : i + 2] in _DIGITS:
        return "expected a non-negative integer: strides, dilations, offsets and indices cannot be negative"
    if c == "-":
        return "expected '>' after '-' ('->' separates the input row from the output row)"
    mode = "multichar" if multichar else "single-char"
    return f"unexpected character {c!r} in {mode} mode"


# --- Parsing -----------------------------------------------------------------------------------


@dataclass
class _RawRow:
    """A row before its kind is known: ``...`` is named after the kind, which only the
    separators that follow the row decide (``a|...`` vs ``a->...``)."""

    before: list[Axis]
    after: list[Axis]
    has_var: bool = False
    var_name: str | None = None  # None for "...", the name for "..name.."
    var_pos: int = 0  # where the ellipsis starts
    name_pos: int = 0  # where an error about the name should point

    def finish(self, kind: str) -> RowSpec:
        if not self.has_var:
            return RowSpec(tuple(self.before))
        return RowSpec(tuple(self.before), self.var_name or kind, tuple(self.after), self.var_pos)


class _Parser:
    """Recursive descent over the token list, one method per rule of the grammar.

    Besides the grammar it checks what can be checked without shapes: one row variable per row,
    no name both an axis label and a row variable, stride and dilation positive and
    ``0 <= offset < stride``. Every error points at the offending token.
    """

    def __init__(self, spec: str):
        self.spec = spec
        self.multichar = is_multichar(spec)
        self.tokens = _lex(spec, self.multichar)
        self.i = 0
        # First occurrence of each name, as a label and as a row variable, across the whole spec.
        self.label_at: dict[str, int] = {}
        self.row_var_at: dict[str, int] = {}
        self.pending_labels: list[tuple[int, str]] = []  # label uses of the current shape spec

    # Token access.
    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        tok = self.tokens[self.i]
        self.i = min(self.i + 1, len(self.tokens) - 1)
        return tok

    def error(self, where: _Token | int, expected: str) -> EinsumSyntaxError:
        pos = where if isinstance(where, int) else where.pos
        return EinsumSyntaxError(self.spec, pos, expected)

    def expect_label(self, after: str) -> _Token:
        tok = self.peek()
        if tok.kind != "ident":
            raise self.error(tok, f"expected an axis label after {after!r}, not {tok.describe()}")
        self.advance()
        self.pending_labels.append((tok.pos, tok.text))
        return tok

    # einsum := shape (';' shape)* '=>' shape EOF
    def einsum(self) -> EinsumSpec:
        operands = [self.operand()]
        while self.peek().kind == ";":
            self.advance()
            operands.append(self.operand())
        if self.peek().kind != "=>":
            raise self.error(self.peek(), "expected '=>' and a result spec")
        self.advance()
        result, empty = self.shape()
        tok = self.peek()
        if empty and tok.kind not in ("eof", "=>"):
            raise self.error(tok, "expected a result spec after '=>'")
        # An empty result (``i;i=>``) is a scalar, as numpy's ``i,i->``.
        if tok.kind == "=>":
            raise self.error(tok, "expected one '=>' only: operands ';' ... '=>' one result spec")
        if tok.kind != "eof":
            hint = " (operands, separated by ';', all come before '=>')" if tok.kind == ";" else ""
            raise self.error(tok, f"expected the end of the spec after the result, "
                             f"not {tok.describe()}{hint}")
        return EinsumSpec(tuple(operands), result, self.spec, self.multichar)

    def operand(self) -> ShapeSpec:
        spec, empty = self.shape()
        if empty:
            tok = self.peek()
            where = "" if tok.kind == "eof" else f" before {tok.describe()}"
            raise self.error(tok, f"expected an operand shape spec{where}")
        return spec

    # shape := row ['|' row] ['->' row], kinds by separator; returns (spec, whether it was empty).
    def shape(self) -> tuple[ShapeSpec, bool]:
        start = self.i
        self.pending_labels = []
        rows = [self.row()]
        separators: list[str] = []
        while (sep := self.peek()).kind in ("|", "->"):
            if sep.kind in separators:
                raise self.error(sep, f"expected at most one {sep.text!r} in a shape spec "
                                 "(batch|input->output)")
            if sep.kind == "|" and separators:
                raise self.error(sep, "expected '|' before '->': the batch row comes first "
                                 "(batch|input->output)")
            separators.append(self.advance().kind)
            rows.append(self.row())
        tok = self.peek()
        if tok.kind not in (";", "=>", "eof"):
            raise self.error(tok, f"expected an axis label before {tok.describe()}")
        kinds = _KINDS_BY_SEPARATORS[tuple(separators)]
        finished = {kind: raw.finish(kind) for kind, raw in zip(kinds, rows)}
        self.check_names(rows, kinds)
        if self.i == start:
            return ShapeSpec(pos=tok.pos), True
        first, last = self.tokens[start], self.tokens[self.i - 1]
        return ShapeSpec(**finished, text=self.spec[first.pos : last.end], pos=first.pos), False

    # row := axes and at most one ELL, commas between axes in multichar mode
    def row(self) -> _RawRow:
        raw = _RawRow([], [])
        while True:
            tok = self.peek()
            if tok.kind in ("...", ".."):
                if raw.has_var:
                    raise self.error(tok, "expected at most one row variable ('...' or '..name..') in a row")
                self.row_var(raw)
                if self.multichar and self.peek().kind == ",":
                    self.advance()
                continue
            if tok.kind == ",":
                raise self.error(tok, "expected an axis before ','")
            if tok.kind not in ("ident", "int", "_"):
                return raw
            (raw.after if raw.has_var else raw.before).append(self.axis())
            nxt = self.peek()
            if self.multichar and nxt.kind == ",":
                self.advance()
            elif self.multichar and nxt.kind not in _ROW_END + ("...", ".."):
                raise self.error(nxt, f"expected ',' between axes, before {nxt.describe()}")

    # ELL := '...' | '..' IDENT '..'
    def row_var(self, raw: _RawRow) -> None:
        ell = self.advance()
        raw.has_var, raw.var_pos, raw.name_pos = True, ell.pos, ell.pos
        if ell.kind == "...":
            return
        name = self.peek()
        if name.kind != "ident":
            raise self.error(name, f"expected a row variable name after '..', not {name.describe()}")
        self.advance()
        raw.var_name, raw.name_pos = name.text, name.pos
        close = self.peek()
        if close.kind != "..":
            hint = "" if self.multichar else " (in single-char mode a row variable name is one letter)"
            raise self.error(close, f"expected '..' to close the row variable '..{name.text}'{hint}")
        self.advance()

    def check_names(self, rows: list[_RawRow], kinds: tuple[str, ...]) -> None:
        """No name may be both a dim label and a row variable; shape inference keeps one
        environment per spec. Uses are visited in text order so the error points at the later one.
        ``...`` counts as a use of its kind's name."""
        uses = [(pos, name, None) for pos, name in self.pending_labels]
        uses += [(raw.name_pos, raw.var_name or kind, kind if raw.var_name is None else "")
                 for kind, raw in zip(kinds, rows) if raw.has_var]
        for pos, name, row_var in sorted(uses):
            if row_var is not None and name in self.label_at:
                what = f"'...' in the {row_var} row is the row variable {name!r}" if row_var else f"{name!r}"
                raise self.error(pos, f"expected a row variable name other than {name!r}: {what}, "
                                 f"but {name!r} is an axis label in this spec (rename one of them)")
            if row_var is None and name in self.row_var_at:
                raise self.error(pos, f"expected an axis label other than {name!r}, "
                                 f"since {name!r} is a row variable in this spec (rename one of them)")
            (self.label_at if row_var is None else self.row_var_at).setdefault(name, pos)

    # axis := INT | IDENT | '_' | IDENT ('^' IDENT)+ | affine
    def axis(self) -> Axis:
        tok = self.advance()
        nxt = self.peek().kind
        if tok.kind == "_":
            return Label("_", tok.pos)
        if tok.kind == "int":
            if nxt == "*":
                return self.affine(tok, self.positive(tok, "stride"))
            if nxt == "^":
                raise self.error(tok, "expected an axis label: concatenation components are labels, "
                                 "not integers")
            return FixedIndex(int(tok.text), tok.pos)
        self.pending_labels.append((tok.pos, tok.text))
        if nxt == "^":
            parts = [tok.text]
            while self.peek().kind == "^":
                self.advance()
                parts.append(self.expect_label("^").text)
            return ConcatAxis(tuple(parts), tok.pos)
        if nxt == "*":
            raise self.error(tok, _symbolic(tok.text, "stride"))
        if nxt in ("=", "<", "+"):
            return self.affine(tok, None, over=tok.text)
        return Label(tok.text, tok.pos)

    def positive(self, tok: _Token, what: str) -> int:
        if int(tok.text) <= 0:
            raise self.error(tok, f"expected a positive {what}, not {tok.text}")
        return int(tok.text)

    # affine := [S '*'] over [PAD] '+' [INT '+'] [D '*'] kernel | S '*' over ['+' INT]
    def affine(self, start: _Token, stride: int | None, over: str | None = None) -> ConvTerm:
        """A convolution or strided input axis (docs/shapes.md, "Convolution terms").
        ``stride`` is None when the term starts with its ``over`` label (then the stride is 1 and
        a kernel is required)."""
        if over is None:
            self.advance()  # '*'
            over = self.expect_label("*").text
        fields = dict(over=over, stride=stride or 1, pos=start.pos)
        pad = self.peek()
        if pad.kind in ("=", "<"):
            self.advance()
            fields["use_padding"] = pad.kind == "="
        else:
            pad = None
        if self.peek().kind != "+":
            if pad is not None:
                raise self.error(self.peek(), f"expected '+' and a kernel label after {pad.text!r}")
            return ConvTerm(**fields)  # strided: only reachable with an explicit stride
        self.advance()
        tok, nxt = self.peek(), self.peek(1).kind
        if tok.kind == "int" and nxt not in ("*", "+"):  # S*over+offset: strided, no kernel
            self.advance()
            if pad is not None or stride is None:
                why = (f"{pad.text!r} pads a convolution" if pad is not None
                       else "an offset without a kernel needs a stride, as in '2*o+1'")
                raise self.error(self.peek(), f"expected '+' and a kernel label after the offset ({why})")
            return ConvTerm(**fields, offset=self.offset(tok, fields["stride"]))
        if tok.kind == "int" and nxt == "+":
            self.advance()
            self.advance()
            fields["offset"] = self.offset(tok, fields["stride"])
            tok, nxt = self.peek(), self.peek(1).kind
        if tok.kind == "int" and nxt == "*":
            fields["dilation"] = self.positive(self.advance(), "dilation")
            self.advance()
            fields["kernel"] = self.expect_label("*").text
        elif tok.kind == "ident" and nxt == "*":
            raise self.error(tok, _symbolic(tok.text, "dilation"))
        else:
            fields["kernel"] = self.expect_label("+").text
        return ConvTerm(**fields)

    def offset(self, tok: _Token, stride: int) -> int:
        value = int(tok.text)
        if value >= stride:
            raise self.error(tok, f"expected an offset smaller than the stride {stride} "
                             f"(0 <= offset < stride), not {value}")
        return value


def _symbolic(name: str, what: str) -> str:
    return (f"expected an integer {what}, not the name {name!r}: substitute its value, "
            f"e.g. with an f-string f\"{{{name}}}*...\"")


def parse_einsum(spec: str) -> EinsumSpec:
    """Parse ``operand; ... => result`` (docs/shapes.md, "Einsum grammar"). Raises
    :class:`EinsumSyntaxError` pointing at the offending character (``len(spec)`` when the spec
    ends too early)."""
    return _Parser(spec).einsum()


def parse_shape_spec(spec: str) -> ShapeSpec:
    """Parse a single shape spec (no ``;``, no ``=>``), as used for layouts and label specs.

    Same grammar as an einsum slot (the ``shape`` rule); integers here are dim sizes, still
    represented as :class:`FixedIndex`. The empty spec is a shape with no axes at all.
    """
    parser = _Parser(spec)
    result, _ = parser.shape()
    tok = parser.peek()
    if tok.kind != "eof":
        raise parser.error(tok, f"expected the end of the shape spec, not {tok.describe()} "
                           "(';' and '=>' belong to einsum specs)")
    return result


# --- Printing: the inverse of parsing, for messages and round trips ------------------------------


def _format_axis(axis: Axis) -> str:
    if isinstance(axis, Label):
        return axis.name
    if isinstance(axis, FixedIndex):
        return str(axis.value)
    if isinstance(axis, ConcatAxis):
        return "^".join(axis.parts)
    text = f"{axis.stride}*{axis.over}" if axis.stride != 1 or axis.kernel is None else axis.over
    text += {None: "", True: "=", False: "<"}[axis.use_padding]
    if axis.kernel is None:
        return text + (f"+{axis.offset}" if axis.offset else "")
    text += f"+{axis.offset}+" if axis.offset else "+"
    return text + (f"{axis.dilation}*{axis.kernel}" if axis.dilation != 1 else axis.kernel)


def _format_row(row: RowSpec, kind: str, multichar: bool) -> str:
    items = [_format_axis(a) for a in row.before]
    if row.row_var is not None:
        items.append("..." if row.row_var == kind else f"..{row.row_var}..")
    items += [_format_axis(a) for a in row.after]
    if multichar:
        return ", ".join(items)
    # Single-char mode: adjacency separates axes, but two integers need a space (`2 3`, not `23`).
    text = ""
    for item in items:
        text += " " + item if text[-1:] in _DIGITS and item[0] in _DIGITS else item
    return text


def _fits_single_char(shapes: tuple[ShapeSpec, ...]) -> bool:
    for shape in shapes:
        for kind in ("batch", "input", "output"):
            row = shape.row(kind)
            if row.row_var not in (None, kind) and len(row.row_var) != 1:
                return False
            for axis in row.axes:
                if isinstance(axis, (ConvTerm, ConcatAxis)):
                    return False
                if isinstance(axis, Label) and len(axis.name) != 1:
                    return False
    return True


def format_shape_spec(spec: ShapeSpec, multichar: bool = True, trailing_comma: bool = False) -> str:
    """Print a shape spec in the shortest form of the grammar that keeps every row; ``trailing_comma``
    ends the first non-empty row with ``,`` (to select multichar mode)."""
    rows = {k: _format_row(spec.row(k), k, multichar) for k in ("batch", "input", "output")}
    if trailing_comma:
        first = next((k for k, text in rows.items() if text), None)
        if first is not None:
            rows[first] += ","
    batch, input, output = rows.values()
    if batch and input:
        return f"{batch}|{input}->{output}"
    if batch:
        return f"{batch}|{output}"
    return f"{input}->{output}" if input or not output else output


def format_einsum(spec: EinsumSpec) -> str:
    """Print ``spec`` so that :func:`parse_einsum` gives it back (positions aside).

    Single-char mode is kept when ``spec.multichar`` is false and every name fits it; otherwise the
    spec is printed in multichar mode, with a trailing comma where nothing else would select that
    mode: ``oh, => oh`` rather than ``oh => oh``, which would mean ``o, h => o, h``.
    """
    shapes = spec.operands + (spec.result,)
    multichar = spec.multichar or not _fits_single_char(shapes)

    def join(parts: list[str]) -> str:
        return "; ".join(parts[:-1]) + " => " + parts[-1]

    text = join([format_shape_spec(s, multichar) for s in shapes])
    if multichar and not is_multichar(text):
        marked = next((i for i, s in enumerate(shapes) if format_shape_spec(s, True) not in ("", "->")), None)
        if marked is not None:
            text = join([format_shape_spec(s, True, i == marked) for i, s in enumerate(shapes)])
    return text
