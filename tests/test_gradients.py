"""Gradients of every differentiable op against central finite differences, plus hand-derived cases.

One helper, :func:`check_grad`, checks any op (tinygrad's ``helper_test_op`` habit):
it makes float64 parameters of the given ``(batch, output, input)`` dims, applies the op, reduces
the result to a scalar with a fixed random weighting ``(y * R).sum()``, and compares each
parameter's ``grad`` after ``train.grad_update`` with central differences of that scalar. A
parameter has no batch axes, so an operand with batch axes is a parameter whose leftmost output
axes are moved to the batch row by a one-operand einsum (a permutation, gradient ``g1 += g``).

Inputs come from domains where the op is smooth (no ``relu``/``abs`` at 0, no ties for
``maximum``, ``einmax``, ``tropical``), as the gradient rules assume (docs/training.md,
"Gradient rules"). The hand-derived cases are the ports of the original's tests (a quadratic,
micrograd's README expression, ``where``) and a few more worked by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

import ocannl as oc
from ocannl import train
from ocannl.errors import OcannlError, OutOfBoundsError, SessionError, ShapeError

STEP = 1e-5
"""Central-difference step: truncation ~STEP**2, rounding ~1e-16 / STEP, both far below RTOL."""
RTOL, ATOL = 1e-6, 1e-7

SCALAR = ((), (), ())
VEC = ((), (5,), ())
MAT = ((), (3,), (2,))
BO = ((3,), (4,), ())
BOI = ((2,), (3,), (4,))
MULTI = ((2,), (2, 3), (2,))


@dataclass(frozen=True)
class Data:
    """A non-differentiable operand: float64 data of the given dims drawn from ``domain``."""

    shape: tuple
    domain: str = "any"


@dataclass(frozen=True)
class Indices:
    """Integer data for ``oc.take``: ``values`` with ``batch`` leading batch axes."""

    values: tuple
    batch: int = 1


def sample(dims: tuple[int, ...], domain: str, rng: np.random.Generator) -> np.ndarray:
    """Values where the op under test is smooth and well conditioned."""
    if domain == "any":
        return rng.uniform(-2.0, 2.0, dims)
    if domain == "pos":
        return rng.uniform(0.3, 3.0, dims)
    if domain == "nonzero":  # away from the kinks of relu and abs, and from poles
        return rng.uniform(0.5, 2.0, dims) * rng.choice([-1.0, 1.0], dims)
    if domain == "unit":  # sat01: inside (0, 1) or outside [0, 1], away from both kinks
        segment = rng.integers(0, 3, dims)
        return rng.uniform(np.array([-0.5, 0.1, 1.1])[segment], np.array([-0.1, 0.9, 1.5])[segment])
    if domain == "small":  # exponents
        return rng.uniform(-1.5, 1.5, dims)
    if domain == "bool":
        return rng.integers(0, 2, dims).astype(np.float64)
    raise ValueError(domain)


def full_dims(shape) -> tuple[int, ...]:
    b, o, i = shape
    return tuple(b) + tuple(o) + tuple(i)


def to_batch(p: oc.Tensor, shape) -> oc.Tensor:
    """``p`` (output ``batch + output`` dims, input ``input`` dims) with its leftmost output axes
    moved to the batch row: a permutation einsum, so memory order and values are unchanged."""
    b, o, i = (len(r) for r in shape)
    bl, ol, il = "abcd"[:b], "mnop"[:o], "uvwx"[:i]
    operand = f"{il}->{bl}{ol}" if il else f"{bl}{ol}"
    result = f"{bl}|{il}->{ol}" if il else f"{bl}|{ol}"
    return oc.einsum(f"{operand} => {result}", p)


def make_operand(k: int, spec, domain: str, rng: np.random.Generator):
    """The tensor for one operand spec, and ``(param, value)`` when it is differentiable."""
    if isinstance(spec, (int, float)):
        return spec, None
    if isinstance(spec, Data):
        b, _, i = spec.shape
        arr = sample(full_dims(spec.shape), spec.domain, rng)
        return oc.tensor(arr, batch=len(b), input=len(i), label=f"data{k}", dtype="float64"), None
    if isinstance(spec, Indices):
        return oc.tensor(np.array(spec.values, dtype=np.int32), batch=spec.batch, label=f"idx{k}"), None
    b, o, i = spec
    arr = sample(full_dims(spec), domain, rng)
    p = oc.param(f"p{k}", output=tuple(b) + tuple(o), input=tuple(i), init=arr, dtype="float64")
    return (to_batch(p, spec) if b else p), (p, arr)


def check_grad(build, operands, domains="any", bindings=None, seed: int = 0):
    """``build(*operands)``'s gradient with respect to each parameter operand equals central
    differences of ``(build(...) * R).sum()``, R a fixed random weighting of the result's cells.

    ``operands``: ``(batch, output, input)`` dims (a parameter), a number (a constant),
    :class:`Data` or :class:`Indices`; ``domains``: one domain for every parameter, or one per
    operand; ``bindings``: index symbol values for every run."""
    rng = np.random.default_rng(seed)
    bindings = bindings or {}
    if isinstance(domains, str):
        domains = [domains] * len(operands)
    tensors, params = [], []
    for k, (spec, domain) in enumerate(zip(operands, domains)):
        t, p = make_operand(k, spec, domain, rng)
        tensors.append(t)
        if p is not None:
            params.append(p)
    y = build(*tensors)
    weights = rng.normal(size=y.dims)
    r = oc.tensor(weights, batch=len(y.shape.batch), input=len(y.shape.input), label="R", dtype="float64")
    loss = (y * r).sum()

    ctx = oc.Context("interp")
    step = ctx.compile(train.grad_update(loss))
    step.run(**bindings)
    analytic = [p.grad.numpy() for p, _ in params]
    forward = ctx.compile(loss)

    def loss_at(p: oc.Tensor, value: np.ndarray) -> float:
        p.set(value)
        forward.run(**bindings)
        return float(loss.numpy())

    any_nonzero = False
    for (p, value), grad in zip(params, analytic):
        numeric = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            plus, minus = value.copy(), value.copy()
            plus[idx] += STEP
            minus[idx] -= STEP
            numeric[idx] = (loss_at(p, plus) - loss_at(p, minus)) / (2 * STEP)
        p.set(value)
        assert grad.shape == value.shape
        np.testing.assert_allclose(grad, numeric, rtol=RTOL, atol=ATOL, err_msg=f"gradient of {p.label}")
        any_nonzero |= bool(np.any(numeric != 0))
    assert any_nonzero, "degenerate case: every gradient is zero"


def case(name: str, build, operands, domains="any", bindings=None, marks=()):
    return pytest.param(build, operands, domains, bindings, id=name, marks=marks)


UNARY_DOMAINS = {
    "relu": "nonzero", "sat01": "unit", "exp": "any", "log": "pos", "exp2": "any", "log2": "pos",
    "sin": "any", "cos": "any", "sqrt": "pos", "recip": "nonzero", "recip_sqrt": "pos", "neg": "any",
    "tanh": "any", "sigmoid": "any", "erf": "any", "abs": "nonzero",
}

UNARY_CASES = [case(f"{name}-{label}", getattr(oc, name), [shape], domain)
               for name, domain in UNARY_DOMAINS.items() for label, shape in (("vec", VEC), ("boi", BOI))]

BINARY_CASES = [
    case("add-same", lambda a, b: a + b, [BOI, BOI]),
    case("add-size1", lambda a, b: a + b, [BOI, ((2,), (1,), (4,))]),
    case("add-lower-rank", lambda a, b: a + b, [BOI, ((), (), (4,))]),
    case("add-scalar-param", lambda a, b: a + b, [BO, SCALAR]),
    case("sub-same", lambda a, b: a - b, [BOI, BOI]),
    case("sub-both-broadcast", lambda a, b: a - b, [((), (3,), (1,)), ((2,), (1,), (4,))]),
    case("rsub-number", lambda a: 1.5 - a, [VEC]),
    case("mul-same", lambda a, b: a * b, [BOI, BOI]),
    case("mul-lower-rank", lambda a, b: a * b, [BOI, ((), (3,), ())]),
    case("mul-size1", lambda a, b: a * b, [((), (1,), (4,)), BOI]),
    case("mul-self", lambda a: a * a, [MULTI]),
    case("mul-number", lambda a: 3.0 * a, [VEC]),
    case("div-same", lambda a, b: a / b, [BOI, BOI], ["any", "nonzero"]),
    case("div-broadcast-denominator", lambda a, b: a / b, [BO, ((), (1,), ())], ["any", "nonzero"]),
    case("rdiv-number", lambda a: 2.0 / a, [VEC], "nonzero"),
    case("pow-number-2", lambda a: a ** 2.0, [BOI], "any"),
    case("pow-number-3", lambda a: a ** 3, [VEC], "any"),
    case("pow-number-half", lambda a: a ** 0.5, [VEC], "pos"),
    case("pow-number-neg", lambda a: a ** -1.5, [VEC], "pos"),
    case("pow-tensor", lambda a, b: a ** b, [VEC, VEC], ["pos", "small"]),
    case("pow-tensor-broadcast", lambda a, b: a ** b, [BOI, ((), (3,), ())], ["pos", "small"]),
    case("rpow-number", lambda a: 2.0 ** a, [VEC], "small"),
    case("maximum-same", oc.maximum, [BOI, BOI]),
    case("maximum-broadcast", oc.maximum, [BOI, ((), (3,), (1,))]),
    case("maximum-number", lambda a: oc.maximum(a, 0.3), [VEC]),
    case("minimum-same", oc.minimum, [BOI, BOI]),
    case("minimum-broadcast", oc.minimum, [((), (), (4,)), BOI]),
]

TERNARY_CASES = [
    case("where-same", oc.where, [Data(BOI, "bool"), BOI, BOI]),
    case("where-number-branch", oc.where, [Data(VEC, "bool"), VEC, 0.5]),
    case("where-number-first-branch", oc.where, [Data(VEC, "bool"), -0.5, VEC]),
    case("where-broadcast", oc.where, [Data(((2,), (3,), (1,)), "bool"), BOI, ((), (3,), ())]),
    case("where-cond-of-param", lambda a, b: oc.where(a > 0, a * a, b), [BOI, BOI], "nonzero"),
    case("fma-same", oc.fma, [BOI, BOI, BOI]),
    case("fma-broadcast", oc.fma, [BOI, ((), (3,), ()), SCALAR]),
]

COMPOSE_CASES = [
    case("compose-matvec", lambda w, x: w @ x, [MAT, ((), (2,), ())]),
    case("compose-dense-layer", lambda w, x: w @ x, [MAT, ((4,), (2,), ())]),
    case("compose-matmul", lambda a, b: a @ b, [MAT, ((), (2,), (4,))]),
    case("compose-batched", lambda a, b: a @ b, [((2,), (3,), (2,)), ((2,), (2,), ())]),
    case("compose-multi-axis", lambda a, b: a @ b, [((), (2,), (2, 3)), ((2,), (2, 3), ())]),
    case("compose-data", lambda w, x: w @ x, [MAT, Data(((4,), (2,), ()))]),
]

EINSUM_CASES = [
    case("einsum1-transpose", lambda a: oc.einsum("ij=>ji", a), [((), (3, 4), ())]),
    case("einsum1-permute-kinds", lambda a: oc.einsum("b|i->o => o|b->i", a), [BOI]),
    case("einsum1-reduce", lambda a: oc.einsum("ij=>i", a), [((), (3, 4), ())]),
    case("einsum1-diagonal", lambda a: oc.einsum("ii=>i", a), [((), (3, 3), ())]),
    case("einsum1-to-diagonal", lambda a: oc.einsum("i=>ii", a), [((), (3,), ())]),
    case("einsum1-sum-to-fixed", lambda a: oc.einsum("...|...->... => 0", a), [BOI]),
    case("einsum1-fixed-batch-index", lambda a: oc.einsum("2...|...->... => ...|...->...", a),
         [((3, 2), (2,), ())]),
    case("einsum2-matmul", lambda a, b: oc.einsum("ij;jk=>ik", a, b), [((), (2, 3), ()), ((), (3, 4), ())]),
    case("einsum2-batched-matmul", lambda a, b: oc.einsum("b|h->o; b|i->h => b|i->o", a, b),
         [((2,), (3,), (4,)), ((2,), (4,), (3,))]),
    case("einsum2-outer", lambda a, b: oc.einsum("i; j => i->j", a, b), [((), (2,), ()), ((), (3,), ())]),
    case("einsum2-broadcast", lambda a, b: oc.einsum("ij;j=>ij", a, b), [((), (3, 4), ()), ((), (4,), ())]),
    case("einsum2-dense", lambda x, w: oc.einsum("b|i; i->o => b|o", x, w), [((3,), (2,), ()), MAT]),
    case("einsum2-fixed-index", lambda a, b: oc.einsum("...|i->1; ...|...->i => ...|i", a, b),
         [((3,), (2,), (4,)), ((3,), (4,), (1,))]),
    case("einsum2-conv1d-strided-valid", lambda x, k: oc.einsum("2*o<+k; k => o", x, k),
         [((), (7,), ()), ((), (3,), ())]),
    case("einsum2-conv2d-strided-valid",
         lambda x, k: oc.einsum("b | 2*oh<+kh, 2*ow<+kw; kh, kw -> c => b | oh, ow, c", x, k),
         [((2,), (4, 4), ()), ((), (2,), (2, 2))]),
    case("einsum3-chain", lambda a, b, c: oc.einsum("ij; jk; k => i", a, b, c),
         [((), (2, 3), ()), ((), (3, 4), ()), ((), (4,), ())]),
    case("einsum3-batched", lambda x, w, y: oc.einsum("b|i; i->o; b|o => b|o", x, w, y),
         [((2,), (2,), ()), MAT, ((2,), (3,), ())]),
    case("outer_sum-outer", lambda a, b: oc.outer_sum("i; j => i->j", a, b), [((), (2,), ()), ((), (3,), ())]),
    case("outer_sum-reduce", lambda a, b: oc.outer_sum("ij; j => i", a, b), [((), (3, 4), ()), ((), (4,), ())]),
    case("einmax-rows", lambda a: oc.einmax("ij=>i", a), [((), (3, 4), ())]),
    case("einmax-inputs", lambda a: oc.einmax("b|i->o => b|o", a), [BOI]),
    case("tropical-pool1d", lambda x, k: oc.tropical("2*o<+k; k => o", x, k), [((), (8,), ()), ((), (2,), ())]),
    case("tropical-pool2d", lambda x, k: oc.tropical("oh<+kh, ow<+kw; kh, kw => oh, ow", x, k),
         [((), (4, 4), ()), ((), (2, 2), ())]),
]

REDUCTION_CASES = [
    case("sum-all", lambda a: a.sum(), [BOI]),
    case("sum-batch", lambda a: a.sum(axes="batch"), [BOI]),
    case("sum-output", lambda a: a.sum(axes="output"), [MULTI]),
    case("sum-input", lambda a: oc.sum(a, axes="input"), [BOI]),
    case("sum-batch-input", lambda a: a.sum(axes=("batch", "input")), [BOI]),
    case("mean-all", lambda a: a.mean(), [BOI]),
    case("mean-batch", lambda a: a.mean(axes="batch"), [BO]),
    case("mean-output-input", lambda a: oc.mean(a, axes=("output", "input")), [MULTI]),
    case("max-all", lambda a: a.max(), [BOI]),
    case("max-output", lambda a: a.max(axes="output"), [BOI]),
    case("max-batch", lambda a: oc.max(a, axes="batch"), [BO]),
]


def _slice(xs, size=3):
    return xs[oc.IndexSymbol("batch_n", size)]


SLICE_TAKE_CASES = [
    case("slice-row0", _slice, [((3, 2), (2,), ())], bindings={"batch_n": 0}),
    case("slice-row2", _slice, [((3, 2), (2,), ())], bindings={"batch_n": 2}),
    case("slice-then-compose", lambda xs, w: w @ _slice(xs, 4), [((4,), (2,), ()), MAT], bindings={"batch_n": 1}),
    case("take-rows", oc.take, [((), (4, 3), ()), Indices((2, 0, 2, 1))]),
    case("take-with-output-axis", oc.take, [((), (3, 2), ()), Indices(((0, 2), (1, 1)))]),
    case("take-table-with-input", oc.take, [((), (4,), (2,)), Indices((3, 3, 0))]),
]

BLOCK_CASES = [
    case("concat", lambda a, b: oc.concat("a; b => a^b", [a, b]), [((), (2,), ()), ((), (3,), ())]),
    case("concat-negated", lambda a, b: oc.concat("...|a; ...|b => ...|a^b", [a, b], negated=True),
         [((2,), (2,), ()), ((2,), (3,), ())]),
    case("stack", lambda a, b: oc.stack([a, b]), [VEC, VEC]),
    case("interleave", oc.interleave, [((), (3,), ()), ((), (3,), ())]),
    case("deinterleave_even", oc.deinterleave_even, [((2,), (6,), ())]),
    case("deinterleave_odd", oc.deinterleave_odd, [((), (6,), ())]),
]

COMPOSITE_CASES = [
    case("dense-tanh", lambda w, b, x: oc.tanh(w @ x + b), [MAT, ((), (3,), ()), Data(((4,), (2,), ()))]),
    case("softmax", lambda x: (lambda e: e / e.sum(axes="output"))(oc.exp(x - x.max(axes="output"))),
         [((2,), (4,), ())]),
    case("logsumexp-mean", lambda x: oc.log(oc.exp(x).sum(axes="output")).mean(), [BO]),
    case("same-operand-twice", lambda a: oc.einsum("ij;jk=>ik", a, a), [((), (3, 3), ())]),
    case("hinge", lambda w, x, t: oc.relu(1 - t * (w @ x)).mean(),
         [((), (1,), (2,)), Data(((4,), (2,), ())), Data(((4,), (1,), ()), "nonzero")]),
]

CONV_CASES = [
    case("einsum2-conv1d-dilated", lambda x, k: oc.einsum("o<+2*k; k => o", x, k), [((), (7,), ()), ((), (3,), ())]),
    case("einsum2-conv1d-padded", lambda x, k: oc.einsum("o=+k; k => o", x, k),
         [((), (5,), ()), ((), (3,), ())]),
    case("einsum2-conv1d-strided-padded", lambda x, k: oc.einsum("2*o=+k; k => o", x, k),
         [((), (6,), ()), ((), (3,), ())]),
    case("tropical-pool1d-padded", lambda x, k: oc.tropical("o=+k; k => o", x, k),
         [((), (5,), ()), ((), (3,), ())]),
]

SPEC_CASES = [
    case("exp-spec-permute", lambda a: oc.exp(a, spec="ij=>ji"), [((), (3, 4), ())]),
    case("relu-spec-reduce", lambda a: oc.relu(a, spec="ij=>i"), [((), (3, 4), ())], "nonzero"),
    case("neg-spec-reduce", lambda a: oc.neg(a, spec="ij=>i"), [((), (3, 4), ())]),
    case("add-spec-reduce", lambda a, b: oc.add(a, b, spec="ij;j=>i"), [((), (3, 4), ()), ((), (4,), ())]),
    case("mul-spec-matmul", lambda a, b: oc.mul(a, b, spec="ij;jk=>ik"), [((), (2, 3), ()), ((), (3, 4), ())]),
    case("where-spec-outer", lambda c, a, b: oc.where(c, a, b, spec="i;i;j=>ij"),
         [Data(((), (2,), ()), "bool"), ((), (2,), ()), ((), (3,), ())]),
    case("where-spec-reduce", lambda c, a, b: oc.where(c, a, b, spec="i;i;j=>i"),
         [Data(((), (2,), ()), "bool"), ((), (2,), ()), ((), (3,), ())]),
    case("exp-spec-reduce", lambda a: oc.exp(a, spec="ij=>i"), [((), (3, 4), ())]),
    case("tanh-spec-reduce", lambda a: oc.tanh(a, spec="ij=>i"), [((), (3, 4), ())]),
    case("sqrt-spec-reduce", lambda a: oc.sqrt(a, spec="ij=>i"), [((), (3, 4), ())], "pos"),
    case("div-spec-reduce", lambda a, b: oc.div(a, b, spec="ij;j=>i"), [((), (2, 3), ()), ((), (3,), ())],
         ["any", "nonzero"]),
    case("maximum-spec-reduce", lambda a, b: oc.maximum(a, b, spec="ij;j=>i"), [((), (3, 4), ()), ((), (4,), ())]),
]

MORE_CASES = [
    case("exp-scalar", oc.exp, [SCALAR]),
    case("sigmoid-multi", lambda a: a.sigmoid(), [MULTI]),
    case("fma-same-operand", lambda a: oc.fma(a, a, a), [VEC]),
    case("pow-same-operand", lambda a: a ** a, [VEC], "pos"),
    case("compose-batch-size1", lambda a, b: a @ b, [((2,), (3,), (2,)), ((1,), (2,), ())]),
    case("max-of-batch-sum", lambda a: a.sum(axes="batch").max(), [BOI]),
    case("mean-scalar", lambda a: a.mean(), [SCALAR]),
    case("static_index-strided", lambda a: a[1, 1:, ::-2], [((2,), (3,), (4,))]),
    case("reshape-through-flat", lambda a: oc.reshape(a, (3, 8), batch=1), [((2,), (3,), (4,))]),
    case("reshape-flatten-input", lambda a: oc.flatten(a, "input").sum(axis=0), [((2,), (), (3, 2))]),
]

ALL_CASES = (UNARY_CASES + BINARY_CASES + TERNARY_CASES + COMPOSE_CASES + EINSUM_CASES + REDUCTION_CASES
             + CONV_CASES + SPEC_CASES + SLICE_TAKE_CASES + BLOCK_CASES + COMPOSITE_CASES + MORE_CASES)


@pytest.mark.parametrize("build, operands, domains, bindings", ALL_CASES)
def test_gradient_matches_finite_differences(build, operands, domains, bindings):
    check_grad(build, operands, domains, bindings)


def test_every_differentiable_op_is_covered():
    """Each op of the catalog (ocannl/ops.py) that has a gradient appears in some case above
    (by case id)."""
    from ocannl import ops

    ids = " ".join(c.id for c in ALL_CASES)
    named = {"compose": "compose", "max_reduce": "max-", "pow": "pow", "mul": "mul", "div": "div",
             "add": "add", "sub": "sub", "slice": "slice", "einsum": "einsum3", "mean": "mean-",
             "sum": "sum-", "maximum": "maximum", "max": "maximum", "min": "minimum"}
    differentiable = [name for name, op in ops.OPS.items() if op.gradient is not None]
    assert {"einsum", "mean", "take", "concat", "interleave", "tropical", "cos"} <= set(differentiable)
    for op in differentiable:
        assert named.get(op, op) in ids, f"no gradient case for {op}"



def test_helper_catches_a_wrong_gradient_rule():
    """The helper is not vacuous: ``cos`` given ``sin``'s gradient fails the check."""
    import dataclasses

    from ocannl import ops

    wrong_cos = dataclasses.replace(ops.OPS["cos"], gradient=ops.OPS["sin"].gradient)
    check_grad(ops.OPS["cos"], [VEC])
    with pytest.raises(AssertionError, match="gradient of p0"):
        check_grad(wrong_cos, [VEC])

