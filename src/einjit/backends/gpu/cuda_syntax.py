"""Rendering low-level code as CUDA: one `extern "C" __global__` kernel per routine.

The C-family renderer of `c_syntax` does the statements and expressions; this module decides
how a routine's work is spread over the GPU's threads (`plan_kernel`) and configures the
renderer accordingly (`CUDA_SYNTAX` plus per-kernel hooks).

Grid mapping. A routine body is a sequence of top-level statements ("segments"). For each
segment, the leading perfectly nested loops whose iterations touch disjoint cells of every
node the body writes — each such node is sliced by the loop's index, at the same axis, in
every read and write — are *parallel*: they are collapsed into one index space that the
grid's threads cover with a grid-stride loop, one iteration per thread at a time. The first
loop that is not parallel (a reduction: its iterations accumulate into the same cells) and
everything inside it run sequentially within the thread, so reductions never race. A segment
without a parallel loop runs on thread 0. Between two segments where the later one touches
what the earlier wrote (or writes what it read), all threads of the grid synchronize
(`cooperative_groups::this_grid().sync()`, so such kernels are launched cooperatively).

Memory classes (`CudaMemClass`). A `Local` node used by only one segment, small enough, and
written before it is read in each parallel iteration becomes a per-thread local array
(`LOCAL_ONLY`): every thread recomputes its own copy. Every other node — including `Local`
nodes that live across segments — is `GLOBAL`: a kernel parameter pointing to device memory.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from einjit.backends import c_syntax
from einjit.backends.c_syntax import (
    CSyntax,
    MemClass,
    RenderedRoutine,
    RenderError,
    mem_class,
    render_routine,
    symbol_name,
)
from einjit.backends.parallel_loops import accesses, opaque, parallel_chain
from einjit.backends.params import CudaMemClass, repeated_names
from einjit.ir import low_level as ll
from einjit.ir import naming, ops
from einjit.ir.indexing import Iterator, StaticSymbol, Symbol, get_symbol
from einjit.ir.passes.local_storage import is_routine_local
from einjit.ir.tnode import Tnode

MAX_BLOCK = 256
PRIVATE_LIMIT_BYTES = 16 * 1024
"""The largest `Local` node kept as a per-thread array; larger ones live in global memory."""

_INT_PRECS = (ops.byte, ops.int32, ops.int64)


CUDA_SYNTAX = CSyntax(
    function_qualifier='extern "C" __global__',
    restrict="__restrict__",
    helper_qualifier="__device__ inline",
    includes=(),
    stack_limit_bytes=PRIVATE_LIMIT_BYTES,
    local_scratch_decl=None,
    zero_out_memset=False,
    interchange_loops=False,
)

_PRELUDE = """\
#define EINJIT_TID ((long long)blockIdx.x * blockDim.x + threadIdx.x)
#define EINJIT_NTHREADS ((long long)gridDim.x * blockDim.x)
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
"""

_GRID_SYNC = """\
/* All threads of the grid meet here; the kernel is launched cooperatively. */
__device__ inline void einjit_grid_sync(void) { cooperative_groups::this_grid().sync(); }
"""

_INT_MATH = """\
/* Integer arguments of math functions go through double, as in C. */
#define EINJIT_INT_MATH(T) \\
  __device__ inline double exp(T x) { return exp((double)x); } \\
  __device__ inline double log(T x) { return log((double)x); } \\
  __device__ inline double exp2(T x) { return exp2((double)x); } \\
  __device__ inline double log2(T x) { return log2((double)x); } \\
  __device__ inline double sin(T x) { return sin((double)x); } \\
  __device__ inline double cos(T x) { return cos((double)x); } \\
  __device__ inline double sqrt(T x) { return sqrt((double)x); } \\
  __device__ inline double tanh(T x) { return tanh((double)x); } \\
  __device__ inline double fabs(T x) { return fabs((double)x); } \\
  __device__ inline double erf(T x) { return erf((double)x); } \\
  __device__ inline double log1p(T x) { return log1p((double)x); } \\
  __device__ inline double pow(T x, T y) { return pow((double)x, (double)y); }
EINJIT_INT_MATH(unsigned char)
EINJIT_INT_MATH(int)
EINJIT_INT_MATH(long long)
"""

# The C renderer's helpers, as device functions.
_HELPERS = {name: text.format(q=CUDA_SYNTAX.helper_qualifier) for name, text in c_syntax.HELPERS.items()}


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True, eq=False)
class Segment:
    """A top-level statement and its leading loops that the grid's threads share."""

    stmt: ll.LLStmt
    parallel: tuple[ll.ForLoop, ...] = ()

    @property
    def size(self) -> int:
        """How many threads can work on the segment at once."""
        return math.prod(lp.to_ - lp.from_ + 1 for lp in self.parallel)

    @property
    def is_work(self) -> bool:
        return not isinstance(self.stmt, (ll.Comment, ll.Noop))


