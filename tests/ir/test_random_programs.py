"""Property tests: random well-formed programs compute the same before and after
`optimize_proc`.

A program is a few hosted input nodes and a sequence of assignments, lowered by
`assignments.to_low_level` from hand-made `Projections`, so the code looks like real lowered
code: pointwise maps, broadcasts (fixed indices), transposes, diagonal reads, reductions
(`=:+`: a fill loop nest then an accumulating one), padded affine reads (guarded by lowering),
convolution-backprop-like affine writes, accumulation into and overwriting of earlier nodes,
constants, ranges and constant fills. Some computed nodes are hosted, the others are left for
the optimizer to decide. Every node that is not virtual after optimization must hold what the
unoptimized program computes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einjit.ir import assignments as asg
from einjit.ir import interpret, ops
from einjit.ir.indexing import Affine, FixedIdx, Iterator, Projections, get_symbol
from einjit.ir.optimize import VirtualizeSettings, optimize_proc
from einjit.ir.tnode import Tnode, hosted

B, U = ops.Binop, ops.Unop
UNOPS = [U.IDENTITY, U.NEG, U.TANH, U.RELU, U.EXP]
BINOPS = [B.ADD, B.SUB, B.MUL, B.MAX, B.DIV, B.TO_POW_OF]
CONSTANTS = [0.0, 1.0, 2.0, 3.0, -1.0, 0.5]
SETTINGS = [
    VirtualizeSettings(),
    VirtualizeSettings(max_visits=2, inline_complex_computations=True),
    VirtualizeSettings(max_tracing_dim=2),
    VirtualizeSettings(inline_scalar_constexprs=False, inline_simple_computations=False),
    VirtualizeSettings(enable_device_only=False, max_visits=0),
]


@dataclass(frozen=True)
class NodeSpec:
    dims: tuple[int, ...]
    prec: ops.Prec
    host: bool


@dataclass(frozen=True)
class FetchStep:
    target: int
    fetch: str
    values: tuple[float, ...]


@dataclass(frozen=True)
class OpStep:
    """`target <acc>= op(args)` over loops of trip counts `space`; indices are recipes:
    ("sym", k), ("fixed", i) or ("affine", k1, k2, offset) over the loop symbols."""

    target: int
    space: tuple[int, ...]
    lhs: tuple[tuple, ...]
    args: tuple[tuple[int, tuple[tuple, ...]], ...]
    op: ops.Unop | ops.Binop
    acc: ops.Binop
    init: bool


@dataclass(frozen=True)
class Program:
    nodes: tuple[NodeSpec, ...]
    steps: tuple[FetchStep | OpStep, ...]
    seed: int


DIMS = st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple)


def _recipe_dim(recipe, space):
    match recipe:
        case ("sym", k):
            return space[k]
        case ("fixed", _):
            return 1
        case ("affine", k1, k2, _):
            return space[k1] + space[k2] - 1


@st.composite
def _arg_index(draw, d, space):
    """An index recipe reading an axis of dimension `d` inside the loops `space`."""
    choices = [("fixed", draw(st.integers(0, d - 1)))]
    choices += [("sym", k) for k, n in enumerate(space) if n == d]
    pairs = [(k1, k2) for k1 in range(len(space)) for k2 in range(len(space)) if k1 != k2]
    if pairs and draw(st.integers(0, 4)) == 0:
        k1, k2 = draw(st.sampled_from(pairs))
        choices.append(("affine", k1, k2, draw(st.integers(-1, 0))))
    return draw(st.sampled_from(choices))


@st.composite
def programs(draw, precs=(ops.double,)):
    nodes = [NodeSpec(draw(DIMS), draw(st.sampled_from(precs)), True) for _ in range(draw(st.integers(1, 2)))]
    steps = []

    def new_node(dims):
        nodes.append(NodeSpec(dims, draw(st.sampled_from(precs)), draw(st.booleans())))
        return len(nodes) - 1

    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["op"] * 5 + ["constant", "range", "fill"]))
        if kind != "op":
            dims = (1,) if kind == "constant" and draw(st.booleans()) else draw(DIMS)
            target = new_node(dims)
            size = int(np.prod(dims))
            values = tuple(draw(st.lists(st.sampled_from(CONSTANTS), min_size=size, max_size=size)))
            steps.append(FetchStep(target, kind, values[:1] if kind == "constant" else values))
            continue
        space = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
        order = draw(st.permutations(range(len(space))))
        lhs = [("sym", k) for k in order[:draw(st.integers(0, len(space)))]]
        free = [k for k in range(len(space)) if ("sym", k) not in lhs]
        affine_lhs = len(free) >= 2 and draw(st.integers(0, 5)) == 0
        if affine_lhs:
            lhs.append(("affine", free[0], free[1], 0))
        if not lhs:
            lhs = [("fixed", 0)]
        dims = tuple(_recipe_dim(r, space) for r in lhs)
        op = draw(st.sampled_from(UNOPS + BINOPS))
        n_args = 1 if isinstance(op, ops.Unop) else 2
        args = []
        for _ in range(n_args):
            a = draw(st.integers(0, len(nodes) - 1))
            args.append((a, tuple(draw(_arg_index(d, space)) for d in nodes[a].dims)))
        existing = [k for k, n in enumerate(nodes) if n.dims == dims]
        if existing and not affine_lhs and draw(st.integers(0, 3)) == 0:
            target = draw(st.sampled_from(existing))
            acc, init = draw(st.sampled_from([B.ADD, B.ARG2])), False
        else:
            target = new_node(dims)
            acc, init = (B.ADD, True) if affine_lhs else draw(st.sampled_from([(B.ARG2, False), (B.ADD, True),
                                                                               (B.MAX, True)]))
        steps.append(OpStep(target, space, tuple(lhs), tuple(args), op, acc, init))
    last = steps[-1].target
    nodes[last] = NodeSpec(nodes[last].dims, nodes[last].prec, True)
    return Program(tuple(nodes), tuple(steps), draw(st.integers(0, 2**31 - 1)))


def build(program: Program):
    """Fresh nodes and assignments for `program`, and the input values."""
    tns = []
    for k, spec in enumerate(program.nodes):
        tn = Tnode(f"n{k}", spec.dims, spec.prec)
        if spec.host:
            tn.update_memory_mode(hosted(), 0)
        tns.append(tn)
    asgns = []
    for step in program.steps:
        match step:
            case FetchStep(target, "constant", values):
                asgns.append(asg.Fetch(tns[target], asg.FetchConstant(values[0])))
            case FetchStep(target, "range", _):
                asgns.append(asg.Fetch(tns[target], asg.RangeOverOffsets()))
            case FetchStep(target, "fill", values):
                asgns.append(asg.Fetch(tns[target], asg.ConstantFill(values)))
            case OpStep(target, space, lhs, args, op, acc, init):
                syms = tuple(get_symbol() for _ in space)

                def index(recipe, syms=syms):
                    match recipe:
                        case ("sym", k):
                            return Iterator(syms[k])
                        case ("fixed", i):
                            return FixedIdx(i)
                        case ("affine", k1, k2, offset):
                            return Affine(((1, syms[k1]), (1, syms[k2])), offset)

                lhs_tn = tns[target]
                proj = asg.Lazy.of(Projections(space, syms, lhs_tn.dims, tuple(tns[a].dims for a, _ in args),
                                               tuple(index(r) for r in lhs),
                                               tuple(tuple(index(r) for r in idcs) for _, idcs in args)))
                bufs = [asg.Node(tns[a]) for a, _ in args]
                if isinstance(op, ops.Unop):
                    asgns.append(asg.AccumUnop(init, acc, op, lhs_tn, *bufs, proj))
                else:
                    asgns.append(asg.AccumBinop(init, acc, op, lhs_tn, *bufs, proj))
    rng = np.random.default_rng(program.seed)
    inputs = {tn: rng.uniform(-1.5, 1.5, tn.dims).astype(tn.prec.dtype)
              for tn, spec in zip(tns, program.nodes, strict=True) if spec.host and _is_input(program, tns.index(tn))}
    return asg.to_low_level(asg.sequence(*asgns)), tns, inputs


def _is_input(program: Program, k: int) -> bool:
    return all(step.target != k for step in program.steps)


def run_both(program: Program, opt_settings: VirtualizeSettings):
    """Interpreter results of the unoptimized and the optimized program (fresh nodes each)."""
    llc, tns, inputs = build(program)
    ref = interpret.run(llc, {tn: v.copy() for tn, v in inputs.items()})
    want = [ref.get(tn) for tn in tns]
    llc, tns, inputs = build(program)
    opt = optimize_proc(llc, settings=opt_settings)
    got = interpret.run(opt.llc, {tn: v.copy() for tn, v in inputs.items()})
    return tns, want, [None if tn.is_virtual() else got.get(tn) for tn in tns]


def _scale(arrays) -> float:
    finite = [np.abs(a[np.isfinite(a)]).max() for a in arrays if a is not None and np.isfinite(a).any()]
    return max(finite, default=0.0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(), opt_settings=st.sampled_from(SETTINGS))
def test_optimized_programs_compute_the_same(program, opt_settings):
    tns, want, got = run_both(program, opt_settings)
    atol = 1e-9 * (1.0 + _scale(want))
    for tn, spec, w, g in zip(tns, program.nodes, want, got, strict=True):
        if spec.host:
            assert g is not None, f"hosted {tn.debug_name()} was virtualized"
        if g is not None and w is not None:
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=atol, equal_nan=True, err_msg=tn.debug_name())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(precs=(ops.double, ops.single)), opt_settings=st.sampled_from(SETTINGS))
def test_virtualization_alone_is_exact_in_mixed_precision(program, opt_settings):
    """Without simplification nothing is reassociated or fused, and an inlined computation runs
    in its node's precision: results are bit for bit those of the unoptimized program."""
    tns, want, got = run_both(program, replace(opt_settings, simplify=False))
    for tn, w, g in zip(tns, want, got, strict=True):
        if g is not None and w is not None:
            assert np.array_equal(g, w, equal_nan=True), tn.debug_name()

