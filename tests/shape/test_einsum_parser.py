"""The einsum spec parser (docs/shapes.md, "Einsum grammar"): modes, the grammar, its worked
examples, errors."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocannl.errors import EinsumSyntaxError
from ocannl.shape.einsum import (
    ConcatAxis, ConvTerm, EinsumSpec, FixedIndex, Label, RowSpec, ShapeSpec, format_einsum, is_multichar, parse_einsum,
    parse_shape_spec,
)

# --- Builders for expected ASTs (positions left at 0; compared after `strip`) ---------------------


def ax(item):
    if isinstance(item, str):
        return Label(item)
    if isinstance(item, int):
        return FixedIndex(item)
    return item


def R(*before, var=None, after=()):
    """A row: str items are labels, int items fixed indices."""
    return RowSpec(tuple(map(ax, before)), var, tuple(map(ax, after)))


def S(b=R(), i=R(), o=R()):
    return ShapeSpec(batch=b, input=i, output=o)


def O(*items, **kw):
    """An output-only shape spec."""
    return S(o=R(*items, **kw))


def strip(node):
    """The AST with every position and source text cleared, to compare structure only."""
    if isinstance(node, EinsumSpec):
        return replace(node, operands=tuple(map(strip, node.operands)), result=strip(node.result), text="")
    if isinstance(node, ShapeSpec):
        return replace(node, batch=strip(node.batch), input=strip(node.input), output=strip(node.output),
                       text="", pos=0)
    if isinstance(node, RowSpec):
        return replace(node, before=tuple(map(strip, node.before)), after=tuple(map(strip, node.after)),
                       row_var_pos=0)
    return replace(node, pos=0)


def conv(over, stride=1, kernel=None, dilation=1, offset=0, use_padding=None):
    return ConvTerm(over, stride, kernel, dilation, offset, use_padding)


# --- Valid specs ----------------------------------------------------------------------------------

B, I, OUT = "batch", "input", "output"

VALID = [
    # single-char mode: letters are axes, a digit run is one integer
    ("ij;jk=>ik", [O("i", "j"), O("j", "k")], O("i", "k"), False),
    ("ii=>i", [O("i", "i")], O("i"), False),
    ("i=>i0", [O("i")], O("i", 0), False),
    ("i2=>i", [O("i", 2)], O("i"), False),
    ("i12j 3=>ij", [O("i", 12, "j", 3)], O("i", "j"), False),
    ("  i j ;j k=>  i k  ", [O("i", "j"), O("j", "k")], O("i", "k"), False),
    ("ij;jk;kl=>il", [O("i", "j"), O("j", "k"), O("k", "l")], O("i", "l"), False),
    ("a|b; c => abc", [S(b=R("a"), o=R("b")), O("c")], O("a", "b", "c"), False),
    ("b|->o => o", [S(b=R("b"), o=R("o"))], O("o"), False),
    ("|->i=>i", [O("i")], O("i"), False),
    ("->i => i", [O("i")], O("i"), False),
    ("ab->c => c", [S(i=R("a", "b"), o=R("c"))], O("c"), False),
    ("_i; _ => i_", [O("_", "i"), O("_")], O("i", "_"), False),
    ("a...b=>ab", [O("a", var=OUT, after=["b"])], O("a", "b"), False),
    ("..v..|... => ..v..kji", [S(b=R(var="v"), o=R(var=OUT))], O(var="v", after="kji"), False),
    ("a..r..;..r..b=>ab", [O("a", var="r"), O(var="r", after=["b"])], O("a", "b"), False),
    ("...|..i.. -> ... => 0", [S(b=R(var=B), i=R(var="i"), o=R(var=OUT))], O(0), False),
    (" ... | ..d.. => ... | 0 ", [S(b=R(var=B), o=R(var="d"))], S(b=R(var=B), o=R(0)), False),
    # worked examples, numbered as the test_exN tests of tests/test_einsum_values.py
    ("b|h->o; b|i->h => b|i->o", [S(R("b"), R("h"), R("o")), S(R("b"), R("i"), R("h"))],
     S(R("b"), R("i"), R("o")), False),  # 2
    ("b|i->o => o|b->i", [S(R("b"), R("i"), R("o"))], S(R("o"), R("b"), R("i")), False),  # 3
    ("b|i->o => b|i", [S(R("b"), R("i"), R("o"))], S(b=R("b"), o=R("i")), False),  # 4
    ("...|...->... => 0", [S(R(var=B), R(var=I), R(var=OUT))], O(0), False),  # 5
    ("...|i->1; ...|...->i => ...|i", [S(R(var=B), R("i"), R(1)), S(R(var=B), R(var=I), R("i"))],
     S(b=R(var=B), o=R("i")), False),  # 6
    ("i; j => i->j", [O("i"), O("j")], S(i=R("i"), o=R("j")), False),  # 7
    ("i=>ii", [O("i")], O("i", "i"), False),  # 8
    (" ... s | h d; ... t | h d => ... s | t -> h",
     [S(b=R(var=B, after="s"), o=R("h", "d")), S(b=R(var=B, after="t"), o=R("h", "d"))],
     S(R(var=B, after="s"), R("t"), R("h")), False),  # 9
    (" ... s | t -> h; ... t | h e => ... s | h e",
     [S(R(var=B, after="s"), R("t"), R("h")), S(b=R(var=B, after="t"), o=R("h", "e"))],
     S(b=R(var=B, after="s"), o=R("h", "e")), False),  # 10
    ("... | 1*oh=+kh, 1*ow=+kw, ..ic..; kh, kw, ..ic.. -> ..oc.. => ... | oh, ow, ..oc..",
     [S(b=R(var=B), o=R(conv("oh", 1, "kh", use_padding=True), conv("ow", 1, "kw", use_padding=True),
                        var="ic")),
      S(i=R("kh", "kw", var="ic"), o=R(var="oc"))],
     S(b=R(var=B), o=R("oh", "ow", var="oc")), True),  # 11
    ("... | 1*oh<+kh, 1*ow<+kw, ..ic..; kh, kw, ..ic.. -> ..oc.. => ... | oh, ow, ..oc..",
     [S(b=R(var=B), o=R(conv("oh", 1, "kh", use_padding=False), conv("ow", 1, "kw", use_padding=False),
                        var="ic")),
      S(i=R("kh", "kw", var="ic"), o=R(var="oc"))],
     S(b=R(var=B), o=R("oh", "ow", var="oc")), True),  # 12
    ("... | 2*oh<+wh, 2*ow<+ww, ..c..; wh, ww => ... | oh, ow, ..c..",
     [S(b=R(var=B), o=R(conv("oh", 2, "wh", use_padding=False), conv("ow", 2, "ww", use_padding=False),
                        var="c")),
      O("wh", "ww")],
     S(b=R(var=B), o=R("oh", "ow", var="c")), True),  # 13
    ("a; b => a^b", [O("a"), O("b")], O(ConcatAxis(("a", "b"))), True),  # 14
    ("... | ... -> ..., i => ... | ... -> ..., 2*i", [S(R(var=B), R(var=I), R(var=OUT, after=["i"]))],
     S(R(var=B), R(var=I), R(var=OUT, after=[conv("i", 2)])), True),  # 15
    ("... | ... -> ..., i => ... | ... -> ..., 2*i + 1", [S(R(var=B), R(var=I), R(var=OUT, after=["i"]))],
     S(R(var=B), R(var=I), R(var=OUT, after=[conv("i", 2, offset=1)])), True),  # 15
    ("... | h, w, ..c.. => ... | 0, 0, ..c..", [S(b=R(var=B), o=R("h", "w", var="c"))],
     S(b=R(var=B), o=R(0, 0, var="c")), True),  # 16
    ("2...|...->... => ...|...->...", [S(R(2, var=B), R(var=I), R(var=OUT))],
     S(R(var=B), R(var=I), R(var=OUT)), False),  # 17
    ("ab|cd->ef => cf|ae->db", [S(R("a", "b"), R("c", "d"), R("e", "f"))],
     S(R("c", "f"), R("a", "e"), R("d", "b")), False),  # 18
    # multichar mode: identifiers, commas, trailing commas
    ("a,b,c => c", [O("a", "b", "c")], O("c"), True),
    ("a, b, => a", [O("a", "b")], O("a"), True),
    ("a, b, | c, -> d, => a,", [S(R("a", "b"), R("c"), R("d"))], O("a"), True),
    ("batch, seq | hid -> out => batch | out", [S(R("batch", "seq"), R("hid"), R("out"))],
     S(b=R("batch"), o=R("out")), True),
    ("w_1, X2 => X2", [O("w_1", "X2")], O("X2"), True),
    ("_, a => a,", [O("_", "a")], O("a"), True),
    ("i12, x=>x", [O("i12", "x")], O("x"), True),
    ("a, ..., b => a, b", [O("a", var=OUT, after=["b"])], O("a", "b"), True),
    ("a ... b, c => a", [O("a", var=OUT, after=["b", "c"])], O("a"), True),
    ("x, ..rest.. | ... => ..rest..", [S(b=R("x", var="rest"), o=R(var=OUT))], O(var="rest"), True),
    ("..., a | b, ... -> ..., c => a,", [S(R(var=B, after=["a"]), R("b", var=I), R(var=OUT, after=["c"]))],
     O("a"), True),
    # convolution and strided terms
    ("2*oh<+kh => oh", [O(conv("oh", 2, "kh", use_padding=False))], O("oh"), True),
    ("2*oh <+ kh => oh", [O(conv("oh", 2, "kh", use_padding=False))], O("oh"), True),
    ("2*oh< + kh=>oh", [O(conv("oh", 2, "kh", use_padding=False))], O("oh"), True),
    ("oh=+kh => oh", [O(conv("oh", 1, "kh", use_padding=True))], O("oh"), True),
    ("2*oh+3*kh => oh", [O(conv("oh", 2, "kh", dilation=3))], O("oh"), True),
    ("2*o+1+3*k => o", [O(conv("o", 2, "k", dilation=3, offset=1))], O("o"), True),
    ("3 * o = + 2 + 2 * k => o", [O(conv("o", 3, "k", dilation=2, offset=2, use_padding=True))], O("o"),
     True),
    ("o+k => o", [O(conv("o", 1, "k"))], O("o"), True),
    ("2*o+k, x => x", [O(conv("o", 2, "k"), "x")], O("x"), True),
    ("x, 2*i => x", [O("x", conv("i", 2))], O("x"), True),
    ("2*i+1 => i", [O(conv("i", 2, offset=1))], O("i"), True),
    ("a^b^c => a, b, c", [O(ConcatAxis(("a", "b", "c")))], O("a", "b", "c"), True),
    ("i; j; k => i ^ j ^ k", [O("i"), O("j"), O("k")], O(ConcatAxis(("i", "j", "k"))), True),
]


@pytest.mark.parametrize("spec, operands, result, multichar", VALID, ids=[c[0] for c in VALID])
def test_valid_spec_parses_to_expected_ast(spec, operands, result, multichar):
    parsed = parse_einsum(spec)
    assert parsed.text == spec
    assert strip(parsed) == EinsumSpec(tuple(operands), result, "", multichar)


@pytest.mark.parametrize("spec", [c[0] for c in VALID])
def test_valid_spec_round_trips_through_the_printer(spec):
    parsed = parse_einsum(spec)
    assert strip(parse_einsum(format_einsum(parsed))) == strip(parsed)


def test_spaced_conv_terms_are_the_same_term_at_the_same_place():
    specs = ("2*oh<+kh=>oh", "2*oh <+ kh=>oh", "2*oh< + kh=>oh")
    terms = [parse_einsum(s).operands[0].output.before[0] for s in specs]
    assert terms[0] == terms[1] == terms[2] == ConvTerm("oh", 2, "kh", 1, 0, False, pos=0)


# --- Positions --------------------------------------------------------------------------------


def test_positions_of_labels_and_shape_specs():
    spec = parse_einsum("ij;jk=>ik")
    a, b = spec.operands
    assert (a.pos, a.text, b.pos, b.text) == (0, "ij", 3, "jk")
    assert (spec.result.pos, spec.result.text) == (7, "ik")
    assert spec.result.output.before == (Label("i", 7), Label("k", 8))


def test_positions_with_whitespace_and_row_variables():
    spec = parse_einsum(" ... s | h d; ... t | h d => ... s | t -> h")
    q, k = spec.operands
    assert (q.pos, q.text) == (1, "... s | h d")
    assert (k.pos, k.text) == (14, "... t | h d")
    assert q.batch == RowSpec((), "batch", (Label("s", 5),), row_var_pos=1)
    assert (spec.result.pos, spec.result.text) == (29, "... s | t -> h")
    assert spec.result.input.before == (Label("t", 37),)


def test_positions_of_conv_concat_and_named_row_variables():
    text = "x, 2*oh <+ kh, a^b, ..ic.. -> 7 => x"
    spec = parse_einsum(text)
    row = spec.operands[0].input
    assert row.before == (Label("x", 0), ConvTerm("oh", 2, "kh", 1, 0, False, pos=3),
                          ConcatAxis(("a", "b"), pos=15))
    assert (row.row_var, row.row_var_pos) == ("ic", 20)
    assert spec.operands[0].output.before == (FixedIndex(7, pos=30),)
    assert spec.operands[0].text == text[:31]


def test_digit_runs_are_one_integer_at_their_first_digit():
    assert parse_einsum("i12j=>i").operands[0].output.before == (
        Label("i", 0), FixedIndex(12, 1), Label("j", 3))


# --- Mode detection and single shape specs -------------------------------------------------------


@pytest.mark.parametrize("spec", ["abc", "a|b->c", "...a..b", "ij;jk=>ik", "b|i->o => o|b->i", ""])
def test_single_char_mode(spec):
    assert not is_multichar(spec)


@pytest.mark.parametrize("spec", ["a,b,c", "2*a+b", "a+b", "a*b", "a^b", "a&b", "o<+k", "o=+k", "a = > b"])
def test_multichar_mode(spec):
    assert is_multichar(spec)


def test_section_10_item_9_axis_counts():
    assert parse_shape_spec("abc") == replace(S(o=R(Label("a", 0), Label("b", 1), Label("c", 2))), text="abc")
    assert strip(parse_shape_spec("b|i->o")) == S(R("b"), R("i"), R("o"))
    assert [len(s.output.axes) for s in parse_einsum("ij;jk=>ik").operands] == [2, 2]
    assert strip(parse_shape_spec("a, b,")) == O("a", "b")
    assert strip(parse_shape_spec("2*o+k")) == O(conv("o", 2, "k"))
    assert strip(parse_shape_spec("2*o+3*k, x")) == O(conv("o", 2, "k", dilation=3), "x")


def test_shape_spec_integers_are_sizes_and_empty_is_scalar():
    spec = parse_shape_spec("3, 4 -> 5")
    assert spec == ShapeSpec(input=RowSpec((FixedIndex(3, 0), FixedIndex(4, 3))),
                             output=RowSpec((FixedIndex(5, 8),)), text="3, 4 -> 5", pos=0)
    assert parse_shape_spec("") == ShapeSpec()
    assert strip(parse_shape_spec("...|..r..")) == S(b=R(var=B), o=R(var="r"))


def test_identifier_stride_asks_for_the_number():
    with pytest.raises(EinsumSyntaxError) as err:
        parse_einsum("a*b => b")
    assert err.value.position == 0 and "f-string" in err.value.expected


# --- Malformed specs ------------------------------------------------------------------------------

MALFORMED = [
    # (spec, position of the caret, part of the `expected` text)
    ("ij;jk", 5, "expected '=>' and a result spec"),
    ("ij", 2, "expected '=>' and a result spec"),
    ("", 0, "expected an operand shape spec"),
    ("i;", 2, "expected an operand shape spec"),
    ("ij;;jk=>ik", 3, "expected an operand shape spec before ';'"),
    ("ij; =>ik", 4, "expected an operand shape spec before '=>'"),
    ("=>i", 0, "expected an operand shape spec before '=>'"),
    ("a&b=>a", 1, "'&' is reserved"),
    ("i=>i&", 4, "'&' is reserved"),
    ("i$j=>i", 1, "unexpected character '$'"),
    ("a, b => a#", 9, "unexpected character '#' in multichar mode"),
    ("a-b=>a", 1, "expected '>' after '-'"),
    ("a.b=>a", 1, "a lone '.'"),
    ("a = > b", 4, "unexpected character '>'"),
    ("-2*o+k=>o", 0, "cannot be negative"),
    ("......=>i", 3, "at most one row variable"),
    ("..a.. ..b..=>i", 6, "at most one row variable"),
    ("a, ..., b, ... => a", 11, "at most one row variable"),
    ("..r=>r", 3, "expected '..' to close the row variable '..r'"),
    ("..rs..=>i", 3, "one letter"),
    ("a..b", 4, "expected '..' to close the row variable '..b'"),
    ("...a..b", 4, "at most one row variable"),
    ("..=>i", 2, "expected a row variable name after '..'"),
    ("i..i..=>i", 3, "expected a row variable name other than 'i'"),
    ("..i..;i=>i", 6, "expected an axis label other than 'i'"),
    ("..r..=>r", 7, "'r' is a row variable"),
    ("output, ... => output", 8, "'...' in the output row is the row variable 'output'"),
    ("a|b|c=>a", 3, "at most one '|'"),
    ("a->b->c=>a", 4, "at most one '->'"),
    ("a->b|c=>a", 4, "expected '|' before '->'"),
    ("i=>i=>i", 4, "one '=>' only"),
    ("i=>i;j", 4, "expected the end of the spec after the result"),
    ("0*o+k=>o", 0, "expected a positive stride, not 0"),
    ("o+0*k=>o", 2, "expected a positive dilation, not 0"),
    ("2*o<=>o", 4, "expected '+' and a kernel label after '<'"),
    ("x, 2*o=", 7, "expected '+' and a kernel label after '='"),
    ("2*o+2=>o", 4, "smaller than the stride 2"),
    ("2*o+3+k=>o", 4, "smaller than the stride 2"),
    ("o+1=>o", 3, "an offset without a kernel needs a stride"),
    ("2*o<+1=>o", 6, "'<' pads a convolution"),
    ("s*o+k=>o", 0, "expected an integer stride, not the name 's'"),
    ("o+d*k=>o", 2, "expected an integer dilation, not the name 'd'"),
    ("2*=>o", 2, "expected an axis label after '*'"),
    ("2*3=>o", 2, "expected an axis label after '*'"),
    ("2*o+=>o", 4, "expected an axis label after '+'"),
    ("a^=>a", 2, "expected an axis label after '^'"),
    ("a^_=>a", 2, "expected an axis label after '^'"),
    ("3^a=>a", 0, "concatenation components are labels"),
    ("a b, c=>a", 2, "expected ',' between axes"),
    ("2*o+1+3*k+1=>o", 9, "expected ',' between axes, before '+'"),
    ("a,,b=>a", 2, "expected an axis before ','"),
    (",a=>a", 0, "expected an axis before ','"),
    ("a, +b=>a", 3, "expected an axis label before '+'"),
]


@pytest.mark.parametrize("spec, position, expected", MALFORMED, ids=[c[0] or "<empty>" for c in MALFORMED])
def test_malformed_spec_points_at_the_offending_character(spec, position, expected):
    with pytest.raises(EinsumSyntaxError) as err:
        parse_einsum(spec)
    assert err.value.spec == spec
    assert err.value.position == position
    assert expected in err.value.expected


@pytest.mark.parametrize("spec, position, expected", [
    ("a;b", 1, "expected the end of the shape spec, not ';'"),
    ("i=>i", 1, "expected the end of the shape spec, not '=>'"),
    ("2*o<", 4, "expected '+' and a kernel label after '<'"),
    ("a|b|c", 3, "at most one '|'"),
])
def test_malformed_shape_spec(spec, position, expected):
    with pytest.raises(EinsumSyntaxError) as err:
        parse_shape_spec(spec)
    assert (err.value.position, expected in err.value.expected) == (position, True)


def test_message_shows_the_spec_with_a_caret_under_the_offending_character():
    spec = "b|i->o; b|h->i => b|h$o"
    with pytest.raises(EinsumSyntaxError) as err:
        parse_einsum(spec)
    lines = str(err.value).splitlines()
    assert lines[0].startswith("invalid einsum spec: unexpected character '$'")
    spec_line, caret_line = lines[1], lines[2]
    assert spec_line.strip() == spec
    assert caret_line.rstrip().endswith("^") and set(caret_line.rstrip()[:-1]) <= {" "}
    assert spec_line[len(caret_line.rstrip()) - 1] == "$"


def test_message_caret_at_the_end_when_the_spec_ends_too_early():
    with pytest.raises(EinsumSyntaxError) as err:
        parse_einsum("ij;jk")
    spec_line, caret_line = str(err.value).splitlines()[1:3]
    assert len(caret_line) == len(spec_line) + 1 and caret_line.endswith("^")


# --- Property: printing and parsing are inverse (positions aside) -----------------------------

MULTI_LABELS = ["a", "b", "z", "oh", "kh", "x1", "w_2", "Hd"]
MULTI_ROW_VARS = ["r", "v", "ic", "oc", "batch", "input", "output"]  # disjoint from the labels
KINDS = ("batch", "input", "output")


@st.composite
def conv_terms(draw):
    name = st.sampled_from(MULTI_LABELS)
    stride = draw(st.integers(1, 4))
    offset = draw(st.integers(0, stride - 1))
    if draw(st.booleans()):
        return ConvTerm(draw(name), stride, offset=offset)
    return ConvTerm(draw(name), stride, draw(name), draw(st.integers(1, 3)), offset,
                    draw(st.sampled_from([None, True, False])))


def multichar_axes():
    return st.one_of(
        st.sampled_from(MULTI_LABELS + ["_"]).map(Label),
        st.integers(0, 40).map(FixedIndex),
        st.lists(st.sampled_from(MULTI_LABELS), min_size=2, max_size=3).map(lambda p: ConcatAxis(tuple(p))),
        conv_terms(),
    )


def single_char_axes():
    return st.one_of(st.sampled_from(list("abcdijk_")).map(Label), st.integers(0, 40).map(FixedIndex))


@st.composite
def rows(draw, kind, axes, row_var_names):
    before = tuple(draw(st.lists(axes, max_size=3)))
    if not draw(st.booleans()):
        return RowSpec(before)
    var = draw(st.one_of(st.just(kind), st.sampled_from(row_var_names)))
    return RowSpec(before, var, tuple(draw(st.lists(axes, max_size=3))))


@st.composite
def einsum_specs(draw, multichar):
    axes = multichar_axes() if multichar else single_char_axes()
    names = MULTI_ROW_VARS if multichar else ["r", "s", "v"]

    def shape():
        return ShapeSpec(*(draw(rows(kind, axes, names)) for kind in KINDS))

    operands = tuple(shape() for _ in range(draw(st.integers(1, 3))))
    return EinsumSpec(operands, shape(), "", multichar)


def check_positions(spec: EinsumSpec):
    """Every recorded position points at the text it was parsed from."""
    text = spec.text
    for shape in spec.operands + (spec.result,):
        assert text[shape.pos : shape.pos + len(shape.text)] == shape.text
        for kind in KINDS:
            row = shape.row(kind)
            if row.row_var is not None:
                assert text.startswith("..", row.row_var_pos)
            for a in row.axes:
                assert text.startswith(first_token(a, text), a.pos)


def first_token(axis, text: str) -> str:
    if isinstance(axis, Label):
        return axis.name
    if isinstance(axis, FixedIndex):
        return str(axis.value)
    if isinstance(axis, ConcatAxis):
        return axis.parts[0]
    return str(axis.stride) if text[axis.pos].isdigit() else axis.over


def has_axes(spec: EinsumSpec) -> bool:
    return any(s.row(k).axes or s.row(k).row_var for s in spec.operands + (spec.result,) for k in KINDS)


@settings(max_examples=200, deadline=None)
@given(st.one_of(einsum_specs(multichar=True), einsum_specs(multichar=False)))
def test_printed_specs_parse_back_to_the_same_ast(spec):
    text = format_einsum(spec)
    parsed = parse_einsum(text)
    assert parsed.text == text
    assert strip(parsed) == replace(spec, multichar=parsed.multichar)
    if has_axes(spec):
        assert parsed.multichar == spec.multichar
    check_positions(parsed)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab1_ ,.|-;>=*+^<&$", max_size=20))
def test_any_string_parses_or_raises_a_syntax_error_inside_the_spec(text):
    try:
        parse_einsum(text)
    except EinsumSyntaxError as err:
        assert 0 <= err.position <= len(text)
        assert err.expected


def test_empty_result_is_a_scalar():
    """``i;i=>`` reduces everything, as numpy's ``i,i->``."""
    spec = parse_einsum("i;i=>")
    assert spec.result.batch.axes == spec.result.input.axes == spec.result.output.axes == ()
    assert all(r.closed for r in (spec.result.batch, spec.result.input, spec.result.output))
