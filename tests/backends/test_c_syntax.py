"""Rendering to C, without compiling: golden output, memory classes, parameters, errors."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from einjit.backends import c_syntax
from einjit.backends.c_syntax import (
    CSyntax,
    MemClass,
    ParamKind,
    RenderError,
    constant_literal,
    flat_index,
    render_program,
    render_routine,
)
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import low_level as ll
from einjit.ir import ops, tnode
from einjit.ir.indexing import Affine, FixedIdx, Iterator, get_static_symbol, get_symbol
from einjit.ir.tnode import Tnode

pytestmark = pytest.mark.usefixtures("avx512_machine")

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("EINJIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with EINJIT_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text()


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def small_program():
    """A strided convolution into a local node, then relu plus a static offset and a merge
    buffer read into a hosted output."""
    x = Tnode("x", (4, 14), memory_mode=tnode.hosted(tnode.MemoryType.CONSTANT))
    w = Tnode("w", (3,))
    h = Tnode("h", (4, 6), memory_mode=tnode.LOCAL)
    y = Tnode("y", (4, 6), memory_mode=tnode.hosted())
    s = get_static_symbol(4)
    i, j, k, i2, j2 = (get_symbol() for _ in range(5))
    v = ll.fresh_scope_id(h)
    conv = ll.LocalScope(v, ll.ForLoop(k, 0, 2, ll.SetLocal(v, ll.Binop(
        ops.Binop.ADD, ll.GetLocal(v),
        ll.Binop(ops.Binop.MUL, ll.Get(x, (Iterator(i), Affine(((2, j), (1, k)), 0))), ll.Get(w, it(k)))))), it(i, j))
    out = ll.Binop(ops.Binop.ADD, ll.Unop(ops.Unop.RELU, ll.Get(h, it(i2, j2))),
                   ll.Binop(ops.Binop.MUL, ll.EmbedIndex(Iterator(s.symbol)), ll.Constant(0.5)))
    out = ll.Binop(ops.Binop.ADD, out, ll.GetMergeBuffer(y, it(i2, j2)))
    code = ll.seq(
        ll.Comment("conv then relu"),
        ll.ZeroOut(y),
        ll.ForLoop(i, 0, 3, ll.ForLoop(j, 0, 5, ll.Set(h, it(i, j), conv, "h =: x conv w"))),
        ll.ForLoop(i2, 0, 3, ll.ForLoop(j2, 0, 5, ll.Set(y, it(i2, j2), out, "y =: relu h + s/2 + merge y"))),
    )
    return code, (x, w, h, y), s


def test_golden_small_program():
    code, _, s = small_program()
    program = render_program([("small", code)], (s,))
    check_golden("small_program.c", program.source)


def test_golden_uniform_hash_and_precisions():
    r = Tnode("r", (2, 4), ops.double)
    q = Tnode("q", (5,), ops.half)
    n = Tnode("n", (5,), ops.int32)
    i, j = get_symbol(), get_symbol()
    code = ll.seq(
        ll.ForLoop(i, 0, 1, ll.SetFromVec(r, (Iterator(i), FixedIdx(0)), 4, ops.VecUnop.UNIFORM_HASH,
                                          ll.Binop(ops.Binop.ADD, ll.ConstantBits(7), ll.EmbedIndex(Iterator(i))),
                                          "r := uniform")),
        ll.ForLoop(j, 0, 4, ll.Set(q, it(j), ll.Unop(ops.Unop.EXP, ll.Binop(
            ops.Binop.MUL, ll.Get(r, (FixedIdx(1), FixedIdx(2))), ll.Constant(0.25))))),
        ll.ForLoop(j, 0, 4, ll.Set(n, it(j), ll.Binop(ops.Binop.MAX, ll.Binop(ops.Binop.MOD, ll.EmbedIndex(Iterator(j)),
                                                                            ll.Constant(3.0)), ll.Get(q, it(j))))),
    )
    check_golden("hash_and_precisions.c", render_program([("mixed", code)]).source)


def test_memory_classes_and_parameter_order():
    code, (x, w, h, y), s = small_program()
    r = render_routine("small", code, (s,))
    assert [p.kind for p in r.params] == [ParamKind.ARRAY, ParamKind.ARRAY, ParamKind.ARRAY,
                                          ParamKind.MERGE_BUFFER, ParamKind.STATIC]
    assert [p.tn for p in r.params[:4]] == [x, w, y, y]
    assert [p.mem for p in r.params[:3]] == [MemClass.CONSTANT_FROM_HOST, MemClass.FROM_CONTEXT,
                                             MemClass.FROM_CONTEXT]
    assert r.params[4].static is s and r.local_nodes == (h,)
    head = r.code.splitlines()[0]
    assert f"const float *restrict {x.name}" in head
    assert f"const float *restrict {w.name}" in head
    assert f"float *restrict {y.name}" in head and f"const float *restrict merge_{y.name}" in head
    assert head.endswith(f"int {c_syntax.symbol_name(s.symbol)}) {{")
    assert f"  float {h.name}[24] = {{0}};" in r.code
    assert h.name not in head


def test_large_local_is_a_scratch_parameter():
    big = Tnode("big", (64, 128), memory_mode=tnode.LOCAL)
    out = Tnode("out", (1,))
    i = get_symbol()
    code = ll.seq(ll.ForLoop(i, 0, 127, ll.Set(big, (FixedIdx(3), Iterator(i)), ll.Constant(1.0))),
                  ll.Set(out, (FixedIdx(0),), ll.Get(big, (FixedIdx(3), FixedIdx(5)))))
    r = render_routine("f", code)
    assert r.code.splitlines()[0] == f"void f(float *restrict {out.name}, float *restrict {big.name}) {{"
    assert [(p.kind, p.tn, p.mem) for p in r.params][-1] == (ParamKind.SCRATCH, big, MemClass.LOCAL_ONLY)
    assert r.scratch_bytes == 64 * 128 * 4 and r.local_nodes == (big,)
    assert "calloc" not in r.code and "free(" not in r.code
    with pytest.raises(RenderError, match="limit for locals"):
        render_routine("f", code, syntax=CSyntax(local_scratch_decl=None))


def test_constant_node_written_by_its_routine_is_not_const():
    c = Tnode("c", (2,), memory_mode=tnode.hosted(tnode.MemoryType.CONSTANT))
    i = get_symbol()
    r = render_routine("init", ll.ForLoop(i, 0, 1, ll.Set(c, it(i), ll.Constant(2.0))))
    assert r.params[0].mem is MemClass.FROM_CONTEXT
    assert f"(float *restrict {c.name})" in r.code


def test_virtual_node_in_code_is_an_error():
    v = Tnode("tmp", (3,), memory_mode=tnode.VIRTUAL, provenance=77)
    o = Tnode("o", (3,))
    i = get_symbol()
    with pytest.raises(RenderError, match=r"virtual tensor tmp#\d+.*provenance 77"):
        render_routine("f", ll.ForLoop(i, 0, 2, ll.Set(o, it(i), ll.Get(v, it(i)))))


def test_unbound_symbol_and_out_of_bounds_are_errors():
    a, o = Tnode("a", (3,)), Tnode("o", (3,))
    i, stray = get_symbol(), get_symbol("k")
    with pytest.raises(RenderError, match=r"symbol k\d+ .* bound neither"):
        render_routine("f", ll.ForLoop(i, 0, 2, ll.Set(o, it(i), ll.Get(a, it(stray)))))
    with pytest.raises(RenderError, match=r"ranges over \[1, 3\], outside \[0, 2\]"):
        render_routine("f", ll.ForLoop(i, 0, 2, ll.Set(o, it(i), ll.Get(a, (Affine(((1, i),), 1),)))))
    s = get_static_symbol(5)
    with pytest.raises(RenderError, match="outside"):
        render_routine("f", ll.Set(o, (FixedIdx(0),), ll.Get(a, (Iterator(s.symbol),))), (s,))
    with pytest.raises(RenderError, match="indices"):
        render_routine("f", ll.Set(o, (FixedIdx(0), FixedIdx(0)), ll.Constant(1.0)))


def test_guarded_padding_read_is_allowed():
    """Lowering guards padded reads with `where`; the read is clamped into bounds and hoisted out
    of the conditional (gcc 12 miscompiles vectorized reductions over masked loads)."""
    a, o = Tnode("a", (4,)), Tnode("o", (4,))
    i = get_symbol()
    idx = Affine(((1, i),), 1)
    guard = ll.Binop(ops.Binop.CMPLT, ll.EmbedIndex(idx), ll.Constant(4.0))
    body = ll.Set(o, it(i), ll.Unop(ops.Unop.RELU, ll.Ternop(ops.Ternop.WHERE, guard, ll.Get(a, (idx,)),
                                                              ll.Constant(0.0))))
    code = render_routine("f", ll.ForLoop(i, 0, 3, body)).code
    assert f"= {a.name}[EINJIT_CLAMP(({c_syntax.symbol_name(i)} + 1), 3)];" in code
    assert "? t1_ : 0.0f)" in code


def test_repeated_template_argument_is_computed_once():
    a, o = Tnode("a", (4,)), Tnode("o", (4,))
    i = get_symbol()
    expr = ll.Unop(ops.Unop.RELU, ll.Unop(ops.Unop.EXP, ll.Get(a, it(i))))
    code = render_routine("f", ll.ForLoop(i, 0, 3, ll.Set(o, it(i), expr))).code
    assert code.count("expf(") == 1 and re.search(r"const float t\d+_ = einjit_expf\(", code)


def test_loads_of_a_conditional_statement_are_hoisted_once_each():
    """Softmax's `exp(where(mask, s * c - max, 0))` and its backward's nested `where`s: every
    load goes into a temporary before any conditional, each cell once, so gcc vectorizes the
    loop (a load under or beside a `?:` kept it scalar); a statement without a conditional
    keeps its loads inline."""
    s, m, o = Tnode("s", (4, 8)), Tnode("m", (4,)), Tnode("o", (4, 8))
    i, j = get_symbol(), get_symbol()
    mask = ll.Binop(ops.Binop.CMPLT, ll.EmbedIndex(Iterator(j)), ll.EmbedIndex(Iterator(i)))
    shifted = ll.Binop(ops.Binop.SUB, ll.Get(s, it(i, j)), ll.Get(m, it(i)))
    inner = ll.Ternop(ops.Ternop.WHERE, mask, shifted, ll.Get(s, it(i, j)))
    expr = ll.Unop(ops.Unop.EXP, ll.Ternop(ops.Ternop.WHERE, mask, inner, ll.Constant(0.0)))
    code = render_routine("f", ll.ForLoop(i, 0, 3, ll.ForLoop(j, 0, 7, ll.Set(o, it(i, j), expr)))).code
    loads = re.findall(r"const float t\d+_ = (\w+)\[[^\]]*\];", code)
    assert sorted(loads) == [m.name, s.name]
    assert "?" in code and not re.search(r"\?[^;]*\[", code)
    plain = ll.Binop(ops.Binop.MUL, ll.Get(s, it(i, j)), ll.Get(m, it(i)))
    code = render_routine("g", ll.ForLoop(i, 0, 3, ll.ForLoop(j, 0, 7, ll.Set(o, it(i, j), plain)))).code
    assert "const float t" not in code
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 10
    mv = np.array([0.5, -1, 2, 0], dtype=np.float32)
    want = np.exp(np.where(np.arange(8)[None, :] < np.arange(4)[:, None], x - mv[:, None], 0)).astype(np.float32)
    nest = ll.ForLoop(i, 0, 3, ll.ForLoop(j, 0, 7, ll.Set(o, it(i, j), expr)))
    got = run_once(nest, {s: x, m: mv}, name="hoisted", context=CcBackend().init("hoisted")).array(o)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_literals():
    assert constant_literal(1.0, ops.single) == "1.0f"
    assert constant_literal(0.1, ops.double) == "0.1"
    assert constant_literal(-2.5, ops.single) == "(-2.5f)"
    assert constant_literal(math.inf, ops.single) == "INFINITY"
    assert constant_literal(-math.inf, ops.double) == "(-INFINITY)"
    assert constant_literal(math.nan, ops.single) == "NAN"
    assert constant_literal(0.5, ops.half) == "((_Float16)0.5)"
    assert constant_literal(3.0, ops.int32) == "3"
    assert constant_literal(3.0, ops.int64) == "3LL"
    assert constant_literal(-1.0, ops.int32) == "(-1)"
    assert constant_literal(0.5, ops.int32) == "0.5"


def test_flat_index():
    i, j, k = get_symbol(), get_symbol(), get_symbol()
    n = c_syntax.symbol_name
    assert flat_index((3, 16), it(i, j)) == f"{n(i)} * 16 + {n(j)}"
    assert flat_index((3, 16), (FixedIdx(2), FixedIdx(5))) == "37"
    assert flat_index((3, 16), (FixedIdx(1), Iterator(j))) == f"{n(j)} + 16"
    assert flat_index((9,), (Affine(((2, i), (1, j)), -1),)) == f"2*{n(i)} + {n(j)} - 1"
    assert flat_index((9, 4), (Affine(((2, i), (-1, j)), 1), Iterator(k))) == f"(2*{n(i)} - {n(j)} + 1) * 4 + {n(k)}"


def test_routine_names_are_checked():
    o = Tnode("o", (1,))
    with pytest.raises(RenderError, match="not a C identifier"):
        render_routine("bad name", ll.Set(o, (FixedIdx(0),), ll.Constant(0.0)))
    with pytest.raises(RenderError, match="repeated"):
        render_program([("f", ll.Noop()), ("f", ll.Noop())])


def test_cuda_like_syntax_is_configurable():
    o = Tnode("o", (4,))
    i = get_symbol()
    syn = CSyntax(function_qualifier='extern "C" __global__', restrict="__restrict__", includes=(),
                  zero_out_memset=False)
    src = render_program([("k", ll.seq(ll.ZeroOut(o), ll.ForLoop(i, 0, 3, ll.Set(o, it(i), ll.Constant(1.0)))))],
                         syntax=syn).source
    assert 'extern "C" __global__ void k(float *__restrict__ o)' in src
    assert "memset" not in src and "#include" not in src