# ---------------------------------------------------------------------------------------------
# Hand-derived cases.


def scalar_param(label: str, value: float) -> oc.Tensor:
    return oc.param(label, output=1, init=np.array([value]), dtype="float64")


def run_grad_update(loss: oc.Tensor, **bindings):
    """Compile and run ``grad_update(loss)`` on a fresh interpreter context. The caller keeps the
    returned routine: it holds the context, whose buffers ``t.numpy()`` and ``t.grad.numpy()`` read."""
    routine = oc.Context("interp").compile(train.grad_update(loss))
    routine.run(**bindings)
    return routine


def test_an_intermediate_gradient_is_kept_only_when_asked():
    """As in PyTorch, an intermediate result's gradient is not kept: the optimizer inlines it into
    the backward code that reads it (here a copy, which then costs nothing). Reading it says how
    to keep it; ``retain_grad()`` keeps it."""
    x = scalar_param("x", 5.0)
    y = x * 3.0
    f = y + 1.0
    routine = run_grad_update(f)
    assert y.grad not in routine.ir.writes
    np.testing.assert_allclose(x.grad.numpy(), [3.0])
    with pytest.raises(SessionError, match=r"call t\.retain_grad\(\) on its tensor t \(labelled 'mul'\)"):
        y.grad.numpy()
    y.retain_grad()
    routine = run_grad_update(f)
    assert y.grad in routine.ir.writes
    np.testing.assert_allclose(y.grad.numpy(), [1.0])


