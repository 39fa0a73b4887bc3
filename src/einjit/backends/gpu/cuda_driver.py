"""ctypes bindings to the CUDA driver API (`libcuda`) and to NVRTC (`libnvrtc`).

Only what the CUDA backend uses is bound, each function with its full signature so 64-bit
device pointers and sizes are never truncated. Nothing is loaded at import: `load_driver()`
and `load_nvrtc()` find the libraries on first use and fail with a message that names what is
missing and how to get it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import shutil
import threading
from ctypes import (
    POINTER,
    c_char_p,
    c_int,
    c_size_t,
    c_ubyte,
    c_uint,
    c_uint64,
    c_void_p,
)
from pathlib import Path

from einjit.backends.interface import BackendError


class CudaError(BackendError, RuntimeError):
    """A CUDA driver or NVRTC call failed; the message names the call and the CUDA error."""


class CudaUnavailable(BackendError, ImportError):
    """A library the CUDA backend needs is not installed."""


# CUdevice_attribute values used here (cuda.h).
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
ATTR_COOPERATIVE_LAUNCH = 95
_EVENT_DISABLE_TIMING = 2
_STREAM_NON_BLOCKING = 1

_P = c_void_p
_DRIVER_API: dict[str, tuple] = {
    "cuInit": (c_uint,),
    "cuGetErrorName": (c_int, POINTER(c_char_p)),
    "cuGetErrorString": (c_int, POINTER(c_char_p)),
    "cuDeviceGetCount": (POINTER(c_int),),
    "cuDeviceGet": (POINTER(c_int), c_int),
    "cuDeviceGetAttribute": (POINTER(c_int), c_int, c_int),
    "cuDeviceGetName": (c_char_p, c_int, c_int),
    "cuDevicePrimaryCtxRetain": (POINTER(_P), c_int),
    "cuCtxSetCurrent": (_P,),
    "cuStreamCreate": (POINTER(_P), c_uint),
    "cuStreamSynchronize": (_P,),
    "cuStreamWaitEvent": (_P, _P, c_uint),
    "cuEventCreate": (POINTER(_P), c_uint),
    "cuEventRecord": (_P, _P),
    "cuEventDestroy_v2": (_P,),
    "cuMemAlloc_v2": (POINTER(c_uint64), c_size_t),
    "cuMemFree_v2": (c_uint64,),
    "cuMemsetD8Async": (c_uint64, c_ubyte, c_size_t, _P),
    "cuMemcpyHtoDAsync_v2": (c_uint64, _P, c_size_t, _P),
    "cuMemcpyDtoHAsync_v2": (_P, c_uint64, c_size_t, _P),
    "cuMemcpyDtoDAsync_v2": (c_uint64, c_uint64, c_size_t, _P),
    "cuMemcpyPeerAsync": (c_uint64, _P, c_uint64, _P, c_size_t, _P),
    "cuModuleLoadData": (POINTER(_P), _P),
    "cuModuleGetFunction": (POINTER(_P), _P, c_char_p),
    "cuLaunchKernel": (_P, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, _P, POINTER(_P), POINTER(_P)),
    "cuLaunchCooperativeKernel": (_P, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, _P, POINTER(_P)),
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": (POINTER(c_int), _P, c_int, c_size_t),
}

_NVRTC_API: dict[str, tuple] = {
    "nvrtcVersion": (POINTER(c_int), POINTER(c_int)),
    "nvrtcCreateProgram": (POINTER(_P), c_char_p, c_char_p, c_int, POINTER(c_char_p), POINTER(c_char_p)),
    "nvrtcCompileProgram": (_P, c_int, POINTER(c_char_p)),
    "nvrtcGetProgramLogSize": (_P, POINTER(c_size_t)),
    "nvrtcGetProgramLog": (_P, c_char_p),
    "nvrtcGetPTXSize": (_P, POINTER(c_size_t)),
    "nvrtcGetPTX": (_P, c_char_p),
    "nvrtcGetCUBINSize": (_P, POINTER(c_size_t)),
    "nvrtcGetCUBIN": (_P, c_char_p),
    "nvrtcDestroyProgram": (POINTER(_P),),
}

_INSTALL_HINT = ("install the NVIDIA driver and the CUDA toolkit, or `pip install einjit[cuda]` for NVRTC "
                 "(together with NVIDIA's nvrtc wheel for your CUDA version)")


def _bind(lib: ctypes.CDLL, api: dict[str, tuple], library: str) -> None:
    for name, argtypes in api.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise CudaUnavailable(f"einjit: {library} lacks {name}; it is too old for the CUDA backend") from e
        fn.argtypes = argtypes
        fn.restype = c_int


def cuda_home() -> Path | None:
    """The CUDA toolkit directory: $CUDA_HOME / $CUDA_PATH, nvcc's parent, or /usr/local/cuda —
    the first of these whose `include/` has the toolkit headers (an `nvcc` wrapper installed in
    /usr/local/bin does not make /usr/local a toolkit), else the first that exists."""
    candidates = [Path(os.environ[var]) for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(os.path.realpath(nvcc)).parent.parent)
    candidates.append(Path("/usr/local/cuda"))
    for c in candidates:
        if (c / "include" / "cooperative_groups.h").exists():
            return c
    return next((c for c in candidates if c.exists()), None)


def _try_load(candidates: list[str]) -> ctypes.CDLL | None:
    for c in candidates:
        try:
            return ctypes.CDLL(c)
        except OSError:
            continue
    return None


# ---------------------------------------------------------------- the driver


def _handle(p: c_void_p) -> int:
    """The handle a successful driver call wrote (never NULL: the call's status was checked)."""
    assert p.value is not None
    return p.value


class Driver:
    """The driver API. Calls raise `CudaError` naming the call and the CUDA error."""

    def __init__(self, lib: ctypes.CDLL):
        _bind(lib, _DRIVER_API, "libcuda")
        self.lib = lib
        self.check(lib.cuInit(0), "cuInit")

    def error_text(self, code: int) -> str:
        name, desc = c_char_p(), c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        self.lib.cuGetErrorString(code, ctypes.byref(desc))
        return f"{(name.value or b'CUDA_ERROR').decode()} ({code}): {(desc.value or b'unknown error').decode()}"

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise CudaError(f"einjit: CUDA {what} failed: {self.error_text(code)}")

    def device_count(self) -> int:
        n = c_int()
        self.check(self.lib.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
        return n.value

    def device(self, ordinal: int) -> int:
        dev = c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), f"cuDeviceGet({ordinal})")
        return dev.value

    def attribute(self, dev: int, attr: int) -> int:
        v = c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(v), attr, dev), f"cuDeviceGetAttribute({attr})")
        return v.value

    def device_name(self, dev: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self.check(self.lib.cuDeviceGetName(buf, 256, dev), "cuDeviceGetName")
        return buf.value.decode()

    def primary_context(self, dev: int) -> int:
        ctx = c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        return _handle(ctx)

    def set_current(self, ctx: int) -> None:
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def stream_create(self) -> int:
        s = c_void_p()
        self.check(self.lib.cuStreamCreate(ctypes.byref(s), _STREAM_NON_BLOCKING), "cuStreamCreate")
        return _handle(s)

    def stream_synchronize(self, stream: int) -> int:
        """The CUresult of waiting for the stream (not raised: the caller names the culprits)."""
        return self.lib.cuStreamSynchronize(stream)

    def event_after(self, stream: int) -> int:
        """A new event recorded at the current end of `stream`."""
        ev = c_void_p()
        self.check(self.lib.cuEventCreate(ctypes.byref(ev), _EVENT_DISABLE_TIMING), "cuEventCreate")
        self.check(self.lib.cuEventRecord(ev, stream), "cuEventRecord")
        return _handle(ev)

    def stream_wait(self, stream: int, event: int) -> None:
        """Make `stream` wait for `event`, then release the event (the wait keeps it alive)."""
        self.check(self.lib.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")
        self.check(self.lib.cuEventDestroy_v2(event), "cuEventDestroy")

    def alloc(self, nbytes: int, stream: int) -> int:
        """Zeroed device memory (the zeroing is ordered on `stream`)."""
        ptr = c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), max(1, nbytes)), f"cuMemAlloc({nbytes} bytes)")
        self.check(self.lib.cuMemsetD8Async(ptr.value, 0, max(1, nbytes), stream), "cuMemsetD8Async")
        return ptr.value

    def free(self, ptr: int) -> None:
        self.check(self.lib.cuMemFree_v2(ptr), "cuMemFree")

    def copy_to_device(self, dst: int, host_ptr: int, nbytes: int, stream: int) -> None:
        self.check(self.lib.cuMemcpyHtoDAsync_v2(dst, host_ptr, nbytes, stream), "cuMemcpyHtoDAsync")

    def copy_to_host(self, host_ptr: int, src: int, nbytes: int, stream: int) -> None:
        self.check(self.lib.cuMemcpyDtoHAsync_v2(host_ptr, src, nbytes, stream), "cuMemcpyDtoHAsync")

    def copy_on_device(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.check(self.lib.cuMemcpyDtoDAsync_v2(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")

    def copy_peer(self, dst: int, dst_ctx: int, src: int, src_ctx: int, nbytes: int, stream: int) -> None:
        self.check(self.lib.cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, nbytes, stream), "cuMemcpyPeerAsync")

    def load_module(self, image: bytes, kind: str) -> int:
        """Load a cubin, or PTX (JIT-compiled by the driver for the current device)."""
        data = image + b"\0" if kind == "ptx" else image
        buf = ctypes.create_string_buffer(data, len(data))
        mod = c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), buf), f"cuModuleLoadData ({kind})")
        return _handle(mod)

    def function(self, module: int, name: str) -> int:
        fn = c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                   f"cuModuleGetFunction({name!r})")
        return _handle(fn)

    def max_active_blocks(self, fn: int, block: int) -> int:
        n = c_int()
        self.check(self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), fn, block, 0),
                   "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return n.value

    def launch(self, fn: int, blocks: int, threads: int, stream: int, params: ctypes.Array,
               cooperative: bool, name: str) -> None:
        if cooperative:
            code = self.lib.cuLaunchCooperativeKernel(fn, blocks, 1, 1, threads, 1, 1, 0, stream, params)
        else:
            code = self.lib.cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, stream, params, None)
        self.check(code, f"launch of kernel {name!r} ({blocks} blocks x {threads} threads"
                         f"{', cooperative' if cooperative else ''})")


