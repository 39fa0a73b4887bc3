"""The backend interfaces through `CcBackend`: work items, routines, Postponed vs Compiled code,
shared and batch compilation, lowering, memory classes, and the errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest

import backend_programs as bp
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend
from einjit.backends.interface import (
    Compiled,
    CpuMemClass,
    NodeNotInContextError,
    NotHostedError,
    Postponed,
    Routine,
    StaticRangeError,
    Work,
    WrongBackendError,
    default_name,
    lower_assignments,
    routine_inputs,
)
from einjit.ir import assignments as asg
from einjit.ir import low_level as ll
from einjit.ir import ops, tnode
from einjit.ir.indexing import IntRef, Iterator, get_static_symbol, get_symbol
from einjit.ir.optimize import Optimized
from einjit.ir.tnode import Tnode

B = ll.Binop


@pytest.fixture
def backend():
    return CcBackend()


def add_static(n: int = 4, value: float = 0.0):
    """out[i] = a[i] + s + value, with `s` a static symbol of range 10."""
    a, out = Tnode("a", (n,)), Tnode("out", (n,))
    s = get_static_symbol(10)
    i = get_symbol()
    code = ll.ForLoop(i, 0, n - 1, ll.Set(out, (Iterator(i),), B(ops.Binop.ADD, B(
        ops.Binop.ADD, ll.Get(a, (Iterator(i),)), ll.EmbedIndex(Iterator(s.symbol))), ll.Constant(value))))
    return code, a, out, s


def fill(value: float, n: int = 3):
    out = Tnode("out", (n,))
    i = get_symbol()
    return ll.ForLoop(i, 0, n - 1, ll.Set(out, (Iterator(i),), ll.Constant(value))), out


def result(backend, ctx, tn) -> np.ndarray:
    backend.to_host(ctx, tn)
    return tn.host_array().copy()


# ---------------------------------------------------------------- work and routines


def test_schedule_captures_the_bindings_and_running_blocks(backend):
    code, a, out, s = add_static()
    ctx = backend.init("cpu")
    a.host_array()[...] = [1, 2, 3, 4]
    backend.from_host(ctx, a)
    routine = backend.link(ctx, backend.compile((s,), code, shared=True, name="add_s"))
    assert isinstance(routine, Routine) and routine.context is ctx and routine.name == "add_s"
    assert list(routine.bindings) == [s]
    routine.bindings[s].value = 3
    work = routine.schedule()
    routine.bindings[s].value = 5
    assert isinstance(work, Work) and work.name == "add_s"
    np.testing.assert_array_equal(result(backend, ctx, out), [0, 0, 0, 0])
    work()
    np.testing.assert_array_equal(result(backend, ctx, out), [4, 5, 6, 7])
    routine()
    np.testing.assert_array_equal(result(backend, ctx, out), [6, 7, 8, 9])


def test_static_values_are_shared_through_given_refs_and_checked(backend):
    code, a, out, s = add_static()
    ctx = backend.init("cpu")
    a.host_array()[...] = 0
    backend.from_host(ctx, a)
    ref = IntRef(9)
    compiled = backend.compile((s,), code, shared=True, name="add_ref")
    r1, r2 = backend.link(ctx, compiled, {s: ref}), backend.link(ctx, compiled, {s: ref})
    assert r1.bindings[s] is ref and r2.bindings[s] is ref
    ref.value = 10
    with pytest.raises(StaticRangeError,
                       match=r"routine 'add_ref': static symbol .* = 10 is outside its range \[0, 10\)"):
        r1.schedule()


def test_memory_classes_of_a_routine(backend):
    w = Tnode("w", (3,), memory_mode=tnode.hosted(tnode.MemoryType.CONSTANT))
    y = Tnode("y", (3,), memory_mode=tnode.hosted())
    h = Tnode("h", (3,), memory_mode=tnode.LOCAL)
    i, j = get_symbol(), get_symbol()
    code = ll.seq(ll.ForLoop(i, 0, 2, ll.Set(h, (Iterator(i),), B(ops.Binop.MUL, ll.Get(w, (Iterator(i),)),
                                                                   ll.Constant(2.0)))),
                  ll.ForLoop(j, 0, 2, ll.Set(y, (Iterator(j),), ll.Get(h, (Iterator(j),)))))
    w.host_array()[...] = [1, 2, 3]
    for shared in (True, False):
        ctx = backend.init("cpu")
        routine = backend.link(ctx, backend.compile((), code, shared=shared, name=f"classes_{shared}"))
        assert routine.mem_classes == {w: CpuMemClass.CONSTANT_FROM_HOST, y: CpuMemClass.FROM_CONTEXT,
                                       h: CpuMemClass.LOCAL_ONLY}
        routine()
        np.testing.assert_array_equal(result(backend, ctx, y), [2, 4, 6])


# ---------------------------------------------------------------- Postponed vs Compiled, shared and batch


def test_shared_code_compiles_once_for_every_context(backend):
    code, a, out, s = add_static(value=0.25)
    contexts = [backend.init(f"cpu{k}") for k in range(3)]
    before = cc.stats.compiler_invocations
    compiled = backend.compile((s,), code, shared=True, name="shared_add")
    assert isinstance(compiled, Compiled) and cc.stats.compiler_invocations == before + 1
    for k, ctx in enumerate(contexts):
        a.host_array()[...] = k
        backend.from_host(ctx, a)
        routine = backend.link(ctx, compiled)
        routine.bindings[s].value = k
        routine()
    assert cc.stats.compiler_invocations == before + 1
    for k, ctx in enumerate(contexts):
        np.testing.assert_array_equal(result(backend, ctx, out), [2 * k + 0.25] * 4)


def test_postponed_code_compiles_per_context_at_link(backend):
    code, a, out, s = add_static(value=0.5)
    contexts = [backend.init(f"cpu{k}") for k in range(3)]
    before = cc.stats.compiler_invocations
    postponed = backend.compile((s,), code, name="postponed_add")
    assert isinstance(postponed, Postponed) and cc.stats.compiler_invocations == before
    for k, ctx in enumerate(contexts):
        a.host_array()[...] = k
        backend.from_host(ctx, a)
        routine = backend.link(ctx, postponed)
        assert cc.stats.compiler_invocations == before + k + 1
        routine.bindings[s].value = 1
        routine()
        np.testing.assert_array_equal(result(backend, ctx, out), [k + 1.5] * 4)


def test_postponed_code_is_specialized_to_the_context_arrays():
    backend = CcBackend(cc.CcOptions(keep_source=True))
    code, a, out, s = add_static()
    ctx = backend.init("cpu")
    a.host_array()[...] = 0
    backend.from_host(ctx, a)
    routine = backend.link(ctx, backend.compile((s,), code, name="special"))
    proc = backend.simple.compile_batch([("special2", code)], (s,), context=ctx)[0]
    source = proc.procedure.source
    assert f"{ctx.array(a).ctypes.data:#x}ULL" in source and "void special2(int s" in source
    assert proc.context is ctx and proc.entry is not None
    other = backend.init("other")
    backend.from_host(other, a)
    with pytest.raises(NodeNotInContextError, match="compiled for context 'cpu' .* compile with shared=True"):
        backend.simple.link_compiled(other, proc, frozenset())
    routine.bindings[s].value = 2
    routine()
    np.testing.assert_array_equal(result(backend, ctx, out), [2] * 4)


def test_batch_compilation_uses_one_compiler_invocation(backend):
    codes, outs = zip(*(fill(k + 0.5) for k in range(4)), strict=True)
    names = [f"fill_batch_{k}" for k in range(4)]
    ctx = backend.init("cpu")
    before = cc.stats.compiler_invocations
    compiled = backend.compile_batch((), codes, shared=True, names=names)
    assert cc.stats.compiler_invocations == before + 1
    for routine in backend.link_batch(ctx, compiled):
        routine()
    postponed = backend.compile_batch((), codes, names=names)
    other = backend.init("other")
    routines = backend.link_batch(other, postponed)
    assert cc.stats.compiler_invocations == before + 2
    for routine in routines:
        routine()
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(result(backend, ctx, out), [k + 0.5] * 3)
        np.testing.assert_array_equal(result(backend, other, out), [k + 0.5] * 3)
    separate = [backend.compile((), c, shared=True, name=f"fill_single_{k}") for k, c in enumerate(codes)]
    assert cc.stats.compiler_invocations == before + 2 + len(separate)


def test_batch_names_must_match_and_be_distinct(backend):
    codes = [fill(1.0)[0], fill(2.0)[0]]
    with pytest.raises(ValueError, match="2 routines to compile but 1 names"):
        backend.compile_batch((), codes, names=["x"])
    with pytest.raises(ValueError, match="routine name 'x' repeated"):
        backend.compile_batch((), codes, names=["x", "x"], shared=True)


# ---------------------------------------------------------------- lowering


def test_lower_assignments_lowers_and_optimizes():
    prog = bp.asg_pointwise_broadcast()
    name, lowered = lower_assignments((), prog.code)
    assert isinstance(lowered, Optimized) and name == default_name(prog.code) and name.startswith("run_tmp_")
    tmp = next(tn for tn in asg.guessed_nodes(prog.code) if tn.label == ["tmp"])
    assert tmp.is_virtual() and tmp not in ll.nodes_of(lowered.llc)
    named, _ = lower_assignments((), bp.asg_matmul().code, "mm")
    assert named == "mm"


def test_compile_accepts_assignments_low_level_and_optimized_code(backend):
    prog = bp.asg_matmul()
    _, optimized = lower_assignments((), prog.code)
    for k, code in enumerate([prog.code, asg.to_low_level(prog.code), optimized]):
        ctx = backend.init("cpu")
        prog.set_host_inputs()
        for tn in prog.inputs:
            backend.from_host(ctx, tn)
        backend.link(ctx, backend.compile((), code, shared=True, name=f"forms_{k}"))()
        np.testing.assert_allclose(result(backend, ctx, prog.outputs[0]), prog.expected[prog.outputs[0]], rtol=1e-5)
    with pytest.raises(TypeError, match="cannot compile str"):
        backend.compile((), "c = a * b")


def test_routine_inputs_are_the_nodes_read_before_written():
    a, acc, w, g, tmp = (Tnode(x, (3,)) for x in ("a", "acc", "w", "g", "tmp"))
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    at = lambda s: (Iterator(s),)  # noqa: E731
    code = ll.seq(
        ll.ZeroOut(acc),
        ll.ForLoop(i, 0, 2, ll.Set(acc, at(i), B(ops.Binop.ADD, ll.Get(acc, at(i)), ll.Get(a, at(i))))),
        ll.ForLoop(j, 0, 2, ll.Set(tmp, at(j), B(ops.Binop.MUL, ll.Get(g, at(j)), ll.Constant(0.1)))),
        ll.ForLoop(k, 0, 2, ll.Set(w, at(k), B(ops.Binop.SUB, ll.Get(w, at(k)), ll.Get(tmp, at(k))))))
    assert routine_inputs(code) == {a, g, w}
    prog = bp.mlp_step()
    _, optimized = lower_assignments((), prog.code)
    assert routine_inputs(optimized) == set(prog.inputs)


# ---------------------------------------------------------------- every representative program


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "postponed"])
@pytest.mark.parametrize("name", sorted(bp.ALL))
def test_programs_match_the_interpreter_and_the_c_backend(backend, name, shared):
    prog = bp.ALL[name]()
    got = bp.run_on(backend, [backend.init("cpu")], prog, shared=shared)[0]
    bp.check_outputs(prog, got, f"CcBackend shared={shared}")


# ---------------------------------------------------------------- bad input


def test_code_of_another_backend_cannot_be_linked(backend):
    code, _ = fill(1.0)
    ctx = backend.init("cpu")
    with pytest.raises(WrongBackendError, match=r"routine 'foreign' was compiled by backend 'cuda' and cannot be "
                                                r"linked into context 'cpu' \(backend 'cc'\) of backend 'cc'"):
        backend.link(ctx, Postponed("cuda", code, (), "foreign"))
    other = CcBackend(name="cc_other")
    compiled = other.compile((), code, shared=True, name="other_cc")
    with pytest.raises(WrongBackendError, match="compiled by backend 'cc_other'"):
        backend.link(ctx, compiled)
    with pytest.raises(WrongBackendError, match=r"context 'cpu' \(backend 'cc'\) is not a context of backend "
                                                r"'cc_other'"):
        other.link(ctx, compiled)
    with pytest.raises(TypeError, match="link expects code from a backend's compile"):
        backend.link(ctx, code)


@pytest.mark.parametrize("shared", [True, False])
def test_reading_a_node_the_context_does_not_hold(backend, shared):
    code, a, out, s = add_static()
    ctx = backend.init("cpu")
    compiled = backend.compile((s,), code, shared=shared, name=f"needs_a_{shared}")
    with pytest.raises(NodeNotInContextError, match=rf"routine 'needs_a_{shared}' reads a#\d+ before writing it, "
                                                    r"but context 'cpu' \(backend 'cc'\) does not hold it"):
        backend.link(ctx, compiled)
    with pytest.raises(NodeNotInContextError, match=r"to_host: context 'cpu' .* does not hold out#"):
        backend.to_host(ctx, out)


def test_a_node_computed_in_one_context_is_not_in_another(backend):
    code, a, out, s = add_static()
    producer, consumer = backend.init("producer"), backend.init("consumer")
    a.host_array()[...] = 0
    backend.from_host(producer, a)
    backend.link(producer, backend.compile((s,), code, shared=True, name="produce"))()
    copy, dbl = Tnode("copy", (4,)), get_symbol()
    reader = ll.ForLoop(dbl, 0, 3, ll.Set(copy, (Iterator(dbl),), B(ops.Binop.MUL, ll.Get(out, (Iterator(dbl),)),
                                                                     ll.Constant(2.0))))
    compiled = backend.compile((), reader, shared=True, name="consume")
    with pytest.raises(NodeNotInContextError, match=r"reads out#\d+ before writing it, but context 'consumer'"):
        backend.link(consumer, compiled)
    with pytest.raises(NodeNotInContextError, match=r"device_to_device into 'producer': context 'consumer'"):
        backend.device_to_device(out, producer, consumer)
    backend.device_to_device(out, consumer, producer, into_merge_buffer=False)
    backend.link(consumer, compiled)()
    np.testing.assert_array_equal(result(backend, consumer, copy), 2 * result(backend, producer, out))


def test_transfers_of_nodes_without_host_arrays_are_named_errors(backend):
    v = Tnode("v", (2,), memory_mode=tnode.VIRTUAL, provenance=15)
    ctx = backend.init("cpu")
    for transfer in (lambda: backend.from_host(ctx, v), lambda: backend.to_host(ctx, v), lambda: ctx.to_host(v)):
        with pytest.raises(NotHostedError, match=r"of v#\d+ in(to)? context 'cpu' \(backend 'cc'\): the node is not "
                                                 r"hosted \(memory mode Virtual, provenance 15: virtual: the optimizer "
                                                 r"inlined .*make it hosted before compiling \(tensor.hosted\(\)"):
            transfer()
    fresh = Tnode("fresh", (2,), memory_mode=tnode.hosted())
    with pytest.raises(NotHostedError, match=r"from_host of fresh#\d+ into context 'cpu' .*: the node has no host "
                                             r"array yet"):
        backend.from_host(ctx, fresh)
    assert fresh.array is None and not ctx.holds(fresh)


def test_merge_buffer_receives_another_contexts_array(backend):
    a = Tnode("a", (4,), memory_mode=tnode.hosted())
    i = get_symbol()
    code = ll.ForLoop(i, 0, 3, ll.Set(a, (Iterator(i),), B(ops.Binop.ADD, ll.Get(a, (Iterator(i),)),
                                                          ll.GetMergeBuffer(a, (Iterator(i),)))))
    ctx0, ctx1 = backend.init("c0"), backend.init("c1")
    a.host_array()[...] = [1, 2, 3, 4]
    backend.from_host(ctx0, a)
    a.host_array()[...] = [10, 20, 30, 40]
    backend.from_host(ctx1, a)
    merge = backend.link(ctx0, backend.compile((), code, shared=True, name="merge_add"))
    backend.device_to_device(a, ctx0, ctx1)
    merge()
    np.testing.assert_array_equal(result(backend, ctx0, a), [11, 22, 33, 44])
    np.testing.assert_array_equal(result(backend, ctx1, a), [10, 20, 30, 40])
    assert merge.mem_classes[a] is CpuMemClass.FROM_CONTEXT
