"""The program cache: a routine compiled before, in this process or an earlier one, is
rebuilt from a record of what einjit's passes decided, without running them.

The compiled-object cache (`cache.py`) skips gcc, but its key is the generated source, so
every compile still lowered, optimized and rendered the program first: for a GPT training
step that is seconds of Python before the cache answers. This cache is keyed by the graph
itself, taken before any pass runs: every assignment (its operation, nodes, projections —
described by what they are derived from, the operation's logic and solved rows, without
deriving them (`Lazy.key`) — fetched constants), every node's dims, precision and memory
mode, whether an earlier routine keeps it, the static bindings, the optimizer settings, the
compiler options and target, and einjit's own source (a change to a pass must not reuse what
the old pass decided). A hit restores what the passes changed — each node's memory mode, the
routine-local marks, the nodes kept in context — and rebuilds the compiled routine from the
recorded source (its shared object then comes from the object cache) and parameters.

Nodes are recorded by their position in the assignments (`graph_nodes`); nodes the passes
create (the scheduler's register blocks and panels) are recorded by label, dims, precision
and mode and made afresh. A program whose code touches a node that is neither is not
recorded. Records are JSON (names of enum members and precisions, node references by
position), never pickles: loading a record found in a cache directory must not run code. A
record that does not decode to what `store` writes is a miss.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from einjit import config
from einjit.backends import cache
from einjit.backends.c_syntax import C_SYNTAX
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend, CcProcedure
from einjit.backends.interface import Compiled
from einjit.backends.params import MemClass, Param, ParamKind
from einjit.backends.scratch_plan import ScratchPlan
from einjit.ir import assignments as asg
from einjit.ir import low_level as ll
from einjit.ir import ops, optimize
from einjit.ir.indexing import Projections, StaticSymbol, Symbol
from einjit.ir.passes import local_storage
from einjit.ir.sched import machine, search
from einjit.ir.tnode import MemoryMode, MemoryType, Mode, Tnode

__all__ = ["Hit", "key", "load", "stats", "store"]

_VERSION = "einjit-program-1"


@dataclass
class Stats:
    hits: int = 0
    stores: int = 0


stats = Stats()
"""How often the program cache answered, and how many programs it recorded (tests)."""


@dataclass(frozen=True)
class Hit:
    """A routine rebuilt from the cache: its compiled code and the hosted nodes it writes."""

    compiled: Compiled
    written_hosted: tuple[Tnode, ...]


@functools.cache
def _einjit_fingerprint() -> str:
    root = Path(__file__).resolve().parents[2]  # the einjit package
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


_FIELDS: dict[type, tuple[str, ...]] = {}
_PLAIN = frozenset({int, float, str, bool, type(None)})


def _field_names(kind: type) -> tuple[str, ...]:
    """The fields a canonical text or a node search walks: a dataclass's (symbols are leaves)."""
    names = _FIELDS.get(kind)
    if names is None:
        dataclass_ = dataclasses.is_dataclass(kind) and kind not in (Symbol, StaticSymbol)
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(kind)) if dataclass_ else ()
    return names


_last_graph: list = [None, []]
"""The assignments `graph_nodes` last answered for, and its answer: the key, the lookup and
the record of one compile ask for the same assignments' nodes."""


def graph_nodes(asgns: asg.Asgns) -> list[Tnode]:
    """The program's nodes in a deterministic order: every node an assignment writes or reads
    (`guessed_nodes`), then those only its run-time indices name (the ids of a gather, inside
    projections that have no key and are computed for the key anyway)."""
    if _last_graph[0] is not asgns:
        _describe(asgns)
    return list(_last_graph[1])


