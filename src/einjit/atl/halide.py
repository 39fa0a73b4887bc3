"""Code generation of the block normal form to a Halide pipeline (``pip install halide``).

Each statement ``x(i0..ik) = e`` becomes one pure Halide ``Func`` definition; a sum
becomes an inline reduction over an ``RDom``; an indicator becomes
``select(p, e, 0.0)``. ``select`` evaluates both branches, so every index that could
leave its tensor is clamped into range: a guarded read then stays in bounds (its
value is discarded) and bounds inference never asks for data outside a tensor. Indices
whose range analysis proves them in bounds are left alone.

Layouts: Halide's dimension 0 is the innermost one, the reverse of NumPy's C order.
Funcs and the output are defined with reversed variables, so a C-ordered result
array is written without a copy. Each argument array is bound in place, as a C-ordered
view (reversed axes), a Fortran-ordered one (axes as they are), or, for any other
strides, a C-ordered view without Halide's unit-stride assumption. One pipeline is
compiled per combination of argument layouts and cached.

Small pipelines compute every statement at the root (a ``let`` is computed once).
A large contraction — one statement with two result dimensions whose body is a sum, such as
a matrix product — gets a register-blocked schedule, the one Halide's own linear-algebra
examples use: the result in tiles of ``8 x 3`` vectors, each tile's sums held in a small
accumulator updated with the reduction outermost and the tile's cells unrolled and
vectorized, tile rows in parallel. It reaches NumPy's BLAS at n = 1024, where the
autoschedulers below stay at 0.2–0.9x. Other large pipelines go to an autoscheduler:
Adams2019 where its plugin loads, then Mullapudi2016, then the plain schedule. Both are
given the static extents as exact bounds of the inputs and as estimates of the output.

``EINJIT_DEBUG=1`` prints compile times and the schedule chosen, ``2`` also the normal
form, ``3`` also writes Halide's lowered statement to a file and names it.
"""

from __future__ import annotations

import glob
import os
import re
import time
from typing import Any, Callable

import numpy as np

