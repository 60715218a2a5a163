"""Einsum values computed by the interpreter: the worked examples of docs/shapes.md and the einsum
tests of the original (trivia, accumulation semantics, tensor puzzles).

* random valid specs (one to three operands, output axes only, ``batch|output``, or
  ``batch|input->output``, labels repeated inside an operand allowed) against ``numpy.einsum``,
  with each shape's axes listed in ocannl's memory order (batch, output, input);
* ``outer_sum``, ``einmax`` and ``tropical`` against a numpy reference that broadcasts every
  operand over the whole label space and reduces the labels absent from the result;
* the worked examples of the spec with the values given there;
* fixed-index and diagonal results: the cells not written keep the neutral element.

Data are small integers, so every sum is exact in float32 and results are compared exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ocannl as oc
import ocannl.session

LETTERS = "abcdefg"


def compute(t: oc.Tensor, **bindings) -> np.ndarray:
    ctx = oc.Context("interp")
    ctx.compile(t).run(**bindings)
    return ctx.get(t.value)


def arange(shape, batch: int = 0, input: int = 0, offset: float = 0.0) -> oc.Tensor:
    """The spec's ``range_of_shape``: each cell holds its row-major offset (memory order)."""
    arr = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + offset
    return oc.tensor(arr, batch=batch, input=input)


# -- random specs ---------------------------------------------------------------------------------


@st.composite
def einsum_case(draw, n_operands, mode: str, repeats: bool = True):
    """``(operands, result, sizes)``; each operand and the result is a ``(batch, output, input)``
    triple of label strings. ``mode``: ``output`` (output axes only), ``batch`` (``b|o``) or
    ``kinds`` (``b|i->o``)."""
    labels = draw(st.lists(st.sampled_from(LETTERS), min_size=1, max_size=5, unique=True))
    sizes = {c: draw(st.integers(1, 4)) for c in labels}
    n = draw(n_operands)

    def split(axes: str) -> tuple[str, str, str]:
        if mode == "output":
            return ("", axes, "")
        cut1 = draw(st.integers(0, len(axes)))
        if mode == "batch":
            return (axes[:cut1], axes[cut1:], "")
        cut2 = draw(st.integers(cut1, len(axes)))
        return (axes[:cut1], axes[cut1:cut2], axes[cut2:])

    operands = []
    for _ in range(n):
        if repeats:
            axes = "".join(draw(st.lists(st.sampled_from(labels), min_size=0, max_size=4)))
        else:
            axes = "".join(draw(st.lists(st.sampled_from(labels), min_size=0, max_size=4, unique=True)))
        operands.append(split(axes))
    used = sorted({c for b, o, i in operands for c in b + o + i})
    result_axes = "".join(draw(st.permutations(used)))[:draw(st.integers(0, len(used)))]
    seed = draw(st.integers(0, 2**16))
    return operands, split(result_axes), sizes, seed


def spec_text(shape: tuple[str, str, str], mode: str) -> str:
    batch, output, input = shape
    if mode == "output":
        return output or "->"  # an empty output-only spec is written `->`
    if mode == "batch":
        return f"{batch}|{output}"
    return f"{batch}|{input}->{output}"


def memory_order(shape: tuple[str, str, str]) -> str:
    batch, output, input = shape
    return batch + output + input


def make_operands(operands, sizes, seed):
    rng = np.random.default_rng(seed)
    arrays, tensors = [], []
    for b, o, i in operands:
        arr = rng.integers(-3, 4, tuple(sizes[c] for c in b + o + i)).astype(np.float32)
        arrays.append(arr)
        tensors.append(oc.tensor(arr, batch=len(b), input=len(i)))
    return arrays, tensors


def full_space_reference(combine, reduce, subscripts: list[str], arrays, result: str, sizes) -> np.ndarray:
    """Broadcast every operand over all the labels (a label repeated in an operand reads its
    diagonal), ``combine`` them, ``reduce`` the labels absent from ``result``."""
    labels = sorted(set("".join(subscripts)))
    expanded = []
    for subs, arr in zip(subscripts, arrays):
        uniq = "".join(dict.fromkeys(subs))
        ordered = "".join(c for c in labels if c in uniq)
        d = np.einsum(f"{subs}->{ordered}", arr.astype(np.float64))
        expanded.append(d.reshape([sizes[c] if c in uniq else 1 for c in labels]))
    full = np.broadcast_to(combine(*expanded), [sizes[c] for c in labels])
    reduced = tuple(k for k, c in enumerate(labels) if c not in result)
    r = reduce(full, axis=reduced) if reduced else full
    kept = "".join(c for c in labels if c in result)
    return np.einsum(f"{kept}->{result}", r)


