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

from einjit.backends import parallel_loops, sum_fission
from einjit.backends.c_syntax import C_SYNTAX
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, GatherIdx, Iterator, get_symbol, make_affine
from einjit.ir.tnode import Tnode

REGION = "#pragma omp parallel num_threads(2)"
FOR = "#pragma omp for schedule(dynamic, 24)"
"""48 rows of 40 cells: 24 rows (960 assignments) per hand-out, an even share per thread."""


def options(threads: int, min_work: int = 1, outline: int = 0, routine_min_work: int | None = 0) -> cc.CcOptions:
    """Routines of any size go on threads (`routine_min_work` 0) unless a test says otherwise."""
    return cc.CcOptions(threads=threads, syntax=replace(C_SYNTAX, thread_min_work=min_work,
                                                        thread_routine_min_work=routine_min_work),
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


def test_a_routine_of_small_nests_stays_serial_whole():
    """Two nests of 960 assignments each go on threads one by one (min_work 256), but not
    together when they run under `ROUTINE_WORK_FACTOR` times min_work each on average (1024
    here): each would cost a barrier, and the call a wake-up of the threads, for less than
    that. A loop the scheduler put on threads (a contraction of a millisecond or more) keeps
    them, and the routine's other nests theirs. Results are those of the interpreter."""
    x, y, mid, out = (Tnode(n, (40, 24)) for n in ("x", "y", "mid", "out"))
    first, second = pointwise(x, mid, 0.5, y), pointwise(mid, out, 2.0)
    code = ll.seq(first, second)
    assert parallel_loops.ROUTINE_WORK_FACTOR * 256 > 960 > parallel_loops.ROUTINE_WORK_FACTOR * 64

    def threaded(stmt: ll.LLStmt) -> list[bool]:
        return [s.parallel for s in ll.flatten(stmt) if isinstance(s, ll.ForLoop)]

    assert threaded(parallel_loops.thread_nests(code, 2, 256)) == [False, False]
    assert threaded(parallel_loops.thread_nests(code, 2, 256, routine_min_work=0)) == [True, True]
    assert threaded(parallel_loops.thread_nests(code, 2, 64)) == [True, True]
    assert threaded(parallel_loops.thread_nests(ll.seq(first, replace(second, parallel=True)), 2, 256)) == [True, True]
    ins = inputs_for(x, y)
    source, want = check_threads(code, ins, [out], "small_routine", min_work=256, routine_min_work=None)
    assert "omp" not in source
    np.testing.assert_allclose(want[out], 2 * np.maximum(ins[x] * 0.5 + ins[y], 0), rtol=1e-6)
    source, _ = check_threads(code, ins, [out], "small_routine", min_work=64, routine_min_work=None)
    assert REGION in source


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


def batch_blocks(two_sets: bool) -> tuple[ll.LLStmt, Tnode, Tnode, tuple[Tnode, ...]]:
    """`out[16*p + l, j] += x[r, 16*p + l, j]` summed over an outer `r`: the batch axis is
    written in blocks of 16 (`p`), as a channel-blocked convolution writes it. With
    `two_sets`, `out2` gets the running value too (the nest's body is two statements)."""
    x, out, out2 = Tnode("x", (5, 32, 64)), Tnode("out", (32, 64)), Tnode("out2", (32, 64))
    r, p, lane, j = (get_symbol(n) for n in ("r", "p", "l", "j"))
    row = make_affine([(16, p), (1, lane)])
    cell = (row, Iterator(j))
    add = ll.Set(out, cell, ll.Binop(ops.Binop.ADD, ll.Get(out, cell), ll.Get(x, (Iterator(r), row, Iterator(j)))))
    body: ll.LLStmt = ll.seq(add, ll.Set(out2, cell, ll.Get(out, cell))) if two_sets else add
    nest = ll.ForLoop(r, 0, 4, ll.ForLoop(p, 0, 1, ll.ForLoop(lane, 0, 15, ll.ForLoop(j, 0, 63, body))))
    return ll.seq(ll.ZeroOut(out), nest), x, out, (out2,) if two_sets else ()


@pytest.mark.parametrize("two_sets", [False, True], ids=["one statement", "two statements"])
def test_a_loop_over_blocks_of_an_axis_moves_outermost(two_sets):
    """`p` slices the batch axis in blocks of 16 (`16*p + l`, `l` < 16), so its iterations
    touch disjoint cells whatever `r` is: it moves outside the summed `r` (one fork-join),
    and each cell still adds its terms in `r` order. `l` is parallel too, but its rows of 64
    floats would put neighbouring iterations on one cache line; `p`'s 16 rows would not."""
    code, x, out, more = batch_blocks(two_sets)
    nest = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1)))[1]
    assert nest.parallel and nest.index.name == "p"
    assert nest.body.index.name == "r" and not nest.body.parallel
    ins = inputs_for(x)
    source, want = check_threads(code, ins, [out, *more], f"blocks{int(two_sets)}")
    assert source.count("#pragma omp parallel for schedule(dynamic) num_threads(2)") == 1
    np.testing.assert_allclose(want[out], ins[x].astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)


