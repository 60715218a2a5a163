"""Training: gradients, optimizers and loops over index symbols (docs/training.md).

``grad_update(loss)`` is one computation: the forward code, zeroing every gradient, ``loss.grad =
1``, then each op's backprop in reverse creation order (a tensor's gradient is complete before its
own backprop reads it, since every consumer was created after it). Optimizers are computations
too, written as accumulating assignments over each parameter, so ``ctx.compile(update, sgd)``
compiles forward, backward and the parameter update into one routine, compiled once and run many
times with different index bindings.

Optimizer state (momentum buffers, Adam's moments and step count) belongs to the parameter, not
to one call of an optimizer: ``adam_update`` called on two gradient updates that share a
parameter (the same model compiled for two batch sizes, say) reads and writes the same state
nodes, so alternating the two routines on one context continues one run of Adam instead of
starting a second from zero. ``save_checkpoint`` / ``load_checkpoint`` save that state with the
parameters, and with every other value the training step carries from one run to the next and
changes (:func:`updated_state`: dropout's run counters, batch norm's running statistics), so that
a run resumed from a checkpoint continues the saved one bit for bit (docs/training.md,
"Checkpoints"). The state of a float16 or bfloat16 parameter is float32, as its gradient is, and
its update is computed in float32 and rounded once into the parameter (docs/precisions.md,
"Training with 16-bit parameters").
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from ocannl import checkpoint, collector, session
from ocannl.errors import SessionError, ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import (Accum, Apply, Arg, Assignment, Block, Computation, Constant, Fetch, Init,
                                         nodes_written)
from ocannl.lowlevel.scalar_ops import Binop, Unop
from ocannl.lowlevel.tnode import TNode
from ocannl.shape.projections import Loop, derive_projections, identity_projections
from ocannl.tensor import Tensor, as_tensor, differentiating_only, finish_inference, subgraph


@dataclass
class GradUpdate:
    """Forward + backprop of ``loss``; ``params`` are the parameters it differentiates (not the
    integer or frozen ones, which take no gradient). ``grad_norm`` is set by
    :func:`clip_grad_norm`: the scalar node its computation stores the gradients' global norm in,
    before clipping (``ctx.get(update.grad_norm)`` reads it after a run)."""

    loss: Tensor
    params: list[Tensor]
    computation: Computation
    grad_norm: TNode | None = None

    def to_computation(self) -> Computation:
        """The computation, with the initializers as they are now: a parameter given a value
        with ``p.set`` (or ``load_checkpoint``) after ``grad_update`` starts from that value."""
        inits = tuple(init for u in subgraph(self.loss) if (init := u.initializer()) is not None)
        return Computation(self.computation.name, self.computation.body, inits)


def grad_update(loss: Tensor, params: Sequence[Tensor] | None = None) -> GradUpdate:
    """Forward code, zero the gradients, ``loss.grad = 1``, backprop in reverse topological
    order, as one computation (docs/training.md, "Tensors and their code"). ``params``: the
    parameters to differentiate, and so to update, when not every trainable one of the loss's
    graph; the others are frozen for this update only (docs/training.md, "Frozen parameters")."""
    with collector.paused():  # a deep network's backprop code is many objects (ocannl/collector.py)
        finish_inference()
        graph = subgraph(loss)
        if params is None:
            return _grad_update(loss, graph)
        with differentiating_only(graph, _chosen_params(loss, graph, params)):
            return _grad_update(loss, graph)


def _chosen_params(loss: Tensor, graph: list[Tensor], params: Sequence[Tensor]) -> list[Tensor]:
    """``params`` of ``grad_update(loss, params=)``, checked: trainable float parameters of
    ``loss``'s graph, at least one."""
    params = list(params)
    if not params:
        raise ValueError(f"grad_update: params= is empty: give the parameters of {loss.label!r} to differentiate")
    in_graph = {u.id for u in graph}
    for p in params:
        if not isinstance(p, Tensor) or not p.is_param:
            raise TypeError(f"grad_update: params= takes parameters (oc.param), got {getattr(p, 'label', p)!r}")
        if p.id not in in_graph:
            raise SessionError(f"grad_update: parameter {p.label!r} of params= is not in the graph of "
                               f"{loss.label!r}: the loss does not depend on it; pass the parameters it reads")
        if not p.requires_grad:
            why = "frozen (trainable=False)" if not p.trainable else f"of the integer precision {p.dtype.name}"
            raise SessionError(f"grad_update: parameter {p.label!r} of params= is {why}, so it takes no gradient")
    return params


