"""The CUDA backend's host side — devices, contexts, buffers, kernel parameters, captured
static values, transfers, awaiting — against a fake driver that keeps device memory in NumPy
and runs each launched kernel's plan on the reference interpreter, with the threads' shared
loops run backwards. Needs neither a GPU nor a CUDA compiler."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

import backend_programs as bp
from einjit.backends.c_syntax import ParamKind
from einjit.backends.gpu import cuda
from einjit.backends.interface import NodeNotInContextError, NotHostedError, RoutineFailed
from einjit.ir import interpret, ops, tnode
from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, Iterator, get_static_symbol, get_symbol
from einjit.ir.tnode import Tnode
from test_cuda_render import reversed_threads

B = ll.Binop


class FakeDriver:
    """Device memory is a dict of byte arrays; a launch interprets the kernel's plan."""

    def __init__(self, n_devices: int = 2):
        self.n_devices = n_devices
        self.memory: dict[int, np.ndarray] = {}
        self.kernels: dict[str, cuda.CudaKernel] = {}
        self.launches: list[tuple[str, int, int, bool]] = []
        self.fail_next_sync = 0
        self.loaded: list[bytes] = []
        self.largest_block = 1024
        self._ids = itertools.count(0x1000, 0x1000)

    def error_text(self, code: int) -> str:
        return f"CUDA_ERROR_FAKE ({code}): injected"

    def device_count(self) -> int:
        return self.n_devices

    def device(self, ordinal: int) -> int:
        return ordinal

    def attribute(self, dev: int, attr: int) -> int:
        return {75: 9, 76: 0, 16: 4, 95: 1}.get(attr, 1024)

    def device_name(self, dev: int) -> str:
        return f"Fake GPU {dev}"

    def primary_context(self, dev: int) -> int:
        return 100 + dev

    def set_current(self, ctx: int) -> None:
        assert ctx is not None

    def stream_create(self) -> int:
        return next(self._ids)

    def stream_synchronize(self, stream: int) -> int:
        code, self.fail_next_sync = self.fail_next_sync, 0
        return code

    def event_after(self, stream: int) -> int:
        return next(self._ids)

    def stream_wait(self, stream: int, event: int) -> None:
        pass

    def alloc(self, nbytes: int, stream: int) -> int:
        ptr = next(self._ids) * 0x10000
        self.memory[ptr] = np.zeros(max(1, nbytes), dtype=np.uint8)
        return ptr

    def free(self, ptr: int) -> None:
        del self.memory[ptr]

    def copy_to_device(self, dst: int, host_ptr: int, nbytes: int, stream: int) -> None:
        self.memory[dst][:nbytes] = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(host_ptr))

    def copy_to_host(self, host_ptr: int, src: int, nbytes: int, stream: int) -> None:
        np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(host_ptr))[...] = self.memory[src][:nbytes]

    def copy_on_device(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.memory[dst][:nbytes] = self.memory[src][:nbytes]

    def copy_peer(self, dst: int, dst_ctx: int, src: int, src_ctx: int, nbytes: int, stream: int) -> None:
        assert dst_ctx != src_ctx
        self.copy_on_device(dst, src, nbytes, stream)

    def load_module(self, image: bytes, kind: str) -> int:
        assert image.startswith(b"fake ") and kind in ("ptx", "cubin")
        self.loaded.append(image)
        return next(self._ids)

    def function(self, module: int, name: str) -> str:
        return name

    def max_active_blocks(self, fn: str, block: int) -> int:
        return 2 if block <= self.largest_block else 0

    def launch(self, fn: str, blocks: int, threads: int, stream: int, params: ctypes.Array, cooperative: bool,
               name: str) -> None:
        kernel = self.kernels[fn]
        self.launches.append((fn, blocks, threads, cooperative))
        arrays, merges, env = {}, {}, {}
        for k, p in enumerate(kernel.rendered.params):
            if p.kind is ParamKind.STATIC:
                env[p.static.symbol] = ctypes.cast(params[k], ctypes.POINTER(ctypes.c_int)).contents.value
                continue
            ptr = ctypes.cast(params[k], ctypes.POINTER(ctypes.c_uint64)).contents.value
            view = self.memory[ptr][:p.tn.size * p.tn.prec.itemsize].view(p.tn.prec.dtype).reshape(p.tn.dims)
            (arrays if p.kind is ParamKind.ARRAY else merges)[p.tn] = view
        interpret.run(reversed_threads(kernel.plan), arrays, env, merges)


@pytest.fixture
def fake(monkeypatch):
    driver = FakeDriver()

    def fake_compile(source, *, name, arch, kind, options=None):
        cuda.stats.compiler_invocations += 1
        return f"fake {kind} {arch} {name}".encode()

    real_compile_program = cuda.compile_program

    def recording_compile_program(*args, **kwargs):
        procs = real_compile_program(*args, **kwargs)
        driver.kernels.update({p.name: p.kernel for p in procs})
        return procs

    monkeypatch.setattr(cuda, "load_driver", lambda: driver)
    monkeypatch.setattr(cuda, "compile_source", fake_compile)
    monkeypatch.setattr(cuda, "compile_program", recording_compile_program)
    return driver


def result(backend, ctx, tn):
    backend.to_host(ctx, tn)
    return tn.host_array().copy()


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per_device"])
@pytest.mark.parametrize("name", sorted(bp.ALL))
def test_programs_through_the_host_side(fake, name, shared):
    backend = cuda.CudaBackend()
    devices = [backend.get_device(k) for k in range(2)]
    contexts = [backend.init(d) for d in devices]
    prog = bp.ALL[name]()
    for k, got in enumerate(bp.run_on(backend, contexts, prog, shared=shared, devices=devices)):
        bp.check_outputs(prog, got, f"fake device {k}")
    images = {tuple(image.split()[1:3]) for image in fake.loaded}
    assert images == ({(b"ptx", b"compute_90")} if shared else {(b"cubin", b"sm_90")})
    assert len(fake.loaded) == 2, "one module per device"
    for ctx in contexts:
        backend.release(ctx)
        assert not ctx.buffers


def test_launch_configuration(fake):
    backend = cuda.CudaBackend()
    device = backend.get_device(0)
    ctx = backend.init(device)
    prog = bp.matmul_low_level()
    bp.run_on(backend, [ctx], prog, shared=True, devices=[device])
    assert fake.launches[-1] == ("matmul_low_level", 2, 256, True)
    prog = bp.pointwise_chain()
    bp.run_on(backend, [ctx], prog, shared=True, devices=[device])
    assert fake.launches[-1] == ("pointwise_chain", 2, 256, False)
    big, i, j = Tnode("big", (1000, 100)), get_symbol(), get_symbol()
    fill = ll.ForLoop(i, 0, 999, ll.ForLoop(j, 0, 99, ll.Set(big, (Iterator(i), Iterator(j)), ll.Constant(1.0))))
    scale = ll.ForLoop(i, 0, 999, ll.Set(big, (Iterator(i), FixedIdx(0)), ll.Get(big, (Iterator(i), FixedIdx(1)))))
    for code, config in [(fill, (4 * 32, 256, False)), (ll.seq(fill, scale), (4 * 2, 256, True))]:
        proc = backend.compile((), code, shared=True, name="big").procedure
        fn = fake.function(device.module(proc.image), "big")
        assert backend.core._launch_config(device, fn, proc) == config
    fake.largest_block = 64
    assert backend.core._launch_config(device, fn, proc) == (4 * 2, 64, True)
    fake.largest_block = 16
    with pytest.raises(cuda.CudaError, match="cannot keep even one block of 32 threads resident"):
        backend.core._launch_config(device, fn, proc)
    assert repr(device) == "<CudaDevice cuda:0 Fake GPU 0 sm_90>"


def test_static_values_are_captured_when_scheduled(fake):
    backend = cuda.CudaBackend()
    device = backend.get_device(1)
    ctx = backend.init(device)
    acc = Tnode("acc", (2,), ops.int64, memory_mode=tnode.hosted())
    s = get_static_symbol(50)
    code = ll.seq(ll.Set(acc, (FixedIdx(0),), B(ops.Binop.ADD, ll.Get(acc, (FixedIdx(0),)), ll.Constant(1))),
                  ll.Set(acc, (FixedIdx(1),), B(ops.Binop.ADD, ll.Get(acc, (FixedIdx(1),)),
                                                ll.EmbedIndex(Iterator(s.symbol)))))
    acc.host_array()[...] = 0
    backend.from_host(ctx, acc)
    routine = backend.link(ctx, backend.compile((s,), code, shared=True, name="count"))
    works = []
    for k in range(50):
        routine.bindings[s].value = k
        works.append(routine.schedule())
    assert not fake.launches
    for w in works:
        w()
    backend.await_(device)
    np.testing.assert_array_equal(result(backend, ctx, acc), [50, sum(range(50))])
    routine.bindings[s].value = 50
    with pytest.raises(IndexError, match="outside its range"):
        routine()


def test_a_kernel_fault_names_the_routines_since_the_last_await(fake):
    backend = cuda.CudaBackend()
    device = backend.get_device(0)
    ctx = backend.init(device)
    out = Tnode("out", (3,))
    i = get_symbol()
    routine = backend.link(ctx, backend.compile((), ll.ForLoop(i, 0, 2, ll.Set(out, (Iterator(i),), ll.Constant(
        2.0))), shared=True, name="fill"))
    routine.schedule()()
    routine.schedule()()
    fake.fail_next_sync = 700
    with pytest.raises(RoutineFailed, match=r"work on device cuda:0 failed: CUDA_ERROR_FAKE \(700\).*"
                                            r"since the last await \(the last 20 at most\): \['fill', 'fill'\]"):
        backend.await_(device)
    backend.await_(device)
    np.testing.assert_array_equal(result(backend, ctx, out), [2, 2, 2])


def test_device_to_device_between_devices_and_transfers_need_the_node(fake):
    backend = cuda.CudaBackend()
    d0, d1 = backend.get_device(0), backend.get_device(1)
    c0, c1 = backend.init(d0), backend.init(d1)
    acc = Tnode("acc", (4,), ops.double, memory_mode=tnode.hosted())
    i = get_symbol()
    merge = ll.ForLoop(i, 0, 3, ll.Set(acc, (Iterator(i),), B(ops.Binop.ADD, ll.Get(acc, (Iterator(i),)),
                                                             ll.GetMergeBuffer(acc, (Iterator(i),)))))
    acc.host_array()[...] = [1, 2, 3, 4]
    backend.from_host(c0, acc)
    with pytest.raises(NodeNotInContextError, match=r"device_to_device into 'cuda:0/\d+': context 'cuda:1/\d+'"):
        backend.device_to_device(acc, c0, c1)
    backend.device_to_device(acc, c1, c0, into_merge_buffer=False)
    backend.device_to_device(acc, c0, c1)
    backend.link(c0, backend.compile((), merge, shared=True, name="merge"))()
    backend.await_(d0)
    np.testing.assert_array_equal(result(backend, c0, acc), [2, 4, 6, 8])
    np.testing.assert_array_equal(result(backend, c1, acc), [1, 2, 3, 4])
    v = Tnode("v", (2,), memory_mode=tnode.VIRTUAL)
    with pytest.raises(NotHostedError, match=r"from_host of v#\d+ in context 'cuda:0/0' \(backend 'cuda'\): "
                                             r"the node is not hosted \(memory mode Virtual"):
        backend.from_host(c0, v)
    with pytest.raises(NotHostedError, match=r"to_host of v#\d+ .*make it hosted"):
        backend.to_host(c0, v)


def test_moons_trains_on_the_cuda_backend_as_on_the_c_backend(fake, monkeypatch):
    """The demo's single-device step reads its loss from the host array, which on a device
    exists only once the routine copied the loss back (the first real-GPU run failed there)."""
    from einjit import backends
    from einjit.demos.moons import run_moons

    on_cpu = run_moons(epochs=2, batch_size=10, n_points=40, quiet=True)
    monkeypatch.setitem(backends._made, "cuda", cuda.CudaBackend())
    monkeypatch.setenv("EINJIT_BACKEND", "cuda")
    on_fake = run_moons(epochs=2, batch_size=10, n_points=40, quiet=True)
    assert fake.launches, "the training steps ran on the (fake) CUDA device"
    np.testing.assert_allclose(on_fake.losses, on_cpu.losses, rtol=1e-4, atol=1e-6)
    assert on_fake.accuracy == on_cpu.accuracy


def _momentum_losses(context, steps=3):
    """Losses of `steps` SGD-with-momentum steps of a small MLP whose parameters are set from
    a fixed generator; its momentum is hosted state that nothing wrote before the first step."""
    import einjit as ej
    from einjit import fit, nn, train

    rng = np.random.default_rng(3)
    xs, ys = rng.standard_normal((8, 5)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32)
    model = nn.Sequential(nn.Linear(5, 4, label="l1"), nn.ReLU(), nn.Linear(4, 3, label="l2"))
    x, y = ej.input("x", batch_dims=[8], output_dims=[5]), ej.input("y", batch_dims=[8], prec="int32")
    loss = nn.cross_entropy(model(x), y)
    opt = nn.SGD(model.params(), 0.5, momentum=0.9)
    train.init_params(loss)
    for p in model.params():
        p.value_tn.host_array()[...] = rng.standard_normal(p.value_tn.dims)
    step = fit.train_step(loss, opt.update(), inputs=[x, y], name="momentum_step", context=context)
    losses = []
    for _ in range(steps):
        step(xs, ys)
        losses.append(step.loss_value())
    return losses


def test_hosted_momentum_starts_at_zero_in_contexts_with_their_own_arrays(fake):
    """The momentum is hosted but has no host array before the first step: the C backend's
    default context computes in a zeroed host array; a device context (and a C context with
    its own arrays) starts it at zero too, instead of refusing to link (the first GPU run)."""
    from einjit import backends

    want = _momentum_losses(None)
    assert want[2] < want[0]
    np.testing.assert_allclose(_momentum_losses(backends.get("cc").init("own_arrays")), want, rtol=1e-6)
    device_backend = cuda.CudaBackend()
    on_device = _momentum_losses(device_backend.init(device_backend.get_device(0)))
    assert fake.launches
    np.testing.assert_allclose(on_device, want, rtol=1e-5)
