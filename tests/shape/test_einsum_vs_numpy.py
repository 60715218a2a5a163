"""Einsum shape inference against ``numpy.einsum`` on random specs (docs/shapes.md, "Einsum grammar").

Random valid specs of one or two operands with single-character labels, a random size (1-4) per
label, and a result made of some of the labels in any order. The spec is translated to numpy's
``ij,jk->ik`` form, listing each shape's axes in ocannl's memory order (batch, output, input), so
the inferred result dims must equal the shape of numpy's result.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import ocannl as oc
import ocannl.session

LETTERS = "abcdefgh"


@st.composite
def einsum_case(draw, with_kinds: bool):
    """``(operands, result, sizes)``: each operand and the result is a ``(batch, output, input)``
    triple of label strings (only output labels unless ``with_kinds``)."""
    labels = draw(st.lists(st.sampled_from(LETTERS), min_size=1, max_size=5, unique=True))
    sizes = {c: draw(st.integers(1, 4)) for c in labels}
    n_operands = draw(st.integers(1, 2))

    def split(axes: str) -> tuple[str, str, str]:
        if not with_kinds:
            return ("", axes, "")
        cut1 = draw(st.integers(0, len(axes)))
        cut2 = draw(st.integers(cut1, len(axes)))
        return (axes[:cut1], axes[cut1:cut2], axes[cut2:])

    operands = []
    for _ in range(n_operands):
        axes = "".join(draw(st.lists(st.sampled_from(labels), min_size=0, max_size=4)))
        operands.append(split(axes))
    used = sorted({c for b, o, i in operands for c in b + o + i})
    result_axes = "".join(draw(st.permutations(used)))[:draw(st.integers(0, len(used)))]
    return operands, split(result_axes), sizes


def ocannl_spec(shape: tuple[str, str, str], with_kinds: bool) -> str:
    batch, output, input = shape
    if not with_kinds:
        return output or "->"  # an empty output-only spec is written `->`
    return f"{batch}|{input}->{output}"


def numpy_subscripts(shape: tuple[str, str, str]) -> str:
    batch, output, input = shape
    return batch + output + input  # memory order


def check_against_numpy(operands, result, sizes, with_kinds: bool) -> None:
    ocannl.session.reset()
    spec = "; ".join(ocannl_spec(s, with_kinds) for s in operands) + " => " + ocannl_spec(result, with_kinds)
    arrays, tensors = [], []
    for b, o, i in operands:
        arr = np.ones(tuple(sizes[c] for c in b + o + i), dtype=np.float32)
        arrays.append(arr)
        tensors.append(oc.tensor(arr, batch=len(b), input=len(i)))
    expected = np.einsum(",".join(map(numpy_subscripts, operands)) + "->" + numpy_subscripts(result), *arrays)
    r = oc.einsum(spec, *tensors)
    assert r.dims == expected.shape, spec
    b, o, i = result
    assert r.shape.batch == tuple(sizes[c] for c in b), spec
    assert r.shape.output == tuple(sizes[c] for c in o), spec
    assert r.shape.input == tuple(sizes[c] for c in i), spec
    for t, arr in zip(tensors, arrays):
        assert t.dims == arr.shape


@settings(max_examples=300, deadline=None)
@given(einsum_case(with_kinds=False))
def test_output_axes_einsum_matches_numpy(case):
    check_against_numpy(*case, with_kinds=False)


@settings(max_examples=200, deadline=None)
@given(einsum_case(with_kinds=True))
def test_einsum_with_batch_and_input_axes_matches_numpy(case):
    check_against_numpy(*case, with_kinds=True)


def test_batch_and_input_examples_in_memory_order():
    """A few fixed cases of the translation: `b|i->o` is numpy's `boi`."""
    cases = [
        ([("b", "o", "h"), ("b", "h", "i")], ("b", "o", "i"), {"b": 2, "o": 5, "h": 4, "i": 3}),
        ([("b", "o", "i")], ("o", "i", "b"), {"b": 2, "o": 4, "i": 3}),
        ([("ab", "ef", "cd")], ("cf", "db", "ae"), dict(zip("abcdef", (2, 3, 4, 5, 6, 7)))),
        ([("a", "h", "i"), ("b", "o", "h")], ("ab", "o", "i"), {"a": 2, "b": 3, "h": 4, "i": 3, "o": 5}),
        ([("s", "hd", ""), ("t", "hd", "")], ("s", "h", "t"), {"s": 3, "t": 4, "h": 2, "d": 5}),
    ]
    for operands, result, sizes in cases:
        check_against_numpy(operands, result, sizes, with_kinds=True)


def test_single_axis_reductions_and_traces():
    for operands, result, sizes in [
        ([("", "ii", "")], ("", "i", ""), {"i": 3}),
        ([("", "ij", "")], ("", "", ""), {"i": 3, "j": 2}),
        ([("", "ij", ""), ("", "j", "")], ("", "i", ""), {"i": 4, "j": 2}),
        ([("", "i", ""), ("", "j", "")], ("", "ji", ""), {"i": 4, "j": 2}),
    ]:
        check_against_numpy(operands, result, sizes, with_kinds=False)
