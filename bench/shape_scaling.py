"""How shape inference scales with the depth of a network.

Builds an N-layer MLP ``h = relu(w_i @ h + b_i)`` whose weights learn their input dims from use
(hidden width 16), then finalizes inference (``y.dims``), for N = 25, 50, 100, 200, each in a
fresh session. Prints the total time and the time per layer for each N, and the ratio of the
largest to the smallest per-layer time: it stays near 1 when inference is linear in the size of
the graph.

A second workload, ``h = relu(h + einsum("...->o => o", p_i))``, leaves every parameter's input
row to the last closing stage (only the einsum's ``...`` reduces it); it once made finalization
quadratic (one rescan of every shape per such row) and guards against that coming back.

    python -m bench.shape_scaling [--repeat R] [--depths 25,50,100,200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import ocannl as oc
import ocannl.session

HIDDEN = 16


def mlp(n_layers: int) -> float:
    """Seconds to build the MLP and finalize its shapes, in a fresh session."""
    ocannl.session.reset()
    start = time.perf_counter()
    x = oc.tensor(np.zeros((10, 2), dtype=np.float32), batch=1)
    h = x
    params = []
    for i in range(n_layers):
        w = oc.param(f"w{i}", output=HIDDEN)
        b = oc.param(f"b{i}", output=HIDDEN)
        params.append(w)
        h = oc.relu(w @ h + b)
    dims = h.dims
    elapsed = time.perf_counter() - start
    assert dims == (10, HIDDEN), dims
    assert params[0].dims == (HIDDEN, 2) and params[-1].dims == (HIDDEN, HIDDEN)
    return elapsed


def einsum_reduced_inputs(n_layers: int) -> float:
    """Seconds to build and finalize the second workload (see the module docstring)."""
    ocannl.session.reset()
    start = time.perf_counter()
    h = oc.tensor(np.zeros((10, HIDDEN), dtype=np.float32), batch=1)
    params = []
    for i in range(n_layers):
        p = oc.param(f"p{i}", output=HIDDEN)
        params.append(p)
        h = oc.relu(h + oc.einsum("...->o => o", p))
    dims = h.dims
    elapsed = time.perf_counter() - start
    assert dims == (10, HIDDEN) and params[-1].dims == (HIDDEN,), (dims, params[-1].dims)
    return elapsed


def report(title: str, build, depths: list[int], repeat: int) -> None:
    build(depths[0])  # warm up imports and caches
    per_layer = {}
    print(title)
    print(f"{'layers':>7} {'total (ms)':>11} {'per layer (ms)':>15}")
    for n in depths:
        best = min(build(n) for _ in range(repeat))
        per_layer[n] = best / n
        print(f"{n:>7} {best * 1e3:>11.2f} {per_layer[n] * 1e3:>15.3f}")
    lo, hi = min(per_layer.values()), max(per_layer.values())
    print(f"per-layer time ratio (largest/smallest): {hi / lo:.2f}"
          f"  ({depths[-1]} vs {depths[0]} layers: {per_layer[depths[-1]] / per_layer[depths[0]]:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per depth; the best is kept")
    parser.add_argument("--depths", default="25,50,100,200")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    report(f"MLP relu(w_i @ h + b_i), hidden {HIDDEN}, weights' input dims inferred", mlp, depths, args.repeat)
    print()
    report("params whose input rows only an einsum's `...` reduces", einsum_reduced_inputs, depths, args.repeat)


if __name__ == "__main__":
    main()
