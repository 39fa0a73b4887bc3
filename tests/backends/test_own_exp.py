"""einjit's own single-precision exp (`ir/own_exp.py`, rendered by `backends/c_math.py`):
accurate over the float range, the same bits vectorized and scalar in C, in NumPy and in the
interpreter, so results no longer depend on whether gcc vectorized a loop."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from einjit.backends import c_math
from einjit.backends.c_syntax import render_routine
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import run_once
from einjit.ir import interpret, ops, own_exp
from einjit.ir import low_level as ll
from einjit.ir.indexing import FixedIdx, Iterator, get_symbol
from einjit.ir.tnode import Tnode

STRIDE = 4099
"""Every 4099th float32 bit pattern: about a million inputs over every binade, both signs, NaNs."""

SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 88.72283, 88.72284, 89.0, 89.5, 1e30, -87.33655, -87.5,
                     -100.0, -103.27893, -103.97208, -103.97209, -104.0, -1e30, np.inf, -np.inf, np.nan,
                     1e-45, -1e-45, 1e-38, 3e-8, -3e-8], dtype=np.float32)
"""Overflow and underflow thresholds, the subnormal results' range, inf, NaN, tiny inputs."""


def _sampled() -> np.ndarray:
    return np.arange(0, 2**32, STRIDE, dtype=np.uint64).astype(np.uint32).view(np.float32)


