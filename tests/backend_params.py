"""Parametrizing tests over backends: a backend that cannot run on this machine (no C compiler, no
triton) is skipped with the reason, and slow ones are marked."""

from __future__ import annotations

import importlib.util
import os

import pytest

import ocannl as oc
from ocannl.backends import registry
from ocannl.backends.context import set_default_context
from ocannl.errors import BackendUnavailable


def runs_here(name: str) -> bool:
    """Whether backend ``name`` can be constructed on this machine."""
    try:
        registry.get_backend(name)
    except Exception:  # noqa: BLE001 - not available on this machine
        return False
    return True


def backend_param(name: str, slow: bool = False):
    """``name`` as a pytest parameter, skipped where it cannot run, marked ``slow`` when asked."""
    marks = [pytest.mark.skipif(not runs_here(name), reason=f"backend {name} is not available here")]
    if slow:
        marks.append(pytest.mark.slow)
    return pytest.param(name, marks=marks, id=name)


def context(name: str) -> oc.Context:
    """A context on backend ``name``, or ``interp-scalar``: the interpreter's literal walk (``interp``
    runs vectorized); the test skips where it cannot run (Triton runs here only under its
    interpreter)."""
    if name == "triton" and (importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1"):
        pytest.skip("the Triton tests run Triton's interpreter: pip install 'ocannl[triton]', TRITON_INTERPRET=1")
    try:
        return oc.Context("interp", interp_mode="scalar") if name == "interp-scalar" else oc.Context(name)
    except BackendUnavailable as e:
        pytest.skip(str(e))


def default_context(backend: str) -> oc.Context:
    """A context on ``backend``, made the default one (``t.numpy()`` runs there); the test skips
    where the backend cannot run."""
    try:
        ctx = oc.Context(backend)
    except BackendUnavailable as e:
        pytest.skip(str(e))
    set_default_context(ctx)
    return ctx
