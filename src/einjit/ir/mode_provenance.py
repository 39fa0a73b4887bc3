"""Which routine made a node virtual, for messages that tell a user what to call.

A node's `provenance` (see `ir.provenance`) says what decided its memory mode; this module keeps
what the number alone cannot say: which routine inlined a node's computation, so that a later
routine reading the node can name it.
"""

from __future__ import annotations

import weakref

from einjit.ir.tnode import Tnode

_virtual_by: weakref.WeakKeyDictionary[Tnode, str] = weakref.WeakKeyDictionary()


def record_virtual(tn: Tnode, routine: str) -> None:
    """The first routine that inlined `tn`'s computation (later ones do not change it)."""
    _virtual_by.setdefault(tn, routine or "<routine>")


def virtual_by(tn: Tnode) -> str | None:
    return _virtual_by.get(tn)