def _around(*centers: float, width: int = 20000) -> np.ndarray:
    """Every float within `width` bit patterns of each center: the thresholds, densely."""
    bits = np.array(centers, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.concatenate([np.arange(b - width, b + width) for b in bits]).astype(np.int32).view(np.float32)


def _ulps(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|got - exp(x)| in float32 ulps of the correctly rounded result (2^-149 below the normals)."""
    ref = np.exp(x.astype(np.float64))
    _, e = np.frexp(ref.astype(np.float32).astype(np.float64))
    return np.abs(got.astype(np.float64) - ref) / np.ldexp(1.0, np.maximum(e - 24, -149))


def test_accuracy_over_the_float_range():
    """Within 1.02 ulp wherever exp is finite, normal in float32 (1.014 over all floats), within
    one unit of 2^-149 where it is subnormal (the float32 result rounds once more into their
    grid), and exact where it is 0 or inf: a sample of all floats, and every float around the
    overflow threshold, the smallest normal result and the underflow to zero."""
    x = np.concatenate([_sampled(), SPECIALS, _around(88.72283, -87.33655, -103.97208, 1e-38, -1e-38)])
    with np.errstate(all="ignore"):
        got = own_exp.expf(x)
        ref = np.exp(x.astype(np.float64)).astype(np.float32)
    finite = np.isfinite(ref) & (ref != 0)
    normal = finite & (ref >= np.finfo(np.float32).tiny)
    assert _ulps(got[normal], x[normal]).max() < 1.02
    assert _ulps(got[finite & ~normal], x[finite & ~normal]).max() < 1.0
    np.testing.assert_array_equal(got[~finite], ref[~finite])
    assert np.isnan(got[np.isnan(x)]).all()
    assert got[x == np.inf] == np.inf and got[x == -np.inf] == 0
    assert (got[(x > 88.72284) & ~np.isnan(x)] == np.inf).all()
    assert (got[x < -103.97209] == 0).all()
    tiny = (x > -103.97) & (x < -87.34)
    assert 0 < got[tiny].min() and got[tiny].max() < np.finfo(np.float32).tiny  # subnormal results


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_numpy_scalar_path_matches_the_array_path():
    """The interpreter computes cell by cell (`fma_scalar` in Python floats): the same bits."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.choice(_sampled(), 3000), SPECIALS])
    with np.errstate(all="ignore"):
        arrays = own_exp.expf(x)
    scalars = np.array([own_exp.expf(v) for v in x], dtype=np.float32)
    np.testing.assert_array_equal(scalars.view(np.uint32)[~np.isnan(x)], arrays.view(np.uint32)[~np.isnan(x)])
    assert np.isnan(scalars[np.isnan(x)]).all()


@pytest.mark.skipif(shutil.which(cc.CcOptions().compiler) is None, reason="needs the C compiler")
def test_vectorized_and_scalar_c_agree_with_numpy(tmp_path: Path):
    """`expf_check.c` runs the helper in a loop gcc vectorizes and in one it may not: no input
    of the sample differs, none is over 1.02 ulp off, and NumPy gives the vectorized bits."""
    header = tmp_path / "expf.h"
    header.write_text(c_math.HELPERS["expf"].format(q="static inline"))
    exe, out = tmp_path / "expf_check", tmp_path / "y.bin"
    flags = [f for f in cc.CcOptions().flags if f not in ("-fPIC", "-shared")]
    subprocess.run([cc.CcOptions().compiler, *flags, "-Wall", "-Werror", "-include", str(header),
                    str(Path(__file__).with_name("expf_check.c")), "-o", str(exe), "-lm"], check=True)
    report = subprocess.run([str(exe), str(STRIDE), str(out)], check=True, capture_output=True, text=True).stdout
    fields = report.split()
    assert fields[:4] == ["vector_differs", "0", "special_wrong", "0"], report
    assert float(fields[5]) < 1.02 and float(fields[7]) < 1.0, report
    with np.errstate(all="ignore"):
        expected = own_exp.expf(_sampled())
    np.testing.assert_array_equal(np.fromfile(out, dtype=np.uint32), expected.view(np.uint32))


def _exp_program(n: int, prec: ops.Prec) -> tuple[ll.LLStmt, Tnode, Tnode, Tnode]:
    """exp in a loop of `n` cells (vectorized, with a scalar tail) and of one fixed cell."""
    x, y, y0 = Tnode("x", (n,), prec), Tnode("y", (n,), prec), Tnode("y0", (1,), prec)
    i = get_symbol()
    code = ll.seq(ll.ForLoop(i, 0, n - 1, ll.Set(y, (Iterator(i),), ll.Unop(ops.Unop.EXP, ll.Get(x, (Iterator(i),))))),
                  ll.Set(y0, (FixedIdx(0),), ll.Unop(ops.Unop.EXP, ll.Get(x, (FixedIdx(n - 1),)))))
    return code, x, y, y0


@pytest.mark.parametrize("prec", [ops.single, ops.half], ids=lambda p: p.name)
def test_compiled_exp_matches_the_interpreter_bit_for_bit(prec):
    rng = np.random.default_rng(7)
    with np.errstate(over="ignore"):  # 1e30 is inf in half
        values = np.concatenate([SPECIALS, rng.uniform(-110, 95, 150), rng.standard_normal(27)]).astype(prec.dtype)
    code, x, y, y0 = _exp_program(len(values), prec)
    ctx = run_once(code, {x: values}, options=cc.CcOptions(threads=1))
    ref = interpret.run(code, {x: values.copy()})
    got = ctx.array(y)
    nan = np.isnan(values)
    np.testing.assert_array_equal(got[~nan].view(np.uint16 if prec is ops.half else np.uint32),
                                  ref[y][~nan].view(np.uint16 if prec is ops.half else np.uint32))
    assert np.isnan(got[nan]).all() and np.isnan(ref[y][nan]).all()
    assert ctx.array(y0)[0] == got[-1] == ref[y0][0]
    with np.errstate(all="ignore"):
        rounded = np.exp(values[~nan].astype(np.float64)).astype(prec.dtype)  # inf past the largest float
    eps, smallest = (2.0**-10, 2.0**-24) if prec is ops.half else (2.0**-23, 2.0**-149)
    np.testing.assert_allclose(got[~nan].astype(np.float64), rounded.astype(np.float64), rtol=eps, atol=smallest)


def test_rendering_uses_the_helper_in_single_and_half_only():
    for prec, own in ((ops.single, True), (ops.half, True), (ops.double, False)):
        rendered = render_routine("f", _exp_program(9, prec)[0])
        assert ("einjit_expf(" in rendered.code) == own and ("expf" in rendered.helpers) == own
    assert "exp(" in render_routine("f", _exp_program(9, ops.double)[0]).code
