"""The CUDA backend: kernels rendered by `cuda_syntax`, compiled by NVRTC or nvcc, launched
through the driver API (`cuda_driver`, plain ctypes; no PyCUDA).

Code follows seed 001's two regimes. Shared code is PTX for the oldest architecture among the
devices (or `CudaOptions.ptx_arch`): compiled once, loaded — JIT-compiled by the driver — on
every device it is linked on. Non-shared code is compiled at link time to a cubin for exactly
the context's device. Either way a batch of routines is one translation unit, one compiler
run. Compiled images are cached on disk by content hash, like the C backend's objects.

Devices, contexts, work:
- A device has one stream. Running a routine's work launches its kernel on that stream and
  returns at once; `await_(device)` synchronizes the stream. A kernel fault is reported there,
  naming the routines launched since the previous await (CUDA cannot tell which one faulted).
- A context is a set of device arrays (`GLOBAL` nodes) and merge buffers on one device. A
  routine reads only nodes its context holds: put there by `from_host`, by `device_to_device`,
  or allocated (zeroed) because a routine linked into the context writes them.
- `from_host` returns once the host data is staged (the host array may then change);
  `to_host` blocks until the copy arrived, and reports a failure of earlier work as
  `await_` does. `device_to_device` never blocks: the copy is
  ordered after the work already launched on both devices, and the source device waits for
  the copy before running later work, so it cannot overwrite the array mid-copy.

Nothing CUDA-specific is loaded at import: rendering and compiling work without a GPU (given
nvcc or NVRTC); the driver is loaded by the first call that needs a device.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
import time
from ctypes import c_int, c_uint64, c_void_p
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from einjit import config
from einjit.backends import cache
from einjit.backends.c_syntax import ParamKind
from einjit.backends.gpu.cuda_driver import (
    ATTR_COMPUTE_CAPABILITY_MAJOR,
    ATTR_COMPUTE_CAPABILITY_MINOR,
    ATTR_COOPERATIVE_LAUNCH,
    ATTR_MULTIPROCESSOR_COUNT,
    CudaError,
    CudaUnavailable,
    Driver,
    cuda_home,
    device_count,
    load_driver,
    load_nvrtc,
)
from einjit.backends.gpu.cuda_syntax import CudaKernel, CudaProgram, render_program
from einjit.backends.interface import (
    BackendUsageError,
    CudaMemClass,
    DeviceError,
    HostTransfers,
    NodeNotInContextError,
    Routine,
    RoutineFailed,
    SimpleNoDeviceBackend,
    Work,
    WrongBackendError,
    capture_values,
    check_hosted,
    check_static_values,
    low_level_of,
    make_refs,
    missing_input_error,
    not_held_error,
    register_context,
)
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.tnode import Tnode

__all__ = ["CudaBackend", "CudaContext", "CudaDevice", "CudaError", "CudaOptions", "CudaProcedure",
           "CudaUnavailable", "compile_source", "device_count", "stats"]

_ABI_VERSION = "einjit-cuda-1"
_DEFAULT_PTX_ARCH = "compute_75"
_MAX_DIAGNOSTICS = 8000
_NAMES_KEPT = 20
"""How many names of recently launched routines a device keeps for error messages."""


@dataclass(frozen=True)
class CudaOptions:
    """`compiler`: "auto" (NVRTC when found, else nvcc), "nvrtc" or "nvcc". `ptx_arch`: the
    virtual architecture of shared code (default: the oldest device's, else compute_75)."""

    compiler: str = "auto"
    nvcc: str = "nvcc"
    nvcc_flags: tuple[str, ...] = ("-O3",)
    nvrtc_flags: tuple[str, ...] = ()
    ptx_arch: str | None = None
    keep_source: bool = False


stats = cache.CacheStats()
"""The CUDA toolchains' cache counters (NVRTC and nvcc share the cache)."""


# ---------------------------------------------------------------- compiling


@lru_cache(maxsize=None)
def _nvcc_identity(nvcc: str) -> str | None:
    path = shutil.which(nvcc)
    if path is None:
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False, timeout=60)
    return f"{os.path.realpath(path)}\n{out.stdout}"


