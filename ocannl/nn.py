"""Building blocks. Blocks with parameters are factories whose instance keeps its params
(``m = nn.mlp(hid_dims=(16, 16), label="mlp"); y = m(x)``); parameter-free blocks are functions."""

from __future__ import annotations

from typing import Sequence

from ocannl import ops
from ocannl.tensor import Tensor, param


class mlp:  # noqa: N801 - a factory named as the catalog names it
    """A multi-layer perceptron: ``relu(w_i @ h + b_i)`` per hidden layer, then ``w_out @ h``
    (no output bias, as the original ``mlp``). Input dims of every weight and the output dims of
    ``w_out`` are inferred from use."""

    def __init__(self, hid_dims: Sequence[int], label: str = "mlp"):
        self.label = label
        self.layers = [
            (param(f"{label}_w{i + 1}", output=d), param(f"{label}_b{i + 1}", output=d, init=0.0))
            for i, d in enumerate(hid_dims)
        ]
        self.w_out = param(f"{label}_w_out")

    @property
    def params(self) -> list[Tensor]:
        return [p for layer in self.layers for p in layer] + [self.w_out]

    def __call__(self, x: Tensor) -> Tensor:
        h = x
        for w, b in self.layers:
            h = ops.relu(w @ h + b)
        return self.w_out @ h
