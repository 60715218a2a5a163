"""Every forward op of the catalog (ocannl/ops.py), computed by the interpreter, against numpy.

One helper, :func:`check_op`, checks any op: it makes random float32 operands of the given
shapes (each a ``(batch, output, input)`` triple of dims; a Python number is passed as is),
computes the op with ocannl and the numpy reference with the operands broadcast kind by kind
(right-aligned within each row, as docs/shapes.md says), and compares dims and values within 1e-6
relative. Each op draws its inputs from a domain where it is defined and well conditioned
(``log``/``sqrt`` on positive numbers, denominators away from 0, small integers for comparisons so
that ties occur).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ocannl as oc
import ocannl.session

RTOL = 1e-6

SCALAR = ((), (), ())
VEC = ((), (5,), ())
BO = ((3,), (4,), ())
BOI = ((2,), (3,), (4,))
MULTI = ((2, 1), (3,), (2, 2))
KINDS = ("batch", "output", "input")


@pytest.fixture(autouse=True)
def interp_backend(monkeypatch):
    monkeypatch.setenv("OCANNL_BACKEND", "interp")


def sample(dims: tuple[int, ...], domain: str, rng: np.random.Generator) -> np.ndarray:
    if domain == "any":
        x = rng.uniform(-2.0, 2.0, dims)
    elif domain == "pos":
        x = rng.uniform(0.1, 3.0, dims)
    elif domain == "nonzero":
        x = rng.uniform(0.5, 2.0, dims) * rng.choice([-1.0, 1.0], dims)
    elif domain == "int":  # small integers: comparisons see ties, relu/abs see exact zeros
        x = rng.integers(-2, 3, dims).astype(np.float64)
    elif domain == "bool":
        x = rng.integers(0, 2, dims).astype(np.float64)
    elif domain == "unit":  # around [0, 1], for sat01
        x = rng.uniform(-0.5, 1.5, dims)
    elif domain == "small":  # exponents
        x = rng.uniform(-1.5, 1.5, dims)
    else:
        raise ValueError(domain)
    return np.asarray(x, dtype=np.float32)


def full_dims(shape) -> tuple[int, ...]:
    b, o, i = shape
    return tuple(b) + tuple(o) + tuple(i)


def broadcast_to_kinds(arr: np.ndarray, shape, ranks: tuple[int, int, int]) -> np.ndarray:
    """``arr`` (memory order batch, output, input) with size-1 axes inserted on the left of each
    row so that row ``k`` has ``ranks[k]`` axes: numpy then broadcasts kind by kind."""
    new: list[int] = []
    for dims, rank in zip(shape, ranks):
        new += [1] * (rank - len(dims)) + list(dims)
    return arr.reshape(new)


def result_shape(shapes) -> tuple[tuple[int, ...], ...]:
    rows = []
    for k in range(3):
        rank = max((len(s[k]) for s in shapes), default=0)
        padded = [(1,) * (rank - len(s[k])) + tuple(s[k]) for s in shapes]
        rows.append(tuple(max(ds) if ds else 1 for ds in zip(*padded)) if padded else ())
    return tuple(rows)


def check_op(oc_fn, np_fn, shapes, domains="any", seed: int = 0, rtol: float = RTOL, bindings=None):
    """The tinygrad ``helper_test_op`` of ocannl: ``oc_fn(*operands)`` equals
    ``np_fn(*broadcast arrays)`` (computed in float64 from the same float32 inputs)."""
    rng = np.random.default_rng(seed)
    if isinstance(domains, str):
        domains = [domains] * len(shapes)
    tensor_shapes = [s for s in shapes if not isinstance(s, (int, float))]
    res = result_shape(tensor_shapes) if tensor_shapes else SCALAR
    ranks = tuple(len(r) for r in res)
    oc_args, np_args = [], []
    for s, dom in zip(shapes, domains):
        if isinstance(s, (int, float)):
            oc_args.append(s)
            np_args.append(np.float64(s))
            continue
        arr = sample(full_dims(s), dom, rng)
        oc_args.append(oc.tensor(arr, batch=len(s[0]), input=len(s[2])))
        np_args.append(broadcast_to_kinds(arr, s, ranks).astype(np.float64))
    y = oc_fn(*oc_args)
    expected = np.asarray(np_fn(*np_args), dtype=np.float64)
    if bindings is None:
        actual = y.numpy()
    else:
        ctx = oc.Context("interp")
        ctx.compile(y).run(**bindings)
        actual = ctx.get(y.value)
    assert actual.dtype == np.float32
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(scale, 1e-30))
    return y


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_erf = np.vectorize(math.erf, otypes=[np.float64])


UNARY = [
    ("relu", oc.relu, lambda x: np.maximum(x, 0.0), "int"),
    ("relu_any", oc.relu, lambda x: np.maximum(x, 0.0), "any"),
    ("sat01", oc.sat01, lambda x: np.clip(x, 0.0, 1.0), "unit"),
    ("exp", oc.exp, np.exp, "any"),
    ("log", oc.log, np.log, "pos"),
    ("exp2", oc.exp2, np.exp2, "any"),
    ("log2", oc.log2, np.log2, "pos"),
    ("sin", oc.sin, np.sin, "any"),
    ("cos", oc.cos, np.cos, "any"),
    ("sqrt", oc.sqrt, np.sqrt, "pos"),
    ("recip", oc.recip, lambda x: 1.0 / x, "nonzero"),
    ("recip_sqrt", oc.recip_sqrt, lambda x: 1.0 / np.sqrt(x), "pos"),
    ("neg", oc.neg, np.negative, "any"),
    ("tanh", oc.tanh, np.tanh, "any"),
    ("sigmoid", oc.sigmoid, _sigmoid, "any"),
    ("erf", oc.erf, _erf, "any"),
    ("abs", oc.abs, np.abs, "any"),
    ("not_", oc.not_, lambda x: (x == 0).astype(np.float64), "int"),
]


@pytest.mark.parametrize("shape", [SCALAR, VEC, BOI, MULTI], ids=["scalar", "vec", "b_o_i", "multi"])
@pytest.mark.parametrize("name,fn,ref,domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, fn, ref, domain, shape):
    check_op(fn, ref, [shape], domain)


@pytest.mark.parametrize("name,fn,ref,domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary_method(name, fn, ref, domain):
    """Each unary function is also a tensor method (``t.relu()``)."""
    method = "not_" if name == "not_" else name.removesuffix("_any")
    check_op(lambda x: getattr(x, method)(), ref, [BO], domain)


def test_unary_of_a_number():
    check_op(lambda: oc.exp(oc.number(0.5)), lambda: np.exp(0.5), [])
    check_op(lambda: oc.relu(oc.number(-2.0) + 5), lambda: np.float64(3.0), [])


BINARY = [
    ("add", oc.add, np.add, ("any", "any")),
    ("sub", oc.sub, np.subtract, ("any", "any")),
    ("mul", oc.mul, np.multiply, ("any", "any")),
    ("div", oc.div, np.divide, ("any", "nonzero")),
    ("pow", oc.pow, np.power, ("pos", "small")),
    ("lt", oc.lt, lambda a, b: (a < b).astype(np.float64), ("int", "int")),
    ("gt", oc.gt, lambda a, b: (a > b).astype(np.float64), ("int", "int")),
    ("eq", oc.eq, lambda a, b: (a == b).astype(np.float64), ("int", "int")),
    ("ne", oc.ne, lambda a, b: (a != b).astype(np.float64), ("int", "int")),
    ("maximum", oc.maximum, np.maximum, ("int", "any")),
    ("minimum", oc.minimum, np.minimum, ("any", "int")),
]

BINARY_SHAPES = {
    "same": [BOI, BOI],
    "size1_dim": [((3,), (4,), ()), ((1,), (4,), ())],
    "size1_both": [((3,), (1,), ()), ((1,), (5,), ())],
    "lower_rank": [((2,), (3, 4), ()), ((), (4,), ())],
    "across_kinds": [((), (4,), ()), ((), (), (5,))],
    "scalar_tensor": [MULTI, SCALAR],
    "number_right": [BO, 1.5],
    "number_left": [1.5, BO],
}


@pytest.mark.parametrize("layout", list(BINARY_SHAPES))
@pytest.mark.parametrize("name,fn,ref,domains", BINARY, ids=[b[0] for b in BINARY])
def test_binary(name, fn, ref, domains, layout):
    shapes = BINARY_SHAPES[layout]
    if name == "pow" and layout == "number_left":
        shapes = [2.0, BO]  # a positive base
    if name in ("lt", "gt", "eq", "ne") and "number" in layout:
        shapes = [1.0 if isinstance(s, float) else s for s in shapes]  # a tie is possible
    check_op(fn, ref, shapes, domains)


OPERATORS = [
    ("a+b", lambda a, b: a + b, np.add, ("any", "any")),
    ("a-b", lambda a, b: a - b, np.subtract, ("any", "any")),
    ("a*b", lambda a, b: a * b, np.multiply, ("any", "any")),
    ("a/b", lambda a, b: a / b, np.divide, ("any", "nonzero")),
    ("a**b", lambda a, b: a ** b, np.power, ("pos", "small")),
    ("a<b", lambda a, b: a < b, lambda a, b: (a < b) * 1.0, ("int", "int")),
    ("a>b", lambda a, b: a > b, lambda a, b: (a > b) * 1.0, ("int", "int")),
    ("a==b", lambda a, b: a == b, lambda a, b: (a == b) * 1.0, ("int", "int")),
    ("a!=b", lambda a, b: a != b, lambda a, b: (a != b) * 1.0, ("int", "int")),
    ("a<=b", lambda a, b: a <= b, lambda a, b: (a <= b) * 1.0, ("int", "int")),
    ("a>=b", lambda a, b: a >= b, lambda a, b: (a >= b) * 1.0, ("int", "int")),
]


@pytest.mark.parametrize("name,fn,ref,domains", OPERATORS, ids=[o[0] for o in OPERATORS])
def test_operator(name, fn, ref, domains):
    check_op(fn, ref, [((2,), (3,), ()), ((), (3,), ())], domains)


SCALAR_OPERATORS = [
    ("x+2", lambda x: x + 2, lambda x: x + 2, "any"),
    ("2+x", lambda x: 2 + x, lambda x: 2 + x, "any"),
    ("x-0.5", lambda x: x - 0.5, lambda x: x - 0.5, "any"),
    ("3-x", lambda x: 3 - x, lambda x: 3 - x, "any"),
    ("x*3", lambda x: x * 3, lambda x: x * 3, "any"),
    ("0.5*x", lambda x: 0.5 * x, lambda x: 0.5 * x, "any"),
    ("x/4", lambda x: x / 4, lambda x: x / 4, "any"),
    ("3/x", lambda x: 3 / x, lambda x: 3 / x, "nonzero"),
    ("x**2", lambda x: x ** 2, lambda x: x ** 2, "any"),
    ("x**0.5", lambda x: x ** 0.5, np.sqrt, "pos"),
    ("2**x", lambda x: 2 ** x, np.exp2, "any"),
    ("-x", lambda x: -x, np.negative, "any"),
    ("x<0", lambda x: x < 0, lambda x: (x < 0) * 1.0, "int"),
    ("x==0", lambda x: x == 0, lambda x: (x == 0) * 1.0, "int"),
    ("relu(x*2+1)", lambda x: oc.relu(x * 2 + 1), lambda x: np.maximum(x * 2 + 1, 0), "any"),
    ("(1-x).relu().exp()", lambda x: (1 - x).relu().exp(), lambda x: np.exp(np.maximum(1 - x, 0)), "any"),
]


@pytest.mark.parametrize("name,fn,ref,domain", SCALAR_OPERATORS, ids=[o[0] for o in SCALAR_OPERATORS])
def test_operator_with_number(name, fn, ref, domain):
    check_op(fn, ref, [BOI], domain)


TERNARY_SHAPES = {
    "same": [BO, BO, BO],
    "broadcast": [((3,), (1,), ()), ((), (4,), ()), ((3,), (4,), ())],
    "kinds": [((2,), (), ()), ((), (3,), ()), ((), (), (4,))],
}


@pytest.mark.parametrize("layout", list(TERNARY_SHAPES))
def test_where(layout):
    check_op(oc.where, lambda c, a, b: np.where(c != 0, a, b), TERNARY_SHAPES[layout], ("bool", "any", "any"))


@pytest.mark.parametrize("branches", ["number_then", "number_else", "both_numbers"])
def test_where_with_number_branches(branches):
    a, b = {"number_then": (2.0, BO), "number_else": (BO, -1.0), "both_numbers": (2.0, -1.0)}[branches]
    check_op(oc.where, lambda c, x, y: np.where(c != 0, x, y), [BO, a, b], ("int", "any", "any"))


@pytest.mark.parametrize("layout", list(TERNARY_SHAPES))
def test_fma(layout):
    check_op(oc.fma, lambda a, b, c: a * b + c, TERNARY_SHAPES[layout])


def test_fma_with_number():
    check_op(lambda a, b: oc.fma(a, 2.0, b), lambda a, b: a * 2.0 + b, [BO, ((), (4,), ())])


# -- compose ------------------------------------------------------------------------------------


def check_compose(a_shape, b_shape, subscripts: str, a_dom="any", b_dom="any"):
    """``a @ b`` against ``numpy.einsum(subscripts)`` over the arrays in memory order."""
    rng = np.random.default_rng(1)
    a_arr, b_arr = sample(full_dims(a_shape), a_dom, rng), sample(full_dims(b_shape), b_dom, rng)
    a = oc.tensor(a_arr, batch=len(a_shape[0]), input=len(a_shape[2]))
    b = oc.tensor(b_arr, batch=len(b_shape[0]), input=len(b_shape[2]))
    y = a @ b
    expected = np.einsum(subscripts, a_arr.astype(np.float64), b_arr.astype(np.float64))
    actual = y.numpy()
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL * np.abs(expected).max())
    return y


COMPOSE = {
    "dense_layer": (((), (3,), (4,)), ((2,), (4,), ()), "oc,bc->bo"),
    "matrix_matrix": (((), (3,), (4,)), ((), (4,), (5,)), "oc,ci->oi"),
    "batched": (((2,), (3,), (4,)), ((2,), (4,), ()), "boc,bc->bo"),
    "batch_broadcast": (((2,), (3,), (4,)), ((), (4,), (5,)), "boc,ci->boi"),
    "two_contracted_axes": (((), (3,), (2, 2)), ((2,), (2, 2), ()), "ocd,bcd->bo"),
    "vector_dot": (((), (), (4,)), ((), (4,), ()), "c,c->"),
    "scalar_right_broadcasts": (((), (3,), (4,)), SCALAR, "oc,->o"),
}


@pytest.mark.parametrize("case", list(COMPOSE))
def test_compose(case):
    a_shape, b_shape, subscripts = COMPOSE[case]
    check_compose(a_shape, b_shape, subscripts)


def test_compose_size1_output_broadcasts_into_input():
    """A size-1 output axis of the right operand broadcasts into the left's input axis (every
    size-1 dim broadcasts): a sum over a's inputs scaled by b[0]."""
    check_compose(((), (3,), (4,)), ((), (1,), ()), "oc,z->o")


