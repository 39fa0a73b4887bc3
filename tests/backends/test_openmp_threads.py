"""OpenMP threads beyond the contraction panel loop (`backends/parallel_loops.py`): pointwise
and reduction nests on threads, consecutive threaded nests in one parallel region. gcc's code at
2 threads computes what the reference interpreter computes, bit for bit (only loops over output
cells are threaded, so no sum changes order), and what it computes at 1 thread. Two threads on
a one-core machine still run (OpenMP time-slices them), so none of this needs two cores."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from einjit.backends import parallel_loops
from einjit.backends.c_syntax import C_SYNTAX
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, GatherIdx, Iterator, get_symbol
from einjit.ir.tnode import Tnode

REGION = "#pragma omp parallel num_threads(2)"
FOR = "#pragma omp for schedule(dynamic, 24)"
"""48 rows of 40 cells: 24 rows (960 assignments) per hand-out, an even share per thread."""


def options(threads: int, min_work: int = 1, outline: int = 0) -> cc.CcOptions:
    return cc.CcOptions(threads=threads, syntax=replace(C_SYNTAX, thread_min_work=min_work),
                        outline_min_nests=outline)


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def inputs_for(*tns, seed=0):
    rng = np.random.default_rng(seed)
    return {tn: rng.standard_normal(tn.dims).astype(tn.prec.dtype) for tn in tns}


def run_c(code, ins, opts, name):
    ctx = run_once(code, {tn: v.copy() for tn, v in ins.items()}, name=name, options=opts,
                   context=CcBackend(opts).init(name))
    return ctx


def check_threads(code, ins, outs, name, **kw):
    """Run `code` in the interpreter and in C at 1 and 2 threads: all bit-identical. Returns the
    2-thread source and the interpreter's arrays."""
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})
    sources = {}
    for threads in (1, 2):
        opts = options(threads, **kw)
        sources[threads] = cc.compile_proc(code, name=name, options=opts).source
        ctx = run_c(code, ins, opts, name)
        for out in outs:
            np.testing.assert_array_equal(ctx.array(out), want[out], err_msg=f"{out.name} at {threads} threads")
    assert "omp" not in sources[1]
    return sources[2], want


def pointwise(src: Tnode, dst: Tnode, scale: float, other: Tnode | None = None) -> ll.LLStmt:
    """`dst = relu(src * scale + other)` over every cell."""
    i, j = get_symbol("i"), get_symbol("j")
    value: ll.LLScalar = ll.Binop(ops.Binop.MUL, ll.Get(src, it(i, j)), ll.Constant(scale))
    if other is not None:
        value = ll.Binop(ops.Binop.ADD, value, ll.Get(other, it(i, j)))
    body = ll.Set(dst, it(i, j), ll.Unop(ops.Unop.RELU, value))
    return ll.ForLoop(i, 0, dst.dims[0] - 1, ll.ForLoop(j, 0, dst.dims[1] - 1, body))


def test_pointwise_nest_runs_on_threads_bit_identical():
    x, y, out = Tnode("x", (40, 24)), Tnode("y", (40, 24)), Tnode("out", (40, 24))
    code = pointwise(x, out, 0.5, y)
    ins = inputs_for(x, y)
    source, want = check_threads(code, ins, [out], "pointwise")
    assert REGION not in source and "#pragma omp parallel for schedule(dynamic, 20) num_threads(2)" in source
    np.testing.assert_allclose(want[out], np.maximum(ins[x] * 0.5 + ins[y], 0), rtol=1e-6)


def test_small_nests_stay_serial():
    x, out = Tnode("x", (4, 8)), Tnode("out", (4, 8))
    code = pointwise(x, out, 2.0)
    assert parallel_loops.work(code) == 32
    assert "omp" not in cc.compile_proc(code, name="small", options=options(2, min_work=64)).source
    assert "omp" in cc.compile_proc(code, name="small", options=options(2, min_work=32)).source


