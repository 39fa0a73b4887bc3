"""Transposing copies in 8x8 vector blocks (`backends/c_transpose.py`): the panel packs of a
contraction whose column operand runs along the summed axis (the attention's `q kᵀ`, a layer's
`w @ x`) render as `einjit_transpose_f32x8` calls, copy every bit (NaN payloads, signed
zeros), leave the nests they do not fit to the plain loops, and an attention layer
gives the same bits with them as without them (AVX2 and AVX-512 register blocks, one and two
threads, causal and not, an odd sequence length)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.backends import c_transpose
from einjit.backends.c_syntax import C_SYNTAX
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import assignments as asg
from einjit.ir import interpret
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol, make_affine
from einjit.ir.optimize import optimize_proc
from einjit.ir.tnode import Tnode
from einjit.nn.attention import MultiHeadAttention
from einjit.shape import finish_inference

PLAIN = cc.CcOptions(syntax=dataclasses.replace(C_SYNTAX, vector_transpose=False))


def _pack(rows: int, width: int, depth: int, panels: int = 2, dst_rows: int | None = None):
    """`pack[jp, i, jr] = src[width*jp + jr, i]` (panels of `width` rows of `src`, each stored
    transposed, `dst_rows` apart along `i`: the panel's width unless given)."""
    src = Tnode("src", (rows, depth))
    pack = Tnode("pack", (panels, depth, dst_rows or width))
    jp, jr, i = get_symbol("jp"), get_symbol("jr"), get_symbol("i")
    st = ll.Set(pack, (Iterator(jp), Iterator(i), Iterator(jr)),
                ll.Get(src, (make_affine([(width, jp), (1, jr)]), Iterator(i))), "pack a panel")
    return src, pack, ll.ForLoop(jp, 0, panels - 1, ll.ForLoop(jr, 0, width - 1, ll.ForLoop(i, 0, depth - 1, st)))


def _special_values(shape) -> np.ndarray:
    """Random floats with NaNs of distinct payloads, infinities, signed zeros and subnormals."""
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1).view(np.uint32)
    flat[3], flat[10], flat[17] = 0x7FC00001, 0xFFC12345, 0x7F800000
    flat[5], flat[12], flat[20] = 0x80000000, 0x00000001, 0x807FFFFF
    return x


@pytest.mark.parametrize("width,depth,blocks", [(16, 40, True), (8, 8, True), (12, 40, False), (16, 20, False)])
def test_panel_pack_copies_every_bit(width, depth, blocks, tmp_path, monkeypatch):
    """Whole blocks (16 x 40, 8 x 8) become the block copy; a width or a depth that is not a
    multiple of 8 stays the plain loop. Both give the transposed bits, under gcc and the
    interpreter."""
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    src, pack, code = _pack(2 * width, width, depth)
    x = _special_values((2 * width, depth))
    want = x.reshape(2, width, depth).transpose(0, 2, 1)
    name = f"pack_{width}x{depth}"
    got = run_once(code, {src: x}, name=name, context=CcBackend().init(name)).array(pack)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(interpret.run(code, {src: x.copy()})[pack].view(np.uint32), want.view(np.uint32))
    source = (tmp_path / f"{name}.c").read_text()
    assert ("einjit_transpose_f32x8(&pack[" in source) is blocks


def test_only_copies_into_distinct_cells_are_blocks():
    """A copy whose destination rows overlap (8 apart for 16 source rows: later cells overwrite
    earlier ones, in the loops' order), a computed value, a copy in double precision, a
    clipped loop: none is a block copy."""
    _, _, overlapping = _pack(32, 16, 16, dst_rows=8)
    assert c_transpose.kernel(overlapping.body) is None
    _, _, fits = _pack(32, 16, 16)
    inner = fits.body
    assert c_transpose.kernel(inner) is not None
    st = inner.body.body
    doubled = dataclasses.replace(st, llsc=ll.Binop(ll.ops.Binop.MUL, st.llsc, ll.Constant(2.0)))
    assert c_transpose.kernel(dataclasses.replace(inner, body=dataclasses.replace(inner.body, body=doubled))) is None
    wide = Tnode("wide", st.tn.dims, ll.ops.double)
    as_double = dataclasses.replace(st, tn=wide)
    assert c_transpose.kernel(dataclasses.replace(inner, body=dataclasses.replace(inner.body, body=as_double))) is None
    clipped = dataclasses.replace(inner, stop=ll.LoopClip(make_affine([], 8), 1))
    assert c_transpose.kernel(clipped) is None


def _attention(causal: bool, seq: int):
    """An attention layer's unoptimized forward code (32 features in 2 heads of 16: whole blocks
    in the packed panels of `q kᵀ`), the values of its parameters and its output's node."""
    rng = np.random.default_rng(5)
    layer = MultiHeadAttention(32, 2, causal=causal, label="mha")
    out = layer(ej.ndarray(rng.standard_normal((2, seq, 32)).astype(np.float32), batch_axes=2, label="x"))
    train.init_params(out, seed=2)
    code = train.forward(out)
    finish_inference()
    params = {p.value_tn: p.value.numpy().astype(np.float32) for p in layer.params()}
    return asg.to_low_level(code), params, out.value_tn


@pytest.mark.parametrize("machine,threads,causal", [("avx2", 1, True), ("avx512", 2, False)])
def test_attention_is_the_same_with_block_packs(machine, threads, causal, tmp_path, monkeypatch):
    """The optimized forward (T = 37: full 16-key panels and a tail) under gcc with the block
    copies and with the plain loops: the same bits (the copy is the renderer's: the interpreter
    runs the loops, `test_panel_pack_copies_every_bit`; the attention's values against PyTorch
    are `tests/ir/test_causal_clip.py`'s)."""
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    monkeypatch.setenv("EINJIT_DUMP_DIR", str(tmp_path))
    llc, params, out = _attention(causal, 37)
    opt = optimize_proc(llc, name="mha")
    name = f"mha_{machine}_{threads}_{int(causal)}"
    runs = {}
    for label, options in (("blocks", cc.CcOptions(threads=threads)),
                           ("plain", dataclasses.replace(PLAIN, threads=threads))):
        ctx = run_once(opt.llc, params, name=f"{name}_{label}", options=options,
                       context=CcBackend(options).init(f"{name}_{label}"))
        runs[label] = ctx.array(out).copy()
    assert "einjit_transpose_f32x8(&" in (tmp_path / f"{name}_blocks.c").read_text()
    assert "einjit_transpose_f32x8(&" not in (tmp_path / f"{name}_plain.c").read_text()
    assert np.abs(runs["plain"]).max() > 0.1
    np.testing.assert_array_equal(runs["blocks"].view(np.uint32), runs["plain"].view(np.uint32))
