"""Register blocks as vectors (`sched/nests.RegisterBlock`, `backends/c_vectors.py`): the
scheduled C declares each block as an array of GCC vectors and computes its lane loops as
vector statements, for the AVX2 and the AVX-512 descriptions, in float and double, and gives
bit for bit what the unscheduled C gives, at extents the blocks do not divide."""

from __future__ import annotations

import re

import numpy as np
import pytest

from einjit.backends.c_syntax import render_routine
from einjit.backends.cc import toolchain as cc
from einjit.ir import interpret, ops, provenance
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator, get_symbol
from einjit.ir.optimize import optimize_proc
from einjit.ir.sched import nests
from einjit.ir.sched.machine import MACHINES
from einjit.ir.sched.schedule import Blocking, schedule_llc
from einjit.ir.tnode import LOCAL, Tnode
from test_schedule import ON, inputs_for, it, matmul, row_sums, run_c

MACHINE_NAMES = ["avx2", "avx512"]
PRECS = {"f32": ops.single, "f64": ops.double}


def blocking(machine: str) -> Blocking:
    return Blocking(min_work=1, min_unroll_work=1, machine=MACHINES[machine])


def source(code: ll.LLStmt) -> str:
    return cc.compile_proc(code, name="blocks", options=cc.CcOptions(threads=1)).source


def lanes_of(machine: str, prec: ops.Prec) -> int:
    return MACHINES[machine].vector_bytes // prec.itemsize


@pytest.mark.parametrize("machine", MACHINE_NAMES)
@pytest.mark.parametrize("prec", PRECS.values(), ids=PRECS.keys())
@pytest.mark.parametrize("transposed", [False, True], ids=["a@b", "a@b.T"])
@pytest.mark.parametrize("n,m,p", [(13, 17, 31), (23, 40, 100), (50, 7, 45), (9, 33, 16)])
def test_vector_blocks_match_the_unscheduled_c_bit_for_bit(machine, prec, transposed, n, m, p):
    code, a, b, c = matmul(n, m, p, transposed, prec=prec)
    sched = schedule_llc(code, ON, blocking(machine))
    src = source(sched)
    lanes = lanes_of(machine, prec)
    short = f"{'f32' if prec is ops.single else 'f64'}x{lanes}"
    assert re.search(rf"einjit_{short} acc\[\d+\] = \{{0\}};", src)
    assert f"einjit_fma_{short}(einjit_splat_{short}(a[" in src
    ins = inputs_for(a, b, seed=n)
    want = run_c(code, ins, c)
    np.testing.assert_array_equal(run_c(sched, ins, c), want)
    ref = ins[a].astype(np.float64) @ (ins[b].T if transposed else ins[b]).astype(np.float64)
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


def _inner_loop(src: str) -> str:
    """The summed loop around the block's first multiply-adds, from its head to its end."""
    start = src.index("] = einjit_fma_")
    head = src.rindex("for (int k", 0, start)
    indent = src.rindex("\n", 0, head) + 1
    end = src.index("\n" + " " * (head - indent) + "}", start)
    return src[head:end]


