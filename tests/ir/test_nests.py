"""The loop-nest helpers the scheduling stage's rewrites share (`ir/sched/nests.py`)."""

from __future__ import annotations

from einjit.ir import interpret, ops, provenance
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator, get_symbol, make_affine
from einjit.ir.sched import nests
from einjit.ir.tnode import Tnode


def test_symbols_reads_and_subst_see_every_index_of_an_operand():
    a, b, c = Tnode("a", (4, 6)), Tnode("b", (6, 4)), Tnode("c", (4, 4))
    i, j, k, k0, lane = (get_symbol(s) for s in ("i", "j", "k", "k0", "l"))
    term = ll.Binop(ops.Binop.MUL, ll.Get(a, (Iterator(i), Affine(((1, k), (1, j))))), ll.EmbedIndex(Iterator(k)))
    assert nests.symbols(term) == {i, j, k}
    assert nests.reads(term, a) and not nests.reads(term, b)
    assert nests.reads(ll.GetMergeBuffer(c, (FixedIdx(0), FixedIdx(0))), c)
    split = nests.subst(term, {k: make_affine(((2, k0), (1, lane)))})
    assert nests.symbols(split) == {i, j, k0, lane}
    assert split.arg2 == ll.EmbedIndex(make_affine(((2, k0), (1, lane))))


def test_unit_stride_axis_symbol_skips_axes_of_one_cell():
    t = Tnode("t", (3, 5, 1))
    i, j = get_symbol("i"), get_symbol("j")
    assert nests.unit_stride_axis_symbol(t, (Iterator(i), Iterator(j), FixedIdx(0))) == j
    assert nests.unit_stride_axis_symbol(t, (Iterator(i), FixedIdx(2), FixedIdx(0))) is None
    assert nests.unit_stride_axis_symbol(Tnode("one", (1,)), (FixedIdx(0),)) is None


def test_nest_builds_loops_from_zero_with_their_marks_and_a_scheduler_local_is_local():
    acc = nests.scheduler_local("acc", (2, 3), ops.single)
    assert acc.is_local() and acc.provenance == provenance.SCHEDULED_LOCAL and acc.dims == (2, 3)
    a, b = get_symbol("a"), get_symbol("b")
    code = nests.nest([(a, 2), (b, 3)], ll.Set(acc, (Iterator(a), Iterator(b)), ll.Constant(1.5)),
                      frozenset({a}), parallel=b)
    outer = code
    assert isinstance(outer, ll.ForLoop) and (outer.index, outer.from_, outer.to_) == (a, 0, 1)
    assert outer.unroll and not outer.parallel
    inner = outer.body
    assert isinstance(inner, ll.ForLoop) and (inner.to_, inner.unroll, inner.parallel) == (2, False, True)
    assert interpret.run(code, {})[acc].tolist() == [[1.5] * 3] * 2
