"""The multicore device backend (seed 001's `Multicore_backend` functor): devices over any
no-device backend, each device a worker thread with its own FIFO queue.

Running a work (`routine.schedule()()`, or `routine()`) only enqueues it on the context's
device, so scheduling never blocks; the worker runs the no-device backend's blocking work.
Compiled C code is called through ctypes, which releases the GIL, so devices compute in
parallel. An exception raised by a work is recorded with the routine's name and raised by the
next `await_(device)`; the worker goes on with the following works, so a failing routine never
wedges its device.

Transfers are ordered with the routines of the devices they touch:
- `from_host` / `to_host` run on the device's queue and block the caller until done, so they
  see (and are seen by) every work scheduled before them;
- `device_to_device` pairs a work on each device: the destination's work waits at its place
  in the queue until the source's work has made the copy at its own place, so neither device
  runs ahead. Both halves are enqueued atomically under one lock, so every queue sees the
  pairs in the same global order, and the earliest unfinished pair can always complete: no
  schedule order deadlocks.
"""

from __future__ import annotations

import functools
import itertools
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from einjit.backends.interface import (
    BackendUsageError,
    Code,
    DeviceError,
    HostTransfers,
    Routine,
    RoutineFailed,
    Work,
    WrongBackendError,
    check_code,
    check_hosted,
    forget_context,
    not_held_error,
    register_context,
)
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.tnode import Tnode


