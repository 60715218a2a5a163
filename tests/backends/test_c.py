"""The C backend against the interpreter, bit for bit: the constructs of the loop IR on
hand-built routines, training steps through the frontend, the register-tiled contractions and
OpenMP loops, float16/bfloat16 rounding without a native ``_Float16`` (every operator, cast,
storage format and PRNG operator, and the conformance catalog, are tests/backends/test_c_family.py's,
shared with Metal); then the compiler driver (no compiler, the kernel cache under
concurrent processes), sanitization of hostile labels, and golden ``.c`` files under golden/c/.

Floats compare bit for bit (NaNs as NaNs, whatever their payload) except the results of libm
functions (exp, log, sin, cos, tanh, pow...), which glibc and numpy compute to within an ulp or
two of each other, not identically.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ocannl as oc
from golden import check_golden
from handbuilt import accum, broadcast_add, matmul, matvec, padded_conv1d, pointwise_loop, sum_and_max_over_middle
from helpers import (
    assert_same_bits, data, float16_bfloat16_routine, float16_bfloat16_values, random_inputs, run_both, run_on,
)
from ocannl import nn, session, testing, train
from ocannl.backends import registry
from ocannl.backends.c import CBackend, CExecutable
from ocannl.backends.c import compiler
from ocannl.backends.c.emit import emit_c, function_name
from ocannl.lowlevel.cpu_schedule import PARALLEL_MIN_WORK, TILE_PARALLEL_MIN_WORK, plan_contraction
from ocannl.backends.interp import InterpBackend
from ocannl.errors import BackendUnavailable
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import Block
from ocannl.lowlevel.indexing import Affine, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Fill, GetLocal, Load, LoadDynamic, Local, LocalScope,
    RoutineIR, SetLocal, Store, Ternary, Unary, loop, seq,
)
from ocannl.lowlevel.lower import lower_routine
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode

HAVE_CC = CBackend().available()[0]
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no working C compiler here")

@pytest.fixture(autouse=True)
def deterministic_flags(monkeypatch):
    """These tests compare bits: the fast setting (contraction) is off whatever the environment says."""
    monkeypatch.setenv("OCANNL_C_FAST", "0")


@needs_cc
def test_embedded_indices_affine_and_static():
    sym = IndexSymbol("step_n", 10)
    i, j = Symbol(), Symbol()
    a = TNode("a", (3, 4), dtypes.int32)
    b = TNode("b", (3, 4), dtypes.float32)
    c = TNode("c", (3, 4), dtypes.int64)
    body = loop(i, 3, loop(j, 4, seq(
        Store(a, (Iter(i), Iter(j)), EmbedIndex(Affine(((4, i), (1, j)), -5))),
        Store(b, (Iter(i), Iter(j)), Cast(EmbedIndex(Affine(((2, sym), (-1, j)), 1)), dtypes.float32)),
        Store(c, (Iter(i), Iter(j)), EmbedIndex(Iter(sym), dtypes.int64)),
    )))
    expected, got = run_both("c", RoutineIR("embed", body), {}, {sym: 7})
    for node in (a, b, c):
        assert_same_bits(expected[node], got[node], node.name)
    assert got[b][0, 0] == 15.0


# ---------------------------------------------------------------------------------------------
# Storage formats: float16 and bfloat16


@needs_cc
def test_software_float16_conversions_without_Float16(tmp_path, monkeypatch):
    """The fallback for compilers without ``_Float16`` converts like numpy: every half bit
    pattern to float, and random and special floats to half."""
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path))
    n = 1 << 16
    routine, x, outs = float16_bfloat16_routine(n)
    source = emit_c(routine, parallel=False)
    tc = compiler.toolchain()
    no_float16 = dataclasses.replace(tc, flags=tc.flags + ("-DOCANNL_NO_FLOAT16",))
    executable = CExecutable(routine, source, compiler.compile_shared(source.text, no_float16))
    values = float16_bfloat16_values(n)
    values[: 1 << 15] = np.arange(1 << 16, dtype=np.uint16).view(np.float16)[::2].astype(np.float32)
    buffers_c = {node: np.zeros(node.dims, node.dtype.storage) for node in outs}
    buffers_c[x] = values
    executable.run(buffers_c, {})
    expected = run_on(InterpBackend(), routine, {x: values})
    for node in outs:
        assert_same_bits(expected[node], buffers_c[node], node.name)
    h = TNode("h16", (1 << 16,), dtypes.float16)
    y = TNode("y32", (1 << 16,), dtypes.float32)
    every_half = RoutineIR("every_half", pointwise_loop(y, lambda i: Load(h, (i,))))
    source = emit_c(every_half, parallel=False)
    run = CExecutable(every_half, source, compiler.compile_shared(source.text, no_float16))
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    out = np.zeros(1 << 16, np.float32)
    run.run({h: halves.copy(), y: out}, {})
    assert_same_bits(halves.astype(np.float32), out, "every half to float")


# ---------------------------------------------------------------------------------------------
# Locals, where, dynamic indices, checks


@needs_cc
def test_locals_scopes_and_lazy_where():
    n = 6
    x = TNode("x", (n, 5), dtypes.float32)
    ids = TNode("ids", (n,), dtypes.int32)
    table = TNode("table", (4,), dtypes.float32)
    running, scoped, chosen = (TNode(name, (n,), dtypes.float32) for name in ("running", "scoped", "chosen"))
    i, j, k = Symbol(), Symbol(), Symbol()
    acc, s = Local(dtypes.float32), Local(dtypes.float32)
    row_sum = LocalScope(s, seq(SetLocal(s, Const(0.5)), loop(k, 5, SetLocal(s, Binary(Binop.ADD, GetLocal(s), Load(x, (Iter(i), Iter(k))))))))
    # where the condition is false, ids[i] is out of the table: only the chosen branch may run
    gather = LoadDynamic(table, 0, Load(ids, (Iter(i),)), ())
    cond = Binary(Binop.GT, Load(x, (Iter(i), Fixed(0))), Const(0.0))
    body = seq(
        Comment("a running total in a local declared per row"),
        loop(i, n, seq(
            DeclareLocal(acc),
            loop(j, 5, SetLocal(acc, Binary(Binop.MAX, GetLocal(acc), Load(x, (Iter(i), Iter(j)))))),
            Store(running, (Iter(i),), GetLocal(acc)),
            Store(scoped, (Iter(i),), Binary(Binop.MUL, row_sum, Const(2.0))),
            Store(chosen, (Iter(i),), Ternary(Ternop.WHERE, cond, gather, row_sum)),
        )),
    )
    xs = np.random.default_rng(1).standard_normal((n, 5)).astype(np.float32)
    xs[:, 0] = [1.0, -1.0, 2.0, -2.0, 0.5, 0.0]
    inputs = {x: xs, ids: np.array([1, 99, 3, -7, 0, 12], np.int32), table: np.array([10, 20, 30, 40], np.float32)}
    routine = RoutineIR("locals", body)
    expected, got = run_both("c", routine, inputs)
    for node in (running, scoped, chosen):
        assert_same_bits(expected[node], got[node], node.name)
    assert "if (" in emit_c(routine).text  # the branch holding a scope became an if


@needs_cc
def test_margins_fills_and_guarded_stores():
    n = 5
    x = TNode("x", (n,), dtypes.float32)
    shifted = TNode("shifted", (n,), dtypes.float32)
    guarded = TNode("guarded", (n,), dtypes.float32)
    filled = TNode("filled", (2, 3), dtypes.bfloat16)
    i = Symbol()
    body = seq(
        Fill(filled, Const(1.3)),
        Fill(guarded, Const(-1.0)),
        loop(i, n, seq(
            Store(shifted, (Iter(i),), Load(x, (Affine(((1, i),), 2),), oob_value=-7.0)),
            Store(guarded, (Affine(((2, i),), -3),), Load(x, (Iter(i),)), skip_oob=True),
        )),
    )
    expected, got = run_both("c", RoutineIR("margins", body), {x: np.arange(1, n + 1, dtype=np.float32)})
    for node in (shifted, guarded, filled):
        assert_same_bits(expected[node], got[node], node.name)
    assert got[shifted].tolist() == [3, 4, 5, -7, -7]


# ---------------------------------------------------------------------------------------------
# The frontend: the conformance catalog and training, bit for bit


@needs_cc
def test_mlp_training_steps_are_bit_identical():
    def run(backend):
        session.reset()
        rng = np.random.default_rng(2)
        x = oc.tensor(rng.standard_normal((16, 2)).astype(np.float32), batch=1)
        y = oc.tensor(np.sign(rng.standard_normal((16, 1))).astype(np.float32), batch=1)
        w1, b1 = oc.param("w1", output=24), oc.param("b1", output=24, init=0.0)
        w2 = oc.param("w2", output=1)
        out = w2 @ oc.relu(w1 @ x + b1)
        loss = (1 - y * out).relu().mean()
        update = train.grad_update(loss)
        ctx = oc.Context(backend)
        step = ctx.compile(update, train.sgd_update(update, lr=0.1, momentum=0.9, weight_decay=1e-4))
        for _ in range(5):
            step.run()
        return [ctx.get(t.value) for t in (w1, b1, w2, loss)]

    for a, b in zip(run("interp"), run("c")):
        assert_same_bits(a, b)


@needs_cc
def test_debug_dir_gets_the_c_source(tmp_path):
    x = oc.tensor(np.ones((2, 3), np.float32), batch=1)
    y = oc.relu(x * 2 + 1)
    ctx = oc.Context("c", debug_dir=tmp_path)
    ctx.compile(y).run()
    assert np.array_equal(ctx.get(y.value), np.full((2, 3), 3, np.float32))
    (source,) = tmp_path.glob("*.c")
    assert "ocannl_relu_" in source.read_text()


# ---------------------------------------------------------------------------------------------
# Contractions: register tiles, loop orders, OpenMP


def contraction_cases():
    """(name, builder) pairs; each builder returns the tensors to compute, in a fresh session."""

    def matmul_ragged():
        return [oc.tensor(data(37, 53), input=1) @ oc.tensor(data(53, 29), input=1)]

    def matmul_float64():
        return [oc.tensor(data(20, 30, dtype=np.float64), input=1) @ oc.tensor(data(30, 18, dtype=np.float64), input=1)]

    def batched():
        return [oc.einsum("b|ik;b|kj=>b|ij", oc.tensor(data(3, 9, 17), batch=1),
                          oc.tensor(data(3, 17, 21), batch=1))]

    def matvec_scope():  # the matmul inlined into relu by the optimizer: a local-scope accumulator
        x = oc.tensor(data(40, 24), batch=1)
        w = oc.param("w", output=33)
        return [oc.relu(w @ x)]

    def reduction_first():  # the weight gradient sums over the batch, its outermost loop
        x = oc.tensor(data(40, 24), batch=1)
        w = oc.param("w", output=33)
        return [train.grad_update((w @ x).sum())]

    def conv_padded():
        x = oc.tensor(data(2, 12, 10, 3), batch=1)
        k = oc.tensor(data(5, 3, 3, 3), input=1)
        return [oc.einsum("b|2*oh=+kh,2*ow=+kw,ci;co->kh,kw,ci=>b|oh,ow,co", x, k)]

    def max_tropical():
        return [oc.tropical("ik;kj=>ij", oc.tensor(data(24, 40)), oc.tensor(data(40, 20)))]

    def reduce_rows():
        return [oc.einsum("ij=>i", oc.tensor(data(300, 70)))]

    return [(f.__name__, f) for f in (matmul_ragged, matmul_float64, batched, matvec_scope, reduction_first,
                                      conv_padded, max_tropical, reduce_rows)]


@needs_cc
@pytest.mark.parametrize("name,build", contraction_cases(), ids=[n for n, _ in contraction_cases()])
def test_tiled_contractions_are_bit_identical(name, build):
    program = testing.Program(name, build)
    expected = testing.run_program(program, "interp")
    got = testing.run_program(program, "c")
    for node, value in expected.items():
        assert_same_bits(value, got[node], f"{name}: {node}")


def _conv_chain_buffers(backend: str) -> tuple[dict[str, np.ndarray], str]:
    """Two padded convolutions summed, one SGD-free gradient pass, with an infinity, a NaN and
    negative zeros among the inputs and the second kernel: every kept buffer, and the source."""
    session.reset()
    oc.seed(0)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 6, 6, 8)).astype(np.float32)
    x[0, 1, 2, 3], x[1, 0, 0, 0], x[2, 3, 3, 1] = np.inf, -0.0, np.nan
    conv1, conv2 = nn.conv2d(8, label="conv1"), nn.conv2d(16, label="conv2")
    update = train.grad_update(conv2(conv1(oc.tensor(x, batch=1, label="x"))).sum(label="loss"))
    ctx = oc.Context(backend)
    routine = ctx.compile(update)
    kernel = ctx.get(conv2.kernel.value)
    kernel[3, 0, 0, 2], kernel[5, 1, 1, 0], kernel[7, 2, 2, 7], kernel[1, 0, 1, 2] = -np.inf, -0.0, np.nan, -0.0
    ctx.set(conv2.kernel.value, kernel)
    routine.run()
    source = routine._executable.source.text if backend == "c" else ""
    return {n.debug_name: ctx.get(n) for n in routine.ir.writes if n.memory_mode is None}, source


@needs_cc
def test_vector_tiles_keep_every_bit():
    """Convolutions in vector tiles (a kernel read across its channels with a stride, an input
    gradient whose terms sit in a ``where``): the interpreter's bits, infinities, NaNs and
    negative zeros included, where a padding term would turn an infinite weight into a NaN if
    it were computed rather than skipped."""
    want, _ = _conv_chain_buffers("interp")
    got, source = _conv_chain_buffers("c")
    if compiler.toolchain().vector_bytes >= 32:
        assert "_vb0_0_0 = _vb0_0_0 + (" in source and "? " in source
    assert set(got) == set(want) and "conv2_kernel.grad" in got
    for name, array in got.items():
        assert_same_bits(want[name], array, name)


@needs_cc
def test_contraction_forms_are_tiled():
    session.reset()
    x = oc.tensor(np.ones((40, 24), np.float32), batch=1)
    w = oc.param("w", output=33)
    y = oc.relu(w @ x)
    ctx = oc.Context("c")
    forward = ctx.compile(y)
    update = ctx.compile(train.grad_update(y.sum()))
    assert "_tile0(" in forward._executable.source.text  # the local-scope form
    assert update._executable.source.text.count("_tile") >= 4  # forward and weight gradient
    for routine in (forward, update):
        routine.run()


def test_a_bfloat16_contraction_rounds_every_step():
    """A tile keeps each cell in a register, but a bfloat16 result is rounded after every step,
    as the loop that stores it each time does."""
    a, b = TNode("a", (8, 16), dtypes.float32), TNode("b", (16, 40), dtypes.float32)
    c = TNode("c", (8, 40), dtypes.bfloat16)
    i, j, k = Symbol(), Symbol(), Symbol()
    asg = accum(c, Binop.ADD, Binop.MUL, (a, b), [(i, 8), (j, 40), (k, 16)], (Iter(i), Iter(j)),
                ((Iter(i), Iter(k)), (Iter(k), Iter(j))), init=True)
    routine = lower_routine("bf16_matmul", asg)
    assert plan_contraction(routine.body) is not None
    source = emit_c(routine).text
    assert "ocannl_bf16_to_f32(ocannl_f32_to_bf16(" in source
    if HAVE_CC:
        rng = np.random.default_rng(4)
        inputs = {a: rng.standard_normal((8, 16)).astype(np.float32), b: rng.standard_normal((16, 40)).astype(np.float32)}
        expected, got = run_both("c", routine, inputs)
        assert_same_bits(expected[c], got[c])


@needs_cc
def test_big_parallel_loops_use_openmp_and_stay_identical():
    """An elementwise loop of ``PARALLEL_MIN_WORK`` iterations and register tiles of
    ``TILE_PARALLEL_MIN_WORK`` multiply-adds (256 x 256 cells of 32 terms) run on threads."""
    n = PARALLEL_MIN_WORK
    x, y = TNode("x", (n,), dtypes.float32), TNode("y", (n,), dtypes.float32)
    a, b = TNode("a", (256, 32), dtypes.float32), TNode("b", (32, 256), dtypes.float32)
    c = TNode("c", (256, 256), dtypes.float32)
    i, j, k = Symbol(), Symbol(), Symbol()
    mm = accum(c, Binop.ADD, Binop.MUL, (a, b), [(i, 256), (j, 256), (k, 32)], (Iter(i), Iter(j)),
               ((Iter(i), Iter(k)), (Iter(k), Iter(j))), init=True)
    assert 256 * 256 * 32 >= TILE_PARALLEL_MIN_WORK
    body = seq(pointwise_loop(y, lambda i: Binary(Binop.MAX, Binary(Binop.MUL, Load(x, (i,)), Const(1.5)), Const(0.25))),
               lower_routine("mm", mm).body)
    routine = RoutineIR("parallel", body)
    text = emit_c(routine).text
    assert text.count("#pragma omp parallel for") == 2 and "collapse(2)" in text
    assert work_of(body) >= PARALLEL_MIN_WORK
    rng = np.random.default_rng(9)
    inputs = {x: rng.standard_normal(n).astype(np.float32), a: rng.standard_normal((256, 32)).astype(np.float32),
              b: rng.standard_normal((32, 256)).astype(np.float32)}
    expected, got = run_both("c", routine, inputs)
    for node in (y, c):
        assert_same_bits(expected[node], got[node], node.name)


@needs_cc
def test_loops_in_parallel_regions_ask_for_vector_loops_and_stay_identical():
    """OpenMP's outlined region loses the buffers' ``restrict``, so GCC's -O2 left an elementwise
    loop inside it scalar: the innermost independent loop asks for a vector loop, printed with the
    parallel pragma when it is the parallel loop itself."""
    n, rows = PARALLEL_MIN_WORK, PARALLEL_MIN_WORK // 64
    x, y = TNode("x", (n,), dtypes.float32), TNode("y", (n,), dtypes.float32)
    u, v = TNode("u", (rows, 64), dtypes.float32), TNode("v", (rows, 64), dtypes.float32)
    i, j = Symbol(), Symbol()
    relu = loop(i, rows, loop(j, 64, Store(v, (Iter(i), Iter(j)), Unary(Unop.RELU, Load(u, (Iter(i), Iter(j)))))))
    body = seq(pointwise_loop(y, lambda i: Binary(Binop.MUL, Load(x, (i,)), Const(1.5))), relu)
    routine = RoutineIR("vector_regions", body)
    text = emit_c(routine, vector_bytes=64).text
    assert text.count("#pragma omp parallel for simd") == 1
    assert text.count("#pragma omp parallel for\n") == 1 and text.count("#pragma omp simd") == 1
    rng = np.random.default_rng(4)
    inputs = {x: rng.standard_normal(n).astype(np.float32), u: rng.standard_normal((rows, 64)).astype(np.float32)}
    expected, got = run_both("c", routine, inputs)
    for node in (y, v):
        assert_same_bits(expected[node], got[node], node.name)


def work_of(stmt):
    from ocannl.lowlevel.cpu_schedule import work

    return work(stmt)


def test_loops_reading_other_iterations_cells_stay_sequential():
    n = 1 << 18
    y = TNode("y", (n,), dtypes.float32)
    i = Symbol()
    shift = loop(i, n - 1, Store(y, (Iter(i),), Load(y, (Affine(((1, i),), 1),))))
    assert "omp" not in emit_c(RoutineIR("shift", shift)).text


# ---------------------------------------------------------------------------------------------
# The compiler driver and the cache


def test_no_compiler_is_backend_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    ok, reason = CBackend().available()
    assert not ok and "CC='/nonexistent/cc'" in reason and "install a C compiler" in reason
    with pytest.raises(BackendUnavailable, match="CC="):
        oc.Context("c")
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang there
    with pytest.raises(BackendUnavailable, match="no C compiler found.*OCANNL_BACKEND=interp"):
        oc.Context("c")
    assert registry.best_available() == "interp"
    x = oc.tensor(np.ones((2, 2), np.float32))
    ctx = oc.Context("interp")
    ctx.compile(x * 2).run()


@needs_cc
def test_concurrent_processes_share_one_cache_entry(tmp_path):
    script = textwrap.dedent(
        """
        import numpy as np, ocannl as oc
        x = oc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), batch=1)
        y = oc.relu(x * 2 - 3)
        ctx = oc.Context("c")
        ctx.compile(y).run()
        print(ctx.get(y.value).tolist())
        """
    )
    env = dict(os.environ, OCANNL_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    assert len({out for out, _ in results}) == 1
    assert results[0][0].strip() == "[[0.0, 0.0, 1.0], [3.0, 5.0, 7.0]]"
    entries = sorted(p.name for p in (tmp_path / "c").iterdir() if p.is_file())
    assert len(entries) == 2 and entries[0].endswith(".so") and entries[1] == entries[0] + ".sha256", entries
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


@needs_cc
def test_cache_key_covers_source_and_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path))
    tc = compiler.toolchain()
    first = compiler.compile_shared("int f(void) { return 1; }\n", tc)
    assert compiler.compile_shared("int f(void) { return 1; }\n", tc) == first  # a hit
    assert compiler.compile_shared("int f(void) { return 2; }\n", tc) != first
    other = dataclasses.replace(tc, flags=tc.flags + ("-DX=1",))
    assert compiler.compile_shared("int f(void) { return 1; }\n", other) != first
    assert first.parent == tmp_path / "c"
    with pytest.raises(compiler.CompileError, match="failed"):
        compiler.compile_shared("this is not C\n", tc)


def test_flags_are_deterministic_unless_fast(monkeypatch):
    assert "-ffp-contract=off" in compiler.BASE_FLAGS and "-ffast-math" not in compiler.BASE_FLAGS
    assert compiler.FAST_FLAGS == ("-ffp-contract=fast",)  # the target ISA is c_isa's, not fast mode's
    monkeypatch.setenv("OCANNL_C_FAST", "1")
    assert compiler.fast_mode()
    monkeypatch.setenv("OCANNL_C_FAST", "0")
    assert not compiler.fast_mode()


# ---------------------------------------------------------------------------------------------
# Names: hostile labels never reach the source unsanitized


HOSTILE = ['a"; system("rm -rf /', "*/ int evil; /*", "line\nbreak", "ocannl_relu_f32", "i0", "_status", "expf",
           "INT32_MIN", "errno", "M_PI"]


@needs_cc
def test_hostile_labels_are_sanitized():
    nodes = [TNode(label, (3,), dtypes.float32) for label in HOSTILE]
    out = TNode('out"); abort(); //', (3,), dtypes.float32)
    i = Symbol()
    total = Load(nodes[0], (Iter(i),))
    for node in nodes[1:]:
        total = Binary(Binop.ADD, total, Load(node, (Iter(i),)))
    body = seq(Comment('hostile */ system("x"); /* comment\nsecond line'),
               loop(i, 3, Store(out, (Iter(i),), Unary(Unop.RELU, total))))
    routine = RoutineIR('memset"; exit(1); /*', body)
    source = emit_c(routine).text
    code = re.sub(r"/\*.*?\*/", "", source)  # what is not a comment
    assert "system(" not in code and "abort(" not in code and "exit(" not in code
    assert '"' not in code.replace('"no-tree-loop-vectorize"', "")
    for line in source.splitlines():
        if "/*" in line:
            assert line.count("/*") == 1 and line.count("*/") == 1, line
    assert function_name(routine.name) != "memset" and function_name("expf") == "expf_routine"
    inputs = {node: np.full(3, k - 2.0, np.float32) for k, node in enumerate(nodes)}
    expected, got = run_both("c", routine, inputs)
    assert_same_bits(expected[out], got[out])


# ---------------------------------------------------------------------------------------------
# Golden .c files of canonical programs (emitted only: no compiler needed)


def golden_einsum_reduction():
    """``s =:+ x ~logic:"bij=>bj"``: a sum over the middle axis, and a row max into float16."""
    x, s = TNode("x", (2, 5, 3)), TNode("s", (2, 3))
    m = TNode("m", (2, 5), dtypes.float16)
    return Block(sum_and_max_over_middle(x, s, m))


def golden_padded_conv():
    return padded_conv1d(TNode("x", (8,)), TNode("w", (3,)), TNode("y", (4,)), 2, 1)


GOLDEN = {
    "matmul": lambda: matmul(TNode("a", (8, 32)), TNode("b", (32, 16)), TNode("c", (8, 16))),
    "broadcast_add": lambda: broadcast_add(TNode("x", (2, 3)), TNode("b", (1, 3)), TNode("y", (2, 3))),
    "einsum_reduction": golden_einsum_reduction,
    "padded_conv": golden_padded_conv,
    "matvec": lambda: matvec(TNode("a", (3, 4)), TNode("v", (4,)), TNode("c", (3,))),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_c(name, update_golden):
    routine = lower_routine(name, GOLDEN[name]())
    check_golden(f"c/{name}.c", emit_c(routine, parallel=True).text, update_golden)


@needs_cc
@pytest.mark.parametrize("name", GOLDEN)
def test_golden_programs_run_like_the_interpreter(name):
    routine = lower_routine(name, GOLDEN[name]())
    expected, got = run_both("c", routine, random_inputs(routine, seed=len(name)))
    for node in routine.writes:
        assert_same_bits(expected[node], got[node], node.name)
