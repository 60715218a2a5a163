"""How long the C backend takes to compile training routines, from an empty kernel cache.

    python -m bench.cc_time [--layers 10 25 100 200] [--repeat 3] [--steps 200] [--no-moons]
                            [--no-transformer]

Programs, each built in a fresh session and compiled with ``Context("c").compile`` into a fresh
temporary ``OCANNL_CACHE_DIR`` (so the compiler checks and the init routine are built too):

* ``mlp-N``: the half-moons data (batches of 10 points, selected by an index symbol) through an
  N-layer relu MLP of width 16, hinge loss, ``train.grad_update`` + ``train.sgd_update``;
* ``moons``: the demo's routine (``examples/moons.py``, 2-16-16-1);
* ``transformer``: one pre-norm transformer block (layer norm, 2-head attention with d_k 16,
  residual; layer norm, a 32-64-32 relu MLP, residual) over batch 8 x sequence 16 x d_model 32,
  mean-square loss, ``train.adam_update``.

Per program it prints the median over ``--repeat`` compilations of: ``cc``, the seconds spent
building kernels (the system C compiler, probes and init routine included), ``cc cpu``, the
processor time of the compiler processes (what the wall time would be on an idle machine with
one core: the figure to compare when other work shares the machine), ``total``, the whole
``compile`` call, and ``cc/layer`` for the MLPs; then the microseconds per training step (the
best of 5 rounds of ``--steps / 5`` runs, after one warm-up run), to check that faster
compilation did not cost kernel speed. The C compiler's flags are those of
``python -m ocannl doctor``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/

import ocannl as oc
import ocannl.session
from ocannl import data, nn, train

WIDTH = 16


class CcTimer:
    """Accumulates the seconds the C backend spends in ``compile_shared`` (the system compiler;
    nothing when the library is already in the cache)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def installed(self) -> Iterator[None]:
        from ocannl.backends.c import backend, compiler

        originals = backend.compile_shared, compiler.compile_shared

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return originals[1](*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        backend.compile_shared = compiler.compile_shared = timed
        try:
            yield
        finally:
            backend.compile_shared, compiler.compile_shared = originals


def mlp(n_layers: int) -> tuple[tuple, dict[str, int]]:
    points, labels = data.moons(800, noise=0.1, seed=0)
    xs = oc.tensor(data.batches(points, 10), batch=2, label="xs")
    ys = oc.tensor(data.batches(labels, 10), batch=2, label="ys")
    batch_n = oc.IndexSymbol("batch_n", 80)
    model = nn.mlp(hid_dims=(WIDTH,) * n_layers, label="mlp")
    loss = oc.relu(1 - ys[batch_n] * model(xs[batch_n])).mean(label="loss")
    update = train.grad_update(loss)
    return (update, train.sgd_update(update, lr=0.1, weight_decay=1e-4)), {"batch_n": 3}


def moons() -> tuple[tuple, dict[str, int]]:
    from examples import moons as demo

    _, _, update, sgd, _, _ = demo.build()
    return (update, sgd), {"batch_n": 3, "step_n": 5}


def transformer() -> tuple[tuple, dict[str, int]]:
    rng = np.random.default_rng(0)
    x = oc.tensor(rng.standard_normal((8, 16, 32)).astype(np.float32), batch=2, label="x")
    target = oc.tensor(rng.standard_normal((8, 16, 32)).astype(np.float32), batch=2, label="target")
    norm1, norm2 = nn.layer_norm("ln1"), nn.layer_norm("ln2")
    attention = nn.multi_head_attention(num_heads=2, d_k=16, d_model=32, label="mha")
    w1, b1 = oc.param("ff_w1", output=64), oc.param("ff_b1", output=64, init=0.0)
    w2, b2 = oc.param("ff_w2", output=32), oc.param("ff_b2", output=32, init=0.0)
    h = x + attention(norm1(x))
    y = h + (w2 @ oc.relu(w1 @ norm2(h) + b1) + b2)
    diff = y - target
    loss = (diff * diff).mean(label="loss")
    update = train.grad_update(loss)
    return (update, train.adam_update(update, lr=1e-3)), {}


@contextmanager
def empty_cache() -> Iterator[None]:
    previous = os.environ.get("OCANNL_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="ocannl-cc-time-") as cache:
        os.environ["OCANNL_CACHE_DIR"] = cache
        try:
            yield
        finally:
            if previous is None:
                del os.environ["OCANNL_CACHE_DIR"]
            else:
                os.environ["OCANNL_CACHE_DIR"] = previous


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(build: Callable[[], tuple[tuple, dict[str, int]]], steps: int) -> tuple[float, float, float, float]:
    """(cc seconds, cc processor seconds, compile seconds, microseconds per step) of one program,
    from an empty cache."""
    ocannl.session.reset()
    oc.seed(0)
    timer = CcTimer()
    with empty_cache():
        computations, bindings = build()
        ctx = oc.Context("c")
        with timer.installed():
            cpu, start = children_cpu(), time.perf_counter()
            routine = ctx.compile(*computations)
            total, cpu = time.perf_counter() - start, children_cpu() - cpu
        routine.run(**bindings)
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(max(steps // 5, 1)):
                routine.run(**bindings)
            rounds.append((time.perf_counter() - start) / max(steps // 5, 1))
    return timer.seconds, cpu, total, min(rounds) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[10, 25, 100, 200], metavar="N")
    parser.add_argument("--repeat", type=int, default=3, help="compilations per program (the median is shown)")
    parser.add_argument("--steps", type=int, default=200, help="timed training steps per compilation")
    parser.add_argument("--no-moons", action="store_true")
    parser.add_argument("--no-transformer", action="store_true")
    args = parser.parse_args()
    print(f"C backend: {oc.Context('c').backend.available()[1]}")
    programs: list[tuple[str, Callable, int]] = [(f"mlp-{n}", lambda n=n: mlp(n), n) for n in args.layers]
    if not args.no_moons:
        programs.append(("moons", moons, 0))
    if not args.no_transformer:
        programs.append(("transformer", transformer, 0))
    print(f"{'program':>12} {'cc s':>7} {'cc cpu s':>9} {'total s':>8} {'cc/layer ms':>12} {'us/step':>9}")
    for name, build, layers in programs:
        runs = [measure(build, args.steps) for _ in range(args.repeat)]
        cc, cpu, total, step = (statistics.median(r[k] for r in runs) for k in range(4))
        per_layer = f"{cc / layers * 1e3:12.1f}" if layers else f"{'':>12}"
        print(f"{name:>12} {cc:7.2f} {cpu:9.2f} {total:8.2f} {per_layer} {step:9.1f}", flush=True)


if __name__ == "__main__":
    main()
