"""The CUDA backend without a GPU: the grid mapping (which loops the threads share, where the
grid synchronizes, which nodes stay per-thread), the rendered source, compilation with nvcc
or NVRTC, golden output, and the errors that need no device."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import backend_programs as bp
from einjit.backends.c_syntax import RenderError
from einjit.backends.cc.backend import CcBackend
from einjit.backends.gpu import cuda
from einjit.backends.gpu.cuda_syntax import render_program
from einjit.backends.gpu.plan import PRIVATE_LIMIT_BYTES, plan_kernel
from einjit.backends.interface import CudaMemClass, WrongBackendError, low_level_of, lower_assignments
from einjit.ir import interpret, ops, tnode
from einjit.ir import low_level as ll
from einjit.ir.indexing import Affine, FixedIdx, Iterator, get_static_symbol, get_symbol, subst_index
from einjit.ir.tnode import Tnode

B, U = ll.Binop, ll.Unop
GOLDEN = Path(__file__).parent / "golden"


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def have_compiler() -> str | None:
    try:
        return cuda._choose_compiler(cuda.CudaOptions())
    except cuda.CudaUnavailable:
        return None


needs_compiler = pytest.mark.skipif(have_compiler() is None, reason="neither nvcc nor NVRTC is present")


def chain_symbols(plan):
    return [tuple(lp.index for lp in seg.parallel) for seg in plan.segments if seg.is_work]


# ---------------------------------------------------------------- the grid mapping


def test_matmul_shares_the_output_loops_and_keeps_the_reduction_in_a_thread():
    prog = bp.matmul_low_level()
    plan = plan_kernel("mm", prog.code)
    zero, acc = plan.segments
    i_loop = acc.stmt
    j_loop = i_loop.body
    assert [lp.index for lp in acc.parallel] == [i_loop.index, j_loop.index]
    assert len(zero.parallel) == 2 and plan.barriers == {1} and plan.grid_sync
    assert plan.work_items == 13 * 20 and plan.launch_shape() == (2, 256)
    assert all(c is CudaMemClass.GLOBAL for c in plan.mem_classes.values())


def test_parallel_loops_below_summed_ones_move_outermost():
    """The weight gradient's batch loop and the product's `k` move inside the output loops: all
    `6 * 11` cells on threads, not the whole gradient on one thread (an MLP step on the GPU
    took seconds so); each cell still sums in the original order (`bp.ALL` runs it)."""
    prog = bp.summed_outer_loops()
    plan = plan_kernel("summed", prog.code)
    _, grad, _, prod = ll.flatten(prog.code)
    b, i, j = grad.index, grad.body.index, grad.body.body.index
    i2, k, j2 = prod.index, prod.body.index, prod.body.body.index
    assert chain_symbols(plan)[1::2] == [(i, j), (i2, j2)]
    moved = [seg.stmt for seg in plan.segments if seg.is_work][1::2]
    assert [s.body.body.index for s in moved] == [b, k] and plan.work_items == 6 * 11
    mm = bp.matmul_low_level().code
    assert plan_kernel("mm", mm).segments[1].stmt is list(ll.flatten(mm))[1], "a nest in order is kept as it is"


def test_reductions_into_one_cell_run_on_one_thread():
    a, total = Tnode("a", (50,)), Tnode("total", (1,))
    i = get_symbol()
    code = ll.ForLoop(i, 0, 49, ll.Set(total, (FixedIdx(0),), B(ops.Binop.ADD, ll.Get(total, (FixedIdx(0),)),
                                                               ll.Get(a, it(i)))))
    plan = plan_kernel("sum", code)
    assert chain_symbols(plan) == [()] and plan.launch_shape() == (1, 32)
    source = render_program([("sum", code)]).source
    assert "if (EINJIT_TID == 0) {" in source and "einjit_grid_sync" not in source


@pytest.mark.parametrize("shape", ["shift", "mirror", "partial_axis"])
def test_loops_with_dependences_between_iterations_are_not_shared(shape):
    n = 8
    a, b = Tnode("a", (n,)), Tnode("b", (n, 2))
    i = get_symbol()
    match shape:
        case "shift":
            body = ll.Set(a, (Affine(((1, i),), 1),), B(ops.Binop.ADD, ll.Get(a, it(i)), ll.Constant(1.0)))
            code = ll.ForLoop(i, 0, n - 2, body)
        case "mirror":
            code = ll.ForLoop(i, 0, n - 1, ll.Set(a, it(i), ll.Get(a, (Affine(((-1, i),), n - 1),))))
        case "partial_axis":
            code = ll.ForLoop(i, 0, n - 1, ll.seq(ll.Set(b, (Iterator(i), FixedIdx(0)), ll.Constant(1.0)),
                                                  ll.Set(b, (FixedIdx(0), FixedIdx(1)), ll.Get(b, (Iterator(i),
                                                                                                  FixedIdx(0))))))
    assert chain_symbols(plan_kernel("dep", code)) == [()]


def test_transposition_and_independent_segments_need_no_barrier():
    a, t, u = Tnode("a", (6, 9)), Tnode("t", (9, 6)), Tnode("u", (6, 9))
    i, j, k, m = (get_symbol() for _ in range(4))
    code = ll.seq(ll.ForLoop(i, 0, 5, ll.ForLoop(j, 0, 8, ll.Set(t, it(j, i), ll.Get(a, it(i, j))))),
                  ll.ForLoop(k, 0, 5, ll.ForLoop(m, 0, 8, ll.Set(u, it(k, m), U(ops.Unop.EXP, ll.Get(a, it(k, m)))))))
    plan = plan_kernel("two", code)
    assert chain_symbols(plan) == [(i, j), (k, m)] and not plan.barriers
    assert "cooperative_groups" not in render_program([("two", code)]).source


def test_backend_staged_code_is_fenced_by_barriers():
    a, b = Tnode("a", (4,)), Tnode("b", (4,))
    i, j = get_symbol(), get_symbol()
    staged = ll.StagedCompilation(lambda: "/* opaque */")
    code = ll.seq(ll.ForLoop(i, 0, 3, ll.Set(a, it(i), ll.Constant(1.0))), staged,
                  ll.ForLoop(j, 0, 3, ll.Set(b, it(j), ll.Constant(2.0))))
    plan = plan_kernel("staged", code)
    assert plan.barriers == {1, 2} and chain_symbols(plan) == [(i,), (), (j,)]
    assert "/* opaque */" in render_program([("staged", code)]).source


def private_local_program(read_first: bool = False, size: int = 7):
    """out[i] = sum_k 2 * a[i, k], through a Local scratch row h."""
    a, out = Tnode("a", (5, size)), Tnode("out", (5,))
    h = Tnode("h", (size,), memory_mode=tnode.LOCAL)
    i, k, k2 = get_symbol(), get_symbol(), get_symbol()
    fill = ll.ForLoop(k, 0, size - 1, ll.Set(h, it(k), B(ops.Binop.MUL, ll.Get(a, it(i, k)), ll.Constant(2.0))))
    acc = ll.ForLoop(k2, 0, size - 1, ll.Set(out, it(i), B(ops.Binop.ADD, ll.Get(out, it(i)), ll.Get(h, it(k2)))))
    body = ll.seq(acc, fill) if read_first else ll.seq(fill, acc)
    return ll.seq(ll.ZeroOut(out), ll.ForLoop(i, 0, 4, body)), a, out, h


def test_a_local_node_of_one_segment_is_a_per_thread_array():
    code, a, out, h = private_local_program()
    plan = plan_kernel("rows", code)
    assert plan.mem_classes[h] is CudaMemClass.LOCAL_ONLY and plan.mem_classes[out] is CudaMemClass.GLOBAL
    assert [len(c) for c in chain_symbols(plan)] == [1, 1]
    kernel = render_program([("rows", code)]).kernels[0].rendered
    assert h in kernel.local_nodes and all(p.tn is not h for p in kernel.params)
    assert "\n  float h[7] = {0};" in kernel.code


def test_a_local_node_read_before_written_keeps_the_loop_sequential():
    code, a, out, h = private_local_program(read_first=True)
    assert [len(c) for c in chain_symbols(plan_kernel("rows", code))] == [1, 0]


def test_large_or_shared_local_nodes_live_in_global_memory():
    big = PRIVATE_LIMIT_BYTES // 4 + 1
    code, a, out, h = private_local_program(size=big)
    plan = plan_kernel("big", code)
    assert plan.mem_classes[h] is CudaMemClass.GLOBAL and [len(c) for c in chain_symbols(plan)] == [1, 0]
    prog = bp.local_only_node()
    h2 = next(tn for tn in ll.nodes_of(prog.code) if tn.is_local())
    plan2 = plan_kernel("spans", prog.code)
    assert plan2.mem_classes[h2] is CudaMemClass.GLOBAL and plan2.barriers == {1}
    assert any(p.tn is h2 for p in render_program([("spans", prog.code)]).kernels[0].rendered.params)


# ---------------------------------------------------------------- the plan, simulated on the interpreter


def _subst_scalar(sc, env):
    match sc:
        case ll.Get(tn, idcs):
            return ll.Get(tn, tuple(subst_index(env, i) for i in idcs))
        case ll.GetMergeBuffer(tn, idcs):
            return ll.GetMergeBuffer(tn, tuple(subst_index(env, i) for i in idcs))
        case ll.EmbedIndex(idx):
            return ll.EmbedIndex(subst_index(env, idx))
        case ll.LocalScope(sid, body, orig):
            return ll.LocalScope(sid, _subst(body, env), orig)
        case ll.Unop(op, x):
            return ll.Unop(op, _subst_scalar(x, env))
        case ll.Binop(op, x, y):
            return ll.Binop(op, _subst_scalar(x, env), _subst_scalar(y, env))
        case ll.Ternop(op, x, y, z):
            return ll.Ternop(op, *(_subst_scalar(v, env) for v in (x, y, z)))
    return sc


def _subst(stmt, env):
    match stmt:
        case ll.Seq(a, b):
            return ll.Seq(_subst(a, env), _subst(b, env))
        case ll.ForLoop():
            return dataclasses.replace(stmt, body=_subst(stmt.body, env))
        case ll.Set(tn, idcs, sc, debug):
            return ll.Set(tn, tuple(subst_index(env, i) for i in idcs), _subst_scalar(sc, env), debug)
        case ll.SetFromVec(tn, idcs, n, op, arg, debug):
            return ll.SetFromVec(tn, tuple(subst_index(env, i) for i in idcs), n, op, _subst_scalar(arg, env), debug)
        case ll.SetLocal(sid, value):
            return ll.SetLocal(sid, _subst_scalar(value, env))
    return stmt


def reversed_threads(plan):
    """The kernel's segments with every shared loop run backwards: if the plan's claim that
    their iterations are independent is wrong, results change."""
    stmts = []
    for seg in plan.segments:
        env = {lp.index: Affine(((-1, lp.index),), lp.from_ + lp.to_) for lp in seg.parallel}
        stmts.append(_subst(seg.stmt, env))
    return ll.seq(*stmts)


@pytest.mark.parametrize("name", sorted(bp.ALL))
def test_shared_loops_are_order_independent(name):
    prog = bp.ALL[name]()
    code = prog.code
    lowered = lower_assignments(prog.statics, code)[1] if not isinstance(code, ll.LLStmt) else code
    llc = low_level_of(lowered)
    plan = plan_kernel(name, llc)
    assert any(seg.parallel for seg in plan.segments)
    env = {s.symbol: v for s, v in prog.bindings.items()}

    def run(c):
        arrays = {tn: np.array(v, dtype=tn.prec.dtype) for tn, v in prog.inputs.items()}
        return interpret.run(c, arrays, env)

    straight, backwards = run(llc), run(reversed_threads(plan))
    for tn in prog.outputs:
        np.testing.assert_array_equal(backwards[tn], straight[tn], err_msg=tn.debug_name())
        np.testing.assert_allclose(straight[tn], prog.expected[tn], rtol=prog.rtol, atol=prog.rtol)


def test_the_private_local_program_is_order_independent():
    code, a, out, h = private_local_program()
    plan = plan_kernel("rows", code)
    av = np.arange(35, dtype=np.float32).reshape(5, 7)
    got = interpret.run(reversed_threads(plan), {a: av.copy()})[out]
    np.testing.assert_array_equal(got, 2 * av.sum(axis=1))


# ---------------------------------------------------------------- the rendered source


def test_kernel_source_shape():
    prog = bp.matmul_low_level()
    source = render_program([("mm", prog.code)]).source
    assert source.startswith("/* Generated by einjit: CUDA backend. */\n#include <cooperative_groups.h>\n")
    assert 'extern "C" __global__ void mm(const float *__restrict__ a, ' in source
    assert source.count("einjit_grid_sync();") == 1 and "memset" not in source
    assert re.search(r"for \(long long g_(\w+) = EINJIT_TID; g_\1 < 260LL; g_\1 \+= EINJIT_NTHREADS\) "
                     r"\{ const int \1 = \(int\)\(g_\1 / 20\);", source)
    assert "#define EINJIT_CLAMP" in source


def test_half_precision_is_refused_clearly():
    h = Tnode("h", (4,), ops.half)
    i = get_symbol()
    with pytest.raises(RenderError, match=r"CUDA backend does not support half precision yet \(h#\d+ is half\)"):
        render_program([("fill_half", ll.ForLoop(i, 0, 3, ll.Set(h, it(i), ll.Constant(1.0))))])


def golden_program():
    """A batch row through a layer with a per-thread scratch row, a ReLU, and a grand total."""
    data, w = Tnode("data", (4, 3)), Tnode("w", (3, 2))
    x, y, total = Tnode("x", (3,)), Tnode("y", (2,)), Tnode("total", (1,))
    h = Tnode("h", (3,), memory_mode=tnode.LOCAL)
    s = get_static_symbol(4)
    i, j, k, m = get_symbol(), get_symbol(), get_symbol(), get_symbol()
    code = ll.seq(
        ll.Comment("x := data[s]"),
        ll.ForLoop(i, 0, 2, ll.Set(x, it(i), ll.Get(data, (Iterator(s.symbol), Iterator(i))))),
        ll.ForLoop(j, 0, 1, ll.seq(
            ll.ForLoop(k, 0, 2, ll.Set(h, it(k), B(ops.Binop.MUL, ll.Get(x, it(k)), ll.Get(w, it(k, j))))),
            ll.Set(y, it(j), U(ops.Unop.RELU, B(ops.Binop.ADD, B(ops.Binop.ADD, ll.Get(h, (FixedIdx(0),)), ll.Get(
                h, (FixedIdx(1),))), B(ops.Binop.ADD, ll.Get(h, (FixedIdx(2),)), ll.GetMergeBuffer(y, it(j)))))))),
        ll.ZeroOut(total),
        ll.ForLoop(m, 0, 1, ll.Set(total, (FixedIdx(0),), B(ops.Binop.ADD, ll.Get(total, (FixedIdx(0),)),
                                                           ll.Get(y, it(m))))))
    return code, s


def test_golden_small_program():
    code, s = golden_program()
    text = render_program([("layer", code)], (s,)).source
    path = GOLDEN / "cuda_small_program.cu"
    if os.environ.get("EINJIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with EINJIT_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text()


# ---------------------------------------------------------------- compiling


def all_ops_program():
    """Every scalar operation in float, double and the integer precisions."""
    stmts = []
    i = get_symbol()
    for prec in (ops.single, ops.double, ops.byte, ops.int32, ops.int64):
        x, y = Tnode("x", (8,), prec), Tnode("y", (8,), prec)
        gx, gy = ll.Get(x, it(i)), ll.Get(y, it(i))
        exprs = [U(op, gx) for op in ops.Unop] + [B(op, gx, gy) for op in ops.Binop]
        exprs += [ll.Ternop(op, gx, gy, ll.Constant(1.5)) for op in ops.Ternop]
        stmts += [ll.Set(Tnode(f"r{k}", (8,), prec), it(i), e) for k, e in enumerate(exprs)]
    return ll.ForLoop(i, 0, 7, ll.seq(*stmts))


def batch_of_everything():
    routines, statics = [("all_ops", all_ops_program())], []
    for name in sorted(bp.ALL):
        prog = bp.ALL[name]()
        code = prog.code if isinstance(prog.code, ll.LLStmt) else lower_assignments(prog.statics, prog.code)[1]
        routines.append((name, code))
        statics += prog.statics
    golden, s = golden_program()
    return routines + [("layer", golden)], statics + [s]


@needs_compiler
@pytest.mark.parametrize("arch,kind", [("compute_75", "ptx"), ("sm_90", "cubin")])
def test_every_program_compiles_in_one_batch(arch, kind):
    routines, statics = batch_of_everything()
    before = cuda.stats.compiler_invocations
    procs = cuda.compile_program(routines, statics, arch=arch, kind=kind)
    assert cuda.stats.compiler_invocations == before + 1
    assert [p.name for p in procs] == [n for n, _ in routines] and len({id(p.image) for p in procs}) == 1
    data = procs[0].image.data
    if kind == "ptx":
        text = data.decode()
        assert all(f".entry {n}(" in text for n, _ in routines)
        assert f".target {arch.replace('compute', 'sm')}" in text
    else:
        assert data[:4] == b"\x7fELF"


@needs_compiler
def test_backend_compiles_shared_code_to_ptx_without_a_device():
    backend = cuda.CudaBackend(cuda.CudaOptions(ptx_arch="compute_80"))
    prog = bp.mlp_step()
    before, hits = cuda.stats.compiler_invocations, cuda.stats.cache_hits
    code = backend.compile(prog.statics, prog.code, shared=True, name="mlp")
    assert code.backend == "cuda" and code.procedure.image.kind == "ptx" and code.procedure.image.arch == "compute_80"
    assert cuda.stats.compiler_invocations == before + 1
    assert code.inputs == set(prog.inputs)
    cuda.compile_source(code.procedure.image.source, name="again", arch="compute_80", kind="ptx",
                        options=backend.core.options)
    assert cuda.stats.compiler_invocations == before + 1 and cuda.stats.cache_hits == hits + 1
    assert {tn.label[0]: c for tn, c in code.procedure.mem_classes.items()}["y"] is CudaMemClass.GLOBAL
    cpu = CcBackend()
    with pytest.raises(WrongBackendError, match="compiled by backend 'cuda'"):
        cpu.link(cpu.init("cpu"), code)


@needs_compiler
def test_compiler_errors_show_the_kept_source():
    with pytest.raises(cuda.CudaError, match=r"(?s)(nvcc|NVRTC) failed .*kept at .*\.cu"):
        cuda.compile_source("this is not CUDA;", name="broken", arch="compute_75", kind="ptx")


def test_unknown_compiler_and_image_kind_are_errors():
    with pytest.raises(ValueError, match="CudaOptions.compiler must be"):
        cuda.compile_source("", name="x", arch="sm_80", kind="ptx", options=cuda.CudaOptions(compiler="clang"))
    with pytest.raises(ValueError, match="'ptx' or 'cubin'"):
        cuda.compile_source("", name="x", arch="sm_80", kind="fatbin")


@pytest.mark.skipif(cuda.device_count() > 0, reason="a CUDA device is present")
def test_without_a_gpu_device_calls_fail_clearly():
    backend = cuda.CudaBackend()
    with pytest.raises((cuda.CudaUnavailable, cuda.CudaError), match="libcuda|CUDA"):
        backend.get_device(0)


def _compiler_available(which: str) -> bool:
    if which == "nvcc":
        return shutil.which("nvcc") is not None
    from einjit.backends.gpu.cuda_driver import load_nvrtc
    return load_nvrtc() is not None


@pytest.mark.parametrize("which", ["nvcc", "nvrtc"])
def test_each_compiler_compiles_the_whole_batch(which):
    if not _compiler_available(which):
        pytest.skip(f"{which} is not installed here")
    routines, statics = batch_of_everything()
    procs = cuda.compile_program(routines, statics, arch="compute_80", kind="ptx",
                                 options=cuda.CudaOptions(compiler=which, keep_source=False))
    text = procs[0].image.data.decode()
    assert all(f".entry {n}(" in text for n, _ in routines)
