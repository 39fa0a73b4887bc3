"""The row buffer stage (`ir/sched/row_buffers.py`): a node one fused nest writes and reads
within each row's iteration becomes a local of one row, bit for bit the same values under the
interpreter and gcc at one and two threads; nodes read elsewhere, across rows or before their
row is written stay whole arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einjit.backends.cc import toolchain as cc
from einjit.ir import interpret, ops, optimize
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, Iterator, get_symbol
from einjit.ir.optimize import VirtualizeSettings, optimize_proc
from einjit.ir.sched.fusion import fuse_loops
from einjit.ir.sched.row_buffers import row_buffers
from einjit.ir.tnode import LOCAL, MATERIALIZED, Tnode
from test_schedule import run_in_c


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def nest(out, body_of, dims):
    syms = [get_symbol(c) for c in "ij"[:len(dims)]]
    body = ll.Set(out, it(*syms), body_of(*syms))
    for s, n in reversed(list(zip(syms, dims, strict=True))):
        body = ll.ForLoop(s, 0, n - 1, body)
    return body


def centred_square(n, m, c_mode=LOCAL, shifted=False):
    """`y = (x - mean(x))²` by rows, the centred values `c` a node of their own (local unless
    `c_mode` says otherwise); `shifted`: `y` reads the next row's `c` (across rows)."""
    x, mean, y = (Tnode(name, dims, memory_mode=MATERIALIZED) for name, dims in (("x", (n, m)), ("mean", (n,)),
                                                                                  ("y", (n, m))))
    c = Tnode("c", (n, m), memory_mode=c_mode)
    i, k = get_symbol("i"), get_symbol("k")
    add = ll.Binop(ops.Binop.ADD, ll.Get(mean, it(i)), ll.Binop(ops.Binop.MUL, ll.Get(x, it(i, k)),
                                                               ll.Constant(1 / m)))
    mean_nest = ll.ForLoop(i, 0, n - 1, ll.ForLoop(k, 0, m - 1, ll.Set(mean, it(i), add)))
    centred = nest(c, lambda i, j: ll.Binop(ops.Binop.SUB, ll.Get(x, it(i, j)), ll.Get(mean, it(i))), (n, m))
    if shifted:
        def read(i, j):
            return ll.Get(c, (Affine(((1, i),), 1), Iterator(j)))
        square = nest(y, lambda i, j: ll.Binop(ops.Binop.MUL, read(i, j), read(i, j)), (n - 1, m))
    else:
        square = nest(y, lambda i, j: ll.Binop(ops.Binop.MUL, ll.Get(c, it(i, j)), ll.Get(c, it(i, j))), (n, m))
    return ll.seq(ll.ZeroOut(mean), mean_nest, centred, square), x, c, y


def rows_of(code):
    return [tn for tn in ll.nodes_of(code) if tn.label[0] == "row"]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_temporary_becomes_a_local_row(threads):
    n, m = 9, 24
    code, x, c, y = centred_square(n, m)
    fused = fuse_loops(code)
    new = row_buffers(fused)
    assert c not in ll.nodes_of(new) and [tn.dims for tn in rows_of(new)] == [(m,)]
    v = np.random.default_rng(0).standard_normal((n, m)).astype(np.float32)
    want = interpret.run(code, {x: v.copy()})[y]
    np.testing.assert_array_equal(interpret.run(new, {x: v.copy()})[y], want)
    got = run_in_c(new, {x: v}, name=f"row_buffer_{threads}", options=cc.CcOptions(threads=threads)).array(y)
    np.testing.assert_array_equal(got, want)
    centred = v.astype(np.float64) - v.astype(np.float64).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(want, centred ** 2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["materialized", "read elsewhere", "across rows", "not fused", "off"])
def test_nodes_that_stay_whole(case):
    n, m = 6, 8
    code, x, c, y = centred_square(n, m, MATERIALIZED if case == "materialized" else LOCAL,
                                   shifted=case == "across rows")
    if case == "read elsewhere":
        z = Tnode("z", (m, n), memory_mode=MATERIALIZED)  # transposed: a nest fusion keeps apart
        code = ll.seq(code, nest(z, lambda j, i: ll.Get(c, it(i, j)), (m, n)))
    fused = code if case == "not fused" else fuse_loops(code)
    assert row_buffers(fused, local_storage=case != "off") == fused


