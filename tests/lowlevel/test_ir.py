import pytest

from ocannl.errors import ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DTypeError
from ocannl.lowlevel.indexing import Affine, Fixed, IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Fill, GetLocal, Load, LoadDynamic, Local, LocalScope,
    LoopKind, Namer, RoutineIR, Seq, SetLocal, Store, StoreDynamic, Ternary, Unary, format_routine, iter_exprs,
    iter_stmts, loop, number_names, seq, stmt_exprs,
)
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode


def dense_layer() -> RoutineIR:
    """The loop nest of ``n5 =:+ w1 * x ~logic:"@"`` with x: batch 10, w1: 16x2."""
    for _ in range(40):
        Symbol()  # global ids far from 0: printing must not depend on them
    x, w1, n5 = TNode("x", (10, 2)), TNode("w1", (16, 2)), TNode("n5", (10, 16))
    b, o, k = Symbol(), Symbol(), Symbol()
    acc = Binary(Binop.ADD, Load(n5, (Iter(b), Iter(o))),
                 Binary(Binop.MUL, Load(w1, (Iter(o), Iter(k))), Load(x, (Iter(b), Iter(k)))))
    inner = loop(k, 2, Store(n5, (Iter(b), Iter(o)), acc))
    body = loop(b, 10, loop(o, 16, seq(Store(n5, (Iter(b), Iter(o)), Const(0.0)), inner)))
    return RoutineIR("dense", body)


def test_ll_printer_matches_the_brief_example():
    assert format_routine(dense_layer()) == (
        "dense ():\n"
        "  for i0 = 0 to 9 {\n"
        "    for i1 = 0 to 15 {\n"
        "      n5[i0, i1] := 0.0;\n"
        "      for i2 = 0 to 1 { n5[i0, i1] := (n5[i0, i1] + (w1[i1, i2] * x[i0, i2])); }\n"
        "    }\n"
        "  }\n"
    )


def test_loop_kinds():
    routine = dense_layer()
    outer = routine.body
    middle = outer.body
    inner = middle.body.stmts[1]
    assert (outer.kind, middle.kind, inner.kind) == (LoopKind.PARALLEL, LoopKind.PARALLEL, LoopKind.REDUCTION)
    x, s = TNode("s", ()), Symbol()
    assert loop(s, 3, Comment("no store")).kind is LoopKind.REDUCTION
    local = Local(dtypes.float32)
    assert loop(s, 3, SetLocal(local, Const(1.0))).kind is LoopKind.REDUCTION
    assert loop(s, 3, Store(x, (), Const(1.0))).kind is LoopKind.REDUCTION


def test_loop_walks_its_body_once(monkeypatch):
    """Lowering wraps each loop of a nest around the inner ones: a loop that walked its body once
    per question it asks of it would cost each nest several walks per level."""
    from ocannl.lowlevel import ir

    walks = []
    original = ir.iter_stmts
    monkeypatch.setattr(ir, "iter_stmts", lambda stmt: walks.append(stmt) or original(stmt))
    local, s, x = Local(dtypes.float32), Symbol(), TNode("x", (3,))
    body = seq(DeclareLocal(local), SetLocal(local, Const(1.0)), Store(x, (Iter(s),), GetLocal(local)))
    assert loop(s, 3, body).kind is LoopKind.PARALLEL
    assert walks == [body]


def test_iter_stmts_enters_the_local_scopes_of_every_operand_in_order():
    """The statements of local scopes come right after the statement whose expressions hold
    them, in the order :func:`iter_exprs` visits the scopes: first operand first, then the
    position of a dynamic access, then the value."""
    x, y = TNode("x", (4,)), TNode("y", (4,))
    marks = iter(range(100))

    def scope() -> LocalScope:
        v = Local(dtypes.float32)
        return LocalScope(v, SetLocal(v, Const(float(next(marks)))))

    def position() -> Cast:
        return Cast(scope(), dtypes.int32)

    body = seq(  # the scopes numbered in the order the walk must visit them
        StoreDynamic(y, 0, position(), (), Binary(Binop.MUL, scope(), LoadDynamic(x, 0, position(), ()))),
        Store(y, (Fixed(1),), Ternary(Ternop.WHERE, scope(), Unary(Unop.NEG, scope()),
                                      Binary(Binop.ADD, scope(), Load(x, (Fixed(0),))))),
        Fill(x, scope()),
    )
    stmts = list(iter_stmts(body))
    assert [s.value.value for s in stmts if isinstance(s, SetLocal)] == [float(k) for k in range(7)]
    expected = [body]
    for s in body.stmts:
        expected.append(s)
        expected += [e.body for v in stmt_exprs(s) for e in iter_exprs(v) if isinstance(e, LocalScope)]
    assert stmts == expected


