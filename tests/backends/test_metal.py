"""The Metal backend: MSL kernels run on the CPU through the C++ shim, against the interpreter.

Default run: the conformance kit (0 mismatches; the catalog bit for bit except libm results, every
operator and cast on hand-built routines, float16/bfloat16 rounding, the PRNG and runtime checks
are tests/backends/test_c_family.py's, on C and Metal alike); locals and margins; threadgroup tree reductions against the
interpreter (and the catalog with trees wherever a reduction allows one); a kernel whose barrier
is deleted is caught by ThreadSanitizer and computes a wrong result; every catalog source parses
as C++20 with g++ and clang++ (when installed); the emitter's invariants (address spaces, no
double, Metal's limits) and its errors; golden ``.metal`` files; the normal API (``Context``,
``OCANNL_BACKEND``, ``Context.auto()`` never picking metal) and the moons example against ``c``.

Slow run (``pytest -m slow``): the catalog under AddressSanitizer + UBSan, the reduction kernels
under ThreadSanitizer, the catalog compiled by clang++, and planted bugs each sanitizer must
report.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import time

import numpy as np
import pytest

import ocannl as oc
from golden import check_golden
from handbuilt import accum, matmul, matvec, padded_conv1d, pointwise_loop, sum_and_max_over_middle
from helpers import assert_same_bits, catalog_for, random_inputs, run_both, run_on, storage_shape
from ocannl import session, testing, train
from ocannl.backends import registry
from ocannl.backends.interp import InterpBackend
from ocannl.backends.metal import KernelLimitError, MetalBackend, Options, emit_metal, harness
from ocannl.backends.metal.emit import MAX_ARGUMENT_BUFFER_ENTRIES, MAX_BUFFERS, Kernel, check_limits
from ocannl.errors import BackendUnavailable, OutOfBoundsError
from ocannl.lowlevel import dtypes, prng
from ocannl.lowlevel.assignments import Block
from ocannl.lowlevel.dtypes import DType, DTypeError
from ocannl.lowlevel.indexing import Affine, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Const, DeclareLocal, Fill, GetLocal, Load, LoadDynamic, Local, LocalScope, RoutineIR, SetLocal, Store,
    Ternary, Unary, loop, seq,
)
from ocannl.lowlevel.lower import lower_routine
from ocannl.lowlevel.optimize import materialized_nodes, optimize
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode

HAVE_METAL = MetalBackend().available()[0]
needs_metal = pytest.mark.skipif(not HAVE_METAL, reason="no C++20 compiler for the Metal shim here")
HAVE_CLANG = shutil.which("clang++") is not None
needs_clang = pytest.mark.skipif(not HAVE_CLANG, reason="clang++ is not installed (Debian: apt-get install -y clang)")


def _tsan_works() -> bool:
    if not HAVE_METAL:
        return False
    try:
        harness.toolchain("thread")
    except BackendUnavailable:
        return False
    return True


HAVE_TSAN = _tsan_works()
needs_tsan = pytest.mark.skipif(not HAVE_TSAN, reason="the C++ compiler cannot build ThreadSanitizer programs here")


# ---------------------------------------------------------------------------------------------
# Hand-built reductions


def reduction(name: str, out_dtype: DType = dtypes.float32, rows: int = 4, cols: int = 1000, op: Binop = Binop.ADD,
              init: bool = True):
    """``s[i] (=:) op over j of x[i, j]`` lowered: (routine, x, s)."""
    x, s = TNode("x", (rows, cols), out_dtype), TNode("s", (rows,), out_dtype)
    i, j = Symbol(), Symbol()
    asg = accum(s, op, Unop.ID, (x,), [(i, rows), (j, cols)], (Iter(i),), ((Iter(i), Iter(j)),), init=init)
    return lower_routine(name, asg), x, s


def cooperative_kernels(routine: RoutineIR, options: Options = Options()) -> list[Kernel]:
    return [k for k in emit_metal(routine, options).kernels if k.cooperative]


# ---------------------------------------------------------------------------------------------
# The conformance kit


@needs_metal
def test_conformance_kit_passes_with_no_mismatch():
    report = testing.conformance("metal", programs=catalog_for("metal"), random_programs=20)
    print(report.summary())
    assert report.ok, report.summary()
    assert not report.mismatches and len(report.passed) == len(catalog_for("metal")) + 20


@needs_metal
def test_float64_is_a_clear_error_naming_the_tensor():
    (program,) = [p for p in testing.catalog() if "float64" in p.name]
    with pytest.raises(DTypeError, match=r"tensor u is float64, and Metal has no float64.*float32"):
        testing.run_program(program, "metal")
    x = TNode("x", (3,), dtypes.float32)
    y = TNode("y", (3,), dtypes.float32)
    through_double = pointwise_loop(y, lambda i: Cast(Cast(Load(x, (i,)), dtypes.float64), dtypes.float32))
    with pytest.raises(DTypeError, match="computes a float64 value while computing tensor y"):
        emit_metal(RoutineIR("through_double", through_double))


@needs_metal
def test_locals_fills_margins_and_lazy_where():
    n = 6
    x = TNode("x", (n, 5), dtypes.float32)
    ids = TNode("ids", (n,), dtypes.int32)
    table = TNode("table", (4,), dtypes.float32)
    running, chosen, shifted = (TNode(name, (n,), dtypes.float32) for name in ("running", "chosen", "shifted"))
    filled = TNode("filled", (2, 3), dtypes.bfloat16)
    i, j, k = Symbol(), Symbol(), Symbol()
    acc, s = Local(dtypes.float32), Local(dtypes.float32)
    row_sum = LocalScope(s, seq(SetLocal(s, Const(0.5)), loop(k, 5, SetLocal(s, Binary(Binop.ADD, GetLocal(s), Load(x, (Iter(i), Iter(k))))))))
    gather = LoadDynamic(table, 0, Load(ids, (Iter(i),)), ())  # out of the table where the condition is false
    cond = Binary(Binop.GT, Load(x, (Iter(i), Fixed(0))), Const(0.0))
    body = seq(
        Fill(filled, Const(1.3)),
        loop(i, n, seq(
            DeclareLocal(acc),
            loop(j, 5, SetLocal(acc, Binary(Binop.MAX, GetLocal(acc), Load(x, (Iter(i), Iter(j)))))),
            Store(running, (Iter(i),), GetLocal(acc)),
            Store(chosen, (Iter(i),), Ternary(Ternop.WHERE, cond, gather, row_sum)),
            Store(shifted, (Iter(i),), Load(running, (Affine(((1, i),), 2),), oob_value=-7.0)),
        )),
    )
    xs = np.random.default_rng(1).standard_normal((n, 5)).astype(np.float32)
    xs[:, 0] = [1.0, -1.0, 2.0, -2.0, 0.5, 0.0]
    inputs = {x: xs, ids: np.array([1, 99, 3, -7, 0, 12], np.int32), table: np.array([10, 20, 30, 40], np.float32)}
    expected, got = run_both("metal", RoutineIR("locals", body), inputs)
    for node in (running, chosen, filled):
        assert_same_bits(expected[node], got[node], node.name)


# ---------------------------------------------------------------------------------------------
# Threadgroup tree reductions


def tree_cases():
    """(name, routine builder, exact): reductions long enough for threadgroup trees."""

    def row_sums():
        return reduction("row_sums")[0]

    def full_sum():
        x, s = TNode("x", (50, 37)), TNode("s", ())
        i, j = Symbol(), Symbol()
        return lower_routine("full_sum", accum(s, Binop.ADD, Unop.ID, (x,), [(i, 50), (j, 37)], (), ((Iter(i), Iter(j)),),
                                               init=True))

    def row_max():
        return reduction("row_max", op=Binop.MAX, rows=3, cols=777)[0]

    def int_sums():
        return reduction("int_sums", dtypes.int32, rows=5, cols=600)[0]

    def onto_existing():  # no reset: the cell's own value starts the sum
        return reduction("onto_existing", rows=2, cols=513, init=False)[0]

    def matvec_long():
        return lower_routine("matvec_long", matvec(TNode("a", (6, 1200)), TNode("v", (1200,)), TNode("c", (6,))))

    def inlined_scope():  # relu of a long dot product: the reduction lives in a local scope
        a, v, c = TNode("a", (5, 700)), TNode("v", (700,)), TNode("c", (5,))
        i, k = Symbol(), Symbol()
        s = Local(dtypes.float32)
        dot = LocalScope(s, seq(SetLocal(s, Const(0.25)), loop(k, 700, SetLocal(
            s, Binary(Binop.ADD, GetLocal(s), Binary(Binop.MUL, Load(a, (Iter(i), Iter(k))), Load(v, (Iter(k),))))))))
        return RoutineIR("inlined_scope", loop(i, 5, Store(c, (Iter(i),), Unary(Unop.RELU, dot))))

    return [("row_sums", row_sums, False), ("full_sum", full_sum, False), ("row_max", row_max, True),
            ("int_sums", int_sums, True), ("onto_existing", onto_existing, False), ("matvec_long", matvec_long, False),
            ("inlined_scope", inlined_scope, False)]


def tree_inputs(routine: RoutineIR) -> dict:
    rng = np.random.default_rng(11)
    out = {}
    for node in routine.reads:
        if node.dtype.is_float:
            out[node] = rng.standard_normal(node.dims).astype(node.dtype.storage)
        else:
            out[node] = rng.integers(-1000, 1000, node.dims).astype(node.dtype.storage)
    return out


@needs_metal
@pytest.mark.parametrize("name,build,exact", tree_cases(), ids=[c[0] for c in tree_cases()])
def test_tree_reductions_match_the_interpreter(name, build, exact):
    routine = build()
    kernels = cooperative_kernels(routine)
    assert len(kernels) == 1 and "threadgroup_barrier(mem_flags::mem_threadgroup);" in kernels[0].text, name
    threads = kernels[0].threads_per_threadgroup
    assert threads & (threads - 1) == 0 and 32 <= threads <= 256 and kernels[0].threadgroup_bytes <= 32 * 1024
    expected, got = run_both("metal", routine, tree_inputs(routine))
    for node in routine.writes:
        if exact:
            assert_same_bits(expected[node], got[node], f"{name}: {node.name}")
        else:
            np.testing.assert_allclose(got[node], expected[node], rtol=1e-5, atol=1e-4, err_msg=name)


@needs_metal
def test_short_reductions_accumulate_in_a_register():
    """Below the tree threshold a thread sums in a local, in the interpreter's order."""
    routine, x, s = reduction("short", rows=3, cols=40)
    text = emit_metal(routine).text
    assert "threadgroup" not in text.replace("threadgroup of", "").replace("threadgroups of", "")
    assert re.search(r"float v\d+ = 0\.0f;", text) and re.search(r"s\[i\d+\] = v\d+;", text)
    expected, got = run_both("metal", routine, tree_inputs(routine))
    assert_same_bits(expected[s], got[s])


