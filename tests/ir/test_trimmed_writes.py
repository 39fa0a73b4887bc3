"""Trimmed writes (`sched/trimmed_writes.py`): a loop storing a node whose clipped readers reach
only the chunks of keys up to the diagonal's is clipped by chunks to those. The node's array
starts as NaN here, so a cell read but no longer written shows; the results are bit for bit
those of the full loop, under the interpreter and gcc at one and two threads."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.backends.cc import toolchain as cc
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol, make_affine
from einjit.ir.optimize import STAGES
from einjit.ir.sched.causal import CHUNK
from einjit.ir.sched.trimmed_writes import trim_writes
from einjit.ir.tnode import LOCAL, MATERIALIZED, Tnode
from test_schedule import inputs_for, it, run_in_c

T, D = 4 * CHUNK, 8


def _weights_and_product(reach: int | None, mode=LOCAL):
    """`p[t, s] := x[t, s] * 0.5` over whole rows, then `out[t, :] += p[t, s] * v[s, :]` over
    the keys of each block of `CHUNK` rows `s < CHUNK*ib + reach` (`reach` None: all keys)."""
    x, v = Tnode("x", (T, T)), Tnode("v", (T, D))
    p = Tnode("p", (T, T), memory_mode=mode)
    out = Tnode("out", (T, D), memory_mode=MATERIALIZED)
    t, s, ib, ir, k, j = (get_symbol(n) for n in ("t", "s", "ib", "ir", "k", "j"))
    store = ll.Set(p, it(t, s), ll.Binop(ops.Binop.MUL, ll.Get(x, it(t, s)), ll.Constant(0.5)), "p = x * 0.5")
    writer = ll.ForLoop(t, 0, T - 1, ll.ForLoop(s, 0, T - 1, store))
    row = make_affine([(CHUNK, ib), (1, ir)])
    cell = (row, Iterator(j))
    term = ll.Ternop(ops.Ternop.FMA, ll.Get(p, (row, Iterator(k))), ll.Get(v, it(k, j)), ll.Get(out, cell))
    stop = None if reach is None else ll.LoopClip(make_affine([(CHUNK, ib)], reach))
    reader = ll.ForLoop(ib, 0, T // CHUNK - 1, ll.ForLoop(ir, 0, CHUNK - 1, ll.ForLoop(
        k, 0, T - 1, ll.ForLoop(j, 0, D - 1, ll.Set(out, cell, term)), stop=stop)))
    return ll.seq(ll.ZeroOut(out), writer, reader), (x, v), p, out


def _clipped_loops(code) -> list[ll.ForLoop]:
    return [s for s in ll.iter_stmts(code) if isinstance(s, ll.ForLoop) and s.stop is not None]


def test_a_store_no_reader_reaches_is_clipped_by_chunks():
    code, ins_tn, p, out = _weights_and_product(reach=CHUNK)
    new = trim_writes(code, local_storage=True)
    trimmed = [lp for lp in _clipped_loops(new) if any(isinstance(x, ll.Set) and x.tn is p for x in ll.iter_stmts(lp))]
    assert len(trimmed) == 1
    # the chunks up to the diagonal's: `CHUNK*c < t + 1`, around a whole loop over the chunk
    (chunk,) = trimmed
    assert chunk.stop is not None and chunk.stop.scale == CHUNK and chunk.to_ == T // CHUNK - 1
    assert isinstance(chunk.body, ll.ForLoop) and chunk.body.to_ == CHUNK - 1 and chunk.body.stop is None
    t = next(s.index for s in ll.iter_stmts(code) if isinstance(s, ll.ForLoop))
    assert chunk.stop.bound == make_affine([(1, t)], 1)
    ins = {**inputs_for(*ins_tn, seed=3), p: np.full(p.dims, np.nan, np.float32)}
    want = interpret.run(code, {tn: a.copy() for tn, a in ins.items()})[out]
    assert np.all(np.isfinite(want))
    np.testing.assert_array_equal(interpret.run(new, {tn: a.copy() for tn, a in ins.items()})[out], want)
    x, v = (ins[tn].astype(np.float64) for tn in ins_tn)
    reached = np.arange(T)[None, :] < (np.arange(T)[:, None] // CHUNK + 1) * CHUNK
    np.testing.assert_allclose(want, np.where(reached, x * 0.5, 0) @ v, rtol=1e-5, atol=1e-5)
    for threads in (1, 2):
        ctx = run_in_c(new, ins, name="trimmed_writes", options=cc.CcOptions(threads=threads))
        np.testing.assert_array_equal(ctx.array(out), want)


@pytest.mark.parametrize("case", ["whole_rows", "clipped_past_the_rows", "hosted", "no_local_storage"])
def test_stores_stay_whole_where_the_reads_need_them(case):
    """Readers reaching every key (unclipped, or clipped past the end of every row), a node the
    host reads, or any node without local storage: the code is kept."""
    reach = {"whole_rows": None, "clipped_past_the_rows": T}.get(case, CHUNK)
    code, _, _, _ = _weights_and_product(reach=reach, mode=MATERIALIZED if case == "hosted" else LOCAL)
    assert trim_writes(code, local_storage=case != "no_local_storage") == code


def test_the_stage_runs_after_the_loop_stages():
    assert [s.name for s in STAGES][-2:] == ["trim", "prefetch"]
