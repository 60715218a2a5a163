"""Golden files: printed IRs and generated sources pinned under ``golden/`` (docs/design.md, "Testing").

``check_golden(name, text, update)`` compares ``text`` with ``golden/<name>``; with ``update``
(``pytest --update-golden``, the ``update_golden`` fixture) it rewrites the file instead, and a
reviewer reads the diff.
"""

from __future__ import annotations

from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"


def check_golden(name: str, text: str, update: bool) -> None:
    path = GOLDEN_DIR / name
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        raise AssertionError(f"golden/{name} does not exist: run pytest --update-golden to create it")
    expected = path.read_text()
    assert text == expected, f"output differs from golden/{name} (pytest --update-golden rewrites it)"
