"""bf16 storage (`ir/bf16.py`, precision `ops.bf16`): cells hold the upper half of a float32,
loads widen exactly, stores round to nearest even; expressions compute in float32 and
contractions accumulate in float32. The NumPy reference is checked against hand-computed
patterns (and PyTorch's rounding where installed), the C backend against the interpreter bit
for bit, and results against NumPy on bf16-rounded inputs.

Tolerances: a float32 accumulation of `m` products of bf16 numbers (exact in float32) differs
from the float64 sum by at most `m * 2**-24` of the sum of magnitudes; a result stored as bf16
adds one rounding, half a bf16 ulp: at most `2**-8` relative.

This machine may lack AVX512_BF16: the `vdpbf16ps` path is checked by compiling the generated
C for Sapphire Rapids to assembly, the fallback that the same source compiles to elsewhere by
running it. Where gcc targets AVX512_BF16 the C runs `vdpbf16ps`, which sums each pair in its own
order and rounding (`backends/bf16_dot.py`): its results are then held to the float32
accumulation bound against float64, not compared bit for bit with the interpreter."""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
import subprocess

import numpy as np
import pytest

from einjit.backends import bf16_dot, c_syntax, c_vectors
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.backends.cc.toolchain import CcOptions
from einjit.ir import bf16, interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator, get_symbol
from einjit.ir.optimize import VirtualizeSettings
from einjit.ir.sched import nests
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking, schedule_llc
from einjit.ir.tnode import Tnode, hosted

RNG = np.random.default_rng(21)
ON = VirtualizeSettings()


def it(*syms):
    return tuple(Iterator(s) for s in syms)


@functools.cache
def c_runs_vdpbf16ps() -> bool:
    """Whether the C backend's code takes the `vdpbf16ps` branch of bf16-pair kernels here: its
    `-march` flag (`native`) makes gcc target AVX512_BF16, as on a CPU that has it."""
    cc = CcOptions()
    march = [f for f in cc.flags if f.startswith("-march")]
    done = subprocess.run([cc.compiler, *march, "-dM", "-E", "-"], input="", capture_output=True, text=True,
                          check=True)
    return "__AVX512BF16__" in done.stdout


def test_rounding_to_nearest_even_by_hand():
    one_ulp = 2.0**-7  # bf16 keeps 7 mantissa bits
    values = np.array([1.0 + one_ulp / 2, 1.0 + 3 * one_ulp / 2, 1.0 + one_ulp / 2 + 2.0**-20, -2.5, 0.0, -0.0,
                       np.inf, -np.inf, 3.4e38, 1e-40], np.float32)
    want = np.array([1.0, 1.0 + 2 * one_ulp, 1.0 + one_ulp, -2.5, 0.0, -0.0, np.inf, -np.inf, np.inf],
                    np.float32)
    got = bf16.round_to_bf16(values)
    np.testing.assert_array_equal(got[:-1], want)
    assert np.signbit(got[5]) and bf16.to_bits(values[-1]) == 0x0001  # 1e-40: a subnormal, not flushed
    assert bf16.to_bits(np.float32(1.0)) == 0x3F80
    for v, bits in zip(values, bf16.to_bits(values), strict=True):
        assert bf16.cell_to_bits(v) == bits and bf16.cell_from_bits(bits) == bf16.from_bits(bits)
    nan = bf16.to_bits(np.array([0x7FC00000, 0xFFC00000, 0x7F800001], np.uint32).view(np.float32))
    assert np.isnan(bf16.from_bits(nan)).all()


def test_rounding_matches_pytorch():
    torch = pytest.importorskip("torch")
    x = np.concatenate([RNG.standard_normal(50_000).astype(np.float32) * np.float32(100),
                        np.frombuffer(RNG.integers(0, 2**32, 50_000, dtype=np.uint32).tobytes(), np.float32)])
    x = x[~np.isnan(x)]
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16.to_bits(x), want)


