"""Shape inference through the public API (docs/shapes.md), with its worked examples.

Every case asserts the inferred rows of the result and of the parameters involved. Tensors are
built from numpy arrays of zeros: only their shapes matter here.
"""

import numpy as np

import ocannl as oc
from ocannl import nn


def T(batch=(), output=(), input=(), label=None):
    """A data tensor with the given rows (sizes), zeros inside."""
    arr = np.zeros(tuple(batch) + tuple(output) + tuple(input), dtype=np.float32)
    return oc.tensor(arr, batch=len(batch), input=len(input), label=label)


def rows(t):
    """The finalized rows of ``t`` as ``(batch, output, input)``; also checks ``t.dims``."""
    dims = t.dims
    s = t.shape
    assert dims == s.batch + s.output + s.input
    return s.batch, s.output, s.input


def check(t, batch=(), output=(), input=()):
    assert rows(t) == (tuple(batch), tuple(output), tuple(input)), str(t.shape)


# ---------------------------------------------------------------------------------------------
# Compose (`@`): a's input axes contract with b's output axes.


def test_dense_layer_with_explicit_weight():
    x = T(batch=[10], output=[2])
    w = oc.param("w", output=16, input=2)
    y = w @ x
    check(y, batch=[10], output=[16])
    check(w, output=[16], input=[2])
    check(x, batch=[10], output=[2])


def test_dense_layer_weight_learns_input_from_use():
    x = T(batch=[10], output=[2])
    w = oc.param("w", output=16)
    b = oc.param("b", output=16)
    h = oc.relu(w @ x + b)
    check(h, batch=[10], output=[16])
    check(w, output=[16], input=[2])
    check(b, output=[16])


def test_bias_learns_output_from_addition():
    x = T(batch=[10], output=[2])
    w = oc.param("w", output=16)
    b = oc.param("b")
    h = w @ x + b
    check(h, batch=[10], output=[16])
    check(b, output=[16])
    check(w, output=[16], input=[2])


def test_batched_compose():
    a = T(batch=[3], output=[4], input=[5])
    b = T(batch=[3], output=[5], input=[2])
    check(a @ b, batch=[3], output=[4], input=[2])


def test_compose_broadcasts_batch_rows():
    a = T(output=[4], input=[5])
    b = T(batch=[7], output=[5])
    check(a @ b, batch=[7], output=[4])
    c = T(batch=[1], output=[4], input=[5])
    d = T(batch=[6], output=[5], input=[3])
    check(c @ d, batch=[6], output=[4], input=[3])


def test_compose_keeps_right_operand_input_axes():
    a = T(output=[2], input=[3])
    b = T(output=[3], input=[4, 5])
    check(a @ b, output=[2], input=[4, 5])


def test_multi_axis_contraction_param_learns_both_input_axes():
    x = T(batch=[8], output=[4, 5])
    w = oc.param("w", output=3)
    y = w @ x
    check(y, batch=[8], output=[3])
    check(w, output=[3], input=[4, 5])


def test_multi_axis_output_weight():
    x = T(batch=[8], output=[4])
    w = oc.param("w", output=(2, 3))
    check(w @ x, batch=[8], output=[2, 3])
    check(w, output=[2, 3], input=[4])


def test_param_learns_output_and_input_from_use():
    """`[1, 2] + (w @ [3, 4, 5])` infers w as input [3], output [2]."""
    w = oc.param("w")
    y = T(output=[2]) + (w @ T(output=[3]))
    check(y, output=[2])
    check(w, output=[2], input=[3])


def test_two_layer_chain_learns_every_input():
    x = T(batch=[5], output=[3])
    w1, b1 = oc.param("w1", output=8), oc.param("b1", output=8)
    w2 = oc.param("w2", output=4)
    y = w2 @ oc.relu(w1 @ x + b1)
    check(y, batch=[5], output=[4])
    check(w1, output=[8], input=[3])
    check(b1, output=[8])
    check(w2, output=[4], input=[8])


def test_param_used_twice_same_dims():
    x = T(batch=[2], output=[6])
    w = oc.param("w", output=6)
    y = w @ (w @ x)
    check(y, batch=[2], output=[6])
    check(w, output=[6], input=[6])


