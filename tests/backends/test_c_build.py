"""How the C backend builds a routine so that compiling stays fast: the compiler flags, and the
shape of the generated code (one function per top-level loop nest, long routines in parts); a
deep MLP's training routine compiles and computes the interpreter's bits."""

from __future__ import annotations

import platform
import threading
import re

import numpy as np
import pytest

import ocannl as oc
from ocannl import data, nn, session, testing, train
from ocannl.backends import cache
from ocannl.backends.c import CBackend, compiler
from ocannl.backends.c.emit import emit_c
from ocannl.backends.codegen import PART_STATEMENTS
from ocannl.lowlevel.cpu_schedule import PART_STATEMENTS_MAX
from ocannl.backends.interp import InterpBackend
from ocannl.errors import CompileError, OcannlError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.indexing import Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Const, DeclareLocal, GetLocal, Load, Local, RoutineIR, SetLocal, Store, Unary, loop, seq,
)
from ocannl.lowlevel.scalar_ops import Binop, Unop
from ocannl.lowlevel.tnode import TNode

needs_cc = pytest.mark.skipif(not CBackend().available()[0], reason="no working C compiler here")


@pytest.fixture(autouse=True)
def deterministic_flags(monkeypatch):
    monkeypatch.setenv("OCANNL_C_FAST", "0")


def run_on(backend, routine: RoutineIR, inputs: dict[TNode, np.ndarray]) -> dict[TNode, np.ndarray]:
    buffers = {n: np.array(inputs[n], n.dtype.storage) if n in inputs else np.zeros(n.dims, n.dtype.storage)
               for n in routine.reads + routine.writes}
    backend.compile(routine).run(buffers, {})
    return {n: buffers[n] for n in routine.writes}


def assert_runs_like_the_interpreter(routine: RoutineIR, inputs: dict[TNode, np.ndarray]) -> None:
    expected, got = run_on(InterpBackend(), routine, inputs), run_on(CBackend(), routine, inputs)
    for node, want in expected.items():
        assert np.array_equal(want.view(np.uint32), got[node].view(np.uint32)), node.debug_name


# ---------------------------------------------------------------------------------------------
# Flags


def test_default_flags_are_o2_and_deterministic():
    assert compiler.BASE_FLAGS[0] == "-O2"
    assert {"-ffp-contract=off", "-fwrapv"} <= set(compiler.BASE_FLAGS)
    assert not {"-O3", "-ffast-math", "-Ofast"} & set(compiler.BASE_FLAGS)


@needs_cc
def test_kernels_are_built_with_the_chosen_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path))
    commands: list[list[str]] = []
    build = cache.build_atomically

    def recording(cmd, *args, **kwargs):
        commands.append(list(cmd))
        return build(cmd, *args, **kwargs)

    monkeypatch.setattr(cache, "build_atomically", recording)
    tc = compiler.toolchain()
    assert tc.flags[: len(compiler.BASE_FLAGS)] == compiler.BASE_FLAGS
    x = TNode("x", (4,), dtypes.float32)
    y = TNode("y", (4,), dtypes.float32)
    i = Symbol()
    routine = RoutineIR("flags_probe", loop(i, 4, Store(y, (Iter(i),), Unary(Unop.RELU, Load(x, (Iter(i),))))))
    assert_runs_like_the_interpreter(routine, {x: np.array([-1.0, 2.0, -3.0, 4.0])})
    assert commands, "nothing was compiled into the empty cache"
    for command in commands:
        assert all(flag in command for flag in compiler.BASE_FLAGS), command
        assert "-O3" not in command


def isa_macros_or_skip(flag: str) -> frozenset[str]:
    tc = compiler.toolchain()
    macros = compiler._isa_macros(tc.command, flag)
    if macros is None:
        pytest.skip(f"the C compiler here does not take {flag}")
    return macros


def multiply_add_and_libm_routine() -> tuple[RoutineIR, dict[TNode, np.ndarray], TNode, TNode]:
    """``y[i] := x[i] * w[i] + x[i]`` and ``z[i] := tanh(x[i]) * sin(w[i]) + pow(w[i], exp(x[i]))``
    over 67 cells (vector bodies and a remainder): a vectorizer allowed to fuse multiply-adds, or
    to swap in vector math functions, would change bits. Returns the routine, its inputs, y, z."""
    n = 67
    x, w = TNode("x", (n,), dtypes.float32), TNode("w", (n,), dtypes.float32)
    y, z = TNode("y", (n,), dtypes.float32), TNode("z", (n,), dtypes.float32)
    i, j = Symbol(), Symbol()
    xi, wi = Load(x, (Iter(i),)), Load(w, (Iter(i),))
    xj, wj = Load(x, (Iter(j),)), Load(w, (Iter(j),))
    first = loop(i, n, Store(y, (Iter(i),), Binary(Binop.ADD, Binary(Binop.MUL, xi, wi), xi)))
    second = loop(j, n, Store(z, (Iter(j),), Binary(
        Binop.ADD, Binary(Binop.MUL, Unary(Unop.TANH, xj), Unary(Unop.SIN, wj)),
        Binary(Binop.POW, wj, Unary(Unop.EXP, xj)))))
    rng = np.random.default_rng(15)
    inputs = {x: rng.uniform(-3, 3, n).astype(np.float32), w: rng.uniform(0.1, 4, n).astype(np.float32)}
    return RoutineIR("isa_probe", seq(first, second)), inputs, y, z


