"""Compile the ATL block normal form to einjit assignments, and on through einjit's own
lowering, optimizer and C backend: ATL without Halide.

Translation scheme. Every statement ``x[i0..ik] = body`` gets a float64 tensor node over
its generators; arguments get hosted nodes (a relation becomes a 0/1 node). The body is
taken apart into accumulating assignments with hand-made ``Projections``, whose product
space is the statement's generators plus the ``Sum`` indices in scope:

- ``Sum`` only widens the product space (a reduction loop), so ``Σ_j A[i,j]*x[j]`` is
  the single assignment ``y =:+ A * x`` that einjit's own matmul would be;
- at the top of a body, ``Add`` splits into separate accumulations into the same node,
  one per reduction term and one for all the other terms together (``c[i] + Σ_j ...``
  is ``y =:+ c; y =+ A * x``): reductions cannot share a loop nest, pointwise terms can;
- what is left is one operation: ``Add``/``Mul`` (``AccumBinop``), ``Indicate``
  (``AccumTernop(WHERE, mask, body, 0)``) or a lone read (``AccumUnop(IDENTITY)``);
- an operand that is itself a compound expression gets an intermediate node over just
  the index variables it uses, filled the same way; the optimizer makes such nodes
  virtual (inlined per scalar) or, where a cell is read many times, keeps them as a
  hoisted temporary;
- constants are scalar nodes filled by ``FetchConstant``; index predicates compare
  index values taken from one ``iota`` node per extent (``RangeOverOffsets``), combined
  with ``CMPLT``/``CMPEQ``/``CMPNE``, ``AND``, ``OR`` and ``NOT``; ``Rel`` reads the
  relation's 0/1 node. After lowering, each read ``iota[ix]`` is replaced by
  ``EmbedIndex(ix)`` (``embed_iotas``): a mask is then a function of indices only, which
  the optimizer inlines wherever it is read, instead of a stored array.

Out-of-range reads. An access may leave its tensor only where an enclosing predicate is
false, and memory must then not be touched. Lowering guards every affine read that may
leave its array with ``where(in_bounds, read, 0)`` (and the C renderer clamps reads under a
``where``), so an operand computed over its whole index space stays safe; the value it
computes out of range is discarded by the ``WHERE`` of the indicator. Two index shapes
lowering cannot guard are handled here: a constant index outside the tensor (the read is
then the constant 0: it can only be evaluated under a false predicate) and a plain
variable whose range exceeds the extent (the read is wrapped in an explicit range
indicator).

Loop order. Any order of a projection's loops computes the same values, so the innermost
loop is chosen to make the most reads and the write unit-stride (``ikj`` for a matmul,
which gcc vectorizes).

``compile_normal_form`` compiles once; the returned ``EinjitFunc`` copies arguments into
the input nodes' host arrays, runs the linked routine, and copies the result out.
``EINJIT_DEBUG=2`` prints the assignments (and, through the optimizer, the optimized code).
"""

from __future__ import annotations

import ctypes
import math
import re
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from einjit import backends, config
from einjit.backends.interface import default_context, load_inputs
from einjit.backends.params import ParamKind
from einjit.errors import EinjitError
from einjit.ir import assignments as asg
from einjit.ir import low_level as ll
from einjit.ir import ops, provenance
from einjit.ir.indexing import AxisIndex, Iterator, Projections, Symbol, get_symbol, make_affine
from einjit.ir.naming import stable_names
from einjit.ir.optimize import VirtualizeSettings, optimize_proc
from einjit.ir.tnode import Tnode, hosted

from .index import interval, to_affine
from .ir import (
    Access,
    Add,
    And,
    Const,
    Eq,
    Expr,
    IConst,
    Index,
    Indicate,
    Le,
    Lt,
    Mul,
    Ne,
    Not,
    Or,
    Pred,
    R,
    Rel,
    Sum,
    Sym,
    TNum,
    Type,
    Var,
    as_sym,
    tensor_shape,
)
from .normalize import NormalForm, Stmt
from .typecheck import is_relation_type

__all__ = [
    "UnsupportedError", "Translation", "to_assignments", "embed_iotas", "EinjitFunc",
    "compile_normal_form",
]

Affine = tuple[dict[Sym, int], int]
Space = dict[Sym, int]


class UnsupportedError(EinjitError, NotImplementedError):
    """A normal form the einjit backend cannot compile; the message names the construct."""


