"""Golden files: the printed (`to_doc`) optimized code of a small dense layer,
`out = relu(w @ x + b) ** 2`, with and without inlining of the reduction.

Ids are normalized (nodes by label, loop symbols and locals numbered in order of appearance)
so the files do not depend on what ran before. Set `EINJIT_UPDATE_GOLDEN=1` to rewrite them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from einjit.ir import assignments as asg
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, Iterator, Projections, get_symbol
from einjit.ir.optimize import VirtualizeSettings, optimize_proc
from einjit.ir.tnode import Tnode, hosted

pytestmark = pytest.mark.usefixtures("avx512_machine")

GOLDEN = Path(__file__).parent / "golden"
B, U = ops.Binop, ops.Unop


def dense_layer():
    n_in, n_out = 3, 2
    x, w, b, out = (Tnode(name, dims, ops.double) for name, dims in
                    (("x", (n_in,)), ("w", (n_out, n_in)), ("b", (n_out,)), ("out", (n_out,))))
    for tn in (x, w, b, out):
        tn.update_memory_mode(hosted(), 0)
    h, z, r, two = (Tnode(name, dims, ops.double) for name, dims in
                    (("h", (n_out,)), ("z", (n_out,)), ("r", (n_out,)), ("two", (1,))))
    i, j = get_symbol("i"), get_symbol("j")

    def proj(space, lhs, rhs, args):
        lhs_idcs, lhs_dims = lhs
        return asg.Lazy.of(Projections(tuple(space.values()), tuple(space), lhs_dims,
                                       tuple(a.dims for a in args), tuple(lhs_idcs), tuple(map(tuple, rhs))))

    ii, jj = Iterator(i), Iterator(j)
    code = asg.sequence(
        asg.AccumBinop(True, B.ADD, B.MUL, h, asg.Node(w), asg.Node(x),
                       proj({i: n_out, j: n_in}, ([ii], h.dims), [[ii, jj], [jj]], [w, x])),
        asg.AccumBinop(False, B.ARG2, B.ADD, z, asg.Node(h), asg.Node(b),
                       proj({i: n_out}, ([ii], z.dims), [[ii], [ii]], [h, b])),
        asg.AccumUnop(False, B.ARG2, U.RELU, r, asg.Node(z), proj({i: n_out}, ([ii], r.dims), [[ii]], [z])),
        asg.Fetch(two, asg.FetchConstant(2.0)),
        asg.AccumBinop(False, B.ARG2, B.TO_POW_OF, out, asg.Node(r), asg.Node(two),
                       proj({i: n_out}, ([ii], out.dims), [[ii], [FixedIdx(0)]], [r, two])))
    return asg.to_low_level(code), {"x": x, "w": w, "b": b, "out": out, "h": h, "z": z, "r": r, "two": two}


def normalized(code: ll.LLStmt, nodes: dict[str, Tnode]) -> str:
    text = ll.to_doc(code)
    for label, tn in nodes.items():
        text = re.sub(rf"\b{re.escape(tn.name)}\b", label, text)
    numbering: dict[str, dict[str, int]] = {}

    def renumber(m: re.Match) -> str:
        ids = numbering.setdefault(m.group(1), {})
        return f"{m.group(1)}{ids.setdefault(m.group(2), len(ids) + 1)}"

    return re.sub(r"\b([a-z])(\d+)\b", renumber, text)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("EINJIT_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"optimized code differs from {path}; EINJIT_UPDATE_GOLDEN=1 rewrites it"


@pytest.mark.parametrize("name,opt_settings", [
    ("dense_layer.txt", VirtualizeSettings()),
    ("dense_layer_inline_complex.txt", VirtualizeSettings(inline_complex_computations=True)),
])
def test_golden_optimized_code(name, opt_settings):
    llc, nodes = dense_layer()
    rng = np.random.default_rng(0)
    inputs = {nodes[k]: rng.standard_normal(nodes[k].dims) for k in ("x", "w", "b")}
    want = np.maximum(inputs[nodes["w"]] @ inputs[nodes["x"]] + inputs[nodes["b"]], 0) ** 2
    ref = interpret.run(llc, {k: v.copy() for k, v in inputs.items()})
    np.testing.assert_allclose(ref[nodes["out"]], want, rtol=1e-12)
    opt = optimize_proc(llc, name="dense", settings=opt_settings)
    got = interpret.run(opt.llc, {k: v.copy() for k, v in inputs.items()})
    np.testing.assert_allclose(got[nodes["out"]], want, rtol=1e-12)
    check_golden(name, normalized(opt.llc, nodes))