def test_moons_mlp_last_weight_output_learned_from_labels():
    """The moons demo: a 2-16-16-1 MLP; `w_out`'s output comes from the labels."""
    x = T(batch=[10], output=[2])
    y = T(batch=[10], output=[1])
    mlp = nn.mlp(hid_dims=(16, 16), label="mlp")
    margin = y * mlp(x)
    loss = (1 - margin).relu().sum()
    check(loss)
    check(margin, batch=[10], output=[1])
    w1, b1 = mlp.layers[0]
    w2, b2 = mlp.layers[1]
    check(w1, output=[16], input=[2])
    check(b1, output=[16])
    check(w2, output=[16], input=[16])
    check(b2, output=[16])
    check(mlp.w_out, output=[1], input=[16])


# ---------------------------------------------------------------------------------------------
# Pointwise broadcasting: numpy-style, per kind, rows right-aligned.


def test_size_one_dims_broadcast_both_ways():
    check(T(output=[3, 1]) + T(output=[1, 4]), output=[3, 4])


def test_scalar_number_broadcasts():
    x = T(batch=[2], output=[3], input=[4])
    check(2.0 * x, batch=[2], output=[3], input=[4])
    check(x - 1, batch=[2], output=[3], input=[4])
    check(x ** 2, batch=[2], output=[3], input=[4])


def test_different_ranks_right_aligned():
    check(T(output=[4]) + T(output=[3, 4]), output=[3, 4])
    check(T(output=[2, 1, 5]) * T(output=[7, 1]), output=[2, 7, 5])


def test_batch_rows_broadcast_independently_of_output():
    a = T(batch=[5], output=[3])
    b = T(output=[3])
    check(a + b, batch=[5], output=[3])
    check(T(batch=[1], output=[3]) / T(batch=[6], output=[1]), batch=[6], output=[3])


def test_explicit_param_size_one_broadcasts():
    """A user-given 1 broadcasts too (a departure from the original)."""
    x = T(batch=[4], output=[16])
    s = oc.param("s", output=1)
    check(x * s, batch=[4], output=[16])
    check(s, output=[1])


def test_param_learns_dims_from_pointwise_use():
    x = T(batch=[4], output=[3, 5])
    p = oc.param("p")
    check(x * p, batch=[4], output=[3, 5])
    check(p, output=[3, 5])


def test_param_used_twice_with_the_same_size_keeps_it():
    """Two uses of size 3 make the parameter 3 (not the broadcast 1 of two different uses)."""
    p = oc.param("p")
    a = p + T(output=[3])
    b = p * T(batch=[2], output=[3])
    check(a, output=[3])
    check(b, batch=[2], output=[3])
    check(p, output=[3])


def test_param_used_with_two_sizes_becomes_one():
    """Uses that disagree (3 vs 5) make the dim 1, which broadcasts into both."""
    p = oc.param("p")
    a = p + T(output=[2, 3])
    b = p + T(output=[4, 3])
    c = p + T(output=[5, 3])
    check(a, output=[2, 3])
    check(b, output=[4, 3])
    check(c, output=[5, 3])
    check(p, output=[1, 3])


def test_result_broadcast_rank_is_longest_operand():
    """BroadcastRank: the result row has exactly as many axes as its longest operand."""
    a = T(output=[2, 3])
    b = oc.relu(a)
    c = b + T(output=[3])
    check(c, output=[2, 3])
    check(b, output=[2, 3])


def test_comparisons_where_and_unary_functions():
    x = T(batch=[3], output=[4])
    m = x > 0
    check(m, batch=[3], output=[4])
    check(oc.where(m, x, 0.0), batch=[3], output=[4])
    check(oc.where(x < 1, 1, T(output=[1])), batch=[3], output=[4])
    check(oc.exp(oc.tanh(x)).sqrt(), batch=[3], output=[4])
    check(x == x, batch=[3], output=[4])


# ---------------------------------------------------------------------------------------------
# Row variables.


def test_row_variable_at_start_of_row():
    x = T(output=[2, 3, 4])
    check(oc.einsum("...i => i...", x), output=[4, 2, 3])


def test_row_variable_in_the_middle_of_a_row():
    x = T(output=[2, 3, 4, 5])
    r = oc.einsum("a..r..b => b..r..a", x, capture=["r"])
    check(r, output=[5, 3, 4, 2])
    assert r.captured["r"].size == 12
    check(oc.einsum("a..r..b => ba", x), output=[5, 2])


