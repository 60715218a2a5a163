"""The operator catalog: every operation of the tensor library, each defined once.

An operation is an :class:`OpDef`: its name, its shape logic (how the result's rows relate to the
operands', ``ocannl/shape/logic.py``), the builder of its forward assignment and its gradient, side
by side. Calling an ``OpDef`` on operand tensors builds the result tensor, which keeps the
definition: ``t.forward_code()`` and ``t.backward_code()`` ask it. Pointwise operations are rows
of one table (:data:`POINTWISE`: name, scalar operator, gradient); the einsum-like operations are
rows of another (:data:`CONTRACTIONS`); every other operation is one definition below, with the
public function that applies it beside it.

This module builds on ``tensor.py`` (the graph) and registers, when imported, the functions that
``Tensor``'s operators and methods call (``a + b``, ``t.relu()``). ``docs/operators.md`` says how
to add an operation; the shapes and the einsum language are in ``docs/shapes.md``.
"""

from __future__ import annotations

import builtins
import functools
import math
import operator
from dataclasses import dataclass
from typing import Callable, Sequence

from ocannl.errors import EinsumSyntaxError, SessionError, ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import (Accum, Apply, Arg, Assignment, Block, Fetch, Gather, RangeOverOffsets,
                                        ScatterAdd, Slice)
from ocannl.lowlevel.dtypes import DType, DTypeError
from ocannl.lowlevel.indexing import IndexSymbol, Iter, Projections
from ocannl.lowlevel.scalar_ops import UINT4X32_LANES, Binop, ScalarOp, Ternop, Unop
from ocannl.lowlevel.tnode import TNode, mark_virtual
from ocannl.shape import einsum as es
from ocannl.shape import solver as solver_mod
from ocannl.shape.logic import (BatchSlice, Compose, Einsum, Interleave, Pointwise, Regroup, ShapeLogic, StaticIndex,
                                 Take, Words, reduction_spec)
from ocannl.shape.projections import derive_projections, identity_projections, retarget
from ocannl.shape.shape import KINDS, Row
from ocannl.shape.solver import DimEq, Origin
from ocannl.tensor import Tensor, as_tensor, new_op, register_catalog

Forward = Callable[[Tensor], Assignment]
"""Builds the forward assignment of a result tensor of the op."""

Gradient = Callable[[Tensor], list[Assignment]]
"""Builds the assignments adding a result's gradient into its operands' gradients."""


def _promoted(operands: Sequence[Tensor]) -> DType:
    """The precision of an operation's result, as PyTorch promotes (docs/precisions.md, "Integer
    arithmetic"): the highest float precision among the operands that are not numbers; with none,
    the highest integer precision among them (int64 > uint32 > int32), unless a number is a float
    (``ids * 0.5`` is float32); float32 when every operand is a number. Numbers adapt to the
    tensors they meet: ``ids + 1`` keeps the precision of ``ids``."""
    held = [o.dtype for o in operands if not o.is_constant]
    floats = [d for d in held if d.is_float]
    if floats:
        return functools.reduce(dtypes.promote, floats)
    if not held or any(o.is_constant and o.data.dtype.kind == "f" for o in operands):
        return dtypes.DEFAULT
    return functools.reduce(dtypes.promote, held)


def _promoted_float(operands: Sequence[Tensor]) -> DType:
    """The precision of an operation that computes in floats (``exp``, ``mean``, ``/``): as
    :func:`_promoted`, float32 where that is an integer precision (``exp`` of int64 data is
    float32, as in PyTorch)."""
    dtype = _promoted(operands)
    return dtype if dtype.is_float else dtypes.DEFAULT


def _where_promoted(operands: Sequence[Tensor]) -> DType:
    """The precision of ``where(cond, a, b)``: its branches', the condition only choosing
    between them (int64 branches stay whole under a float condition, as in PyTorch); where both
    branches are numbers, the condition's."""
    branches = operands[1:]
    return _promoted(operands if all(b.is_constant for b in branches) else branches)


@dataclass(frozen=True, eq=False)
class OpDef:
    """One operation, whole (an operation is this object: two definitions are never equal).

    - ``shape`` builds the op's shape logic from its operands and its other arguments (a spec,
      the reduced axis kinds, an index symbol); the logic is stated to the shape solver as the
      result is built.
    - ``forward`` builds the result's forward assignment, once shapes are inferred.
    - ``gradient`` builds the backprop assignments of a result whose gradient is needed; ``None``
      for an op without a gradient (comparisons, ``not``), whose results take no gradient.
    - ``dtype`` is the result's precision given the operands."""

    name: str
    shape: Callable[..., ShapeLogic]
    forward: Forward
    gradient: Gradient | None
    dtype: Callable[[Sequence[Tensor]], DType] = _promoted

    def __call__(self, *operands, label: str | None = None, attrs: dict | None = None, **arguments) -> Tensor:
        """The op applied to ``operands`` (numbers, index symbols and arrays become tensors);
        ``arguments`` go to the shape logic, and a ``spec`` among them is shown by shape errors."""
        tensors = [as_tensor(x) for x in operands]
        result = self.dtype(tensors)
        if not result.is_float:
            _check_numbers_fit(self.name if label is None else f"{self.name} {label!r}", tensors, result)
        logic = self.shape(tensors, **arguments)
        return new_op(self, logic, tensors, label, spec=arguments.get("spec"), attrs=attrs)


OPS: dict[str, OpDef] = {}
"""The catalog: every operation by name."""


def define(op: OpDef) -> OpDef:
    """Add ``op`` to the catalog; a name is defined once."""
    if op.name in OPS:
        raise SessionError(f"operation {op.name!r} is defined twice; each operation has one definition")
    OPS[op.name] = op
    return op


# ---------------------------------------------------------------------------------------------
# Forward code. Every op's forward is accumulating assignments over its projections,
# ``v <accum>= fn(v1, ...)``, as the original's ``%cd`` definitions.


def _operand(t: Tensor, result: DType):
    """A number is inlined as a constant, kept a whole int in an integer ``result``'s code
    (through a float, 2**53 + 1 would round); every other operand is read from its buffer."""
    if not t.is_constant:
        return t.value
    return int(t.data) if not result.is_float and t.data.dtype.kind != "f" else float(t.data)


def _check_numbers_fit(op: str, operands: Sequence[Tensor], result: DType) -> None:
    """The numbers among the operands of ``op`` fit its integer ``result``: ``uint32_ids + (-1)``
    or ``int32_ids * 2**40`` are refused, as numpy refuses them, never wrapped
    (docs/precisions.md, "Integer arithmetic")."""
    for o in operands:
        if o.is_constant and o.data.dtype.kind != "f":
            v, low, high = int(o.data), dtypes.lowest(result), dtypes.highest(result)
            if not low <= v <= high:
                raise DTypeError(
                    f"{op}: the number {v} does not fit the result's precision {result.name} [{low}, {high}], "
                    f"which its integer operands give it; make them a wider integer (dtype='int64'), or "
                    f"write a float number ({v}.0) for a float32 result")


def _spec_text(t: Tensor, default: str) -> str:
    logic = t.logic
    return logic.spec.text if isinstance(logic, Einsum) else default


def _assign(t: Tensor, fn: ScalarOp, accum: Binop | None = None, spec: str = ".") -> Accum:
    """``v =: fn(...)`` (``accum`` None), or ``v =:<accum> fn(...)``: reset to the accumulator's
    neutral element, then accumulate over the reduced axes (lowering drops the reset when every
    cell is written exactly once)."""
    return Accum(t.value, accum, fn, tuple(_operand(o, t.dtype) for o in t.operands), t.projections,
                 initialize_neutral=accum is not None, spec=spec)