class _Walk:
    """One walk over a program's assignments: the canonical text of every one (nodes and
    symbols named as the program names them, so it is the same in every process for the same
    model), and the nodes met inside projections that have no key. A deep model's key reads
    tens of thousands of fields, so node names and the reprs of enum members are asked once."""

    def __init__(self) -> None:
        self.names: dict[Tnode, str] = {}
        self.reprs: dict[int, str] = {}
        self.inside: dict[Tnode, None] = {}
        self.nodes: dict[Tnode, None] = {}

    def text(self, x: Any) -> str:
        kind = type(x)
        if kind is Tnode:
            name = self.names.get(x)
            if name is None:
                name = self.names[x] = x.name
            return name
        if kind in _PLAIN:
            return repr(x)
        if kind is tuple or kind is list:
            return "(" + ", ".join([self.text(v) for v in x]) + ")"
        if kind is asg.Lazy:
            return self.lazy(x)
        if kind is np.ndarray:
            return f"array {x.dtype} {x.shape} {hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()}"
        fields = _FIELDS.get(kind)
        if fields is None:
            fields = _field_names(kind)
        if fields:
            texts = []
            for n in fields:
                v = getattr(x, n)
                k = type(v)
                if k is bool:
                    texts.append("True" if v else "False")
                elif k is Tnode or k is asg.Node:
                    tn = v if k is Tnode else v.tn
                    name = self.names.get(tn)
                    if name is None:
                        name = self.names[tn] = tn.name
                    texts.append(name if k is Tnode else f"Node({name})")
                else:
                    text = self.reprs.get(id(v)) if isinstance(v, Enum) else None
                    texts.append(text if text is not None else self.text(v))
            return f"{kind.__name__}(" + ", ".join(texts) + ")"
        if isinstance(x, Enum):
            text = self.reprs.get(id(x))
            if text is None:
                text = self.reprs[id(x)] = repr(x)
            return text
        return repr(x)

    def _search(self, x: Any) -> None:
        """Collect the nodes inside `x` (a forced value without a key)."""
        kind = type(x)
        if kind is Tnode:
            self.inside.setdefault(x, None)
        elif kind is tuple or kind is list:
            for v in x:
                self._search(v)
        elif kind is asg.Lazy:
            self._search(x.force())
        else:
            for n in _field_names(kind):
                self._search(getattr(x, n))

    def program(self, asgns: asg.Asgns) -> list[str]:
        """The text of every assignment in order, block comments as brackets around theirs
        (their messages become comments of the generated C); `nodes` collects every node an
        assignment writes or reads, in order of first appearance (`asg.guessed_nodes`).
        The assignment kinds of every model are described by `_ASSIGNMENT_TEXTS`, each text
        the same as `text` gives (tested): tens of thousands of fields are read without
        asking each value's kind."""
        out: list[str] = []
        nodes = self.nodes
        stack: list[Any] = [asgns]
        while stack:
            a = stack.pop()
            kind = type(a)
            if kind is asg.Seq:
                stack += [a.second, a.first]
                continue
            fast = _ASSIGNMENT_TEXTS.get(kind)
            if fast is not None:
                out.append(fast(self, a))
                continue
            match a:
                case asg.Noop():
                    pass
                case asg.BlockComment(message, body):
                    out.append(f"# {message!r} [")
                    stack += ["]", body]
                case str():
                    out.append(a)
                case _:
                    out.append(self.text(a))
                    for lhs in asg.lhs_nodes(a):
                        nodes.setdefault(lhs, None)
                    for b in asg.rhs_buffers(a):
                        nodes.setdefault(b.tn, None)
        return out

    def node(self, tn: Tnode) -> str:
        """The node's name, the node recorded as one the program writes or reads."""
        self.nodes.setdefault(tn, None)
        name = self.names.get(tn)
        if name is None:
            name = self.names[tn] = tn.name
        return name

    def buffer(self, b: asg.Buffer) -> str:
        if type(b) is asg.Node:
            return f"Node({self.node(b.tn)})"
        self.nodes.setdefault(b.tn, None)
        return self.text(b)

    def enum(self, e: Enum) -> str:
        text = self.reprs.get(id(e))
        if text is None:
            text = self.reprs[id(e)] = repr(e)
        return text

    def lazy(self, x: asg.Lazy) -> str:
        described = x.key()
        if described is not None:
            # Keys hold numbers, strings and frozen dataclasses of those (symbols print by
            # their stable names): their repr is canonical.
            return f"derived from {described!r}"
        value = x.force()
        self._search(value)
        # Projections hold symbols, dims and indices only: their repr is already canonical.
        return repr(value) if isinstance(value, Projections) else self.text(value)


def _binop_text(w: _Walk, a: asg.AccumBinop) -> str:
    lhs = w.node(a.lhs)
    return (f"AccumBinop({a.initialize_neutral}, {w.enum(a.accum)}, {w.enum(a.op)}, {lhs}, {w.buffer(a.rhs1)}, "
            f"{w.buffer(a.rhs2)}, {w.lazy(a.projections)})")