def _grad_update(loss: Tensor, graph: list[Tensor]) -> GradUpdate:
    """The update of :func:`grad_update` for the parameters ``requires_grad`` counts now."""
    if not loss.requires_grad:
        frozen = [u.label for u in graph if u.is_param and not u.trainable]
        raise ShapeError(f"grad_update: {loss.label!r} does not depend on any parameter"
                         + (f" but frozen ones (trainable=False): {', '.join(frozen)}" if frozen else ""))
    forward = loss.to_computation()
    reached = _reached_by_gradient(loss, graph)
    differentiable = [u for u in graph if u.id in reached or (u.is_param and u.requires_grad)]
    zero = Block(tuple(Fetch(u.grad, Constant(0.0)) for u in differentiable), comment="zero grads")
    backprop = Block(tuple(a for u in reversed(graph) if u.id in reached and u.logic is not None
                           for a in u.backward_code()), comment=f"{loss.label} backprop")
    body = Block((forward.body, zero, Fetch(loss.grad, Constant(1.0)), backprop))
    params = [u for u in graph if u.is_param and u.requires_grad]  # integer and frozen parameters take none
    return GradUpdate(loss, params, Computation(f"{loss.label}_grad_update", body, forward.inits))


def _reached_by_gradient(loss: Tensor, graph: list[Tensor]) -> set[int]:
    """The ids of the tensors of ``graph`` (operands first) that a gradient from ``loss`` reaches:
    the loss, and the differentiable operands of a tensor reached, through its gradient rule. A
    tensor read only by operations without one (``oc.stop_gradient``, comparisons) is not
    reached: it gets no gradient node filled and no backprop code, which would only propagate
    zeros (the maximum a softmax subtracts would search its first maximum for nothing)."""
    reached = {loss.id}
    for u in reversed(graph):
        if u.id in reached and u.requires_grad and u.definition is not None and u.definition.gradient is not None:
            reached.update(o.id for o in u.operands if o.requires_grad)
    return reached


def clip_grad_norm(update: GradUpdate, max_norm: float) -> GradUpdate:
    """``update`` followed, in the same computation, by scaling its gradients so that their
    global L2 norm is at most ``max_norm``, as ``torch.nn.utils.clip_grad_norm_``: ``norm =
    sqrt(sum of every gradient's squares)``, each gradient multiplied in place by ``min(1,
    max_norm / (norm + 1e-6))``. Give the result to the optimizer (``sgd_update``,
    ``adam_update``) and compile both: the optimizer reads the clipped gradients, with no round
    trip to the host (docs/training.md, "Clipping gradients"). The norm is the returned update's
    ``grad_norm`` node, computed in the widest precision of the gradients."""
    if isinstance(max_norm, (bool, np.bool_)) or not isinstance(max_norm, numbers.Real) or not max_norm > 0:
        raise ValueError(f"clip_grad_norm: max_norm must be a positive number, got {max_norm!r}")
    if not isinstance(update, GradUpdate):
        raise TypeError(f"clip_grad_norm clips the gradients of a train.grad_update(...), got {type(update).__name__}")
    grads = [p.grad for p in update.params]
    precision = grads[0].dtype
    for g in grads[1:]:
        precision = dtypes.promote(precision, g.dtype)
    name = update.loss.label
    sum_sq = TNode(f"{name}_grad_sum_sq", dims=(), dtype=precision)
    norm = TNode(f"{name}_grad_norm", dims=(), dtype=precision)
    scale = TNode(f"{name}_grad_clip_scale", dims=(), dtype=precision)
    squares = [Fetch(sum_sq, Constant(0.0))] + [_add_squares(sum_sq, g) for g in grads]
    coefficient = Apply(Binop.DIV, (float(max_norm), Apply(Binop.ADD, (Arg(0), 1e-6))))
    clip = Block((*squares,
                  _set(norm, None, Apply(Unop.SQRT, (Arg(0),)), [sum_sq], [()]),
                  _set(scale, None, Apply(Binop.MIN, (1.0, coefficient)), [norm], [()]),
                  *(_set(g, Binop.MUL, Arg(0), [scale], [()]) for g in grads)),
                 comment=f"clip {name} gradients to norm {max_norm}")
    computation = update.computation
    return GradUpdate(update.loss, update.params,
                      Computation(computation.name, Block((computation.body, clip)), computation.inits), norm)


