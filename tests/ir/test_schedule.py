"""The scheduling stage (`ir/sched/schedule.py`): rescheduled nests compute what the original nests
compute — bit for bit where nothing is reassociated — under the interpreter and under gcc."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator, get_symbol
from einjit.ir.optimize import STAGES, VirtualizeSettings, optimize_proc
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking, schedule_llc
from einjit.ir.tnode import Tnode
from test_random_programs import SETTINGS, _scale, build, programs

GOLDEN = Path(__file__).parent / "golden"
LANES = Blocking().lanes
ANY_SIZE = Blocking(min_work=1, min_unroll_work=1)
TINY = Blocking(min_work=1, nb_choices=(4,), min_nb=2, mb_max=2, lanes=2)
"""Blocks small enough for the random programs' 1-3 element axes."""
ON = VirtualizeSettings()
OFF = VirtualizeSettings(reassociate=False)


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def matmul(n, m, p, transposed, prec=ops.single):
    """`c = a @ b`, or `c = a @ b.T` (the dense layer's `w @ x`) when `transposed`, as the
    simplifier leaves it: a zero fill, then i-j-k loops around one fused multiply-add."""
    a, c = Tnode("a", (n, m), prec), Tnode("c", (n, p), prec)
    b = Tnode("b", (p, m) if transposed else (m, p), prec)
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, it(i, k)), ll.Get(b, it(j, k) if transposed else it(k, j)),
                    ll.Get(c, it(i, j)))
    loops = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, p - 1, ll.ForLoop(k, 0, m - 1, ll.Set(c, it(i, j), fma))))
    return ll.seq(ll.ZeroOut(c), loops), a, b, c


def conv(prec=ops.single):
    """`out[o, y, x] = sum_{c, u, v} w[o, c, u, v] * img[c, y + u, x + v]`, valid padding."""
    oc, ic, h, k = 4, 2, 10, 3
    img, w = Tnode("img", (ic, h, h), prec), Tnode("w", (oc, ic, k, k), prec)
    out = Tnode("out", (oc, h - k + 1, h - k + 1), prec)
    o, y, x, c, u, v = (get_symbol(s) for s in "oyxcuv")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(w, it(o, c, u, v)),
                    ll.Get(img, (Iterator(c), Affine(((1, y), (1, u))), Affine(((1, x), (1, v))))),
                    ll.Get(out, it(o, y, x)))
    body = ll.Set(out, it(o, y, x), fma)
    for s, n in reversed([(o, oc), (y, h - k + 1), (x, h - k + 1), (c, ic), (u, k), (v, k)]):
        body = ll.ForLoop(s, 0, n - 1, body)
    return ll.seq(ll.ZeroOut(out), body), img, w, out


def inputs_for(*tns, seed=0):
    rng = np.random.default_rng(seed)
    return {tn: rng.standard_normal(tn.dims).astype(tn.prec.dtype) for tn in tns}


def run_in_c(code, inputs, *, name="scheduled", options=None):
    """Compile `code` with gcc and run it once in a fresh context with its own arrays (the
    host arrays are neither read nor written), after copying `inputs` in; the context."""
    return run_once(code, inputs, name=name, options=options, context=CcBackend(options).init(name))


def run_c(code, inputs, out):
    return run_in_c(code, inputs).array(out).copy()


def check_exact(code, sched, ins, out, *, threads=1, name="exact"):
    """The scheduled code's `out`, under the interpreter and gcc, is the unscheduled code's
    (bit for bit: nothing is reassociated); that value."""
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[out]
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[out], want)
    got = run_in_c(sched, ins, name=name, options=cc.CcOptions(threads=threads)).array(out)
    if out.prec is ops.double:
        # the interpreter has no fused double multiply-add (it rounds twice); gcc's fma rounds once
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)
    else:
        np.testing.assert_array_equal(got, want)
    return want


def local_nodes(code):
    return {tn.label[0] for tn in ll.nodes_of(code) if tn.is_local()}


