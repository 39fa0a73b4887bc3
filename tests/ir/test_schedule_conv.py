"""Channel blocking of convolution nests (`ir/sched/schedule_conv.py`), differentially: the scheduled
nest against the original under the interpreter, gcc against the interpreter, both against a
float64 NumPy reference; bit for bit wherever no sum is reordered."""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np
import pytest

from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, Iterator, get_symbol
from einjit.ir.sched import cost_model
from einjit.ir.sched.interchange import interchange_loops
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking, schedule_llc
from einjit.ir.tnode import Tnode
from test_schedule import GOLDEN, OFF, ON, _normalized_c, inputs_for, it, local_nodes, run_c, run_in_c

B, CI, CO, H, K = 8, 2, 16, 5, 3
OH = H - K + 1
ANY_SIZE = Blocking(min_work=1, min_unroll_work=1)


def _window(*syms):
    """`(n, c, y + u, x + v)`-style indices: plain iterators, then two affine window axes."""
    *plain, y, u, x, v = syms
    return (*it(*plain), Affine(((1, y), (1, u))), Affine(((1, x), (1, v))))


def _nest(order, body):
    for s, n in reversed(order):
        body = ll.ForLoop(s, 0, n - 1, body)
    return body


def _syms():
    return tuple(get_symbol(s) for s in ("n", "o", "c", "y", "x", "u", "v"))


def forward(prec=ops.single):
    """`out[n, o, y, x] += img[n, c, y+u, x+v] * w[o, c, u, v]` in NCHW, as `nn.Conv2d` lowers it."""
    img, w = Tnode("img", (B, CI, H, H), prec), Tnode("w", (CO, CI, K, K), prec)
    out = Tnode("out", (B, CO, OH, OH), prec)
    n, o, c, y, x, u, v = _syms()
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(img, _window(n, c, y, u, x, v)), ll.Get(w, it(o, c, u, v)),
                    ll.Get(out, it(n, o, y, x)))
    body = _nest([(n, B), (o, CO), (y, OH), (x, OH), (c, CI), (u, K), (v, K)], ll.Set(out, it(n, o, y, x), fma))
    return ll.seq(ll.ZeroOut(out), body), (img, w), out


def kernel_grad(prec=ops.single):
    """`dw[o, c, u, v] += img[n, c, y+u, x+v] * g[n, o, y, x]`."""
    img, g = Tnode("img", (B, CI, H, H), prec), Tnode("g", (B, CO, OH, OH), prec)
    dw = Tnode("dw", (CO, CI, K, K), prec)
    n, o, c, y, x, u, v = _syms()
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(img, _window(n, c, y, u, x, v)), ll.Get(g, it(n, o, y, x)),
                    ll.Get(dw, it(o, c, u, v)))
    body = _nest([(n, B), (o, CO), (y, OH), (x, OH), (c, CI), (u, K), (v, K)], ll.Set(dw, it(o, c, u, v), fma))
    return ll.seq(ll.ZeroOut(dw), body), (img, g), dw


def input_grad(prec=ops.single):
    """`dimg[n, c, y+u, x+v] += g[n, o, y, x] * w[o, c, u, v]`: a scatter through the window."""
    g, w = Tnode("g", (B, CO, OH, OH), prec), Tnode("w", (CO, CI, K, K), prec)
    dimg = Tnode("dimg", (B, CI, H, H), prec)
    n, o, c, y, x, u, v = _syms()
    cell = _window(n, c, y, u, x, v)
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(g, it(n, o, y, x)), ll.Get(w, it(o, c, u, v)), ll.Get(dimg, cell))
    body = _nest([(n, B), (o, CO), (y, OH), (x, OH), (c, CI), (u, K), (v, K)], ll.Set(dimg, cell, fma))
    return ll.seq(ll.ZeroOut(dimg), body), (g, w), dimg


def _patches(img):
    return np.stack([np.stack([img[:, :, u:u + OH, v:v + OH] for v in range(K)], -1) for u in range(K)], -2)


