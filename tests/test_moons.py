"""The moons demo (docs/training.md): the original test's criterion, with our default seed."""

import pytest

import ocannl as oc
from ocannl.backends import registry
from examples import moons


def _c_available() -> bool:
    try:
        registry.get_backend("c")
    except oc.errors.BackendUnavailable:
        return False
    return True


def test_a_few_epochs_on_the_interpreter_lower_the_loss():
    result = moons.train_moons(oc.Context("interp"), epochs=2, n_points=200)
    first, last = result["epoch_losses"]
    assert last < first


@pytest.mark.skipif(not _c_available(), reason="no working C compiler")
def test_full_training_on_c_converges():
    result = moons.train_moons(oc.Context("c"))
    assert len(result["epoch_losses"]) == 80
    assert result["epoch_losses"][-1] < 0.1


@pytest.mark.slow
def test_full_training_on_the_interpreter_converges():
    """About 3 minutes on the interpreter."""
    result = moons.train_moons(oc.Context("interp"))
    assert result["epoch_losses"][-1] < 0.1


@pytest.mark.skipif(not _c_available(), reason="no working C compiler")
def test_same_seed_same_bits_on_interp_and_c():
    values = []
    for backend in ("interp", "c"):
        oc.session.reset()
        model, *_ = moons.build()
        w = model.layers[0][0]
        ctx = oc.Context(backend)
        ctx.compile(w * 1.0).run()
        values.append(ctx.get(w.value))
    assert (values[0] == values[1]).all() and values[0].tobytes() == values[1].tobytes()


@pytest.mark.parametrize("backend", ["interp", "c"])
def test_an_epoch_per_run_many_gives_the_losses_of_a_run_per_step(backend):
    """The demo trains an epoch per ``run_many`` call: the per-step losses are those of one
    ``run()`` and one ``ctx.get`` per step, bit for bit."""
    if backend == "c" and not _c_available():
        pytest.skip("no working C compiler")
    result = moons.train_moons(oc.Context(backend), epochs=2, n_points=200)
    oc.session.reset()
    oc.seed(0)
    ctx = oc.Context(backend)
    _, loss, update, sgd, _, n_batches = moons.build(n_points=200, epochs=2)
    routine = ctx.compile(update, sgd)
    losses = []
    for step in range(2 * n_batches):
        routine.run(batch_n=step % n_batches, step_n=step)
        losses.append(float(ctx.get(loss)))
    assert result["step_losses"] == losses and len(set(losses)) > 1
