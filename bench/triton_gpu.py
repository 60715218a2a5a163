"""The Triton backend on a GPU against PyTorch, measured in the same run.

* GEMM ``n x n x n`` (default 4096): float16 operands accumulated in float32 (the tensor-core
  path: ``tl.dot`` on 16-bit tiles) against ``torch.matmul`` on float16, and float32 with exact
  products (``input_precision="ieee"``) against ``torch.matmul`` with TF32 off.
* One training step of a 784-1024-1024-10 relu MLP (batch 512, softmax cross-entropy, SGD)
  against the same model in PyTorch eager and under ``torch.compile``, all float32 without TF32.

``--smoke`` runs the same code on the CPU at toy sizes (Triton's interpreter, CPU torch, no
``torch.compile``): it checks the script, not speed; the tests run it.

Prints milliseconds (best of ``--repeat``, after a warm-up run that also compiles), TFLOP/s
for the GEMMs and the ratio ocannl / PyTorch (below 1: ocannl is faster). ::

    python -m bench.triton_gpu [--repeat 20] [--size 4096] [--batch 512] [--hidden 1024]

Needs a CUDA GPU and the triton extra (``pip install 'ocannl[triton]'``); without a GPU it says
so and exits with status 0. ``OCANNL_TRITON_FP32_DOT=tf32`` makes the float32 GEMM use TF32 (then
compare with ``torch.backends.cuda.matmul.allow_tf32 = True``, ``--tf32``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


DEVICE = "cuda"


def sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def gpu_or_reason() -> str | None:
    """``None`` when a GPU can run the benchmark, else why not."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "TRITON_INTERPRET is set: the interpreter would take hours; unset it on a GPU machine"
    from ocannl.backends.triton.runtime import availability

    ok, reason = availability()
    return None if ok else reason


def gemm_computation(n: int, m: int, k: int, dtype: str, seed: int = 0):
    """``c[i, j] = sum_k a[i, k] * b[k, j]`` with ``a``, ``b`` of ``dtype`` and ``c`` float32 (the
    accumulation precision is a per-node choice: a float16 ``c`` would round at every step), as
    a :class:`~ocannl.lowlevel.assignments.Computation` with its operands' values as inits."""
    from ocannl.lowlevel import dtypes
    from ocannl.lowlevel.assignments import Accum, Computation
    from ocannl.lowlevel.indexing import Iter, Projections, Symbol
    from ocannl.lowlevel.scalar_ops import Binop
    from ocannl.lowlevel.tnode import TNode

    rng = np.random.default_rng(seed)
    a = TNode("a", (n, k), dtypes.by_name(dtype))
    b = TNode("b", (k, m), dtypes.by_name(dtype))
    c = TNode("c", (n, m), dtypes.float32)
    i, j, r = Symbol(), Symbol(), Symbol()
    proj = Projections((n, m, k), (i, j, r), c.dims, (a.dims, b.dims), (Iter(i), Iter(j)),
                       ((Iter(i), Iter(r)), (Iter(r), Iter(j))))
    body = Accum(c, Binop.ADD, Binop.MUL, (a, b), lambda: proj, initialize_neutral=True, spec="@")
    values = (rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32))
    return Computation(f"gemm_{dtype}", body, ((a, values[0]), (b, values[1]))), (a, b, c)


