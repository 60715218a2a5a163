"""Lowering: the assignments IR to the loop IR (docs/compiler.md, "Lowering").

Each construct has one function: :func:`lower_accumulation`, :func:`lower_fetch`,
:func:`lower_gather`, :func:`lower_scatter_add`; :func:`lower` dispatches and
:func:`lower_routine` wraps the result for a backend. Static index symbols stay symbolic: they
are bound when the routine runs.
"""

from __future__ import annotations

import itertools
from typing import Callable

from ocannl.errors import ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.analysis import provably_within, row_major_offset
from ocannl.lowlevel.assignments import (
    Accum,
    Apply,
    Arg,
    Assignment,
    Block,
    CellOffset,
    Constant,
    EmbedSymbol,
    Fetch,
    Gather,
    Noop,
    Operand,
    RangeOverOffsets,
    ScatterAdd,
    Slice,
    Values,
)
from ocannl.lowlevel.dtypes import DType, DTypeError
from ocannl.lowlevel.indexing import (
    Affine,
    AxisIndex,
    Fixed,
    IndexSymbol,
    Iter,
    Projections,
    Symbol,
    index_symbols,
)
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, Fill, GetLocal, Load, LoadDynamic, Local,
    RoutineIR, Seq, SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary, nest, seq,
)
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop, neutral_element, operand_dtypes
from ocannl.lowlevel.tnode import TNode


def lower_routine(name: str, asg: Assignment) -> RoutineIR:
    return RoutineIR(name, lower(asg))


def lower(asg: Assignment) -> Stmt:
    match asg:
        case Block(items=items, comment=comment):
            return seq(*([Comment(comment)] if comment else []), *(lower(i) for i in items))
        case Noop():
            return Seq(())
        case Accum():
            return lower_accumulation(asg)
        case Fetch():
            return lower_fetch(asg)
        case Gather():
            return lower_gather(asg)
        case ScatterAdd():
            return lower_scatter_add(asg)
    raise TypeError(f"not an assignment: {asg!r}")