def test_routine_collects_symbols_and_nodes():
    routine = dense_layer()
    assert [n.name for n in routine.reads] == ["n5", "w1", "x"]
    assert [n.name for n in routine.writes] == ["n5"]
    step = IndexSymbol("step_n", 100)
    y = TNode("y", ())
    r = RoutineIR("embed", Store(y, (), Cast(EmbedIndex(Iter(step)), dtypes.float32)))
    assert r.static_symbols == (step,) and r.reads == ()
    assert format_routine(r) == "embed (step_n : [0..99]):\n  y[] := float32(step_n);\n"


def every_construct() -> Seq:
    """A body holding every statement and expression kind, its loop symbols reused."""
    t, ids, out = TNode("table", (5, 3)), TNode("ids", (4,), dtypes.int32), TNode("out", (4, 3))
    x = TNode("x", (7,))
    a, b = Symbol(), Symbol()
    v = Local(dtypes.float32)
    pos = Load(ids, (Iter(a),))
    grown = Binary(Binop.MAX, Load(out, (Iter(a), Iter(b))), Const(0.0))
    padded = Load(x, (Affine(((2, a),), -1),), 0.0)
    small = Binary(Binop.LT, GetLocal(v), Const(1.0))
    fma = Ternary(Ternop.FMA, GetLocal(v), GetLocal(v), Const(0.5))
    body = Seq((
        Comment("padded */ read\nhere"),
        Fill(out, Const(float("-inf"))),
        loop(a, 4, loop(b, 3, Store(out, (Iter(a), Iter(b)), LoadDynamic(t, 0, pos, (Iter(b),))))),
        loop(a, 4, loop(b, 3, StoreDynamic(t, 0, pos, (Iter(b),), grown))),
        DeclareLocal(v),
        loop(a, 2, SetLocal(v, Binary(Binop.ADD, GetLocal(v), padded))),
        Store(out, (Fixed(0), Fixed(1)), Ternary(Ternop.WHERE, small, Unary(Unop.RELU, GetLocal(v)), fma)),
        Store(out, (Fixed(0), Fixed(2)), LocalScope(Local(dtypes.float32), Seq(()))),
        loop(a, 2, Store(x, (Iter(a),), Cast(EmbedIndex(Affine(((1, a),), 1)), dtypes.float32))),
    ))
    return body


def test_every_construct_prints():
    body = every_construct()
    assert format_routine(RoutineIR("all", body)) == (
        "all ():\n"
        "  /* padded * / read here */\n"
        "  fill out := -inf;\n"
        "  for i0 = 0 to 3 {\n"
        "    for i1 = 0 to 2 { out[i0, i1] := table[@(ids[i0]), i1]; }\n"
        "  }\n"
        "  for i0 = 0 to 3 {\n"
        "    for i1 = 0 to 2 { table[@(ids[i0]), i1] := max(out[i0, i1], 0.0); }\n"
        "  }\n"
        "  declare v0;\n"
        "  for i0 = 0 to 1 { v0 := (v0 + x[2*i0-1 else 0.0]); }\n"
        "  out[0, 1] := where((v0 < 1.0), relu(v0), fma(v0, v0, 0.5));\n"
        "  out[0, 2] := v1 { };\n"
        "  for i0 = 0 to 1 { x[i0] := float32(i0+1); }\n"
    )


def test_numbering_names_loops_and_locals_as_the_printer_does():
    """``number_names`` (the C and Metal printers' numbering) asks for each name in the order
    ``format_routine`` does: a routine printed with its namer reads as printed alone."""
    import numpy as np

    import ocannl as oc
    from ocannl import nn, train

    oc.session.reset()
    oc.seed(0)
    images = oc.tensor(np.zeros((2, 6, 6, 1), np.float32), batch=1, label="images")
    ids = oc.tensor(np.array([1, 0]), label="ids")
    table = oc.param("table", output=(3, 4))
    logits = nn.linear(3)(oc.relu(nn.conv2d(2)(images))) + oc.take(table, ids).sum()
    update = train.grad_update(logits.sum())
    step = oc.Context("interp").compile(update, train.adam_update(update))
    for routine in (RoutineIR("all", every_construct()), dense_layer(), step.ir):
        numbered = Namer()
        number_names(routine.body, numbered)
        assert format_routine(routine, numbered) == format_routine(routine)


