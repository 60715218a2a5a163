"""The operator catalog: each operation's shape logic, forward code and gradient in one place.

Every public op is a function over tensors (numbers and index symbols are accepted where a tensor
is, and become scalar tensors). Names follow the catalog of spec/frontend.md §3.2 and the public API
of shared/DESIGN.md §4.
"""

from __future__ import annotations

import builtins
import math
from typing import Callable, Sequence

import numpy as np

from ocannl.errors import EinsumSyntaxError, SessionError, ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import (Accum, Apply, Arg, Assignment, Block, Constant, EmbedSymbol, Fetch,
                                        Gather, RangeOverOffsets, ScatterAdd, Slice)
from ocannl.lowlevel.indexing import IndexSymbol, Iter, Projections
from ocannl.lowlevel.scalar_ops import Binop, ScalarOp, Ternop, Unop
from ocannl.lowlevel.tnode import TNode
from ocannl.shape import einsum as es
from ocannl.shape import solver as solver_mod
from ocannl.shape.shape import Shape
from ocannl.shape.logic import BatchSlice, Compose, Einsum, Interleave, Pointwise, Take, reduction_spec
from ocannl.shape.projections import derive_projections, identity_projections, retarget
from ocannl.shape.shape import KINDS, Row
from ocannl.shape.solver import DimEq, Origin
from ocannl.tensor import Tensor, as_tensor, new_op

UNARY_OPS = ("relu", "sat01", "exp", "log", "exp2", "log2", "sin", "cos", "sqrt", "recip",
             "recip_sqrt", "neg", "tanh", "sigmoid", "abs", "not")
"""Pointwise unary functions (``not`` is exposed as ``oc.not_``)."""

BINARY_OPS = ("add", "sub", "mul", "div", "pow", "lt", "gt", "eq", "ne", "max", "min")
"""Pointwise binary functions; ``<``, ``>``, ``==``, ``!=`` give 1.0 where true, 0.0 elsewhere."""


# ---------------------------------------------------------------------------------------------
# Forward code. Every op's forward is one accumulating assignment over its projections,
# ``v <accum>= fn(v1, ...)``, as the original's ``%cd`` definitions (spec/frontend.md §3.2).


def _operand(t: Tensor):
    """A number is inlined as a constant; every other operand is read from its buffer."""
    return float(t.data) if t.is_constant else t.value


def _assign(t: Tensor, fn: ScalarOp, accum: Binop | None = None, spec: str = ".") -> Accum:
    """``v =: fn(...)`` (``accum`` None), or ``v =:<accum> fn(...)``: reset to the accumulator's
    neutral element, then accumulate over the reduced axes (lowering drops the reset when every
    cell is written exactly once)."""
    return Accum(t.value, accum, fn, tuple(_operand(o) for o in t.operands), t.projections,
                 initialize_neutral=accum is not None, spec=spec)


def _spec_text(t: Tensor, default: str) -> str:
    logic = t.logic
    return logic.spec.text if isinstance(logic, Einsum) else default


_POINTWISE_FN: dict[str, ScalarOp] = {
    **{op: Unop(op) for op in UNARY_OPS}, **{op: Binop(op) for op in BINARY_OPS},
    "where": Ternop.WHERE, "fma": Ternop.FMA,
}

_EINSUM_FORWARD: dict[str, tuple[Binop, dict[int, ScalarOp]]] = {
    # op: (accumulator, the function of the operands by arity)
    "einsum": (Binop.ADD, {1: Unop.ID, 2: Binop.MUL, 3: Ternop.MUL3}),
    "outer_sum": (Binop.ADD, {2: Binop.ADD}),
    "einmax": (Binop.MAX, {1: Unop.ID}),
    "tropical": (Binop.MAX, {2: Binop.ADD}),
    "sum": (Binop.ADD, {1: Unop.ID}),
    "mean": (Binop.ADD, {1: Unop.ID}),
    "max_reduce": (Binop.MAX, {1: Unop.ID}),
}