@pytest.mark.parametrize("transposed", [False, True], ids=["a@b", "a@b.T"])
@pytest.mark.parametrize("n,m,p", [(16, 8, 32), (12, 5, 40), (7, 9, 20)])
def test_contraction_is_blocked_and_bit_identical(n, m, p, transposed):
    code, a, b, c = matmul(n, m, p, transposed)
    sched = schedule_llc(code, ON, ANY_SIZE)
    # a tail panel's block of vectors loads and stores through a zero-padded edge buffer
    assert local_nodes(sched) == {"pack", "acc"} | ({"edge"} if p % 32 else set())
    ins = inputs_for(a, b)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[c]
    got = interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[c]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run_c(sched, ins, c), want)
    np.testing.assert_allclose(want, ins[a] @ (ins[b].T if transposed else ins[b]), rtol=1e-5, atol=1e-5)


def test_conv_is_blocked_and_bit_identical():
    code, img, w, out = conv()
    sched = schedule_llc(code, ON, ANY_SIZE)
    assert local_nodes(sched) == {"pack", "acc"}
    ins = inputs_for(img, w)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[out]
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[out], want)
    np.testing.assert_array_equal(run_c(sched, ins, out), want)
    x, wv = ins[img].astype(np.float64), ins[w].astype(np.float64)
    ref = np.zeros(out.dims)
    for u in range(3):
        for v in range(3):
            ref += np.einsum("ocyx->oyx", wv[:, :, u, v][:, :, None, None] * x[None, :, u:u + 8, v:v + 8])
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


def test_small_nests_are_left_alone():
    code, *_ = matmul(4, 4, 4, True)
    assert schedule_llc(code, ON) == code


def row_sums(n, m, prec):
    a, s = Tnode("a", (n, m), prec), Tnode("s", (n,), prec)
    i, k = get_symbol("i"), get_symbol("k")
    add = ll.Binop(ops.Binop.ADD, ll.Get(s, it(i)), ll.Get(a, it(i, k)))
    return ll.seq(ll.ZeroOut(s), ll.ForLoop(i, 0, n - 1, ll.ForLoop(k, 0, m - 1, ll.Set(s, it(i), add)))), a, s


def test_reduction_is_split_into_lanes_only_when_reassociation_is_allowed():
    code, a, s = row_sums(3, 4 * LANES, ops.single)
    split = schedule_llc(code, ON, ANY_SIZE)
    assert local_nodes(split) == {"lanes"}
    assert schedule_llc(code, OFF, ANY_SIZE) == code
    ins = inputs_for(a)
    want = interpret.run(code, {a: ins[a].copy()})[s]
    got = interpret.run(split, {a: ins[a].copy()})[s]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(run_c(split, ins, s), got)
    np.testing.assert_allclose(got, ins[a].astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_a_subtracted_row_sum_is_split_and_subtracted_once():
    """LayerNorm's backward subtracts a row sum (`s[i] -= g[i, k]`): the partial sums add the
    terms, and their total is subtracted from the target, which keeps its prior value."""
    a, s = Tnode("a", (5, 4 * LANES)), Tnode("s", (5,))
    i, k = get_symbol("i"), get_symbol("k")
    sub = ll.Binop(ops.Binop.SUB, ll.Get(s, it(i)), ll.Get(a, it(i, k)))
    code = ll.ForLoop(i, 0, 4, ll.ForLoop(k, 0, 4 * LANES - 1, ll.Set(s, it(i), sub)))
    split = schedule_llc(code, ON, ANY_SIZE)
    assert local_nodes(split) == {"lanes"}
    assert schedule_llc(code, OFF, ANY_SIZE) == code
    ins = inputs_for(a, s)
    got = interpret.run(split, {tn: v.copy() for tn, v in ins.items()})[s]
    np.testing.assert_array_equal(run_c(split, ins, s), got)
    want = ins[s].astype(np.float64) - ins[a].astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    unsplit = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[s]
    np.testing.assert_allclose(got, unsplit, rtol=1e-5, atol=1e-5)
    assert not np.array_equal(got, ins[s])


def test_decode_sized_matrix_vector_products_are_split_below_min_work():
    """A 128 x 128 `w @ x` for one token (a decode step) is under `min_work`, yet is split
    into lanes (`min_split_work`); a reduction shorter than the lanes and a nest under
    `min_split_work` are left alone."""
    w, x, y = Tnode("w", (128, 128)), Tnode("x", (128,)), Tnode("y", (128,))
    i, k = get_symbol("i"), get_symbol("k")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(w, it(i, k)), ll.Get(x, it(k)), ll.Get(y, it(i)))
    code = ll.seq(ll.ZeroOut(y), ll.ForLoop(i, 0, 127, ll.ForLoop(k, 0, 127, ll.Set(y, it(i), fma))))
    assert 128 * 128 < Blocking().min_work
    split = schedule_llc(code, ON, Blocking())
    assert local_nodes(split) == {"lanes"}
    ins = inputs_for(w, x)
    got = interpret.run(split, {tn: v.copy() for tn, v in ins.items()})[y]
    np.testing.assert_array_equal(run_c(split, ins, y), got)
    want = ins[w].astype(np.float64) @ ins[x].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    short, *_ = row_sums(256, LANES // 2, ops.single)
    assert schedule_llc(short, ON, Blocking()) == short
    few, *_ = row_sums(2, 2 * LANES, ops.single)
    assert schedule_llc(few, ON, Blocking()) == few


def test_integer_reductions_are_split_exactly_even_without_reassociation():
    code, a, s = row_sums(2, 2 * LANES, ops.int32)
    split = schedule_llc(code, OFF, ANY_SIZE)
    assert local_nodes(split) == {"lanes"}
    x = np.arange(2 * 2 * LANES, dtype=np.int32).reshape(2, -1) * 7 - 100
    np.testing.assert_array_equal(interpret.run(split, {a: x.copy()})[s], x.sum(axis=1))


def test_split_keeps_an_innermost_unit_stride_lhs_loop_for_interchange():
    """A column sum `s[j] += a[k, j]` is the interchange's job (j innermost), not a split."""
    a, s = Tnode("a", (4 * LANES, 8)), Tnode("s", (8,))
    j, k = get_symbol("j"), get_symbol("k")
    code = ll.ForLoop(j, 0, 7, ll.ForLoop(k, 0, 4 * LANES - 1, ll.Set(
        s, it(j), ll.Binop(ops.Binop.ADD, ll.Get(s, it(j)), ll.Get(a, it(k, j))))))
    assert schedule_llc(code, ON, ANY_SIZE) == code


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(precs=(ops.double, ops.single)), opt_settings=st.sampled_from(SETTINGS),
       reassociate=st.booleans())
