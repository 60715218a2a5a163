"""The C backend against its peers on the CPU: PyTorch eager, torch.compile and JAX jit (and
numpy, and a hand-written C loop), every figure of the table measured side by side in this run.

    python -m bench.cpu_steps [--threads N] [--repeat R] [--workloads KEY ...] [--quick] [--markdown]

Rows, in this order:

* **fp32 GEMM 1024, 1 thread** and **N threads**: ``a @ b`` on c against numpy's (the product of
  ``bench/gemm.py``, thread pools limited in-process, timed in rounds alternating the two sides;
  numpy's idle OpenBLAS threads sleep rather than spin through the other side's round,
  ``bench/gemm.py``), and its bit-for-bit check against the interpreter at a ragged size;
* training steps, each against PyTorch eager, torch.compile and JAX jit (``bench/peers.py``):
  ``mlp``: a 64-256-256-10 relu MLP (``nn.mlp``), batch 64, softmax cross-entropy
  (``nn.cross_entropy``), SGD; ``cnn``: a padded 3x3 convolution to 8 channels, relu, 2x2 max
  pool, a padded 3x3 convolution to 16 channels, relu, a linear layer to 10 classes
  (``nn.conv2d``, ``nn.max_pool2d``, ``nn.linear``), batch 64 of 8x8 images, cross-entropy, SGD;
  ``transformer``: the pre-norm transformer block of ``bench/cc_time.py`` (batch 8 x sequence 16
  x d_model 32, two heads, mean-square loss, Adam); ``mlp-large``: an MLP 784-1024-1024-10, batch
  128, SGD; ``gpt``: ``examples/char_lm.py``'s model (embedding plus sinusoidal positions, 2
  causal ``nn.transformer_block``, d 128, 4 heads, ff 512, a final layer norm, a linear head)
  over sequences of 64 characters of its text, batch 16, cross-entropy, Adam;
* **cold compile** of ``mlp-large`` and ``gpt``: the seconds from the imported framework to the
  first step's loss: ocannl with an empty kernel cache (``OCANNL_CACHE_DIR`` a fresh folder),
  torch.compile with an empty Inductor cache, JAX jit's first call;
* **moons**: the demo's training (``examples/moons.py``) with one ``run()`` and a loss read per
  step, and with ``run_many`` (an epoch per call), against PyTorch eager and against the
  hand-written C loop of ``bench/moons.py``.

Each framework's side of a training step runs in its own process, pinned to the first ``N``
cores (``os.sched_setaffinity``: XLA starts threads whatever its flags say), with its thread pools
set to ``N`` (``OMP_NUM_THREADS``, ``torch.set_num_threads``; on one thread XLA's
``--xla_cpu_multi_thread_eigen=false``). ocannl's process writes its initial weights and the
batches to an ``.npz`` that the peers' processes load, so every side trains the same network from
the same weights on the same batches; each peer's first two losses must agree with ocannl's
(relative difference below 1e-4, checked before timing), so the columns time the same
computation. The processes run one after the other in two passes, the second in reverse order.
The moons demo's first two steps are checked the same way, in-process (its timed runs start from
each framework's own initialization, as ``bench/moons.py``'s do). A process times its side in
``--repeat`` rounds after a warm-up, a round lasting about 0.2 s; the table shows the best round
of both passes per step and, in brackets, the median, a measure of the noise of a shared
machine. The ratio is the strongest peer's best time over ocannl's best: above 1, ocannl is
faster than every peer measured. A peer whose package is missing (``pip install
'ocannl[peers]'`` installs JAX) reads "not installed".

``--threads N`` runs every side on N threads (by default every core); ``--workloads`` picks the
training steps (the keys above); ``--quick`` measures small sizes briefly (a smoke test);
``--markdown`` prints the table as Markdown (the README's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for bench/ and examples/
# First: bench.gemm sets OpenBLAS's idle-thread timeout before numpy loads OpenBLAS.
from bench.gemm import build_gemm, check_bits  # noqa: E402

import numpy as np  # noqa: E402

import ocannl as oc  # noqa: E402
import ocannl.session  # noqa: E402
from bench import cc_time, moons as moons_bench, peers  # noqa: E402
from bench.peers import EAGER, PEERS, Experiment  # noqa: E402
from ocannl import nn, train  # noqa: E402

BATCHES = 4
"""Batches of data the training steps cycle through (bound by the ``batch_n`` index symbol)."""

LOSS_RTOL = 1e-4
"""How closely the first losses of two frameworks must agree."""

OURS = "ocannl c"
"""The side every other is compared with."""

HAND_WRITTEN_C = "hand-written C"

PASSES = 2
"""Each side's process runs once per pass; the second pass runs them in reverse order."""