def _contract(accumulator: Binop, fns: dict[int, ScalarOp]) -> Forward:
    """``v =:<accumulator> fn(v1, ...)`` over the loops of the op's einsum, ``fn`` chosen by the
    number of operands."""
    def forward(t: Tensor) -> Assignment:
        fn = fns.get(len(t.operands))
        if fn is None:
            raise ShapeError(f"{t.op} of {len(t.operands)} operands is not supported")
        return _assign(t, fn, accumulator, _spec_text(t, t.op))

    return forward


# ---------------------------------------------------------------------------------------------
# Gradients. A rule says, for operand j, how its gradient accumulates, as an expression of
# ``g`` (the result's gradient), ``v`` (the result's value) and ``v1``, ``v2``, ``v3`` (the
# operands' values); every term is read through the op's own projections (``retarget``), so a
# forward reduction becomes a backward broadcast and a broadcast a reduction.

Rules = dict[int, tuple[Binop, object]]
"""Operand number (from 1) -> (how its gradient accumulates, the expression accumulated)."""

LN2 = 0.6931471805599453
TWO_OVER_SQRT_PI = 1.1283791670955126
"""``erf``'s derivative at 0: ``d/dx erf x = 2/sqrt(pi) exp(-x^2)``."""

_ADD, _SUB = Binop.ADD, Binop.SUB


def _b(op: ScalarOp, *args):
    return (op, *args)


def _mul(a, b):
    return _b(Binop.MUL, a, b)


def _div(a, b):
    return _b(Binop.DIV, a, b)


_G_TIMES_V2: Rules = {1: (_ADD, _mul("g", "v2")), 2: (_ADD, _mul("v1", "g"))}
_G_TO_EACH: Rules = {1: (_ADD, "g"), 2: (_ADD, "g")}
_G_TO_THE_OPERAND: Rules = {1: (_ADD, "g")}


def rules(table: Rules | Callable[[Tensor], Rules]) -> Gradient:
    """The gradient given by one rule per operand (``table``, or a function of the result tensor
    when the rules depend on its arity or dims): ``operand_j.grad <accum>= expr`` for each
    operand that needs a gradient."""
    def gradient(t: Tensor) -> list[Assignment]:
        chosen = table(t) if callable(table) else table
        return [_rule_accum(t, t.operands[j - 1].grad, j, accum, expr, t.projections)
                for j, (accum, expr) in sorted(chosen.items()) if t.operands[j - 1].requires_grad]

    return gradient


def _rule_accum(t: Tensor, lhs: TNode, lhs_slot: int, accum: Binop, expr, projections: Callable[[], Projections],
                extra: dict[str, tuple[TNode, int]] | None = None, initialize_neutral: bool = False) -> Accum:
    """``lhs <accum>= expr`` over the loops of ``projections()``, ``t``'s forward loops (its
    slot ``lhs_slot`` indexes ``lhs``). The leaves of ``expr`` are ``g`` and ``v`` (read at the
    result's slot 0), ``v1``, ``v2``, ``v3`` (the operands' slots) and the names in ``extra``,
    each a node with the slot that indexes it."""
    extra = extra or {}
    leaves: list[str] = []

    def compile_expr(e):
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
            rhs.append(_operand(t.operands[k - 1], lhs.dtype))
            slots.append(k)
    if isinstance(fn, Arg):
        fn = Unop.ID
    return Accum(lhs, accum, fn, tuple(rhs), lambda: retarget(projections(), lhs_slot, slots),
                 initialize_neutral=initialize_neutral, spec=_spec_text(t, "."))


def _first_position(t: Tensor, first: TNode, is_extreme, dtype: DType, leaves: dict[str, tuple[TNode, int]] | None = None
                    ) -> tuple[Projections, dict[str, tuple[TNode, int]], list[Assignment]]:
    """The assignments setting ``first`` (``t``'s dims) to the least position, in the order the
    reduced loops of ``t`` run (row-major over the reduced axes), of the window's points where
    the expression ``is_extreme`` holds; also the forward loops with a slot numbering the window
    (``numbered``) and the leaves ``position`` and ``first`` for further rules over them
    (``leaves`` adds others that ``is_extreme`` reads). The
    positions are numbers of ``dtype``; a window larger than a float ``dtype`` counts exactly is
    an error rather than a tie given to a neighbour."""
    proj = t.projections()
    extents = dict(zip(proj.product_iterators, proj.product_space))
    reduced = proj.reduction_iterators()
    window = tuple(extents[r] for r in reduced)
    size = math.prod(window)
    exact = 2**53 if dtype is dtypes.float64 else 2**24
    if dtype.is_float and size > exact:
        built_at = f" (built at {t.source})" if t.source else ""
        raise SessionError(
            f"{t.op} {t.label!r}{built_at}: each result cell reduces {size} cells, more than {dtype.name} "
            f"positions count exactly ({exact}), so a tie could not be given to its first maximum; reduce "
            f"in two steps (a maximum of maxima over smaller windows)")
    numbered = Projections(proj.product_space, proj.product_iterators, proj.lhs_dims,
                           proj.rhs_dims + (window,), proj.project_lhs,
                           proj.project_rhs + (tuple(Iter(r) for r in reduced),), proj.debug)
    position = TNode(f"{t.label}_window_position", dims=window, dtype=dtype)
    # Virtual: each read becomes the window's loop indices as a number, so the search for the
    # first maximum is a select between two values computed in registers, not a load.
    mark_virtual(position)
    extra = {"position": (position, len(t.operands) + 1), "first": (first, 0), **(leaves or {})}
    code: list[Assignment] = [
        Fetch(position, RangeOverOffsets()),
        _rule_accum(t, first, 0, Binop.MIN, _b(Ternop.WHERE, is_extreme, "position", float(size)),
                    lambda: numbered, extra, initialize_neutral=True),
    ]
    return numbered, extra, code


def first_maximum(offered) -> Gradient:
    """The gradient of a reduction by maximum, where ``offered`` is the expression a point of
    the loops offers the maximum (``"v1"``; ``v1 + v2`` for tropical): in each window (the
    cells reduced into one result cell), only the first point equal to the maximum, in the
    order the reduced loops run (row-major over the reduced axes), receives the result's
    gradient, so the gradient keeps its total at ties (docs/semantics.md, "Gradients at
    ties"). One rule for every backend, written as three assignments over the forward loops:

    - ``position`` holds 0, 1, 2... over the window's shape;
    - ``first`` (the result's shape) takes the least position whose point equals the maximum;
    - each operand's gradient accumulates ``g`` at the points whose position is ``first``.

    Positions are numbers of the result's compute precision; a window larger than it counts
    exactly is an error rather than a gradient split between neighbours."""
    def gradient(t: Tensor) -> list[Assignment]:
        targets = [j for j, o in enumerate(t.operands, 1) if o.requires_grad]
        if not targets:
            return []
        dtype = t.dtype.compute if t.dtype.is_float else dtypes.DEFAULT
        first = TNode(f"{t.label}_first_maximum", dims=t.dims, dtype=dtype)
        numbered, extra, find_first = _first_position(t, first, _b(Binop.EQ, offered, "v"), dtype)
        code: list[Assignment] = list(find_first)
        for j in targets:
            code.append(_rule_accum(t, t.operands[j - 1].grad, j, _ADD,
                                    _mul("g", _b(Binop.EQ, "position", "first")), lambda: numbered, extra))
        return code

    return gradient


