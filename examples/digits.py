"""A small convolutional network on scikit-learn's handwritten digits.

Run with ``python -m examples.digits``. The data are the 1797 8x8 grey-level digits that ship
inside scikit-learn (``load_digits``: nothing is downloaded), installed by the ``examples`` extra
(``pip install 'ocannl[examples]'``). Pixels (0-16) are scaled to [0, 1]; a fixed permutation
(``--seed``) holds out 20% of the images (359) as the test set.

The network is conv(3x3, 16) -> relu -> max-pool 2x2 -> conv(3x3, 32) -> relu -> linear(10), cross
entropy on one-hot labels, Adam. Shapes are inferred: the convolutions learn their input channels
and the linear layer its 4x4x32 inputs from use. The training step (forward, backprop, Adam) is
one routine compiled once; an epoch is one ``run_many`` call over the batches in a shuffled order
(the order depends only on the seed). The test accuracy comes from a second routine, the same
blocks applied to the whole test set at once, so it reads the trained parameters in place.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import ocannl as oc
from ocannl import data, nn, train
from ocannl.errors import OcannlError

BATCH = 32
EPOCHS = 30
LR = 3e-3
TEST_FRACTION = 0.2
CLASSES = 10


def load_digits(seed: int = 0, test_fraction: float = TEST_FRACTION):
    """``(train_images, train_labels, test_images, test_labels)``: images of shape ``(n, 8, 8, 1)``
    in [0, 1] (the channel last, as ``nn.conv2d`` reads it), integer labels."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as err:
        raise OcannlError("examples.digits needs scikit-learn for its bundled digits: "
                          "pip install 'ocannl[examples]'") from err
    bunch = sklearn_digits()
    images = (bunch.images / 16.0).astype(np.float32)[..., None]
    labels = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = int(round(len(images) * test_fraction))
    test, train_ = order[:n_test], order[n_test:]
    return images[train_], labels[train_], images[test], labels[test]


class DigitsCNN:
    """conv -> relu -> pool -> conv -> relu -> linear: a factory whose instance keeps its blocks, so
    the training and the evaluation graphs share one set of parameters."""

    def __init__(self, label: str = "digits"):
        self.conv1 = nn.conv2d(16, kernel_size=3, label=f"{label}_conv1")
        self.conv2 = nn.conv2d(32, kernel_size=3, label=f"{label}_conv2")
        self.head = nn.linear(CLASSES, label=f"{label}_head")

    @property
    def params(self) -> list[oc.Tensor]:
        return [*self.conv1.params, *self.conv2.params, *self.head.params]

    def __call__(self, images: oc.Tensor) -> oc.Tensor:
        h = nn.max_pool2d(oc.relu(self.conv1(images)), stride=2, window_size=2)
        return self.head(oc.relu(self.conv2(h)))


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits.reshape(len(labels), -1), axis=1) == labels))


def train_digits(ctx: oc.Context | None = None, epochs: int = EPOCHS, batch: int = BATCH, lr: float = LR,
                 n_train: int | None = None, seed: int = 0, log=None) -> dict:
    """Train the CNN; returns the per-epoch mean losses, the test accuracy, the model and timings.

    ``n_train`` keeps the first that many training images (rounded down to whole batches), for
    quick runs; the test set is always the full held-out 359."""
    oc.seed(seed)
    ctx = ctx or oc.Context.auto()
    x_train, y_train, x_test, y_test = load_digits(seed)
    n = len(x_train) if n_train is None else min(n_train, len(x_train))
    n_batches = n // batch
    if n_batches == 0:
        raise OcannlError(f"examples.digits: {n} training images make no batch of {batch}")
    x_train, y_train = x_train[:n_batches * batch], y_train[:n_batches * batch]
    onehot = np.eye(CLASSES, dtype=np.float32)

    start = time.perf_counter()
    batch_n = oc.IndexSymbol("batch_n", n_batches)
    images = oc.tensor(data.batches(x_train, batch), batch=2, label="digit_images")[batch_n]
    targets = oc.tensor(data.batches(onehot[y_train], batch), batch=2, label="digit_targets")[batch_n]
    model = DigitsCNN()
    loss = nn.cross_entropy(model(images), targets, label="loss")
    update = train.grad_update(loss)
    step = ctx.compile(update, train.adam_update(update, lr=lr))
    test_logits = model(oc.tensor(x_test, batch=1, label="digit_test_images"))
    evaluate = ctx.compile(test_logits)
    compiled = time.perf_counter()

    order_rng = np.random.default_rng(seed + 1)
    epoch_losses: list[float] = []
    for epoch in range(epochs):
        losses = step.run_many(batch_n=order_rng.permutation(n_batches).tolist(), record=loss)
        epoch_losses.append(float(np.mean(losses)))
        if log is not None:
            log(f"epoch {epoch + 1:3d}: mean loss {epoch_losses[-1]:.4f}")
    trained = time.perf_counter()
    evaluate.run()
    test_accuracy = accuracy(ctx.get(test_logits.value), y_test)
    return {"epoch_losses": epoch_losses, "test_accuracy": test_accuracy, "model": model, "ctx": ctx,
            "n_train": len(x_train), "n_test": len(x_test), "compile_s": compiled - start,
            "train_s": trained - compiled}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default=None, help="interp, c, ... (default: the best available)")
    args = parser.parse_args(argv)
    ctx = oc.Context(args.backend) if args.backend else oc.Context.auto()
    print(f"Training the digits CNN on the {ctx.backend_name} backend: {args.epochs} epochs, batch {args.batch}, "
          f"Adam lr {args.lr}.")
    result = train_digits(ctx, epochs=args.epochs, batch=args.batch, lr=args.lr, seed=args.seed, log=print)
    print(f"compile {result['compile_s']:.2f} s, train {result['train_s']:.2f} s "
          f"({result['n_train']} training images)")
    print(f"test accuracy {result['test_accuracy']:.4f} on {result['n_test']} held-out images")


if __name__ == "__main__":
    main()
