"""Global shape inference: constraint solving over dims and row variables (docs/shapes.md).

Every operation adds constraints between the rows of its result and its operands:

* equations (einsum slots, batch slicing): the two rows are the same;
* broadcasting inequalities ``res ⊑ opnd`` (pointwise ops, compose): the operand row broadcasts
  into the result row, numpy-style: rows align to the right, every size-1 dim broadcasts
  (a departure from the original, which broadcasts only the dims it created itself);
* convolution and concatenation relations between dims, and lower bounds from fixed indices.

Constraints are solved online, as operations are built, by a worklist: a constraint that cannot
progress waits on the variables it mentions and is retried when one of them is solved. What stays
unknown is decided only at *finalization* (``t.dims``, compiling, ``oc.explain_shapes``), by
closing variables in a fixed order of stages (:meth:`Solver.finalize`): first the parameters'
dims learned from their uses (the original's "GLB"), then the results' dims, then empty rows,
and last defaults. A parameter dim that nothing determines is an error naming the parameter,
never a silent 1. Reading ``t.shape`` only propagates and never forces a default.

The information a variable gathers from broadcasting uses is its *bound*: if operand ``v`` must
broadcast into results of size 3, ``v`` is 1 or 3; closing prefers 3. Two different bounds force
``v = 1`` at once (it broadcasts in both places).
"""

from __future__ import annotations

import sys
from builtins import max as builtins_max
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Iterable, Union

from ocannl import session
from ocannl.errors import ShapeError
from ocannl.shape.shape import EMPTY_ROW, Dim, DimVar, Row, RowVar, Shape


# ---------------------------------------------------------------------------------------------
# Where a constraint comes from: everything an error message needs.


@dataclass
class Origin:
    """The operation that generated a constraint, for error messages and explanations."""

    op: str
    label: str = ""
    source: str = ""
    shapes: tuple[tuple[str, Shape], ...] = ()
    spec: str | None = None
    spec_pos: int | None = None

    def describe(self) -> str:
        what = f"{self.op}"
        if self.label:
            what += f" {self.label!r}"
        if self.source:
            what += f" (built at {self.source})"
        return what


@dataclass(frozen=True)
class Where:
    """Which axis a dim constraint is about: kind, position in its row, and the two sides."""

    kind: str = ""
    position: int | None = None
    sides: tuple[str, str] = ("result", "operand")

    def row(self, side: int) -> str:
        """The row of side ``side`` (0 or 1) in words, e.g. ``operand 1 output`` (a compose
        names rows of different kinds, ``left operand input``, in its sides already)."""
        name = self.sides[side]
        return name if any(k in name for k in ("batch", "output", "input")) else f"{name} {self.kind}"

    def describe(self) -> str:
        if not self.kind:
            return ""
        if self.position is None:
            return f"{self.kind} axes"
        return f"{self.kind} axis {self.position}"


# ---------------------------------------------------------------------------------------------
# Constraints.


@dataclass(eq=False)
class DimEq:
    a: Dim
    b: Dim
    origin: Origin
    where: Where = Where()


@dataclass(eq=False)
class DimIneq:
    """``res ⊑ opnd``: the operand dim broadcasts into the result dim (equal, or operand 1)."""

    res: Dim
    opnd: Dim
    origin: Origin
    where: Where = Where()


@dataclass(eq=False)
class RowEq:
    a: Row
    b: Row
    origin: Origin
    where: Where = Where()


@dataclass(eq=False)
class RowIneq:
    """``res ⊑ opnd`` on rows: right-aligned broadcasting of the operand row into the result row;
    an open operand's left flank aligns with the result's left edge."""

    res: Row
    opnd: Row
    origin: Origin
    where: Where = Where()


@dataclass(eq=False)
class ConvDim:
    """An input axis indexed ``stride*over + dilation*kernel``. As PyTorch sizes its outputs, the
    stride need not divide the input (docs/semantics.md, "Convolution sizes"): with padding (or no
    kernel) ``over = ceil(input / stride)``, PyTorch's ``floor((input + 2*pad - span) / stride) + 1``
    for the centred padding of an odd window; without, ``over = floor((input - span) / stride) + 1``
    with ``span = dilation*(kernel-1) + 1``, the input cells past the last window unread. Solved
    from the output side, the input is the size the stride fits exactly: ``stride*over`` padded,
    ``stride*(over-1) + span`` valid."""

    input: Dim
    stride: int
    over: Dim
    dilation: int
    kernel: Dim | None
    use_padding: bool
    origin: Origin
    where: Where = Where()