# ---------------------------------------------------------------------------------------------
# Pointwise operations: one row each. Given ``spec=``, the operands are related by that einsum
# instead of broadcasting, and the result may sum over the axes the spec drops.

_TO_THE_FIRST_EQUAL: Rules = {
    # At a tie of the two operands the first one gets the gradient (docs/semantics.md).
    1: (_ADD, _mul("g", _b(Binop.EQ, "v", "v1"))),
    2: (_ADD, _mul("g", _mul(_b(Binop.EQ, "v", "v2"), _b(Binop.NE, "v1", "v2")))),
}

POINTWISE: tuple[tuple[str, ScalarOp, Rules | None], ...] = (
    # name, scalar operator, gradient rules (None: no gradient)
    ("relu", Unop.RELU, {1: (_ADD, _b(Binop.RELU_GATE, "v1", "g"))}),
    ("sat01", Unop.SAT01, {1: (_ADD, _b(Binop.SAT01_GATE, "v1", "g"))}),
    ("exp", Unop.EXP, {1: (_ADD, _mul("g", "v"))}),
    ("log", Unop.LOG, {1: (_ADD, _div("g", "v1"))}),
    ("exp2", Unop.EXP2, {1: (_ADD, _mul("g", _mul("v", LN2)))}),
    ("log2", Unop.LOG2, {1: (_ADD, _div("g", _mul("v1", LN2)))}),
    ("sin", Unop.SIN, {1: (_ADD, _mul("g", _b(Unop.COS, "v1")))}),
    ("cos", Unop.COS, {1: (_SUB, _mul("g", _b(Unop.SIN, "v1")))}),
    ("sqrt", Unop.SQRT, {1: (_ADD, _div("g", _mul(2.0, "v")))}),
    ("recip", Unop.RECIP, {1: (_SUB, _mul("g", _mul("v", "v")))}),
    ("recip_sqrt", Unop.RECIP_SQRT, {1: (_ADD, _mul("g", _mul(-0.5, _mul("v", _mul("v", "v")))))}),
    ("neg", Unop.NEG, {1: (_SUB, "g")}),
    ("tanh", Unop.TANH, {1: (_ADD, _mul("g", _b(Binop.SUB, 1.0, _mul("v", "v"))))}),
    ("sigmoid", Unop.SIGMOID, {1: (_ADD, _mul("g", _mul("v", _b(Binop.SUB, 1.0, "v"))))}),
    ("erf", Unop.ERF, {1: (_ADD, _mul("g", _mul(TWO_OVER_SQRT_PI, _b(Unop.EXP, _b(Unop.NEG, _mul("v1", "v1"))))))}),
    ("abs", Unop.ABS, {1: (_ADD, _mul("g", _b(Binop.SUB, _b(Binop.GT, "v1", 0.0), _b(Binop.LT, "v1", 0.0))))}),
    ("not", Unop.NOT, None),
    ("add", Binop.ADD, _G_TO_EACH),
    ("sub", Binop.SUB, {1: (_ADD, "g"), 2: (_SUB, "g")}),
    ("mul", Binop.MUL, _G_TIMES_V2),
    ("div", Binop.DIV, {1: (_ADD, _div("g", "v2")), 2: (_SUB, _mul("g", _div("v", "v2")))}),
    ("pow", Binop.POW, {1: (_ADD, _mul("g", _mul("v2", _b(Binop.POW, "v1", _b(Binop.SUB, "v2", 1.0))))),
                        2: (_ADD, _mul("g", _mul("v", _b(Unop.LOG, "v1"))))}),
    ("lt", Binop.LT, None),
    ("gt", Binop.GT, None),
    ("eq", Binop.EQ, None),
    ("ne", Binop.NE, None),
    ("max", Binop.MAX, _TO_THE_FIRST_EQUAL),
    ("min", Binop.MIN, _TO_THE_FIRST_EQUAL),
    ("where", Ternop.WHERE, {2: (_ADD, _b(Ternop.WHERE, "v1", "g", 0.0)), 3: (_ADD, _b(Ternop.WHERE, "v1", 0.0, "g"))}),
    ("fma", Ternop.FMA, {1: (_ADD, _mul("g", "v2")), 2: (_ADD, _mul("v1", "g")), 3: (_ADD, "g")}),
)
"""The pointwise operations. A comparison gives 1 where true, 0 elsewhere, in its operands'
precision; ``not`` is exposed as ``oc.not_``, ``max``/``min`` as ``oc.maximum``/``oc.minimum``."""


def _pointwise_logic(operands: Sequence[Tensor], spec: str | None = None) -> ShapeLogic:
    return Pointwise() if spec is None else Einsum(es.parse_einsum(spec))


def _pointwise_forward(fn: ScalarOp) -> Forward:
    def forward(t: Tensor) -> Assignment:
        if isinstance(t.logic, Einsum):  # given an einsum spec, the op may reduce
            return _assign(t, fn, Binop.ADD, t.logic.spec.text)
        return _assign(t, fn)

    return forward


def _replace_leaf(expr, leaf: str, by):
    if expr == leaf:
        return by
    if isinstance(expr, tuple):
        return (expr[0], *(_replace_leaf(e, leaf, by) for e in expr[1:]))
    return expr


def _pointwise_gradient(fn: ScalarOp, table: Rules) -> Gradient:
    def per_result(t: Tensor) -> Rules:
        if not isinstance(t.logic, Einsum):
            return table
        # With a spec the result may hold a sum, not each point's value: a rule reading ``v``
        # recomputes it from the operands at the point.
        value = (fn, *(f"v{k}" for k in range(1, len(t.operands) + 1)))
        return {j: (accum, _replace_leaf(expr, "v", value)) for j, (accum, expr) in table.items()}

    return rules(per_result)


def _pointwise_promoted(fn: ScalarOp) -> Callable[[Sequence[Tensor]], DType]:
    """The result precision of the pointwise operation of ``fn``: integer operands keep an
    integer precision except through a float-only operator (``exp``, ``sqrt``, ``pow``)."""
    if fn is Ternop.WHERE:
        return _where_promoted
    return _promoted_float if fn.float_only else _promoted


for _name, _fn, _rules in POINTWISE:
    define(OpDef(_name, shape=_pointwise_logic, forward=_pointwise_forward(_fn),
                 gradient=None if _rules is None else _pointwise_gradient(_fn, _rules),
                 dtype=_pointwise_promoted(_fn)))

STOP_GRADIENT = define(OpDef("stop_gradient", shape=_pointwise_logic, forward=_pointwise_forward(Unop.ID),
                             gradient=None, dtype=lambda operands: operands[0].dtype))
"""Its operand's value, through which no gradient flows (``jax.lax.stop_gradient``,
``torch.Tensor.detach``): the maximum a softmax subtracts is a constant of the function, whose
gradient through it is zero, and computing that zero costs a search for the first maximum per
row (the optimizer inlines the copy itself)."""


def stop_gradient(x, *, label: str | None = None) -> Tensor:
    """``x``'s value, treated as a constant by differentiation (no gradient reaches ``x`` from here)."""
    return STOP_GRADIENT(as_tensor(x), label=label)


TRUE_DIV = define(OpDef("true_div", shape=_pointwise_logic, forward=_pointwise_forward(Binop.DIV), gradient=None,
                        dtype=_promoted_float))