def test_row_variable_at_end_of_row():
    check(oc.einsum("a... => ...", T(output=[2, 3, 4, 5])), output=[3, 4, 5])


def test_row_variable_may_be_empty():
    check(oc.einsum("...a => a", T(output=[5])), output=[5])
    check(oc.einsum("a...b => ab", T(output=[2, 3])), output=[2, 3])


def test_row_variable_moves_axes_across_kinds():
    x = T(batch=[2, 3], output=[4, 5, 6])
    check(oc.einsum("..v..|ijk => ..v..kji", x), output=[2, 3, 6, 5, 4])
    y = T(batch=[2, 3], output=[4], input=[7])
    check(oc.einsum("..v..|i->o => o|i->..v..", y), batch=[4], output=[2, 3], input=[7])


def test_row_variable_shared_between_operands():
    """Capturing `..r..` of `a..r..;..r..b=>ab` on `[2,3,4]` / `[3,4,5]` gives the product 12."""
    r = oc.einsum("a..r..;..r..b=>ab", T(output=[2, 3, 4]), T(output=[3, 4, 5]), capture=["r"])
    check(r, output=[2, 5])
    assert r.captured["r"].size == 12


def test_row_variables_in_every_kind():
    x = T(batch=[2], output=[3], input=[4])
    check(oc.einsum("...|...->... => ...|...->...", x), batch=[2], output=[3], input=[4])
    check(oc.sum(x, axes="batch"), output=[3], input=[4])
    check(x.mean(axes=("output", "input")), batch=[2])


# ---------------------------------------------------------------------------------------------
# Fixed indices.


def test_sum_to_fixed_index_zero_gives_one_axis():
    check(oc.einsum("...|...->... => 0", T(batch=[2], output=[3], input=[4])), output=[1])


def test_result_fixed_index_closes_to_index_plus_one():
    x = T(output=[4])
    check(oc.einsum("i=>i0", x), output=[4, 1])
    check(oc.einsum("i=>i2", x), output=[4, 3])


def test_result_fixed_index_grows_when_an_equation_fixes_it_larger():
    r = oc.einsum("i=>i2", T(output=[4]))
    s = oc.einsum("ij;ij=>ij", r, T(output=[4, 5]))
    check(r, output=[4, 5])
    check(s, output=[4, 5])


def test_result_fixed_index_grows_to_a_larger_fixed_index_read():
    """Written at index 0 but read at index 3 by another einsum: it closes to 4."""
    r = oc.einsum("i=>i0", T(output=[4]))
    s = oc.einsum("i3=>i", r)
    check(r, output=[4, 4])
    check(s, output=[4])


def test_fixed_index_result_of_size_one_broadcasts_later():
    """The original's softmax relies on it: `x - max_k x` with max's axis written at index 0."""
    x = T(batch=[3], output=[5])
    m = oc.einmax("b|i => b|0", x)
    d = x - m
    check(m, batch=[3], output=[1])
    check(d, batch=[3], output=[5])


def test_operand_fixed_index_with_row_variables():
    """`...|i->1; ...|...->i => ...|i` on `3|4->2` and `3|1->4` gives `3|->4`."""
    a = T(batch=[3], output=[2], input=[4])
    b = T(batch=[3], output=[4], input=[1])
    check(oc.einsum("...|i->1; ...|...->i => ...|i", a, b), batch=[3], output=[4])


def test_operand_fixed_index_sets_size_of_unknown_axis():
    """An axis only read at fixed index 2 needs size >= 3: it closes to 3."""
    r = oc.einsum("i=>ij", T(output=[4]))
    s = oc.einsum("i2=>i", r)
    check(r, output=[4, 3])
    check(s, output=[4])


def test_fixed_leftmost_batch_index():
    """`2...|...->... => ...|...->...`: a static slice of the leftmost batch axis."""
    x = T(batch=[5, 3], output=[2], input=[4])
    check(oc.einsum("2...|...->... => ...|...->...", x), batch=[3], output=[2], input=[4])


def test_global_sum_pool_fixed_indices():
    """`... | h, w, ..c.. => ... | 0, 0, ..c..`: a global sum pool to `[1, 1, C]`."""
    x = T(batch=[2], output=[4, 4, 3])
    check(oc.einsum("... | h, w, ..c.. => ... | 0, 0, ..c..", x), batch=[2], output=[1, 1, 3])


