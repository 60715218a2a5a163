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
    if all(getattr(obj, k) is v for k, v in changes.items()):
        return obj
    return replace(obj, **changes)


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
        new = tuple(self.index(i) for i in idx)
        return idx if all(a is b for a, b in zip(new, idx)) else new

    def rebuild_stmt(self, s: Stmt) -> Stmt:
        """``s`` with its children rewritten; a sequence that changes is flattened (:func:`seq`)."""
        match s:
            case For(body=body):
                return rebuilt(s, body=self.stmt(body))
            case Seq(stmts=stmts):
                parts = [self.stmt(x) for x in stmts]
                if all(a is b for a, b in zip(parts, stmts)):
                    return s
                return seq(*parts)
            case Store(indices=indices, value=value):
                return rebuilt(s, indices=self.indices(indices), value=self.expr(value))
            case StoreDynamic(position=p, indices=indices, value=value):
                return rebuilt(s, position=self.expr(p), indices=self.indices(indices), value=self.expr(value))
            case Fill() | Comment() | DeclareLocal():
                return s
            case SetLocal(value=value):
                return rebuilt(s, value=self.expr(value))
        raise TypeError(f"not a loop IR statement: {s!r}")

    def rebuild_expr(self, e: Expr) -> Expr:
        """``e`` with its children rewritten (a local scope's body included)."""
        match e:
            case Const() | GetLocal():
                return e
            case Load(indices=indices):
                return rebuilt(e, indices=self.indices(indices))
            case LoadDynamic(position=p, indices=indices):
                return rebuilt(e, position=self.expr(p), indices=self.indices(indices))
            case Unary(x=x) | Cast(x=x):
                return rebuilt(e, x=self.expr(x))
            case Binary(a=a, b=b):
                return rebuilt(e, a=self.expr(a), b=self.expr(b))
            case Ternary(a=a, b=b, c=c):
                return rebuilt(e, a=self.expr(a), b=self.expr(b), c=self.expr(c))
            case EmbedIndex(index=index):
                return rebuilt(e, index=self.index(index))
            case LocalScope(body=body):
                return rebuilt(e, body=self.stmt(body))
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
