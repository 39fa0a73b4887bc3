"""Contractions whose accumulators start at zero in place of the output's zero fill
(`schedule.py` starts them at zero, `ir/sched/first_writes.py` drops the fill): the fill goes
only where the nest writes every cell in one pass,
and the results are bit-identical to the unscheduled code (with the fill) under the
interpreter and gcc, whatever the output held before. Outputs are filled with NaN first, so
a cell the scheduled code failed to write, or a zero it read from a fill it dropped, shows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, Iterator, get_symbol
from einjit.ir.sched.cost_model import Tile
from einjit.ir.sched.first_writes import first_writes
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking
from einjit.ir.sched.schedule import schedule_llc as _schedule_llc
from einjit.ir.tnode import Tnode
from test_schedule import OFF, check_exact, contraction_nest, inputs_for, it, matmul


def schedule_llc(code: ll.LLStmt, settings, blocking: Blocking) -> ll.LLStmt:
    """The scheduler, then the stage that drops the fills the scheduled nests overwrite."""
    return first_writes(_schedule_llc(code, settings, blocking))


def fills(code: ll.LLStmt) -> list[Tnode]:
    return [s.tn for s in ll.iter_stmts(code) if isinstance(s, ll.ZeroOut)]


def stale(c: Tnode, ins: dict, value: float = np.nan) -> dict:
    """`ins` with the output `c` holding `value` everywhere (what a fill would overwrite)."""
    return {**ins, c: np.full(c.dims, value, dtype=c.prec.dtype)}


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("transposed", [False, True], ids=["a@b", "a@b.T"])
@pytest.mark.parametrize("n,m,p", [(64, 16, 48), (13, 17, 31), (31, 11, 97), (7, 5, 63), (8, 16, 36)])
def test_a_zero_filled_output_is_written_from_zero_without_its_fill(n, m, p, transposed, machine):
    """Full blocks, tail rows and padded tail panels (loaded and stored through `edge`) all
    start at zero; every cell of the NaN-filled output is written, bit-identically."""
    code, a, b, c = matmul(n, m, p, transposed)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, min_unroll_work=1, machine=MACHINES[machine]))
    assert fills(code) == [c] and fills(sched) == []
    assert ", from zero" in ll.to_doc(sched)
    ins = stale(c, inputs_for(a, b, seed=n))
    want = check_exact(code, sched, ins, c)
    ref = ins[a].astype(np.float64) @ (ins[b].T if transposed else ins[b]).astype(np.float64)
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_threaded_panels_and_row_blocks_start_from_zero(threads):
    """Panels on threads (each packing its own), then a tail panel whose row blocks are shared."""
    code, a, b, c = matmul(40, 33, 70, True)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, tile=Tile(3, 16, 33), parallel_min_work=1,
                                             machine=MACHINES["avx2"]))
    assert fills(sched) == []
    check_exact(code, sched, stale(c, inputs_for(a, b, seed=2)), c, threads=threads)


def test_an_accumulation_into_existing_values_still_loads_them():
    """Without a fill the kernel adds to what the output holds (a gradient's second term)."""
    code, a, b, c = matmul(13, 17, 31, True)
    code = ll.seq(*(s for s in ll.flatten(code) if not isinstance(s, ll.ZeroOut)))
    sched = schedule_llc(code, OFF, Blocking(min_work=1, min_unroll_work=1, machine=MACHINES["avx2"]))
    assert ", from zero" not in ll.to_doc(sched)
    ins = inputs_for(a, b, seed=4)
    before = np.random.default_rng(5).standard_normal(c.dims).astype(np.float32)
    want = check_exact(code, sched, {**ins, c: before}, c)
    np.testing.assert_allclose(want, before + ins[a] @ ins[b].T, rtol=1e-5, atol=1e-5)


def test_two_contractions_into_one_output_the_first_from_zero():
    """`c = a @ b.T` then `c += a @ b.T`: the first starts at zero, the second loads it."""
    code, a, b, c = matmul(13, 17, 31, True)
    nest = next(s for s in ll.flatten(code) if isinstance(s, ll.ForLoop))
    twice = ll.seq(code, nest)
    sched = schedule_llc(twice, OFF, Blocking(min_work=1, min_unroll_work=1, machine=MACHINES["avx2"]))
    assert fills(sched) == [] and ll.to_doc(sched).count(", from zero") == 1
    ins = stale(c, inputs_for(a, b, seed=6))
    want = check_exact(twice, sched, ins, c)
    np.testing.assert_allclose(want, 2 * (ins[a] @ ins[b].T), rtol=1e-5, atol=1e-5)


def test_a_read_between_the_fill_and_the_nest_keeps_the_fill():
    """`d := c[0, 0]` after the fill sees its zero: the fill stays and the kernel loads it."""
    code, a, b, c = matmul(13, 17, 31, True)
    fill, nest = list(ll.flatten(code))
    d = Tnode("d", (1,), ops.single)
    read = ll.Set(d, (FixedIdx(0),), ll.Get(c, (FixedIdx(0), FixedIdx(0))))
    code = ll.seq(fill, read, nest)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, min_unroll_work=1))
    assert fills(sched) == [c] and ", from zero" not in ll.to_doc(sched)
    ins = stale(c, inputs_for(a, b, seed=8))
    check_exact(code, sched, ins, c)
    assert interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[d][0] == 0.0


