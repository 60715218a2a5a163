"""Moons training (the demo's 2-16-16-1 MLP, 6400 SGD steps) on the C backend vs PyTorch eager
on the CPU, and the interpreter for a few steps; all measured in this run.

    python bench/moons.py [--steps 6400] [--interp-steps 200]

Prints the per-step time of each and the ratios. PyTorch runs the same model, loss, learning-rate
schedule and weight decay, one step per batch of 10 (eager mode, default threads).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/


def ocannl_run(backend: str, steps: int) -> tuple[float, float, float]:
    """(compile seconds, seconds per step, last epoch's summed loss)."""
    import ocannl as oc
    from examples import moons

    oc.session.reset()
    oc.seed(0)
    ctx = oc.Context(backend)
    start = time.perf_counter()
    model, loss, update, sgd, _, n_batches = moons.build()
    routine = ctx.compile(update, sgd)
    compiled = time.perf_counter()
    losses = []
    for step in range(steps):
        routine.run(batch_n=step % n_batches, step_n=step)
        losses.append(float(ctx.get(loss.value)))
    done = time.perf_counter()
    last = sum(losses[-n_batches:]) if steps >= n_batches else float("nan")
    return compiled - start, (done - compiled) / steps, last


def torch_run(steps: int) -> tuple[float, float]:
    """(seconds per step, last epoch's summed loss) of the same training in PyTorch eager."""
    import torch

    from ocannl import data

    torch.manual_seed(0)
    points, labels = data.moons(800, noise=0.1, seed=0)
    xs = torch.from_numpy(points).reshape(80, 10, 2)
    ys = torch.from_numpy(labels).reshape(80, 10, 1)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 1, bias=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-4)
    total = 6400
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = 0.1 * (2 * total - step) / total
        b = step % 80
        loss = torch.relu(1 - ys[b] * model(xs[b])).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    per_step = (time.perf_counter() - start) / steps
    return per_step, sum(losses[-80:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6400)
    parser.add_argument("--interp-steps", type=int, default=200)
    args = parser.parse_args()
    c_compile, c_step, c_loss = ocannl_run("c", args.steps)
    print(f"ocannl c:      compile {c_compile:.3f} s, {c_step * 1e6:8.1f} us/step, "
          f"total {c_compile + c_step * args.steps:.2f} s, last epoch loss {c_loss:.4f}")
    i_compile, i_step, _ = ocannl_run("interp", args.interp_steps)
    print(f"ocannl interp: compile {i_compile:.3f} s, {i_step * 1e6:8.1f} us/step ({args.interp_steps} steps)")
    try:
        t_step, t_loss = torch_run(args.steps)
    except ImportError:
        print("PyTorch is not installed (pip install 'ocannl[bench]'): no comparison")
        return
    print(f"pytorch eager: {t_step * 1e6:8.1f} us/step, last epoch loss {t_loss:.4f}")
    print(f"ratios per step: c is {t_step / c_step:.1f}x faster than PyTorch eager, "
          f"{i_step / c_step:.0f}x faster than the interpreter")


if __name__ == "__main__":
    main()