def _stored(values: np.ndarray) -> np.ndarray:
    return bf16.to_bits(values)


def _pointwise():
    """`y[i] = exp(x[i]) * 0.5 + x[i]`, bf16 in and out, and `z = y * x` in single."""
    x, y, z = Tnode("x", (300,), ops.bf16), Tnode("y", (300,), ops.bf16), Tnode("z", (300,), ops.single)
    i = get_symbol("i")
    expr = ll.Binop(ops.Binop.ADD, ll.Binop(ops.Binop.MUL, ll.Unop(ops.Unop.EXP, ll.Get(x, it(i))), ll.Constant(0.5)),
                    ll.Get(x, it(i)))
    prod = ll.Binop(ops.Binop.MUL, ll.Get(y, it(i)), ll.Get(x, it(i)))
    code = ll.seq(ll.ForLoop(i, 0, 299, ll.Set(y, it(i), expr)), ll.ForLoop(i, 0, 299, ll.Set(z, it(i), prod)))
    return code, x, y, z


def test_pointwise_c_matches_interpreter_and_numpy():
    code, x, y, z = _pointwise()
    xv = RNG.standard_normal(300).astype(np.float32) * 3
    ins = {x: _stored(xv)}
    ran = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})
    ctx = run_once(code, ins, name="bf16_pointwise", context=CcBackend().init("bf16_pointwise"))
    assert ran[y].dtype == np.uint16
    np.testing.assert_array_equal(ctx.array(y), ran[y])
    np.testing.assert_array_equal(ctx.array(z), ran[z])
    xr = bf16.round_to_bf16(xv)
    want_y = bf16.round_to_bf16(np.exp(xr) * np.float32(0.5) + xr)
    np.testing.assert_allclose(bf16.from_bits(ran[y]), want_y, rtol=2.0**-8)
    np.testing.assert_array_equal(ran[z], bf16.from_bits(ran[y]) * xr)


def matmul(n, m, p, transposed, out_prec):
    """`c = a @ b` (`a @ b.T` when `transposed`) with bf16 operands, as the simplifier leaves it."""
    a, c = Tnode("a", (n, m), ops.bf16), Tnode("c", (n, p), out_prec)
    b = Tnode("b", (p, m) if transposed else (m, p), ops.bf16)
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, it(i, k)), ll.Get(b, it(j, k) if transposed else it(k, j)),
                    ll.Get(c, it(i, j)))
    loops = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, p - 1, ll.ForLoop(k, 0, m - 1, ll.Set(c, it(i, j), fma))))
    return ll.seq(ll.ZeroOut(c), loops), a, b, c


def _operands(a, b):
    return {a: _stored(RNG.standard_normal(a.dims).astype(np.float32)),
            b: _stored(RNG.standard_normal(b.dims).astype(np.float32))}


def _reference(ins, a, b, transposed):
    av, bv = (bf16.from_bits(ins[t]).astype(np.float64) for t in (a, b))
    return av @ (bv.T if transposed else bv), np.abs(av) @ np.abs(bv.T if transposed else bv)


def _local_precs(code):
    return {tn.label[0]: tn.prec for tn in ll.nodes_of(code) if tn.is_local()}


