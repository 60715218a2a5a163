"""Hand-built assignments with hand-built projections: what the tensor frontend will produce,
written out so the compiler half is tested alone; and loop IR built by hand, so a backend is
tested alone."""

from __future__ import annotations

from collections.abc import Callable

from ocannl.lowlevel.assignments import Accum, Operand
from ocannl.lowlevel.indexing import Affine, AxisIndex, Iter, Projections, Symbol
from ocannl.lowlevel.ir import Expr, For, Store, loop
from ocannl.lowlevel.scalar_ops import Binop, ScalarOp, Unop
from ocannl.lowlevel.tnode import TNode


def accum(
    lhs: TNode,
    acc: Binop | None,
    fn: ScalarOp,
    rhs: tuple[Operand, ...],
    space: list[tuple[Symbol, int]],
    lhs_idx: tuple[AxisIndex, ...],
    rhs_idx: tuple[tuple[AxisIndex, ...], ...],
    *,
    init: bool = False,
    spec: str = "",
) -> Accum:
    """``lhs <acc>= fn(rhs...)`` over ``space``; dims come from the nodes (constants: ``()``)."""
    proj = Projections(
        product_space=tuple(n for _, n in space),
        product_iterators=tuple(s for s, _ in space),
        lhs_dims=lhs.dims,
        rhs_dims=tuple(r.dims if isinstance(r, TNode) else () for r in rhs),
        project_lhs=lhs_idx,
        project_rhs=rhs_idx,
    )
    return Accum(lhs, acc, fn, rhs, lambda: proj, initialize_neutral=init, spec=spec)


def matvec(a: TNode, v: TNode, c: TNode) -> Accum:
    """``c =:+ a * v ~logic:"@"``: ``c[i] = sum_k a[i, k] * v[k]``."""
    i, k = Symbol(), Symbol()
    n, m = a.dims
    return accum(
        c, Binop.ADD, Binop.MUL, (a, v), [(i, n), (k, m)], (Iter(i),), ((Iter(i), Iter(k)), (Iter(k),)),
        init=True, spec="@",
    )


def matmul(a: TNode, b: TNode, c: TNode) -> Accum:
    """``c =:+ a * b ~logic:"ik;kj=>ij"``: ``c[i, j] = sum_k a[i, k] * b[k, j]``."""
    i, j, k = Symbol(), Symbol(), Symbol()
    (n, m), (_, p) = a.dims, b.dims
    return accum(
        c, Binop.ADD, Binop.MUL, (a, b), [(i, n), (j, p), (k, m)], (Iter(i), Iter(j)),
        ((Iter(i), Iter(k)), (Iter(k), Iter(j))), init=True, spec="ik;kj=>ij",
    )


def broadcast_add(x: TNode, b: TNode, y: TNode) -> Accum:
    """``y =: x + b ~logic:"."`` over ``y``'s two axes, ``b`` read at the same cell as ``x``."""
    i, j = Symbol(), Symbol()
    n, m = y.dims
    return accum(y, None, Binop.ADD, (x, b), [(i, n), (j, m)], (Iter(i), Iter(j)),
                 ((Iter(i), Iter(j)), (Iter(i), Iter(j))), spec=".")


def sum_and_max_over_middle(x: TNode, s: TNode, m: TNode) -> tuple[Accum, Accum]:
    """``s =:+ x ~logic:"bij=>bj"`` and ``m =:^ x ~logic:"bij=>bi"``: a sum over the middle axis
    and a max over the last one."""
    b, i, j = Symbol(), Symbol(), Symbol()
    b2, i2, j2 = Symbol(), Symbol(), Symbol()
    (nb, ni, nj) = x.dims
    return (
        accum(s, Binop.ADD, Unop.ID, (x,), [(b, nb), (i, ni), (j, nj)], (Iter(b), Iter(j)),
              ((Iter(b), Iter(i), Iter(j)),), init=True, spec="bij=>bj"),
        accum(m, Binop.MAX, Unop.ID, (x,), [(b2, nb), (i2, ni), (j2, nj)], (Iter(b2), Iter(i2)),
              ((Iter(b2), Iter(i2), Iter(j2)),), init=True, spec="bij=>bi"),
    )


def padded_conv1d(x: TNode, w: TNode, y: TNode, stride: int, pad: int) -> Accum:
    """``y[o] = sum_k x[stride*o + k - pad] * w[k]``, reading 0 outside ``x``."""
    o, k = Symbol(), Symbol()
    index = Affine(((stride, o), (1, k)), -pad)
    return accum(
        y, Binop.ADD, Binop.MUL, (x, w), [(o, y.dims[0]), (k, w.dims[0])], (Iter(o),), ((index,), (Iter(k),)),
        init=True, spec="stride*o=+k",
    )


def pointwise(lhs: TNode, fn: ScalarOp, *rhs: Operand, acc: Binop | None = None, init: bool = False,
              spec: str = ".") -> Accum:
    """``lhs[i] <acc>= fn(rhs[i]...)`` cell by cell over ``lhs``'s only axis; a constant operand
    is read as is."""
    i = Symbol()
    return accum(lhs, acc, fn, rhs, [(i, lhs.dims[0])], (Iter(i),),
                 tuple((Iter(i),) if isinstance(r, TNode) else () for r in rhs), init=init, spec=spec)


def pointwise_loop(out: TNode, value: Callable[[Iter], Expr]) -> For:
    """The loop IR ``out[i] := value(i)`` over ``out``'s only axis, for tests of a backend alone."""
    i = Symbol()
    return loop(i, out.dims[0], Store(out, (Iter(i),), value(Iter(i))))
