"""Tensors: the nodes of the user's graph, each with an inferred shape and the op that made it.

A :class:`Tensor` is a leaf (data from ``oc.tensor``, a number, a parameter ``oc.param``, an
embedded index symbol) or the result of an operation over operand tensors, which keeps the
operation's definition (an ``OpDef`` of the catalog, ``ops.py``): its forward and backprop code
come from there. Building an operation states its shape logic to the global solver at once, so
``t.shape`` shows everything known so far (``?`` for a dim not known yet); ``t.dims`` finalizes
inference (defaults, closing rows) and returns the concrete dims in memory order (batch, output,
input).

Operators mirror numpy: ``+ - * / **`` and comparisons are pointwise with broadcasting (Python
numbers become scalar constants), ``@`` is compose (a's input axes contract with b's output axes).
They call the catalog's functions, which ``ops.py`` registers here (:func:`register_catalog`) when
it is imported: the catalog builds on this module, never the other way round.
"""

from __future__ import annotations

import contextlib
import keyword
import numbers
import operator
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ocannl import config, session
from ocannl.backends.context import default_context
from ocannl.backends.session_state import session_state
from ocannl.errors import IndexBindingError, SessionError, ShapeError
from ocannl.init import init_code
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import Assignment, Block, Computation, EmbedSymbol, Fetch
from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import IndexSymbol, Projections
from ocannl.lowlevel.tnode import TNode, mark_materialized, mark_virtual
from ocannl.shape import solver as solver_mod
from ocannl.shape.logic import ShapeLogic
from ocannl.shape.projections import derive_projections
from ocannl.shape.shape import KINDS, Row, Shape, format_rows
from ocannl.shape.solver import Origin

if TYPE_CHECKING:
    from ocannl.ops import OpDef

_tensor_ids = session.Counter()


class ShapeView:
    """What ``t.shape`` returns: the rows as tuples, as far as they are known.

    A known dim is an int, an unknown one ``None``; an open row (more axes may come) shows
    ``...`` (``Ellipsis``) where axes may still be inserted. Once inferred, every row is a tuple of
    ints."""

    __slots__ = ("_shape",)

    def __init__(self, shape: Shape):
        self._shape = shape

    @staticmethod
    def _row(row: Row) -> tuple:
        def dim(d):
            return d if isinstance(d, int) else None

        out = [dim(d) for d in row.beg]
        if row.var is not None:
            out.append(...)
        return tuple(out + [dim(d) for d in row.end])

    @property
    def batch(self) -> tuple:
        return self._row(self._shape.batch)

    @property
    def output(self) -> tuple:
        return self._row(self._shape.output)

    @property
    def input(self) -> tuple:
        return self._row(self._shape.input)

    def __str__(self) -> str:
        return format_rows(self._shape.batch, self._shape.output, self._shape.input)

    def __repr__(self) -> str:
        return f"<shape {self}>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShapeView):
            return (self.batch, self.output, self.input) == (other.batch, other.output, other.input)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


_OPERATORS: dict[str, Callable[..., "Tensor"]] = {}
"""The catalog's functions behind Tensor's operators, by name (``add`` for ``a + b``)."""

_METHODS: dict[str, Callable[..., "Tensor"]] = {}
"""The catalog's functions that are also tensor methods (``t.relu()``, ``t.sum(axes="batch")``)."""


def register_catalog(operators: Mapping[str, Callable[..., "Tensor"]],
                     methods: Mapping[str, Callable[..., "Tensor"]]) -> None:
    """Called by the op catalog (``ops.py``) as it is imported, which ``import ocannl`` does
    before any tensor exists: the functions Tensor's operators and methods call."""
    _OPERATORS.update(operators)
    _METHODS.update(methods)


def _operator(name: str, reflected: bool = False) -> Callable[["Tensor", Any], "Tensor"]:
    """A binary operator of Tensor calling the catalog's function ``name``; ``reflected`` for
    the right-hand form (``1 - t`` is ``t.__rsub__(1)``, i.e. ``sub(1, t)``)."""
    if reflected:
        return lambda self, other: _OPERATORS[name](other, self)
    return lambda self, other: _OPERATORS[name](self, other)


