"""Covered fills (`sched/covered_fills.py`): a zero fill goes when the clipped nests writing its
node store every cell the clipped nests after them read, the writers' updates becoming stores.
The node's array starts as NaN here, so a cell read but never written, or an update still
reading its zero, shows; the results are bit for bit those of the code with its fill, under
the interpreter and gcc at one and two threads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from einjit.backends.cc import toolchain as cc
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol, make_affine
from einjit.ir.sched.covered_fills import drop_covered_fills
from einjit.ir.tnode import LOCAL, MATERIALIZED, Tnode
from test_schedule import inputs_for, it, run_in_c

T, D, CHUNK = 16, 8, 4


def _attention_backward(reach: int, mode=LOCAL, twice: bool = False, summed: bool = False):
    """The softmax's backward and a product of its result, shaped as the causal clipping
    leaves them: `g[t, s] =+ where(s < t + 1, x, 0) * 0.5` over the chunks of 4 keys reaching
    the diagonal (`stop 4*c < t + 1`), then `out[t, :] += g[t, s] * k[s, :]` over the keys of
    each block of 4 rows `s < 4*ib + reach` (4: the block's own chunk, all written). `twice`:
    the update comes twice; `summed`: inside a loop of 2 its index does not name."""
    x, k = Tnode("x", (T, T)), Tnode("k", (T, D))
    g = Tnode("g", (T, T), memory_mode=mode)
    out = Tnode("out", (T, D), memory_mode=MATERIALIZED)
    t, c, lane, ib, ir, s, j = (get_symbol(n) for n in ("t", "c", "l", "ib", "ir", "s", "j"))
    key = make_affine([(CHUNK, c), (1, lane)])
    at = (Iterator(t), key)
    causal = ll.Binop(ops.Binop.CMPLT, ll.EmbedIndex(key), ll.EmbedIndex(make_affine([(1, t)], 1)))
    masked = ll.Ternop(ops.Ternop.WHERE, causal, ll.Get(x, at), ll.Constant(0.0))
    update = ll.Set(g, at, ll.Ternop(ops.Ternop.FMA, masked, ll.Constant(0.5), ll.Get(g, at)), "g =+ x * 0.5")
    body = ll.seq(update, update) if twice else update
    if summed:
        body = ll.ForLoop(get_symbol("r"), 0, 1, body)
    writer = ll.ForLoop(t, 0, T - 1, ll.ForLoop(c, 0, T // CHUNK - 1, ll.ForLoop(lane, 0, CHUNK - 1, body),
                                                 stop=ll.LoopClip(make_affine([(1, t)], 1), CHUNK)))
    row = make_affine([(CHUNK, ib), (1, ir)])
    cell = (row, Iterator(j))
    term = ll.Ternop(ops.Ternop.FMA, ll.Get(g, (row, Iterator(s))), ll.Get(k, it(s, j)), ll.Get(out, cell))
    product = ll.Set(out, cell, term)
    reader = ll.ForLoop(ib, 0, T // CHUNK - 1, ll.ForLoop(ir, 0, CHUNK - 1, ll.ForLoop(
        s, 0, T - 1, ll.ForLoop(j, 0, D - 1, product), stop=ll.LoopClip(make_affine([(CHUNK, ib)], reach)))))
    code = ll.seq(ll.ZeroOut(out), ll.ZeroOut(g), writer, reader)
    return code, (x, k), g, out


def _fills(code) -> set[str]:
    return {s.tn.label[0] for s in ll.iter_stmts(code) if isinstance(s, ll.ZeroOut)}


def _same_results(code, new, ins_tn, g, out, seed: int) -> None:
    ins = {**inputs_for(*ins_tn, seed=seed), g: np.full(g.dims, np.nan, np.float32)}
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[out]
    got = interpret.run(new, {tn: v.copy() for tn, v in ins.items()})[out]
    assert np.all(np.isfinite(want))
    np.testing.assert_array_equal(got, want)
    x, k = (ins[tn].astype(np.float64) for tn in ins_tn)
    np.testing.assert_allclose(want, (np.tril(x) * 0.5) @ k, rtol=1e-5, atol=1e-6)
    for threads in (1, 2):
        ctx = run_in_c(new, ins, name="covered_fills", options=cc.CcOptions(threads=threads))
        np.testing.assert_array_equal(ctx.array(out), want)


def test_a_fill_whose_skipped_cells_no_reader_reaches_goes():
    code, ins_tn, g, out = _attention_backward(reach=CHUNK)
    new = drop_covered_fills(code, local_storage=True)
    assert _fills(new) == {"out"}
    updates = [s for s in ll.iter_stmts(new) if isinstance(s, ll.Set) and s.tn is g]
    assert len(updates) == 1 and not any(isinstance(x, ll.Get) and x.tn is g for x in ll.deep_parts(updates[0].llsc))
    assert updates[0].debug == "g =: x * 0.5"
    _same_results(code, new, ins_tn, g, out, seed=1)


@pytest.mark.parametrize("case", ["reaches_past", "hosted", "no_local_storage", "updated_twice", "summed"])
def test_fills_stay_where_a_skipped_or_summed_cell_is_read(case):
    """A reader reaching one chunk past the diagonal's (its zeros are read); a node the host
    reads (or any node, without local storage); a cell updated twice, by two statements or by
    a loop its index does not name (it sums from its zero): the code is kept as it is."""
    code, ins_tn, g, out = _attention_backward(
        reach=2 * CHUNK if case == "reaches_past" else CHUNK,
        mode=MATERIALIZED if case == "hosted" else LOCAL, twice=case == "updated_twice", summed=case == "summed")
    new = drop_covered_fills(code, local_storage=case != "no_local_storage")
    assert new == code
    assert _fills(new) == {"out", "g"}


def test_nodes_no_clipped_loop_touches_are_left_to_first_writes():
    code, _, _, _ = _attention_backward(reach=CHUNK)
    unclipped = ll.seq(*(_without_clips(s) for s in ll.flatten(code)))
    assert drop_covered_fills(unclipped, local_storage=True) == unclipped


def _without_clips(stmt: ll.LLStmt) -> ll.LLStmt:
    if isinstance(stmt, ll.ForLoop):
        return dataclasses.replace(stmt, body=_without_clips(stmt.body), start=None, stop=None)
    return stmt
