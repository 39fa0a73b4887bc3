"""The C backend: render, compile with gcc into a shared object, load with ctypes, run.

Compiled objects are cached on disk by a content hash of (source, flags, compiler identity),
so compiling a program that was compiled before — in this process or an earlier one — loads
the cached object without calling the compiler. Writes go to a temporary name and are
published with `os.replace`, so concurrent processes never see a partial file.

Calling convention of a routine (see `c_syntax.render_routine`): one pointer per non-local
array in node-id order, one pointer per merge buffer in node-id order, one `int` per static
binding in the order given at compilation. `link` prepares the pointer arguments once; a
routine call reads the static symbols' `IntRef`s and makes one ctypes call, which releases
the GIL while the C code runs.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from einjit import config
from einjit.backends.c_syntax import C_SYNTAX, CProgram, CSyntax, MemClass, Param, ParamKind, render_program
from einjit.errors import EinjitError
from einjit.ir import low_level as ll
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.tnode import Tnode

_ABI_VERSION = "einjit-cc-1"
_MAX_DIAGNOSTICS = 8000


class CompileError(EinjitError, RuntimeError):
    """The C compiler failed or could not be run; the message carries its diagnostics and
    where the generated source was kept."""


def _default_compiler() -> str:
    return os.environ.get("CC") or "gcc"


_VECTOR_MATH_PRELUDE = """\
#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__FAST_MATH__)
/* Let gcc vectorize math calls through glibc's libmvec (as -ffast-math would, without it). */
#define EINJIT_SIMD __attribute__((__simd__("notinbranch")))
EINJIT_SIMD float expf(float); EINJIT_SIMD double exp(double);
EINJIT_SIMD float logf(float); EINJIT_SIMD double log(double);
EINJIT_SIMD float sinf(float); EINJIT_SIMD double sin(double);
EINJIT_SIMD float cosf(float); EINJIT_SIMD double cos(double);
EINJIT_SIMD float powf(float, float); EINJIT_SIMD double pow(double, double);
#if __GLIBC_PREREQ(2, 35)
EINJIT_SIMD float exp2f(float); EINJIT_SIMD double exp2(double);
EINJIT_SIMD float log2f(float); EINJIT_SIMD double log2(double);
EINJIT_SIMD float tanhf(float); EINJIT_SIMD double tanh(double);
#endif
#endif
"""


def _has_libmvec() -> bool:
    return sys.platform.startswith("linux") and platform.machine() == "x86_64" and platform.libc_ver()[0] == "glibc"


@dataclass(frozen=True)
class CcOptions:
    """How to compile. `flags` and `libs` replace the defaults entirely when given.

    `-ffp-contract=off`: gcc does not fuse `a * b + c` on its own, because where it fuses
    depends on its vectorization choices, so results would change with loop order and differ
    from the interpreter. Fused multiply-adds are explicit in the IR (`Ternop.FMA`, which the
    simplifier introduces) and compile to FMA instructions under `-march=native`.

    `threads`: how many OpenMP threads the loops the scheduler marks `parallel` (the outer
    loops of large contractions) run on; 1 compiles without `-fopenmp` and renders no pragma.
    Default: `EINJIT_NUM_THREADS`, else the machine's core count.

    `vector_math` lets gcc vectorize loops calling exp/log/sin/cos/pow/exp2/log2/tanh with
    glibc's libmvec (x86-64 glibc only; elsewhere it has no effect). Those vector variants
    are accurate to a few ulps rather than glibc's scalar < 1 ulp; turn it off for results
    that match the scalar math library exactly.

    `-O2`, not `-O3`: gcc 12.2 at `-O3` miscompiles small vectorized reduction nests (a
    reduction into one cell after store motion, with if-converted conditionals: sums came out
    missing terms). At `-O2` gcc 12 still vectorizes with its cheap cost model, and the
    benchmarks (`benchmarks/bench_core.py`) lose little.
    """

    compiler: str = field(default_factory=_default_compiler)
    flags: tuple[str, ...] = ("-O2", "-march=native", "-fPIC", "-shared", "-fno-math-errno",
                              "-fno-trapping-math", "-ffp-contract=off")
    libs: tuple[str, ...] = ("-lm",)
    keep_source: bool = False
    vector_math: bool = True
    syntax: CSyntax = C_SYNTAX
    threads: int = field(default_factory=lambda: default_threads())

    def effective_syntax(self) -> CSyntax:
        syntax = dataclasses.replace(self.syntax, num_threads=self.threads) if self.threads > 1 else self.syntax
        if self.vector_math and _has_libmvec():
            return dataclasses.replace(syntax, prelude=syntax.prelude + _VECTOR_MATH_PRELUDE)
        return syntax

    def effective_libs(self) -> tuple[str, ...]:
        """The libraries, and `-fopenmp` when compiling for several threads (gcc takes it at
        any position of its one compile-and-link command)."""
        openmp = ("-fopenmp",) if self.threads > 1 else ()
        return openmp + (("-lmvec",) if self.vector_math and _has_libmvec() else ()) + self.libs


def default_threads() -> int:
    """`EINJIT_NUM_THREADS` if set, else the machine's core count."""
    value = os.environ.get("EINJIT_NUM_THREADS", "").strip()
    if not value:
        return os.cpu_count() or 1
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise CompileError(f"einjit: EINJIT_NUM_THREADS must be a positive integer, got {value!r}")
    return threads