def forward_code(t: Tensor) -> Assignment:
    """The forward assignment of ``t``'s op."""
    if t.op in _POINTWISE_FN:
        fn = _POINTWISE_FN[t.op]
        if isinstance(t.logic, Einsum):  # a pointwise op given an einsum spec may reduce
            return _assign(t, fn, Binop.ADD, t.logic.spec.text)
        return _assign(t, fn)
    if t.op == "compose":
        return _assign(t, Binop.MUL, Binop.ADD, "@")
    if t.op in _EINSUM_FORWARD:
        accum, fns = _EINSUM_FORWARD[t.op]
        fn = fns.get(len(t.operands))
        if fn is None:
            raise ShapeError(f"{t.op} of {len(t.operands)} operands is not supported")
        code = _assign(t, fn, accum, _spec_text(t, t.op))
        if t.op == "mean":
            (x,) = t.operands
            count = int(np.prod(x.dims)) // builtins.max(1, int(np.prod(t.dims)))
            scale = Accum(t.value, Binop.MUL, Unop.ID, (_mean_scale(count),),
                          lambda: identity_projections(t.dims, [()]), spec=".")
            return Block((code, scale))
        return code
    if t.op == "slice":
        (x,) = t.operands
        return Fetch(t.value, Slice(x.value, t.logic.symbol))  # type: ignore[union-attr]
    if t.op == "embed_index":
        return Fetch(t.value, EmbedSymbol(t.symbol))  # type: ignore[arg-type]
    if t.op == "take":
        table, indices = t.operands
        return Gather(t.value, table.value, indices.value)
    if t.op in ("concat", "interleave"):
        return Block(tuple(Accum(t.value, None, Unop.NEG if t.attrs.get("negated") else Unop.ID,
                                 (_operand(o),), _part_projections(t, j), spec=_spec_text(t, t.op))
                           for j, o in enumerate(t.operands)))
    raise ShapeError(f"no forward code for op {t.op!r}")


# ---------------------------------------------------------------------------------------------
# Gradients. Each rule says, for operand j, how its gradient accumulates, as an expression of
# ``g`` (the result's gradient), ``v`` (the result's value) and ``v1``, ``v2``, ``v3`` (the
# operands' values); every term is read through the op's own projections (``retarget``), so a
# forward reduction becomes a backward broadcast and a broadcast a reduction (spec §3.2).

LN2 = 0.6931471805599453


def _b(op: ScalarOp, *args):
    return (op, *args)


def _mul(a, b):
    return _b(Binop.MUL, a, b)


def _div(a, b):
    return _b(Binop.DIV, a, b)


def _mean_scale(count: int) -> float:
    """``1 / count``, the factor turning a sum of ``count`` cells into their mean; over no cell
    (a size-0 axis) it is +inf, so that the mean is ``0 * inf``, NaN, as numpy's ``0 / 0``
    (docs/semantics.md, "Numerics")."""
    return 1.0 / count if count else math.inf


_ADD, _SUB = Binop.ADD, Binop.SUB
_G_TIMES_V2 = {1: (_ADD, _mul("g", "v2")), 2: (_ADD, _mul("v1", "g"))}
# At a tie of the two operands the first one gets the gradient (docs/semantics.md).
_TO_THE_FIRST_EQUAL = {1: (_ADD, _mul("g", _b(Binop.EQ, "v", "v1"))),
                       2: (_ADD, _mul("g", _mul(_b(Binop.EQ, "v", "v2"), _b(Binop.NE, "v1", "v2"))))}

