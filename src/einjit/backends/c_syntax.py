"""Rendering the low-level IR to C-family source code.

One function per routine, readable enough to debug by eye: tensor names come from their
labels, `Set.debug` strings and `Comment`s become comments, multi-axis indices are flattened
row-major with constant strides. The output is shaped for gcc's vectorizer (`restrict`
pointers, constant trip counts, no calls in loop bodies other than math functions).

What differs between C and CUDA — function qualifiers, the `restrict` spelling, how local
arrays are declared, which math functions exist for a precision — lives in the frozen
`CSyntax` configuration, so a CUDA renderer reuses this module by passing its own.

Memory classes (seed 001, CPU backends) decide where a node's storage comes from:
`LOCAL_ONLY` nodes are declared inside the function, `FROM_CONTEXT` nodes are passed as
arguments (a per-context copy), `CONSTANT_FROM_HOST` nodes are read directly from the host
array through a `const` pointer. Virtual nodes have no storage and must not appear.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Sequence

from einjit.backends import amx_tiles, bf16_dot, c_math, c_outline, c_transpose, c_vectors, parallel_loops
from einjit.backends.params import MemClass, Param, ParamKind, repeated_names
from einjit.errors import EinjitError
from einjit.ir import low_level as ll
from einjit.ir import naming, ops
from einjit.ir.c_names import c_name
from einjit.ir.indexing import (
    Affine,
    AxisIndex,
    FixedIdx,
    GatherIdx,
    Iterator,
    StaticSymbol,
    SubAxis,
    Symbol,
    gather_indices,
    index_symbols,
    make_affine,
)
from einjit.ir.passes.local_storage import is_routine_local
from einjit.ir.precision import combine_prec
from einjit.ir.structure import Structure, structure
from einjit.ir.tnode import Tnode

_INT_MAX = 2**31 - 1
_LLONG_MAX = 2**63 - 1


class RenderError(EinjitError, ValueError):
    """The low-level program cannot be rendered: a virtual node, an unbound symbol, an
    out-of-bounds constant index range, a malformed routine name."""


def mem_class(tn: Tnode, written: bool) -> MemClass:
    """The CPU memory class of a node a routine touches; `written` says whether it assigns it.

    A constant hosted node that the routine itself writes (its initialization) cannot be a
    `const` pointer, so it falls back to `FROM_CONTEXT`. Nodes without a memory mode
    (unoptimized code) are `FROM_CONTEXT`. Whether a node is only used within one routine is
    the optimizer's decision, recorded as the `Local` memory mode.
    """
    _reject_virtual(tn)
    if tn.is_local():
        return MemClass.LOCAL_ONLY
    if tn.is_constant() and not written:
        return MemClass.CONSTANT_FROM_HOST
    return MemClass.FROM_CONTEXT


def _reject_virtual(tn: Tnode) -> None:
    if tn.is_virtual():
        raise RenderError(
            f"einjit: virtual tensor {tn.debug_name()} appears in code to render; virtual nodes have "
            f"no storage (provenance {tn.provenance}) — its computation should have been inlined")


def c_math_suffix(prec: ops.Prec) -> str:
    """`expf` for single (and half, computed through float), `exp` for double and integers."""
    return "f" if prec in (ops.single, ops.half) else ""


def c_type_name(prec: ops.Prec) -> str:
    return prec.c_type


@dataclass(frozen=True)
class CSyntax:
    """The C-family dialect to render. Templates use `{t}` (element type), `{name}`, `{size}`
    and `{restrict}`. `prelude` is emitted verbatim after the includes.

    Routine-local arrays (memory class `LOCAL_ONLY`) up to `stack_limit_bytes` each and
    `stack_total_bytes` together are declared on the stack (`local_stack_decl`); larger ones
    are scratch parameters (`local_scratch_decl`), arrays the backend allocates once (per
    context and node): no allocation per call, and, each its own `restrict` pointer, code as
    fast as for a context array (slices of one buffer would be assumed to alias each other).
    `local_scratch_decl=None` makes an oversized local an error (dialects without scratch).

    Hooks for dialects that map loops and storage differently (CUDA): `loop_head(loop,
    symbol_name, index_type)` returns a loop's header text (ending in `{`) or None for the
    plain `for`; `classify(tn, written)` replaces `mem_class` (a non-`LOCAL_ONLY` class makes
    the node a parameter)."""

    function_qualifier: str = ""
    restrict: str = "restrict"
    helper_qualifier: str = "static inline"
    type_name: Callable[[ops.Prec], str] = c_type_name
    math_suffix: Callable[[ops.Prec], str] = c_math_suffix
    includes: tuple[str, ...] = ("math.h", "stdlib.h", "string.h")
    prelude: str = ""
    stack_limit_bytes: int = 16 * 1024
    stack_total_bytes: int = 256 * 1024
    local_stack_decl: str = "{t} {name}[{size}] = {{0}};"
    local_scratch_decl: str | None = "{t} *{restrict} {name}"
    zero_out_memset: bool = True
    unroll_pragma: str = "#pragma GCC unroll {n}"
    num_threads: int = 1
    parallel_pragma: str = "#pragma omp parallel for schedule(dynamic{chunk}){collapse} num_threads({n}){private}"
    parallel_region_pragma: str = "#pragma omp parallel num_threads({n}){private}"
    private_heap_decl: str = "{t} *{restrict} {name} = ({t} *)malloc({size} * sizeof({t}));\nif (!{name}) abort();"
    """A thread's own copy of a scratch node, written before it is read (the `parallel`
    loop's contract), so it needs no zero fill."""
    private_heap_free: str = "free({name});"
    private_stack_decl: str = "{t} {name}[{size}];"
    """A thread's own copy of a stack local that only its parallel region uses (again written
    before it is read)."""
    parallel_for_pragma: str = "#pragma omp for schedule(dynamic{chunk}){collapse}"
    """Loops on threads hand out iterations dynamically: on a busy machine a descheduled
    thread then delays only its current iteration, not a fixed share of the loop. Light
    iterations go in chunks (`chunk_clause` of `parallel_loops.chunk`)."""
    chunk_clause: str = ", {k}"
    collapse_clause: str = " collapse({k})"
    """A threaded loop and the `parallel` loops right inside it shared out as one
    (`parallel_loops.collapsed`): 3 kernel rows times 3 columns split evenly over 2 threads."""
    thread_min_work: int = parallel_loops.THREAD_MIN_WORK
    """At more than one thread, nests whose outermost parallel loop runs at least this many
    assignments go on threads (`parallel_loops.thread_nests`)."""
    thread_routine_min_work: int | None = None
    """A routine whose threaded nests run fewer assignments each on average runs on one
    thread (`parallel_loops.ROUTINE_WORK_FACTOR` times `thread_min_work` when None)."""
    shared_region_pragma: str = "#pragma omp parallel num_threads({n})"
    """One region around consecutive threaded nests (`parallel_loops.shared_regions`): each
    nest an orphaned `parallel_for_pragma` loop, the statements between them `single_pragma`."""
    single_pragma: str = "#pragma omp single"
    barrier_pragma: str = "#pragma omp barrier"
    master_pragma: str = "#pragma omp master"
    """The profiler's clock reads in a shared region: one thread reads, after a barrier."""
    nowait_clause: str = " nowait"
    loop_head: Callable[[ll.ForLoop, str, str], str | None] | None = None
    classify: Callable[[Tnode, bool], MemClass] | None = None
    outline_min_nests: int = 0
    """A routine with at least this many top-level loop nests renders each nest as its own
    function (`c_outline`), nests identical up to names as one function; 0: never by size. A
    routine with a shared parallel region (`num_threads` > 1) is always outlined, its threaded
    nests orphaned `omp for` loops in their functions."""
    units: int = 1
    """How many translation units the outlined nest functions are spread over, beside the
    routine's own (gcc compiles them in parallel); 1 keeps everything in one."""
    own_math: bool = True
    """Render einjit's own math functions where it has them (`c_math`: `exp` in single
    precision), whose scalar and vectorized forms give the same bits; dialects with their own
    math library (CUDA) leave it off."""
    bf16_dot: bool = True
    """Render bf16-pair kernel nests for AVX512_BF16 and bf16 tile kernels for AMX too, where
    the compiler targets them (`bf16_dot`, `amx_tiles`); dialects without x86 intrinsics leave
    it off."""
    vector_transpose: bool = True
    """Render transposing copies (panel packs) as 8x8 blocks of GCC vector shuffles
    (`c_transpose`); dialects without GCC vector extensions leave it off."""
    prefetch: bool = True
    """Render loops' `ll.Prefetch` requests as `__builtin_prefetch`; dialects without the GCC
    builtin leave them out (they change no value)."""


C_SYNTAX = CSyntax()


@dataclass(frozen=True, slots=True, eq=False)
class RenderedRoutine:
    """`code` is the routine's own function; `nests` the definitions (without storage class)
    of the nest functions it calls when it was outlined (`c_outline`)."""

    name: str
    code: str
    params: tuple[Param, ...]
    local_nodes: tuple[Tnode, ...]
    helpers: frozenset[str]
    scratch_bytes: int = 0
    nests: tuple[str, ...] = ()


UNIT_MARK = "/* einjit: translation unit */\n"
"""Starts every translation unit after the first in a program's source."""


@dataclass(frozen=True, slots=True, eq=False)
class CProgram:
    """The source of the routines in the order given: one translation unit, or several
    (outlined nests spread for parallel compilation) separated by `UNIT_MARK` lines."""

    source: str
    routines: tuple[RenderedRoutine, ...]


