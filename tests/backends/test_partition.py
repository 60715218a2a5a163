"""The kernel partitioner shared by the Triton and Metal backends (ocannl/backends/partition.py):
moving a statement up into an earlier kernel, and grouping kernels into launches, on hand-built
loop IR; then a training step whose partition moves statements, on both backends."""

from __future__ import annotations

import numpy as np
import pytest
from backend_params import backend_param

import ocannl as oc
from ocannl import nn, session, testing, train
from ocannl.backends.context import Context
from ocannl.backends.partition import Launch, group, launch_hazards, partition
from ocannl.lowlevel.indexing import Fixed, Iter, Symbol
from ocannl.lowlevel.ir import Binary, Const, Load, Seq, Store, loop
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.tnode import TNode


def _scale(out: TNode, src: TNode, factor: float):
    """``for i: out[i] := src[i] * factor``."""
    i = Symbol()
    return loop(i, out.dims[0], Store(out, (Iter(i),), Binary(Binop.MUL, Load(src, (Iter(i),)), Const(factor))))


def _row_sums(out: TNode, src: TNode):
    """``for j: out[j] := 0; for k: out[j] := out[j] + src[j, k]``."""
    j, k = Symbol(), Symbol()
    total = Binary(Binop.ADD, Load(out, (Iter(j),)), Load(src, (Iter(j), Iter(k))))
    return loop(j, out.dims[0], Seq((Store(out, (Iter(j),), Const(0.0)), loop(k, src.dims[1], Store(out, (Iter(j),), total)))))


def _shifted(out: TNode, src: TNode, shift: TNode):
    """``for i: out[i] := src[i] + shift[0]``."""
    i = Symbol()
    value = Binary(Binop.ADD, Load(src, (Iter(i),)), Load(shift, (Fixed(0),)))
    return loop(i, out.dims[0], Store(out, (Iter(i),), value))


def _nodes():
    return (TNode("a", (64,)), TNode("b", (8, 8)), TNode("c", (64,)), TNode("d", (64,)), TNode("e", (8,)))


def test_a_statement_moves_up_into_the_earlier_kernel_it_joins():
    """``d := c + 1`` cannot join the row sums before it (another grid, nothing of theirs read);
    it commutes with them (no node in common), so it joins the kernel computing ``c``."""
    a, b, c, d, e = _nodes()
    first, sums, last = _scale(c, a, 2.0), _row_sums(e, b), _scale(d, c, 1.5)
    kernels = partition(Seq((first, sums, last)))
    assert [[p.stmt for p in k.parts] for k in kernels] == [[first, last], [sums]]


def test_a_statement_stays_after_a_kernel_it_conflicts_with():
    """``d := c + e[0]`` reads the row sums' ``e``: it may not move above them."""
    a, b, c, d, e = _nodes()
    first, sums, last = _scale(c, a, 2.0), _row_sums(e, b), _shifted(d, c, e)
    kernels = partition(Seq((first, sums, last)))
    assert [[p.stmt for p in k.parts] for k in kernels] == [[first], [sums], [last]]


def test_independent_kernels_are_segments_of_one_launch():
    a, b, c, d, e = _nodes()
    kernels = partition(Seq((_scale(c, a, 2.0), _row_sums(e, b), _shifted(d, c, e))))
    programs = [2, 1, 2]
    launches = group(kernels, programs)
    # The row sums come first: their one program does more work (72 steps) than each of the
    # scaling's two (32 cells).
    assert launches == [Launch(((1,), (0,))), Launch(((2,),))]
    assert launch_hazards(kernels, programs, launches) == []


def test_single_program_kernels_chain_in_one_program():
    a, b, c, d, e = _nodes()
    kernels = partition(Seq((_scale(c, a, 2.0), _row_sums(e, b), _shifted(d, c, e))))
    programs = [1, 1, 1]
    launches = group(kernels, programs)
    assert launches == [Launch(((0, 1, 2),))]
    assert launch_hazards(kernels, programs, launches) == []