def check_case(op: str, case, mode: str) -> None:
    operands, result, sizes, seed = case
    ocannl.session.reset()
    spec = "; ".join(spec_text(s, mode) for s in operands) + " => " + spec_text(result, mode)
    arrays, tensors = make_operands(operands, sizes, seed)
    subs = [memory_order(s) for s in operands]
    res = memory_order(result)
    if op == "einsum":
        y = oc.einsum(spec, *tensors)
        expected = np.einsum(",".join(subs) + "->" + res, *(a.astype(np.float64) for a in arrays))
    else:
        fn, combine, reduce = {
            "outer_sum": (oc.outer_sum, np.add, np.sum),
            "einmax": (oc.einmax, lambda a: a, np.max),
            "tropical": (oc.tropical, np.add, np.max),
        }[op]
        y = fn(spec, *tensors)
        expected = full_space_reference(combine, reduce, subs, arrays, res, sizes)
    actual = compute(y)
    assert actual.shape == expected.shape, spec
    np.testing.assert_array_equal(actual, expected, err_msg=spec)


@settings(max_examples=120, deadline=None)
@given(einsum_case(st.integers(1, 3), "output"))
def test_random_einsum_output_axes(case):
    check_case("einsum", case, "output")


@settings(max_examples=100, deadline=None)
@given(einsum_case(st.integers(1, 3), "batch"))
def test_random_einsum_with_batch(case):
    check_case("einsum", case, "batch")


@settings(max_examples=80, deadline=None)
@given(einsum_case(st.integers(1, 3), "kinds"))
def test_random_einsum_all_kinds(case):
    check_case("einsum", case, "kinds")


@settings(max_examples=60, deadline=None)
@given(einsum_case(st.just(2), "batch"))
def test_random_outer_sum(case):
    check_case("outer_sum", case, "batch")


@settings(max_examples=60, deadline=None)
@given(einsum_case(st.just(1), "kinds"))
def test_random_einmax(case):
    check_case("einmax", case, "kinds")


@settings(max_examples=60, deadline=None)
@given(einsum_case(st.just(2), "batch"))
def test_random_tropical(case):
    check_case("tropical", case, "batch")


def test_random_float_data_within_tolerance():
    """Non-integer data: float32 sums in the interpreter's loop order, within 1e-6 relative of
    numpy's float64 result (a matmul of 7-term dot products)."""
    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((3, 5, 7)).astype(np.float32), rng.standard_normal((7, 4)).astype(np.float32)
    y = oc.einsum("b|ij;jk=>b|ik", oc.tensor(A, batch=1), oc.tensor(B))
    expected = np.einsum("bij,jk->bik", A.astype(np.float64), B.astype(np.float64))
    np.testing.assert_allclose(compute(y), expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())


# -- worked examples -----------------------------------------------------------------------------


def test_ex1_matmul():
    a, b = arange((2, 3)), arange((3, 4))
    y = oc.einsum("ij;jk=>ik", a, b)
    np.testing.assert_array_equal(compute(y), np.arange(6.0).reshape(2, 3) @ np.arange(12.0).reshape(3, 4))


def test_ex2_batched_matmul():
    """``b|h->o; b|i->h => b|i->o`` on ``2|4->5`` and ``2|3->4``: ``2|3->5``."""
    x, y = arange((2, 5, 4), batch=1, input=1), arange((2, 4, 3), batch=1, input=1)
    r = oc.einsum("b|h->o; b|i->h => b|i->o", x, y)
    assert (r.shape.batch, r.shape.input, r.shape.output) == ((2,), (3,), (5,))
    X, Y = np.arange(40.0).reshape(2, 5, 4), np.arange(24.0).reshape(2, 4, 3)
    np.testing.assert_array_equal(compute(r), np.einsum("boh,bhi->boi", X, Y))