# ---------------------------------------------------------------------------------------------
# Convolutions (docs/shapes.md, "Convolution terms").

CONV2D = "... | 1*oh=+kh, 1*ow=+kw, ..ic..; kh, kw, ..ic.. -> ..oc.. => ... | oh, ow, ..oc.."


def test_conv2d_padded_keeps_spatial_size():
    x = T(batch=[2], output=[5, 5, 1])
    k = oc.param("k", output=4, input=(3, 3, 1))
    y = oc.einsum(CONV2D, x, k)
    check(y, batch=[2], output=[5, 5, 4])
    check(k, output=[4], input=[3, 3, 1])


def test_conv2d_valid_shrinks_by_kernel_span():
    x = T(batch=[2], output=[5, 5, 1])
    k = oc.param("k", output=4, input=(3, 3, 1))
    check(oc.einsum(CONV2D.replace("=+", "<+"), x, k), batch=[2], output=[3, 3, 4])


def test_conv2d_padded_with_stride_two():
    x = T(output=[6, 6, 1])
    k = oc.param("k", output=4, input=(3, 3, 1))
    check(oc.einsum(CONV2D.replace("1*", "2*"), x, k), output=[3, 3, 4])


def test_conv_use_padding_argument():
    x = T(output=[5, 5, 1])
    k = oc.param("k", output=4, input=(3, 3, 1))
    spec = CONV2D.replace("=+", "+")
    check(oc.einsum(spec, x, k, use_padding=True), output=[5, 5, 4])
    check(oc.einsum(spec, x, k, use_padding=False), output=[3, 3, 4])


def test_conv_kernel_channels_learned_from_input():
    """The kernel's input-channel row variable comes from the image's channels."""
    x = T(batch=[2], output=[5, 5, 3])
    k = oc.param("k", output=8, input=(3, 3, 3))
    y = oc.einsum(CONV2D, x, k)
    check(y, batch=[2], output=[5, 5, 8])


def test_max_pool2d():
    """Max pooling: stride 2 window 2 on 4x4x1; stride 2 window 3 on 7x7x2."""
    spec = "... | 2*oh<+wh, 2*ow<+ww, ..c..; wh, ww => ... | oh, ow, ..c.."
    check(oc.tropical(spec, T(output=[4, 4, 1]), T(output=[2, 2])), output=[2, 2, 1])
    check(oc.tropical(spec, T(batch=[3], output=[7, 7, 2]), T(output=[3, 3])),
          batch=[3], output=[3, 3, 2])


def test_valid_conv_with_dilation():
    """in = stride*(out-1) + dilation*(k-1) + 1: in 9, stride 2, dilation 2, kernel 3 -> out 3."""
    check(oc.einsum("2*o<+2*k; k => o", T(output=[9]), T(output=[3])), output=[3])


def test_padded_conv_with_dilation_keeps_size():
    check(oc.einsum("1*o=+2*k; k => o", T(output=[5]), T(output=[3])), output=[5])


def test_valid_conv_kernel_solved_from_input_and_output():
    r = oc.einsum("o<+k; o => o", T(output=[7]), T(output=[5]), capture=["k", "o"])
    check(r, output=[5])
    assert r.captured["k"].size == 3
    assert r.captured["o"].size == 5


def test_pure_stride_axis():
    check(oc.einsum("2*o => o", T(output=[6])), output=[3])
    check(oc.einsum("2*o+1 => o", T(output=[6])), output=[3])


def test_batch_slice_then_padded_conv():
    """Images rebatched [2, 4], sliced by batch_n, then a padded conv2d."""
    images = T(batch=[2, 4], output=[3, 3, 1])
    batch_n = oc.IndexSymbol("batch_n", 2)
    k = oc.param("k", output=4, input=(3, 3, 1))
    y = oc.einsum(CONV2D, images[batch_n], k)
    check(y, batch=[4], output=[3, 3, 4])
    check(images, batch=[2, 4], output=[3, 3, 1])


# ---------------------------------------------------------------------------------------------
# Batch slicing with an index symbol.