@pytest.mark.parametrize("machine", MACHINE_NAMES)
def test_the_inner_loop_of_a_large_matmul_has_no_accumulator_array_of_scalars(machine, monkeypatch):
    """Through the optimizer, with the description `EINJIT_MACHINE` names: every cell of the
    block is a lane of a vector indexed by the unrolled loops, none a float of an array."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    n = 256
    code, a, b, c = matmul(n, n, n, False)
    opt = optimize_proc(code, name="mm")
    src = source(opt.llc)
    assert not re.search(r"float acc\[", src)
    lanes = lanes_of(machine, ops.single)
    inner = _inner_loop(src)
    assert "#pragma GCC unroll" in inner and f"einjit_load_f32x{lanes}(&pack[" in inner
    # each statement reads and writes whole vectors of the block, never a lane
    assert not re.search(r"acc\[[^\]]*\]\[", inner)
    ins = inputs_for(a, b)
    np.testing.assert_allclose(run_c(opt.llc, ins, c), ins[a] @ ins[b], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("machine", MACHINE_NAMES)
@pytest.mark.parametrize("prec", PRECS.values(), ids=PRECS.keys())
@pytest.mark.parametrize("m", [1000, 48])
def test_split_reductions_keep_their_partial_sums_in_vectors(machine, prec, m):
    """A dot product per row (ATL's matvec): the partial sums are vectors, added up lane by
    lane in lane order, exactly as the interpreter adds the scheduled code's lanes."""
    a, x, y = Tnode("a", (5, m), prec), Tnode("x", (m,), prec), Tnode("y", (5,), prec)
    i, k = get_symbol("i"), get_symbol("k")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, it(i, k)), ll.Get(x, it(k)), ll.Get(y, it(i)))
    code = ll.seq(ll.ZeroOut(y), ll.ForLoop(i, 0, 4, ll.ForLoop(k, 0, m - 1, ll.Set(y, it(i), fma))))
    sched = schedule_llc(code, ON, Blocking(min_work=1, lanes=8, machine=MACHINES[machine]))
    src = source(sched)
    short = f"{'f32' if prec is ops.single else 'f64'}x{min(8, lanes_of(machine, prec))}"
    assert f"einjit_{short} lanes[" in src and f"einjit_fma_{short}(einjit_load_{short}(&a[" in src
    ins = inputs_for(a, x, seed=m)
    got = run_c(sched, ins, y)
    if prec is ops.single:
        np.testing.assert_array_equal(got, interpret.run(sched, {t: v.copy() for t, v in ins.items()})[y])
    np.testing.assert_allclose(got, ins[a].astype(np.float64) @ ins[x].astype(np.float64), rtol=1e-5, atol=1e-5)


def _lane_order_sums(x: np.ndarray, n_lanes: int, lanes: int) -> np.ndarray:
    """Row sums of float32 `x` as the split reduction adds them: `n_lanes` partial sums over
    `k = n_lanes*k0 + j`, their vectors of `lanes` folded pairwise (upper half onto the lower),
    the first vector's lanes then added in lane order."""
    out = np.zeros(x.shape[:-1], np.float32)
    for at in np.ndindex(*x.shape[:-1]):
        part = np.zeros(n_lanes, np.float32)
        for step in x[at].reshape(-1, n_lanes):
            part = part + step
        vectors, n = list(part.reshape(-1, lanes)), n_lanes // lanes
        while n > 1:
            half, top = n // 2, n - n // 2
            for v in range(half):
                vectors[v] = vectors[v] + vectors[v + top]
            n = top
        total = np.float32(0)
        for lane in vectors[0]:
            total = np.float32(total + lane)
        out[at] = total
    return out


@pytest.mark.parametrize("machine", MACHINE_NAMES)
@pytest.mark.parametrize("heads,keys,together", [(4, 64, True), (4, 320, False), (12, 64, False)])
def test_the_totals_of_a_few_short_sums_are_added_side_by_side(machine, heads, keys, together):
    """The softmax's row sums, `s[b, h] = Σ_k e[b, h, k]` over a few heads: each head's partial
    sums, then the heads' totals lane by lane side by side (one chain of dependent additions
    per head, run together), each still in lane order: the bits of one head at a time, as
    the interpreter adds the scheduled code. Many heads, or a long sum, keep one at a time."""
    e, s = Tnode("e", (3, heads, keys)), Tnode("s", (3, heads))
    b, h, k = get_symbol("b"), get_symbol("h"), get_symbol("k")
    add = ll.Binop(ops.Binop.ADD, ll.Get(s, it(b, h)), ll.Get(e, it(b, h, k)))
    code = ll.seq(ll.ZeroOut(s), ll.ForLoop(b, 0, 2, ll.ForLoop(h, 0, heads - 1, ll.ForLoop(k, 0, keys - 1, ll.Set(
        s, it(b, h), add)))))
    sched = schedule_llc(code, ON, blocking(machine))
    src = source(sched)
    side_by_side = re.search(rf"for \(int jl\d+ = 0; jl\d+ < \d+; \+\+jl\d+\) \{{\n\s*#pragma GCC unroll {heads}\n"
                             rf"\s*for \(int h\d+ = 0; h\d+ < {heads}; ", src)
    assert bool(side_by_side) == together, src
    ins = inputs_for(e, seed=keys + heads)
    got = run_c(sched, ins, s)
    np.testing.assert_array_equal(got, interpret.run(sched, {t: v.copy() for t, v in ins.items()})[s])
    np.testing.assert_array_equal(got, _lane_order_sums(ins[e], 32, lanes_of(machine, ops.single)))