@dataclass
class CcStats:
    """Counters for tests and debugging: how often the compiler actually ran."""

    compiler_invocations: int = 0
    cache_hits: int = 0


stats = CcStats()


@dataclass(frozen=True, eq=False)
class Procedure:
    """A compiled routine: its source (the whole translation unit it was compiled in), its
    parameters in calling order, the shared object and the loaded C function."""

    name: str
    source: str
    params: tuple[Param, ...]
    bindings: tuple[StaticSymbol, ...]
    so_path: Path
    function: Callable = field(repr=False)
    source_path: Path | None = None

    def mem_class(self, tn: Tnode) -> MemClass | None:
        """How this procedure stores `tn` (None if it does not touch it or it is Local_only)."""
        for p in self.params:
            if p.kind is ParamKind.ARRAY and p.tn is tn:
                return p.mem
        return None


# ---------------------------------------------------------------- compiling


@functools.lru_cache(maxsize=None)
def _compiler_identity(compiler: str) -> str:
    path = shutil.which(compiler)
    if path is None:
        raise _missing_compiler(compiler)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False, timeout=60)
    except OSError as e:
        raise _missing_compiler(compiler, e) from e
    return f"{os.path.realpath(path)}\n{out.stdout}"


@functools.lru_cache(maxsize=None)
def _host_identity() -> str:
    """The CPU the objects are built for: `-march=native` output must not be reused on a
    machine with other instruction-set extensions sharing the cache directory."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} {flags.strip()}"


def _missing_compiler(compiler: str, err: Exception | None = None) -> CompileError:
    cc_env = os.environ.get("CC")
    why = f" ({err})" if err else ""
    return CompileError(
        f"einjit: C compiler {compiler!r} not found or not runnable{why}. Install gcc, or set $CC to a "
        f"working C compiler ($CC is {'unset' if cc_env is None else repr(cc_env)}), or pass "
        f"CcOptions(compiler=...).")


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _cc_dir() -> Path:
    path = config.cache_dir() / "cc"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _build(program: CProgram, label: str, options: CcOptions) -> tuple[Path, Path | None]:
    """The shared object for `program`, from the cache or freshly compiled; and the kept source."""
    identity = _compiler_identity(options.compiler)
    cmd_flags = " ".join(options.flags + options.effective_libs())
    key = hashlib.sha256("\0".join([_ABI_VERSION, identity, _host_identity(), cmd_flags, program.source])
                         .encode()).hexdigest()[:32]
    directory = _cc_dir()
    so_path, c_path = directory / f"{key}.so", directory / f"{key}.c"
    keep = options.keep_source or config.debug_level() >= 3
    if keep:
        _atomic_write(c_path, program.source)
    config.debug(3, f"cc: generated C for {label}:\n{program.source}")
    if so_path.exists():
        stats.cache_hits += 1
        config.debug(1, f"cc: {label}: cache hit {so_path}")
    else:
        _compile(program.source, so_path, c_path, label, options)
    return so_path, c_path if keep else None


def _compile(source: str, so_path: Path, c_path: Path, label: str, options: CcOptions) -> None:
    """Run the compiler on `source` into `so_path`, through temporary files published with
    `os.replace`; on failure keep the source at `c_path` and raise with the diagnostics."""
    fd, tmp_c = tempfile.mkstemp(dir=so_path.parent, prefix=".tmp-", suffix=".c")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(source)
    tmp_so = tmp_c[:-2] + ".so"
    cmd = [options.compiler, *options.flags, "-o", tmp_so, tmp_c, *options.effective_libs()]
    config.debug(3, f"cc: {' '.join(cmd)}")
    start = time.perf_counter()
    stats.compiler_invocations += 1
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:
        os.unlink(tmp_c)
        _compiler_identity.cache_clear()
        raise _missing_compiler(options.compiler, e) from e
    elapsed = time.perf_counter() - start
    if proc.returncode != 0 or not os.path.exists(tmp_so):
        os.replace(tmp_c, c_path)
        if os.path.exists(tmp_so):
            os.unlink(tmp_so)
        diagnostics = (proc.stderr + proc.stdout).strip()
        if len(diagnostics) > _MAX_DIAGNOSTICS:
            diagnostics = diagnostics[:_MAX_DIAGNOSTICS] + "\n... (diagnostics truncated)"
        raise CompileError(
            f"einjit: {options.compiler} failed (exit {proc.returncode}) compiling {label}; the generated "
            f"source is kept at {c_path}\ncommand: {' '.join(cmd)}\n{diagnostics}")
    os.replace(tmp_so, so_path)
    os.unlink(tmp_c)
    config.debug(1, f"cc: {label}: compiled in {elapsed * 1000:.1f} ms")


def _unwrap(llc) -> ll.LLStmt:
    """Accept the optimizer's result (anything with `.llc`) as well as bare low-level code."""
    return getattr(llc, "llc", llc)


