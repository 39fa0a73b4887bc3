"""Program-local names: nodes, loop symbols and locals named by label and order of appearance.

Nodes, symbols and scope ids carry process-global ids, so names built from them change when
unrelated tensors are built first: the same model would render different C in two processes
and miss the compiled-object cache. Inside `stable_names()`, printing a node, a symbol or a
local asks the active `Names` instead, which hands out names in order of first request:
nodes by label (`w1`, then `w1_2` for a second node labelled `w1`), symbols by their prefix
and a counter from 0 (`i0`, `i1`), locals `v0_`, `v1_`. Renderers query names in program
order, so "first request" is "first appearance". Outside the context, names keep the global
id, which is what debug output and error messages want.

Nodes, symbols and scope ids are duck-typed; the only einjit import is the reserved C names.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from einjit.ir import c_names

# Everything a routine name may not be (C/C++/CUDA keywords, libm and libc names, einjit's
# helpers), and the fixed identifiers of the renderers: a node labelled `exp` or `z` must not
# shadow them.
RENDERER_NAMES = frozenset("z vec_base vec_k grid block half".split())


def is_reserved(name: str) -> bool:
    return c_names.is_reserved(name) or name in RENDERER_NAMES


RESERVED_PREFIXES = ("merge_", "einjit", "EINJIT", "g_", "__")


MAX_BASE = 64
"""The longest name a label gives a node; longer labels are cut (the program's names stay
distinct: `Names` numbers repeated bases)."""


def _identifier(text: str) -> str:
    """Letters, digits and `_` of `text` (ASCII only: the user's label must not decide which
    characters the compiler reads), cut to `MAX_BASE`."""
    clean = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")[:MAX_BASE].rstrip("_") or "n"
    return "n" + clean if clean[0].isdigit() else clean


def node_base(label: list[str]) -> str:
    """The C identifier a node's label suggests (its first two label parts)."""
    return _base("_".join(label[:2]) if label else "n")


@functools.lru_cache(maxsize=1 << 16)
def _base(text: str) -> str:
    """Remembered: a program names thousands of nodes from far fewer labels (a deep model's
    blocks repeat theirs), and the program cache's key names every node of the graph."""
    base = _identifier(text)
    return "n_" + base if is_reserved(base) or base.startswith(RESERVED_PREFIXES) else base


class Names:
    """The names of one program; every name is distinct from every other and none is reserved."""

    def __init__(self) -> None:
        self._given: dict[tuple[str, int], str] = {}
        self._used: set[str] = set()
        self._counters: dict[str, int] = {}
        self._suffixes: dict[str, int] = {}
        self.requests: list[tuple[str, Any]] | None = None
        """While a list, every node, symbol and scope id whose name is asked, in order: the C
        renderer records a nest's and asks the same of the nests it copies instead of
        rendering them, so that names are handed out as if it had rendered them."""

    def _take(self, key: tuple[str, int], candidates: Iterator[str]) -> str:
        name = self._given.get(key)
        if name is None:
            name = next(c for c in candidates if c not in self._used and not is_reserved(c))
            self._used.add(name)
            self._given[key] = name
        return name

    def node(self, tn: Any) -> str:
        if self.requests is not None:
            self.requests.append(("node", tn))
        key = ("node", tn.id)
        name = self._given.get(key)
        if name is not None:
            return name
        base = node_base(tn.label)
        k = self._suffixes.get(base, 1)
        name = base if k == 1 else f"{base}_{k}"
        if name not in self._used and not is_reserved(name):
            # `_take`'s answer when the base's next name is free, without its generator:
            # keying a program names every node of the graph
            self._suffixes[base] = k + 1
            self._used.add(name)
            self._given[key] = name
            return name
        return self._take(key, self._suffixed(base))

    def symbol(self, s: Any) -> str:
        if self.requests is not None:
            self.requests.append(("symbol", s))
        return self._take(("symbol", s.id), self._counted(_identifier(s.name), ""))

    def local(self, sid: Any) -> str:
        if self.requests is not None:
            self.requests.append(("local", sid))
        return self._take(("local", sid.id), self._counted("v", "_"))

    def _suffixed(self, base: str) -> Iterator[str]:
        """`base`, `base_2`, `base_3`... from the first one not yet passed over: the ones before
        were taken, and stay taken, so a program of n nodes labelled alike costs O(n) names."""
        k = self._suffixes.get(base, 1)
        while True:
            self._suffixes[base] = k + 1
            yield base if k == 1 else f"{base}_{k}"
            k += 1

    def _counted(self, prefix: str, suffix: str) -> Iterator[str]:
        while True:
            k = self._counters.get(prefix, 0)
            self._counters[prefix] = k + 1
            yield f"{prefix}{k}{suffix}"




_current: ContextVar[Names | None] = ContextVar("einjit_names", default=None)


def current() -> Names | None:
    """The active program's names, or None outside `stable_names()`."""
    return _current.get()


@contextmanager
def stable_names() -> Iterator[Names]:
    """Name everything printed inside by order of appearance; nested uses share the outer names,
    so a program rendered in parts names each node the same way in every part."""
    active = _current.get()
    if active is not None:
        yield active
        return
    names = Names()
    token = _current.set(names)
    try:
        yield names
    finally:
        _current.reset(token)