@dataclass(frozen=True, slots=True)
class Operand:
    """A read ``tn[idcs]`` with each index affine in ATL index variables."""

    tn: Tnode
    idcs: tuple[Affine, ...]

    def vars(self) -> set[Sym]:
        return {v for terms, _ in self.idcs for v in terms}


@dataclass(frozen=True, slots=True)
class _Target:
    """An assignment's left-hand side: ``tn`` indexed by ``lhs_vars``."""

    tn: Tnode
    lhs_vars: tuple[Sym, ...]


@dataclass(frozen=True, slots=True)
class Translation:
    """The assignments of one normal form with their interface nodes: ``inputs`` in
    argument order, ``output`` the result; ``iotas`` the index-value nodes."""

    asgns: asg.Asgns
    inputs: tuple[Tnode, ...]
    output: Tnode
    iotas: frozenset[Tnode]

    def to_low_level(self) -> ll.LLStmt:
        """The lowered code, with index values embedded (see ``embed_iotas``)."""
        return embed_iotas(asg.to_low_level(self.asgns), self.iotas)


def _node(label: str, dims: tuple[int, ...]) -> Tnode:
    return Tnode(["atl", label], dims, ops.double)


def _symbol(v: Sym) -> Symbol:
    """Loop symbols are printed ``name`` + id: the trailing ``_`` keeps an ATL name that
    ends in digits (``i1``) from colliding with another (``i`` with id 1...)."""
    return get_symbol(re.sub(r"\W", "_", str(v.name)) + "_")


def _free_vars(e: Expr) -> set[Sym]:
    """Index variables ``e`` reads that no ``Sum`` inside it binds."""
    match e:
        case Var() | Const():
            return set()
        case Add(lhs, rhs) | Mul(lhs, rhs):
            return _free_vars(lhs) | _free_vars(rhs)
        case Sum(i, _, body):
            return _free_vars(body) - {i}
        case Indicate(pred, body):
            return _pred_vars(pred) | _free_vars(body)
        case Access():
            out: set[Sym] = set()
            while isinstance(e, Access):
                out |= set(_affine(e.idx)[0])
                e = e.base
            return out
    raise UnsupportedError(f"einjit ATL backend: {type(e).__name__} is not a normal-form "
                           f"statement body construct: {e}")


def _affine(ix: Index) -> tuple[dict[Sym, int], int]:
    """``to_affine`` in the typed form, where every index variable is a ``Sym``."""
    terms, const = to_affine(ix)
    return {as_sym(v): c for v, c in terms.items()}, const


def _box(ix: Index, space: Space) -> tuple[int, int]:
    """The least and greatest value of ``ix`` over the index variables in scope."""
    box = interval(ix, space)
    if box is None:
        raise UnsupportedError(f"einjit ATL backend: index {ix} uses a variable that no "
                               "enclosing generator or sum binds")
    return box


def _terms(e: Expr) -> list[Expr]:
    """The terms of a tree of ``Add``s, left to right."""
    if isinstance(e, Add):
        return _terms(e.lhs) + _terms(e.rhs)
    return [e]


def _pred_vars(p: Pred) -> set[Sym]:
    match p:
        case Eq(l, r) | Ne(l, r) | Lt(l, r) | Le(l, r):
            return set(_affine(l)[0]) | set(_affine(r)[0])
        case Rel(_, args):
            return set().union(*(set(_affine(a)[0]) for a in args))
        case And(l, r) | Or(l, r):
            return _pred_vars(l) | _pred_vars(r)
        case Not(arg):
            return _pred_vars(arg)
    raise UnsupportedError(f"einjit ATL backend: predicate {type(p).__name__} is not supported: {p}")


def _loop_order(target: _Target, reduced: tuple[Sym, ...], operands: list[Operand]) -> list[Sym]:
    """The product space's variables, outermost first: the written ones, then the summed
    ones, except that the innermost loop is the variable that the most accesses (the
    write included) index with unit stride, less those it strides through."""
    order = list(target.lhs_vars) + [v for v in reduced if v not in target.lhs_vars]
    accesses = [tuple(({v: 1}, 0) for v in target.lhs_vars)] + [o.idcs for o in operands]

    def score(v: Sym) -> int:
        s = 0
        for idcs in accesses:
            if idcs and idcs[-1][0] == {v: 1}:
                s += 1
            elif any(v in terms for terms, _ in idcs):
                s -= 1
        return s

    if order:
        best = max(reversed(order), key=score)
        order.remove(best)
        order.append(best)
    return order


