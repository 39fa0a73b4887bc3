"""GELU as `x * gate(x)` with the gate stored between the forward and the backprop
(`tensor/activations.py`): the training step evaluates the gate's `exp` (or `erf`) once per
element, a forward-only routine inlines the gate, and the values are those of the formulation
that recomputes the gate in the backprop, bit for bit, under gcc at one and two threads and
under the interpreter."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import einjit as ej
from einjit import nn, train
from einjit.backends import c_syntax
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.backends.interface import low_level_of, lower_assignments
from einjit.ir import interpret
from einjit.ir import low_level as ll
from einjit.tensor.notation import Template, make_op

_C = -2 * math.sqrt(2.0 / math.pi)
_SIGMOID = f"recip(1 + exp({_C!r} * (t1 + 0.044715 * (t1 * t1 * t1))))"
_RECOMPUTED = {
    "tanh": (Template(f"t =: t1 * {_SIGMOID}"),
             Template(f"g1 =+ g * ({_SIGMOID} + t1 * {_SIGMOID} * (1 - {_SIGMOID}) * {-_C!r} * "
                      f"(1 + {3 * 0.044715!r} * (t1 * t1)))")),
    "none": (Template(f"t =: t1 * (0.5 + 0.5 * erf({1 / math.sqrt(2.0)!r} * t1))"),
             Template(f"g1 =+ g * ((0.5 + 0.5 * erf({1 / math.sqrt(2.0)!r} * t1)) "
                      f"+ t1 * ({1 / math.sqrt(2.0 * math.pi)!r} * exp(-0.5 * (t1 * t1))))")),
}
"""GELU as it was before the gate became a tensor: one operation whose backprop evaluates the
gate again (gcc merges the repeated gate of the tanh form into one evaluation)."""


def _recomputing_gelu(x, approximate: str):
    fwd, bwd = _RECOMPUTED[approximate]
    return make_op("gelu", [x], logic=None, forward=fwd, backprop=bwd)


def _mlp(tag: str, gelu, seed: int = 0):
    """`sum(r * gelu(fc(x)))`, the GELU's inputs of either sign, a few units large (`x`
    scaled by 2)."""
    rng = np.random.default_rng(seed)
    fc = nn.Linear(16, 64, label=f"{tag}_fc")
    x = ej.ndarray((rng.standard_normal((24, 16)) * 2).astype(np.float32), batch_axes=1, label=f"{tag}_x")
    r = ej.ndarray(rng.standard_normal((24, 64)).astype(np.float32), batch_axes=1, label=f"{tag}_r")
    loss = ej.sum(gelu(fc(x)) * r, label=f"{tag}_loss")
    train.init_params(loss, seed=seed)
    return loss, fc


def _c_of(code, name: str) -> str:
    _, optimized = lower_assignments((), code, name)
    return c_syntax.render_program([(name, optimized.llc)]).source


def _calls(src: str, fn: str) -> int:
    """How many times the generated code calls `fn` (its definition in the prelude aside)."""
    return len(re.findall(rf"(?<![\w]){fn}\((?!float x\))", src))


@pytest.mark.parametrize("approximate,gate_fn", [("tanh", "einjit_expf"), ("none", "erff")])
def test_the_training_step_evaluates_the_gate_once_per_element(approximate, gate_fn):
    """One call of the gate's function in the whole step, in the nest that stores the gate;
    the erf form's backprop keeps one `exp` (the normal density), the tanh form's none."""
    loss, _ = _mlp(f"once_{approximate}", lambda h: ej.gelu(h, approximate))
    src = _c_of(train.grad_update(loss), f"once_{approximate}")
    gate_lines = [line for line in src.splitlines() if f"{gate_fn}(" in line and "gelu_gate[" in line]
    assert _calls(src, gate_fn) == 1 and len(gate_lines) == 1
    assert re.search(r"gelu_gate\[[^]]*\] = ", gate_lines[0])
    assert _calls(src, "einjit_expf") == 1


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_a_forward_routine_inlines_the_gate(approximate):
    """Read once, by the GELU, the gate is virtual: nothing stored beyond the result."""
    loss, _ = _mlp(f"fwd_{approximate}", lambda h: ej.gelu(h, approximate))
    src = _c_of(train.forward_code(loss), f"fwd_{approximate}")
    assert "gelu_gate[" not in src and "gelu[" not in src
    assert _calls(src, "einjit_expf" if approximate == "tanh" else "erff") == 1


def _trained(tag: str, gelu, threads: int):
    loss, fc = _mlp(tag, gelu)
    train.to_routine(train.grad_update(loss), name=tag, options=cc.CcOptions(threads=threads))()
    return [loss.value.numpy().copy()] + [p.grad.numpy().copy() for p in fc.params()]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_the_stored_gate_gives_the_recomputed_values_bit_for_bit(approximate, threads):
    stored = _trained(f"stored_{approximate}{threads}", lambda h: ej.gelu(h, approximate), threads)
    again = _trained(f"again_{approximate}{threads}", lambda h: _recomputing_gelu(h, approximate), threads)
    for got, want in zip(stored, again, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_compiled_step_matches_the_interpreter_bit_for_bit():
    """The tanh form (`exp` is einjit's own, the same float32 steps in C and NumPy; C's `erff`
    and NumPy's `erf` may differ in the last bit)."""
    loss, fc = _mlp("interp", lambda h: ej.gelu(h, "tanh"))
    _, lowered = lower_assignments((), train.grad_update(loss), "interp")
    llc = low_level_of(lowered)
    hosted = {tn: tn.array.copy() for tn in ll.nodes_of(llc) if tn.array is not None}
    want = interpret.run(llc, {tn: a.copy() for tn, a in hosted.items()})
    ctx = run_once(llc, hosted, name="interp", context=CcBackend().init("interp"))
    checked = [tn for t in loss.subtree() for tn in (t.value_tn, t.grad_tn) if tn in want and not tn.is_virtual()]
    assert {p.grad_tn for p in fc.params()} <= set(checked)
    assert any("gelu_gate" in tn.debug_name() for tn in ll.nodes_of(llc))
    for tn in checked:
        np.testing.assert_array_equal(ctx.array(tn), want[tn], err_msg=tn.debug_name())


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_values_and_gradients_match_torch_in_single_precision(approximate):
    torch = pytest.importorskip("torch")
    loss, fc = _mlp(f"torch_{approximate}", lambda h: ej.gelu(h, approximate), seed=5)
    train.to_routine(train.grad_update(loss), name=f"torch_{approximate}")()
    w, b = (torch.tensor(p.value.numpy().astype(np.float64), requires_grad=True) for p in fc.params())
    rng = np.random.default_rng(5)
    x = torch.tensor((rng.standard_normal((24, 16)) * 2).astype(np.float32).astype(np.float64))
    r = torch.tensor(rng.standard_normal((24, 64)).astype(np.float32).astype(np.float64))
    want = (torch.nn.functional.gelu(x @ w.T + b, approximate=approximate) * r).sum()
    want.backward()
    np.testing.assert_allclose(loss.value.numpy().ravel()[0], want.item(), rtol=1e-5)
    for p, t in zip(fc.params(), (w, b), strict=True):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)
