"""Interpreter throughput: training steps on the interpreter against PyTorch eager on the CPU, all
measured in this run.

    python bench/interp_throughput.py [--rounds 3] [--scalar]

Three training steps, each compiled once and run many times:

* **moons**: the demo's 2-16-16-1 relu MLP, hinge loss, SGD (``examples/moons.py``), batch 10;
* **cnn**: a padded 3x3 convolution to 8 channels, relu, 2x2 max pool, a linear layer to 10
  classes, cross-entropy, SGD; a batch of 16 images of 8x8x1;
* **transformer**: token embedding (``oc.take``) plus sinusoidal positions, one pre-norm block
  (layer norm, 2-head causal self-attention, layer norm, relu MLP of width 64, residuals), a final
  layer norm and a linear map to a vocabulary of 16, cross-entropy, Adam; d 32, sequence 16,
  batch 8.

PyTorch runs the same models, eager, with its default threads. Each model is timed in
``--rounds`` alternating rounds (interpreter, then PyTorch) and the medians are printed with the
ratio ``pytorch time / interpreter time`` (1.0: as fast as PyTorch). ``--scalar`` also times the
scalar interpreter (the literal semantics, ``interp_mode=scalar``) for a step or two.
:func:`matmul_ops_per_second` is the historical figure: scalar operations per second of a
64x64x64 float32 matmul.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/ and bench/

import ocannl as oc  # noqa: E402
from ocannl import nn, train  # noqa: E402
from ocannl.backends.context import Context  # noqa: E402
from ocannl.lowlevel.assignments import Accum, Computation  # noqa: E402
from ocannl.lowlevel.indexing import Iter, Projections, Symbol  # noqa: E402
from ocannl.lowlevel.scalar_ops import Binop  # noqa: E402
from ocannl.lowlevel.tnode import TNode  # noqa: E402

N = 64
BATCHES = 4
"""Batches of data each model cycles through (bound by the ``batch_n`` index symbol)."""


def matmul_ops_per_second(n: int = N, interp_mode: str | None = None) -> float:
    """Scalar operations (a multiply and an add per innermost iteration) per second of an
    ``n``-cubed float32 matmul."""
    a, b, c = TNode("a", (n, n)), TNode("b", (n, n)), TNode("c", (n, n))
    i, j, k = Symbol(), Symbol(), Symbol()
    proj = Projections(
        product_space=(n, n, n),
        product_iterators=(i, j, k),
        lhs_dims=(n, n),
        rhs_dims=((n, n), (n, n)),
        project_lhs=(Iter(i), Iter(j)),
        project_rhs=((Iter(i), Iter(k)), (Iter(k), Iter(j))),
    )
    matmul = Accum(c, Binop.ADD, Binop.MUL, (a, b), lambda: proj, initialize_neutral=True, spec="@")
    ctx = Context("interp") if interp_mode is None else Context("interp", interp_mode=interp_mode)
    rng = np.random.default_rng(0)
    ctx.set(a, rng.standard_normal((n, n)))
    ctx.set(b, rng.standard_normal((n, n)))
    routine = ctx.compile(Computation("matmul", matmul))
    start = time.perf_counter()
    routine.run()
    elapsed = time.perf_counter() - start
    expected = ctx.get(a).astype(np.float64) @ ctx.get(b).astype(np.float64)
    assert np.allclose(ctx.get(c), expected, rtol=1e-4, atol=1e-4)
    return 2 * n**3 / elapsed


# ---------------------------------------------------------------------------------------------
# The models in ocannl: each returns (loss tensor, items to compile); data are fixed random
# batches sliced by the batch_n index symbol.


def cross_entropy(logits, onehot):
    """The batch mean of ``-sum(onehot * log_softmax(logits))`` over the last output axis."""
    shifted = logits - oc.einmax("... | c => ... | 0", logits)
    log_sum = oc.log(oc.einsum("... | c => ... | 0", oc.exp(shifted)))
    return -((onehot * (shifted - log_sum)).sum(axes="output")).mean(label="loss")


def cnn_data(batch: int = 16, classes: int = 10, batches: int = BATCHES) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.standard_normal((batches, batch, 8, 8, 1)).astype(np.float32)
    return images, rng.integers(0, classes, (batches, batch))


def build_cnn(batch: int = 16, classes: int = 10, channels: int = 8):
    images, labels = cnn_data(batch, classes)
    batch_n = oc.IndexSymbol("batch_n", len(images))
    x = oc.tensor(images, batch=2, label="images")[batch_n]
    y = oc.tensor(np.eye(classes, dtype=np.float32)[labels], batch=2, label="onehot")[batch_n]
    h = nn.max_pool2d(oc.relu(nn.conv2d(channels, kernel_size=3, label="conv")(x)))
    logits = oc.param("fc_w", output=classes) @ h + oc.param("fc_b", output=classes, init=0.0)
    loss = cross_entropy(logits, y)
    update = train.grad_update(loss)
    return loss, [update, train.sgd_update(update, lr=0.05)]


def transformer_data(batch: int = 8, seq: int = 16, vocab: int = 16, batches: int = BATCHES) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vocab, (batches, batch, seq + 1))


def build_transformer(batch: int = 8, seq: int = 16, d: int = 32, heads: int = 2, mlp: int = 64, vocab: int = 16):
    tokens = transformer_data(batch, seq, vocab)
    batch_n = oc.IndexSymbol("batch_n", len(tokens))
    ids = oc.tensor(tokens[:, :, :seq].astype(np.int32), batch=3, label="tokens")[batch_n]
    ids.shape  # noqa: B018 - oc.take needs the indices' axes known when it is built
    targets = oc.tensor(np.eye(vocab, dtype=np.float32)[tokens[:, :, 1:]], batch=3, label="targets")[batch_n]
    x = oc.take(oc.param("embedding", output=(vocab, d)), ids) + nn.sinusoidal_position_encoding(d, seq)
    causal = oc.tensor(np.tril(np.ones((seq, seq), np.float32)), batch=1, input=1, label="causal")
    attention = nn.multi_head_attention(heads, d // heads, d_model=d, label="mha")
    h = x + attention(nn.layer_norm("ln1")(x), mask=causal)
    h = h + nn.mlp(hid_dims=(mlp,), label="ffn")(nn.layer_norm("ln2")(h))
    logits = oc.param("w_out", output=vocab) @ nn.layer_norm("ln3")(h)
    loss = cross_entropy(logits, targets)
    update = train.grad_update(loss)
    return loss, [update, train.adam_update(update, lr=1e-3)]


def _moons():
    from examples import moons

    _, loss, update, sgd, _, _ = moons.build()
    return loss, [update, sgd]


MODELS: dict[str, Callable] = {"moons": _moons, "cnn": build_cnn, "transformer": build_transformer}


def interp_stepper(model: str, interp_mode: str = "vectorized") -> Callable[[int], float]:
    """A function running ``n`` training steps of ``model`` on the interpreter; returns the last
    loss."""
    oc.session.reset()
    oc.seed(0)
    ctx = Context("interp", interp_mode=interp_mode)
    loss, items = MODELS[model]()
    routine = ctx.compile(*items)
    bound = {s.name for s in routine.ir.static_symbols}
    count = [0]

    def steps(n: int) -> float:
        for _ in range(n):
            bindings = {"batch_n": count[0] % BATCHES, "step_n": count[0]}
            routine.run(**{k: v for k, v in bindings.items() if k in bound})
            count[0] += 1
        return float(ctx.get(loss.value))

    return steps


# ---------------------------------------------------------------------------------------------
# The same models in PyTorch eager


def torch_stepper(model: str) -> Callable[[int], float]:
    import torch

    torch.manual_seed(0)
    if model == "moons":
        return _torch_moons(torch)
    if model == "cnn":
        return _torch_cnn(torch)
    return _torch_transformer(torch)


def torch_loop(optimizer, batch_loss) -> Callable[[int], float]:
    """``steps(n)``: n PyTorch training steps (the loss of batch ``count``, backward, the
    optimizer's step), returning the last loss; the step count carries over between calls."""
    count = [0]

    def steps(n: int) -> float:
        loss = None
        for _ in range(n):
            loss = batch_loss(count[0])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            count[0] += 1
        return loss.item()

    return steps


def _torch_moons(torch) -> Callable[[int], float]:
    from ocannl import data

    points, labels = data.moons(800, noise=0.1, seed=0)
    xs, ys = torch.from_numpy(points).reshape(80, 10, 2), torch.from_numpy(labels).reshape(80, 10, 1)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 1, bias=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-4)

    def batch_loss(step: int):
        b = step % 80
        return torch.relu(1 - ys[b] * model(xs[b])).mean()

    return torch_loop(optimizer, batch_loss)


