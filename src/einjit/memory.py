"""Host allocations that fail with a named error: a tensor larger than the memory available
gets an `AllocationError` naming it and its size, before NumPy tries (and raises a bare
`MemoryError`, or on Linux succeeds lazily and lets the kernel kill the process later)."""

from __future__ import annotations

import os

import numpy as np
from numpy.typing import DTypeLike

from einjit.errors import EinjitError


class AllocationError(EinjitError, MemoryError):
    """A host array does not fit in the memory available."""


def available_bytes() -> int | None:
    """Memory the process can still get (RAM available plus free swap), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f) if v.split()}
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


def zeros(what: str, dims: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """`np.zeros(dims, dtype)` for the array of `what`, checked by `check_fits` first."""
    nbytes = check_fits(what, dims, dtype)
    try:
        return np.zeros(dims, dtype=dtype)
    except (MemoryError, ValueError) as e:
        raise AllocationError(f"einjit: {what} with dims {tuple(dims)} needs {human(nbytes)} of host memory and "
                              f"could not get it ({e})") from None