def test_random_programs_through_the_scheduler(program, opt_settings, reassociate):
    """Optimized random programs, then scheduled with no size threshold: the interpreter agrees
    — exactly without reassociation, within float32 rounding with it."""
    base = replace(opt_settings, schedule=False, interchange=False)
    llc, tns, inputs = build(program)
    code = optimize_proc(llc, settings=base).llc
    want = interpret.run(code, {tn: v.copy() for tn, v in inputs.items()})
    sched = schedule_llc(code, replace(base, reassociate=reassociate), TINY)
    got = interpret.run(sched, {tn: v.copy() for tn, v in inputs.items()})
    atol = 1e-4 * (1.0 + _scale([want.get(tn) for tn in tns]))
    for tn in tns:
        if tn in want and tn in got:
            if reassociate:
                np.testing.assert_allclose(got[tn], want[tn], rtol=1e-4, atol=atol, equal_nan=True)
            else:
                assert np.array_equal(got[tn], want[tn], equal_nan=True), tn.debug_name()


def test_stages_are_named_and_dumped(tmp_path, monkeypatch):
    assert [s.name for s in STAGES] == ["tracing", "virtualize", "cleanup", "simplify", "schedule", "bf16",
                                        "extrema", "interchange", "causal", "scope_sums", "first_writes", "copies",
                                        "epilogues", "fuse", "rows", "trim", "prefetch"]
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    code, *_ = matmul(64, 32, 64, True)
    opt = optimize_proc(code, name="dense")
    names = sorted(p.name for p in tmp_path.iterdir())
    # the unoptimized code is `lower_assignments`'s dump (`<name>.ll`), not the optimizer's
    assert names == sorted(f"dense.{s}.ll" for s in ("virtualize", "cleanup", "simplify", "schedule", "bf16",
                                                     "extrema", "interchange", "causal", "scope_sums",
                                                     "first_writes", "copies", "epilogues", "fuse", "rows",
                                                     "trim", "prefetch"))
    assert (tmp_path / "dense.prefetch.ll").read_text() == ll.to_doc(opt.llc)
    assert "pack" in (tmp_path / "dense.schedule.ll").read_text()
    assert "pack" not in ll.to_doc(opt.portable_llc)