def _torch_cnn(torch) -> Callable[[int], float]:
    images, labels = cnn_data()
    xs = torch.from_numpy(images).permute(0, 1, 4, 2, 3).contiguous()  # NCHW
    ys = torch.from_numpy(labels)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def batch_loss(step: int):
        b = step % BATCHES
        return torch.nn.functional.cross_entropy(model(xs[b]), ys[b])

    return torch_loop(optimizer, batch_loss)


def _torch_transformer(torch, batch: int = 8, seq: int = 16, d: int = 32, heads: int = 2, mlp: int = 64,
                       vocab: int = 16) -> Callable[[int], float]:
    tokens = torch.from_numpy(transformer_data(batch, seq, vocab))
    nnt, dk = torch.nn, d // heads
    layers = nnt.ModuleDict({
        "embedding": nnt.Embedding(vocab, d), "ln1": nnt.LayerNorm(d), "ln2": nnt.LayerNorm(d),
        "ln3": nnt.LayerNorm(d), "q": nnt.Linear(d, d, bias=False), "k": nnt.Linear(d, d, bias=False),
        "v": nnt.Linear(d, d, bias=False), "o": nnt.Linear(d, d, bias=False), "ff1": nnt.Linear(d, mlp),
        "ff2": nnt.Linear(mlp, d, bias=False), "out": nnt.Linear(d, vocab, bias=False),
    })
    pos = np.arange(seq)[:, None] / 10000.0 ** (2 * (np.arange(d)[None, :] // 2) / d)
    positions = torch.from_numpy(np.where(np.arange(d) % 2 == 0, np.sin(pos), np.cos(pos)).astype(np.float32))
    mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
    optimizer = torch.optim.Adam(layers.parameters(), lr=1e-3)

    def split(t):
        return t.view(batch, seq, heads, dk).transpose(1, 2)

    def batch_loss(step: int):
        ids = tokens[step % BATCHES]
        x = layers["embedding"](ids[:, :seq]) + positions
        a = layers["ln1"](x)
        scores = split(layers["q"](a)) @ split(layers["k"](a)).transpose(-1, -2) / dk**0.5
        attn = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
        h = x + layers["o"]((attn @ split(layers["v"](a))).transpose(1, 2).reshape(batch, seq, d))
        h = h + layers["ff2"](torch.relu(layers["ff1"](layers["ln2"](h))))
        logits = layers["out"](layers["ln3"](h))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))

    return torch_loop(optimizer, batch_loss)