def test_a_kernel_of_several_programs_waits_for_the_next_launch():
    """``d := c + e[0]`` runs 2 programs: it cannot chain after the single-program row sums."""
    a, b, c, d, e = _nodes()
    kernels = partition(Seq((_scale(c, a, 2.0), _row_sums(e, b), _shifted(d, c, e))))
    launches = group(kernels, [1, 1, 2])
    assert launches == [Launch(((1,), (0,))), Launch(((2,),))]


def test_hazards_name_what_an_unsound_grouping_breaks():
    a, b, c, d, e = _nodes()
    kernels = partition(Seq((_scale(c, a, 2.0), _row_sums(e, b), _shifted(d, c, e))))
    programs = [2, 1, 2]
    assert launch_hazards(kernels, programs, [Launch(((0,), (1,), (2,)))]) == [
        "launch 0: kernels 0 and 2 conflict in different segments",
        "launch 0: kernels 1 and 2 conflict in different segments",
    ]
    assert launch_hazards(kernels, programs, [Launch(((2,),)), Launch(((0,), (1,)))]) == [
        "kernel 2 runs before kernel 0, with which it conflicts",
        "kernel 2 runs before kernel 1, with which it conflicts",
    ]
    assert launch_hazards(kernels, programs, [Launch(((0, 1, 2),))]) == [
        "launch 0: segment [0, 1, 2] chains a kernel of several programs"]
    assert launch_hazards(kernels, programs, [Launch(((0,), (1,)))]) == ["kernel 2 never runs"]


# ---------------------------------------------------------------------------------------------
# On the backends that partition


def _sgd_step():
    """One SGD step of an MLP over 64 features: its partition moves statements up into earlier
    kernels."""
    rng = np.random.default_rng(3)
    x = oc.tensor(rng.uniform(-1, 1, (16, 64)).astype(np.float32), batch=1, label="x")
    target = oc.tensor(rng.uniform(-1, 1, (16, 64)).astype(np.float32), batch=1, label="target")
    diff = nn.mlp(hid_dims=(64,), label="wide")(x) - target
    update = train.grad_update((diff * diff).mean(label="loss"))
    return [update, train.sgd_update(update, lr=0.1)]


def test_partitioning_walks_each_statement_a_fixed_number_of_times(monkeypatch):
    """What a statement accesses is found once per statement, not at every kernel it is tried in
    nor at every join of the kernel it is in: a chain of pointwise statements (one kernel that
    keeps growing) and independent statements of distinct grids (each a kernel of its own, each
    tried in every earlier one) walk each statement for its accesses a fixed number of times.
    Checking the signature rule over the whole kernel at each join made a chain of 2,000
    pointwise ops take minutes to partition."""
    from ocannl.backends import partition as module

    walks = []
    counted = module.accesses
    monkeypatch.setattr(module, "accesses", lambda stmt, **kw: (walks.append(stmt), counted(stmt, **kw))[1])
    n = 300
    chain = [TNode(f"c{k}", (64,)) for k in range(n + 1)]
    steps = [_scale(chain[k + 1], chain[k], 1.0001) for k in range(n)]
    assert len(partition(Seq(tuple(steps)))) == 1
    assert len(walks) <= 2 * n
    walks.clear()
    independent = [_scale(TNode(f"o{k}", (k + 1,)), TNode(f"i{k}", (k + 1,)), 2.0) for k in range(n)]
    assert len(partition(Seq(tuple(independent)))) == n
    assert len(walks) <= 2 * n


def _moved_statements(build) -> int:
    """How many times the partition of the routine ``build()`` compiles to runs a statement
    before one that precedes it in the routine (a statement moved up)."""
    session.reset()
    ctx = Context("interp")
    irs = []
    compile_ir = ctx.backend.compile
    ctx.backend.compile = lambda ir: (irs.append(ir), compile_ir(ir))[1]
    ctx.compile(*build())
    body = irs[-1].body
    position = {id(s): n for n, s in enumerate(body.stmts)}
    order = [position[id(p.stmt)] for kernel in partition(body) for p in kernel.parts]
    return sum(later < earlier for earlier, later in zip(order, order[1:]))


@pytest.mark.parametrize("backend", [backend_param("metal"), backend_param("triton")])
def test_a_step_with_moved_statements_matches_the_interpreter(backend):
    assert _moved_statements(_sgd_step) > 0
    assert testing.compare(_sgd_step, [backend]) == []