def _choose_compiler(options: CudaOptions) -> str:
    if options.compiler not in ("auto", "nvrtc", "nvcc"):
        raise BackendUsageError("einjit: CudaOptions.compiler must be 'auto', 'nvrtc' or 'nvcc', "
                                f"not {options.compiler!r}")
    if options.compiler in ("auto", "nvrtc") and load_nvrtc() is not None:
        return "nvrtc"
    if options.compiler in ("auto", "nvcc") and _nvcc_identity(options.nvcc) is not None:
        return "nvcc"
    wanted = {"auto": "NVRTC (libnvrtc) nor nvcc", "nvrtc": "NVRTC (libnvrtc)", "nvcc": f"nvcc ({options.nvcc!r})"}
    raise CudaUnavailable(f"einjit: no CUDA compiler: neither {wanted[options.compiler]} was found. Install the CUDA "
                          f"toolkit (nvcc, libnvrtc) or `pip install einjit[cuda]` with NVIDIA's nvrtc wheel, or set "
                          f"$CUDA_HOME")


def compile_source(source: str, *, name: str, arch: str, kind: str, options: CudaOptions | None = None) -> bytes:
    """PTX (`kind="ptx"`, `arch="compute_XY"`) or a cubin (`"cubin"`, `"sm_XY"`) for `source`,
    from the disk cache or freshly compiled."""
    options = options or CudaOptions()
    if kind not in ("ptx", "cubin"):
        raise BackendUsageError(f"einjit: CUDA images are 'ptx' or 'cubin', not {kind!r}")
    compiler = _choose_compiler(options)
    identity: str | None
    if compiler == "nvrtc":
        nvrtc = load_nvrtc()
        assert nvrtc is not None  # _choose_compiler picks NVRTC only when it loads
        identity, flags = f"nvrtc {nvrtc.path} {nvrtc.version}", options.nvrtc_flags
    else:
        identity, flags = _nvcc_identity(options.nvcc), options.nvcc_flags
        assert identity is not None  # _choose_compiler picks nvcc only when it is found
    start = time.perf_counter()

    def build(out: Path, _src: Path, kept: Path) -> None:
        run = _run_nvrtc(source, name, arch, kind, flags, kept) if compiler == "nvrtc" else \
            _run_nvcc(source, name, arch, kind, options, kept)
        out.write_bytes(run)
        config.debug(1, f"cuda: {name}: {compiler} {kind} for {arch} in {1000 * (time.perf_counter() - start):.1f} ms")

    config.debug(3, f"cuda: generated CUDA for {name}:\n{source}")
    built = cache.get_or_build("cuda", [_ABI_VERSION, identity, arch, kind, " ".join(flags), source],
                               suffix=f".{kind}", source=source, source_suffix=".cu", stats=stats, label=name,
                               keep_source=options.keep_source or config.debug_level() >= 3, build=build)
    return built.data


def _run_nvrtc(source: str, name: str, arch: str, kind: str, flags: tuple[str, ...], cu_path: Path) -> bytes:
    home = cuda_home()
    # CUDA 13 keeps libcu++ (needed by cooperative_groups.h) under include/cccl, which nvcc
    # adds by itself and NVRTC does not.
    dirs = [] if home is None else [home / "include", home / "include" / "cccl"]
    includes = tuple(f"-I{d}" for d in dirs if d.exists())
    nvrtc = load_nvrtc()
    assert nvrtc is not None  # _choose_compiler picks NVRTC only when it loads
    try:
        image, _ = nvrtc.compile(source, name, arch, kind, includes + tuple(flags))
    except CudaError as e:
        raise CudaError(f"{str(e)[:_MAX_DIAGNOSTICS]}\nthe generated source is kept at {cu_path}") from None
    return image


