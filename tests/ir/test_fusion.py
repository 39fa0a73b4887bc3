"""The loop fusion stage (`ir/sched/fusion.py`): fused nests compute what the separate nests
compute, bit for bit, under the interpreter and gcc; nests whose fusion would reorder a
dependence stay apart."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator, get_symbol
from einjit.ir.optimize import STAGES, VirtualizeSettings, optimize_proc
from einjit.ir.sched.fusion import ROW_MIN, fuse_loops
from einjit.ir.tnode import MATERIALIZED, Tnode
from test_random_programs import SETTINGS, build, programs
from test_schedule import run_c, run_in_c

N, M = 6, 8


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def nest(out, body_of, dims=(N, M)):
    """`out[i, j] = body_of(i, j)` over fresh loop symbols."""
    syms = [get_symbol(c) for c in "ij"[:len(dims)]]
    body = ll.Set(out, it(*syms), body_of(*syms))
    for s, n in reversed(list(zip(syms, dims, strict=True))):
        body = ll.ForLoop(s, 0, n - 1, body)
    return body


def top_loops(code):
    return [s for s in ll.flatten(code) if isinstance(s, ll.ForLoop)]


def row_norm(n=N, m=M, subtract=False):
    """LayerNorm's shape: a row mean (a reduction nest), the centred values, the affine map
    (every node stored, as when each is read several times). `subtract`: the mean is
    accumulated negated (`mean -= x / m`, as LayerNorm's backward subtracts its row sums)."""
    x, mean, c, y = (Tnode(name, dims, memory_mode=MATERIALIZED)
                     for name, dims in (("x", (n, m)), ("mean", (n,)), ("c", (n, m)), ("y", (n, m))))
    i, k = get_symbol("i"), get_symbol("k")
    add = ll.Binop(ops.Binop.SUB if subtract else ops.Binop.ADD, ll.Get(mean, it(i)),
                   ll.Binop(ops.Binop.MUL, ll.Get(x, it(i, k)), ll.Constant(1 / m)))
    mean_nest = ll.ForLoop(i, 0, n - 1, ll.ForLoop(k, 0, m - 1, ll.Set(mean, it(i), add)))
    centred = nest(c, lambda i, j: ll.Binop(ops.Binop.ADD if subtract else ops.Binop.SUB, ll.Get(x, it(i, j)),
                                            ll.Get(mean, it(i))), (n, m))
    scaled = nest(y, lambda i, j: ll.Binop(ops.Binop.MUL, ll.Get(c, it(i, j)), ll.Get(c, it(i, j))), (n, m))
    return ll.seq(ll.ZeroOut(mean), mean_nest, ll.ZeroOut(c), centred, scaled), x, y


def test_a_row_reduction_and_its_pointwise_consumers_become_one_pass():
    code, x, y = row_norm()
    fused = fuse_loops(code)
    loops = top_loops(fused)
    assert len(top_loops(code)) == 3 and len(loops) == 1
    inner = [s for s in ll.flatten(loops[0].body) if isinstance(s, ll.ForLoop)]
    assert len(inner) == 2  # the reduction over k, then the pointwise nests' fused innermost loop
    assert isinstance(list(ll.flatten(fused))[0], ll.ZeroOut)
    v = np.random.default_rng(0).standard_normal(x.dims).astype(np.float32)
    want = interpret.run(code, {x: v.copy()})[y]
    np.testing.assert_array_equal(interpret.run(fused, {x: v.copy()})[y], want)
    np.testing.assert_array_equal(run_c(fused, {x: v}, y), want)
    c = v - v.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(want, c * c, rtol=1e-5, atol=1e-6)


def test_a_read_of_another_iterations_cells_keeps_the_nests_apart():
    x, y, z = Tnode("x", (N, M)), Tnode("y", (N, M)), Tnode("z", (N - 1, M))
    first = nest(y, lambda i, j: ll.Binop(ops.Binop.MUL, ll.Get(x, it(i, j)), ll.Constant(2.0)))
    shifted = nest(z, lambda i, j: ll.Get(y, (Affine(((1, i),), 1), Iterator(j))), (N - 1, M))
    assert fuse_loops(ll.seq(first, shifted)) == ll.seq(first, shifted)


def test_a_reduction_across_the_outer_loop_keeps_the_nests_apart():
    """`s[j] += y[i, j]` accumulates across `i`: the consumer of `s` must wait for all of it."""
    x, s, out = Tnode("x", (N, M)), Tnode("s", (M,)), Tnode("out", (N, M))
    i, j = get_symbol("i"), get_symbol("j")
    acc = ll.ForLoop(i, 0, N - 1, ll.ForLoop(j, 0, M - 1, ll.Set(s, it(j), ll.Binop(
        ops.Binop.ADD, ll.Get(s, it(j)), ll.Get(x, it(i, j))))))
    use = nest(out, lambda i, j: ll.Binop(ops.Binop.MUL, ll.Get(x, it(i, j)), ll.Get(s, it(j))))
    code = ll.seq(ll.ZeroOut(s), acc, use)
    assert len(top_loops(fuse_loops(code))) == 2


def test_an_anti_dependence_keeps_the_nests_apart():
    """B overwrites what A reads at another iteration: fused, A would read the new values."""
    x, y = Tnode("x", (N, M)), Tnode("y", (N, M))
    reads_next = nest(y, lambda i, j: ll.Get(x, (FixedIdx(N - 1), Iterator(j))))
    writes = nest(x, lambda i, j: ll.Constant(1.0))
    code = ll.seq(reads_next, writes)
    assert len(top_loops(fuse_loops(code))) == 2


def test_a_zero_fill_of_an_array_the_first_nest_reads_is_not_moved():
    x, y = Tnode("x", (N, M)), Tnode("y", (N, M))
    first = nest(y, lambda i, j: ll.Get(x, it(i, j)))
    second = nest(x, lambda i, j: ll.Binop(ops.Binop.ADD, ll.Get(x, it(i, j)), ll.Constant(1.0)))
    code = ll.seq(first, ll.ZeroOut(x), second)
    assert fuse_loops(code) == code


def _innermost_pair(second_value, into_one_cell=False):
    """`y[i] = x[i] * 2`, then `z[j] = second_value(j)` (or the sum `z[0] += second_value(j)`):
    two innermost loops."""
    x, y, z = Tnode("x", (N,)), Tnode("y", (N,)), Tnode("z", (N,))
    i, j = get_symbol("i"), get_symbol("j")
    a = ll.ForLoop(i, 0, N - 1, ll.Set(y, it(i), ll.Binop(ops.Binop.MUL, ll.Get(x, it(i)), ll.Constant(2.0))))
    if into_one_cell:
        b = ll.ForLoop(j, 0, N - 1, ll.Set(z, (FixedIdx(0),), ll.Binop(
            ops.Binop.ADD, ll.Get(z, (FixedIdx(0),)), second_value(x, y, j))))
    else:
        b = ll.ForLoop(j, 0, N - 1, ll.Set(z, it(j), second_value(x, y, j)))
    return ll.seq(a, b), x, z


def _fused_into_one_loop(code, x, out, *, seed):
    """`code` fused into one loop that computes `out` from a random `x` bit for bit as `code`
    does, under the interpreter and gcc; that `x` and `out`."""
    fused = fuse_loops(code)
    assert len(top_loops(fused)) == 1
    v = np.random.default_rng(seed).standard_normal(x.dims).astype(np.float32)
    want = interpret.run(code, {x: v.copy()})[out]
    np.testing.assert_array_equal(interpret.run(fused, {x: v.copy()})[out], want)
    np.testing.assert_array_equal(run_c(fused, {x: v}, out), run_c(code, {x: v}, out))
    return v, want


def test_innermost_loops_of_plain_arithmetic_fuse_bit_identically():
    """`z = fma(y, x, exp(x) / 3)` after `y = 2 x`: one loop, the values the two loops give."""
    code, x, z = _innermost_pair(lambda x, y, j: ll.Ternop(ops.Ternop.FMA, ll.Get(y, it(j)), ll.Get(x, it(j)), ll.Binop(
        ops.Binop.DIV, ll.Unop(ops.Unop.EXP, ll.Get(x, it(j))), ll.Constant(3.0))))
    assert len(top_loops(code)) == 2
    v, want = _fused_into_one_loop(code, x, z, seed=3)
    np.testing.assert_allclose(want, 2 * v * v + np.exp(v) / 3, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("value", [
    lambda x, y, j: ll.Unop(ops.Unop.LOG, ll.Get(y, it(j))),
    lambda x, y, j: ll.Ternop(ops.Ternop.WHERE, ll.Get(x, it(j)), ll.Get(y, it(j)), ll.Constant(0.0)),
    lambda x, y, j: ll.Binop(ops.Binop.MUL, ll.Get(x, (FixedIdx(0),)), ll.Constant(2.0)),
], ids=["log", "where", "fill"])
def test_innermost_loops_with_calls_selects_or_fills_stay_apart(value):
    """A math call other than `exp` or a select (masked lanes would compute what they select
    away, see `_innermost`), or a loop storing one value along its row (`row_buffers` keeps that
    row as one cell) is not fused."""
    code, _, _ = _innermost_pair(value)
    assert fuse_loops(code) == code


def test_an_innermost_sum_into_one_cell_stays_apart():
    """`z[0] += x[j]`: gcc keeps an in-order float sum scalar, and the loop fused with it too."""
    code, _, _ = _innermost_pair(lambda x, y, j: ll.Get(x, it(j)), into_one_cell=True)
    assert fuse_loops(code) == code


def _row_scalar_between_row_passes(per_row: bool = True, width: int = ROW_MIN):
    """LayerNorm's forward in miniature: the row mean `m[i]` (a nest), `inv[i] = 1 / sqrt(m[i]^2 + 1)`
    (a loop over the rows alone, with a math call), then `y[i, j] = (x[i, j] - m[i]) * inv[i]`,
    over rows of `width`. Without `per_row`, the middle loop also sums the means into one cell,
    `t[0] += m[r]`."""
    x, m, inv, y, t = (Tnode("x", (N, width)), Tnode("m", (N,)), Tnode("inv", (N,)), Tnode("y", (N, width)),
                       Tnode("t", (1,)))
    i, k, r = get_symbol("i"), get_symbol("k"), get_symbol("r")
    mean = ll.ForLoop(i, 0, N - 1, ll.ForLoop(k, 0, width - 1, ll.Set(m, it(i), ll.Ternop(
        ops.Ternop.FMA, ll.Get(x, it(i, k)), ll.Constant(1 / width), ll.Get(m, it(i))))))
    scalar: ll.LLStmt = ll.Set(inv, it(r), ll.Unop(ops.Unop.RECIP, ll.Unop(ops.Unop.SQRT, ll.Ternop(
        ops.Ternop.FMA, ll.Get(m, it(r)), ll.Get(m, it(r)), ll.Constant(1.0)))))
    if not per_row:
        one = (FixedIdx(0),)
        scalar = ll.seq(scalar, ll.Set(t, one, ll.Binop(ops.Binop.ADD, ll.Get(t, one), ll.Get(m, it(r)))))
    last = nest(y, lambda i, j: ll.Binop(ops.Binop.MUL, ll.Binop(ops.Binop.SUB, ll.Get(x, it(i, j)), ll.Get(m, it(i))),
                                         ll.Get(inv, it(i))), (N, width))
    return ll.seq(ll.ZeroOut(m), mean, ll.ForLoop(r, 0, N - 1, scalar), last), x, y


def test_a_loop_over_the_rows_alone_fuses_between_two_passes_over_them():
    """The middle loop becomes one scalar statement per row: one pass, bit-identical."""
    code, x, y = _row_scalar_between_row_passes()
    assert len(top_loops(code)) == 3
    v, want = _fused_into_one_loop(code, x, y, seed=4)
    mean = v.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(want, (v - mean) / np.sqrt(mean * mean + 1), rtol=1e-5, atol=1e-6)


def test_a_loop_over_the_rows_alone_stays_apart_from_short_rows():
    """Rows shorter than `ROW_MIN`: a line or two each, nothing to keep in cache."""
    code, _, _ = _row_scalar_between_row_passes(width=ROW_MIN // 2)
    assert len(top_loops(fuse_loops(code))) == 3


def test_a_loop_over_the_rows_summing_into_one_cell_stays_apart():
    """Legal to fuse (nothing else touches `t`), but its in-order sum would run as a scalar
    statement per row where gcc keeps it in a loop of its own."""
    code, _, _ = _row_scalar_between_row_passes(per_row=False)
    assert len(top_loops(fuse_loops(code))) == 3


def test_a_loop_over_the_rows_alone_sharing_nothing_with_the_nest_stays_apart():
    """Two parameters' updates, a vector's and a matrix's over as many rows: nothing to keep in
    cache from one to the other, and the vector's loop would run a scalar statement per row."""
    x, y, v, w = Tnode("x", (N, ROW_MIN)), Tnode("y", (N, ROW_MIN)), Tnode("v", (N,)), Tnode("w", (N,))
    r = get_symbol("r")
    vector = ll.ForLoop(r, 0, N - 1, ll.Set(w, it(r), ll.Binop(ops.Binop.MUL, ll.Get(v, it(r)), ll.Constant(2.0))))
    matrix = nest(y, lambda i, j: ll.Binop(ops.Binop.MUL, ll.Get(x, it(i, j)), ll.Constant(2.0)), (N, ROW_MIN))
    code = ll.seq(vector, matrix)
    assert fuse_loops(code) == code


def _row_passes(first_reads_sum: bool):
    """Three nests over rows: `y[i, j] += x[i, j]` (or `+= s[i]`), the row sum `s[i] += |x[i, k]|`
    (whose innermost loop does not fuse: `abs` is no plain arithmetic), then
    `y[i, j] = fma(s[i], 0.5, y[i, j])`."""
    x, y, s = Tnode("x", (N, M)), Tnode("y", (N, M)), Tnode("s", (N,))
    i, k = get_symbol("i"), get_symbol("k")
    first = nest(y, lambda i, j: ll.Binop(ops.Binop.ADD, ll.Get(y, it(i, j)),
                                          ll.Get(s, it(i)) if first_reads_sum else ll.Get(x, it(i, j))))
    total = ll.ForLoop(i, 0, N - 1, ll.ForLoop(k, 0, M - 1, ll.Set(s, it(i), ll.Binop(
        ops.Binop.ADD, ll.Get(s, it(i)), ll.Unop(ops.Unop.ABS, ll.Get(x, it(i, k)))))))
    last = nest(y, lambda i, j: ll.Ternop(ops.Ternop.FMA, ll.Get(s, it(i)), ll.Constant(0.5), ll.Get(y, it(i, j))))
    return ll.seq(ll.ZeroOut(s), first, total, last), x, y


def test_a_loop_sinks_past_independent_statements_to_join_a_later_pass_over_its_array():
    """In the fused row: the first loop neither writes what the row sum reads nor reads what it
    writes, so it sinks past it and joins the last loop, which writes `y` too: one pass over
    `y`, bit for bit the values of the three nests."""
    code, x, y = _row_passes(False)
    fused = fuse_loops(code)
    [row] = top_loops(fused)
    inner = [s for s in ll.flatten(row.body) if isinstance(s, ll.ForLoop)]
    assert len(inner) == 2 and len([s for s in ll.flatten(inner[1].body) if isinstance(s, ll.Set)]) == 2
    rng = np.random.default_rng(4)
    ins = {x: rng.standard_normal(x.dims).astype(np.float32), y: rng.standard_normal(y.dims).astype(np.float32)}
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[y]
    np.testing.assert_array_equal(interpret.run(fused, {tn: v.copy() for tn, v in ins.items()})[y], want)
    np.testing.assert_array_equal(run_in_c(fused, ins).array(y), run_in_c(code, ins).array(y))
    ref = ins[y] + ins[x] + 0.5 * np.abs(ins[x]).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


def test_a_loop_reading_what_the_statements_after_it_write_does_not_sink():
    code, _, _ = _row_passes(True)
    [row] = top_loops(fuse_loops(code))
    assert len([s for s in ll.flatten(row.body) if isinstance(s, ll.ForLoop)]) == 3


def test_marked_loops_and_different_ranges_stay_apart():
    x, y, z = Tnode("x", (N, M)), Tnode("y", (N, M)), Tnode("z", (N, M))
    a = nest(y, lambda i, j: ll.Get(x, it(i, j)))
    b = nest(z, lambda i, j: ll.Get(x, it(i, j)))
    assert len(top_loops(fuse_loops(ll.seq(a, b)))) == 1
    assert len(top_loops(fuse_loops(ll.seq(a, replace(b, parallel=True))))) == 2
    w = Tnode("w", (M, N))
    c = nest(w, lambda i, j: ll.Get(x, it(j, i)), (M, N))
    assert len(top_loops(fuse_loops(ll.seq(a, c)))) == 2


def test_the_stage_runs_after_the_loop_stages_and_layer_norm_steps_fuse_in_the_pipeline():
    assert [s.name for s in STAGES][-4:] == ["fuse", "rows", "trim", "prefetch"]
    code, x, y = row_norm()
    on = optimize_proc(code, name="norm").llc
    code2, x2, y2 = row_norm()
    off = optimize_proc(code2, name="norm", settings=VirtualizeSettings(fuse=False)).llc
    assert len(top_loops(on)) < len(top_loops(off))
    v = np.random.default_rng(1).standard_normal(x.dims).astype(np.float32)
    np.testing.assert_array_equal(run_c(on, {x: v}, y), run_c(off, {x2: v}, y2))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(), opt_settings=st.sampled_from(SETTINGS))
def test_random_programs_compute_the_same_fused_and_unfused(program, opt_settings):
    """Differential: the optimized program with and without fusion, compiled by gcc, agree bit
    for bit (fusion reorders no arithmetic), and fusion alone is exact under the interpreter."""
    results = []
    for fuse in (True, False):
        llc, tns, inputs = build(program)
        code = optimize_proc(llc, settings=replace(opt_settings, fuse=fuse))
        ctx = run_once(code, inputs, name="random_fused", context=CcBackend().init("random_fused"))
        results.append({tn.label[0]: ctx.array(tn).copy() for tn, spec in zip(tns, program.nodes, strict=True)
                        if spec.host and tn.is_materialized_known()})
    assert results[0].keys() == results[1].keys()
    for name in results[0]:
        np.testing.assert_array_equal(results[0][name], results[1][name], err_msg=name)
    llc, tns, inputs = build(program)
    want = interpret.run(llc, {tn: v.copy() for tn, v in inputs.items()})
    got = interpret.run(fuse_loops(llc), {tn: v.copy() for tn, v in inputs.items()})
    for tn in want:
        np.testing.assert_array_equal(got[tn], want[tn], err_msg=tn.debug_name())


def _lanes_inside(code) -> bool:
    """Whether the split reduction's partial sums are computed inside a top-level loop that
    also computes a pointwise node (they were fused with their row pass)."""
    for top in top_loops(code):
        written = {tn.label[0] for tn in ll.nodes_of(top)}
        if "lanes" in written and "y" in written:
            return True
    return False


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("subtract", [False, True], ids=["sum", "subtracted"])
def test_split_row_sums_fuse_with_their_row_pass(machine, subtract, monkeypatch):
    """Rows long enough for the scheduler's split reduction (partial sums in unrolled loops)
    still fuse with the nests that use them: one pass per row, bit-identical to the unfused
    program under gcc, and the row norm NumPy computes."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    n, m = 40, 128
    code, x, y = row_norm(n, m, subtract)
    on = optimize_proc(code, name="split_norm").llc
    code2, x2, y2 = row_norm(n, m, subtract)
    off = optimize_proc(code2, name="split_norm", settings=VirtualizeSettings(fuse=False)).llc
    assert "lanes" in {tn.label[0] for tn in ll.nodes_of(off)}
    assert _lanes_inside(on) and not _lanes_inside(off)
    assert len(top_loops(on)) == 1 < len(top_loops(off))
    v = np.random.default_rng(2).standard_normal(x.dims).astype(np.float32) + 3
    got = run_c(on, {x: v}, y)
    np.testing.assert_array_equal(got, run_c(off, {x2: v}, y2))
    c = v.astype(np.float64) - v.astype(np.float64).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(got, c * c, rtol=1e-4, atol=1e-5)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 48), m=st.sampled_from([32, 64, 96, 160]), subtract=st.booleans(),
       machine=st.sampled_from(["avx2", "avx512"]), seed=st.integers(0, 2**16))
def test_random_row_norms_compute_the_same_fused_and_unfused(n, m, subtract, machine, seed, monkeypatch):
    """Differential over row counts and lengths around the split reduction's thresholds (split
    or not, lanes dividing the row or one lane per element): fused and unfused agree bit for
    bit under gcc, and both match the interpreter on the unoptimized code to float32 rounding."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    results = []
    v = np.random.default_rng(seed).standard_normal((n, m)).astype(np.float32)
    for fuse in (True, False):
        code, x, y = row_norm(n, m, subtract)
        llc = optimize_proc(code, name="random_norm", settings=VirtualizeSettings(fuse=fuse)).llc
        results.append(run_c(llc, {x: v}, y))
    np.testing.assert_array_equal(results[0], results[1])
    code, x, y = row_norm(n, m, subtract)
    want = interpret.run(code, {x: v.copy()})[y]
    np.testing.assert_allclose(results[0], want, rtol=1e-5, atol=1e-5)