GRADIENTS: dict[str, dict[int, tuple[Binop, object]]] = {
    "add": {1: (_ADD, "g"), 2: (_ADD, "g")},
    "sub": {1: (_ADD, "g"), 2: (_SUB, "g")},
    "mul": _G_TIMES_V2,
    "div": {1: (_ADD, _div("g", "v2")), 2: (_SUB, _mul("g", _div("v", "v2")))},
    "pow": {1: (_ADD, _mul("g", _mul("v2", _b(Binop.POW, "v1", _b(Binop.SUB, "v2", 1.0))))),
            2: (_ADD, _mul("g", _mul("v", _b(Unop.LOG, "v1"))))},
    "neg": {1: (_SUB, "g")},
    "relu": {1: (_ADD, _b(Binop.RELU_GATE, "v1", "g"))},
    "sat01": {1: (_ADD, _b(Binop.SAT01_GATE, "v1", "g"))},
    "exp": {1: (_ADD, _mul("g", "v"))},
    "exp2": {1: (_ADD, _mul("g", _mul("v", LN2)))},
    "log": {1: (_ADD, _div("g", "v1"))},
    "log2": {1: (_ADD, _div("g", _mul("v1", LN2)))},
    "sin": {1: (_ADD, _mul("g", _b(Unop.COS, "v1")))},
    "cos": {1: (_SUB, _mul("g", _b(Unop.SIN, "v1")))},
    "sqrt": {1: (_ADD, _div("g", _mul(2.0, "v")))},
    "recip": {1: (_SUB, _mul("g", _mul("v", "v")))},
    "recip_sqrt": {1: (_ADD, _mul("g", _mul(-0.5, _mul("v", _mul("v", "v")))))},
    "tanh": {1: (_ADD, _mul("g", _b(Binop.SUB, 1.0, _mul("v", "v"))))},
    "sigmoid": {1: (_ADD, _mul("g", _mul("v", _b(Binop.SUB, 1.0, "v"))))},
    "abs": {1: (_ADD, _mul("g", _b(Binop.SUB, _b(Binop.GT, "v1", 0.0), _b(Binop.LT, "v1", 0.0))))},
    "max": _TO_THE_FIRST_EQUAL,
    "min": _TO_THE_FIRST_EQUAL,
    "where": {2: (_ADD, _b(Ternop.WHERE, "v1", "g", 0.0)), 3: (_ADD, _b(Ternop.WHERE, "v1", 0.0, "g"))},
    "fma": {1: (_ADD, _mul("g", "v2")), 2: (_ADD, _mul("v1", "g")), 3: (_ADD, "g")},
    "compose": _G_TIMES_V2,
    "outer_sum": {1: (_ADD, "g"), 2: (_ADD, "g")},
    "sum": {1: (_ADD, "g")},
    "slice": {1: (_ADD, "g")},
}
"""Gradient rules of the differentiable ops; ``einsum``, ``mean`` and ``take`` depend on arity
or shapes and are in :func:`gradient_rules`, the max-reductions in :data:`MAX_REDUCTIONS`. Ops
absent here (comparisons, ``not``) have no gradient."""

MAX_REDUCTIONS: dict[str, object] = {"einmax": "v1", "max_reduce": "v1", "tropical": _b(Binop.ADD, "v1", "v2")}
"""The ops reducing by maximum, each with the value a point of its loops offers the maximum;
their gradient goes to the first maximum of each window (:func:`_first_maximum_backward`)."""

NON_DIFFERENTIABLE = frozenset({"lt", "gt", "eq", "ne", "not", "embed_index", "tensor", "number"})


def gradient_rules(t: Tensor) -> dict[int, tuple[Binop, object]]:
    if t.op == "einsum":
        n = len(t.operands)
        if n == 1:
            return {1: (_ADD, "g")}
        if n == 2:
            return _G_TIMES_V2
        return {1: (_ADD, _b(Ternop.MUL3, "g", "v2", "v3")), 2: (_ADD, _b(Ternop.MUL3, "v1", "g", "v3")),
                3: (_ADD, _b(Ternop.MUL3, "v1", "v2", "g"))}
    if t.op == "mean":
        (x,) = t.operands
        count = int(np.prod(x.dims)) // builtins.max(1, int(np.prod(t.dims)))
        return {1: (_ADD, _mul("g", _mean_scale(count)))}
    return GRADIENTS.get(t.op, {})


