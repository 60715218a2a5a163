"""The half-moons classifier of the slides: a 2-16-16-1 relu MLP with a hinge loss.

Run with ``python -m examples.moons`` (``make demo``). Shapes are inferred: no weight states its
input dims, and the last weight learns its output dim from the labels.
"""

from __future__ import annotations

import ocannl as oc
from ocannl import data, nn

BATCH = 10
N_POINTS = 800


def build():
    points, labels = data.moons(N_POINTS, noise=0.1, seed=0)
    n_batches = N_POINTS // BATCH
    moons_flat = oc.tensor(data.batches(points, BATCH), batch=2, label="moons_flat")
    moons_classes = oc.tensor(data.batches(labels, BATCH), batch=2, label="moons_classes")
    batch_n = oc.IndexSymbol("batch_n", n_batches)
    x = moons_flat[batch_n]
    y = moons_classes[batch_n]
    model = nn.mlp(hid_dims=(16, 16), label="mlp")
    margin = oc.relu(1 - y * model(x))
    loss = margin.mean()
    return model, x, y, margin, loss


def main() -> None:
    model, x, y, margin, loss = build()
    print(oc.explain_shapes(loss))


if __name__ == "__main__":
    main()
