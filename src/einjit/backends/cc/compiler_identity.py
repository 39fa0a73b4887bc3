"""Which C compiler a cached object was built by, and the error naming a compiler that cannot run.

Every object einjit caches (a program's, the thread team's) is keyed by the compiler that built
it: its resolved path and its `--version` text, asked once per process and compiler."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

from einjit.errors import EinjitError

__all__ = ["CompileError", "identity", "missing_compiler"]


class CompileError(EinjitError, RuntimeError):
    """The C compiler failed or could not be run; the message carries its diagnostics and
    where the generated source was kept."""


@functools.lru_cache(maxsize=None)
def identity(compiler: str) -> str:
    """The resolved path of `compiler` and its `--version` text."""
    path = shutil.which(compiler)
    if path is None:
        raise missing_compiler(compiler)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False, timeout=60)
    except OSError as e:
        raise missing_compiler(compiler, e) from e
    return f"{os.path.realpath(path)}\n{out.stdout}"


def missing_compiler(compiler: str, err: Exception | None = None) -> CompileError:
    """The error for a compiler that is not found or cannot be run, naming `$CC`."""
    cc_env = os.environ.get("CC")
    why = f" ({err})" if err else ""
    return CompileError(
        f"einjit: C compiler {compiler!r} not found or not runnable{why}. Install gcc, or set $CC to a "
        f"working C compiler ($CC is {'unset' if cc_env is None else repr(cc_env)}), or pass "
        f"CcOptions(compiler=...).")
