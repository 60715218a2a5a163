"""The conformance kit runs on every backend available here, and catches a wrong backend."""

import numpy as np
import pytest

from ocannl import testing
from ocannl.backends import registry
from ocannl.backends.interp import InterpBackend


def _available() -> list[str]:
    names = []
    for name in registry.registered_backends():
        try:
            registry.get_backend(name)
        except Exception:  # noqa: BLE001 - unavailable here
            continue
        names.append(name)
    return names


@pytest.mark.parametrize("backend", _available())
def test_catalog_matches_the_interpreter(backend):
    report = testing.conformance(backend, random_programs=10)
    assert report.ok, report.summary()
    assert len(report.passed) >= 55


class _OffByOneUlp(InterpBackend):
    """The interpreter, except that after each run one float cell of the last written buffer is
    nudged: the kit must notice."""

    def compile(self, routine):
        inner = super().compile(routine)
        written = [n for n in routine.writes if n.dtype.is_float]

        class Nudged:
            def run(self, buffers, bindings):
                inner.run(buffers, bindings)
                if written:
                    buf = buffers[written[-1]].reshape(-1)
                    buf[-1] = np.nextafter(buf[-1], np.inf) * (1 + 1e-3) + 1e-3

        return Nudged()


def test_compare_reports_the_first_departing_tensor_and_element():
    registry.register_backend("nudged", _OffByOneUlp, preference=-100)
    try:
        def build():
            import ocannl as oc

            x = oc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), label="x")
            return [oc.relu(x * 2 - 1, label="y")]

        [mismatch] = testing.compare(build, ["nudged"], name="relu program")
        assert mismatch.node == "y"
        assert mismatch.index == (1, 2)
        assert mismatch.expected == 9.0
        assert "relu program on nudged: y[1, 2]" in str(mismatch)
        report = testing.conformance("nudged", programs=testing.catalog()[:5], random_programs=0)
        assert not report.ok and len(report.mismatches) == 5
    finally:
        registry._registry.pop("nudged")


def test_command_line_summary(capsys):
    assert testing.main(["--backend", "interp", "--random", "2"]) == 0
    assert "conformance of 'interp'" in capsys.readouterr().out
    assert testing.main(["--backend", "no_such_backend"]) == 2