def _run_nvcc(source: str, name: str, arch: str, kind: str, options: CudaOptions, cu_path: Path) -> bytes:
    with tempfile.TemporaryDirectory(prefix="einjit-nvcc-") as tmp:
        src, out = Path(tmp) / f"{name}.cu", Path(tmp) / f"{name}.{kind}"
        src.write_text(source, encoding="utf-8")
        cmd = [options.nvcc, f"-{kind}", f"-arch={arch}", *options.nvcc_flags, "-o", str(out), str(src)]
        config.debug(3, f"cuda: {' '.join(cmd)}")
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not out.exists():
            diagnostics = (proc.stderr + proc.stdout).strip()[:_MAX_DIAGNOSTICS]
            raise CudaError(f"einjit: nvcc failed (exit {proc.returncode}) compiling {name} for {arch}; the generated "
                            f"source is kept at {cu_path}\ncommand: {' '.join(cmd)}\n{diagnostics}")
        return out.read_bytes()


@dataclass(eq=False)
class CudaImage:
    """A compiled translation unit, loaded (as a CUDA module) at most once per device."""

    program: CudaProgram = field(repr=False)
    data: bytes = field(repr=False)
    kind: str
    arch: str
    modules: dict[int, int] = field(default_factory=dict, repr=False)

    @property
    def source(self) -> str:
        return self.program.source


@dataclass(frozen=True, eq=False)
class CudaProcedure:
    """One kernel of a compiled image; `context` is set for code compiled for one context."""

    name: str
    image: CudaImage = field(repr=False)
    kernel: CudaKernel = field(repr=False)
    bindings: tuple[StaticSymbol, ...]
    context: "CudaContext | None" = field(default=None, repr=False)

    @property
    def mem_classes(self) -> Mapping[Tnode, CudaMemClass]:
        return self.kernel.plan.mem_classes


def compile_program(routines: Sequence[tuple[str, Any]], bindings: Sequence[StaticSymbol], *, arch: str, kind: str,
                    options: CudaOptions | None = None) -> list[CudaProcedure]:
    """Render routines into one source, compile it once, one procedure per kernel."""
    program = render_program([(n, getattr(c, "portable_llc", None) or low_level_of(c)) for n, c in routines],
                             tuple(bindings))
    label = "_".join(n for n, _ in routines)[:80] or "empty"
    for n, _ in routines:
        config.dump(n, "", "cu", program.source)
    data = compile_source(program.source, name=label, arch=arch, kind=kind, options=options)
    image = CudaImage(program, data, kind, arch)
    return [CudaProcedure(k.name, image, k, tuple(bindings)) for k in program.kernels]


# ---------------------------------------------------------------- devices and contexts


class CudaDevice:
    """One GPU: its primary CUDA context and the stream all its work goes to."""

    def __init__(self, backend_name: str, driver: Driver, ordinal: int):
        self.backend_name = backend_name
        self.driver = driver
        self.ordinal = ordinal
        self.label = f"{backend_name}:{ordinal}"
        self.handle = driver.device(ordinal)
        self.name = driver.device_name(self.handle)
        self.capability = (driver.attribute(self.handle, ATTR_COMPUTE_CAPABILITY_MAJOR),
                           driver.attribute(self.handle, ATTR_COMPUTE_CAPABILITY_MINOR))
        self.sm_count = driver.attribute(self.handle, ATTR_MULTIPROCESSOR_COUNT)
        self.cooperative = bool(driver.attribute(self.handle, ATTR_COOPERATIVE_LAUNCH))
        self.ctx: int | None = None
        self.stream: int | None = None
        self._launched: list[str] = []
        self._lock = threading.Lock()

    @property
    def started_ctx(self) -> int:
        """The context, once `start` made it."""
        if self.ctx is None:
            raise BackendUsageError(f"einjit: CUDA device {self.label} is used before it was started")
        return self.ctx

    @property
    def started_stream(self) -> int:
        """The stream, once `start` made it."""
        if self.stream is None:
            raise BackendUsageError(f"einjit: CUDA device {self.label} is used before it was started")
        return self.stream

    def __repr__(self) -> str:
        return f"<CudaDevice {self.label} {self.name} sm_{self.capability[0]}{self.capability[1]}>"

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def initialized(self) -> bool:
        return self.stream is not None

    def start(self) -> None:
        with self._lock:
            if self.stream is None:
                self.ctx = self.driver.primary_context(self.handle)
                self.driver.set_current(self.ctx)
                self.stream = self.driver.stream_create()

    def activate(self) -> None:
        """Make this device's context current in the calling thread."""
        self.driver.set_current(self.started_ctx)

    def module(self, image: CudaImage) -> int:
        with self._lock:
            if self.ordinal not in image.modules:
                self.activate()
                image.modules[self.ordinal] = self.driver.load_module(image.data, image.kind)
            return image.modules[self.ordinal]

    def launch(self, fn: int, blocks: int, threads: int, params: ctypes.Array, cooperative: bool, name: str) -> None:
        self.activate()
        self.driver.launch(fn, blocks, threads, self.started_stream, params, cooperative, name)
        with self._lock:
            self._launched.append(name)
            if len(self._launched) > 2 * _NAMES_KEPT:
                del self._launched[:-_NAMES_KEPT]

    def synchronize(self) -> tuple[int, list[str]]:
        """Wait for the stream: (CUresult, names of the kernels launched since the last call)."""
        self.activate()
        code = self.driver.stream_synchronize(self.started_stream)
        with self._lock:
            launched, self._launched = self._launched, []
        return code, launched


