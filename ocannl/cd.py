"""User-level assignments: ``oc.cd.assign(dst, op, value)``, the ``%cd`` statements of the original.

Every op's forward and gradient code is an accumulating assignment ``lhs <op> rhs`` of the
assignments IR (``ocannl/lowlevel/assignments.py``). This module lets a user write one directly,
as a :class:`~ocannl.lowlevel.assignments.Computation` that ``ctx.compile`` accepts alone or
beside other items (a training step, a forward pass)::

    total = oc.tensor(np.zeros(3))
    acc = oc.cd.assign(total, "=+", xs[batch_n])    # total += xs[batch_n] on every run
    ctx.compile(acc).run(batch_n=0)

``op`` is ``"=:"`` (set) or ``"="`` followed by an accumulator's symbol: ``"=+"``, ``"=-"``,
``"=*"``, ``"=/"``, ``"=@^"`` (max), ``"=@-"`` (min); ``dst <op> value`` updates ``dst`` cell by
cell (``dst =- value`` is ``dst = dst - value``). The written cells are ``dst``'s buffer, or, when
``dst`` is a batch slice ``xs[sym]`` (possibly of a slice), the cells of ``xs`` at the index
bound to ``sym`` when the routine runs: the write lands in ``xs``.

``value`` is a tensor or a number. A tensor has ``dst``'s dims, axis by axis, except that an
axis of size 1 (or no axes at all) broadcasts over ``dst``'s axis; its forward code (and the
initializers of its parameters and data) run first, in the same routine. The destination is
stored data: a data tensor, a parameter, or a batch slice of one; its initializer runs once per
context, as for any item compiled there. The assignment itself has no gradient: it is a
statement, not a tensor.
"""

from __future__ import annotations

import functools
import numbers

from ocannl.errors import SessionError, ShapeError
from ocannl.lowlevel.assignments import Accum, Assignment, Block, Computation
from ocannl.lowlevel.indexing import AxisIndex, Fixed, Iter, Projections, Symbol
from ocannl.lowlevel.scalar_ops import ACCUMULATORS, Binop, Unop
from ocannl.lowlevel.tnode import TNode
from ocannl.tensor import Tensor, as_tensor, finish_inference

OPERATORS: dict[str, Binop | None] = {
    "=:": None, **{f"={b.symbol}": b for b in sorted(ACCUMULATORS, key=lambda b: b.value)}}
"""The assignment operators ``assign`` takes, with the accumulator each one applies (``None``:
a plain set)."""


def assign(dst: Tensor, op: str, value, *, name: str | None = None) -> Computation:
    """The computation ``dst <op> value`` (see the module docstring), named ``name`` in
    printouts (``<dst>_assign`` by default).

    Raises ``ShapeError`` naming the op, both shapes and the axis when ``value``'s dims do not
    fit ``dst``'s; ``SessionError`` for an unknown ``op`` or a destination that is not stored
    data: a number, or a tensor computed by an op, whose forward code would overwrite the write
    (and which the optimizer may not keep in memory at all); ``TypeError`` when ``dst`` is not a
    tensor."""
    if op not in OPERATORS:
        raise SessionError(f"oc.cd.assign: unknown assignment operator {op!r}; use one of {', '.join(OPERATORS)}")
    if not isinstance(dst, Tensor):
        raise TypeError(f"oc.cd.assign: the destination must be a tensor, got {type(dst).__name__}")
    if dst.is_constant:
        raise SessionError(f"oc.cd.assign: the destination {dst.label!r} is a number, which has no buffer to write")
    root_tensor = _root_tensor(dst)
    if root_tensor.definition is not None or root_tensor.op == "embed_index":
        raise SessionError(
            f"oc.cd.assign: cannot write into {root_tensor.label!r}, computed by {root_tensor.op}: its forward "
            f"code recomputes it; write into a data tensor, a parameter, or a batch slice of one")
    if not isinstance(value, (numbers.Number, Tensor)):
        value = as_tensor(value)
    finish_inference()
    root, prefix = _written_cells(dst)
    statement = f"{dst.label} {op} {_describe(value)}"
    rhs_dims = _checked_value_dims(dst, value, statement)
    operand = _constant(value, dst) if rhs_dims is None else value.value
    projections = functools.cache(lambda: _projections(dst.dims, prefix, root, rhs_dims, statement))
    write = Accum(root, OPERATORS[op], Unop.ID, (operand,), projections, spec=".")

    body: list[Assignment] = []
    inits = []
    if (init := root_tensor.initializer()) is not None:
        inits.append(init)
    if isinstance(value, Tensor) and not value.is_constant:
        computed = value.to_computation()
        body.append(computed.body)
        inits.extend(i for i in computed.inits if i[0] not in {n for n, _ in inits})
    body.append(write)
    label = name or f"{dst.label}_assign"
    return Computation(label, Block(tuple(body), comment=statement), tuple(inits))