def test_ex3_permutation():
    """``hey ++ "b|i->o => o|b->i"`` on ``2|3->4``: ``4|2->3`` with ``r[o,i,b] = hey[b,o,i]``."""
    r = oc.einsum("b|i->o => o|b->i", arange((2, 4, 3), batch=1, input=1))
    assert (r.shape.batch, r.shape.input, r.shape.output) == ((4,), (2,), (3,))
    np.testing.assert_array_equal(compute(r), np.arange(24.0).reshape(2, 4, 3).transpose(1, 2, 0))


def test_ex4_reduction():
    r = oc.einsum("b|i->o => b|i", arange((2, 4, 3), batch=1, input=1))
    assert (r.shape.batch, r.shape.output, r.shape.input) == ((2,), (3,), ())
    np.testing.assert_array_equal(compute(r), [[18, 22, 26], [66, 70, 74]])


def test_ex5_sum_everything_into_cell_0():
    r = oc.einsum("...|...->... => 0", arange((2, 3, 4), batch=1, input=1))
    assert r.dims == (1,)
    np.testing.assert_array_equal(compute(r), [276.0])


def test_ex6_fixed_index_and_row_variables():
    a, b = arange((3, 2, 4), batch=1, input=1), arange((3, 4, 1), batch=1, input=1)
    r = oc.einsum("...|i->1; ...|...->i => ...|i", a, b)
    assert (r.shape.batch, r.shape.output, r.shape.input) == ((3,), (4,), ())
    np.testing.assert_array_equal(compute(r), [[0, 5, 12, 21], [48, 65, 84, 105], [160, 189, 220, 253]])


def test_ex7_outer_product():
    a, b = arange((2,)), arange((3,))
    r = oc.einsum("i; j => i->j", a + 1, b)
    assert (r.shape.input, r.shape.output) == ((2,), (3,))
    np.testing.assert_array_equal(compute(r), [[0, 0], [1, 2], [2, 4]])


def test_ex8_diagonal_write_leaves_zeros():
    r = oc.einsum("i=>ii", arange((5,)))
    np.testing.assert_array_equal(compute(r), np.diag(np.arange(5.0)))


def test_ex8_diagonal_write_with_negative_values():
    """Off-diagonal cells are the sum's neutral 0 even where every value is negative."""
    r = oc.einsum("i=>ii", arange((3,), offset=-10.0))
    np.testing.assert_array_equal(compute(r), np.diag(np.arange(3.0) - 10))


def test_ex9_attention_scores():
    rng = np.random.default_rng(9)
    Q, K = rng.integers(-3, 4, (2, 3, 2, 4)).astype(np.float32), rng.integers(-3, 4, (2, 5, 2, 4)).astype(np.float32)
    q, k = oc.tensor(Q, batch=2), oc.tensor(K, batch=2)
    s = oc.einsum(" ... s | h d; ... t | h d => ... s | t -> h", q, k)
    assert (s.shape.batch, s.shape.output, s.shape.input) == ((2, 3), (2,), (5,))
    np.testing.assert_array_equal(compute(s), np.einsum("bshd,bthd->bsht", Q, K))


def test_ex10_attention_output():
    rng = np.random.default_rng(10)
    W, V = rng.integers(-3, 4, (2, 3, 2, 5)).astype(np.float32), rng.integers(-3, 4, (2, 5, 2, 4)).astype(np.float32)
    w, v = oc.tensor(W, batch=2, input=1), oc.tensor(V, batch=2)
    o = oc.einsum(" ... s | t -> h; ... t | h e => ... s | h e", w, v)
    np.testing.assert_array_equal(compute(o), np.einsum("bsht,bthe->bshe", W, V))


def test_ex16_global_sum_pool():
    x = arange((2, 3, 4, 2), batch=1)
    r = oc.einsum("... | h, w, ..c.. => ... | 0, 0, ..c..", x)
    assert r.dims == (2, 1, 1, 2)
    np.testing.assert_array_equal(compute(r), np.arange(48.0).reshape(2, 3, 4, 2).sum(axis=(1, 2), keepdims=True))


def test_ex17_static_batch_index():
    x = arange((5, 2, 3, 4), batch=2, input=1)
    r = oc.einsum("2...|...->... => ...|...->...", x)
    assert r.dims == (2, 3, 4)
    np.testing.assert_array_equal(compute(r), np.arange(120.0).reshape(5, 2, 3, 4)[2])


