"""Shape logics: how an operation's result shape relates to its operands' (docs/shapes.md).

Each logic does two things, at two times:

* when the operation is built, :meth:`ShapeLogic.constraints` states the relation as solver
  constraints (broadcasting inequalities for pointwise ops and compose, equations for einsum);
* once shapes are concrete, :meth:`ShapeLogic.layout` names, for every axis of the result and of
  each operand, the loop that indexes it (``projections.py`` turns that into Projections).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field

from ocannl.errors import ShapeError
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.shape import einsum as es
from ocannl.shape.projections import At, Conv, Loop, Static, Strided, Term, padding_left
from ocannl.shape.shape import KINDS, Dim, DimVar, Row, RowVar, Shape
from ocannl.shape.solver import (AtLeast, BroadcastRank, ConcatDim, Constraint, ConvDim, DimEq, Origin, RowEq,
                                 RowIneq, Solver, Where, shape_error)


class ShapeLogic(abc.ABC):
    """Base of the shape logics. ``operands`` are the operand shapes in order."""

    @abc.abstractmethod
    def constraints(self, result: Shape, operands: list[Shape], origin: Origin) -> list[Constraint]:
        """The relation of the result's rows to the operands' rows, as solver constraints."""

    @abc.abstractmethod
    def layout(self, result: Shape, operands: list[Shape], solver: Solver) -> list[list[Term]]:
        """Once shapes are concrete: the axis terms of the result and of each operand."""


def _sides(j: int, n: int) -> tuple[str, str]:
    return ("result", "operand" if n == 1 else f"operand {j + 1}")


def _broadcast_terms(res_dims: tuple[int, ...], opnd_dims: tuple[int, ...], key: str) -> list[Term]:
    """Right-aligned numpy broadcasting: operand axis ``p`` shares the loop of the result axis it
    aligns with, or reads position 0 where it has size 1 and the result axis does not."""
    n, m = len(res_dims), len(opnd_dims)
    terms: list[Term] = []
    for p, d in enumerate(opnd_dims):
        r = res_dims[n - m + p]
        terms.append(At(0) if d == 1 and r != 1 else Loop((key, m - 1 - p), d))
    return terms


def _own_terms(dims: tuple[int, ...], key: str) -> list[Term]:
    n = len(dims)
    return [Loop((key, n - 1 - p), d) for p, d in enumerate(dims)]


@dataclass
class Pointwise(ShapeLogic):
    """Result rows are the numpy broadcast of the operands' rows, kind by kind."""

    def constraints(self, result, operands, origin):
        out: list[Constraint] = [RowIneq(result.row(k), s.row(k), origin, Where(k, None, _sides(j, len(operands))))
                                 for j, s in enumerate(operands) for k in KINDS]
        out += [BroadcastRank(result.row(k), tuple(s.row(k) for s in operands), origin, Where(k))
                for k in KINDS]
        return out

    def layout(self, result, operands, solver):
        res = [t for k in KINDS for t in _own_terms(result.row(k).dims, k)]  # type: ignore[arg-type]
        slots = [res]
        for s in operands:
            slots.append([t for k in KINDS
                          for t in _broadcast_terms(result.row(k).dims, s.row(k).dims, k)])  # type: ignore[arg-type]
        return slots


@dataclass
class Words(Pointwise):
    """Operands whose last output axis holds ``size`` words (``oc.threefry4x32``: the four words
    of a key and of a counter). The other axes broadcast as :class:`Pointwise`; the word axis is
    ``size`` in every operand, so it never broadcasts, and the result has it too. :meth:`layout`
    is the pointwise one (what ``oc.explain_shapes`` reads); the result is written one word at a
    time, through :meth:`word_layout`."""

    size: int

    def constraints(self, result, operands, origin):
        out = super().constraints(result, operands, origin)
        for j, s in enumerate(operands):
            words = Row((), RowVar("words"), (self.size,))
            sides = (_sides(j, len(operands))[1], f"{self.size} words")
            out.append(RowEq(s.output, words, origin, Where("output", -1, sides)))
        return out

    def word_layout(self, word: int, result: Shape, operands: list[Shape], solver: Solver) -> list[list[Term]]:
        """The axis terms of the assignment writing word ``word`` of the result: the result's
        word axis at ``word``; then each operand once per word, in order (operand 1's words 0 to
        ``size - 1``, then operand 2's...), its word axis at that word."""
        def at_word(terms: list[Term], position: int, k: int) -> list[Term]:
            return terms[:position] + [At(k)] + terms[position + 1:]

        def word_axis(s: Shape) -> int:
            return len(s.batch.dims) + len(s.output.dims) - 1

        res, *opnds = super().layout(result, operands, solver)
        slots = [at_word(res, word_axis(result), word)]
        for s, terms in zip(operands, opnds):
            slots += [at_word(terms, word_axis(s), k) for k in range(self.size)]
        return slots