def lower_accumulation(a: Accum) -> Stmt:
    """One loop nest over the product space, in ``product_space`` order (a fresh loop symbol per
    product iterator; an iterator of extent 1 becomes the index 0, without a loop). The store is
    ``lhs[P] := accum(lhs[P], fn(rhs...))``, or ``lhs[P] := fn(rhs...)`` for a plain set and for
    ``initialize_neutral`` with an injective projection (each cell is written once: for ``=:-``
    and ``=:/`` the store is ``neutral - fn(...)`` / ``neutral / fn(...)``, where the original
    stores ``fn(...)``).

    With ``initialize_neutral``, unless the projection writes every cell exactly once (surjective
    and injective), ``lhs`` is first reset to the neutral element. Where the loops that index
    ``lhs`` come first and each cell is reached once by them, the reset is a store inside those
    loops just before the reduction loops (``n[i0, i1] := 0; for i2 ...``), which keeps the
    accumulation local; otherwise it is a :class:`~ocannl.lowlevel.ir.Fill` of the whole ``lhs``
    before the nest.

    Operand indices: an index of a size-1 operand axis reads position 0 (broadcasting); an
    affine index that interval arithmetic over the loop extents cannot keep inside the operand
    reads the accumulation's neutral element outside it (padded convolutions).
    """
    proj = a.projections()
    _check_projections(a, proj)
    compute = a.lhs.dtype.compute

    loops: list[tuple[Symbol, int]] = []
    subst: dict[Symbol, Symbol | None] = {}
    for iterator, extent in zip(proj.product_iterators, proj.product_space):
        if extent == 1:
            subst[iterator] = None
        else:
            subst[iterator] = Symbol()
            loops.append((subst[iterator], extent))
    extents = {s: n for s, n in loops}

    def operand(j: int, r: Operand, dtype: DType) -> Expr:
        if not isinstance(r, TNode):
            return _const(r, dtype)
        indices, oob = [], False
        for idx, d in zip(proj.project_rhs[j], r.dims):
            new = _substitute(idx, subst)
            if isinstance(idx, Affine):  # a window may leave a size-1 axis too: no broadcasting
                oob |= not provably_within(new, d, extents)
            elif d == 1 and isinstance(new, (Fixed, Iter)):
                new = Fixed(0)
            indices.append(new)
        oob_value = _const(neutral_element(a.accum, r.dtype), r.dtype.compute).value if oob else None
        return _convert(Load(r, tuple(indices), oob_value), dtype)

    lhs_idx = tuple(_substitute(idx, subst) for idx in proj.project_lhs)
    shared: list[Stmt] = []  # the locals of an Apply's shared sub-expressions, set before the store
    if isinstance(a.fn, Apply):
        offset = row_major_offset(lhs_idx, a.lhs.dims)
        value = _apply_tree(a.fn, lambda j, dtype: operand(j, a.rhs[j], dtype), offset, compute, shared)
    elif a.fn is Ternop.WHERE:
        cond = operand(0, a.rhs[0], a.rhs[0].dtype.compute if isinstance(a.rhs[0], TNode) else compute)
        args = [cond] + [operand(j, r, compute) for j, r in enumerate(a.rhs) if j > 0]
        value = _apply(a.fn, args, compute)
    else:
        args = [operand(j, r, t) for (j, r), t in zip(enumerate(a.rhs), operand_dtypes(a.fn, compute))]
        value = _apply(a.fn, args, compute)

    # An affine result index may leave the result (a padded convolution's gradient writes into
    # margins that have no cells): those iterations store nothing.
    skip_oob = any(isinstance(orig, Affine) and not provably_within(idx, d, extents)
                   for orig, idx, d in zip(proj.project_lhs, lhs_idx, a.lhs.dims))
    neutral = _const(neutral_element(a.accum, a.lhs.dtype), compute)
    if a.accum is not None:
        if not (a.initialize_neutral and proj.is_injective()):
            value = Binary(a.accum, Load(a.lhs, lhs_idx, 0 if skip_oob else None), value)
        elif a.accum in (Binop.SUB, Binop.DIV):
            value = Binary(a.accum, neutral, value)  # each cell is written once, from the neutral
    nest: Stmt = seq(*shared, Store(a.lhs, lhs_idx, value, skip_oob))

    if not (a.initialize_neutral and not (proj.is_surjective() and proj.is_injective())):
        return _wrap(loops, nest)
    reset_depth = _in_nest_reset_depth(proj, lhs_idx, loops)
    if reset_depth is None:
        return seq(Fill(a.lhs, neutral), _wrap(loops, nest))
    return _wrap(loops, nest, (reset_depth, Store(a.lhs, lhs_idx, neutral)))


def lower_fetch(f: Fetch) -> Stmt:
    """A fill (constant), a loop nest over ``lhs``'s dims (offsets, slices, embedded symbols), or
    one store per cell (explicit values)."""
    lhs, compute = f.lhs, f.lhs.dtype.compute
    match f.source:
        case Constant(value=v):
            return Fill(lhs, _const(v, compute))
        case RangeOverOffsets():
            return _loop_over(lhs.dims, lambda idx: Store(lhs, idx, _embed(row_major_offset(idx, lhs.dims), compute)))
        case Slice(parent=parent, index=sym):
            if parent.dims[1:] != lhs.dims or not parent.dims or (sym.size or 0) > parent.dims[0]:
                raise ShapeError(
                    f"{lhs.debug_name} = {parent.debug_name} @| {sym.name}: expected the parent's dims to be "
                    f"({sym.size or 'n'},) + {lhs.dims}, got {parent.dims}"
                )
            return _loop_over(
                lhs.dims,
                lambda idx: Store(lhs, idx, _convert(Load(parent, (Iter(sym),) + idx), compute)),
            )
        case EmbedSymbol(symbol=sym):
            return _loop_over(lhs.dims, lambda idx: Store(lhs, idx, _embed(Iter(sym), compute)))
        case Values(values=values):
            if not values:
                raise ShapeError(f"{lhs.debug_name}: constant_fill needs at least one value")
            cells = itertools.product(*(range(d) for d in lhs.dims))
            return seq(
                *(
                    Store(lhs, tuple(Fixed(i) for i in cell), _const(values[k % len(values)], compute))
                    for k, cell in enumerate(cells)
                )
            )
    raise TypeError(f"not a fetch source: {f.source!r}")


