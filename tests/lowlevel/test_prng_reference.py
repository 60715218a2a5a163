"""The numpy Threefry-4x32 oracle against Random123's known answers, and its uniform conversions."""

import numpy as np
import pytest

from ocannl.lowlevel.prng_reference import (
    threefry4x32, uniform1_float32, uniform1_float64, uniform_float32, uniform_float64,
)

# Random123's known-answer vectors for threefry4x32, from the kat_vectors file of the
# Random123 distribution (github.com/DEShawResearch/random123). Each line there reads
# "threefry4x32 ROUNDS CTR0..3 KEY0..3 EXPECTED0..3" in hex; the third counter/key pair is the
# hex expansion of pi.
ZEROS = (0, 0, 0, 0)
ONES = (0xFFFFFFFF,) * 4
PI_COUNTER = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
PI_KEY = (0xA4093822, 0x299F31D0, 0x082EFA98, 0xEC4E6C89)

KNOWN_ANSWERS = [
    # rounds, counter, key, expected
    (13, ZEROS, ZEROS, (0x531C7E4F, 0x39491EE5, 0x2C855A92, 0x3D6ABF9A)),
    (13, ONES, ONES, (0xC4189358, 0x1C9CC83A, 0xD5881C67, 0x6A0A89E0)),
    (13, PI_COUNTER, PI_KEY, (0x4AA71D8F, 0x734738C2, 0x431FC6A8, 0xAE6DEBF1)),
    (20, ZEROS, ZEROS, (0x9C6CA96A, 0xE17EAE66, 0xFC10ECD4, 0x5256A7D8)),
    (20, ONES, ONES, (0x2A881696, 0x57012287, 0xF6C7446E, 0xA16A6732)),
    (20, PI_COUNTER, PI_KEY, (0x59CD1DBB, 0xB8879579, 0x86B5D00C, 0xAC8B6D84)),
    (72, ZEROS, ZEROS, (0x93171DA6, 0x9220326D, 0xB392B7B1, 0xFF58A002)),
    (72, ONES, ONES, (0x60743F3D, 0x9961E684, 0xAAB21C34, 0x8C65FB7D)),
    (72, PI_COUNTER, PI_KEY, (0x09930ADF, 0x7F27BD55, 0x9ED68CE1, 0x97F803F6)),
]


@pytest.mark.parametrize("rounds, counter, key, expected", KNOWN_ANSWERS)
def test_known_answer_vectors(rounds, counter, key, expected):
    key = np.array(key, dtype=np.uint32)
    counter = np.array(counter, dtype=np.uint32)
    out = threefry4x32(key, counter, rounds=rounds)
    assert out.dtype == np.uint32
    assert out.shape == (4,)
    assert out.tolist() == list(expected)


def test_default_is_20_rounds():
    assert threefry4x32(PI_KEY, PI_COUNTER).tolist() == list(KNOWN_ANSWERS[5][3])


def test_known_answers_in_one_batch():
    """All nine vectors at once, grouped by round count, give the same words as one at a time."""
    for rounds in (13, 20, 72):
        rows = [row for row in KNOWN_ANSWERS if row[0] == rounds]
        keys = np.array([row[2] for row in rows], dtype=np.uint32)
        counters = np.array([row[1] for row in rows], dtype=np.uint32)
        expected = np.array([row[3] for row in rows], dtype=np.uint32)
        np.testing.assert_array_equal(threefry4x32(keys, counters, rounds=rounds), expected)


def test_vectorized_equals_per_element():
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 2**32, size=(3, 5, 4), dtype=np.uint32)
    counters = rng.integers(0, 2**32, size=(3, 5, 4), dtype=np.uint32)
    batched = threefry4x32(keys, counters)
    assert batched.shape == (3, 5, 4)
    for i in range(3):
        for j in range(5):
            np.testing.assert_array_equal(batched[i, j], threefry4x32(keys[i, j], counters[i, j]))


