"""`AccumExpr` and `Fused` (an optimizer's update as one loop nest): the C backend, on the
optimized code, against the reference interpreter on the unoptimized lowering and against NumPy,
on the avx2 and avx512 machine descriptions; fused against the same members one after another;
and the lowering's refusals."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from einjit.backends.c_syntax import C_SYNTAX
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import run_once
from einjit.ir import assignments as asg
from einjit.ir import expr as ex
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, Iterator, Projections, get_symbol
from einjit.ir.optimize import optimize_proc
from einjit.ir.tnode import Tnode, hosted

B = ops.Binop
SCALARS = {"b1": 0.9, "b2": 0.999, "c1": 0.1, "c2": 0.001, "step_size": 0.05 / 0.19, "rbc2": 0.002 ** -0.5,
           "eps": 1e-8, "lr_wd": 0.05 * 0.01}


def _nodes(dims: tuple[int, ...]) -> dict[str, Tnode]:
    out = {}
    for name in ("p", "m", "v", "g", *SCALARS):
        tn = Tnode(name, dims if name in "pmvg" else (1,), ops.single)
        tn.update_memory_mode(hosted(), 0)
        out[name] = tn
    return out


def _expr(tns: dict[str, Tnode], lhs: str, rhs: ex.Expr, names: list[str], accum: B = B.ARG2,
          reads: dict[str, tuple] | None = None) -> asg.AccumExpr:
    """`lhs accum= rhs` pointwise over the lhs's dims (an axis of dimension 1 is no loop, as
    shape inference projects it); scalars read at their one cell."""
    dims = tns[lhs].dims
    syms = tuple(get_symbol() for d in dims if d > 1)
    it = iter(syms)
    cell = tuple(Iterator(next(it)) if d > 1 else FixedIdx(0) for d in dims)
    idcs = tuple((reads or {}).get(n, cell if tns[n].dims == dims else (FixedIdx(0),)) for n in names)
    space = tuple(d for d in dims if d > 1)
    proj = Projections(space, syms, dims, tuple(tns[n].dims for n in names), cell, idcs, "fused test")
    return asg.AccumExpr(False, accum, tns[lhs], rhs, tuple(asg.Node(tns[n]) for n in names), asg.Lazy.of(proj))


def _adamw(tns: dict[str, Tnode]) -> list[asg.AccumExpr]:
    """m, v, then p of AdamW, as `train.adam_one` writes them."""
    a = ex.Arg
    m = _expr(tns, "m", ex.Bin(B.ADD, ex.Bin(B.MUL, a(0), a(1)), ex.Bin(B.MUL, a(2), a(3))), ["b1", "m", "c1", "g"])
    v = _expr(tns, "v", ex.Bin(B.ADD, ex.Bin(B.MUL, a(0), a(1)), ex.Bin(B.MUL, a(2), ex.Bin(B.MUL, a(3), a(3)))),
              ["b2", "v", "c2", "g"])
    denom = ex.Bin(B.ADD, ex.Bin(B.MUL, ex.Un(ops.Unop.SQRT, a(4)), a(5)), a(6))
    step = ex.Bin(B.MUL, a(2), ex.Bin(B.DIV, a(3), denom))
    p = _expr(tns, "p", ex.Bin(B.ADD, ex.Bin(B.MUL, a(0), a(1)), step),
              ["lr_wd", "p", "step_size", "m", "v", "rbc2", "eps"], accum=B.SUB)
    return [m, v, p]


def _inputs(tns: dict[str, Tnode], seed: int) -> dict[Tnode, np.ndarray]:
    rng = np.random.default_rng(seed)
    dims = tns["p"].dims
    arrays = {tns[n]: rng.standard_normal(dims).astype(np.float32) for n in "pmg"}
    arrays[tns["v"]] = rng.uniform(0.1, 1.0, dims).astype(np.float32)
    arrays.update({tns[n]: np.array([x], np.float32) for n, x in SCALARS.items()})
    return arrays


def _numpy_adamw(arrays: dict[Tnode, np.ndarray], tns: dict[str, Tnode]) -> dict[str, np.ndarray]:
    x = {n: arrays[tn].astype(np.float64) for n, tn in tns.items()}
    s = {n: float(np.float32(v)) for n, v in SCALARS.items()}
    m = s["b1"] * x["m"] + s["c1"] * x["g"]
    v = s["b2"] * x["v"] + s["c2"] * x["g"] ** 2
    p = x["p"] - (s["lr_wd"] * x["p"] + s["step_size"] * (m / (np.sqrt(v) * s["rbc2"] + s["eps"])))
    return {"m": m, "v": v, "p": p}


def _c(code: asg.Asgns, arrays: dict[Tnode, np.ndarray], tns: dict[str, Tnode], threads: int = 1
       ) -> dict[str, np.ndarray]:
    llc = optimize_proc(asg.to_low_level(code))
    options = cc.CcOptions(threads=threads, syntax=replace(C_SYNTAX, thread_min_work=16))
    ctx = run_once(llc, {tn: a.copy() for tn, a in arrays.items()}, name="fused_pointwise", options=options)
    return {n: ctx.array(tns[n]).copy() for n in "pmv"}


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("dims", [(5, 7), (3, 1, 40), (33,)])
def test_fused_adamw_nest_matches_interpreter_and_numpy(machine, dims, monkeypatch):
    """Odd sizes reach the vector loops' tails; the interpreter runs the unoptimized lowering."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    tns = _nodes(dims)
    code = asg.Fused(tuple(_adamw(tns)))
    arrays = _inputs(tns, seed=len(dims) + dims[0])
    want = interpret.run(asg.to_low_level(code), {tn: a.copy() for tn, a in arrays.items()})
    got = _c(code, arrays, tns)
    ref = _numpy_adamw(arrays, tns)
    for n in "pmv":
        # float32 throughout; the C code contracts `b * x + c * y` into an FMA (one rounding fewer)
        np.testing.assert_allclose(got[n], want[tns[n]], rtol=2e-6, atol=1e-7, err_msg=n)
        np.testing.assert_allclose(got[n], ref[n], rtol=1e-5, atol=1e-6, err_msg=n)
    assert not np.allclose(got["p"], arrays[tns["p"]])


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_group_is_bit_identical_to_its_members_in_sequence(threads):
    """One nest or three, the same values: each member reads a node another writes only at the
    cell being updated."""
    tns = _nodes((6, 50))
    members = _adamw(tns)
    arrays = _inputs(tns, seed=7)
    fused = _c(asg.Fused(tuple(members)), arrays, tns, threads)
    serial = _c(asg.sequence(*members), arrays, tns, threads)
    for n in "pmv":
        np.testing.assert_array_equal(fused[n], serial[n], err_msg=n)


