"""The reference interpreter reads a program into closures before running it: what it checks
it still checks when the statement runs, in the order a walk over the tree would (the values
themselves are checked against gcc by every differential test)."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator, get_symbol, make_affine
from einjit.ir.tnode import VIRTUAL, Tnode


def test_a_statement_that_never_runs_is_never_checked():
    """A read of a virtual node, a cell out of bounds and backend-staged code inside a loop
    clipped to no iterations: the program runs (the checks belong to running them)."""
    out, ghost = Tnode("out", (3,)), Tnode("ghost", (3,))
    ghost.update_memory_mode(VIRTUAL, 0)
    i, j = get_symbol("i"), get_symbol("j")
    body = ll.seq(ll.Set(out, (Iterator(i),), ll.Get(ghost, (Iterator(i),))),
                  ll.Set(out, (FixedIdx(7),), ll.Constant(1.0)), ll.StagedCompilation(lambda: ""))
    never = ll.ForLoop(i, 0, 2, body, stop=ll.LoopClip(make_affine([(1, j)], -5), 1))
    code = ll.seq(ll.ForLoop(j, 0, 2, never), ll.Set(out, (FixedIdx(1),), ll.Constant(2.0)))
    np.testing.assert_array_equal(interpret.run(code)[out], [0.0, 2.0, 0.0])


def test_a_loop_symbol_is_unbound_after_its_loop():
    out = Tnode("out", (4,))
    i = get_symbol("i")
    loop = ll.ForLoop(i, 0, 3, ll.Set(out, (Iterator(i),), ll.EmbedIndex(Iterator(i))))
    np.testing.assert_array_equal(interpret.run(loop)[out], [0.0, 1.0, 2.0, 3.0])
    with pytest.raises(interpret.InterpretError, match=r"symbol i\d* is not bound"):
        interpret.run(ll.seq(loop, ll.Set(out, (Iterator(i),), ll.Constant(1.0))))


def test_static_bindings_and_affine_cells():
    """`out[2 i + n + 1] = i` with `n` bound statically; 2 i + n + 1 past the end is refused,
    naming the cell and the node's dims."""
    out = Tnode("out", (9,))
    i, n = get_symbol("i"), get_symbol("n")
    at = (Affine(((2, i), (1, n)), 1),)
    code = ll.ForLoop(i, 0, 3, ll.Set(out, at, ll.EmbedIndex(Iterator(i))))
    np.testing.assert_array_equal(interpret.run(code, bindings={n: 1})[out], [0, 0, 0, 0, 1, 0, 2, 0, 3])
    with pytest.raises(interpret.InterpretError, match=r"index \(10,\) out of bounds for out\S* with dims \(9,\)"):
        interpret.run(code, bindings={n: 3})


def test_an_index_of_the_wrong_rank_is_refused():
    out = Tnode("out", (2, 2, 2, 2), ops.double)
    code = ll.Set(out, (FixedIdx(0), FixedIdx(1), FixedIdx(1)), ll.Constant(1.0))
    with pytest.raises(interpret.InterpretError, match=r"index \(0, 1, 1\) out of bounds"):
        interpret.run(code)
    four = ll.Set(out, (FixedIdx(0), FixedIdx(1), FixedIdx(1), FixedIdx(0)), ll.Constant(1.0))
    assert interpret.run(four)[out][0, 1, 1, 0] == 1.0