@dataclass
class Row:
    """One line of the table: ocannl's seconds and each reference's, as lists of rounds (None: the
    reference's package is not installed)."""

    workload: str
    ours: list[float]
    references: dict[str, list[float] | None]
    note: str = ""

    @property
    def strongest(self) -> str | None:
        """The reference with the best round, among those measured."""
        measured = {name: min(r) for name, r in self.references.items() if r}
        return min(measured, key=measured.get) if measured else None

    @property
    def ratio(self) -> float | None:
        """The strongest reference's best time over ocannl's: above 1, ocannl is faster."""
        strongest = self.strongest
        return None if strongest is None else min(self.references[strongest]) / min(self.ours)


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


def side_environment(n: int, scratch: Path) -> dict[str, str]:
    """The environment of a side's process on ``n`` threads: the thread pools' sizes, read when
    each library starts (XLA's single-thread flags on one thread), and an empty Inductor cache in
    ``scratch`` for torch.compile's cold compile."""
    env = dict(os.environ, OMP_NUM_THREADS=str(n), OPENBLAS_NUM_THREADS=str(n), MKL_NUM_THREADS=str(n),
               TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"))
    if n == 1:  # (``intra_op_parallelism_threads`` is TensorFlow's: XLA_FLAGS would refuse it)
        env["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), "--xla_cpu_multi_thread_eigen=false"]))
    return env


def first_cores(n: int) -> set[int]:
    """The first ``n`` cores this process may run on, the set a side's process is pinned to."""
    return set(sorted(os.sched_getaffinity(0))[:n])


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
# The models: ocannl builds them; its initial weights and its batches are the experiment every
# peer starts from (bench/peers.py)


@dataclass
class Built:
    """An ocannl training step compiled on a C context, with the experiment its peers mirror."""

    ctx: oc.Context
    routine: object
    loss: object
    experiment: Experiment
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


def compile_step(update: train.GradUpdate, optimizer, experiment: Experiment, batched: bool) -> Built:
    """``update`` and ``optimizer`` compiled on c; ``experiment`` gets the parameters' initial values."""
    ctx = oc.Context("c")
    routine = ctx.compile(update, optimizer)
    experiment.params = {p.label: ctx.get(p.value) for p in update.params}
    return Built(ctx, routine, update.loss, experiment, batched)


def classification_data(shape: tuple[int, ...], classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``BATCHES`` batches of standard normal inputs of ``shape`` and their class labels."""
    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCHES, *shape)).astype(np.float32), rng.integers(0, classes, (BATCHES, shape[0]))


OPTIMIZERS = {"sgd": train.sgd_update, "adam": train.adam_update}


def classifier(model: str, build_logits: Callable[[object], object], inputs: np.ndarray, labels: np.ndarray,
               optimizer: str, lr: float, classes: int = 10, constants: dict[str, np.ndarray] | None = None) -> Built:
    """The training step of the classifier ``build_logits(x)`` on batches of ``inputs`` (the
    batch axes are those of ``labels``), cross-entropy, ``optimizer``."""
    batch_n = oc.IndexSymbol("batch_n", BATCHES)
    x = oc.tensor(inputs, batch=labels.ndim, label="inputs")[batch_n]
    y = oc.tensor(np.eye(classes, dtype=np.float32)[labels], batch=labels.ndim, label="onehot")[batch_n]
    update = train.grad_update(nn.cross_entropy(build_logits(x), y, label="loss"))
    experiment = Experiment(model, optimizer, lr, {}, {"inputs": inputs, "labels": labels, **(constants or {})})
    return compile_step(update, OPTIMIZERS[optimizer](update, lr=lr), experiment, batched=True)


def build_mlp(batch: int, widths: Sequence[int]) -> Built:
    """An MLP ``widths``-10: the input width, then the hidden ones."""
    inputs, labels = classification_data((batch, widths[0]))
    return classifier("mlp", nn.mlp(hid_dims=tuple(widths[1:]), label="mlp"), inputs, labels, "sgd", lr=0.1)


def build_cnn(batch: int) -> Built:
    inputs, labels = classification_data((batch, 8, 8, 1))
    conv1, conv2, fc = nn.conv2d(8, label="conv1"), nn.conv2d(16, label="conv2"), nn.linear(10, label="fc")

    def logits(x):
        return fc(oc.relu(conv2(nn.max_pool2d(oc.relu(conv1(x))))))

    return classifier("cnn", logits, inputs, labels, "sgd", lr=0.05)


def build_transformer() -> Built:
    (update, adam), _ = cc_time.transformer()
    rng = np.random.default_rng(0)  # the data of cc_time.transformer, drawn in its order
    x, target = (rng.standard_normal((1, 8, 16, 32)).astype(np.float32) for _ in range(2))
    return compile_step(update, adam, Experiment("transformer", "adam", 1e-3, {}, {"inputs": x, "targets": target}),
                        batched=False)


def build_gpt(batch: int, seq: int, d_model: int, heads: int, d_ff: int, blocks: int = 2) -> Built:
    """``examples/char_lm.py``'s model (``blocks`` transformer blocks) and data (its first
    ``BATCHES`` batches), with Adam at its rate."""
    from examples import char_lm

    text = char_lm.load_text()
    vocab = char_lm.Vocabulary(text)
    tokens = char_lm.windows(vocab.encode(text), seq, batch, seed=0)[:BATCHES]
    model = char_lm.CharLM(len(vocab), seq=seq, d_model=d_model, heads=heads, d_ff=d_ff, blocks=blocks)
    return classifier("gpt", model, np.ascontiguousarray(tokens[:, :, :seq]), tokens[:, :, 1:], "adam",
                      lr=char_lm.LR, classes=len(vocab), constants={"positions": model.positions.data})


@dataclass(frozen=True)
class Workload:
    """A training step of the table: its ocannl builder at full and at ``--quick`` sizes."""

    key: str
    title: Callable[..., str]
    """The row's name, from the sizes."""
    build: Callable[..., Built]
    sizes: dict = field(default_factory=dict)
    quick_sizes: dict = field(default_factory=dict)
    cold: bool = False
    """Whether the table has a cold-compile row for it."""

    def name(self, quick: bool) -> str:
        return self.title(**(self.quick_sizes if quick else self.sizes))

    def built(self, quick: bool) -> Built:
        """The step compiled in a fresh session, from seed 0."""
        ocannl.session.reset()
        oc.seed(0)
        return self.build(**(self.quick_sizes if quick else self.sizes))


def _mlp_title(batch: int, widths: Sequence[int]) -> str:
    return f"MLP {'-'.join(map(str, widths))}-10 step, batch {batch}"


def _gpt_title(batch: int, seq: int, d_model: int, heads: int, d_ff: int) -> str:
    return f"GPT step: 2 causal blocks, d {d_model}, {heads} heads, ff {d_ff}, seq {seq}, batch {batch}"


WORKLOADS = (
    Workload("mlp", _mlp_title, build_mlp, {"batch": 64, "widths": (64, 256, 256)},
             {"batch": 8, "widths": (64, 256, 256)}),
    Workload("cnn", lambda batch: f"CNN step, batch {batch}", build_cnn, {"batch": 64}, {"batch": 8}),
    Workload("transformer", lambda: "transformer block step (8x16x32)", build_transformer),
    Workload("mlp-large", _mlp_title, build_mlp, {"batch": 128, "widths": (784, 1024, 1024)},
             {"batch": 8, "widths": (784, 64, 64)}, cold=True),
    Workload("gpt", _gpt_title, build_gpt, {"batch": 16, "seq": 64, "d_model": 128, "heads": 4, "d_ff": 512},
             {"batch": 2, "seq": 8, "d_model": 16, "heads": 2, "d_ff": 32},
             cold=True),
)
WORKLOAD_KEYS = {w.key: w for w in WORKLOADS}


def compare_losses(name: str, peer: str, ours: Sequence[float], theirs: Sequence[float]) -> None:
    """The first steps' losses of ocannl and of ``peer`` must agree: else they do not train the same."""
    for step, (a, b) in enumerate(zip(ours, theirs), 1):
        if abs(a - b) > LOSS_RTOL * max(abs(a), abs(b), 1e-6):
            raise RuntimeError(f"{name}: step {step}'s loss is {a!r} on ocannl but {b!r} on {peer}: the two sides "
                               f"do not compute the same training step")


def check_losses(name: str, ours: Callable[[int], float], theirs: Callable[[int], float], peer: str = EAGER) -> str:
    """Run two steps on each side; their losses must agree. Returns the first loss, as a note."""
    first = (ours(1), theirs(1))
    second = (ours(1), theirs(1))
    compare_losses(name, peer, (first[0], second[0]), (first[1], second[1]))
    return f"loss {first[0]:.5f} both"


# ---------------------------------------------------------------------------------------------
# A side in its own process


@dataclass
class Measured:
    """What a side's process reports: its first two losses, the seconds from the imported
    framework to the first loss (a cold compile), and its rounds (seconds per step)."""

    losses: list[float]
    cold: float
    rounds: list[float]


def run_side(side: str, workload: Workload, quick: bool, experiment: Path, expected: Sequence[float] | None,
             repeat: int, round_seconds: float) -> Measured:
    """One side of ``workload``, in this process: ocannl builds and compiles it from an empty
    kernel cache (and writes ``experiment`` if it is not there yet), a peer loads ``experiment``;
    the first two losses are checked against ``expected`` (ocannl's), then the rounds are timed."""
    if side == OURS:
        with cc_time.empty_cache():
            start = time.perf_counter()
            built = workload.built(quick)
            compiling = time.perf_counter() - start
        if not experiment.exists():
            built.experiment.save(experiment)
        steps, start = built.stepper(), time.perf_counter() - compiling  # writing the file is no part of it
    else:
        loaded = Experiment.load(experiment)
        peers.load(side)
        start = time.perf_counter()
        steps = peers.stepper(side, loaded)
    losses = [steps(1)]
    cold = time.perf_counter() - start
    losses.append(steps(1))
    if expected is not None:
        compare_losses(workload.name(quick), side, expected, losses)
    return Measured(losses, cold, timed_rounds([steps], repeat, round_seconds)[0])


def side_process(side: str, workload: Workload, args: argparse.Namespace, scratch: Path,
                 expected: Sequence[float] | None) -> Measured:
    """:func:`run_side` in a new process pinned to ``args.threads`` cores (``scratch`` holds the
    experiment and the process's own caches); a failure, a refusal included, is a RuntimeError."""
    scratch.mkdir(exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix=f"{side.split()[0].lower()}-", dir=scratch))
    command = [sys.executable, "-m", "bench.cpu_steps", "--side", side, "--workloads", workload.key,
               "--experiment", str(scratch / "experiment.npz"), "--threads", str(args.threads),
               "--repeat", str(args.repeat), *(["--quick"] if args.quick else []),
               *(["--expect", *map(repr, expected)] if expected is not None else [])]
    cores = first_cores(args.threads)
    done = subprocess.run(command, cwd=ROOT, env=side_environment(args.threads, cache), capture_output=True,
                          text=True, preexec_fn=lambda: os.sched_setaffinity(0, cores))
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise RuntimeError(f"{workload.name(args.quick)}: the {side} side failed: {tail[0]}")
    return Measured(**json.loads(done.stdout.strip().splitlines()[-1]))


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
        rows.append(Row(f"fp32 GEMM {n}, {t} thread{'s' * (t > 1)}", ours, {"numpy": theirs},
                        f"{flops / min(ours) / 1e9:.0f} vs {flops / min(theirs) / 1e9:.0f} GFLOP/s"))
    rows[0].note += f"; bit-identical to interp at 96x99x91: {check_bits(96, 99, 91, 0)}"
    return rows


def step_rows(workloads: Sequence[Workload], args: argparse.Namespace) -> list[Row]:
    """Each workload's training step on every side, each in its own process, :data:`PASSES`
    passes; then the cold-compile rows of the workloads that have them."""
    sides = [OURS] + [p for p in PEERS if peers.missing(p) is None]
    rows, cold_rows = [], []
    for workload in workloads:
        measured: dict[str, list[Measured]] = {side: [] for side in sides}
        with tempfile.TemporaryDirectory(prefix="ocannl-cpu-steps-") as scratch:
            for k in range(PASSES):
                for side in sides if k % 2 == 0 else sides[::-1]:
                    expected = measured[OURS][0].losses if measured[OURS] else None
                    measured[side].append(side_process(side, workload, args, Path(scratch), expected))

        def column(side: str, of: Callable[[Measured], list[float]]) -> list[float] | None:
            return [x for m in measured[side] for x in of(m)] if side in measured else None

        name = workload.name(args.quick)
        first = measured[OURS][0].losses[0]
        rows.append(Row(name, column(OURS, lambda m: m.rounds),
                        {p: column(p, lambda m: m.rounds) for p in PEERS},
                        f"loss {first:.5f} on every side"))
        if workload.cold:
            cold_rows.append(Row(f"cold compile: {name.replace(' step', '')}", column(OURS, lambda m: [m.cold]),
                                 {p: column(p, lambda m: [m.cold]) for p in PEERS if p != EAGER},
                                 "seconds to the first loss, empty caches"))
    return rows + cold_rows


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
    references = {EAGER: eager}
    try:
        references[HAND_WRITTEN_C] = [moons_bench.hand_written_c_run(steps)[0] for _ in range(repeat)]
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"no C compiler for the hand-written loop ({e})", file=sys.stderr)
    return [Row("moons, one run() per step", run_step, {EAGER: eager}, f"a loss read per step; {note}"),
            Row("moons, run_many", many_step, references, "an epoch (80 steps) per call")]