@dataclass
class Compose(ShapeLogic):
    """``a @ b``: a's input axes contract with b's output axes (b's broadcast into a's); the
    result has a's output axes, b's input axes and the broadcast of both batch rows."""

    def constraints(self, result, operands, origin):
        a, b = operands
        return [
            RowIneq(a.input, b.output, origin, Where("input", None, ("left operand input", "right operand output"))),
            RowIneq(result.batch, a.batch, origin, Where("batch", None, ("result", "left operand"))),
            RowIneq(result.batch, b.batch, origin, Where("batch", None, ("result", "right operand"))),
            RowIneq(result.input, b.input, origin, Where("input", None, ("result", "right operand"))),
            RowIneq(result.output, a.output, origin, Where("output", None, ("result", "left operand"))),
            BroadcastRank(a.input, (b.output,), origin, Where("input")),
            BroadcastRank(result.batch, (a.batch, b.batch), origin, Where("batch")),
            BroadcastRank(result.input, (b.input,), origin, Where("input")),
            BroadcastRank(result.output, (a.output,), origin, Where("output")),
        ]

    def layout(self, result, operands, solver):
        a, b = operands
        rb, ro, ri = (result.row(k).dims for k in KINDS)
        res = _own_terms(rb, "b") + _own_terms(ro, "o") + _own_terms(ri, "i")  # type: ignore[arg-type]
        lhs = (_broadcast_terms(rb, a.batch.dims, "b") + _broadcast_terms(ro, a.output.dims, "o")  # type: ignore[arg-type]
               + _own_terms(a.input.dims, "c"))  # type: ignore[arg-type]
        rhs = (_broadcast_terms(rb, b.batch.dims, "b") + _broadcast_terms(a.input.dims, b.output.dims, "c")  # type: ignore[arg-type]
               + _broadcast_terms(ri, b.input.dims, "i"))  # type: ignore[arg-type]
        return [res, lhs, rhs]


@dataclass
class BatchSlice(ShapeLogic):
    """``xs[sym]``: the result is ``xs`` without its leftmost batch axis, read at the run-time
    value of ``sym``."""

    symbol: IndexSymbol

    def constraints(self, result, operands, origin):
        (s,) = operands
        # The sliced axis is a variable equated with the symbol's size by its own equation, so
        # that a size mismatch names the index symbol rather than the result.
        lead = DimVar(self.symbol.name)
        rb = result.batch
        sliced = Row((lead,) + rb.beg, rb.var, rb.end) if rb.var is not None else Row.closed((lead,) + rb.end)
        where = ("sliced operand", "result")
        out: list[Constraint] = [RowEq(s.batch, sliced, origin, Where("batch", None, where)),
                                 RowEq(s.output, result.output, origin, Where("output", None, where)),
                                 RowEq(s.input, result.input, origin, Where("input", None, where))]
        if self.symbol.size is not None:
            out.append(DimEq(lead, self.symbol.size, origin,
                             Where("batch", 0, ("sliced operand", f"index symbol {self.symbol.name!r}"))))
        return out

    def layout(self, result, operands, solver):
        (s,) = operands
        res = [t for k in KINDS for t in _own_terms(result.row(k).dims, k)]  # type: ignore[arg-type]
        src: list[Term] = [Static(self.symbol)] + res[:len(result.batch.dims)] + res[len(result.batch.dims):]
        return [res, src]


