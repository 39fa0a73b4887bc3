"""Zero fills a contraction makes redundant: its accumulators start at zero instead.

Lowering writes every accumulation as a zero fill (`ZeroOut`, a `memset`) followed by the nest
that adds into it, and the register-blocked kernel loads each block of the output before its
first step and stores it after the last. When the fill is the output's last write before the
nest, and the nest writes every cell of the output in one pass over its summed loops, the
kernel can start its accumulators at zero instead of loading the zeros, and the fill can go:
a dense layer's forward `x @ w` (M=1024, K=128, N=512 in the GPT step) spent a sixth of its
time writing 2 MB of zeros and reading them back, with K=128 steps per block to pay for them.
`fma(a, b, +0.0)` is what the loaded zero gave, so results are bit-identical.

`PendingZeroFills` follows a sequence of statements and says which nodes are still exactly
the zeros of a fill (nothing since has read or written them), and where that fill is.
`covers` says whether an accumulation's loops visit every cell of its node.
"""

from __future__ import annotations

from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, Iterator, Symbol
from einjit.ir.tnode import Tnode


class PendingZeroFills:
    """The zero fills of a statement sequence whose node nothing has touched since, by node:
    the position of the fill in the sequence being built."""

    def __init__(self) -> None:
        self._at: dict[Tnode, int] = {}

    @property
    def nodes(self) -> frozenset[Tnode]:
        return frozenset(self._at)

    def position(self, tn: Tnode) -> int:
        return self._at[tn]

    def passed(self, stmt: ll.LLStmt, position: int) -> None:
        """`stmt`, at `position` of the sequence, has run: the nodes it touches are no longer
        pending; a fill starts pending."""
        if self._at:
            for tn in ll.nodes_of(stmt):
                self._at.pop(tn, None)
        if isinstance(stmt, ll.ZeroOut):
            self._at[stmt.tn] = position


def covers(st: ll.Set, extent: dict[Symbol, int]) -> bool:
    """Whether the loops of `extent` (all from 0) write every cell of `st`'s node: each axis
    indexed by its own loop over the whole axis, or fixed at 0 on an axis of one."""
    seen: set[Symbol] = set()
    for d, idx in zip(st.tn.dims, st.idcs, strict=True):
        match idx:
            case Iterator(s) if extent.get(s) == d and s not in seen:
                seen.add(s)
            case FixedIdx(0) if d == 1:
                pass
            case _:
                return False
    return True
