"""Datasets made on the fly (moons, circles) and batching."""

import numpy as np
import pytest

from ocannl import data


def test_moons_shapes_dtypes_and_interleaved_labels():
    points, labels = data.moons()
    assert points.shape == (800, 2) and points.dtype == np.float32
    assert labels.shape == (800, 1) and labels.dtype == np.float32
    assert (labels[0::2] == 1).all() and (labels[1::2] == -1).all()


def test_moons_without_noise_follow_the_formula():
    """v = i*pi/(n/2); A = (cos v, sin v), B = (1 - cos v, 0.5 - sin v)."""
    points, _ = data.moons(n=12, noise=0.0)
    v = np.arange(6) * np.pi / 6
    np.testing.assert_allclose(points[0::2], np.stack([np.cos(v), np.sin(v)], 1), atol=1e-7)
    np.testing.assert_allclose(
        points[1::2], np.stack([1 - np.cos(v), 0.5 - np.sin(v)], 1), atol=1e-7
    )


def test_moons_noise_is_uniform_in_the_given_half_width():
    clean, _ = data.moons(n=2000, noise=0.0)
    noisy, _ = data.moons(n=2000, noise=0.1, seed=3)
    delta = noisy.astype(np.float64) - clean
    assert np.abs(delta).max() <= 0.1 + 1e-6
    assert np.abs(delta).max() > 0.09  # the whole range is used
    assert abs(delta.mean()) < 0.01


def test_same_seed_same_bits_other_seed_other_points():
    a, la = data.moons(n=100, seed=5)
    b, lb = data.moons(n=100, seed=5)
    assert a.tobytes() == b.tobytes() and la.tobytes() == lb.tobytes()
    assert not np.array_equal(a, data.moons(n=100, seed=6)[0])
    c1, _ = data.circles(n=100, seed=5)
    c2, _ = data.circles(n=100, seed=5)
    assert c1.tobytes() == c2.tobytes()


def test_circles_radii_and_labels():
    points, labels = data.circles(n=40, noise=0.0, factor=0.3)
    radii = np.hypot(points[:, 0], points[:, 1])
    np.testing.assert_allclose(radii[0::2], 0.3, rtol=1e-6)
    np.testing.assert_allclose(radii[1::2], 1.0, rtol=1e-6)
    assert (labels[0::2] == 1).all() and (labels[1::2] == -1).all()
    assert points.dtype == np.float32 and labels.shape == (40, 1)


@pytest.mark.parametrize("n", [7, 0, -2])
def test_n_must_be_positive_and_even(n):
    with pytest.raises(ValueError, match="even"):
        data.moons(n=n)


def test_bad_noise_and_factor():
    with pytest.raises(ValueError, match="noise"):
        data.moons(noise=-0.1)
    with pytest.raises(ValueError, match="factor"):
        data.circles(factor=1.5)


def test_batches_reshape_in_order():
    points, labels = data.moons()
    xs = data.batches(points, 10)
    ys = data.batches(labels, 10)
    assert xs.shape == (80, 10, 2) and ys.shape == (80, 10, 1)
    np.testing.assert_array_equal(xs[3], points[30:40])
    # Interleaving makes every even-sized batch balanced.
    assert (ys.sum(axis=(1, 2)) == 0).all()


def test_batches_error_says_how_to_fix():
    with pytest.raises(ValueError) as err:
        data.batches(np.zeros((800, 2)), 7)
    message = str(err.value)
    assert "800 rows do not split into batches of 7" in message
    assert "e.g. 8" in message
    assert "batches(array[:798], 7)" in message
    with pytest.raises(ValueError, match=r"divides 6 \(e.g. 6\)$"):
        data.batches(np.zeros((6, 2)), 10)  # fewer rows than one batch: no trimming to suggest
    with pytest.raises(ValueError, match="positive int"):
        data.batches(np.zeros((10, 2)), 0)