@pytest.mark.parametrize("machine", ["avx2", "avx512", "avx512_bf16"])
@pytest.mark.parametrize("transposed", [False, True], ids=["a@b", "a@b.T"])
@pytest.mark.parametrize("n,m,p", [(16, 8, 32), (12, 6, 40), (7, 9, 20)])
def test_float_result_of_bf16_operands(machine, n, m, p, transposed):
    """Accumulated in float32, in the original order of `k`: the blocked nest, with float
    accumulators and a float panel or (AVX512_BF16, even `k`) a pair panel, is bit-identical
    to the plain nest, in the interpreter and in C (the fallback of the pair kernel where gcc
    does not target AVX512_BF16); `vdpbf16ps` is within the same bound of the exact sum."""
    code, a, b, c = matmul(n, m, p, transposed, ops.single)
    sched = schedule_llc(code, ON, Blocking(machine=MACHINES[machine], min_work=1, min_unroll_work=1))
    pairs = machine == "avx512_bf16" and m % 2 == 0
    precs = _local_precs(sched)
    assert precs.pop("pack") is (ops.bf16 if pairs else ops.single)
    # the block, and with vector blocks a padded tail panel's `edge`
    assert "acc" in precs and set(precs.values()) == {ops.single}
    ins = _operands(a, b)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[c]
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[c], want)
    ref, magnitude = _reference(ins, a, b, transposed)
    assert np.all(np.abs(want - ref) <= m * 2.0**-24 * magnitude)
    got = run_once(sched, ins, name="bf16_mm", context=CcBackend().init("bf16_mm")).array(c)
    if pairs and c_runs_vdpbf16ps():
        assert np.all(np.abs(got - ref) <= m * 2.0**-24 * magnitude)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("machine", ["avx2", "avx512_bf16"])
def test_bf16_result_accumulates_in_float_and_rounds_once(machine):
    """A bf16 result of a blocked contraction is summed in float32 accumulators and rounded
    once per cell: within half a bf16 ulp of the exact sum (`2**-8` relative at most), where
    rounding at every step (the plain nest) drifts by several ulps over 256 terms."""
    n, m, p = 4, 256, 16
    code, a, b, c = matmul(n, m, p, False, ops.bf16)
    sched = schedule_llc(code, ON, Blocking(machine=MACHINES[machine], min_work=1))
    assert _local_precs(sched)["acc"] is ops.single
    ins = _operands(a, b)
    got = interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[c]
    in_c = run_once(sched, ins, name="bf16_out", context=CcBackend().init("bf16_out")).array(c)
    ref, magnitude = _reference(ins, a, b, False)
    err = np.abs(bf16.from_bits(got) - ref)
    assert np.all(err <= 2.0**-8 * np.abs(ref) + m * 2.0**-24 * magnitude)
    if machine == "avx512_bf16" and c_runs_vdpbf16ps():
        assert np.all(np.abs(bf16.from_bits(in_c) - ref) <= 2.0**-8 * np.abs(ref) + m * 2.0**-24 * magnitude)
    else:
        np.testing.assert_array_equal(in_c, got)
    stepwise = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[c]
    assert np.abs(bf16.from_bits(stepwise) - ref).mean() > 4 * err.mean()


def _scheduled_source(n, m, p, transposed):
    code, a, b, c = matmul(n, m, p, transposed, ops.single)
    sched = schedule_llc(code, ON, Blocking(machine=MACHINES["avx512_bf16"], min_work=1, min_unroll_work=1))
    return c_syntax.render_program([("bf16_mm", sched)]).source


def _assembly(tmp_path, source, march):
    src = tmp_path / "k.c"
    src.write_text(source)
    out = tmp_path / f"k_{march}.s"
    done = subprocess.run(["gcc", "-O2", f"-march={march}", "-S", "-o", str(out), str(src)], capture_output=True,
                          text=True)
    if done.returncode and "bad value" in done.stderr:
        pytest.skip(f"gcc does not know -march={march}")
    assert done.returncode == 0, done.stderr
    return out.read_text()


def _inner_loop(assembly: str) -> list[str]:
    """The instructions of the loop holding the first `vdpbf16ps`: from the label before it to
    the branch back to that label."""
    lines = [ln.strip() for ln in assembly.splitlines()]
    first = next(k for k, ln in enumerate(lines) if ln.startswith("vdpbf16ps"))
    start = max(k for k in range(first) if re.fullmatch(r"\.L\d+:", lines[k]))
    label = lines[start][:-1]
    end = next(k for k in range(first, len(lines)) if re.match(rf"j\w+\s+{re.escape(label)}$", lines[k]))
    return [ln for ln in lines[start + 1:end + 1] if ln and not ln.startswith(".")]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("transposed", [False, True], ids=["a@b", "a@b.T"])
