"""The tanh GELU keeps its gate: the forward stores `sigmoid(2u)` once and the backward reads it,
so a training step evaluates `exp` once per element (it recomputed the gate before, the
backward's cost). The optimized step in C (AVX2 and AVX-512 machine settings, 1 and 2
threads) against the interpreter on the same code, bit for bit, and against PyTorch."""

from __future__ import annotations

import re

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.backends import c_syntax
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import run_once
from einjit.ir import assignments as asg
from einjit.ir import interpret
from einjit.ir.optimize import optimize_proc
from einjit.shape import finish_inference
from einjit.tensor import activations as act

ROWS, COLS = 6, 45
"""Enough cells for the scheduler's nests (and vector loops with tails), small enough for the
interpreter's cell-by-cell `exp`."""


def _step(seed: int):
    """The optimized training code of `sum(gelu_tanh(x) * r)`, the arrays it reads (x's value
    and r), x and r."""
    rng = np.random.default_rng(seed)
    v = (rng.standard_normal((ROWS, COLS)) * 3).astype(np.float32)
    v[0, :5] = [-1e4, -30.0, 0.0, 30.0, 1e4]
    r = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    x = ej.param(f"gx{seed}", values=v, output_dims=[ROWS, COLS])
    weights = ej.ndarray(r)
    loss = ej.sum(act.gelu(x, approximate="tanh") * weights)
    code = train.grad_update(loss)
    finish_inference()
    train.init_params(loss)
    arrays = {x.value_tn: v, weights.value_tn: r}
    return optimize_proc(asg.to_low_level(code), name=f"gelu_gate{seed}").llc, arrays, x, r


def test_the_step_evaluates_exp_once_per_element():
    llc, *_ = _step(seed=0)
    source = c_syntax.render_program([("gelu_gate", llc)]).source
    calls = re.findall(r"einjit_expf\((?!float)", source)
    assert len(calls) == 1


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("threads", [1, 2])
def test_gcc_matches_the_interpreter_and_torch(machine, threads, monkeypatch):
    monkeypatch.setenv("EINJIT_MACHINE", machine)
    llc, arrays, x, r = _step(seed=1)
    v = arrays[x.value_tn]
    want = interpret.run(llc, {tn: a.copy() for tn, a in arrays.items()})[x.grad_tn]
    ctx = run_once(llc, {tn: a.copy() for tn, a in arrays.items()}, name=f"gelu_gate_{machine}_{threads}",
                   options=cc.CcOptions(threads=threads))
    got = ctx.array(x.grad_tn)
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[0, [0, 1, 3, 4]], r[0, [0, 1, 3, 4]] * [0.0, 0.0, 1.0, 1.0])
    torch = pytest.importorskip("torch")
    tx = torch.tensor(v.astype(np.float64), requires_grad=True)
    (torch.nn.functional.gelu(tx, approximate="tanh") * torch.tensor(r.astype(np.float64))).sum().backward()
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-5, atol=2e-6)