def test_zero2hero_quadratic():
    """f = 3x² − 4x + 5 at x = 5 (the original's zero-to-hero test)."""
    x = scalar_param("x", 5.0)
    x2 = x ** 2
    three_x2 = 3 * x2
    four_x = 4 * x
    diff = three_x2 - four_x
    f = diff + 5
    for t in (f, diff, three_x2, four_x, x2):
        t.retain_grad()  # intermediate gradients are inlined unless kept
    routine = run_grad_update(f)
    values = {"f": 60.0, "3x²-4x": 55.0, "3x²": 75.0, "4x": 20.0, "x²": 25.0}
    grads = {"f": 1.0, "3x²-4x": 1.0, "3x²": 1.0, "4x": -1.0, "x²": 3.0, "x": 26.0}
    tensors = {"f": f, "3x²-4x": diff, "3x²": three_x2, "4x": four_x, "x²": x2, "x": x}
    for name, value in values.items():
        np.testing.assert_allclose(tensors[name].numpy(), [value], err_msg=name)
    for name, grad in grads.items():
        np.testing.assert_allclose(tensors[name].grad.numpy(), [grad], err_msg=f"grad of {name}")

    results = {}
    for v in range(-5, 5):
        x.set(np.array([float(v)]))
        routine.run()
        results[v] = float(f.numpy()[0])
        assert float(x.grad.numpy()[0]) == 6 * v - 4
    assert min(results.values()) == 4.0 and min(results, key=results.get) == 1
    assert max(results.values()) == 100.0 and max(results, key=results.get) == -5