def test_key_broadcasts_over_counters():
    key = np.array([42, 0, 0, 0], dtype=np.uint32)
    counters = np.zeros((6, 4), dtype=np.uint32)
    counters[:, 0] = np.arange(6)
    out = threefry4x32(key, counters)
    assert out.shape == (6, 4)
    for i in range(6):
        np.testing.assert_array_equal(out[i], threefry4x32(key, counters[i]))
    # Distinct counters give distinct blocks.
    assert len({tuple(row) for row in out.tolist()}) == 6


def test_bad_inputs_are_explained():
    with pytest.raises(ValueError, match="4 words on its last axis"):
        threefry4x32(np.zeros(3, dtype=np.uint32), np.zeros(4, dtype=np.uint32))
    with pytest.raises(ValueError, match="outside"):
        threefry4x32([-1, 0, 0, 0], ZEROS)
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        threefry4x32(np.zeros(4, dtype=np.float32), ZEROS)


def test_float32_rule_is_top_24_bits():
    words = np.array([0, 0xFF, 0x100, 0xFFFFFFFF], dtype=np.uint32)
    u = uniform_float32(words)
    assert u.dtype == np.float32
    assert u.tolist() == [0.0, 0.0, 2.0**-24, 1.0 - 2.0**-24]
    # Bit for bit: the value times 2**24 is exactly the word's top 24 bits.
    words = threefry4x32(ZEROS, np.arange(40, dtype=np.uint32).reshape(10, 4))
    np.testing.assert_array_equal((uniform_float32(words).astype(np.float64) * 2**24), words >> 8)


def test_float64_rule_is_top_53_bits_of_odd_high_even_low():
    words = np.array([0xFFFFFFFF, 0xFFFFFFFF, 0x00000000, 0x00000800], dtype=np.uint32)
    u = uniform_float64(words)
    assert u.dtype == np.float64
    assert u.shape == (2,)
    assert u[0] == 1.0 - 2.0**-53
    # (0x800 << 32) >> 11 = 2**32, so the value is 2**32 * 2**-53 = 2**-21.
    assert u[1] == 2.0**-21
    # Only the low word's top 21 bits count: the 11 bits shifted out make no difference.
    assert uniform_float64(np.array([0x7FF, 0, 0x800, 0], dtype=np.uint32)).tolist() == [
        0.0,
        2.0**-53,
    ]


def test_scalar_forms_use_the_first_words():
    words = threefry4x32(ZEROS, np.arange(24, dtype=np.uint32).reshape(2, 3, 4))
    np.testing.assert_array_equal(uniform1_float32(words), uniform_float32(words)[..., 0])
    np.testing.assert_array_equal(uniform1_float64(words), uniform_float64(words)[..., 0])
    assert uniform1_float32(words).shape == (2, 3)


def test_uniform_range_and_moments():
    """100k float32 and float64 samples: in [0, 1), mean ~1/2, variance ~1/12, no lane bias."""
    counters = np.zeros((50_000, 4), dtype=np.uint32)
    counters[:, 0] = np.arange(50_000)
    words = threefry4x32((7, 0, 0, 0), counters)
    for u in (uniform_float32(words[:25_000]), uniform_float64(words)):
        assert u.size == 100_000
        assert u.min() >= 0.0 and u.max() < 1.0
        # Standard error of the mean is sqrt(1/12/1e5) ~ 9e-4; of the variance ~ 2.4e-4.
        assert abs(u.mean() - 0.5) < 5e-3
        assert abs(u.var() - 1 / 12) < 2e-3
        # Each lane on its own is uniform too (a lane-mixing bug would bias one of them).
        for lane in range(u.shape[-1]):
            assert abs(u[:, lane].mean() - 0.5) < 1e-2
        # Counts in 10 equal bins are flat within a loose bound (expected 10k each).
        counts = np.histogram(u, bins=10, range=(0.0, 1.0))[0]
        assert counts.min() > 9_400 and counts.max() < 10_600
