"""Register blocks as vectors (`sched/nests.RegisterBlock`, `backends/c_vectors.py`): the
scheduled C declares each block as an array of GCC vectors and computes its lane loops as
vector statements, for the AVX2 and the AVX-512 descriptions, in float and double, and gives
bit for bit what the unscheduled C gives, at extents the blocks do not divide."""

from __future__ import annotations

import re

import numpy as np
import pytest

from einjit.backends import c_vectors
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
    """A dot product per row (ATL's matvec): the partial sums are vectors, their lanes summed
    by halves, exactly as the interpreter adds the scheduled code's lanes."""
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


def _halving_sum(a: np.ndarray, start: np.ndarray, n_lanes: int, lanes: int, subtract: bool) -> np.ndarray:
    """The split row sum in the scheduled order, in `a`'s precision: `n_lanes` partial sums
    over the row's chunks, their vectors of `lanes` folded upper onto lower, the first vector's
    upper half added onto its lower half down to two lanes, those two added into the start."""
    part = np.zeros((a.shape[0], n_lanes), a.dtype)
    for k0 in range(a.shape[1] // n_lanes):
        part = part + a[:, k0 * n_lanes:(k0 + 1) * n_lanes]
    vecs = [part[:, v * lanes:(v + 1) * lanes] for v in range(n_lanes // lanes)]
    while len(vecs) > 1:
        half, top = len(vecs) // 2, len(vecs) - len(vecs) // 2
        vecs = [vecs[v] + vecs[v + top] if v < half else vecs[v] for v in range(top)]
    v = vecs[0]
    while v.shape[1] > 2:
        v = v[:, :v.shape[1] // 2] + v[:, v.shape[1] // 2:]
    total = v[:, 0] + v[:, 1]
    return start - total if subtract else start + total


@pytest.mark.parametrize("machine", MACHINE_NAMES)
@pytest.mark.parametrize("prec", PRECS.values(), ids=PRECS.keys())
@pytest.mark.parametrize("subtract", [False, True], ids=["sum", "subtracted"])
def test_split_row_sums_total_their_lanes_by_halves(machine, prec, subtract):
    """The partial sums' first vector is summed by halves, into vectors of half its lanes down to
    two lanes (`schedule._halved`), each step one vector statement (`einjit_low_*` plus
    `einjit_high_*`), no loop over lanes: gcc and the interpreter give that order's sums bit for
    bit, a subtracted sum (LayerNorm's backward) leaving the target's prior value in."""
    n, m = 6, 96
    a, s = Tnode("a", (n, m), prec), Tnode("s", (n,), prec)
    i, k = get_symbol("i"), get_symbol("k")
    op = ops.Binop.SUB if subtract else ops.Binop.ADD
    step = ll.ForLoop(i, 0, n - 1, ll.ForLoop(k, 0, m - 1, ll.Set(s, it(i), ll.Binop(
        op, ll.Get(s, it(i)), ll.Get(a, it(i, k))))))
    code = step if subtract else ll.seq(ll.ZeroOut(s), step)
    sched = schedule_llc(code, ON, blocking(machine))
    lanes = lanes_of(machine, prec)
    halves = sorted(tn.dims[-1] for tn in ll.nodes_of(sched) if tn.is_local() and tn.dims[:2] == (1, 1))
    assert halves == [2 ** e for e in range(1, lanes.bit_length() - 1)]
    src = source(sched)
    short = f"{'f32' if prec is ops.single else 'f64'}x{lanes}"
    assert f"einjit_low_{short}(lanes" in src and f"einjit_high_{short}(lanes" in src
    assert not re.search(r"lanes\w*\[0\]\[j", src)
    ins = inputs_for(a, s, seed=m)
    start = ins[s] if subtract else np.zeros(n, prec.dtype)
    want = _halving_sum(ins[a], start, Blocking().lanes, lanes, subtract)
    inputs = ins if subtract else {a: ins[a]}
    np.testing.assert_array_equal(interpret.run(sched, {t: v.copy() for t, v in inputs.items()})[s], want)
    np.testing.assert_array_equal(run_c(sched, inputs, s), want)
    ref = ins[a].astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(want, start - ref if subtract else ref, rtol=1e-5, atol=1e-5)


def test_only_a_loop_over_half_a_blocks_lanes_reads_it_by_halves():
    """`h[l] = b[l] + b[l + 8]` is one vector statement where `h` has 8 lanes and `b` 16, not
    where `h` has 4 (the halves of `b` are 8 lanes wide), nor with an offset other than the half."""
    def block(lanes):
        return Tnode("lanes", (1, 1, lanes), ops.single, memory_mode=LOCAL, provenance=provenance.REGISTER_BLOCK)

    b, lane = block(16), get_symbol("l")
    at = (FixedIdx(0), FixedIdx(0), Iterator(lane))

    def step(lanes, offset):
        upper = (FixedIdx(0), FixedIdx(0), Affine(((1, lane),), offset))
        return ll.ForLoop(lane, 0, lanes - 1, ll.Set(block(lanes), at, ll.Binop(
            ops.Binop.ADD, ll.Get(b, at), ll.Get(b, upper))))

    assert c_vectors.lane_statement(step(8, 8)) is not None
    assert c_vectors.lane_statement(step(4, 8)) is None
    assert c_vectors.lane_statement(step(8, 4)) is None


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