def test_the_isa_setting_defaults_to_native_and_is_validated(monkeypatch):
    monkeypatch.delenv("OCANNL_C_ISA", raising=False)
    assert compiler.isa_setting() == "native"
    monkeypatch.setenv("OCANNL_C_ISA", "Portable")
    assert compiler.isa_setting() == "portable"
    monkeypatch.setenv("OCANNL_C_ISA", "x86-64-v3")
    assert compiler.isa_setting() == "x86-64-v3"
    monkeypatch.setenv("OCANNL_C_ISA", "")  # empty means unset, as for every setting
    assert compiler.isa_setting() == "native"
    for bad in ("-O3", "native -ffast-math", "x86-64;rm"):
        monkeypatch.setenv("OCANNL_C_ISA", bad)
        with pytest.raises(OcannlError, match=r"c_isa \(from OCANNL_C_ISA\)"):
            compiler.isa_setting()


@needs_cc
@pytest.mark.parametrize("isa", ["native", "named"])
def test_every_target_isa_computes_the_portable_builds_bits(monkeypatch, tmp_path, isa):
    """The target changes the instructions, never the results: contraction stays off (arithmetic
    equals the interpreter's bits) and the math library calls stay the scalar ones (the same bits
    as the portable build's)."""
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path))
    if isa == "named":
        targets = {"x86_64": "x86-64-v2", "AMD64": "x86-64-v2", "aarch64": "armv8-a", "arm64": "armv8-a"}
        isa = targets.get(platform.machine(), "")
        if not isa or not isa_macros_or_skip(f"-march={isa}") <= isa_macros_or_skip("-march=native"):
            pytest.skip(f"no named target known to run on {platform.machine()} here")
    routine, inputs, y, z = multiply_add_and_libm_routine()
    monkeypatch.setenv("OCANNL_C_ISA", "portable")
    portable_tc = compiler.toolchain()
    assert not [f for f in portable_tc.flags if f.startswith("-march")] and portable_tc.isa == "portable"
    portable = run_on(CBackend(), routine, inputs)
    monkeypatch.setenv("OCANNL_C_ISA", isa)
    tc = compiler.toolchain()
    if tc.isa == isa:  # native falls back to portable on a compiler without -march=native
        assert [f for f in tc.flags if f.startswith("-march")] == [f"-march={isa}"]
    assert "-ffp-contract=off" in tc.flags and "-ffp-contract=fast" not in tc.flags
    targeted = run_on(CBackend(), routine, inputs)
    expected = run_on(InterpBackend(), routine, inputs)
    assert np.array_equal(targeted[y].view(np.uint32), expected[y].view(np.uint32))
    for node in (y, z):
        assert np.array_equal(targeted[node].view(np.uint32), portable[node].view(np.uint32)), node.debug_name


@needs_cc
def test_an_unknown_target_is_an_error_naming_the_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OCANNL_C_ISA", "no-such-cpu-9000")
    with pytest.raises(OcannlError, match=r"c_isa=no-such-cpu-9000 \(from OCANNL_C_ISA\).*does not know "
                                          r"-march=no-such-cpu-9000"):
        compiler.toolchain()


@needs_cc
def test_a_target_this_cpu_cannot_run_is_an_error(monkeypatch, tmp_path):
    """Kernels built for instructions this CPU lacks would fault when run: refused up front."""
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path))
    tc = compiler.toolchain()
    host = compiler._isa_macros(tc.command, "-march=native")
    if host is None:
        pytest.skip("the C compiler here does not take -march=native")
    real = compiler._isa_macros
    poorer = frozenset(m for m in host if "AVX" not in m and "NEON" not in m and "SSE4" not in m)

    def host_without_vectors(command, flag):
        return poorer if flag == "-march=native" else real(command, flag)

    monkeypatch.setattr(compiler, "_isa_macros", host_without_vectors)
    target = "x86-64-v3" if "__SSE2__" in host else "armv8.2-a"
    monkeypatch.setenv("OCANNL_C_ISA", target)
    if real(tc.command, f"-march={target}") is None or real(tc.command, f"-march={target}") <= poorer:
        pytest.skip(f"{target} adds no instruction set to this stripped host")
    with pytest.raises(OcannlError, match=rf"c_isa={target} \(from OCANNL_C_ISA\): this CPU lacks .*could not run"):
        compiler.toolchain()