# ---------------------------------------------------------------- helpers emitted on demand

HELPERS = {
    "clamp_index": """\
/* An index read at run time (gather / scatter), clamped into [0, n): never out of bounds. */
{q} long long einjit_clamp_index(long long i, long long n) {{
  return i < 0 ? 0 : (i >= n ? n - 1 : i);
}}
""",
    **c_vectors.HELPERS,
    **c_transpose.HELPERS,
    "uniform01": """\
/* VecUnop.UNIFORM_HASH: splitmix64 of a counter, top 53 bits scaled to [0, 1). */
{q} double einjit_uniform01(unsigned long long x) {{
  unsigned long long z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z = z ^ (z >> 31);
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}}
""",
    "bf16": """\
/* bf16 storage (precision bf16): a float's upper 16 bits. A load widens exactly; a store rounds
   to nearest even, and a NaN stays a (quiet) NaN instead of carrying into an infinity. */
{q} float einjit_bf16_load(unsigned short h) {{
  union {{ unsigned int u; float f; }} v;
  v.u = (unsigned int)h << 16;
  return v.f;
}}
{q} unsigned short einjit_bf16_store(float f) {{
  union {{ float f; unsigned int u; }} v;
  v.f = f;
  const unsigned int rounded = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16;
  return (unsigned short)((v.u & 0x7fffffffu) > 0x7f800000u ? (v.u >> 16) | 0x40u : rounded);
}}
""",
    "bf16_dot": bf16_dot.HELPER,
    "amx_tiles": amx_tiles.HELPER,
    **c_math.HELPERS,
}

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SIMPLE = re.compile(r"(\(\w[\w ]*\))?[\w.]+(\[[^\[\]]*\])?")