def test_long_loops_break():
    n = TNode("a_rather_long_buffer_name_that_does_not_fit", (3,))
    s = Symbol()
    expr = Load(n, (Iter(s),))
    for _ in range(3):
        expr = Binary(Binop.ADD, expr, Load(n, (Iter(s),)))
    text = format_routine(RoutineIR("long", loop(s, 3, Store(n, (Iter(s),), expr))))
    assert text.splitlines()[1] == "  for i0 = 0 to 2 {"


def test_type_checks():
    f16 = TNode("h", (2,), dtypes.float16)
    i32 = TNode("k", (2,), dtypes.int32)
    assert Load(f16, (Fixed(0),)).dtype is dtypes.float32  # 16-bit floats compute in float32
    with pytest.raises(DTypeError, match="storage type"):
        Const(1.0, dtypes.float16)
    with pytest.raises(DTypeError, match="one type"):
        Binary(Binop.ADD, Load(f16, (Fixed(0),)), Load(i32, (Fixed(0),)))
    with pytest.raises(DTypeError, match="floats only"):
        Unary(Unop.EXP, Load(i32, (Fixed(0),)))
    with pytest.raises(DTypeError, match="needs a int32 value"):
        Store(i32, (Fixed(0),), Const(1.0))
    with pytest.raises(DTypeError, match="must be an integer"):
        LoadDynamic(f16, 0, Const(1.0), ())
    with pytest.raises(ShapeError, match="accessed with 2 indices"):
        Load(f16, (Fixed(0), Fixed(0)))
    with pytest.raises(DTypeError, match="uint4x32"):
        Cast(Const((1, 2, 3, 4), dtypes.uint4x32), dtypes.uint32)
    with pytest.raises(DTypeError, match="local cannot hold"):
        SetLocal(Local(dtypes.int32), Const(1.0))


def test_total_over_executions_multiplies_through_loops_at_any_depth():
    from ocannl.lowlevel.cpu_schedule import work
    from ocannl.lowlevel.ir import For, total_over_executions

    x, y = TNode("x", (3, 5)), TNode("y", (7,))
    i, j, k = Symbol(), Symbol(), Symbol()
    nest = seq(
        loop(i, 3, seq(loop(j, 5, Store(x, (Iter(i), Iter(j)), Const(1.0))), Store(x, (Iter(i), Fixed(0)), Const(2.0)))),
        Fill(y, Const(0.0)),
        loop(k, 0, Store(y, (Iter(k),), Const(3.0))),
    )
    assert total_over_executions(nest, lambda s: 1) == 3 * 5 + 3 + 1
    assert work(nest) == 3 * 5 + 3 + 7  # a fill counts its cells
    deep = Store(y, (Fixed(0),), Const(1.0))
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = For(Symbol(), 2 if isinstance(deep, Store) else 1, deep, LoopKind.REDUCTION)
    assert total_over_executions(deep, lambda s: 1) == 2


def test_operator_arity_and_float_only():
    from ocannl.lowlevel.scalar_ops import FLOAT_ONLY_OPS, PRNG_OPS

    assert all(op.arity == n for ops, n in ((Unop, 1), (Binop, 2), (Ternop, 3)) for op in ops)
    assert FLOAT_ONLY_OPS == {Unop.EXP, Unop.LOG, Unop.EXP2, Unop.LOG2, Unop.SIN, Unop.COS, Unop.SQRT, Unop.RECIP,
                              Unop.RECIP_SQRT, Unop.TANH, Unop.SIGMOID, Unop.ERF, Binop.POW}
    n = Load(TNode("n", (), dtypes.int32), ())
    for op in (*Unop, *Binop):
        if op in PRNG_OPS:
            continue
        build = (lambda: Unary(op, n)) if isinstance(op, Unop) else (lambda: Binary(op, n, n))
        assert op.float_only == (op in FLOAT_ONLY_OPS)
        if op.float_only:
            with pytest.raises(DTypeError, match=f"{op.value} is defined on floats only"):
                build()
        else:
            assert build().dtype is dtypes.int32


def test_a_routine_walks_its_body_for_its_accesses_only_when_asked():
    """The optimizer makes a routine per pass: building one must not walk its body (a deep
    network's routine takes tens of milliseconds a walk)."""
    a, b = TNode("a", (3,), dtypes.float32), TNode("b", (3,), dtypes.float32)
    i = Symbol()
    routine = RoutineIR("r", loop(i, 3, Store(b, (Iter(i),), Load(a, (Iter(i),)))))
    assert "_accesses" not in vars(routine)
    assert (routine.reads, routine.writes, routine.static_symbols) == ((a,), (b,), ())
    assert "_accesses" in vars(routine)