class Tensor:
    """A node of the tensor graph. See the module docstring."""

    def __init__(self, *, op: str, label: str, shape: Shape, operands: Sequence["Tensor"] = (),
                 logic: ShapeLogic | None = None, data: np.ndarray | None = None,
                 init: Any = None, symbol: IndexSymbol | None = None, attrs: dict | None = None,
                 source: str = "", dtype: DType = dtypes.DEFAULT, definition: OpDef | None = None):
        self.id = next(_tensor_ids)
        self.op = op
        self.definition = definition  # the operation that computes this tensor; None for a leaf
        self.label = label
        self._shape = shape
        self.operands = tuple(operands)
        self.logic = logic
        self.data = data
        self.init = init
        self.symbol = symbol
        self.attrs = attrs or {}
        self.source = source
        self.dtype = dtype
        self._projections: Projections | None = None
        self._value: TNode | None = None
        self._host_value: np.ndarray | None = None
        self._requires_grad: bool | None = None
        self._grad: GradNode | None = None

    # -- shapes --------------------------------------------------------------------------------

    @property
    def is_param(self) -> bool:
        return self._shape.is_param

    @property
    def trainable(self) -> bool:
        """A parameter that training updates: every parameter unless made with
        ``oc.param(..., trainable=False)`` (docs/training.md, "Frozen parameters"). A frozen one
        is read like data: it gets no gradient node, so the optimizers leave it unchanged."""
        return self.is_param and self.attrs.get("trainable", True)

    @property
    def shape(self) -> ShapeView:
        solver_mod.current().resolve_shape(self._shape)
        return ShapeView(self._shape)

    @property
    def dims(self) -> tuple[int, ...]:
        """The concrete dims in memory order (batch, output, input); finalizes shape inference."""
        finish_inference()
        if not self._shape.is_concrete():
            kind = "output" if not self._shape.output.is_concrete() else "input"
            raise ShapeError(f"cannot infer the {kind} dims of parameter {self.label!r}: no operation "
                             f"uses it yet; use it first, or specify {kind}=... when creating it")
        return self._shape.dims()

    @property
    def captured(self) -> dict:
        """Dims captured by name in this tensor's einsum (``capture=[...]``): name -> DimRef."""
        return self.attrs.get("captured", {})

    def projections(self) -> Projections:
        """The loops of the op that computes this tensor (finalizes shape inference)."""
        if self.logic is None:
            raise SessionError(f"tensor {self.label!r} is a leaf ({self.op}): it has no projections")
        if self._projections is None:
            finish_inference()
            s = solver_mod.current()
            operand_shapes = [o._shape for o in self.operands]
            slots = self.logic.layout(self._shape, operand_shapes, s)
            dims = [self._shape.dims()] + [sh.dims() for sh in operand_shapes]
            self._projections = derive_projections(slots, dims, debug=f"{self.op} {self.label}")
        return self._projections

    # -- values --------------------------------------------------------------------------------

    @property
    def value(self) -> TNode:
        """The buffer holding this tensor's value (its dims are this tensor's inferred dims)."""
        if self._value is None:
            self._value = TNode(self.label, dims=lambda: self.dims, dtype=self.dtype)
            if self.logic is not None:
                # An intermediate result: the optimizer may inline it where it is read, unless
                # the host reads it (t.numpy() recomputes it then) or ``t.materialize()`` asks.
                mark_virtual(self._value)
        return self._value

    def materialize(self) -> "Tensor":
        """Keep this tensor's value in a buffer in routines compiled from now on, so the host can
        read what a training step computed (intermediates are inlined by default)."""
        mark_materialized(self.value)
        return self

    def retain_grad(self) -> "Tensor":
        """Keep this tensor's gradient in a buffer in routines compiled from now on, so that
        ``t.grad.numpy()`` can read it, as PyTorch's ``retain_grad``. A parameter's gradient is
        always kept; an intermediate result's is inlined where the backward pass uses it, as the
        tensor's value is (it never exists as a whole otherwise)."""
        mark_materialized(self.grad)
        return self

    @property
    def requires_grad(self) -> bool:
        """Float trainable parameters, and float results of differentiable ops with a
        differentiable operand. Data, constants, index embeddings, comparisons, frozen parameters
        and integer tensors (an int32 parameter included, as PyTorch refuses gradients to
        integers) get no gradient node."""
        if self._requires_grad is None:
            # Operands first, in creation order, without recursion: a chain of thousands of ops
            # must not exhaust the Python stack.
            _derive_requires_grad(subgraph(self, stop=lambda v: v._requires_grad is not None), lambda p: p.trainable)
        return self._requires_grad

    @property
    def grad(self) -> TNode:
        """The buffer of this tensor's gradient (``w.grad.numpy()`` reads it)."""
        if not self.requires_grad:
            frozen = self.is_param and not self.trainable
            why = "a frozen parameter (trainable=False)" if frozen else "not differentiable"
            raise SessionError(f"tensor {self.label!r} ({self.op}) is {why}: it has no gradient")
        if self._grad is None:
            self._grad = GradNode(self)
        return self._grad

    @property
    def is_constant(self) -> bool:
        """A number: inlined into the code that reads it, it has no buffer."""
        return self.op == "number"

    def forward_code(self) -> Assignment:
        """This op's own forward assignment, from its definition; an embedded index symbol reads
        the symbol's value."""
        if self.op == "embed_index":
            return Fetch(self.value, EmbedSymbol(self.symbol))  # type: ignore[arg-type]
        if self.definition is None:
            raise SessionError(f"tensor {self.label!r} is a leaf ({self.op}): it has no forward code")
        return self.definition.forward(self)

    def backward_code(self) -> list[Assignment]:
        """The assignments adding this tensor's gradient into its operands' gradients, from its
        op's definition (none for a leaf or an op without a gradient)."""
        if not self.requires_grad or self.definition is None or self.definition.gradient is None:
            return []
        return self.definition.gradient(self)

    def to_computation(self) -> Computation:
        """The forward code of this tensor and everything it is computed from, in creation order
        (operands before results), with the initializers of its parameters and data."""
        finish_inference()
        graph = subgraph(self)
        body = Block(tuple(u.forward_code() for u in graph if u.logic is not None or u.op == "embed_index"),
                     comment=f"{self.label} forward")
        inits = tuple(init for u in graph if (init := u.initializer()) is not None)
        return Computation(f"{self.label}_fwd", body, inits)

    def initializer(self) -> tuple[TNode, Any] | None:
        """How a leaf gets its value before the first run: host data (an array) or init code."""
        if self._host_value is not None:
            return (self.value, self._host_value)
        if self.op == "tensor":
            return (self.value, self.data)
        if self.is_param:
            return (self.value, init_code(self))
        return None

    def numpy(self, /, **bindings: int) -> np.ndarray:
        """The value as a numpy array of shape ``t.dims``.

        Without arguments, the value the last routine computing this tensor stored. When no
        routine stored it (none ran yet, or the optimizer computed it inline: intermediates are
        not stored unless ``t.materialize()`` asked), its forward code is compiled and run where
        its parameters live (else on the default context), from their current values.
        ``bindings`` bind the index symbols that forward code reads (``pred.numpy(batch_n=3)``
        after training on ``xs[batch_n]``); given bindings, the value is always recomputed."""
        if self.is_constant:
            self._check_numpy_bindings(set(), bindings)
            return np.full(self.dims, self.data, dtype=self.dtype.storage)

        ctx = session_state.last_writer(self.value)
        stored = ctx is not None and ctx.has_value(self.value)
        if not stored:
            holders = (c for u in reversed(subgraph(self)) if u.is_param
                       for c in session_state.contexts_holding(u.value))
            ctx = next(holders, None) or default_context()
        if bindings or not stored:
            routine = ctx.compile(self)
            self._check_numpy_bindings({s.name for s in routine.ir.static_symbols}, bindings)
            routine.run(**bindings)
        return ctx.get(self.value)

    def _check_numpy_bindings(self, reads: set[str], bindings: dict[str, int]) -> None:
        """The index symbols ``t.numpy(...)`` binds are exactly those the forward code reads; the
        error says what to pass, or how to keep the value a training step computed."""
        unknown = sorted(set(bindings) - reads)
        if unknown:
            raise IndexBindingError(
                f"{self.label!r}.numpy: computing {self.label!r} reads no index symbol named "
                f"{', '.join(unknown)} (it reads: {', '.join(sorted(reads)) or 'none'})")
        missing = sorted(reads - set(bindings))
        if missing:
            example = ", ".join(f"{n}=0" if n.isidentifier() and not keyword.iskeyword(n) else f"**{{{n!r}: 0}}"
                                for n in missing)
            raise IndexBindingError(
                f"tensor {self.label!r} is not stored on any context (a routine computed it inline, or none "
                f"ran), and computing it reads index symbol(s) {', '.join(missing)}: pass them, "
                f"t.numpy({example}); or call t.materialize() before compiling the routine that computes "
                f"it, to read the value that routine stores")

    def set(self, array) -> None:
        """Give this tensor a value: before compiling, it is kept (a parameter is then not
        initialized); afterwards, the next run of the context that holds it sees it."""
        arr = np.asarray(array)
        if tuple(arr.shape) != self.dims:
            raise ShapeError(f"{self.label}.set: expected an array of shape {self.dims}, got {arr.shape}")
        self._host_value = arr

        for ctx in session_state.contexts_holding(self.value):
            ctx.set(self.value, arr)

    # -- Python protocol -----------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"<Tensor #{self.id} {self.label!r} ({self.op}) {self.shape}>"

    def __hash__(self) -> int:
        return self.id

    def __bool__(self) -> bool:
        raise TypeError("a Tensor has no truth value; use oc.where(...) for conditions, or "
                        "t.numpy() to read values")

    # -- exchange with other array libraries (interop.py) ---------------------------------------

    __array_ufunc__ = None
    """numpy defers to the tensor's operators: ``ndarray + t`` is ``t.__radd__(ndarray)``, a
    tensor, not an object array of tensors."""

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """The value as ``t.numpy()`` reads it, shared with the context's buffer where the backend
        allows (``np.from_dlpack(t)``, ``torch.from_dlpack(t)``); see ``ocannl.interop``."""
        from ocannl import interop

        return interop.export(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        from ocannl import interop

        return interop.export_device(self)

    # Operators call the catalog's functions (registered by ops.py).
    __add__, __radd__ = _operator("add"), _operator("add", reflected=True)
    __sub__, __rsub__ = _operator("sub"), _operator("sub", reflected=True)
    __mul__, __rmul__ = _operator("mul"), _operator("mul", reflected=True)
    __truediv__, __rtruediv__ = _operator("div"), _operator("div", reflected=True)
    __pow__, __rpow__ = _operator("pow"), _operator("pow", reflected=True)
    __matmul__, __rmatmul__ = _operator("compose"), _operator("compose", reflected=True)
    __lt__, __gt__ = _operator("lt"), _operator("gt")
    __eq__, __ne__ = _operator("eq"), _operator("ne")  # type: ignore[assignment]
    __getitem__ = _operator("getitem")

    def __neg__(self): return _OPERATORS["neg"](self)
    def __le__(self, o): return _OPERATORS["not_"](_OPERATORS["gt"](self, o))
    def __ge__(self, o): return _OPERATORS["not_"](_OPERATORS["lt"](self, o))

    def __getattr__(self, name: str):
        # Unary functions and reductions of the catalog are also methods: t.relu(), t.sum().
        if name.startswith("_"):
            raise AttributeError(name)
        fn = _METHODS.get(name)
        if fn is None:
            raise AttributeError(f"'Tensor' object has no attribute {name!r}")
        return lambda *args, **kw: fn(self, *args, **kw)


class GradNode(TNode):
    """A tensor's gradient buffer; ``w.grad.numpy()`` reads it like a tensor's value."""

    __slots__ = ("tensor",)

    def __init__(self, t: Tensor):
        # A gradient is a sum over every use of ``t``: a float16 or bfloat16 tensor's gradient is
        # float32 (its compute type), so that it accumulates without rounding to 16 bits per term.
        super().__init__(t.label, dims=lambda: t.dims, dtype=t.dtype.compute, grad_of=t.value)
        self.tensor = t
        if not t.is_param:
            # An intermediate result's gradient: the optimizer may inline it into the backward
            # code that reads it (a gradient passed on through an addition becomes no copy at
            # all), unless ``t.retain_grad()`` asks to keep it.
            mark_virtual(self)

    def numpy(self) -> np.ndarray:

        ctx = session_state.last_writer(self) or next(
            (c for c in list(session_state.contexts) if c.inlined(self)), None)
        if ctx is None:
            raise SessionError(f"the gradient of {self.tensor.label!r} has not been computed: compile "
                               f"and run train.grad_update(loss) first")
        return ctx.get(self)


def subgraph(t: Tensor, stop: Callable[[Tensor], bool] | None = None) -> list[Tensor]:
    """``t`` and every tensor it is computed from, in creation order (operands first); with
    ``stop``, the walk neither keeps nor enters a tensor for which ``stop`` holds."""
    seen: dict[int, Tensor] = {}
    stack = [t]
    while stack:
        u = stack.pop()
        if u.id not in seen and not (stop is not None and stop(u)):
            seen[u.id] = u
            stack.extend(u.operands)
    return [seen[i] for i in sorted(seen)]


def _derive_requires_grad(tensors: Sequence[Tensor], trainable: Callable[[Tensor], bool]) -> None:
    """Set ``requires_grad`` of ``tensors``, given operands first, each operand's already set,
    with ``trainable`` telling which parameters are differentiated."""
    for u in tensors:
        if not u.dtype.is_float:
            u._requires_grad = False
        elif u.is_param:
            u._requires_grad = trainable(u)
        elif u.definition is None or u.definition.gradient is None:
            u._requires_grad = False
        else:
            u._requires_grad = any(o._requires_grad for o in u.operands)


@contextlib.contextmanager
def differentiating_only(graph: Sequence[Tensor], params: Sequence[Tensor]) -> Iterator[None]:
    """Within it, ``requires_grad`` over ``graph`` (a :func:`subgraph`) counts the trainable
    parameters of ``params`` only, the others read as frozen ones are: the view of one
    ``train.grad_update(loss, params=...)``, which so writes no gradient code for what leads
    only to the others. The graph's own answers are restored on leaving."""
    saved = [u._requires_grad for u in graph]
    chosen = {p.id for p in params}
    try:
        _derive_requires_grad(graph, lambda p: p.trainable and p.id in chosen)
        yield
    finally:
        for u, flag in zip(graph, saved):
            u._requires_grad = flag


# ---------------------------------------------------------------------------------------------
# Building tensors.


def new_op(definition: OpDef, logic: ShapeLogic, operands: Sequence[Tensor], label: str | None = None,
           spec: str | None = None, attrs: dict | None = None) -> Tensor:
    """Create the result of the operation ``definition`` over ``operands`` and state its shape
    logic to the solver (``OpDef.__call__`` in ops.py is the usual way here)."""
    op = definition.name
    shape = Shape(Row.open(), Row.open(), Row.open(), tensor_label=label or op)
    source = solver_mod.caller_source()
    t = Tensor(op=op, label=label or op, shape=shape, operands=operands, logic=logic, attrs=attrs,
               source=source, dtype=definition.dtype(operands), definition=definition)
    names = ["operand"] if len(operands) == 1 else [f"operand {i + 1}" for i in range(len(operands))]
    origin = Origin(op, label or "", source,
                    (("result", shape), *((f"{n} ({o.label})", o._shape) for n, o in zip(names, operands))),
                    spec)
    s = solver_mod.current()
    s.register(shape)
    for o in operands:
        o._shape.used = True
        # The logic sees each operand's rows as far as they are solved, as after ``o.shape``:
        # whether the user read a shape first never changes what an op is built from.
        s.resolve_shape(o._shape)
    try:
        s.add(logic.constraints(shape, [o._shape for o in operands], origin))
    except ShapeError:
        s.shapes.remove(shape)
        s.queue.clear()
        raise
    return t


def leaf(op: str, label: str, batch: Row, output: Row, input: Row, *, is_param: bool = False,
         **fields) -> Tensor:
    shape = Shape(batch, output, input, tensor_label=label, is_param=is_param, is_terminal=True)
    t = Tensor(op=op, label=label, shape=shape, source=solver_mod.caller_source(), **fields)
    solver_mod.current().register(shape)
    return t


def tensor(array, batch: int = 0, input: int = 0, label: str | None = None,
           dtype: DType | str | None = None) -> Tensor:
    """Data from a numpy array (or nested lists): the first ``batch`` axes are batch axes, the
    last ``input`` axes input axes, the rest output axes (docs/shapes.md, "Axis kinds"). Float data is
    float32 unless ``dtype`` says otherwise; integer data keeps its width (int64 stays int64,
    ``dtypes.default_for``). Another library's array (DLPack or the array interface: a torch
    tensor, say) keeps its own precision instead: a float64 torch tensor stays float64. A value the
    precision cannot hold is a ``DTypeError`` naming it."""
    from ocannl import interop

    for kind, count in (("batch", batch), ("input", input)):
        if not _int_like(count) or count < 0:
            raise ShapeError(f"oc.tensor: {kind}= counts axes, so it must be a non-negative int, got {count!r}")
    foreign = interop.is_foreign_array(array)
    arr = interop.host_array(array, f"oc.tensor {label or 'tensor'!r}") if foreign else np.asarray(array)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"oc.tensor: expected numeric data, got dtype {arr.dtype}")
    if dtype is None:
        # Another library's array keeps its precision; numpy data follows numpy's conventions.
        dtype = interop.kept_dtype(arr) if foreign else dtypes.default_for(arr)
    elif isinstance(dtype, str):
        dtype = dtypes.by_name(dtype)
    # Kept as the host sees it (bfloat16 as float32), rounded and range-checked once here.
    arr = dtypes.from_storage(dtype, dtypes.to_storage(dtype, arr, f"oc.tensor {label or 'tensor'!r}"))
    if batch + input > arr.ndim:
        raise ShapeError(
            f"oc.tensor: batch={batch} and input={input} axes do not fit an array of shape {arr.shape}")
    dims = arr.shape
    b, o, i = dims[:batch], dims[batch:arr.ndim - input], dims[arr.ndim - input:]
    return leaf("tensor", label or "tensor", Row.closed(b), Row.closed(o), Row.closed(i), data=arr,
                dtype=dtype)


