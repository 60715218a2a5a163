"""The C backend against PyTorch eager (and numpy, and a hand-written C loop) on the CPU: every
figure of the table measured side by side in this run.

    python -m bench.cpu_steps [--threads N] [--repeat R] [--quick] [--markdown]

Rows, in this order:

* **fp32 GEMM 1024, 1 thread** and **N threads**: ``a @ b`` on c against numpy's (the product of
  ``bench/gemm.py``, thread pools limited in-process, timed in rounds as the steps are; numpy's
  idle OpenBLAS threads sleep rather than spin through the other side's round,
  ``bench/gemm.py``), and its bit-for-bit check against the interpreter at a ragged size;
* **mlp**: the training step of a 64-256-256-10 relu MLP (``nn.mlp``), batch 64, softmax
  cross-entropy (``nn.cross_entropy``), SGD;
* **cnn**: the training step of a padded 3x3 convolution to 8 channels, relu, 2x2 max pool, a
  padded 3x3 convolution to 16 channels, relu, a linear layer to 10 classes (``nn.conv2d``,
  ``nn.max_pool2d``, ``nn.linear``), batch 64 of 8x8 images, cross-entropy, SGD;
* **transformer**: the pre-norm transformer block's training step of ``bench/cc_time.py`` (batch
  8 x sequence 16 x d_model 32, two heads, mean-square loss, Adam);
* **moons**: the demo's training (``examples/moons.py``) with one ``run()`` and a loss read per
  step, and with ``run_many`` (an epoch per call), against PyTorch eager and against the
  hand-written C loop of ``bench/moons.py``.

The MLP, CNN and transformer start from the same weights in both frameworks (PyTorch's copied
from the C context after initialization) and train on the same batches; the first two steps'
losses must agree (relative difference below 1e-4, checked before timing), so the two columns
time the same computation. The moons demo's first two steps are checked the same way (its timed
runs start from each framework's own initialization, as ``bench/moons.py``'s do). Each workload is timed in ``--repeat`` rounds alternating the two
sides, after a warm-up, a round lasting about 0.2 s; the table shows the best round per step and,
in brackets, the median round, a measure of the noise of a shared machine. The ratio is the
reference's best time over ocannl's best: above 1, ocannl is faster.

``--threads N`` runs both sides on N threads (OpenMP and BLAS thread pools through threadpoolctl,
PyTorch through ``torch.set_num_threads``); by default every core. ``--quick`` measures small
sizes briefly (a smoke test); ``--markdown`` prints the table as Markdown (the README's).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for bench/ and examples/
# First: bench.gemm sets OpenBLAS's idle-thread timeout before numpy loads OpenBLAS.
from bench.gemm import build_gemm, check_bits  # noqa: E402

import numpy as np  # noqa: E402

import ocannl as oc  # noqa: E402
import ocannl.session  # noqa: E402
from bench import cc_time, moons as moons_bench  # noqa: E402
from bench.interp_throughput import torch_loop  # noqa: E402
from ocannl import nn, train  # noqa: E402

BATCHES = 4
"""Batches of data the MLP and the CNN cycle through (bound by the ``batch_n`` index symbol)."""

LOSS_RTOL = 1e-4
"""How closely the first losses of the two frameworks must agree."""


@dataclass
class Row:
    """One line of the table: ocannl's seconds and the reference's, as lists of rounds."""

    workload: str
    reference: str
    ours: list[float]
    theirs: list[float]
    note: str = ""

    @property
    def ratio(self) -> float:
        return min(self.theirs) / min(self.ours)


# ---------------------------------------------------------------------------------------------
# Thread pools


@contextmanager
def threads(n: int) -> Iterator[None]:
    """Every thread pool loaded in this process (OpenMP's, the BLAS's, PyTorch's) limited to
    ``n`` threads; the C backend's OpenMP runtime must already be loaded (compile first)."""
    from threadpoolctl import threadpool_limits

    torch = sys.modules.get("torch")
    previous = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(limits=n):
        if torch is not None:
            torch.set_num_threads(n)
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(previous)


# ---------------------------------------------------------------------------------------------
# Timing


def timed_rounds(sides: list[Callable[[int], float]], repeat: int, round_seconds: float) -> list[list[float]]:
    """Seconds per step of each side (``steps(n)`` runs ``n`` steps), ``repeat`` rounds each,
    the sides alternating round by round; each side first warms up and sizes its rounds."""
    counts = []
    for steps in sides:
        steps(2)  # warm up: caches, thread pools, PyTorch's allocator
        start = time.perf_counter()
        steps(3)
        per_step = (time.perf_counter() - start) / 3
        counts.append(max(1, int(round_seconds / max(per_step, 1e-9))))
    rounds: list[list[float]] = [[] for _ in sides]
    for _ in range(repeat):
        for steps, n, out in zip(sides, counts, rounds):
            start = time.perf_counter()
            steps(n)
            out.append((time.perf_counter() - start) / n)
    return rounds


# ---------------------------------------------------------------------------------------------
# The models: ocannl builds them; PyTorch's copies the initial weights from the C context


@dataclass
class Built:
    """An ocannl training step compiled on a C context, with what PyTorch needs to mirror it."""

    ctx: oc.Context
    routine: object
    loss: object
    params: dict[str, np.ndarray]
    """Each parameter's initial value, by label."""
    batched: bool
    """Whether the step reads the ``batch_n`` index symbol."""

    def stepper(self) -> Callable[[int], float]:
        count = [0]
        routine, ctx, loss = self.routine, self.ctx, self.loss

        def steps(n: int) -> float:
            for _ in range(n):
                if self.batched:
                    routine.run(batch_n=count[0] % BATCHES)
                else:
                    routine.run()
                count[0] += 1
            return float(ctx.get(loss.value))

        return steps


def compile_step(update: train.GradUpdate, optimizer, batched: bool) -> Built:
    ctx = oc.Context("c")
    routine = ctx.compile(update, optimizer)
    params = {p.label: ctx.get(p.value) for p in update.params}
    return Built(ctx, routine, update.loss, params, batched)


def classification_data(shape: tuple[int, ...], classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``BATCHES`` batches of standard normal inputs of ``shape`` and their class labels."""
    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCHES, *shape)).astype(np.float32), rng.integers(0, classes, (BATCHES, shape[0]))


def classifier(build_logits: Callable[[object], object], inputs: np.ndarray, labels: np.ndarray, lr: float) -> Built:
    """The SGD training step of the classifier ``build_logits(x)`` on batches of ``inputs``."""
    batch_n = oc.IndexSymbol("batch_n", BATCHES)
    x = oc.tensor(inputs, batch=2, label="inputs")[batch_n]
    y = oc.tensor(np.eye(10, dtype=np.float32)[labels], batch=2, label="onehot")[batch_n]
    update = train.grad_update(nn.cross_entropy(build_logits(x), y, label="loss"))
    return compile_step(update, train.sgd_update(update, lr=lr), batched=True)


def build_mlp(batch: int = 64) -> tuple[Built, np.ndarray, np.ndarray]:
    inputs, labels = classification_data((batch, 64))
    return classifier(nn.mlp(hid_dims=(256, 256), label="mlp"), inputs, labels, lr=0.1), inputs, labels


def build_cnn(batch: int = 64) -> tuple[Built, np.ndarray, np.ndarray]:
    inputs, labels = classification_data((batch, 8, 8, 1))
    conv1, conv2, fc = nn.conv2d(8, label="conv1"), nn.conv2d(16, label="conv2"), nn.linear(10, label="fc")

    def logits(x):
        return fc(oc.relu(conv2(nn.max_pool2d(oc.relu(conv1(x))))))

    return classifier(logits, inputs, labels, lr=0.05), inputs, labels


def build_transformer() -> Built:
    (update, adam), _ = cc_time.transformer()
    return compile_step(update, adam, batched=False)


def _copy(torch, target, value: np.ndarray) -> None:
    with torch.no_grad():
        target.copy_(torch.from_numpy(np.ascontiguousarray(value)).reshape(target.shape))


def torch_mlp(torch, built: Built, inputs: np.ndarray, labels: np.ndarray) -> Callable[[int], float]:
    nnt, p = torch.nn, built.params
    model = nnt.Sequential(nnt.Linear(64, 256), nnt.ReLU(), nnt.Linear(256, 256), nnt.ReLU(),
                           nnt.Linear(256, 10, bias=False))
    # ocannl lays a weight out as [output, input], as torch.nn.Linear.
    for layer, name in ((model[0], "mlp_w1"), (model[2], "mlp_w2"), (model[4], "mlp_w_out")):
        _copy(torch, layer.weight, p[name])
    _copy(torch, model[0].bias, p["mlp_b1"])
    _copy(torch, model[2].bias, p["mlp_b2"])
    xs, ys = torch.from_numpy(inputs), torch.from_numpy(labels)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return torch_loop(optimizer,
                      lambda step: nnt.functional.cross_entropy(model(xs[step % BATCHES]), ys[step % BATCHES]))


def torch_cnn(torch, built: Built, inputs: np.ndarray, labels: np.ndarray) -> Callable[[int], float]:
    nnt, p = torch.nn, built.params
    model = nnt.Sequential(nnt.Conv2d(1, 8, 3, padding=1), nnt.ReLU(), nnt.MaxPool2d(2),
                           nnt.Conv2d(8, 16, 3, padding=1), nnt.ReLU(), nnt.Flatten(), nnt.Linear(16 * 4 * 4, 10))
    # ocannl's kernels are [oc, kh, kw, ic] and its activations [h, w, c]; PyTorch's [oc, ic, kh, kw]
    # and [c, h, w], so the linear layer's input axes are permuted the same way.
    _copy(torch, model[0].weight, p["conv1_kernel"].transpose(0, 3, 1, 2))
    _copy(torch, model[3].weight, p["conv2_kernel"].transpose(0, 3, 1, 2))
    _copy(torch, model[6].weight, p["fc_w"].transpose(0, 3, 1, 2))
    for layer, name in ((model[0], "conv1_bias"), (model[3], "conv2_bias"), (model[6], "fc_b")):
        _copy(torch, layer.bias, p[name])
    xs = torch.from_numpy(inputs).permute(0, 1, 4, 2, 3).contiguous()  # NCHW
    ys = torch.from_numpy(labels)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return torch_loop(optimizer,
                      lambda step: nnt.functional.cross_entropy(model(xs[step % BATCHES]), ys[step % BATCHES]))


def torch_transformer(torch, built: Built) -> Callable[[int], float]:
    """``bench/cc_time.py``'s block: attention without biases, heads split from 32-wide
    projections (ocannl's ``[h, d_k, d_model]`` weights are ``Linear(32, 32)`` weights)."""
    nnt, p = torch.nn, built.params
    rng = np.random.default_rng(0)  # the data of cc_time.transformer, drawn in its order
    x = torch.from_numpy(rng.standard_normal((8, 16, 32)).astype(np.float32))
    target = torch.from_numpy(rng.standard_normal((8, 16, 32)).astype(np.float32))
    layers = nnt.ModuleDict({"ln1": nnt.LayerNorm(32), "ln2": nnt.LayerNorm(32), "q": nnt.Linear(32, 32, bias=False),
                             "k": nnt.Linear(32, 32, bias=False), "v": nnt.Linear(32, 32, bias=False),
                             "o": nnt.Linear(32, 32, bias=False), "ff1": nnt.Linear(32, 64), "ff2": nnt.Linear(64, 32)})
    for name, weight in (("ln1", "ln1_gamma"), ("ln2", "ln2_gamma"), ("q", "mha_w_q"), ("k", "mha_w_k"),
                         ("v", "mha_w_v"), ("o", "mha_w_o"), ("ff1", "ff_w1"), ("ff2", "ff_w2")):
        _copy(torch, layers[name].weight, p[weight])
    for name, bias in (("ln1", "ln1_beta"), ("ln2", "ln2_beta"), ("ff1", "ff_b1"), ("ff2", "ff_b2")):
        _copy(torch, layers[name].bias, p[bias])
    optimizer = torch.optim.Adam(layers.parameters(), lr=1e-3)

    def heads(t):
        return t.view(8, 16, 2, 16).transpose(1, 2)

    def batch_loss(step: int):
        a = layers["ln1"](x)
        scores = heads(layers["q"](a)) @ heads(layers["k"](a)).transpose(-1, -2) / 4.0
        out = (torch.softmax(scores, dim=-1) @ heads(layers["v"](a))).transpose(1, 2).reshape(8, 16, 32)
        h = x + layers["o"](out)
        y = h + layers["ff2"](torch.relu(layers["ff1"](layers["ln2"](h))))
        return ((y - target) ** 2).mean()

    return torch_loop(optimizer, batch_loss)


def check_losses(name: str, ours: Callable[[int], float], theirs: Callable[[int], float]) -> str:
    """Run two steps on each side; their losses must agree. Returns the first loss, as a note."""
    first = (ours(1), theirs(1))
    second = (ours(1), theirs(1))
    for step, (a, b) in enumerate((first, second), 1):
        if abs(a - b) > LOSS_RTOL * max(abs(a), abs(b), 1e-6):
            raise RuntimeError(f"{name}: step {step}'s loss is {a!r} on ocannl but {b!r} on PyTorch: the two sides "
                               f"do not compute the same training step")
    return f"loss {first[0]:.5f} both"


# ---------------------------------------------------------------------------------------------
# The rows


def gemm_rows(n: int, n_threads: int, repeat: int, round_seconds: float) -> list[Row]:
    """The product on 1 and on ``n_threads`` threads, timed in alternating rounds as the steps
    are (:func:`timed_rounds`); compiling it first loads the C backend's OpenMP runtime, for the
    thread limits to reach it."""
    _, run, a_np, b_np = build_gemm(n)

    def ours_steps(k: int) -> float:
        for _ in range(k):
            run()
        return 0.0

    def numpy_steps(k: int) -> float:
        for _ in range(k):
            a_np @ b_np
        return 0.0

    rows = []
    for t in sorted({1, n_threads}):
        with threads(t):
            ours, theirs = timed_rounds([ours_steps, numpy_steps], repeat, round_seconds)
        flops = 2.0 * n**3
        rows.append(Row(f"fp32 GEMM {n}, {t} thread{'s' * (t > 1)}", "numpy", ours, theirs,
                        f"{flops / min(ours) / 1e9:.0f} vs {flops / min(theirs) / 1e9:.0f} GFLOP/s"))
    rows[0].note += f"; bit-identical to interp at 96x99x91: {check_bits(96, 99, 91, 0)}"
    return rows


def step_rows(torch, quick: bool, repeat: int, round_seconds: float) -> list[Row]:
    batch = 8 if quick else 64
    rows = []

    def mlp():
        built, inputs, labels = build_mlp(batch)
        return built.stepper(), torch_mlp(torch, built, inputs, labels)

    def cnn():
        built, inputs, labels = build_cnn(batch)
        return built.stepper(), torch_cnn(torch, built, inputs, labels)

    def transformer():
        built = build_transformer()
        return built.stepper(), torch_transformer(torch, built)

    workloads = [(f"MLP 64-256-256-10 step, batch {batch}", mlp), (f"CNN step, batch {batch}", cnn),
                 ("transformer block step (8x16x32)", transformer)]
    for name, build in workloads:
        ocannl.session.reset()
        oc.seed(0)
        torch.manual_seed(0)
        ours, theirs = build()
        note = check_losses(name, ours, theirs)
        mine, reference = timed_rounds([ours, theirs], repeat, round_seconds)
        rows.append(Row(name, "PyTorch eager", mine, reference, note))
    return rows


def moons_check() -> str:
    """The demo's first two steps on c and in PyTorch eager from the same weights: equal losses
    (the timed runs start from each framework's own initialization, as the demo does)."""
    from examples import moons

    ocannl.session.reset()
    oc.seed(0)
    ctx = oc.Context("c")
    model, loss, update, sgd, _, n_batches = moons.build()
    routine = ctx.compile(update, sgd)
    eager, _ = moons_bench.torch_training({p.label: ctx.get(p) for p in model.params})
    count = [0, 0]

    def ours(n: int) -> float:
        for _ in range(n):
            routine.run(batch_n=count[0] % n_batches, step_n=count[0])
            count[0] += 1
        return float(ctx.get(loss))

    def theirs(n: int) -> float:
        for _ in range(n):
            value = eager(count[1]).item()
            count[1] += 1
        return value

    return check_losses("moons", ours, theirs)


def moons_rows(quick: bool, repeat: int) -> list[Row]:
    steps = 320 if quick else 6400
    note = moons_check()
    run_step = [moons_bench.ocannl_run("c", steps)[1] for _ in range(repeat)]
    many_step = [moons_bench.ocannl_run("c", steps, many=True)[1] for _ in range(repeat)]
    eager = [moons_bench.torch_run(steps)[0] for _ in range(max(1, repeat // 2))]
    rows = [Row("moons, one run() per step", "PyTorch eager", run_step, eager, f"a loss read per step; {note}"),
            Row("moons, run_many", "PyTorch eager", many_step, eager, "an epoch (80 steps) per call")]
    try:
        hand = [moons_bench.hand_written_c_run(steps)[0] for _ in range(repeat)]
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"no C compiler for the hand-written loop ({e})", file=sys.stderr)
    else:
        rows.append(Row("moons, run_many", "hand-written C", many_step, hand, "the same training written in C"))
    return rows


# ---------------------------------------------------------------------------------------------
# Output


def seconds(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def cells(row: Row) -> list[str]:
    return [row.workload, f"{seconds(min(row.ours))} [{seconds(statistics.median(row.ours))}]", row.reference,
            f"{seconds(min(row.theirs))} [{seconds(statistics.median(row.theirs))}]", f"{row.ratio:.2f}x", row.note]


HEADER = ["workload", "ocannl c, best [median]", "reference", "reference, best [median]", "reference / ocannl",
          "note"]


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return f"{model}, {os.cpu_count()} cores"


def print_table(rows: list[Row], markdown: bool) -> None:
    table = [HEADER] + [cells(r) for r in rows]
    if markdown:
        for k, line in enumerate(table):
            print("| " + " | ".join(line) + " |")
            if k == 0:
                print("|" + "|".join("---" if i in (0, 2, 5) else "--:" for i in range(len(line))) + "|")
        return
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    for line in table:
        print("  ".join(cell.ljust(w) if i in (0, 2, 5) else cell.rjust(w) for i, (cell, w) in
                        enumerate(zip(line, widths))).rstrip())


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both sides (default: all)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per workload (the best is shown)")
    parser.add_argument("--quick", action="store_true", help="small sizes, short rounds: a smoke test")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    try:
        import threadpoolctl  # noqa: F401
        import torch
    except ImportError as e:
        raise SystemExit(f"bench.cpu_steps compares with PyTorch: pip install 'ocannl[bench]' ({e})") from None
    print(f"machine: {machine()}; threads: {args.threads}; C backend: {oc.Context('c').backend.available()[1]}")
    round_seconds = 0.02 if args.quick else 0.2
    rows = gemm_rows(128 if args.quick else 1024, args.threads, args.repeat, round_seconds)
    with threads(args.threads):
        rows += step_rows(torch, args.quick, args.repeat, round_seconds)
        rows += moons_rows(args.quick, args.repeat)
    print_table(rows, args.markdown)
    return rows


if __name__ == "__main__":
    main()
