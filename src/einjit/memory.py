"""Memory: host allocations that fail with a named error, and reports of what compiled code holds.

A tensor larger than the memory available gets an `AllocationError` naming it and its size,
before NumPy tries (and raises a bare `MemoryError`, or on Linux succeeds lazily and lets the
kernel kill the process later).

`report(routine_or_context)` (also `routine.memory` and `routine.kept_bytes`) says how many
bytes a compiled routine or a context keeps between calls, and how many live only during a
call (routine-local arrays, see `ir/passes/local_storage.py`).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from einjit.errors import EinjitError


class AllocationError(EinjitError, MemoryError):
    """A host array does not fit in the memory available."""


_READ_AGAIN_AFTER = 0.05
_last_read: tuple[float, int | None] = (-1.0, None)


def available_bytes() -> int | None:
    """Memory the process can still get (RAM available plus free swap), None if unknown.

    Linking a deep model checks hundreds of arrays in a few milliseconds; a reading younger
    than `_READ_AGAIN_AFTER` seconds is reused rather than read again for each."""
    global _last_read
    now = time.monotonic()
    if now - _last_read[0] < _READ_AGAIN_AFTER:
        return _last_read[1]
    _last_read = (now, _read_available_bytes())
    return _last_read[1]


def _read_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:  # only the two lines used: linking checks hundreds of arrays
            info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f
                                                              if line.startswith(("MemAvailable:", "SwapFree:")))}
        if "MemAvailable" in info:
            return info["MemAvailable"] + info.get("SwapFree", 0)
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def human(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{nbytes} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def check_fits(what: str, dims: tuple[int, ...], dtype: DTypeLike) -> int:
    """The bytes of an array of `what` (a tensor's name), or an `AllocationError` saying how
    much it needs and how much memory is available."""
    nbytes = int(np.dtype(dtype).itemsize)
    for d in dims:
        nbytes *= int(d)
    avail = available_bytes()
    if avail is not None and nbytes > avail:
        raise AllocationError(f"einjit: {what} with dims {tuple(dims)} needs {human(nbytes)} of host memory, more than "
                              f"the {human(avail)} available; use smaller dims or batches")
    return nbytes


ALIGN = 64
"""The byte alignment of the arrays `zeros` returns: a cache line, and a whole AVX-512 vector."""


def zeros(what: str, dims: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """`np.zeros(dims, dtype)` for the array of `what`, checked by `check_fits` first, starting
    on a cache line (`ALIGN`). NumPy's own large arrays start 16 bytes past a page (glibc's
    `mmap`ed chunks): every row of a 512-float matrix then straddled two cache lines, so
    a generated kernel's packing read and its block stores touched twice the lines, and
    `a @ b` at n=512 ran 5-7% slower on znver3 than on aligned arrays."""
    nbytes = check_fits(what, dims, dtype)
    try:
        return aligned_zeros(dims, dtype)
    except (MemoryError, ValueError) as e:
        raise AllocationError(f"einjit: {what} with dims {tuple(dims)} needs {human(nbytes)} of host memory and "
                              f"could not get it ({e})") from None


def aligned_zeros(dims: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """`np.zeros(dims, dtype)` starting on a cache line (`ALIGN`), without `check_fits` (which
    reads /proc/meminfo): a context's arrays, hundreds per link, allocated as before."""
    dt = np.dtype(dtype)
    nbytes = dt.itemsize * math.prod(dims)
    raw = np.zeros(nbytes + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dt).reshape(dims)


# ---------------------------------------------------------------- what routines and contexts hold


@dataclass(frozen=True)
class MemoryReport:
    """The bytes a compiled routine or a context holds, by how long they live.

    `kept_bytes`: arrays kept between calls — a context's array per node (parameters,
    optimizer state, results), device memory on CUDA. This is what a model costs while it is
    loaded. `local_bytes`: routine-local arrays on the stack (or a GPU thread's local
    memory), which exist only during a call. `scratch_bytes`: routine-local arrays too large
    for the stack, allocated once per context (their values are not needed between calls, but
    the memory stays allocated; see `CSyntax`): the planned arena, where arrays whose
    lifetimes do not meet share bytes (`backends/scratch_plan.py`), or one array each.
    `scratch_parts_bytes`: what those arrays take one array each (`scratch_bytes` when nothing
    is planned). `host_bytes`: constant hosted arrays a routine reads in place from the host,
    which no context copies. `arrays` lists `(node, memory class, bytes)` for each array,
    largest first.
    """

    kept_bytes: int
    local_bytes: int = 0
    scratch_bytes: int = 0
    host_bytes: int = 0
    arrays: tuple[tuple[str, str, int], ...] = field(default=(), repr=False)
    scratch_parts_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.scratch_parts_bytes is None:
            object.__setattr__(self, "scratch_parts_bytes", self.scratch_bytes)

    def __str__(self) -> str:
        parts = self.scratch_parts_bytes
        planned = ""
        if parts is not None and parts != self.scratch_bytes:
            planned = f" (one arena for {human(parts)} of arrays)"
        lines = [f"kept between calls {human(self.kept_bytes)}, local {human(self.local_bytes)}, "
                 f"scratch {human(self.scratch_bytes)}{planned}, read from the host {human(self.host_bytes)}"]
        lines += [f"  {name:<32} {cls:<20} {human(n)}" for name, cls, n in self.arrays]
        return "\n".join(lines)


