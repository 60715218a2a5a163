"""Reading a module's imports without running it: what the layout tests check."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """Every module ``path`` (a module of ``package``) imports, absolute, with its line, including
    imports inside functions: the names of ``from X import name`` count as ``X.name`` as well,
    since a name may be a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def package_modules(root: Path, package: str = "ocannl") -> list[tuple[Path, str, str]]:
    """``(path, module, package)`` for every module under ``root``, the folder of ``package``."""
    modules = []
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if path.name == "__init__.py":
            parts = parts[:-1]
            modules.append((path, ".".join(parts), ".".join(parts)))
        else:
            modules.append((path, ".".join(parts), ".".join(parts[:-1])))
    return modules
