"""`ir/sched/bf16_fold.py`: a routine-local bf16 copy of float weights that the scheduled code
only packs or widens is not stored; the packs round the weights themselves. Bit-identical to
the code that stores the copy: the interpreter on the plain code against the interpreter on
the scheduled, folded code, and C on the folded code against C on the scheduled code that
stores the copy, on AVX2, AVX-512 and AVX512_BF16 (whose pair panels keep it) machine settings, at 1 and 2
threads, with weights that round up, down, to even, overflow to infinity, are NaN, infinite
or subnormal."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import bf16, interpret, ops, provenance
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.optimize import VirtualizeSettings
from einjit.ir.sched import bf16_fold, nests
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking, schedule_llc
from einjit.ir.tnode import NEVER_VIRTUAL, Tnode
from test_bf16 import c_runs_vdpbf16ps

ON = VirtualizeSettings()
RNG = np.random.default_rng(7)


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def _weights(dims):
    """Normal values, and in the first rows the cases rounding must get right: ties (to even,
    up and down), just above a tie, the largest floats (rounding to infinity), infinities,
    NaNs and subnormals."""
    w = RNG.standard_normal(dims).astype(np.float32)
    special = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
                        0x7FC00001, 0xFFA00000, 0x00000001, 0x80018000, 0x007FFFFF], np.uint32).view(np.float32)
    flat = w.reshape(-1)
    flat[:special.size] = special
    return w


def _program(n, m, p, *, rhs_prec=ops.single, reads_after=None, copy=None):
    """`wb := round(w)` (a local bf16 copy, or `copy(dims)`), then `c = a @ wb` (`a` float32
    or bf16); with `reads_after`, that statement after the contraction."""
    w = Tnode("w", (m, p), ops.single)
    wb = nests.scheduler_local("wb", (m, p), ops.bf16) if copy is None else copy((m, p))
    a, c = Tnode("a", (n, m), rhs_prec), Tnode("c", (n, p), ops.single)
    r, s = get_symbol("r"), get_symbol("s")
    rounding = ll.ForLoop(r, 0, m - 1, ll.ForLoop(s, 0, p - 1, ll.Set(wb, it(r, s), ll.Get(w, it(r, s)))))
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, it(i, k)), ll.Get(wb, it(k, j)), ll.Get(c, it(i, j)))
    mm = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, p - 1, ll.ForLoop(k, 0, m - 1, ll.Set(c, it(i, j), fma))))
    after = [] if reads_after is None else [reads_after(w, wb)]
    return ll.seq(rounding, ll.ZeroOut(c), mm, *after), w, wb, a, c


def _inputs(w, a):
    return {w: _weights(w.dims), a: bf16.as_cells(RNG.standard_normal(a.dims), a.prec)}


def _folded(code, machine):
    sched = schedule_llc(code, ON, Blocking(machine=MACHINES[machine], min_work=1, min_unroll_work=1))
    return sched, bf16_fold.fold_rounded_copies(sched)


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("machine", ["avx2", "avx512", "avx512_bf16"])
@pytest.mark.parametrize("rhs_prec", [ops.single, ops.bf16], ids=["f32", "bf16"])
def test_packs_round_the_weights_themselves(monkeypatch, machine, threads, rhs_prec):
    monkeypatch.setenv("EINJIT_NUM_THREADS", threads)
    """A pair panel (AVX512_BF16, both operands bf16) keeps the copy: its packing nest copies
    16-bit cells instead of rounding every weight (`bf16_fold._paired`)."""
    code, w, wb, a, c = _program(12, 16, 48, rhs_prec=rhs_prec)
    sched, folded = _folded(code, machine)
    pairs = machine == "avx512_bf16" and rhs_prec is ops.bf16
    assert wb in ll.nodes_of(sched) and (wb in ll.nodes_of(folded)) == pairs and w in ll.nodes_of(folded)
    ins = _inputs(w, a)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[c]
    assert np.isnan(want).any() and np.isinf(want).any()  # the special weights reached the result
    np.testing.assert_array_equal(interpret.run(folded, {tn: v.copy() for tn, v in ins.items()})[c], want)
    stored = run_once(sched, ins, name=f"bf16_copy_{machine}", context=CcBackend().init("bf16_copy")).array(c)
    ctx = run_once(folded, ins, name=f"bf16_fold_{machine}", context=CcBackend().init("bf16_fold"))
    np.testing.assert_array_equal(ctx.array(c), stored)
    if machine == "avx512_bf16" and rhs_prec is ops.bf16 and c_runs_vdpbf16ps():
        # `vdpbf16ps` sums each pair in its own order and rounding and flushes subnormals:
        # non-finite cells agree, finite ones are within float32 accumulation's bound
        got, m = ctx.array(c), a.dims[1]
        finite = np.isfinite(want)
        np.testing.assert_array_equal(got[~finite], want[~finite])
        av, wv = bf16.from_bits(ins[a]).astype(np.float64), bf16.round_to_bf16(ins[w]).astype(np.float64)
        with np.errstate(invalid="ignore"):
            exact, magnitude = av @ wv, np.abs(av) @ np.abs(wv)
        bound = m * 2.0**-24 * magnitude + m * 2.0**-126
        assert np.all(np.abs(got[finite] - exact[finite]) <= bound[finite])
        return
    # C against the interpreter: equal but where a subnormal weight meets the interpreter's
    # float64 emulation of fmaf (one cell in ~40 runs, 1 ulp, with or without the fold)
    np.testing.assert_allclose(ctx.array(c), want, rtol=2.0**-22, atol=0)


def test_a_mixed_precision_operand_copy_folds_like_a_local_one():
    """A mixed-precision step's bf16 copy of a float32 operand (a gradient, an input) is no
    local node (it may be large), but only that step reads it
    (`provenance.MIXED_PRECISION_OPERAND`): where the scheduled code only packs it (a float
    kernel: AVX2 here, a convolution or a narrow output elsewhere), the packs round the operand
    themselves, bit for bit as with the copy stored."""
    def operand_copy(dims):
        return Tnode("g_bf16", dims, ops.bf16, memory_mode=NEVER_VIRTUAL,
                     provenance=provenance.MIXED_PRECISION_OPERAND)

    code, w, wb, a, c = _program(12, 16, 48, copy=operand_copy)
    sched, folded = _folded(code, "avx2")
    assert wb in ll.nodes_of(sched) and wb not in ll.nodes_of(folded)
    ins = _inputs(w, a)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[c]
    np.testing.assert_array_equal(interpret.run(folded, {tn: v.copy() for tn, v in ins.items()})[c], want)
    stored = run_once(sched, ins, name="bf16_grad_copy", context=CcBackend().init("bf16_grad_copy")).array(c)
    ctx = run_once(folded, ins, name="bf16_grad_fold", context=CcBackend().init("bf16_grad_fold"))
    np.testing.assert_array_equal(ctx.array(c), stored)


def test_copies_read_otherwise_or_often_are_kept():
    """The copy stays where a read is not a copy (a pointwise use in the kernel), where the
    weights change before the last read, and where the packs read each weight more than
    `MAX_READS_PER_ELEMENT` times; the code is then what the scheduler made."""
    i, j = get_symbol("u"), get_symbol("v")

    def pointwise(w, wb):
        out = Tnode("out", wb.dims, ops.single)
        return ll.ForLoop(i, 0, wb.dims[0] - 1, ll.ForLoop(j, 0, wb.dims[1] - 1, ll.Set(
            out, it(i, j), ll.Binop(ops.Binop.MUL, ll.Get(wb, it(i, j)), ll.Constant(2.0)))))

    def rewrite_then_pack(w, wb):
        wide = Tnode("wide2", wb.dims, ops.single)
        return ll.ForLoop(i, 0, wb.dims[0] - 1, ll.ForLoop(j, 0, wb.dims[1] - 1, ll.seq(
            ll.Set(w, it(i, j), ll.Constant(1.0)), ll.Set(wide, it(i, j), ll.Get(wb, it(i, j))))))

    for after in (pointwise, rewrite_then_pack):
        code, *_ = _program(12, 16, 48, reads_after=after)
        sched, folded = _folded(code, "avx2")
        assert folded is sched
    for repeats in (bf16_fold.MAX_READS_PER_ELEMENT - 1, bf16_fold.MAX_READS_PER_ELEMENT):  # and the pack's read
        def widen_repeatedly(w, wb, repeats=repeats):
            t, wide = get_symbol("t"), Tnode("wide2", wb.dims, ops.single)
            return ll.ForLoop(t, 0, repeats - 1, ll.ForLoop(i, 0, wb.dims[0] - 1, ll.ForLoop(
                j, 0, wb.dims[1] - 1, ll.Set(wide, it(i, j), ll.Get(wb, it(i, j))))))

        code, w, wb, a, c = _program(2, 16, 48, reads_after=widen_repeatedly)
        sched, folded = _folded(code, "avx2")
        assert (folded is sched) == (repeats + 1 > bf16_fold.MAX_READS_PER_ELEMENT)


def _two_products(rewrite_between):
    """`c1 = x @ b1; c2 = x @ b2` with bf16 `x`, the row operand of both (widened into a float
    copy for each); with `rewrite_between`, `x` is written between the two."""
    x = Tnode("x", (16, 8), ops.bf16)
    bs = [Tnode(f"b{n}", (8, 64), ops.bf16) for n in (1, 2)]
    cs = [Tnode(f"c{n}", (16, 64), ops.single) for n in (1, 2)]
    stmts: list[ll.LLStmt] = []
    for b, c in zip(bs, cs, strict=True):
        i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
        fma = ll.Ternop(ops.Ternop.FMA, ll.Get(x, it(i, k)), ll.Get(b, it(k, j)), ll.Get(c, it(i, j)))
        product = ll.ForLoop(i, 0, 15, ll.ForLoop(j, 0, 63, ll.ForLoop(k, 0, 7, ll.Set(c, it(i, j), fma))))
        stmts += [ll.ZeroOut(c), product]
        if rewrite_between and c is cs[0]:
            i, k = get_symbol("i"), get_symbol("k")
            stmts.append(ll.ForLoop(i, 0, 15, ll.ForLoop(k, 0, 7, ll.Set(
                x, it(i, k), ll.Binop(ops.Binop.MUL, ll.Get(x, it(i, k)), ll.Constant(3.0))))))
    return ll.seq(*stmts), x, bs, cs


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("rewrite_between", [False, True], ids=["shared", "rewritten"])
def test_a_node_read_by_several_contractions_is_widened_once(machine, rewrite_between):
    """`bf16_widen.share_fills`: the second product reads the first one's float copy of `x`,
    unless `x` changed in between; bit-identical in the interpreter and in C."""
    code, x, bs, cs = _two_products(rewrite_between)
    sched = schedule_llc(code, ON, Blocking(machine=MACHINES[machine], min_work=1, min_unroll_work=1, min_nb=4))
    staged = bf16_fold.bf16_stage(sched)

    def wides(llc):
        return [tn for tn in ll.nodes_of(llc) if tn.label == ["wide"]]

    assert len(wides(sched)) == 2 and len(wides(staged)) == (2 if rewrite_between else 1)
    ins = {x: bf16.as_cells(RNG.standard_normal(x.dims), ops.bf16),
           **{b: bf16.as_cells(RNG.standard_normal(b.dims), ops.bf16) for b in bs}}
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})
    got = interpret.run(staged, {tn: v.copy() for tn, v in ins.items()})
    ctx = run_once(staged, ins, name=f"bf16_share_{machine}", context=CcBackend().init("bf16_share"))
    for c in cs:
        np.testing.assert_array_equal(got[c], want[c])
        np.testing.assert_array_equal(ctx.array(c), want[c])