_driver: Driver | None = None
_driver_lock = threading.Lock()


def load_driver() -> Driver:
    """The driver, loaded and initialized once per process."""
    global _driver
    with _driver_lock:
        if _driver is None:
            lib = _try_load(["libcuda.so.1", "libcuda.so", "nvcuda.dll"])
            if lib is None:
                raise CudaUnavailable(f"einjit: the CUDA backend needs the NVIDIA driver library libcuda, which was "
                                      f"not found; {_INSTALL_HINT}")
            _driver = Driver(lib)
        return _driver


def device_count() -> int:
    """How many CUDA devices this process sees; 0 when the driver or a device is missing."""
    try:
        return load_driver().device_count()
    except (CudaUnavailable, CudaError):
        return 0


# ---------------------------------------------------------------- NVRTC


class Nvrtc:
    """Runtime compilation of CUDA C++ to PTX or cubin."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        _bind(lib, _NVRTC_API, "libnvrtc")
        self.lib = lib
        self.path = path
        major, minor = c_int(), c_int()
        lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = (major.value, minor.value)

    def compile(self, source: str, name: str, arch: str, kind: str, options: tuple[str, ...]) -> tuple[bytes, str]:
        """(image, log) for `arch` (`sm_90` for a cubin, `compute_80` for PTX)."""
        prog = c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0,
                                                None, None), "nvrtcCreateProgram")
        try:
            opts = [f"--gpu-architecture={arch}", *options]
            arr = (c_char_p * len(opts))(*[o.encode() for o in opts])
            code = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
            log = self._log(prog)
            if code != 0:
                raise CudaError(f"einjit: NVRTC failed compiling {name} for {arch}:\n{log}")
            size = c_size_t()
            get_size, get = ((self.lib.nvrtcGetCUBINSize, self.lib.nvrtcGetCUBIN) if kind == "cubin"
                             else (self.lib.nvrtcGetPTXSize, self.lib.nvrtcGetPTX))
            self._check(get_size(prog, ctypes.byref(size)), f"nvrtcGet{kind.upper()}Size")
            buf = ctypes.create_string_buffer(size.value)
            self._check(get(prog, buf), f"nvrtcGet{kind.upper()}")
            data = buf.raw[:size.value]
            return (data.rstrip(b"\0") if kind == "ptx" else data), log
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog: c_void_p) -> str:
        size = c_size_t()
        if self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != 0 or size.value <= 1:
            return ""
        buf = ctypes.create_string_buffer(size.value)
        self.lib.nvrtcGetProgramLog(prog, buf)
        return buf.value.decode(errors="replace")

    @staticmethod
    def _check(code: int, what: str) -> None:
        if code != 0:
            raise CudaError(f"einjit: NVRTC {what} failed with nvrtcResult {code}")


def _nvrtc_candidates() -> list[str]:
    found = [ctypes.util.find_library("nvrtc") or ""]
    home = cuda_home()
    if home is not None:
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "bin"):
            found += sorted(glob.glob(str(home / sub / "libnvrtc.so*")), reverse=True)
            found += sorted(glob.glob(str(home / sub / "nvrtc64_*.dll")), reverse=True)
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        found += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")), reverse=True)
    found += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    return [f for f in dict.fromkeys(found) if f and "builtins" not in os.path.basename(f)]


_nvrtc: Nvrtc | None = None
_nvrtc_missing = False


def load_nvrtc() -> Nvrtc | None:
    """NVRTC if a libnvrtc can be found, else None (the backend then tries nvcc)."""
    global _nvrtc, _nvrtc_missing
    with _driver_lock:
        if _nvrtc is None and not _nvrtc_missing:
            for path in _nvrtc_candidates():
                lib = _try_load([path])
                if lib is not None:
                    _nvrtc = Nvrtc(lib, path)
                    break
            else:
                _nvrtc_missing = True
        return _nvrtc