def _root_tensor(dst: Tensor) -> Tensor:
    """The tensor whose buffer ``dst`` names: ``xs`` for ``xs[i][j]``, ``dst`` itself otherwise."""
    while dst.op == "slice":
        (dst,) = dst.operands
    return dst


def _written_cells(dst: Tensor) -> tuple[TNode, tuple[AxisIndex, ...]]:
    """The node written and the indices of its leading axes fixed by slicing: ``(xs, (Iter(i),
    Iter(j)))`` for ``xs[i][j]``, ``(dst, ())`` for a tensor that is not a slice."""
    prefix: list[AxisIndex] = []
    while dst.op == "slice":
        prefix.insert(0, Iter(dst.logic.symbol))  # type: ignore[union-attr]
        (dst,) = dst.operands
    return dst.value, tuple(prefix)


def _describe(value) -> str:
    return value.label if isinstance(value, Tensor) else repr(value)


def _constant(value, dst: Tensor) -> float | int:
    """A number (or a number tensor) as the assignment's constant operand, in ``dst``'s kind."""
    number = value.data if isinstance(value, Tensor) else value
    return float(number) if dst.dtype.is_float else int(number)


def _checked_value_dims(dst: Tensor, value, statement: str) -> tuple[int, ...] | None:
    """``value``'s dims when it is read from a buffer (``None`` for a constant), after checking
    that each of its axes equals ``dst``'s or is 1; no axes at all broadcasts everywhere."""
    if not isinstance(value, Tensor) or value.is_constant:
        return None
    dims, want = tuple(value.dims), tuple(dst.dims)
    if dims == ():
        return dims
    if len(dims) != len(want):
        raise ShapeError(f"oc.cd.assign {statement}: {value.label!r} has {len(dims)} axes (shape {value.shape}, "
                         f"dims {dims}) but {dst.label!r} has {len(want)} (shape {dst.shape}, dims {want})")
    for axis, (d, w) in enumerate(zip(dims, want)):
        if d not in (w, 1):
            raise ShapeError(f"oc.cd.assign {statement}: axis {axis} of {value.label!r} has size {d} where "
                             f"{dst.label!r} has {w} (shapes {value.shape} and {dst.shape}; dims {dims} "
                             f"and {want}): sizes must match or the value's be 1")
    return dims


def _projections(dims: tuple[int, ...], prefix: tuple[AxisIndex, ...], root: TNode,
                 rhs_dims: tuple[int, ...] | None, statement: str) -> Projections:
    """One loop per axis of ``dst`` of size above 1; the root node is indexed by the slice
    prefix then those loops, the value by the same loops (``Fixed(0)`` where it broadcasts)."""
    loops: list[tuple[Symbol, int]] = []
    lhs: list[AxisIndex] = list(prefix)
    rhs: list[AxisIndex] = []
    for axis, d in enumerate(dims):
        if d == 1:
            lhs.append(Fixed(0))
        else:
            loops.append((Symbol(), d))
            lhs.append(Iter(loops[-1][0]))
        if rhs_dims:
            rhs.append(Fixed(0) if rhs_dims[axis] == 1 else lhs[-1])
    return Projections(
        product_space=tuple(n for _, n in loops),
        product_iterators=tuple(s for s, _ in loops),
        lhs_dims=root.dims,
        rhs_dims=(rhs_dims if rhs_dims is not None else (),),
        project_lhs=tuple(lhs),
        project_rhs=(tuple(rhs),),
        debug=statement,
    )


__all__ = ["assign", "OPERATORS"]
