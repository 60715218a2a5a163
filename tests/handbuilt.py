"""Hand-built assignments with hand-built projections: what the tensor frontend will produce,
written out so the compiler half is tested alone."""

from __future__ import annotations

from ocannl.lowlevel.assignments import Accum, Operand
from ocannl.lowlevel.indexing import Affine, AxisIndex, Iter, Projections, Symbol
from ocannl.lowlevel.scalar_ops import Binop, ScalarOp
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


def padded_conv1d(x: TNode, w: TNode, y: TNode, stride: int, pad: int) -> Accum:
    """``y[o] = sum_k x[stride*o + k - pad] * w[k]``, reading 0 outside ``x``."""
    o, k = Symbol(), Symbol()
    index = Affine(((stride, o), (1, k)), -pad)
    return accum(
        y, Binop.ADD, Binop.MUL, (x, w), [(o, y.dims[0]), (k, w.dims[0])], (Iter(o),), ((index,), (Iter(k),)),
        init=True, spec="stride*o=+k",
    )