def test_micrograd_readme_expression():
    """micrograd's README expression at a = −4, b = 2."""
    a, b = scalar_param("a", -4.0), scalar_param("b", 2.0)
    c = a + b
    d = a * b + b ** 3
    c = c + c + 1
    c = c + 1 + c + (-a)
    d = d + d * 2 + (b + a).relu()
    d = d + 3 * d + (b - a).relu()
    e = c - d
    f = e ** 2
    g = f / 2.0
    g = g + 10.0 / f
    _routine = run_grad_update(g)
    assert round(float(g.numpy()[0]), 4) == 24.7041
    assert round(float(a.grad.numpy()[0]), 4) == 138.8338
    assert round(float(b.grad.numpy()[0]), 4) == 645.5773


@pytest.mark.parametrize("cond, value, grad_x, grad_y", [(1, 2.0, 1.0, 0.0), (0, 3.0, 0.0, 1.0)])
def test_where_simple(cond, value, grad_x, grad_y):
    """where(c, x = 2, y = 3); the condition is a number."""
    x, y = scalar_param("x", 2.0), scalar_param("y", 3.0)
    r = oc.where(cond, x, y)
    _routine = run_grad_update(r)
    assert r.numpy().tolist() == [value]
    assert x.grad.numpy().tolist() == [grad_x]
    assert y.grad.numpy().tolist() == [grad_y]