def test_ex18_permutation_across_kinds():
    """``ab|cd->ef => cf|ae->db`` on ``[2,3]|[4,5]->[6,7]``: ``[4,7]|[2,6]->[5,3]``."""
    x = arange((2, 3, 6, 7, 4, 5), batch=2, input=2)
    r = oc.einsum("ab|cd->ef => cf|ae->db", x)
    assert (r.shape.batch, r.shape.input, r.shape.output) == ((4, 7), (2, 6), (5, 3))
    X = np.arange(float(2 * 3 * 4 * 5 * 6 * 7)).reshape(2, 3, 6, 7, 4, 5)
    np.testing.assert_array_equal(compute(r), np.einsum("abefcd->cfdbae", X))


# -- the original's einsum tests ------------------------------------------------------------------


def test_item3_batched_compose_like_einsums():
    X, Y = np.arange(24.0).reshape(2, 4, 3), np.arange(40.0).reshape(2, 5, 4)  # 2|3->4, 2|4->5
    x, y = oc.tensor(X, batch=1, input=1), oc.tensor(Y, batch=1, input=1)
    r1 = oc.einsum("a|i->h; b|h->o => ab|i->o", x, y)
    assert (r1.shape.batch, r1.shape.input, r1.shape.output) == ((2, 2), (3,), (5,))
    np.testing.assert_array_equal(compute(r1), np.einsum("ahi,boh->aboi", X, Y))
    ocannl.session.reset()
    x, y = oc.tensor(X, batch=1, input=1), oc.tensor(Y, batch=1, input=1)
    r2 = oc.einsum("b|i->h; b|h->o => i->o", x, y)
    assert (r2.shape.batch, r2.shape.input, r2.shape.output) == ((), (3,), (5,))
    np.testing.assert_array_equal(compute(r2), np.einsum("bhi,boh->oi", X, Y))


def test_item4_fixed_index_result_writes_one_column():
    """``i=>i0`` closes the fixed axis to 1; fixed larger by another use (``i=>i2``, or an einsum
    equating it with 3), the columns not written keep 0."""
    r = oc.einsum("i=>i0", arange((4,)))
    np.testing.assert_array_equal(compute(r), np.arange(4.0)[:, None])
    ocannl.session.reset()
    r = oc.einsum("i=>i2", arange((4,)))
    expected = np.zeros((4, 3))
    expected[:, 2] = np.arange(4.0)
    np.testing.assert_array_equal(compute(r), expected)
    ocannl.session.reset()
    r = oc.einsum("i=>i0", arange((4,), offset=1.0))
    z = oc.einsum("ij;ij=>ij", r, oc.tensor(np.ones((4, 3), np.float32)))
    expected = np.zeros((4, 3))
    expected[:, 0] = np.arange(4.0) + 1
    np.testing.assert_array_equal(compute(z), expected)


def test_item4_max_fixed_index_keeps_minus_infinity():
    """An einmax result written at a fixed index keeps the max's neutral element elsewhere."""
    r = oc.einmax("ij=>i1", arange((2, 3)))
    np.testing.assert_array_equal(compute(r), [[-np.inf, 2.0], [-np.inf, 5.0]])


def test_item5_tensor_puzzles():
    r4 = arange((4,))
    np.testing.assert_array_equal(compute(r4 * 0.0 + 1), [1, 1, 1, 1])  # ones
    np.testing.assert_array_equal(compute(oc.einsum("i => 0", r4)), [6])  # sum
    outer = oc.einsum("i; j => i->j", arange((3,)), arange((4,)))
    np.testing.assert_array_equal(compute(outer).ravel(), [0, 0, 0, 0, 1, 2, 0, 2, 4, 0, 3, 6])
    diag = oc.einsum("ii => i", arange((3, 3)))
    np.testing.assert_array_equal(compute(diag), [0, 4, 8])
    a = oc.tensor(np.array([-1.0, 0.0, 2.0], np.float32))
    b = oc.tensor(np.full(3, 5.0, np.float32))
    heaviside = oc.where(a == 0, b, oc.where(0 < a, 1, 0))
    np.testing.assert_array_equal(compute(heaviside), [0, 5, 1])


