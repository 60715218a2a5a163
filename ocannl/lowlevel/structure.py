"""A statement's structure: the statement up to which nodes, loop symbols and locals it names.

A deep network repeats its layers, so most of a training routine's loop nests come in families
that differ only in their buffers and in the loop symbols and locals lowering made for each
(fresh objects, compared by identity). :func:`structure` gives a statement a key that families
share: the statement's every field, each node replaced by its number in order of first
appearance and what a printer may read of it (dims, dtype, memory mode, and what the caller
adds), each symbol and local by its number in order of first appearance. Two statements with
equal keys print the same code once their nodes, symbols and locals are named: the C target
prints the helper function of a family once (``ocannl/backends/c/target.py``).

CSE's keys (``_KeyCache`` in ``ocannl/lowlevel/optimize.py``) are coarser in one way and finer
in another: they number only the symbols and locals an expression binds, keeping nodes and free
symbols as themselves, and so can remember each sub-expression's key; here nothing is kept as
itself, and a key depends on the whole statement.

Anything else a statement holds (constants, operators, index symbols, dtypes) is part of the key
as it is; a float by its bits (``0.0`` and ``-0.0`` differ, as their products do); an object of
a kind not listed here by its identity, so two statements holding one never share a key.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from ocannl.lowlevel.dtypes import DType
from ocannl.lowlevel.indexing import IndexSymbol, Iter, Symbol
from ocannl.lowlevel.ir import Binary, For, Local, LoopKind, Stmt
from ocannl.lowlevel.scalar_ops import Binop
from ocannl.lowlevel.tnode import TNode


@dataclass(frozen=True)
class Structure:
    """``key``: the statement's structure (module docstring); ``nodes``, ``symbols``,
    ``locals``: what it names, each in order of first appearance, the order of their numbers in
    ``key``."""

    key: Hashable
    nodes: tuple[TNode, ...]
    symbols: tuple[Symbol, ...]
    locals: tuple[Local, ...]


_FIELDS: dict[type, Callable[[object], tuple]] = {}
"""Each dataclass type's :func:`field_values`, made by :func:`_kind`."""
_PLAIN = (int, str, bool, type(None), enum.Enum, DType, IndexSymbol)


def structure(stmt: Stmt, node_facts: Callable[[TNode], Hashable] = lambda node: ()) -> Structure:
    """The :class:`Structure` of ``stmt``; ``node_facts(node)`` adds to each node's entry what the
    caller's printing reads of it beyond its dims, dtype and memory mode."""
    nodes: dict[TNode, int] = {}
    symbols: dict[Symbol, int] = {}
    locals_: dict[Local, int] = {}

    def symbol(x: Symbol) -> Hashable:
        return ("symbol", symbols.setdefault(x, len(symbols)))

    def walk(x: object) -> Hashable:
        cls = type(x)
        # The commonest nodes first, their fields walked here, each as the general case below
        # would: a walk visits every field of a deep network's statements.
        if cls is Iter and type(x.symbol) is Symbol:
            return ("Iter", symbol(x.symbol))
        if cls is Binary:
            return ("Binary", (_BINOP, x.op), walk(x.a), walk(x.b))
        if cls is For and type(x.symbol) is Symbol and type(x.extent) is int:
            return ("For", symbol(x.symbol), ("int", x.extent), walk(x.body), (_LOOP_KIND, x.kind))
        kind = _KINDS.get(cls) or _kind(cls)
        if kind == "dataclass":
            return (cls.__name__, *map(walk, _FIELDS[cls](x)))
        if kind == "sequence":
            return (cls.__name__, *map(walk, x))
        if kind == "plain":
            return (type(x).__name__, x)
        if kind == "symbol":
            return ("symbol", symbols.setdefault(x, len(symbols)))
        if kind == "node":
            k = nodes.get(x)
            if k is not None:
                return ("node", k)
            nodes[x] = len(nodes)
            return ("node", len(nodes) - 1, x.dims, x.dtype, x.memory_mode, node_facts(x))
        if kind == "local":
            k = locals_.get(x)
            if k is not None:
                return ("local", k)
            locals_[x] = len(locals_)
            return ("local", len(locals_) - 1, *map(walk, _FIELDS[cls](x)))
        if kind == "float":
            return ("float", struct.pack("<d", x))
        return ("object", id(x))  # kept alive by the statement, so its id is its own

    key = walk(stmt)
    return Structure(key, tuple(nodes), tuple(symbols), tuple(locals_))


