"""The loop IR rewriter every pass builds on (ocannl/lowlevel/rewrite.py): unchanged trees come back
as themselves, and a fresh copy renames every loop and local it binds."""

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.indexing import Fixed, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Const, DeclareLocal, For, GetLocal, Load, Local, LocalScope, Namer, SetLocal, Store, format_expr, iter_stmts,
    loop, seq,
)
from ocannl.lowlevel.rewrite import FreshCopy, Rewriter
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.tnode import TNode

F32 = dtypes.float32


def row_sum(x: TNode, i: Symbol) -> tuple[LocalScope, Local, Symbol]:
    """``sum_k x[i, k]`` as a local scope: the expression shape the summation pass copies."""
    v, k = Local(F32), Symbol()
    step = SetLocal(v, Binary(Binop.ADD, GetLocal(v), Load(x, (Iter(i), Iter(k)))))
    return LocalScope(v, seq(DeclareLocal(Local(F32)), loop(k, 3, step))), v, k


def test_a_rewriter_that_changes_nothing_returns_the_same_objects():
    x, y = TNode("x", (4, 3)), TNode("y", (4,))
    i = Symbol()
    scope, _, _ = row_sum(x, i)
    body = loop(i, 4, seq(Store(y, (Iter(i),), Const(0.0)), Store(y, (Iter(i),), scope)))
    assert Rewriter().stmt(body) is body
    assert Rewriter().expr(scope) is scope


def test_a_fresh_copy_substitutes_its_symbols_and_renames_what_it_binds():
    x = TNode("x", (4, 3))
    i = Symbol()
    scope, v, k = row_sum(x, i)
    first, second = FreshCopy({i: Fixed(2)}).expr(scope), FreshCopy({i: Fixed(3)}).expr(scope)
    assert format_expr(first, Namer()) == "v0 { declare v1; for i0 = 0 to 2 { v0 := (v0 + x[2, i0]); } }"
    for copy in (first, second):
        loops = [s for s in iter_stmts(copy.body) if isinstance(s, For)]
        sets = [s for s in iter_stmts(copy.body) if isinstance(s, SetLocal)]
        assert len(loops) == 1 and loops[0].symbol is not k
        assert copy.local is not v and sets[0].local is copy.local
        assert sets[0].value.a == GetLocal(copy.local)
    # Two copies stand side by side: no loop iterator or local in common.
    assert first.local is not second.local
    assert [s.symbol for s in iter_stmts(first.body) if isinstance(s, For)] != [
        s.symbol for s in iter_stmts(second.body) if isinstance(s, For)]
    declared = [s.local for c in (first, second) for s in iter_stmts(c.body) if isinstance(s, DeclareLocal)]
    assert len(declared) == 2 and declared[0] is not declared[1]