def test_a_block_index_reaching_the_next_block_is_not_parallel():
    """`out[16*p + l]` with `l` up to 16 reaches the first row of the next block: `p`'s
    iterations share cells, so it is not parallel (nor is `l`: rows collide across `p`)."""
    x, out = Tnode("x", (48,)), Tnode("out", (48,))
    p, lane = get_symbol("p"), get_symbol("l")
    row = (make_affine([(16, p), (1, lane)]),)
    add = ll.Set(out, row, ll.Binop(ops.Binop.ADD, ll.Get(out, row), ll.Get(x, row)))
    loop = ll.ForLoop(p, 0, 1, ll.ForLoop(lane, 0, 16, add))
    assert not parallel_loops.is_parallel(loop, set())
    assert parallel_loops.is_parallel(replace(loop, body=replace(loop.body, to_=15)), set())


def test_uneven_rows_collapse_with_the_loop_inside():
    """3 x 3 kernel offsets on 2 threads: 3 rows keep one thread busy a third of the time
    alone, 9 (rows x columns, `collapse(2)`) split 5 to 4, one at a time (each 2048 cells); the
    vector loop inside stays."""
    x, out = Tnode("x", (3, 3, 2048)), Tnode("out", (3, 3, 2048))
    a, b, j = get_symbol("a"), get_symbol("b"), get_symbol("j")
    set_ = ll.Set(out, it(a, b, j), ll.Binop(ops.Binop.MUL, ll.Get(x, it(a, b, j)), ll.Constant(2.0)))
    code = ll.ForLoop(a, 0, 2, ll.ForLoop(b, 0, 2, ll.ForLoop(j, 0, 2047, set_)))
    nest = parallel_loops.thread_nests(code, 2, 1)
    assert isinstance(nest, ll.ForLoop) and [nest.parallel, nest.body.parallel, nest.body.body.parallel] == \
        [True, True, False]
    ins = inputs_for(x)
    source, want = check_threads(code, ins, [out], "collapse")
    assert "#pragma omp parallel for schedule(dynamic) collapse(2) num_threads(2)" in source
    np.testing.assert_array_equal(want[out], ins[x] * np.float32(2.0))


def test_statements_under_a_loop_of_one_iteration_thread_one_by_one():
    """A weight gradient's nest is a loop of one iteration around a pack and the sums that
    read it: with no parallel loop around them, each nest inside goes on threads by itself,
    both in one region around the serial loop (`omp for`s whose barrier orders `b` after `a`)."""
    x, a, b = Tnode("x", (48, 40)), Tnode("a", (48, 40)), Tnode("b", (48, 40))
    code = ll.ForLoop(get_symbol("q"), 0, 0, ll.seq(pointwise(x, a, 2.0), pointwise(a, b, 3.0)))
    nest = parallel_loops.thread_nests(code, 2, 1)
    assert isinstance(nest, ll.ForLoop) and not nest.parallel
    assert [s.parallel for s in ll.flatten(nest.body)] == [True, True]
    ins = inputs_for(x)
    source, want = check_threads(code, ins, [a, b], "one_iteration")
    body = source[source.index("void one_iteration"):]
    assert _pragmas(body) == [REGION, FOR, FOR]
    np.testing.assert_allclose(want[b], np.maximum(3 * np.maximum(2 * ins[x], 0), 0), rtol=1e-6)