def test_a_node_read_before_its_row_is_written_stays():
    """`c[i, j] = c[i, j] + x[i, j]` first in each row: the row's old values are read."""
    n, m = 4, 8
    x, c, y = Tnode("x", (n, m), memory_mode=MATERIALIZED), Tnode("c", (n, m), memory_mode=LOCAL), \
        Tnode("y", (n, m), memory_mode=MATERIALIZED)
    acc = nest(c, lambda i, j: ll.Binop(ops.Binop.ADD, ll.Get(c, it(i, j)), ll.Get(x, it(i, j))), (n, m))
    use = nest(y, lambda i, j: ll.Get(c, it(i, j)), (n, m))
    fused = fuse_loops(ll.seq(acc, use))
    assert row_buffers(fused) == fused


def _stages_without_rows():
    return tuple(s for s in optimize.STAGES if s.name != "rows")


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), m=st.sampled_from([8, 32, 96, 160]), machine=st.sampled_from(["avx2", "avx512"]),
       seed=st.integers(0, 2**16))
def test_random_row_sizes_compute_the_same_with_and_without_the_stage(n, m, machine, seed, monkeypatch):
    """Differential through the optimizer (split row sums or not) and gcc: bit-identical with
    and without the stage, and the interpreter's values on the unoptimized code."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    v = np.random.default_rng(seed).standard_normal((n, m)).astype(np.float32)
    results = []
    for on in (True, False):
        if not on:
            monkeypatch.setattr(optimize, "STAGES", _stages_without_rows())
        code, x, c, y = centred_square(n, m)
        llc = optimize_proc(code, name="random_rows", settings=VirtualizeSettings()).llc
        assert bool(rows_of(llc)) == on
        results.append(run_in_c(llc, {x: v}, name="random_rows").array(y).copy())
        monkeypatch.undo()
        monkeypatch.setenv("EINJIT_MACHINE", machine)
    np.testing.assert_array_equal(results[0], results[1])
    code, x, c, y = centred_square(n, m)
    np.testing.assert_allclose(results[0], interpret.run(code, {x: v.copy()})[y], rtol=1e-5, atol=1e-5)


def _layer_norm_grads(on: bool, threads: int, monkeypatch):
    """Gradients of `sum(r * (h + LayerNorm(h)))`, `h = x * s`, as `bench_pointwise` runs it."""
    import einjit as ej
    from einjit import nn, train

    shrunk = []
    if on:
        def counted(code, **kw):
            new = row_buffers(code, **kw)
            shrunk.extend(rows_of(new))
            return new
        monkeypatch.setattr(optimize, "row_buffers", counted)
    else:
        monkeypatch.setattr(optimize, "STAGES", _stages_without_rows())
    rng = np.random.default_rng(4)
    tag = f"{'on' if on else 'off'}{threads}"
    xv, rv = (rng.standard_normal((24, 32)).astype(np.float32) for _ in range(2))
    s = ej.param(f"rows_{tag}_s", (rng.standard_normal(32) * 0.5 + 1).astype(np.float32))
    ln = nn.LayerNorm(32, label=f"rows_{tag}_ln")
    h = ej.ndarray(xv, batch_axes=1, label=f"rows_{tag}_x") * s
    loss = ej.sum((h + ln(h)) * ej.ndarray(rv, batch_axes=1, label=f"rows_{tag}_r"), label=f"rows_{tag}_loss")
    train.init_params(loss, seed=0)
    params = [s, *ln.params()]
    values = [p.value.numpy().copy() for p in params]
    train.to_routine(train.grad_update(loss), name=f"rows_{tag}", options=cc.CcOptions(threads=threads))()
    monkeypatch.undo()
    return [p.grad.numpy().copy() for p in params], values, (xv, rv), len(shrunk)


@pytest.mark.parametrize("threads", [1, 2])
def test_layer_norm_gradients_are_the_same_with_and_without_the_stage(threads, monkeypatch):
    """Differential through the whole optimizer and gcc, at one and two threads: bit-identical
    gradients with and without the stage (which makes row locals here), and PyTorch's."""
    on, values, (xv, rv), shrunk = _layer_norm_grads(True, threads, monkeypatch)
    off, _, _, _ = _layer_norm_grads(False, threads, monkeypatch)
    assert shrunk >= 1
    for got, want in zip(on, off, strict=True):
        np.testing.assert_array_equal(got, want)
    torch = pytest.importorskip("torch")
    ts, tg, tb = (torch.tensor(v, requires_grad=True) for v in values)
    h = torch.tensor(xv) * ts
    y = h + torch.nn.functional.layer_norm(h, (32,), tg, tb)
    (y * torch.tensor(rv)).sum().backward()
    for got, t in zip(on, (ts, tg, tb), strict=True):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_the_stage_follows_fusion():
    names = [s.name for s in optimize.STAGES]
    assert names[names.index("fuse") + 1] == "rows"


