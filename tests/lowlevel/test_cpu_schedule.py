"""The CPU plan of a routine's top-level statements (ocannl/lowlevel/cpu_schedule.py,
``plan_top_level``): which become helper functions of their own, which products inlined into
their consumer are split into a packed GEMM and the consumer, and which print in place. Read
from the plan records: nothing is printed."""

from ocannl.lowlevel import cpu_schedule, dtypes
from ocannl.lowlevel.cpu_schedule import plan_nest, plan_top_level
from ocannl.lowlevel.indexing import Affine, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Comment, Const, DeclareLocal, For, GetLocal, Load, Local, LocalScope, SetLocal, Store, Unary, iter_stmts,
    loop, seq,
)
from ocannl.lowlevel.scalar_ops import Binop, Unop
from ocannl.lowlevel.tnode import TNode


def _scale(n: int = 64):
    x, y = TNode("x", (n,)), TNode("y", (n,))
    i = Symbol()
    return loop(i, n, Store(y, (Iter(i),), Binary(Binop.MUL, Load(x, (Iter(i),)), Const(2.0, dtypes.float32))))


def _dense_relu(m: int, n: int, k: int):
    """``for i, j: out[i, j] := relu(v { v := 0; for s: v := v + a[i, s] * b[s, j] })``: a
    product inlined into its consumer, as the optimizer leaves a layer's bias and activation."""
    a, b, out = TNode("a", (m, k)), TNode("b", (k, n)), TNode("out", (m, n))
    i, j, s = Symbol(), Symbol(), Symbol()
    v = Local(dtypes.float32)
    term = Binary(Binop.MUL, Load(a, (Iter(i), Iter(s))), Load(b, (Iter(s), Iter(j))))
    total = LocalScope(v, seq(SetLocal(v, Const(0.0, dtypes.float32)),
                              loop(s, k, SetLocal(v, Binary(Binop.ADD, GetLocal(v), term)))))
    return loop(i, m, loop(j, n, Store(out, (Iter(i), Iter(j)), Unary(Unop.RELU, total))))


def test_a_self_contained_nest_becomes_a_function_of_its_own():
    nest = _scale()
    plan = plan_top_level(nest, 32, threads=True)
    assert plan.kind == "function" and plan.nest == plan_nest(nest, 32, threads=True)


def test_a_nest_using_a_local_of_the_code_around_it_prints_in_place():
    n, v = 64, Local(dtypes.float32)
    x = TNode("x", (n,))
    i = Symbol()
    nest = loop(i, n, SetLocal(v, Binary(Binop.ADD, GetLocal(v), Load(x, (Iter(i),)))))
    plan = plan_top_level(nest, 32, threads=True)
    assert plan.kind == "inline" and plan.nest is not None and plan.nest.contraction is None
    for other in (DeclareLocal(v), Comment("a comment")):
        assert plan_top_level(other, 32, threads=True) == cpu_schedule.TopLevelPlan(other, "inline")


def test_a_product_inlined_into_its_consumer_splits_where_it_runs_as_a_packed_gemm():
    nest = _dense_relu(64, 64, 64)
    plan = plan_top_level(nest, 32, threads=True)
    assert plan.kind == "split"
    product, consumer = plan.parts
    assert product.kind == "inline" and product.nest.contraction.gemm is not None, "the product prints its own function"
    assert consumer.kind == "function" and consumer.nest.contraction is None, "relu over the result"
    tiled = plan_top_level(nest, None, threads=True)
    assert tiled.kind == "inline", "without packed GEMMs: register tiles with the consumer inside"
    assert tiled.nest.contraction is not None and tiled.nest.contraction.gemm is None


def test_a_product_too_small_for_tiles_splits_from_its_consumer():
    """10 x 16 cells of 16 terms (the moons demo's layers) get no register tiles: inlined, each
    cell's sum would run in a local that the C compiler leaves scalar, so the product gets a nest
    of its own (plain loops), then relu over its result."""
    nest = _dense_relu(10, 16, 16)
    assert plan_nest(nest, 32, threads=True).contraction is None
    plan = plan_top_level(nest, 32, threads=True)
    assert plan.kind == "split"
    product, consumer = plan.parts
    assert product.nest.contraction is None and consumer.nest.contraction is None
    assert [type(s).__name__ for s in iter_stmts(product.stmt) if isinstance(s, (Store, SetLocal))] == ["Store", "Store"]


def test_a_target_without_tiles_plans_contractions_as_their_loops():
    nest = _dense_relu(64, 64, 64)
    assert plan_nest(nest, None, threads=False).contraction is not None
    assert plan_nest(nest, None, threads=False, tiles=False).contraction is None


def test_an_innermost_loop_of_independent_iterations_with_a_remainder_asks_for_a_vector_loop():
    """``y[i, j] := exp(x[i, j])`` over 54 columns: GCC's -O2 leaves a loop whose trip count is not
    a whole number of vectors scalar, so the inner loop asks for a vector loop (``simd``); over 64
    columns it needs not, nor does a loop whose iterations read each other's cells."""
    def inner(columns: int, shifted: bool = False) -> For:
        x, y = TNode("x", (8, columns)), TNode("y", (8, columns + 1))
        i, j = Symbol(), Symbol()
        read = Load(y, (Iter(i), Affine(((1, j),), 1))) if shifted else Load(x, (Iter(i), Iter(j)))
        return loop(j, columns, Store(y, (Iter(i), Iter(j)), Unary(Unop.EXP, read)))

    assert plan_nest(inner(54), 64, threads=False).simd
    assert not plan_nest(inner(64), 64, threads=False).simd
    assert not plan_nest(inner(54, shifted=True), 64, threads=False).simd, "y[i, j] reads y[i, j + 1]"
    assert not plan_nest(inner(54), None, threads=False).simd, "no vector registers"