# ---------------------------------------------------------------------------------------------
# Output


def seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def timing(rounds: list[float]) -> str:
    return f"{seconds(min(rounds))} [{seconds(statistics.median(rounds))}]"


def columns(rows: list[Row]) -> list[str]:
    """The reference columns of the table: every reference of a row, in order of appearance."""
    return list(dict.fromkeys(name for r in rows for name in r.references))


def cells(row: Row, references: list[str]) -> list[str]:
    def reference(name: str) -> str:
        if name not in row.references:
            return ""
        rounds = row.references[name]
        return "not installed" if rounds is None else timing(rounds)

    ratio = "" if row.ratio is None else f"{row.ratio:.2f}x ({row.strongest})"
    return [row.workload, timing(row.ours), *map(reference, references), ratio, row.note]


def header(references: list[str]) -> list[str]:
    return ["workload", f"{OURS}, best [median]", *(f"{name}, best [median]" for name in references),
            "strongest peer / ocannl", "note"]


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
    references = columns(rows)
    table = [header(references)] + [cells(r, references) for r in rows]
    text = {0, len(table[0]) - 1}  # the workload and the note; the rest are figures
    if markdown:
        for k, line in enumerate(table):
            print("| " + " | ".join(line) + " |")
            if k == 0:
                print("|" + "|".join("---" if i in text else "--:" for i in range(len(line))) + "|")
        return
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(cell.ljust(w) if i in text else cell.rjust(w) for i, (cell, w) in
                        enumerate(zip(line, widths))).rstrip())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for every side (default: all)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per process (the best is shown)")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOAD_KEYS), default=list(WORKLOAD_KEYS),
                        help="the training steps to time (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes, short rounds: a smoke test")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    # A side's own process (side_process): which side, the experiment file, ocannl's first losses.
    parser.add_argument("--side", choices=[OURS, *PEERS], help=argparse.SUPPRESS)
    parser.add_argument("--experiment", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=float, nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[Row]:
    args = parse_args(argv)
    round_seconds = 0.02 if args.quick else 0.2
    if args.side is not None:
        measured = run_side(args.side, WORKLOAD_KEYS[args.workloads[0]], args.quick, args.experiment, args.expect,
                            args.repeat, round_seconds)
        print(json.dumps(asdict(measured)))
        return []
    try:
        import threadpoolctl  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"bench.cpu_steps compares with PyTorch: pip install 'ocannl[bench]' ({e})") from None
    print(f"machine: {machine()}; threads: {args.threads}; C backend: {oc.Context('c').backend.available()[1]}")
    rows = gemm_rows(128 if args.quick else 1024, args.threads, args.repeat, round_seconds)
    rows += step_rows([WORKLOAD_KEYS[k] for k in args.workloads], args)
    with threads(args.threads):
        rows += moons_rows(args.quick, args.repeat)
    print_table(rows, args.markdown)
    return rows


if __name__ == "__main__":
    main()
