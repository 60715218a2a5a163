"""The half-moons classifier of the slides: a 2-16-16-1 relu MLP, hinge loss, SGD.

Run with ``python -m examples.moons`` (``make demo``). 800 points, batch 10, 80 epochs of 80
batches = 6400 steps; SGD with weight decay 1e-4 and the learning rate
``0.1 * (2*steps - step_n) / steps`` (0.2 falling linearly towards 0.1), computed inside the
routine from the ``step_n`` index symbol. Shapes are inferred: no weight states its input dims,
and the last weight learns its output dim from the labels. The whole training step (forward,
backprop, SGD) is one routine, compiled once and run 6400 times with different bindings: an
epoch per ``run_many`` call, which runs its 80 steps in one call into the compiled code and
records the loss after each.

Prints a progress bar, the loss curve and the decision boundary, then each epoch's summed loss
(the sum over its 80 batches of the batch-mean hinge loss, the original's measure). The pictures
are drawn by plotext and tqdm, the ``plot`` extra (``pip install 'ocannl[plot]'``, which ``make
demo`` installs); training itself needs only the core package.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import ocannl as oc
from ocannl import data, nn, plot, train

BATCH = 10
N_POINTS = 800
EPOCHS = 80


def build(n_points: int = N_POINTS, batch: int = BATCH, epochs: int = EPOCHS):
    """The model, its loss and the training routine's computations (nothing is compiled)."""
    points, labels = data.moons(n_points, noise=0.1, seed=0)
    n_batches = n_points // batch
    steps = epochs * n_batches
    moons_flat = oc.tensor(data.batches(points, batch), batch=2, label="moons_flat")
    moons_classes = oc.tensor(data.batches(labels, batch), batch=2, label="moons_classes")
    batch_n = oc.IndexSymbol("batch_n", n_batches)
    step_n = oc.IndexSymbol("step_n", steps)
    x = moons_flat[batch_n]
    y = moons_classes[batch_n]
    model = nn.mlp(hid_dims=(16, 16), label="mlp")
    margin = oc.relu(1 - y * model(x))
    loss = margin.mean(label="loss")
    update = train.grad_update(loss)
    lr = 0.1 * (2 * steps - step_n) / steps
    sgd = train.sgd_update(update, lr=lr, weight_decay=1e-4)
    return model, loss, update, sgd, (points, labels), n_batches


def train_moons(ctx: oc.Context | None = None, epochs: int = EPOCHS, progress: bool = False,
                n_points: int = N_POINTS) -> dict:
    """Train; returns the per-epoch summed losses, the per-step losses, the model and timings."""
    oc.seed(0)
    ctx = ctx or oc.Context.auto()
    start = time.perf_counter()
    model, loss, update, sgd, dataset, n_batches = build(n_points=n_points, epochs=epochs)
    routine = ctx.compile(update, sgd)
    compiled = time.perf_counter()
    step_losses: list[float] = []
    bar = plot.progress(epochs * n_batches, label="training") if progress else None
    for epoch in range(epochs):
        first = epoch * n_batches
        losses = routine.run_many(batch_n=range(n_batches), step_n=range(first, first + n_batches), record=loss)
        step_losses.extend(losses.tolist())
        if bar is not None:
            bar.set_postfix(epoch_loss=f"{sum(step_losses[-n_batches:]):.4f}", refresh=False)
            bar.update(n_batches)
    if bar is not None:
        bar.close()
    done = time.perf_counter()
    epoch_losses = [sum(step_losses[e * n_batches:(e + 1) * n_batches]) for e in range(epochs)]
    return {"epoch_losses": epoch_losses, "step_losses": step_losses, "model": model, "ctx": ctx,
            "dataset": dataset, "compile_s": compiled - start, "train_s": done - compiled}


def predictor(model, ctx: oc.Context):
    """Scores of the trained model for a batch of points (for the decision-boundary plot)."""
    def predict(points: np.ndarray) -> np.ndarray:
        x = oc.tensor(points.astype(np.float32), batch=1)
        y = model(x)
        routine = ctx.compile(y)
        routine.run()
        return ctx.get(y.value)

    return predict


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--backend", default=None, help="interp, c, ... (default: the best available)")
    args = parser.parse_args(argv)
    ctx = oc.Context(args.backend) if args.backend else oc.Context.auto()
    print(f"Training the half-moons MLP (2-16-16-1) on the {ctx.backend_name} backend, "
          f"{args.epochs} epochs of {N_POINTS // BATCH} batches of {BATCH}.")
    result = train_moons(ctx, epochs=args.epochs, progress=True)
    print(f"compile {result['compile_s']:.2f} s, train {result['train_s']:.2f} s")
    drawing = time.perf_counter()
    # The summed loss per epoch, on a linear scale: per-step hinge losses are often exactly 0,
    # which a log scale cannot show, and 6400 noisy steps hide the trend in 70 columns.
    print(plot.loss_curve(result["epoch_losses"], title="summed hinge loss per epoch",
                          xlabel="epoch", log_y=False))
    points, labels = result["dataset"]
    print(plot.decision_boundary(predictor(result["model"], ctx), points, labels))
    print(f"plots drawn in {time.perf_counter() - drawing:.2f} s")
    print("Summed loss per epoch:")
    for e, loss in enumerate(result["epoch_losses"]):
        print(f"  epoch {e + 1:3d}: {loss:.6f}")
    final = result["epoch_losses"][-1]
    print(f"Last epoch's summed loss: {final:.6f} ({'< 0.1: converged' if final < 0.1 else 'not below 0.1'})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