@needs_metal
def test_catalog_with_threadgroup_trees_wherever_possible(monkeypatch):
    """``metal_tree_min=2`` turns every reduction the tree handles into one: the results agree
    with the interpreter within rounding (sums in another order)."""
    monkeypatch.setenv("OCANNL_METAL_TREE_MIN", "2")
    wanted = ("einsum", "compose", "reductions", "conv", "einmax", "tropical", "training step sgd", "training step adam")
    programs = [dataclasses.replace(p, exact=False) for p in catalog_for("metal") if any(w in p.name for w in wanted)]
    assert len(programs) >= 15
    report = testing.conformance("metal", programs=programs, random_programs=5)
    assert report.ok, report.summary()


@needs_metal
def test_a_deleted_barrier_computes_a_wrong_result():
    routine, x, s = reduction("no_barrier")
    program = emit_metal(routine)
    mutated = delete_first_barrier(program.text)
    inputs = tree_inputs(routine)
    expected = run_on(InterpBackend(), routine, inputs)[s]
    runner = harness.load(program, harness.toolchain(), mutated)
    got = run_runner(program, runner, inputs)[s]
    assert not np.allclose(got, expected, rtol=1e-3), "the mutation went unnoticed"


@needs_tsan
def test_thread_sanitizer_reports_a_deleted_barrier():
    """Deterministic: without the first barrier, thread 0 reads the partial result of thread
    T/2 with nothing ordering the two accesses, which ThreadSanitizer reports whatever the
    timing."""
    routine, x, s = reduction("tsan_barrier")
    program = emit_metal(routine)
    inputs = tree_inputs(routine)
    tsan = harness.toolchain("thread")
    clean = run_runner(program, harness.load(program, tsan), inputs)[s]  # no report on the real kernel
    np.testing.assert_allclose(clean, run_on(InterpBackend(), routine, inputs)[s], rtol=1e-5, atol=1e-4)
    with pytest.raises(harness.SanitizerError, match=r"(?s)ThreadSanitizer: data race.*tsan_barrier\.metal"):
        run_runner(program, harness.load(program, tsan, delete_first_barrier(program.text)), inputs)