def backward_code(t: Tensor) -> list[Assignment]:
    """The assignments adding ``t``'s contribution to its operands' gradients."""
    if t.op == "take":
        table, indices = t.operands
        return [ScatterAdd(table.grad, indices.value, t.grad)] if table.requires_grad else []
    if t.op in MAX_REDUCTIONS:
        return _first_maximum_backward(t)
    if t.op in ("concat", "interleave"):
        accum = Binop.SUB if t.attrs.get("negated") else Binop.ADD
        return [Accum(o.grad, accum, Unop.ID, (t.grad,), _retargeted_part(t, j), spec=_spec_text(t, t.op))
                for j, o in enumerate(t.operands) if o.requires_grad]
    code: list[Assignment] = []
    for j, (accum, expr) in sorted(gradient_rules(t).items()):
        target = t.operands[j - 1]
        if not target.requires_grad:
            continue
        code.append(_gradient_accum(t, j, accum, expr))
    return code


def _gradient_accum(t: Tensor, j: int, accum: Binop, expr) -> Accum:
    """``operand_j.grad <accum>= expr``, ``expr`` read at the forward op's projections."""
    return _rule_accum(t, t.operands[j - 1].grad, j, accum, expr, t.projections)


def _rule_accum(t: Tensor, lhs: TNode, lhs_slot: int, accum: Binop, expr, projections: Callable[[], Projections],
                extra: dict[str, tuple[TNode, int]] | None = None, initialize_neutral: bool = False) -> Accum:
    """``lhs <accum>= expr`` over the loops of ``projections()``, ``t``'s forward loops (its
    slot ``lhs_slot`` indexes ``lhs``). The leaves of ``expr`` are ``g`` and ``v`` (read at the
    result's slot 0), ``v1``, ``v2``, ``v3`` (the operands' slots) and the names in ``extra``,
    each a node with the slot that indexes it."""
    extra = extra or {}
    leaves: list[str] = []

    # With a reducing spec (``oc.exp(x, spec="ij=>i")``) the result holds a sum, not each
    # point's value: a rule reading ``v`` recomputes it from the operands at the point.
    pointwise_value = t.op in _POINTWISE_FN and isinstance(t.logic, Einsum)

    def compile_expr(e):
        if e == "v" and pointwise_value:
            return compile_expr((_POINTWISE_FN[t.op], *(f"v{k + 1}" for k in range(len(t.operands)))))
        if isinstance(e, str):
            if e not in leaves:
                leaves.append(e)
            return Arg(leaves.index(e))
        if isinstance(e, tuple):
            return Apply(e[0], tuple(compile_expr(x) for x in e[1:]))
        return float(e)

    fn = compile_expr(expr)
    rhs, slots = [], []
    for leaf in leaves:
        if leaf == "g":
            rhs.append(t.grad)
            slots.append(0)
        elif leaf == "v":
            rhs.append(t.value)
            slots.append(0)
        elif leaf in extra:
            node, slot = extra[leaf]
            rhs.append(node)
            slots.append(slot)
        else:
            k = int(leaf[1:])
            rhs.append(_operand(t.operands[k - 1]))
            slots.append(k)
    if isinstance(fn, Arg):
        fn = Unop.ID
    return Accum(lhs, accum, fn, tuple(rhs), lambda: retarget(projections(), lhs_slot, slots),
                 initialize_neutral=initialize_neutral, spec=_spec_text(t, "."))