def test_a_result_only_one_nest_touches_stays():
    """A row maximum written and never read again is the routine's result, not a temporary."""
    n, h, m = 4, 3, 16
    x, r = Tnode("x", (n, h, m), memory_mode=MATERIALIZED), Tnode("r", (n, h), memory_mode=LOCAL)
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    fill = ll.ForLoop(j, 0, h - 1, ll.Set(r, it(i, j), ll.Constant(ops.Binop.MAX.neutral)))
    step = ll.Binop(ops.Binop.MAX, ll.Get(r, it(i, j)), ll.Get(x, it(i, j, k)))
    acc = ll.ForLoop(j, 0, h - 1, ll.ForLoop(k, 0, m - 1, ll.Set(r, it(i, j), step)))
    code = ll.ForLoop(i, 0, n - 1, ll.seq(fill, acc))
    assert row_buffers(code) == code


@pytest.mark.parametrize("read_last", [True, False])
def test_a_node_read_in_two_passes_over_a_block_keeps_the_block(read_last):
    """LayerNorm backward's shape: `c` written over a block of rows, then each row updated and
    read; shrunk to the block when the second pass reads it last, whole when it writes last."""
    n, b, m = 3, 4, 16
    x, y = Tnode("x", (n, b, m), memory_mode=MATERIALIZED), Tnode("y", (n, b, m), memory_mode=MATERIALIZED)
    c = Tnode("c", (n, b, m), memory_mode=LOCAL)
    i, j, k, j2, k2, k3 = (get_symbol(s) for s in ("i", "j", "k", "j", "k", "k"))
    first = ll.ForLoop(j, 0, b - 1, ll.ForLoop(k, 0, m - 1, ll.Set(c, it(i, j, k), ll.Binop(
        ops.Binop.MUL, ll.Get(x, it(i, j, k)), ll.Constant(2.0)))))
    update = ll.ForLoop(k2, 0, m - 1, ll.Set(c, it(i, j2, k2), ll.Binop(
        ops.Binop.ADD, ll.Get(c, it(i, j2, k2)), ll.Get(x, it(i, j2, k2)))))
    use = ll.ForLoop(k3, 0, m - 1, ll.Set(y, it(i, j2, k3), ll.Binop(
        ops.Binop.MUL, ll.Get(c, it(i, j2, k3)), ll.Get(c, it(i, j2, k3)))))
    second = ll.ForLoop(j2, 0, b - 1, ll.seq(update, use) if read_last else ll.seq(use, update))
    code = ll.ForLoop(i, 0, n - 1, ll.seq(first, second))
    new = row_buffers(code)
    if not read_last:
        assert new == code
        return
    assert c not in ll.nodes_of(new) and [tn.dims for tn in rows_of(new)] == [(b, m)]
    v = np.random.default_rng(5).standard_normal((n, b, m)).astype(np.float32)
    want = interpret.run(code, {x: v.copy()})[y]
    np.testing.assert_array_equal(interpret.run(new, {x: v.copy()})[y], want)
    np.testing.assert_array_equal(run_in_c(new, {x: v}, name="row_block").array(y), want)
    np.testing.assert_allclose(want, (3 * v) ** 2, rtol=1e-6)


def broadcast_then_read(n, m, accumulate=False):
    """`b[i, k] := s[i] * 0.5` (one value along the row, as LayerNorm's backward broadcasts the
    mean's gradient), then `y[i, k] := b[i, k] * x[i, k] + b[i, k]`; with `accumulate`, also
    `b[i, k] += x[i, k]` in between (the row then varies)."""
    s, x, y = (Tnode(name, dims, memory_mode=MATERIALIZED) for name, dims in (("s", (n,)), ("x", (n, m)),
                                                                              ("y", (n, m))))
    b = Tnode("b", (n, m), memory_mode=LOCAL)
    nests = [nest(b, lambda i, k: ll.Binop(ops.Binop.MUL, ll.Get(s, it(i)), ll.Constant(0.5)), (n, m))]
    if accumulate:
        nests.append(nest(b, lambda i, k: ll.Binop(ops.Binop.ADD, ll.Get(b, it(i, k)), ll.Get(x, it(i, k))), (n, m)))
    nests.append(nest(y, lambda i, k: ll.Ternop(ops.Ternop.FMA, ll.Get(b, it(i, k)), ll.Get(x, it(i, k)),
                                                ll.Get(b, it(i, k))), (n, m)))
    return ll.seq(*nests), s, x, y


