"""The conformance kit: every backend computes what the interpreter computes.

A *program* builds tensors and computations in a fresh session (so ids, labels and PRNG keys are
the same on every run) and names the index bindings of its runs. :func:`run_program` compiles and
runs it on one backend and returns every node the routine wrote; :func:`conformance` runs the
whole :func:`catalog` (every op forward and backward, einsum forms, convolutions, reductions, a
training step with each optimizer, PRNG bits, gathers) plus random einsum programs on a backend
and compares each node with the interpreter's: exactly for integers and PRNG bits, within a
tolerance for floats (libm's ``expf`` may differ from numpy's in the last place).

Beyond the fixed programs, :func:`search_generated` lets hypothesis draw programs through the
public frontend (pointwise chains, einsums, reductions, gathers, gradients, training steps); on a
departure hypothesis shrinks the program to a minimal one, which :meth:`GeneratedProgram.script`
prints as a runnable script. ``docs/backends.md`` tells backend authors how to use the kit.

``python -m ocannl.testing --backend c`` runs it and prints a summary; the test suite runs it for
every available backend. :func:`compare` checks one computation on several backends and reports
the first tensor and element where one departs from the interpreter.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from ocannl import session

FLOAT_RTOL = 1e-5
FLOAT_ATOL = 1e-6


@dataclass
class Program:
    """``build()`` returns the items to compile (tensors and computations); ``runs`` are the
    bindings of successive runs (one run without bindings by default)."""

    name: str
    build: Callable[[], Sequence]
    runs: tuple[dict[str, int], ...] = ({},)
    exact: bool = False  # compare floats bit for bit too (PRNG-derived values)
    needs: frozenset[str] = frozenset()  # precisions it uses that some backends lack (float64)
    atol: float = 0.0
    """An absolute tolerance above the default, for results that are sums of many terms much
    larger than the result (cancellation): their rounding depends on the terms' magnitude, and
    backends may add the terms in another order (tiles)."""


@dataclass
class Mismatch:
    program: str
    node: str
    index: tuple[int, ...] | None
    expected: object
    got: object

    def __str__(self) -> str:
        where = f"[{', '.join(map(str, self.index))}]" if self.index is not None else ""
        return f"{self.program}: {self.node}{where}: interp {self.expected!r}, backend {self.got!r}"


@dataclass
class Report:
    backend: str
    passed: list[str] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    generated: int = 0  # how many generated programs were searched
    failure: GeneratedFailure | None = None  # the minimal generated program that departs
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.errors and self.failure is None

    def summary(self) -> str:
        lines = [f"conformance of {self.backend!r}: {len(self.passed)} programs passed, "
                 f"{len(self.mismatches)} mismatched, {len(self.errors)} failed, "
                 f"{len(self.skipped)} not applicable ({self.seconds:.1f} s)"]
        lines += [f"  MISMATCH {m}" for m in self.mismatches]
        lines += [f"  ERROR {name}: {err}" for name, err in self.errors]
        lines += [f"  not applicable {name}: {why}" for name, why in self.skipped]
        if self.generated:
            lines.append(f"generated programs: {self.generated} searched, "
                         + ("all agree" if self.failure is None else "a departure found"))
        if self.failure is not None:
            lines += [f"  GENERATED {self.failure}", "  reproduce it with this script:", "",
                      self.failure.program.script(self.backend)]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Running and comparing.


def run_program(program: Program, backend: str) -> dict[str, np.ndarray]:
    """Run ``program`` in a fresh session on ``backend``; every node its routine read or wrote
    (parameters included), by name, after the last run."""
    from ocannl.backends.context import Context

    session.reset()
    items = list(program.build())
    ctx = Context(backend)
    routine = ctx.compile(*items)
    for bindings in program.runs:
        routine.run(**bindings)
    nodes = dict.fromkeys(routine.ir.writes + routine.ir.reads)  # parameters too: their init
    return {node.name: ctx.get(node) for node in nodes if ctx.has_value(node)}


def first_mismatch(name: str, expected: dict[str, np.ndarray], got: dict[str, np.ndarray],
                   exact: bool = False, atol: float = 0.0) -> Mismatch | None:
    """The first node (in the interpreter's write order) and element where ``got`` departs
    (floats within the tolerance unless ``exact``)."""
    for node, want in expected.items():
        have = got.get(node)
        if have is None:
            return Mismatch(name, node, None, "a value", "nothing (node missing)")
        if have.shape != want.shape or have.dtype != want.dtype:
            return Mismatch(name, node, None, (want.shape, str(want.dtype)), (have.shape, str(have.dtype)))
        if want.dtype.kind == "f" and not exact:
            bad = ~np.isclose(have, want, rtol=FLOAT_RTOL, atol=max(FLOAT_ATOL, atol), equal_nan=True)
        else:
            bad = have != want
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            return Mismatch(name, node, index, want[index].item() if want.ndim else want.item(),
                            have[index].item() if have.ndim else have.item())
    return None


def check_program(program: Program, backend: str, reference: str = "interp") -> Mismatch | None:
    return first_mismatch(program.name, run_program(program, reference), run_program(program, backend),
                          exact=program.exact, atol=program.atol)


def compare(build: Callable[[], Sequence], backends: Sequence[str], runs: Sequence[dict[str, int]] = ({},),
            name: str = "computation") -> list[Mismatch]:
    """Run what ``build()`` returns (tensors/computations, built afresh per backend) on the
    interpreter and on each of ``backends``; the first departure of each backend (empty if all
    agree)."""
    program = Program(name, build, tuple(runs))
    expected = run_program(program, "interp")
    out = []
    for b in backends:
        m = first_mismatch(f"{name} on {b}", expected, run_program(program, b))
        if m is not None:
            out.append(m)
    return out


def conformance(backend: str, programs: Iterable[Program] | None = None, random_programs: int = 20,
                seed: int = 0, generated: int = 0) -> Report:
    """Run the catalog (and ``random_programs`` random einsum programs) on ``backend``, then
    search ``generated`` hypothesis-generated programs (:func:`search_generated`)."""
    report = Report(backend)
    start = time.perf_counter()
    programs = list(programs) if programs is not None else catalog()
    rng = np.random.default_rng(seed)
    programs += [random_einsum_program(rng, i) for i in range(random_programs)]
    from ocannl.backends.registry import get_backend

    unsupported = set(getattr(get_backend(backend), "unsupported_dtypes", ()))
    for program in programs:
        if program.needs & unsupported:
            report.skipped.append((program.name, f"{backend} has no {', '.join(sorted(program.needs & unsupported))}"))
            continue
        try:
            m = check_program(program, backend)
        except Exception as exc:  # noqa: BLE001 - reported per program, the run goes on
            report.errors.append((program.name, f"{type(exc).__name__}: {exc}".splitlines()[0]))
            continue
        if m is None:
            report.passed.append(program.name)
        else:
            report.mismatches.append(m)
    if generated:
        report.generated = generated
        report.failure = search_generated(backend, examples=generated, seed=seed)
    report.seconds = time.perf_counter() - start
    session.reset()
    return report


# ---------------------------------------------------------------------------------------------
# The catalog.


def _data(shape: tuple[int, ...], seed: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def _param(label: str, shape: tuple[int, ...], seed: int, n_input: int = 0, low: float = -1.0, high: float = 1.0):
    import ocannl as oc

    out, inp = shape[:len(shape) - n_input], shape[len(shape) - n_input:]
    return oc.param(label, output=out, input=inp, init=_data(shape, seed, low, high))


def _forward_and_backward(make: Callable) -> Callable[[], Sequence]:
    """A program computing ``make()``'s result and the gradients of a weighted sum of it."""
    def build():
        import ocannl as oc
        from ocannl import train

        y = make()
        if not y.requires_grad:
            return [y]
        weights = oc.tensor(_data(y.dims, 99), batch=len(y.shape.batch), input=len(y.shape.input))
        return [train.grad_update((y * weights).sum(label="loss"))]

    return build


_UNARY_DOMAINS = {"log": (0.5, 2.0), "log2": (0.5, 2.0), "sqrt": (0.5, 2.0), "recip": (0.5, 2.0),
                  "recip_sqrt": (0.5, 2.0)}


def _unary_programs() -> list[Program]:
    import ocannl as oc
    from ocannl.ops import UNARY_OPS

    out = []
    for op in UNARY_OPS:
        fn = getattr(oc, "not_" if op == "not" else op)
        low, high = _UNARY_DOMAINS.get(op, (-2.0, 2.0))
        out.append(Program(f"unary {op}", _forward_and_backward(
            lambda fn=fn, low=low, high=high: fn(_param("x", (3, 4), 1, low=low, high=high)))))
    return out


def _binary_programs() -> list[Program]:
    import ocannl as oc

    cases = {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b, "pow": lambda a, b: a ** b, "lt": lambda a, b: a < b,
        "gt": lambda a, b: a > b, "eq": lambda a, b: oc.eq(a, b), "ne": lambda a, b: oc.ne(a, b),
        "maximum": oc.maximum, "minimum": oc.minimum,
    }
    out = []
    for name, fn in cases.items():
        positive = name in ("pow", "div")
        lo, hi = (0.5, 2.0) if positive else (-2.0, 2.0)
        out.append(Program(f"binary {name}", _forward_and_backward(
            lambda fn=fn, lo=lo, hi=hi: fn(_param("a", (2, 3), 1, low=lo, high=hi),
                                           _param("b", (3,), 2, low=lo, high=hi)))))
    out.append(Program("binary scalar broadcast", _forward_and_backward(
        lambda: 2.5 * _param("a", (2, 3), 3) - 1)))
    return out


def _structured_programs() -> list[Program]:
    import ocannl as oc
    from ocannl import nn

    def x(shape, seed=4, batch=0, input=0):
        return oc.tensor(_data(shape, seed), batch=batch, input=input)

    return [
        Program("where", _forward_and_backward(
            lambda: oc.where(x((2, 3), 5) > 0, _param("a", (2, 3), 1), _param("b", (2, 3), 2)))),
        Program("fma", _forward_and_backward(
            lambda: oc.fma(_param("a", (3,), 1), _param("b", (3,), 2), _param("c", (3,), 3)))),
        Program("compose (dense layer)", _forward_and_backward(
            lambda: _param("w", (4, 3), 1, n_input=1) @ x((5, 3), batch=1))),
        Program("einsum matmul", _forward_and_backward(
            lambda: oc.einsum("ij;jk=>ik", _param("a", (2, 3), 1), _param("b", (3, 4), 2)))),
        Program("einsum batched attention scores", _forward_and_backward(
            lambda: oc.einsum("b s | h d; b t | h d => b s | t -> h",
                              oc.tensor(_data((2, 3, 2, 4), 1), batch=2),
                              _param("k", (2, 4), 2) * oc.tensor(_data((2, 3, 1, 1), 3), batch=2)))),
        Program("einsum three operands", _forward_and_backward(
            lambda: oc.einsum("i;ij;j=>i", _param("a", (3,), 1), _param("b", (3, 4), 2), _param("c", (4,), 3)))),
        Program("einsum permutation across kinds", _forward_and_backward(
            lambda: oc.einsum("ab|cd->ef => cf|ae->db", _param("p", (3, 2, 2, 3), 1, n_input=2) *
                              oc.tensor(_data((2, 3, 3, 2, 2, 3), 2), batch=2, input=2)))),
        Program("einsum fixed index", _forward_and_backward(
            lambda: oc.einsum("...|i->1; ...|...->i => ...|i", oc.tensor(_data((3, 2, 4), 1), batch=1, input=1),
                              _param("b", (4,), 2) * oc.tensor(_data((3, 4, 1), 3), batch=1, input=1)))),
        Program("einsum diagonal", lambda: [oc.einsum("i=>ii", x((5,)))]),
        Program("outer_sum", _forward_and_backward(
            lambda: oc.outer_sum("i;j=>ij", _param("a", (3,), 1), _param("b", (4,), 2)))),
        Program("einmax", _forward_and_backward(lambda: oc.einmax("ij=>i", _param("a", (3, 5), 1)))),
        Program("tropical max-pool", _forward_and_backward(
            lambda: oc.tropical("2*oh<+wh, 2*ow<+ww; wh, ww => oh, ow", _param("a", (4, 6), 1),
                                oc.tensor(np.zeros((2, 2), np.float32))))),
        Program("sum/mean/max reductions", _forward_and_backward(
            lambda: _param("a", (2, 3), 1).sum() + _param("b", (2, 3), 2).mean() + _param("c", (3, 2), 3).max())),
        Program("reduce batch axes", _forward_and_backward(
            lambda: (_param("w", (3,), 1) * x((4, 3), batch=1)).mean(axes="batch"))),
        Program("valid conv 2-D stride 2 dilation 2", _forward_and_backward(
            lambda: oc.einsum("2*oh<+2*kh, 2*ow<+2*kw, ic; kh, kw, ic -> oc => oh, ow, oc",
                              x((9, 9, 2)), _param("k", (3, 3, 3, 2), 2, n_input=3)))),
        Program("padded conv 2-D", _forward_and_backward(
            lambda: oc.einsum("oh=+kh, ow=+kw, ic; kh, kw, ic -> oc => oh, ow, oc",
                              x((5, 5, 1)), _param("k", (2, 3, 3, 1), 2, n_input=3)))),
        Program("batch slice by index symbol", _forward_and_backward(
            lambda: _param("w", (3,), 1) * oc.tensor(_data((4, 2, 3), 1), batch=2)[oc.IndexSymbol("batch_n", 4)]),
            runs=({"batch_n": 0}, {"batch_n": 3})),
        Program("take (gather) and scatter-add", _forward_and_backward(
            lambda: oc.take(_param("table", (5, 3), 1), oc.tensor(np.array([[4, 0], [1, 1], [2, 4]]), batch=1)))),
        Program("concat and stack", _forward_and_backward(
            lambda: oc.concat("a; b => a^b", [_param("a", (2,), 1), _param("b", (3,), 2)])
            + oc.stack([_param("c", (5,), 3), _param("d", (5,), 4)]).sum(axes="output") * 0 )),
        Program("interleave and deinterleave", _forward_and_backward(
            lambda: oc.interleave(oc.deinterleave_odd(_param("a", (6,), 1)), _param("b", (3,), 2)))),
        Program("batch norm with running statistics", _forward_and_backward(
            lambda: nn.batch_norm(label="bn")(oc.einsum("b, h, c => b | h, c", _param("x", (4, 3, 2), 1)))),
            runs=({},) * 2),
        Program("index symbol as a scalar", lambda: [oc.tensor(_data((3,), 1)) * (oc.IndexSymbol("step_n", 10) + 1)],
                runs=({"step_n": 7},)),
    ]


def _training_programs() -> list[Program]:
    def step(optimizer: str, **kw):
        def build():
            import ocannl as oc
            from ocannl import train

            x = oc.tensor(_data((6, 2), 1), batch=1)
            y = oc.tensor(np.sign(_data((6, 1), 2)), batch=1)
            w1 = _param("w1", (4, 2), 3, n_input=1)
            b1 = _param("b1", (4,), 4)
            w2 = _param("w2", (1, 4), 5, n_input=1)
            loss = oc.relu(1 - y * (w2 @ oc.relu(w1 @ x + b1))).mean(label="loss")
            u = train.grad_update(loss)
            opt = getattr(train, optimizer)(u, **kw)
            return [u, opt]

        return build

    return [
        Program("training step sgd", step("sgd_update", lr=0.1, weight_decay=1e-4), runs=({},) * 3),
        Program("training step sgd momentum", step("sgd_update", lr=0.1, momentum=0.9), runs=({},) * 3),
        Program("training step sgd nesterov", step("sgd_update", lr=0.1, momentum=0.9, nesterov=True), runs=({},) * 3),
        Program("training step adam", step("adam_update", lr=0.01), runs=({},) * 3),
        Program("training step adamw", step("adam_update", lr=0.01, weight_decay=0.1, decoupled=True), runs=({},) * 3),
    ]


def _prng_programs() -> list[Program]:
    def default_init():
        import ocannl as oc

        w = oc.param("w", output=5, input=3)
        return [w @ oc.tensor(_data((2, 3), 1), batch=1)]

    def uniform_bits(dtype: str):
        def build():
            import ocannl as oc

            p = oc.param("u", output=(7, 5), init=oc.init.uniform(-2.0, 3.0), dtype=dtype)
            return [p * 1.0]

        return build

    def dropout():
        from ocannl import nn

        return nn.dropout(_param("x", (4, 6), 1), 0.3)

    return [Program("PRNG default parameter init (Glorot uniform)", default_init, exact=True),
            Program("PRNG uniform bits float32", uniform_bits("float32"), exact=True),
            Program("PRNG uniform bits float64", uniform_bits("float64"), exact=True,
                    needs=frozenset({"float64"})),
            # A new mask every run, from a run counter the routine increments (ocannl/random.py);
            # a wrong mask bit is far outside the tolerance, which the summed loss needs.
            Program("PRNG run-time draws (dropout)", _forward_and_backward(dropout), runs=({},) * 3)]


def catalog() -> list[Program]:
    """Every program of the kit (random programs aside)."""
    return _unary_programs() + _binary_programs() + _structured_programs() + _training_programs() + _prng_programs()


def random_einsum_program(rng: np.random.Generator, index: int = 0) -> Program:
    """A random einsum of one to three operands over single-letter labels of random small
    sizes, forward and backward (the result keeps a random subset of the labels)."""
    letters = "ijklm"
    n_labels = int(rng.integers(1, 5))
    labels = letters[:n_labels]
    sizes = {c: int(rng.integers(1, 4)) for c in labels}
    n_operands = int(rng.integers(1, 4))
    operands = ["".join(rng.permutation(list(labels))[:int(rng.integers(1, n_labels + 1))]) for _ in range(n_operands)]
    used = sorted(set("".join(operands)))
    result = "".join(c for c in rng.permutation(used) if rng.random() < 0.6)
    spec = ";".join(operands) + "=>" + result
    seeds = [int(rng.integers(1 << 30)) for _ in operands]

    def make():
        import ocannl as oc

        ts = [_param(f"p{j}", tuple(sizes[c] for c in op), seed) for j, (op, seed) in enumerate(zip(operands, seeds))]
        return oc.einsum(spec, *ts)

    return Program(f"random einsum #{index} {spec!r}", _forward_and_backward(make))


# ---------------------------------------------------------------------------------------------
# Generated programs: hypothesis draws them, and shrinks a failing one.


@dataclass(frozen=True)
class GeneratedProgram:
    """A program drawn by :func:`generated_programs`, kept as the Python source of its ``build``
    function (so that the script printed for a failure is exactly what ran). ``ops`` counts its
    operations (the parameters and the loss aside)."""

    source: str
    ops: int
    runs: int = 1

    def program(self, name: str = "generated program") -> Program:
        namespace: dict = {}
        exec(compile(_GEN_IMPORTS + self.source, f"<{name}>", "exec"), namespace)  # noqa: S102 - our text
        return Program(name, namespace["build"], ({},) * self.runs)

    def script(self, backend: str) -> str:
        """A runnable script reproducing the comparison of this program on ``backend``."""
        return "\n".join([
            f"# A program on which backend {backend!r} departs from the interpreter,",
            "# found and minimized by `python -m ocannl.testing`.",
            _GEN_IMPORTS + "from ocannl.testing import compare",
            "",
            self.source.rstrip(),
            "",
            "",
            f"for mismatch in compare(build, [{backend!r}], runs=[{{}}] * {self.runs}):",
            "    print(mismatch)",
            "",
        ])


@dataclass
class GeneratedFailure:
    """The minimal generated program on which a backend departs from the interpreter."""

    program: GeneratedProgram
    problem: str  # the first mismatch, or the backend's exception

    def __str__(self) -> str:
        return f"{self.problem}\n(minimal program: {self.program.ops} ops)"


_GEN_IMPORTS = "import numpy as np\nimport ocannl as oc\nfrom ocannl import train\n"
_GEN_UNARY = ("relu", "neg", "abs", "tanh", "sigmoid", "sin", "cos", "exp")
_GEN_BINARY = {"add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}",
               "maximum": "oc.maximum({a}, {b})", "minimum": "oc.minimum({a}, {b})"}
_GEN_REDUCE = ("sum", "mean", "max")


def generated_programs():
    """A hypothesis strategy of :class:`GeneratedProgram`: one to three parameters, then a
    chain of one to six operations, each on earlier values (pointwise unary and binary ops,
    scalings by constants, einsums of one or two operands, full reductions, partial max
    reductions, gathers), ended by the last value itself, its gradients, or training steps
    (SGD, two runs). Every choice shrinks toward the simplest: fewer parameters and ops, unary
    ``relu``, small sizes, the forward ending."""
    from hypothesis import strategies as st

    @st.composite
    def draw_program(draw) -> GeneratedProgram:
        sizes = {c: draw(st.integers(1, 3)) for c in "ijk"}
        fresh = iter("pqrs")
        lines, values = [], []  # values: (variable, labels)

        def dims(labels: str) -> tuple[int, ...]:
            return tuple(sizes[c] for c in labels)

        for n in range(draw(st.integers(1, 3))):
            labels = draw(st.sampled_from(("i", "ij", "jk", "ijk", "ki")))
            seed = draw(st.integers(0, 1 << 16))
            lines.append(f"p{n} = oc.param('p{n}', output={dims(labels)}, "
                         f"init=np.random.default_rng({seed}).uniform(-1, 1, {dims(labels)}).astype(np.float32))")
            values.append((f"p{n}", labels))
        n_ops = draw(st.integers(1, 6))
        for k in range(n_ops):
            kind = draw(st.sampled_from(("unary", "binary", "scale", "einsum", "reduce", "einmax", "take")))
            var, labels = draw(st.sampled_from(values))
            out, new = f"v{k}", labels
            if kind == "unary":
                expr = f"oc.{draw(st.sampled_from(_GEN_UNARY))}({var})"
            elif kind == "binary":
                other = draw(st.sampled_from([v for v, ls in values if ls == labels]))
                expr = _GEN_BINARY[draw(st.sampled_from(sorted(_GEN_BINARY)))].format(a=var, b=other)
            elif kind == "scale":
                expr = f"{var} * {draw(st.sampled_from((2.0, -0.5, 0.25)))} + {draw(st.sampled_from((0.0, 1.0, -3.0)))}"
            elif kind == "einsum" and labels:
                operands = [(var, labels)]
                if draw(st.booleans()):
                    operands.append(draw(st.sampled_from([v for v in values if v[1]])))
                union = sorted(set("".join(ls for _, ls in operands)))
                new = "".join(draw(st.permutations(union))[:draw(st.integers(0, len(union)))])
                spec = ";".join(ls for _, ls in operands) + "=>" + new
                expr = f"oc.einsum({spec!r}, {', '.join(v for v, _ in operands)})"
            elif kind == "einmax" and labels:
                new = labels[:draw(st.integers(0, len(labels) - 1))]
                expr = f"oc.einmax({labels + '=>' + new!r}, {var})"
            elif kind == "take" and labels:
                rows = draw(st.lists(st.integers(0, sizes[labels[0]] - 1), min_size=1, max_size=3))
                letter = next(fresh, None)
                if letter is None:
                    expr = f"oc.relu({var})"
                else:
                    sizes[letter] = len(rows)
                    new = letter + labels[1:]
                    expr = f"oc.take({var}, oc.tensor(np.array({rows})))"
            else:  # full reductions, and the operations above on a scalar
                new = ""
                expr = f"{var}.{draw(st.sampled_from(_GEN_REDUCE))}()"
            lines.append(f"{out} = {expr}")
            values.append((out, new))
        last, labels = values[-1]
        ending = draw(st.sampled_from(("forward", "grad", "sgd")))
        if ending == "forward":
            lines.append(f"return [{last}]")
        else:
            weights = f"np.random.default_rng(7).uniform(-1, 1, {dims(labels)}).astype(np.float32)"
            lines.append(f"loss = ({last} * oc.tensor({weights})).sum(label='loss')")
            lines.append("update = train.grad_update(loss)")
            lines.append("return [update]" if ending == "grad" else "return [update, train.sgd_update(update, lr=0.1)]")
        source = "def build():\n" + "".join(f"    {line}\n" for line in lines)
        return GeneratedProgram(source, n_ops, runs=2 if ending == "sgd" else 1)

    return draw_program()


def _generated_problem(program: GeneratedProgram, backend: str, exact: bool = False) -> str | None:
    """Why ``backend`` departs from the interpreter on ``program`` (``None``: it agrees). The
    interpreter's own failure is not caught: it would be the generator's bug."""
    p = program.program()
    expected = run_program(p, "interp")
    try:
        got = run_program(p, backend)
    except Exception as exc:  # noqa: BLE001 - a backend's failure is a finding
        return f"{backend} failed: {type(exc).__name__}: {exc}".splitlines()[0]
    m = first_mismatch(p.name, expected, got, exact=exact)
    return None if m is None else str(m)


def search_generated(backend: str, examples: int = 25, seed: int = 0, exact: bool = False) -> GeneratedFailure | None:
    """Run up to ``examples`` generated programs on ``backend``; on the first departure from
    the interpreter (floats within the kit's tolerance, or bit for bit with ``exact``), let
    hypothesis shrink it and return the minimal one (``None``: all agree). Deterministic for a
    given ``seed`` (no example database)."""
    import random

    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    config = settings(max_examples=examples, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))
    try:
        minimal = find(generated_programs(), lambda p: _generated_problem(p, backend, exact) is not None,
                       settings=config, random=random.Random(seed))
    except NoSuchExample:
        return None
    finally:
        session.reset()
    return GeneratedFailure(minimal, _generated_problem(minimal, backend, exact) or "(no longer departs)")


# ---------------------------------------------------------------------------------------------
# Command line.


def main(argv: list[str] | None = None) -> int:
    from ocannl.backends.registry import get_backend
    from ocannl.errors import BackendUnavailable

    parser = argparse.ArgumentParser(prog="python -m ocannl.testing", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, help="the backend to check against the interpreter")
    parser.add_argument("--random", type=int, default=20, help="number of random einsum programs")
    parser.add_argument("--generated", type=int, default=50,
                        help="number of hypothesis-generated programs to search (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        get_backend(args.backend)
    except BackendUnavailable as exc:
        print(f"backend {args.backend!r} is not available here: {exc}")
        return 2
    if args.generated and importlib.util.find_spec("hypothesis") is None:
        print("note: generated programs need hypothesis (pip install 'ocannl[dev]'): searching none")
        args.generated = 0
    report = conformance(args.backend, random_programs=args.random, seed=args.seed, generated=args.generated)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
