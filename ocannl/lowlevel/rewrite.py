"""Rewriting the loop IR: rebuild statements and expressions bottom-up, sharing what does not change.

Every pass that transforms the loop IR (the optimizer's inlining, simplification, CSE and FMA
passes; the summation pass copying a term at new indices) walks the same trees, so the walk is
written once, in :class:`Rewriter`: a pass overrides the cases it changes and leaves the others
to the ``rebuild_*`` methods, which recurse into every child. A subtree that comes back unchanged
is returned as the same object, so a pass that changes nothing costs no allocation and callers
can test ``new is old``.

:class:`FreshCopy` is the rewriter both inlining and blocked summation need: a copy of IR that
can run beside the original, at other indices.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ocannl.lowlevel.analysis import substitute_index
from ocannl.lowlevel.indexing import AnySymbol, AxisIndex, Iter, Symbol
from ocannl.lowlevel.ir import (
    Binary, Cast, Comment, Const, DeclareLocal, EmbedIndex, Expr, Fill, For, GetLocal, Load, LoadDynamic, Local,
    LocalScope, Seq, SetLocal, Stmt, Store, StoreDynamic, Ternary, Unary, seq,
)


def rebuilt(obj: Any, **changes: Any) -> Any:
    """``obj`` with fields changed, or ``obj`` itself when every new value is the old one."""
    for name, value in changes.items():
        if getattr(obj, name) is not value:
            return replace(obj, **changes)
    return obj


class Rewriter:
    """Rebuilds statements and expressions bottom-up, sharing what does not change. Subclasses
    override :meth:`stmt`, :meth:`expr` or :meth:`index` and call the ``rebuild_*`` methods to
    recurse; children are visited in evaluation order (a store's indices before its value), so a
    pass that renames as it goes sees each binding before its uses."""

    def stmt(self, s: Stmt) -> Stmt:
        return self.rebuild_stmt(s)

    def expr(self, e: Expr) -> Expr:
        return self.rebuild_expr(e)

    def index(self, i: AxisIndex) -> AxisIndex:
        return i

    def indices(self, idx: tuple[AxisIndex, ...]) -> tuple[AxisIndex, ...]:
        new = tuple(map(self.index, idx))
        for a, b in zip(new, idx):
            if a is not b:
                return new
        return idx

    # The rebuilders dispatch on the class and call the constructors themselves: every pass
    # rebuilds every node of a routine, and a ``match`` tries its cases in turn, as
    # ``dataclasses.replace`` looks the fields up, on each node.

    def rebuild_stmt(self, s: Stmt) -> Stmt:
        """``s`` with its children rewritten; a sequence that changes is flattened (:func:`seq`)."""
        kind = type(s)
        if kind is Store:
            indices, value = self.indices(s.indices), self.expr(s.value)
            if indices is s.indices and value is s.value:
                return s
            return Store(s.tnode, indices, value, s.skip_oob)
        if kind is For:
            body = self.stmt(s.body)
            return s if body is s.body else For(s.symbol, s.extent, body, s.kind)
        if kind is Seq:
            parts = [self.stmt(x) for x in s.stmts]
            for a, b in zip(parts, s.stmts):
                if a is not b:
                    return seq(*parts)
            return s
        if kind is SetLocal:
            value = self.expr(s.value)
            return s if value is s.value else SetLocal(s.local, value)
        if kind is StoreDynamic:
            position, indices, value = self.expr(s.position), self.indices(s.indices), self.expr(s.value)
            if position is s.position and indices is s.indices and value is s.value:
                return s
            return StoreDynamic(s.tnode, s.axis, position, indices, value)
        if kind is Fill or kind is Comment or kind is DeclareLocal:
            return s
        raise TypeError(f"not a loop IR statement: {s!r}")

    def rebuild_expr(self, e: Expr) -> Expr:
        """``e`` with its children rewritten (a local scope's body included)."""
        kind = type(e)
        if kind is Binary:
            a, b = self.expr(e.a), self.expr(e.b)
            return e if a is e.a and b is e.b else Binary(e.op, a, b)
        if kind is Load:
            indices = self.indices(e.indices)
            return e if indices is e.indices else Load(e.tnode, indices, e.oob_value)
        if kind is Const or kind is GetLocal:
            return e
        if kind is Unary:
            x = self.expr(e.x)
            return e if x is e.x else Unary(e.op, x, e.to)
        if kind is Cast:
            x = self.expr(e.x)
            return e if x is e.x else Cast(x, e.dtype)
        if kind is Ternary:
            a, b, c = self.expr(e.a), self.expr(e.b), self.expr(e.c)
            return e if a is e.a and b is e.b and c is e.c else Ternary(e.op, a, b, c)
        if kind is LoadDynamic:
            position, indices = self.expr(e.position), self.indices(e.indices)
            if position is e.position and indices is e.indices:
                return e
            return LoadDynamic(e.tnode, e.axis, position, indices)
        if kind is EmbedIndex:
            index = self.index(e.index)
            return e if index is e.index else EmbedIndex(index, e.dtype)
        if kind is LocalScope:
            body = self.stmt(e.body)
            return e if body is e.body else LocalScope(e.local, body)
        raise TypeError(f"not a loop IR expression: {e!r}")


class FreshCopy(Rewriter):
    """A copy that can run beside the original: each symbol of ``env`` replaced by its index,
    and every loop and local bound inside the copy renamed fresh, so that two copies never share
    a loop iterator or a local (the summation pass copies a term once per block, the optimizer a
    producer once per read)."""

    def __init__(self, env: Mapping[AnySymbol, AxisIndex]):
        self.env = dict(env)
        self.locals: dict[Local, Local] = {}

    def index(self, i: AxisIndex) -> AxisIndex:
        return substitute_index(i, self.env)

    def bind(self, old: Local) -> Local:
        """A fresh local standing for ``old`` from its binding on."""
        self.locals[old] = Local(old.dtype)
        return self.locals[old]

    def renamed(self, old: Local) -> Local:
        """What a use of ``old`` refers to in the copy (itself when bound outside it)."""
        return self.locals.get(old, old)

    def stmt(self, s: Stmt) -> Stmt:
        match s:
            case For(symbol=symbol, body=body):
                fresh = Symbol()
                self.env[symbol] = Iter(fresh)
                return replace(s, symbol=fresh, body=self.stmt(body))
            case DeclareLocal(local=local):
                return DeclareLocal(self.bind(local))
            case SetLocal(local=local, value=value):
                return SetLocal(self.renamed(local), self.expr(value))
        return self.rebuild_stmt(s)

    def expr(self, e: Expr) -> Expr:
        match e:
            case GetLocal(local=local):
                return GetLocal(self.renamed(local))
            case LocalScope(local=local, body=body):
                return LocalScope(self.bind(local), self.stmt(body))
        return self.rebuild_expr(e)
