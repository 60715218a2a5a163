"""Scatter-accumulations computed as gathers (ocannl/lowlevel/gather.py): each rewrite on
hand-built loop IR keeps every cell's bits (same terms, same order) against the interpreter running
the scatter; each refused form stays a scatter; then a convolution's input gradient in a compiled
training step, on every backend."""

from functools import partial

import numpy as np
import pytest

import helpers
from helpers import assert_pass_keeps_bits, run_ir, same_bits
import ocannl as oc
from backend_params import backend_param
from ocannl import nn, session, train
from ocannl.lowlevel import dtypes
from ocannl.lowlevel import optimize as opt
from ocannl.lowlevel.gather import gather_scatters, gathered
from ocannl.lowlevel.indexing import Affine, Fixed, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Const, Fill, For, Load, LoadDynamic, LoopKind, RoutineIR, Store, StoreDynamic, Ternary, iter_exprs,
    iter_stmts, loop, seq, stmt_exprs,
)
from ocannl.lowlevel.scalar_ops import Binop, Ternop
from ocannl.lowlevel.summation import block_sums
from ocannl.lowlevel.tnode import TNode

RNG = np.random.default_rng(23)
# values with negative zeros among them, so that a lost sign of zero shows
data = partial(helpers.data, rng=RNG, negative_zeros=True)


def at(*symbols: Symbol) -> tuple[Iter, ...]:
    return tuple(Iter(s) for s in symbols)


def add(*terms: tuple[int, Symbol], offset: int = 0) -> Affine:
    return Affine(tuple(terms), offset)


def accumulate(node: TNode, cell: tuple, term, op: Binop = Binop.ADD, skip_oob: bool = True) -> Store:
    return Store(node, cell, Binary(op, Load(node, cell, oob_value=0.0 if skip_oob else None), term), skip_oob)


