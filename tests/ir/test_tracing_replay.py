"""Tracing executes each top-level statement once per structure (`tracing.visit_llc`): a nest
that differs from an earlier one only in its nodes and symbols replays the earlier one's
events on its own nodes. The facts must be those of executing it."""

from __future__ import annotations

import pytest

from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.passes import tracing
from einjit.ir.passes.tracing import RECURRENT, TracedArray, VirtualizeSettings, visit_llc
from einjit.ir.tnode import Tnode


def block(x: Tnode, n: int = 8, k: int = 12) -> tuple[ll.LLStmt, Tnode, Tnode]:
    """`s[i] = sum_j x[i, j]` (a reduction whose inner loop tracing leaves partly untraced),
    then `y[i] = s[i] * s[i]` (s read twice per cell), `s` zeroed first."""
    s, y = Tnode("s", (n,)), Tnode("y", (n,))
    i, j, i2 = get_symbol("i"), get_symbol("j"), get_symbol("i")
    acc = ll.Set(s, (Iterator(i),), ll.Binop(ops.Binop.ADD, ll.Get(s, (Iterator(i),)),
                                             ll.Get(x, (Iterator(i), Iterator(j)))))
    reduce = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, k - 1, acc))
    square = ll.ForLoop(i2, 0, n - 1, ll.Set(y, (Iterator(i2),), ll.Binop(
        ops.Binop.MUL, ll.Get(s, (Iterator(i2),)), ll.Get(s, (Iterator(i2),)))))
    return ll.seq(ll.ZeroOut(s), reduce, square), s, y


def facts(ta: TracedArray) -> tuple:
    return (sorted(ta.assignments), sorted(ta.accesses.items(), key=lambda kv: kv[0]), ta.zero_initialized_by_code,
            ta.read_before_write, ta.read_only, ta.is_scalar_constexpr, ta.is_accessing, ta.is_complex,
            ta.is_simple, ta.is_local_reduction, ta.max_visits())


@pytest.fixture
def executions(monkeypatch):
    """How many top-level statements tracing executed (rather than replayed)."""
    count = [0]
    original = tracing._Recorder.stmt

    def counting(self, stmt, env, loops, first_visit, traced=1):
        if not loops:
            count[0] += 1
        return original(self, stmt, env, loops, first_visit, traced)

    monkeypatch.setattr(tracing._Recorder, "stmt", counting)
    return count


def test_identical_blocks_execute_once_and_get_the_facts_of_executing_them(executions):
    x1, x2 = Tnode("x1", (8, 12)), Tnode("x2", (8, 12))
    first, s1, y1 = block(x1)
    second, s2, y2 = block(x2)
    alone = visit_llc(second, settings=VirtualizeSettings())
    executed_alone = executions[0]
    both = visit_llc(ll.seq(first, second), settings=VirtualizeSettings())
    assert executions[0] - executed_alone == executed_alone  # the second block only replays
    for tn in (x2, s2, y2):
        assert facts(both.traced_store[tn]) == facts(alone.traced_store[tn]), tn.label
    for a, b in ((x1, x2), (s1, s2), (y1, y2)):
        assert facts(both.traced_store[a]) == facts(both.traced_store[b]), a.label
    assert both.traced_store[s2].max_visits() == 2
    assert both.traced_store[x2].accesses[(0, 0)] is RECURRENT  # an input, read before written
    # Each block's loops are owned by its own nodes.
    owners = {tn for tn in both.reverse_node_map.values()}
    assert {s1, y1, s2, y2} <= owners and not owners & {x1, x2}


def test_only_a_statement_of_other_dims_is_executed_again_and_replays_see_their_own_state(executions):
    x1, x2, x3 = Tnode("x1", (8, 12)), Tnode("x2", (8, 13)), Tnode("x3", (8, 12))
    first, _, _ = block(x1)
    wider, _, _ = block(x2, k=13)
    visit_llc(ll.seq(first, wider), settings=VirtualizeSettings())
    # The zeroing and the square are the same statements on other nodes; the reduction over
    # 13 columns is another one, executed again.
    assert executions[0] == 4
    executions[0] = 0
    same, _, _ = block(x3)
    i, j = get_symbol("i"), get_symbol("j")
    feed = ll.ForLoop(i, 0, 7, ll.ForLoop(j, 0, 11, ll.Set(x3, (Iterator(i), Iterator(j)), ll.Constant(1.0))))
    trace = visit_llc(ll.seq(first, feed, same), settings=VirtualizeSettings())
    assert executions[0] == 4  # the first block's three statements and the feed; `same` replays
    # Replayed on another state, the same events give other facts: x3 is written before read.
    assert trace.traced_store[x1].accesses[(0, 0)] is RECURRENT
    assert trace.traced_store[x3].accesses[(0, 0)] == 1 and not trace.traced_store[x3].read_before_write


def test_comments_do_not_keep_blocks_apart(executions):
    """Comments and statements' debug texts name one instance's tensors: left out."""
    x1, x2 = Tnode("x1", (8, 12)), Tnode("x2", (8, 12))
    first, _, _ = block(x1)
    second, _, _ = block(x2)
    visit_llc(ll.seq(ll.Comment("block 1"), first, ll.Comment("block 2"), second), settings=VirtualizeSettings())
    assert executions[0] == 4  # one comment and the first block's three statements


def test_reads_of_a_node_the_statement_does_not_write_count_each_read(executions):
    """A replayed statement's reads of a node it does not write each count once where the cell
    was written, and a cell read before any write is recurrent however often it is read (the
    counts a replay that grouped reads per cell would have to keep)."""
    s = Tnode("s", (5,))
    i = get_symbol("i")
    fill = ll.ForLoop(i, 0, 3, ll.Set(s, (Iterator(i),), ll.Constant(1.0)))

    def thrice(out: Tnode) -> ll.LLStmt:
        j = get_symbol("j")
        read = ll.Get(s, (Iterator(j),))
        return ll.ForLoop(j, 0, 4, ll.Set(out, (Iterator(j),), ll.Binop(
            ops.Binop.ADD, read, ll.Binop(ops.Binop.MUL, read, read))))

    trace = visit_llc(ll.seq(fill, thrice(Tnode("y", (5,))), thrice(Tnode("z", (5,)))), settings=VirtualizeSettings())
    assert executions[0] == 2  # the second reading statement replays the first's events
    accesses = trace.traced_store[s].accesses
    assert list(accesses.items()) == [((0,), 6), ((1,), 6), ((2,), 6), ((3,), 6), ((4,), RECURRENT)]
    assert trace.traced_store[s].read_before_write and trace.traced_store[s].max_visits() is RECURRENT