def test_fused_group_lowers_to_one_nest():
    tns = _nodes((4, 3))
    llc = asg.to_low_level(asg.Fused(tuple(_adamw(tns))))
    stmts = list(ll.iter_stmts(llc))
    assert sum(1 for s in stmts if isinstance(s, ll.ForLoop)) == 2
    assert [s.tn for s in stmts if isinstance(s, ll.Set)] == [tns["m"], tns["v"], tns["p"]]
    n = {k: tn.name for k, tn in tns.items()}
    doc = asg.to_doc(asg.Fused(tuple(_adamw(tns))))
    assert doc == (f"~fused({n['m']} = (({n['b1']} * {n['m']}) + ({n['c1']} * {n['g']})); "
                   f"{n['v']} = (({n['b2']} * {n['v']}) + ({n['c2']} * ({n['g']} * {n['g']}))); "
                   f"{n['p']} =- (({n['lr_wd']} * {n['p']}) + ({n['step_size']} * ({n['m']} / "
                   f"((sqrt({n['v']}) * {n['rbc2']}) + {n['eps']})))));\n")


def test_fused_read_of_a_written_node_at_another_cell_is_refused():
    """`p` reading `m[0, 0]` while the nest updates `m` would see cells of the new `m` and
    cells of the old one."""
    tns = _nodes((4, 3))
    m, v, _ = _adamw(tns)
    bad = _expr(tns, "p", ex.Bin(B.ADD, ex.Arg(0), ex.Arg(1)), ["p", "m"], reads={"m": (FixedIdx(0), FixedIdx(0))})
    with pytest.raises(asg.LoweringError, match="is written in the same nest"):
        asg.to_low_level(asg.Fused((m, v, bad)))


def test_fused_members_over_different_spaces_are_refused():
    tns = _nodes((4, 3))
    other = _nodes((4, 2))
    with pytest.raises(asg.LoweringError, match="must be written once per cell"):
        asg.to_low_level(asg.Fused((_adamw(tns)[0], _adamw(other)[0])))
