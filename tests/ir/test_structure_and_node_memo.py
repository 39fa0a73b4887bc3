"""`ir/structure.py` (statements equal up to renaming their nodes and symbols) and the memo of
`ll.nodes_of` inside `ll.remembered_nodes()`: a statement built while the memo is active
gets its own nodes, never those of a statement answered before."""

from __future__ import annotations

import gc

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.structure import structure
from einjit.ir.tnode import Tnode


def _copy_loop(dst: Tnode, src: Tnode, scale: float = 2.0) -> ll.ForLoop:
    i = get_symbol()
    read = ll.Binop(ops.Binop.MUL, ll.Get(src, (Iterator(i),)), ll.Constant(scale))
    return ll.ForLoop(i, 0, dst.dims[0] - 1, ll.Set(dst, (Iterator(i),), read))


def test_structure_is_equal_up_to_renaming_and_tells_what_the_node_key_tells():
    a, b, c, d = (Tnode(n, (4,)) for n in "abcd")
    first, second = structure(_copy_loop(a, b), lambda tn: tn.dims), structure(_copy_loop(c, d), lambda tn: tn.dims)
    assert first.key == second.key and first.nodes == [a, b] and second.nodes == [c, d]
    assert first.symbols != second.symbols and len(first.symbols) == 1
    assert structure(_copy_loop(a, a), lambda tn: tn.dims).key != first.key             # aliasing differs
    assert structure(_copy_loop(a, b, 3.0), lambda tn: tn.dims).key != first.key        # a constant differs
    wide = Tnode("wide", (4,), ops.double)
    assert structure(_copy_loop(wide, b), lambda tn: tn.dims).key == first.key
    assert structure(_copy_loop(wide, b), lambda tn: (tn.dims, tn.prec)).key != structure(
        _copy_loop(a, b), lambda tn: (tn.dims, tn.prec)).key


def test_remembered_nodes_answer_each_statement_with_its_own_nodes():
    a, b = Tnode("a", (4,)), Tnode("b", (4,))
    first = _copy_loop(a, b)
    plain = ll.nodes_of(ll.seq(first, _copy_loop(b, a)))
    with ll.remembered_nodes():
        assert ll.nodes_of(first) == [a, b]
        for k in range(50):                         # statements made and dropped while remembering
            c, d = Tnode(f"c{k}", (4,)), Tnode(f"d{k}", (4,))
            assert ll.nodes_of(_copy_loop(c, d)) == [c, d]
            # the young generation, where this loop's garbage is (a full collection walks the
            # whole test session's heap: 13 s in CI)
            gc.collect(0)
        with ll.remembered_nodes():                 # nested: the same memo
            assert ll.nodes_of(ll.seq(first, _copy_loop(b, a))) == plain == [a, b]
        e = Tnode("e", (4,))
        assert ll.nodes_of(ll.seq(_copy_loop(e, a), first)) == [e, a, b]
    assert ll._remembered.get() is None