def number(value: float | int) -> Tensor:
    """A scalar constant (dims ``()``): broadcasts into every shape."""
    return leaf("number", _number_label(value), Row(), Row(), Row(), data=np.asarray(value))


def _number_label(value: float | int) -> str:
    text = repr(float(value)) if isinstance(value, float) else str(value)
    return text


def _int_like(x: Any) -> bool:
    """An integer that is not a bool: ``3``, ``np.int64(3)``, anything ``operator.index`` takes."""
    if isinstance(x, (bool, np.bool_)):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def _row_of_sizes(sizes, what: str, label: str) -> Row:
    if sizes is None:
        return Row.open(f"{label}_{what}")
    items = (sizes,) if _int_like(sizes) else sizes
    try:
        dims = tuple(operator.index(d) if _int_like(d) else None for d in items)
    except TypeError:  # not iterable
        dims = (None,)
    if not all(d is not None and d > 0 for d in dims):
        raise ShapeError(f"oc.param({label!r}): {what}= must be a positive int or a tuple of them, got {sizes!r}")
    return Row.closed(dims)


def _param_init(init: Any, label: str) -> Any:
    """``oc.param``'s ``init=`` in the form the init code takes (``init.init_code``): ``None``
    (the default initializer), a float (every cell), a numpy array (the values, copied now: later
    changes to the source do not reach the parameter) or a callable initializer. Array-likes are
    anything numpy reads: nested lists, numpy arrays, objects with ``__array__`` or
    ``__dlpack__`` (a torch or jax array). Anything else is an error, never the default."""
    if init is None or (callable(init) and not _is_array_like(init)):
        return init
    if isinstance(init, (bool, np.bool_)):
        raise TypeError(f"oc.param({label!r}): init={init!r} is a bool; give a number, an array or an initializer")
    if isinstance(init, numbers.Real):
        return float(init)
    if isinstance(init, Tensor):
        raise TypeError(f"oc.param({label!r}): init= cannot be a Tensor ({init.label!r}); pass its values "
                        f"(init={init.label}.numpy()) or set the parameter later with .set(...)")
    if not _is_array_like(init):
        raise TypeError(f"oc.param({label!r}): init= must be a number, an array-like (nested lists, a numpy "
                        f"array, an object with __array__ or __dlpack__ such as a torch tensor) or an "
                        f"initializer such as oc.init.normal(); got {type(init).__name__}")
    try:
        if hasattr(init, "__dlpack__") and not hasattr(init, "__array__"):
            arr = np.from_dlpack(init).copy()
        else:
            arr = np.array(init)  # a copy
    except (TypeError, ValueError, RuntimeError, BufferError) as e:
        raise TypeError(f"oc.param({label!r}): cannot read init= ({type(init).__name__}) as an array: {e}") from e
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"oc.param({label!r}): init= must hold numbers, got an array of dtype {arr.dtype}")
    return arr


