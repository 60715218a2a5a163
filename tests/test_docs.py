"""The documentation ships with the code: every file a comment, docstring or document names is in
the repository, every section it names exists, and nothing cites documents a user of the
repository does not have (the design notes and specifications the project was written from).

Scanned: the package, the tests, the benchmarks, the examples, ``README.md``, ``Makefile`` and
``docs/``. A citation reads ``docs/shapes.md, "Einsum grammar"`` or ``docs/shapes.md#einsum-grammar``
(the anchor of a heading as GitHub renders it); a file path starts with one of the repository's
top-level folders (``ocannl/lowlevel/optimize.py``, ``golden/c/``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("ocannl", "tests", "bench", "examples", "docs", "README.md", "Makefile")
TEXT_SUFFIXES = {".py", ".md", ".c", ".h", ".cpp", ".hpp", ".toml", ".txt", ".cfg"}
SKIPPED_DIRS = {"__pycache__", "build", "dist", ".pytest_cache"}

# A path into the repository: a top-level folder, then at least one more component. Preceded by
# nothing path-like (so URLs and longer paths that merely contain ``docs/...`` are not read as
# ours), and ending on a word character (so a path ending a sentence leaves its full stop out).
# Placeholders such as ``golden/<name>`` do not match.
PATH = re.compile(r"(?<![\w/.\-])((?:docs|ocannl|golden|tests|bench|examples)/[\w./\-]*\w)")
# A section cited by name after a document, ``docs/shapes.md, "Einsum grammar"`` (backticks
# allowed around the path), or by anchor, ``docs/shapes.md#einsum-grammar``.
SECTION = re.compile(r"(docs/[\w\-/]+\.md)`?,\s*\"([^\"\n]+)\"")
ANCHOR = re.compile(r"(docs/[\w\-/]+\.md)#([\w\-]+)")
LOCAL_ANCHOR = re.compile(r"\]\(#([\w\-]+)\)")

# What a user of the repository cannot open. Spelled in pieces, so that this file does not name
# them itself.
FORBIDDEN = {
    "spec" + "/": "the specification folder",
    "DESIGN" + ".md": "the design notes",
    "STYLE" + ".md": "the style notes",
    "shared" + "/": "the shared notes folder",
}
SECTION_NUMBER = re.compile("\u00a7" + r"\s*\d")  # a numbered section of a document not shipped


def _scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        top = ROOT / name
        if top.is_file():
            files.append(top)
            continue
        for path in sorted(top.rglob("*")):
            if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in path.relative_to(ROOT).parts):
                continue
            if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name in ("Makefile", "metal_stdlib")):
                files.append(path)
    return files


THIS_FILE = Path(__file__).resolve()
FILES = _scanned_files()
CHECKED = [p for p in FILES if p != THIS_FILE]
"""This file names wrong paths and sections on purpose, as samples for the patterns."""


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than ``-`` and ``_``
    dropped, spaces as ``-``."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _headings(doc: Path) -> list[str]:
    """The headings of a Markdown file, outside fenced code blocks."""
    out: list[str] = []
    fenced = False
    for line in _text(doc).splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            out.append(re.sub(r"[`*]", "", m.group(1)))
    return out


def _where(path: Path, text: str, pos: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, pos) + 1}"


def test_the_scan_sees_the_repository():
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"README.md", "ocannl/ops.py", "docs/design.md", "tests/test_docs.py"} <= names


def test_every_named_path_exists():
    missing = []
    for path in CHECKED:
        text = _text(path)
        for m in PATH.finditer(text):
            if not (ROOT / m.group(1)).exists():
                missing.append(f"{_where(path, text, m.start())}: {m.group(1)}")
    assert not missing, "paths that are not in the repository:\n" + "\n".join(missing)


def test_every_cited_section_exists():
    missing = []
    for path in CHECKED:
        text = _text(path)
        for m in SECTION.finditer(text):
            doc = ROOT / m.group(1)
            titles = {h.lower() for h in _headings(doc)} if doc.is_file() else set()
            if m.group(2).lower() not in titles:
                missing.append(f"{_where(path, text, m.start())}: {m.group(1)}, \"{m.group(2)}\"")
        for m in ANCHOR.finditer(text):
            doc = ROOT / m.group(1)
            if not doc.is_file() or m.group(2) not in {_slug(h) for h in _headings(doc)}:
                missing.append(f"{_where(path, text, m.start())}: {m.group(0)}")
        if path.suffix == ".md":
            slugs = {_slug(h) for h in _headings(path)}
            for m in LOCAL_ANCHOR.finditer(text):
                if m.group(1) not in slugs:
                    missing.append(f"{_where(path, text, m.start())}: #{m.group(1)}")
    assert not missing, "sections that do not exist:\n" + "\n".join(missing)


def test_nothing_cites_documents_outside_the_repository():
    found = []
    for path in CHECKED:
        text = _text(path)
        for needle, what in FORBIDDEN.items():
            for m in re.finditer(re.escape(needle), text):
                found.append(f"{_where(path, text, m.start())}: {what} ({needle})")
        for m in SECTION_NUMBER.finditer(text):
            found.append(f"{_where(path, text, m.start())}: a numbered section ({m.group(0)})")
    assert not found, ("citations of documents users do not have; cite a file of docs/ or the module "
                       "that holds the rule instead:\n" + "\n".join(found))


@pytest.mark.parametrize("heading, slug", [
    ("Einsum grammar", "einsum-grammar"),
    ("The `.cd` printer", "the-cd-printer"),
    ("Departures from the original OCANNL", "departures-from-the-original-ocannl"),
    ("Tensors, code and gradients", "tensors-code-and-gradients"),
])
def test_anchors_are_githubs(heading, slug):
    assert _slug(heading) == slug


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The patterns find a wrong path, a wrong section and a forbidden citation in a sample."""
    sample = ('see docs/nowhere.md and ocannl/ops.py; docs/shapes.md, "No such section"; '
              'docs/shapes.md#no-such-anchor; ' + "spec" + "/frontend.md " + "\u00a7" + "2.1")
    paths = [m.group(1) for m in PATH.finditer(sample)]
    assert paths == ["docs/nowhere.md", "ocannl/ops.py", "docs/shapes.md", "docs/shapes.md"]
    assert not (ROOT / "docs/nowhere.md").exists() and (ROOT / "ocannl/ops.py").exists()
    (section,) = SECTION.finditer(sample)
    assert section.group(2) not in _headings(ROOT / "docs/shapes.md")
    (anchor,) = ANCHOR.finditer(sample)
    assert anchor.group(2) not in {_slug(h) for h in _headings(ROOT / "docs/shapes.md")}
    assert SECTION_NUMBER.search(sample) and any(n in sample for n in FORBIDDEN)
