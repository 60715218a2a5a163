"""The shared C-family walk (ocannl/backends/codegen.py): its state is an immutable scope, left as
it was entered, and contractions are printed by the language's target (C) or, without one
(Metal), as their loops."""

from ocannl.backends.c.emit import emit_c
from ocannl.backends.c.syntax import CSyntax
from ocannl.backends.c.target import CTarget
from ocannl.backends.codegen import Emitter, Scope
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.indexing import Iter, Symbol
from ocannl.lowlevel.ir import Binary, Const, Load, RoutineIR, Store, loop, seq
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.tnode import TNode


def _matmul(m: int = 32, n: int = 32, k: int = 32) -> RoutineIR:
    a, b, c = TNode("a", (m, k)), TNode("b", (k, n)), TNode("c", (m, n))
    i, j, s = Symbol(), Symbol(), Symbol()
    cell = (Iter(i), Iter(j))
    term = Binary(Binop.MUL, Load(a, (Iter(i), Iter(s))), Load(b, (Iter(s), Iter(j))))
    step = Store(c, cell, Binary(Binop.ADD, Load(c, cell), term))
    return RoutineIR("matmul", loop(i, m, loop(j, n, seq(Store(c, cell, Const(0.0, dtypes.float32)), loop(s, k, step)))))


def test_the_walk_leaves_its_scope_as_it_entered_it():
    routine = _matmul()
    for vector_bytes in (None, 32):
        target = CTarget(vector_bytes)
        emitter = Emitter(CSyntax(), routine, target=target)
        lines = target.body(emitter)
        assert lines and target.functions, "the tiles print in a helper function"
        assert emitter.scope.replace(out=[]) == Scope(), "depth, symbols, extents and flags as at the start"


def test_a_walk_without_a_target_prints_contractions_as_their_loops():
    routine = _matmul()
    assert "register tiles" in emit_c(routine).text
    lines = Emitter(CSyntax(), routine, parallel=False).statement_lines(routine.body, {})
    assert not any("register tiles" in line or "_c0_0" in line for line in lines)
    assert sum(line.lstrip().startswith("for (") for line in lines) == 3
