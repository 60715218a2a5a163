"""The kit for backend authors: plugins found through the ``ocannl.backends`` entry points, the
example backend of ``examples/numpy_loops`` passing the kit, and hypothesis-generated programs
that catch a wrong backend and shrink its failure to a small runnable script."""

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ocannl import testing
from ocannl.backends import registry as backend_registry
from ocannl.errors import BackendUnavailable
from ocannl.lowlevel.scalar_ops import Binop, Unop

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "numpy_loops"


@pytest.fixture
def registry(monkeypatch):
    """The backend registry, restored after the test (plugins registered in it disappear)."""
    monkeypatch.setattr(backend_registry, "_registry", dict(backend_registry._registry))
    monkeypatch.setattr(backend_registry, "_plugin_errors", {})
    monkeypatch.setattr(backend_registry, "_plugins_loaded", False)
    return backend_registry


@pytest.fixture
def example(monkeypatch):
    """The example backend's module, importable from its source folder."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import ocannl_numpy_loops

    return ocannl_numpy_loops


def _fake_distribution(tmp_path: Path, monkeypatch, entry_points: str) -> None:
    """An installed distribution as importlib.metadata sees one: a dist-info folder on sys.path
    with its metadata and entry points."""
    info = tmp_path / "fake_ocannl_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-ocannl-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ocannl.backends]\n" + entry_points)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_example_backend_registers_through_an_entry_point_and_passes_the_kit(
        registry, example, tmp_path, monkeypatch, capsys):
    _fake_distribution(tmp_path, monkeypatch, "numpy_loops_plugin = ocannl_numpy_loops:NumpyLoopsBackend\n")
    assert "numpy_loops_plugin" in registry.registered_backends()
    assert isinstance(registry.get_backend("numpy_loops_plugin"), example.NumpyLoopsBackend)
    assert registry.best_available() != "numpy_loops_plugin"  # preference -1: never the default
    assert testing.main(["--backend", "numpy_loops_plugin", "--random", "5", "--generated", "30"]) == 0
    out = capsys.readouterr().out
    assert "0 mismatched, 0 failed" in out and "30 searched, all agree" in out


def test_a_broken_plugin_is_named_and_the_other_backends_stay_usable(registry, tmp_path, monkeypatch):
    _fake_distribution(tmp_path, monkeypatch, "broken = no_such_module_for_ocannl:Backend\n")
    with pytest.raises(BackendUnavailable, match=r"'broken'.*no_such_module_for_ocannl:Backend.*ModuleNotFoundError"):
        registry.get_backend("broken")
    assert "broken" not in registry.registered_backends()
    assert registry.get_backend("interp").name == "interp"


def test_example_backend_is_a_compiler_not_the_interpreter(example):
    """Its executable holds the Python source it generated for the routine's loops."""
    import ocannl as oc
    from ocannl.backends.context import Context

    backend_registry.register_backend("numpy_loops_direct", example.NumpyLoopsBackend, preference=-100)
    try:
        x = oc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), label="x")
        y = oc.relu(x - 2, label="y")
        ctx = Context("numpy_loops_direct")
        routine = ctx.compile(y)
        routine.run()
        np.testing.assert_array_equal(ctx.get(y), np.maximum(np.arange(6).reshape(2, 3) - 2, 0))
        assert "for i" in routine._executable.source
    finally:
        backend_registry._registry.pop("numpy_loops_direct")


def test_example_backend_computes_the_interpreters_bits(example):
    """It uses numpy's math functions, as the interpreter does, so it agrees bit for bit, not
    only within the kit's tolerance: on the catalog and on generated programs."""
    backend_registry.register_backend("numpy_loops_bits", example.NumpyLoopsBackend, preference=-100)
    try:
        for program in testing.catalog()[:40:3]:
            expected = testing.run_program(program, "interp")
            got = testing.run_program(program, "numpy_loops_bits")
            assert testing.first_mismatch(program.name, expected, got, exact=True) is None
        assert testing.search_generated("numpy_loops_bits", examples=20, seed=2, exact=True) is None
    finally:
        backend_registry._registry.pop("numpy_loops_bits")


_PERTURBATIONS = {  # one operator of the example backend made wrong
    "tanh scaled by 1.001": ("_UNARY", Unop.TANH, lambda t: lambda x: np.tanh(x) * t.scalar(1.001)),
    "max taking the first operand only when it leads by 0.25": (
        "_BINARY", Binop.MAX, lambda t: lambda a, b: a if a > b + t.scalar(0.25) else b),
}


@pytest.mark.parametrize("perturbation", [  # tanh is rarer among generated operations: a longer search
    pytest.param(name, marks=pytest.mark.slow) if "tanh" in name else name for name in sorted(_PERTURBATIONS)])
def test_generated_programs_catch_a_wrong_backend_and_shrink_it(example, monkeypatch, perturbation):
    table, op, wrong = _PERTURBATIONS[perturbation]
    monkeypatch.setitem(getattr(example, table), op, wrong)
    backend_registry.register_backend("numpy_loops_wrong", example.NumpyLoopsBackend, preference=-100)
    try:
        failure = testing.search_generated("numpy_loops_wrong", examples=200, seed=0)
        assert failure is not None, f"the kit missed {perturbation}"
        assert failure.program.ops <= 5, failure.program.source
        assert "generated program" in failure.problem
        script = failure.program.script("numpy_loops_wrong")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(script, "<shrunk script>", "exec"), {"__name__": "__main__"})  # noqa: S102
        assert "on numpy_loops_wrong" in printed.getvalue(), script
    finally:
        backend_registry._registry.pop("numpy_loops_wrong")


def test_generated_programs_are_deterministic_and_agree_on_the_interpreter():
    assert testing.search_generated("interp", examples=10, seed=3) is None
    from hypothesis import HealthCheck, given, settings

    sources = []

    @settings(max_examples=5, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(testing.generated_programs())
    def collect(program):
        sources.append(program.source)

    collect()
    first = list(sources)
    sources.clear()
    collect()
    assert sources == first and len(set(first)) > 1


def _builtin_backends() -> list[str]:
    names = []
    for name in ("c", "metal", "triton"):
        try:
            backend_registry.get_backend(name)
        except BackendUnavailable:
            continue
        names.append(name)
    return names


@pytest.mark.parametrize("backend", _builtin_backends())
def test_generated_programs_agree_on_every_builtin_backend(backend):
    failure = testing.search_generated(backend, examples=15, seed=1)
    assert failure is None, f"{failure}\n{failure.program.script(backend)}"


@pytest.mark.slow
def test_example_installs_with_pip_and_passes_the_kit_through_its_entry_point(tmp_path):
    """The real path: pip installs the example (editable, into this environment, once), and a
    fresh interpreter finds it through its entry point."""
    env = {**os.environ, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    probe = "import importlib.metadata as m; m.distribution('ocannl-numpy-loops')"
    installed = subprocess.run([sys.executable, "-c", probe], capture_output=True, env=env).returncode == 0
    if not installed:
        pytest.importorskip("setuptools", reason="installing the example offline builds it with setuptools")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "-e", str(EXAMPLE)], check=True, env=env)
    run = subprocess.run([sys.executable, "-m", "ocannl.testing", "--backend", "numpy_loops", "--generated", "40"],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "conformance of 'numpy_loops'" in run.stdout and "40 searched, all agree" in run.stdout