def test_avx512_bf16_kernel_compiles_to_vdpbf16ps(tmp_path, transposed):
    """The pair kernel is `_mm512_dpbf16_ps` where the compiler targets AVX512_BF16, and none,
    the scalar fallback, where it does not. Its inner loop (Sapphire Rapids) is what the
    throughput estimate in the report assumes: per pair of `k`, 16 `vdpbf16ps` (8 rows × 2
    vectors of an 8×32 block) on zmm accumulators that stay in registers (nothing read from or
    written to the stack), the panel's 2 vector loads and one `vpbroadcastd` load per row (the
    row operand's pair, adjacent in memory), and the loop's own few instructions: 30 in all,
    which two `vdpbf16ps` a cycle issue in 8 cycles. The block is the fp32 kind: an array of
    vectors loaded from and stored to the result whole."""
    source = _scheduled_source(16, 64, 64, transposed)
    assert "_mm512_dpbf16_ps" in source and "#if defined(__AVX512BF16__)" in source
    assert "einjit_f32x16 acc[16]" in source and "einjit_bf16_pair_at(&a[" in source
    spr = _assembly(tmp_path, source, "sapphirerapids")
    loop = _inner_loop(spr)
    ops_in = [ln.split()[0] for ln in loop]
    assert ops_in.count("vdpbf16ps") == 16 and ops_in.count("vpbroadcastd") == 8
    assert all(re.search(r"%zmm\d+, %zmm\d+, %zmm\d+$", ln) for ln in loop if ln.startswith("vdpbf16ps"))
    assert not any("%rsp" in ln or "%rbp" in ln for ln in loop), loop
    assert len(loop) <= 32, loop
    assert "vdpbf16ps" not in _assembly(tmp_path, source, "skylake-avx512")
    assert "vdpbf16ps" not in _assembly(tmp_path, source, "x86-64-v3")


def test_panels_narrower_than_a_bf16_dot_vector_keep_the_float_panel():
    """`vdpbf16ps` fills 16 float lanes: a contraction whose register block is narrower (the 10
    logits of a classifier take 8-lane blocks) keeps the float panel and kernel, where a pair
    panel had only the scalar fallback nest; the result is the plain nest's, bit for bit."""
    code, a, b, c = matmul(64, 32, 10, False, ops.single)
    sched = schedule_llc(code, ON, Blocking(machine=MACHINES["avx512_bf16"], min_work=1, min_unroll_work=1))
    assert _local_precs(sched)["pack"] is ops.single
    assert "_mm512_dpbf16_ps" not in c_syntax.render_program([("narrow", sched)]).source
    ins = _operands(a, b)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[c]
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[c], want)
    got = run_once(sched, ins, name="bf16_narrow", context=CcBackend().init("bf16_narrow")).array(c)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n,steps", [(6, 8), (13, 4), (6, 5)])