def test_a_compiler_barrier_stays_in_the_region_after_a_thread_barrier():
    """Where the scratch planner lets an array start to live in another's bytes, every thread
    must be done with the old one: the region goes on, with `omp barrier` before the compiler
    barrier, and the nest before it needs no barrier of its own."""
    x, a, b = Tnode("x", (48, 40)), Tnode("a", (48, 40)), Tnode("b", (48, 40))
    fence = ll.StagedCompilation(lambda: parallel_loops.COMPILER_BARRIER)
    code = ll.seq(pointwise(x, a, 2.0), fence, pointwise(x, b, 3.0))
    top = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1)))
    [region] = parallel_loops.shared_regions(top)
    assert [(u.role, u.nowait) for u in region.units] == [("for", True), ("sync", True), ("for", True)]
    ins = inputs_for(x)
    want = interpret.run(ll.seq(pointwise(x, a, 2.0), pointwise(x, b, 3.0)), {x: ins[x].copy()})
    for threads in (1, 2):
        ctx = run_c(code, ins, options(threads), "fence")
        for out in (a, b):
            np.testing.assert_array_equal(ctx.array(out), want[out], err_msg=f"{out.name} at {threads} threads")
    body = _functions(cc.compile_proc(code, name="fence", options=options(2)).source, "fence")["fence"]
    assert _pragmas(body) == [REGION, "#pragma omp barrier"]
    assert body.index("#pragma omp barrier") < body.index(parallel_loops.COMPILER_BARRIER)


def test_a_large_zero_fill_in_a_region_is_shared_in_pieces():
    """A 256 KB zero fill between two threaded nests: the threads clear 64 KB pieces of it
    (the last one shorter) instead of one thread clearing it all while the other waits; the
    nest that adds into it waits for the fill, the one before does not."""
    x, a, z = Tnode("x", (48, 40)), Tnode("a", (48, 40)), Tnode("big", (130, 512))
    i, j = get_symbol("i"), get_symbol("j")
    cell = it(i, j)
    bump = ll.Set(z, cell, ll.Binop(ops.Binop.ADD, ll.Get(z, cell), ll.Constant(1.5)))
    code = ll.seq(pointwise(x, a, 2.0), ll.ZeroOut(z), ll.ForLoop(i, 0, 129, ll.ForLoop(j, 0, 511, bump)))
    top = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1)))
    [region] = parallel_loops.shared_regions(top)
    assert [(u.role, u.nowait) for u in region.units] == [("for", True), ("zero", False), ("for", True)]
    source, want = check_threads(code, inputs_for(x), [a, z], "zero_fill")
    body = _functions(source, "zero_fill")["zero_fill"]
    assert _pragmas(body) == [REGION, "#pragma omp for schedule(dynamic)"]
    assert "for (int z = 0; z < 5; ++z) memset(big + z * 16384, 0, sizeof(float) * (z < 4 ? 16384 : 1024));" in body
    np.testing.assert_array_equal(want[z], np.full((130, 512), 1.5, np.float32))


def test_a_large_zero_fill_before_the_first_threaded_nest_joins_its_region():
    """The fill of an array the region's first nest adds into (a convolution's output) is the
    region's first unit, shared in pieces, with a barrier before the nest; a small fill before
    it stays outside (one thread's `memset`)."""
    x, a, z, small = Tnode("x", (48, 40)), Tnode("a", (48, 40)), Tnode("big", (130, 512)), Tnode("small", (8,))
    i, j = get_symbol("i"), get_symbol("j")
    cell = it(i, j)
    bump = ll.Set(z, cell, ll.Binop(ops.Binop.ADD, ll.Get(z, cell), ll.Constant(1.5)))
    code = ll.seq(ll.ZeroOut(small), ll.ZeroOut(z), ll.ForLoop(i, 0, 129, ll.ForLoop(j, 0, 511, bump)),
                  pointwise(x, a, 2.0))
    top = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1)))
    [region] = parallel_loops.shared_regions(top)
    assert (region.start, region.stop) == (1, 4)
    assert [(u.role, u.nowait) for u in region.units] == [("zero", False), ("for", True), ("for", True)]
    source, want = check_threads(code, inputs_for(x), [a, z, small], "leading_zero_fill")
    body = _functions(source, "leading_zero_fill")["leading_zero_fill"]
    assert body.index("memset(small") < body.index(REGION) < body.index("memset(big + z * 16384")
    np.testing.assert_array_equal(want[z], np.full((130, 512), 1.5, np.float32))


