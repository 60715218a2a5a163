"""Projections: the loops of one operation and how each axis is indexed (docs/shapes.md, "Projections").

Projections are compared in a normalized form: the product-space loops are named ``L0, L1, ...``
in product-space order, an index symbol by its name, a fixed index by its int, and an affine index
as ``(((coeff, loop), ...), offset)``.
"""

import numpy as np

import ocannl as oc
from ocannl.lowlevel.indexing import Affine, Fixed, IndexSymbol, Iter


def T(batch=(), output=(), input=()):
    arr = np.zeros(tuple(batch) + tuple(output) + tuple(input), dtype=np.float32)
    return oc.tensor(arr, batch=len(batch), input=len(input))


def normalized(t):
    """``(product_space, project_lhs, project_rhs)`` of ``t``'s op, with loops named by position."""
    p = t.projections()
    names = {sym: f"L{k}" for k, sym in enumerate(p.product_iterators)}

    def name(sym):
        return sym.name if isinstance(sym, IndexSymbol) else names[sym]

    def idx(i):
        if isinstance(i, Fixed):
            return i.index
        if isinstance(i, Iter):
            return name(i.symbol)
        assert isinstance(i, Affine)
        return (tuple((c, name(s)) for c, s in i.terms), i.offset)

    assert p.lhs_dims == t.dims
    assert p.rhs_dims == tuple(o.dims for o in t.operands)
    return p.product_space, tuple(map(idx, p.project_lhs)), tuple(tuple(map(idx, r)) for r in p.project_rhs)


def test_compose_matmul_reduces_over_the_contracted_axis():
    w = oc.param("w", output=2, input=3)
    x = T(batch=[5], output=[3])
    y = w @ x
    space, lhs, rhs = normalized(y)
    assert space == (5, 2, 3)
    assert lhs == ("L0", "L1")
    assert rhs == (("L1", "L2"), ("L0", "L2"))
    p = y.projections()
    assert p.reduction_iterators() == (p.product_iterators[2],)


def test_einsum_matmul():
    """`ij;jk=>ik`: `for i,k,j: c[i,k] += a[i,j]*b[j,k]`."""
    c = oc.einsum("ij;jk=>ik", T(output=[2, 3]), T(output=[3, 4]))
    space, lhs, rhs = normalized(c)
    assert space == (2, 4, 3)
    assert lhs == ("L0", "L1")
    assert rhs == (("L0", "L2"), ("L2", "L1"))
    assert len(c.projections().reduction_iterators()) == 1


def test_batched_compose_broadcasts_batch_of_size_one():
    a = T(batch=[1], output=[4], input=[5])
    b = T(batch=[6], output=[5], input=[3])
    space, lhs, rhs = normalized(a @ b)
    assert space == (6, 4, 3, 5)
    assert lhs == ("L0", "L1", "L2")
    assert rhs == ((0, "L1", "L3"), ("L0", "L3", "L2"))


def test_broadcast_add_reads_size_one_axes_at_zero():
    s = T(output=[3, 1]) + T(output=[1, 4])
    space, lhs, rhs = normalized(s)
    assert space == (3, 4)
    assert lhs == ("L0", "L1")
    assert rhs == (("L0", 0), (0, "L1"))


def test_broadcast_add_of_lower_rank_operand_and_scalar():
    x = T(batch=[2], output=[3])
    s = x + T(output=[3]) + 1.0
    space, lhs, rhs = normalized(s)
    assert space == (2, 3)
    assert lhs == ("L0", "L1")
    assert rhs == (("L0", "L1"), ())
    inner = s.operands[0]
    assert normalized(inner)[2] == (("L0", "L1"), ("L1",))


def test_size_one_result_axis_is_not_a_loop():
    s = T(output=[1, 4]) * T(output=[1, 4])
    space, lhs, rhs = normalized(s)
    assert space == (4,)
    assert lhs == (0, "L0")
    assert rhs == ((0, "L0"), (0, "L0"))


def test_padded_conv_with_stride_is_affine_with_negative_left_pad():
    """Padded (`=+`) conv, stride 2, kernel 3: `x[b, 2*oh + kh - 1, ic]` (left pad (3-1)//2 = 1)."""
    spec = "... | 2*oh=+kh, ..ic..; kh, ..ic.. -> ..oc.. => ... | oh, ..oc.."
    x = T(batch=[2], output=[6, 1])
    k = oc.param("k", output=4, input=(3, 1))
    y = oc.einsum(spec, x, k)
    assert y.dims == (2, 3, 4)
    space, lhs, rhs = normalized(y)
    assert space == (2, 3, 4, 3)
    assert lhs == ("L0", "L1", "L2")
    assert rhs == (("L0", (((2, "L1"), (1, "L3")), -1), 0),
                   ("L2", "L3", 0))


def test_valid_conv_with_stride_has_no_offset():
    y = oc.einsum("2*o<+k; k => o", T(output=[9]), T(output=[3]))
    space, lhs, rhs = normalized(y)
    assert space == (4, 3)
    assert lhs == ("L0",)
    assert rhs == (((((2, "L0"), (1, "L1")), 0),), ("L1",))