# ---------------------------------------------------------------------------------------------


STEPS = {"moons": 200, "cnn": 40, "transformer": 8}
"""Steps per timed round of each model (PyTorch runs ten times as many)."""

TARGETS = {"moons": "ratio >= 0.5", "cnn": "<= 30 ms", "transformer": "<= 200 ms"}


def seconds_per_step(steps: Callable[[int], float], n: int) -> float:
    steps(max(1, n // 10))  # warm up
    start = time.perf_counter()
    steps(n)
    return (time.perf_counter() - start) / n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scalar", action="store_true", help="also time the scalar interpreter")
    parser.add_argument("--models", default="moons,cnn,transformer")
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        torch = None
        print("PyTorch is not installed (pip install 'ocannl[bench]'): interpreter times only")
    rate = matmul_ops_per_second()
    print(f"interp: {rate / 1e6:.2f} M scalar ops/s ({N}x{N}x{N} float32 matmul, {2 * N**3} ops)")
    print(f"{'model':12} {'interp ms/step':>15} {'pytorch ms/step':>16} {'pytorch/interp':>15}   target")
    for model in args.models.split(","):
        ours, theirs = [], []
        interp, eager = interp_stepper(model), torch_stepper(model) if torch else None
        for _ in range(args.rounds):
            ours.append(seconds_per_step(interp, STEPS[model]))
            if eager is not None:
                theirs.append(seconds_per_step(eager, 10 * STEPS[model]))
        mine = statistics.median(ours)
        line = f"{model:12} {mine * 1e3:15.3f}"
        if theirs:
            reference = statistics.median(theirs)
            line += f" {reference * 1e3:16.3f} {reference / mine:15.2f}"
        else:
            line += f" {'-':>16} {'-':>15}"
        print(f"{line}   {TARGETS[model]}")
        if args.scalar:
            scalar = interp_stepper(model, "scalar")
            per_step = seconds_per_step(scalar, 2 if model != "transformer" else 1)
            print(f"{'':12} scalar interpreter: {per_step * 1e3:.1f} ms/step ({per_step / mine:.0f}x the vectorized)")


if __name__ == "__main__":
    main()