def lower_gather(g: Gather) -> Stmt:
    """``lhs[i..., r...] := table[@(indices[i...]), r...]`` over ``lhs``'s dims (the axis
    convention of :class:`~ocannl.lowlevel.assignments.Gather`)."""
    k = _check_take(g.lhs, g.table, g.indices, "take")

    def body(idx: tuple[AxisIndex, ...]) -> Stmt:
        position = _position(g.indices, idx[:k])
        return Store(g.lhs, idx, _convert(LoadDynamic(g.table, 0, position, idx[k:]), g.lhs.dtype.compute))

    return _loop_over(g.lhs.dims, body)


def lower_scatter_add(s: ScatterAdd) -> Stmt:
    """``target[@(indices[i...]), r...] := target[...] + source[i..., r...]`` over ``source``'s
    dims. The loops over ``indices``' axes are reductions: two iterations may hit one row."""
    k = _check_take(s.source, s.target, s.indices, "scatter")
    compute = s.target.dtype.compute

    def body(idx: tuple[AxisIndex, ...]) -> Stmt:
        position = _position(s.indices, idx[:k])
        old = LoadDynamic(s.target, 0, position, idx[k:])
        new = _convert(Load(s.source, idx), compute)
        return StoreDynamic(s.target, 0, position, idx[k:], Binary(Binop.ADD, old, new))

    return _loop_over(s.source.dims, body)


# ---------------------------------------------------------------------------------------------


def _check_projections(a: Accum, proj: Projections) -> None:
    def mismatch(what: str, node_dims: tuple[int, ...], proj_dims: tuple[int, ...]) -> ShapeError:
        return ShapeError(
            f"{a.lhs.debug_name}: the projections give {what} dims {proj_dims} but the node has {node_dims} ({proj})"
        )

    if a.lhs.dims != proj.lhs_dims:
        raise mismatch("result", a.lhs.dims, proj.lhs_dims)
    if len(proj.project_rhs) != len(a.rhs):
        raise ShapeError(
            f"{a.lhs.debug_name}: {len(a.rhs)} operands but {len(proj.project_rhs)} operand projections"
        )
    for r, dims in zip(a.rhs, proj.rhs_dims):
        node_dims = r.dims if isinstance(r, TNode) else ()
        if node_dims != dims:
            raise mismatch("operand", node_dims, dims)


def _substitute(idx: AxisIndex, subst: dict[Symbol, Symbol | None]) -> AxisIndex:
    """``idx`` with product iterators replaced by their loop symbols (``None``: the value 0),
    simplified: an affine index of one unit term is an ``Iter``, one of no term a ``Fixed``."""

    def renamed(s: Symbol | IndexSymbol) -> Symbol | IndexSymbol | None:
        if isinstance(s, IndexSymbol):
            return s
        if s not in subst:
            raise ShapeError(f"an index uses {s!r}, which is not an iterator of the product space")
        return subst[s]

    match idx:
        case Iter(symbol=s):
            new = renamed(s)
            return Fixed(0) if new is None else Iter(new)
        case Affine(terms=terms, offset=offset):
            kept = tuple((c, n) for c, s in terms if (n := renamed(s)) is not None and c != 0)
            if not kept:
                return Fixed(offset)
            if len(kept) == 1 and kept[0][0] == 1 and offset == 0:
                return Iter(kept[0][1])
            return Affine(kept, offset)
    return idx


def _apply(fn: Unop | Binop | Ternop, args: list[Expr], dtype: DType) -> Expr:
    """``fn(args...)`` yielding a ``dtype`` value (only ``uniform1`` needs to be told)."""
    match fn:
        case Unop.ID:
            return args[0]
        case Unop.UNIFORM1:
            return Unary(fn, args[0], to=dtype)
        case Unop():
            return Unary(fn, args[0])
        case Binop():
            return Binary(fn, args[0], args[1])
        case Ternop():
            return Ternary(fn, args[0], args[1], args[2])


