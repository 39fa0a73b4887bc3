"""Where a node's memory mode came from, for messages that tell a user what to call.

A node's `provenance` is a number (the seed's); this module keeps what the number alone
cannot say: which routine decided that a node is virtual (its computation inlined there, so
no other routine can read it), and what the tensor-level calls' provenances mean.
"""

from __future__ import annotations

import weakref

from einjit.ir.tnode import Tnode

#: Provenances of the tensor-level memory-mode calls (`Tensor.hosted()` and its siblings).
HOSTED_VALUE, HOSTED_GRAD, MATERIALIZE, VIRTUAL, ON_DEVICE = 60, 61, 62, 63, 64

_CALLS = {HOSTED_VALUE: "hosted()", HOSTED_GRAD: "hosted() (its gradient)", MATERIALIZE: "materialize()",
          VIRTUAL: "virtual()", ON_DEVICE: "on_device()"}

_virtual_by: weakref.WeakKeyDictionary[Tnode, str] = weakref.WeakKeyDictionary()


def record_virtual(tn: Tnode, routine: str) -> None:
    """The first routine that inlined `tn`'s computation (later ones do not change it)."""
    _virtual_by.setdefault(tn, routine or "<routine>")


def virtual_by(tn: Tnode) -> str | None:
    return _virtual_by.get(tn)


def describe_call(provenance: int) -> str | None:
    """The tensor method a provenance stands for, if it is one."""
    return _CALLS.get(provenance)