class CpuDevice:
    """One device: a worker thread, started by `init`, running works in FIFO order."""

    def __init__(self, backend_name: str, ordinal: int):
        self.backend_name = backend_name
        self.ordinal = ordinal
        self.label = f"{backend_name}:{ordinal}"
        self._queue: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._pending = 0
        self._errors: list[tuple[str, Exception]] = []
        self._thread: threading.Thread | None = None
        self._stopped = False

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running" if self._thread else "not initialized"
        return f"<CpuDevice {self.label} {state}>"

    @property
    def initialized(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        with self._cond:
            if self._stopped:
                raise DeviceError(f"einjit: device {self.label} was shut down")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"einjit {self.label}", daemon=True)
                self._thread.start()

    def check_running(self, what: str) -> None:
        if self._thread is None or self._stopped:
            raise DeviceError(f"einjit: cannot run {what!r} on device {self.label}: "
                              f"{'it was shut down' if self._stopped else 'it was never initialized'}")

    def enqueue(self, work: Work) -> None:
        with self._cond:
            self.check_running(work.name)
            self._pending += 1
            self._queue.put(work)

    def _loop(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            try:
                work()
            except Exception as e:  # noqa: BLE001 - every failure is reported at await_
                with self._cond:
                    self._errors.append((work.name, e))
            finally:
                with self._cond:
                    self._pending -= 1
                    if self._pending == 0:
                        self._cond.notify_all()

    def is_idle(self) -> bool:
        with self._cond:
            return self._pending == 0

    def wait(self) -> list[tuple[str, Exception]]:
        """Wait until the queue is drained; return (and forget) the failures since the last wait."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)
            errors, self._errors = self._errors, []
        return errors

    def call(self, name: str, fn: Callable[[], None]) -> None:
        """Run `fn` at the current end of the queue and wait for it; its exception is raised here."""
        done = threading.Event()
        failure: list[Exception] = []

        def run() -> None:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - re-raised in the calling thread
                failure.append(e)
            finally:
                done.set()

        self.enqueue(Work(name, run))
        done.wait()
        if failure:
            raise failure[0]

    def stop(self) -> None:
        with self._cond:
            thread, self._stopped = self._thread, True
        if thread is not None:
            self._queue.put(None)
            thread.join()


@dataclass(eq=False)
class MulticoreContext(HostTransfers):
    """A context of the inner backend, bound to one device."""

    label: str
    backend_name: str
    device: CpuDevice
    inner: Any = field(repr=False)
    backend: Any = field(default=None, repr=False)

    def holds(self, tn: Tnode) -> bool:
        return self.inner.holds(tn)


class MulticoreBackend:
    """Devices over a no-device backend (by default `CcBackend`, one thread per routine: the
    devices are the parallelism). Code is the inner backend's."""

    def __init__(self, inner: Any = None, num_devices: int | None = None):
        if inner is None:
            from einjit.backends.cc import toolchain as cc
            from einjit.backends.cc.backend import CcBackend
            inner = CcBackend(cc.CcOptions(threads=1))
        self.inner = inner
        self.name = f"multicore({inner.name})"
        self._num_devices = num_devices if num_devices is not None else os.cpu_count() or 1
        if self._num_devices < 1:
            raise BackendUsageError(f"einjit: a multicore backend needs at least one device, got {num_devices}")
        self._devices: dict[int, CpuDevice] = {}
        self._lock = threading.Lock()
        self._context_ids = itertools.count()

    def __repr__(self) -> str:
        return f"<MulticoreBackend {self.name} with {self._num_devices} devices>"

    def __enter__(self) -> "MulticoreBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- devices

    def num_devices(self) -> int:
        return self._num_devices

    def get_device(self, ordinal: int) -> CpuDevice:
        if not 0 <= ordinal < self._num_devices:
            raise DeviceError(f"einjit: backend {self.name} has devices 0..{self._num_devices - 1}, not {ordinal}")
        with self._lock:
            if ordinal not in self._devices:
                self._devices[ordinal] = CpuDevice(self.name, ordinal)
            return self._devices[ordinal]

    def _check_device(self, device: Any) -> CpuDevice:
        if not isinstance(device, CpuDevice) or self._devices.get(device.ordinal) is not device:
            raise WrongBackendError(f"einjit: {device!r} is not a device of backend {self.name}")
        return device

    def init(self, device: CpuDevice) -> MulticoreContext:
        """A fresh context on `device`, starting the device's worker on first use."""
        device = self._check_device(device)
        device.start()
        label = f"{device.label}/{next(self._context_ids)}"
        inner = self.inner.init(label)
        forget_context(inner)
        return register_context(MulticoreContext(label, self.name, device, inner), self)

    def await_(self, device: CpuDevice) -> None:
        """Wait for all work scheduled on `device`; raise the first failure since the last await."""
        device = self._check_device(device)
        if not device.initialized:
            raise DeviceError(f"einjit: device {device.label} was never initialized; call init(device) before "
                              f"scheduling work on it or awaiting it")
        errors = device.wait()
        if errors:
            name, first = errors[0]
            more = "" if len(errors) == 1 else f" (and {len(errors) - 1} more failures: " + ", ".join(
                f"{n!r}: {type(e).__name__}" for n, e in errors[1:6]) + ("..." if len(errors) > 6 else "") + ")"
            raise RoutineFailed(f"einjit: routine {name!r} failed on device {device.label}: "
                                f"{type(first).__name__}: {first}{more}", name, device) from first

    def shutdown(self) -> None:
        """Stop every device's worker (after the work already queued)."""
        for device in list(self._devices.values()):
            device.stop()

    # -- code

    def compile(self, bindings: Sequence[StaticSymbol], code: Any, *, shared: bool = False,
                name: str | None = None) -> Code:
        return self.inner.compile(bindings, code, shared=shared, name=name)

    def compile_batch(self, bindings: Sequence[StaticSymbol], codes: Sequence[Any], *, shared: bool = False,
                      names: Sequence[str] | None = None) -> list[Code]:
        return self.inner.compile_batch(bindings, codes, shared=shared, names=names)

    def _check_context(self, context: Any) -> MulticoreContext:
        if not isinstance(context, MulticoreContext) or context.backend_name != self.name \
                or self._devices.get(context.device.ordinal) is not context.device:
            label = getattr(context, "label", repr(context))
            raise WrongBackendError(f"einjit: {label!r} is not a context of backend {self.name}")
        return context

    def link(self, context: MulticoreContext, code: Code,
             static_values: Mapping[StaticSymbol, IntRef] | None = None) -> Routine[MulticoreContext]:
        return self.link_batch(context, [code], static_values)[0]

    def link_batch(self, context: MulticoreContext, codes: Sequence[Code],
                   static_values: Mapping[StaticSymbol, IntRef] | None = None) -> list[Routine[MulticoreContext]]:
        context = self._check_context(context)
        for code in codes:
            check_code(self.name, code, context, accepted=(self.inner.name,))
        inner_routines = self.inner.link_batch(context.inner, codes, static_values)
        return [self._on_device(context, r) for r in inner_routines]

    def _on_device(self, context: MulticoreContext, inner: Routine) -> Routine[MulticoreContext]:
        device = context.device

        def schedule() -> Work:
            work = inner.schedule()
            return Work(work.name, lambda: device.enqueue(work))

        return Routine(context, schedule, inner.bindings, inner.name, inner.mem_classes,
                       await_=functools.partial(self.await_, device))

    # -- moving data

    def from_host(self, context: MulticoreContext, tn: Tnode) -> None:
        """Copy the host array into the context, after the work scheduled before; blocks until done."""
        context = self._check_context(context)
        check_hosted("from_host", tn, context)
        context.device.call(f"from_host {tn.debug_name()}", lambda: self.inner.from_host(context.inner, tn))

    def to_host(self, context: MulticoreContext, tn: Tnode) -> None:
        """Copy the context's array to the host, after the work scheduled before; blocks until done."""
        context = self._check_context(context)
        check_hosted("to_host", tn, context)
        if not context.holds(tn):
            raise not_held_error("to_host", tn, context)
        context.device.call(f"to_host {tn.debug_name()}", lambda: self.inner.to_host(context.inner, tn))

    def allocate_zeroed(self, context: MulticoreContext, tn: Tnode) -> None:
        """A zeroed array for `tn` in the context, after the work scheduled before."""
        context = self._check_context(context)
        context.device.call(f"allocate_zeroed {tn.debug_name()}", lambda: self.inner.allocate_zeroed(context.inner, tn))

    def device_to_device(self, tn: Tnode, dst_context: MulticoreContext, src_context: MulticoreContext,
                         into_merge_buffer: bool = True) -> None:
        """Schedule a copy of `tn` from `src_context` into `dst_context`'s merge buffer (or its own
        array); never blocks. Failures are reported by `await_` of the destination's device."""
        dst, src = self._check_context(dst_context), self._check_context(src_context)
        if not src.holds(tn):
            raise not_held_error(f"device_to_device into {dst.label!r}", tn, src)
        name = f"device_to_device {tn.debug_name()} {src.label} -> {dst.label}"

        def copy() -> None:
            self.inner.device_to_device(tn, dst.inner, src.inner, into_merge_buffer)

        if dst.device is src.device:
            dst.device.enqueue(Work(name, copy))
            return
        ready, done = threading.Event(), threading.Event()
        failure: list[Exception] = []

        def source_side() -> None:
            ready.wait()
            try:
                copy()
            except Exception as e:  # noqa: BLE001 - reported by the destination's await_
                failure.append(e)
            finally:
                done.set()

        def destination_side() -> None:
            ready.set()
            done.wait()
            if failure:
                raise failure[0]

        with self._lock:
            for device in (dst.device, src.device):
                device.check_running(name)
            dst.device.enqueue(Work(name, destination_side))
            src.device.enqueue(Work(name, source_side))
