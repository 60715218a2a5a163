"""Golden files of the forward code of canonical programs: the assignments
IR (``.cd``) and the unoptimized loop IR (``.ll``) of each program's forward
computation are pinned under ``golden/forward/``; ``pytest --update-golden`` rewrites them and a
reviewer reads the diff. Session state (ids, labels) is reset per test, so the text is stable.

The moons program is the 2-16-16-1 relu MLP of the slides with a hinge loss, built here with
explicit initial values (its printed code does not depend on them); its ``.cd`` must read like
the slides' (seeds/000: ``n35 =:+ w1 * moons_input ~logic:"@";`` ... ``moons_flat @| i1``).
"""

from __future__ import annotations

import numpy as np
import pytest
from golden import check_golden

import ocannl as oc
from ocannl.lowlevel.assignments import format_cd
from ocannl.lowlevel.ir import format_routine
from ocannl.lowlevel.lower import lower_routine


def matmul() -> oc.Tensor:
    w = oc.param("w", output=3, input=4, init=np.zeros((3, 4), np.float32))
    x = oc.tensor(np.zeros((2, 4), np.float32), batch=1, label="x")
    return w @ x


def broadcast_add() -> oc.Tensor:
    x = oc.tensor(np.zeros((2, 3), np.float32), batch=1, label="x")
    b = oc.tensor(np.zeros((1, 3), np.float32), batch=1, label="b")  # a size-1 batch axis
    c = oc.tensor(np.zeros((1,), np.float32), label="c")  # a size-1 output axis
    return x + b + c


def einsum_reduction() -> oc.Tensor:
    x = oc.tensor(np.zeros((2, 4, 3), np.float32), batch=1, input=1, label="x")
    return oc.einsum("b|i->o => b|i", x, label="reduced")


def conv2d() -> oc.Tensor:
    x = oc.tensor(np.zeros((2, 6, 6, 1), np.float32), batch=1, label="images")
    kernel = oc.param("kernel", output=4, input=(3, 3, 1), init=np.zeros((4, 3, 3, 1), np.float32))
    return oc.einsum("... | 2*oh=+kh, 2*ow=+kw, ..ic..; kh, kw, ..ic.. -> ..oc.. => ... | oh, ow, ..oc..",
                     x, kernel, label="conv")


def max_pool() -> oc.Tensor:
    x = oc.tensor(np.zeros((4, 4, 1), np.float32), label="x")
    window = oc.tensor(np.zeros((2, 2), np.float32), label="window")
    return oc.tropical("... | 2*oh<+wh, 2*ow<+ww, ..c..; wh, ww => ... | oh, ow, ..c..", x, window, label="pool")


def moons_forward() -> oc.Tensor:
    """The moons program's forward pass: batch 10 of 80 batches sliced by ``batch_n``, 2-16-16-1
    relu MLP, hinge loss averaged over the batch."""
    moons_flat = oc.tensor(np.zeros((80, 10, 2), np.float32), batch=2, label="moons_flat")
    moons_classes = oc.tensor(np.ones((80, 10, 1), np.float32), batch=2, label="moons_classes")
    batch_n = oc.IndexSymbol("batch_n", 80)
    moons_input, moons_class = moons_flat[batch_n], moons_classes[batch_n]
    w1 = oc.param("w1", output=16, init=np.zeros((16, 2), np.float32))
    b1 = oc.param("b1", output=16, init=0.0)
    w2 = oc.param("w2", output=16, init=np.zeros((16, 16), np.float32))
    b2 = oc.param("b2", output=16, init=0.0)
    w3 = oc.param("w3", init=np.zeros((1, 16), np.float32))
    h1 = oc.relu(w1 @ moons_input + b1)
    h2 = oc.relu(w2 @ h1 + b2)
    mlp = w3 @ h2
    margin = oc.relu(1 - moons_class * mlp)
    return margin.mean(label="scalar_loss")


PROGRAMS = {
    "matmul": matmul,
    "broadcast_add": broadcast_add,
    "einsum_reduction": einsum_reduction,
    "conv2d": conv2d,
    "max_pool": max_pool,
    "moons_forward": moons_forward,
}


def printed(t: oc.Tensor) -> tuple[str, str]:
    comp = t.to_computation()
    return format_cd(comp.name, comp.body), format_routine(lower_routine(comp.name, comp.body))


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_golden_forward(name, update_golden):
    cd, ll = printed(PROGRAMS[name]())
    check_golden(f"forward/{name}.cd", cd, update_golden)
    check_golden(f"forward/{name}.ll", ll, update_golden)


def test_moons_cd_reads_like_the_slides():
    cd, ll = printed(moons_forward())
    first = cd.splitlines()[0]
    assert first.startswith("scalar_loss_fwd (batch_n : [0..79]):")  # slides: `(i1 : [0..79], i2):`
    assert "moons_flat @| batch_n;" in cd and "moons_classes @| batch_n;" in cd
    for w in ("w1", "w2", "w3"):  # slides: `n35 =:+ w1 * moons_input ~logic:"@";`
        assert any(line.strip().split(" =:+ ")[-1].startswith(f"{w} * ") and line.endswith('~logic:"@";')
                   for line in cd.splitlines()), w
    assert cd.count("=:+") >= 3 and cd.count('~logic:"@"') == 3
    assert cd.count(" =: relu ") == 3  # slides: `n39_relu =: relu n37;`
    assert "+ b1;" in cd and "+ b2;" in cd  # `n37 =: b1 + n35;` (operands in our order)
    # the loops: batch 10, hidden 16, inputs 2, as the slides' unoptimized .ll
    assert "for i0 = 0 to 9 {" in ll and "to 15" in ll and "to 1 " in ll
    assert "moons_flat[batch_n, " in ll


def test_golden_programs_compute():
    """The pinned programs also run: the moons loss of zero weights is the hinge at 0, i.e. 1."""
    loss = moons_forward()
    ctx = oc.Context("interp")
    ctx.compile(loss).run(batch_n=5)
    np.testing.assert_allclose(ctx.get(loss.value), 1.0, rtol=1e-6)