def delete_first_barrier(text: str) -> str:
    start = text.index("  threadgroup_barrier(")
    mutated = text[:start] + text[text.index("\n", start) + 1:]
    assert mutated.count("threadgroup_barrier(") == text.count("threadgroup_barrier(") - 1
    return mutated


def run_runner(program, runner, inputs: dict) -> dict[TNode, np.ndarray]:
    """Runs a harness runner (maybe built from mutated text) on fresh buffers."""
    import ctypes

    arrays = [np.ascontiguousarray(np.array(inputs[n], n.dtype.storage)) if n in inputs else np.zeros(storage_shape(n), n.dtype.storage)
              for n in program.nodes]
    addresses = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    assert runner(addresses, np.zeros(0, np.int32), arrays) == 0
    return dict(zip(program.nodes, arrays))


# ---------------------------------------------------------------------------------------------
# Every emitted source: address spaces, no double, parses with g++ and clang++


@pytest.fixture(scope="module")
def catalog_routines() -> list[RoutineIR]:
    """The optimized routines (init routines too) of every catalog program, captured from an
    interpreter context."""
    routines: list[RoutineIR] = []
    for program in testing.catalog():
        session.reset()
        items = list(program.build())
        ctx = oc.Context("interp")
        compile_ir = ctx.backend.compile
        ctx.backend.compile = lambda r, compile_ir=compile_ir: (routines.append(r), compile_ir(r))[1]
        ctx.compile(*items)
    session.reset()
    return routines