from ..config import cache_dir, debug, debug_level
from .index import interval
from .ir import (
    Access,
    Add,
    And,
    Const,
    Eq,
    Expr,
    IAdd,
    IConst,
    IMul,
    Index,
    Indicate,
    IVar,
    Le,
    Lt,
    Mul,
    Ne,
    Not,
    Or,
    Pred,
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
from .rewrite import index_vars_of
from .typecheck import is_relation_type

__all__ = ["HalideFunc", "import_halide", "AUTOSCHEDULE_WORK"]

#: Estimated multiply-adds above which a pipeline is autoscheduled.
AUTOSCHEDULE_WORK = 1 << 18
#: Rows of a contraction's register tile, and its width in vectors.
_TILE_ROWS, _TILE_VECTORS = 8, 3

_AUTOSCHEDULERS = ("Adams2019", "Mullapudi2016")
_loaded_plugins: dict[str, bool] = {}


def import_halide():
    """The ``halide`` module, or an ``ImportError`` naming the extra to install."""
    try:
        import halide
    except ImportError as exc:
        raise ImportError("the ATL Halide backend needs the 'halide' package: "
                          "pip install 'einjit[halide]'") from exc
    return halide


def _hname(sym: Sym) -> str:
    return re.sub(r"\W", "_", f"{sym.name}_{sym.id}")


def _layout(arr: np.ndarray) -> str:
    if arr.flags.c_contiguous:
        return "C"
    if arr.flags.f_contiguous:
        return "F"
    return "S"


def estimated_work(nf: NormalForm) -> int:
    """Multiply-adds the pipeline performs, counting each sum's full range."""
    def cost(e: Expr) -> int:
        match e:
            case Add(lhs, rhs) | Mul(lhs, rhs):
                return cost(lhs) + cost(rhs)
            case Sum(_, rng, body):
                return rng * cost(body)
            case Indicate(_, body):
                return cost(body)
        return 1
    return sum(int(np.prod(s.shape, dtype=np.int64)) * cost(s.body)
               for s in nf.stmts + (nf.ret,))


class HalideFunc:
    """The Halide pipelines of one normal form, compiled on first use per layout."""

    def __init__(self, nf: NormalForm, autoschedule: bool | None = None) -> None:
        self.hl = import_halide()
        self.nf = nf
        self.autoschedule = (estimated_work(nf) > AUTOSCHEDULE_WORK
                             if autoschedule is None else autoschedule)
        self.scheduler: str | None = None
        self._compiled: dict[tuple[str, ...], Callable] = {}
        self._out_shape = tensor_shape(nf.ret_type)[0]

    def __call__(self, *args: Any, output: np.ndarray | None = None) -> Any:
        """Run on validated arguments: floats for ``R``, float64 (or bool) arrays.

        Arrays are read in place; a read-only one (a broadcast, a frozen array) is
        copied first, because Halide's Python buffers need writable memory. A checked
        ``output`` (see ``Func.jit_exec``) is realized into directly when C-contiguous,
        else filled from a fresh result.
        """
        hl = self.hl
        args = tuple(np.array(a) if isinstance(a, np.ndarray) and not a.flags.writeable
                     else a for a in args)
        layouts = {k: _layout(a) for k, a in enumerate(args) if isinstance(a, np.ndarray)}
        key = tuple(layouts.values())
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._compiled[key] = self._compile(key)
        call_args = [hl.Buffer(a, reverse_axes=layouts[k] != "F") if k in layouts else a
                     for k, a in enumerate(args)]
        direct = output is not None and output.flags.c_contiguous
        out = output.reshape(self._out_shape) if direct and output is not None else np.empty(
            self._out_shape, dtype=np.float64)
        fn(*call_args, hl.Buffer(out))
        if output is not None:
            if not direct:
                output[...] = out.reshape(output.shape)
            return output
        return float(out[()]) if out.ndim == 0 else out

    def _compile(self, layouts: tuple[str, ...]) -> Callable:
        hl = self.hl
        t0 = time.perf_counter()
        target = hl.get_jit_target_from_environment()
        tile = _contraction_tile(self.nf, target.natural_vector_size(hl.Float(64))) if self.autoschedule else None
        lowering = _Lowering(hl, self.nf, layouts, contraction=tile is not None)
        pipeline = hl.Pipeline(lowering.output)
        if tile is not None:
            _schedule_contraction(hl, lowering, *tile)
            self.scheduler = "contraction"
        else:
            self.scheduler = self._schedule(pipeline, lowering, target)
        fn = pipeline.compile_to_callable(lowering.params, target)
        debug(1, f"ATL Halide compile ({self.scheduler}, layouts {layouts}): "
                 f"{time.perf_counter() - t0:.3f}s")
        debug(2, f"ATL normal form:\n{self.nf}")
        if debug_level() >= 3:
            path = cache_dir() / f"atl_{_hname(self.nf.ret.name)}_{''.join(layouts)}.stmt"
            pipeline.compile_to_lowered_stmt(str(path), lowering.params,
                                             hl.StmtOutputFormat.Text, target)
            debug(3, f"ATL lowered Halide pipeline written to {path}")
        return fn

    def _schedule(self, pipeline, lowering: "_Lowering", target) -> str:
        hl = self.hl
        if self.autoschedule:
            for name in _AUTOSCHEDULERS:
                if not _load_plugin(hl, name):
                    continue
                params = {"parallelism": str(os.cpu_count() or 1)}
                try:
                    pipeline.apply_autoscheduler(target, hl.AutoschedulerParams(name, params))
                    return name
                except Exception as exc:  # a plugin refusing a pipeline is not fatal
                    debug(1, f"ATL autoscheduler {name} failed: {exc}")
        for f in lowering.stmt_funcs:
            f.compute_root()
        return "root"


def _load_plugin(hl, name: str) -> bool:
    """Load an autoscheduler shipped in the halide wheel, once; ``False`` if absent."""
    if name not in _loaded_plugins:
        pkg = os.path.dirname(hl.__file__)
        paths = glob.glob(os.path.join(pkg, "lib*", f"*autoschedule_{name.lower()}.*"))
        _loaded_plugins[name] = any(_try_load(hl, path) for path in paths)
    return _loaded_plugins[name]


def _try_load(hl, path: str) -> bool:
    try:
        hl.load_plugin(path)
    except Exception:  # a plugin built for another Halide: fall back to the next one
        return False
    return True


def _contraction_tile(nf: NormalForm, vector: int) -> tuple[int, int, int] | None:
    """(vector width, tile columns, tile rows) when ``nf`` is one contraction the register-
    blocked schedule fits: no earlier statements, two result dimensions at least a tile each,
    a body that is a sum over its own index."""
    ret = nf.ret
    if nf.stmts or len(ret.gens) != 2 or not isinstance(ret.body, Sum):
        return None
    if ret.body.idx not in index_vars_of(ret.body.body):
        return None
    rows, cols = ret.shape
    width = vector * _TILE_VECTORS
    if rows < _TILE_ROWS or cols < width:
        return None
    return vector, width, _TILE_ROWS


def _schedule_contraction(hl, lowering: "_Lowering", vector: int, width: int, rows: int) -> None:
    """Register blocking (see the module docstring). Tiles at the edges shift inwards, so any
    extent of at least one tile works."""
    assert lowering.accumulator is not None  # lowered with contraction=True
    acc, r = lowering.accumulator
    out = lowering.output
    x, y = lowering.output_vars
    xo, yo, xi, yi = (hl.Var(n) for n in ("xo", "yo", "xi", "yi"))
    out.tile(x, y, xo, yo, xi, yi, width, rows).vectorize(xi, vector).unroll(xi).parallel(yo)
    acc.compute_at(out, xo).vectorize(x, vector).unroll(x).unroll(y)
    acc.update().reorder(x, y, r.x).vectorize(x, vector).unroll(x).unroll(y)


class _Lowering:
    """Builds the Halide Funcs of one normal form for given argument layouts. With
    ``contraction``, the result's top-level sum becomes an accumulator Func with an update
    definition (``accumulator``), which the contraction schedule blocks."""

    def __init__(self, hl, nf: NormalForm, layouts: tuple[str, ...], contraction: bool = False) -> None:
        self.hl = hl
        self.accumulator: tuple[Any, Any] | None = None
        self.f64 = hl.Float(64)
        self.values: dict[Sym, tuple[str, Any, str]] = {}   # kind, object, layout
        self.shapes: dict[Sym, tuple[int, ...]] = {}
        self.indices: dict[Sym, Any] = {}
        self.ranges: dict[Sym, int] = {}
        self.params: list = []
        it = iter(layouts)
        for sym, typ in nf.args:
            self.params.append(self._param(sym, typ, it))
        self.stmt_funcs = [self._stmt(s) for s in nf.stmts]
        self.output = self._contraction(nf.ret) if contraction else self._stmt(nf.ret)
        self.output_vars = self._vars_of(nf.ret)
        for (var, n) in zip(self._vars_of(nf.ret), nf.ret.shape, strict=True):
            self.output.set_estimate(var, 0, n)

    def _param(self, sym: Sym, typ: Type, layouts) -> Any:
        hl = self.hl
        if isinstance(typ, TNum):
            p = hl.Param(self.f64, _hname(sym))
            p.set_estimate(1.0)
            self.values[sym] = ("param", p, "")
            return p
        shape = tensor_shape(typ)[0]
        layout = next(layouts)
        elem = hl.Bool() if is_relation_type(typ) else self.f64
        p = hl.ImageParam(elem, len(shape), _hname(sym))
        for d, n in enumerate(shape):
            hd = d if layout == "F" else len(shape) - 1 - d
            p.dim(hd).set_bounds(0, n).set_estimate(0, n)
        if layout == "S":
            p.dim(0).set_stride(hl.Expr())
        self.values[sym] = ("image", p, layout)
        self.shapes[sym] = shape
        return p

    def _vars_of(self, s: Stmt) -> list:
        return [self.indices[i] for i, _ in reversed(s.gens)]

    def _stmt(self, s: Stmt):
        hl = self.hl
        f = hl.Func(_hname(s.name))
        for i, n in s.gens:
            self.indices[i] = hl.Var(_hname(i))
            self.ranges[i] = n
        body = self._expr(s.body)
        vars_ = self._vars_of(s)
        if vars_:
            f[tuple(vars_)] = body
        else:
            f[()] = body
        self.values[s.name] = ("func", f, "C")
        self.shapes[s.name] = s.shape
        return f

    def _contraction(self, s: Stmt):
        """``f(vars) = acc(vars)`` with ``acc(vars) = 0; acc(vars) += body(r)``."""
        hl = self.hl
        assert isinstance(s.body, Sum)
        for i, n in s.gens:
            self.indices[i] = hl.Var(_hname(i))
            self.ranges[i] = n
        vars_ = tuple(self._vars_of(s))
        i, rng = as_sym(s.body.idx), s.body.range
        r = hl.RDom([(0, rng)], _hname(i))
        self.indices[i], self.ranges[i] = r.x, rng
        acc = hl.Func(_hname(s.name) + "_acc")
        acc[vars_] = hl.f64(0.0)
        acc[vars_] = acc[vars_] + self._expr(s.body.body)
        f = hl.Func(_hname(s.name))
        f[vars_] = acc[vars_]
        self.values[s.name] = ("func", f, "C")
        self.shapes[s.name] = s.shape
        self.accumulator = (acc, r)
        return f

    def _expr(self, e: Expr) -> Any:
        hl = self.hl
        match e:
            case Var(name):
                kind, obj, _ = self.values[as_sym(name)]
                return obj[()] if kind == "func" else obj
            case Const(val):
                return hl.f64(val)
            case Add(lhs, rhs):
                return self._expr(lhs) + self._expr(rhs)
            case Mul(lhs, rhs):
                return self._expr(lhs) * self._expr(rhs)
            case Sum(i, rng, body):
                r = hl.RDom([(0, rng)], _hname(as_sym(i)))
                self.indices[as_sym(i)] = r.x
                self.ranges[as_sym(i)] = rng
                term = self._expr(body)
                if i not in index_vars_of(body):
                    # a reduction whose body never names its domain runs once
                    term = hl.select(r.x >= 0, term, hl.f64(0.0))
                return hl.sum(r, term, _hname(as_sym(i)) + "_sum")
            case Indicate(pred, body):
                return hl.select(self._pred(pred), self._expr(body), hl.f64(0.0))
            case Access():
                idx: list[Index] = []
                while isinstance(e, Access):
                    idx.insert(0, e.idx)
                    e = e.base
                assert isinstance(e, Var)  # normal form: an access chain reads a variable
                return self._read(as_sym(e.name), idx)
        raise TypeError(f"not a normal-form body: {e!r}")

    def _read(self, name: Sym, idx: list[Index]) -> Any:
        _, obj, layout = self.values[name]
        shape = self.shapes[name]
        args = [self._clamped(ix, n) for ix, n in zip(idx, shape, strict=True)]
        return obj[tuple(args if layout == "F" else reversed(args))]

    def _clamped(self, ix: Index, n: int) -> Any:
        e = self._index(ix)
        box = interval(ix, self.ranges)
        if box is not None and 0 <= box[0] and box[1] < n:
            return e
        return self.hl.clamp(e, 0, n - 1)

    def _index(self, ix: Index) -> Any:
        hl = self.hl
        match ix:
            case IVar(name):
                return self.indices[as_sym(name)]
            case IConst(val):
                return hl.Expr(val)
            case IAdd(lhs, rhs):
                return self._index(lhs) + self._index(rhs)
            case IMul(coeff, arg):
                return coeff * self._index(arg)
        raise TypeError(f"not an index expression: {ix!r}")

    def _pred(self, p: Pred) -> Any:
        match p:
            case Eq(l, r):
                return self._index(l) == self._index(r)
            case Ne(l, r):
                return self._index(l) != self._index(r)
            case Lt(l, r):
                return self._index(l) < self._index(r)
            case Le(l, r):
                return self._index(l) <= self._index(r)
            case Rel(rel, args):
                inside = None
                for ix, n in zip(args, self.shapes[as_sym(rel)], strict=True):
                    box = interval(ix, self.ranges)
                    if box is not None and 0 <= box[0] and box[1] < n:
                        continue
                    e = self._index(ix)
                    test = (e >= 0) & (e < n)
                    inside = test if inside is None else inside & test
                member = self._read(as_sym(rel), list(args))
                return member if inside is None else inside & member
            case And(l, r):
                return self._pred(l) & self._pred(r)
            case Or(l, r):
                return self._pred(l) | self._pred(r)
            case Not(arg):
                return ~self._pred(arg)
        raise TypeError(f"not a predicate: {p!r}")