def _apply_tree(
    fn: Apply | Arg | CellOffset | float | int | tuple,
    operand: Callable[[int, DType], Expr],
    offset: AxisIndex,
    dtype: DType,
    definitions: list[Stmt],
) -> Expr:
    """An :class:`Apply` expression yielding a ``dtype`` value, with ``operand(j, type)`` reading
    operand ``j`` and ``offset`` the written cell's offset. Operators compute in their result's
    type, except the PRNG operators, whose operand types are fixed (``operand_dtypes``).

    ``fn`` may be a graph: one :class:`Apply` object read by several arguments (``prng.box_muller``
    reads its reduced argument at every step of a binary search). Such a sub-expression, where
    ``fn`` evaluates it unconditionally (:func:`_shared_subexpressions`), is lowered once: its
    ``declare t; t := e`` are appended to ``definitions``, to run before the expression, and each
    use reads ``t``, as common-subexpression elimination (optimize.py) would leave it. Lowered at
    each use instead, it would be copied once per path to it, exponentially many for
    ``box_muller``, for the elimination to merge again. A uint4x32 value stays at each use, as
    no local holds one (the same rule as ``optimize.virtualize``'s)."""
    shared, lowered = _shared_subexpressions(fn), {}

    def tree(x: Apply | Arg | CellOffset | float | int | tuple, t: DType) -> Expr:
        if isinstance(x, Arg):
            return operand(x.index, t)
        if isinstance(x, CellOffset):
            return _embed(offset, t)
        if not isinstance(x, Apply):
            return _const(x, t)
        if (id(x), t) in lowered:
            return lowered[id(x), t]
        e = _apply(x.op, [tree(arg, u) for arg, u in zip(x.args, operand_dtypes(x.op, t))], t)
        if id(x) in shared and t is not dtypes.uint4x32 and isinstance(e, (Unary, Binary, Ternary)):
            local = Local(t)
            definitions.extend((DeclareLocal(local), SetLocal(local, e)))
            e = lowered[id(x), t] = GetLocal(local)
        return e

    return tree(fn, dtype)


def _shared_subexpressions(fn: Apply | Arg | CellOffset | float | int | tuple) -> set[int]:
    """The ids of the :class:`Apply` objects in ``fn`` read by more than one argument, among
    those evaluated whenever ``fn`` is (reached without entering a ``where``'s branches, which
    are evaluated only when chosen). Each object is visited once."""
    uses: dict[int, int] = {}
    stack, seen = [fn], set()
    while stack:
        x = stack.pop()
        if not isinstance(x, Apply) or id(x) in seen:
            continue
        seen.add(id(x))
        for arg in x.args:
            uses[id(arg)] = uses.get(id(arg), 0) + 1
        stack.extend(x.args)
    unconditional: set[int] = set()
    stack = [fn]
    while stack:
        x = stack.pop()
        if id(x) in unconditional or not isinstance(x, Apply):
            continue
        unconditional.add(id(x))
        stack.extend(x.args[:1] if x.op is Ternop.WHERE else x.args)
    return {i for i in unconditional if uses.get(i, 0) > 1}


def _in_nest_reset_depth(
    proj: Projections, lhs_idx: tuple[AxisIndex, ...], loops: list[tuple[Symbol, int]]
) -> int | None:
    """Where in the nest a per-cell reset of ``lhs`` is correct: the number of enclosing loops,
    or ``None`` when the whole buffer must be filled first. It is correct when the projection
    reaches every cell, each ``lhs`` axis is a distinct loop index (or 0 on a size-1 axis), and
    those loops enclose all the others."""
    if not proj.is_surjective():
        return None
    written = [i.symbol for i in lhs_idx if isinstance(i, Iter)]
    if len(set(written)) != len(written) or any(not isinstance(i, (Iter, Fixed)) for i in lhs_idx):
        return None
    depth = len(written)
    if {s for s, _ in loops[:depth]} != set(written) or depth == len(loops):
        return None
    return depth


def _wrap(loops: list[tuple[Symbol, int]], body: Stmt, reset: tuple[int, Stmt] | None = None) -> Stmt:
    """``body`` inside ``loops`` (outermost first); ``reset = (depth, stmt)`` puts ``stmt`` just
    before the loop at that depth."""
    if reset is None:
        return nest(loops, body)
    depth, stmt = reset
    return nest(loops[:depth], seq(stmt, nest(loops[depth:], body)))