def reference(which, ins):
    """float64 NumPy: `patches[n, c, y, x, u, v] = img[n, c, y+u, x+v]`."""
    a, b = (v.astype(np.float64) for v in ins)
    match which:
        case "forward":
            return np.einsum("ncyxuv,ocuv->noyx", _patches(a), b)
        case "kernel_grad":
            return np.einsum("ncyxuv,noyx->ocuv", _patches(a), b)
    out = np.zeros((B, CI, H, H))
    for u in range(K):
        for v in range(K):
            out[:, :, u:u + OH, v:v + OH] += np.einsum("noyx,oc->ncyx", a, b[:, :, u, v])
    return out


BUILDERS = {"forward": forward, "kernel_grad": kernel_grad, "input_grad": input_grad}


def _run_both(code, sched, tns, out):
    ins = inputs_for(*tns)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[out]
    got = interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[out]
    return ins, want, got


@pytest.mark.parametrize("kind", ["avx512", "avx2"])
@pytest.mark.parametrize("which", ["forward", "kernel_grad"])
def test_plain_lhs_nests_are_channel_blocked_bit_identically(which, kind):
    """On AVX2 a 16-channel block takes at most 6 rows: 2 vectors each, plus the panel row and
    a broadcast, in 16 registers. The kernel gradient's rows, its 3 kernel rows, are too few
    FMA chains: the block spans its 3 kernel columns too on AVX-512 (9 rows of one vector),
    its 2 input channels on AVX2 (6 rows of two)."""
    code, tns, out = BUILDERS[which]()
    blocking = dataclasses.replace(ANY_SIZE, machine=MACHINES[kind])
    sched = schedule_llc(code, OFF, blocking)
    assert "channel-blocked" in ll.to_doc(sched) and local_nodes(sched) == {"pack", "acc"}
    assert "channel-blocked" in ll.to_doc(schedule_llc(code, ON, blocking))
    mb, nb = map(int, re.search(r"channel-blocked (\d+)x(\d+)", ll.to_doc(sched)).groups())
    assert nb == 16 and cost_model.fits(mb, nb, 4, MACHINES[kind])
    if which == "kernel_grad":
        assert f"(3x{3 if kind == 'avx512' else 2} rows)" in ll.to_doc(sched)
    ins, want, got = _run_both(code, sched, tns, out)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run_c(sched, ins, out), want)
    np.testing.assert_allclose(want, reference(which, [ins[t] for t in tns]), rtol=1e-5, atol=1e-5)


def test_the_vector_axis_is_the_widest_channel_axis_and_its_panel_is_filled_once():
    """The lhs rows hold 3 cells, which no vector width divides: the blocks' columns are the
    16 output channels. The forward packs the weights once, outside every image loop; the
    kernel gradient packs the transposed output gradient once, outside the kernel loops."""
    for which in ("forward", "kernel_grad"):
        code, _, _ = BUILDERS[which]()
        sched = schedule_llc(code, ON, ANY_SIZE)
        packs = [tn for tn in ll.nodes_of(sched) if tn.is_local() and tn.label[0] == "pack"]
        assert len(packs) == 1 and packs[0].dims[-1] == CO, which
        outer = sched
        while isinstance(outer, ll.Seq):
            outer = next(s for s in ll.flatten(outer) if isinstance(s, ll.ForLoop))
        filled_in = []
        loop = outer
        while isinstance(loop, ll.ForLoop):
            filled_in.append(loop.index.name)
            loop = next(s for s in ll.flatten(loop.body) if isinstance(s, (ll.ForLoop, ll.Comment)))
        assert filled_in == ["jp"], (which, filled_in)