def test_k_chunks_keep_the_fill():
    """A later chunk adds to what the first stored, so a chunked nest loads its fill."""
    code, a, b, c = matmul(19, 23, 45, True)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, tile=Tile(5, 16, 7)))
    assert fills(sched) == [c] and ", from zero" not in ll.to_doc(sched)
    check_exact(code, sched, stale(c, inputs_for(a, b, seed=1)), c)


def test_a_nest_writing_part_of_its_output_keeps_the_fill():
    """`c[i, 1, j] += a[i, k] * b[j, k]` writes one of two slices: the other needs the zeros."""
    n, m, p = 12, 9, 40
    a, b, c = Tnode("a", (n, m), ops.single), Tnode("b", (p, m), ops.single), Tnode("c", (n, 2, p), ops.single)
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    cell = (Iterator(i), FixedIdx(1), Iterator(j))
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, it(i, k)), ll.Get(b, it(j, k)), ll.Get(c, cell))
    nest = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, p - 1, ll.ForLoop(k, 0, m - 1, ll.Set(c, cell, fma))))
    code = ll.seq(ll.ZeroOut(c), nest)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, min_unroll_work=1))
    assert "register-blocked" in ll.to_doc(sched) and fills(sched) == [c]
    want = check_exact(code, sched, stale(c, inputs_for(a, b, seed=9)), c)
    assert not want[:, 0].any()


def test_a_weight_shared_across_the_batch_starts_from_zero():
    """A dense layer over a batch (`c[n, i, j] += x[n, i, k] * w[j, k]`, the GPT step's
    layout): the weight does not vary along the batch, so its fill goes."""
    code, x, w, c = batched_matmul(3, 10, 7, 36, shared_b=True)
    sched = schedule_llc(code, OFF, Blocking(min_work=1, min_unroll_work=1, machine=MACHINES["avx2"]))
    assert fills(sched) == [] and ", from zero" in ll.to_doc(sched)
    check_exact(code, sched, stale(c, inputs_for(x, w, seed=11)), c)


def batched_matmul(nb: int, n: int, m: int, p: int, shared_b: bool = False):
    """`c[s, i, j] += a[s, i, k] * b[(s,) j, k]`, the batch loop outermost, after a fill."""
    s, i, j, k = get_symbol("s"), get_symbol("i"), get_symbol("j"), get_symbol("k")
    a, c = Tnode("a", (nb, n, m), ops.single), Tnode("c", (nb, n, p), ops.single)
    b = Tnode("b", (p, m) if shared_b else (nb, p, m), ops.single)
    b_at = it(j, k) if shared_b else it(s, j, k)
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, it(s, i, k)), ll.Get(b, b_at), ll.Get(c, it(s, i, j)))
    body = ll.Set(c, it(s, i, j), fma)
    for sym, e in reversed([(s, nb), (i, n), (j, p), (k, m)]):
        body = ll.ForLoop(sym, 0, e - 1, body)
    return ll.seq(ll.ZeroOut(c), body), a, b, c


@st.composite
def contractions(draw):
    """A random contraction nest (`test_schedule.contraction_nest`) after its fill, with
    random block sizes (one chunk or several) and each machine description."""
    prec = draw(st.sampled_from([ops.single, ops.double]))
    code, a, b, c = contraction_nest(draw, *(draw(st.integers(1, 9)) for _ in range(4)), prec)
    tile = Tile(draw(st.integers(1, 4)), draw(st.sampled_from([2, 4, 8])), draw(st.integers(1, 9)))
    blocking = Blocking(min_work=1, min_nb=2, tile=tile, parallel_min_work=draw(st.sampled_from([1, 1 << 30])),
                        machine=draw(st.sampled_from(list(MACHINES.values()))))
    return code, a, b, c, blocking


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=contractions(), threads=st.sampled_from([1, 2]))
def test_random_contractions_over_stale_outputs_are_exact(case, threads):
    """Whatever the layout, loop order, batching, tile and threads: a dropped fill never
    leaves a stale cell, and a kept one is still read."""
    code, a, b, c, blocking = case
    sched = schedule_llc(code, OFF, blocking)
    if not fills(sched):
        assert ", from zero" in ll.to_doc(sched)
    check_exact(code, sched, stale(c, inputs_for(a, b)), c, threads=threads)
