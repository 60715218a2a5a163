"""Moons training (the demo's 2-16-16-1 MLP, 6400 SGD steps) on the C backend vs PyTorch eager
on the CPU, and the interpreter for a few steps; all measured in this run.

    python bench/moons.py [--steps 6400] [--interp-steps 200]

Prints the per-step time of each (the median over epochs of an epoch's time per step, which
a busy machine disturbs less than a mean) and the ratios. The C backend trains two ways: one
``routine.run()`` per step, reading the loss with ``ctx.get`` after each (what a Python training
loop pays per step), and an epoch of 80 steps per ``routine.run_many(..., record=loss)`` (the
steps and the loss copies in one C call, as the demo trains). ``run()``'s own cost is printed
too: a run of a routine whose kernel does next to nothing, and the difference between the two
ways per step. PyTorch runs the same model, loss, learning-rate schedule and weight decay, one
step per batch of 10 (eager mode, default threads); so does a training loop written by hand in C
(``HAND_WRITTEN_C``, compiled here by ``cc -O2``, an epoch per call), the floor a framework's
step loop can approach.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/


def ocannl_run(backend: str, steps: int, many: bool = False) -> tuple[float, float, float]:
    """(compile seconds, seconds per step, last epoch's summed loss); ``many``: an epoch (or
    what is left of ``steps``) per ``run_many`` call."""
    import ocannl as oc
    from examples import moons

    oc.session.reset()
    oc.seed(0)
    ctx = oc.Context(backend)
    start = time.perf_counter()
    model, loss, update, sgd, _, n_batches = moons.build()
    routine = ctx.compile(update, sgd)
    compiled = time.perf_counter()
    losses, per_step = [], []
    for first in range(0, steps, n_batches):
        count = min(n_batches, steps - first)
        epoch_start = time.perf_counter()
        if many:
            recorded = routine.run_many(batch_n=range(count), step_n=range(first, first + count), record=loss)
            losses.extend(recorded.tolist())
        else:
            for b in range(count):
                routine.run(batch_n=b, step_n=first + b)
                losses.append(float(ctx.get(loss.value)))
        per_step.append((time.perf_counter() - epoch_start) / count)
    last = sum(losses[-n_batches:]) if steps >= n_batches else float("nan")
    return compiled - start, statistics.median(per_step), last


def run_overhead(backend: str, calls: int = 100_000) -> float:
    """Seconds per ``routine.run(s=...)`` of a routine whose kernel stores one number: the
    Python and call cost of a run, best of 5 rounds."""
    import ocannl as oc

    oc.session.reset()
    ctx = oc.Context(backend)
    s = oc.IndexSymbol("s", calls)
    routine = ctx.compile((s * 1.0).materialize())
    routine.run(s=0)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for i in range(calls):
            routine.run(s=i)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def torch_training(weights: dict[str, "np.ndarray"] | None = None, total: int = 6400):
    """The same training in PyTorch eager: a function running step ``k`` (returning the loss
    tensor) and the model. ``weights``: initial values by ocannl label (``mlp_w1``, ...), copied
    in (ocannl lays a weight out as ``[output, input]``, as ``torch.nn.Linear``); else
    PyTorch's own initialization."""
    import torch

    from ocannl import data

    points, labels = data.moons(800, noise=0.1, seed=0)
    xs = torch.from_numpy(points).reshape(80, 10, 2)
    ys = torch.from_numpy(labels).reshape(80, 10, 1)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 1, bias=False))
    if weights is not None:
        with torch.no_grad():
            for target, name in ((model[0].weight, "mlp_w1"), (model[0].bias, "mlp_b1"), (model[2].weight, "mlp_w2"),
                                 (model[2].bias, "mlp_b2"), (model[4].weight, "mlp_w_out")):
                target.copy_(torch.from_numpy(weights[name]).reshape(target.shape))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-4)

    def step(k: int):
        for group in opt.param_groups:
            group["lr"] = 0.1 * (2 * total - k) / total
        b = k % 80
        loss = torch.relu(1 - ys[b] * model(xs[b])).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step, model