def report(obj: Any) -> MemoryReport:
    """What a routine (anything with `mem_classes`, as `Routine`) or a context (`CcContext`,
    a multicore or CUDA context) holds. Also `routine.memory`, `routine.kept_bytes`.

    For a routine, kept bytes are its context arrays, whether or not another routine of the
    context shares them; for a context, every array it holds, merge buffers included, and
    `scratch_bytes` the scratch arrays of the routine-local nodes of routines linked into it."""
    classes = getattr(obj, "mem_classes", None)
    if classes is not None:
        return _routine_report(classes, getattr(obj, "scratch_plan", None))
    inner = getattr(obj, "inner", None)
    if inner is not None and hasattr(inner, "holds"):
        return report(inner)
    arrays: list[tuple[str, str, int]] = []
    for table, what in ((getattr(obj, "arrays", None), "From_context"), (getattr(obj, "buffers", None), "Global"),
                        (getattr(obj, "merge_buffers", None), "Merge_buffer")):
        arrays += [(tn.debug_name(), what, _nbytes(tn)) for tn in (table or {})]
    if not arrays and not any(hasattr(obj, a) for a in ("arrays", "buffers")):
        raise TypeError(f"einjit: memory.report expects a compiled routine or a context, got {type(obj).__name__}")
    arrays += [(tn.debug_name(), "Scratch", _nbytes(tn)) for tn in getattr(obj, "scratch", None) or {}]
    arrays += [(f"scratch arena of {routine}", "Scratch", int(arena.nbytes))
               for routine, arenas in (getattr(obj, "arenas", None) or {}).items() for arena in arenas]
    return MemoryReport(sum(n for _, cls, n in arrays if cls != "Scratch"),
                        scratch_bytes=sum(n for _, cls, n in arrays if cls == "Scratch"), arrays=_largest_first(arrays))


def _routine_report(classes: Any, plan: Any = None) -> MemoryReport:
    """`plan`: the routine's scratch plan (`backends.scratch_plan.ScratchPlan`), whose arena
    holds its scratch arrays; None when they are one array each."""
    by_class: dict[str, int] = {}
    arrays: list[tuple[str, str, int]] = []
    locals_ = [tn for tn, cls in classes.items() if cls.value == "Local_only"]
    # a backend's memory class knows where its routine-local nodes live (stack or scratch)
    on_stack = type(classes[locals_[0]]).locals_on_stack(locals_) if locals_ else set()
    for tn, cls in classes.items():
        name = cls.value
        if name == "Local_only" and tn not in on_stack:
            name = "Local_only (scratch)"
        arrays.append((tn.debug_name(), name, _nbytes(tn)))
        by_class[name] = by_class.get(name, 0) + _nbytes(tn)
    parts = by_class.get("Local_only (scratch)", 0)
    if plan is not None:
        arrays.append(("scratch arena", "Scratch arena", int(plan.size)))
    return MemoryReport(kept_bytes=by_class.get("From_context", 0) + by_class.get("Global", 0),
                        local_bytes=by_class.get("Local_only", 0),
                        scratch_bytes=parts if plan is None else int(plan.size),
                        host_bytes=by_class.get("Constant_from_host", 0), arrays=_largest_first(arrays),
                        scratch_parts_bytes=parts if plan is None else int(plan.parts_bytes))


def _nbytes(tn: Any) -> int:
    return int(tn.size) * int(tn.prec.itemsize)


def _largest_first(arrays: list[tuple[str, str, int]]) -> tuple[tuple[str, str, int], ...]:
    return tuple(sorted(arrays, key=lambda a: (-a[2], a[0])))


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Hold Python's cyclic garbage collector off while einjit builds or compiles a graph.
    A compile allocates millions of short-lived objects (IR nodes, shape rows, constraints)
    beside a large live graph, and every collection walks that graph: a third of the 4-block
    GPT step's compile time went to collections that found a few thousand cycles. The cycles
    made meanwhile wait for the first collection after it (nested uses keep it off until the
    outermost ends; a collector switched off by the caller stays off)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
