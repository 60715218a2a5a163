"""A 64-256-256-10 MLP on scikit-learn's digits (batch 64, softmax cross-entropy, SGD) on the C
backend vs the same model in PyTorch eager on the CPU, measured in this run.

    python bench/digits_mlp.py [--epochs 5]

Needs the ``bench`` extra (``pip install 'ocannl[bench]'``: torch, scikit-learn).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

BATCH = 64


def load():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    n = (len(x) // BATCH) * BATCH
    onehot = np.eye(10, dtype=np.float32)[y[:n]]
    return x[:n].reshape(-1, BATCH, 64), onehot.reshape(-1, BATCH, 10), y[:n].reshape(-1, BATCH)


def ocannl_train(xs, ys, epochs: int, backend: str = "c") -> tuple[float, float, float]:
    """(compile seconds, seconds per step, accuracy on the training set after training)."""
    import ocannl as oc
    from ocannl import nn, train

    oc.session.reset()
    oc.seed(0)
    ctx = oc.Context(backend)
    start = time.perf_counter()
    n_batches = xs.shape[0]
    batch_n = oc.IndexSymbol("batch_n", n_batches)
    x = oc.tensor(xs, batch=2, label="digits")[batch_n]
    y = oc.tensor(ys, batch=2, label="onehot")[batch_n]
    model = nn.mlp(hid_dims=(256, 256), label="digits_mlp")
    logits = model(x)
    probs = nn.softmax(logits)
    loss = (-(y * oc.log(probs + 1e-9)).sum(axes="output")).mean(label="loss")
    update = train.grad_update(loss)
    routine = ctx.compile(update, train.sgd_update(update, lr=0.1))
    compiled = time.perf_counter()
    steps = 0
    for _ in range(epochs):
        for b in range(n_batches):
            routine.run(batch_n=b)
            steps += 1
    done = time.perf_counter()
    pred = ctx.compile(logits)
    correct = 0
    for b in range(n_batches):
        pred.run(batch_n=b)
        correct += int((ctx.get(logits.value).argmax(-1) == ys[b].argmax(-1)).sum())
    return compiled - start, (done - compiled) / steps, correct / (n_batches * BATCH)


def torch_train(xs, labels, epochs: int) -> tuple[float, float]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10, bias=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tx, ty = torch.from_numpy(xs), torch.from_numpy(labels)
    steps = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for b in range(tx.shape[0]):
            loss = torch.nn.functional.cross_entropy(model(tx[b]), ty[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
    per_step = (time.perf_counter() - start) / steps
    with torch.no_grad():
        acc = float((model(tx.reshape(-1, 64)).argmax(-1) == ty.reshape(-1)).float().mean())
    return per_step, acc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    xs, onehot, labels = load()
    c_compile, c_step, c_acc = ocannl_train(xs, onehot, args.epochs)
    print(f"ocannl c:      compile {c_compile:.2f} s, {c_step * 1e3:7.3f} ms/step, train accuracy {c_acc:.3f}")
    t_step, t_acc = torch_train(xs, labels, args.epochs)
    print(f"pytorch eager: {t_step * 1e3:7.3f} ms/step, train accuracy {t_acc:.3f}")
    print(f"ratio per step: c is {t_step / c_step:.2f}x PyTorch eager's speed")


if __name__ == "__main__":
    main()