def _unop_text(w: _Walk, a: asg.AccumUnop) -> str:
    lhs = w.node(a.lhs)
    return (f"AccumUnop({a.initialize_neutral}, {w.enum(a.accum)}, {w.enum(a.op)}, {lhs}, {w.buffer(a.rhs)}, "
            f"{w.lazy(a.projections)})")


def _ternop_text(w: _Walk, a: asg.AccumTernop) -> str:
    lhs = w.node(a.lhs)
    return (f"AccumTernop({a.initialize_neutral}, {w.enum(a.accum)}, {w.enum(a.op)}, {lhs}, {w.buffer(a.rhs1)}, "
            f"{w.buffer(a.rhs2)}, {w.buffer(a.rhs3)}, {w.lazy(a.projections)})")


def _fetch_text(w: _Walk, a: asg.Fetch) -> str:
    array = w.node(a.array)
    if type(a.fetch_op) is asg.Slice:
        w.nodes.setdefault(a.fetch_op.sliced, None)
    return f"Fetch({array}, {w.text(a.fetch_op)})"


_ASSIGNMENT_TEXTS: dict[type, Callable[[_Walk, Any], str]] = {
    asg.AccumBinop: _binop_text, asg.AccumUnop: _unop_text, asg.AccumTernop: _ternop_text, asg.Fetch: _fetch_text}
"""`text` of the assignment kinds every model is made of, field by field in declaration order,
recording their nodes in the order `asg.lhs_of` and `asg.rhs_buffers` give them."""


def _describe(asgns: asg.Asgns) -> tuple[list[str], dict[Tnode, str]]:
    """The assignments' texts and the names of their nodes; sets `graph_nodes`'s answer."""
    walk = _Walk()
    texts = walk.program(asgns)
    nodes = walk.nodes
    nodes.update((tn, None) for tn in walk.inside if tn not in nodes)
    _last_graph[:] = [asgns, list(nodes)]
    return texts, walk.names


def key(asgns: asg.Asgns, bindings: Sequence[StaticSymbol], name: str, settings: Any, backend: Any
        ) -> str | None:
    """The program's key, or None when it is not cached: on a backend other than the plain C
    one, and when the passes' output was asked for (`EINJIT_DUMP_DIR`, `EINJIT_DEBUG` 2 and
    up), which only running them gives. Call inside `naming.stable_names()` after shape
    inference, before lowering: names, symbols and projections then print the same in every
    process."""
    if type(backend) is not CcBackend or config.dumping() or config.debug_level() >= 2:
        return None
    options = backend.simple.options  # type: ignore[attr-defined]  # CcBackend's simple backend is CcSimpleBackend
    if options.syntax is not C_SYNTAX:
        return None
    settings = settings or optimize.virtualize_settings
    texts, names = _describe(asgns)
    parts = [_VERSION, _einjit_fingerprint(), name, repr(settings), _scheduler_identity(settings),
             cc.target_identity(options),
             repr((options.vector_math, options.keep_source, options.outline_min_nests, options.jobs)),
             repr([(b, b.static_range) for b in bindings]), *texts]
    parts += [f"{names.get(tn) or tn.name} {tn.dims} {tn.prec.name} {tn.memory_mode} {tn.provenance} "
              f"{local_storage.kept_in_context(tn)} {local_storage.local_to(tn)}" for tn in _last_graph[1]]
    return cache.cache_key(*parts)


def _scheduler_identity(settings: Any) -> str:
    """What decides the passes' output besides the program, its settings and einjit's source:
    the machine description the scheduler prices code for (`EINJIT_MACHINE`, else the kind of
    the CPU at hand; the C compiler's `-march=native` does not tell "avx2" from "avx512" on
    one host), the optimizer's stages in order with the ones `settings` runs (a caller may
    leave one out or replace one), and whether tiles are measured (`EINJIT_SEARCH`)."""
    stages = [(s.name, s.enabled(settings), s.portable, _code_identity(s.run)) for s in optimize.STAGES]
    measured = search.enabled() and os.environ.get("EINJIT_SEARCH_CANDIDATES", "6").strip()
    return repr((machine.host_machine(), stages, measured))