def sequence_structure(parts: Sequence[Structure]) -> Structure:
    """The structure of statements run in sequence, from theirs: each statement's key, with
    which of the sequence's nodes, symbols and locals its own numbers stand for (numbered in
    order of first appearance over the sequence). Two sequences get equal keys exactly when
    their statements do and they share the same nodes, symbols and locals between statements,
    so the key tells what one walk over the sequence would; a caller that already holds its
    statements' structures (``ocannl/backends/c/target.py``: a long routine's parts, made of the
    statements it prints one by one) walks none of them again."""
    nodes: dict[TNode, int] = {}
    symbols: dict[Symbol, int] = {}
    locals_: dict[Local, int] = {}
    key = tuple((part.key, tuple(nodes.setdefault(x, len(nodes)) for x in part.nodes),
                 tuple(symbols.setdefault(x, len(symbols)) for x in part.symbols),
                 tuple(locals_.setdefault(x, len(locals_)) for x in part.locals)) for part in parts)
    return Structure(("sequence", key), tuple(nodes), tuple(symbols), tuple(locals_))


_OBJECT_ID = re.compile(r"\('object', \d+\)")


def fingerprint(key: Hashable) -> int:
    """A 32-bit number of a structure's ``key``, the same in every process (Python's ``hash`` of
    a string is salted per process): a decision taken from it, such as where a long routine's
    parts begin (``cpu_schedule.plan_parts``), gives the same source on every run. Objects held
    by identity count as one value here, so two keys differing only there share a fingerprint."""
    return zlib.crc32(_OBJECT_ID.sub("?", repr(key)).encode())


_BINOP, _LOOP_KIND = Binop.__name__, LoopKind.__name__

_KINDS: dict[type, str] = {}
"""What :func:`structure`'s walk does with a value of each type (:func:`_kind`), by its exact
type: a walk visits every field of a deep network's statements, and one dictionary lookup a
value is cheaper than a chain of ``isinstance`` tests."""


def _kind(cls: type) -> str:
    """How :func:`structure` walks a value of type ``cls``, remembered in :data:`_KINDS`."""
    if issubclass(cls, TNode):
        kind = "node"
    elif issubclass(cls, Symbol):
        kind = "symbol"
    elif issubclass(cls, Local):
        kind = "local"
    elif issubclass(cls, float):
        kind = "float"
    elif issubclass(cls, (tuple, list)):
        kind = "sequence"
    elif issubclass(cls, _PLAIN):
        kind = "plain"
    elif dataclasses.is_dataclass(cls):
        kind = "dataclass"
    else:
        kind = "object"
    if kind in ("dataclass", "local"):
        _FIELDS[cls] = field_values(cls)
    _KINDS[cls] = kind
    return kind


def field_values(cls: type) -> Callable[[object], tuple]:
    """A function giving the fields of an instance of the dataclass ``cls`` as a tuple, in one
    call (:func:`operator.attrgetter`, which gives a lone field bare): the walks over every
    node of a routine (here, CSE's keys) read them so, where :func:`dataclasses.fields` builds
    the list anew at every call."""
    names = tuple(f.name for f in dataclasses.fields(cls))
    if len(names) == 1:
        name = names[0]
        return lambda x: (getattr(x, name),)
    return operator.attrgetter(*names) if names else (lambda x: ())
