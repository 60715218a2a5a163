"""The examples people train (examples/digits.py, examples/char_lm.py) at small sizes; the full runs,
whose figures the README quotes, are marked slow."""

import numpy as np
import pytest

from backend_params import backend_param, runs_here
import ocannl as oc
from ocannl.errors import OcannlError
from examples import char_lm


needs_c = pytest.mark.skipif(not runs_here("c"), reason="no working C compiler")
OTHER_BACKENDS = [backend_param("c"), backend_param("metal"), backend_param("triton", slow=True)]
"""The backends compared with the interpreter on tiny runs of the examples; the Triton interpreter
takes 20 s to over a minute on them."""


def _digits():
    pytest.importorskip("sklearn", reason="the digits come with scikit-learn: pip install 'ocannl[examples]'")
    from examples import digits

    return digits


def test_digits_split_is_fixed_and_disjoint():
    digits = _digits()
    x_train, y_train, x_test, y_test = digits.load_digits(seed=0)
    assert x_train.shape == (1438, 8, 8, 1) and x_test.shape == (359, 8, 8, 1)
    assert x_train.dtype == np.float32 and 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert set(np.unique(y_test)) == set(range(10))
    again = digits.load_digits(seed=0)
    assert np.array_equal(again[1], y_train) and np.array_equal(again[2], x_test)
    train_rows = {row.tobytes() for row in x_train}
    assert sum(row.tobytes() in train_rows for row in x_test) < len(x_test) // 10  # a few duplicate images exist


@needs_c
def test_digits_cnn_learns_on_a_small_subset_on_c():
    """384 training images, 8 epochs: a few seconds, well above chance (10%) on the 359 held out."""
    digits = _digits()
    result = digits.train_digits(oc.Context("c"), epochs=8, n_train=384)
    losses = result["epoch_losses"]
    assert result["n_train"] == 384 and len(losses) == 8
    assert losses[-1] < 0.5 * losses[0]
    assert result["test_accuracy"] >= 0.85


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_digits_first_epoch_matches_the_interpreter(backend):
    """The example's training step runs alike on every backend: one epoch of two batches gives the
    interpreter's losses and test accuracy."""
    digits = _digits()
    results = []
    for name in ("interp", backend):
        oc.session.reset()
        results.append(digits.train_digits(oc.Context(name), epochs=1, n_train=64))
    np.testing.assert_allclose(results[1]["epoch_losses"], results[0]["epoch_losses"], rtol=1e-5)
    assert results[1]["test_accuracy"] == results[0]["test_accuracy"]


def test_digits_too_few_images_for_a_batch_is_an_error():
    digits = _digits()
    with pytest.raises(OcannlError, match="no batch of 32"):
        digits.train_digits(oc.Context("interp"), epochs=1, n_train=10)


@pytest.mark.slow
@needs_c
def test_digits_full_run_reaches_97_percent():
    """The README's figure: 30 epochs over the 1408 training images, about 6 s of training on c."""
    digits = _digits()
    result = digits.train_digits(oc.Context("c"))
    assert result["test_accuracy"] >= 0.97


def test_char_lm_vocabulary_round_trips_and_names_unknown_characters():
    vocab = char_lm.Vocabulary(char_lm.load_text())
    text = "It was the best of times"
    assert vocab.decode(vocab.encode(text)) == text
    with pytest.raises(OcannlError, match="'#'"):
        vocab.encode("a#b")


def test_char_lm_windows_are_shifted_slices_of_the_text():
    ids = np.arange(200, dtype=np.int32)
    batches = char_lm.windows(ids, seq=8, batch=4, seed=0, stride=4)
    assert batches.shape == (12, 4, 9)  # starts 0, 4, ..., 188: 48 windows
    assert char_lm.windows(ids, seq=8, batch=4, seed=0).shape == (48, 4, 9)  # every start: 192 windows
    for window in batches.reshape(-1, 9):
        assert np.array_equal(window, np.arange(window[0], window[0] + 9))
    with pytest.raises(OcannlError, match="not a batch of 64"):
        char_lm.windows(ids, seq=8, batch=64, seed=0, stride=4)


@needs_c
def test_char_lm_loss_decreases_and_sampling_is_deterministic_on_c():
    result = char_lm.train_char_lm(oc.Context("c"), epochs=8, stride=16)
    losses, vocab, sampler = result["epoch_losses"], result["vocab"], result["sampler"]
    assert losses[0] < np.log(len(vocab)) + 0.5  # starts near a uniform guess
    assert losses[-1] < losses[0] - 0.8
    assert all(b < a for a, b in zip(losses[:4], losses[1:5]))
    text = sampler.sample("It was ", 40, seed=3)
    assert text.startswith("It was ") and len(text) == 47
    assert set(text) <= set(vocab.chars)
    assert sampler.sample("It was ", 40, seed=3) == text
    assert sampler.sample("It was ", 40, seed=4) != text


@needs_c
def test_char_lm_logits_at_a_position_ignore_the_cells_after_it():
    """Sampling fills a window from the left and reads the last filled position: with causal
    blocks, what the unfilled cells hold does not change it."""
    result = char_lm.train_char_lm(oc.Context("c"), epochs=1, seq=8, batch=8, stride=64)
    sampler, vocab = result["sampler"], result["vocab"]
    prompt = vocab.encode("It w")
    filled = sampler.next_logits(prompt)  # cells 4..7 hold id 0
    window = np.concatenate([prompt, vocab.encode("asth")])[None, :]
    sampler.window.set(window)
    sampler.routine.run()
    rows = sampler.ctx.get(sampler.logits.value).reshape(8, -1)
    np.testing.assert_array_equal(rows[3], filled)
    assert not np.array_equal(rows[7], filled)
    assert len(sampler.sample("It was the best of times", 10, seed=0)) == 34  # past one window


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_char_lm_tiny_run_matches_the_interpreter(backend):
    """A tiny model (width 16, windows of 8), one epoch: the interpreter's losses and, from them, the
    same sampled characters."""
    results = []
    for name in ("interp", backend):
        oc.session.reset()
        result = char_lm.train_char_lm(oc.Context(name), epochs=1, seq=8, batch=8, stride=64, d_model=16, d_ff=32)
        results.append((result["epoch_losses"], result["sampler"].sample("It was", 12, seed=0)))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5)
    assert results[1][1] == results[0][1]


@pytest.mark.slow
@needs_c
def test_char_lm_full_run_learns_the_text():
    """The README's run: 20 epochs over every window of the text, under a minute on c."""
    result = char_lm.train_char_lm(oc.Context("c"))
    assert result["epoch_losses"][-1] < 0.6