def test_batch_slice_drops_leftmost_batch_axis():
    xs = T(batch=[80, 10], output=[2])
    batch_n = oc.IndexSymbol("batch_n", 80)
    x = xs[batch_n]
    w = oc.param("w", output=16)
    h = w @ x
    check(x, batch=[10], output=[2])
    check(h, batch=[10], output=[16])
    check(w, output=[16], input=[2])


def test_batch_slice_symbol_without_size_takes_it_from_the_tensor():
    xs = T(batch=[7, 3], output=[2], input=[5])
    check(xs[oc.IndexSymbol("n")], batch=[3], output=[2], input=[5])


# ---------------------------------------------------------------------------------------------
# The worked examples of docs/shapes.md.


def test_matmul_einsum():
    """#1."""
    check(oc.einsum("ij;jk=>ik", T(output=[2, 3]), T(output=[3, 4])), output=[2, 4])


def test_batched_matmul_einsum_and_batch_variants():
    """The batched matrix product `b|h->o; b|i->h => b|i->o`, and variants reducing or
    combining the batch axes."""
    b = T(batch=[2], output=[5], input=[4])
    a = T(batch=[2], output=[4], input=[3])
    check(oc.einsum("b|h->o; b|i->h => b|i->o", b, a), batch=[2], output=[5], input=[3])
    a2 = T(batch=[2], output=[4], input=[3])
    b2 = T(batch=[2], output=[5], input=[4])
    check(oc.einsum("a|i->h; b|h->o => ab|i->o", a2, b2), batch=[2, 2], output=[5], input=[3])
    check(oc.einsum("b|i->h; b|h->o => i->o", a2, b2), output=[5], input=[3])


def test_permutation_across_kinds():
    """#3: `b|i->o => o|b->i` on `2|3->4` gives `4|2->3`."""
    hey = T(batch=[2], output=[4], input=[3])
    r = oc.einsum("b|i->o => o|b->i", hey)
    check(r, batch=[4], output=[3], input=[2])
    assert r.dims == (4, 3, 2)


def test_permutation_across_kinds_two_axes_each():
    """#18: `ab|cd->ef => cf|ae->db` on `[2,3]|[4,5]->[6,7]` gives `[4,7]|[2,6]->[5,3]`."""
    hey2 = T(batch=[2, 3], output=[6, 7], input=[4, 5])
    check(oc.einsum("ab|cd->ef => cf|ae->db", hey2), batch=[4, 7], output=[5, 3], input=[2, 6])


def test_reduction_over_output_axis():
    """#4: `b|i->o => b|i` on `2|3->4` gives `2|->3` (the result's `i` is an output axis)."""
    check(oc.einsum("b|i->o => b|i", T(batch=[2], output=[4], input=[3])), batch=[2], output=[3])


def test_full_reductions():
    """`...|...->... => 0` sums everything into output [1]; `t.sum()` and friends give dims ()."""
    x = T(batch=[2], output=[3], input=[4])
    check(oc.einsum("...|...->... => 0", x), output=[1])
    check(x.sum())
    check(oc.mean(x))
    check(x.max())
    check(x.max(axes="input"), batch=[2], output=[3])


def test_outer_product():
    """#7: `i; j => i->j` on `[2]`, `[3]` gives `[2]->[3]`."""
    a, b = T(output=[2]), T(output=[3])
    check(oc.einsum("i; j => i->j", a + 1, b), output=[3], input=[2])
    check(oc.outer_sum("i; j => i->j", a, b), output=[3], input=[2])


def test_diagonal():
    """#8: `i=>ii` on `[5]` gives `[5,5]`; and back with `ii=>i`."""
    d = oc.einsum("i=>ii", T(output=[5]))
    check(d, output=[5, 5])
    check(oc.einsum("ii=>i", d), output=[5])


def test_attention_scores_and_weighted_values():
    """#9 and #10."""
    q = T(batch=[2, 5], output=[4, 8])
    k = T(batch=[2, 6], output=[4, 8])
    v = T(batch=[2, 6], output=[4, 3])
    scores = oc.einsum(" ... s | h d; ... t | h d => ... s | t -> h", q, k)
    check(scores, batch=[2, 5], output=[4], input=[6])
    out = oc.einsum(" ... s | t -> h; ... t | h e => ... s | h e", scores, v)
    check(out, batch=[2, 5], output=[4, 3])


