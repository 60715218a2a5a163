"""The backend registry (ocannl/backends/registry.py): the built-in backends are entry points
loaded on first use, as plug-ins are; the plug-in API of docs/backends.md is importable."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from ocannl.backends import registry

DOCS = Path(__file__).resolve().parents[2] / "docs" / "backends.md"


def test_every_built_in_backend_is_an_entry_point_of_the_plugin_group():
    for entry_point, _, _ in registry.BUILT_IN_BACKENDS:
        assert entry_point.group == registry.ENTRY_POINT_GROUP
        assert entry_point.name in registry.registered_backends()
    assert registry.get_backend("interp", interp_mode="scalar").name == "interp"


def test_listing_the_backends_imports_none_of_them():
    """Registration reads the built-ins' table, so importing ocannl imports no backend (Triton's
    imports torch)."""
    packages = ["ocannl.backends.c", "ocannl.backends.triton", "ocannl.backends.metal", "ocannl.backends.interp",
                "torch"]
    code = ("import sys, ocannl; from ocannl.backends import registry; registry.registered_backends(); "
            f"print(sorted(m for m in sys.modules if m.rsplit('.', 1)[0] in {packages} or m in {packages}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_availability_reports_a_failing_probe_instead_of_raising(monkeypatch):
    class Probe:
        def available(self):
            raise RuntimeError("no driver")

    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    registry.register_backend("probe", Probe, preference=-100)
    assert registry.availability("probe") == (False, "its availability check failed: RuntimeError: no driver")
    assert registry.availability("interp")[0]


def test_the_names_docs_backends_md_gives_to_plugin_authors_exist():
    import importlib

    cited = set(re.findall(r"`(ocannl\.backends\.base\.\w+)", DOCS.read_text()))
    assert cited, "docs/backends.md names the plug-in API"
    for name in cited:
        module, attribute = name.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), attribute), name