@dataclass
class Einsum(ShapeLogic):
    """Generalized einsum: every slot's rows *equal* its spec rows (no broadcasting).

    Spec labels become dim variables shared by every slot of this operation; row variables
    likewise. Fixed indices need the axis to be larger than the index; a result axis written at a
    fixed index closes to ``index + 1`` when nothing else sets it. Convolution terms relate the
    operand axis to the output and kernel axes (docs/shapes.md, "Convolution terms")."""

    spec: es.EinsumSpec
    use_padding: bool | None = None
    labels: dict[str, DimVar] = field(default_factory=dict)
    row_vars: dict[str, RowVar] = field(default_factory=dict)
    axis_dims: dict[int, DimVar] = field(default_factory=dict)  # id(axis node) -> its dim var
    active_part: int | None = None  # while laying out one component of a concatenation

    def _label(self, name: str) -> DimVar:
        v = self.labels.get(name)
        if v is None:
            v = self.labels[name] = DimVar(name)
        return v

    def _axis_dim(self, ax: es.Axis, slot: int, kind: str, position: int, origin: Origin,
                  out: list[Constraint]) -> Dim:
        where = Where(kind, position, ("spec", "result" if slot == 0 else f"operand {slot}"))
        if isinstance(ax, es.Label):
            return self._label(ax.name)
        v = DimVar()
        self.axis_dims[id(ax)] = v
        if isinstance(ax, es.FixedIndex):
            out.append(AtLeast(v, ax.value + 1, _at(origin, ax.pos), where, closes_to=slot == 0))
        elif isinstance(ax, es.ConvTerm):
            if slot == 0:
                raise shape_error(_at(origin, ax.pos), where,
                                  "a convolution term can only index an operand, not the result")
            use_padding = ax.use_padding if ax.use_padding is not None else self.use_padding
            if ax.kernel is not None and use_padding is None:
                raise shape_error(
                    _at(origin, ax.pos), where,
                    "use_padding must be specified in convolution spec (use = for true, < for false), "
                    "or pass use_padding=True/False")
            kernel = self._label(ax.kernel) if ax.kernel is not None else None
            out.append(ConvDim(v, ax.stride, self._label(ax.over), ax.dilation, kernel,
                               bool(use_padding), _at(origin, ax.pos), where))
        elif isinstance(ax, es.ConcatAxis):
            out.append(ConcatDim(v, tuple(self._label(p) for p in ax.parts), _at(origin, ax.pos), where))
        return v

    def _row(self, rs: es.RowSpec, slot: int, kind: str, origin: Origin, out: list[Constraint]) -> Row:
        beg = tuple(self._axis_dim(a, slot, kind, i, origin, out) for i, a in enumerate(rs.before))
        end = tuple(self._axis_dim(a, slot, kind, -len(rs.after) + i, origin, out)
                    for i, a in enumerate(rs.after))
        if rs.row_var is None:
            return Row.closed(beg)
        var = self.row_vars.get(rs.row_var)
        if var is None:
            var = self.row_vars[rs.row_var] = RowVar(rs.row_var)
        return Row(beg, var, end)

    def slot_specs(self) -> list[es.ShapeSpec]:
        return [self.spec.result, *self.spec.operands]

    def constraints(self, result, operands, origin):
        if len(operands) != len(self.spec.operands):
            raise ShapeError(
                f"{origin.describe()}: the spec {self.spec.text!r} has {len(self.spec.operands)} "
                f"operand(s), but {len(operands)} tensor(s) were given")
        rows: list[Constraint] = []
        axes: list[Constraint] = []
        for slot, (shape, ss) in enumerate(zip([result, *operands], self.slot_specs())):
            name = "result" if slot == 0 else f"operand {slot}"
            for k in KINDS:
                row = self._row(ss.row(k), slot, k, origin, axes)
                rows.append(RowEq(shape.row(k), row, _at(origin, ss.pos), Where(k, None, (name, "spec"))))
        return rows + axes

    def layout(self, result, operands, solver):
        def label_loop(name: str) -> Loop:
            size = solver.dim(self._label(name))
            assert isinstance(size, int)
            return Loop(("label", name), size)

        slots: list[list[Term]] = []
        for ss in self.slot_specs():
            terms: list[Term] = []
            for k in KINDS:
                rs = ss.row(k)
                terms += [self._term(a, label_loop, solver) for a in rs.before]
                if rs.row_var is not None:
                    dims = solver.row(Row((), self.row_vars[rs.row_var], ())).dims
                    terms += [Loop(("row", rs.row_var, len(dims) - 1 - p), d) for p, d in enumerate(dims)]  # type: ignore[arg-type]
                terms += [self._term(a, label_loop, solver) for a in rs.after]
            slots.append(terms)
        return slots

    def _term(self, ax: es.Axis, label_loop, solver: Solver) -> Term:
        if isinstance(ax, es.Label):
            return label_loop(ax.name)
        if isinstance(ax, es.FixedIndex):
            return At(ax.value)
        if isinstance(ax, es.ConvTerm):
            use_padding = ax.use_padding if ax.use_padding is not None else self.use_padding
            kernel = label_loop(ax.kernel) if ax.kernel is not None else None
            pad = padding_left(kernel.size, ax.dilation) if (kernel is not None and use_padding) else 0
            return Conv(label_loop(ax.over), ax.stride, kernel, ax.dilation, ax.offset, pad)
        if self.active_part is None:
            raise ShapeError(
                f"axis concatenation {'^'.join(ax.parts)!r} in {self.spec.text!r}: use oc.concat for "
                f"concatenations")
        # Concatenation: one assignment per component; the active one writes at its offset.
        sizes = [label_loop(p).size for p in ax.parts]
        j = self.active_part
        return Conv(label_loop(ax.parts[j]), 1, None, 1, sum(sizes[:j]), 0)

    def part_layout(self, j: int, result: Shape, operands: list[Shape], solver: Solver) -> list[list[Term]]:
        """The slots (result, operand ``j``) of component ``j`` of a concatenation
        (``a^b``): the result's concatenated axis is written at component ``j``'s offset."""
        self.active_part = j
        try:
            slots = self.layout(result, operands, solver)
        finally:
            self.active_part = None
        return [slots[0], slots[1 + j]]