def test_two_layer_net_on_two_points():
    """h = relu(w1 @ x + b1), y = w2 @ h, loss = Σ (y − t)², derived by hand:
    pre-activations (2, 2) and (1, −2.5); y = (−2, 1); dL/dy = 2(y − t) = (−4, −2);
    dL/dw2 = Σ dy·h = (−10, −8); dL/dpre = (−4, 8) and (−2, 0) (the second unit is off for
    point 2); dL/db1 = (−6, 8); dL/dw1 = Σ dpre ⊗ x = [[−2, −10], [8, 16]]."""
    w1 = oc.param("w1", output=2, input=2, init=np.array([[1.0, -1.0], [2.0, 0.5]]), dtype="float64")
    b1 = oc.param("b1", output=2, init=np.array([3.0, -1.0]), dtype="float64")
    w2 = oc.param("w2", output=1, input=2, init=np.array([[1.0, -2.0]]), dtype="float64")
    x = oc.tensor([[1.0, 2.0], [-1.0, 1.0]], batch=1, dtype="float64")
    t = oc.tensor([[0.0], [2.0]], batch=1, dtype="float64")
    h = oc.relu(w1 @ x + b1)
    y = w2 @ h
    loss = ((y - t) ** 2).sum()
    _routine = run_grad_update(loss)
    assert h.numpy().tolist() == [[2.0, 2.0], [1.0, 0.0]]
    assert y.numpy().tolist() == [[-2.0], [1.0]]
    assert float(loss.numpy()) == 5.0
    assert w2.grad.numpy().tolist() == [[-10.0, -8.0]]
    assert b1.grad.numpy().tolist() == [-6.0, 8.0]
    assert w1.grad.numpy().tolist() == [[-2.0, -10.0], [8.0, 16.0]]