def _sanitize(name: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return clean if clean and not clean[0].isdigit() else "n" + clean


def symbol_name(s: Symbol) -> str:
    return _sanitize(repr(s))


def local_name(sid: ll.ScopeId) -> str:
    """Generated names end in `_` (locals `v3_`, temporaries `t1_`) so they can never equal a
    loop symbol (`i3`) or a node name, which never ends in `_`."""
    names = naming.current()
    return names.local(sid) if names is not None else f"v{sid.id}_"


_UNSAFE_IN_COMMENT = re.compile(r"[^ -\[\]-~]")
"""Everything but printable ASCII without the backslash: no newline or carriage return to end a
line, no backslash to splice one, no NUL, nothing a compiler's input charset may reject."""


def _comment(text: str) -> str:
    """`text` (labels: the user's) as a C comment that stays one comment on one line: unsafe
    characters become `?` (line breaks and tabs a space), and `*/` (which would end it), `/*`
    and `??` (a trigraph's start, as in `??/` for a backslash) are split apart."""
    safe = _UNSAFE_IN_COMMENT.sub(lambda m: " " if m.group() in "\n\r\t" else "?", text)
    safe = re.sub(r"\*(?=/)|/(?=\*)|\?(?=\?)", lambda m: m.group() + " ", safe)
    return "/* " + safe + " */"


def _float_literal(v: float, prec: ops.Prec, syn: CSyntax) -> str:
    t = syn.type_name(prec)
    if math.isnan(v):
        body = "NAN"
    elif math.isinf(v):
        body = "INFINITY" if v > 0 else "(-INFINITY)"
    else:
        text = repr(float(v))
        body = text + prec.c_literal_suffix if prec is not ops.half else text
        if v < 0:
            body = f"({body})"
    return body if prec in (ops.single, ops.double) else f"(({t}){body})"


def _int_literal(v: int, prec: ops.Prec) -> str:
    suffix = "LL" if prec is ops.int64 or not -_INT_MAX - 1 <= v <= _INT_MAX else ""
    if v >= 2**63:
        return f"{v}ULL"
    if v < 0:
        return f"(-{-v}{suffix})" if v != -(2**63) else "(-9223372036854775807LL - 1)"
    return f"{v}{suffix}"


def constant_literal(v: float, prec: ops.Prec, syn: CSyntax = C_SYNTAX) -> str:
    """A C literal for `v` computed in `prec`: `1.0f`, `INFINITY`, `3` or `3LL`."""
    if prec.is_float:
        return _float_literal(v, prec, syn)
    if math.isfinite(v) and float(v).is_integer():
        return _int_literal(int(v), prec)
    return _float_literal(v, ops.double, syn)


# ---------------------------------------------------------------- index expressions


def _affine_text(terms: Iterable[tuple[int, Symbol]], offset: int) -> str:
    out = ""
    for c, s in terms:
        name = symbol_name(s)
        mag = name if abs(c) == 1 else f"{abs(c)}*{name}"
        out += (mag if c > 0 else f"-{mag}") if not out else (f" + {mag}" if c > 0 else f" - {mag}")
    if offset or not out:
        out += str(offset) if not out else (f" + {offset}" if offset > 0 else f" - {-offset}")
    return out


def flat_index(dims: tuple[int, ...], idcs: tuple[AxisIndex, ...]) -> str:
    """Row-major flattening with constant strides: `i1 * 16 + i2`, `(2*i4 + i5 - 1) * 8 + 3`."""
    parts: list[str] = []
    const = 0
    for idx, st in zip(idcs, ll.row_major_strides(dims), strict=True):
        match idx:
            case FixedIdx(i):
                const += i * st
            case SubAxis():
                pass
            case Iterator(s):
                parts.append(symbol_name(s) if st == 1 else f"{symbol_name(s)} * {st}")
            case Affine(terms, offset):
                text = f"({_affine_text(terms, offset)})"
                parts.append(text if st == 1 else f"{text} * {st}")
            case GatherIdx():
                text = axis_index_text(idx)
                parts.append(text if st == 1 else f"{text} * {st}")
    if not parts:
        return str(const)
    if len(parts) == 1 and not const and parts[0].endswith(")") and parts[0].startswith("("):
        return parts[0][1:-1]
    text = " + ".join(parts)
    return text + (f" + {const}" if const > 0 else f" - {-const}" if const else "")


def clamped_flat_index(dims: tuple[int, ...], idcs: tuple[AxisIndex, ...], clamped: list[int]) -> str:
    """Row-major flattening where the axes in `clamped` are clamped into range: a read under a
    `where` guard (padding) is then always in bounds and can be done unconditionally."""
    parts = []
    for axis, (idx, st) in enumerate(zip(idcs, ll.row_major_strides(dims), strict=True)):
        text = axis_index_text(idx)
        if axis in clamped:
            text = f"EINJIT_CLAMP({text}, {dims[axis] - 1})"
        parts.append(text if st == 1 else f"{text} * {st}")
    return " + ".join(parts)


def _plus(idx: AxisIndex, k: int) -> AxisIndex:
    """An affine index plus a constant."""
    match idx:
        case FixedIdx(i):
            return FixedIdx(i + k)
        case Iterator(s):
            return make_affine([(1, s)], k)
        case Affine(terms, offset):
            return make_affine(terms, offset + k)
    raise RenderError(f"einjit: a loop bound {idx!r} is not an affine index")


def axis_index_text(idx: AxisIndex) -> str:
    match idx:
        case FixedIdx(i):
            return str(i)
        case Iterator(s):
            return symbol_name(s)
        case Affine(terms, offset):
            return f"({_affine_text(terms, offset)})"
        case SubAxis():
            return "0"
        case GatherIdx(ids, idcs, size):
            return f"einjit_clamp_index({ids.name}[{flat_index(ids.dims, idcs)}], {size})"
    raise TypeError(f"not an axis index: {idx!r}")


# ---------------------------------------------------------------- function bodies


class _Writer:
    """Renders one routine's body, collecting the nodes, buffers and helpers it needs."""

    def __init__(self, syn: CSyntax, statics: Sequence[StaticSymbol], index_type: str):
        self.syn = syn
        self.index_type = index_type
        self.static_ranges: dict[Symbol, int | None] = {b.symbol: b.static_range for b in statics}
        self.loops: dict[Symbol, tuple[int, int]] = {}
        self.locals_in_scope: set[ll.ScopeId] = set()
        self.on_stack: set[Tnode] = set()
        self.region_only: set[Tnode] = set()
        self.in_nest_function = False
        """Rendering a nest that may become a function of its own, taking the routine's stack
        arrays it shares with other nests as pointers: a thread's copy of one is then declared in
        the region, since `private(..)` on a pointer parameter gives each thread an unset pointer."""
        self.nodes: dict[int, Tnode] = {}
        self.written: set[int] = set()
        self.merges: dict[int, Tnode] = {}
        self.helpers: set[str] = set()
        self.lines: list[str] = []
        self.guarded = 0
        self.temps = 0
        self.parallel_depth = 0
        self.nest_owned: set[Tnode] = set()
        self.hoisted: dict[str, str] | None = None
        """The loads of the statement being rendered, bound to temporaries (`hoisting`)."""
        self.orphan: bool | None = None
        """In a shared region: render the next threaded loop as an orphaned `omp for`, with
        `nowait` when True."""
        self.team = False
        """Statements here run on every thread of a loop region (`loop_region`): those without
        a threaded loop go in `omp single`."""
        self.region_declared: set[Tnode] = set()
        """Private nodes a loop region declared once for all its threaded loops."""
        self.shared_zero: bool | None = None
        """In a shared region: render the zero fill as an `omp for` over its pieces, with
        `nowait` when True."""

    # -- names and storage

    def node_name(self, tn: Tnode, written: bool = False) -> str:
        _reject_virtual(tn)
        self.nodes.setdefault(tn.id, tn)
        if written:
            self.written.add(tn.id)
        return tn.name

    def _check_symbol(self, s: Symbol, where: str) -> None:
        if s not in self.loops and s not in self.static_ranges:
            raise RenderError(f"einjit: symbol {s!r} used in {where} is bound neither by an enclosing loop "
                              f"nor by the routine's static bindings {sorted(map(repr, self.static_ranges))}")

    def _range(self, idx: AxisIndex) -> tuple[int, int] | None:
        match idx:
            case FixedIdx(i):
                return i, i
            case SubAxis():
                return 0, 0
            case GatherIdx(_, _, size):
                return 0, size - 1
            case Iterator(s):
                terms, offset = ((1, s),), 0
            case Affine(terms, offset):
                pass
        lo = hi = offset
        for c, s in terms:
            if s in self.loops:
                a, b = self.loops[s]
            elif (static_range := self.static_ranges.get(s)) is not None:
                a, b = 0, static_range - 1
            else:
                return None
            lo, hi = lo + min(c * a, c * b), hi + max(c * a, c * b)
        return lo, hi

    def index(self, tn: Tnode, idcs: tuple[AxisIndex, ...], what: str, extra_last: int = 0) -> str:
        """The flat index, after checking symbols are bound and, where loop ranges are known,
        that it stays in bounds (reads under a `where` guard are exempt: padding)."""
        dims = tn.dims
        if len(idcs) != len(dims):
            raise RenderError(f"einjit: {what} of {tn.debug_name()} uses {len(idcs)} indices {idcs} "
                              f"but the node has dims {dims}")
        for g in gather_indices(idcs):
            self.node_name(g.ids)
            self.index(g.ids, g.idcs, "read")
            self.helpers.add("clamp_index")
        clamped: list[int] = []
        empty_loop = any(a > b for a, b in self.loops.values())
        for axis, (idx, d) in enumerate(zip(idcs, dims, strict=True)):
            for s in index_symbols(idx):
                self._check_symbol(s, f"{what} of {tn.debug_name()}")
            rng = None if empty_loop else self._range(idx)
            hi = None if rng is None else rng[1] + (extra_last if axis == len(dims) - 1 else 0)
            in_bounds = rng is not None and hi is not None and rng[0] >= 0 and hi < d
            if self.guarded and what == "read":
                if not in_bounds and not isinstance(idx, FixedIdx):
                    clamped.append(axis)
            elif rng is not None and not in_bounds:
                raise RenderError(
                    f"einjit: {what} of {tn.debug_name()} with dims {dims}: index {idx!r} on axis {axis} "
                    f"ranges over [{rng[0]}, {hi}], outside [0, {d - 1}]")
        if clamped:
            return clamped_flat_index(dims, idcs, clamped)
        return flat_index(dims, idcs)

    def cell(self, tn: Tnode, idcs: tuple[AxisIndex, ...], what: str) -> str:
        """`x[i]`; in a register block, a lane of one of its vectors: `acc[3][l]`."""
        index = self.index(tn, idcs, what)
        name = self.node_name(tn, written=what == "write")
        if not c_vectors.is_block(tn):
            return f"{name}[{index}]"
        self.helpers.add(c_vectors.helper(tn))
        return f"{name}[{flat_index(tn.dims[:-1], idcs[:-1])}][{axis_index_text(idcs[-1])}]"

    def prefetch(self, p: ll.Prefetch) -> str:
        """A `Prefetch`: gcc's builtin, its address `p.ahead` elements on computed as an integer
        (past the array's end it would be undefined as a pointer; clamping it into the array
        cost the kernels 18 instructions an iteration)."""
        cell = self.cell(p.tn, p.idcs, "read")
        address = f"(const void *)((__UINTPTR_TYPE__)&{cell} + {p.ahead * p.tn.prec.itemsize})"
        return f"__builtin_prefetch({address}, 1);" if p.write else f"__builtin_prefetch({address});"

    # -- vector statements (`c_vectors`)

    def vector_set(self, st: ll.Set, lane: Symbol, indent: str) -> None:
        """A loop over a register block's lanes (`c_vectors.lane_statement`) as one statement."""
        vec = next(x.tn for x in (st, *ll.iter_scalars(st.llsc))
                   if isinstance(x, (ll.Set, ll.Get)) and c_vectors.is_block(x.tn))
        self.helpers.add(c_vectors.helper(vec))
        value = self.vector(st.llsc, vec, lane)
        at = self.vector_ref(st.tn, st.idcs, vec, lane, "write")
        note = " " + _comment(st.debug) if st.debug else ""
        if c_vectors.is_block(st.tn):
            self.lines.append(f"{indent}{at} = {value};{note}")
        else:
            self.lines.append(f"{indent}einjit_store_{c_vectors.vector_name(vec)}({at}, {value});{note}")

    def vector_ref(self, tn: Tnode, idcs: tuple[AxisIndex, ...], vec: Tnode, lane: Symbol, what: str) -> str:
        """A block's vector `acc[3]`, or the address of another array's first lane `&x[i]`
        (its vector's other lanes checked in bounds too)."""
        first = c_vectors.at_lane_zero(idcs, lane)
        name = self.node_name(tn, written=what == "write")
        if c_vectors.is_block(tn):
            self.index(tn, first, what)
            return f"{name}[{flat_index(tn.dims[:-1], idcs[:-1])}]"
        return f"&{name}[{self.index(tn, first, what, extra_last=vec.dims[-1] - 1)}]"

    def vector(self, sc: ll.LLScalar, vec: Tnode, lane: Symbol) -> str:
        """`sc` over the lanes of `vec`'s vectors."""
        short = c_vectors.vector_name(vec)
        match sc:
            case ll.Constant(v):
                return f"einjit_splat_{short}({constant_literal(v, vec.prec, self.syn)})"
            case ll.Get(tn, idcs) if c_vectors.access_mode(tn, idcs, lane) == "splat":
                return f"einjit_splat_{short}({self.loaded(self.cell(tn, idcs, 'read'), tn.prec)})"
            case ll.Get(tn, idcs) if c_vectors.is_block(tn) and tn.dims[-1] != vec.dims[-1]:
                part = c_vectors.half(tn, idcs, lane)
                assert part is not None, "c_vectors.lane_statement reads other blocks by halves only"
                self.helpers.update(c_vectors.halves(tn))
                first = (*idcs[:-1], Iterator(lane))
                return f"{c_vectors.half_name(tn, part)}({self.vector_ref(tn, first, tn, lane, 'read')})"
            case ll.Get(tn, idcs) if c_vectors.is_block(tn):
                return self.vector_ref(tn, idcs, vec, lane, "read")
            case ll.Get(tn, idcs):
                return f"einjit_load_{short}({self.vector_ref(tn, idcs, vec, lane, 'read')})"
            case ll.Ternop(ops.Ternop.FMA, a, b, c):
                return f"einjit_fma_{short}({', '.join(self.vector(x, vec, lane) for x in (a, b, c))})"
            case ll.Binop(op, a, b):
                return op.c_template.format(self.vector(a, vec, lane), self.vector(b, vec, lane))
        raise TypeError(f"not a vector scalar: {sc!r}")

    # -- scalars

    def typed(self, text: str, prec: ops.Prec) -> str:
        return f"(({self.syn.type_name(prec)}){text})"

    def cast(self, text: str, have: ops.Prec, want: ops.Prec) -> str:
        return text if have is want else f"({self.syn.type_name(want)}){text}"

    def scalar(self, sc: ll.LLScalar, prec: ops.Prec, pre: list[str], indent: str) -> str:
        """C text of `sc` computed in `prec`; local scopes are hoisted into `pre`. An operation
        on wider arguments is computed in their precision and converted once (`combine_prec`);
        one stored in bf16 is computed in single (`Prec.computed_in`)."""
        prec = prec.computed_in
        wide = combine_prec(prec, sc)
        if wide is not prec:
            return self.cast(self.scalar(sc, wide, pre, indent), wide, prec)
        match sc:
            case ll.Constant(v):
                return constant_literal(v, prec, self.syn)
            case ll.ConstantBits(b):
                lit = _int_literal(int(b), ops.int64)
                return self.typed(lit, prec) if prec is not ops.int64 else lit
            case ll.Get(tn, idcs):
                text = self.loaded(self.cell(tn, idcs, "read"), tn.prec)
                if self.hoisted is not None:
                    if text not in self.hoisted:
                        self.hoisted[text] = self.bind(text, tn.prec.computed_in, pre, indent)
                    text = self.hoisted[text]
                return self.cast(text, tn.prec.computed_in, prec)
            case ll.GetMergeBuffer(tn, idcs):
                self.merges.setdefault(tn.id, tn)
                text = f"merge_{tn.name}[{self.index(tn, idcs, 'merge-buffer read')}]"
                return self.cast(self.loaded(text, tn.prec), tn.prec.computed_in, prec)
            case ll.GetLocal(sid):
                if sid not in self.locals_in_scope:
                    raise RenderError(f"einjit: local {sid!r} (of {sid.tn.debug_name()}) read outside its scope")
                return self.cast(local_name(sid), sid.tn.prec.computed_in, prec)
            case ll.LocalScope(sid, body, _):
                # A bf16 node's local is a float holding bf16 numbers: each `SetLocal` rounds.
                pre.append(f"{indent}{self.syn.type_name(sid.tn.prec.computed_in)} {local_name(sid)} = 0;")
                self.locals_in_scope.add(sid)
                saved, self.lines = self.lines, pre
                self.stmt(body, indent)
                self.lines = saved
                return self.cast(local_name(sid), sid.tn.prec.computed_in, prec)
            case ll.EmbedIndex(idx):
                for s in index_symbols(idx):
                    self._check_symbol(s, "an embedded index")
                return f"(({self.syn.type_name(prec)}){axis_index_text(idx)})"
            case ll.Unop(op, a):
                own = c_math.template(op, prec) if self.syn.own_math else None
                if own:
                    self.helpers.add(own[1])
                template = own[0] if own else op.c_template
                return self.apply(template, template, prec, [self.scalar(a, prec, pre, indent)], pre, indent)
            case ll.Binop(op, a, b):
                args = [self.scalar(x, prec, pre, indent) for x in (a, b)]
                return self.apply(op.c_template, op.c_int_template, prec, args, pre, indent)
            case ll.Ternop(ops.Ternop.WHERE, c, a, b):
                args = [self.scalar(c, prec, pre, indent)]
                self.guarded += 1
                args += [self.scalar(x, prec, pre, indent) for x in (a, b)]
                self.guarded -= 1
                return self.apply(ops.Ternop.WHERE.c_template, ops.Ternop.WHERE.c_template, prec, args, pre, indent)
            case ll.Ternop(op, a, b, c):
                args = [self.scalar(x, prec, pre, indent) for x in (a, b, c)]
                return self.apply(op.c_template, op.c_int_template, prec, args, pre, indent)
        raise TypeError(f"not a low-level scalar: {sc!r}")

    def apply(self, template: str, int_template: str, prec: ops.Prec, args: list[str], pre: list[str],
              indent: str) -> str:
        """Instantiate an op template. An argument the template repeats (`relu`, `max` on
        integers) is bound to a temporary first unless trivial, so it is computed once — except
        under a `where` guard, where it must stay inside the conditional; the arguments of a
        conditional template that read memory are bound too (floating point only). Results are cast back
        to `prec` where C would compute in another type (half arithmetic, integer math through
        double functions)."""
        if not prec.is_float:
            template = int_template
        if not self.guarded:
            args = [self.bind(a, prec, pre, indent) if template.count(f"{{{k}}}") > 1 and not _SIMPLE.fullmatch(a)
                    else a for k, a in enumerate(args)]
        text = template.format(*args, f=self.syn.math_suffix(prec))
        needs_cast = prec is ops.half or (not prec.is_float and "{f}" in template)
        return self.typed(text, prec) if needs_cast else text

    def loaded(self, cell: str, prec: ops.Prec) -> str:
        """A cell's value in C: a bf16 cell is widened to float (`einjit_bf16_load`)."""
        if prec is not ops.bf16:
            return cell
        self.helpers.add("bf16")
        return f"einjit_bf16_load({cell})"

    def stored(self, value: str, prec: ops.Prec) -> str:
        """What a cell of `prec` is assigned for the C value `value`: a bf16 cell its rounding."""
        if prec is not ops.bf16:
            return value
        self.helpers.add("bf16")
        return f"einjit_bf16_store({value})"

    def bind(self, text: str, prec: ops.Prec, pre: list[str], indent: str) -> str:
        self.temps += 1
        name = f"t{self.temps}_"
        pre.append(f"{indent}const {self.syn.type_name(prec)} {name} = {text};")
        return name

    # -- statements

    def emit(self, indent: str, text: str) -> None:
        self.lines.extend(indent + line for line in text.split("\n"))

    def with_scalar(self, indent: str, render: Callable[[list[str], str], str], hoist: bool = False) -> None:
        """Emit a statement whose scalar may hoist local scopes or loads: then both go in a block."""
        pre: list[str] = []
        before = set(self.locals_in_scope)
        saved, self.hoisted = self.hoisted, {} if hoist else None
        text = render(pre, indent + "  ")
        self.hoisted = saved
        if pre:
            self.lines.append(indent + "{")
            self.lines.extend(pre)
            self.emit(indent + "  ", text)
            self.lines.append(indent + "}")
        else:
            self.emit(indent, text)
        self.locals_in_scope = before

    def stmt(self, stmt: ll.LLStmt, indent: str) -> None:
        if self.team and not self.parallel_depth:
            self.team_stmts(stmt, indent)
            return
        for s in ll.flatten(stmt):
            match s:
                case ll.Comment(msg):
                    self.lines.append(indent + _comment(msg))
                case ll.StagedCompilation(render):
                    self.emit(indent, render().rstrip("\n"))
                case ll.ForLoop(index, from_, to_, body, _):
                    if index in self.loops or index in self.static_ranges:
                        raise RenderError(f"einjit: loop symbol {index!r} is already bound in an enclosing scope")
                    if (lane_set := c_vectors.lane_statement(s)) is not None:
                        self.vector_set(lane_set, index, indent)
                        continue
                    if self.syn.vector_transpose and not self.guarded and (tr := c_transpose.kernel(s)):
                        self.lines += c_transpose.render(self, tr, (symbol_name(index), symbol_name(tr.inner.index)),
                                                         indent)
                        continue
                    name = symbol_name(index)
                    dot = bf16_dot.kernel(s) if self.syn.bf16_dot else None
                    pairs = bf16_dot.pair_pack(s) if self.syn.bf16_dot and dot is None else None
                    if dot is not None:
                        self.lines += bf16_dot.render(self, dot, name, indent)
                    elif pairs is not None:
                        self.lines += bf16_dot.render_pack(self, pairs, name, indent)
                    elif self.syn.bf16_dot and (tiles := amx_tiles.kernel(s)) is not None:
                        self.lines += amx_tiles.render(self, tiles, name, indent)
                    if s.unroll and self.syn.unroll_pragma:
                        self.lines.append(indent + self.syn.unroll_pragma.format(n=to_ - from_ + 1))
                    region: list[str] = []
                    at = indent  # a parallel region indents its loop, not the statements after it
                    team = not s.parallel and self.syn.num_threads > 1 and not self.parallel_depth and _threads(s)
                    opens = team and self.orphan is None
                    if s.parallel and self.syn.num_threads > 1 and not self.parallel_depth:
                        at, region = self.parallel_head(s, indent)
                    elif opens:
                        at, region = self.loop_region(s, indent)
                    head = self.syn.loop_head(s, name, self.index_type) if self.syn.loop_head else None
                    lo, hi = self.loop_bounds(s)
                    self.lines.append(at + (head or f"for ({self.index_type} {name} = {lo}; "
                                                    f"{name} < {hi}; ++{name}) {{"))
                    self.loops[index] = (from_, to_)
                    self.lines += [at + "  " + self.prefetch(p) for p in s.prefetch if self.syn.prefetch]
                    self.parallel_depth += s.parallel
                    self.team, outer_team = team, self.team
                    self.stmt(body, at + "  ")
                    self.team = outer_team
                    self.parallel_depth -= s.parallel
                    del self.loops[index]
                    self.lines.append(at + "}")
                    self.lines.extend(region)
                    if opens:
                        self.orphan, self.region_declared = None, set()
                    if dot is not None or pairs is not None:
                        self.lines.append("#endif")
                case ll.ZeroOut(tn):
                    self.zero_out(tn, indent)
                case ll.Set(tn, idcs, llsc, debug):
                    def render_set(pre, ind, tn=tn, idcs=idcs, llsc=llsc, debug=debug):
                        lhs = self.cell(tn, idcs, "write")
                        note = " " + _comment(debug) if debug else ""
                        if tn.prec is ops.bf16 and isinstance(llsc, ll.Get) and llsc.tn.prec is ops.bf16:
                            # a bf16 pair panel packs bf16 cells: copied, not widened and rounded back
                            return f"{lhs} = {self.cell(llsc.tn, llsc.idcs, 'read')};{note}"
                        return f"{lhs} = {self.stored(self.scalar(llsc, tn.prec, pre, ind), tn.prec)};{note}"
                    self.with_scalar(indent, render_set, tn.prec.is_float and hoisting(llsc))
                case ll.SetLocal(sid, value):
                    if sid not in self.locals_in_scope:
                        raise RenderError(f"einjit: local {sid!r} (of {sid.tn.debug_name()}) set outside its scope")
                    def render_local(pre, ind, sid=sid, value=value):
                        rhs = self.scalar(value, sid.tn.prec, pre, ind)
                        if sid.tn.prec is ops.bf16:
                            rhs = self.loaded(self.stored(rhs, ops.bf16), ops.bf16)
                        return f"{local_name(sid)} = {rhs};"
                    self.with_scalar(indent, render_local, sid.tn.prec.is_float and hoisting(value))
                case ll.SetFromVec():
                    def render_vec(pre, ind, s=s):
                        return self.set_from_vec(s, pre, ind)
                    self.with_scalar(indent, render_vec)
                case _:
                    raise TypeError(f"not a low-level statement: {s!r}")

    def loop_region(self, loop: ll.ForLoop, indent: str) -> tuple[str, list[str]]:
        """One parallel region around a serial `loop` with threaded loops inside (a blocked
        contraction's k chunks around its threaded panels): every thread runs `loop`, each
        threaded loop inside is an orphaned `omp for` and the statements between them an
        `omp single`, so the loop costs a barrier per step instead of a fork-join. The private
        copies no code outside threaded loops uses are declared once, at the region's start;
        the indentation of the loop and the lines that close the region."""
        threaded = [s for s in ll.iter_stmts(loop) if isinstance(s, ll.ForLoop) and s.parallel]
        hoist = {tn.id: tn for s in threaded for tn in private_nodes(s) if tn in self.region_only}
        self.lines.append(indent + self.syn.parallel_region_pragma.format(n=self.syn.num_threads, private=""))
        self.orphan, self.region_declared = False, set(hoist.values())
        return self.private_block(indent, [tn for _, tn in sorted(hoist.items())], None)

    def team_stmts(self, stmt: ll.LLStmt, indent: str) -> None:
        """`stmt` run by every thread of a loop region: loops with threaded loops inside as
        they are, each run of other statements in one `omp single` (whose barrier orders it
        before what follows)."""
        pending: list[ll.LLStmt] = []

        def single() -> None:
            self.team = False
            if any(not isinstance(s, ll.Comment) for s in pending):
                self.lines += [indent + self.syn.single_pragma, indent + "{"]
                self.stmt(ll.seq(*pending), indent + "  ")
                self.lines.append(indent + "}")
            else:
                self.stmt(ll.seq(*pending), indent)
            self.team = True
            pending.clear()

        for s in ll.flatten(stmt):
            if isinstance(s, ll.ForLoop) and _threads(s):
                single()
                self.team = False
                self.stmt(s, indent)
                self.team = True
            else:
                pending.append(s)
        single()

    def loop_bounds(self, loop: ll.ForLoop) -> tuple[str, str]:
        """The first and past-the-last iteration of `loop` as C expressions: its clips
        (`ll.LoopClip`, from outer indices) where they can cut its range, the constant
        bounds where they can exceed it."""
        lo, hi = str(loop.from_), str(loop.to_ + 1)
        for clip, at_start in ((loop.start, True), (loop.stop, False)):
            if clip is None:
                continue
            least, most = self.index_range(clip.bound)
            scale = clip.scale
            if scale > 1 and loop.from_ < 0:
                raise RenderError(f"einjit: loop {loop.index!r} from {loop.from_} has a scaled clip: its bound "
                                  f"is rounded up by truncating division, exact only from 0 on")
            text = axis_index_text(clip.bound) if scale == 1 else \
                f"{axis_index_text(_plus(clip.bound, scale - 1))} / {scale}"  # rounded up from `from_` on
            if at_start and most > scale * loop.from_:
                lo = text if least + scale - 1 >= scale * loop.from_ else f"({text} > {lo} ? {text} : {lo})"
            elif not at_start and least < scale * (loop.to_ + 1):
                hi = text if most <= scale * (loop.to_ + 1) else f"({text} < {hi} ? {text} : {hi})"
        return lo, hi

    def index_range(self, idx: AxisIndex) -> tuple[int, int]:
        """The least and greatest value of an affine index over the enclosing loops."""
        match idx:
            case FixedIdx(i):
                return i, i
            case Iterator(s):
                return self.loops[s]
            case Affine(terms, offset):
                least = most = offset
                for c, sym in terms:
                    a, b = c * self.loops[sym][0], c * self.loops[sym][1]
                    least, most = least + min(a, b), most + max(a, b)
                return least, most
        raise RenderError(f"einjit: a loop bound {idx!r} is not an affine index of enclosing loops")

    def parallel_head(self, loop: ll.ForLoop, indent: str) -> tuple[str, list[str]]:
        """The OpenMP pragma for a `parallel` loop; the indentation of the loop and the lines
        that close its region. The scheduler's locals written inside (register blocks, packed
        panels; `private_nodes`) are private to each thread. One that only parallel regions use
        (`region_only_nodes`) is declared in the region alone: a stack array, or a heap copy
        each thread allocates. One also used outside keeps the routine's copy there and gets
        a thread's own inside: through `private(..)` on the stack, or, for a scratch array (a
        private copy of its pointer would share the memory), a heap copy under the same name;
        in a nest that may become a function of its own (`in_nest_function`), where the array
        may be a pointer parameter, a copy declared in the region. Either kind of copy in the
        region makes it a `parallel` region around an `omp for`.
        Routine-local nodes (`ir.local_storage`) are shared like context arrays, since each
        iteration writes its own cells of them and later code reads them all."""
        nodes = [tn for tn in private_nodes(loop) if tn not in self.region_declared]
        declared = [tn for tn in nodes if tn in self.region_only or tn not in self.on_stack or self.in_nest_function]
        stack = ", ".join(self.node_name(tn, written=True) for tn in nodes if tn not in declared)
        private = f" private({stack})" if stack else ""
        if self.orphan is not None:
            return self.orphaned_head(loop, indent, declared, private)
        if not declared:
            self.lines.append(indent + self.syn.parallel_pragma.format(n=self.syn.num_threads, private=private,
                                                                       **self.for_clauses(loop)))
            return indent, []
        self.lines.append(indent + self.syn.parallel_region_pragma.format(n=self.syn.num_threads, private=private))
        return self.private_block(indent, declared, self.syn.parallel_for_pragma.format(**self.for_clauses(loop)))

    def private_block(self, indent: str, declared: list[Tnode], pragma: str | None) -> tuple[str, list[str]]:
        """A block every thread runs: its own copies of `declared` (on the stack, or from the
        heap and freed at the end), then `pragma` if any; the block's indent and its closing lines."""
        inner = indent + "  "
        self.lines.append(indent + "{")
        heap = [tn for tn in declared if tn not in self.on_stack]
        for tn in declared:
            t, size = storage(tn, self.syn)
            fields = dict(t=t, name=self.node_name(tn, written=True), size=size, restrict=self.syn.restrict)
            decl = self.syn.private_heap_decl if tn in heap else self.syn.private_stack_decl
            self.lines.extend(inner + line for line in decl.format(**fields).split("\n"))
        if pragma:
            self.lines.append(inner + pragma)
        frees = [inner + self.syn.private_heap_free.format(name=self.node_name(tn, written=True)) for tn in heap]
        return inner, [*frees, indent + "}"]

    def for_clauses(self, loop: ll.ForLoop) -> dict[str, str]:
        """The chunk and collapse clauses of a threaded loop's pragma."""
        k = parallel_loops.chunk(loop, self.syn.num_threads)
        depth = len(parallel_loops.collapsed(loop))
        return dict(chunk=self.syn.chunk_clause.format(k=k) if k > 1 else "",
                    collapse=self.syn.collapse_clause.format(k=depth) if depth > 1 else "")

    def orphaned_head(self, loop: ll.ForLoop, indent: str, declared: list[Tnode],
                      private: str) -> tuple[str, list[str]]:
        """`parallel_head` inside a shared region: an `omp for` binding to the enclosing
        region (called outside one, it runs on the calling thread alone). Every thread runs
        the block, so the copies declared in it are its own."""
        pragma = (self.syn.parallel_for_pragma.format(**self.for_clauses(loop)) + private
                  + (self.syn.nowait_clause if self.orphan else ""))
        if not declared:
            self.lines.append(indent + pragma)
            return indent, []
        return self.private_block(indent, declared, pragma)

    def region_part(self, region: parallel_loops.Region, k: int, indent: str, emit: Callable[[str], None]) -> None:
        """Emit top-level statement `region.start + k` of a shared region (`emit(indent)`
        renders it), opening the region before its first statement and closing it after its
        last; statements run by one thread go in one `omp single` block per unit."""
        inner = indent + "  "
        unit = region.unit_of(k)
        nowait = self.syn.nowait_clause if unit.nowait else ""
        if k == 0:
            self.lines.append(indent + self.syn.shared_region_pragma.format(n=self.syn.num_threads))
            self.lines.append(indent + "{")
        if unit.role == "single":
            if k == unit.first:
                self.lines.append(inner + self.syn.single_pragma + nowait)
                self.lines.append(inner + "{")
            emit(inner + "  ")
            if k == unit.stop - 1:
                self.lines.append(inner + "}")
        else:
            if unit.role in ("sync", "timer"):
                self.lines.append(inner + self.syn.barrier_pragma)
            if unit.role == "timer":
                self.lines.append(inner + self.syn.master_pragma)
            self.orphan = unit.nowait if unit.role == "for" else None
            self.shared_zero = unit.nowait if unit.role == "zero" else None
            emit(inner)
            self.orphan = self.shared_zero = None
        if k == region.stop - region.start - 1:
            self.lines.append(indent + "}")

    def top_level(self, top: list[ll.LLStmt], indent: str) -> None:
        """The routine's statements, consecutive threaded nests sharing parallel regions."""
        starts = {r.start: r for r in parallel_loops.shared_regions(top)} if self.syn.num_threads > 1 else {}
        region: parallel_loops.Region | None = None
        for k, s in enumerate(top):
            region = starts.get(k, region)
            if region is None or k >= region.stop:
                region = None
                self.stmt(s, indent)
                continue
            self.region_part(region, k - region.start, indent, functools.partial(self.stmt, s))

    def zero_out(self, tn: Tnode, indent: str) -> None:
        name, t = self.node_name(tn, written=True), self.syn.type_name(tn.prec)
        if self.shared_zero is not None and self.syn.zero_out_memset:
            piece = max(1, parallel_loops.ZERO_PIECE_BYTES // tn.prec.itemsize)
            pieces = -(-tn.size // piece)
            last = tn.size - (pieces - 1) * piece
            self.lines.append(indent + self.syn.parallel_for_pragma.format(chunk="", collapse="")
                              + (self.syn.nowait_clause if self.shared_zero else ""))
            self.lines.append(f"{indent}for ({self.index_type} z = 0; z < {pieces}; ++z) "
                              f"memset({name} + z * {piece}, 0, sizeof({t}) * (z < {pieces - 1} ? {piece} : {last}));")
        elif self.syn.zero_out_memset:
            self.lines.append(f"{indent}memset({name}, 0, sizeof({t}) * {tn.size});")
        else:
            zero = self.stored("0.0f", tn.prec) if tn.prec is ops.bf16 else "0"
            self.lines.append(f"{indent}for ({self.index_type} z = 0; z < {tn.size}; ++z) {name}[z] = {zero};")

    def set_from_vec(self, s: ll.SetFromVec, pre: list[str], indent: str) -> str:
        match s.vec_unop:
            case ops.VecUnop.UNIFORM_HASH:
                self.helpers.add("uniform01")
        name = self.node_name(s.tn, written=True)
        start = self.index(s.tn, s.idcs, "vector write", extra_last=s.length - 1)
        counter = self.scalar(s.arg, ops.int64, pre, indent)
        note = " " + _comment(s.debug) if s.debug else ""
        cell = f"({self.syn.type_name(s.tn.prec.computed_in)})einjit_uniform01(vec_base + (unsigned long long)vec_k)"
        return "\n".join([
            f"{{{note}",
            f"  const unsigned long long vec_base = (unsigned long long){counter} * {s.length}ULL;",
            f"  for ({self.index_type} vec_k = 0; vec_k < {s.length}; ++vec_k)",
            f"    {name}[{start} + vec_k] = {self.stored(cell, s.tn.prec)};",
            "}",
        ])


# ---------------------------------------------------------------- routines and programs


def hoisting(sc: ll.LLScalar) -> bool:
    """Whether a statement computing `sc` loads every cell it reads into a temporary first,
    each once: when `sc` has a conditional (`where`, `max`, `relu`) and the statement computes
    in floating point. gcc 12 miscompiles
    vectorized loops over conditional (masked) loads, and a load it sees under a conditional,
    or next to one (softmax's `exp(where(mask, s - max, 0))`), kept the whole nest scalar:
    softmax's backward ran at 7 GFLOP/s. Reads under a `where` guard have clamped indices,
    so loading them unconditionally is safe."""
    return any(isinstance(x, (ll.Unop, ll.Binop, ll.Ternop)) and "?" in x.op.c_template for x in ll.iter_scalars(sc))


def index_type(name: str, llc: ll.LLStmt) -> str:
    """`int` when every array size, loop bound and index value computed from loop counters fits
    in 32 bits, else `long long` (an `int` loop counter running to 3e9 never stops; a range
    of 3e9 split into `32*k + l` by the scheduler wraps). Past 64 bits no index type fits: an
    error before compiling, naming the node or loop. One walk of the code finds the loops and
    the affine indices used as values (`EmbedIndex`): each reaches at most its offset plus
    its terms over the largest magnitude of their loops' bounds."""
    widest = 0
    for tn in ll.nodes_of(llc):
        if tn.size > _LLONG_MAX:
            raise RenderError(f"einjit: routine {name!r}: {tn.debug_name()} with dims {tn.dims} has {tn.size} "
                              f"cells, more than 64-bit indexing can address ({_LLONG_MAX})")
        widest = max(widest, tn.size)
    embedded: list[Affine] = []
    ranges: dict[Symbol, int] = {}
    for x in ll.deep_parts(llc):
        if isinstance(x, ll.ForLoop):
            bound = max(abs(x.from_), abs(x.to_) + 1)
            if bound > _LLONG_MAX:
                raise RenderError(f"einjit: routine {name!r}: loop {x.index!r} over [{x.from_}, {x.to_}] is longer "
                                  f"than 64-bit indexing can count ({_LLONG_MAX})")
            widest = max(widest, bound)
            ranges[x.index] = max(abs(x.from_), abs(x.to_))
        elif isinstance(x, ll.EmbedIndex) and isinstance(x.idx, Affine):
            embedded.append(x.idx)
    for idx in embedded:
        widest = max(widest, abs(idx.offset) + sum(abs(c) * ranges.get(sym, 0) for c, sym in idx.symbols))
    return "int" if widest <= _INT_MAX else "long long"


def render_routine(name: str, llc: ll.LLStmt, bindings: Sequence[StaticSymbol] = (),
                   syntax: CSyntax = C_SYNTAX) -> RenderedRoutine:
    """Render one routine as a C function definition (without the prelude).

    The function is called `c_names.c_name(name)`: the routine's name unless it is a C keyword,
    a math or C library name (then mangled, e.g. `exp_`); `RenderedRoutine.name` is that name.

    Parameters: the arrays of `FROM_CONTEXT` and `CONSTANT_FROM_HOST` nodes sorted by node
    id, then merge buffers (`merge_NODE`) sorted by node id, then one `int` per static
    binding in the order given.
    """
    if not isinstance(name, str) or not _IDENT.match(name):
        raise RenderError(f"einjit: routine name {name!r} is not a C identifier (letters, digits, _)")
    name = c_name(name)
    itype = index_type(name, llc)
    w = _Writer(syntax, tuple(bindings), itype)
    layout = routine_layout(llc, syntax)
    llc, top, outlined = layout.llc, layout.top, layout.outlined
    if syntax.num_threads > 1:
        w.region_only = region_only_nodes(llc)
    w.on_stack = layout.placement.on_stack
    nest_functions = _render_outlined(w, name, top, bindings, itype) if outlined else ()
    if not outlined:
        w.top_level(top, "  ")

    params: list[Param] = []
    decls: list[str] = []
    local_decls: list[str] = []
    local_nodes: list[Tnode] = []
    r = syntax.restrict
    for tn in sorted(w.nodes.values(), key=lambda n: n.id):
        mem = (syntax.classify or mem_class)(tn, tn.id in w.written)
        t, size = storage(tn, syntax)
        if mem is MemClass.LOCAL_ONLY:
            local_nodes.append(tn)
            if tn in w.region_only or tn in w.nest_owned:
                continue
            if tn in layout.placement.on_stack:
                local_decls.append("  " + syntax.local_stack_decl.format(t=t, name=tn.name, size=size))
            continue
        const = "" if tn.id in w.written else "const "
        params.append(Param(ParamKind.ARRAY, tn.name, tn=tn, mem=mem))
        decls.append(f"{const}{t} *{r} {tn.name}")
    for tn in sorted(w.merges.values(), key=lambda n: n.id):
        if tn.is_local():
            raise RenderError(f"einjit: merge buffer of {tn.debug_name()} read, but the node is Local")
        params.append(Param(ParamKind.MERGE_BUFFER, f"merge_{tn.name}", tn=tn))
        decls.append(f"const {syntax.type_name(tn.prec)} *{r} merge_{tn.name}")
    scratch = [tn for tn in local_nodes if tn not in layout.placement.on_stack and tn not in w.region_only]
    for tn in scratch:
        params.append(Param(ParamKind.SCRATCH, tn.name, tn=tn, mem=MemClass.LOCAL_ONLY))
        decls.append(_scratch_decl(tn, syntax))
    scratch_bytes = sum(tn.size * tn.prec.itemsize for tn in scratch)
    widened: list[str] = []
    for b in bindings:
        sym = symbol_name(b.symbol)
        params.append(Param(ParamKind.STATIC, sym, static=b))
        if itype == "int":
            decls.append(f"int {sym}")
        else:
            # Static values arrive as `int`; widened, `s * stride` cannot overflow in 32 bits.
            decls.append(f"int {sym}_arg")
            widened.append(f"  const long long {sym} = {sym}_arg;")

    qual = f"{syntax.function_qualifier} " if syntax.function_qualifier else ""
    head = f"{qual}void {name}({', '.join(decls) or 'void'}) {{"
    body = widened + [line for d in local_decls for line in d.split("\n")] + w.lines
    code = "\n".join([head, *body, "}"]) + "\n"
    return RenderedRoutine(name, code, tuple(params), tuple(local_nodes), frozenset(w.helpers), scratch_bytes,
                           nest_functions)


def _render_outlined(w: _Writer, name: str, top: list[ll.LLStmt], bindings: Sequence[StaticSymbol],
                     itype: str) -> tuple[str, ...]:
    """Render each top-level loop nest with its own writer, as a function that `w`'s body
    calls; the other statements stay in `w`'s body. Returns the nest functions' definitions.

    A stack local that only one nest touches (the scheduler's register blocks and panels, a
    temporary of that nest alone) is declared in that nest's function, where gcc sees all of
    its uses; every other array is a pointer parameter."""
    rendered: list[tuple[ll.ForLoop, _Writer] | ll.LLStmt] = []
    users: dict[Tnode, int] = {}
    regions = parallel_loops.shared_regions(top) if w.syn.num_threads > 1 else []
    place = {r.start + k: (r, k) for r in regions for k in range(r.stop - r.start)}
    shapes = _NestShapes(w, {b.symbol for b in bindings})
    for i, s in enumerate(top):
        if not isinstance(s, ll.ForLoop):
            before = set(w.nodes)
            w.stmt(s, "  ")
            for k in set(w.nodes) - before:
                users[w.nodes[k]] = users.get(w.nodes[k], 0) + 2
            rendered.append(s)
            continue
        nw = _Writer(w.syn, tuple(bindings), itype)
        nw.on_stack, nw.region_only, nw.in_nest_function = w.on_stack, w.region_only, True
        if i in place and (unit := place[i][0].unit_of(place[i][1])).role == "for":
            nw.orphan = unit.nowait
        if not shapes.copy(s, nw):
            nw.stmt(s, "  ")
            shapes.rendered(nw)
        for tn in nw.nodes.values():
            users[tn] = users.get(tn, 0) + 1
        rendered.append((s, nw))
    w.lines = []
    nests: list[c_outline.Nest | c_outline.Copy] = []
    first_nest: dict[int, int] = {}
    """The nest (index into `nests`) each rendered writer became, for the copies of it."""
    nests_owned: dict[int, list[Tnode]] = {}
    nests_args: dict[int, list[tuple[Tnode, bool]]] = {}
    nests_bound: dict[int, list[tuple[str, Any]]] = {}
    """Per nest: the names its loop counters and locals asked for, for its copies to ask."""

    def emit(item: tuple[ll.ForLoop, _Writer] | ll.LLStmt, indent: str) -> None:
        if not isinstance(item, tuple):
            w.stmt(item, indent)
            return
        loop, nw = item
        owned = [tn for tn in nw.nodes.values() if users[tn] == 1 and tn in w.on_stack and tn not in w.region_only
                 and (w.syn.classify or mem_class)(tn, tn.id in nw.written) is MemClass.LOCAL_ONLY]
        copied = shapes.copied.get(id(nw))
        if copied is not None:
            source = first_nest.get(id(copied[0]))
            mapping = copied[1]
            if source is not None and not all(x in copied[2][kind] for kind, x in nests_bound.get(source, ())):
                source = None
            if source is not None and {mapping[tn] for tn in nests_owned[source]} == set(owned):
                merge_into(nw, owned)
                args = [arg(mapping[tn], merge, nw) for tn, merge in nests_args[source]]
                shapes.ask(copied[2], nests_bound.get(source, []))  # the names rendering it would have asked last
                nests.append(c_outline.Copy(source, args))
                w.lines.append(f"{indent}{c_outline.CALL_MARK}{len(nests) - 1}")
                return
            # the first nest of this structure owns other locals: this one is rendered after all
            fresh = _Writer(w.syn, tuple(bindings), itype)
            fresh.on_stack, fresh.region_only, fresh.orphan = nw.on_stack, nw.region_only, nw.orphan
            fresh.in_nest_function = True
            fresh.stmt(loop, "  ")
            nw = fresh
        merge_into(nw, owned)
        arg_nodes = [(tn, False) for tn in sorted(nw.nodes.values(), key=lambda n: n.id)
                     if tn not in owned and tn not in w.region_only]
        arg_nodes += [(tn, True) for tn in sorted(nw.merges.values(), key=lambda n: n.id)]
        decls = [w.syn.local_stack_decl.format(t=t, name=tn.name, size=size)
                 for tn in sorted(owned, key=lambda n: n.id) for t, size in [storage(tn, w.syn)]]
        private = [tn.name for tn in nw.nodes.values() if tn in w.region_only]
        names = naming.current()
        if names is not None:
            names.requests = []
        renamed = [*(tn.name for tn in owned), *private, *_bound_names(loop)]
        if names is not None:
            nests_bound[len(nests)], names.requests = names.requests or [], None
        first_nest[id(nw)] = len(nests)
        nests_owned[len(nests)] = owned
        nests_args[len(nests)] = arg_nodes
        nests.append(c_outline.Nest([arg(tn, merge, nw) for tn, merge in arg_nodes], decls, nw.lines, renamed))
        w.lines.append(f"{indent}{c_outline.CALL_MARK}{len(nests) - 1}")

    def merge_into(nw: _Writer, owned: list[Tnode]) -> None:
        w.nodes.update(nw.nodes)
        w.written |= nw.written
        w.merges.update(nw.merges)
        w.helpers |= nw.helpers
        w.nest_owned.update(owned)

    def arg(tn: Tnode, merge: bool, nw: _Writer) -> c_outline.Arg:
        if merge:
            return c_outline.Arg(f"merge_{tn.name}", w.syn.type_name(tn.prec), False)
        return c_outline.Arg(tn.name, storage(tn, w.syn)[0], tn.id in nw.written)

    for i, item in enumerate(rendered):
        if i in place:
            w.region_part(*place[i], "  ", functools.partial(emit, item))
        else:
            emit(item, "  ")
    statics = [(symbol_name(b.symbol), "int" if itype == "int" else "long long") for b in bindings]
    functions, calls = c_outline.share(name, nests, statics, w.syn.restrict)
    w.lines = [_call_line(line, calls) if c_outline.CALL_MARK in line else line for line in w.lines]
    return functions


class _NestShapes:
    """The nests `_render_outlined` rendered, by structure (`ir.structure`): a later nest of
    the same structure is not rendered, it becomes a `c_outline.Copy` of the first, whose
    function it calls with its own arrays. Rendering every nest and comparing texts took most
    of a deep model's rendering time (the 12-block GPT-2 step: 946 nests, 74 functions).

    The structure compares everything the text of a nest depends on: the code up to renaming
    its nodes and symbols, each node's dims, precision, memory mode, provenance (register
    blocks) and placement (stack, thread-private), the order of the nodes' ids (arguments
    and declarations are sorted by id), the static symbols by identity (they keep their
    names) and how the nest joins a shared parallel region. Equal structures render to equal
    texts up to those names, so the copy calls the function the first nest's text became."""

    def __init__(self, w: _Writer, statics: set[Symbol]):
        self.w = w
        self.statics = statics
        self.first: dict[Hashable, tuple[_Writer, Structure, list[tuple[str, Any]]]] = {}
        """Per structure: the writer that rendered its first nest, that nest's structure and
        the names rendering it asked for, each once, in order."""
        self.copied: dict[int, tuple[_Writer, dict[Tnode, Tnode], dict[str, dict[Any, Any]]]] = {}
        """Per copy's writer (by id): the first nest's writer, its nodes' counterparts and
        the counterparts of its nodes, symbols and scopes by kind (as `Names` asks them)."""
        self._pending: tuple[Hashable, Structure] | None = None

    def _node_key(self, tn: Tnode) -> Hashable:
        return (tn.dims, tn.prec, tn.memory_mode, tn.provenance, tn in self.w.on_stack, tn in self.w.region_only)

    def _symbol_key(self, s: Symbol) -> Hashable:
        return s if s in self.statics else None

    def copy(self, loop: ll.ForLoop, nw: _Writer) -> bool:
        """Whether `loop` is a copy of a nest rendered before: then `nw` gets the nodes,
        written nodes, merge buffers and helpers that rendering it would have given it, and
        the program's names are asked in the order rendering it would have asked them."""
        self._pending = None
        if not c_outline.SHARE_BY_STRUCTURE:
            return False
        found = structure(loop, self._node_key, self._symbol_key)
        ranks = tuple(sorted(range(len(found.nodes)), key=lambda k: found.nodes[k].id))
        key = (nw.orphan, ranks, found.key)
        known = self.first.get(key)
        names = naming.current()
        if known is None:
            self._pending = (key, found)
            if names is not None:
                names.requests = []
            return False
        of, first, requests = known
        mapping = dict(zip(first.nodes, found.nodes, strict=True))
        counterpart: dict[str, dict[Any, Any]] = {
            "node": mapping, "symbol": dict(zip(first.symbols, found.symbols, strict=True)),
            "local": dict(zip(first.scopes, found.scopes, strict=True))}
        self.ask(counterpart, requests)
        nw.nodes = {mapping[tn].id: mapping[tn] for tn in of.nodes.values()}
        nw.written = {mapping[of.nodes[k]].id for k in of.written}
        nw.merges = {mapping[tn].id: mapping[tn] for tn in of.merges.values()}
        nw.helpers = set(of.helpers)
        self.copied[id(nw)] = (of, mapping, counterpart)
        return True

    @staticmethod
    def ask(counterpart: dict[str, dict[Any, Any]], requests: list[tuple[str, Any]]) -> None:
        """Ask the program's names of the counterparts of what a nest's rendering asked."""
        names = naming.current()
        if names is None:
            return
        ask = {"node": names.node, "symbol": names.symbol, "local": names.local}
        for kind, x in requests:
            ask[kind](counterpart[kind][x])

    def rendered(self, nw: _Writer) -> None:
        """`nw` rendered the nest `copy` last declined: the first of its structure, unless it
        touched or named something its code does not hold (then each is rendered)."""
        names = naming.current()
        requests: list[tuple[str, Any]] = []
        if names is not None:
            requests, names.requests = names.requests or [], None
        if self._pending is None:
            return
        key, found = self._pending
        self._pending = None
        held: dict[str, set[Any]] = {"node": set(found.nodes), "symbol": set(found.symbols),
                                     "local": set(found.scopes)}
        if (all(tn in held["node"] for tn in [*nw.nodes.values(), *nw.merges.values()])
                and set(nw.written) <= set(nw.nodes) and all(x in held[kind] for kind, x in requests)):
            self.first.setdefault(key, (nw, found, list(dict.fromkeys(requests))))


def _call_line(line: str, calls: list[str]) -> str:
    """The nest call a `CALL_MARK` line stands for, at the line's indentation."""
    indent, mark = line.split(c_outline.CALL_MARK)
    return indent + calls[int(mark)].lstrip()


def _bound_names(loop: ll.ForLoop) -> list[str]:
    """The C names a nest binds itself (loop counters, scalar locals): renamed when comparing
    nests, like its arrays. One walk: a walk per statement was quadratic in the nest's depth."""
    names = []
    for x in ll.deep_parts(loop):
        if isinstance(x, ll.ForLoop):
            names.append(symbol_name(x.index))
        elif isinstance(x, ll.LocalScope):
            names.append(local_name(x.id))
    return names


def _threads(stmt: ll.LLStmt) -> bool:
    """Whether `stmt` is or holds a loop marked `parallel`."""
    return any(isinstance(s, ll.ForLoop) and s.parallel for s in ll.iter_stmts(stmt))


def private_nodes(loop: ll.ForLoop) -> list[Tnode]:
    """The locals each thread running `loop` needs its own copy of: the scheduler's locals
    written in its body (the `parallel` contract: written before read in every iteration), by
    id. Routine-local nodes are not among them: each iteration writes its own cells; nor is a
    local the loop fills block by block (`parallel_loops.sliced_nodes`: a weight gradient's
    pack of the summed operand, which the threaded panels after it read whole)."""
    sliced = parallel_loops.sliced_nodes(loop)
    written = {s.tn.id: s.tn for s in ll.iter_stmts(loop.body)
               if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut)) and s.tn.is_local()
               and not is_routine_local(s.tn) and s.tn not in sliced}
    return [tn for _, tn in sorted(written.items())]


def region_only_nodes(llc: ll.LLStmt) -> set[Tnode]:
    """The private nodes of the outermost `parallel` loops (those that open a region) that no
    code outside such a loop touches. When the loops run on threads, a routine-level copy of
    them would go unused: a threaded panel loop packs every panel into each thread's own."""
    inside: set[Tnode] = set()
    outside: set[Tnode] = set()

    def visit(stmt: ll.LLStmt, private: frozenset[Tnode], in_region: bool) -> None:
        for s in ll.flatten(stmt):
            if isinstance(s, ll.ForLoop):
                if s.parallel and not in_region:
                    visit(s.body, frozenset(private_nodes(s)), True)
                else:
                    visit(s.body, private, in_region)
                continue
            for x in ll.deep_parts(s):
                if isinstance(x, (ll.Set, ll.SetFromVec, ll.ZeroOut, ll.Get, ll.GetMergeBuffer)) and x.tn.is_local():
                    (inside if x.tn in private else outside).add(x.tn)

    visit(llc, frozenset(), False)
    return inside - outside


@dataclass(frozen=True, slots=True, eq=False)
class LocalPlacement:
    """Where a routine's local arrays live: `on_stack`, or (the others) as scratch parameters."""

    on_stack: set[Tnode]


@dataclass(frozen=True, slots=True, eq=False)
class RoutineLayout:
    """How `render_routine` lays a routine out: its code with the nests threads run (`llc`),
    its top-level statements, whether each nest becomes a function, and where its locals live.
    The scratch planner places exactly the locals this leaves off the stack."""

    llc: ll.LLStmt
    top: list[ll.LLStmt]
    outlined: bool
    placement: LocalPlacement


def routine_layout(llc: ll.LLStmt, syntax: CSyntax = C_SYNTAX) -> RoutineLayout:
    if syntax.num_threads > 1:
        llc = parallel_loops.thread_nests(llc, syntax.num_threads, syntax.thread_min_work,
                                          syntax.thread_routine_min_work)
    top = list(ll.flatten(llc))
    outlined = bool(syntax.outline_min_nests
                    and sum(isinstance(s, ll.ForLoop) for s in top) >= syntax.outline_min_nests)
    if syntax.num_threads > 1 and parallel_loops.shared_regions(top):
        # A loop inside `omp parallel` is compiled into a function of its own that reaches the
        # routine's stack arrays through a pointer to each (`(*p)[i]`), which gcc does not
        # vectorize; an orphaned `omp for` in a nest function stays where it is, on pointers.
        outlined = True
    locals_ = [tn for tn in ll.nodes_of(llc) if tn.is_local()]
    placement = outlined_placement(top, locals_, syntax) if outlined else local_placement(locals_, syntax)
    return RoutineLayout(llc, top, outlined, placement)


def local_placement(local_nodes: Iterable[Tnode], syntax: CSyntax = C_SYNTAX) -> LocalPlacement:
    """Place local arrays: the scheduler's locals first (register blocks and panels are
    private per OpenMP thread, which needs them on the stack), then the others, each by id.
    A local goes on the stack when it is at most `stack_limit_bytes` and the stack total
    stays within `stack_total_bytes` — a thread's stack is a few MiB at best and a routine
    may hold dozens of locals; without scratch (`local_scratch_decl=None`) every local that
    fits one array's limit stays on the stack. A register block always stays on the stack: it
    is at most a few vector registers, and its vector type needs the alignment that the stack
    gives and scratch arrays and `malloc` (16 bytes) do not."""
    order = sorted(set(local_nodes), key=lambda tn: (is_routine_local(tn), tn.id))
    on_stack: set[Tnode] = set()
    total = 0
    for tn in order:
        nbytes = tn.size * tn.prec.itemsize
        fits = syntax.local_scratch_decl is None or total + nbytes <= syntax.stack_total_bytes
        if c_vectors.is_block(tn) or (nbytes <= syntax.stack_limit_bytes and fits):
            on_stack.add(tn)
            total += nbytes
    return LocalPlacement(on_stack)


def outlined_placement(top: Sequence[ll.LLStmt], local_nodes: Iterable[Tnode], syntax: CSyntax = C_SYNTAX
                       ) -> LocalPlacement:
    """`local_placement` for a routine rendered as one function per nest: a local that one
    nest alone touches is declared in that nest's function, on the stack only while the nest
    runs, so it counts against that nest's stack total (what the routine's own locals leave),
    not against every other nest's. Placed by the routine's total, the register blocks and
    panels of the later blocks of a deep model became scratch parameters, and their nests
    compiled as functions of their own instead of calls of the first block's."""
    local_nodes = set(local_nodes)
    users: dict[Tnode, set[int]] = {}
    for k, s in enumerate(top):
        for tn in ll.nodes_of(s):
            if tn in local_nodes:
                users.setdefault(tn, set()).add(k)
    owner = {tn: k for tn, ks in users.items() if len(ks) == 1 for k in ks if isinstance(top[k], ll.ForLoop)}
    shared = local_placement([tn for tn in local_nodes if tn not in owner], syntax)
    left = syntax.stack_total_bytes - sum(tn.size * tn.prec.itemsize for tn in shared.on_stack)
    by_nest: dict[int, list[Tnode]] = {}
    for tn, k in owner.items():
        by_nest.setdefault(k, []).append(tn)
    on_stack = set(shared.on_stack)
    for nodes in by_nest.values():
        on_stack |= local_placement(nodes, dataclasses.replace(syntax, stack_total_bytes=max(left, 0))).on_stack
    return LocalPlacement(on_stack)


def _scratch_decl(tn: Tnode, syn: CSyntax) -> str:
    if syn.local_scratch_decl is None:
        raise RenderError(f"einjit: local tensor {tn.debug_name()} needs {tn.size * tn.prec.itemsize} bytes, "
                          f"over the {syn.stack_limit_bytes}-byte limit for locals of this backend")
    return syn.local_scratch_decl.format(t=storage(tn, syn)[0], name=tn.name, restrict=syn.restrict)


def storage(tn: Tnode, syn: CSyntax) -> tuple[str, int]:
    """The element type of a node's array and its length: a register block holds vectors
    (`c_vectors`)."""
    if c_vectors.is_block(tn):
        return c_vectors.type_name(tn), c_vectors.vectors(tn)
    return syn.type_name(tn.prec), tn.size


def render_program(routines: Sequence[tuple[str, ll.LLStmt]], bindings: Sequence[StaticSymbol] = (),
                   syntax: CSyntax = C_SYNTAX) -> CProgram:
    """Render routines into one translation unit, with only the helpers they use."""
    dup = repeated_names(n for n, _ in routines)
    if dup:
        raise RenderError(f"einjit: routine names must be distinct in one program, repeated: {dup}")
    with naming.stable_names(), ll.deep_recursion():
        rendered = tuple(render_routine(n, llc, bindings, syntax) for n, llc in routines)
    dup = repeated_names(r.name for r in rendered)
    if dup:
        raise RenderError(f"einjit: routine names must be distinct in one program once mangled, repeated: {dup}")
    nests = [f for r in rendered for f in r.nests]
    dup = repeated_names([r.name for r in rendered] + [f.split("(", 1)[0].split()[-1] for f in nests])
    if dup:
        raise RenderError(f"einjit: routine names must be distinct from the nest functions of other routines, "
                          f"repeated: {dup}")
    helpers = sorted(set().union(*(r.helpers for r in rendered)))
    parts = ["/* Generated by einjit: C backend. */\n" + "".join(f"#include <{h}>\n" for h in syntax.includes)
             + "#define EINJIT_CLAMP(x, hi) ((x) < 0 ? 0 : ((x) > (hi) ? (hi) : (x)))\n"]
    if syntax.prelude:
        parts.append(syntax.prelude)
    parts += [HELPERS[h].format(q=syntax.helper_qualifier) for h in helpers]
    units = min(syntax.units, len(nests))
    if units <= 1:
        parts += [_NEST_STATIC + f for f in nests]
        parts += [r.code for r in rendered]
        return CProgram("\n".join(parts), rendered)
    header = list(parts)
    spread: list[list[str]] = [[] for _ in range(units)]
    sizes = [0] * units
    for f in sorted(nests, key=len, reverse=True):
        k = sizes.index(min(sizes))
        spread[k].append(f)
        sizes[k] += len(f)
    prototypes = "".join(_NEST_HIDDEN + f.split("\n", 1)[0][:-2] + ";\n" for f in nests)
    main = "\n".join([*header, prototypes, *(r.code for r in rendered)])
    others = ["\n".join([*header, *(_NEST_HIDDEN + f for f in sorted(unit, key=nests.index))]) for unit in spread]
    return CProgram(UNIT_MARK.join([main, *others]), rendered)


_NEST_STATIC = "static __attribute__((noinline)) "
"""Nest functions in the routine's translation unit: not inlined back into one function."""
_NEST_HIDDEN = '__attribute__((visibility("hidden"))) '
"""Nest functions in other translation units: linked within the shared object only."""