def bias_backward(row_sum: bool) -> tuple[ll.LLStmt, tuple[Tnode, ...], tuple[Tnode, ...]]:
    """A linear layer's backward fused with its bias gradient, as the scheduler leaves it: over
    rows (b, t), `h = g * w`, `db += h`, `dx += h`, each an innermost loop over the 64 columns.
    With `row_sum`, `s[b, t] += h` sums over the columns too."""
    g, w, dx = Tnode("g", (6, 10, 64)), Tnode("w", (64,)), Tnode("dx", (6, 10, 64))
    h, db, s = Tnode("h", (6, 10, 64)), Tnode("db", (64,)), Tnode("s", (6, 10))
    b, t = get_symbol("b"), get_symbol("t")
    j1, j2, j3, j4 = (get_symbol("j") for _ in range(4))
    stmts = [ll.ForLoop(j1, 0, 63, ll.Set(h, it(b, t, j1), ll.Binop(ops.Binop.MUL, ll.Get(g, it(b, t, j1)),
                                                                      ll.Get(w, it(j1))))),
             ll.ForLoop(j2, 0, 63, ll.Set(db, it(j2), ll.Binop(ops.Binop.ADD, ll.Get(db, it(j2)),
                                                                ll.Get(h, it(b, t, j2))))),
             ll.ForLoop(j3, 0, 63, ll.Set(dx, it(b, t, j3), ll.Binop(ops.Binop.ADD, ll.Get(dx, it(b, t, j3)),
                                                                      ll.Get(h, it(b, t, j3)))))]
    if row_sum:
        stmts.append(ll.ForLoop(j4, 0, 63, ll.Set(s, it(b, t), ll.Binop(ops.Binop.ADD, ll.Get(s, it(b, t)),
                                                                         ll.Get(h, it(b, t, j4))))))
    nest = ll.ForLoop(b, 0, 5, ll.ForLoop(t, 0, 9, ll.seq(*stmts)))
    zeros = [ll.ZeroOut(db)] + ([ll.ZeroOut(s)] if row_sum else [])
    return ll.seq(*zeros, nest), (g, w, dx), (h, db, dx) + ((s,) if row_sum else ())