def matvec() -> tuple[ll.LLStmt, Tnode, Tnode, Tnode]:
    """`out[i] = sum_k a[i, k] * v[k]`: the sum is over `k`, the threads over `i`."""
    a, v, out = Tnode("a", (33, 20)), Tnode("v", (20,)), Tnode("out", (33,))
    i, k = get_symbol("i"), get_symbol("k")
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, it(i, k)), ll.Get(v, it(k)), ll.Get(out, it(i)))
    return ll.seq(ll.ZeroOut(out), ll.ForLoop(i, 0, 32, ll.ForLoop(k, 0, 19, ll.Set(out, it(i), fma)))), a, v, out


def test_row_reduction_threads_its_output_cells_only():
    code, a, v, out = matvec()
    threaded = parallel_loops.thread_nests(code, 2, 1)
    loops = [s for s in ll.iter_stmts(threaded) if isinstance(s, ll.ForLoop)]
    assert [lp.parallel for lp in loops] == [True, False]  # i on threads, the summed k not
    ins = inputs_for(a, v)
    _, want = check_threads(code, ins, [out], "matvec")
    np.testing.assert_allclose(want[out], ins[a].astype(np.float64) @ ins[v], rtol=1e-5)


def column_sums(inner: int) -> tuple[ll.LLStmt, Tnode, Tnode]:
    """`db[j, e] = sum_{b, t} g[b, t, j, e]` (a bias gradient), the summed loops outside."""
    g, db = Tnode("g", (6, 10, 4, inner)), Tnode("db", (4, inner))
    b, t, j, e = (get_symbol(n) for n in "btje")
    add = ll.Set(db, it(j, e), ll.Binop(ops.Binop.ADD, ll.Get(db, it(j, e)), ll.Get(g, it(b, t, j, e))))
    loops = ll.ForLoop(b, 0, 5, ll.ForLoop(t, 0, 9, ll.ForLoop(j, 0, 3, ll.ForLoop(e, 0, inner - 1, add))))
    return ll.seq(ll.ZeroOut(db), loops), g, db


@pytest.mark.parametrize("inner", [1, 48])
def test_sums_over_outer_loops_move_an_output_loop_outermost(inner):
    """The summed loops are outermost; the outermost loop over output cells (j) moves outside
    them, so each cell still adds its terms in order, and one fork-join does the nest."""
    code, g, db = column_sums(inner)
    nest = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1)))[1]
    assert nest.parallel and nest.index.name == "j" and nest.to_ == 3
    assert not any(s.parallel for s in ll.iter_stmts(nest.body) if isinstance(s, ll.ForLoop))
    ins = inputs_for(g)
    _, want = check_threads(code, ins, [db], f"colsum{inner}")
    np.testing.assert_allclose(want[db], ins[g].astype(np.float64).sum((0, 1)), rtol=1e-5, atol=1e-5)


def test_an_innermost_output_loop_moves_out_in_vector_chunks():
    g, db = Tnode("g", (6, 10, 64)), Tnode("db", (64,))
    b, t, e = (get_symbol(n) for n in "bte")
    add = ll.Set(db, it(e), ll.Binop(ops.Binop.ADD, ll.Get(db, it(e)), ll.Get(g, it(b, t, e))))
    code = ll.seq(ll.ZeroOut(db), ll.ForLoop(b, 0, 5, ll.ForLoop(t, 0, 9, ll.ForLoop(e, 0, 63, add))))
    nest = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1)))[1]
    chain = [nest, nest.body, nest.body.body, nest.body.body.body]
    assert [(lp.to_ + 1, lp.parallel) for lp in chain] == [(8, True), (6, False), (10, False), (8, False)]
    ins = inputs_for(g)
    source, want = check_threads(code, ins, [db], "vecsum")
    assert "db[8*e" in source.replace(" ", "") or "db[(8*e" in source.replace(" ", "")
    np.testing.assert_allclose(want[db], ins[g].astype(np.float64).sum((0, 1)), rtol=1e-5, atol=1e-5)


