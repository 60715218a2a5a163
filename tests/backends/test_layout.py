"""The backends' folders are independent: what two backends share sits beside them in
``ocannl/backends/`` (the toolchains, the kernel cache, the partitioner, the native executable's
checks), so no module of one backend's folder imports another backend's folder."""

from __future__ import annotations

from pathlib import Path

import ocannl.backends
from tests.imports import imported_modules

BACKENDS_DIR = Path(ocannl.backends.__file__).resolve().parent
FOLDERS = sorted(p.name for p in BACKENDS_DIR.iterdir() if (p / "__init__.py").exists())


def backend_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["ocannl", "backends"] and len(parts) > 2 and parts[2] in FOLDERS:
        return parts[2]
    return None


def test_the_backend_folders_are_found():
    assert {"c", "interp", "metal", "triton"} <= set(FOLDERS)


def test_no_backend_folder_imports_another():
    crossings = []
    for folder in FOLDERS:
        for path in sorted((BACKENDS_DIR / folder).rglob("*.py")):
            relative = path.relative_to(BACKENDS_DIR).with_suffix("")
            parts = ["ocannl", "backends", *relative.parts]
            package = ".".join(parts if path.name == "__init__.py" else parts[:-1])
            for line, module in imported_modules(path, package):
                other = backend_of(module)
                if other is not None and other != folder:
                    crossings.append(f"ocannl/backends/{relative}.py:{line} imports {module}")
    assert not crossings, "\n".join(crossings)


def test_the_check_sees_every_form_of_import(tmp_path):
    """The walk above reads ``import``, ``from ... import`` and relative imports alike."""
    module = tmp_path / "m.py"
    module.write_text("import ocannl.backends.c.compiler\nfrom ocannl.backends import triton\n"
                      "from ..metal import harness\nfrom . import emit\n")
    seen = [backend_of(m) for _, m in imported_modules(module, "ocannl.backends.interp")]
    assert {"c", "triton", "metal", "interp"} <= set(seen)