def _add_squares(target: TNode, g: TNode) -> Accum:
    """``target += sum(g * g)`` over every cell of ``g`` (``target`` a scalar): one loop per axis
    of ``g``, none of them indexing ``target``, so each is a reduction."""
    def projections():
        loops = [Loop(("axis", k), d) for k, d in enumerate(g.dims)]
        return derive_projections([[], loops], [(), g.dims], debug=f"{target.debug_name} += sum({g.debug_name}^2)")

    return Accum(target, Binop.ADD, Apply(Binop.MUL, (Arg(0), Arg(0))), (g,), projections)


_optimizer_state: dict[TNode, dict[str, TNode]] = {}
"""A parameter's value node -> its optimizer state nodes by name (``adam_m``, ``adam_v``,
``adam_step``, ``sgd_momentum``). Keyed by node, which hashes by identity; forgotten with the
session."""


@session.on_reset
def _forget_optimizer_state() -> None:
    _optimizer_state.clear()


def optimizer_state(p: Tensor) -> dict[str, TNode]:
    """The optimizer state nodes of parameter ``p`` made so far, by name (a copy)."""
    return dict(_optimizer_state.get(p.value, {}))


@dataclass
class _ParamUpdate:
    """An optimizer step of the parameters of ``update``: per-parameter assignments plus their
    state buffers' initializers. ``states`` lists the state nodes it reads, by parameter, for
    checkpoints."""

    name: str
    update: GradUpdate
    body: list[Assignment] = field(default_factory=list)
    inits: list[tuple[TNode, Init]] = field(default_factory=list)
    prelude: tuple[Assignment, ...] = ()
    states: list[tuple[Tensor, str, TNode]] = field(default_factory=list)
    hyperparameter: Tensor | None = None
    """A tensor hyper-parameter (``lr``), whose initializers are read when compiling, so that a
    ``lr.set(...)`` made after the step was built counts."""

    @property
    def params(self) -> list[Tensor]:
        """The parameters this step updates: those ``update`` differentiates."""
        return self.update.params

    def to_computation(self) -> Computation:
        state_inits = tuple((node, _initial_state(node)) for _, _, node in self.states)
        inits = tuple(self.inits)
        if self.hyperparameter is not None:
            inits += tuple(self.hyperparameter.to_computation().inits)
        return Computation(self.name, Block(self.prelude + tuple(self.body), comment=self.name),
                           inits + state_inits)

    def state(self, p: Tensor, what: str, dims: tuple[int, ...] | None = None,
              dtype: dtypes.DType | None = None) -> TNode:
        """``p``'s state node ``what``, zero before the first step: the node an earlier
        optimizer step made for ``p`` when there is one, so that every routine updating ``p``
        shares it; its zero initializer only runs on a context where it has no value yet. Its
        precision is ``p``'s compute type unless given: a float16 or bfloat16 parameter keeps
        float32 moments, which a 16-bit store would round on every step (Adam's ``v`` holds
        squares far below a bfloat16 weight's resolution)."""
        per_param = _optimizer_state.setdefault(p.value, {})
        node = per_param.get(what)
        if node is None:
            node = TNode(f"{p.label}_{what}", dims=p.dims if dims is None else dims,
                         dtype=(p.dtype.compute if p.dtype.is_float else p.dtype) if dtype is None else dtype)
            per_param[what] = node
        self.states.append((p, what, node))
        return node