def compile_batch(routines: Sequence[tuple[str, ll.LLStmt]], *, bindings: Sequence[StaticSymbol] = (),
                  options: CcOptions | None = None) -> list[Procedure]:
    """Compile several routines into one shared object with one compiler call; every routine
    takes all of `bindings` as its trailing `int` parameters."""
    options = options or CcOptions()
    if not routines:
        return []
    start = time.perf_counter()
    program = render_program([(n, _unwrap(c)) for n, c in routines], tuple(bindings),
                             options.effective_syntax())
    rendered_at = time.perf_counter()
    label = ", ".join(n for n, _ in routines)
    so_path, c_path = _build(program, label, options)
    try:
        lib = ctypes.CDLL(str(so_path))
    except OSError as e:
        config.debug(1, f"cc: {label}: cached object {so_path} unloadable ({e}); rebuilding")
        so_path.unlink(missing_ok=True)
        so_path, c_path = _build(program, label, options)
        lib = ctypes.CDLL(str(so_path))
    procs = []
    for r in program.routines:
        fn = lib[r.name]
        fn.restype = None
        procs.append(Procedure(r.name, program.source, r.params, tuple(bindings), so_path, fn, c_path))
    config.debug(1, f"cc: {label}: render {1000 * (rendered_at - start):.1f} ms, "
                    f"total {1000 * (time.perf_counter() - start):.1f} ms")
    return procs


def compile_proc(llc: ll.LLStmt, *, name: str, bindings: Sequence[StaticSymbol] = (),
                 options: CcOptions | None = None) -> Procedure:
    """Compile one routine (its own shared object, shared by all contexts that link it)."""
    return compile_batch([(name, llc)], bindings=bindings, options=options)[0]


# ---------------------------------------------------------------- contexts and routines