"""The quotient of two integer operands as ``a / b`` computes it: in float32. It has no gradient
since integers have none; ``/`` of anything else is ``div`` itself (:func:`true_divide`)."""

UNARY_OPS = tuple(name for name, fn, _ in POINTWISE if isinstance(fn, Unop))
"""Pointwise unary functions (``not`` is exposed as ``oc.not_``)."""

BINARY_OPS = tuple(name for name, fn, _ in POINTWISE if isinstance(fn, Binop))
"""Pointwise binary functions; ``<``, ``>``, ``==``, ``!=`` give 1.0 where true, 0.0 elsewhere."""


def _unary(op: OpDef):
    def fn(x, *, label: str | None = None, spec: str | None = None) -> Tensor:
        return op(x, label=label, spec=spec)

    fn.__name__ = "not_" if op.name == "not" else op.name
    fn.__doc__ = f"Pointwise ``{op.name}``; with ``spec=`` the operand is permuted/reduced by that einsum."
    return fn


def _binary(op: OpDef):
    def fn(a, b, *, label: str | None = None, spec: str | None = None) -> Tensor:
        return op(a, b, label=label, spec=spec)

    fn.__name__ = {"max": "maximum", "min": "minimum"}.get(op.name, op.name)
    fn.__doc__ = f"Pointwise ``{op.name}`` with numpy-style broadcasting (or the einsum ``spec=``)."
    if op.name in ("max", "min"):
        fn.__doc__ += " Where the operands are equal, the first gets the gradient (docs/semantics.md)."
    if op.name == "div":
        fn.__doc__ += (" Integers keep their precision and truncate toward zero, a zero divisor being an "
                       "IntegerDivisionError when the code runs; ``a / b`` gives their float32 quotient "
                       "(docs/precisions.md, \"Integer arithmetic\").")
    return fn


relu, sat01, exp, log, exp2, log2, sin, cos, sqrt, recip, recip_sqrt, neg, tanh, sigmoid, erf, abs, not_ = (
    _unary(OPS[name]) for name in UNARY_OPS)
add, sub, mul, div, pow, lt, gt, eq, ne, maximum, minimum = (_binary(OPS[name]) for name in BINARY_OPS)


def true_divide(a, b, *, label: str | None = None) -> Tensor:
    """``a / b``: true division, as Python's, numpy's and PyTorch's ``/``. A quotient of integers
    (tensors or numbers) is float32, ``ids / 2`` included; ``oc.div`` keeps integers and
    truncates as C does (docs/precisions.md, "Integer arithmetic"). Of floats, it is ``oc.div``."""
    operands = (as_tensor(a), as_tensor(b))
    quotient = OPS["div"] if OPS["div"].dtype(operands).is_float else TRUE_DIV
    return quotient(*operands, label=label)


def where(cond, a, b, *, spec: str | None = None, label: str | None = None) -> Tensor:
    """``a`` where ``cond`` is non-zero, else ``b``, broadcasting all three (numbers allowed)."""
    return OPS["where"](cond, a, b, label=label, spec=spec)


def fma(a, b, c, *, label: str | None = None) -> Tensor:
    """``a * b + c`` pointwise, in one operation."""
    return OPS["fma"](a, b, c, label=label)


# ---------------------------------------------------------------------------------------------
# Compose: ``a @ b``.

COMPOSE = define(OpDef("compose", shape=lambda operands: Compose(),
                       forward=lambda t: _assign(t, Binop.MUL, Binop.ADD, "@"), gradient=rules(_G_TIMES_V2)))


def compose(a, b, *, label: str | None = None) -> Tensor:
    """``a @ b``: a's input axes contract with b's output axes; batch axes broadcast."""
    return COMPOSE(a, b, label=label)


# ---------------------------------------------------------------------------------------------
# Einsum-like operations: one row each. The result accumulates a function of the operands over
# the axes its spec drops (docs/shapes.md, "Einsum grammar").


def _product_rules(t: Tensor) -> Rules:
    """The gradient of a sum of products, by the number of factors."""
    n = len(t.operands)
    if n == 1:
        return _G_TO_THE_OPERAND
    if n == 2:
        return _G_TIMES_V2
    return {1: (_ADD, _b(Ternop.MUL3, "g", "v2", "v3")), 2: (_ADD, _b(Ternop.MUL3, "v1", "g", "v3")),
            3: (_ADD, _b(Ternop.MUL3, "v1", "v2", "g"))}


CONTRACTIONS: tuple[tuple[str, Binop, dict[int, ScalarOp], Gradient], ...] = (
    # name, accumulator, the function of the operands by their number, gradient
    ("einsum", Binop.ADD, {1: Unop.ID, 2: Binop.MUL, 3: Ternop.MUL3}, rules(_product_rules)),
    ("outer_sum", Binop.ADD, {2: Binop.ADD}, rules(_G_TO_EACH)),
    ("einmax", Binop.MAX, {1: Unop.ID}, first_maximum("v1")),
    ("tropical", Binop.MAX, {2: Binop.ADD}, first_maximum(_b(Binop.ADD, "v1", "v2"))),
)
"""The operations written as an einsum spec; the maximum ones give their gradient to the first
maximum of each window (docs/semantics.md, "Gradients at ties")."""


def _spec_logic(name: str, arity: tuple[int, ...]) -> Callable[..., ShapeLogic]:
    """The shape logic of ``oc.<name>(spec, ...)``, which takes ``arity`` operands."""
    def logic(operands: Sequence[Tensor], spec: str, use_padding: bool | None = None) -> Einsum:
        if not isinstance(spec, str):
            raise TypeError(f"oc.{name}: the first argument is the spec string")
        parsed = es.parse_einsum(spec)
        if len(operands) not in arity or len(parsed.operands) != len(operands):
            raise EinsumSyntaxError(
                spec, len(spec),
                f"oc.{name} takes {' or '.join(map(str, arity))} operand(s); the spec has "
                f"{len(parsed.operands)} and {len(operands)} tensor(s) were given")
        return Einsum(parsed, use_padding)

    return logic


for _name, _accumulator, _fns, _gradient in CONTRACTIONS:
    define(OpDef(_name, shape=_spec_logic(_name, tuple(_fns)), forward=_contract(_accumulator, _fns),
                 gradient=_gradient))


def _with_captures(t: Tensor, spec: str, capture: Sequence[str] | None) -> Tensor:
    if capture:
        t.attrs["captured"] = {name: DimRef(t.logic, name, spec) for name in capture}  # type: ignore[arg-type]
    return t


def einsum(spec: str, *operands, use_padding: bool | None = None, capture: Sequence[str] | None = None,
           label: str | None = None) -> Tensor:
    """Generalized einsum, sum of products over the axes absent from the result (one to three
    operands; the grammar is in docs/shapes.md); ``capture`` names labels or row variables
    whose sizes the program reads (``t.captured["h"]``)."""
    return _with_captures(OPS["einsum"](*operands, spec=spec, use_padding=use_padding, label=label), spec, capture)


def outer_sum(spec: str, a, b, *, use_padding: bool | None = None, label: str | None = None) -> Tensor:
    """Like einsum with ``+`` in place of ``*``: sums ``a + b`` over the axes absent from the result."""
    return OPS["outer_sum"](a, b, spec=spec, use_padding=use_padding, label=label)


def einmax(spec: str, a, *, use_padding: bool | None = None, capture: Sequence[str] | None = None,
           label: str | None = None) -> Tensor:
    """One-operand einsum that takes the maximum over the axes absent from the result. At a tie,
    the gradient goes to the first maximum (docs/semantics.md, "Gradients at ties")."""
    return _with_captures(OPS["einmax"](a, spec=spec, use_padding=use_padding, label=label), spec, capture)


