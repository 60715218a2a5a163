import pytest

from handbuilt import accum, matvec, pointwise
from ocannl.errors import OcannlError
from ocannl.lowlevel.assignments import (
    Accum, Block, Computation, Constant, EmbedSymbol, Fetch, Gather, Noop, RangeOverOffsets, ScatterAdd, Slice, Values,
    format_cd, nodes_read, nodes_written, static_symbols,
)
from ocannl.lowlevel.indexing import IndexSymbol, Iter, Symbol
from ocannl.lowlevel.scalar_ops import Binop, Ternop, Unop
from ocannl.lowlevel.tnode import TNode


def moons_like_update() -> Block:
    batch_n = IndexSymbol("batch_n", 80)
    flat, inp = TNode("moons_flat", (80, 10, 2)), TNode("moons_input", (10, 2))
    w1, hidden = TNode("w1", (16, 2)), TNode("", (10, 16))
    i, o, k = Symbol(), Symbol(), Symbol()
    compose = accum(hidden, Binop.ADD, Binop.MUL, (w1, inp), [(i, 10), (o, 16), (k, 2)],
                    (Iter(i), Iter(o)), ((Iter(o), Iter(k)), (Iter(i), Iter(k))), init=True, spec="@")
    h = TNode("h", (16,))
    b1, relu = TNode("b1", (16,)), TNode("relu h", (16,))
    b1_grad = TNode(grad_of=b1)
    lr = TNode("learning_rate", (16,))
    return Block((
        Block((
            Fetch(inp, Slice(flat, batch_n)),
            compose,
            pointwise(h, Binop.ADD, b1, h),
            pointwise(relu, Unop.RELU, h),
        ), "forward"),
        Block((pointwise(b1, Binop.MUL, lr, b1_grad, acc=Binop.SUB),), "sgd"),
        Noop(),
    ))


def test_cd_printer():
    text = format_cd("update", moons_like_update())
    assert text == (
        "update (batch_n : [0..79]):\n"
        '  # "forward";\n'
        "  moons_input =: moons_flat @| batch_n;\n"
        '  n4 =:+ w1 * moons_input ~logic:"@";\n'
        "  h =: b1 + h;\n"
        "  relu_h =: relu h;\n"
        '  # "sgd";\n'
        '  b1 =- learning_rate * b1.grad ~logic:".";\n'
    )


def test_cd_printer_forms():
    x, y, c = TNode("x", (3,)), TNode("y", (3,)), TNode("c", (3,))
    step = IndexSymbol("step_n")
    body = Block((
        Fetch(x, Constant(0.5)),
        Fetch(x, RangeOverOffsets()),
        Fetch(x, EmbedSymbol(step)),
        Fetch(x, Values((1, 2.5, float("-inf")))),
        pointwise(y, Unop.ID, x),
        pointwise(y, Unop.EXP, x, acc=Binop.MAX),
        pointwise(y, Ternop.WHERE, c, x, 2.0),
        pointwise(y, Ternop.FMA, x, x, y, spec="x; x; x => x"),
        Gather(TNode("emb", (2, 3)), TNode("table", (5, 3)), TNode("ids", (2,))),
        ScatterAdd(TNode("table grad", (5, 3)), TNode("ids", (2,)), TNode("g", (2, 3))),
    ), 'say "hi"\n*/')
    assert format_cd("forms", body) == (
        "forms (step_n):\n"
        '  # "say \\"hi\\"\\u000a*/";\n'
        "  x =: 0.5;\n"
        "  x =: range_over_offsets();\n"
        "  x =: !@step_n;\n"
        "  x =: constant_fill([1, 2.5, -inf]);\n"
        "  y =: x;\n"
        "  y =@^ exp x;\n"
        "  y =: where(c, x, 2.0);\n"
        '  y =: fma(x, x, y) ~logic:"x; x; x => x";\n'
        "  emb =: take(table, ids);\n"
        "  table_grad =+ scatter(ids_8, g);\n"
    )


def test_nodes_read_and_written():
    a, v, c = TNode("a", (3, 4)), TNode("v", (4,)), TNode("c", (3,))
    acc = TNode("acc", (3,))
    body = Block((matvec(a, v, c), pointwise(acc, Unop.ID, c, acc=Binop.ADD)))
    assert nodes_written(body) == (c, acc)
    assert nodes_read(body) == (a, v, acc, c)  # =:+ does not read c; =+ reads acc
    assert static_symbols(body) == ()


def test_static_symbols_from_projections():
    s = IndexSymbol("batch_n", 4)
    xs, x = TNode("xs", (4, 3)), TNode("x", (3,))
    i = Symbol()
    asg = accum(x, None, Unop.ID, (xs,), [(i, 3)], (Iter(i),), ((Iter(s), Iter(i)),))
    assert static_symbols(asg) == (s,)
    assert format_cd("slice", asg) == "slice (batch_n : [0..3]):\n  x =: xs;\n"


def test_accum_validation():
    x = TNode("x", (2,))
    proj = lambda: None  # noqa: E731 (never forced)
    with pytest.raises(OcannlError, match="cannot accumulate with pow"):
        Accum(x, Binop.POW, Unop.ID, (x,), proj)
    with pytest.raises(OcannlError, match="initialize_neutral needs an accumulator"):
        Accum(x, None, Unop.ID, (x,), proj, initialize_neutral=True)
    with pytest.raises(OcannlError, match="add takes 2 operands, got 1"):
        Accum(x, None, Binop.ADD, (x,), proj)


def test_computation_holds_inits():
    w = TNode("w", (2,))
    comp = Computation("init_w", Noop(), ((w, Fetch(w, Constant(0.0))),))
    assert comp.inits[0][0] is w