def test_pairs_run_along_the_innermost_of_two_summed_loops(n, steps):
    """A weight gradient summed over batch and time (`c[i, j] += x[n, t, i] * g[n, t, j]`)
    pairs two steps of time (an even count) and chunks the batch as in float: the pair kernel
    runs inside the batch loop, and its panel holds `pack[n.., tp, j, kl]`. The interpreter
    gives the plain nest's bits; `vdpbf16ps` stays within the float32 accumulation bound. An odd
    count keeps the float panel, bit for bit in C too."""
    i_n, j_n = 24, 48
    x, g = Tnode("x", (n, steps, i_n), ops.bf16), Tnode("g", (n, steps, j_n), ops.bf16)
    c = Tnode("c", (i_n, j_n), ops.single)
    i, j, b, t = get_symbol("i"), get_symbol("j"), get_symbol("n"), get_symbol("t")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(x, it(b, t, i)), ll.Get(g, it(b, t, j)), ll.Get(c, it(i, j)))
    nest = ll.Set(c, it(i, j), fma)
    for sym, extent in ((t, steps), (b, n), (j, j_n), (i, i_n)):
        nest = ll.ForLoop(sym, 0, extent - 1, nest)
    code = ll.seq(ll.ZeroOut(c), nest)
    sched = schedule_llc(code, ON, Blocking(machine=MACHINES["avx512_bf16"], min_work=1, min_unroll_work=1))
    pairs = steps % 2 == 0
    pack = next(tn for tn in ll.nodes_of(sched) if tn.is_local() and tn.label[0] == "pack")
    assert pack.prec is (ops.bf16 if pairs else ops.single)
    if pairs:
        assert pack.dims[-3:] == (steps // 2, 16 * (pack.dims[-2] // 16), 2) and len(pack.dims) == 4
    source = c_syntax.render_program([("bf16_two_sums", sched)]).source
    assert ("_mm512_dpbf16_ps" in source) == pairs
    ins = {x: _stored(RNG.standard_normal(x.dims).astype(np.float32)),
           g: _stored(RNG.standard_normal(g.dims).astype(np.float32))}
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[c]
    np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[c], want)
    xv, gv = (bf16.from_bits(ins[tn]).astype(np.float64).reshape(n * steps, -1) for tn in (x, g))
    ref, magnitude = xv.T @ gv, np.abs(xv.T) @ np.abs(gv)
    got = run_once(sched, ins, name="bf16_two_sums", context=CcBackend().init("bf16_two_sums")).array(c)
    if pairs and c_runs_vdpbf16ps():
        assert np.all(np.abs(got - ref) <= n * steps * 2.0**-24 * magnitude)
    else:
        np.testing.assert_array_equal(got, want)


def test_odd_depth_keeps_the_float_panel():
    source = _scheduled_source(16, 63, 64, False)
    assert "_mm512_dpbf16_ps" not in source