def test_column_loops_under_summed_rows_go_to_threads_in_vector_chunks():
    """The rows are summed into `db`, so no loop of the nest's chain is parallel; the columns
    are, in every statement: chunks of 8 columns go to threads (8 chunks on 2 threads), each
    running the three statements on its columns over all rows, every cell updated in the
    nest's order (bit-identical to the interpreter at 1 and 2 threads)."""
    code, ins_nodes, outs = bias_backward(row_sum=False)
    nest = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1024, 0)))[1]
    assert nest.parallel and (nest.from_, nest.to_) == (0, 7)
    rows = nest.body
    assert [rows.index.name, rows.body.index.name] == ["b", "t"] and not rows.parallel and not rows.body.parallel
    chunks = list(ll.flatten(rows.body.body))
    assert [(lp.to_, lp.parallel) for lp in chunks] == [(7, False)] * 3
    ins = inputs_for(*ins_nodes)
    source, want = check_threads(code, ins, outs, "columns", min_work=1024)
    # 1440 assignments a chunk: two at a time (`parallel_loops.chunk`)
    assert _pragmas(source) == ["#pragma omp parallel for schedule(dynamic, 2) num_threads(2)"]
    h = ins[ins_nodes[0]] * ins[ins_nodes[1]]
    np.testing.assert_allclose(want[outs[1]], h.astype(np.float64).sum((0, 1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(want[outs[2]], ins[ins_nodes[2]] + h)


def test_a_sum_over_the_columns_moves_the_column_sum_after_the_rows():
    """`s[b, t]` adds every column of a row, so chunks of columns would write one cell from two
    threads; instead `db += h` moves into a nest of its own after the rest
    (`sum_fission.split`): the rest goes on threads over its rows, the sum over chunks of its
    columns, each cell of `db` still added in the order of the rows (bit-identical)."""
    code, ins_nodes, outs = bias_backward(row_sum=True)
    top = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1024, 0)))
    rows, sums = top[2:]
    assert rows.parallel and (rows.index.name, rows.to_) == ("b", 5)
    (g, w, dx), (h, db, _, s) = ins_nodes, outs
    assert set(ll.nodes_of(rows)) == {g, w, h, dx, s}
    assert sums.parallel and set(ll.nodes_of(sums)) == {db, h}
    [region] = parallel_loops.shared_regions(top)
    assert [(u.role, u.nowait) for u in region.units] == [("for", False), ("for", True)]
    source, want = check_threads(code, inputs_for(*ins_nodes), outs, "row_sum", min_work=1024)
    assert source.count("#pragma omp for") == 2
    np.testing.assert_allclose(want[s], want[h].astype(np.float64).sum(2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(want[db], want[h].astype(np.float64).sum((0, 1)), rtol=1e-5, atol=1e-5)


def _fused_bias_backward(row_buffer: bool) -> tuple[ll.LLStmt, dict, tuple[Tnode, ...]]:
    """`bias_backward` as loop fusion leaves it: `h = g * w`, `db += h` and `dx += h` in one
    loop over the columns, beside a row sum `s[b, t] += h`. With `row_buffer`, `h` is one row
    `h[j]` rewritten for every (b, t) (`row_buffers`), which a sum moved after the rows would
    read only the last of."""
    g, w, dx = Tnode("g", (6, 10, 64)), Tnode("w", (64,)), Tnode("dx", (6, 10, 64))
    h, db, s = Tnode("h", (64,) if row_buffer else (6, 10, 64)), Tnode("db", (64,)), Tnode("s", (6, 10))
    b, t, j1, j2 = get_symbol("b"), get_symbol("t"), get_symbol("j"), get_symbol("j")
    at_h = it(j1) if row_buffer else it(b, t, j1)
    row = ll.ForLoop(j1, 0, 63, ll.seq(
        ll.Set(h, at_h, ll.Binop(ops.Binop.MUL, ll.Get(g, it(b, t, j1)), ll.Get(w, it(j1)))),
        ll.Set(db, it(j1), ll.Binop(ops.Binop.ADD, ll.Get(db, it(j1)), ll.Get(h, at_h))),
        ll.Set(dx, it(b, t, j1), ll.Binop(ops.Binop.ADD, ll.Get(dx, it(b, t, j1)), ll.Get(h, at_h)))))
    at_h2 = it(j2) if row_buffer else it(b, t, j2)
    total = ll.ForLoop(j2, 0, 63, ll.Set(s, it(b, t), ll.Binop(ops.Binop.ADD, ll.Get(s, it(b, t)), ll.Get(h, at_h2))))
    nest = ll.ForLoop(b, 0, 5, ll.ForLoop(t, 0, 9, ll.seq(row, total)))
    return ll.seq(ll.ZeroOut(db), ll.ZeroOut(s), nest), inputs_for(g, w, dx), (db, dx, s)


def test_a_column_sum_moves_out_of_the_loop_it_was_fused_into():
    """Fusion put `db += h` in the loop computing `h` and `dx`: the sum alone moves, into a copy
    of that loop after the rows (`sum_fission._sums_of`), the rows go on threads, and every
    cell is bit-identical to the interpreter at 1 and 2 threads."""
    code, ins, outs = _fused_bias_backward(row_buffer=False)
    db, dx, s = outs
    parts = sum_fission.split(list(ll.flatten(code))[2])
    assert parts is not None
    rest, sums = parts
    assert [[st.tn for st in ll.iter_stmts(n) if isinstance(st, ll.Set)] for n in sums] == [[db]]
    assert [st.tn for st in ll.iter_stmts(rest) if isinstance(st, ll.Set)][1:] == [dx, s]
    top = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1024, 0)))
    assert top[2].parallel and db not in ll.nodes_of(top[2]) and top[3].parallel and db in ll.nodes_of(top[3])
    _, want = check_threads(code, ins, outs, "fused_bias", min_work=1024)
    g, w, dx0 = ins.values()
    h = g * w
    np.testing.assert_allclose(want[db], h.astype(np.float64).sum((0, 1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(want[dx], dx0 + h)


def test_a_column_sum_of_a_row_buffer_stays_in_its_loop():
    """`db += h[j]` reads a row rewritten for every (b, t): moved after the rows it would add the
    last row 60 times, so nothing moves and the nest stays on one thread."""
    code, _, _ = _fused_bias_backward(row_buffer=True)
    assert sum_fission.split(list(ll.flatten(code))[2]) is None


def _sum_then(after: str) -> ll.LLStmt:
    """`db += h` over rows with a row sum beside it, then `after`: "write" changes `h` after the
    sum has read it; "read" reads `db` in the nest."""
    h, db, s, g = Tnode("h", (6, 10, 64)), Tnode("db", (64,)), Tnode("s", (6, 10)), Tnode("g", (6, 10, 64))
    b, t = get_symbol("b"), get_symbol("t")
    j1, j2, j3, j4 = (get_symbol("j") for _ in range(4))
    stmts = [ll.ForLoop(j1, 0, 63, ll.Set(h, it(b, t, j1), ll.Binop(ops.Binop.MUL, ll.Get(g, it(b, t, j1)),
                                                                      ll.Get(g, it(b, t, j1))))),
             ll.ForLoop(j2, 0, 63, ll.Set(db, it(j2), ll.Binop(ops.Binop.ADD, ll.Get(db, it(j2)),
                                                                ll.Get(h, it(b, t, j2))))),
             ll.ForLoop(j3, 0, 63, ll.Set(s, it(b, t), ll.Binop(ops.Binop.ADD, ll.Get(s, it(b, t)),
                                                                 ll.Get(h, it(b, t, j3)))))]
    last = ll.Get(h, it(b, t, j4)) if after == "write" else ll.Get(db, it(j4))
    stmts.append(ll.ForLoop(j4, 0, 63, ll.Set(h, it(b, t, j4), ll.Binop(ops.Binop.ADD, last, ll.Constant(1.0)))))
    return ll.seq(ll.ZeroOut(db), ll.ZeroOut(s), ll.ForLoop(b, 0, 5, ll.ForLoop(t, 0, 9, ll.seq(*stmts))))


@pytest.mark.parametrize("after", ["write", "read"])
def test_a_column_sum_stays_where_the_nest_changes_what_it_reads_or_reads_its_target(after):
    """Moved after the nest, the sum would read `h` after its last write, not before it
    ("write"), or the nest would read `db` before the sum ("read"): it stays, the nest serial."""
    code = _sum_then(after)
    assert sum_fission.split(list(ll.flatten(code))[2]) is None
    threaded = parallel_loops.thread_nests(code, 2, 1024, 0)
    assert not any(isinstance(s, ll.ForLoop) and s.parallel for s in ll.iter_stmts(threaded))


def _two_passes(row_indexed: bool) -> tuple[ll.LLStmt, dict, tuple[Tnode, ...]]:
    """A LayerNorm backward's two passes over the rows of each `b`: the first computes
    `h[b, t, j]` and a row sum `s[b, t]`, the second sums `h * s` into `db[j]`. Without
    `row_indexed`, the first pass writes `h[0, t, j]` (every `b` the same cells)."""
    g, h, s, db = Tnode("g", (6, 10, 64)), Tnode("h", (6, 10, 64)), Tnode("s", (6, 10)), Tnode("db", (64,))
    b, t1, t2 = get_symbol("b"), get_symbol("t"), get_symbol("t")
    j1, j2, j3 = (get_symbol("j") for _ in range(3))
    at_h = it(b, t1, j1) if row_indexed else (FixedIdx(0), Iterator(t1), Iterator(j1))
    first = ll.seq(ll.ForLoop(j1, 0, 63, ll.Set(h, at_h, ll.Binop(ops.Binop.MUL, ll.Get(g, it(b, t1, j1)),
                                                                      ll.Get(g, it(b, t1, j1))))),
                   ll.ForLoop(j2, 0, 63, ll.Set(s, it(b, t1), ll.Binop(ops.Binop.ADD, ll.Get(s, it(b, t1)),
                                                                       ll.Get(g, it(b, t1, j2))))))
    term = ll.Binop(ops.Binop.MUL, ll.Get(h, it(b, t2, j3)), ll.Get(s, it(b, t2)))
    second = ll.ForLoop(j3, 0, 63, ll.Set(db, it(j3), ll.Binop(ops.Binop.ADD, ll.Get(db, it(j3)), term)))
    nest = ll.ForLoop(b, 0, 5, ll.seq(ll.ForLoop(t1, 0, 9, first), ll.ForLoop(t2, 0, 9, second)))
    return ll.seq(ll.ZeroOut(h), ll.ZeroOut(s), ll.ZeroOut(db), nest), inputs_for(g), (h, s, db)


def test_a_sum_reading_an_earlier_pass_over_the_rows_moves_after_them():
    """`db += h * s` reads what the first pass over the rows of the same `b` wrote, in cells
    of that `b`: it moves, the passes go on threads over b, bit-identical at 1 and 2 threads."""
    code, ins, outs = _two_passes(row_indexed=True)
    top = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1024, 0)))
    rows, sums = top[3:]
    assert rows.parallel and sums.parallel and outs[2] not in ll.nodes_of(rows)
    _, want = check_threads(code, ins, outs, "two_passes", min_work=1024)
    h, s, db = (want[tn].astype(np.float64) for tn in outs)
    np.testing.assert_allclose(want[outs[2]], (h * s[:, :, None]).sum((0, 1)), rtol=1e-4, atol=1e-4)