@dataclass(eq=False)
class CudaContext(HostTransfers):
    """Device arrays and merge buffers of one context, on one device."""

    label: str
    backend_name: str
    device: CudaDevice
    buffers: dict[Tnode, int] = field(default_factory=dict, repr=False)
    merge_buffers: dict[Tnode, int] = field(default_factory=dict, repr=False)
    backend: Any = field(default=None, repr=False)

    def holds(self, tn: Tnode) -> bool:
        return tn in self.buffers


def _nbytes(tn: Tnode) -> int:
    return tn.size * tn.prec.itemsize


def _host_array(what: str, tn: Tnode, context: CudaContext) -> np.ndarray:
    check_hosted(what, tn, context)
    arr = tn.host_array()
    if arr.dtype != tn.prec.dtype or tuple(arr.shape) != tuple(tn.dims) or not arr.flags.c_contiguous:
        raise BackendUsageError(f"einjit: host array of {tn.debug_name()} must be a C-contiguous {tn.prec.dtype} "
                                f"array of shape {tn.dims}, got {arr.dtype} {arr.shape}")
    return arr


class CudaCore:
    """The `SimpleBackend` part of the CUDA backend, plus the devices it runs on."""

    def __init__(self, options: CudaOptions, name: str):
        self.options = options
        self.name = name
        self._devices: dict[int, CudaDevice] = {}
        self._lock = threading.Lock()
        self._context_ids = itertools.count()

    @property
    def driver(self) -> Driver:
        return load_driver()

    # -- devices

    def num_devices(self) -> int:
        return self.driver.device_count()

    def get_device(self, ordinal: int) -> CudaDevice:
        n = self.num_devices()
        if not 0 <= ordinal < n:
            raise DeviceError(f"einjit: backend {self.name} sees {n} CUDA device(s); there is no device {ordinal}")
        with self._lock:
            if ordinal not in self._devices:
                self._devices[ordinal] = CudaDevice(self.name, self.driver, ordinal)
            return self._devices[ordinal]

    def check_device(self, device: Any) -> CudaDevice:
        if not isinstance(device, CudaDevice) or self._devices.get(device.ordinal) is not device:
            raise WrongBackendError(f"einjit: {device!r} is not a device of backend {self.name}")
        return device

    def init(self, device: CudaDevice) -> CudaContext:
        device = self.check_device(device)
        device.start()
        return CudaContext(f"{device.label}/{next(self._context_ids)}", self.name, device)

    def owns(self, context: Any) -> bool:
        return isinstance(context, CudaContext) and context.backend_name == self.name \
            and self._devices.get(context.device.ordinal) is context.device

    def await_(self, device: CudaDevice) -> None:
        device = self.check_device(device)
        if not device.initialized:
            raise DeviceError(f"einjit: device {device.label} was never initialized; call init(device) before "
                              f"scheduling work on it or awaiting it")
        code, launched = device.synchronize()
        if code != 0:
            culprit = launched[-1] if launched else ""
            raise RoutineFailed(f"einjit: work on device {device.label} failed: {self.driver.error_text(code)}; "
                                f"routines launched since the last await (the last {_NAMES_KEPT} at most): "
                                f"{launched[-_NAMES_KEPT:]}", culprit, device)

    def _ptx_arch(self) -> str:
        if self.options.ptx_arch:
            return self.options.ptx_arch
        try:
            caps = [self.get_device(k).capability for k in range(self.num_devices())]
        except (CudaUnavailable, CudaError):
            caps = []
        return f"compute_{min(caps)[0]}{min(caps)[1]}" if caps else _DEFAULT_PTX_ARCH

    # -- SimpleBackend

    def compile_batch(self, routines: Sequence[tuple[str, Any]], bindings: Sequence[StaticSymbol], *,
                      context: CudaContext | None = None) -> list[CudaProcedure]:
        if context is None:
            return compile_program(routines, bindings, arch=self._ptx_arch(), kind="ptx", options=self.options)
        procs = compile_program(routines, bindings, arch=context.device.arch, kind="cubin", options=self.options)
        return [CudaProcedure(p.name, p.image, p.kernel, p.bindings, context) for p in procs]

    def _buffer(self, context: CudaContext, tn: Tnode, merge: bool = False) -> int:
        table = context.merge_buffers if merge else context.buffers
        if tn not in table:
            context.device.activate()
            table[tn] = self.driver.alloc(_nbytes(tn), context.device.started_stream)
        return table[tn]

    def link_compiled(self, context: CudaContext, procedure: CudaProcedure, inputs: frozenset[Tnode],
                      static_values: Mapping[StaticSymbol, IntRef] | None = None) -> Routine[CudaContext]:
        name, device = procedure.name, context.device
        if procedure.context is not None and procedure.context is not context:
            raise NodeNotInContextError(
                f"einjit: routine {name!r} was compiled for context {procedure.context.label!r} (not shared); it "
                f"cannot run in context {context.label!r} — compile with shared=True")
        args: list[c_uint64] = []
        for p in procedure.kernel.rendered.params:
            match p.kind:
                case ParamKind.ARRAY:
                    if p.tn in inputs and not context.holds(p.tn):
                        raise missing_input_error(name, p.tn, context, hosted_hint=True)
                    args.append(c_uint64(self._buffer(context, p.node)))
                case ParamKind.MERGE_BUFFER:
                    args.append(c_uint64(self._buffer(context, p.node, merge=True)))
        fn = self.driver.function(device.module(procedure.image), name)
        blocks, threads, cooperative = self._launch_config(device, fn, procedure)
        statics = procedure.bindings
        refs = make_refs(statics, static_values)

        def schedule() -> Work:
            values = capture_values(refs)
            check_static_values(name, statics, values)

            def run() -> None:
                cells = [*args, *(c_int(v) for v in values)]
                params = (c_void_p * len(cells))(*[ctypes.addressof(c) for c in cells])
                device.launch(fn, blocks, threads, params, cooperative, name)

            return Work(name, run)

        return Routine(context, schedule, refs, name, procedure.mem_classes,
                       await_=functools.partial(self.await_, device))

    def _launch_config(self, device: CudaDevice, fn: int, procedure: CudaProcedure) -> tuple[int, int, bool]:
        """Grid-stride loops make any grid correct, so blocks are shrunk until one fits on a
        multiprocessor (register-hungry kernels). A kernel with grid barriers must have all its
        blocks resident at once, which a cooperative launch guarantees."""
        plan = procedure.kernel.plan
        wanted, threads = plan.launch_shape()
        per_sm = self.driver.max_active_blocks(fn, threads)
        while per_sm < 1 and threads > 32:
            threads //= 2
            wanted = -(-plan.work_items // threads)
            per_sm = self.driver.max_active_blocks(fn, threads)
        if per_sm < 1:
            raise CudaError(f"einjit: kernel {procedure.name!r} cannot keep even one block of 32 threads resident "
                            f"on device {device.label}")
        if not plan.grid_sync:
            return max(1, min(wanted, 32 * device.sm_count)), threads, False
        if not device.cooperative:
            raise CudaError(f"einjit: routine {procedure.name!r} synchronizes its grid, but device {device.label} does "
                            f"not support cooperative launches")
        return max(1, min(wanted, per_sm * device.sm_count)), threads, True

    # -- moving data

    def from_host(self, context: CudaContext, tn: Tnode) -> None:
        host = _host_array("from_host", tn, context)
        ptr = self._buffer(context, tn)
        context.device.activate()
        self.driver.copy_to_device(ptr, host.ctypes.data, host.nbytes, context.device.started_stream)

    def to_host(self, context: CudaContext, tn: Tnode) -> None:
        host = _host_array("to_host", tn, context)
        if not context.holds(tn):
            raise not_held_error("to_host", tn, context)
        if not host.flags.writeable:
            raise BackendUsageError(f"einjit: to_host: the host array of {tn.debug_name()} is read-only")
        context.device.activate()
        self.driver.copy_to_host(host.ctypes.data, context.buffers[tn], host.nbytes, context.device.started_stream)
        self.await_(context.device)

    def allocate_zeroed(self, context: CudaContext, tn: Tnode) -> None:
        self._buffer(context, tn)

    def device_to_device(self, tn: Tnode, dst_context: CudaContext, src_context: CudaContext,
                         into_merge_buffer: bool = True) -> None:
        if not src_context.holds(tn):
            raise not_held_error(f"device_to_device into {dst_context.label!r}", tn, src_context)
        dst_ptr = self._buffer(dst_context, tn, merge=into_merge_buffer)
        src_ptr, nbytes = src_context.buffers[tn], _nbytes(tn)
        dst, src, drv = dst_context.device, src_context.device, self.driver
        if dst is src:
            dst.activate()
            drv.copy_on_device(dst_ptr, src_ptr, nbytes, dst.started_stream)
            return
        src.activate()
        ready = drv.event_after(src.started_stream)
        dst.activate()
        drv.stream_wait(dst.started_stream, ready)
        drv.copy_peer(dst_ptr, dst.started_ctx, src_ptr, src.started_ctx, nbytes, dst.started_stream)
        copied = drv.event_after(dst.started_stream)
        src.activate()
        drv.stream_wait(src.started_stream, copied)

    def release(self, context: CudaContext) -> None:
        """Free the context's device memory, after the work already on its device."""
        self.await_(context.device)
        for ptr in [*context.buffers.values(), *context.merge_buffers.values()]:
            self.driver.free(ptr)
        context.buffers.clear()
        context.merge_buffers.clear()


class CudaBackend(SimpleNoDeviceBackend[CudaContext, CudaProcedure]):
    """The CUDA device backend: `Postponed` / `Compiled` code as in `SimpleNoDeviceBackend`,
    with devices, contexts on them, and asynchronous work."""

    def __init__(self, options: CudaOptions | None = None, name: str = "cuda"):
        self.core = CudaCore(options or CudaOptions(), name)
        # CudaCore is a SimpleBackend except that its contexts live on devices (`init(device)`):
        # this class overrides every method that would call `init(label)` on it.
        super().__init__(self.core)  # type: ignore[arg-type]

    def num_devices(self) -> int:
        return self.core.num_devices()

    def get_device(self, ordinal: int) -> CudaDevice:
        return self.core.get_device(ordinal)

    def init(self, device: CudaDevice) -> CudaContext:  # type: ignore[override]  # contexts live on devices
        return register_context(self.core.init(device), self)

    def await_(self, device: CudaDevice) -> None:
        self.core.await_(device)

    def release(self, context: CudaContext) -> None:
        self.check_context(context)
        self.core.release(context)