def test_vector_blocks_widen_bf16_reads_and_never_load_them_as_floats():
    """A float register block's lane loop broadcasts a bf16 read that does not depend on the
    lane, widened first (`einjit_bf16_load`); one that runs along the lane stays on the scalar
    lane path, since a vector load would take two bf16 cells for one float. A bf16 matmul's
    kernel broadcasts from the float copy of its row operand (`bf16_widen`), widened once
    before the nest: the only widening read of `a` is the copy's."""
    rb = nests.register_block(1, 16, ops.single, 64, get_symbol("j"))
    own = ll.Get(rb.node, rb.at(FixedIdx(0)))
    for prec in (ops.single, ops.bf16):
        x = Tnode("x", (16,), prec)
        along = ll.Set(rb.node, own.idcs, ll.Binop(ops.Binop.ADD, own, ll.Get(x, (Iterator(rb.lane),))))
        fixed = ll.Set(rb.node, own.idcs, ll.Binop(ops.Binop.ADD, own, ll.Get(x, (FixedIdx(3),))))
        assert c_vectors.lane_statement(ll.ForLoop(rb.lane, 0, 15, fixed)) is fixed
        assert (c_vectors.lane_statement(ll.ForLoop(rb.lane, 0, 15, along)) is along) == (prec is ops.single)
    for machine in ("avx2", "avx512"):
        code = matmul(16, 64, 64, False, ops.bf16)[0]
        sched = schedule_llc(code, ON, Blocking(machine=MACHINES[machine], min_work=1, min_unroll_work=1))
        source = c_syntax.render_program([("bf16_mm", sched)]).source
        lanes = 16 if machine == "avx512" else 8
        assert f"_splat_f32x{lanes}(wide[" in source and f"_splat_f32x{lanes}(einjit_bf16_load" not in source
        assert source.count("einjit_bf16_load(a[") == 1
        assert re.search(r"wide\[[^]]*\] = einjit_bf16_load\(a\[", source)
        assert not re.search(r"einjit_(load|store)_f32x\d+\(&[abc]\[", source)


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
def test_row_operand_widened_once_unless_little_of_it_is_read(machine):
    """`bf16_widen`: the bf16 row operand is copied to float once, before the nest, and the
    kernel reads the copy; a contraction reading only a slice of a larger bf16 node (fewer
    than `MIN_REUSE` multiply-adds per element of it) keeps widening its reads in place. Both
    are bit-identical to the plain nest, in the interpreter and in C."""
    for rows, width, copied in ((16, 64, True), (64, 4, False)):
        big = Tnode("a", (rows, 8), ops.bf16)
        b, c = Tnode("b", (8, width), ops.bf16), Tnode("c", (4, width), ops.single)
        i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
        fma = ll.Ternop(ops.Ternop.FMA, ll.Get(big, it(i, k)), ll.Get(b, it(k, j)), ll.Get(c, it(i, j)))
        code = ll.seq(ll.ZeroOut(c), ll.ForLoop(i, 0, 3, ll.ForLoop(j, 0, width - 1, ll.ForLoop(
            k, 0, 7, ll.Set(c, it(i, j), fma)))))
        sched = schedule_llc(code, ON, Blocking(machine=MACHINES[machine], min_work=1, min_unroll_work=1, min_nb=4))
        wide = [tn for tn in ll.nodes_of(sched) if tn.label == ["wide"]]
        assert "pack" in _local_precs(sched)  # blocked either way
        assert (len(wide) == 1 and wide[0].dims == big.dims and wide[0].prec is ops.single) == copied
        assert bool(wide) == copied
        ins = _operands(big, b)
        want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[c]
        np.testing.assert_array_equal(interpret.run(sched, {tn: v.copy() for tn, v in ins.items()})[c], want)
        ctx = run_once(sched, ins, name="bf16_wide", context=CcBackend().init("bf16_wide"))
        np.testing.assert_array_equal(ctx.array(c), want)


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
def test_convolution_widens_its_bf16_weights_once(machine):
    """A channel-blocked convolution (`schedule_conv`) of float32 images with bf16 weights (a
    mixed-precision step's weight copies) broadcasts the weights from a float copy made once
    before the nest, not through a widening read in the kernel; bit-identical to the plain
    nest in the interpreter and in C."""
    bsz, ci, co, h, kk = 16, 2, 4, 6, 3  # blocked along the batch: the weights are the row operand
    oh = h - kk + 1
    img, w = Tnode("img", (bsz, ci, h, h), ops.single), Tnode("w", (co, ci, kk, kk), ops.bf16)
    out = Tnode("out", (bsz, co, oh, oh), ops.single)
    n, o, c, y, x, u, v = (get_symbol(s) for s in ("n", "o", "c", "y", "x", "u", "v"))
    window = (Iterator(n), Iterator(c), Affine(((1, y), (1, u))), Affine(((1, x), (1, v))))
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(img, window), ll.Get(w, it(o, c, u, v)), ll.Get(out, it(n, o, y, x)))
    body: ll.LLStmt = ll.Set(out, it(n, o, y, x), fma)
    for s, extent in reversed([(n, bsz), (o, co), (y, oh), (x, oh), (c, ci), (u, kk), (v, kk)]):
        body = ll.ForLoop(s, 0, extent - 1, body)
    code = ll.seq(ll.ZeroOut(out), body)
    sched = schedule_llc(code, ON, Blocking(machine=MACHINES[machine], min_work=1, min_unroll_work=1))
    wide = [tn for tn in ll.nodes_of(sched) if tn.label == ["wide"]]
    assert len(wide) == 1 and wide[0].dims == w.dims and wide[0].prec is ops.single
    source = c_syntax.render_program([("bf16_conv", sched)]).source
    assert source.count("einjit_bf16_load(w[") == 1 and "acc[" in source
    ins = {img: RNG.standard_normal(img.dims).astype(np.float32), w: _stored(RNG.standard_normal(w.dims))}
    want = interpret.run(code, {tn: a.copy() for tn, a in ins.items()})[out]
    np.testing.assert_array_equal(interpret.run(sched, {tn: a.copy() for tn, a in ins.items()})[out], want)
    ctx = run_once(sched, ins, name="bf16_conv", context=CcBackend().init("bf16_conv"))
    np.testing.assert_array_equal(ctx.array(out), want)