def test_logsumexp_gradient_is_softmax():
    """log(e^0 + e^(ln 3)) = ln 4, and its gradient is the softmax (1/4, 3/4)."""
    x = oc.param("x", output=2, init=np.array([0.0, math.log(3.0)]), dtype="float64")
    lse = oc.log(oc.exp(x).sum())
    _routine = run_grad_update(lse)
    np.testing.assert_allclose(lse.numpy(), math.log(4.0), rtol=1e-15)
    np.testing.assert_allclose(x.grad.numpy(), [0.25, 0.75], rtol=1e-15)


def test_broadcast_scalar_gradient_sums():
    """mean(w · x) over x = (1, 2, 3, 4) with one broadcast w = 2: value 5, dw = mean(x) = 2.5."""
    w = oc.param("w", output=(), init=np.array(2.0), dtype="float64")
    x = oc.tensor([1.0, 2.0, 3.0, 4.0], batch=1, dtype="float64")
    m = (w * x).mean()
    _routine = run_grad_update(m)
    assert float(m.numpy()) == 5.0
    assert float(w.grad.numpy()) == 2.5


def test_max_gradient_goes_to_the_argmax():
    x = oc.param("x", output=3, init=np.array([1.0, 5.0, 3.0]), dtype="float64")
    m = x.max()
    _routine = run_grad_update(m)
    assert float(m.numpy()) == 5.0
    assert x.grad.numpy().tolist() == [0.0, 1.0, 0.0]