def test_a_sum_stays_where_an_earlier_pass_writes_cells_of_every_row():
    """`h[0, t, j]` is written again for every `b`: after the nest it holds the last b's
    values, not those the sum read in each b."""
    code, _, _ = _two_passes(row_indexed=False)
    assert sum_fission.split(list(ll.flatten(code))[3]) is None


def _embedding_backward(ids_written: bool) -> tuple[ll.LLStmt, dict, tuple[Tnode, ...], Tnode]:
    """Over rows (b, t): `h = g * g`, a row sum `s[b, t] += h`, the position embedding's
    gradient `dp[t, j] += h` (summed over b only) and the token embedding's scatter
    `dw[ids[b, t], j] += h`. With `ids_written`, the nest also writes the index array."""
    g, h, s = Tnode("g", (6, 10, 64)), Tnode("h", (6, 10, 64)), Tnode("s", (6, 10))
    dp, dw, ids = Tnode("dp", (10, 64)), Tnode("dw", (5, 64)), Tnode("ids", (6, 10), ops.int32)
    b, t = get_symbol("b"), get_symbol("t")
    j1, j2, j3, j4 = (get_symbol("j") for _ in range(4))

    def add(tn, at, j):
        return ll.Set(tn, at, ll.Binop(ops.Binop.ADD, ll.Get(tn, at), ll.Get(h, it(b, t, j))))

    token = (GatherIdx(ids, it(b, t), 5), Iterator(j4))
    stmts = [ll.ForLoop(j1, 0, 63, ll.Set(h, it(b, t, j1), ll.Binop(ops.Binop.MUL, ll.Get(g, it(b, t, j1)),
                                                                      ll.Get(g, it(b, t, j1))))),
             ll.ForLoop(j2, 0, 63, add(s, it(b, t), j2)),
             ll.ForLoop(j3, 0, 63, add(dp, it(t, j3), j3)),
             ll.ForLoop(j4, 0, 63, add(dw, token, j4))]
    if ids_written:
        stmts.append(ll.Set(ids, it(b, t), ll.Get(ids, it(b, t))))
    nest = ll.ForLoop(b, 0, 5, ll.ForLoop(t, 0, 9, ll.seq(*stmts)))
    rng = np.random.default_rng(3)
    ins = {g: rng.standard_normal(g.dims).astype(np.float32), ids: rng.integers(0, 5, ids.dims).astype(np.int32)}
    return ll.seq(ll.ZeroOut(s), ll.ZeroOut(dp), ll.ZeroOut(dw), nest), ins, (h, s, dp, dw), ids


