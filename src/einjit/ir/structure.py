"""The structure of low-level code up to a renaming of its nodes and symbols.

Deep models repeat the same computation on other tensors (every block of a transformer, in
forward and in backward). A pass whose result depends only on the code's shape can compute it
once per structure and carry it over to the other instances: tracing replays the events of
the first statement of a structure, the C renderer calls the function of the first nest. Two
statements have equal keys when they are equal after renaming their nodes and symbols in
order of first appearance, each node also compared by what `node_key` says of it (its dims
for tracing; everything rendering reads for the renderer). Comments and fields left out of
equality (a statement's debug text) are left out: they name one instance's tensors.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, Symbol
from einjit.ir.tnode import Tnode

_FIELDS: dict[type, Callable[[object], tuple]] = {}
"""Per dataclass: its compared fields' values, as a tuple."""
_ATOMS: set[type] = {int, str, bool, type(None)}
"""Types whose values stand for themselves in a key (hashable, no fields)."""


@dataclass(frozen=True, slots=True, eq=False)
class Structure:
    """`key` hashes the structure; `nodes`, `symbols` and `scopes` (local scalars) are the
    statement's own, in the order the key numbers them, so that instances of one key
    correspond position by position."""

    key: Hashable
    nodes: list[Tnode]
    symbols: list[Symbol]
    scopes: list[ll.ScopeId]


def _getter(names: tuple[str, ...]) -> Callable[[object], tuple]:
    if len(names) > 1:
        return operator.attrgetter(*names)
    name = names[0]
    return lambda x: (getattr(x, name),)


def structure(stmt: ll.LLStmt, node_key: Callable[[Tnode], Hashable],
              symbol_key: Callable[[Symbol], Hashable] = lambda s: None) -> Structure:
    """The structure of `stmt`; `symbol_key` tells symbols apart beyond their numbering (the
    renderer's static symbols keep their names)."""
    nodes: dict[Tnode, int] = {}
    symbols: dict[Symbol, int] = {}
    scopes: dict[ll.ScopeId, int] = {}
    atoms = _ATOMS  # tested inline: 40% of the parts walked are flags, counts and None

    def walk(x: object, walk: Callable[[object, Any], Hashable]) -> Hashable:
        """`walk` is itself, as an argument: a closure naming itself is a reference cycle,
        which a compile left for the cyclic collector once per statement and nest."""
        kind = type(x)
        if kind in _ATOMS:
            return x
        if kind is Tnode:
            assert isinstance(x, Tnode)
            return _numbered(nodes, "node", x, node_key)
        if kind is Symbol:
            assert isinstance(x, Symbol)
            return _numbered(symbols, "symbol", x, symbol_key)
        if kind is Iterator:  # a third of the parts walked: its one field read directly
            assert isinstance(x, Iterator)
            return (kind, _numbered(symbols, "symbol", x.symbol, symbol_key))
        if kind is tuple or kind is list:
            assert isinstance(x, (tuple, list))
            return (kind, *[y if type(y) in atoms else walk(y, walk) for y in x])
        if kind is ll.ScopeId:
            assert isinstance(x, ll.ScopeId)
            return ("scope", scopes.setdefault(x, len(scopes)), walk(x.tn, walk))
        if kind is ll.Comment:
            return ("comment",)
        if kind is float:
            return ("float", repr(x))
        fields = _FIELDS.get(kind)
        if fields is None:
            names = (tuple(f.name for f in dataclasses.fields(kind) if f.compare)
                     if dataclasses.is_dataclass(kind) else ())
            if not names:
                if not isinstance(x, Hashable):
                    return ("object", id(x))
                _ATOMS.add(kind)
                return x
            fields = _FIELDS[kind] = _getter(names)
        return (kind, *[y if type(y) in atoms else walk(y, walk) for y in fields(x)])

    key = walk(stmt, walk)
    return Structure(key, list(nodes), list(symbols), list(scopes))


def _numbered(seen: dict, tag: str, x: Hashable, key: Callable[[Any], Hashable]) -> Hashable:
    """`x` by its number in order of first appearance; its `key` (what it is) at that first
    appearance only, so two structures match when they use alike things in the same pattern."""
    k = seen.get(x)
    if k is None:
        k = seen[x] = len(seen)
        return (tag, k, key(x))
    return (tag, k)
