"""The optimizers' fused updates (`%cd` `~fused(...)`: one loop nest per parameter, no
intermediate tensors) against the one-operation-per-assignment `%cd` they replace, bit for bit
over several compiled steps, at 1 and 2 threads; and the notation's `~fused` group itself."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from tiny_mlp import tiny_mlp

import einjit as ej
from einjit import train
from einjit.backends.c_syntax import C_SYNTAX
from einjit.backends.cc import toolchain as cc
from einjit.ir import assignments as asg
from einjit.ir import ops
from einjit.nn import optim
from einjit.tensor import cd_syntax as syn
from einjit.tensor.notation import cd
from einjit.tensor.state import state

NET = tiny_mlp(seed=11, batch=6, inputs=5, hidden=7)  # a 7x5 matrix, odd for vector tails
W1 = NET.w1
_mlp = NET.build


def _sgd_unfused(p, lr, wd, mom, nesterov):
    """`train.sgd_one` before `~fused`: an intermediate tensor per operation."""
    text = ['"sgd_delta" =: p.grad + wd * p']
    if mom > 0.0:
        text.append('"sgd_momentum" =: mom * sgd_momentum + sgd_delta')
        text.append("sgd_delta =+ mom * sgd_momentum" if nesterov else "sgd_delta =: sgd_momentum")
    text.append('p =- lr * sgd_delta ~logic:"."')
    return cd("; ".join(text), p=p, lr=lr, wd=wd, mom=mom).asgns


def _adam_unfused(p, scalars, coupled):
    """`train.adam_one` before `~fused` (with the shared scalars)."""
    grad = "adam_g" if coupled else "p.grad"
    text = ['"adam_g" =: p.grad + wd * p'] if coupled else []
    text += [f'"adam_m" =: b1 * adam_m + c1 * {grad}', f'"adam_v" =: b2 * adam_v + c2 * ({grad} * {grad})',
             '"adam_denom" =: sqrt(adam_v) * rbc2 + eps', '"adam_ratio" =: adam_m / adam_denom',
             'p =- step_size * adam_ratio ~logic:"."' if coupled
             else 'p =- lr_wd * p + step_size * adam_ratio ~logic:"."']
    shared = {k: scalars[f"adam_{k}"] for k in ("b1", "b2", "c1", "c2", "eps", "wd", "step_size", "rbc2", "lr_wd")}
    return cd("; ".join(text), p=p, **shared).asgns


def _options(threads: int) -> cc.CcOptions:
    """Threads for nests of at least 16 assignments: the update of every parameter here."""
    return cc.CcOptions(threads=threads, syntax=replace(C_SYNTAX, thread_min_work=16))


def _steps(loss, update, name: str, threads: int, before=None, steps: int = 5) -> None:
    routine = train.to_routine([train.grad_update(loss), update], name=name, options=_options(threads))
    for _ in range(steps):
        if before is not None:
            before()
        routine()


SGD_CASES = {"momentum_wd": dict(momentum=0.9, weight_decay=0.01), "nesterov": dict(momentum=0.8, nesterov=True),
             "plain_wd": dict(weight_decay=0.05)}


@pytest.mark.parametrize("case", sorted(SGD_CASES))
def test_fused_sgd_is_bit_identical_to_the_unfused_update(case):
    kw = SGD_CASES[case]
    loss, params = _mlp(f"sf{case}")
    _steps(loss, optim.SGD(loss, 0.03, **kw).update(), f"sgd_fused_{case}", 1)
    loss_ref, ref = _mlp(f"su{case}")
    update = asg.sequence(*[_sgd_unfused(p, 0.03, kw.get("weight_decay", 0.0), kw.get("momentum", 0.0),
                                         kw.get("nesterov", False)) for p in ref])
    _steps(loss_ref, update, f"sgd_unfused_{case}", 1)
    for got, want in zip(params, ref, strict=True):
        np.testing.assert_array_equal(got.value.numpy(), want.value.numpy())
    assert not np.allclose(params[0].value.numpy(), W1, atol=1e-3)


@pytest.mark.parametrize("decoupled", [True, False])
def test_fused_adam_is_bit_identical_to_the_unfused_update(decoupled):
    """AdamW, and Adam with L2 weight decay (the gradient `p.grad + wd * p` inlined twice)."""
    make = optim.AdamW if decoupled else optim.Adam
    tag = "w" if decoupled else "l2"
    loss, params = _mlp(f"af{tag}")
    opt = make(loss, 0.05, weight_decay=0.1)
    _steps(loss, opt.update(), f"adam_fused_{tag}", 1, before=opt.step)
    loss_ref, ref = _mlp(f"au{tag}")
    count = state([f"adam_unfused_{tag}", "step"], 0.0, prec=ops.double)
    scalars = train.adam_scalars(count, 0.05, weight_decay=0.1)
    update = asg.sequence(cd("n =+ 1", n=count.value).asgns, scalars.asgns,
                          *[_adam_unfused(p, scalars, not decoupled) for p in ref])
    _steps(loss_ref, update, f"adam_unfused_{tag}", 1)
    for got, want in zip(params, ref, strict=True):
        np.testing.assert_array_equal(got.value.numpy(), want.value.numpy())
    assert not np.allclose(params[0].value.numpy(), W1, atol=0.1)


def test_fused_adamw_runs_the_same_at_2_threads():
    values = {}
    for threads in (1, 2):
        loss, params = _mlp(f"t{threads}")
        opt = optim.AdamW(loss, 0.05, weight_decay=0.1)
        _steps(loss, opt.update(), f"adamw_threads{threads}", threads, before=opt.step)
        values[threads] = [p.value.numpy().copy() for p in params]
    for got, want in zip(values[2], values[1], strict=True):
        np.testing.assert_array_equal(got, want)


def test_adam_update_is_one_fused_group_per_parameter():
    """The compile-time point of fusing: per parameter, one `Fused` group of three expressions
    (the moments, then the parameter), where one operation per assignment took fifteen."""
    loss, params = _mlp("count")
    opt = optim.AdamW(loss, 0.05)
    groups = [a for a in asg.flatten_with_comments(opt.update()) if isinstance(a, asg.Fused)]
    kept = opt.state_tensors()
    assert [[m.lhs for m in g.members] for g in groups] == [
        [kept[f"adamw.{p.label_str}.adam_m"].value_tn, kept[f"adamw.{p.label_str}.adam_v"].value_tn, p.value_tn]
        for p in params]


def test_fused_group_syntax():
    (group,) = syn.parse('~fused("m" =: b * m + g; p =- lr * m;)')
    assert isinstance(group, syn.FusedGroup)
    assert [type(s.lhs).__name__ for s in group.body] == ["Decl", "Ref"]
    assert group.body[1].accum is ops.Binop.SUB
    with pytest.raises(syn.CdSyntaxError, match=r"column 14: expected '\)', found 'end of text'"):
        syn.parse("~fused(p =: a")
    with pytest.raises(syn.CdSyntaxError, match=r"column 8: an assignment starts with the assigned-to tensor"):
        syn.parse('~fused(~~("c"; p =: a))')


def test_fused_assignment_with_einsum_logic_is_an_error():
    a = ej.ndarray(np.ones((2, 3), np.float32), label="fa")
    b = ej.ndarray(np.ones((3, 2), np.float32), label="fb")
    with pytest.raises(ej.CdError, match=r"column 8: a ~fused assignment is pointwise"):
        cd('~fused("c" =:+ a * b ~logic:"@")', a=a, b=b)


def test_fused_cd_numbers_and_repeated_tensors():
    """Numbers (literal or bound) are constants of the expression, and a tensor named twice is
    one argument read twice: `c = 2 * a * a + k`."""
    av = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.0
    a = ej.ndarray(av, label="fra")
    code = cd('~fused("c" =: 2.0 * a * a + k)', a=a, k=0.5)
    (group,) = [x for x in asg.flatten_with_comments(code.asgns) if isinstance(x, asg.Fused)]
    (member,) = group.members
    assert member.args == (asg.Node(a.value_tn),)
    c = code["c"].hosted()
    train.to_routine(code, name="fused_numbers")()
    np.testing.assert_array_equal(c.value.numpy(), 2.0 * av * av + 0.5)