def catalog_sources(routines: list[RoutineIR]) -> list[tuple[str, str]]:
    out = []
    for r in routines:
        try:
            out.append((r.name, emit_metal(r).text))
        except DTypeError:
            assert any(n.dtype is dtypes.float64 for n in r.reads + r.writes), r.name
    return out


def test_every_pointer_has_an_address_space_and_nothing_is_double(catalog_routines):
    sources = catalog_sources(catalog_routines)
    assert len(sources) >= 55
    for name, text in sources:
        for params in re.findall(r"kernel void \w+\((.*?)\) \{", text, re.S):
            for param in params.split(",\n"):
                if "*" in param or "&" in param:
                    assert re.match(r"\s*(device|constant|threadgroup) ", param), f"{name}: {param!r}"
        code = re.sub(r"/\*.*?\*/", "", text)
        assert not re.search(r"\b(double|std|malloc|printf)\b", code), name


def parse_all(sources: list[tuple[str, str]], compiler: str) -> None:
    """One translation unit holding every source in a namespace of its own (the shim included
    once first), parsed with ``-fsyntax-only``: one compiler start for ~100 sources."""
    parts = ["#include <metal_stdlib>"]
    for k, (name, text) in enumerate(sources):
        parts += [f"namespace source{k} {{", f'#line 1 "{re.sub(r"[^A-Za-z0-9_]", "_", name)}.metal"', text, "}"]
    tc = harness.toolchain()
    flags = [f for f in tc.flags if not f.startswith("-Wno-")]
    flags.append("-Wno-unknown-attributes" if "clang" in compiler else "-Wno-attributes")
    cmd = [compiler, *flags, "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I", str(harness.SHIM_DIR), "-x", "c++", "-"]
    result = subprocess.run(cmd, input="\n".join(parts), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[:5000]


@needs_metal
def test_every_catalog_source_parses_with_gpp(catalog_routines):
    parse_all(catalog_sources(catalog_routines), "g++")


@needs_clang
def test_every_catalog_source_parses_with_clang(catalog_routines):
    parse_all(catalog_sources(catalog_routines), "clang++")


@needs_metal
def test_the_shim_rejects_what_msl_rejects():
    tc = harness.toolchain()
    base_kernel = "#include <metal_stdlib>\nusing namespace metal;\nkernel void k(device float* x [[buffer(0)]]) {{ {} }}\n"
    harness.parse_only(base_kernel.format("x[0] = precise::exp(x[1]);"), tc)
    for body, message in (("double d = x[0]; x[1] = d;", "poisoned"), ("x[0] = std::exp(x[1]);", "poisoned"),
                          ("printf(\"hi\");", "poisoned"), ("simdgroup_barrier(mem_flags::mem_none);", "simdgroup_barrier")):
        with pytest.raises(harness.CompileError, match=message):
            harness.parse_only(base_kernel.format(body), tc)


# ---------------------------------------------------------------------------------------------
# Metal's limits


def wide_sum(n_inputs: int, statements: int = 1) -> RoutineIR:
    """``statements`` pointwise sums, each of ``n_inputs`` different nodes, over one grid."""
    stmts = []
    for s in range(statements):
        nodes = [TNode(f"in{s}_{k}", (8,)) for k in range(n_inputs)]
        out = TNode(f"out{s}", (8,))

        def total(i, nodes=nodes):
            value = Load(nodes[0], (i,))
            for node in nodes[1:]:
                value = Binary(Binop.ADD, value, Load(node, (i,)))
            return value

        stmts.append(pointwise_loop(out, total))
    return RoutineIR("wide", seq(*stmts))


def test_limits_are_checked_before_emission():
    wide = emit_metal(wide_sum(40)).kernels[0]
    check_limits(wide, "wide")  # its 41 arguments travel in an argument buffer
    direct = dataclasses.replace(wide, argument_buffer=None)
    with pytest.raises(KernelLimitError, match=r"kernel wide_k0 of routine wide takes 41 buffer arguments .*"
                                               r"at most 31: pass them in an argument buffer"):
        check_limits(direct, "wide")
    huge = dataclasses.replace(wide, params=wide.params * (MAX_ARGUMENT_BUFFER_ENTRIES // len(wide.params) + 1))
    with pytest.raises(KernelLimitError, match=r"its argument buffer wide_k0_args holds \d+ buffer arguments "
                                               r"\(in0_0, .* and \d+ more\), and Metal allows at most 500000"):
        check_limits(huge, "wide")
    reduce, _, _ = reduction("big_group", rows=1, cols=4096)
    with pytest.raises(KernelLimitError, match="2048 threads per threadgroup, and Metal allows at most 1024"):
        emit_metal(reduce, Options(threads_per_threadgroup=2048, tree_terms_per_thread=1))
    kernel = emit_metal(reduce).kernels[0]
    with pytest.raises(KernelLimitError, match="40000 bytes of threadgroup memory, and Metal allows at most 32768"):
        check_limits(dataclasses.replace(kernel, threadgroup_bytes=40000), "big_group")
    check_limits(kernel, "big_group")


def broadcast_add(rows: int, cols: int) -> RoutineIR:
    """``c[i, j] = a[i, 0] + b[0, j]`` in float16, optimized with ``a``, ``b`` and ``c`` stored:
    nothing is allocated until it runs."""
    a, b, c = TNode("a", (rows, 1), dtypes.float16), TNode("b", (1, cols), dtypes.float16), TNode("c", (rows, cols), dtypes.float16)
    i, j = Symbol(), Symbol()
    add = accum(c, None, Binop.ADD, (a, b), [(i, rows), (j, cols)], (Iter(i), Iter(j)),
                ((Iter(i), Fixed(0)), (Fixed(0), Iter(j))))
    routine = lower_routine("broadcast", add)
    return optimize(routine, materialized_nodes(routine) | {a, b})


def test_a_buffer_over_2_31_cells_is_indexed_in_64_bits():
    """A float16 broadcast add of 65537 x 1 and 1 x 32769 (2**31 + 98305 cells), counted in
    ``int``, wrapped around and wrote outside its output. Every index and offset of such a
    routine is a ``long``, and its grid, more points than a 32-bit thread position numbers, is
    walked by a loop in each of the threads launched; a small routine keeps ``int``. Generated
    code only: nothing of 2**31 cells is allocated."""
    program = emit_metal(broadcast_add(65537, 32769))
    (kernel,) = program.kernels
    assert program.index_dtype is dtypes.int64 and not re.search(r"\bint\b", kernel.text)
    launched = kernel.threadgroups * kernel.threads_per_threadgroup
    assert launched == Options().max_grid_threads < 2**31
    lines = kernel.text.splitlines()
    assert f"  for (long _g = long(gid.x); _g < {65537 * 32769}; _g += {launched}) {{  /* this thread's grid points */" in lines
    assert "    c[32769*i0 + i1] = half((float(a[i0]) + float(b[i1])));" in lines
    small = emit_metal(broadcast_add(3, 5))
    assert small.index_dtype is dtypes.int32 and "  const int _g = int(gid.x);  /* this thread's grid point */" in small.text
    if HAVE_METAL:
        parse_all([("wide", program.text)], "g++")


@needs_metal
def test_a_grid_of_more_points_than_threads_launched_matches_the_interpreter():
    """With at most 64 threads launched, each thread walks its points 64 apart: a broadcast add
    and a kernel of two statements on 1000 points compute the interpreter's values."""
    x, y, z = TNode("x", (1000,)), TNode("y", (1000,)), TNode("z", (1000,))
    twice = pointwise_loop(y, lambda i: Binary(Binop.MUL, Load(x, (i,)), Const(2.0)))
    plus_one = pointwise_loop(z, lambda i: Binary(Binop.ADD, Load(y, (i,)), Const(1.0)))
    rng = np.random.default_rng(3)
    for routine in (broadcast_add(30, 50), RoutineIR("two_statements", seq(twice, plus_one))):
        program = emit_metal(routine, Options(max_grid_threads=64))
        assert all(k.threadgroups * k.threads_per_threadgroup <= 64 for k in program.kernels)
        assert "_g += 64) {" in program.text
        inputs = {n: rng.uniform(-2, 2, storage_shape(n)).astype(n.dtype.storage) for n in routine.reads}
        expected = run_on(InterpBackend(), routine, inputs)
        got = run_runner(program, harness.load(program, harness.toolchain()), inputs)
        for node in routine.writes:
            assert_same_bits(expected[node], got[node], f"{routine.name}: {node.name}")


@needs_metal
def test_a_kernel_of_many_statements_is_launched_in_parts():
    """70 pointwise statements on one grid, one kernel of the partition, launch as kernels of
    at most PART_STATEMENTS statements each (the compiler's time stays linear), in order."""
    from ocannl.backends.codegen import PART_STATEMENTS

    nodes = [TNode(f"t{k}", (16,)) for k in range(71)]
    steps = [pointwise_loop(nodes[k + 1], lambda i, k=k: Binary(Binop.ADD, Load(nodes[k], (i,)), Const(float(k))))
             for k in range(70)]
    routine = RoutineIR("chain", seq(*steps))
    kernels = emit_metal(routine).kernels
    assert len(kernels) == -(-70 // PART_STATEMENTS)
    assert [k.text.count(" = (t") for k in kernels] == [PART_STATEMENTS, PART_STATEMENTS, 70 - 2 * PART_STATEMENTS]
    expected, got = run_both("metal", routine, {nodes[0]: np.arange(16, dtype=np.float32)})
    for node in routine.writes:
        assert_same_bits(expected[node], got[node], node.name)


def chain_of_pointwise_ops(n: int, term: str):
    """``n`` steps ``y := y * 1.0001 + t`` (2n ops), ``t`` the constant 0.5 or ``y`` itself (which
    the optimizer does not inline: one stored statement per step)."""
    y = oc.tensor(np.ones(8, np.float32))
    for _ in range(n):
        y = y * 1.0001 + (0.5 if term == "constant" else y)
    return y


@needs_metal
@pytest.mark.slow
@pytest.mark.parametrize("term", ["constant", "itself"])
def test_a_chain_of_2000_pointwise_ops_compiles_within_twice_the_time_of_c(monkeypatch, tmp_path, term):
    """Partitioning took time quadratic in the statements of a kernel, and the shim's compiler
    time superlinear in a kernel's length: a chain of 2,000 ops took minutes on metal. Both
    backends compile into a fresh cache, their toolchains already probed."""
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path))
    seconds = {}
    for backend in ("c", "metal"):
        session.reset()
        oc.Context(backend).compile(chain_of_pointwise_ops(1, term))
        session.reset()
        y = chain_of_pointwise_ops(1000, term)
        ctx = oc.Context(backend)
        start = time.perf_counter()
        ctx.compile(y)
        seconds[backend] = time.perf_counter() - start
    assert seconds["metal"] <= 2 * seconds["c"], seconds


def wide_slice() -> tuple[RoutineIR, list[TNode], TNode, IndexSymbol]:
    """``out[i] = x[row, i] + in0[i] + ... + in31[i]``: 34 buffers, the symbol ``row`` (no size:
    its access is checked when it runs) and the status buffer, 36 arguments."""
    inputs = [TNode(f"in{k}", (8,)) for k in range(32)]
    x, out, row = TNode("x", (3, 8)), TNode("out", (8,)), IndexSymbol("row")

    def total(i):
        value = Load(x, (Iter(row), i))
        for node in inputs:
            value = Binary(Binop.ADD, value, Load(node, (i,)))
        return value

    return RoutineIR("wide", pointwise_loop(out, total)), inputs, x, row


def test_a_kernel_over_31_arguments_takes_one_argument_buffer():
    """The struct holds every argument (pointers with their address space, the symbol by value,
    the status buffer); the kernel binds only it and copies the members to the usual names."""
    routine, _, _, _ = wide_slice()
    (kernel,) = emit_metal(routine).kernels
    assert kernel.argument_buffer == "wide_k0_args" and len(kernel.params) == 36
    for line in ("struct wide_k0_args {", "  device const float* in0 [[id(0)]];", "  device float* out [[id(32)]];",
                 "  long _s_row [[id(34)]];", "  device atomic_int* _status [[id(35)]];",
                 "    constant wide_k0_args& _args [[buffer(0)]],", "  device const float* in31 = _args.in31;",
                 "  long _s_row = _args._s_row;", "  device atomic_int* _status = _args._status;"):
        assert line in kernel.text.splitlines(), line
    assert "[[buffer(1)]]" not in kernel.text
    narrow = emit_metal(wide_sum(30)).kernels[0]
    assert narrow.argument_buffer is None and "[[buffer(30)]]" in narrow.text and "struct" not in narrow.text


@needs_metal
@pytest.mark.parametrize("statements", [1, 6])
def test_a_kernel_over_31_arguments_matches_the_interpreter(statements):
    routine = wide_sum(40 if statements == 1 else 10, statements)  # 41 or 66 buffers on one grid
    program = emit_metal(routine)
    assert len(program.kernels) == 1 and program.kernels[0].argument_buffer
    inputs = {n: np.arange(8, dtype=np.float32) * (k + 1) for k, n in enumerate(routine.reads)}
    expected, got = run_both("metal", routine, inputs)
    for node in routine.writes:
        assert_same_bits(expected[node], got[node], node.name)


@needs_metal
def test_an_argument_buffer_carries_symbols_and_the_status():
    routine, inputs, x, row = wide_slice()
    values = {node: np.full(8, k + 1.0, np.float32) for k, node in enumerate(inputs)}
    values[x] = np.arange(24, dtype=np.float32).reshape(3, 8)
    expected, got = run_both("metal", routine, values, {row: 2})
    (out,) = routine.writes
    assert_same_bits(expected[out], got[out])
    assert got[out].tolist() == [16.0 + 528.0 + k for k in range(8)]
    with pytest.raises(OutOfBoundsError, match="x"):
        run_on(MetalBackend(), routine, values, {row: 3})
    for compiler in ("g++", "clang++") if HAVE_CLANG else ("g++",):  # -Wall -Wextra -Werror
        parse_all([("wide", emit_metal(routine).text)], compiler)


def scalar_neuron(n: int):
    """micrograd's style: a neuron over ``n`` inputs, every weight and input a tensor of one
    number, ``relu(b + sum_k w_k * x_k)``: one grid point reading 2n + 1 tensors."""
    ws = [oc.param(f"w{k}", output=1, init=np.array([0.1 * (k + 1)]), dtype="float32") for k in range(n)]
    xs = [oc.tensor(np.array([1.0 - 0.25 * k], np.float32)) for k in range(n)]
    b = oc.param("b", output=1, init=np.array([0.5]), dtype="float32")
    total = b
    for w, x in zip(ws, xs):
        total = total + w * x
    return total.relu(), ws + [b]


@needs_metal
def test_a_scalar_program_of_38_buffers_runs_on_metal_like_interp():
    """18 weights, 18 inputs, a bias and the output: 38 buffers in one kernel (a
    :class:`KernelLimitError` before argument buffers); then its training step."""
    results = {}
    for backend in ("interp", "metal"):
        session.reset()
        out, params = scalar_neuron(18)
        ctx = oc.Context(backend)
        forward = ctx.compile(out)
        if backend == "metal":
            (kernel,) = forward._executable.program.kernels
            assert len(kernel.params) == 38 and kernel.argument_buffer
        forward.run()
        loss = (out - 1.0) ** 2
        step = ctx.compile(train.sgd_update(train.grad_update(loss), lr=0.01))
        step.run()
        results[backend] = [ctx.get(out.value)] + [ctx.get(p.value) for p in params]
    for want, got in zip(results["interp"], results["metal"]):
        assert_same_bits(want, got)


# ---------------------------------------------------------------------------------------------
# The normal API


@needs_metal
def test_context_and_environment_select_metal_but_auto_never_picks_it(monkeypatch, tmp_path):
    x = oc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), batch=1)
    y = oc.relu(x * 2 - 3)
    ctx = oc.Context("metal", debug_dir=tmp_path)
    ctx.compile(y).run()
    assert ctx.get(y.value).tolist() == [[0.0, 0.0, 1.0], [3.0, 5.0, 7.0]]
    (source,) = tmp_path.glob("*.metal")
    assert "kernel void" in source.read_text()
    monkeypatch.setenv("OCANNL_BACKEND", "metal")
    assert oc.Context.auto().backend_name == "metal"
    monkeypatch.delenv("OCANNL_BACKEND")
    assert oc.Context.auto().backend_name != "metal"
    for name in ("c", "triton"):  # nothing better available: still interp, never the shim
        registration = registry._registry[name]
        monkeypatch.setitem(registry._registry, name, dataclasses.replace(registration, factory=_Unavailable))
    assert registry.best_available() == "interp" and oc.Context.auto().backend_name == "interp"