def test_take_scatter_adds_repeated_rows():
    """Rows picked twice receive the gradient twice; rows never picked receive none."""
    table = oc.param("table", output=(3, 2), init=np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), dtype="float64")
    picked = oc.take(table, oc.tensor(np.array([2, 0, 2], dtype=np.int32), batch=1))
    weights = oc.tensor([[1.0, 10.0], [100.0, 1000.0], [0.5, 0.25]], batch=1, dtype="float64")
    loss = (picked * weights).sum()
    _routine = run_grad_update(loss)
    assert picked.numpy().tolist() == [[5.0, 6.0], [1.0, 2.0], [5.0, 6.0]]
    assert float(loss.numpy()) == 5 + 60 + 100 + 2000 + 2.5 + 1.5
    assert table.grad.numpy().tolist() == [[100.0, 1000.0], [0.0, 0.0], [1.5, 10.25]]


def test_slice_gradient_lands_in_the_bound_row():
    xs = oc.param("xs", output=(3, 2), init=np.arange(6.0).reshape(3, 2), dtype="float64")
    rows = oc.einsum("ab => a|b", xs)
    n = oc.IndexSymbol("batch_n", 3)
    loss = (rows[n] * oc.tensor([1.0, -2.0], dtype="float64")).sum()
    routine = run_grad_update(loss, batch_n=1)
    assert float(loss.numpy()) == 2.0 - 6.0
    assert xs.grad.numpy().tolist() == [[0.0, 0.0], [1.0, -2.0], [0.0, 0.0]]
    routine.run(batch_n=2)  # gradients are zeroed each run: only row 2 now
    assert float(loss.numpy()) == 4.0 - 10.0
    assert xs.grad.numpy().tolist() == [[0.0, 0.0], [0.0, 0.0], [1.0, -2.0]]