def test_compose_function_and_mlp_layer():
    """``oc.compose`` is ``@``; a dense layer ``relu(w @ x + b)`` with explicit inits."""
    rng = np.random.default_rng(2)
    W, B, X = rng.standard_normal((16, 2)), rng.standard_normal(16), rng.standard_normal((10, 2))
    w = oc.param("w", output=16, input=2, init=W.astype(np.float32))
    b = oc.param("b", output=16, init=B.astype(np.float32))
    x = oc.tensor(X.astype(np.float32), batch=1)
    h = oc.relu(oc.compose(w, x) + b)
    expected = np.maximum(X.astype(np.float32) @ W.astype(np.float32).T + B.astype(np.float32), 0)
    np.testing.assert_allclose(h.numpy(), expected, rtol=RTOL, atol=1e-6)


# -- reductions ---------------------------------------------------------------------------------

AXES = {None: (0, 1, 2), "batch": (0,), "output": (1,), "input": (2,), ("batch", "input"): (0, 2),
        ("output", "input"): (1, 2)}


def _positions(shape, kinds) -> tuple[int, ...]:
    starts = np.cumsum([0] + [len(r) for r in shape])
    return tuple(p for k in kinds for p in range(starts[k], starts[k + 1]))


REDUCTIONS = [("sum", np.sum), ("mean", np.mean), ("max", np.max)]


