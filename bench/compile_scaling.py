"""How compilation scales with the depth of a network.

Builds an N-layer tanh MLP of width 16 (``h = tanh(w_i @ h + b_i)``, a mean-square loss), its
training step (``train.grad_update`` then ``train.sgd_update``) and compiles that step with
``Context.compile`` into an empty kernel cache (a fresh temporary ``OCANNL_CACHE_DIR`` per N),
for N = 25, 50, 100, 200, 1000 by default, each in a fresh session.

Per N it prints:

* ``python``: the Python passes of ``Context.compile`` (lowering, tracing, virtualization,
  simplification, CSE, emitting the source): this process's processor time over the call (the
  init routine's compiler runs meanwhile, ``docs/compiler.md``, so the wall time less the
  compiler's would count it twice);
* ``cc``: the processor time of the system C compiler's processes building kernels (0 on
  ``--backend interp``; the compiler's own checks for the fresh cache run before timing starts);
* ``units`` and ``unit cc``: the translation units the longest source was compiled as, at the
  same time, one a core (``ocannl/backends/c/compiler.py``), and the seconds the slowest of them
  takes compiled alone afterwards (untimed above): the part of ``cc`` more cores would not cut;
* ``total``: the whole ``Context.compile`` call (it also compiles and runs the parameters' init
  routine);
* the time per layer of each, and at the end the ratio of the per-layer Python time at the
  largest N to that at the smallest: near 1 when the passes are linear in the routine.

Building the graph and its gradient code (the frontend) is timed apart, as ``frontend``.

``--gpt-blocks 2 12`` measures the GPT of ``bench/cpu_steps.py`` (its ``gpt`` workload's sizes)
with that many transformer blocks instead, from building the model to its compiled training
step, each in a fresh process on the cores this one may use (``taskset -c 0`` for one core), the
kernel cache empty and the C compiler's checks included, as a user's first run pays them: ``python`` (this process's
processor time), ``cc`` (the C compiler's, all its processes), ``total`` (wall seconds), and at
the end the ratio of the total at the most blocks to that at the fewest, which the blocks' shared
code should keep low (``docs/codegen.md``, "C").

    python -m bench.compile_scaling [--backend c|interp] [--layers 25 50 100 200 1000]
    python -m bench.compile_scaling --gpt-blocks 2 12 [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

import ocannl as oc
import ocannl.session
from bench.cc_time import children_cpu, empty_cache
from ocannl import train

WIDTH = 16


class _LongestSource:
    """Keeps the longest source the C backend builds while :meth:`installed`."""

    def __init__(self) -> None:
        self.longest = ""

    @contextmanager
    def installed(self) -> Iterator[None]:
        from ocannl.backends.c import backend as c_backend

        original = c_backend.compile_shared

        def timed(source, *args, **kwargs):
            self.longest = max(self.longest, source, key=len)
            return original(source, *args, **kwargs)

        c_backend.compile_shared = timed
        try:
            yield
        finally:
            c_backend.compile_shared = original


def build(n_layers: int) -> tuple[train.GradUpdate, object]:
    """The training step of an ``n_layers`` tanh MLP: its grad update and its SGD update."""
    x = oc.tensor(np.linspace(-1.0, 1.0, 8 * 2, dtype=np.float32).reshape(8, 2), batch=1)
    target = oc.tensor(np.zeros((8, 1), dtype=np.float32), batch=1)
    h = x
    for i in range(n_layers):
        w = oc.param(f"w{i}", output=WIDTH)
        b = oc.param(f"b{i}", output=WIDTH, init=0.0)
        h = oc.tanh(w @ h + b)
    w_out = oc.param("w_out", output=1)
    diff = w_out @ h - target
    loss = (diff * diff).mean()
    update = train.grad_update(loss)
    return update, train.sgd_update(update, lr=0.01)


def slowest_unit(source: str) -> tuple[int, float]:
    """The number of translation units ``source`` is compiled as, and the seconds the slowest
    of them takes to compile alone."""
    from ocannl.backends.c.compiler import compile_objects, parallel_units, toolchain

    units, tc, slowest = parallel_units(source), toolchain(), 0.0
    with tempfile.TemporaryDirectory(prefix="ocannl-compile-scaling-unit-") as folder:
        for unit in units:
            start = time.perf_counter()
            compile_objects([unit], tc, Path(folder))
            slowest = max(slowest, time.perf_counter() - start)
    return len(units), slowest


def measure(n_layers: int, backend: str) -> dict[str, float]:
    """Seconds per phase for one N, in a fresh session with an empty kernel cache."""
    ocannl.session.reset()
    timer = _LongestSource()
    with empty_cache():
        start = time.perf_counter()
        update, sgd = build(n_layers)
        frontend = time.perf_counter() - start
        ctx = oc.Context(backend)
        if backend == "c":  # the C compiler's checks, once per cache: not part of compiling
            from ocannl.backends.c.compiler import toolchain

            toolchain()
        with timer.installed():
            start, python, cc = time.perf_counter(), time.process_time(), children_cpu()
            step = ctx.compile(update, sgd)
            total, python, cc = time.perf_counter() - start, time.process_time() - python, children_cpu() - cc
        step.run()
    units, unit_cc = slowest_unit(timer.longest) if backend == "c" else (0, 0.0)
    return {"frontend": frontend, "python": python, "cc": cc, "total": total, "units": units, "unit cc": unit_cc}


def gpt_build(blocks: int) -> dict[str, float]:
    """Builds and compiles the GPT of ``bench/cpu_steps.py`` with ``blocks`` blocks in this
    process, from an empty kernel cache: seconds of wall time, of this process's processor time
    and of the C compiler's."""
    from bench.cpu_steps import WORKLOAD_KEYS, build_gpt

    with empty_cache():
        ocannl.session.reset()
        oc.seed(0)
        start, python = time.perf_counter(), time.process_time()
        build_gpt(**WORKLOAD_KEYS["gpt"].sizes, blocks=blocks)
        total, python = time.perf_counter() - start, time.process_time() - python
    return {"total": total, "python": python, "cc": children_cpu()}