def _normalized_c(code) -> str:
    """The C of `code` at one thread: the default thread count is the machine's core count,
    which would make the golden depend on the machine running the test."""
    src = cc.compile_proc(code, name="scheduled", options=cc.CcOptions(threads=1)).source
    src = src[src.index("void scheduled("):]
    names: dict[str, str] = {}
    return re.sub(r"\b([a-z]+)_?(\d+)\b", lambda m: names.setdefault(m.group(0), f"{m.group(1)}{len(names)}"), src)


@pytest.mark.parametrize("which", ["matmul_abt", "conv", "matmul_tails"])
def test_scheduled_c_golden(which):
    """`matmul_tails`: 11 rows and 45 columns, which the 7x32 block the cost model picks does
    not divide: blocks of 6 and 5 rows (`cost_model.row_blocks`), and the last 13 columns in a
    panel padded to 32."""
    code = {"matmul_abt": lambda: matmul(64, 32, 64, True)[0], "conv": lambda: conv()[0],
            "matmul_tails": lambda: matmul(11, 9, 45, True)[0]}[which]()
    text = _normalized_c(schedule_llc(code, ON, ANY_SIZE))
    path = GOLDEN / f"scheduled_{which}.c"
    if os.environ.get("EINJIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_large_contractions_run_on_threads_with_identical_results():
    code, a, b, c = matmul(64, 48, 64, True)
    sched = schedule_llc(code, ON, Blocking(min_work=1, parallel_min_work=1))
    ins = inputs_for(a, b)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[c]
    results = {}
    for threads in (1, 2):
        options = cc.CcOptions(threads=threads)
        proc = cc.compile_proc(sched, name="threaded", options=options)
        # one region around both panels (not one per panel): one thread packs a panel, the
        # threads share out its row blocks
        region = ("  #pragma omp parallel num_threads(2)\n  {\n    einjit_f32x16 acc[16];\n"
                  "    for (int jp0 = 0; jp0 < 2; ++jp0) {\n      #pragma omp single\n      {\n")
        rows = "      #pragma omp for schedule(dynamic)\n      for (int ib0 = 0; ib0 < 8; ++ib0) {"
        assert (region in proc.source and rows in proc.source) == (threads == 2)
        assert proc.source.count("#pragma omp parallel") == (threads == 2)
        # the row blocks share the panel packed before them; the block of accumulators is
        # each thread's alone, so the routine declares none of its own
        assert ("einjit_f32x16 acc[16] = {0};" in proc.source) == (threads == 1)
        assert "float pack[1536] = {0};" in proc.source
        results[threads] = run_in_c(sched, ins, name="threaded", options=options).array(c).copy()
    np.testing.assert_array_equal(results[1], want)
    np.testing.assert_array_equal(results[2], want)


def test_small_contractions_stay_serial():
    code, *_ = matmul(16, 8, 32, True)
    sched = schedule_llc(code, ON, ANY_SIZE)
    assert not any(isinstance(s, ll.ForLoop) and s.parallel for s in ll.iter_stmts(sched))
    assert "omp" not in cc.compile_proc(sched, name="serial", options=cc.CcOptions(threads=2)).source


def test_thread_count_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("EINJIT_NUM_THREADS", "3")
    assert cc.CcOptions().threads == 3
    monkeypatch.setenv("EINJIT_NUM_THREADS", "many")
    with pytest.raises(cc.CompileError, match="EINJIT_NUM_THREADS must be a positive integer, got 'many'"):
        cc.CcOptions()
    monkeypatch.delenv("EINJIT_NUM_THREADS")
    assert cc.CcOptions().threads == (os.cpu_count() or 1)


def test_batched_contractions_run_their_batch_loop_on_threads():
    """A conv over a batch: the batch loop is the one on threads, each with its own panel."""
    code, img, w, out = conv()
    n = get_symbol("n")
    batched_img, batched_out = Tnode("bimg", (3, *img.dims)), Tnode("bout", (3, *out.dims))

    def batched(sc):
        match sc:
            case ll.Get(tn, idcs) if tn in (img, out):
                return ll.Get(batched_img if tn is img else batched_out, (Iterator(n), *idcs))
            case ll.Ternop(op, a, b, c):
                return ll.Ternop(op, batched(a), batched(b), batched(c))
        return sc

    nest = list(ll.flatten(code))[1]
    loops, body = [], nest
    while isinstance(body, ll.ForLoop):
        loops.append(body)
        body = body.body
    new = ll.Set(batched_out, (Iterator(n), *body.idcs), batched(body.llsc))
    for lp in reversed(loops):
        new = ll.ForLoop(lp.index, lp.from_, lp.to_, new)
    code = ll.seq(ll.ZeroOut(batched_out), ll.ForLoop(n, 0, 2, new))
    sched = schedule_llc(code, ON, Blocking(min_work=1, parallel_min_work=1))
    assert [s.index for s in ll.iter_stmts(sched) if isinstance(s, ll.ForLoop) and s.parallel] == [n]
    ins = inputs_for(batched_img, w)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[batched_out]
    options = cc.CcOptions(threads=2)
    proc = cc.compile_proc(sched, name="batched", options=options)
    head, _, body = proc.source.partition(" {\n")
    assert "#pragma omp parallel num_threads(2)\n  {\n    float pack[" in body and "pack" not in head
    assert "pack[" not in body.partition("#pragma omp")[0] and "acc[" not in body.partition("#pragma omp")[0]
    ctx = run_in_c(sched, ins, name="batched", options=options)
    np.testing.assert_array_equal(ctx.array(batched_out), want)


def test_split_sums_are_more_accurate_than_sequential_ones():
    """The issue's example: a float32 sum of 2,000,000 values. In lanes each partial sum
    stays small, so rounding errors stay small too."""
    n = 2_000_000
    a, s = Tnode("a", (n,)), Tnode("s", (1,))
    k = get_symbol("k")
    cell = (FixedIdx(0),)
    code = ll.seq(ll.ZeroOut(s), ll.ForLoop(k, 0, n - 1, ll.Set(
        s, cell, ll.Binop(ops.Binop.ADD, ll.Get(s, cell), ll.Get(a, it(k))))))
    x = np.random.default_rng(0).uniform(0, 1, n).astype(np.float32)
    exact = x.astype(np.float64).sum()
    errors = {}
    for settings_ in (ON, OFF):
        opt = optimize_proc(code, name="total", settings=settings_)
        assert ("lanes" in local_nodes(opt.llc)) == settings_.reassociate
        errors[settings_.reassociate] = abs(float(run_c(opt, {a: x}, s)[0]) - exact) / exact
    assert errors[True] < 1e-6 < errors[False]


def test_conv_kernel_gradient_keeps_lanes_across_all_summed_loops():
    """`dw[o, c, u, v] += g[n, o, y, x] * img[n, c, y + u, x + v]`: the lhs loops move out, and
    one partial sum per `x` runs over `n`, `y` and `x` before the lanes are added up."""
    oc, ic, k, b, h = 2, 2, 3, 2, 6
    g, img, dw = Tnode("g", (b, oc, h, h)), Tnode("img", (b, ic, h + k - 1, h + k - 1)), Tnode("dw", (oc, ic, k, k))
    o, c, u, v, n, y, x = (get_symbol(s) for s in "ocuvnyx")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(g, it(n, o, y, x)),
                    ll.Get(img, (Iterator(n), Iterator(c), Affine(((1, y), (1, u))), Affine(((1, x), (1, v))))),
                    ll.Get(dw, it(o, c, u, v)))
    body = ll.Set(dw, it(o, c, u, v), fma)
    for s, e in reversed([(o, oc), (c, ic), (u, k), (v, k), (n, b), (y, h), (x, h)]):
        body = ll.ForLoop(s, 0, e - 1, body)
    code = ll.seq(ll.ZeroOut(dw), body)
    sched = schedule_llc(code, ON, ANY_SIZE)
    assert local_nodes(sched) == {"lanes"}
    assert [s.index for s in ll.iter_stmts(sched) if isinstance(s, ll.ForLoop)][:4] == [o, c, u, v]
    assert schedule_llc(code, OFF, ANY_SIZE) == code
    ins = inputs_for(g, img)
    got = interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[dw]
    np.testing.assert_array_equal(run_c(sched, ins, dw), got)
    gv, iv = ins[g].astype(np.float64), ins[img].astype(np.float64)
    want = np.zeros(dw.dims)
    for du in range(k):
        for dv in range(k):
            want[:, :, du, dv] = np.einsum("noyx,ncyx->oc", gv, iv[:, :, du:du + h, dv:dv + h])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(), threads=st.sampled_from([1, 2]))