def test_an_embedding_scatter_threads_its_feature_chunks():
    """`dw[ids[b], e] += g[b, e]`: rows collide (repeated ids), so the batch loop stays serial;
    chunks of the feature loop go to threads, each adding its columns in batch order."""
    ids, g, dw = Tnode("ids", (50,), ops.int32), Tnode("g", (50, 32)), Tnode("dw", (6, 32))
    b, e = get_symbol("b"), get_symbol("e")
    row = GatherIdx(ids, it(b), 6)
    add = ll.Set(dw, (row, Iterator(e)), ll.Binop(ops.Binop.ADD, ll.Get(dw, (row, Iterator(e))), ll.Get(g, it(b, e))))
    code = ll.seq(ll.ZeroOut(dw), ll.ForLoop(b, 0, 49, ll.ForLoop(e, 0, 31, add)))
    nest = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1)))[1]
    assert nest.parallel and nest.to_ == 3 and not nest.body.parallel
    rng = np.random.default_rng(3)
    ins = {ids: rng.integers(0, 6, 50).astype(np.int32), g: rng.standard_normal((50, 32)).astype(np.float32)}
    _, want = check_threads(code, ins, [dw], "scatter")
    expect = np.zeros((6, 32))
    np.add.at(expect, ins[ids], ins[g].astype(np.float64))
    np.testing.assert_allclose(want[dw], expect, rtol=1e-5, atol=1e-5)


def test_a_sum_into_one_cell_is_never_threaded():
    x, total = Tnode("x", (64, 64)), Tnode("total", (1,))
    i, j, cell = get_symbol("i"), get_symbol("j"), (FixedIdx(0),)
    acc = ll.Set(total, cell, ll.Binop(ops.Binop.ADD, ll.Get(total, cell), ll.Get(x, it(i, j))))
    code = ll.seq(ll.Set(total, cell, ll.Constant(0.0)), ll.ForLoop(i, 0, 63, ll.ForLoop(j, 0, 63, acc)))
    threaded = parallel_loops.thread_nests(code, 2, 1)
    assert not any(isinstance(s, ll.ForLoop) and s.parallel for s in ll.iter_stmts(threaded))
    ins = inputs_for(x)
    source, want = check_threads(code, ins, [total], "total")
    assert "omp" not in source
    np.testing.assert_allclose(want[total][0], ins[x].astype(np.float64).sum(), rtol=1e-4)


def region_program():
    """`a = relu(2x)`, `b = relu(y/2)` (independent of `a`), `s = x[0, 0]` (a serial
    statement), then `c = relu(3a + b)`, which needs both."""
    x, y = Tnode("x", (48, 40)), Tnode("y", (48, 40))
    a, b, c, s = Tnode("a", (48, 40)), Tnode("b", (48, 40)), Tnode("c", (48, 40)), Tnode("s", (1,))
    first = ll.Set(s, (FixedIdx(0),), ll.Get(x, (FixedIdx(0), FixedIdx(0))))
    code = ll.seq(pointwise(x, a, 2.0), pointwise(y, b, 0.5), first, pointwise(a, c, 3.0, b))
    return code, (x, y), (a, b, c, s)


def _pragmas(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if "#pragma omp" in line]


def _functions(source: str, routine: str) -> dict[str, str]:
    """The routine's function and its nest functions (definitions), by name."""
    found = re.finditer(rf"^[^\n;]*\bvoid ({routine}\w*)\([^;]*?\{{\n(.*?)^}}", source, re.M | re.S)
    return {m.group(1): m.group(2) for m in found}