def _is_array_like(x: Any) -> bool:
    return isinstance(x, (np.ndarray, list, tuple)) or hasattr(x, "__array__") or hasattr(x, "__dlpack__")


def param(label: str, output=None, input=None, init=None, dtype: DType | str | None = None,
          trainable: bool = True) -> Tensor:
    """A learnable parameter. ``output``/``input`` are sizes: an int (numpy integers too; one
    axis), a tuple (several, leftmost first) or ``()`` (no axes); left out, they are inferred from
    the parameter's uses (an error names the parameter when nothing determines them). Parameters
    have no batch axes. ``init`` is a number, an array-like of the parameter's dims (a numpy or
    torch array, nested lists; its values are copied when the parameter is created) or an
    initializer from ``oc.init``; left out, ``init.default_init`` chooses. ``dtype`` left out is
    the ``param_precision`` setting (float32 unless set; ``config.param_precision``).
    ``trainable=False`` freezes it: it keeps its value through training, as a PyTorch parameter
    with ``requires_grad=False`` does, and checkpoints still save it (``Tensor.trainable``)."""
    if not isinstance(label, str) or not label:
        raise TypeError("oc.param: the first argument is the parameter's label (a non-empty string)")
    if not isinstance(trainable, (bool, np.bool_)):
        raise TypeError(f"oc.param({label!r}): trainable= is True or False, got {trainable!r}")
    dtype = dtypes.by_name(dtype) if isinstance(dtype, str) else (dtype or config.param_precision())
    return leaf("param", label, Row.closed(()), _row_of_sizes(output, "output", label),
                _row_of_sizes(input, "input", label), is_param=True, init=_param_init(init, label),
                dtype=dtype, attrs={"trainable": bool(trainable)})