def gpt_scaling(block_counts: list[int], repeat: int) -> None:
    """The table of ``--gpt-blocks`` (module docstring): each count ``repeat`` times, in fresh
    processes taking turns; the best of each column."""
    print("GPT of bench/cpu_steps.py, Adam, empty kernel cache, a fresh process each; best of", repeat)
    results: dict[int, list[dict[str, float]]] = {n: [] for n in block_counts}
    for _ in range(repeat):
        for n in block_counts:
            done = subprocess.run([sys.executable, "-m", "bench.compile_scaling", "--gpt-blocks-child", str(n)],
                                  capture_output=True, text=True, check=True)
            results[n].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("  ".join(f"{h:>12}" for h in ("blocks", "python s", "cc s", "total s")))
    best = {n: {k: min(r[k] for r in rs) for k in ("python", "cc", "total")} for n, rs in results.items()}
    for n, b in best.items():
        print(f"{n:>12}" + "".join(f"  {b[k]:>12.2f}" for k in ("python", "cc", "total")), flush=True)
    if len(best) > 1:
        small, large = min(best), max(best)
        print(f"total at {large} blocks / at {small}: {best[large]['total'] / best[small]['total']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("c", "interp"), default="c")
    parser.add_argument("--layers", type=int, nargs="+", default=[25, 50, 100, 200, 1000], metavar="N")
    parser.add_argument("--gpt-blocks", type=int, nargs="+", metavar="B",
                        help="measure the GPT of bench/cpu_steps.py with B blocks instead (C backend)")
    parser.add_argument("--repeat", type=int, default=3, help="with --gpt-blocks: processes per count")
    parser.add_argument("--gpt-blocks-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gpt_blocks_child is not None:
        print(json.dumps(gpt_build(args.gpt_blocks_child)))
        return
    if args.gpt_blocks:
        gpt_scaling(args.gpt_blocks, args.repeat)
        return
    print(f"backend {args.backend}, width {WIDTH}, grad_update + sgd_update, empty kernel cache")
    header = ("N", "frontend s", "python s", "cc s", "units", "unit cc s", "total s", "python/layer ms", "cc/layer ms",
              "total/layer ms")
    print("  ".join(f"{h:>15}" for h in header))
    per_layer: dict[int, float] = {}
    for n in args.layers:
        r = measure(n, args.backend)
        per_layer[n] = r["python"] / n
        row = (n, r["frontend"], r["python"], r["cc"], r["units"], r["unit cc"], r["total"],
               1e3 * r["python"] / n, 1e3 * r["cc"] / n, 1e3 * r["total"] / n)
        print("  ".join(f"{v:>15}" if isinstance(v, int) else f"{v:>15.3f}" for v in row), flush=True)
    if len(per_layer) > 1:
        small, large = min(per_layer), max(per_layer)
        print(f"python time per layer at N={large} / at N={small}: {per_layer[large] / per_layer[small]:.2f}")


if __name__ == "__main__":
    main()