class _Translator:
    """Builds the assignments of one normal form (see the module docstring)."""

    def __init__(self, nf: NormalForm) -> None:
        self.nodes: dict[Sym, Tnode] = {}
        self.shapes: dict[Sym, tuple[int, ...]] = {}
        self.prelude: list[asg.Asgns] = []
        self.body: list[asg.Asgns] = []
        self.consts: dict[tuple[float, float], Tnode] = {}
        self.iotas: dict[int, Tnode] = {}
        self.initialized: set[Tnode] = set()
        inputs = [self._input(sym, typ) for sym, typ in nf.args]
        for s in nf.stmts:
            self._stmt(s)
        output = self._stmt(nf.ret)
        output.update_memory_mode(hosted(), provenance.UNSET)
        self.translation = Translation(asg.sequence(*self.prelude, *self.body), tuple(inputs),
                                       output, frozenset(self.iotas.values()))

    # ------------------------------------------------------------------ nodes
    def _input(self, sym: Sym, typ: Type) -> Tnode:
        dims, elem = tensor_shape(typ)
        if not isinstance(elem, TNum) and not is_relation_type(typ):
            raise UnsupportedError(f"einjit ATL backend: argument '{sym}' of type {typ} is "
                                   "not a real, a real tensor or a relation")
        tn = _node(str(sym.name), dims)
        tn.update_memory_mode(hosted(), provenance.UNSET)
        self.nodes[sym], self.shapes[sym] = tn, dims
        return tn

    def _const(self, val: float) -> Operand:
        key = (val, math.copysign(1.0, val))  # -0.0 is not 0.0
        tn = self.consts.get(key)
        if tn is None:
            tn = self.consts[key] = _node(f"c{len(self.consts)}", ())
            self.prelude.append(asg.Fetch(tn, asg.FetchConstant(val)))
        return Operand(tn, ())

    def _iota(self, v: Sym, n: int) -> Operand:
        """``iota_n[v]``: the value of index ``v`` as a number."""
        tn = self.iotas.get(n)
        if tn is None:
            tn = self.iotas[n] = _node(f"iota{n}", (n,))
            self.prelude.append(asg.Fetch(tn, asg.RangeOverOffsets()))
        return Operand(tn, (({v: 1}, 0),))

    def _stmt(self, s: Stmt) -> Tnode:
        tn = _node(str(s.name.name), s.shape)
        space = dict(s.gens)
        self._into(_Target(tn, tuple(space)), s.body, space, ())
        self.nodes[s.name], self.shapes[s.name] = tn, s.shape
        return tn

    # ------------------------------------------------------------ assignments
    def _emit(self, target: _Target, space: Space, reduced: tuple[Sym, ...], op: Any,
              operands: list[Operand]) -> None:
        """``target (=:+ | =+) op(operands)`` over the target's variables and ``reduced``."""
        order = _loop_order(target, reduced, operands)
        syms = {v: _symbol(v) for v in order}

        def index(a: Affine) -> AxisIndex:
            terms, const = a
            return make_affine([(c, syms[v]) for v, c in terms.items()], const)

        proj = Projections(
            product_space=tuple(space[v] for v in order),
            product_iterators=tuple(syms[v] for v in order),
            lhs_dims=target.tn.dims,
            rhs_dims=tuple(o.tn.dims for o in operands),
            project_lhs=tuple(Iterator(syms[v]) for v in target.lhs_vars),
            project_rhs=tuple(tuple(index(a) for a in o.idcs) for o in operands),
            debug_info=f"ATL {target.tn.debug_name()}")
        init = target.tn not in self.initialized
        self.initialized.add(target.tn)
        lazy, accum, bufs = asg.Lazy.of(proj), ops.Binop.ADD, [asg.Node(o.tn) for o in operands]
        match op:
            case ops.Unop():
                self.body.append(asg.AccumUnop(init, accum, op, target.tn, bufs[0], lazy))
            case ops.Binop():
                self.body.append(asg.AccumBinop(init, accum, op, target.tn, bufs[0], bufs[1], lazy))
            case ops.Ternop():
                self.body.append(asg.AccumTernop(init, accum, op, target.tn, bufs[0], bufs[1], bufs[2], lazy))

    def _into(self, target: _Target, e: Expr, space: Space, reduced: tuple[Sym, ...]) -> None:
        """Accumulate ``e`` into ``target``. Reductions widen the product space; in a sum
        of terms each reduction is its own accumulation, while the other terms are added
        in one pointwise accumulation (one loop nest once intermediates are inlined)."""
        match e:
            case Add():
                terms = _terms(e)
                pointwise = [t for t in terms if not isinstance(t, Sum)]
                if pointwise:
                    total = pointwise[0]
                    for t in pointwise[1:]:
                        total = Add(total, t, R)
                    self._pointwise(target, total, space, reduced)
                for term in terms:
                    if isinstance(term, Sum):
                        self._into(target, term, space, reduced)
            case Sum(i, rng, body):
                self._into(target, body, {**space, as_sym(i): rng}, reduced + (as_sym(i),))
            case _:
                self._pointwise(target, e, space, reduced)

    def _pointwise(self, target: _Target, e: Expr, space: Space,
                   reduced: tuple[Sym, ...]) -> None:
        """Accumulate ``e`` into ``target`` with one assignment: its outermost operation
        over operands."""
        match e:
            case Add(lhs, rhs) | Mul(lhs, rhs):
                op = ops.Binop.ADD if isinstance(e, Add) else ops.Binop.MUL
                self._emit(target, space, reduced, op,
                           [self._operand(lhs, space), self._operand(rhs, space)])
            case Indicate(pred, body):
                self._emit(target, space, reduced, ops.Ternop.WHERE,
                           [self._mask(pred, space), self._operand(body, space, raw=True),
                            self._const(0.0)])
            case _:
                self._emit(target, space, reduced, ops.Unop.IDENTITY, [self._operand(e, space)])

    def _fresh(self, label: str, vars_: set[Sym], space: Space) -> _Target:
        """A new intermediate node over ``vars_``, in the order of ``space``."""
        ordered = tuple(v for v in space if v in vars_)
        return _Target(_node(label, tuple(space[v] for v in ordered)), ordered)

    # ---------------------------------------------------------------- operands
    def _operand(self, e: Expr, space: Space, raw: bool = False) -> Operand:
        """``e`` as one read: of an argument, statement or constant node, or of a new
        intermediate node computing ``e``. ``raw``: the read sits directly under an
        indicator's ``WHERE``, which already makes an out-of-range plain index safe."""
        match e:
            case Var(name):
                if self.shapes.get(as_sym(name)) != ():
                    raise UnsupportedError(f"einjit ATL backend: variable '{e}' is not a "
                                           "scalar argument or scalar statement")
                return Operand(self.nodes[as_sym(name)], ())
            case Const(val):
                return self._const(val)
            case Access():
                return self._access(e, space, raw)
        target = self._fresh("t", _free_vars(e), space)
        self._into(target, e, space, ())
        return Operand(target.tn, tuple(({v: 1}, 0) for v in target.lhs_vars))

    def _access(self, e: Access, space: Space, raw: bool) -> Operand:
        idx: list[Index] = []
        root: Expr = e
        while isinstance(root, Access):
            idx.insert(0, root.idx)
            root = root.base
        if not isinstance(root, Var) or root.name not in self.nodes:
            raise UnsupportedError(f"einjit ATL backend: an access must index a tensor "
                                   f"argument or statement, got {e}")
        shape = self.shapes[root.name]
        if len(idx) != len(shape):
            raise UnsupportedError(f"einjit ATL backend: access {e} indexes {len(idx)} of the "
                                   f"{len(shape)} dimensions of '{root}'")
        guards: list[Pred] = []
        for ix, n in zip(idx, shape, strict=True):
            lo, hi = _box(ix, space)
            if hi < 0 or lo >= n:
                return self._const(0.0)  # only ever evaluated under a false predicate
            terms, const = _affine(ix)
            plain = const == 0 and len(terms) == 1 and next(iter(terms.values())) == 1
            if plain and hi >= n and not raw:
                guards.append(Lt(ix, IConst(n)))
        if guards:
            pred = guards[0]
            for g in guards[1:]:
                pred = And(pred, g)
            return self._operand(Indicate(pred, e, e.typ), space)
        return Operand(self.nodes[as_sym(root.name)], tuple(_affine(ix) for ix in idx))

    # ------------------------------------------------------------------ masks
    def _mask(self, p: Pred, space: Space) -> Operand:
        """A 0/1 operand that is 1 exactly where ``p`` holds."""
        match p:
            case Rel(rel, args):
                if rel not in self.nodes:
                    raise UnsupportedError(f"einjit ATL backend: unknown relation '{rel}'")
                if len(args) != len(self.shapes[rel]):
                    raise UnsupportedError(f"einjit ATL backend: {p} indexes {len(args)} of "
                                           f"the {len(self.shapes[rel])} dimensions of '{rel}'")
                inside: list[Pred] = []
                for ix, n in zip(args, self.shapes[rel], strict=True):
                    lo, hi = _box(ix, space)
                    if hi < 0 or lo >= n:
                        return self._const(0.0)  # outside the extents: not a member
                    if lo < 0:
                        inside.append(Le(IConst(0), ix))
                    if hi >= n:
                        inside.append(Lt(ix, IConst(n)))
                member = Operand(self.nodes[rel], tuple(_affine(ix) for ix in args))
                if not inside:
                    return member
                # Partly outside (an index a rewrite made range past the extent, `M[i+0]`
                # over a longer `i`): no members there, and the read happens only under the
                # `WHERE` of the extent test, which keeps it in bounds.
                test = inside[0]
                for more in inside[1:]:
                    test = And(test, more)
                return self._combine("m", ops.Ternop.WHERE, [self._mask(test, space), member, self._const(0.0)],
                                     space)
            case Eq(l, r) | Ne(l, r) | Lt(l, r) | Le(l, r):
                return self._compare(p, l, r, space)
            case And(l, r) | Or(l, r):
                op = ops.Binop.AND if isinstance(p, And) else ops.Binop.OR
                return self._combine("m", op, [self._mask(l, space), self._mask(r, space)], space)
            case Not(arg):
                return self._combine("m", ops.Unop.NOT, [self._mask(arg, space)], space)
        raise UnsupportedError(f"einjit ATL backend: predicate {type(p).__name__} is not "
                               f"supported: {p}")

    def _compare(self, p: Pred, a: Index, b: Index, space: Space) -> Operand:
        """``a ⋈ b`` as ``P ⋈' N`` with ``P`` and ``N`` sums of nonnegative multiples of
        index values (``a - b = P - N``), ``Le`` as ``<`` on integers."""
        lt, lc = _affine(a)
        rt, rc = _affine(b)
        terms = dict(lt)
        for v, c in rt.items():
            terms[v] = terms.get(v, 0) - c
        const = lc - rc
        if isinstance(p, Le):
            const -= 1  # d <= 0  <=>  d - 1 < 0
        op_of: dict[type, ops.Binop] = {Eq: ops.Binop.CMPEQ, Ne: ops.Binop.CMPNE, Lt: ops.Binop.CMPLT,
              Le: ops.Binop.CMPLT}
        op = op_of[type(p)]
        pos = {v: c for v, c in terms.items() if c > 0}
        neg = {v: -c for v, c in terms.items() if c < 0}
        if not pos and not neg:
            holds = {ops.Binop.CMPEQ: const == 0, ops.Binop.CMPNE: const != 0,
                     ops.Binop.CMPLT: const < 0}[op]
            return self._const(1.0 if holds else 0.0)
        lhs = self._index_value(pos, max(const, 0), space)
        rhs = self._index_value(neg, max(-const, 0), space)
        return self._combine("m", op, [lhs, rhs], space)

    def _index_value(self, terms: dict[Sym, int], const: int, space: Space) -> Operand:
        """``Σ c·v + const`` (``c > 0``, ``const >= 0``) as a number."""
        parts: list[Operand] = []
        for v, c in terms.items():
            iota = self._iota(v, space[v])
            parts.append(iota if c == 1 else
                         self._combine("ix", ops.Binop.MUL, [self._const(float(c)), iota], space))
        if const or not parts:
            parts.append(self._const(float(const)))
        out = parts[0]
        for part in parts[1:]:
            out = self._combine("ix", ops.Binop.ADD, [out, part], space)
        return out

    def _combine(self, label: str, op: Any, operands: list[Operand], space: Space) -> Operand:
        """A new node over the operands' variables holding ``op(operands)``."""
        target = self._fresh(label, set().union(*(o.vars() for o in operands)), space)
        self._emit(target, space, (), op, operands)
        return Operand(target.tn, tuple(({v: 1}, 0) for v in target.lhs_vars))


