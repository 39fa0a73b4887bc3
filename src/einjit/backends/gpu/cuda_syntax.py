"""Rendering low-level code as CUDA: one `extern "C" __global__` kernel per routine.

The C-family renderer of `c_syntax` does the statements and expressions; the kernel plan
(`gpu/plan.py`: segments, parallel loops, grid barriers, memory classes) decides how a
routine's work is spread over the GPU's threads, and this module configures the renderer
accordingly (`CUDA_SYNTAX` plus per-kernel hooks).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

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
from einjit.backends.gpu.plan import PRIVATE_LIMIT_BYTES, KernelPlan, plan_kernel
from einjit.backends.parallel_loops import accesses
from einjit.backends.params import CudaMemClass, repeated_names
from einjit.ir import low_level as ll
from einjit.ir import naming, ops
from einjit.ir.indexing import StaticSymbol, Symbol, get_symbol
from einjit.ir.tnode import Tnode

_INT_PRECS = (ops.byte, ops.int32, ops.int64)


def cuda_type_name(prec: ops.Prec) -> str:
    """C types, with bf16 cells as CUDA's `__nv_bfloat16` (the same 16 bits as the host's)."""
    return "__nv_bfloat16" if prec is ops.bf16 else prec.c_type


CUDA_SYNTAX = CSyntax(
    type_name=cuda_type_name,
    function_qualifier='extern "C" __global__',
    restrict="__restrict__",
    helper_qualifier="__device__ inline",
    includes=(),
    stack_limit_bytes=PRIVATE_LIMIT_BYTES,
    local_scratch_decl=None,
    zero_out_memset=False,
    bf16_dot=False,
    own_math=False,
    vector_transpose=False,
    prefetch=False,
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

_BF16 = """\
/* bf16 storage through cuda_bf16.h: loads widen exactly, stores round to nearest even. */
__device__ inline float einjit_bf16_load(__nv_bfloat16 h) { return __bfloat162float(h); }
__device__ inline __nv_bfloat16 einjit_bf16_store(float f) { return __float2bfloat16_rn(f); }
"""

# The C renderer's helpers, as device functions; bf16 conversions by CUDA's own intrinsics.
_HELPERS = {name: text.format(q=CUDA_SYNTAX.helper_qualifier) for name, text in c_syntax.HELPERS.items()
            if name not in ("bf16_dot", "amx_tiles")} | {"bf16": _BF16}


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
    includes: tuple[str, ...] = ("cooperative_groups.h",) if any(k.plan.grid_sync for k in kernels) else ()
    if ops.bf16 in precs:
        includes += ("cuda_bf16.h",)
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
