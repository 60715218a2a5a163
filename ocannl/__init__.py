"""ocannl: shape-inferred tensors, reverse-mode autodiff, a two-level IR and several backends.

The public API (docs/design.md, "Public API") is re-exported here: ``import ocannl as oc``.
"""

from ocannl import cd, errors, init
from ocannl.backends.context import Context
from ocannl.checkpoint import load, save
from ocannl.explain import explain_shapes
from ocannl.init import seed
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.ops import (DimRef, abs, add, argmax, argmin, compose, concat, cos, deinterleave_even, deinterleave_odd, div,
                        einmax, einsum, eq, erf, exp, exp2, fma, gt, interleave, stack, take,
                        log, log2, logsumexp, lt, max, maximum, mean, minimum, mul, ne, neg, not_, outer_sum,
                        pow, recip, recip_sqrt, relu, sat01, sigmoid, sin, slice_batch, sqrt, sub,
                        sum, tanh, threefry4x32, tropical, where)
from ocannl.ops import flatten, permute, reshape, transpose, unflatten
from ocannl.ops import stop_gradient
from ocannl.tensor import Tensor, number, param, tensor

__all__ = [
    "cd", "errors", "init", "seed", "Context", "explain_shapes", "IndexSymbol", "Tensor", "tensor", "param", "number", "DimRef",
    "abs", "add", "compose", "cos", "div", "einmax", "einsum", "eq", "erf", "exp", "exp2", "fma", "gt",
    "log", "log2", "logsumexp", "lt", "max", "maximum", "mean", "minimum", "mul", "ne", "neg", "not_",
    "outer_sum", "pow", "recip", "recip_sqrt", "relu", "sat01", "sigmoid", "sin", "slice_batch",
    "sqrt", "sub", "sum", "tanh", "tropical", "where", "concat", "stack", "interleave",
    "deinterleave_even", "deinterleave_odd", "take", "save", "load", "threefry4x32",
    "argmax", "argmin", "reshape", "flatten", "unflatten", "permute", "transpose",
    "stop_gradient",
]