def best_ms(fn, repeat: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def bench_gemm(n: int, dtype: str, repeat: int) -> tuple[float, float, float]:
    """(ocannl ms, torch ms, max relative difference)."""
    import torch

    import ocannl as oc

    oc.session.reset()
    comp, (a, b, c) = gemm_computation(n, n, n, dtype)
    ctx = oc.Context("triton")
    routine = ctx.compile(comp)
    ours = best_ms(routine.run, repeat)
    torch_dtype = getattr(torch, dtype)
    ta = torch.from_numpy(ctx.get(a)).to(DEVICE, torch_dtype)
    tb = torch.from_numpy(ctx.get(b)).to(DEVICE, torch_dtype)
    theirs = best_ms(lambda: torch.matmul(ta, tb), repeat) if DEVICE == "cuda" or dtype == "float32" else float("nan")
    expected = torch.matmul(ta.double(), tb.double()).cpu().numpy()
    got = ctx.get(c)
    err = float(np.abs(got - expected).max() / np.abs(expected).max())
    return ours, theirs, err


def bench_mlp(batch: int, hidden: int, repeat: int) -> dict[str, float]:
    """Milliseconds per training step: ocannl, PyTorch eager, torch.compile (on a GPU)."""
    import torch

    import ocannl as oc
    from ocannl import nn, train

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((batch, 784)).astype(np.float32)
    labels = rng.integers(0, 10, batch)
    onehot = np.eye(10, dtype=np.float32)[labels]

    oc.session.reset()
    oc.seed(0)
    ctx = oc.Context("triton")
    x = oc.tensor(xs, batch=1, label="x")
    y = oc.tensor(onehot, batch=1, label="y")
    model = nn.mlp(hid_dims=(hidden, hidden), label="mlp")
    probs = nn.softmax(model(x))
    loss = (-(y * oc.log(probs + 1e-9)).sum(axes="output")).mean(label="loss")
    update = train.grad_update(loss)
    start = time.perf_counter()
    routine = ctx.compile(update, train.sgd_update(update, lr=0.01))
    routine.run()
    sync()
    first = time.perf_counter() - start
    out = {"ocannl": best_ms(routine.run, repeat), "ocannl first run (compiles)": first * 1e3}

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                              torch.nn.ReLU(), torch.nn.Linear(hidden, 10, bias=False)).to(DEVICE)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    tx, ty = torch.from_numpy(xs).to(DEVICE), torch.from_numpy(labels).to(DEVICE)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(tx), ty).backward()
        opt.step()

    out["torch eager"] = best_ms(step, repeat)
    if DEVICE == "cuda":
        compiled = torch.compile(step)
        start = time.perf_counter()
        compiled()
        sync()
        out["torch.compile first run (compiles)"] = (time.perf_counter() - start) * 1e3
        out["torch.compile"] = best_ms(compiled, repeat)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--size", type=int, default=4096, help="GEMM size n (n x n x n)")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU interpreter: checks the script")
    parser.add_argument("--tf32", action="store_true", help="let torch use TF32 for float32 (compare with "
                        "OCANNL_TRITON_FP32_DOT=tf32)")
    args = parser.parse_args(argv)
    global DEVICE
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        DEVICE = "cpu"
        args.size, args.batch, args.hidden, args.repeat = 48, 16, 32, 1
    else:
        reason = gpu_or_reason()
        if reason is not None:
            print(f"bench/triton_gpu.py needs a CUDA GPU; not run here: {reason}")
            return 0
    import torch

    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "none (--smoke: the CPU interpreter)"
    print(f"GPU: {device}; torch {torch.__version__}; "
          f"float32 dot: {os.environ.get('OCANNL_TRITON_FP32_DOT', 'ieee')}")
    n = args.size
    flops = 2 * n**3
    print(f"\nGEMM {n}x{n}x{n}       ocannl ms   torch ms   ocannl TFLOP/s   torch TFLOP/s   ratio   max rel. err")
    for dtype in ("float16", "float32"):
        ours, theirs, err = bench_gemm(n, dtype, args.repeat)
        print(f"  {dtype:<16} {ours:10.3f} {theirs:10.3f} {flops / ours / 1e9:16.1f} {flops / theirs / 1e9:15.1f}"
              f" {ours / theirs:7.2f}   {err:.1e}")
    print(f"\nMLP 784-{args.hidden}-{args.hidden}-10 training step, batch {args.batch} (float32)")
    times = bench_mlp(args.batch, args.hidden, args.repeat)
    for name, ms in times.items():
        print(f"  {name:<36} {ms:10.3f} ms")
    print(f"  ratio ocannl / torch eager: {times['ocannl'] / times['torch eager']:.2f}"
          + (f"; ocannl / torch.compile: {times['ocannl'] / times['torch.compile']:.2f}" if "torch.compile" in times else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