def test_gcc_runs_scheduled_random_programs_like_the_interpreter(program, threads):
    """Scheduled random programs (tiny blocks, every contraction threaded) compiled by gcc
    compute what the interpreter computes on the same scheduled code."""
    base = VirtualizeSettings(schedule=False, interchange=False)
    llc, tns, inputs = build(program)
    code = optimize_proc(llc, settings=base).llc
    sched = schedule_llc(code, ON, replace(TINY, parallel_min_work=1))
    want = interpret.run(sched, {tn: v.copy() for tn, v in inputs.items()})
    ctx = run_in_c(sched, inputs, name="scheduled_random", options=cc.CcOptions(threads=threads))
    atol = 1e-9 * (1.0 + _scale([want.get(tn) for tn in tns]))
    for tn, spec in zip(tns, program.nodes, strict=True):
        if spec.host and tn in want:
            np.testing.assert_allclose(ctx.array(tn), want[tn], rtol=1e-9, atol=atol, equal_nan=True,
                                       err_msg=tn.debug_name())


def contraction_nest(draw, ni: int, nj: int, nk: int, nb_: int, prec=ops.single):
    """`c[(n,) i, j] += A * B` in a drawn loop order, with a drawn layout of each operand and
    a drawn choice of batching (over `nb_`): the code and the nodes `a, b, c`."""
    batched, a_t, b_t = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    n, i, j, k = (get_symbol(s) for s in "nijk")
    a = Tnode("a", (nk, ni) if a_t else (ni, nk), prec)
    b = Tnode("b", ((nb_,) if batched else ()) + ((nj, nk) if b_t else (nk, nj)), prec)
    c = Tnode("c", ((nb_,) if batched else ()) + (ni, nj), prec)
    pre = (Iterator(n),) if batched else ()
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, it(k, i) if a_t else it(i, k)),
                    ll.Get(b, pre + (it(j, k) if b_t else it(k, j))), ll.Get(c, pre + it(i, j)))
    order = draw(st.permutations([(i, ni), (j, nj), (k, nk)] + ([(n, nb_)] if batched else [])))
    body = ll.Set(c, pre + it(i, j), fma)
    for s, e in reversed(order):
        body = ll.ForLoop(s, 0, e - 1, body)
    return ll.seq(ll.ZeroOut(c), body), a, b, c