class CpuContext:
    """The arrays one CPU device computes with, keyed by node.

    Hosted nodes use the host array itself (`share_host_arrays=True`, the default), so the
    host sees results without copying; with `share_host_arrays=False` they get a per-context
    copy moved by `from_host` / `to_host`, which lets several contexts compute concurrently.
    Other nodes get a zeroed per-context array on first need.
    """

    def __init__(self, name: str = "cpu", *, share_host_arrays: bool = True):
        self.name = name
        self.share_host_arrays = share_host_arrays
        self.arrays: dict[Tnode, np.ndarray] = {}
        self.merge_buffers: dict[Tnode, np.ndarray] = {}

    def __repr__(self) -> str:
        return f"<CpuContext {self.name}: {len(self.arrays)} arrays>"

    def array(self, tn: Tnode) -> np.ndarray:
        arr = self.arrays.get(tn)
        if arr is None:
            if tn.is_hosted() and (self.share_host_arrays or tn.is_constant()):
                arr = _checked(tn, tn.host_array())
            elif tn.is_hosted():
                arr = np.array(_checked(tn, tn.host_array()), order="C", copy=True)
            else:
                arr = np.zeros(tn.dims, dtype=tn.prec.dtype)
            self.arrays[tn] = arr
        return arr

    def merge_buffer(self, tn: Tnode) -> np.ndarray:
        """The buffer that receives another device's copy of `tn` (zeroed until filled)."""
        buf = self.merge_buffers.get(tn)
        if buf is None:
            buf = self.merge_buffers[tn] = np.zeros(tn.dims, dtype=tn.prec.dtype)
        return buf

    def from_host(self, tn: Tnode) -> None:
        arr = self.array(tn)
        host = tn.host_array()
        if arr is not host:
            arr[...] = host

    def to_host(self, tn: Tnode) -> None:
        arr = self.array(tn)
        host = tn.host_array()
        if arr is not host:
            host[...] = arr


def _checked(tn: Tnode, arr: np.ndarray) -> np.ndarray:
    if arr.dtype != tn.prec.dtype or tuple(arr.shape) != tuple(tn.dims) or not arr.flags.c_contiguous \
            or not arr.flags.writeable:
        raise ValueError(
            f"einjit: host array of {tn.debug_name()} must be a writeable C-contiguous {tn.prec.dtype} array "
            f"of shape {tn.dims}, got {arr.dtype} {arr.shape} (contiguous={arr.flags.c_contiguous})")
    return arr


class Routine:
    """A procedure linked to a context: `routine()` runs it once on the context's arrays.

    The argument pointers are captured at link time: arrays in the context must not be
    replaced afterwards (mutate them in place instead).
    """

    __slots__ = ("name", "context", "procedure", "bindings", "_run", "_keep")

    def __init__(self, context: CpuContext, procedure: Procedure, bindings: dict[StaticSymbol, IntRef],
                 run: Callable[[], None], keep: list[np.ndarray]):
        self.name = procedure.name
        self.context = context
        self.procedure = procedure
        self.bindings = bindings
        self._run = run
        self._keep = keep

    def __call__(self) -> None:
        self._run()

    def __repr__(self) -> str:
        return f"<Routine {self.name} on {self.context.name}>"


def link(context: CpuContext, procedure: Procedure,
         static_values: Mapping[StaticSymbol, IntRef] | None = None) -> Routine:
    """Bind `procedure` to `context`'s arrays. Static symbols without a given `IntRef` get a
    fresh one (in `routine.bindings`); values are checked against known static ranges."""
    keep: list[np.ndarray] = []
    pointers: list[ctypes.c_void_p] = []
    refs: dict[StaticSymbol, IntRef] = {}
    for p in procedure.params:
        match p.kind:
            case ParamKind.ARRAY:
                arr = context.array(p.tn)
            case ParamKind.MERGE_BUFFER:
                arr = context.merge_buffer(p.tn)
            case ParamKind.STATIC:
                refs[p.static] = (static_values or {}).get(p.static) or IntRef(0)
                continue
        keep.append(arr)
        pointers.append(ctypes.c_void_p(arr.ctypes.data))
    return Routine(context, procedure, refs, _caller(procedure.function, tuple(pointers), refs), keep)


def _caller(fn: Callable, pointers: tuple, refs: dict[StaticSymbol, IntRef]) -> Callable[[], None]:
    """The cheapest closure that performs one call: a bare partial when there are no statics."""
    if not refs:
        return functools.partial(fn, *pointers)
    cells = tuple(refs.values())
    ranged = tuple((s, r, s.static_range) for s, r in refs.items() if s.static_range is not None)

    def run() -> None:
        for s, r, n in ranged:
            if not 0 <= r.value < n:
                raise IndexError(f"einjit: static symbol {s!r} = {r.value} outside its range [0, {n})")
        fn(*pointers, *[c.value for c in cells])

    return run