@pytest.mark.parametrize("transposed", [False, True], ids=["a@b", "a@b.T"])
def test_pair_panels_copy_bf16_cells_without_a_round_trip(transposed):
    """Packing bf16 cells into a bf16 pair panel copies them: no widening and rounding back
    (which cost two conversions per cell and set a signalling NaN's quiet bit). In C and in
    the interpreter alike, every pattern, NaNs with any payload included, is copied as is."""
    source = _scheduled_source(16, 8, 32, transposed)
    assert "einjit_bf16_store(einjit_bf16_load(" not in source
    assert re.search(r"pack\[[^]]*\] = b\[[^]]*\];", source)
    a, b = Tnode("a", (8, 16), ops.bf16), Tnode("b", (8, 16), ops.bf16)
    i, j = get_symbol("i"), get_symbol("j")
    code = ll.ForLoop(i, 0, 7, ll.ForLoop(j, 0, 15, ll.Set(b, it(i, j), ll.Get(a, it(i, j)))))
    cells = np.arange(0, 2**16, 2**16 // 128, dtype=np.uint32).astype(np.uint16).reshape(8, 16)
    cells[0, :4] = [0x7F81, 0xFF81, 0x7FC1, 0x7F80]  # signalling and quiet NaNs, infinity
    np.testing.assert_array_equal(interpret.run(code, {a: cells.copy()})[b], cells)
    ctx = run_once(code, {a: cells}, name="bf16_copy", context=CcBackend().init("bf16_copy"))
    np.testing.assert_array_equal(ctx.array(b), cells)


def test_pair_panel_packing_interleaves_16_columns_of_two_rows_at_once():
    """A pair panel packed from the rows of its operand (`pack[kp, b, kl] = B(2*kp + kl, b)`,
    unit stride along `b`) is `einjit_bf16_pairs16` calls where the compiler targets
    AVX512_BF16, one per 16 columns (a permutation of the two rows' halves), and copies every
    cell as the plain nest does, offsets into the source included."""
    src, pack = Tnode("src", (10, 64), ops.bf16), Tnode("pack", (5, 48, 2), ops.bf16)
    kp, kl, b = get_symbol("kp"), get_symbol("kl"), get_symbol("b")
    read = ll.Get(src, (Affine(((2, kp), (1, kl))), Affine(((1, b),), 16)))
    code = ll.ForLoop(kp, 0, 4, ll.ForLoop(kl, 0, 1, ll.ForLoop(b, 0, 47, ll.Set(pack, it(kp, b, kl), read))))
    source = c_syntax.render_program([("bf16_pairs16", code)]).source
    assert source.count("einjit_bf16_pairs16(&") == 3
    assert bf16_dot.pair_pack(code) is not None and bf16_dot.pair_pack(dataclasses.replace(code, parallel=True)) is None
    cells = RNG.integers(0, 2**16, (10, 64)).astype(np.uint16)
    want = interpret.run(code, {src: cells.copy()})[pack]
    np.testing.assert_array_equal(want, cells[:, 16:].reshape(5, 2, 48).transpose(0, 2, 1))
    ctx = run_once(code, {src: cells}, name="bf16_pairs16", context=CcBackend().init("bf16_pairs16"))
    np.testing.assert_array_equal(ctx.array(pack), want)


def _nearest_even_reference(u: np.ndarray) -> np.ndarray:
    """bf16 patterns of float32 patterns `u`, by comparing distances to the two neighbouring
    bf16 numbers in float64 (not by the carry trick the implementations use): the nearer one,
    the even one on a tie, infinity past the largest bf16 number's half ulp; NaNs quiet."""
    mag = u & np.uint32(0x7FFFFFFF)
    lo = mag & np.uint32(0xFFFF0000)
    hi = lo + np.uint32(0x10000)
    def as_f64(p):
        with np.errstate(invalid="ignore"):  # NaN patterns: their result is chosen below
            return np.where(p == 0x7F800000, 2.0**128, p.view(np.float32).astype(np.float64))

    v, below, above = as_f64(mag), as_f64(lo), as_f64(hi)
    up = (above - v < v - below) | ((above - v == v - below) & ((lo >> 16) & 1 == 1))
    bits = np.where(up, hi, lo) >> 16
    bits = np.where(mag > 0x7F800000, (mag >> 16) | 0x40, np.where(mag == 0x7F800000, 0x7F80, bits))
    return (bits | ((u >> 16) & 0x8000)).astype(np.uint16)


def _conversion_samples() -> np.ndarray:
    """Every bf16 pattern followed by 16 low halves: zero (exact), 1 (just above), 0x7FFF and
    0x8001 (either side of a tie), 0x8000 (the tie), 0xFFFF, and random ones: all signs,
    zeros, subnormals, normals, the largest floats, infinities and NaNs."""
    lows = np.concatenate([[0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], RNG.integers(0, 2**16, 10)]).astype(np.uint32)
    return ((np.arange(2**16, dtype=np.uint32)[:, None] << 16) | lows[None, :]).reshape(-1)


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_c_conversions_exhaustively(monkeypatch, machine, threads):
    """The C helpers (`einjit_bf16_load`, `_store`, in optimized, vectorized nests) against an
    independent NumPy reference and `bf16.to_bits`: widening all 2^16 patterns exactly,
    rounding 2^20 float32 patterns (`_conversion_samples`); the interpreter on a slice."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    monkeypatch.setenv("EINJIT_NUM_THREADS", threads)
    from einjit.ir.optimize import optimize_proc

    u = _conversion_samples()
    n = u.size
    f, h = Tnode("f", (n,), ops.single), Tnode("h", (n,), ops.bf16)
    cells, wide = Tnode("cells", (2**16,), ops.bf16), Tnode("wide", (2**16,), ops.single)
    i, j = get_symbol("i"), get_symbol("j")
    code = ll.seq(ll.ForLoop(i, 0, n - 1, ll.Set(h, it(i), ll.Get(f, it(i)))),
                  ll.ForLoop(j, 0, 2**16 - 1, ll.Set(wide, it(j), ll.Get(cells, it(j)))))
    for tn in (f, h, cells, wide):
        tn.update_memory_mode(hosted(), 0)
    patterns = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    ins = {f: u.view(np.float32), cells: patterns}
    ctx = run_once(optimize_proc(code, name="bf16_conv").llc, ins, name="bf16_conv",
                   context=CcBackend().init("bf16_conv"))
    want = _nearest_even_reference(u)
    np.testing.assert_array_equal(bf16.to_bits(u.view(np.float32)), want)
    np.testing.assert_array_equal(ctx.array(h), want)
    np.testing.assert_array_equal(ctx.array(wide).view(np.uint32), patterns.astype(np.uint32) << 16)
    part = slice(0x7F7F * 16, 0x7F82 * 16)  # the largest floats, infinity, NaNs
    few = {f: u[part].view(np.float32)}
    hp = Tnode("hp", (few[f].size,), ops.bf16)
    fp = Tnode("fp", (few[f].size,), ops.single)
    small = ll.ForLoop(i, 0, few[f].size - 1, ll.Set(hp, it(i), ll.Get(fp, it(i))))
    np.testing.assert_array_equal(interpret.run(small, {fp: few[f]})[hp], want[part])
