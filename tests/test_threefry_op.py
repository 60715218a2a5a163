"""``oc.threefry4x32(key, counter)``: standard Threefry-4x32-20 of words held in uint32 tensors,
the same bits on every backend (interp vectorized and scalar, c, metal through its C++ shim,
triton in its CPU interpreter), and the two loop-IR operators it is built from, ``uint4x32_pack``
and ``uint4x32_word``."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import ocannl as oc  # noqa: E402
from backend_params import context  # noqa: E402
from ocannl.backends.context import set_default_context  # noqa: E402
from ocannl.errors import ShapeError  # noqa: E402
from ocannl.lowlevel import dtypes, op_semantics  # noqa: E402
from ocannl.lowlevel.assignments import format_cd  # noqa: E402
from ocannl.lowlevel.dtypes import DTypeError  # noqa: E402
from ocannl.lowlevel.ir import Binary, Const, Load  # noqa: E402
from ocannl.lowlevel.prng_reference import threefry4x32 as reference  # noqa: E402
from ocannl.lowlevel.scalar_ops import Binop  # noqa: E402
from ocannl.lowlevel.tnode import TNode  # noqa: E402

BACKENDS = ("interp", "interp-scalar", "c", "metal", "triton")
"""``interp`` runs vectorized; ``interp-scalar`` is its literal walk."""

# Random123's 20-round known answers: counter, key, result.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0, 0, 0), (0x9C6CA96A, 0xE17EAE66, 0xFC10ECD4, 0x5256A7D8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 4, (0x2A881696, 0x57012287, 0xF6C7446E, 0xA16A6732)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0, 0x082EFA98, 0xEC4E6C89),
     (0x59CD1DBB, 0xB8879579, 0x86B5D00C, 0xAC8B6D84)),
]


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """Makes the backend the default context, so ``.numpy()`` computes there."""
    set_default_context(context(request.param))
    return request.param


def words(array) -> oc.Tensor:
    return oc.tensor(np.asarray(array, dtype=np.uint32), dtype="uint32")


def test_known_answers(backend):
    counters, keys, expected = (np.array(column, dtype=np.uint32) for column in zip(*KNOWN_ANSWERS))
    result = oc.threefry4x32(words(keys), words(counters))
    assert result.dtype is dtypes.uint32
    out = result.numpy()
    assert out.dtype == np.uint32
    np.testing.assert_array_equal(out, expected)


def test_random_keys_and_counters_equal_the_reference(backend):
    rng = np.random.default_rng(16)
    keys, counters = rng.integers(0, 2**32, (2, 64, 4), dtype=np.uint32)
    keys[0], counters[1] = 0xFFFFFFFF, 0x80000000  # a high word with its top bit set: a negative int64 half
    out = oc.threefry4x32(words(keys), words(counters)).numpy()
    np.testing.assert_array_equal(out, reference(keys, counters))


def test_one_key_broadcasts_over_many_counters(backend):
    key = np.array([0xA4093822, 0x299F31D0, 0x082EFA98, 0xEC4E6C89], dtype=np.uint32)
    counters = np.arange(6 * 3 * 4, dtype=np.uint32).reshape(6, 3, 4) * np.uint32(0x9E3779B9)
    result = oc.threefry4x32(words(key), oc.tensor(counters, batch=1, dtype="uint32"))
    assert result.shape.batch == (6,) and result.shape.output == (3, 4)
    np.testing.assert_array_equal(result.numpy(), reference(np.broadcast_to(key, counters.shape), counters))
    assert "(threefry4x32): batch [6] output [3, 4]" in oc.explain_shapes(result)


def test_a_hashed_key_hashes_again(backend):
    """The inner result is an intermediate the outer one reads word by word (the optimizer may
    compute it inline)."""
    rng = np.random.default_rng(3)
    keys, counters = rng.integers(0, 2**32, (2, 8, 4), dtype=np.uint32)
    k, c = words(keys), words(counters)
    out = oc.threefry4x32(oc.threefry4x32(k, c), c).numpy()
    np.testing.assert_array_equal(out, reference(reference(keys, counters), counters))


def test_a_key_without_four_words_is_a_shape_error_naming_the_op():
    with pytest.raises(ShapeError, match="threefry4x32"):
        oc.threefry4x32(words(np.zeros((2, 3))), words(np.zeros((2, 4))))
    with pytest.raises(ShapeError, match="threefry4x32"):
        oc.threefry4x32(words(np.zeros((2, 4))), words(np.zeros((5,))))


def test_key_and_counter_must_hold_uint32_words():
    with pytest.raises(DTypeError, match=r"threefry4x32: the key 'k' holds float32"):
        oc.threefry4x32(oc.tensor(np.zeros(4), label="k"), words(np.zeros(4)))
    with pytest.raises(DTypeError, match="threefry4x32: the counter .* holds int64"):
        oc.threefry4x32(words(np.zeros(4)), oc.tensor(np.zeros(4, dtype=np.int64)))


def test_the_result_takes_no_gradient():
    result = oc.threefry4x32(words(np.zeros(4)), words(np.ones(4)))
    assert not result.requires_grad
    assert result.definition.gradient is None


# -- the loop-IR operators ------------------------------------------------------------------------

HALVES = [0, 1, -1, 2**32, 2**32 - 1, -(2**63), 2**63 - 1, 0x0123456789ABCDEF, -0x0123456789ABCDEF]


def test_pack_and_word_forms_agree():
    lo = np.array(HALVES, dtype=np.int64)
    hi = lo[::-1].copy()
    lanes = op_semantics.array_uint4x32_pack(lo, hi)
    for j, (a, b) in enumerate(zip(lo, hi)):
        scalar = op_semantics.scalar_uint4x32_pack(a, b)
        ua, ub = int(a) % 2**64, int(b) % 2**64
        assert scalar.tolist() == [ua % 2**32, ua >> 32, ub % 2**32, ub >> 32]
        assert [int(lane[j]) for lane in lanes] == scalar.tolist()
        for k in range(4):
            word = op_semantics.scalar_uint4x32_word(scalar, k)
            assert type(word) is np.uint32 and word == scalar[k]
            assert op_semantics.array_uint4x32_word(lanes, k)[j] == word


def test_word_operators_are_never_folded():
    for op in (Binop.UINT4X32_PACK, Binop.UINT4X32_WORD):
        assert op not in op_semantics.FOLDED_BINARY
        assert op_semantics.fold_binary(op, np.int64(1), np.int64(2), dtypes.int64) is None


def test_ir_types_of_the_word_operators():
    lo = Load(TNode("lo", (), dtypes.int64), ())
    packed = Binary(Binop.UINT4X32_PACK, lo, lo)
    assert packed.dtype is dtypes.uint4x32
    assert Binary(Binop.UINT4X32_WORD, packed, Const(3, dtypes.uint32)).dtype is dtypes.uint32
    with pytest.raises(DTypeError, match="uint4x32_pack takes int64 and int64 operands, got uint32"):
        Binary(Binop.UINT4X32_PACK, Load(TNode("w", (), dtypes.uint32), ()), lo)
    with pytest.raises(DTypeError, match="a constant from 0 to 3"):
        Binary(Binop.UINT4X32_WORD, packed, Const(4, dtypes.uint32))
    with pytest.raises(DTypeError, match="a constant from 0 to 3"):
        Binary(Binop.UINT4X32_WORD, packed, Load(TNode("j", (), dtypes.uint32), ()))


def test_forward_code_writes_each_word_by_its_own_assignment():
    result = oc.threefry4x32(words(np.zeros((2, 4))), words(np.zeros((2, 4))), label="bits")
    result.dims  # noqa: B018 - finalizes inference
    lines = format_cd("forward", result.forward_code()).splitlines()[1:]
    assert len(lines) == 4
    for j, line in enumerate(lines):
        assert line.startswith("  bits =: uint4x32_word((uint4x32_pack(") and f"^^^^ uint4x32_pack(" in line
        assert line.endswith(f'), {j}) ~logic:"threefry4x32";')
        assert line.count("uint4x32_pack(") == 2
