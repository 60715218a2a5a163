"""``bench/peak.py``: the kernel it times computes what its chains say (a run of the tool, not a
timed assertion)."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.backend_params import runs_here

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/

pytestmark = pytest.mark.skipif(not runs_here("c"), reason="the tool measures the c backend's compiler")


@pytest.mark.parametrize("lanes", [1, 4])
def test_the_peak_kernel_computes_its_chains(lanes):
    """Every lane of chain ``j`` starts at ``seed * (j + 1)`` and becomes ``a * seed + seed * 1e-7``
    each iteration; the kernel returns the sum over chains and lanes, in float32."""
    from bench import peak
    from ocannl.backends.c import compiler

    kernel = ctypes.CDLL(str(compiler.compile_shared(peak.source(lanes), compiler.toolchain()))).ocannl_peak
    kernel.argtypes, kernel.restype = (ctypes.c_int64, ctypes.c_float), ctypes.c_float
    seed, n = np.float32(0.5), 3
    chains = [seed * np.float32(j + 1) for j in range(peak.CHAINS)]
    for _ in range(n):
        chains = [a * seed + seed * np.float32(1e-7) for a in chains]
    lanes_total = np.float32(0)
    for a in chains:
        lanes_total += a
    expected = np.float32(0)
    for _ in range(lanes):
        expected += lanes_total
    assert kernel(n, float(seed)) == pytest.approx(float(expected), rel=1e-6)


def test_the_tool_reports_both_builds():
    from bench import peak

    measured = peak.measure(repeat=1, iterations=1000)
    assert measured.lanes >= 1 and measured.separate > 0 and measured.fused > 0
