"""The multicore device backend over `CcBackend`: the representative programs on one and two
devices, non-blocking scheduling under stress, parallelism, failures, transfers and misuse."""

from __future__ import annotations

import time

import numpy as np
import pytest

import backend_programs as bp
from einjit.backends.cc.backend import CcBackend
from einjit.backends.cc.multicore import MulticoreBackend
from einjit.backends.interface import (
    DeviceError,
    NodeNotInContextError,
    RoutineFailed,
    StaticRangeError,
    Work,
    WrongBackendError,
)
from einjit.ir import low_level as ll
from einjit.ir import ops, tnode
from einjit.ir.indexing import FixedIdx, Iterator, get_static_symbol, get_symbol
from einjit.ir.tnode import Tnode

B = ll.Binop


@pytest.fixture
def backend():
    with MulticoreBackend(CcBackend(), num_devices=2) as be:
        yield be


def devices_and_contexts(backend, n):
    devices = [backend.get_device(k) for k in range(n)]
    return devices, [backend.init(d) for d in devices]


def counter_program(static_range: int | None = None):
    """acc[0] += 1; acc[1] += s; acc[2] = s (the last value seen)."""
    acc = Tnode("acc", (3,), ops.int64, memory_mode=tnode.hosted())
    s = get_static_symbol(static_range)
    get = lambda k: ll.Get(acc, (FixedIdx(k),))  # noqa: E731
    sym = ll.EmbedIndex(Iterator(s.symbol))
    code = ll.seq(ll.Set(acc, (FixedIdx(0),), B(ops.Binop.ADD, get(0), ll.Constant(1))),
                  ll.Set(acc, (FixedIdx(1),), B(ops.Binop.ADD, get(1), sym)),
                  ll.Set(acc, (FixedIdx(2),), sym))
    return code, acc, s


def busy_program(n: int = 3_000_000):
    """A C loop long enough (tens of milliseconds) to watch a device work."""
    out = Tnode("spin", (1,), ops.double, memory_mode=tnode.hosted())
    i = get_symbol()
    step = B(ops.Binop.ADD, B(ops.Binop.MUL, ll.Get(out, (FixedIdx(0),)), ll.Constant(0.999999)), ll.Constant(1.0))
    return ll.ForLoop(i, 0, n - 1, ll.Set(out, (FixedIdx(0),), step)), out


def fill_program():
    out = Tnode("out", (2,))
    i = get_symbol()
    return ll.ForLoop(i, 0, 1, ll.Set(out, (Iterator(i),), ll.Constant(1.0))), out


def result(backend, ctx, tn):
    backend.to_host(ctx, tn)
    return tn.host_array().copy()


# ---------------------------------------------------------------- the programs on 1 and 2 devices


@pytest.mark.parametrize("n_devices", [1, 2])
@pytest.mark.parametrize("name", sorted(bp.ALL))
def test_programs_on_devices_match_the_c_backend(backend, name, n_devices):
    """Shared code: every device gives exactly the no-device backend's result."""
    prog = bp.ALL[name]()
    devices, contexts = devices_and_contexts(backend, n_devices)
    results = bp.run_on(backend, contexts, prog, shared=True, devices=devices)
    plain = CcBackend()
    reference = bp.run_on(plain, [plain.init("cpu")], prog, shared=True)[0]
    for k, got in enumerate(results):
        bp.check_outputs(prog, got, f"multicore device {k} of {n_devices}")
        for tn in prog.outputs:
            np.testing.assert_array_equal(got[tn], reference[tn], err_msg=f"device {k}: {tn.debug_name()}")


@pytest.mark.parametrize("name", ["mlp_step", "asg_slice", "matmul_low_level"])
def test_postponed_programs_on_two_devices(backend, name):
    prog = bp.ALL[name]()
    devices, contexts = devices_and_contexts(backend, 2)
    for k, got in enumerate(bp.run_on(backend, contexts, prog, shared=False, devices=devices)):
        bp.check_outputs(prog, got, f"postponed, device {k}")


# ---------------------------------------------------------------- scheduling


def test_thousand_routines_on_two_devices_capture_their_static_values(backend):
    code, acc, s = counter_program()
    devices, contexts = devices_and_contexts(backend, 2)
    for ctx in contexts:
        acc.host_array()[...] = 0
        backend.from_host(ctx, acc)
    compiled = backend.compile((s,), code, shared=True, name="count")
    routines = [backend.link(ctx, compiled) for ctx in contexts]
    works = []
    for k in range(1000):
        routine = routines[k % 2]
        routine.bindings[s].value = k
        works.append(routine.schedule())
    for work in works:
        work()
    for device in devices:
        backend.await_(device)
    for d, ctx in enumerate(contexts):
        mine = range(d, 1000, 2)
        np.testing.assert_array_equal(result(backend, ctx, acc), [500, sum(mine), mine[-1]])


