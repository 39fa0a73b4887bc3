"""Causal skipping (`ir/sched/causal.py`): the loops of a causal attention's contractions are
clipped to the triangle the mask keeps — `P v`, `dS k`, `Pᵀ dY`, `dSᵀ q` skip the terms with a
zero weight, `q kᵀ` and `dY vᵀ` skip the cells only the mask reads — and every result stays bit
for bit that of the full loops: gcc on one and two threads and the interpreter, AVX2 and AVX-512
register blocks, an odd sequence length (tail row blocks and panels), against PyTorch where
installed."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gradcheck import weighted_loss
from torch_refs import torch_mha

import einjit as ej
from einjit import train
from einjit.backends.cc import toolchain as cc
from einjit.ir import assignments as asg
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol, make_affine
from einjit.ir.optimize import VirtualizeSettings, optimize_proc
from einjit.ir.sched.causal import clip_causal_loops
from einjit.ir.sched.fusion import fuse_loops
from einjit.ir.tnode import Tnode
from einjit.nn.attention import MultiHeadAttention
from einjit.shape import finish_inference
from test_schedule import run_in_c

B, T, D, H = 2, 37, 32, 2
CLIPPED = re.compile(r"\((start|stop) (\d+)\*")


def _layer_and_loss(causal: bool, seed: int = 0, shape: tuple[int, int, int] = (B, T, D), poison: float = 0.0):
    """The layer and a weighted loss of its output; `poison`, when not 0, replaces one input
    value (the sixth token's fourth feature)."""
    rng = np.random.default_rng(seed)
    layer = MultiHeadAttention(shape[2], H, causal=causal, label="mha")
    xv = rng.standard_normal(shape).astype(np.float32)
    if poison:
        xv[0, 5, 3] = poison
    x = ej.ndarray(xv, batch_axes=2, label="x")
    loss = weighted_loss(layer(x), rng)
    train.init_params(loss, seed=seed + 1)
    return layer, loss


def _run(loss, layer, name: str, settings: VirtualizeSettings, code=None, threads: int = 1,
         poisoned: bool = False) -> dict[str, np.ndarray]:
    """The loss and the gradients after one step; `poisoned`: every byte of the routine's
    scratch set to 0xFF first (a NaN in each float), so a cell read before it is written shows."""
    routine = train.to_routine(code or train.grad_update(loss), name=name, settings=settings,
                               options=cc.CcOptions(threads=threads))
    if poisoned:
        context = routine.context
        for scratch in [*(a for arenas in context.arenas.values() for a in arenas), *context.scratch.values()]:
            scratch.view(np.uint8)[...] = 0xFF
    routine()
    out = {"loss": loss.value.numpy().copy()}
    out.update({p.label_str: p.grad.numpy().copy() for p in layer.params()})
    return out


def _clipped_as_full(name: str, threads: int = 1, **layer_args) -> dict[str, np.ndarray]:
    """A causal layer's training step compiled with its loops clipped (`{name}_clipped`) and
    with the full loops (`{name}_full`): the loss and the gradients are the same bits; the
    full loops' values. With `vector_math` (the default): `exp` is einjit's own (`c_math`), the
    same bits whether gcc vectorizes its loop or not, and that depends on what surrounds it."""
    layer, loss = _layer_and_loss(causal=True, **layer_args)
    code = train.grad_update(loss)
    clipped = _run(loss, layer, f"{name}_clipped", VirtualizeSettings(), code, threads)
    full = _run(loss, layer, f"{name}_full", VirtualizeSettings(causal=False), code, threads)
    for label, want in full.items():
        np.testing.assert_array_equal(clipped[label], want, err_msg=label)
    return full


@pytest.mark.parametrize("machine,threads", [("avx2", 1), ("avx512", 2)])
def test_causal_training_step_is_bit_identical_to_the_full_loops(machine, threads, tmp_path, monkeypatch):
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    _clipped_as_full(f"step_{machine}", threads)
    code = (tmp_path / f"step_{machine}_clipped.causal.ll").read_text()
    clips = CLIPPED.findall(code)
    # the six contractions: the reductions of P v, dS k (stops), Pᵀ dY, dSᵀ q (starts), and
    # the row blocks of q kᵀ and dY vᵀ (starts scaled by the block's rows)
    assert sum(kind == "stop" for kind, _ in clips) >= 2
    assert sum(kind == "start" and scale == "1" for kind, scale in clips) >= 2
    assert sum(kind == "start" and scale != "1" for kind, scale in clips) >= 2
    assert not (tmp_path / f"step_{machine}_full.causal.ll").exists()
    source = (tmp_path / f"step_{machine}_clipped.c").read_text()
    assert re.search(r"for \(int \w+ = 0; \w+ < \(6\*ib\d+ \+ 6\); ", source) or machine != "avx2"


ZERO_FILL = re.compile(r"^zero_out\((\w+)\);", re.MULTILINE)


TRIMMED = re.compile(r"for c\d+ = 0 to \d+ \(stop 8\*c\d+ < i\d+\+1\) \{\n"
                     r"\s*for l\d+ = 0 to 7 \{\n\s*attention_weights\[")


@pytest.mark.parametrize("machine,threads,seq", [("avx2", 1, T), ("avx512", 2, T), ("avx512", 1, 40)])
def test_contractions_of_the_clipped_step_need_no_zero_fill(machine, threads, seq, tmp_path, monkeypatch):
    """The clipped step fills no node the full loops do not: the scores `q kᵀ` (read only
    under the mask, their skipped blocks never used), the outputs of `P v`, `Pᵀ dY`, `dS k`,
    `dSᵀ q` (every cell stored, from register blocks summing fewer terms), and `dY vᵀ` and the
    softmax's backward `dS`, whose clipped readers (`dP * P`, `dS k`) never reach the cells
    their clipped writers skip (`covered_fills`). With whole vectors of keys (T = 40), the
    weights are divided only in the chunks their readers reach (`trimmed_writes`). Run on a
    scratch arena of NaNs, the step's loss and gradients are still the full loops' bits."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    layer, loss = _layer_and_loss(causal=True, seed=3, shape=(B, seq, D))
    code = train.grad_update(loss)
    clipped = _run(loss, layer, f"fills_{machine}", VirtualizeSettings(), code, threads, poisoned=True)
    full = _run(loss, layer, f"fills_{machine}_full", VirtualizeSettings(causal=False), code, threads)
    for label, want in full.items():
        assert np.all(np.isfinite(want)), label
        np.testing.assert_array_equal(clipped[label], want, err_msg=label)
    fills, full_fills = (set(ZERO_FILL.findall((tmp_path / f"{name}.optimized.ll").read_text()))
                         for name in (f"fills_{machine}", f"fills_{machine}_full"))
    assert not fills - full_fills
    assert not {"attention_weights_grad", "mha_heads_scores_grad"} & fills
    trimmed = TRIMMED.search((tmp_path / f"fills_{machine}.optimized.ll").read_text())
    assert bool(trimmed) == (seq % 8 == 0)


def test_non_causal_attention_is_not_clipped(tmp_path, monkeypatch):
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    layer, loss = _layer_and_loss(causal=False)
    _run(loss, layer, "unmasked", VirtualizeSettings())
    assert not CLIPPED.search((tmp_path / "unmasked.causal.ll").read_text())


def _without_clips(stmt: ll.LLStmt) -> ll.LLStmt:
    match stmt:
        case ll.Seq(a, b):
            return ll.Seq(_without_clips(a), _without_clips(b))
        case ll.ForLoop(body=body):
            return ll.ForLoop(stmt.index, stmt.from_, stmt.to_, _without_clips(body), stmt.trace_it, stmt.unroll,
                              stmt.parallel, stmt.keep_order)
    return stmt


def _interpreted(seed: int, shape: tuple[int, int, int]):
    """A causal layer's unoptimized training code, and a function giving the parameters'
    gradients a program computes from it under the interpreter."""
    layer, loss = _layer_and_loss(causal=True, seed=seed, shape=shape)
    code = train.grad_update(loss)
    finish_inference()
    llc = asg.to_low_level(code)
    params = {p.value_tn: p.value.numpy().astype(np.float32) for p in layer.params()}

    def grads(program):
        arrays = interpret.run(program, {tn: v.copy() for tn, v in params.items()})
        return {p.label_str: arrays[p.grad_tn] for p in layer.params()}

    return llc, grads


def test_interpreter_runs_the_clipped_loops_as_the_full_ones():
    """The optimized code with and without its clips, and the unoptimized code, under the
    interpreter: the clipped program skips exactly the terms that are zero (a size the
    interpreter runs quickly: the loops are clipped unblocked)."""
    llc, grads = _interpreted(seed=3, shape=(1, 9, 8))
    plain = grads(llc)
    opt = optimize_proc(llc, name="interpreted")
    assert any(isinstance(s, ll.ForLoop) and (s.start or s.stop) for s in ll.iter_stmts(opt.llc))
    clipped, full = grads(opt.llc), grads(_without_clips(opt.llc))
    for label, want in full.items():
        np.testing.assert_array_equal(clipped[label], want, err_msg=label)
    for label, want in plain.items():
        np.testing.assert_allclose(clipped[label], want, rtol=2e-4, atol=1e-5 * np.abs(want).max(), err_msg=label)


@pytest.mark.parametrize("seq", [T, 40])
def test_clipped_causal_attention_matches_torch(seq):
    """An odd sequence (tail blocks, loops clipped by iterations) and one of whole vectors
    (the softmax's loops clipped by chunks of 8)."""
    torch = pytest.importorskip("torch")
    layer, loss = _layer_and_loss(causal=True, seed=5, shape=(B, seq, D))
    got = _run(loss, layer, f"vs_torch_{seq}", VirtualizeSettings())
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((B, seq, D)).astype(np.float32)
    r = rng.standard_normal((B, seq, D))
    p = {name: (w.value.numpy().astype(np.float64), b.value.numpy().astype(np.float64))
         for name, (w, b) in layer.proj.items()}
    ref = torch_mha(torch, p, D, H)
    xt = torch.tensor(xv.astype(np.float64))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(seq, dtype=torch.float64)
    y, _ = ref(xt, xt, xt, attn_mask=mask, is_causal=True, need_weights=False)
    total = (y * torch.tensor(r)).sum()
    total.backward()
    np.testing.assert_allclose(float(got["loss"].ravel()[0]), total.item(), rtol=1e-5)
    grad_w = ref.in_proj_weight.grad.numpy()
    for k, n in enumerate("qkv"):
        want = grad_w[k * D:(k + 1) * D].reshape(H, D // H, D)
        np.testing.assert_allclose(got[f"mha.{n}.w"], want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=n)
    want = ref.out_proj.weight.grad.numpy().reshape(D, H, D // H)
    np.testing.assert_allclose(got["mha.out.w"], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("scale", [1, 3, 6])
def test_clipped_loop_bounds_in_c_and_the_interpreter(scale):
    """`start: scale*i >= 5*j - 7` and `stop: scale*i < 4*j + 2 - scale` over `i in 0..9`,
    bounds negative, inside and past the range: gcc renders the rounded-up bounds as the
    interpreter runs them, cell by cell as NumPy counts them."""
    out = Tnode("out", (6, 10))
    i, j = get_symbol("i"), get_symbol("j")
    one = ll.Set(out, (Iterator(j), Iterator(i)), ll.Constant(1.0))
    inner = ll.ForLoop(i, 0, 9, one, start=ll.LoopClip(make_affine([(5, j)], -7), scale),
                       stop=ll.LoopClip(make_affine([(4, j)], 2 - scale), scale))
    code = ll.seq(ll.ZeroOut(out), ll.ForLoop(j, 0, 5, inner))
    jj, ii = np.meshgrid(np.arange(6), np.arange(10), indexing="ij")
    want = ((scale * ii >= 5 * jj - 7) & (scale * ii < 4 * jj + 2 - scale)).astype(np.float32)
    np.testing.assert_array_equal(interpret.run(code)[out], want)
    np.testing.assert_array_equal(run_in_c(code, {}, name=f"clipped{scale}").array(out), want)


CHUNKED = re.compile(r"for \(int c\d+ = 0; c\d+ < \(i\d+ \+ 8\) / 8; \+\+c\d+\) \{\n\s*for \(int l\d+ = 0; l\d+ < 8; ")


@pytest.mark.parametrize("machine,threads", [("avx2", 1), ("avx512", 2)])
def test_softmax_loops_are_clipped_by_whole_vectors(machine, threads, tmp_path, monkeypatch):
    """A sequence of whole vectors (T = 40): the softmax's `exp` (whose cells above the diagonal
    only masks read), its backward's row sum of `dP * P` (a local scope's serial sum) and the
    scores' gradient (`where(mask, ..., 0)` accumulated) run over the chunks of 8 keys that
    reach the diagonal, each chunk a whole loop gcc vectorizes, and the step stays bit for bit
    that of the full loops."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    _clipped_as_full(f"chunked_{machine}", threads, seed=7, shape=(B, 40, D))
    source = (tmp_path / f"chunked_{machine}_clipped.c").read_text()
    chunked = [source[m.end():].split(";", 1)[0] for m in CHUNKED.finditer(source)]
    assert len(chunked) >= 3, chunked
    at = source.index("] = einjit_expf(")
    assert CHUNKED.search(source[at - 600:at]), "the exp loop is not clipped"


def test_one_and_two_threads_give_the_same_bits(monkeypatch):
    """The clipped step of T = 40 at 1 and at 2 threads: the same loss and gradients. With
    glibc's libmvec the threaded softmax nest's `exp` was its vector `expf` and the serial one
    partly the scalar `expf`, and the loss differed by 1.2e-6; einjit's own `exp` is one
    function either way."""
    monkeypatch.setenv("EINJIT_MACHINE", "avx512")
    layer, loss = _layer_and_loss(causal=True, seed=7, shape=(B, 40, D))
    code = train.grad_update(loss)
    one = _run(loss, layer, "threads_1", VirtualizeSettings(), code, 1)
    two = _run(loss, layer, "threads_2", VirtualizeSettings(), code, 2)
    for label, want in one.items():
        assert np.all(np.isfinite(want)), label
        np.testing.assert_array_equal(two[label], want, err_msg=label)


@pytest.mark.parametrize("poison", [np.inf, np.nan])
def test_clipped_softmax_keeps_infinities_and_nans(poison):
    """An input row with an infinity or a NaN: scores of `±inf` and NaN reach the masked
    softmax, and the clipped step's loss and gradients have the NaNs and infinities of the
    full loops', the other values bit for bit."""
    full = _clipped_as_full("poisoned", seed=11, shape=(1, 16, D), poison=poison)
    assert not np.isfinite(full["mha.q.w"]).all()


def test_interpreter_runs_the_chunked_loops_as_the_full_ones():
    """The clipped chunk loops (T = 16: two chunks of 8) under the interpreter give the
    values of the unclipped optimized code."""
    llc, grads = _interpreted(seed=4, shape=(1, 16, 8))
    opt = optimize_proc(llc, name="interpreted_chunks")
    chunks = [s for s in ll.iter_stmts(opt.llc) if isinstance(s, ll.ForLoop) and s.stop and s.stop.scale == 8]
    assert len(chunks) >= 3
    clipped, full = grads(opt.llc), grads(_without_clips(opt.llc))
    for label, want in full.items():
        np.testing.assert_array_equal(clipped[label], want, err_msg=label)


def test_fusion_renames_the_bounds_of_clipped_loops():
    """Two row nests, the second's inner loop clipped to the chunks of 8 with `8 c < j + 1` (as
    the causal stage leaves it): fused, the clip names the fused row loop, and the interpreter
    and gcc write the chunks the unfused code does."""
    a, out = Tnode("a", (12, 16)), Tnode("out", (12, 16))
    j1, k1, j2, c, lane = (get_symbol(n) for n in ("j", "k", "j", "c", "l"))
    first = ll.ForLoop(j1, 0, 11, ll.ForLoop(k1, 0, 15, ll.Set(a, (Iterator(j1), Iterator(k1)), ll.Constant(2.0))))
    cell = make_affine([(8, c), (1, lane)])
    tripled = ll.Binop(ops.Binop.MUL, ll.Get(a, (Iterator(j2), cell)), ll.Constant(3.0))
    chunks = ll.ForLoop(c, 0, 1, ll.ForLoop(lane, 0, 7, ll.Set(out, (Iterator(j2), cell), tripled)),
                        stop=ll.LoopClip(make_affine([(1, j2)], 1), 8))
    code = ll.seq(ll.ZeroOut(out), first, ll.ForLoop(j2, 0, 11, chunks))
    fused = fuse_loops(code)
    loops = [s for s in ll.flatten(fused) if isinstance(s, ll.ForLoop)]
    assert len(loops) == 1
    (clipped,) = (s for s in ll.iter_stmts(fused) if isinstance(s, ll.ForLoop) and s.stop is not None)
    assert clipped.stop.bound == make_affine([(1, loops[0].index)], 1)
    want = np.full((12, 16), 6.0, np.float32)
    want[:8, 8:] = 0.0  # the second chunk from row 8 on
    np.testing.assert_array_equal(interpret.run(code)[out], want)
    np.testing.assert_array_equal(interpret.run(fused)[out], want)
    np.testing.assert_array_equal(run_in_c(fused, {}, name="fused_clips").array(out), want)


def _row_maximum(lanes: int, rows: int, keys: int):
    """`m[q] = max_k where(k < q + 1, s[q, k], -1e30)`: one loop over the keys (`lanes` 1), or
    `lanes` partial maxima over chunks of keys folded into `m` (the extrema stage's form)."""
    s, masked, m = Tnode("s", (rows, keys)), Tnode("masked", (rows, keys)), Tnode("m", (rows,))
    q, k, k0, lane = get_symbol("q"), get_symbol("k"), get_symbol("k"), get_symbol("l")
    causal = ll.Binop(ops.Binop.CMPLT, ll.EmbedIndex(Iterator(k)), ll.EmbedIndex(make_affine([(1, q)], 1)))
    at = (Iterator(q), Iterator(k))
    write = ll.Set(masked, at, ll.Ternop(ops.Ternop.WHERE, causal, ll.Get(s, at), ll.Constant(-1e30)))
    code = [ll.ForLoop(q, 0, rows - 1, ll.ForLoop(k, 0, keys - 1, write)),
            ll.ForLoop(q, 0, rows - 1, ll.Set(m, (Iterator(q),), ll.Constant(-np.inf)))]
    mine = ll.Get(m, (Iterator(q),))
    if lanes == 1:
        code.append(ll.ForLoop(q, 0, rows - 1, ll.ForLoop(k, 0, keys - 1, ll.Set(
            m, (Iterator(q),), ll.Binop(ops.Binop.MAX, mine, ll.Get(masked, at))))))
    else:
        part = Tnode("part", (lanes,))
        cell = ll.Get(part, (Iterator(lane),))
        chunk = ll.Get(masked, (Iterator(q), make_affine([(lanes, k0), (1, lane)])))
        code.append(ll.ForLoop(q, 0, rows - 1, ll.seq(
            ll.ForLoop(lane, 0, lanes - 1, ll.Set(part, (Iterator(lane),), ll.Constant(-np.inf))),
            ll.ForLoop(k0, 0, keys // lanes - 1, ll.ForLoop(lane, 0, lanes - 1, ll.Set(
                part, (Iterator(lane),), ll.Binop(ops.Binop.MAX, cell, chunk)))),
            ll.ForLoop(lane, 0, lanes - 1, ll.Set(m, (Iterator(q),), ll.Binop(ops.Binop.MAX, mine, cell))))))
    return ll.seq(*code), s, m


@pytest.mark.parametrize("lanes", [1, 8])
def test_row_maximum_is_clipped_and_keeps_the_mask_constant(lanes):
    """The row maximum over 24 keys reads the causal prefix and a chunk of masked cells (one
    masked cell in each partial maximum), not the rest: a row whose visible scores are all
    below -1e30 (-inf, -3e38) still gets -1e30, a NaN stays a NaN, the others their maximum;
    the interpreter and gcc give the full loops' values, which NumPy computes."""
    rows, keys = 8, 24
    code, s, m = _row_maximum(lanes, rows, keys)
    clipped = clip_causal_loops(code)
    stops = [x for x in ll.iter_stmts(clipped) if isinstance(x, ll.ForLoop) and x.stop is not None]
    assert len(stops) == 1
    assert any(isinstance(y, ll.Set) and isinstance(y.llsc, ll.Binop) and y.llsc.op is ops.Binop.MAX
               for y in ll.iter_stmts(stops[0].body))
    x = np.random.default_rng(4).standard_normal((rows, keys)).astype(np.float32)
    # row 7 sees 8 keys, a whole chunk: the clip must still read a masked one
    x[0, 0], x[1, :2], x[2, 1], x[7, :8] = -np.inf, -3e38, np.nan, -np.inf
    qq, kk = np.meshgrid(np.arange(rows), np.arange(keys), indexing="ij")
    want = np.where(kk < qq + 1, x, np.float32(-1e30)).max(axis=1)
    assert want[0] == want[1] == want[7] == np.float32(-1e30) and np.isnan(want[2])
    np.testing.assert_array_equal(interpret.run(code, {s: x.copy()})[m], want)
    np.testing.assert_array_equal(interpret.run(clipped, {s: x.copy()})[m], want)
    np.testing.assert_array_equal(run_in_c(clipped, {s: x}, name=f"row_max{lanes}").array(m), want)