def _initial_state(node: TNode) -> Init:
    """A state node's value on a context that has none yet: what ``load_checkpoint`` loaded for
    it, else zero."""
    loaded = _loaded_state.get(node)
    return loaded if loaded is not None else Fetch(node, Constant(0.0))


_loaded_state: dict[TNode, np.ndarray] = {}
"""State values ``load_checkpoint`` read without a context: contexts compiling the state later
start from them, as a tensor's ``set`` value reaches contexts compiling it later."""


@session.on_reset
def _forget_loaded_state() -> None:
    _loaded_state.clear()


def _scalar(x, what: str):
    """A learning rate or coefficient: a number (numpy scalars and ``oc.number`` included) stays
    a constant; a tensor (data, or an expression of ``step_n``) must be a scalar, computed inside
    the routine."""
    if isinstance(x, Tensor) and x.is_constant:
        x = x.data.item()
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{what} must be a number or a scalar tensor, got {x!r}")
    if isinstance(x, numbers.Real):
        return float(x), ()
    t = as_tensor(x)
    if t.dims not in ((), (1,)):
        raise ShapeError(f"{what} must be a scalar, got dims {t.dims}")
    return t, t.dims


def _set(target: TNode, accum: Binop | None, expr, operands: list, operand_dims: list) -> Accum:
    """``target <accum>= expr`` cell by cell, ``expr`` over ``operands`` (Arg(i) is operands[i])."""
    dims = target.dims
    used = sorted(_arg_indices(expr))
    renumber = {old: new for new, old in enumerate(used)}
    fn = Unop.ID if isinstance(expr, Arg) else _renumber(expr, renumber)
    rhs = tuple(operands[i].value if isinstance(operands[i], Tensor) else operands[i] for i in used)
    kept_dims = [operand_dims[i] for i in used]
    return Accum(target, accum, fn, rhs, lambda: identity_projections(dims, kept_dims), spec=".")


def _arg_indices(e) -> set[int]:
    if isinstance(e, Arg):
        return {e.index}
    return e.arg_indices() if isinstance(e, Apply) else set()


def _renumber(e, mapping: dict[int, int]):
    """``e`` with its operand indices renumbered (operands an expression does not use are
    dropped from the assignment)."""
    if isinstance(e, Arg):
        return Arg(mapping[e.index])
    if isinstance(e, Apply):
        return Apply(e.op, tuple(_renumber(x, mapping) for x in e.args))
    return e


def _with_decay(g: Arg, p: Arg, weight_decay: float):
    """``g + weight_decay * p`` (L2 regularization folded into the gradient)."""
    return g if not weight_decay else Apply(Binop.ADD, (g, Apply(Binop.MUL, (weight_decay, p))))