def test_scatter_lhs_is_blocked_only_when_reassociation_is_allowed():
    code, tns, out = input_grad()
    assert schedule_llc(code, OFF, ANY_SIZE) == code
    sched = schedule_llc(code, ON, ANY_SIZE)
    assert "channel-blocked" in ll.to_doc(sched)
    ins, want, got = _run_both(code, sched, tns, out)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(run_c(sched, ins, out), got)
    np.testing.assert_allclose(want, reference("input_grad", [ins[t] for t in tns]), rtol=1e-5, atol=1e-5)


def test_double_precision_is_blocked_bit_identically():
    code, tns, out = forward(ops.double)
    sched = schedule_llc(code, ON, ANY_SIZE)
    assert "channel-blocked" in ll.to_doc(sched)
    ins, want, got = _run_both(code, sched, tns, out)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(want, reference("forward", [ins[t] for t in tns]), rtol=1e-12)


def test_nests_without_a_vector_sized_axis_are_left_to_the_generic_rewrites():
    """Channels of 3 and 5, batch 2: no axis takes a vector block, nothing is channel-blocked."""
    img, w, out = Tnode("img", (2, 3, 7, 7)), Tnode("w", (5, 3, 3, 3)), Tnode("out", (2, 5, 5, 5))
    n, o, c, y, x, u, v = _syms()
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(img, _window(n, c, y, u, x, v)), ll.Get(w, it(o, c, u, v)),
                    ll.Get(out, it(n, o, y, x)))
    code = _nest([(n, 2), (o, 5), (y, 5), (x, 5), (c, 3), (u, 3), (v, 3)], ll.Set(out, it(n, o, y, x), fma))
    assert "channel-blocked" not in ll.to_doc(schedule_llc(code, ON, ANY_SIZE))


def test_a_unit_stride_axis_of_vector_size_keeps_the_generic_contraction():
    """NHWC (`out[n, y, x, o]`, 16 output channels innermost): `schedule`'s own contraction."""
    img, w, out = Tnode("img", (B, H, H, CI)), Tnode("w", (K, K, CI, CO)), Tnode("out", (B, OH, OH, CO))
    n, o, c, y, x, u, v = _syms()
    read = (Iterator(n), Affine(((1, y), (1, u))), Affine(((1, x), (1, v))), Iterator(c))
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(img, read), ll.Get(w, it(u, v, c, o)), ll.Get(out, it(n, y, x, o)))
    code = _nest([(n, B), (y, OH), (x, OH), (o, CO), (u, K), (v, K), (c, CI)], ll.Set(out, it(n, y, x, o), fma))
    doc = ll.to_doc(schedule_llc(code, ON, ANY_SIZE))
    assert "register-blocked" in doc and "channel-blocked" not in doc