def tropical(spec: str, a, b, *, use_padding: bool | None = None, label: str | None = None) -> Tensor:
    """Max-plus einsum: the maximum of ``a + b`` over the axes absent from the result
    (max-pooling with a kernel-shaped ``b``). At a tie, the gradient goes to the first maximum."""
    return OPS["tropical"](a, b, spec=spec, use_padding=use_padding, label=label)


# ---------------------------------------------------------------------------------------------
# Reductions over whole axis kinds: ``t.sum()``, ``t.mean(axes="batch")``, ``t.max()``.


def _reduction_logic(operands: Sequence[Tensor], axes: str | int | Sequence[str | int] | None = None) -> Einsum:
    """The one-operand einsum reducing the axes of the kinds ``axes`` (every axis when None), or
    the axes at the positions ``axes`` of the operand's dims (ints, negative from the end; the
    other axes keep their kinds)."""
    if axes is None:
        return Einsum(reduction_spec(KINDS))
    chosen = (axes,) if isinstance(axes, (str, int)) else tuple(axes)
    if chosen and all(isinstance(a, int) and not isinstance(a, bool) for a in chosen):
        rows = _rows(operands[0])
        n = builtins.sum(len(row) for row in rows)
        reduced = {_position(a, n, f"reduction of {operands[0].label!r}") for a in chosen}
        return Einsum(es.parse_einsum(_positional_einsum(rows, [p if p not in reduced else None for p in range(n)])))
    bad = [k for k in chosen if k not in KINDS]
    if bad:
        raise ValueError(f"axes= takes kinds among {KINDS} or positions (ints), got {bad}")
    return Einsum(reduction_spec(chosen))  # type: ignore[arg-type]


def _mean_scale(t: Tensor) -> float:
    """``1 / count``, the factor turning the sum of the ``count`` cells reduced into each cell of
    the mean ``t`` into their mean; over no cell (a size-0 axis) it is +inf, so that the mean is
    ``0 * inf``, NaN, as numpy's ``0 / 0`` (docs/semantics.md, "Numerics")."""
    (x,) = t.operands
    count = math.prod(x.dims) // builtins.max(1, math.prod(t.dims))
    return 1.0 / count if count else math.inf


def _mean_forward(t: Tensor) -> Assignment:
    """The sum, then each cell scaled by :func:`_mean_scale`."""
    scale = Accum(t.value, Binop.MUL, Unop.ID, (_mean_scale(t),), lambda: identity_projections(t.dims, [()]),
                  spec=".")
    return Block((_contract(Binop.ADD, {1: Unop.ID})(t), scale))


SUM = define(OpDef("sum", shape=_reduction_logic, forward=_contract(Binop.ADD, {1: Unop.ID}),
                   gradient=rules(_G_TO_THE_OPERAND)))
MEAN = define(OpDef("mean", shape=_reduction_logic, forward=_mean_forward,
                    gradient=rules(lambda t: {1: (_ADD, _mul("g", _mean_scale(t)))}), dtype=_promoted_float))
MAX_REDUCE = define(OpDef("max_reduce", shape=_reduction_logic, forward=_contract(Binop.MAX, {1: Unop.ID}),
                          gradient=first_maximum("v1")))


def _reduced(axes, axis):
    """What a reduction reduces: ``axes=`` (kinds) or ``axis=`` (positions), not both."""
    if axes is not None and axis is not None:
        raise ValueError("a reduction takes axes= (kinds, or positions) or axis= (positions), not both")
    return axes if axis is None else axis


def sum(x, axes=None, *, axis=None, label: str | None = None) -> Tensor:  # noqa: A001 - the catalog's name
    """Sum over every axis (dims ``()``), over the axes of the given kinds (``axes="batch"``), or
    over the axes at the given positions of ``x.dims`` (``axis=-1``, ``axis=(0, 2)``)."""
    return SUM(x, axes=_reduced(axes, axis), label=label)


def mean(x, axes=None, *, axis=None, label: str | None = None) -> Tensor:
    """Mean over every axis, over the axes of the given kinds, or at the given positions."""
    return MEAN(x, axes=_reduced(axes, axis), label=label)


def max(x, axes=None, *, axis=None, label: str | None = None) -> Tensor:  # noqa: A001 - the catalog's name
    """Maximum over every axis, over the axes of the given kinds, or at the given positions. At
    a tie, the gradient goes to the first maximum (docs/semantics.md, "Gradients at ties")."""
    return MAX_REDUCE(x, axes=_reduced(axes, axis), label=label)


def logsumexp(x, axis=None, *, label: str | None = None) -> Tensor:
    """``log(sum(exp(x)))`` over ``axis`` (as :func:`sum`'s ``axes``: every axis, or the axes of
    the given kinds), computed as ``m + log(sum(exp(x - m)))`` with ``m`` the maximum, so no
    ``exp`` overflows, as PyTorch's ``torch.logsumexp``."""
    x = as_tensor(x)
    m = stop_gradient(MAX_REDUCE(x, axes=axis))
    return OPS["add"](m, OPS["log"](SUM(OPS["exp"](x - m), axes=axis)), label=label)


# ---------------------------------------------------------------------------------------------
# Batch slicing: ``xs[sym]``.


def _slice_forward(t: Tensor) -> Assignment:
    (x,) = t.operands
    return Fetch(t.value, Slice(x.value, t.logic.symbol))  # type: ignore[union-attr]


SLICE = define(OpDef("slice", shape=lambda operands, symbol: BatchSlice(symbol), forward=_slice_forward,
                     gradient=rules(_G_TO_THE_OPERAND)))


def slice_batch(x: Tensor, sym: IndexSymbol, *, label: str | None = None) -> Tensor:
    """``x[sym]``: drop ``x``'s leftmost batch axis, reading it at ``sym``'s run-time value."""
    if not isinstance(sym, IndexSymbol):
        raise TypeError(f"tensors are indexed by an oc.IndexSymbol (a batch slice), got {type(sym).__name__}")
    return SLICE(x, symbol=sym, label=label or f"{x.label}@{sym.name}")


# ---------------------------------------------------------------------------------------------
# By position over ``t.dims``, in memory order batch, output, input (docs/shapes.md, "Indexing,
# reshaping, reductions by position"): static indexing ``t[1:3]``, reshapes, permutations,
# reductions along axes and ``argmax``. Each is built from its operand's dims.


def _rows(x: Tensor) -> tuple[tuple[int, ...], ...]:
    """``x``'s dims, one tuple per kind of ``KINDS``. An operation by position needs them when it
    is built, so dims not yet known finish shape inference of what is built so far
    (``Tensor.dims``), which names the parameter whose dims nothing determines."""
    x.shape  # noqa: B018 - resolves what is already known, closing nothing
    if not x._shape.is_concrete():
        x.dims  # noqa: B018
    return tuple(tuple(x._shape.row(k).dims) for k in KINDS)  # type: ignore[misc]


def _kinds_by_position(rows: tuple[tuple[int, ...], ...]) -> list[str]:
    return [k for k, row in zip(KINDS, rows) for _ in row]


def _position(axis, ndim: int, what: str) -> int:
    """``axis`` as a position among ``ndim`` axes, counted from the end when negative (numpy)."""
    if isinstance(axis, bool) or not isinstance(axis, int) or not -ndim <= axis < ndim:
        raise ShapeError(f"{what}: axis {axis!r} is not a position among the tensor's {ndim} axes; positions "
                         f"count over t.dims (batch, output, input) from {-ndim} to {ndim - 1}")
    return axis % ndim