def sgd_update(update: GradUpdate, lr=0.1, momentum: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False) -> _ParamUpdate:
    """SGD as torch.optim.SGD (dampening 0): ``d = g + wd*p``; with momentum ``buf = m*buf + d``
    and ``d = buf`` (Nesterov: ``d = d + m*buf``); ``p -= lr * d``. ``lr`` is a number or a
    scalar tensor: data (``lr.set(...)`` changes it between runs) or an expression, e.g. of the
    ``step_n`` index symbol (docs/semantics.md, "Hyper-parameters given as tensors")."""
    if nesterov and not momentum:
        raise ValueError("sgd_update: nesterov=True needs momentum > 0")
    lr_val, lr_dims = _scalar(lr, "lr")
    step = _optimizer_step(update, "sgd_update", lr_val)
    for p in update.params:
        dims = p.dims
        g, pv = p.grad, p.value
        if not momentum:
            expr = Apply(Binop.MUL, (Arg(0), _with_decay(Arg(1), Arg(2), weight_decay)))
            step.body.append(_set(pv, Binop.SUB, expr, [lr_val, g, pv], [lr_dims, dims, dims]))
            continue
        buf = step.state(p, "sgd_momentum")
        new_buf = Apply(Binop.ADD, (Apply(Binop.MUL, (momentum, Arg(0))), _with_decay(Arg(1), Arg(2), weight_decay)))
        step.body.append(_set(buf, None, new_buf, [buf, g, pv], [dims, dims, dims]))
        if nesterov:
            d = Apply(Binop.ADD, (_with_decay(Arg(1), Arg(2), weight_decay), Apply(Binop.MUL, (momentum, Arg(3)))))
            expr = Apply(Binop.MUL, (Arg(0), d))
            step.body.append(_set(pv, Binop.SUB, expr, [lr_val, g, pv, buf], [lr_dims, dims, dims, dims]))
        else:
            step.body.append(_set(pv, Binop.SUB, Apply(Binop.MUL, (Arg(0), Arg(1))), [lr_val, buf], [lr_dims, dims]))
    return step


def adam_update(update: GradUpdate, lr=1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                weight_decay: float = 0.0, decoupled: bool = False) -> _ParamUpdate:
    """Adam as torch.optim.Adam: ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g*g``, then
    ``p -= (lr / (1 - b1**t)) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)`` with ``t`` the step count;
    ``weight_decay`` adds ``wd*p`` to ``g`` (L2), or with ``decoupled=True`` (AdamW) first
    scales ``p *= 1 - lr*wd``."""
    b1, b2 = betas
    lr_val, lr_dims = _scalar(lr, "lr")
    step = _optimizer_step(update, "adam_update", lr_val)
    l2 = 0.0 if decoupled else weight_decay
    for p in update.params:
        dims = p.dims
        g, pv = p.grad, p.value
        # The step count is per parameter (as torch.optim.Adam keeps it), so that routines
        # updating different subsets of the parameters each count only their own steps. Like the
        # moments it is in the parameter's compute type: a 16-bit count would stop growing after
        # 2048 (float16) or 256 (bfloat16) steps.
        t = step.state(p, "adam_step", dims=())
        step.body.append(Accum(t, Binop.ADD, Unop.ID, (1.0,), lambda: identity_projections((), [()]), spec="."))
        m, v = step.state(p, "adam_m"), step.state(p, "adam_v")
        grad = _with_decay(Arg(1), Arg(2), l2)
        step.body.append(_set(m, None, Apply(Binop.ADD, (Apply(Binop.MUL, (b1, Arg(0))), Apply(Binop.MUL, (1.0 - b1, grad)))),
                              [m, g, pv], [dims, dims, dims]))
        sq = Apply(Binop.MUL, (grad, grad))
        step.body.append(_set(v, None, Apply(Binop.ADD, (Apply(Binop.MUL, (b2, Arg(0))), Apply(Binop.MUL, (1.0 - b2, sq)))),
                              [v, g, pv], [dims, dims, dims]))
        # p -= (lr / (1 - b1**t)) * m / (sqrt(v) / sqrt(1 - b2**t) + eps). The two bias
        # corrections depend on the step count alone: each is computed once per step into a
        # scalar of the compute type, not once per cell (two pow calls per cell were a quarter of
        # a small transformer's training step on the C backend). The same operations in the same
        # order, rounded as the per-cell expression rounded them: the same bits.
        compute = p.dtype.compute
        step_size = TNode(f"{p.label}_adam_step_size", dims=lr_dims, dtype=compute)  # lr's: () or (1,)
        bc2 = TNode(f"{p.label}_adam_bc2", dims=(), dtype=compute)
        step.body.append(_set(step_size, None, Apply(Binop.DIV, (Arg(0), Apply(Binop.SUB, (
            1.0, Apply(Binop.POW, (b1, Arg(1))))))), [lr_val, t], [lr_dims, ()]))
        step.body.append(_set(bc2, None, Apply(Unop.SQRT, (Apply(Binop.SUB, (1.0, Apply(Binop.POW, (b2, Arg(0))))),)),
                              [t], [()]))
        # operands step_size, bc2, m, v
        denom = Apply(Binop.ADD, (Apply(Binop.DIV, (Apply(Unop.SQRT, (Arg(3),)), Arg(1))), eps))
        expr = Apply(Binop.DIV, (Apply(Binop.MUL, (Arg(0), Arg(2))), denom))
        if decoupled and weight_decay:
            # AdamW: p := p * (1 - lr*wd) - expr, one store, so that a 16-bit parameter rounds
            # once per step (a separate ``p *= 1 - lr*wd`` would round the decay away). m and v
            # do not read p here (no L2 term), so shrinking last is the same arithmetic as first.
            shrink = Apply(Binop.SUB, (1.0, Apply(Binop.MUL, (Arg(5), weight_decay))))
            expr = Apply(Binop.SUB, (Apply(Binop.MUL, (Arg(4), shrink)), expr))
            step.body.append(_set(pv, None, expr, [step_size, bc2, m, v, pv, lr_val],
                                  [lr_dims, (), dims, dims, dims, lr_dims]))
        else:
            step.body.append(_set(pv, Binop.SUB, expr, [step_size, bc2, m, v], [lr_dims, (), dims, dims]))
    return step