def torch_run(steps: int) -> tuple[float, float]:
    """(seconds per step, last epoch's summed loss) of the same training in PyTorch eager."""
    import torch

    torch.manual_seed(0)
    step, _ = torch_training()
    losses, per_step = [], []
    for first in range(0, steps, 80):
        count = min(80, steps - first)
        start = time.perf_counter()
        for k in range(first, first + count):
            losses.append(step(k).item())
        per_step.append((time.perf_counter() - start) / count)
    return statistics.median(per_step), sum(losses[-80:])


HAND_WRITTEN_C = r"""
#include <stdint.h>
#define B 10  /* batch */
#define H 16  /* hidden width */

static float relu(float v) { return v > 0.0f ? v : 0.0f; }

/* Steps first .. first + count - 1 of the moons training: forward, hinge loss, backprop and SGD
   with weight decay, the learning rate falling from 0.2 towards 0.1 over `total` steps. */
void train(const float *xs, const float *ys, int64_t n_batches, int64_t first, int64_t count,
           int64_t total, float *w1, float *b1, float *w2, float *b2, float *w3, float *losses) {
  const float wd = 1e-4f;
  for (int64_t s = 0; s < count; ++s) {
    int64_t step = first + s;
    const float *x = xs + (step % n_batches) * B * 2, *y = ys + (step % n_batches) * B;
    float lr = 0.1f * (float)(2 * total - step) / (float)total;
    float h1[B][H], a1[B][H], h2[B][H], a2[B][H], out[B], dout[B], loss = 0.0f;
    for (int i = 0; i < B; ++i) {
      for (int j = 0; j < H; ++j) {
        h1[i][j] = b1[j] + w1[2 * j] * x[2 * i] + w1[2 * j + 1] * x[2 * i + 1];
        a1[i][j] = relu(h1[i][j]);
      }
      for (int j = 0; j < H; ++j) {
        float v = b2[j];
        for (int k = 0; k < H; ++k) v += w2[H * j + k] * a1[i][k];
        h2[i][j] = v;
        a2[i][j] = relu(v);
      }
      out[i] = 0.0f;
      for (int k = 0; k < H; ++k) out[i] += w3[k] * a2[i][k];
      float margin = 1.0f - y[i] * out[i];
      loss += relu(margin);
      dout[i] = margin > 0.0f ? -y[i] / B : 0.0f;
    }
    losses[s] = loss / B;
    float g1[H][2] = {{0}}, gb1[H] = {0}, g2[H][H] = {{0}}, gb2[H] = {0}, g3[H] = {0};
    for (int i = 0; i < B; ++i) {
      float dh2[H], dh1[H];
      for (int k = 0; k < H; ++k) {
        g3[k] += dout[i] * a2[i][k];
        dh2[k] = h2[i][k] > 0.0f ? dout[i] * w3[k] : 0.0f;
      }
      for (int k = 0; k < H; ++k) dh1[k] = 0.0f;
      for (int j = 0; j < H; ++j) {
        gb2[j] += dh2[j];
        for (int k = 0; k < H; ++k) {
          g2[j][k] += dh2[j] * a1[i][k];
          dh1[k] += dh2[j] * w2[H * j + k];
        }
      }
      for (int j = 0; j < H; ++j) {
        float d = h1[i][j] > 0.0f ? dh1[j] : 0.0f;
        gb1[j] += d;
        g1[j][0] += d * x[2 * i];
        g1[j][1] += d * x[2 * i + 1];
      }
    }
    for (int j = 0; j < H; ++j) {
      w1[2 * j] -= lr * (g1[j][0] + wd * w1[2 * j]);
      w1[2 * j + 1] -= lr * (g1[j][1] + wd * w1[2 * j + 1]);
      b1[j] -= lr * (gb1[j] + wd * b1[j]);
      b2[j] -= lr * (gb2[j] + wd * b2[j]);
      w3[j] -= lr * (g3[j] + wd * w3[j]);
      for (int k = 0; k < H; ++k) w2[H * j + k] -= lr * (g2[j][k] + wd * w2[H * j + k]);
    }
  }
}
"""


