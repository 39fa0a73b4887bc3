"""Compilation mechanics: the on-disk cache, batch compilation, errors, debug output."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import FixedIdx, Iterator, get_symbol
from einjit.ir.tnode import Tnode


def fill_code(value: float, n: int = 4):
    out = Tnode("out", (n,))
    i = get_symbol()
    return ll.ForLoop(i, 0, n - 1, ll.Set(out, (Iterator(i),), ll.Constant(value))), out


def test_second_compilation_hits_the_cache():
    code, out = fill_code(1.25)
    before = cc.stats.compiler_invocations
    first = cc.compile_proc(code, name="fill")
    assert cc.stats.compiler_invocations == before + 1
    hits = cc.stats.cache_hits
    second = cc.compile_proc(code, name="fill")
    assert cc.stats.compiler_invocations == before + 1 and cc.stats.cache_hits == hits + 1
    assert first.so_path == second.so_path and first.so_path.exists()
    np.testing.assert_array_equal(run_once(code, name="fill").array(out), [1.25] * 4)


def test_different_flags_do_not_share_a_cache_entry():
    code, _ = fill_code(2.5)
    a = cc.compile_proc(code, name="fill")
    before = cc.stats.compiler_invocations
    b = cc.compile_proc(code, name="fill", options=cc.CcOptions(flags=("-O1", "-fPIC", "-shared")))
    assert cc.stats.compiler_invocations == before + 1 and a.so_path != b.so_path


def test_batch_compiles_many_routines_with_one_compiler_call():
    routines, outs = [], []
    for k in range(5):
        code, out = fill_code(float(k) + 0.5)
        routines.append((f"fill_{k}", code))
        outs.append(out)
    before = cc.stats.compiler_invocations
    procs = cc.compile_batch(routines)
    assert cc.stats.compiler_invocations == before + 1
    assert len({p.so_path for p in procs}) == 1 and [p.name for p in procs] == [n for n, _ in routines]
    backend = CcBackend()
    ctx = backend.init("batch", share_host_arrays=True)
    compiled = backend.compile_batch((), [c for _, c in routines], shared=True, names=[n for n, _ in routines])
    for routine in backend.link_batch(ctx, compiled):
        routine()
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(ctx.array(out), [k + 0.5] * 4)


def test_compiler_errors_show_diagnostics_and_the_kept_source():
    out = Tnode("out", (1,))
    bad = ll.seq(ll.StagedCompilation(lambda: "this is not C;"), ll.Set(out, (FixedIdx(0),), ll.Constant(1.0)))
    with pytest.raises(cc.CompileError) as info:
        cc.compile_proc(bad, name="broken")
    msg = str(info.value)
    first = msg.splitlines()[0]
    assert "failed" in first and "compiling broken" in first and "kept at" in first
    assert "error:" in msg, "gcc's diagnostics are part of the message"
    kept = Path(re.search(r"kept at (\S+\.c)", msg).group(1))
    assert kept.exists() and "this is not C;" in kept.read_text()
    code, target = fill_code(3.0)
    ctx = run_once(code, name="after_error")
    assert ctx.array(target)[0] == 3.0


def test_missing_compiler_is_named(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/gcc")
    code, _ = fill_code(4.0)
    with pytest.raises(cc.CompileError, match=r"'/nonexistent/gcc' not found.*\$CC is '/nonexistent/gcc'"):
        cc.compile_proc(code, name="nocc", options=cc.CcOptions())
    monkeypatch.delenv("CC")
    with pytest.raises(cc.CompileError, match="/nonexistent/gcc"):
        cc.compile_proc(code, name="nocc", options=cc.CcOptions(compiler="/nonexistent/gcc"))
    assert cc.compile_proc(code, name="nocc").so_path.exists()


def test_debug_levels(monkeypatch, tmp_path):
    log = tmp_path / "debug.log"
    monkeypatch.setenv("EINJIT_DEBUG_FILE", str(log))
    monkeypatch.setenv("EINJIT_DEBUG", "1")
    code, _ = fill_code(5.0)
    cc.compile_proc(code, name="dbg")
    text = log.read_text()
    assert re.search(r"dbg: compiled in [\d.]+ ms", text) and "#include" not in text
    monkeypatch.setenv("EINJIT_DEBUG", "3")
    proc = cc.compile_proc(code, name="dbg")
    text = log.read_text()
    assert "void dbg(" in text and "cache hit" in text
    assert proc.source_path is not None and proc.source_path.read_text() == proc.source
    code6, _ = fill_code(6.0)
    cc.compile_proc(code6, name="dbg")
    assert re.search(r"cc: \S*gcc .*-O2 .*-o \S+\.so \S+\.c", log.read_text())


def test_keep_source_option():
    code, _ = fill_code(7.0)
    assert cc.compile_proc(code, name="quiet").source_path is None
    kept = cc.compile_proc(code, name="quiet", options=cc.CcOptions(keep_source=True)).source_path
    assert kept is not None and kept.exists() and "void quiet(" in kept.read_text()


def test_routine_reuses_prepared_arguments():
    acc = Tnode("acc", (2,))
    i = get_symbol()
    code = ll.ForLoop(i, 0, 1, ll.Set(acc, (Iterator(i),), ll.Binop(ops.Binop.ADD, ll.Get(acc, (Iterator(i),)),
                                                                   ll.Constant(1.0))))
    backend = CcBackend()
    ctx = backend.init("count", share_host_arrays=True)
    ctx.array(acc)[...] = 0
    routine = backend.link(ctx, backend.compile((), code, shared=True, name="count"))
    for _ in range(10):
        routine()
    np.testing.assert_array_equal(ctx.array(acc), [10, 10])
    assert "count" in repr(routine)


def test_host_array_must_match_the_node():
    from einjit.ir import tnode
    y = Tnode("y", (2, 3), memory_mode=tnode.hosted())
    y.array = np.zeros((3, 2), dtype=np.float32).T
    with pytest.raises(ValueError, match="C-contiguous"):
        CcBackend().init("mismatch", share_host_arrays=True).array(y)
