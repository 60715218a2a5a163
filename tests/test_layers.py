"""The layer contract of docs/design.md ("Layers"), checked on the source: a module imports only
from its own layer and the layers below it, and no module imports another module's private
names. A test, not a memory: an upward import fails here naming the file and line."""

from __future__ import annotations

import shutil
from pathlib import Path

import ocannl
from tests.imports import imported_modules, package_modules

PACKAGE_DIR = Path(ocannl.__file__).resolve().parent

FOUNDATION = ("ocannl.errors", "ocannl.session", "ocannl.tempfiles", "ocannl.collector")
"""Modules every layer may use: the exception types, the session's reset hooks, temporary files,
the garbage collector's pauses."""

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", FOUNDATION),
    ("lowlevel", ("ocannl.lowlevel",)),
    ("settings", ("ocannl.config",)),
    ("shape", ("ocannl.shape",)),
    ("backends", ("ocannl.backends",)),
)
"""The layers, lowest first, by module prefix; every other module of the package is the frontend
(tensors, ops, blocks, training, checkpoints), the top layer."""

MAY_IMPORT: dict[str, set[str]] = {
    "foundation": {"foundation"},
    "lowlevel": {"foundation", "lowlevel"},
    "settings": {"foundation", "settings", "lowlevel"},
    "shape": {"foundation", "lowlevel", "shape"},
    "backends": {"foundation", "lowlevel", "settings", "backends"},
    "frontend": {"foundation", "lowlevel", "settings", "shape", "backends", "frontend"},
}
"""What each layer may import. The compiler half (lowlevel, backends) never sees a tensor nor
shape inference; lowlevel takes its settings as arguments, so it never reads ``config``."""


def layer_of(module: str) -> str:
    for name, prefixes in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return name
    return "frontend"


def crossings(root: Path) -> list[str]:
    """Every import under ``root`` (a copy of the package) that breaks the contract."""
    found = []
    for path, module, package in package_modules(root):
        layer = layer_of(module)
        where = f"ocannl/{path.relative_to(root)}"
        for line, imported in imported_modules(path, package):
            if imported != "ocannl" and not imported.startswith("ocannl."):
                continue
            if imported == "ocannl":
                continue  # the `from ocannl import x` line itself; x is listed on its own
            target = layer_of(imported)
            if target not in MAY_IMPORT[layer]:
                found.append(f"{where}:{line}: the {layer} layer imports {imported} ({target})")
            private = imported.rsplit(".", 1)[-1]
            if private.startswith("_") and not private.startswith("__") and not module.startswith(
                    imported.rsplit(".", 1)[0]):
                found.append(f"{where}:{line}: imports the private name {imported}")
    return found


def test_every_import_goes_down_the_layers():
    assert not crossings(PACKAGE_DIR), "\n".join(crossings(PACKAGE_DIR))


def test_a_planted_upward_import_is_caught(tmp_path):
    copy = tmp_path / "ocannl"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "lowlevel" / "analysis.py", "a") as f:
        f.write("\nfrom ocannl import nn\n")
    with open(copy / "lowlevel" / "ir.py", "a") as f:
        f.write("\nfrom ocannl.backends.interp.interpreter import _Compiler\n")
    found = crossings(copy)
    assert any("lowlevel/analysis.py" in c and "imports ocannl.nn (frontend)" in c for c in found), found
    assert any("lowlevel/ir.py" in c and "(backends)" in c for c in found), found
    assert any("private name ocannl.backends.interp.interpreter._Compiler" in c for c in found), found


def test_the_layers_cover_the_package():
    layers = {layer_of(module) for _, module, _ in package_modules(PACKAGE_DIR)}
    assert layers == set(MAY_IMPORT)