def _ranges(n_out: int, n_in: int):
    """``range n_out`` as an output axis and ``range n_in`` as an input axis: pointwise ops on
    them build selector matrices ``m[o, i]``."""
    return arange((n_out,)), oc.tensor(np.arange(n_in, dtype=np.float32)[None, :], input=1)


def test_item6_tensor_puzzle_workarounds():
    row, col = _ranges(3, 3)  # row: output i, col: input j
    np.testing.assert_array_equal(compute(oc.einsum("i=>ii", oc.tensor(np.ones(3, np.float32)))).ravel(),
                                  [1, 0, 0, 0, 1, 0, 0, 0, 1])  # eye
    np.testing.assert_array_equal(compute(col >= row).ravel(), [1, 1, 1, 0, 1, 1, 0, 0, 1])  # triu
    ocannl.session.reset()
    a = oc.tensor(np.array([1.0, 2.0, 3.0, 4.0], np.float32))
    row, col = _ranges(4, 4)
    tril = col <= row  # tril[i, j] = j <= i
    np.testing.assert_array_equal(compute(oc.einsum("j->i; j => i", tril, a)), [1, 3, 6, 10])  # cumsum
    flip = oc.einsum("j->i; j => i", (row + col) == 3, a)
    np.testing.assert_array_equal(compute(flip), [4, 3, 2, 1])
    roll = oc.einsum("j->i; j => i", (col == row + 1) + (col == row - 3), a)
    np.testing.assert_array_equal(compute(roll), [2, 3, 4, 1])
    np.testing.assert_array_equal(compute(2 + arange((5,)) * 2), [2, 4, 6, 8, 10])  # linspace
    ocannl.session.reset()
    x = oc.tensor(np.array([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]], np.float32))
    ri = oc.tensor(np.arange(2, dtype=np.float32), batch=1)
    rj = oc.tensor(np.arange(3, dtype=np.float32)[None, :], input=1)
    rk = arange((6,))
    selector = rk == ri * 3 + rj  # batch i, output k, input j
    flat = oc.einsum("i|j->k; ij => k", selector, x)
    np.testing.assert_array_equal(compute(flat), [10, 20, 30, 40, 50, 60])  # flatten


@pytest.mark.skipif(not hasattr(oc, "concat"), reason="oc.concat not available yet")
def test_item6_pad_and_vstack_by_concat():
    a = oc.tensor(np.array([1.0, 2.0, 3.0], np.float32))
    z = oc.tensor(np.zeros(2, np.float32))
    np.testing.assert_array_equal(compute(oc.concat("i; j => i^j", [a, z])), [1, 2, 3, 0, 0])
    ocannl.session.reset()
    b = oc.tensor(np.array([10.0, 20.0, 30.0], np.float32))
    np.testing.assert_array_equal(compute(oc.concat("i; j => i^j", [arange((3,)), b])), [0, 1, 2, 10, 20, 30])


@pytest.mark.skipif(not hasattr(oc, "stack"), reason="oc.stack not available yet")
def test_item5_repeat_by_stack():
    r = arange((3,))
    np.testing.assert_array_equal(compute(oc.stack([r, r, r])).ravel(), [0, 1, 2, 0, 1, 2, 0, 1, 2])


@pytest.mark.skipif(not hasattr(oc, "interleave"), reason="oc.interleave not available yet")
def test_ex15_interleave():
    a = oc.tensor(np.array([1.0, 2.0, 3.0], np.float32))
    b = oc.tensor(np.array([4.0, 5.0, 6.0], np.float32))
    np.testing.assert_array_equal(compute(oc.interleave(a, b)), [1, 4, 2, 5, 3, 6])


# -- fixed indices in operands ---------------------------------------------------------------------


@pytest.mark.parametrize("spec,ref", [
    ("ij => i0", lambda X: X.sum(axis=1)[:, None]),
    ("i1 => i", lambda X: X[:, 1]),
    ("2j => j", lambda X: X[2]),
    ("ij => 0j", lambda X: X.sum(axis=0)[None, :]),
    ("ii => 0", lambda X: np.array([np.trace(X)])),
    ("ij => ji", lambda X: X.T),
])
def test_fixed_and_repeated_indices(spec, ref):
    X = np.arange(9.0).reshape(3, 3)
    np.testing.assert_array_equal(compute(oc.einsum(spec, oc.tensor(X))), ref(X))