@pytest.mark.parametrize("axes", list(AXES), ids=lambda a: "all" if a is None else str(a))
@pytest.mark.parametrize("name,ref", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reduction(name, ref, axes):
    shape = MULTI if axes is None or "batch" in axes else BOI
    pos = _positions(shape, AXES[axes])
    y = check_op(lambda x: getattr(x, name)(axes=axes), lambda x: ref(x, axis=pos), [shape])
    if axes is None:
        assert y.dims == ()


@pytest.mark.parametrize("name,ref", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reduction_functions(name, ref):
    fn = {"sum": oc.sum, "mean": oc.mean, "max": oc.max}[name]
    check_op(fn, lambda x: ref(x), [BOI])
    check_op(lambda x: fn(x * x, axes="output"), lambda x: ref(x * x, axis=1), [BO])


def test_mean_of_a_pointwise_expression():
    check_op(lambda x, y: oc.relu(1 - y * x).mean(), lambda x, y: np.maximum(1 - y * x, 0).mean(),
             [((10,), (1,), ()), ((10,), (1,), ())], ("any", "int"))


# -- batch slicing ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 2, 3])
def test_slice_by_index_symbol(n):
    sym = oc.IndexSymbol("n", 4)
    check_op(lambda xs: xs[sym], lambda xs: xs[n], [((4, 2), (3,), ())], bindings={"n": n})


def test_slice_then_ops_and_symbol_arithmetic():
    sym = oc.IndexSymbol("n", 4)
    check_op(lambda xs: oc.relu(xs[sym] * 2 - 1) + sym, lambda xs: np.maximum(xs[1] * 2 - 1, 0) + 1,
             [((4,), (3,), (2,))], bindings={"n": 1})


# -- take, concat, stack, interleave ---------------------------------------------------------------

_rng = np.random.default_rng(12)
A = _rng.integers(-3, 4, (2, 3, 4)).astype(np.float32)
B = _rng.integers(-3, 4, (2, 3, 2)).astype(np.float32)
C = _rng.integers(-3, 4, (2, 3, 1)).astype(np.float32)
TABLE = _rng.standard_normal((5, 3)).astype(np.float32)
TABLE3 = _rng.standard_normal((4, 2, 3)).astype(np.float32)


def T(arr, batch=0, input=0):
    return oc.tensor(arr, batch=batch, input=input)


STRUCTURAL = [
    ("take_vector_ids", lambda: oc.take(T(TABLE), T(np.array([4, 0, 2], np.int32))), TABLE[[4, 0, 2]]),
    ("take_batch_ids", lambda: oc.take(T(TABLE), T(np.array([[4, 0], [1, 1]], np.int32), batch=1)),
     TABLE[np.array([[4, 0], [1, 1]])]),
    ("take_float_ids", lambda: oc.take(T(TABLE), T(np.array([3.0, 1.0], np.float32))), TABLE[[3, 1]]),
    ("take_table_with_input_axes", lambda: oc.take(T(TABLE3, input=1), T(np.array([1, 3], np.int32))),
     TABLE3[[1, 3]]),
    ("take_scalar_id", lambda: oc.take(T(TABLE), T(np.array(2, np.int32))), TABLE[2]),
    ("take_then_ops", lambda: oc.relu(oc.take(T(TABLE), T(np.array([0, 1], np.int32))) * 2),
     np.maximum(TABLE[[0, 1]] * 2, 0)),
    ("concat_pair", lambda: oc.concat("a; b => a^b", [T(A[0, 0]), T(B[0, 0])]), np.concatenate([A[0, 0], B[0, 0]])),
    ("concat_three_last_axis", lambda: oc.concat(
        "...|..o.., a; ...|..o.., b; ...|..o.., c => ...|..o.., a^b^c", [T(A, batch=1), T(B, batch=1), T(C, batch=1)]),
     np.concatenate([A, B, C], -1)),
    ("concat_first_axis", lambda: oc.concat("a, ...; b, ... => a^b, ...", [T(A[0]), T(A[1])]),
     np.concatenate([A[0], A[1]], 0)),
    ("concat_batch_axis", lambda: oc.concat("a, ...|...; b, ...|... => a^b, ...|...", [T(A, batch=1), T(A[:1], batch=1)]),
     np.concatenate([A, A[:1]], 0)),
    ("concat_input_axis", lambda: oc.concat("a->...; b->... => a^b->...", [T(A[0], input=1), T(B[0], input=1)]),
     np.concatenate([A[0], B[0]], -1)),
    ("concat_middle_axis", lambda: oc.concat("x, a, y; x, b, y => x, a^b, y",
                                             [T(A.transpose(0, 2, 1)), T(B.transpose(0, 2, 1))]),
     np.concatenate([A.transpose(0, 2, 1), B.transpose(0, 2, 1)], 1)),
    ("concat_negated", lambda: oc.concat("i; j => i^j", [T(A[0, 0]), T(B[0, 0])], negated=True),
     -np.concatenate([A[0, 0], B[0, 0]])),
    ("stack_output", lambda: oc.stack([T(A), T(A + 1)]), np.stack([A, A + 1])),
    ("stack_output_after_batch", lambda: oc.stack([T(A, batch=1), T(A * 2, batch=1)]), np.stack([A, A * 2], 1)),
    ("stack_batch", lambda: oc.stack([T(A[0]), T(A[1]), T(A[0])], kind="batch"), np.stack([A[0], A[1], A[0]])),
    ("stack_input", lambda: oc.stack([T(A[0]), T(A[1])], kind="input"), np.stack([A[0], A[1]], -1)),
    ("stack_one", lambda: oc.stack([T(A[0])]), A[0][None]),
    ("interleave_vectors", lambda: oc.interleave(T(A[0, 0]), T(B[0, 0].repeat(2))),
     np.stack([A[0, 0], B[0, 0].repeat(2)], -1).ravel()),
    ("interleave_batched", lambda: oc.interleave(T(A, batch=1), T(A + 10, batch=1)),
     np.stack([A, A + 10], -1).reshape(2, 3, 8)),
    ("interleave_with_input_axes", lambda: oc.interleave(T(A[0], input=1), T(A[1], input=1)),
     np.stack([A[0], A[1]], 1).reshape(6, 4)),
    ("deinterleave_even", lambda: oc.deinterleave_even(T(A, batch=1)), A[..., 0::2]),
    ("deinterleave_odd", lambda: oc.deinterleave_odd(T(A, batch=1)), A[..., 1::2]),
    ("deinterleave_of_interleave", lambda: oc.deinterleave_odd(oc.interleave(T(A[0]), T(A[1]))), A[1]),
]


@pytest.mark.parametrize("name,build,expected", STRUCTURAL, ids=[c[0] for c in STRUCTURAL])
def test_structural_op(name, build, expected):
    y = build()
    actual = y.numpy()
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)


# -- ops given an einsum spec, the same operand twice ----------------------------------------------


SPEC_VARIANTS = [
    ("relu_transpose", lambda a, b: oc.relu(a, spec="ij=>ji"), lambda a, b: np.maximum(a, 0).T),
    ("exp_reduce", lambda a, b: oc.exp(a, spec="ij=>i"), lambda a, b: np.exp(a).sum(1)),
    ("mul_matmul", lambda a, b: oc.mul(a, b, spec="ij;jk=>ik"), lambda a, b: a @ b),
    ("add_outer", lambda a, b: oc.add(a, b, spec="ij;kj=>ikj"), lambda a, b: a[:, None, :] + b[None, :, :]),
    ("sub_total", lambda a, b: oc.sub(a, b, spec="ij;ij=>0"), lambda a, b: np.array([(a - b).sum()])),
    ("where_transpose", lambda a, b: oc.where(a > 0, a, b, spec="ij;ij;ij=>ji"), lambda a, b: np.where(a > 0, a, b).T),
]


@pytest.mark.parametrize("name,fn,ref", SPEC_VARIANTS, ids=[v[0] for v in SPEC_VARIANTS])
def test_op_with_spec(name, fn, ref):
    """Every pointwise op takes ``spec=``: its operands are then related by that einsum, and the
    axes absent from the result are summed."""
    check_op(fn, ref, [((), (3, 3), ()), ((), (3, 3), ())])


SAME_OPERAND = [
    ("x*x", lambda x: x * x, lambda x: x * x),
    ("x@x", lambda x: x @ x, lambda x: np.einsum("ij,jk->ik", x, x)),
    ("einsum_transposed", lambda x: oc.einsum("j->i; i->j => j->i", x, x), lambda x: x * x.T),
    ("x-x.max()", lambda x: x - x.max(), lambda x: x - x.max()),
]


@pytest.mark.parametrize("name,fn,ref", SAME_OPERAND, ids=[v[0] for v in SAME_OPERAND])
def test_same_operand_twice(name, fn, ref):
    """One tensor read twice by one op, possibly through different projections."""
    check_op(fn, ref, [((), (4,), (4,))])


def test_max_of_negative_values_starts_from_minus_infinity():
    check_op(lambda x: (-x - 1).max(), lambda x: (-x - 1).max(), [BOI], "pos")
    check_op(lambda x: (-x - 1).max(axes="batch"), lambda x: (-x - 1).max(axis=0), [BOI], "pos")


# -- random broadcasting layouts ------------------------------------------------------------------


@st.composite
def broadcast_pair(draw):
    """Two ``(batch, output, input)`` shapes that broadcast kind by kind: per kind a result row,
    and each operand a suffix of it with some dims replaced by 1."""
    shapes: list[list[tuple[int, ...]]] = [[], []]
    for _ in range(3):
        row = draw(st.lists(st.integers(1, 3), max_size=2))
        for s in shapes:
            n = draw(st.integers(0, len(row)))
            suffix = row[len(row) - n:]
            s.append(tuple(1 if draw(st.booleans()) else d for d in suffix))
    return tuple(shapes[0]), tuple(shapes[1])


RANDOM_BINARY = [b for b in BINARY if b[0] != "pow"]


@settings(max_examples=60, deadline=None)
@given(broadcast_pair(), st.sampled_from(range(len(RANDOM_BINARY))), st.integers(0, 1000))
def test_random_broadcasting(shapes, op_index, seed):
    ocannl.session.reset()
    name, fn, ref, domains = RANDOM_BINARY[op_index]
    rng = np.random.default_rng(seed)
    arrays = [sample(full_dims(s), d, rng) for s, d in zip(shapes, domains)]
    ranks = tuple(len(r) for r in result_shape(shapes))
    y = fn(*(oc.tensor(x, batch=len(s[0]), input=len(s[2])) for x, s in zip(arrays, shapes)))
    expected = ref(*(broadcast_to_kinds(x, s, ranks).astype(np.float64) for x, s in zip(arrays, shapes)))
    ctx = oc.Context("interp")
    ctx.compile(y).run()
    actual = ctx.get(y.value)
    assert actual.shape == np.shape(expected), (name, shapes)
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL * max(1.0, np.abs(expected).max(initial=0)))