def _optimizer_step(update: GradUpdate, optimizer: str, lr) -> _ParamUpdate:
    """An empty step of ``optimizer`` over ``update``'s parameters, whose prelude computes the
    learning rate ``lr``: nothing for a number; for a tensor, its forward code, and the
    initializers of the data and parameters it reads, so that ``lr = oc.tensor(...)`` holds its
    value on every context the step runs on."""
    name = f"{update.loss.label}_{optimizer}"
    if not isinstance(lr, Tensor):
        return _ParamUpdate(name, update)
    return _ParamUpdate(name, update, prelude=(lr.to_computation().body,), hyperparameter=lr)


def updated_state(computations: Iterable[Computation]) -> list[TNode]:
    """The nodes ``computations`` carry from one run to the next and change: those they both
    initialize (so a value persists on the context) and write. Parameters, optimizer state,
    dropout's run counters and batch norm's running statistics are such nodes; data only read
    and intermediate results recomputed on every run are not. A run continues another exactly
    when it starts from these nodes' values, which is what a training checkpoint holds."""
    computations = list(computations)
    initialized = {node for c in computations for node, _ in c.inits}
    return list(dict.fromkeys(node for c in computations for node in nodes_written(c.body) if node in initialized))


def checkpoint_entries(optimizers) -> list[checkpoint.Entry]:
    """What a training checkpoint of ``optimizers`` (an optimizer step, or a list of them) holds:
    the :func:`updated_state` of each step compiled with its gradient update, and the parameters
    the step reads without updating them (frozen or integer ones: model state all the same, which
    a run resumed in a fresh process would otherwise start from their initializers). The
    parameters are named by their labels, each parameter's optimizer state ``<label>.<state>`` (``w1.adam_m``,
    ``w1.adam_step``, ``w1.sgd_momentum``), and the data tensors the forward code updates by their
    labels (dropout's run counter ``<dropout label>_draw_run``, batch norm's
    ``<label>_running_mean`` and ``<label>_running_var``)."""
    steps = [optimizers] if isinstance(optimizers, _ParamUpdate) else list(optimizers)
    for s in steps:
        if not isinstance(s, _ParamUpdate):
            raise TypeError(f"a training checkpoint takes the optimizer steps sgd_update/adam_update return, "
                            f"got {type(s).__name__}")
    optimizer_state_names = {node: f"{p.label}.{what}" for s in steps for p, what, node in s.states}
    owners = {u.value: u for s in steps for root in (s.update.loss, s.hyperparameter) if root is not None
              for u in subgraph(root)}
    found = []
    for node in updated_state(c for s in steps for c in (s.update.computation, s.to_computation())):
        if node in optimizer_state_names:
            found.append(checkpoint.Entry(optimizer_state_names[node], node, None, is_state=True))
        else:
            t = owners[node]
            found.append(checkpoint.Entry(t.label, node, t, is_state=not t.is_param))
    found += [checkpoint.Entry(t.label, node, t) for node, t in owners.items() if t.is_param]
    return checkpoint.unique(found, fix="give them distinct labels (a dropout's run counter is named after the "
                                        "dropout: nn.dropout(x, rate, label=...))")