def _code_identity(f: Any) -> str:
    """A function by where it is defined (the same in every process and checkout): two lambdas
    of one module differ by their lines."""
    code = getattr(f, "__code__", None)
    if code is None:
        return f"{type(f).__module__}.{type(f).__qualname__}"
    return f"{f.__module__}.{f.__qualname__}:{code.co_firstlineno}"


def _path(program_key: str) -> Path:
    directory = config.cache_dir() / "program"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{program_key}.json"


def store(program_key: str, asgns: asg.Asgns, bindings: Sequence[StaticSymbol], lowered: Any, compiled: Compiled,
          newest_id: int) -> None:
    """Record what the passes decided for the program (`newest_id`: the largest node id before
    lowering; newer nodes are the passes' own)."""
    graph = graph_nodes(asgns)
    index = {tn: ("g", k) for k, tn in enumerate(graph)}
    fresh: list[Tnode] = []
    proc: CcProcedure = compiled.procedure
    llc = ll_of(lowered)
    touched = set(ll.nodes_of(llc)) | set(proc.mem_classes) | {p.tn for p in proc.procedure.params if p.tn}
    for tn in sorted(touched, key=lambda t: t.id):
        if tn in index:
            continue
        if tn.id <= newest_id:
            config.debug(1, f"program cache: {proc.name} touches {tn.debug_name()}, outside its assignments; "
                            f"not recorded")
            return
        index[tn] = ("x", len(fresh))
        fresh.append(tn)

    def ref(tn: Tnode | None) -> tuple[str, int] | None:
        return None if tn is None else index[tn]

    def mode(m: Mode | None) -> tuple[str, str | None] | None:
        return None if m is None else (m.mode.name, None if m.memory_type is None else m.memory_type.name)

    bindings = list(bindings)
    written = sorted({s.tn for s in ll.iter_stmts(llc) if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut))
                      and s.tn.is_hosted()}, key=lambda t: t.id)
    record = {
        "version": _VERSION,
        "nodes": len(graph),
        "modes": [(mode(tn.memory_mode), tn.provenance) for tn in graph],
        "fresh": [(tn.label, tn.dims, tn.prec.name, mode(tn.memory_mode), tn.provenance) for tn in fresh],
        # over the graph too: a node a CPU stage removed is routine-local without being touched
        "local_to": [(ref(tn), local_storage.local_to(tn)) for tn in index if local_storage.local_to(tn)],
        "kept": [ref(tn) for tn in touched if local_storage.kept_in_context(tn)],
        "params": [(p.kind.name, p.c_name, ref(p.tn), None if p.mem is None else p.mem.name,
                    None if p.static is None else bindings.index(p.static)) for p in proc.procedure.params],
        "mem_classes": [(ref(tn), mem.name) for tn, mem in proc.mem_classes.items()],
        "inputs": [ref(tn) for tn in compiled.inputs],
        "written": [ref(tn) for tn in written],
        "plan": None if proc.plan is None else (proc.plan.offsets, proc.plan.nbytes, proc.plan.size),
        "c_name": proc.procedure.name,
        "source": proc.procedure.source,
    }
    cache.store_record("program", program_key, _path(program_key), json.dumps(record).encode())
    stats.stores += 1


def ll_of(lowered: Any) -> ll.LLStmt:
    return getattr(lowered, "llc", lowered)


class _BadRecord(Exception):
    """A record that is not what `store` writes (corrupt, of another version, or forged)."""


def _want(ok: bool) -> None:
    if not ok:
        raise _BadRecord


def _count(x: Any, below: int | None = None) -> int:
    _want(type(x) is int and x >= 0 and (below is None or x < below))
    return x


def _text(x: Any) -> str:
    _want(type(x) is str)
    return x


def _mode(x: Any) -> Mode | None:
    if x is None:
        return None
    mode, memory_type = x
    return Mode(MemoryMode[_text(mode)], None if memory_type is None else MemoryType[_text(memory_type)])


@dataclass(frozen=True)
class _Record:
    """A record decoded and checked against the program, before anything is changed."""

    modes: list[tuple[Mode | None, int]]
    local_to: list[tuple[Tnode, str]]
    kept: list[Tnode]
    params: tuple[Param, ...]
    mem_classes: dict[Tnode, MemClass]
    inputs: frozenset[Tnode]
    written: tuple[Tnode, ...]
    c_name: str
    source: str
    plan: ScratchPlan | None