@pytest.mark.parametrize("n,threads", [(64, 1), (1024, 2)])
def test_a_row_of_one_value_keeps_one_cell(n, threads):
    """The same bits as without the stage: under the interpreter and gcc (small), and at two
    threads (enough rows for them) as at one."""
    m = 128
    code, s, x, y = broadcast_then_read(n, m)
    new = row_buffers(fuse_loops(code))
    assert [tn.dims for tn in rows_of(new)] == [(1,)]
    assert sum(isinstance(st, ll.ForLoop) for st in ll.iter_stmts(new)) == 2  # the row loop, the read's loop
    rng = np.random.default_rng(3)
    ins = {s: rng.standard_normal(n).astype(np.float32), x: rng.standard_normal((n, m)).astype(np.float32)}
    if threads == 1:
        want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[y]
        np.testing.assert_array_equal(interpret.run(new, {tn: v.copy() for tn, v in ins.items()})[y], want)
    else:
        want = run_in_c(code, ins, name="uniform_row_whole").array(y).copy()
    got = run_in_c(new, ins, name=f"uniform_row_{threads}", options=cc.CcOptions(threads=threads)).array(y)
    np.testing.assert_array_equal(got, want)
    half = ins[s][:, None].astype(np.float64) * 0.5
    np.testing.assert_allclose(want, half * ins[x] + half, rtol=1e-6, atol=1e-6)


def test_a_row_written_again_keeps_all_its_cells():
    n, m = 8, 16
    code, s, x, y = broadcast_then_read(n, m, accumulate=True)
    new = row_buffers(fuse_loops(code))
    assert [tn.dims for tn in rows_of(new)] == [(m,)]
    rng = np.random.default_rng(4)
    ins = {s: rng.standard_normal(n).astype(np.float32), x: rng.standard_normal((n, m)).astype(np.float32)}
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})[y]
    np.testing.assert_array_equal(run_in_c(new, ins, name="varying_row").array(y), want)


def test_a_row_of_scope_sums_keeps_its_cells():
    """`b[i, j] := sum over k of x[i, j, k]` as a local scope (log-softmax's sum of exps): the
    scope's reads are what vary along the row, so the row keeps all its cells."""
    n, h, m = 2, 3, 4
    x = Tnode("x", (n, h, m), memory_mode=MATERIALIZED)
    y = Tnode("y", (n, h, m), memory_mode=MATERIALIZED)
    b = Tnode("b", (n, h), memory_mode=LOCAL)
    i, j, k, i2, j2, k2 = (get_symbol(c) for c in "ijkijk")
    sid = ll.fresh_scope_id(b)
    total = ll.LocalScope(sid, ll.ForLoop(k, 0, m - 1, ll.SetLocal(sid, ll.Binop(
        ops.Binop.ADD, ll.GetLocal(sid), ll.Get(x, it(i, j, k))))), it(i, j))
    sums = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, h - 1, ll.Set(b, it(i, j), total)))
    diff = ll.ForLoop(i2, 0, n - 1, ll.ForLoop(j2, 0, h - 1, ll.ForLoop(k2, 0, m - 1, ll.Set(
        y, it(i2, j2, k2), ll.Binop(ops.Binop.SUB, ll.Get(x, it(i2, j2, k2)), ll.Get(b, it(i2, j2)))))))
    code = ll.seq(sums, diff)
    new = row_buffers(fuse_loops(code))
    assert [tn.dims for tn in rows_of(new)] == [(h,)]
    v = np.random.default_rng(5).standard_normal((n, h, m)).astype(np.float32)
    want = interpret.run(code, {x: v.copy()})[y]
    np.testing.assert_array_equal(run_in_c(new, {x: v}, name="scope_row").array(y), want)
    np.testing.assert_allclose(want, v - v.sum(axis=-1, keepdims=True), rtol=1e-6, atol=1e-6)