def embed_iotas(stmt: ll.LLStmt, iotas: frozenset[Tnode]) -> ll.LLStmt:
    """Lowered code with every read ``iota[ix]`` replaced by ``EmbedIndex(ix)`` and the
    iotas' fills removed (the same values: ``iota[k] = k``)."""
    match stmt:
        case ll.Seq(first, second):
            return ll.seq(embed_iotas(first, iotas), embed_iotas(second, iotas))
        case ll.ForLoop(body=body):
            inner = embed_iotas(body, iotas)
            return ll.Noop() if isinstance(inner, ll.Noop) else replace(stmt, body=inner)
        case ll.Set(tn=tn) if tn in iotas:
            return ll.Noop()
        case ll.Set(llsc=sc):
            return replace(stmt, llsc=_embed_scalar(sc, iotas))
    return stmt


def _embed_scalar(sc: ll.LLScalar, iotas: frozenset[Tnode]) -> ll.LLScalar:
    match sc:
        case ll.Get(tn, (idx,)) if tn in iotas:
            return ll.EmbedIndex(idx)
        case ll.Unop(op, a):
            return ll.Unop(op, _embed_scalar(a, iotas))
        case ll.Binop(op, a, b):
            return ll.Binop(op, _embed_scalar(a, iotas), _embed_scalar(b, iotas))
        case ll.Ternop(op, a, b, c):
            return ll.Ternop(op, *(_embed_scalar(x, iotas) for x in (a, b, c)))
    return sc