def test_a_scatter_and_a_sum_over_one_row_loop_move_after_the_rows():
    """The last LayerNorm backward of a GPT step ends in the embeddings' gradients: `dp[t, j]`
    (summed over b) and a scatter into `dw` through the token ids. Both move after the rest,
    which goes on threads over b; they go on threads over chunks of their columns, every cell
    updated in the order of the rows (bit-identical to the interpreter at 1 and 2 threads)."""
    code, ins, outs, ids = _embedding_backward(ids_written=False)
    top = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1024, 0)))
    rows, sums = top[3:]
    assert rows.parallel and rows.index.name == "b"
    h, s, dp, dw = outs
    assert set(ll.nodes_of(sums)) >= {dp, dw, h} and s not in ll.nodes_of(sums) and sums.parallel
    source, want = check_threads(code, ins, outs, "embedding_backward", min_work=1024)
    assert source.count("#pragma omp for") == 2
    hv = want[h].astype(np.float64)
    np.testing.assert_allclose(want[dp], hv.sum(0), rtol=1e-5, atol=1e-5)
    expect = np.zeros((5, 64))
    np.add.at(expect, ins[ids].reshape(-1), hv.reshape(-1, 64))
    np.testing.assert_allclose(want[dw], expect, rtol=1e-5, atol=1e-5)


def test_a_scatter_stays_where_the_nest_writes_its_index_array():
    """`ids` changes in the nest: moved after it, the scatter would read the changed ids."""
    code, _, (h, s, dp, dw), ids = _embedding_backward(ids_written=True)
    parts = sum_fission.split(list(ll.flatten(code))[3])
    assert parts is not None
    rest, [sums] = parts
    assert dw in ll.nodes_of(rest) and dw not in ll.nodes_of(sums) and dp in ll.nodes_of(sums)