@st.composite
def contractions(draw):
    """A random contraction nest (`contraction_nest`) with extents up to 9, random block
    sizes and each machine description."""
    prec = draw(st.sampled_from([ops.single, ops.double]))
    code, a, b, c = contraction_nest(draw, *(draw(st.integers(1, 9)) for _ in range(4)), prec)
    blocking = Blocking(min_work=1, nb_choices=(draw(st.sampled_from([2, 4, 8])),), min_nb=2,
                        mb_max=draw(st.integers(1, 4)), parallel_min_work=1,
                        machine=draw(st.sampled_from(list(MACHINES.values()))))
    return code, a, b, c, blocking


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=contractions(), threads=st.sampled_from([1, 2]))
def test_random_contractions_are_scheduled_exactly(case, threads):
    """Without reassociation (a nest that is no contraction, such as a dot product, may
    otherwise become a split sum) every result is bit-identical."""
    code, a, b, c, blocking = case
    sched = schedule_llc(code, OFF, blocking)
    ins = inputs_for(a, b)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[c]
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[c], want)
    ctx = run_in_c(sched, ins, name="contraction", options=cc.CcOptions(threads=threads))
    tol = 1e-6 if c.prec is ops.single else 1e-14
    np.testing.assert_allclose(ctx.array(c), want, rtol=tol, atol=tol)