def _first_maximum_backward(t: Tensor) -> list[Assignment]:
    """The gradient of a max-reduction: in each window (the cells reduced into one result
    cell), only the first cell equal to the maximum, in the order the reduced loops run
    (row-major over the reduced axes), receives the result's gradient, so the gradient keeps
    its total at ties (docs/semantics.md, "Gradients at ties"). One rule for every backend,
    written as three assignments over the forward loops:

    - ``position`` holds 0, 1, 2... over the window's shape;
    - ``first`` (the result's shape) takes the least position whose point equals the maximum;
    - each operand's gradient accumulates ``g`` at the points whose position is ``first``.

    Positions are numbers of the result's compute precision; a window larger than it counts
    exactly is an error rather than a gradient split between neighbours."""
    targets = [j for j, o in enumerate(t.operands, 1) if o.requires_grad]
    if not targets:
        return []
    proj = t.projections()
    extents = dict(zip(proj.product_iterators, proj.product_space))
    reduced = proj.reduction_iterators()
    window = tuple(extents[r] for r in reduced)
    size = math.prod(window)
    dtype = t.dtype.compute if t.dtype.is_float else dtypes.DEFAULT
    exact = 2**53 if dtype is dtypes.float64 else 2**24
    if size > exact:
        built_at = f" (built at {t.source})" if t.source else ""
        raise SessionError(
            f"{t.op} {t.label!r}{built_at}: each result cell reduces {size} cells, more than {dtype.name} "
            f"positions count exactly ({exact}), so a tie could not be given to its first maximum; reduce "
            f"in two steps (a maximum of maxima over smaller windows)")
    numbered = Projections(proj.product_space, proj.product_iterators, proj.lhs_dims, proj.rhs_dims + (window,),
                           proj.project_lhs, proj.project_rhs + (tuple(Iter(r) for r in reduced),), proj.debug)
    position = TNode(f"{t.label}_window_position", dims=window, dtype=dtype)
    first = TNode(f"{t.label}_first_maximum", dims=t.dims, dtype=dtype)
    extra = {"position": (position, len(t.operands) + 1), "first": (first, 0)}
    is_maximum = _b(Binop.EQ, MAX_REDUCTIONS[t.op], "v")
    code: list[Assignment] = [
        Fetch(position, RangeOverOffsets()),
        _rule_accum(t, first, 0, Binop.MIN, _b(Ternop.WHERE, is_maximum, "position", float(size)),
                    lambda: numbered, extra, initialize_neutral=True),
    ]
    for j in targets:
        code.append(_rule_accum(t, t.operands[j - 1].grad, j, _ADD, _mul("g", _b(Binop.EQ, "position", "first")),
                                lambda: numbered, extra))
    return code


def _part_projections(t: Tensor, j: int):
    """Projections of component ``j`` of a concatenation or interleaving: (result, operand j)."""
    def proj():
        t.dims  # finalizes inference
        from ocannl.shape import solver as s

        shapes = [o._shape for o in t.operands]
        slots = t.logic.part_layout(j, t._shape, shapes, s.current())  # type: ignore[union-attr]
        return derive_projections(slots, [t.dims, t.operands[j].dims], debug=f"{t.op} {t.label} part {j}")

    return proj


def _retargeted_part(t: Tensor, j: int):
    forward = _part_projections(t, j)
    return lambda: retarget(forward(), 1, [0])


def param_init_code(t: Tensor):
    """A parameter's initializer: a number fills it, an array is its value."""
    init = t.init
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return Fetch(t.value, Constant(float(init)))
    if isinstance(init, np.ndarray) or isinstance(init, (list, tuple)):
        arr = np.asarray(init)
        if arr.shape != t.dims:
            raise ShapeError(f"parameter {t.label!r}: init array of shape {arr.shape} does not match its dims {t.dims}")
        # Host values (bfloat16 as float32), rounded to the precision and range-checked here.
        return dtypes.from_storage(t.dtype, dtypes.to_storage(t.dtype, arr, f"parameter {t.label!r}"))
    if callable(init):
        return init(t)
    if init is None:
        return default_init(t)
    raise SessionError(f"parameter {t.label!r}: init={init!r} is not a number, an array or an initializer "
                       f"(oc.param accepts those)")


def default_init(t: Tensor):
    """Glorot uniform for a weight (a parameter with input axes), 0 for a bias."""
    if not t._shape.input.dims:
        return Fetch(t.value, Constant(0.0))
    from ocannl import init as init_mod

    return init_mod.glorot_uniform(t)