def test_attention_with_param_projections():
    """Query/key projections whose input dims are learned from the model width."""
    x = T(batch=[2, 5], output=[12])
    wq = oc.param("wq", output=(4, 8))
    wk = oc.param("wk", output=(4, 8))
    scores = oc.einsum("... s | h d; ... t | h d => ... s | t -> h", wq @ x, wk @ x)
    check(scores, batch=[2, 5], output=[4], input=[5])
    check(wq, output=[4, 8], input=[12])
    check(wk, output=[4, 8], input=[12])


# ---------------------------------------------------------------------------------------------
# Captures.


def test_capture_labels():
    """Capturing `a`, `b`, `c` of `ab;bc=>ac` on [2, 3] and [3, 4]."""
    r = oc.einsum("ab;bc=>ac", T(output=[2, 3]), T(output=[3, 4]), capture=["a", "b", "c"])
    check(r, output=[2, 4])
    assert [r.captured[n].size for n in "abc"] == [2, 3, 4]
    r2 = oc.einsum("ij=>ji", T(output=[5, 7]), capture=["i", "j"])
    assert (r2.captured["i"].size, r2.captured["j"].size) == (5, 7)


def test_capture_of_label_learned_later():
    """A captured dim that depends on a param is unknown until inference determines it."""
    w = oc.param("w", output=3)
    r = oc.einsum("i->o => o", w, capture=["i"])
    assert r.captured["i"].size is None
    y = w @ T(batch=[2], output=[6])
    check(y, batch=[2], output=[3])
    assert r.captured["i"].size == 6
    check(r, output=[3])


# ---------------------------------------------------------------------------------------------
# Reading shapes before finalization (`t.shape` never applies defaults).


def test_reading_param_shape_does_not_force_defaults():
    w = oc.param("w", output=16)
    assert str(w.shape) == "output [16] input [...]"
    assert w.shape.input == (...,)
    x = T(batch=[10], output=[2])
    y = w @ x
    assert w.shape.input == (2,)
    check(y, batch=[10], output=[16])
    check(w, output=[16], input=[2])


def test_reading_open_result_shape_then_using_it():
    p = oc.param("p")
    s = oc.relu(p)
    assert str(s.shape) == "output [...] input [...]"
    assert s.shape.output == (...,)
    y = s + T(batch=[3], output=[4, 5])
    # Still open: `s` may yet have more axes than the tensor added to it.
    assert str(y.shape) == "batch [3] output [..., 4, 5] input [...]"
    assert str(p.shape) == "output [...] input [...]"
    check(y, batch=[3], output=[4, 5])
    check(p, output=[4, 5])
    check(s, output=[4, 5])


def test_unknown_dim_shows_question_mark_until_learned():
    w = oc.param("w")
    x = T(batch=[10], output=[2])
    h = w @ x
    assert str(h.shape) == "batch [10] output [...]"
    assert str(w.shape) == "output [...] input [2]"
    o = h + T(output=[7])
    assert str(o.shape) == "batch [10] output [..., 7]"
    assert str(w.shape) == "output [...] input [2]"
    check(o, batch=[10], output=[7])
    check(w, output=[7], input=[2])


def test_reading_fixed_index_result_before_a_larger_equation():
    r = oc.einsum("i=>i0", T(output=[4]))
    assert r.shape.output == (4, None)
    s = oc.einsum("ij;ij=>ij", r, T(output=[4, 6]))
    check(s, output=[4, 6])
    check(r, output=[4, 6])


def test_finalizing_twice_and_building_after_finalization():
    x = T(batch=[3], output=[2])
    w = oc.param("w", output=5)
    h = w @ x
    check(h, batch=[3], output=[5])
    w2 = oc.param("w2", output=1)
    y = w2 @ oc.relu(h)
    check(y, batch=[3], output=[1])
    check(w2, output=[1], input=[5])
    check(h, batch=[3], output=[5])


def test_explain_shapes_mentions_learned_dims():
    x = T(batch=[10], output=[2])
    y = T(batch=[10], output=[1])
    w = oc.param("w")
    out = y * (w @ x)
    text = oc.explain_shapes(out)
    check(w, output=[1], input=[2])
    assert "w (param): output [1] input [2]" in text
    assert "learned from its use" in text