def test_padded_conv_with_dilation_pads_by_half_the_dilated_span():
    """Unlike the original: left pad = (dilation*(k-1))//2 = 2 for dilation 2, kernel 3."""
    y = oc.einsum("1*o=+2*k; k => o", T(output=[5]), T(output=[3]))
    assert normalized(y)[2] == (((((1, "L0"), (2, "L1")), -2),), ("L1",))


def test_strided_axis_with_offset():
    y = oc.einsum("2*o+1 => o", T(output=[6]))
    space, lhs, rhs = normalized(y)
    assert space == (3,)
    assert rhs == (((((2, "L0"),), 1),),)


def test_conv2d_padded_same_size():
    """A padded 3x3 conv2d: `x[b, oh+kh-1, ow+kw-1, ic] * k[oc, kh, kw, ic]`."""
    spec = "... | 1*oh=+kh, 1*ow=+kw, ..ic..; kh, kw, ..ic.. -> ..oc.. => ... | oh, ow, ..oc.."
    y = oc.einsum(spec, T(batch=[2], output=[5, 5, 1]), oc.param("k", output=4, input=(3, 3, 1)))
    space, lhs, rhs = normalized(y)
    assert space == (2, 5, 5, 4, 3, 3)
    assert lhs == ("L0", "L1", "L2", "L3")
    assert rhs == (("L0", (((1, "L1"), (1, "L4")), -1), (((1, "L2"), (1, "L5")), -1), 0),
                   ("L3", "L4", "L5", 0))


def test_result_fixed_index():
    """`i=>i2`: the result is written at column 2 only."""
    r = oc.einsum("i=>i2", T(output=[4]))
    space, lhs, rhs = normalized(r)
    assert r.dims == (4, 3)
    assert space == (4,)
    assert lhs == ("L0", 2)
    assert rhs == (("L0",),)
    assert not r.projections().is_surjective()


def test_operand_fixed_index():
    """`...|i->1; ...|...->i => ...|i`: `c[b,i] += a[b,1,i]*b[b,i,k]` with k of size 1."""
    a = T(batch=[3], output=[2], input=[4])
    b = T(batch=[3], output=[4], input=[1])
    c = oc.einsum("...|i->1; ...|...->i => ...|i", a, b)
    space, lhs, rhs = normalized(c)
    assert space == (3, 4)
    assert lhs == ("L0", "L1")
    assert rhs == (("L0", 1, "L1"), ("L0", "L1", 0))


def test_sum_to_fixed_index_zero():
    r = oc.einsum("...|...->... => 0", T(batch=[2], output=[3], input=[4]))
    space, lhs, rhs = normalized(r)
    assert space == (2, 3, 4)
    assert lhs == (0,)
    assert rhs == (("L0", "L1", "L2"),)
    assert len(r.projections().reduction_iterators()) == 3


def test_diagonal_uses_one_loop_twice():
    d = oc.einsum("i=>ii", T(output=[5]))
    space, lhs, rhs = normalized(d)
    assert space == (5,)
    assert lhs == ("L0", "L0")
    assert rhs == (("L0",),)
    p = d.projections()
    # Not every cell is written once: lowering must keep the zero-initialization.
    assert not (p.is_surjective() and p.is_injective())


def test_permutation_across_kinds():
    """`b|i->o => o|b->i`: `r[o,i,b] = hey[b,o,i]` (memory order batch, output, input)."""
    hey = T(batch=[2], output=[4], input=[3])
    r = oc.einsum("b|i->o => o|b->i", hey)
    space, lhs, rhs = normalized(r)
    assert space == (4, 3, 2)
    assert lhs == ("L0", "L1", "L2")
    assert rhs == (("L2", "L0", "L1"),)


def test_batch_slice_reads_the_index_symbol():
    batch_n = IndexSymbol("batch_n", 80)
    xs = T(batch=[80, 10], output=[2])
    x = xs[batch_n]
    space, lhs, rhs = normalized(x)
    assert space == (10, 2)
    assert lhs == ("L0", "L1")
    assert rhs == (("batch_n", "L0", "L1"),)
    assert x.projections().project_rhs[0][0] == Iter(batch_n)


def test_attention_scores_reduce_over_d():
    """Attention scores: `s[..., s, h, t] += q[..., s, h, d] * k[..., t, h, d]`."""
    q = T(batch=[2, 5], output=[4, 8])
    k = T(batch=[2, 6], output=[4, 8])
    s = oc.einsum("... s | h d; ... t | h d => ... s | t -> h", q, k)
    space, lhs, rhs = normalized(s)
    assert space == (2, 5, 4, 6, 8)
    assert lhs == ("L0", "L1", "L2", "L3")
    assert rhs == (("L0", "L1", "L2", "L4"), ("L0", "L3", "L2", "L4"))


def test_same_tensor_indexed_two_ways():
    """`einsum("ij;ji=>ij", a, a)` indexes the two uses of `a` differently."""
    a = T(output=[3, 3])
    r = oc.einsum("ij;ji=>ij", a, a)
    assert normalized(r)[2] == (("L0", "L1"), ("L1", "L0"))