def conv_input_gradient(h: int = 5, k: int = 3, c: int = 2, op: Binop = Binop.ADD):
    """``fill g := 0``, then ``g[b, oh + kh - 1, ic] op= d[b, oh, oc] * w[oc, kh, ic]``: the input
    gradient of a padded 1-D convolution, as lowering writes it."""
    b, oh, oc, kh, ic = (Symbol() for _ in range(5))
    g, d, w = TNode("g", (2, h, c)), TNode("d", (2, h, 3)), TNode("w", (3, k, c))
    term = Binary(Binop.MUL, Load(d, at(b, oh, oc)), Load(w, at(oc, kh, ic)))
    cell = (Iter(b), add((1, oh), (1, kh), offset=-(k // 2)), Iter(ic))
    nest = loop(b, 2, loop(oh, h, loop(oc, 3, loop(kh, k, loop(ic, c, accumulate(g, cell, term, op))))))
    return RoutineIR("conv_grad", seq(Fill(g, Const(0.0)), nest)), (g, d, w)


def stores(routine: RoutineIR, node: TNode) -> list[Store]:
    return [s for s in iter_stmts(routine.body) if isinstance(s, Store) and s.tnode is node]


def nest_of(routine: RoutineIR, node: TNode) -> For:
    return next(s for s in iter_stmts(routine.body) if isinstance(s, For) and stores(RoutineIR("n", s), node))


# ---------------------------------------------------------------------------------------------
# The rewrite


def test_a_convolution_input_gradient_becomes_owner_computes():
    """Each cell of ``g`` is owned by one iteration of loops over ``g``'s axes (parallel), the
    terms summed by reduction loops inside, with no bounds-skipping store; every cell keeps its
    bits, a kernel holding infinities and negative zeros included (a placeholder term of the
    margins would make ``0 * inf`` a NaN)."""
    routine, (g, d, w) = conv_input_gradient()
    after = gather_scatters(routine)
    (store,) = stores(after, g)
    assert not store.skip_oob and all(isinstance(i, Iter) for i in store.indices)
    nest = nest_of(after, g)
    kinds = []
    while isinstance(nest, For):
        kinds.append((nest.kind, nest.extent))
        nest = nest.body
    assert kinds[:3] == [(LoopKind.PARALLEL, 2), (LoopKind.PARALLEL, 5), (LoopKind.PARALLEL, 2)]
    assert all(kind is LoopKind.REDUCTION for kind, _ in kinds[3:])
    assert sorted(n for _, n in kinds[3:]) == [3, 3]
    kernel = data(3, 3, 2)
    kernel[0, 0, 0], kernel[1, 2, 1] = np.inf, -np.inf
    assert_pass_keeps_bits(routine, after, {d: data(2, 5, 3), w: kernel})
    assert_pass_keeps_bits(routine, opt.optimize(routine), {d: data(2, 5, 3), w: kernel})


def test_each_cell_keeps_the_order_of_its_terms():
    """The terms of a cell come in the scatter's loop order: the output loop is eliminated and
    the kernel loop takes its place running downwards (``oh = ih + 1 - kh`` grows as ``kh``
    falls). Terms spanning many magnitudes make any reordering show in the sums."""
    routine, (g, d, w) = conv_input_gradient(h=6, k=5, c=1)
    after = gather_scatters(routine)
    grad = np.float32(10.0) ** RNG.integers(-6, 7, (2, 6, 3)).astype(np.float32)
    grad *= np.where(RNG.random((2, 6, 3)) < 0.5, -1, 1).astype(np.float32)
    assert_pass_keeps_bits(routine, after, {d: grad, w: data(3, 5, 1)})


@pytest.mark.parametrize("coefficients", [(1, -1), (-1, 1), (-1, -1)], ids=["minus-kernel", "minus-output", "both"])
def test_negative_coefficients_invert_exactly(coefficients):
    """``g[oh - kh + 2]`` (a correlation), ``g[-oh + kh + 4]`` and ``g[-oh - kh + 6]``: the
    eliminated loop's index and the direction of the loop left follow the signs."""
    c_o, c_k = coefficients
    oh, kh = Symbol(), Symbol()
    offset = {(1, -1): 2, (-1, 1): 4, (-1, -1): 6}[coefficients]
    g, d, w = TNode("g", (5,)), TNode("d", (5,)), TNode("w", (3,))
    term = Binary(Binop.MUL, Load(d, at(oh)), Load(w, at(kh)))
    nest = loop(oh, 5, loop(kh, 3, accumulate(g, (add((c_o, oh), (c_k, kh), offset=offset),), term)))
    routine = RoutineIR("signs", seq(Fill(g, Const(0.0)), nest))
    after = gather_scatters(routine)
    assert not stores(after, g)[0].skip_oob
    assert_pass_keeps_bits(routine, after, {d: data(5), w: data(3)})


def test_the_kernel_loop_outside_keeps_running_upwards():
    """With the kernel loop outside the output loop (a weight-stationary order), the kernel loop
    is the one eliminated only if longer; here the output loop is, and the kernel loop, outer,
    keeps its place and direction."""
    kh, oh = Symbol(), Symbol()
    g, d, w = TNode("g", (6,)), TNode("d", (6,)), TNode("w", (3,))
    term = Binary(Binop.MUL, Load(d, at(oh)), Load(w, at(kh)))
    nest = loop(kh, 3, loop(oh, 6, accumulate(g, (add((1, oh), (1, kh), offset=-1),), term)))
    routine = RoutineIR("outer_kernel", seq(Fill(g, Const(0.0)), nest))
    after = gather_scatters(routine)
    inner = nest_of(after, g).body
    assert inner.extent == 3 and Load(w, at(inner.symbol)) in [e for s in iter_stmts(inner)
                                                                for x in stmt_exprs(s) for e in iter_exprs(x)]
    assert_pass_keeps_bits(routine, after, {d: data(6), w: data(3)})


def test_a_subtraction_gathers_with_its_own_neutral_term():
    """``g -= term`` skips a missing term with ``- +0.0``, which keeps ``-0.0``."""
    routine, (g, d, w) = conv_input_gradient(op=Binop.SUB)
    after = gather_scatters(routine)
    (where,) = [e for s in stores(after, g) for e in iter_exprs(s.value)
                if isinstance(e, Ternary) and e.op is Ternop.WHERE]
    assert where.c == Const(0.0) and np.copysign(1.0, where.c.value) > 0
    assert_pass_keeps_bits(routine, after, {d: data(2, 5, 3), w: data(3, 3, 2)})


def test_the_fill_folds_and_the_summation_order_blocks_the_gather():
    """After the rewrite the zero fill folds into the gather's reset, and a cell of more than a
    block of terms is summed in blocks: the same cells as the interpreter running the blocked
    IR, close to the scatter's sums."""
    wide_d, wide_w = TNode("d2", (2, 4, 40)), TNode("w2", (40, 3, 2))
    b, oh, oc, kh, ic = (Symbol() for _ in range(5))
    term = Binary(Binop.MUL, Load(wide_d, at(b, oh, oc)), Load(wide_w, at(oc, kh, ic)))
    cell = (Iter(b), add((1, oh), (1, kh), offset=-1), Iter(ic))
    g2 = TNode("g2", (2, 4, 2))
    nest = loop(b, 2, loop(oh, 4, loop(oc, 40, loop(kh, 3, loop(ic, 2, accumulate(g2, cell, term))))))
    routine = RoutineIR("wide", seq(Fill(g2, Const(0.0)), nest))
    optimized = opt.optimize(routine)
    assert not [s for s in iter_stmts(optimized.body) if isinstance(s, Fill)]
    blocked = block_sums(optimized)
    assert blocked.body != optimized.body
    values = {wide_d: data(2, 4, 40), wide_w: data(40, 3, 2)}
    np.testing.assert_allclose(run_ir(blocked, values)[g2], run_ir(routine, values)[g2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(24))
def test_random_scatters_keep_every_cells_bits(seed):
    """Nests of two written axes, each addressed by two loops with coefficients ``+-1`` or a
    stride, any offset, the loops in a random order with a loop that indexes nothing: the
    gather (where it is not refused) keeps every cell's bits, terms spanning many magnitudes."""
    rng = np.random.default_rng(seed)
    loops = [Symbol() for _ in range(5)]
    extents = dict(zip(loops, (int(n) for n in rng.integers(1, 5, 5))))
    (o1, k1, o2, k2, free) = loops
    axes = []
    for o, k in ((o1, k1), (o2, k2)):
        c_o, c_k = int(rng.choice([1, -1, 2])), int(rng.choice([1, -1]))
        if rng.random() < 0.5:
            c_o, c_k = c_k, c_o
        offset = int(rng.integers(-3, 4))
        axes.append(add((c_o, o), (c_k, k), offset=offset))
    g = TNode("g", (int(rng.integers(2, 7)), int(rng.integers(2, 7))))
    d, w = TNode("d", (extents[o1], extents[o2], extents[free])), TNode("w", (extents[k1], extents[k2]))
    term = Binary(Binop.MUL, Load(d, at(o1, o2, free)), Load(w, at(k1, k2)))
    body = accumulate(g, tuple(axes), term)
    for s in reversed([loops[i] for i in rng.permutation(5)]):
        body = loop(s, extents[s], body)
    routine = RoutineIR("random", seq(Fill(g, Const(0.0)), body))
    grad = np.float32(10.0) ** rng.integers(-6, 7, d.dims).astype(np.float32)
    grad *= np.where(rng.random(d.dims) < 0.5, -1, 1).astype(np.float32)
    kernel = data(*w.dims)
    kernel.flat[0] = np.inf
    assert_pass_keeps_bits(routine, gather_scatters(routine), {d: grad, w: kernel})


# ---------------------------------------------------------------------------------------------
# Refusals: the nest stays a scatter


def test_a_data_dependent_position_stays_a_scatter():
    """``oc.take``'s gradient scatters at positions read from data."""
    i, j = Symbol(), Symbol()
    g, pos, src = TNode("g", (4, 3)), TNode("pos", (5,)), TNode("src", (5, 3))
    position = Cast(Load(pos, at(i)), dtypes.INDEX)
    read = LoadDynamic(g, 0, position, at(j))
    nest = loop(i, 5, loop(j, 3, StoreDynamic(g, 0, position, at(j), Binary(Binop.ADD, read, Load(src, at(i, j))))))
    assert gathered(nest) is None


@pytest.mark.parametrize("form", ["three-loops", "stride-both", "diagonal", "reads-itself", "pool-window",
                                  "float16", "unchecked-write", "fixed-outside"])
def test_forms_that_do_not_invert_stay_scatters(form):
    """Three loops in one axis (a dilated strided index), no ``+-1`` coefficient on an axis, one
    loop indexing two axes, a term reading the written node, a pooling window (a gather many
    times the scatter's work), a float16 node (each stored partial sum rounds), a write that may
    leave the node without skipping (an error that must stay one), and a fixed index outside the
    node (whose terms the scatter skips)."""
    a, b, c = Symbol(), Symbol(), Symbol()
    x = TNode("x", (4, 4))
    if form == "fixed-outside":
        g = TNode("g", (7, 2))
        store = accumulate(g, (add((1, a), (1, b), offset=-1), Fixed(3)), Load(x, at(a, b)))
        assert gathered(loop(a, 4, loop(b, 4, store))) is None
        return
    if form in ("float16", "unchecked-write"):
        g = TNode("g", (6,), dtype=dtypes.float16 if form == "float16" else dtypes.float32)
        store = accumulate(g, (add((1, a), (1, b), offset=-1),), Load(x, at(a, b)), skip_oob=form == "float16")
        assert gathered(loop(a, 4, loop(b, 4, store))) is None
        return
    if form == "pool-window":
        oh, wh, ow, ww = Symbol(), Symbol(), Symbol(), Symbol()
        g = TNode("g", (8, 8))
        store = accumulate(g, (add((2, oh), (1, wh)), add((2, ow), (1, ww))), Load(x, at(oh, ow)), skip_oob=False)
        assert gathered(loop(oh, 4, loop(ow, 4, loop(wh, 2, loop(ww, 2, store))))) is None
        return
    if form == "three-loops":
        g = TNode("g", (12,))
        store = accumulate(g, (add((1, a), (1, b), (1, c)),), Load(x, at(a, b)))
    elif form == "stride-both":
        g = TNode("g", (16,))
        store = accumulate(g, (add((2, a), (2, b)),), Load(x, at(a, b)))
    elif form == "diagonal":
        g = TNode("g", (8, 8))
        store = accumulate(g, (add((1, a), (1, b)), add((1, a), (1, c))), Load(x, at(a, b)))
    else:
        g = TNode("g", (8,))
        store = accumulate(g, (add((1, a), (1, b)),), Load(g, at(a)))
    assert gathered(loop(a, 4, loop(b, 4, loop(c, 4, store)))) is None


# ---------------------------------------------------------------------------------------------
# In a compiled step, on every backend


def _cnn_step():
    """Convolution, relu, max pool, convolution, linear, with a squared-error loss: IEEE
    operations only (no math-library function, whose last bit may differ between backends). The
    gradients of the pool and of its input are kept (``retain_grad``), for the tests to read."""
    session.reset()
    oc.seed(0)
    rng = np.random.default_rng(5)
    x = oc.tensor(rng.standard_normal((4, 6, 6, 2)).astype(np.float32), batch=1, label="x")
    y = oc.tensor(rng.standard_normal((4, 3)).astype(np.float32), batch=1, label="y")
    conv1, conv2, fc = nn.conv2d(3, label="conv1"), nn.conv2d(4, label="conv2"), nn.linear(3, label="fc")
    pooled = nn.max_pool2d(oc.relu(conv1(x)).retain_grad()).retain_grad()
    diff = fc(oc.relu(conv2(pooled))) - y
    update = train.grad_update((diff * diff).mean(label="loss"))
    return update, train.sgd_update(update, lr=0.1)


def test_the_cnn_steps_conv_input_gradient_is_a_gather():
    """The optimized step has no bounds-skipping store left: the second convolution's input
    gradient owns its cells."""
    update, step = _cnn_step()
    routine = oc.Context("interp").compile(update, step)
    assert not [s for s in iter_stmts(routine.ir.body) if isinstance(s, Store) and s.skip_oob]
    pool_grads = [s for s in iter_stmts(routine.ir.body) if isinstance(s, Store)
                  and s.tnode.debug_name == "max_pool2d.grad"]
    assert pool_grads and all(all(isinstance(i, Iter) for i in s.indices) for s in pool_grads)


def _cnn_buffers(backend: str, update, step) -> dict[str, np.ndarray]:
    ctx = oc.Context(backend)
    routine = ctx.compile(update, step)
    routine.run()
    routine.run()
    return {n.debug_name: ctx.get(n) for n in routine.ir.writes}


@pytest.mark.parametrize("backend", [backend_param("c"), backend_param("metal"), backend_param("triton", slow=True)])
def test_the_cnn_step_matches_the_interpreter(backend):
    """Two SGD steps of a small CNN: every kept buffer as the interpreter computes it, bit for bit
    (Triton sums long reductions in trees: there, up to rounding)."""
    update, step = _cnn_step()
    want = _cnn_buffers("interp", update, step)
    got = _cnn_buffers(backend, update, step)
    assert "max_pool2d.grad" in got and set(got) == set(want)
    for name, array in got.items():
        if backend == "triton":
            np.testing.assert_allclose(array, want[name], rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            assert same_bits(array, want[name]), name