# ---------------------------------------------------------------------------------------------
# Pointwise operations.


def _pointwise(op: str, operands: Sequence, label: str | None, spec: str | None = None,
               use_padding: bool | None = None) -> Tensor:
    ts = [as_tensor(x) for x in operands]
    if spec is not None:
        parsed = es.parse_einsum(spec)
        return new_op(op, Einsum(parsed, use_padding), ts, label, spec=spec)
    return new_op(op, Pointwise(), ts, label)


def _unary(op: str):
    def fn(x, *, label: str | None = None, spec: str | None = None) -> Tensor:
        return _pointwise(op, (x,), label, spec)

    fn.__name__ = "not_" if op == "not" else op
    fn.__doc__ = f"Pointwise ``{op}``; with ``spec=`` the operand is permuted/reduced by that einsum."
    return fn


def _binary(op: str):
    def fn(a, b, *, label: str | None = None, spec: str | None = None) -> Tensor:
        return _pointwise(op, (a, b), label, spec)

    fn.__name__ = op
    fn.__doc__ = f"Pointwise ``{op}`` with numpy-style broadcasting (or the einsum ``spec=``)."
    if op in ("max", "min"):
        fn.__doc__ += " Where the operands are equal, the first gets the gradient (docs/semantics.md)."
    return fn


relu, sat01, exp, log, exp2, log2, sin, cos, sqrt, recip, recip_sqrt, neg, tanh, sigmoid, abs, not_ = (
    _unary(op) for op in UNARY_OPS)
add, sub, mul, div, pow, lt, gt, eq, ne, maximum, minimum = (_binary(op) for op in BINARY_OPS)


def where(cond, a, b, *, spec: str | None = None, label: str | None = None) -> Tensor:
    """``a`` where ``cond`` is non-zero, else ``b``, broadcasting all three (numbers allowed)."""
    return _pointwise("where", (cond, a, b), label, spec)


def fma(a, b, c, *, label: str | None = None) -> Tensor:
    """``a * b + c`` pointwise, in one operation."""
    return _pointwise("fma", (a, b, c), label)


# ---------------------------------------------------------------------------------------------
# Compose, einsum and reductions.


def compose(a, b, *, label: str | None = None) -> Tensor:
    """``a @ b``: a's input axes contract with b's output axes; batch axes broadcast."""
    return new_op("compose", Compose(), [as_tensor(a), as_tensor(b)], label)


def _einsum(op: str, spec: str, operands: Sequence, arity: Sequence[int], use_padding: bool | None,
            capture: Sequence[str] | None, label: str | None) -> Tensor:
    if not isinstance(spec, str):
        raise TypeError(f"oc.{op}: the first argument is the spec string")
    parsed = es.parse_einsum(spec)
    if len(operands) not in arity or len(parsed.operands) != len(operands):
        raise EinsumSyntaxError(
            spec, len(spec),
            f"oc.{op} takes {' or '.join(map(str, arity))} operand(s); the spec has "
            f"{len(parsed.operands)} and {len(operands)} tensor(s) were given")
    logic = Einsum(parsed, use_padding)
    t = new_op(op, logic, [as_tensor(x) for x in operands], label, spec=spec)
    if capture:
        t.attrs["captured"] = {name: DimRef(logic, name, spec) for name in capture}
    return t


def einsum(spec: str, *operands, use_padding: bool | None = None, capture: Sequence[str] | None = None,
           label: str | None = None) -> Tensor:
    """Generalized einsum, sum of products over the axes absent from the result (one to three
    operands). See spec/frontend.md §2 for the grammar; ``capture`` names labels or row variables
    whose sizes the program reads (``t.captured["h"]``)."""
    return _einsum("einsum", spec, operands, (1, 2, 3), use_padding, capture, label)


def outer_sum(spec: str, a, b, *, use_padding: bool | None = None, label: str | None = None) -> Tensor:
    """Like einsum with ``+`` in place of ``*``: sums ``a + b`` over the axes absent from the result."""
    return _einsum("outer_sum", spec, (a, b), (2,), use_padding, None, label)