def _labels_spec(rows_of_labels: Sequence[Sequence[str]]) -> str:
    """The shape spec ``batch|input->output`` of labels given per kind of ``KINDS``."""
    b, o, i = ("".join(f"{a}," for a in row) for row in rows_of_labels)
    return f"{b}|{i}->{o}"


def _positional_einsum(rows: tuple[tuple[int, ...], ...], result_positions: Sequence[int | None]) -> str:
    """The one-operand einsum spec whose result, kind by kind as the operand, holds the operand's
    axis ``result_positions[q]`` at its position ``q`` (``None``: the axis is reduced away)."""
    kinds = _kinds_by_position(rows)
    operand = [[f"a{p}" for p, k in enumerate(kinds) if k == kind] for kind in KINDS]
    kept = [(kinds[q], f"a{p}") for q, p in enumerate(result_positions) if p is not None]
    result = [[label for k, label in kept if k == kind] for kind in KINDS]
    return f"{_labels_spec(operand)} => {_labels_spec(result)}"


def _copy_forward(t: Tensor) -> Assignment:
    return _assign(t, Unop.ID, spec=t.op)


STATIC_INDEX = define(OpDef("static_index", shape=lambda operands, logic: logic, forward=_copy_forward,
                            gradient=rules(_G_TO_THE_OPERAND), dtype=lambda operands: operands[0].dtype))
REGROUP = define(OpDef("reshape", shape=lambda operands, logic: logic, forward=_copy_forward,
                       gradient=rules(_G_TO_THE_OPERAND), dtype=lambda operands: operands[0].dtype))


def _pick(key, size: int, position: int, label: str) -> int | tuple[int, int, int]:
    """One entry of a static index on an axis of ``size``: an int position (numpy: negative
    counts from the end) or a slice as ``(start, step, count)``."""
    if isinstance(key, slice):
        start, stop, step = key.indices(size)
        count = len(range(start, stop, step))
        if count == 0:  # every backend's loops and buffers have at least one cell per axis
            raise ShapeError(f"{label!r}[...]: the slice {key.start}:{key.stop}:{key.step} of axis {position} (size "
                             f"{size}) selects no cell, and a tensor axis holds at least one")
        return start, step, count
    if isinstance(key, IndexSymbol):
        raise TypeError(f"{label!r}[...]: an oc.IndexSymbol slices alone (xs[sym]); mix it with no other index")
    try:
        index = operator.index(key) if not isinstance(key, bool) else None
    except TypeError:
        index = None
    if index is None:
        raise TypeError(f"{label!r}[...]: a tensor is indexed by ints, slices, '...' or an oc.IndexSymbol, got "
                        f"{type(key).__name__}; gather by values with oc.take")
    if not -size <= index < size:
        raise ShapeError(f"{label!r}[...]: index {index} is out of range for axis {position} of size {size}")
    return index % size


def static_index(x, key, *, label: str | None = None) -> Tensor:
    """``x[key]`` for ints, slices and ``...``, numpy's basic indexing over ``x.dims`` (memory
    order: batch, output, input): an int drops its axis, a slice keeps it (any step but 0), and
    every kept axis keeps its kind. The result is a copy through a strided read
    ``start + step*k``, so the gradient flows back to the cells read."""
    x = as_tensor(x)
    rows = _rows(x)
    dims = [d for row in rows for d in row]
    key = key if isinstance(key, tuple) else (key,)
    ellipses = [j for j, k in enumerate(key) if k is Ellipsis]
    if len(ellipses) > 1:
        raise ShapeError(f"{x.label!r}[...]: an index can have a single ellipsis '...'")
    given = len(key) - len(ellipses)
    if given > len(dims):
        raise ShapeError(f"{x.label!r}[...]: {given} indices for a tensor of {len(dims)} axes (dims {tuple(dims)})")
    fill = (slice(None),) * (len(dims) - given)
    key = key[:ellipses[0]] + fill + key[ellipses[0] + 1:] if ellipses else key + fill
    picks = tuple(_pick(k, d, p, x.label) for p, (k, d) in enumerate(zip(key, dims)))
    kinds = _kinds_by_position(rows)
    result_rows = tuple(tuple(pick[2] for pick, k in zip(picks, kinds) if k == kind and not isinstance(pick, int))
                        for kind in KINDS)
    return STATIC_INDEX(x, logic=StaticIndex(result_rows, rows, picks), label=label or f"{x.label}[...]")


def getitem(x: Tensor, key, *, label: str | None = None) -> Tensor:
    """``x[sym]`` with an ``oc.IndexSymbol`` slices the leftmost batch axis at run time
    (:func:`slice_batch`); any other key is a static index (:func:`static_index`)."""
    if isinstance(key, IndexSymbol):
        return slice_batch(x, key, label=label)
    return static_index(x, key, label=label)