def save_checkpoint(path, optimizers, *, context=None) -> None:
    """Save what a run of the steps ``optimizers`` needs to continue (:func:`checkpoint_entries`:
    parameters, optimizer state, dropout's run counters, batch norm's running statistics) to the
    safetensors file ``path``, atomically; from ``context`` when given, else as ``t.numpy()``
    reads them. Index bindings (``step_n`` in a learning-rate schedule) are the caller's: resume
    by binding the step to continue from."""
    checkpoint.write(path, checkpoint_entries(optimizers), context=context)


def load_checkpoint(path, optimizers, *, context=None, strict: bool = True,
                    allow_missing_state: bool = False) -> None:
    """Restore what :func:`save_checkpoint` saved, checking names, dims and precisions first
    (see ``oc.load``). Values go to ``context`` when given; else to every context holding them,
    and to contexts compiling these steps later. Training on from here gives the bits an
    uninterrupted run gives. A file lacking some state (saved before checkpoints held run
    counters and running statistics) is an error naming it; with ``allow_missing_state`` it
    loads, that state keeping its current value, with a ``CheckpointWarning``."""
    values = checkpoint.read(path, checkpoint_entries(optimizers), strict=strict,
                             allow_missing_state=allow_missing_state)
    if context is None:
        _loaded_state.update((e.node, v) for e, v in values if e.tensor is None)
    checkpoint.assign(values, context=context)


def sequential_loop(routine, **ranges: Iterable[int]) -> Iterable[dict[str, int]]:
    """Run ``routine`` once per combination of the given index-symbol values (the last keyword
    varies fastest), yielding the bindings after each run, without recompiling: the original's
    ``sequential_loop``. E.g. ``for b in sequential_loop(step, batch_n=range(80)): ...``."""
    names = list(ranges)
    values = [list(r) for r in ranges.values()]

    def rec(i: int, bound: dict[str, int]):
        if i == len(names):
            routine.run(**bound)
            yield dict(bound)
            return
        for v in values[i]:
            bound[names[i]] = v
            yield from rec(i + 1, bound)

    yield from rec(0, {})


def train_epochs(routine, epochs: int, batch_symbol: str, n_batches: int, step_symbol: str | None = None,
                 on_step: Callable[[int, int, int], None] | None = None) -> None:
    """``epochs`` passes over ``n_batches`` batches: binds ``batch_symbol`` to the batch and
    ``step_symbol`` (if given) to the global step count, runs ``routine``, and calls
    ``on_step(epoch, batch, step)`` after each run."""
    step = 0
    for epoch in range(epochs):
        for batch in range(n_batches):
            bindings = {batch_symbol: batch}
            if step_symbol is not None:
                bindings[step_symbol] = step
            routine.run(**bindings)
            if on_step is not None:
                on_step(epoch, batch, step)
            step += 1