class _Unavailable:
    name = "unavailable"

    def available(self):
        return False, "disabled by the test"


@needs_metal
def test_moons_trains_on_metal_as_on_c():
    from examples.moons import train_moons

    if not registry.get_backend("c").available()[0]:
        pytest.skip("no C compiler")
    on_c = train_moons(oc.Context("c"), epochs=1, n_points=100)
    session.reset()
    on_metal = train_moons(oc.Context("metal"), epochs=1, n_points=100)
    assert len(on_metal["step_losses"]) == 10
    np.testing.assert_allclose(on_metal["step_losses"], on_c["step_losses"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(on_metal["epoch_losses"][-1], on_c["epoch_losses"][-1], rtol=1e-5)


def test_no_compiler_is_backend_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("OCANNL_METAL_CXX", "/nonexistent/g++")
    ok, reason = MetalBackend().available()
    assert not ok and "OCANNL_METAL_CXX='/nonexistent/g++'" in reason and "C++20 shim" in reason
    with pytest.raises(BackendUnavailable, match="metal"):
        oc.Context("metal")


# ---------------------------------------------------------------------------------------------
# Golden .metal files of canonical programs (emitted only: no compiler needed)


def golden_broadcast_add():
    x, b, y = TNode("x", (2, 3)), TNode("b", (1, 3)), TNode("y", (2, 3))
    i, j = Symbol(), Symbol()
    return accum(y, None, Binop.ADD, (x, b), [(i, 2), (j, 3)], (Iter(i), Iter(j)),
                 ((Iter(i), Iter(j)), (Fixed(0), Iter(j))), spec=".")


def golden_einsum_reduction():
    """``s =:+ x ~logic:"bij=>bj"`` and a row max into float16, then a long row sum that runs
    as a threadgroup tree."""
    x, s = TNode("x", (2, 5, 3)), TNode("s", (2, 3))
    m = TNode("m", (2, 5), dtypes.float16)
    long_x, long_s = TNode("long_x", (3, 1024)), TNode("long_s", (3,))
    sum_and_max = sum_and_max_over_middle(x, s, m)
    r, c = Symbol(), Symbol()
    return Block((
        *sum_and_max,
        accum(long_s, Binop.ADD, Unop.ID, (long_x,), [(r, 3), (c, 1024)], (Iter(r),), ((Iter(r), Iter(c)),),
              init=True, spec="rc=>r"),
    ))


def golden_conv():
    return padded_conv1d(TNode("x", (8,)), TNode("w", (3,)), TNode("y", (4,)), 2, 1)


def golden_uniform_init():
    return prng.uniform_fill(TNode("w", (3, 4)), seed=0, stream=7, low=-1.0, high=1.0)


GOLDEN = {
    "matmul": lambda: matmul(TNode("a", (8, 32)), TNode("b", (32, 16)), TNode("c", (8, 16))),
    "broadcast_add": golden_broadcast_add,
    "einsum_reduction": golden_einsum_reduction,
    "conv": golden_conv,
    "uniform_init": golden_uniform_init,
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_metal(name, update_golden):
    routine = lower_routine(name, GOLDEN[name]())
    check_golden(f"metal/{name}.metal", emit_metal(routine).text, update_golden)


@needs_metal
@pytest.mark.parametrize("name", GOLDEN)
def test_golden_programs_run_like_the_interpreter(name):
    routine = lower_routine(name, GOLDEN[name]())
    expected, got = run_both("metal", routine, random_inputs(routine, seed=len(name)))
    for node in routine.writes:
        if node.name == "long_s":  # the threadgroup tree sums in another order
            np.testing.assert_allclose(got[node], expected[node], rtol=1e-5, atol=1e-4)
        else:
            assert_same_bits(expected[node], got[node], node.name)


# ---------------------------------------------------------------------------------------------
# Slow: sanitizers and clang over the whole catalog


@needs_metal
@pytest.mark.slow
def test_catalog_under_address_and_undefined_behaviour_sanitizers(monkeypatch):
    monkeypatch.setenv("OCANNL_METAL_SANITIZE", "address,undefined")
    report = testing.conformance("metal", programs=catalog_for("metal"), random_programs=20)
    assert report.ok, report.summary()


@needs_metal
@pytest.mark.slow
def test_an_argument_buffer_under_address_and_undefined_behaviour_sanitizers(monkeypatch):
    """Each buffer its own allocation of exactly its size: a member pointing at the wrong
    buffer, or a wrong type, would read out of bounds."""
    monkeypatch.setenv("OCANNL_METAL_SANITIZE", "address,undefined")
    test_an_argument_buffer_carries_symbols_and_the_status()


@needs_tsan
@pytest.mark.slow
def test_reduction_kernels_under_thread_sanitizer(monkeypatch):
    monkeypatch.setenv("OCANNL_METAL_SANITIZE", "thread")
    for name, build, exact in tree_cases():
        routine = build()
        expected, got = run_both("metal", routine, tree_inputs(routine))
        for node in routine.writes:
            np.testing.assert_allclose(got[node], expected[node], rtol=1e-5, atol=1e-4, err_msg=name)
    monkeypatch.setenv("OCANNL_METAL_TREE_MIN", "2")  # every reduction of the catalog as a tree
    programs = [dataclasses.replace(p, exact=False) for p in catalog_for("metal")]
    report = testing.conformance("metal", programs=programs, random_programs=20)
    assert report.ok, report.summary()


@needs_metal
@pytest.mark.slow
def test_address_sanitizer_reports_an_off_by_one_read():
    routine, x, s = reduction("off_by_one")
    program = emit_metal(routine)
    mutated = program.text.replace("x[1000*i0 + i1]", "x[1000*i0 + i1 + 1]")
    assert mutated != program.text
    runner = harness.load(program, harness.toolchain("address,undefined"), mutated)
    with pytest.raises(harness.SanitizerError, match=r"(?s)heap-buffer-overflow.*off_by_one\.metal"):
        run_runner(program, runner, tree_inputs(routine))


@needs_clang
@pytest.mark.slow
def test_catalog_compiled_by_clang(monkeypatch):
    monkeypatch.setenv("OCANNL_METAL_CXX", "clang++")
    assert harness.toolchain().is_clang
    report = testing.conformance("metal", programs=catalog_for("metal"), random_programs=10)
    assert report.ok, report.summary()
    monkeypatch.setenv("OCANNL_METAL_TREE_MIN", "2")
    for name, build, exact in tree_cases():
        routine = build()
        expected, got = run_both("metal", routine, tree_inputs(routine))
        for node in routine.writes:
            np.testing.assert_allclose(got[node], expected[node], rtol=1e-5, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("value", ["0", "-1", "2.5", "many"])
def test_thread_and_tree_settings_must_be_positive_integers(monkeypatch, value):
    from ocannl.backends.metal.backend import options
    from ocannl.errors import OcannlError

    for setting in ("METAL_THREADS", "METAL_TREE_MIN"):
        monkeypatch.setenv(f"OCANNL_{setting}", value)
        with pytest.raises(OcannlError, match=rf"setting {setting.lower()} \(OCANNL_{setting}\) must be a positive "
                                              rf"integer, got '{re.escape(value)}': unset it for its default \(256\)"):
            options()
        monkeypatch.delenv(f"OCANNL_{setting}")
    monkeypatch.setenv("OCANNL_METAL_THREADS", "64")
    assert options().threads_per_threadgroup == 64
