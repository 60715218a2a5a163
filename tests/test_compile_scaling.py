"""``bench/compile_scaling.py``: its GPT mode builds the benchmark's GPT at a given depth from an
empty kernel cache and reports where the time went (a run of the tool, not a timed assertion)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.backend_params import runs_here

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ and examples/

pytestmark = pytest.mark.skipif(not runs_here("c"), reason="the tool measures the c backend")


def test_the_gpt_mode_builds_a_gpt_of_the_given_depth_and_leaves_the_cache_setting_alone():
    from bench import compile_scaling

    before = os.environ.get("OCANNL_CACHE_DIR")
    measured = compile_scaling.gpt_build(1)
    assert os.environ.get("OCANNL_CACHE_DIR") == before
    assert set(measured) == {"total", "python", "cc"} and all(v > 0 for v in measured.values())