def hand_written_c_run(steps: int) -> tuple[float, float]:
    """(seconds per step, last epoch's summed loss) of ``HAND_WRITTEN_C``, Glorot-uniform weights
    and zero biases; raises ``OSError`` or ``subprocess.CalledProcessError`` without a C compiler."""
    import numpy as np

    from ocannl import data

    points, labels = data.moons(800, noise=0.1, seed=0)
    xs = np.ascontiguousarray(points, np.float32)
    ys = np.ascontiguousarray(labels, np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        source, library = Path(tmp) / "moons.c", Path(tmp) / "moons.so"
        source.write_text(HAND_WRITTEN_C)
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
                       check=True, capture_output=True)
        train = ctypes.CDLL(str(library)).train
    rng = np.random.default_rng(0)

    def glorot(fan_out: int, fan_in: int) -> np.ndarray:
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)

    params = [glorot(16, 2), np.zeros(16, np.float32), glorot(16, 16), np.zeros(16, np.float32), glorot(1, 16)]
    losses = np.zeros(80, np.float32)
    pointer = ctypes.c_void_p
    train.argtypes = [pointer, pointer, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64] + [pointer] * 6
    per_step, last = [], 0.0
    for first in range(0, steps, 80):
        count = min(80, steps - first)
        start = time.perf_counter()
        train(xs.ctypes.data, ys.ctypes.data, 80, first, count, 6400, *(p.ctypes.data for p in params),
              losses.ctypes.data)
        per_step.append((time.perf_counter() - start) / count)
        last = float(losses[:count].sum())
    return statistics.median(per_step), last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6400)
    parser.add_argument("--interp-steps", type=int, default=200)
    args = parser.parse_args()
    c_compile, c_step, c_loss = ocannl_run("c", args.steps)
    print(f"ocannl c, run():    compile {c_compile:.3f} s, {c_step * 1e6:8.2f} us/step, "
          f"total {c_compile + c_step * args.steps:.2f} s, last epoch loss {c_loss:.4f}")
    _, m_step, m_loss = ocannl_run("c", args.steps, many=True)
    print(f"ocannl c, run_many:                  {m_step * 1e6:8.2f} us/step, last epoch loss {m_loss:.4f}")
    overhead = run_overhead("c")
    print(f"ocannl c, run() of a one-store kernel: {overhead * 1e6:.2f} us per call; run() + ctx.get(loss) cost "
          f"{(c_step - m_step) * 1e6:.2f} us per step more than run_many")
    i_compile, i_step, _ = ocannl_run("interp", args.interp_steps)
    print(f"ocannl interp:      compile {i_compile:.3f} s, {i_step * 1e6:8.1f} us/step ({args.interp_steps} steps)")
    try:
        t_step, t_loss = torch_run(args.steps)
    except ImportError:
        print("PyTorch is not installed (pip install 'ocannl[bench]'): no comparison")
        return
    print(f"pytorch eager:      {t_step * 1e6:8.1f} us/step, last epoch loss {t_loss:.4f}")
    print(f"ratios per step: c with run() is {t_step / c_step:.1f}x faster than PyTorch eager, with run_many "
          f"{t_step / m_step:.1f}x; run() is {i_step / c_step:.0f}x faster than the interpreter")
    try:
        h_step, h_loss = hand_written_c_run(args.steps)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"no C compiler for the hand-written loop ({e})")
        return
    print(f"hand-written C:     {h_step * 1e6:8.2f} us/step, last epoch loss {h_loss:.4f}; run_many takes "
          f"{m_step / h_step:.2f}x its time per step, run() {c_step / h_step:.2f}x")


if __name__ == "__main__":
    main()