def test_scheduling_does_not_block(backend):
    code, out = busy_program()
    devices, contexts = devices_and_contexts(backend, 1)
    out.host_array()[...] = 0
    backend.from_host(contexts[0], out)
    routine = backend.link(contexts[0], backend.compile((), code, shared=True, name="busy"))
    start = time.perf_counter()
    for _ in range(3):
        routine.schedule()()
    scheduled = time.perf_counter() - start
    assert not devices[0].is_idle(), "the device should still be working"
    backend.await_(devices[0])
    assert devices[0].is_idle() and scheduled < time.perf_counter() - start


def test_devices_compute_without_holding_the_gil(backend):
    """While both devices run long C loops, the main thread keeps executing Python."""
    code, out = busy_program()
    devices, contexts = devices_and_contexts(backend, 2)
    compiled = backend.compile((), code, shared=True, name="busy_both")
    for ctx in contexts:
        out.host_array()[...] = 0
        backend.from_host(ctx, out)
    routines = [backend.link(ctx, compiled) for ctx in contexts]
    for _ in range(4):
        for routine in routines:
            routine.schedule()()
    spins = 0
    while not all(d.is_idle() for d in devices):
        spins += 1
    for device in devices:
        backend.await_(device)
    assert spins > 1000
    values = [result(backend, ctx, out)[0] for ctx in contexts]
    assert values[0] == values[1] > 0


# ---------------------------------------------------------------- failures


def _failing(name: str) -> Work:
    def run() -> None:
        raise ValueError(f"{name} broke")
    return Work(name, run)


def test_a_failing_work_is_reported_at_await_and_the_device_goes_on(backend):
    code, acc, s = counter_program(static_range=4)
    devices, contexts = devices_and_contexts(backend, 1)
    (device,), (ctx,) = devices, contexts
    acc.host_array()[...] = 0
    backend.from_host(ctx, acc)
    good = backend.link(ctx, backend.compile((s,), code, shared=True, name="good"))
    good.bindings[s].value = 1
    good.schedule()()
    device.enqueue(_failing("bad"))
    good.schedule()()
    with pytest.raises(RoutineFailed,
                       match=r"routine 'bad' failed on device multicore\(cc\):0: ValueError: bad broke") as info:
        backend.await_(device)
    assert info.value.routine_name == "bad" and isinstance(info.value.__cause__, ValueError)
    backend.await_(device)
    np.testing.assert_array_equal(result(backend, ctx, acc), [2, 2, 1])


def test_an_out_of_range_static_value_is_refused_when_scheduled(backend):
    code, acc, s = counter_program(static_range=4)
    (device,), (ctx,) = devices_and_contexts(backend, 1)
    acc.host_array()[...] = 0
    backend.from_host(ctx, acc)
    bad = backend.link(ctx, backend.compile((s,), code, shared=True, name="bad"))
    bad.bindings[s].value = 7
    with pytest.raises(StaticRangeError, match=r"routine 'bad': static symbol s\d+<4> = 7 is outside its range "
                                               r"\[0, 4\); set its IntRef"):
        bad.schedule()
    with pytest.raises(StaticRangeError):
        bad()
    backend.await_(device)
    np.testing.assert_array_equal(result(backend, ctx, acc), [0, 0, 0])
    bad.bindings[s].value = 3
    for _ in range(5):
        bad()
    np.testing.assert_array_equal(result(backend, ctx, acc), [5, 15, 3])


def test_several_failures_are_all_named(backend):
    (device,), _ = devices_and_contexts(backend, 1)
    for _ in range(3):
        device.enqueue(_failing("r"))
    with pytest.raises(RoutineFailed, match=r"and 2 more failures: 'r': ValueError, 'r': ValueError"):
        backend.await_(device)


def test_device_misuse_is_reported(backend):
    with pytest.raises(DeviceError, match=r"device multicore\(cc\):1 was never initialized; call init\(device\)"):
        backend.await_(backend.get_device(1))
    with pytest.raises(DeviceError, match=r"has devices 0..1, not 2"):
        backend.get_device(2)
    with MulticoreBackend(CcBackend(), num_devices=1) as other:
        foreign = other.get_device(0)
        with pytest.raises(WrongBackendError, match="is not a device of backend multicore"):
            backend.init(foreign)
        ctx = other.init(foreign)
        code, _ = fill_program()
        with pytest.raises(WrongBackendError, match="is not a context of backend multicore"):
            backend.link(ctx, backend.compile((), code, shared=True, name="x"))


