"""Iterative walks over low-level code for the optimizer's analyses.

Inlining nests computations inside each other, so expressions get as deep as the longest
chain of virtual nodes. These walks keep an explicit stack: their cost is linear in the size
of the code whatever its depth (a chain of nested generators costs the depth at every step).
"""

from __future__ import annotations

from typing import Iterator as PyIterator

from einjit.ir import low_level as ll


def block_statements(stmt: ll.LLStmt) -> PyIterator[ll.LLStmt]:
    """The statements of a block and of its loops (loops included), not those inside local
    scopes — which only ever set locals."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        match s:
            case ll.Seq(a, b):
                stack.append(b)
                stack.append(a)
            case ll.Noop():
                pass
            case ll.ForLoop(body=body):
                yield s
                stack.append(body)
            case _:
                yield s


def deep_parts(root: ll.LLStmt | ll.LLScalar) -> PyIterator[ll.LLStmt | ll.LLScalar]:
    """Every statement and every expression under `root`, local-scope bodies included."""
    stack: list[ll.LLStmt | ll.LLScalar] = [root]
    while stack:
        x = stack.pop()
        match x:
            case ll.Seq(a, b):
                stack.append(b)
                stack.append(a)
                continue
            case ll.Noop():
                continue
        yield x
        match x:
            case ll.ForLoop(body=body) | ll.LocalScope(body=body):
                stack.append(body)
            case ll.Set(llsc=sc) | ll.SetFromVec(arg=sc) | ll.SetLocal(value=sc):
                stack.append(sc)
            case _:
                stack.extend(reversed(ll.scalar_children(x)))
