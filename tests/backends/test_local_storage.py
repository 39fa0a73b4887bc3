"""Routine-local storage (`ir/passes/local_storage.py`) and the memory report (`einjit.memory`).

A node one routine writes and consumes within a call is declared inside the generated
function; values must not change (differential: local storage on and off, C and the
interpreter), the kept bytes must drop by exactly the local bytes, and a later routine that
needs such a node's values is refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import fit, memory, train
from einjit.backends import c_syntax
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend
from einjit.backends.cc.multicore import MulticoreBackend
from einjit.backends.gpu import cuda_syntax
from einjit.backends.interface import NodeNotInContextError, lower_assignments, read_first
from einjit.backends.params import CudaMemClass, MemClass
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, Iterator, get_symbol
from einjit.ir.optimize import optimize_proc
from einjit.ir.passes.local_storage import LocalNodeError, is_routine_local, local_to, localize
from einjit.ir.passes.tracing import VirtualizeSettings
from einjit.ir.provenance import ROUTINE_LOCAL
from einjit.ir.tnode import LOCAL, NEVER_VIRTUAL, MemoryModeError, Tnode, hosted

OFF = VirtualizeSettings(local_storage=False)
X = np.random.default_rng(3).normal(size=(8, 3))
Y = np.random.default_rng(4).normal(size=(8, 1))
W1 = np.random.default_rng(5).normal(size=(16, 3)) / 2
W2 = np.random.default_rng(6).normal(size=(1, 16)) / 4


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def mlp_step(tag: str, settings: VirtualizeSettings | None = None, backend=None, context=None):
    """A 3→16→1 regression MLP and its SGD step, with fixed values."""
    x = ej.ndarray(X, batch_axes=1, label=f"{tag}_x")
    y = ej.ndarray(Y, batch_axes=1, label=f"{tag}_y")
    w1 = ej.param(f"{tag}_w1", values=W1, output_dims=[16], input_dims=[3])
    w2 = ej.param(f"{tag}_w2", values=W2, output_dims=[1], input_dims=[16])
    h = ej.relu(w1 @ x, label=f"{tag}_h")
    err = ej.sub(w2 @ h, y, label=f"{tag}_err")
    loss = ej.sum(ej.mul(err, err), "...|...->... => 0", label=f"{tag}_loss")
    train.init_params(loss)
    step = train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.01)], name=f"{tag}_step",
                            settings=settings, backend=backend, context=context)
    return step, (w1, w2), h, loss


def numpy_steps(n: int) -> tuple[np.ndarray, np.ndarray, float]:
    w1, w2, loss = W1.copy(), W2.copy(), 0.0
    for _ in range(n):
        pre = X @ w1.T
        h = np.maximum(pre, 0)
        err = h @ w2.T - Y
        loss = float((err * err).sum())
        d_out = 2 * err
        g2 = d_out.T @ h
        g1 = ((d_out @ w2) * (pre > 0)).T @ X
        w1, w2 = w1 - 0.01 * g1, w2 - 0.01 * g2
    return w1, w2, loss


def test_a_training_step_keeps_its_intermediates_local_and_computes_the_same_values():
    on, (w1, w2), h, loss = mlp_step("ls_on")
    off, (w1_off, w2_off), h_off, loss_off = mlp_step("ls_off", OFF)
    for _ in range(5):
        on()
        off()
    want_w1, want_w2, want_loss = numpy_steps(5)
    np.testing.assert_allclose(w1.numpy(), want_w1, rtol=1e-12)
    np.testing.assert_allclose(w2.numpy(), want_w2, rtol=1e-12)
    np.testing.assert_allclose(loss.numpy().ravel()[0], want_loss, rtol=1e-12)
    np.testing.assert_array_equal(w1.numpy(), w1_off.numpy())   # same code order: bit-identical
    np.testing.assert_array_equal(w2.numpy(), w2_off.numpy())
    assert is_routine_local(h.value_tn) and local_to(h.value_tn) == "ls_on_step"
    assert h.value_tn.provenance == ROUTINE_LOCAL and "local" in ej.ir.provenance.describe(ROUTINE_LOCAL)
    assert not h_off.value_tn.is_local()
    assert on.mem_classes[h.value_tn] is MemClass.LOCAL_ONLY
    assert off.mem_classes[h_off.value_tn] is MemClass.FROM_CONTEXT


def test_kept_bytes_drop_by_exactly_the_local_bytes():
    on, params, h, loss = mlp_step("kb_on")
    off, *_ = mlp_step("kb_off", OFF)
    # kept: both parameters with their gradients, and the loss with its gradient (hosted)
    kept = sum(2 * 8 * p.value_tn.size for p in params) + 2 * 8
    assert on.kept_bytes == kept
    # 16 hidden units x 8 examples: two of the pre-activation, its gradient and h (h's gradient
    # is inlined) and one example's row of the third (the "rows" stage: only its own
    # iteration reads it); 8 each: the output, its gradient, the error and the gradient of err*err
    assert on.memory.local_bytes == 8 * (2 * 16 * 8 + 16 + 4 * 8)
    assert on.memory.scratch_bytes == 0
    assert off.local_bytes == 0
    assert off.kept_bytes == on.kept_bytes + on.local_bytes + 8 * (16 * 8 - 16)
    assert on.memory.host_bytes == off.memory.host_bytes == X.nbytes + Y.nbytes   # read in place
    table = str(on.memory)
    assert "kb_on_h" in table and "Local_only" in table and "From_context" in table


def test_the_generated_c_declares_the_locals_inside_the_function():
    x = Tnode("x", (64,), ops.double, memory_mode=hosted())
    t = Tnode("t", (64,), ops.double)
    out = Tnode("out", (1,), ops.double, memory_mode=hosted())
    i, j = get_symbol("i"), get_symbol("j")
    code = ll.seq(
        ll.ForLoop(i, 0, 63, ll.Set(t, (Iterator(i),), ll.Unop(ops.Unop.EXP, ll.Get(x, (Iterator(i),))))),
        ll.Set(out, (FixedIdx(0),), ll.Constant(0.0)),
        ll.ForLoop(j, 0, 63, ll.Set(out, (FixedIdx(0),), ll.Binop(
            ops.Binop.ADD, ll.Get(out, (FixedIdx(0),)), ll.Binop(ops.Binop.MUL, ll.Get(t, (Iterator(j),)),
                                                                  ll.Get(t, (Iterator(j),)))))))
    opt = optimize_proc(code, name="sumsq", settings=VirtualizeSettings(max_visits=0))
    localize([("sumsq", opt, read_first(opt))])
    assert is_routine_local(t) and not out.is_local()
    src = c_syntax.render_program([("sumsq", opt.llc)]).source
    assert "  double t[64] = {0};\n" in src
    head = next(line for line in src.splitlines() if line.startswith("void sumsq("))
    assert head == "void sumsq(const double *restrict x, double *restrict out) {"
    xs = np.linspace(-1, 1, 64)
    x.array = xs.copy()
    want = interpret.run(code, {x: xs.copy()})[out]
    backend = CcBackend()
    ctx = backend.init("sumsq", share_host_arrays=True)
    backend.link(ctx, backend.compile((), opt, shared=True, name="sumsq"))()
    np.testing.assert_allclose(out.array, want, rtol=1e-14)
    np.testing.assert_allclose(out.array[0], (np.exp(xs) ** 2).sum(), rtol=1e-13)
    with pytest.raises(NodeNotInContextError, match="routine-local"):
        ctx.array(t)


def test_large_locals_go_to_the_scratch_and_the_stack_has_a_total_budget():
    small = [Tnode(f"s{k}", (1024,), ops.single, memory_mode=LOCAL) for k in range(70)]    # 4 KiB each
    big = Tnode("big", (8192,), ops.single, memory_mode=LOCAL)                              # 32 KiB
    placed = c_syntax.local_placement([big, *small])
    assert big not in placed.on_stack
    assert placed.on_stack == set(small[:64])                            # 256 KiB in all
    no_scratch = cuda_syntax.CUDA_SYNTAX
    assert c_syntax.local_placement(small, no_scratch).on_stack == set(small)


def _big_sum_routines(context):
    n = 5000                                                             # 40 KB of doubles
    x = ej.ndarray(np.linspace(0, 1, n), label="big_x")
    t = ej.exp(ej.mul(x, 2.0), label="big_t")
    total = ej.sum(ej.mul(t, t), "...|...->... => 0", label="big_total")
    stored = VirtualizeSettings(max_visits=0, inline_broadcast_arithmetic=False)   # 2x too, not recomputed
    step = train.to_routine(train.forward(total), name="big_sum", context=context, settings=stored)
    return n, t, total, step, lambda: train.to_routine(fit.forward_code(total), name="big_sum", context=context,
                                                       settings=stored)


def test_a_large_intermediate_lives_in_a_scratch_array_allocated_once(monkeypatch):
    monkeypatch.setenv("EINJIT_SCRATCH_PLAN", "0")                       # one array each, the planner off
    context = CcBackend().init("big", share_host_arrays=True)
    n, t, total, step, again = _big_sum_routines(context)
    scratch = {tn: id(a) for tn, a in context.scratch.items()}
    step()
    step()
    assert {tn: id(a) for tn, a in context.scratch.items()} == scratch    # none allocated per call
    assert len(scratch) == 3 and context.scratch[t.value_tn].dtype == np.float64   # 2x, t and t*t
    assert step.memory.scratch_bytes == memory.report(context).scratch_bytes == 3 * 8 * n
    assert step.scratch_plan is None and not context.arenas
    again()()
    assert {tn: id(a) for tn, a in context.scratch.items()} == scratch   # another routine reuses them
    np.testing.assert_allclose(total.numpy().ravel()[0], np.exp(4 * np.linspace(0, 1, n)).sum(), rtol=1e-12)


def test_large_intermediates_share_one_planned_arena_allocated_once():
    context = CcBackend().init("big_planned", share_host_arrays=True)
    n, _, total, step, again = _big_sum_routines(context)
    [[arena]] = context.arenas.values()
    step()
    step()
    assert [list(map(id, v)) for v in context.arenas.values()] == [[id(arena)]]   # none allocated per call
    assert not context.scratch
    plan = step.scratch_plan
    assert plan.parts_bytes == 3 * 8 * n and plan.size == arena.nbytes <= plan.parts_bytes
    report = step.memory
    assert report.scratch_bytes == plan.size == memory.report(context).scratch_bytes
    assert report.scratch_parts_bytes == 3 * 8 * n
    assert f"scratch {memory.human(plan.size)}" in str(report)
    again()()
    assert [list(map(id, v)) for v in context.arenas.values()] == [[id(arena)]]   # the same name reuses it
    np.testing.assert_allclose(total.numpy().ravel()[0], np.exp(4 * np.linspace(0, 1, n)).sum(), rtol=1e-12)


def test_a_later_routine_reading_a_local_node_is_refused_by_name():
    step, _, h, _ = mlp_step("late")
    step()
    reader = ej.mul(h, 2.0, label="late_reader")
    with pytest.raises(LocalNodeError, match="late_h") as e:
        train.to_routine(train.forward(reader), name="late_eval")
    assert "late_step" in str(e.value) and ".materialize()" in str(e.value)
    assert isinstance(e.value, ej.EinjitError)
    with pytest.raises(MemoryModeError, match="late_step"):
        h.hosted()


def test_a_node_materialized_before_compiling_stays_readable_by_a_later_routine():
    x = ej.ndarray(X, batch_axes=1, label="mat_x")
    w1 = ej.param("mat_w1", values=W1, output_dims=[16], input_dims=[3])
    h = ej.relu(w1 @ x, label="mat_h").materialize()
    loss = ej.sum(ej.mul(h, h), "...|...->... => 0", label="mat_loss")
    train.init_params(loss)
    train.to_routine(train.grad_update(loss), name="mat_step")()
    reader = ej.mul(h, 2.0, label="mat_reader")
    train.to_routine(train.forward(reader), name="mat_eval")()
    np.testing.assert_allclose(reader.numpy(), 2 * np.maximum(X @ W1.T, 0), rtol=1e-12)
    assert not h.value_tn.is_local()


def test_a_later_routine_that_recomputes_the_node_is_fine():
    step, _, h, _ = mlp_step("again")
    step()
    out = ej.mul(h, 2.0, label="again_out")
    forward = train.to_routine(fit.forward_code(out), name="again_fwd")  # recomputes h from x and w1
    forward()
    np.testing.assert_allclose(out.numpy(), 2 * np.maximum(X @ step_w1(step).T, 0), rtol=1e-12)
    assert is_routine_local(h.value_tn)


def step_w1(step) -> np.ndarray:
    return next(a for tn, a in step.context.arrays.items() if tn.label == ["again_w1"])


def test_a_result_no_statement_reads_afterwards_stays_in_the_context():
    x = Tnode("rx", (4,), ops.double, memory_mode=hosted())
    r = Tnode("r", (4,), ops.double, memory_mode=NEVER_VIRTUAL)
    i = get_symbol("i")
    code = ll.ForLoop(i, 0, 3, ll.Set(r, (Iterator(i),), ll.Binop(ops.Binop.MUL, ll.Get(x, (Iterator(i),)),
                                                                    ll.Constant(3.0))))
    opt = optimize_proc(code, name="result")
    localize([("result", opt, read_first(opt))])
    assert not r.is_local()
    x.array = np.arange(4.0)
    backend = CcBackend()
    ctx = backend.init("result", share_host_arrays=True)
    backend.link(ctx, backend.compile((), opt, shared=True, name="result"))()
    np.testing.assert_array_equal(ctx.array(r), [0.0, 3.0, 6.0, 9.0])


def test_nodes_shared_by_a_batch_or_kept_by_an_earlier_routine_are_not_made_local():
    a = Tnode("ba", (4,), ops.double, memory_mode=hosted())
    t = Tnode("bt", (4,), ops.double)
    o1 = Tnode("bo1", (4,), ops.double, memory_mode=hosted())
    o2 = Tnode("bo2", (4,), ops.double, memory_mode=hosted())
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    write_t = ll.ForLoop(i, 0, 3, ll.Set(t, (Iterator(i),), ll.Get(a, (Iterator(i),))))
    first = ll.seq(write_t, ll.ForLoop(j, 0, 3, ll.Set(o1, (Iterator(j),), ll.Get(t, (Iterator(j),)))))
    second = ll.ForLoop(k, 0, 3, ll.Set(o2, (Iterator(k),), ll.Get(t, (Iterator(k),))))
    opt1 = optimize_proc(first, name="first", settings=VirtualizeSettings(max_visits=0, virtualize=False))
    opt2 = optimize_proc(second, name="second")
    localize([("first", opt1, read_first(opt1)), ("second", opt2, read_first(opt2))])
    assert not t.is_local()   # the second routine reads it: the optimizer made it Materialized
    u = Tnode("bu", (4,), ops.double)
    o3 = Tnode("bo3", (4,), ops.double, memory_mode=hosted())
    consumes = ll.seq(ll.ForLoop(i, 0, 3, ll.Set(u, (Iterator(i),), ll.Get(a, (Iterator(i),)))),
                      ll.ForLoop(j, 0, 3, ll.Set(o3, (Iterator(j),), ll.Get(u, (Iterator(j),)))))
    opt3 = optimize_proc(consumes, name="keeps", settings=VirtualizeSettings(local_storage=False, virtualize=False))
    localize([("keeps", opt3, read_first(opt3))])
    opt4 = optimize_proc(consumes, name="consumes", settings=VirtualizeSettings(virtualize=False))
    localize([("consumes", opt4, read_first(opt4))])
    assert not u.is_local()   # "keeps" holds it in its context: values written there stay readable


def test_multicore_devices_run_the_localized_step_with_the_same_values():
    backend = MulticoreBackend(CcBackend())
    try:
        context = backend.init(backend.get_device(0))
        step, (w1, w2), h, _ = mlp_step("mc", backend=backend, context=context)
        for _ in range(3):
            step()
        backend.await_(backend.get_device(0))
        for p in (w1, w2):
            context.to_host(p.value_tn)
        want_w1, want_w2, _ = numpy_steps(3)
        np.testing.assert_allclose(w1.numpy(), want_w1, rtol=1e-12)
        np.testing.assert_allclose(w2.numpy(), want_w2, rtol=1e-12)
        assert is_routine_local(h.value_tn)
        assert memory.report(context).kept_bytes > 0
        assert step.kept_bytes < memory.report(context).kept_bytes + step.local_bytes
    finally:
        backend.shutdown()


def test_cuda_code_generation_keeps_routine_local_nodes_in_global_memory():
    x = Tnode("cx", (256,), ops.single, memory_mode=hosted())
    t = Tnode("ct", (256,), ops.single)
    out = Tnode("cout", (256,), ops.single, memory_mode=hosted())
    i, j = get_symbol("i"), get_symbol("j")
    code = ll.seq(
        ll.ForLoop(i, 0, 255, ll.Set(t, (Iterator(i),), ll.Unop(ops.Unop.EXP, ll.Get(x, (Iterator(i),))))),
        ll.ForLoop(j, 0, 255, ll.Set(out, (Iterator(j),), ll.Binop(
            ops.Binop.ADD, ll.Get(t, (Iterator(j),)), ll.Get(t, (Iterator(j),))))))
    opt = optimize_proc(code, name="ck", settings=VirtualizeSettings(max_visits=0))
    localize([("ck", opt, read_first(opt))])
    assert is_routine_local(t)
    program = cuda_syntax.render_program([("ck", opt.portable_llc)])
    kernel = program.kernels[0]
    assert kernel.plan.mem_classes[t] is CudaMemClass.GLOBAL
    assert any(p.tn is t for p in kernel.rendered.params)
    assert "grid_sync" in program.source   # t crosses segments: threads meet before reading it


def test_openmp_threads_share_routine_local_nodes_and_keep_scheduler_locals_private():
    rng = np.random.default_rng(7)
    xs, ws = rng.normal(size=(64, 512)), rng.normal(size=(256, 512)) / 20
    x = ej.ndarray(xs, batch_axes=1, label="omp_x")
    w = ej.ndarray(ws, input_axes=1, label="omp_w")
    pre = ej.matmul(w, x, label="omp_pre")                       # 8.4M multiply-adds: a parallel loop
    total = ej.sum(ej.relu(pre), "...|...->... => 0", label="omp_total")
    _, lowered = lower_assignments((), train.forward(total), "omp_dense")
    backend = CcBackend(cc.CcOptions(threads=2))
    code = backend.compile((), lowered, shared=True, name="omp_dense")
    assert is_routine_local(pre.value_tn)
    source = code.procedure.procedure.source
    pragmas = [line for line in source.splitlines() if "#pragma omp parallel" in line]
    assert pragmas
    for line in pragmas:
        private = line.partition("private(")[2].rstrip(")").split(", ") if "private(" in line else []
        assert all(name.startswith(("acc", "pack", "lanes")) for name in private), line
    backend.link(backend.init("omp", share_host_arrays=True), code)()
    np.testing.assert_allclose(total.numpy().ravel()[0], np.maximum(xs @ ws.T, 0).sum(), rtol=1e-10)


def test_memory_report_of_a_cuda_routine_and_context_counts_global_and_per_thread_arrays():
    g = Tnode("rg", (100,), ops.single)
    p = Tnode("rp", (10,), ops.single, memory_mode=LOCAL)

    class CudaRoutine:
        mem_classes = {g: CudaMemClass.GLOBAL, p: CudaMemClass.LOCAL_ONLY}

    class CudaContext:
        buffers = {g: 0x1000}
        merge_buffers = {p: 0x2000}

    r = memory.report(CudaRoutine())
    assert (r.kept_bytes, r.local_bytes, r.scratch_bytes, r.host_bytes) == (400, 40, 0, 0)
    c = memory.report(CudaContext())
    assert c.kept_bytes == 440 and [a[1] for a in c.arrays] == ["Global", "Merge_buffer"]
    with pytest.raises(TypeError, match="routine or a context"):
        memory.report(object())