def test_code_of_another_backend_cannot_be_linked(backend):
    from einjit.backends.interface import Postponed

    code, _ = fill_program()
    (_,), (ctx,) = devices_and_contexts(backend, 1)
    with pytest.raises(WrongBackendError, match=r"compiled by backend 'cuda' and cannot be linked into context "
                                                r"'multicore\(cc\):0/\d+' .* of backend 'multicore\(cc\)'"):
        backend.link(ctx, Postponed("cuda", code, (), "foreign"))


# ---------------------------------------------------------------- transfers


def merge_program():
    """acc += merge(acc): the partial sums of two devices combined on one of them."""
    acc = Tnode("acc", (4,), ops.double, memory_mode=tnode.hosted())
    i = get_symbol()
    merge = ll.ForLoop(i, 0, 3, ll.Set(acc, (Iterator(i),), B(ops.Binop.ADD, ll.Get(acc, (Iterator(i),)),
                                                              ll.GetMergeBuffer(acc, (Iterator(i),)))))
    s, j = get_static_symbol(), get_symbol()
    bump = ll.ForLoop(j, 0, 3, ll.Set(acc, (Iterator(j),), B(ops.Binop.ADD, ll.Get(acc, (Iterator(j),)),
                                                             ll.EmbedIndex(Iterator(s.symbol)))))
    return acc, merge, bump, s


def test_device_to_device_copies_are_ordered_with_both_devices(backend):
    acc, merge, bump, s = merge_program()
    devices, (ctx0, ctx1) = devices_and_contexts(backend, 2)
    acc.host_array()[...] = 0
    backend.from_host(ctx0, acc)
    backend.from_host(ctx1, acc)
    merge0 = backend.link(ctx0, backend.compile((), merge, shared=True, name="merge"))
    bump_code = backend.compile((s,), bump, shared=True, name="bump")
    bump0, bump1 = backend.link(ctx0, bump_code), backend.link(ctx1, bump_code)
    expected0 = expected1 = 0
    for step in range(1, 40):
        bump1.bindings[s].value = step
        bump1()
        expected1 += step
        backend.device_to_device(acc, ctx0, ctx1)
        bump1.bindings[s].value = 1000
        bump1()
        merge0()
        expected0 += expected1
        expected1 += 1000
        bump0.bindings[s].value = 1
        bump0()
        expected0 += 1
    for device in devices:
        backend.await_(device)
    np.testing.assert_array_equal(result(backend, ctx0, acc), [expected0] * 4)
    np.testing.assert_array_equal(result(backend, ctx1, acc), [expected1] * 4)


def test_device_to_device_on_one_device_and_into_the_array(backend):
    acc, merge, bump, s = merge_program()
    (device,), (ctx0,) = devices_and_contexts(backend, 1)
    ctx1 = backend.init(device)
    acc.host_array()[...] = 5
    backend.from_host(ctx0, acc)
    with pytest.raises(NodeNotInContextError, match=r"device_to_device into '.*/0': context '.*/1' .* does not hold"):
        backend.device_to_device(acc, ctx0, ctx1)
    backend.device_to_device(acc, ctx1, ctx0, into_merge_buffer=False)
    backend.link(ctx1, backend.compile((), merge, shared=True, name="merge1"))
    backend.device_to_device(acc, ctx1, ctx0)
    backend.link(ctx1, backend.compile((), merge, shared=True, name="merge2"))()
    backend.await_(device)
    np.testing.assert_array_equal(result(backend, ctx1, acc), [10] * 4)


def test_host_transfers_are_ordered_with_scheduled_work(backend):
    acc, _, bump, s = merge_program()
    (device,), (ctx,) = devices_and_contexts(backend, 1)
    acc.host_array()[...] = 1
    backend.from_host(ctx, acc)
    routine = backend.link(ctx, backend.compile((s,), bump, shared=True, name="bump_host"))
    routine.bindings[s].value = 2
    for _ in range(50):
        routine.schedule()()
    acc.host_array()[...] = 7
    backend.from_host(ctx, acc)
    routine.schedule()()
    np.testing.assert_array_equal(result(backend, ctx, acc), [9] * 4)
    backend.await_(device)


def test_a_node_of_another_devices_context_is_not_there(backend):
    acc, _, bump, s = merge_program()
    _, (ctx0, ctx1) = devices_and_contexts(backend, 2)
    acc.host_array()[...] = 0
    backend.from_host(ctx0, acc)
    compiled = backend.compile((s,), bump, shared=True, name="bump_other")
    backend.link(ctx0, compiled)
    with pytest.raises(NodeNotInContextError, match=r"reads acc#\d+ before writing it, but context "
                                                    r"'multicore\(cc\):1/\d+'.*transfer it with from_host"):
        backend.link(ctx1, compiled)
    with pytest.raises(NodeNotInContextError, match="to_host"):
        backend.to_host(ctx1, acc)