def einmax(spec: str, a, *, use_padding: bool | None = None, capture: Sequence[str] | None = None,
           label: str | None = None) -> Tensor:
    """One-operand einsum that takes the maximum over the axes absent from the result. At a tie,
    the gradient goes to the first maximum (docs/semantics.md, "Gradients at ties")."""
    return _einsum("einmax", spec, (a,), (1,), use_padding, capture, label)


def tropical(spec: str, a, b, *, use_padding: bool | None = None, label: str | None = None) -> Tensor:
    """Max-plus einsum: the maximum of ``a + b`` over the axes absent from the result
    (max-pooling with a kernel-shaped ``b``). At a tie, the gradient goes to the first maximum."""
    return _einsum("tropical", spec, (a, b), (2,), use_padding, None, label)


def _reduction_kinds(axes) -> tuple[str, ...]:
    if axes is None:
        return KINDS
    kinds = (axes,) if isinstance(axes, str) else tuple(axes)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"axes= takes kinds among {KINDS}, got {bad}")
    return kinds


def sum(x, axes=None, *, label: str | None = None) -> Tensor:  # noqa: A001 - the catalog's name
    """Sum over every axis (dims ``()``), or over the axes of the given kinds (``axes="batch"``)."""
    return new_op("sum", Einsum(reduction_spec(_reduction_kinds(axes))), [as_tensor(x)], label)


def mean(x, axes=None, *, label: str | None = None) -> Tensor:
    """Mean over every axis, or over the axes of the given kinds."""
    return new_op("mean", Einsum(reduction_spec(_reduction_kinds(axes))), [as_tensor(x)], label)


def max(x, axes=None, *, label: str | None = None) -> Tensor:  # noqa: A001 - the catalog's name
    """Maximum over every axis, or over the axes of the given kinds. At a tie, the gradient goes
    to the first maximum (docs/semantics.md, "Gradients at ties")."""
    return new_op("max_reduce", Einsum(reduction_spec(_reduction_kinds(axes))), [as_tensor(x)], label)


def slice_batch(x: Tensor, sym: IndexSymbol, *, label: str | None = None) -> Tensor:
    """``x[sym]``: drop ``x``'s leftmost batch axis, reading it at ``sym``'s run-time value."""
    if not isinstance(sym, IndexSymbol):
        raise TypeError(f"tensors are indexed by an oc.IndexSymbol (a batch slice), got {type(sym).__name__}")
    return new_op("slice", BatchSlice(sym), [x], label or f"{x.label}@{sym.name}")


def take(table, indices, *, label: str | None = None) -> Tensor:
    """Rows of ``table`` picked by the integer values of ``indices`` (the makemore ``C[X]``).

    ``table``'s leftmost output axis is indexed by the values; the result has ``indices``' batch
    and output axes followed by ``table``'s remaining output axes, and ``table``'s input axes.
    ``indices`` has no input axes and ``table`` no batch axes. Its gradient scatter-adds."""
    return new_op("take", Take(), [as_tensor(table), as_tensor(indices)], label)


def concat(spec: str, tensors: Sequence, *, negated: bool = False, label: str | None = None) -> Tensor:
    """Concatenation along an axis written ``a^b^c`` in the result (spec §2.3), e.g.
    ``oc.concat("...|a; ...|b => ...|a^b", [x, y])``: component ``j`` comes from tensor ``j``."""
    parsed = es.parse_einsum(spec)
    if len(parsed.operands) != len(tensors):
        raise EinsumSyntaxError(spec, len(spec), f"oc.concat: the spec has {len(parsed.operands)} operands "
                                f"and {len(tensors)} tensors were given")
    t = new_op("concat", Einsum(parsed), [as_tensor(x) for x in tensors], label, spec=spec)
    t.attrs["negated"] = negated
    return t