def test_scheduled_nn_conv_c_golden():
    """The C of a channel-blocked NCHW convolution (the layout `nn.Conv2d` lowers to)."""
    text = _normalized_c(schedule_llc(forward()[0], ON, ANY_SIZE))
    path = GOLDEN / "scheduled_conv_nn.c"
    if os.environ.get("EINJIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def max_pool(c=CI * 4):
    """`m[n, c, y, x] := max(m[n, c, y, x], img[n, c, 2y+u, 2x+v])` over 2x2 windows, after a
    fill with max's neutral element (what `nn.MaxPool2d` lowers to)."""
    img, m = Tnode("img", (2, c, 6, 6)), Tnode("m", (2, c, 3, 3))
    n, ch, y, x, u, v = (get_symbol(s) for s in "ncyxuv")
    read = ll.Get(img, (Iterator(n), Iterator(ch), Affine(((2, y), (1, u))), Affine(((2, x), (1, v)))))
    body = _nest([(n, 2), (ch, c), (y, 3), (x, 3), (u, 2), (v, 2)],
                 ll.Set(m, it(n, ch, y, x), ll.Binop(ops.Binop.MAX, ll.Get(m, it(n, ch, y, x)), read)))
    fill = _nest([(n, 2), (ch, c), (y, 3), (x, 3)], ll.Set(m, it(n, ch, y, x), ll.Constant(-np.inf)))
    return ll.seq(fill, body), img, m, (n, ch, y, x, u, v)


def _loop_order(code):
    return [s.index for s in ll.iter_stmts(code) if isinstance(s, ll.ForLoop)]


def test_window_reduction_moves_the_channel_loop_innermost_and_interchange_keeps_it():
    code, img, m, (n, ch, y, x, u, v) = max_pool()
    sched = interchange_loops(schedule_llc(code, OFF, ANY_SIZE))
    assert _loop_order(sched)[-6:] == [n, y, x, u, v, ch]
    nest = [s for s in ll.iter_stmts(sched) if isinstance(s, ll.ForLoop) and s.index == n][-1]
    assert nest.keep_order and not any(s.keep_order for s in ll.iter_stmts(nest.body) if isinstance(s, ll.ForLoop))
    doc = ll.to_doc(sched)
    assert "vectorized across its axis 1" in doc and re.search(r"\nfor n\d* = 0 to 1 \(order kept\) \{\n", doc)
    assert not any(isinstance(s, ll.Comment) for s in ll.iter_stmts(nest))  # the mark, not a comment, keeps it
    ins = inputs_for(img)
    ins[img][0, 3, 1, 4] = np.nan
    want = interpret.run(code, {img: ins[img].copy()})[m]
    np.testing.assert_array_equal(interpret.run(sched, {img: ins[img].copy()})[m], want)
    np.testing.assert_array_equal(run_c(sched, ins, m), want)
    ref = ins[img].reshape(2, CI * 4, 3, 2, 3, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(want, ref)  # NaN included: the window holding it is NaN
    assert np.isnan(want[0, 3, 0, 2]) and np.isnan(want).sum() == 1


def test_window_reduction_needs_a_loop_the_vector_divides():
    code, *_ = max_pool(c=6)
    assert "vectorized across" not in ll.to_doc(schedule_llc(code, ON, ANY_SIZE))


@pytest.mark.parametrize("classes, label", [(10, "register-blocked"), (3, "channel-blocked 3x16 contraction into")])
def test_a_dense_layer_is_blocked_along_its_outputs_or_else_the_batch_bit_identically(classes, label):
    """`logits[b, o] += x[b, k] * w[o, k]`: 10 outputs take a vector block with a tail;
    3 outputs are too few for one, and the plain blocking declines them: 16 samples take one."""
    x, w, logits = Tnode("x", (16, 40)), Tnode("w", (classes, 40)), Tnode("logits", (16, classes))
    b, o, k = (get_symbol(s) for s in "bok")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(x, it(b, k)), ll.Get(w, it(o, k)), ll.Get(logits, it(b, o)))
    code = ll.seq(ll.ZeroOut(logits), _nest([(b, 16), (o, classes), (k, 40)], ll.Set(logits, it(b, o), fma)))
    sched = schedule_llc(code, OFF, ANY_SIZE)
    assert label in ll.to_doc(sched)
    ins = inputs_for(x, w)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[logits]
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[logits], want)
    np.testing.assert_array_equal(run_c(sched, ins, logits), want)
    np.testing.assert_allclose(want, ins[x].astype(np.float64) @ ins[w].T.astype(np.float64), rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("kind", ["avx512", "avx2"])
def test_a_long_kernel_gradient_sum_is_split_into_chunks_that_threads_share(kind, monkeypatch):
    """The batch is cut into `SPLIT_CHUNKS` chunks, each summed into its own partial sums and
    added in chunk order: within float tolerance of the unsplit sum (the terms' order changes),
    and gcc at 1 and at 2 threads gives the interpreter's bits (the chunk count does not depend
    on the threads). Without reassociation the sum stays whole and bit-identical. (The
    threshold is lowered so that the interpreter runs a small nest: 8 images of 3x3 outputs.)"""
    from einjit.backends import parallel_loops
    from einjit.backends.c_syntax import C_SYNTAX
    from einjit.backends.cc import toolchain as cc
    from einjit.ir.sched import schedule_conv

    code, tns, out = kernel_grad()
    blocking = dataclasses.replace(ANY_SIZE, machine=MACHINES[kind])
    assert "sum split" not in ll.to_doc(schedule_llc(code, ON, blocking))  # 72 terms per cell
    monkeypatch.setattr(schedule_conv, "SPLIT_MIN_TERMS", B * OH * OH)
    sched = schedule_llc(code, ON, blocking)
    doc = ll.to_doc(sched)
    assert f"sum split into {schedule_conv.SPLIT_CHUNKS} chunks" in doc and "channel-blocked" in doc
    parts = [tn for tn in ll.nodes_of(sched) if tn.label[0] == "part"]
    assert len(parts) == 1 and parts[0].dims == (schedule_conv.SPLIT_CHUNKS, CO, CI, K, K)
    threaded = parallel_loops.thread_nests(sched, 2, min_work=1)
    assert any(isinstance(s, ll.ForLoop) and s.parallel and s.index.name == "kc" for s in ll.flatten(threaded))
    ins, want, got = _run_both(code, sched, tns, out)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(want, reference("kernel_grad", [ins[t] for t in tns]), rtol=1e-5, atol=1e-5)
    for threads in (1, 2):
        opts = cc.CcOptions(threads=threads, syntax=dataclasses.replace(C_SYNTAX, thread_min_work=1))
        source = cc.compile_proc(sched, name=f"split{threads}", options=opts).source
        assert ("#pragma omp for" in source) == (threads == 2)
        np.testing.assert_array_equal(run_in_c(sched, ins, options=opts).array(out), got, err_msg=f"{threads} threads")
    exact = schedule_llc(code, OFF, blocking)
    assert "sum split" not in ll.to_doc(exact) and "channel-blocked" in ll.to_doc(exact)
    np.testing.assert_array_equal(_run_both(code, exact, tns, out)[2], want)


def test_an_nhwc_kernel_gradient_is_channel_blocked_only_when_its_sum_is_split(monkeypatch):
    """`dw[u, v, c, o] += img[n, y+u, x+v, c] * g[n, y, x, o]`: the 16 output channels are the
    unit-stride axis, which `schedule`'s contraction blocks along, until the sum is long enough
    to split (threshold lowered here: 8 images of 3x3 outputs); split, the chunks go on threads."""
    from einjit.ir.sched import schedule_conv

    img, g, dw = Tnode("img", (B, H, H, CI)), Tnode("g", (B, OH, OH, CO)), Tnode("dw", (K, K, CI, CO))
    n, o, c, y, x, u, v = _syms()
    read = (Iterator(n), Affine(((1, y), (1, u))), Affine(((1, x), (1, v))), Iterator(c))
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(img, read), ll.Get(g, it(n, y, x, o)), ll.Get(dw, it(u, v, c, o)))
    code = ll.seq(ll.ZeroOut(dw), _nest([(n, B), (y, OH), (x, OH), (u, K), (v, K), (c, CI), (o, CO)],
                                        ll.Set(dw, it(u, v, c, o), fma)))
    assert "channel-blocked" not in ll.to_doc(schedule_llc(code, ON, ANY_SIZE))
    monkeypatch.setattr(schedule_conv, "SPLIT_MIN_TERMS", B * OH * OH)
    sched = schedule_llc(code, ON, ANY_SIZE)
    assert "channel-blocked" in ll.to_doc(sched) and "sum split into" in ll.to_doc(sched)
    assert "channel-blocked" not in ll.to_doc(schedule_llc(code, OFF, ANY_SIZE))
    ins, want, got = _run_both(code, sched, (img, g), dw)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(run_c(sched, ins, dw), got)
    patches = _patches(ins[img].transpose(0, 3, 1, 2).astype(np.float64))
    ref = np.einsum("ncyxuv,nyxo->uvco", patches, ins[g].astype(np.float64))
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)
