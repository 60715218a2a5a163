import numpy as np
import pytest

from ocannl.lowlevel import dtypes
from ocannl.lowlevel.dtypes import DTypeError


def test_names_sizes_and_kinds():
    assert [d.name for d in dtypes.ALL] == [
        "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint32", "uint4x32",
    ]
    assert dtypes.DEFAULT is dtypes.float32
    f32 = dtypes.float32
    assert (f32.c_name, f32.triton_name, f32.msl_name) == ("float", "tl.float32", "float")
    assert dtypes.bfloat16.storage == np.uint16 and dtypes.bfloat16.itemsize == 2
    assert dtypes.uint4x32.itemsize == 16 and dtypes.uint4x32.lanes == 4
    assert [d.is_float for d in (dtypes.float16, dtypes.int32, dtypes.uint4x32)] == [True, False, False]
    assert dtypes.by_name("int64") is dtypes.int64


def test_metal_has_no_double():
    with pytest.raises(DTypeError, match="Metal has no float64"):
        dtypes.float64.msl_name


def test_unknown_name():
    with pytest.raises(DTypeError, match="known: float32"):
        dtypes.by_name("float8")


def test_compute_types():
    assert dtypes.float16.compute is dtypes.float32
    assert dtypes.bfloat16.compute is dtypes.float32
    assert dtypes.float64.compute is dtypes.float64
    assert dtypes.int32.compute is dtypes.int32


def test_promotion_order():
    assert dtypes.promote(dtypes.float16, dtypes.bfloat16) is dtypes.bfloat16
    assert dtypes.promote(dtypes.float32, dtypes.float64) is dtypes.float64
    assert dtypes.promote(dtypes.int64, dtypes.float16) is dtypes.float16
    assert dtypes.promote(dtypes.int32, dtypes.uint32) is dtypes.uint32
    assert dtypes.promote(dtypes.float64, dtypes.uint4x32) is dtypes.uint4x32


def test_bfloat16_rounds_to_nearest_even():
    # 1 + 2**-8 lies halfway between bfloat16 neighbours 1 and 1 + 2**-7: ties go to even (1).
    halfway = np.float32(1 + 2**-8)
    above = np.nextafter(halfway, np.float32(2))
    bits = dtypes.float32_to_bfloat16_bits(np.array([halfway, above, 1 + 3 * 2**-8], dtype=np.float32))
    assert dtypes.bfloat16_bits_to_float32(bits).tolist() == [1.0, 1 + 2**-7, 1 + 2**-6]
    assert dtypes.float32_to_bfloat16_bits(np.float32(1.0)) == 0x3F80


def test_bfloat16_special_values():
    values = np.array([np.inf, -np.inf, np.nan, -0.0, 3.4e38], dtype=np.float32)
    back = dtypes.bfloat16_bits_to_float32(dtypes.float32_to_bfloat16_bits(values))
    assert back[0] == np.inf and back[1] == -np.inf and np.isnan(back[2])
    assert back[3] == 0 and np.signbit(back[3])
    assert back[4] == np.inf  # past the largest bfloat16


def test_round_to():
    assert dtypes.round_to(dtypes.float32, 0.1) == np.float32(0.1)
    assert type(dtypes.round_to(dtypes.float16, 0.1)) is np.float32
    assert dtypes.round_to(dtypes.float16, 0.1) == np.float32(np.float16(0.1))
    assert dtypes.round_to(dtypes.bfloat16, 1 + 2**-8) == 1.0
    assert dtypes.round_to(dtypes.int32, -2.7) == -2  # truncation toward zero, as C
    assert dtypes.round_to(dtypes.int32, 2**31) == -(2**31)  # wraps around
    assert dtypes.round_to(dtypes.uint32, -1) == 2**32 - 1
    with pytest.raises(DTypeError):
        dtypes.round_to(dtypes.int32, float("nan"))