@dataclass(frozen=True, eq=False)
class KernelPlan:
    name: str
    segments: tuple[Segment, ...]
    barriers: frozenset[int]
    """Indices of the segments preceded by a grid-wide synchronization."""
    mem_classes: Mapping[Tnode, CudaMemClass] = field(repr=False)

    @property
    def grid_sync(self) -> bool:
        return bool(self.barriers)

    @property
    def work_items(self) -> int:
        """The most threads any segment can use."""
        return max((s.size for s in self.segments if s.is_work), default=1)

    def launch_shape(self) -> tuple[int, int]:
        """(blocks wanted, threads per block): whole warps, at most `MAX_BLOCK` threads."""
        n = self.work_items
        block = MAX_BLOCK if n >= MAX_BLOCK else 32 * max(1, -(-n // 32))
        return -(-n // block), block


def _expand_zero_out(stmt: ll.LLStmt) -> ll.LLStmt:
    """A top-level `ZeroOut` becomes a loop nest of stores, which the grid can share."""
    if not isinstance(stmt, ll.ZeroOut):
        return stmt
    tn = stmt.tn
    syms = [get_symbol() for _ in tn.dims]
    body: ll.LLStmt = ll.Set(tn, tuple(Iterator(s) for s in syms), ll.Constant(0.0), f"{tn.name} := 0")
    for s, d in reversed(list(zip(syms, tn.dims, strict=True))):
        body = ll.ForLoop(s, 0, d - 1, body)
    return body


def _private_nodes(stmts: Sequence[ll.LLStmt]) -> set[Tnode]:
    """`Local` nodes that one segment alone uses and that fit a thread's local memory.
    Routine-local nodes (`ir.local_storage`) stay global: a segment may read cells of them
    that another thread's iterations wrote."""
    users: dict[Tnode, set[int]] = {}
    for k, s in enumerate(stmts):
        for a in accesses(s):
            users.setdefault(a.tn, set()).add(k)
    return {tn for tn, ks in users.items()
            if tn.is_local() and not is_routine_local(tn) and len(ks) == 1
            and tn.size * tn.prec.itemsize <= PRIVATE_LIMIT_BYTES}


def _touched(stmt: ll.LLStmt, private: set[Tnode]) -> tuple[set[Tnode], set[Tnode]]:
    reads: set[Tnode] = set()
    writes: set[Tnode] = set()
    for a in accesses(stmt):
        if a.tn not in private:
            (writes if a.write else reads).add(a.tn)
    return reads, writes


def plan_kernel(name: str, llc: ll.LLStmt) -> KernelPlan:
    """Split `llc` into segments, find each one's parallel loops, place grid barriers where a
    segment depends on an earlier one since the last barrier, and classify the nodes."""
    stmts = [_expand_zero_out(s) for s in ll.flatten(llc)]
    private = _private_nodes(stmts)
    segments: list[Segment] = []
    barriers: set[int] = set()
    reads: set[Tnode] = set()
    writes: set[Tnode] = set()
    opaque_before, started = False, False
    for s in stmts:
        seg = Segment(s, parallel_chain(s, private))
        if seg.is_work:
            r, w = _touched(s, private)
            staged = opaque(s)
            if started and (writes & (r | w) or reads & w or staged or opaque_before):
                barriers.add(len(segments))
                reads, writes = set(), set()
            reads |= r
            writes |= w
            opaque_before, started = staged, True
        segments.append(seg)
    classes: dict[Tnode, CudaMemClass] = {}
    for s in stmts:
        for a in accesses(s):
            classes[a.tn] = CudaMemClass.LOCAL_ONLY if a.tn in private else CudaMemClass.GLOBAL
    return KernelPlan(name, tuple(segments), frozenset(barriers), classes)


# ---------------------------------------------------------------- rendering

HeadFn = Callable[[str], str]


def _collapsed_heads(chain: tuple[ll.ForLoop, ...]) -> dict[Symbol, HeadFn]:
    """Headers that walk the chain's index space with a grid-stride loop over `g`, each loop
    variable recovered from `g` (the innermost one varies fastest: coalesced accesses)."""
    trips = [lp.to_ - lp.from_ + 1 for lp in chain]
    strides = [math.prod(trips[k + 1:]) for k in range(len(chain))]
    g = f"g_{symbol_name(chain[0].index)}"
    heads: dict[Symbol, HeadFn] = {}
    for k, (lp, n, st) in enumerate(zip(chain, trips, strides, strict=True)):
        offset = f"{lp.from_} + " if lp.from_ else ""
        part = g if st == 1 else f"({g} / {st})" if k > 0 else f"{g} / {st}"
        if k > 0:
            part = f"{part} % {n}"
        if n == 1:
            offset, part = "", str(lp.from_)

        def value(itype: str, lp=lp, offset=offset, part=part) -> str:
            return f"const {itype} {symbol_name(lp.index)} = {offset}({itype})({part});"

        if k == 0:
            total = math.prod(trips)

            def outer_head(itype: str, value: HeadFn = value, total: int = total) -> str:
                return (f"for (long long {g} = EINJIT_TID; {g} < {total}LL; {g} += EINJIT_NTHREADS) "
                        f"{{ {value(itype)}")
            heads[lp.index] = outer_head
        else:
            def inner_head(itype: str, value: HeadFn = value) -> str:
                return f"{{ {value(itype)}"
            heads[lp.index] = inner_head
    return heads


def render_kernel(plan: KernelPlan, bindings: Sequence[StaticSymbol] = ()) -> RenderedRoutine:
    """The kernel's source: barriers as `einjit_grid_sync()`, sequential segments guarded to
    thread 0, parallel chains as collapsed grid-stride loops."""
    heads: dict[Symbol, HeadFn] = {}
    stmts: list[ll.LLStmt] = []
    for k, seg in enumerate(plan.segments):
        if k in plan.barriers:
            stmts.append(ll.StagedCompilation(lambda: "einjit_grid_sync();"))
        if seg.parallel or not seg.is_work:
            heads.update(_collapsed_heads(seg.parallel) if seg.parallel else {})
            stmts.append(seg.stmt)
        else:
            solo = get_symbol("t")
            heads[solo] = lambda itype: "if (EINJIT_TID == 0) {"
            stmts.append(ll.ForLoop(solo, 0, 0, seg.stmt))

    def loop_head(loop: ll.ForLoop, name: str, itype: str) -> str | None:
        head = heads.get(loop.index)
        return None if head is None else head(itype)

    def classify(tn: Tnode, written: bool) -> MemClass:
        mem_class(tn, written)
        if plan.mem_classes.get(tn) is CudaMemClass.LOCAL_ONLY:
            return MemClass.LOCAL_ONLY
        return MemClass.FROM_CONTEXT

    syntax = dataclasses.replace(CUDA_SYNTAX, loop_head=loop_head, classify=classify)
    return render_routine(plan.name, ll.seq(*stmts), bindings, syntax)


@dataclass(frozen=True, eq=False)
class CudaKernel:
    name: str
    plan: KernelPlan = field(repr=False)
    rendered: RenderedRoutine = field(repr=False)


@dataclass(frozen=True, eq=False)
class CudaProgram:
    """A translation unit of kernels, in the order given."""

    source: str
    kernels: tuple[CudaKernel, ...]


def render_program(routines: Sequence[tuple[str, ll.LLStmt]], bindings: Sequence[StaticSymbol] = ()) -> CudaProgram:
    """Plan and render routines into one CUDA source, with only the support code they use."""
    dup = repeated_names(n for n, _ in routines)
    if dup:
        raise RenderError(f"einjit: routine names must be distinct in one program, repeated: {dup}")
    kernels = []
    with naming.stable_names(), ll.deep_recursion():
        for name, llc in routines:
            plan = plan_kernel(name, llc)
            rendered = render_kernel(plan, tuple(bindings))
            kernels.append(CudaKernel(rendered.name, plan, rendered))
    nodes = {a.tn for _, llc in routines for a in accesses(llc)}
    nodes |= {x.id.tn for _, llc in routines for s in ll.iter_stmts(llc) if isinstance(s, ll.SetLocal) for x in [s]}
    precs = {tn.prec for tn in nodes}
    if ops.half in precs:
        node = min((tn for tn in nodes if tn.prec is ops.half), key=lambda tn: tn.id)
        raise RenderError(f"einjit: the CUDA backend does not support half precision yet ({node.debug_name()} is "
                          f"half); use single precision")
    includes = ("cooperative_groups.h",) if any(k.plan.grid_sync for k in kernels) else ()
    # The C renderer's own support macros (index clamping, ...) come with its empty program.
    header = c_syntax.render_program([], (), dataclasses.replace(CUDA_SYNTAX, includes=includes, prelude=_PRELUDE))
    parts = [header.source.replace("einjit: C backend", "einjit: CUDA backend", 1)]
    if any(p in _INT_PRECS for p in precs):
        parts.append(_INT_MATH)
    if any(k.plan.grid_sync for k in kernels):
        parts.append(_GRID_SYNC)
    for helper in sorted(set().union(*(k.rendered.helpers for k in kernels))):
        if helper not in _HELPERS:
            raise RenderError(f"einjit: the CUDA backend has no device version of the helper {helper!r}")
        parts.append(_HELPERS[helper])
    parts += [k.rendered.code for k in kernels]
    return CudaProgram("\n".join(parts), tuple(kernels))