@pytest.mark.parametrize("outline", [0, 2], ids=["outlined for threads", "outlined by size"])
def test_consecutive_nests_share_one_parallel_region(outline):
    """The routine opens one region around the nests' calls; each threaded nest is an
    orphaned `omp for` in its function (outlined even below `outline_min_nests`: a loop
    compiled inside `omp parallel` would reach stack arrays through pointers gcc does not
    vectorize), the serial statement an `omp single` in the region."""
    code, ins_nodes, outs = region_program()
    ins = inputs_for(*ins_nodes)
    source, want = check_threads(code, ins, outs, "region", outline=outline)
    functions = _functions(source, "region")
    body = functions.pop("region")
    assert source.count("#pragma omp parallel") == 1
    # c reads a and b, so the single before it ends with a barrier; a and b are independent
    # (no barrier between them), and the single's statement touches neither
    assert _pragmas(body) == [REGION, "#pragma omp single"]
    assert [line.strip() for line in body.splitlines() if "region_nest" in line] == [
        "region_nest0(x, a);", "region_nest1(y, b);", "region_nest2(a, b, c);"]
    assert [_pragmas(f) for f in functions.values()] == [[FOR + " nowait"]] * 3
    x, y = (ins[n].astype(np.float64) for n in ins_nodes)
    np.testing.assert_allclose(want[outs[2]], np.maximum(3 * np.maximum(2 * x, 0) + np.maximum(y / 2, 0), 0),
                               rtol=1e-6)


def test_dependent_nests_keep_their_barrier():
    x, a, c = Tnode("x", (48, 40)), Tnode("a", (48, 40)), Tnode("c", (48, 40))
    code = ll.seq(pointwise(x, a, 2.0), pointwise(a, c, 3.0))
    source, _ = check_threads(code, inputs_for(x), [a, c], "chain")
    functions = _functions(source, "chain")
    assert _pragmas(functions.pop("chain")) == [REGION]
    assert [_pragmas(f) for f in functions.values()] == [[FOR], [FOR + " nowait"]]


def test_a_threaded_inner_loop_ends_the_region():
    """A nest that threads a loop below a serial one opens its own region: the others do not
    share theirs with it."""
    x, a, b = Tnode("x", (48, 40)), Tnode("a", (48, 40)), Tnode("b", (48, 40))
    inner = pointwise(x, b, 0.5)
    serial = ll.ForLoop(get_symbol("r"), 0, 1, replace(inner, parallel=True))
    code = ll.seq(pointwise(x, a, 2.0), serial, pointwise(x, b, 3.0))
    top = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1)))
    assert parallel_loops.shared_regions(top) == []
    assert parallel_loops.shared_regions([top[0], top[2]])[0].units[0].nowait


def test_a_serial_loop_around_threaded_loops_is_one_region():
    """A serial loop whose steps each run a threaded loop (a contraction's k chunks around its
    panels) opens one region, not one per step: every thread runs the serial loop, the
    threaded loop is an orphaned `omp for` (its barrier orders the steps), the serial statement
    an `omp single`. Every step adds into the same cells, so the order matters: bit-identical
    to the interpreter."""
    x, acc, s = Tnode("x", (48, 40)), Tnode("acc", (48, 40)), Tnode("s", (3,))
    r, i, j = get_symbol("r"), get_symbol("i"), get_symbol("j")
    scaled = ll.Binop(ops.Binop.MUL, ll.Get(x, it(i, j)), ll.Get(s, it(r)))
    step = ll.ForLoop(i, 0, 47, ll.ForLoop(j, 0, 39, ll.Set(acc, it(i, j), ll.Binop(
        ops.Binop.ADD, ll.Binop(ops.Binop.MUL, ll.Get(acc, it(i, j)), ll.Constant(0.5)), scaled))), parallel=True)
    first = ll.Set(s, it(r), ll.Binop(ops.Binop.ADD, ll.Get(x, (Iterator(r), FixedIdx(0))), ll.Constant(1.0)))
    code = ll.seq(ll.ZeroOut(acc), ll.ForLoop(r, 0, 2, ll.seq(first, step)))
    ins = inputs_for(x)
    source, want = check_threads(code, ins, [acc, s], "steps")
    body = source[source.index("void steps"):]
    assert _pragmas(body) == [REGION, "#pragma omp single", FOR]
    assert re.search(r"  #pragma omp parallel num_threads\(2\)\n  \{\n    for \(int r0 = 0; r0 < 3; \+\+r0\) \{\n"
                     r"      #pragma omp single\n", body)
    expect = np.zeros((48, 40))
    for k in range(3):
        expect = expect * 0.5 + ins[x] * (ins[x][k, 0] + 1.0)
    np.testing.assert_allclose(want[acc], expect, rtol=1e-5, atol=1e-6)