def weight_gradient() -> tuple[ll.LLStmt, tuple[Tnode, ...], Tnode, Tnode]:
    """`dw[j, c] = sum_r y[r, j] x[r, c]` as the scheduler leaves a weight gradient: chunks
    `kt` of the summed rows, each packing its rows of `x` into a scheduler local `p`, then the
    panels `j` (on threads) reading the whole pack."""
    from einjit.ir.sched import nests
    x, y, dw = Tnode("x", (64, 40)), Tnode("y", (64, 48)), Tnode("dw", (48, 40))
    p = nests.scheduler_local("pack", (32, 40), ops.single)
    kt, r, c, j, r2, c2 = (get_symbol(n) for n in ("kt", "r", "c", "j", "r", "c"))
    row = make_affine([(32, kt), (1, r)])
    pack = ll.ForLoop(r, 0, 31, ll.ForLoop(c, 0, 39, ll.Set(p, it(r, c), ll.Get(x, (row, Iterator(c))))))
    row2 = make_affine([(32, kt), (1, r2)])
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(y, (row2, Iterator(j))), ll.Get(p, it(r2, c2)), ll.Get(dw, it(j, c2)))
    panels = ll.ForLoop(j, 0, 47, ll.ForLoop(r2, 0, 31, ll.ForLoop(c2, 0, 39, ll.Set(dw, it(j, c2), fma))),
                        parallel=True)
    return ll.seq(ll.ZeroOut(dw), ll.ForLoop(kt, 0, 1, ll.seq(pack, panels))), (x, y), dw, p


def test_a_weight_gradients_pack_is_shared_out_beside_its_panels():
    """The pack under the serial chunk loop was one thread's `omp single`: it becomes an `omp
    for` over its rows, every thread writing its rows of one shared pack (it is not made
    private: the panels after the barrier read all of it). Bit-identical to the interpreter."""
    code, ins_nodes, dw, p = weight_gradient()
    nest = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1)))[1]
    pack = [s for s in ll.flatten(nest.body) if isinstance(s, ll.ForLoop)][0]
    assert not nest.parallel and pack.parallel and parallel_loops.sliced_nodes(pack) == {p}
    ins = inputs_for(*ins_nodes)
    source, want = check_threads(code, ins, [dw], "wgrad")
    body = source[source.index("void wgrad"):]
    # 16 pack rows of 40 cells a hand-out; 2 panels of 1280 multiply-adds
    assert _pragmas(body) == [REGION, "#pragma omp for schedule(dynamic, 16)", "#pragma omp for schedule(dynamic, 2)"]
    before, region = body.split(REGION)
    assert "float pack[1280]" in before and "float pack" not in region
    np.testing.assert_allclose(want[dw], ins[ins_nodes[1]].T.astype(np.float64) @ ins[ins_nodes[0]],
                               rtol=1e-5, atol=1e-5)


def test_a_pack_the_next_nest_reads_whole_goes_on_threads_in_its_region():
    """A panel pack hoisted before its contraction (a scheduler local two top-level nests
    touch) ran on one thread while the other waited: it goes on threads over its rows, every
    thread writing its rows of the one pack the contraction then reads whole, in the
    contraction's region, with a barrier between them. Bit-identical to the interpreter."""
    from einjit.ir.sched import nests
    x, y, out = Tnode("x", (64, 40)), Tnode("y", (64, 48)), Tnode("out", (48, 40))
    p = nests.scheduler_local("pack", (64, 40), ops.single)
    r, c, j, r2, c2 = (get_symbol(n) for n in ("r", "c", "j", "r", "c"))
    pack = ll.ForLoop(r, 0, 63, ll.ForLoop(c, 0, 39, ll.Set(p, it(r, c), ll.Get(x, it(r, c)))))
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(y, it(r2, j)), ll.Get(p, it(r2, c2)), ll.Get(out, it(j, c2)))
    panels = ll.ForLoop(j, 0, 47, ll.ForLoop(r2, 0, 63, ll.ForLoop(c2, 0, 39, ll.Set(out, it(j, c2), fma))),
                        parallel=True)
    code = ll.seq(ll.ZeroOut(out), pack, panels)
    top = list(ll.flatten(parallel_loops.thread_nests(code, 2, 1)))
    assert top[1].parallel and parallel_loops.sliced_nodes(top[1]) == {p}
    [region] = parallel_loops.shared_regions(top)
    assert [(u.role, u.nowait) for u in region.units] == [("for", False), ("for", True)]
    ins = inputs_for(x, y)
    source, want = check_threads(code, ins, [out], "packed")
    functions = _functions(source, "packed")
    body = functions.pop("packed")
    assert _pragmas(body) == [REGION]
    # 32 pack rows of 40 cells a hand-out, then the panels; the barrier after the pack orders them
    assert [_pragmas(f) for f in functions.values()] == [["#pragma omp for schedule(dynamic, 32)"],
                                                         ["#pragma omp for schedule(dynamic) nowait"]]
    before, region = body.split(REGION)
    assert "float pack[2560]" in before and "float pack" not in region + "".join(functions.values())
    np.testing.assert_allclose(want[out], ins[y].T.astype(np.float64) @ ins[x], rtol=1e-5, atol=1e-5)
