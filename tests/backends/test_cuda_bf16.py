"""bf16 on the CUDA backend: cells are `__nv_bfloat16` (the host's 16 bits), loaded with
`__bfloat162float` and stored with `__float2bfloat16_rn`; the source compiles to PTX with nvcc
or NVRTC when one is present (no GPU needed), and the PTX converts with `cvt.rn.bf16.f32`."""

from __future__ import annotations

import pytest

from einjit.backends.gpu import cuda
from einjit.backends.gpu.cuda_syntax import render_program
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.tnode import Tnode


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def _have_compiler() -> bool:
    try:
        cuda._choose_compiler(cuda.CudaOptions())
    except cuda.CudaUnavailable:
        return False
    return True


def bf16_program():
    """`y = exp(x) + x` in bf16, a float matmul of bf16 operands, and `z = y * x` in float."""
    x, y, z = Tnode("x", (64,), ops.bf16), Tnode("y", (64,), ops.bf16), Tnode("z", (64,), ops.single)
    a, b, c = Tnode("a", (8, 16), ops.bf16), Tnode("b", (16, 4), ops.bf16), Tnode("c", (8, 4), ops.single)
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    expr = ll.Binop(ops.Binop.ADD, ll.Unop(ops.Unop.EXP, ll.Get(x, it(i))), ll.Get(x, it(i)))
    prod = ll.Binop(ops.Binop.MUL, ll.Get(y, it(i)), ll.Get(x, it(i)))
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, it(i, k)), ll.Get(b, it(k, j)), ll.Get(c, it(i, j)))
    return ll.seq(ll.ZeroOut(y), ll.ForLoop(i, 0, 63, ll.Set(y, it(i), expr)),
                  ll.ForLoop(i, 0, 63, ll.Set(z, it(i), prod)), ll.ZeroOut(c),
                  ll.ForLoop(i, 0, 7, ll.ForLoop(j, 0, 3, ll.ForLoop(k, 0, 15, ll.Set(c, it(i, j), fma)))))


def test_bf16_renders_as_nv_bfloat16():
    source = render_program([("bf16_kernel", bf16_program())]).source
    assert "#include <cuda_bf16.h>" in source
    assert "const __nv_bfloat16 *__restrict__ x" in source and "__nv_bfloat16 *__restrict__ y" in source
    assert "] = einjit_bf16_store(0.0f);" in source  # the zero fill of y
    assert "einjit_bf16_store((expf(einjit_bf16_load(x[" in source
    assert "unsigned short" not in source and "_mm512" not in source


@pytest.mark.skipif(not _have_compiler(), reason="neither nvcc nor NVRTC is present")
def test_bf16_kernel_compiles_to_ptx():
    source = render_program([("bf16_kernel", bf16_program())]).source
    ptx = cuda.compile_source(source, name="bf16_kernel", arch="compute_80", kind="ptx").decode()
    assert ".entry bf16_kernel(" in ptx
    assert "cvt.rn.bf16.f32" in ptx