@dataclass(eq=False)
class ConcatDim:
    """``total = sum(parts)`` for an axis concatenation ``a^b^c``."""

    total: Dim
    parts: tuple[Dim, ...]
    origin: Origin
    where: Where = Where()


@dataclass(eq=False)
class AtLeast:
    """A fixed index ``n-1`` reads or writes this axis: its size must be at least ``n``."""

    dim: Dim
    n: int
    origin: Origin
    where: Where = Where()
    closes_to: bool = False  # a result axis written at a fixed index closes to ``n`` when unknown


@dataclass(eq=False)
class BroadcastRank:
    """The result of broadcasting has exactly as many axes as its longest operand row, as in
    numpy: once every operand row is closed, an open result row closes to that length. (The
    original lets results gain axes from later uses; ocannl's broadcasting is
    numpy's, so a result never has more axes than its operands give it.)"""

    res: Row
    operands: tuple[Row, ...]
    origin: Origin
    where: Where = Where()


Constraint = Union[DimEq, DimIneq, RowEq, RowIneq, ConvDim, ConcatDim, AtLeast, BroadcastRank]


# ---------------------------------------------------------------------------------------------
# Per-variable knowledge.


@dataclass
class DimInfo:
    # (size, origin, axis) of each use it broadcasts into; the axis is kept so that a mismatch
    # found later, when the variable is solved, still names the axis of the use.
    bounds: list[tuple[int, Origin, Where]] = field(default_factory=list)
    at_least: int = 0
    at_least_origin: Origin | None = None
    closes_to: int = 0
    operand_of_one: bool = False  # some use broadcasts a literal 1 into it: 1 is a safe default
    param: str | None = None  # label of the parameter whose shape holds this var


@dataclass
class RowInfo:
    bounds: list[tuple[tuple[Dim, ...], Origin, Where]] = field(default_factory=list)
    param: str | None = None
    kind: str = ""
    terminal: bool = False