def test_a_reduction_step_the_vectors_cannot_compute_keeps_a_plain_array():
    """A sum of `exp`s: gcc vectorizes the plain loop (einjit's inline `einjit_expf`); a vector block would be
    addressed lane by lane."""
    a, s = Tnode("a", (3, 64)), Tnode("s", (3,))
    i, k = get_symbol("i"), get_symbol("k")
    add = ll.Binop(ops.Binop.ADD, ll.Get(s, it(i)), ll.Unop(ops.Unop.EXP, ll.Get(a, it(i, k))))
    code = ll.seq(ll.ZeroOut(s), ll.ForLoop(i, 0, 2, ll.ForLoop(k, 0, 63, ll.Set(s, it(i), add))))
    sched = schedule_llc(code, ON, blocking("avx2"))
    assert "float lanes[32] = {0};" in source(sched)
    ins = inputs_for(a)
    np.testing.assert_allclose(run_c(sched, ins, s), np.exp(ins[a].astype(np.float64)).sum(axis=1), rtol=1e-5)


def test_integer_partial_sums_stay_scalar():
    code, a, s = row_sums(2, 64, ops.int32)
    sched = schedule_llc(code, ON, blocking("avx512"))
    assert "int lanes[32] = {0};" in source(sched)
    x = np.arange(128, dtype=np.int32).reshape(2, -1) * 7 - 100
    np.testing.assert_array_equal(run_c(sched, {a: x}, s), x.sum(axis=1))


def test_a_lane_loop_the_vectors_cannot_compute_addresses_lanes():
    """A strided read: the loop stays a loop, each cell a lane of the block's vector, with the
    interpreter's results."""
    x, out = Tnode("x", (16,)), Tnode("out", (8,))
    block = Tnode("acc", (1, 2, 4), ops.single, memory_mode=LOCAL, provenance=provenance.REGISTER_BLOCK)
    q, lane = get_symbol("q"), get_symbol("l")
    at = (FixedIdx(0), Iterator(q), Iterator(lane))
    col = Affine(((4, q), (1, lane)), 0)
    strided = ll.Get(x, (Affine(((8, q), (2, lane)), 0),))
    code = ll.seq(
        ll.ForLoop(q, 0, 1, ll.ForLoop(lane, 0, 3, ll.Set(block, at, ll.Binop(ops.Binop.MUL, strided, strided)))),
        ll.ForLoop(q, 0, 1, ll.ForLoop(lane, 0, 3, ll.Set(out, (col,), ll.Get(block, at)))))
    src = re.sub(r"\b([a-z]+)_?\d+\b", r"\1", render_routine("lanes", code).code)  # names are numbered
    assert "einjit_f32x4 acc[2] = {0};" in src
    assert "acc[q][l] = (x[8*q + 2*l] * x[8*q + 2*l]);" in src
    assert "einjit_store_f32x4(&out[4*q], acc[q]);" in src
    v = np.linspace(-2, 2, 16, dtype=np.float32)
    np.testing.assert_array_equal(run_c(code, {x: v}, out), v[::2] * v[::2])
    np.testing.assert_array_equal(interpret.run(code, {x: v.copy()})[out], v[::2] * v[::2])


@pytest.mark.parametrize("width,prec,vector_bytes,lanes", [
    (32, ops.single, 64, 16), (32, ops.single, 32, 8), (16, ops.double, 32, 4), (12, ops.single, 64, 4),
    (5, ops.single, 64, 1), (32, ops.half, 64, 1), (32, ops.int32, 64, 1), (2, ops.double, 16, 2)])
def test_vector_lanes_follow_the_machine_and_the_width(width, prec, vector_bytes, lanes):
    assert nests.vector_lanes(width, prec, vector_bytes) == lanes
    block = nests.register_block(3, width, prec, vector_bytes, get_symbol("j"))
    assert block.node.size == 3 * width and block.width == width
    assert (block.node.provenance == provenance.REGISTER_BLOCK) == (lanes > 1)