def test_an_independent_innermost_loop_in_a_parallel_region_asks_for_a_vector_loop():
    """OpenMP moves a parallel region into a function reading the buffers' addresses from a
    structure, their ``restrict`` lost, and GCC's -O2 adds no run-time alias check: a relu inside
    ``#pragma omp parallel for`` stayed scalar, 6x slower. Inside a region, and when the parallel
    loop is itself innermost, the loop asks for a vector loop whatever its trip count."""
    x, y = TNode("x", (4096, 64)), TNode("y", (4096, 64))
    i, j = Symbol(), Symbol()
    inner = loop(j, 64, Store(y, (Iter(i), Iter(j)), Unary(Unop.RELU, Load(x, (Iter(i), Iter(j))))))
    assert not plan_nest(inner, 64, threads=False).simd
    assert plan_nest(inner, 64, threads=False, in_parallel=True).simd

    flat_x, flat_y = TNode("fx", (1 << 20,)), TNode("fy", (1 << 20,))
    flat = loop(i, 1 << 20, Store(flat_y, (Iter(i),), Unary(Unop.RELU, Load(flat_x, (Iter(i),)))))
    plan = plan_nest(flat, 64, threads=True)
    assert plan.parallel and plan.simd


def test_a_vector_tile_takes_a_factor_computed_from_one_load():
    """``w.grad[c, k] += x[b, k] * (0.0 + g[b, c])`` (a convolution's kernel gradient reading an
    inlined gradient copy): the copy is the column factor, computed on the loaded vector of ``g``
    (``vector_chain_load``); a factor of two loads is not one, nor one through a function."""
    x, g = TNode("x", (64, 9)), TNode("g", (64, 8))
    b, c, k = Symbol(), Symbol(), Symbol()
    copy = Binary(Binop.ADD, Const(0.0, dtypes.float32), Load(g, (Iter(b), Iter(c))))
    term = Binary(Binop.MUL, Load(x, (Iter(b), Iter(k))), copy)
    assert cpu_schedule.vector_factors(term, k, c) == (None, term.a, copy, True, 0.0)
    two = Binary(Binop.MUL, Load(x, (Iter(b), Iter(k))), Binary(Binop.ADD, Load(g, (Iter(b), Iter(c))), copy))
    assert cpu_schedule.vector_factors(two, k, c) is None
    assert cpu_schedule.vector_chain_load(copy) == copy.b
    assert cpu_schedule.vector_chain_load(Unary(Unop.EXP, copy.b)) is None


def _row_sums(rows: int, cols: int, length: int):
    """``out[i, j] := v { v := 0; for s: v := v + x[i, j, s] }``: a sum along the rows' contiguous
    axis, as a layer norm's mean or a softmax's denominator."""
    x, out = TNode("x", (rows, cols, length)), TNode("out", (rows, cols))
    i, j, s = Symbol(), Symbol(), Symbol()
    v = Local(dtypes.float32)
    step = SetLocal(v, Binary(Binop.ADD, GetLocal(v), Load(x, (Iter(i), Iter(j), Iter(s)))))
    total = LocalScope(v, seq(SetLocal(v, Const(0.0, dtypes.float32)), loop(s, length, step)))
    return loop(i, rows, loop(j, cols, Store(out, (Iter(i), Iter(j)), total)))


def test_tiles_of_columns_no_term_reads_adjacent_keep_few_scalar_cells():
    """A row sum's cells read their terms a row apart: no vector holds a tile's columns, so the
    tile is :data:`SCALAR_TILE_CELLS` independent sums, not 4 x 16 (which only lengthened the C
    compiler's work); a product whose columns a factor reads adjacent keeps its vector tile."""
    sums = plan_nest(_row_sums(16, 64, 64), None, threads=False).contraction
    assert (sums.mr, sums.nr) == (cpu_schedule.SCALAR_TILE_CELLS // cpu_schedule.SCALAR_TILE_COLUMNS,
                                  cpu_schedule.SCALAR_TILE_COLUMNS)
    product = plan_nest(_dense_relu(64, 64, 64), None, threads=False).contraction
    assert (product.mr, product.nr) == (cpu_schedule.TILE_ROWS, cpu_schedule.TILE_BYTES // 4)


def test_a_long_routine_is_cut_into_parts_at_the_same_statements_of_each_repeated_block():
    """``plan_parts`` cuts after statements whose fingerprints are smallest among their
    neighbours', so a block repeated on other buffers (equal fingerprints) is cut at the same
    places in each repetition whatever its length and its fingerprints, with every part within
    the bounds."""
    import random

    rng = random.Random(0)
    for length, odd in ((37, False), (29, True)):  # odd: no fingerprint a multiple of 16 (the old rule's cuts)
        block = [rng.getrandbits(32) | odd for _ in range(length)]
        fingerprints = [rng.getrandbits(32) for _ in range(5)] + block * 9
        parts = cpu_schedule.plan_parts(fingerprints)
        assert [k for part in parts for k in part] == list(range(len(fingerprints)))
        assert all(len(part) <= cpu_schedule.PART_STATEMENTS_MAX for part in parts)
        assert all(len(part) >= cpu_schedule.PART_STATEMENTS_MIN for part in parts[:-1])
        # From the second repetition on, each starts its parts at the same offsets.
        offsets = [{(part.start - 5) % length for part in parts if (part.start - 5) // length == r}
                   for r in range(1, 9)]
        assert offsets[0] and all(o == offsets[0] for o in offsets)
    # A run of statements no fingerprint cuts still ends parts at the most statements.
    assert cpu_schedule.plan_parts([1] * 100) == (range(0, 48), range(48, 96), range(96, 100))