def to_assignments(nf: NormalForm) -> Translation:
    """The einjit assignments computing ``nf`` (see the module docstring)."""
    return _Translator(nf).translation


class EinjitFunc:
    """One normal form compiled by an einjit backend, callable on NumPy arguments.

    The routine is linked once, by default into the C backend's context that computes in
    the host arrays. There a call hands the C function the caller's own arrays when their
    dtype, shape and layout are the routine's (C-contiguous, aligned): the routine only reads
    its inputs, and a copy of a large matrix would cost more than a matrix-vector product.
    Other arguments (any strides or dtype; a relation's booleans become 0/1), and every call
    on other backends, are copied into the input nodes' host arrays and moved to the context.
    The result is copied out. Calls from several threads share those arrays, so a lock makes
    each call whole (the C routine runs without the GIL: another thread would otherwise
    overwrite the inputs).
    """

    def __init__(self, nf: NormalForm, *, settings: VirtualizeSettings | None = None,
                 options: Any = None, einjit_backend: Any = None) -> None:
        t0 = time.perf_counter()
        self.translation = to_assignments(nf)
        name = "atl_" + re.sub(r"\W", "_", nf.ret.name.name)
        base = backends.resolve(einjit_backend)
        compiler = base if options is None else backends.with_options(base, options)
        with stable_names():
            config.debug(2, f"ATL normal form:\n{nf}\nATL einjit assignments:\n"
                            f"{asg.to_doc(self.translation.asgns)}")
            self.optimized = optimize_proc(self.translation.to_low_level(), name=name, settings=settings)
            compiled = compiler.compile((), self.optimized, shared=True, name=name)
        self.context = default_context(base)
        self._input_nodes = self.translation.inputs
        self._inputs = [tn.host_array() for tn in self._input_nodes]
        for tn in self._input_nodes:
            self.context.from_host(tn)
        load_inputs(self.context, compiled.inputs)
        self.routine = compiler.link(self.context, compiled)
        self._output = self.translation.output.host_array()
        self._direct = _direct_call(compiled.procedure, self.context, self._input_nodes, self.translation.output,
                                    output_read=self.translation.output in compiled.inputs)
        self._lock = threading.Lock()
        config.debug(1, f"ATL einjit compile {name}: {time.perf_counter() - t0:.3f}s"
                        + ("" if self._direct is None else " (arguments passed without copying when they fit)"))

    def __call__(self, *args: Any, output: np.ndarray | None = None) -> Any:
        """Run on the arguments. `output`, a float64 array of the result's shape (already
        checked by `Func`), receives the result: the routine writes into it directly when
        it is one the routine can take (C-contiguous, aligned), else it is filled from the
        result node. Returns `output` then, else a new array (a float for an `R` result)."""
        if len(args) != len(self._inputs):
            raise TypeError(f"expected {len(self._inputs)} arguments, got {len(args)}")
        with self._lock:
            target = None if output is None else output.reshape(self._output.shape) if output.size == 1 else output
            if self._direct is not None:
                written = self._direct(self._inputs, args, target)
            else:
                for tn, host, val in zip(self._input_nodes, self._inputs, args, strict=True):
                    host[...] = val
                    self.context.from_host(tn)
                self.routine()
                self.context.to_host(self.translation.output)
                written = False
            out = self._output
            if output is not None:
                if not written:
                    output[...] = out.reshape(output.shape)
                return output
            return float(out[()]) if out.ndim == 0 else out.copy()


