"""The environment a benchmark sets before NumPy and einjit are imported: BLAS libraries read
their thread count (`OPENBLAS_NUM_THREADS`, `OMP_NUM_THREADS`, `MKL_NUM_THREADS`) once, when
NumPy loads them, so a script that compares einjit with NumPy or PyTorch at N threads must set
them first; and the compiled-object cache the benchmarks share, outside the user's own."""

from __future__ import annotations

import os
import tempfile

BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def set_threads(threads: int, *, also: tuple[str, ...] = (), keep_set: bool = False) -> None:
    """Give BLAS, and the variables in `also` (`EINJIT_NUM_THREADS`, `HL_NUM_THREADS`),
    `threads` threads; `keep_set`: leave a variable that is set already (a script that
    `run.py` imports after setting its own)."""
    for var in BLAS_THREADS + also:
        if keep_set:
            os.environ.setdefault(var, str(threads))
        else:
            os.environ[var] = str(threads)


def shared_cache() -> None:
    """Compile into the benchmarks' cache (`$TMPDIR/einjit-bench-cache`) unless
    `EINJIT_CACHE_DIR` says otherwise."""
    os.environ.setdefault("EINJIT_CACHE_DIR", os.path.join(tempfile.gettempdir(), "einjit-bench-cache"))
