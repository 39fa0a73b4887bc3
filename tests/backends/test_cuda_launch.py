"""The CUDA backend on a GPU: the representative programs end to end against the interpreter,
shared and per-device code, many launches, transfers between contexts, and misuse. Skipped
without a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

import backend_programs as bp
from einjit.backends.cc.backend import CcBackend
from einjit.backends.gpu import cuda
from einjit.backends.interface import CudaMemClass, DeviceError, NodeNotInContextError, WrongBackendError
from einjit.ir import low_level as ll
from einjit.ir import ops, tnode
from einjit.ir.indexing import FixedIdx, Iterator, get_static_symbol, get_symbol
from einjit.ir.tnode import Tnode

pytestmark = pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA device")

B = ll.Binop


@pytest.fixture(scope="module")
def backend():
    return cuda.CudaBackend()


@pytest.fixture(scope="module")
def device(backend):
    return backend.get_device(0)


def result(backend, ctx, tn):
    backend.to_host(ctx, tn)
    return tn.host_array().copy()


@pytest.mark.parametrize("shared", [True, False], ids=["shared_ptx", "device_cubin"])
@pytest.mark.parametrize("name", sorted(bp.ALL))
def test_programs_match_the_interpreter(backend, device, name, shared):
    prog = bp.ALL[name]()
    ctx = backend.init(device)
    got = bp.run_on(backend, [ctx], prog, shared=shared, devices=[device])[0]
    bp.check_outputs(prog, got, f"CUDA shared={shared}")
    backend.release(ctx)


def test_shared_code_is_compiled_once_for_several_contexts(backend, device):
    prog = bp.asg_conv2d()
    contexts = [backend.init(device) for _ in range(3)]
    before = cuda.stats.compiler_invocations
    results = bp.run_on(backend, contexts, prog, shared=True, devices=[device])
    assert cuda.stats.compiler_invocations <= before + 1
    for got in results:
        bp.check_outputs(prog, got, "shared in three contexts")


def test_a_large_matmul_spreads_over_many_blocks(backend, device):
    n, m, p = 256, 96, 192
    a, b, c = bp.hosted("a", (n, m)), bp.hosted("b", (m, p)), bp.hosted("c", (n, p))
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    at = lambda *s: tuple(Iterator(x) for x in s)  # noqa: E731
    acc = ll.Set(c, at(i, j), B(ops.Binop.ADD, ll.Get(c, at(i, j)), B(ops.Binop.MUL, ll.Get(a, at(i, k)),
                                                                       ll.Get(b, at(k, j)))))
    code = ll.seq(ll.ZeroOut(c), ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, p - 1, ll.ForLoop(k, 0, m - 1, acc))))
    rng = np.random.default_rng(0)
    a.host_array()[...] = rng.standard_normal((n, m))
    b.host_array()[...] = rng.standard_normal((m, p))
    ctx = backend.init(device)
    backend.from_host(ctx, a)
    backend.from_host(ctx, b)
    compiled = backend.compile((), code, shared=True, name="big_mm")
    assert compiled.procedure.kernel.plan.launch_shape() == (n * p // 256, 256)
    backend.link(ctx, compiled)()
    backend.await_(device)
    np.testing.assert_allclose(result(backend, ctx, c), a.host_array() @ b.host_array(), rtol=1e-4, atol=1e-4)


def counter_program(static_range=None):
    acc = Tnode("acc", (3,), ops.int64, memory_mode=tnode.hosted())
    s = get_static_symbol(static_range)
    get = lambda k: ll.Get(acc, (FixedIdx(k),))  # noqa: E731
    sym = ll.EmbedIndex(Iterator(s.symbol))
    code = ll.seq(ll.Set(acc, (FixedIdx(0),), B(ops.Binop.ADD, get(0), ll.Constant(1))),
                  ll.Set(acc, (FixedIdx(1),), B(ops.Binop.ADD, get(1), sym)),
                  ll.Set(acc, (FixedIdx(2),), sym))
    return code, acc, s


def test_many_launches_capture_their_static_values(backend, device):
    code, acc, s = counter_program()
    ctx = backend.init(device)
    acc.host_array()[...] = 0
    backend.from_host(ctx, acc)
    routine = backend.link(ctx, backend.compile((s,), code, shared=True, name="count"))
    works = []
    for k in range(1000):
        routine.bindings[s].value = k
        works.append(routine.schedule())
    for work in works:
        work()
    backend.await_(device)
    np.testing.assert_array_equal(result(backend, ctx, acc), [1000, sum(range(1000)), 999])


def test_static_values_out_of_range_fail_at_launch(backend, device):
    code, acc, s = counter_program(static_range=4)
    ctx = backend.init(device)
    acc.host_array()[...] = 0
    backend.from_host(ctx, acc)
    routine = backend.link(ctx, backend.compile((s,), code, shared=True, name="ranged"))
    routine.bindings[s].value = 4
    with pytest.raises(IndexError, match=r"routine 'ranged': static symbol .* = 4 is outside its range \[0, 4\)"):
        routine()
    routine.bindings[s].value = 3
    routine()
    backend.await_(device)
    np.testing.assert_array_equal(result(backend, ctx, acc), [1, 3, 3])


def merge_program():
    acc = Tnode("acc", (4,), ops.double, memory_mode=tnode.hosted())
    i = get_symbol()
    code = ll.ForLoop(i, 0, 3, ll.Set(acc, (Iterator(i),), B(ops.Binop.ADD, ll.Get(acc, (Iterator(i),)),
                                                            ll.GetMergeBuffer(acc, (Iterator(i),)))))
    return acc, code


def test_device_to_device_into_merge_buffers(backend, device):
    acc, code = merge_program()
    devices = [backend.get_device(k) for k in range(min(2, backend.num_devices()))]
    ctx0, ctx1 = backend.init(device), backend.init(devices[-1])
    acc.host_array()[...] = [1, 2, 3, 4]
    backend.from_host(ctx0, acc)
    acc.host_array()[...] = [10, 20, 30, 40]
    backend.from_host(ctx1, acc)
    merge = backend.link(ctx0, backend.compile((), code, shared=True, name="merge"))
    assert merge.mem_classes[acc] is CudaMemClass.GLOBAL
    backend.device_to_device(acc, ctx0, ctx1)
    merge()
    for d in devices:
        backend.await_(d)
    np.testing.assert_array_equal(result(backend, ctx0, acc), [11, 22, 33, 44])
    np.testing.assert_array_equal(result(backend, ctx1, acc), [10, 20, 30, 40])


def test_misuse_is_reported(backend, device):
    fresh = cuda.CudaBackend()
    with pytest.raises(DeviceError, match="was never initialized"):
        fresh.await_(fresh.get_device(0))
    with pytest.raises(DeviceError, match="there is no device"):
        backend.get_device(backend.num_devices())
    with pytest.raises(WrongBackendError, match="is not a device of backend"):
        backend.init(fresh.get_device(0))
    acc, code = merge_program()
    ctx = backend.init(device)
    compiled = backend.compile((), code, shared=True, name="needs_acc")
    with pytest.raises(NodeNotInContextError, match=r"reads acc#\d+ before writing it"):
        backend.link(ctx, compiled)
    with pytest.raises(NodeNotInContextError, match="to_host"):
        backend.to_host(ctx, acc)
    cpu = CcBackend()
    with pytest.raises(WrongBackendError, match="compiled by backend 'cc'"):
        backend.link(ctx, cpu.compile((), code, shared=True, name="cpu_code"))
    with pytest.raises(WrongBackendError, match="compiled by backend 'cuda'"):
        cpu.link(cpu.init("cpu"), compiled)