def _passable(val: Any, host: np.ndarray) -> bool:
    """Whether the C routine can take `val` in place of `host`'s memory."""
    if not isinstance(val, np.ndarray) or val.dtype != host.dtype or val.shape != host.shape:
        return False
    flags = val.flags
    return flags.c_contiguous and flags.aligned


class _Address:
    """The data address of the last array seen in one argument slot. Reading it
    (`ndarray.ctypes.data`) costs about 1.4 µs, a twentieth of a 512 × 512 float64 matrix-vector
    product's whole time; a caller passing the same array call after call pays it once. The
    array is held through a weak reference: an array's data never moves while it lives, and a
    dead one cannot be mistaken for a new one."""

    __slots__ = ("address", "array")

    def __init__(self) -> None:
        self.array: Callable[[], Any] = lambda: None
        self.address = 0

    def of(self, val: np.ndarray) -> int:
        if self.array() is not val:
            self.array, self.address = weakref.ref(val), val.ctypes.data
        return self.address


def _direct_call(procedure: Any, context: Any, inputs: Sequence[Tnode], output: Tnode, *, output_read: bool
                 ) -> Callable[[list[np.ndarray], tuple[Any, ...], np.ndarray | None], bool] | None:
    """A call of the C function with per-call input pointers, and the caller's output array
    when it fits (the call then returns True), when the routine is relocatable C (array
    parameters only) and the context computes in the host arrays; None otherwise. The
    caller's output replaces the result node only when the routine writes every cell before
    reading it (`output_read` is False): its old contents must not matter. The function is
    called through a prototype of its own taking addresses as integers (no `c_void_p` per
    argument per call; the library's own function object is left as it is)."""
    cproc = getattr(getattr(procedure, "procedure", None), "function", None)
    params = getattr(getattr(procedure, "procedure", None), "params", None)
    if cproc is None or params is None or getattr(procedure, "entry", None) is not None:
        return None
    if not all(p.kind is ParamKind.ARRAY for p in params) or not getattr(context, "share_host_arrays", False):
        return None
    if any(context.array(tn) is not tn.host_array() for tn in [*inputs, output]):
        return None
    prototype = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(params))
    # ctypes never unloads a library it loaded, so the address stays valid
    function = prototype(ctypes.cast(cproc, ctypes.c_void_p).value or 0)
    slots = [[i for i, p in enumerate(params) if p.tn is tn] for tn in inputs]
    out_slots = [] if output_read else [i for i, p in enumerate(params) if p.tn is output]
    fixed = [context.array(p.node).ctypes.data for p in params]
    addresses = [_Address() for _ in [*inputs, output]]
    out_host = output.host_array()

    def call(hosts: list[np.ndarray], args: tuple[Any, ...], out: np.ndarray | None) -> bool:
        pointers = list(fixed)
        for k, host in enumerate(hosts):
            val = args[k]
            if not _passable(val, host):
                host[...] = val
                val = host
            address = addresses[k].of(val)
            for i in slots[k]:
                pointers[i] = address
        direct_out = out is not None and bool(out_slots) and _passable(out, out_host) and out.flags.writeable
        if direct_out:
            assert out is not None  # checked just above
            address = addresses[-1].of(out)
            for i in out_slots:
                pointers[i] = address
        function(*pointers)
        return direct_out

    return call


def compile_normal_form(nf: NormalForm, **options: Any) -> EinjitFunc:
    """The ATL backend contract (see ``func._compile``). Options: ``settings``, the
    optimizer's ``VirtualizeSettings``; ``options``, the C backend's ``CcOptions``;
    ``einjit_backend``, an einjit backend or its name (default: ``$EINJIT_BACKEND`` or ``cc``)."""
    unknown = set(options) - {"settings", "options", "einjit_backend"}
    if unknown:
        raise TypeError(f"einjit ATL backend: unknown options {sorted(unknown)}; "
                        "expected 'settings', 'options' and/or 'einjit_backend'")
    return EinjitFunc(nf, **options)