# ---------------------------------------------------------------------------------------------
# Code shape


def pointwise_chain(n: int) -> tuple[RoutineIR, TNode]:
    """``t_k[i] := relu(t_{k-1}[i] * 1.5 - 0.25 k)`` for k = 1..n: n top-level loop nests, all
    different (identical ones would share a function, ``shared_helpers.py``)."""
    nodes = [TNode(f"t{k}", (5,), dtypes.float32) for k in range(n + 1)]
    nests = []
    for k, (prev, node) in enumerate(zip(nodes, nodes[1:]), start=1):
        i = Symbol()
        value = Binary(Binop.SUB, Binary(Binop.MUL, Load(prev, (Iter(i),)), Const(1.5, dtypes.float32)),
                       Const(0.25 * k, dtypes.float32))
        nests.append(loop(i, 5, Store(node, (Iter(i),), Unary(Unop.RELU, value))))
    return RoutineIR("chain", seq(*nests)), nodes[0]


def helper_calls(text: str, kind: str) -> list[str]:
    return re.findall(rf"^\s+chain_{kind}\d+\(", text, flags=re.MULTILINE)


@needs_cc
def test_each_top_level_loop_nest_is_a_function():
    routine, first = pointwise_chain(4)
    text = emit_c(routine).text
    assert "#define OCANNL_NEST_FN __attribute__((noinline))" in text
    assert len(re.findall(r"^static OCANNL_NEST_FN void chain_nest\d+\(", text, flags=re.MULTILINE)) == 4
    assert len(helper_calls(text, "nest")) == 4 and not helper_calls(text, "part")
    assert_runs_like_the_interpreter(routine, {first: np.linspace(-1.0, 1.0, 5)})


@needs_cc
def test_a_long_routine_runs_in_parts():
    n = 2 * PART_STATEMENTS + 3
    routine, first = pointwise_chain(n)
    text = emit_c(routine).text
    parts = re.findall(r"^static OCANNL_PART_FN void chain_part\d+\(", text, flags=re.MULTILINE)
    assert len(helper_calls(text, "nest")) == n
    # The routine's function only calls its parts, passing the buffers as the entry gets them.
    entry = text[text.index("static OCANNL_CALLS_FN int chain(void *const *_buffers, const int64_t *_symbols) {"):]
    calls = helper_calls(entry, "part")
    assert len(calls) == len(parts) >= n // PART_STATEMENTS_MAX and not helper_calls(entry, "nest")
    assert "_unpacked" not in text
    # Parts only call, so they are built as the routine is (-O1 on GCC), and kept out of line.
    assert "#define OCANNL_PART_FN OCANNL_NEST_FN OCANNL_CALLS_FN" in text and "#define OCANNL_NEST_FN" in text
    args = re.findall(r"^\s+chain_part\d+\((.*)\);$", entry, flags=re.MULTILINE)
    assert all(re.fullmatch(r"(_buffers\[\d+\], )+_status", a) for a in args), args
    assert_runs_like_the_interpreter(routine, {first: np.linspace(-1.0, 1.0, 5)})


@needs_cc
def test_the_parts_of_repeated_blocks_are_printed_once():
    """A routine repeating a block of statements on other buffers (a deep network's layers) is
    cut into parts at the same statements of each repetition (``cpu_schedule.plan_parts``), so
    its parts are a few functions called many times, whatever the block's length."""
    blocks, length = 12, 23  # no divisor of the old fixed part length (32)
    nodes = [TNode(f"t{k}", (5,), dtypes.float32) for k in range(blocks * length + 1)]
    nests = []
    for k, (prev, node) in enumerate(zip(nodes, nodes[1:])):
        i = Symbol()
        value = Binary(Binop.MUL, Load(prev, (Iter(i),)), Const(1.0 + k % length, dtypes.float32))
        nests.append(loop(i, 5, Store(node, (Iter(i),), Unary(Unop.RELU, value))))
    routine = RoutineIR("chain", seq(*nests))
    text = emit_c(routine).text
    printed = re.findall(r"^static OCANNL_PART_FN void chain_part\d+\(", text, flags=re.MULTILINE)
    calls = helper_calls(text, "part")
    assert len(calls) >= blocks and len(printed) <= len(calls) // 4
    assert_runs_like_the_interpreter(routine, {nodes[0]: np.linspace(-1.0, 1.0, 5)})


