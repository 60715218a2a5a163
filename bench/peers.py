"""The peers of ``bench/cpu_steps.py``: its training steps written once against a small table of
operations, run in PyTorch (eager, and through ``torch.compile``) and in JAX (``jax.jit``).

Every side of a workload starts from an :class:`Experiment`: the initial parameters ocannl drew,
by their ocannl labels and in ocannl's layouts (a weight is ``[output, input]``, a convolution
kernel ``[out, kh, kw, in]``, attention's query weight ``[heads, d_k, d_model]``), the batches,
the model's constants (the position encoding) and the optimizer. A model reads the sizes it needs
from the parameters' shapes, so a peer cannot drift from the network ocannl built.

A model is one function of an operation table (:class:`TorchOps`, :class:`JaxOps`): each entry
is the framework's own fused operation (``F.linear``, ``F.layer_norm``,
``F.scaled_dot_product_attention``, ``jax.nn.dot_product_attention``...), as a user of that
framework would write it, so a peer is as fast as its framework makes that model. PyTorch trains
with ``torch.optim``; JAX has no optimizers of its own, so :func:`jax_stepper` writes SGD and
Adam with ``torch.optim``'s (and ``ocannl.train``'s) formulas. ``torch.compile`` compiles the
loss (forward; its backward comes compiled from AOTAutograd) and leaves the optimizer's step
eager, the usual way to compile a training step.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

EAGER, COMPILED, JAX = "PyTorch eager", "torch.compile", "JAX jit"
PEERS = (EAGER, COMPILED, JAX)
"""The peer columns of the table, in order."""

_PACKAGE = {EAGER: "torch", COMPILED: "torch", JAX: "jax"}


def missing(peer: str) -> str | None:
    """The package ``peer`` needs when it is not installed (the table then says so), else None."""
    package = _PACKAGE[peer]
    return None if importlib.util.find_spec(package) is not None else package


@dataclass
class Experiment:
    """What every side of a workload starts from (ocannl writes it, the peers' processes load it)."""

    model: str
    """A key of :data:`MODELS`."""
    optimizer: str
    """``"sgd"`` or ``"adam"``."""
    lr: float
    params: dict[str, np.ndarray]
    """The initial parameters by ocannl label, in ocannl's layouts."""
    arrays: dict[str, np.ndarray]
    """The batches (``inputs``: the first axis counts them; ``labels`` or ``targets``) and the
    model's constants."""

    def save(self, path: Path) -> None:
        meta = json.dumps({"model": self.model, "optimizer": self.optimizer, "lr": self.lr})
        np.savez(path, meta=np.array(meta), **{f"param/{k}": v for k, v in self.params.items()},
                 **{f"array/{k}": v for k, v in self.arrays.items()})

    @classmethod
    def load(cls, path: Path) -> Experiment:
        with np.load(path) as npz:
            meta = json.loads(str(npz["meta"]))
            params = {k.split("/", 1)[1]: npz[k] for k in npz.files if k.startswith("param/")}
            arrays = {k.split("/", 1)[1]: npz[k] for k in npz.files if k.startswith("array/")}
        return cls(meta["model"], meta["optimizer"], meta["lr"], params, arrays)


# ---------------------------------------------------------------------------------------------
# The operation tables: the same operation in each framework's idiom. Activations are channels
# last (NHWC) in both; PyTorch's convolutions permute to NCHW and back around the call.


class TorchOps:
    def __init__(self, torch):
        self.torch, self.F = torch, torch.nn.functional

    def asarray(self, a: np.ndarray):
        """A copy (the optimizer updates it in place); integer arrays (ids, class labels) become
        int64, the index type of PyTorch."""
        return self.torch.tensor(a.astype(np.int64) if a.dtype.kind in "iu" else a)

    def linear(self, x, w, b=None):
        """``x @ w.T + b`` over the last axis of ``x``, ``w`` of ocannl's ``[output..., input]``."""
        return self.F.linear(x, w.reshape(-1, x.shape[-1]), None if b is None else b.reshape(-1))

    def relu(self, x):
        return self.torch.relu(x)

    def embedding(self, table, ids):
        return self.F.embedding(ids, table)

    def layer_norm(self, x, gamma, beta, eps: float):
        return self.F.layer_norm(x, gamma.shape, gamma, beta, eps)

    def attention(self, q, k, v, causal: bool):
        """Scaled dot-product attention over ``[batch, seq, heads, d_k]``."""
        out = self.F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal)
        return out.transpose(1, 2)

    def conv2d_same(self, x, kernel, bias):
        nchw = x.permute(0, 3, 1, 2)
        out = self.F.conv2d(nchw, kernel.permute(0, 3, 1, 2), bias, padding=kernel.shape[1] // 2)
        return out.permute(0, 2, 3, 1)

    def max_pool2d(self, x):
        return self.F.max_pool2d(x.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)

    def cross_entropy(self, logits, labels):
        return self.F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class JaxOps:
    def __init__(self, jax):
        self.jax, self.jnp = jax, jax.numpy

    def asarray(self, a: np.ndarray):
        """A copy: a donated buffer must not be the experiment's array."""
        return self.jnp.array(a)

    def linear(self, x, w, b=None):
        y = x @ w.reshape(-1, x.shape[-1]).T
        return y if b is None else y + b.reshape(-1)

    def relu(self, x):
        return self.jax.nn.relu(x)

    def embedding(self, table, ids):
        return table[ids]

    def layer_norm(self, x, gamma, beta, eps: float):
        centered = x - x.mean(-1, keepdims=True)
        var = (centered * centered).mean(-1, keepdims=True)
        return gamma * (centered / self.jnp.sqrt(var + eps)) + beta

    def attention(self, q, k, v, causal: bool):
        return self.jax.nn.dot_product_attention(q, k, v, is_causal=causal)

    def conv2d_same(self, x, kernel, bias):
        out = self.jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "OHWI", "NHWC"))
        return out + bias

    def max_pool2d(self, x):
        return self.jax.lax.reduce_window(x, -self.jnp.inf, self.jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def cross_entropy(self, logits, labels):
        log_probs = self.jax.nn.log_softmax(logits, axis=-1)
        return -self.jnp.take_along_axis(log_probs, labels[..., None], axis=-1).mean()


# ---------------------------------------------------------------------------------------------
# The models: ``loss(ops, params, constants, inputs, labels_or_targets)``


def mlp(o, p, c, x, labels):
    """``nn.mlp``: relu layers ``mlp_w{i}``, ``mlp_b{i}``, then ``mlp_w_out`` without a bias."""
    h, i = x, 1
    while f"mlp_w{i}" in p:
        h = o.relu(o.linear(h, p[f"mlp_w{i}"], p[f"mlp_b{i}"]))
        i += 1
    return o.cross_entropy(o.linear(h, p["mlp_w_out"]), labels)


def cnn(o, p, c, x, labels):
    """``bench/cpu_steps.py``'s CNN: conv, relu, 2x2 max pool, conv, relu, linear."""
    h = o.relu(o.conv2d_same(x, p["conv1_kernel"], p["conv1_bias"]))
    h = o.relu(o.conv2d_same(o.max_pool2d(h), p["conv2_kernel"], p["conv2_bias"]))
    return o.cross_entropy(o.linear(h.reshape(h.shape[0], -1), p["fc_w"], p["fc_b"]), labels)


def block(o, x, w: dict, causal: bool, eps: float = 1e-5):
    """``nn.transformer_block``: ``h = x + attention(layer_norm(x))``, ``h + ff2(relu(ff1(layer_norm(h))))``;
    ``w`` names the weights: ``norm1``, ``norm2`` (gamma, beta), ``q``, ``k``, ``v``, ``o``,
    ``ff1``, ``ff2`` (weight, bias)."""
    heads, d_k, _ = w["q"].shape
    batch, seq, _ = x.shape
    a = o.layer_norm(x, *w["norm1"], eps)
    q, k, v = (o.linear(a, w[n]).reshape(batch, seq, heads, -1) for n in "qkv")
    h = x + o.linear(o.attention(q, k, v, causal).reshape(batch, seq, -1), w["o"])
    return h + o.linear(o.relu(o.linear(o.layer_norm(h, *w["norm2"], eps), *w["ff1"])), *w["ff2"])


def transformer(o, p, c, x, target):
    """``bench/cc_time.py``'s block (its own labels), mean-square loss against ``target``."""
    w = {"norm1": (p["ln1_gamma"], p["ln1_beta"]), "norm2": (p["ln2_gamma"], p["ln2_beta"]),
         **{n: p[f"mha_w_{n}"] for n in "qkvo"}, "ff1": (p["ff_w1"], p["ff_b1"]), "ff2": (p["ff_w2"], p["ff_b2"])}
    diff = block(o, x, w, causal=False) - target
    return (diff * diff).mean()


def transformer_block_weights(p: dict, label: str) -> dict:
    """The weights of ``nn.transformer_block(label=label)``, by the names :func:`block` reads."""
    return {"norm1": (p[f"{label}_norm1_gamma"], p[f"{label}_norm1_beta"]),
            "norm2": (p[f"{label}_norm2_gamma"], p[f"{label}_norm2_beta"]),
            **{n: p[f"{label}_attention_w_{n}"] for n in "qkvo"},
            **{f: (p[f"{label}_{f}_w"], p[f"{label}_{f}_b"]) for f in ("ff1", "ff2")}}


def gpt(o, p, c, ids, labels):
    """``examples/char_lm.py``'s ``CharLM``: embedding plus the sinusoidal position encoding, the
    causal blocks ``char_lm_block{i}``, a final layer norm, a linear head; cross-entropy."""
    h, i = o.embedding(p["char_lm_embed_table"], ids) + c["positions"], 0
    while f"char_lm_block{i}_ff1_w" in p:
        h = block(o, h, transformer_block_weights(p, f"char_lm_block{i}"), causal=True)
        i += 1
    h = o.layer_norm(h, p["char_lm_norm_gamma"], p["char_lm_norm_beta"], 1e-5)
    return o.cross_entropy(o.linear(h, p["char_lm_head_w"], p["char_lm_head_b"]), labels)


MODELS: dict[str, Callable] = {"mlp": mlp, "cnn": cnn, "transformer": transformer, "gpt": gpt}

CONSTANTS = ("positions",)
"""Arrays of an experiment that are part of the model, not of the batches."""


def _split(experiment: Experiment, asarray) -> tuple[dict, list, list]:
    """The model's constants, and the batches as per-batch arrays of the framework."""
    a = experiment.arrays
    targets = a["labels"] if "labels" in a else a["targets"]
    constants = {k: asarray(a[k]) for k in CONSTANTS if k in a}
    return constants, [asarray(x) for x in a["inputs"]], [asarray(t) for t in targets]


# ---------------------------------------------------------------------------------------------
# The training loops: ``steps(n)`` runs n steps and returns the last loss (the step count carries
# over between calls), as ``bench/cpu_steps.py``'s own side does.


def torch_stepper(experiment: Experiment, compiled: bool) -> Callable[[int], float]:
    import torch

    from bench.interp_throughput import torch_loop

    o = TorchOps(torch)
    params = {k: o.asarray(v).requires_grad_() for k, v in experiment.params.items()}
    constants, inputs, targets = _split(experiment, o.asarray)
    model = MODELS[experiment.model]

    def loss(params, x, t):
        return model(o, params, constants, x, t)

    loss = torch.compile(loss) if compiled else loss
    optimizer = (torch.optim.SGD if experiment.optimizer == "sgd" else torch.optim.Adam)(params.values(),
                                                                                      lr=experiment.lr)
    return torch_loop(optimizer, lambda step: loss(params, inputs[step % len(inputs)], targets[step % len(targets)]))


def jax_stepper(experiment: Experiment) -> Callable[[int], float]:
    import jax

    o = JaxOps(jax)
    jnp = jax.numpy
    params = {k: o.asarray(v) for k, v in experiment.params.items()}
    constants, inputs, targets = _split(experiment, o.asarray)
    model, lr = MODELS[experiment.model], experiment.lr

    def loss(params, x, t):
        return model(o, params, constants, x, t)

    if experiment.optimizer == "sgd":
        state = ()

        def update(p, g, state):
            return jax.tree.map(lambda p, g: p - lr * g, p, g), state
    else:
        b1, b2, eps = 0.9, 0.999, 1e-8
        state = (jnp.zeros((), jnp.float32), *(jax.tree.map(jnp.zeros_like, params) for _ in "mv"))

        def update(p, g, state):
            t, m, v = state
            t = t + 1
            m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
            v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
            step_size, bc2 = lr / (1 - b1**t), jnp.sqrt(1 - b2**t)
            return jax.tree.map(lambda p, m, v: p - step_size * m / (jnp.sqrt(v) / bc2 + eps), p, m, v), (t, m, v)

    def train_step(p, state, x, t):
        value, grads = jax.value_and_grad(loss)(p, x, t)
        p, state = update(p, grads, state)
        return p, state, value

    train_step = jax.jit(train_step, donate_argnums=(0, 1))
    current = [params, state, 0]

    def steps(n: int) -> float:
        p, state, count = current
        value = None
        for _ in range(n):
            p, state, value = train_step(p, state, inputs[count % len(inputs)], targets[count % len(targets)])
            count += 1
        current[:] = [p, state, count]
        return float(value)

    return steps


def load(peer: str) -> None:
    """Import ``peer``'s framework: a cold compile counts from the imported framework."""
    importlib.import_module(_PACKAGE[peer])


def stepper(peer: str, experiment: Experiment) -> Callable[[int], float]:
    """``steps(n)`` of ``experiment``'s training in ``peer``; nothing compiles before the first call."""
    if peer == JAX:
        return jax_stepper(experiment)
    return torch_stepper(experiment, compiled=peer == COMPILED)
