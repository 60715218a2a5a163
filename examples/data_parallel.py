"""Data-parallel training of the half-moons MLP: the same global batches for any number of replicas.

``python -m examples.data_parallel --nproc N`` starts N worker processes (gloo on the CPU, NCCL
on GPUs), each owning ``--contexts K`` contexts (default 1); ``torchrun --nproc-per-node N
examples/data_parallel.py`` starts them instead, on one machine or several. Every global batch of
40 points is split evenly between the N*K replicas; each computes the gradient of its slice's mean
hinge loss, the gradients are averaged (``ocannl.distributed``), and one SGD step (momentum 0.9,
weight decay 1e-4, the moons demo's falling learning rate) updates every replica alike. Since the
average of the slices' gradients is the whole batch's gradient, the run follows the one-process
run up to float rounding, whatever N and K.

Prints the mean loss of every epoch, then as its last line ``params_sq <float>``: the sum of the
squares of all parameters after training, to compare runs with different N.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import ocannl as oc
from ocannl import data, distributed, nn, train

GLOBAL_BATCH = 40
N_POINTS = 800
EPOCHS = 10


def run_training(backend: str | None = None, contexts: int = 1, epochs: int = EPOCHS,
                 n_points: int = N_POINTS, verbose: bool = True) -> float:
    """Train on this process's ``contexts`` replicas (with every process of the process group, if
    there is one); returns the sum of squares of the parameters, the same bits on every replica."""
    oc.seed(0)
    points, labels = data.moons(n_points, noise=0.1, seed=0)
    all_xs = data.batches(points, GLOBAL_BATCH)
    all_ys = data.batches(labels, GLOBAL_BATCH)
    n_batches = all_xs.shape[0]
    steps = epochs * n_batches
    replicas = distributed.world_size() * contexts
    xs = oc.tensor(distributed.shard(all_xs, 0, replicas), batch=2, label="moons_flat")
    ys = oc.tensor(distributed.shard(all_ys, 0, replicas), batch=2, label="moons_classes")
    batch_n = oc.IndexSymbol("batch_n", n_batches)
    step_n = oc.IndexSymbol("step_n", steps)
    model = nn.mlp(hid_dims=(16, 16), label="mlp")
    loss = oc.relu(1 - ys[batch_n] * model(xs[batch_n])).mean(label="loss")
    update = train.grad_update(loss)
    sgd = train.sgd_update(update, lr=0.02 * (2 * steps - step_n) / steps, momentum=0.9, weight_decay=1e-4)

    ctxs = [oc.Context(backend) if backend else oc.Context.auto() for _ in range(contexts)]
    dp = distributed.DataParallel(update, sgd, ctxs)
    for ctx in ctxs:
        ctx.set(xs, distributed.shard(all_xs, dp.replica_index(ctx), dp.replicas))
        ctx.set(ys, distributed.shard(all_ys, dp.replica_index(ctx), dp.replicas))
    talk = verbose and dp.rank == 0
    if talk:
        print(f"{dp.replicas} replica(s) ({dp.world_size} process(es) x {contexts} {ctxs[0].backend_name} "
              f"context(s)), {GLOBAL_BATCH // dp.replicas} of each global batch of {GLOBAL_BATCH} per replica")
    for epoch in range(epochs):
        total = 0.0
        for b in range(n_batches):
            dp.step(batch_n=b, step_n=epoch * n_batches + b)
            total += dp.mean(loss)
        if talk:
            print(f"epoch {epoch + 1:3d}: mean loss {total / n_batches:.6f}")
    dp.check_replicas()
    return float(sum(np.sum(np.asarray(dp.owner.get(p), dtype=np.float64) ** 2) for p in dp.params))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=1, help="worker processes to start (ignored under torchrun)")
    parser.add_argument("--contexts", type=int, default=1, help="contexts (replicas) per process")
    parser.add_argument("--backend", default=None, help="interp, c, triton, ... (default: the best available)")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    args = parser.parse_args(argv)
    config = (args.backend, args.contexts, args.epochs)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun: this is one worker
        distributed.init_process_group()
        rank = distributed.rank()
        try:
            params_sq = run_training(*config)
        finally:
            import torch.distributed

            torch.distributed.destroy_process_group()
        if rank == 0:
            print(f"params_sq {params_sq!r}")
        return
    if args.nproc == 1:
        params_sq = run_training(*config)
    else:
        params_sq = distributed.launch(run_training, args.nproc, *config)[0]
    sys.stdout.flush()
    print(f"params_sq {params_sq!r}")


if __name__ == "__main__":
    main()
