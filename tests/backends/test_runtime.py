"""The one runtime: the backend registry, `train.to_routine` on every backend, the seed's
`Routine` (callable and `schedule()`), the process's contexts, checks made before C runs."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import backends, train
from einjit.backends import interface
from einjit.backends.cc.backend import CcBackend
from einjit.backends.cc.multicore import MulticoreBackend
from einjit.backends.interface import (
    NodeNotInContextError,
    NotHostedError,
    Routine,
    StaticRangeError,
    Work,
)
from einjit.ir import low_level as ll
from einjit.ir import ops, tnode
from einjit.ir.indexing import FixedIdx, IntRef, get_static_symbol
from test_cuda_fake_driver import fake  # noqa: F401 - the fake CUDA driver fixture


def doubled(values):
    x = ej.ndarray(np.array(values, dtype=np.float32), label="x")
    y = 2.0 * x + 1.0
    return x, y


def test_registry_names_and_default(monkeypatch):
    assert backends.names() == ["cc", "multicore", "cuda"]
    assert isinstance(backends.get("cc"), CcBackend) and backends.get("cc") is backends.get("cc")
    assert isinstance(backends.get("multicore"), MulticoreBackend)
    monkeypatch.delenv("EINJIT_BACKEND", raising=False)
    assert backends.get() is backends.get("cc")
    monkeypatch.setenv("EINJIT_BACKEND", "multicore")
    assert backends.get() is backends.get("multicore")
    monkeypatch.setenv("EINJIT_BACKEND", "tpu")
    with pytest.raises(backends.UnknownBackendError, match=r"no backend named 'tpu' \(from \$EINJIT_BACKEND\); the "
                                                           r"backends are 'cc', 'multicore', 'cuda'"):
        backends.get()
    mine = CcBackend()
    assert backends.resolve(mine) is mine and backends.resolve("cc") is backends.get("cc")


def test_to_routine_returns_the_seed_routine_on_the_host_arrays():
    x, y = doubled([1.0, 2.0, 3.0])
    routine = train.to_routine(train.forward(y), name="twice")
    assert isinstance(routine, Routine) and routine.name == "twice"
    assert routine.context is interface.default_context(backends.get("cc"))
    routine()
    np.testing.assert_allclose(y.value.numpy(), [3.0, 5.0, 7.0], rtol=0, atol=0)
    x.value_tn.host_array()[...] = [10.0, 20.0, 30.0]
    work = routine.schedule()
    assert isinstance(work, Work)
    np.testing.assert_allclose(y.value.numpy(), [3.0, 5.0, 7.0], rtol=0, atol=0)
    work()
    np.testing.assert_allclose(y.value.numpy(), [21.0, 41.0, 61.0], rtol=0, atol=0)
    assert interface.contexts_holding(y.value_tn)[0] is routine.context


@pytest.mark.parametrize("name", ["multicore", "cuda"])
def test_to_routine_on_a_device_backend(name, request):
    if name == "cuda":
        request.getfixturevalue("fake")
    backend = backends.resolve(name) if name == "multicore" else __import__(
        "einjit.backends.gpu.cuda", fromlist=["CudaBackend"]).CudaBackend()
    x, y = doubled([1.0, -2.0])
    value = train.forward(y)
    routine = train.to_routine(value, name="double_dev", backend=backend)
    assert routine.context.backend is backend and routine.context.holds(x.value_tn)
    routine()
    np.testing.assert_allclose(y.value.numpy(), [3.0, -3.0], rtol=0, atol=0)
    y.value_tn.host_array()[...] = 0.0
    routine.schedule()()
    backend.await_(routine.context.device)
    np.testing.assert_allclose(y.value_tn.host_array(), [0.0, 0.0], rtol=0, atol=0)
    assert routine.context in interface.contexts_holding(y.value_tn)
    x.value_tn.host_array()[...] = [4.0, 5.0]
    for ctx in interface.contexts_holding(x.value_tn):
        ctx.from_host(x.value_tn)
    routine()
    np.testing.assert_allclose(y.value.numpy(), [9.0, 11.0], rtol=0, atol=0)


def test_forward_once_on_multicore_matches_cc():
    _, y = doubled([0.5, 1.5])
    _, y2 = doubled([0.5, 1.5])
    np.testing.assert_allclose(train.forward_once(y, backend="multicore"), train.forward_once(y2), rtol=0, atol=0)


def test_static_values_are_checked_in_python_before_any_c_runs():
    s = get_static_symbol(3, "batch")
    data = ej.ndarray(np.arange(6, dtype=np.float32).reshape(3, 2), batch_axes=1, label="data")
    out = ej.batch_slice(data, s) * 1.0
    ref = IntRef(0)
    routine = train.to_routine(train.forward(out), bindings={s: ref}, name="slice_once")
    ref.value = 2
    routine()
    np.testing.assert_allclose(out.value.numpy().ravel(), [4.0, 5.0], rtol=0, atol=0)
    ref.value = 3
    with pytest.raises(StaticRangeError, match=r"routine 'slice_once': static symbol batch\d+<3> = 3 is outside its "
                                               r"range \[0, 3\)"):
        routine()
    with pytest.raises(StaticRangeError):
        routine.schedule()
    np.testing.assert_allclose(out.value.numpy().ravel(), [4.0, 5.0], rtol=0, atol=0)


def test_a_routine_reading_state_its_context_does_not_hold_names_it():
    backend = backends.get("cc")
    acc = tnode.Tnode("acc", (1,), memory_mode=tnode.hosted())
    at0 = (FixedIdx(0),)
    bump = ll.Set(acc, at0, ll.Binop(ops.Binop.ADD, ll.Get(acc, at0), ll.Constant(1.0)))
    ctx = backend.init("private")
    with pytest.raises(NodeNotInContextError, match=r"routine 'bump' reads acc#\d+ before writing it, but context "
                                                    r"'private' \(backend 'cc'\) does not hold it; transfer it with "
                                                    r"from_host"):
        backend.link(ctx, backend.compile((), bump, shared=True, name="bump"))
    with pytest.raises(NotHostedError, match=r"from_host of acc#\d+ into context 'private' .*no host array yet"):
        ctx.from_host(acc)
    acc.host_array()[...] = 41.0
    ctx.from_host(acc)
    backend.link(ctx, backend.compile((), bump, shared=True, name="bump"))()
    ctx.to_host(acc)
    assert acc.host_array()[0] == 42.0


def test_non_hosted_nodes_refuse_host_transfers_on_every_context():
    x, _ = doubled([1.0, 2.0])
    hidden = 3.0 * x
    out = hidden + 1.0
    routine = train.to_routine(train.forward(out), name="hidden")
    routine()
    assert hidden.value_tn.is_virtual()
    with pytest.raises(NotHostedError, match=r"to_host of .*#\d+ in context 'default' \(backend 'cc'\): the node is "
                                             r"not hosted \(memory mode Virtual, provenance 15: virtual"):
        routine.context.to_host(hidden.value_tn)
    assert hidden.value_tn.array is None


def test_options_compile_with_other_flags_into_the_default_context():
    from einjit.backends.cc import toolchain as cc
    _, y = doubled([2.0])
    routine = train.to_routine(train.forward(y), name="o1", options=cc.CcOptions(flags=("-O1", "-fPIC", "-shared")))
    routine()
    np.testing.assert_allclose(y.value.numpy(), [5.0], rtol=0, atol=0)
    with pytest.raises(TypeError, match="options= are C compiler options"):
        train.to_routine(train.forward(doubled([1.0])[1]), backend="multicore", options=cc.CcOptions())


def test_contexts_holding_forgets_dead_contexts():
    n = tnode.Tnode("held", (2,), memory_mode=tnode.hosted())
    n.host_array()[...] = 1.0
    ctx = backends.get("cc").init("short_lived")
    ctx.from_host(n)
    assert ctx in interface.contexts_holding(n)
    del ctx
    import gc
    gc.collect()
    assert all(c.label != "short_lived" for c in interface.contexts_holding(n))


def test_a_routine_named_like_a_c_keyword_is_mangled_and_runs():
    _, y = doubled([1.0])
    routine = train.to_routine(train.forward(y), name="double")
    routine()
    np.testing.assert_array_equal(y.numpy(), [3.0])


def test_the_public_operations_are_the_operation_library():
    import einjit
    from einjit.tensor import operation
    public = einjit._operations()
    assert public["range"] == "range_" and {"relu", "where", "Batch", "batch_slice"} <= set(public)
    for api, name in public.items():
        if api not in einjit._PUBLIC:  # reductions and activations of their own modules take precedence
            assert getattr(ej, api) is getattr(operation, name)
    assert set(operation._UNARY) <= set(public) and set(public) <= set(ej.__all__)
    assert "_defs" not in public and "make_op" not in public and "np" not in ej.__all__


@pytest.mark.parametrize("name", ["cc", "multicore", "cuda"])
def test_host_transfers_of_a_non_hosted_node_are_named_errors_on_every_backend(name, request):
    if name == "cuda":
        request.getfixturevalue("fake")
        from einjit.backends.gpu.cuda import CudaBackend
        backend = CudaBackend()
    else:
        backend = backends.get(name)
    context = backend.init(backend.get_device(0)) if hasattr(backend, "get_device") else backend.init("plain")
    local = tnode.Tnode("scratch", (3,), memory_mode=tnode.LOCAL, provenance=17)
    for transfer in (context.from_host, context.to_host):
        with pytest.raises(NotHostedError, match=r"(from|to)_host of scratch#\d+ in(to)? context '.*' \(backend "
                                                 r"'.*'\): the node is not hosted \(memory mode Local, provenance 17: "
                                                 r"kept: it is still read where .*; make it hosted before compiling"):
            transfer(local)
    assert local.array is None and not context.holds(local)


def test_the_moons_demo_trains_identically_on_the_multicore_backend(monkeypatch):
    from einjit.demos.moons import run_moons
    monkeypatch.delenv("EINJIT_BACKEND", raising=False)
    on_cc = run_moons(epochs=3, quiet=True)
    monkeypatch.setenv("EINJIT_BACKEND", "multicore")
    on_multicore = run_moons(epochs=3, quiet=True)
    assert on_multicore.losses == on_cc.losses and on_multicore.accuracy == on_cc.accuracy
    assert on_cc.losses[-1] < on_cc.losses[0]


def test_atl_functions_compile_through_any_backend():
    from einjit.atl import Func, Gen, Idx, R, Sum, TTensor, Var
    i, j, k = Idx("i"), Idx("j"), Idx("k")
    a, b = Var("A"), Var("B")
    rnn = TTensor(3, TTensor(3, R))
    matmul = Func([("A", rnn), ("B", rnn)], Gen(i, 3, Gen(j, 3, Sum(k, 3, a[i, k] * b[k, j]))))
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    on_cc = matmul.compiled("einjit")
    on_multicore = matmul.compiled("einjit", einjit_backend="multicore")
    assert on_multicore.context.backend is backends.get("multicore") and on_multicore is not on_cc
    for _ in range(2):
        np.testing.assert_allclose(on_multicore(x, y), x @ y, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(on_multicore(x, y), on_cc(x, y))
        x = 2 * x
