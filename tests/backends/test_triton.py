"""The Triton backend (ocannl/backends/triton), run by Triton's CPU interpreter.

Everything here runs with ``TRITON_INTERPRET=1`` on CPU torch tensors (spec/peers.md §3.1:
programs run one after another, so shapes stay small), and every generated kernel the tests
interpret is also compiled for an H100 (sm_90) by Triton's compiler, which needs no GPU
(``gpu_check.py``): the interpreter accepts code the compiler would reject. The default run
takes a representative subset; ``pytest -m slow`` runs the whole conformance catalog and the
larger programs. On a machine with a GPU, ``python -m ocannl.testing --backend triton`` runs the
kit there.
"""

from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("the Triton backend needs triton and torch: pip install 'ocannl[triton]'", allow_module_level=True)
if os.environ["TRITON_INTERPRET"] != "1":
    pytest.skip("these tests run Triton's interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

from golden import check_golden  # noqa: E402

import ocannl as oc  # noqa: E402
from ocannl import nn, session, testing, train  # noqa: E402
from ocannl.backends import base  # noqa: E402
from ocannl.backends.base import Context  # noqa: E402
from ocannl.backends.triton import generate  # noqa: E402
from ocannl.backends.triton.gpu_check import compile_for_gpu  # noqa: E402
from ocannl.errors import BackendUnavailable, OutOfBoundsError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


# ---------------------------------------------------------------------------------------------
# Helpers


def data(*shape: int, seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def routines_of(build) -> list:
    """The loop IR of every routine compiling ``build()`` makes (init routines included)."""
    session.reset()
    ctx = Context("interp")
    irs = []
    compile_ir = ctx.backend.compile
    ctx.backend.compile = lambda ir: (irs.append(ir), compile_ir(ir))[1]
    ctx.compile(*build())
    return irs


def module_of(build):
    """The generated module of the (last) routine ``build()`` compiles to."""
    return generate(routines_of(build)[-1])


def kernels_of(text: str) -> list[str]:
    return re.findall(r"^def (\w+)\(", text, flags=re.M)[:-1]  # the last one is launch()


def check_on_gpu_compiler(builds) -> None:
    """Every kernel of every routine of ``builds`` compiles for sm_90."""
    sources = [generate(ir) for b in builds for ir in routines_of(b)]
    assert compile_for_gpu(sources)


def forward_and_backward(make):
    return testing._forward_and_backward(make)


# ---------------------------------------------------------------------------------------------
# Larger programs than the catalog's: several tiles, ragged edges, tl.dot, looped stages.


def _p(name: str, shape, seed: int, n_input: int = 0, dtype=None, low=-1.0, high=1.0):
    out, inp = shape[:len(shape) - n_input], shape[len(shape) - n_input:]
    value = data(*shape, seed=seed, low=low, high=high)
    return oc.param(name, output=out, input=inp, init=value, dtype=dtype)


def _dense_relu():
    w, b = _p("w", (37, 45), 1, n_input=1), _p("b", (37,), 2)
    return oc.relu(w @ oc.tensor(data(50, 45, seed=3), batch=1, label="x") + b)


def _batched_scores():
    q = oc.tensor(data(2, 20, 3, 24, seed=1), batch=2, label="q")
    k = _p("k", (3, 24), 2) * oc.tensor(data(2, 18, 1, 1, seed=3), batch=2, label="s")
    return oc.einsum("b s | h d; b t | h d => b s | t -> h", q, k)


def _conv_padded():
    x = oc.tensor(data(2, 9, 9, 3, seed=1), batch=1, label="images")
    k = _p("kernel", (16, 3, 3, 3), 2, n_input=3)
    return oc.relu(oc.einsum("... | oh=+kh, ow=+kw, ic; kh, kw, ic -> oc => ... | oh, ow, oc", x, k))


def _softmax(n: int):
    def make():
        return nn.softmax(_p("x", (3, n), 1) * 2.0)
    return make


def _layer_norm():
    return nn.layer_norm()(_p("x", (6, 40), 1) * oc.tensor(data(6, 1, seed=2), label="scale"))


def _max_pool():
    return nn.max_pool2d(_p("x", (12, 10, 3), 1))


def _take_repeated():
    table = _p("table", (30, 20), 1)
    ids = oc.tensor(np.random.default_rng(2).integers(0, 30, (40, 3)).astype(np.int32), batch=1, label="ids")
    return oc.take(table, ids)


def _long_sum():
    return (_p("x", (3000,), 1) * _p("y", (3000,), 2)).sum()


def _matmul_16bit(dtype: str):
    def make():
        a = _p("a", (33, 40), 1, n_input=1, dtype=dtype)
        b = _p("b", (40, 24), 2, n_input=1, dtype=dtype)
        return a @ b
    return make


def _matmul_float64():
    return _p("a", (20, 30), 1, n_input=1, dtype="float64") @ _p("b", (30, 18), 2, n_input=1, dtype="float64")


def _mlp_step():
    x = oc.tensor(data(8, 40, 20, seed=1), batch=2, label="xs")
    batch_n = oc.IndexSymbol("batch_n", 8)
    m = nn.mlp(hid_dims=(32, 24), label="mlp")
    loss = (m(x[batch_n]) * oc.tensor(data(40, 1, seed=2), batch=1)).relu().mean()
    update = train.grad_update(loss)
    return [update, train.adam_update(update, lr=0.01)]


LARGER = [
    pytest.param(testing.Program("dense 37x45 @ 50 + bias, relu", forward_and_backward(_dense_relu)), id="dense-relu"),
    pytest.param(testing.Program("batched attention scores", forward_and_backward(_batched_scores)), id="scores"),
    pytest.param(testing.Program("padded conv as implicit GEMM", forward_and_backward(_conv_padded)), id="conv"),
    pytest.param(testing.Program("softmax rows of 300", forward_and_backward(_softmax(300))), id="softmax-300"),
    pytest.param(testing.Program("softmax rows of 2000 (looped)", forward_and_backward(_softmax(2000))),
                 id="softmax-2000", marks=pytest.mark.slow),
    pytest.param(testing.Program("layer norm", forward_and_backward(_layer_norm)), id="layer-norm",
                 marks=pytest.mark.slow),
    pytest.param(testing.Program("max pool", forward_and_backward(_max_pool)), id="max-pool", marks=pytest.mark.slow),
    pytest.param(testing.Program("take, repeated rows", forward_and_backward(_take_repeated)), id="take"),
    pytest.param(testing.Program("sum of 3000 products", forward_and_backward(_long_sum)), id="long-sum",
                 marks=pytest.mark.slow),
    pytest.param(testing.Program("float16 matmul", forward_and_backward(_matmul_16bit("float16"))), id="fp16",
                 marks=pytest.mark.slow),
    pytest.param(testing.Program("bfloat16 matmul", forward_and_backward(_matmul_16bit("bfloat16"))), id="bf16",
                 marks=pytest.mark.slow),
    pytest.param(testing.Program("float64 matmul", forward_and_backward(_matmul_float64)), id="fp64",
                 marks=pytest.mark.slow),
    pytest.param(testing.Program("mlp step with adam, sliced batches", _mlp_step,
                                 runs=({"batch_n": 0}, {"batch_n": 5}, {"batch_n": 7})), id="mlp-adam"),
]


@pytest.mark.parametrize("program", LARGER)
def test_larger_programs_match_the_interpreter(program):
    report = testing.conformance("triton", programs=[program], random_programs=0)
    assert report.ok, report.summary()
    check_on_gpu_compiler([program.build])