# ---------------------------------------------------------------------------------------------
# Non-differentiable tensors get no gradient.


def test_data_and_comparisons_have_no_gradient():
    w = scalar_param("w", 0.5)
    x = oc.tensor([1.0, -1.0, 2.0], batch=1, dtype="float64")
    positive = w * x > 0
    loss = (oc.where(positive, w * x, 0.0) + oc.not_(x < 0) + (x == 2.0)).sum()
    _routine = run_grad_update(loss)
    np.testing.assert_allclose(w.grad.numpy(), [3.0])  # only the where branch: x = 1 and x = 2
    for t in (x, positive, x < 0, oc.not_(x < 0), x == 2.0, oc.number(2.0)):
        assert not t.requires_grad
        with pytest.raises(OcannlError, match="not differentiable"):
            t.grad


def test_constant_exponent_and_condition_get_no_gradient():
    """``pow``'s number exponent and ``where``'s condition are operands without gradients; their
    rules are skipped, the differentiable operands still get theirs."""
    a = scalar_param("a", 3.0)
    cond = oc.tensor([1.0], dtype="float64")
    loss = oc.where(cond, a ** 2, 7.0).sum()
    _routine = run_grad_update(loss)
    assert a.grad.numpy().tolist() == [6.0]
    with pytest.raises(OcannlError, match="not differentiable"):
        cond.grad


def test_grad_update_of_a_loss_without_parameters_is_an_error():
    x = oc.tensor([1.0, 2.0], dtype="float64")
    with pytest.raises(ShapeError, match="does not depend on any parameter"):
        train.grad_update((x * x).sum())