def stack(tensors: Sequence, kind: str = "output", *, label: str | None = None) -> Tensor:
    """A new leftmost axis of ``kind`` holding the tensors in order (they must have one shape)."""
    if kind not in KINDS:
        raise ValueError(f"stack: kind must be one of {KINDS}, got {kind!r}")
    n = len(tensors)
    parts = "^".join(f"s{j}" for j in range(n))
    rows = {"batch": "..b..", "input": "..i..", "output": "..o.."}
    operand = f"{rows['batch']} | {rows['input']} -> {rows['output']}"
    result = dict(rows)
    result[kind] = f"{parts}, {rows[kind]}" if n > 1 else f"s0, {rows[kind]}"
    spec = "; ".join(operand for _ in range(n)) + f" => {result['batch']} | {result['input']} -> {result['output']}"
    t = concat(spec, tensors, label=label or "stack")
    origin = Origin("stack", t.label, solver_mod.caller_source(), (), spec)
    # Each component is one position of the new axis.
    solver_mod.current().add([DimEq(t.logic.labels[f"s{j}"], 1, origin) for j in range(n)])  # type: ignore[union-attr]
    return t


def interleave(a, b, *, label: str | None = None) -> Tensor:
    """``r[..., 2i] = a[..., i]``, ``r[..., 2i+1] = b[..., i]`` along the last output axis."""
    return new_op("interleave", Interleave(), [as_tensor(a), as_tensor(b)], label)


def deinterleave_even(x, *, label: str | None = None) -> Tensor:
    """``r[..., i] = x[..., 2i]`` along the last output axis."""
    return einsum("..b.. | ..i.. -> ..o.., 2*k => ..b.. | ..i.. -> ..o.., k", x, label=label or "even")


def deinterleave_odd(x, *, label: str | None = None) -> Tensor:
    """``r[..., i] = x[..., 2i+1]`` along the last output axis."""
    return einsum("..b.. | ..i.. -> ..o.., 2*k+1 => ..b.. | ..i.. -> ..o.., k", x, label=label or "odd")


# ---------------------------------------------------------------------------------------------
# Dimension capture.


class DimRef:
    """A label or row variable of an einsum, captured by name: its size is readable by the
    program and can be constrained (the original's ``dim d`` / ``set_dim``, spec §2.6)."""

    def __init__(self, logic: Einsum, name: str, spec: str):
        if name not in logic.labels and name not in logic.row_vars:
            raise ShapeError(f"variable {name!r} not found in the spec {spec!r}")
        self.logic, self.name, self.spec = logic, name, spec

    @property
    def size(self) -> int | None:
        """The size (a row variable: the product of its dims), or None while unknown."""
        s = solver_mod.current()
        if self.name in self.logic.labels:
            d = s.dim(self.logic.labels[self.name])
            return d if isinstance(d, int) else None
        row = s.row(Row((), self.logic.row_vars[self.name], ()))
        if not row.is_concrete():
            return None
        n = 1
        for d in row.dims:
            n *= d  # type: ignore[operator]
        return n

    def set(self, size: int) -> None:
        """Constrain the captured dim to ``size``."""
        if self.name not in self.logic.labels:
            raise ShapeError(f"set: {self.name!r} is a row variable; only single dims can be set")
        solver_mod.current().add([DimEq(self.logic.labels[self.name], size,
                                        Origin("set_dim", self.name, solver_mod.caller_source(), (), self.spec))])

    def __repr__(self) -> str:
        return f"DimRef({self.name!r}, size={self.size})"


METHODS = {
    "relu": relu, "sat01": sat01, "exp": exp, "log": log, "exp2": exp2, "log2": log2, "sin": sin,
    "cos": cos, "sqrt": sqrt, "recip": recip, "recip_sqrt": recip_sqrt, "neg": neg, "tanh": tanh,
    "sigmoid": sigmoid, "abs": abs, "not_": not_, "sum": sum, "mean": mean, "max": max,
}
"""Functions also available as tensor methods (``t.relu()``, ``t.sum(axes="batch")``)."""