def _loop_over(dims: tuple[int, ...], body: Callable[[tuple[AxisIndex, ...]], Stmt]) -> Stmt:
    """A loop per axis of ``dims`` (none for a size-1 axis, indexed 0) around ``body(indices)``."""
    symbols = [None if d == 1 else Symbol() for d in dims]
    stmt = body(tuple(Fixed(0) if s is None else Iter(s) for s in symbols))
    return nest([(s, d) for s, d in zip(symbols, dims) if s is not None], stmt)


def _embed(index: AxisIndex, dtype: DType) -> Expr:
    """The value of ``index`` as a ``dtype`` scalar. A float takes it through int64 when a static
    symbol in it may be bound past int32 (it has no size, or a larger one): bindings are 64-bit,
    and ``step_n * 1.0`` must not wrap at 2**31."""
    if not dtype.is_float:
        return EmbedIndex(index, dtype)
    wide = any(isinstance(s, IndexSymbol) and (s.size is None or s.size > 2**31) for s in index_symbols(index))
    return Cast(EmbedIndex(index, dtypes.int64 if wide else dtypes.INDEX), dtype)


def _position(indices: TNode, idx: tuple[AxisIndex, ...]) -> Expr:
    """The row number read from ``indices`` at ``idx``, as an integer the bounds check sees whole:
    int64 and uint32 rows stay 64-bit (narrowed to int32, ``2**32 + 2`` would read row 2), float
    rows are tested before they convert (:func:`_float_position`), the others become index-typed
    integers."""
    row = Load(indices, idx)
    if row.dtype.is_float:
        return _float_position(row)
    wide = indices.dtype in (dtypes.int64, dtypes.uint32)
    return _convert(row, dtypes.int64 if wide else dtypes.INDEX)


def _float_position(row: Expr) -> Expr:
    """A float row number truncated toward zero, or -1 when it has no index value: a NaN, an
    infinity or a value past ``2**31`` would otherwise meet a float-to-integer conversion that C
    leaves undefined (on x86 it reads row 0). -1 is outside every axis, so every backend's bounds
    check reports it (docs/semantics.md, "Numerics")."""
    t = row.dtype
    convertible = Binary(Binop.AND, Binary(Binop.GT, row, _const(-1, t)), Binary(Binop.LT, row, _const(2**31, t)))
    return Ternary(Ternop.WHERE, convertible, Cast(row, dtypes.INDEX), _const(-1, dtypes.INDEX))


def _check_take(result: TNode, table: TNode, indices: TNode, what: str) -> int:
    if not table.dims or result.dims != indices.dims + table.dims[1:]:
        raise ShapeError(
            f"{what}: with indices of dims {indices.dims} and a table of dims {table.dims}, the result "
            f"must have dims indices.dims + table.dims[1:], got {result.dims}"
        )
    return len(indices.dims)


def _convert(e: Expr, dtype: DType) -> Expr:
    return e if e.dtype is dtype else Cast(e, dtype)


def _const(value: float | int | tuple, dtype: DType) -> Const:
    """A constant of a compute type; integer types take the value as ``dtypes.round_to`` does, a
    uint4x32 is a tuple of four lanes, each taken modulo 2**32 (an int ``v`` is ``(v, 0, 0, 0)``,
    as ``uint4x32_of``: the neutral element 0 is all lanes zero)."""
    if dtype is dtypes.uint4x32 and isinstance(value, int) and not isinstance(value, bool):
        value = (value, 0, 0, 0)
    if (dtype is dtypes.uint4x32) != isinstance(value, tuple):
        raise DTypeError(f"a {dtype.name} operand cannot be the constant {value!r}: a uint4x32 constant "
                         f"is an int or a tuple of four ints, and only uint4x32 operands take one")
    if dtype is dtypes.uint4x32:
        if len(value) != 4:
            raise DTypeError(f"a uint4x32 constant has four lanes, got {value!r}")
        return Const(tuple(int(v) & 0xFFFFFFFF for v in value), dtype)
    if dtype.is_float:
        return Const(float(value), dtype)
    return Const(int(dtypes.round_to(dtype, value)), dtype)