def _common_cells(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """The coarsest dims of which both ``a`` and ``b`` (of one size) are runs of consecutive
    products, or None where none exists (``(2, 3)`` and ``(3, 2)``): the boundaries of the
    row-major prefixes of both, when each divides the next."""
    def prefixes(dims: Sequence[int]) -> set[int]:
        return {math.prod(dims[:j]) for j in range(len(dims) + 1)}

    bounds = sorted(prefixes(a) | prefixes(b))
    if any(hi % lo for lo, hi in zip(bounds, bounds[1:])):
        return None
    return tuple(hi // lo for lo, hi in zip(bounds, bounds[1:]))


def _regroup(x: Tensor, result_rows: tuple[tuple[int, ...], ...], label: str) -> Tensor:
    """``x``'s cells in row-major order, viewed as ``result_rows``: one copy where the two dims
    have a common refinement, else two through the flat cells."""
    rows = _rows(x)
    dims = [d for row in rows for d in row]
    new = [d for row in result_rows for d in row]
    if 0 in dims:
        raise ShapeError(f"reshape of {x.label!r}: a tensor with no cells (dims {tuple(dims)}) is not reshaped")
    cells = _common_cells([d for d in dims if d != 1], [d for d in new if d != 1])
    if cells is None:
        flat = ((), (math.prod(dims),), ())
        x = REGROUP(x, logic=Regroup(flat, rows, tuple(d for d in dims if d != 1)), label=f"{x.label}_flat")
        rows, cells = flat, tuple(d for d in new if d != 1)
    return REGROUP(x, logic=Regroup(result_rows, rows, cells), label=label)


def _sizes(shape, total: int, what: str) -> tuple[int, ...]:
    """``shape`` (an int or a sequence of ints, one of them possibly -1, as numpy) as the dims of
    ``total`` cells."""
    sizes = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < -1 for d in sizes) or sizes.count(-1) > 1:
        raise ShapeError(f"{what}: the new dims {sizes} must be non-negative ints, with at most one -1 to infer")
    known = math.prod(d for d in sizes if d != -1)
    if -1 in sizes and known and total % known == 0:
        sizes = tuple(total // known if d == -1 else d for d in sizes)
    if math.prod(sizes) != total:
        raise ShapeError(f"{what}: the new dims {sizes} do not hold the tensor's {total} cells")
    return sizes


def reshape(x, shape, *, batch: int = 0, input: int = 0, label: str | None = None) -> Tensor:  # noqa: A002
    """``x``'s cells in row-major order over ``x.dims`` with the dims ``shape`` (numpy's reshape,
    one ``-1`` inferred). Kinds, as ``oc.tensor``: the first ``batch`` new axes are batch axes,
    the last ``input`` input axes, the rest output axes (by default every axis is an output
    axis). Differentiable; a copy, each cell read once."""
    x = as_tensor(x)
    sizes = _sizes(shape, math.prod(d for row in _rows(x) for d in row), f"oc.reshape of {x.label!r}")
    if batch < 0 or input < 0 or batch + input > len(sizes):
        raise ShapeError(f"oc.reshape of {x.label!r}: batch={batch} and input={input} count axes among the "
                         f"{len(sizes)} new dims {sizes}")
    rows = (sizes[:batch], sizes[batch:len(sizes) - input], sizes[len(sizes) - input:])
    return _regroup(x, rows, label or f"{x.label}_reshaped")


def flatten(x, kind: str = "output", *, label: str | None = None) -> Tensor:
    """The axes of ``kind`` made one axis of that kind (of size 1 where there were none); the
    other kinds are unchanged. ``flatten(images)`` turns the outputs ``[C, H, W]`` into
    ``[C*H*W]``."""
    x = as_tensor(x)
    if kind not in KINDS:
        raise ValueError(f"flatten: kind must be one of {KINDS}, got {kind!r}")
    rows = _rows(x)
    result = tuple((math.prod(row),) if k == kind else row for k, row in zip(KINDS, rows))
    return _regroup(x, result, label or f"{x.label}_flat")


def unflatten(x, axis: int, sizes, *, label: str | None = None) -> Tensor:
    """The axis at position ``axis`` of ``x.dims`` split into axes of ``sizes`` (one ``-1``
    inferred) of its kind, as ``torch.unflatten``."""
    x = as_tensor(x)
    rows = _rows(x)
    dims = [d for row in rows for d in row]
    p = _position(axis, len(dims), f"unflatten of {x.label!r}")
    new = _sizes(sizes, dims[p], f"unflatten of {x.label!r} at axis {p}")
    kinds = _kinds_by_position(rows)
    result = tuple(tuple(e for q, d in enumerate(dims) if kinds[q] == kind for e in (new if q == p else (d,)))
                   for kind in KINDS)
    return _regroup(x, result, label or f"{x.label}_unflat")


def permute(x, order: Sequence[int], *, label: str | None = None) -> Tensor:
    """The axes of ``x.dims`` reordered: position ``q`` of the result holds axis ``order[q]``
    (``torch.permute``); the result's kinds stay those of ``x`` position by position (a batch
    position stays a batch position). An einsum that relabels."""
    x = as_tensor(x)
    rows = _rows(x)
    n = builtins.sum(len(row) for row in rows)
    positions = [_position(p, n, f"permute of {x.label!r}") for p in order]
    if sorted(positions) != list(range(n)):
        raise ShapeError(f"permute of {x.label!r}: {tuple(order)} is not an order of its {n} axes")
    return einsum(_positional_einsum(rows, positions), x, label=label or f"{x.label}_permuted")


def transpose(x, axis1: int = -2, axis2: int = -1, *, label: str | None = None) -> Tensor:
    """The axes at positions ``axis1`` and ``axis2`` of ``x.dims`` exchanged (``torch.transpose``;
    by default the last two); kinds stay by position, as :func:`permute`."""
    x = as_tensor(x)
    n = builtins.sum(len(row) for row in _rows(x))
    order = list(range(n))
    a, b = (_position(p, n, f"transpose of {x.label!r}") for p in (axis1, axis2))
    order[a], order[b] = order[b], order[a]
    return permute(x, order, label=label)


def _argextreme_forward(extreme: Binop) -> Forward:
    """``argmax``/``argmin``: the extreme of each window, then the first position holding it
    (the search the gradient of ``max`` makes, :func:`_first_position`)."""
    def forward(t: Tensor) -> Assignment:
        (x,) = t.operands
        value = TNode(f"{t.label}_extreme", dims=t.dims, dtype=x.dtype)
        find = Accum(value, extreme, Unop.ID, (x.value,), t.projections, initialize_neutral=True, spec=t.op)
        _, _, first = _first_position(t, t.value, _b(Binop.EQ, "v1", "extreme"), t.dtype,
                                      {"extreme": (value, 0)})
        return Block((find, *first))

    return forward


def _argextreme_logic(operands: Sequence[Tensor], axis: int) -> Einsum:
    rows = _rows(operands[0])
    n = builtins.sum(len(row) for row in rows)
    p = _position(axis, n, f"argmax/argmin of {operands[0].label!r}")
    return Einsum(es.parse_einsum(_positional_einsum(rows, [q if q != p else None for q in range(n)])))


ARGMAX = define(OpDef("argmax", shape=_argextreme_logic, forward=_argextreme_forward(Binop.MAX), gradient=None,
                      dtype=lambda operands: dtypes.int64))
ARGMIN = define(OpDef("argmin", shape=_argextreme_logic, forward=_argextreme_forward(Binop.MIN), gradient=None,
                      dtype=lambda operands: dtypes.int64))


def argmax(x, axis: int = -1, *, label: str | None = None) -> Tensor:
    """The position of the maximum along the axis at position ``axis`` of ``x.dims`` (that axis
    dropped, the others keep their kinds), the first one at a tie (numpy); int64, no gradient."""
    return ARGMAX(x, axis=axis, label=label)


def argmin(x, axis: int = -1, *, label: str | None = None) -> Tensor:
    """The position of the minimum along the axis at position ``axis``, the first one at a tie;
    int64, no gradient."""
    return ARGMIN(x, axis=axis, label=label)


# ---------------------------------------------------------------------------------------------
# Gathering rows: ``oc.take(table, indices)``.


def _take_gradient(t: Tensor) -> list[Assignment]:
    table, indices = t.operands
    return [ScatterAdd(table.grad, indices.value, t.grad)] if table.requires_grad else []


TAKE = define(OpDef("take", shape=lambda operands: Take(),
                    forward=lambda t: Gather(t.value, t.operands[0].value, t.operands[1].value),
                    gradient=_take_gradient, dtype=lambda operands: operands[0].dtype))


def take(table, indices, *, label: str | None = None) -> Tensor:
    """Rows of ``table`` picked by the integer values of ``indices`` (the makemore ``C[X]``).

    ``table``'s leftmost output axis is indexed by the values; the result has ``indices``' batch
    and output axes followed by ``table``'s remaining output axes, and ``table``'s input axes.
    ``indices`` has no input axes and ``table`` no batch axes. Its gradient scatter-adds; the
    result keeps the table's precision."""
    return TAKE(table, indices, label=label)


# ---------------------------------------------------------------------------------------------
# Assembling a result from parts: concatenation and interleaving. Component ``j`` of the result
# is written from operand ``j`` by its own assignment (negated with ``negated=True``), and its
# gradient flows back through the same loops.


def _part_projections(t: Tensor, j: int) -> Callable[[], Projections]:
    """Projections of component ``j`` of a concatenation or interleaving: (result, operand j)."""
    def proj():
        t.dims  # noqa: B018 - finalizes inference
        shapes = [o._shape for o in t.operands]
        slots = t.logic.part_layout(j, t._shape, shapes, solver_mod.current())  # type: ignore[union-attr]
        return derive_projections(slots, [t.dims, t.operands[j].dims], debug=f"{t.op} {t.label} part {j}")

    return proj


def _parts_forward(t: Tensor) -> Assignment:
    fn = Unop.NEG if t.attrs.get("negated") else Unop.ID
    return Block(tuple(Accum(t.value, None, fn, (_operand(o, t.dtype),), _part_projections(t, j),
                             spec=_spec_text(t, t.op))
                       for j, o in enumerate(t.operands)))


def _parts_gradient(t: Tensor) -> list[Assignment]:
    accum = Binop.SUB if t.attrs.get("negated") else Binop.ADD
    code: list[Assignment] = []
    for j, o in enumerate(t.operands):
        if o.requires_grad:
            forward = _part_projections(t, j)
            code.append(Accum(o.grad, accum, Unop.ID, (t.grad,), lambda forward=forward: retarget(forward(), 1, [0]),
                              spec=_spec_text(t, t.op)))
    return code


def _concat_logic(operands: Sequence[Tensor], spec: str) -> Einsum:
    parsed = es.parse_einsum(spec)
    if len(parsed.operands) != len(operands):
        raise EinsumSyntaxError(spec, len(spec), f"oc.concat: the spec has {len(parsed.operands)} operands "
                                f"and {len(operands)} tensors were given")
    return Einsum(parsed)


CONCAT = define(OpDef("concat", shape=_concat_logic, forward=_parts_forward, gradient=_parts_gradient))
INTERLEAVE = define(OpDef("interleave", shape=lambda operands: Interleave(), forward=_parts_forward,
                          gradient=_parts_gradient))


def concat(spec: str, tensors: Sequence, *, negated: bool = False, label: str | None = None) -> Tensor:
    """Concatenation along an axis written ``a^b^c`` in the result (docs/shapes.md), e.g.
    ``oc.concat("...|a; ...|b => ...|a^b", [x, y])``: component ``j`` comes from tensor ``j``."""
    return CONCAT(*tensors, spec=spec, label=label, attrs={"negated": negated})


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
    return INTERLEAVE(a, b, label=label)


def deinterleave_even(x, *, label: str | None = None) -> Tensor:
    """``r[..., i] = x[..., 2i]`` along the last output axis."""
    return einsum("..b.. | ..i.. -> ..o.., 2*k => ..b.. | ..i.. -> ..o.., k", x, label=label or "even")


def deinterleave_odd(x, *, label: str | None = None) -> Tensor:
    """``r[..., i] = x[..., 2i+1]`` along the last output axis."""
    return einsum("..b.. | ..i.. -> ..o.., 2*k+1 => ..b.. | ..i.. -> ..o.., k", x, label=label or "odd")


# ---------------------------------------------------------------------------------------------
# Threefry-4x32 of words held in tensors: ``oc.threefry4x32(key, counter)``.


def _packed(first: int) -> Apply:
    """The uint4x32 of the words read by operands ``first`` to ``first + 3``: two int64 halves
    ``w0 + w1 * 2**32`` and ``w2 + w3 * 2**32`` (the words convert to int64 without a sign, and
    the product wraps onto the high 32 bits)."""
    def half(k: int) -> Apply:
        return Apply(Binop.ADD, (Arg(first + k), Apply(Binop.MUL, (Arg(first + k + 1), 2**32))))

    return Apply(Binop.UINT4X32_PACK, (half(0), half(2)))


def _word_projections(t: Tensor, word: int) -> Callable[[], Projections]:
    """Projections of the assignment writing word ``word`` of ``t``: (result, key's words 0-3,
    counter's words 0-3)."""
    def proj():
        t.dims  # noqa: B018 - finalizes inference
        shapes = [o._shape for o in t.operands]
        slots = t.logic.word_layout(word, t._shape, shapes, solver_mod.current())  # type: ignore[union-attr]
        dims = [t.dims] + [o.dims for o in t.operands for _ in range(UINT4X32_LANES)]
        return derive_projections(slots, dims, debug=f"{t.op} {t.label} word {word}")

    return proj


def _threefry_forward(t: Tensor) -> Assignment:
    """Word ``j`` of each result cell, for ``j`` from 0 to 3, by its own assignment: the key's
    and the counter's words packed into uint4x32 values, hashed, and lane ``j`` read back. Each
    assignment hashes anew, since the loop IR holds no uint4x32 value from one store to the next;
    a block costs twenty rounds of 32-bit additions, rotations and xors."""
    key, counter = (o.value for o in t.operands)
    n = UINT4X32_LANES
    bits = Apply(Binop.THREEFRY4X32, (_packed(0), _packed(n)))
    return Block(tuple(Accum(t.value, None, Apply(Binop.UINT4X32_WORD, (bits, j)), (key,) * n + (counter,) * n,
                             _word_projections(t, j), spec=t.op)
                       for j in range(n)))


THREEFRY4X32 = define(OpDef("threefry4x32", shape=lambda operands: Words(UINT4X32_LANES),
                            forward=_threefry_forward, gradient=None, dtype=lambda operands: dtypes.uint32))


def threefry4x32(key, counter, *, label: str | None = None) -> Tensor:
    """Standard Threefry-4x32-20 (Random123's ``threefry4x32_R(20, counter, key)``) of the words
    of ``key`` and ``counter``, uint32 tensors whose last output axis holds the 4 words of each
    key and counter; their other axes broadcast as a pointwise operation's. The result is uint32
    with the broadcast shape, its last output axis holding the 4 words of each block: the same
    bits on every backend. It takes no gradient."""
    operands = [as_tensor(x) for x in (key, counter)]
    for name, o in zip(("key", "counter"), operands):
        if o.dtype is not dtypes.uint32:
            raise DTypeError(f"threefry4x32: the {name} {o.label!r} holds {o.dtype.name}; key and counter hold "
                             f"uint32 words (dtype='uint32')")
    return THREEFRY4X32(*operands, label=label)


# ---------------------------------------------------------------------------------------------
# Dimension capture.


class DimRef:
    """A label or row variable of an einsum, captured by name: its size is readable by the
    program and can be constrained (the original's ``dim d`` / ``set_dim``; docs/shapes.md,
    "Capturing dims")."""

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
        return math.prod(row.dims)  # type: ignore[arg-type]

    def set(self, size: int) -> None:
        """Constrain the captured dim to ``size``."""
        if self.name not in self.logic.labels:
            raise ShapeError(f"set: {self.name!r} is a row variable; only single dims can be set")
        solver_mod.current().add([DimEq(self.logic.labels[self.name], size,
                                        Origin("set_dim", self.name, solver_mod.caller_source(), (), self.spec))])

    def __repr__(self) -> str:
        return f"DimRef({self.name!r}, size={self.size})"


# ---------------------------------------------------------------------------------------------
# Tensor's operators and methods call these functions.

register_catalog(
    operators={"add": add, "sub": sub, "mul": mul, "div": true_divide, "pow": pow, "compose": compose, "neg": neg,
               "lt": lt, "gt": gt, "eq": eq, "ne": ne, "not_": not_, "getitem": getitem},
    methods={"relu": relu, "sat01": sat01, "exp": exp, "log": log, "exp2": exp2, "log2": log2, "sin": sin,
             "cos": cos, "sqrt": sqrt, "recip": recip, "recip_sqrt": recip_sqrt, "neg": neg, "tanh": tanh,
             "sigmoid": sigmoid, "erf": erf, "abs": abs, "not_": not_, "sum": sum, "mean": mean, "max": max,
             "reshape": reshape, "flatten": flatten, "unflatten": unflatten, "permute": permute,
             "transpose": transpose, "argmax": argmax, "argmin": argmin},
)
