"""How the C backend builds a routine so that compiling stays fast: the compiler flags, and the
shape of the generated code (one function per top-level loop nest, long routines in parts); a
deep MLP's training routine compiles and computes the interpreter's bits."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ocannl as oc
from ocannl import data, nn, session, testing, train
from ocannl.backends import cache
from ocannl.backends.c import CBackend, compiler
from ocannl.backends.c.emit import emit_c
from ocannl.backends.codegen import PART_STATEMENTS
from ocannl.backends.interp import InterpBackend
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.indexing import Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary,
    Const,
    DeclareLocal,
    GetLocal,
    Load,
    Local,
    RoutineIR,
    SetLocal,
    Store,
    Unary,
    loop,
    seq,
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


# ---------------------------------------------------------------------------------------------
# Code shape


def pointwise_chain(n: int) -> tuple[RoutineIR, TNode]:
    """``t_k[i] := relu(t_{k-1}[i] * 1.5 - 0.25)`` for k = 1..n: n top-level loop nests."""
    nodes = [TNode(f"t{k}", (5,), dtypes.float32) for k in range(n + 1)]
    nests = []
    for prev, node in zip(nodes, nodes[1:]):
        i = Symbol()
        value = Binary(Binop.SUB, Binary(Binop.MUL, Load(prev, (Iter(i),)), Const(1.5, dtypes.float32)),
                       Const(0.25, dtypes.float32))
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
    assert len(re.findall(r"^static OCANNL_NEST_FN void chain_part\d+\(", text, flags=re.MULTILINE)) == 3
    assert len(helper_calls(text, "nest")) == n
    entry = text[text.index("static int chain("):]
    assert len(helper_calls(entry, "part")) == 3 and not helper_calls(entry, "nest")
    assert_runs_like_the_interpreter(routine, {first: np.linspace(-1.0, 1.0, 5)})


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