class Solver:
    """The inference environment of one epoch: substitutions, bounds, waiting constraints.

    An epoch lasts from the first operation built after a finalization to the next finalization;
    finalized shapes are concrete, so a new epoch starts empty.
    """

    def __init__(self) -> None:
        self.dim_subst: dict[DimVar, Dim] = {}
        self.row_subst: dict[RowVar, Row] = {}
        self.dim_info: dict[DimVar, DimInfo] = defaultdict(DimInfo)
        self.row_info: dict[RowVar, RowInfo] = defaultdict(RowInfo)
        self.waiting: dict[Union[DimVar, RowVar], list[Constraint]] = defaultdict(list)
        self.queue: deque[Constraint] = deque()
        self.shapes: list[Shape] = []
        self._unsolved: list[Shape] = []  # during finalize: the shapes that may hold open variables
        self.decisions: dict[Union[DimVar, RowVar], str] = {}

    # -- substitution --------------------------------------------------------------------------

    def dim(self, d: Dim) -> Dim:
        while isinstance(d, DimVar):
            nxt = self.dim_subst.get(d)
            if nxt is None:
                return d
            d = nxt
        return d

    def row(self, r: Row) -> Row:
        beg, var, end = r.beg, r.var, r.end
        while var is not None and var in self.row_subst:
            sub = self.row_subst[var]
            beg, var, end = beg + sub.beg, sub.var, sub.end + end
        return Row(tuple(self.dim(d) for d in beg), var, tuple(self.dim(d) for d in end))

    def resolve_shape(self, shape: Shape) -> Shape:
        shape.batch, shape.output, shape.input = (self.row(r) for r in shape.rows())
        return shape

    # -- adding and solving --------------------------------------------------------------------

    def register(self, shape: Shape) -> None:
        """Track ``shape`` in this epoch (it will be closed at finalization)."""
        self.shapes.append(shape)
        if shape.is_param:
            for kind in ("batch", "output", "input"):
                r = shape.row(kind)
                if r.var is not None:
                    info = self.row_info[r.var]
                    info.param, info.kind, info.terminal = shape.tensor_label, kind, True
                for d in r.beg + r.end:
                    if isinstance(d, DimVar):
                        self.dim_info[d].param = shape.tensor_label

    def add(self, constraints: Iterable[Constraint]) -> None:
        self.queue.extend(constraints)
        self.solve()

    def solve(self) -> None:
        while self.queue:
            c = self.queue.popleft()
            self._step(c)

    def _wait(self, c: Constraint, *vars_: Union[DimVar, RowVar, None]) -> None:
        for v in vars_:
            if v is not None:
                self.waiting[v].append(c)

    def _wake(self, v: Union[DimVar, RowVar]) -> None:
        waiting = self.waiting.pop(v, None)
        if waiting:
            self.queue.extend(waiting)

    def _step(self, c: Constraint) -> None:
        if isinstance(c, DimEq):
            self.unify_dim(c.a, c.b, c.origin, c.where)
        elif isinstance(c, DimIneq):
            self._dim_ineq(c)
        elif isinstance(c, RowEq):
            self.unify_row(c.a, c.b, c.origin, c.where)
        elif isinstance(c, RowIneq):
            self._row_ineq(c)
        elif isinstance(c, ConvDim):
            self._conv(c)
        elif isinstance(c, ConcatDim):
            self._concat(c)
        elif isinstance(c, AtLeast):
            self._at_least(c)
        elif isinstance(c, BroadcastRank):
            self._broadcast_rank(c)
        else:  # pragma: no cover
            raise TypeError(c)

    # -- dims ----------------------------------------------------------------------------------

    def unify_dim(self, a: Dim, b: Dim, origin: Origin, where: Where) -> None:
        a, b = self.dim(a), self.dim(b)
        if a is b or (isinstance(a, int) and isinstance(b, int) and a == b):
            return
        if isinstance(a, DimVar):
            self.bind_dim(a, b, origin, where)
        elif isinstance(b, DimVar):
            self.bind_dim(b, a, origin, where)
        else:
            raise shape_error(origin, where, f"dimension mismatch: {a} vs {b}")

    def bind_dim(self, v: DimVar, value: Dim, origin: Origin, where: Where) -> None:
        self.dim_subst[v] = value
        info = self.dim_info.pop(v, None)
        if info is not None:
            if isinstance(value, DimVar):
                target = self.dim_info[value]
                target.operand_of_one |= info.operand_of_one
                target.param = target.param or info.param
                target.closes_to = max(target.closes_to, info.closes_to)
                if info.at_least > target.at_least:
                    target.at_least, target.at_least_origin = info.at_least, info.at_least_origin
                for b, o, w in info.bounds:
                    self.queue.append(DimIneq(b, value, o, w))
            else:
                if info.at_least and value < info.at_least:
                    raise shape_error(info.at_least_origin or origin, where,
                                      f"an axis of size {value} is indexed at position {info.at_least - 1}")
                for b, o, w in info.bounds:
                    self.queue.append(DimIneq(b, value, o, w))
        self._wake(v)

    def _dim_ineq(self, c: DimIneq) -> None:
        res, opnd = self.dim(c.res), self.dim(c.opnd)
        if res is opnd or (isinstance(res, int) and isinstance(opnd, int) and res == opnd):
            return
        if isinstance(opnd, int):
            if opnd == 1:
                if isinstance(res, DimVar):
                    self.dim_info[res].operand_of_one = True
                return
            if isinstance(res, int):
                raise shape_error(c.origin, c.where,
                                  f"cannot broadcast {c.where.sides[1]} dim {opnd} to {c.where.sides[0]} dim {res}")
            self.bind_dim(res, opnd, c.origin, c.where)
            return
        if isinstance(res, int):
            if res == 1:
                self.bind_dim(opnd, 1, c.origin, c.where)
                return
            info = self.dim_info[opnd]
            if any(b != res for b, *_ in info.bounds):
                # Used where it must broadcast into two different sizes: it can only be 1.
                self.bind_dim(opnd, 1, c.origin, c.where)
                return
            info.bounds.append((res, c.origin, c.where))
            return
        self._wait(c, res, opnd)

    def _at_least(self, c: AtLeast) -> None:
        d = self.dim(c.dim)
        if isinstance(d, int):
            if d < c.n:
                raise shape_error(c.origin, c.where,
                                  f"an axis of size {d} is indexed at position {c.n - 1}")
            return
        info = self.dim_info[d]
        if c.n > info.at_least:
            info.at_least, info.at_least_origin = c.n, c.origin
        if c.closes_to:
            info.closes_to = max(info.closes_to, c.n)

    def _conv(self, c: ConvDim) -> None:
        inp, over = self.dim(c.input), self.dim(c.over)
        kernel = self.dim(c.kernel) if c.kernel is not None else None
        s = c.stride
        if c.use_padding or kernel is None:
            if isinstance(inp, int):
                self.unify_dim(over, -(-inp // s), c.origin, c.where)
            elif isinstance(over, int):
                self.unify_dim(inp, s * over, c.origin, c.where)
            else:
                self._wait(c, inp, over)
            return
        if isinstance(inp, int) and isinstance(kernel, int):
            span = c.dilation * (kernel - 1) + 1
            if inp < span:
                raise shape_error(
                    c.origin, c.where,
                    f"valid convolution: input size {inp} does not fit one window (kernel span {span})")
            self.unify_dim(over, (inp - span) // s + 1, c.origin, c.where)
        elif isinstance(over, int) and isinstance(kernel, int):
            self.unify_dim(inp, s * (over - 1) + c.dilation * (kernel - 1) + 1, c.origin, c.where)
        elif isinstance(inp, int) and isinstance(over, int):
            span = inp - s * (over - 1)
            if span < 1 or (span - 1) % c.dilation:
                raise shape_error(c.origin, c.where,
                                  f"valid convolution: no kernel size gives output {over} from input {inp}")
            assert c.kernel is not None
            self.unify_dim(c.kernel, (span - 1) // c.dilation + 1, c.origin, c.where)
        else:
            self._wait(c, *(d for d in (inp, over, kernel) if isinstance(d, DimVar)))

    def _concat(self, c: ConcatDim) -> None:
        total = self.dim(c.total)
        parts = [self.dim(p) for p in c.parts]
        unknown = [p for p in parts if isinstance(p, DimVar)]
        known = sum(p for p in parts if isinstance(p, int))
        if not unknown:
            self.unify_dim(total, known, c.origin, c.where)
        elif isinstance(total, int) and len(unknown) == 1:
            if known > total:
                raise shape_error(c.origin, c.where,
                                  f"concatenated parts ({known}) exceed the axis size {total}")
            self.unify_dim(unknown[0], total - known, c.origin, c.where)
        else:
            self._wait(c, *unknown, total if isinstance(total, DimVar) else None)

    # -- rows ----------------------------------------------------------------------------------

    def unify_row(self, a: Row, b: Row, origin: Origin, where: Where) -> None:
        a, b = self.row(a), self.row(b)
        if a.is_closed and b.is_closed:
            if len(a.end) != len(b.end):
                raise shape_error(origin, where,
                                  f"mismatching number of axes: {len(a.end)} vs {len(b.end)}")
            self._pair_eq(a.end, b.end, origin, where)
            return
        if a.is_closed:
            a, b = b, a
        if b.is_closed:  # a open, b closed
            dims = b.end
            if len(dims) < a.n_known_axes:
                raise shape_error(origin, where,
                                  f"number of axes mismatch: {len(dims)} vs at least {a.n_known_axes}")
            nb, ne = len(a.beg), len(a.end)
            self._pair_eq(a.beg, dims[:nb], origin, where)
            self._pair_eq(a.end, dims[len(dims) - ne:], origin, where, offset=len(dims) - ne)
            assert a.var is not None
            self.bind_row(a.var, Row.closed(dims[nb:len(dims) - ne]), origin, where)
            return
        # both open
        nb = min(len(a.beg), len(b.beg))
        ne = min(len(a.end), len(b.end))
        self._pair_eq(a.beg[:nb], b.beg[:nb], origin, where)
        self._pair_eq(a.end[len(a.end) - ne:], b.end[len(b.end) - ne:], origin, where)
        a_beg, a_end = a.beg[nb:], a.end[:len(a.end) - ne]
        b_beg, b_end = b.beg[nb:], b.end[:len(b.end) - ne]
        assert a.var is not None and b.var is not None
        if a.var is b.var:
            if a_beg or a_end or b_beg or b_end:
                raise shape_error(origin, where, "infinite number of axes by self-reference")
            return
        if not a_beg and not a_end:
            self.bind_row(a.var, Row(b_beg, b.var, b_end), origin, where)
        elif not b_beg and not b_end:
            self.bind_row(b.var, Row(a_beg, a.var, a_end), origin, where)
        else:
            fresh = RowVar()
            self._inherit_row_info(fresh, a.var)
            self._inherit_row_info(fresh, b.var)
            self.bind_row(a.var, Row(b_beg, fresh, b_end), origin, where)
            self.bind_row(b.var, Row(a_beg, fresh, a_end), origin, where)

    def _pair_eq(self, xs: tuple[Dim, ...], ys: tuple[Dim, ...], origin: Origin, where: Where,
                 offset: int = 0) -> None:
        for i, (x, y) in enumerate(zip(xs, ys)):
            self.unify_dim(x, y, origin, Where(where.kind, offset + i, where.sides))

    def _inherit_row_info(self, new: RowVar, old: RowVar, info: RowInfo | None = None) -> None:
        info = info or self.row_info.get(old)
        if info is not None and info.param:
            tgt = self.row_info[new]
            tgt.param, tgt.kind, tgt.terminal = info.param, info.kind, info.terminal

    def bind_row(self, v: RowVar, value: Row, origin: Origin, where: Where) -> None:
        value = self.row(value)
        if value.var is v:
            if value.beg or value.end:
                raise shape_error(origin, where, "infinite number of axes by self-reference")
            return
        self.row_subst[v] = value
        info = self.row_info.pop(v, None)
        if info is not None:
            if info.param:
                # The axes that replace a parameter's row variable belong to that parameter.
                for d in value.beg + value.end:
                    if isinstance(d, DimVar):
                        self.dim_info[d].param = self.dim_info[d].param or info.param
                if value.var is not None:
                    self._inherit_row_info(value.var, v, info)
            for bound, o, w in info.bounds:
                self.queue.append(RowIneq(Row.closed(bound), value, o, w))
        self._wake(v)

    def _row_ineq(self, c: RowIneq) -> None:
        res, opnd = self.row(c.res), self.row(c.opnd)
        where = c.where
        if opnd.is_closed:
            n = len(opnd.end)
            if len(res.end) >= n:
                self._pair_ineq(res.end[len(res.end) - n:], opnd.end, c.origin, where, len(res.end) - n)
                return
            if res.is_closed:
                raise shape_error(
                    c.origin, where,
                    f"too many axes in an operand: {where.row(1)} has {n} axes, "
                    f"{where.row(0)} has {len(res.end)} (maybe `@` where `*` was meant?)")
            assert res.var is not None
            fresh = tuple(DimVar() for _ in range(n - len(res.end)))
            self.bind_row(res.var, Row((), RowVar(), fresh), c.origin, where)
            self.queue.append(c)
            return
        ob, oe = opnd.beg, opnd.end
        assert opnd.var is not None
        if res.is_closed:
            dims = res.end
            if len(dims) < len(ob) + len(oe):
                raise shape_error(
                    c.origin, where,
                    f"too many axes in an operand: {where.row(1)} has at least {len(ob) + len(oe)} "
                    f"axes, {where.row(0)} has {len(dims)}")
            self._pair_ineq(dims[:len(ob)], ob, c.origin, where, 0)
            self._pair_ineq(dims[len(dims) - len(oe):], oe, c.origin, where, len(dims) - len(oe))
            middle = dims[len(ob):len(dims) - len(oe)]
            self._row_bound(opnd.var, middle, c.origin, where)
            return
        assert res.var is not None
        if len(res.beg) < len(ob) or len(res.end) < len(oe):
            grow_beg = tuple(DimVar() for _ in range(max(0, len(ob) - len(res.beg))))
            grow_end = tuple(DimVar() for _ in range(max(0, len(oe) - len(res.end))))
            self.bind_row(res.var, Row(grow_beg, RowVar(), grow_end), c.origin, where)
            self.queue.append(c)
            return
        self._pair_ineq(res.beg[:len(ob)], ob, c.origin, where, 0)
        self._pair_ineq(res.end[len(res.end) - len(oe):], oe, c.origin, where, None)
        rest = Row(res.beg[len(ob):], res.var, res.end[:len(res.end) - len(oe)])
        if rest.var is opnd.var:
            return
        if rest.end:
            # The operand's axes align right within the result's: what the result already
            # shows on its right is a bound the operand may close to (prefer generality: a
            # later, longer bound joins to the shorter one).
            self.row_info[opnd.var].bounds.append((rest.end, c.origin, where))
        pending = RowIneq(rest, Row((), opnd.var, ()), c.origin, where)
        self._wait(pending, rest.var, opnd.var)

    def _broadcast_rank(self, c: BroadcastRank) -> None:
        res = self.row(c.res)
        if res.is_closed:
            return
        operands = [self.row(r) for r in c.operands]
        open_vars = [r.var for r in operands if r.var is not None]
        if open_vars:
            self._wait(c, *open_vars)
            return
        n = builtins_max((len(r.end) for r in operands), default=0)
        known = res.n_known_axes
        if known > n:
            return  # the row ineqs report the mismatch with the axis that does not fit
        assert res.var is not None
        self.bind_row(res.var, Row.closed(tuple(DimVar() for _ in range(n - known))), c.origin, c.where)

    def _pair_ineq(self, res: tuple[Dim, ...], opnd: tuple[Dim, ...], origin: Origin, where: Where,
                   offset: int | None) -> None:
        for i, (r, o) in enumerate(zip(res, opnd)):
            self._dim_ineq(DimIneq(r, o, origin,
                                   Where(where.kind, None if offset is None else offset + i, where.sides)))

    def _row_bound(self, v: RowVar, middle: tuple[Dim, ...], origin: Origin, where: Where) -> None:
        """Operand row variable ``v`` must broadcast into ``middle``: remember it (closing prefers
        it); a use with no room left (``middle == ()``) fixes ``v`` to empty at once."""
        if not middle:
            self.bind_row(v, EMPTY_ROW, origin, where)
            return
        self.row_info[v].bounds.append((middle, origin, where))

    # -- finalization --------------------------------------------------------------------------

    def finalize(self) -> None:
        """Close every variable of the epoch in stages (docs/shapes.md, "Inference and
        finalization"), then make every tracked shape concrete. Raises a ShapeError naming a
        parameter whose dims nothing determines."""
        self.solve()
        # A parameter no operation uses yet has nothing to learn its dims from: it waits for the
        # next epoch instead of failing inference for everything else.
        deferred = [sh for sh in self.shapes if sh.is_param and not sh.used and not sh.is_concrete()]
        self.shapes = [sh for sh in self.shapes if not (sh.is_param and not sh.used and not sh.is_concrete())]
        self._unsolved = list(self.shapes)
        stages = (
            self._close_param_rows_with_bounds,
            self._close_param_dims_with_bounds,
            self._close_fixed_index_dims,
            self._close_result_dims_with_bounds,
            self._close_result_rows_with_bounds,
            self._close_broadcasts_of_one,
            self._forbid_guessing_param_outputs,
            self._close_result_rows,
            self._close_remaining_rows,
        )
        progress = True
        while progress:
            progress = False
            for stage in stages:
                if stage():
                    self.solve()
                    progress = True
                    break
        self._close_remaining_dims()
        self.solve()
        for shape in self.shapes:
            self._explain(shape)
            self.resolve_shape(shape)
            if not shape.is_concrete():  # pragma: no cover - every var was closed above
                raise ShapeError(f"not enough shape information for {shape.tensor_label!r}: {shape}")
        # The substitutions stay (later projections resolve spec labels through them); the
        # epoch's bookkeeping goes, since every variable of it is now solved.
        self.shapes = []
        self._unsolved = []
        self.waiting.clear()
        self.dim_info.clear()
        self.row_info.clear()
        for sh in deferred:
            self.register(sh)

    def _open_vars(self) -> tuple[list[tuple[RowVar, Shape, str]], list[tuple[DimVar, Shape, str]]]:
        """The open row and dim variables of the epoch's shapes, in the order of the shapes'
        creation (each with the first shape and kind it occurs in).

        Every closing stage rescans, so a scan must not cost the whole epoch each time: a shape
        found concrete is dropped from ``_unsolved`` for good (substitutions only ever make rows
        more concrete), which keeps finalization linear in the number of shapes when most of them
        are solved online (bench/shape_scaling.py)."""
        rows: list[tuple[RowVar, Shape, str]] = []
        dims: list[tuple[DimVar, Shape, str]] = []
        seen: set[int] = set()
        still_open: list[Shape] = []
        for shape in self._unsolved:
            is_open = False
            for kind in ("batch", "output", "input"):
                r = self.row(shape.row(kind))
                if r.var is not None:
                    is_open = True
                    if r.var.id not in seen:
                        seen.add(r.var.id)
                        rows.append((r.var, shape, kind))
                for d in r.beg + r.end:
                    if isinstance(d, DimVar):
                        is_open = True
                        if d.id not in seen:
                            seen.add(d.id)
                            dims.append((d, shape, kind))
            if is_open:
                still_open.append(shape)
        self._unsolved = still_open
        return rows, dims

    def _decide_row(self, v: RowVar, dims: tuple[Dim, ...], why: str) -> None:
        self.decisions[v] = why
        self.bind_row(v, Row.closed(dims), Origin("closing"), Where())

    def _decide_dim(self, v: DimVar, n: int, why: str) -> None:
        self.decisions[v] = why
        self.bind_dim(v, n, Origin("closing"), Where())

    def _resolved_bounds(self, info: RowInfo) -> list[tuple[Dim, ...]]:
        """A row variable's bounds with every dim substituted: a bound is recorded when the use
        is built, often before its dims are solved, and ``join_rows`` compares dims by value
        (two uses of size 3 recorded as two distinct variables both solved to 3 must join to 3,
        not to 1)."""
        return [tuple(self.dim(d) for d in b) for b, *_ in info.bounds]

    def _close_param_rows_with_bounds(self) -> bool:
        done = False
        for v, shape, kind in self._open_vars()[0]:
            info = self.row_info.get(v)
            if shape.is_terminal and info is not None and info.bounds:
                dims = join_rows(self._resolved_bounds(info))
                self._decide_row(v, dims, f"learned from its use{'s' if len(info.bounds) > 1 else ''}")
                done = True
        return done

    def _close_param_dims_with_bounds(self) -> bool:
        done = False
        for v, shape, kind in self._open_vars()[1]:
            info = self.dim_info.get(v)
            if shape.is_terminal and info is not None and info.bounds:
                self._decide_dim(v, info.bounds[0][0], "learned from its use")
                done = True
        return done

    def _result_dims(self):
        for v, shape, kind in self._open_vars()[1]:
            info = self.dim_info.get(v)
            if not shape.is_terminal and info is not None:
                yield v, info

    def _close_fixed_index_dims(self) -> bool:
        done = False
        for v, info in self._result_dims():
            if info.closes_to:
                # Written at fixed index k, it closes to k+1, unless another use indexes it
                # further: that use fixes it larger (the original closes a dim that is only
                # indexed at position n-1 to n, even where a use needs it larger).
                n = max(info.closes_to, info.at_least)
                self._decide_dim(v, n, f"written at fixed index {info.closes_to - 1}" if n == info.closes_to
                                 else f"indexed at position {n - 1}")
                done = True
        return done

    def _close_result_dims_with_bounds(self) -> bool:
        """Results learn sizes from their uses first; each round moves the knowledge one op
        down a chain of pointwise ops, so no dim is defaulted while a use could still fix it."""
        done = False
        for v, info in self._result_dims():
            if info.bounds:
                self._decide_dim(v, info.bounds[0][0], "learned from its use")
                done = True
        return done

    def _close_broadcasts_of_one(self) -> bool:
        """A dim that only ever meets size-1 operands closes to 1 — parameters' dims too: in the
        moons demo ``y * mlp(x)`` with labels of output ``[1]`` gives the last weight output
        ``[1]`` (the original equates it with the labels' explicit 1)."""
        done = False
        for v, shape, kind in self._open_vars()[1]:
            info = self.dim_info.get(v)
            if info is not None and info.operand_of_one:
                self._decide_dim(v, 1, "broadcast of size-1 operands only")
                done = True
        return done

    def _result_rows(self):
        """The open rows of results: rows of no terminal tensor, nor standing for a part of one."""
        for v, shape, kind in self._open_vars()[0]:
            if not (shape.is_terminal or (v in self.row_info and self.row_info[v].terminal)):
                yield v

    def _close_result_rows_with_bounds(self) -> bool:
        done = False
        for v in self._result_rows():
            info = self.row_info.get(v)
            if info is not None and info.bounds:
                self._decide_row(v, join_rows(self._resolved_bounds(info)), "learned from its use")
                done = True
        return done

    def _row_param(self, v: RowVar, shape: Shape, kind: str) -> tuple[str | None, str]:
        """The parameter whose row ``v`` is (with that row's kind), or ``(None, kind)``."""
        info = self.row_info.get(v)
        if info is not None and info.param:
            return info.param, info.kind or kind
        return (shape.tensor_label if shape.is_param else None), kind

    def _forbid_guessing_param_outputs(self) -> bool:
        """A parameter's output row still open here was learned from no use. The next stage
        closes result rows to no axes, which a parameter broadcasting into them would follow;
        that is a guess, so it is an error naming the parameter, as in the original, which checks
        terminal rows (stage 4) before closing the remaining ones (stage 6): ``{w} * [3;4;5]``
        and ``{x} + {y}`` are errors."""
        for v, shape, kind in self._open_vars()[0]:
            param, pkind = self._row_param(v, shape, kind)
            if param is not None and pkind == "output":
                raise _unknown_param_output(param)
        return False

    def _close_result_rows(self) -> bool:
        done = False
        for v in self._result_rows():
            self._decide_row(v, (), "no axes needed")
            done = True
        return done

    def _close_remaining_rows(self) -> bool:
        """Close the first open row to no axes; the earlier stages then get another chance
        (closing it may teach them something). When closing it wakes no constraint, nothing
        changed for them, so the next open row is closed in the same scan: the same decisions
        as restarting, without rescanning once per row (which made finalization quadratic in
        the number of such rows, e.g. parameters whose input rows only an einsum's ``...``
        reduces)."""
        done = False
        for v, shape, kind in self._open_vars()[0]:
            if v in self.row_subst:  # pragma: no cover - only vars left open are visited
                continue
            param, pkind = self._row_param(v, shape, kind)
            if param is not None and pkind == "output":
                raise _unknown_param_output(param)
            self._decide_row(v, (), "no axes needed")
            done = True
            if self.queue:
                return True
        return done

    def _close_remaining_dims(self) -> None:
        for v, shape, kind in self._open_vars()[1]:
            v2 = self.dim(v)
            if not isinstance(v2, DimVar):
                continue
            info = self.dim_info.get(v2, DimInfo())
            param = info.param or (shape.tensor_label if shape.is_param else None)
            if param is not None:
                article = "an" if kind[0] in "aeiou" else "a"
                raise ShapeError(
                    f"cannot infer {article} {kind} dim of parameter {param!r}: nothing in its uses "
                    f"determines it; specify {kind}=... when creating it")
            n = max(info.at_least, 1)
            self._decide_dim(v2, n, "default" if n == 1 else f"indexed at position {n - 1}")
            self.solve()

    def _explain(self, shape: Shape) -> None:
        """Record, per axis of ``shape``, the closing decisions that fixed it (for explain_shapes)."""
        for kind in ("batch", "output", "input"):
            r = shape.row(kind)
            var = r.var
            while var is not None:
                if var in self.decisions:
                    sub = self.row(Row((), var, ()))
                    if sub.end or shape.is_param:
                        shape.explanations.append(f"{kind} axes {sub}: {self.decisions[var]}")
                    break
                nxt = self.row_subst.get(var)
                var = nxt.var if nxt is not None else None
            for d in r.beg + r.end:
                why = self._dim_decision(d)
                if why:
                    shape.explanations.append(f"{kind} dim {self.dim(d)}: {why}")

    def _dim_decision(self, d: Dim) -> str | None:
        while isinstance(d, DimVar):
            if d in self.decisions:
                return self.decisions[d]
            d = self.dim_subst.get(d)  # type: ignore[assignment]
        return None


def _unknown_param_output(param: str) -> ShapeError:
    return ShapeError(
        f"cannot infer the output dims of parameter {param!r}: nothing in its uses "
        f"determines them; specify output=... when creating it")


def join_rows(rows: list[tuple[Dim, ...]]) -> tuple[Dim, ...]:
    """The most general row every one of ``rows`` accepts by broadcasting: right-aligned, as long
    as the shortest, each dim kept where all agree and 1 where they differ."""
    n = min(len(r) for r in rows)
    out: list[Dim] = []
    for i in range(n):
        col = [r[len(r) - n + i] for r in rows]
        first = col[0]
        out.append(first if all(c is first or c == first for c in col) else 1)
    return tuple(out)


def shape_error(origin: Origin, where: Where, message: str) -> ShapeError:
    """A ShapeError naming the op, where the user built it, the axis and every shape involved."""
    lines = [f"{origin.describe()}: {message}"]
    axis = where.describe()
    if axis:
        lines.append(f"  at {axis} (between {where.sides[0]} and {where.sides[1]})")
    if origin.spec is not None:
        lines.append(f"  spec: {origin.spec}")
        if origin.spec_pos is not None:
            lines.append("        " + " " * origin.spec_pos + "^")
    s = current()
    for name, shape in origin.shapes:
        s.resolve_shape(shape)
        lines.append(f"  {name}: {shape}")
    err = ShapeError("\n".join(lines))
    err.origin = origin  # type: ignore[attr-defined]
    err.where = where  # type: ignore[attr-defined]
    return err


_solver = Solver()


def current() -> Solver:
    return _solver


@session.on_reset
def _reset_solver() -> None:
    global _solver
    _solver = Solver()


def caller_source() -> str:
    """``file:line`` of the innermost frame outside the ocannl package: where the user built the op."""
    import os

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame = sys._getframe(1)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not fname.startswith("<frozen") and not os.path.abspath(fname).startswith(here):
            return f"{os.path.basename(fname)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""