def embed_symbol(sym: IndexSymbol) -> Tensor:
    """The run-time value of an index symbol as a scalar tensor (``step_n`` in a learning rate)."""
    return leaf("embed_index", sym.name, Row(), Row(), Row(), symbol=sym)


def as_tensor(x: Any) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, IndexSymbol):
        return embed_symbol(x)
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
        return number(x)
    if _is_array_operand(x):
        return tensor(x, label="array")
    raise TypeError(f"expected a Tensor, a number, an IndexSymbol or an array, got {type(x).__name__}")


def _is_array_operand(x: Any) -> bool:
    """An array as an operand (``t + ndarray``): its axes are output axes, as ``oc.tensor(x)``
    makes them. Nested lists are not arrays here: ``t + [1, 2]`` is more likely a mistake."""
    from ocannl import interop

    return isinstance(x, np.ndarray) or interop.is_foreign_array(x)


def finish_inference() -> None:
    """Finalize shape inference for every tensor built so far (see solver.Solver.finalize)."""
    solver_mod.current().finalize()


def _install_symbol_arithmetic() -> None:
    """An IndexSymbol in arithmetic acts as a scalar tensor holding its bound value
    (docs/training.md, "Routines and index symbols"); the compiler half defines the symbol, the
    frontend its arithmetic."""
    for name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
                 "__truediv__", "__rtruediv__", "__neg__", "__lt__", "__gt__"):
        def method(self, *args, _name=name):
            return getattr(embed_symbol(self), _name)(*args)

        setattr(IndexSymbol, name, method)


_install_symbol_arithmetic()
__all__ = ["Tensor", "ShapeView", "tensor", "param", "number", "as_tensor", "finish_inference", "KINDS"]
