"""The loop-nest helpers the scheduling stage's rewrites share (`ir/sched/nests.py`)."""

from __future__ import annotations

import numpy as np

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


def test_identity_copy_takes_whole_cell_by_cell_copies_in_any_loop_order():
    a, b, w = Tnode("a", (3, 4)), Tnode("b", (3, 4)), Tnode("w", (3, 4), ops.bf16)
    i, j = get_symbol("i"), get_symbol("j")
    at = (Iterator(i), Iterator(j))

    def loops(body, outer=(i, 3), inner=(j, 4), **clip):
        return ll.ForLoop(outer[0], 0, outer[1] - 1, ll.ForLoop(inner[0], 0, inner[1] - 1, body, **clip))

    assert nests.identity_copy(loops(ll.Set(a, at, ll.Get(b, at)))) == (a, b)
    assert nests.identity_copy(loops(ll.Set(a, at, ll.Get(b, at)), outer=(j, 4), inner=(i, 3))) == (a, b)
    assert nests.identity_copy(loops(ll.Set(w, at, ll.Get(a, at)))) == (w, a)
    assert nests.identity_copy(loops(ll.Set(a, at, ll.Get(b, at)), inner=(j, 3))) is None
    assert nests.identity_copy(loops(ll.Set(a, at, ll.Get(b, (Iterator(j), Iterator(i)))))) is None
    assert nests.identity_copy(loops(ll.Set(a, at, ll.Get(a, at)))) is None
    assert nests.identity_copy(loops(ll.Set(a, at, ll.Get(b, at)), start=ll.LoopClip(Iterator(i)))) is None


def test_retarget_moves_reads_writes_and_comments_to_another_node():
    """Reads only (`read_from`), or writes too with an index map (a row buffer's), and the
    comments naming the node moved with `notes`; values under the interpreter follow."""
    a, b, c = Tnode("a", (3, 4)), Tnode("b", (3, 4)), Tnode("c", (4,))
    i, j = get_symbol("i"), get_symbol("j")
    at = (Iterator(i), Iterator(j))
    double = ll.Binop(ops.Binop.MUL, ll.Get(b, at), ll.Constant(2.0))
    code = ll.ForLoop(i, 0, 2, ll.seq(ll.ForLoop(j, 0, 3, ll.Set(a, at, double, f"{a.name} := 2 * {b.name}")),
                                      ll.ForLoop(j, 0, 3, ll.Set(b, at, ll.Get(a, at), f"{b.name} := {a.name}"))))

    def sets(code: ll.LLStmt) -> list[ll.Set]:
        return [s for s in ll.iter_stmts(code) if isinstance(s, ll.Set)]

    read = nests.read_from(code, {a: c}, notes=True)
    assert [s.tn for s in sets(read)] == [a, b] and sets(read)[1].debug == f"{b.name} := {c.name}"
    row = nests.retarget(code, {a: c}, writes=True, at=lambda ix: ix[1:])
    assert [(s.tn, s.idcs) for s in sets(row)] == [(c, (Iterator(j),)), (b, at)]
    assert sets(row)[1].llsc == ll.Get(c, (Iterator(j),)) and sets(row)[1].debug == f"{b.name} := {a.name}"
    bv = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(interpret.run(row, {b: bv.copy()})[b], bv * 2)