def _plan(x: Any, params: Sequence[Param]) -> ScratchPlan | None:
    """The scratch plan, checked to place exactly the routine's scratch parameters inside its
    arena: a forged plan must not make two live arrays overlap or a view run past the arena."""
    if x is None:
        return None
    offsets, nbytes, size = x
    plan = ScratchPlan(tuple(_count(o) for o in offsets), tuple(_count(n) for n in nbytes), _count(size))
    scratch = [p.tn for p in params if p.kind is ParamKind.SCRATCH and p.tn is not None]
    _want(plan.nbytes == tuple(int(tn.size) * int(tn.prec.itemsize) for tn in scratch)
          and len(plan.offsets) == len(plan.nbytes)
          and all(o + n <= plan.size for o, n in zip(plan.offsets, plan.nbytes, strict=True)))
    return plan


def _decode(record: Any, graph: list[Tnode], bindings: Sequence[StaticSymbol]) -> _Record:
    """Raises `_BadRecord`, `KeyError`, `TypeError` or `ValueError` for a record that is not
    one `store` wrote for this program."""
    _want(isinstance(record, dict) and record.get("version") == _VERSION and record.get("nodes") == len(graph))
    fresh = [Tnode([_text(part) for part in label], tuple(_count(d) for d in dims), ops.PRECISIONS[_text(prec)],
                   memory_mode=_mode(mode), provenance=_count(provenance))
             for label, dims, prec, mode, provenance in record["fresh"]]

    def node(r: Any) -> Tnode:
        where, k = r
        _want(where in ("g", "x"))
        nodes = graph if where == "g" else fresh
        return nodes[_count(k, len(nodes))]

    modes = [(_mode(mode), _count(provenance)) for mode, provenance in record["modes"]]
    _want(len(modes) == len(graph))
    params = tuple(Param(ParamKind[_text(kind)], _text(c_name), None if r is None else node(r),
                         None if mem is None else MemClass[_text(mem)],
                         None if static is None else bindings[_count(static, len(bindings))])
                   for kind, c_name, r, mem, static in record["params"])
    c_name = _text(record["c_name"])
    _want(c_name.isidentifier())
    return _Record(modes, [(node(r), _text(routine)) for r, routine in record["local_to"]],
                   [node(r) for r in record["kept"]], params,
                   {node(r): MemClass[_text(mem)] for r, mem in record["mem_classes"]},
                   frozenset(node(r) for r in record["inputs"]), tuple(node(r) for r in record["written"]),
                   c_name, _text(record["source"]), _plan(record["plan"], params))


def load(program_key: str, asgns: asg.Asgns, bindings: Sequence[StaticSymbol], name: str, backend: Any
         ) -> Hit | None:
    """The routine rebuilt from its record, with the passes' decisions restored; None when
    there is no usable record."""
    path = _path(program_key)
    graph = graph_nodes(asgns)
    if len(graph) != len(set(graph)):
        return None
    try:
        record = _decode(json.loads(cache.load_record("program", program_key, path)), graph, bindings)
    except FileNotFoundError:
        return None
    except (OSError, _BadRecord, KeyError, TypeError, ValueError, IndexError) as e:
        config.debug(1, f"program cache: {name}: record {path} is unusable ({type(e).__name__}); recompiling")
        return None
    built = cc.compile_source(record.source, label=name, options=backend.simple.options)
    try:
        fn = cc.load_library(built)[record.c_name]
    except AttributeError:
        config.debug(1, f"program cache: {name}: record {path} names no compiled function; recompiling")
        return None
    fn.restype = None
    for tn, (mode, provenance) in zip(graph, record.modes, strict=True):
        tn.memory_mode, tn.provenance = mode, provenance
    for tn, routine in record.local_to:
        local_storage.mark_local(tn, routine)
    for tn in record.kept:
        local_storage.mark_kept(tn)
    procedure = cc.Procedure(record.c_name, record.source, record.params, tuple(bindings), built.path, fn,
                             built.source_path)
    cc_proc = CcProcedure(procedure.name, procedure, record.mem_classes, plan=record.plan)
    stats.hits += 1
    config.debug(1, f"program cache: {name}: hit {path}")
    return Hit(Compiled(backend.name, cc_proc, tuple(bindings), name, record.inputs), record.written)
