"""The Triton rendering table (ocannl/backends/triton/tile_expr.py) works on constants' numbers,
never on generated text: negating, casting and storing constants keep every value exact."""

import math

import pytest

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.scalar_ops import Binop, Unop
from ocannl.backends.triton.tile_expr import TileArithmetic, Val, literal_code, stored_literal


def _arithmetic() -> tuple[TileArithmetic, list[str]]:
    lines: list[str] = []

    def temp(code: str) -> str:
        lines.append(code)
        return f"t{len(lines) - 1}"

    return TileArithmetic(temp, set()), lines


@pytest.mark.parametrize("value, code", [
    (2.5, "-2.5"), (-0.0, "0.0"), (0.0, "-0.0"), (math.inf, 'float("-inf")'), (-math.inf, 'float("inf")'),
    (math.nan, '-float("nan")'),
])
def test_negating_a_constant_negates_its_number(value, code):
    negated = TileArithmetic.negate(Val.constant(value, dtypes.float32))
    assert negated.literal and negated.code == code
    assert math.copysign(1.0, negated.value) == -math.copysign(1.0, value)


def test_a_cast_constant_is_rounded_to_its_new_type():
    assert TileArithmetic.cast(Val.constant(3, dtypes.int32), dtypes.float32).code == "3.0"
    assert TileArithmetic.cast(Val.constant(2.75, dtypes.float32), dtypes.int32).code == "2"
    third = TileArithmetic.cast(Val.constant(1 / 3, dtypes.float64), dtypes.float16)
    assert third.value == float(dtypes.round_to(dtypes.float16, 1 / 3)) and third.code == "0.333251953125"


def test_constants_are_stored_as_their_buffers_hold_them():
    assert stored_literal(1.0, dtypes.bfloat16) == "16256"  # 0x3F80, bfloat16's bits of 1.0
    assert stored_literal(-math.inf, dtypes.float32) == 'float("-inf")'
    assert stored_literal(7, dtypes.uint4x32) == "0"
    assert literal_code(-7, dtypes.int64) == "-7"


def test_an_operand_read_twice_is_named_once():
    arithmetic, lines = _arithmetic()
    x = Val("tl.load(p + xindex)", frozenset({"x"}), dtypes.float32)
    assert arithmetic.unary(Unop.RELU, x) == "tl.where(t0 > 0, t0, 0.0)"
    assert lines == ["tl.load(p + xindex)"]
    assert arithmetic.binary(Binop.DIV, Val.constant(1, dtypes.float32, "1.0"), x, dtypes.float32) == (
        "tl.div_rn(1.0, tl.load(p + xindex))")