def _at(origin: Origin, pos: int) -> Origin:
    """The same origin, pointing at character ``pos`` of its spec."""
    if origin.spec is None:
        return origin
    return Origin(origin.op, origin.label, origin.source, origin.shapes, origin.spec, pos)


def reduction_spec(kinds: tuple[str, ...]) -> es.EinsumSpec:
    """The one-operand einsum that sums away the axes of ``kinds`` and keeps the others
    (``t.sum(axes=...)``): e.g. for ``("batch",)`` the spec ``...|...->... => ...->...``."""
    every = es.ShapeSpec(batch=es.RowSpec(row_var="batch"), input=es.RowSpec(row_var="input"),
                         output=es.RowSpec(row_var="output"), text="...|...->...")
    keep = {k: es.RowSpec(row_var=k) if k not in kinds else es.RowSpec() for k in KINDS}
    text = ("...|" if "batch" not in kinds else "") + ("...->" if "input" not in kinds else "") \
        + ("..." if "output" not in kinds else "")
    if "output" in kinds and "input" not in kinds:
        text += "[]"  # an input row needs an output row after '->'; printed for readers only
    result = es.ShapeSpec(batch=keep["batch"], input=keep["input"], output=keep["output"], text=text)
    return es.EinsumSpec((every,), result, f"...|...->... => {text}", multichar=False)


@dataclass
class Take(ShapeLogic):
    """``oc.take(table, indices)``: result batch = indices' batch; result output = indices'
    output followed by table's output without its leftmost axis; result input = table's input.
    The gather is lowered directly (no loops from projections)."""

    def constraints(self, result, operands, origin):
        table, indices = operands
        s_rows = (indices.output,)
        if not indices.output.is_closed:
            raise ShapeError(f"{origin.describe()}: the indices' output axes must be known when "
                             f"oc.take is built (got {indices.output})")
        rest = RowVar("take_rows")
        where = ("result", "table")
        return [
            RowEq(table.batch, Row(), origin, Where("batch", None, ("table", "no batch axes"))),
            RowEq(indices.input, Row(), origin, Where("input", None, ("indices", "no input axes"))),
            RowEq(table.output, Row((DimVar("rows"),), rest, ()), origin, Where("output", 0, where)),
            RowEq(result.output, Row(s_rows[0].end, rest, ()), origin, Where("output", None, where)),
            RowEq(result.batch, indices.batch, origin, Where("batch", None, ("result", "indices"))),
            RowEq(result.input, table.input, origin, Where("input", None, where)),
        ]

    def layout(self, result, operands, solver):
        raise ShapeError("oc.take is lowered as a gather; it has no projections")