@needs_cc
def test_a_nest_using_a_local_declared_outside_it_stays_inline():
    x = TNode("x", (6,), dtypes.float32)
    y = TNode("y", (1,), dtypes.float32)
    z = TNode("z", (6,), dtypes.float32)
    acc = Local(dtypes.float32)
    i, j, k = Symbol(), Symbol(), Symbol()
    body = seq(
        DeclareLocal(acc),
        loop(i, 6, SetLocal(acc, Binary(Binop.ADD, GetLocal(acc), Load(x, (Iter(i),))))),
        loop(j, 1, Store(y, (Iter(j),), GetLocal(acc))),
        loop(k, 6, Store(z, (Iter(k),), Unary(Unop.RELU, Load(x, (Iter(k),))))),
    )
    routine = RoutineIR("sums", body)
    text = emit_c(routine).text
    assert len(re.findall(r"^static OCANNL_NEST_FN void sums_nest\d+\(", text, flags=re.MULTILINE)) == 1
    assert_runs_like_the_interpreter(routine, {x: np.arange(6.0) - 2.5})


# ---------------------------------------------------------------------------------------------
# A deep training routine


def deep_mlp_step(n_layers: int):
    """An ``n_layers`` relu MLP of width 16 on the half-moons data: grad_update + sgd_update."""

    def build():
        oc.seed(0)
        points, labels = data.moons(40, noise=0.1, seed=0)
        xs = oc.tensor(data.batches(points, 10), batch=2, label="xs")
        ys = oc.tensor(data.batches(labels, 10), batch=2, label="ys")
        batch_n = oc.IndexSymbol("batch_n", 4)
        model = nn.mlp(hid_dims=(16,) * n_layers, label="mlp")
        loss = oc.relu(1 - ys[batch_n] * model(xs[batch_n])).mean(label="loss")
        update = train.grad_update(loss)
        return update, train.sgd_update(update, lr=0.05, weight_decay=1e-4)

    return build


@needs_cc
def test_a_25_layer_mlp_training_routine_compiles_and_matches_the_interpreter():
    program = testing.Program("mlp-25 training step", deep_mlp_step(25), ({"batch_n": 0}, {"batch_n": 3}))
    expected = testing.run_program(program, "interp")
    got = testing.run_program(program, "c")
    session.reset()
    assert len(expected) > 25 * 4
    mismatch = testing.first_mismatch(program.name, expected, got, exact=True)
    assert mismatch is None, str(mismatch)


def _model_with_init():
    """A parameter initialized by random code (an init routine) and a computation reading it."""
    session.reset()
    oc.seed(0)
    w = oc.param("w", output=3, input=4)
    x = oc.tensor(np.ones((4,), np.float32))
    return w, w @ x


@needs_cc
def test_the_init_routine_is_compiled_while_the_routine_is_prepared(monkeypatch, tmp_path):
    """``Context.compile`` prints the init routine's C and leaves its compiler to a thread of its
    own, at ``-O1`` (it runs once), while it prepares the routine it was asked for; the values
    are the ones an init routine built first gives (the interpreter's)."""
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path))
    builders = []
    compile_shared = compiler.compile_shared

    def recording(source, tc):
        builders.append(("_init" in source.splitlines()[0], (threading.current_thread().name, tc.flags[0])))
        return compile_shared(source, tc)

    monkeypatch.setattr("ocannl.backends.c.backend.compile_shared", recording)
    w, y = _model_with_init()
    ctx = oc.Context("c")
    ctx.compile(y).run()
    built = dict(builders)  # whether the source is the init routine's -> the thread that built it, -O
    assert len(builders) == 2 and built[True][0].startswith("ocannl-cc") and built[True][1] == "-O1", builders
    assert built[False] == (threading.main_thread().name, "-O2"), builders
    got = ctx.get(w.value), ctx.get(y.value)
    w, y = _model_with_init()
    reference = oc.Context("interp")
    reference.compile(y).run()
    np.testing.assert_array_equal(got[0], reference.get(w.value))
    np.testing.assert_array_equal(got[1], reference.get(y.value))


@needs_cc
def test_the_parameters_are_initialized_when_the_routine_fails_to_build(monkeypatch, tmp_path):
    """The init routine runs even when the routine compiled after it fails to build, as when it
    ran before the routine was prepared; the routine's error is the one raised."""
    monkeypatch.setenv("OCANNL_CACHE_DIR", str(tmp_path))
    compile_shared = compiler.compile_shared

    def failing_after_init(source, tc):
        if "_init" not in source.splitlines()[0]:
            raise CompileError("the routine's build failed")
        return compile_shared(source, tc)

    monkeypatch.setattr("ocannl.backends.c.backend.compile_shared", failing_after_init)
    w, y = _model_with_init()
    ctx = oc.Context("c")
    with pytest.raises(CompileError, match="the routine's build failed"):
        ctx.compile(y)
    assert ctx.has_value(w.value) and np.any(ctx.get(w.value) != 0)
