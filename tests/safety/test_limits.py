"""Limits: loops and arrays past 32 bits get 64-bit indexing (no endless `int` loop), past 64
bits a named error before compiling; host arrays larger than the memory available fail with
an error naming the tensor and its size."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import memory, train
from einjit.backends import c_syntax
from einjit.backends.c_syntax import symbol_name
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_static_symbol, get_symbol
from einjit.ir.tnode import Tnode


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def test_sum_of_a_range_longer_than_int_terminates_with_the_right_value():
    """`sum(range(n))` with n just past 2**31 - 1 used to loop forever on an `int` counter."""
    n = 2**31 + 5
    s = ej.sum(ej.range(n))
    got = train.forward_once(s)
    np.testing.assert_allclose(got, [n * (n - 1) / 2], rtol=1e-6)


def test_long_loops_and_big_arrays_use_64_bit_indices():
    i = get_symbol()
    out = Tnode("acc", (1,), prec=ops.double)
    loop = ll.ForLoop(i, 0, 3_000_000_000 - 1, ll.Set(out, (ll_fixed0(),), ll.Constant(1.0)))
    text = c_syntax.render_routine("long_loop", loop).code
    assert f"for (long long {symbol_name(i)} = 0; {symbol_name(i)} < 3000000000;" in text
    small = ll.ForLoop(i, 0, 9, ll.Set(out, (ll_fixed0(),), ll.Constant(1.0)))
    assert f"for (int {symbol_name(i)} = 0;" in c_syntax.render_routine("short_loop", small).code


def test_static_symbols_are_widened_when_the_arrays_are_big():
    """`s * stride` must be computed in 64 bits: the `int` argument is copied into a `long long`."""
    big = Tnode("big", (3, 1_000_000_000), prec=ops.single)
    out = Tnode("row0", (1,), prec=ops.single)
    s = get_static_symbol(3, "b")
    code = ll.Set(out, (ll_fixed0(),), ll.Get(big, (Iterator(s.symbol), ll_fixed0())))
    text = c_syntax.render_routine("big_rows", code, (s,)).code
    name = symbol_name(s.symbol)
    assert f"int {name}_arg)" in text and f"  const long long {name} = {name}_arg;" in text
    assert f"{name} * 1000000000" in text


def test_past_64_bits_is_an_error_before_compiling():
    huge = Tnode("huge", (2**40, 2**40), prec=ops.single)
    i = get_symbol()
    code = ll.Set(huge, (ll_fixed0(), ll_fixed0()), ll.Constant(1.0))
    with pytest.raises(c_syntax.RenderError, match=r"huge.*1208925819614629174706176 cells, more than 64-bit"):
        c_syntax.render_routine("too_big", code)
    out = Tnode("o", (1,))
    loop = ll.ForLoop(i, 0, 2**64, ll.Set(out, (ll_fixed0(),), ll.Constant(1.0)))
    with pytest.raises(c_syntax.RenderError, match="longer than 64-bit indexing can count"):
        c_syntax.render_routine("too_long", loop)


def ll_fixed0():
    from einjit.ir.indexing import FixedIdx
    return FixedIdx(0)


def test_a_parameter_larger_than_memory_is_a_named_error():
    p = ej.param("enormous", output_dims=[10**7, 10**7], input_dims=[])
    want = r"parameter enormous with dims \(10000000, 10000000\) needs 727\.6 TiB"
    with pytest.raises(memory.AllocationError, match=want):
        train.init_params(p)
    assert ej.AllocationError is memory.AllocationError and issubclass(ej.AllocationError, ej.EinjitError)


def test_a_hosted_result_larger_than_memory_is_a_named_error(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 4096)
    x = ej.ndarray(np.ones(1000), label="ones")
    y = ej.mul(x, 2.0, label="doubled")
    with pytest.raises(memory.AllocationError, match=r"doubled.*\(1000,\) needs 7\.8 KiB of host memory, more than "
                                                     r"the 4\.0 KiB available"):
        train.forward_once(y)


def test_the_interpreter_allocates_through_the_same_check(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 100)
    out = Tnode("wide", (1000,), prec=ops.double)
    i = get_symbol()
    code = ll.ForLoop(i, 0, 999, ll.Set(out, (Iterator(i),), ll.Constant(1.0)))
    with pytest.raises(memory.AllocationError, match=r"wide.*needs 7\.8 KiB"):
        interpret.run(code)


def test_human_sizes():
    assert [memory.human(n) for n in (12, 2048, 5 * 2**30, 3 * 2**50)] == ["12 bytes", "2.0 KiB", "5.0 GiB",
                                                                           "3.0 PiB"]


def test_a_local_array_larger_than_memory_is_refused_before_compiling(monkeypatch):
    """A local too large for the stack is a scratch array allocated when the routine is linked;
    one that does not fit in memory is refused then, naming it, before gcc runs."""
    from einjit.ir import tnode
    big = Tnode("scratch", (64, 128), memory_mode=tnode.LOCAL)
    out = Tnode("out", (1,))
    i = get_symbol()
    code = ll.seq(ll.ForLoop(i, 0, 127, ll.Set(big, (ll_fixed0(), Iterator(i)), ll.Constant(1.0))),
                  ll.Set(out, (ll_fixed0(),), ll.Get(big, (ll_fixed0(), ll_fixed0()))))
    assert f"float *restrict {big.name}" in c_syntax.render_routine("fits", code).code.splitlines()[0]
    monkeypatch.setattr(memory, "available_bytes", lambda: 16 * 1024)
    backend = CcBackend()
    postponed = backend.compile((), code, name="too_big_local")
    runs = cc.stats.compiler_invocations
    with pytest.raises(memory.AllocationError, match=r"scratch arena of routine 'too_big_local' \(for scratch#\d+ "
                                                      r"\(64, 128\)\).* needs 32\.1 KiB"):
        backend.link(backend.init("limits"), postponed)
    assert cc.stats.compiler_invocations == runs
    monkeypatch.setenv("EINJIT_SCRATCH_PLAN", "0")                      # one array each: named the same way
    with pytest.raises(memory.AllocationError, match=r"scratch array of scratch.*\(64, 128\) needs 32\.0 KiB"):
        backend.link(backend.init("limits"), postponed)


def test_available_memory_is_read_once_for_many_arrays(monkeypatch):
    """Linking checks every array; a reading is reused for `_READ_AGAIN_AFTER` seconds, then read again."""
    reads = []
    monkeypatch.setattr(memory, "_read_available_bytes", lambda: reads.append(1) or 1 << 30)
    monkeypatch.setattr(memory, "_last_read", (-1.0, None))
    clock = [100.0]
    monkeypatch.setattr(memory.time, "monotonic", lambda: clock[0])
    for _ in range(200):
        memory.check_fits("w", (16, 16), np.float32)
    assert len(reads) == 1 and memory.available_bytes() == 1 << 30
    clock[0] += 2 * memory._READ_AGAIN_AFTER
    memory.available_bytes()
    assert len(reads) == 2