@dataclass
class Interleave(ShapeLogic):
    """``oc.interleave(a, b)``: ``r[..., 2i] = a[..., i]``, ``r[..., 2i+1] = b[..., i]`` on the
    last output axis; the other axes are shared by all three. Written as two assignments, one
    per operand (:meth:`part_layout`)."""

    def constraints(self, result, operands, origin):
        a, b = operands
        n, rest = DimVar("n"), RowVar("interleave")
        out: list[Constraint] = []
        for name, s in (("operand 1", a), ("operand 2", b)):
            out.append(RowEq(s.output, Row((), rest, (n,)), origin, Where("output", -1, (name, "result"))))
            out.append(RowEq(s.batch, result.batch, origin, Where("batch", None, (name, "result"))))
            out.append(RowEq(s.input, result.input, origin, Where("input", None, (name, "result"))))
        twice = DimVar("twice")
        out.append(RowEq(result.output, Row((), rest, (twice,)), origin, Where("output", -1)))
        out.append(ConvDim(twice, 2, n, 1, None, True, origin, Where("output", -1)))
        return out

    def part_layout(self, j: int, result: Shape, operands: list[Shape], solver: Solver) -> list[list[Term]]:
        rb, ro, ri = (result.row(k).dims for k in KINDS)
        n = ro[-1] // 2  # type: ignore[operator]
        res = _own_terms(rb, "b") + _own_terms(ro[:-1], "o") + [Conv(Loop("n", n), 2, None, 1, j, 0)] \
            + _own_terms(ri, "i")  # type: ignore[arg-type]
        src = _own_terms(rb, "b") + _own_terms(ro[:-1], "o") + [Loop("n", n)] + _own_terms(ri, "i")  # type: ignore[arg-type]
        return [res, src]

    def layout(self, result, operands, solver):
        raise ShapeError("oc.interleave is computed per operand (part_layout)")


@dataclass
class Positional(ShapeLogic):
    """An operation built from its operand's concrete dims, position by position (a static
    index, a reshape: docs/shapes.md, "Indexing, reshaping, reductions by position"): the
    result's rows and the operand's are known when the op is built, and stated as such."""

    result_rows: tuple[tuple[int, ...], ...]
    """The result's dims, one tuple per kind of ``KINDS``."""
    operand_rows: tuple[tuple[int, ...], ...]

    def constraints(self, result, operands, origin):
        (s,) = operands
        return [RowEq(shape.row(k), Row.closed(rows[i]), origin, Where(k, None, (side, "its dims when indexed")))
                for shape, rows, side in ((result, self.result_rows, "result"), (s, self.operand_rows, "operand"))
                for i, k in enumerate(KINDS)]


@dataclass
class StaticIndex(Positional):
    """``t[0]``, ``t[1:3]``, ``t[..., ::2]``: each operand axis, in memory order, is either read
    at one position (an ``int`` in ``picks``, the axis dropped) or by a loop of ``count`` steps
    ``start + step*k`` (a ``(start, step, count)`` triple, one result axis)."""

    picks: tuple[int | tuple[int, int, int], ...] = ()

    def layout(self, result, operands, solver):
        res: list[Term] = []
        src: list[Term] = []
        for p, pick in enumerate(self.picks):
            if isinstance(pick, int):
                src.append(At(pick))
                continue
            start, step, count = pick
            loop = Loop(("axis", p), count)
            res.append(loop)
            src.append(loop if (start, step) == (0, 1) else Strided(((step, loop),), start))
        return [res, src]


@dataclass
class Regroup(Positional):
    """A reshape: the result and the operand are the same cells in row-major order. The loops run
    over ``cells``, a common refinement of both dims (every axis of either side is the product of
    a run of consecutive cells), and each axis is indexed by its run, ``sum(stride * cell)``."""

    cells: tuple[int, ...] = ()

    def layout(self, result, operands, solver):
        def terms(dims: tuple[int, ...]) -> list[Term]:
            out: list[Term] = []
            c = 0
            for d in dims:
                run: list[int] = []
                covered = 1
                while covered < d:
                    covered *= self.cells[c]
                    run.append(c)
                    c += 1
                strides = [math.prod(self.cells[r + 1:run[-1] + 1]) for r in run]
                loops = tuple((st, Loop(("cell", r), self.cells[r])) for st, r in zip(strides, run))
                out.append(At(0) if d == 1 else loops[0][1] if len(loops) == 1 else Strided(loops))
            return out

        return [terms(tuple(d for row in self.result_rows for d in row)),
                terms(tuple(d for row in self.operand_rows for d in row))]
