"""Causal masks generated from indices (a run-time offset for decoding), key-padding masks,
and the masked softmax: values and gradients against NumPy and PyTorch, fully masked rows
without NaN, no `T x T` array in the optimized code, C against the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import shape as sh
from einjit import train
from einjit.ir import assignments as asg
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.optimize import optimize_proc

B, T, H, S = 2, 3, 2, 5


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def scores_of(x_np):
    """Scores `[B, T | H, S]` with a gradient (a zero bias row added to data)."""
    bias = ej.param("bias", values=np.zeros(S), output_dims=[S])
    return (ej.ndarray(x_np, batch_axes=2, label="x") + bias).hosted()


def reference(x, keep, w):
    """Masked softmax over the last axis and the gradient of `sum(p * w)` by the scores."""
    z = np.where(keep, x, -np.inf)
    with np.errstate(invalid="ignore"):
        z = z - np.max(z, axis=-1, keepdims=True)
    e = np.where(keep, np.exp(np.where(keep, z, 0.0)), 0.0)
    p = e / np.maximum(e.sum(-1, keepdims=True), 1.0)
    grad = p * (w - (p * w).sum(-1, keepdims=True))
    return p, grad


def causal_keep(offset):
    return np.broadcast_to(np.arange(S)[None, None, None, :] <= np.arange(T)[None, :, None, None] + offset,
                           (B, T, H, S))


def test_causal_softmax_with_a_run_time_offset_matches_numpy_and_never_nans():
    rng = np.random.default_rng(0)
    x_np, w = rng.standard_normal((B, T, H, S)) * 4, rng.standard_normal((B, T, H, S))
    sc = scores_of(x_np)
    off = ej.get_static_symbol(name="off")
    p = ej.masked_softmax(sc, ej.causal_mask(sc, query_axis=1, key_axis=-1, offset=off), axis=-1).hosted()
    loss = ej.sum(p * ej.ndarray(w, batch_axes=2), "...|...->... => 0", label="loss")
    train.init_params(loss)
    ref = ej.IntRef(0)
    step = train.to_routine(train.grad_update(loss), bindings={off: ref}, name="causal_softmax")
    for offset in (0, 1, S - T, -1, -T):   # -1 masks the first row entirely, -T every row
        ref.value = offset
        step()
        want_p, want_grad = reference(x_np, causal_keep(offset), w)
        np.testing.assert_allclose(p.value.numpy(), want_p, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(sc.grad.numpy(), want_grad, rtol=1e-12, atol=1e-14)
        assert np.all(np.isfinite(sc.grad.numpy()))
    np.testing.assert_array_equal(p.value.numpy(), 0.0)  # offset -T: nothing to attend


def test_the_mask_is_compared_in_the_loop_not_stored():
    sc = scores_of(np.zeros((B, T, H, S)))
    mask = ej.causal_mask(sc, query_axis=1, key_axis=3)
    p = ej.masked_softmax(sc, mask, axis=3)
    train.init_params(p)
    opt = optimize_proc(asg.to_low_level(train.forward(p)), name="no_mask_array")
    assert mask.value_tn.is_virtual()
    assert mask.value_tn not in ll.nodes_of(opt.llc)
    assert "causal_mask" not in ll.to_doc(opt.llc).replace("causal_mask(", "")


def test_key_padding_and_causal_masks_combine_and_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x_np, w = rng.standard_normal((B, T, H, S)), rng.standard_normal((B, T, H, S))
    pad = np.ones((B, 1, 1, S))
    pad[0, ..., 3:] = 0    # batch 0 has 3 real keys
    sc = scores_of(x_np)
    causal = ej.causal_mask(sc, query_axis=1, key_axis=3, offset=2)
    keep = causal * ej.ndarray(pad, batch_axes=2, label="key_padding")
    p = ej.masked_softmax(sc, keep, axis=-1).hosted()
    loss = ej.sum(p * ej.ndarray(w, batch_axes=2), "...|...->... => 0", label="loss")
    train.init_params(loss)
    train.to_routine(train.grad_update(loss), name="padded_softmax")()
    keep_np = causal_keep(2) & (pad != 0)
    want_p, want_grad = reference(x_np, keep_np, w)
    np.testing.assert_allclose(p.value.numpy(), want_p, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(sc.grad.numpy(), want_grad, rtol=1e-12, atol=1e-14)
    xt = torch.tensor(x_np, requires_grad=True)
    pt = torch.softmax(xt.masked_fill(~torch.tensor(keep_np), float("-inf")), dim=-1)
    (pt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(p.value.numpy(), pt.detach().numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(sc.grad.numpy(), xt.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_causal_mask_fill_and_the_interpreter_agree_with_c():
    rng = np.random.default_rng(2)
    x_np = rng.standard_normal((B, T, H, S))
    x = ej.ndarray(x_np, batch_axes=2, label="x")
    off = ej.get_static_symbol(name="off")
    filled = ej.causal_mask_fill(x, query_axis=1, key_axis=3, offset=off, value=-7.0)
    code = train.forward(filled)
    want = np.where(causal_keep(1), x_np, -7.0)
    sh.finish_inference()
    llc = asg.to_low_level(code)
    got = interpret.run(llc, {x.value_tn: x_np.copy()}, {off.symbol: 1})
    np.testing.assert_array_equal(got[filled.value_tn], want)
    optimized = optimize_proc(llc, name="fill", static_indices=[off]).llc
    got = interpret.run(optimized, {x.value_tn: x_np.copy()}, {off.symbol: 1})
    np.testing.assert_array_equal(got[filled.value_tn], want)
    train.to_routine(code, bindings={off: ej.IntRef(1)}, name="fill_c")()
    np.testing.assert_array_equal(filled.value.numpy(), want)


def test_masked_softmax_without_a_mask_is_softmax_and_bad_axes_are_named():
    x_np = np.random.default_rng(3).standard_normal((4, 6))
    got = train.forward_once(ej.masked_softmax(ej.ndarray(x_np, batch_axes=1), axis=-1))
    e = np.exp(x_np - x_np.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-13)
    x = ej.ndarray(x_np, batch_axes=1)
    with pytest.raises(ej.EinjitError, match="query axis 1 and key axis -1 must be two different axes"):
        train.forward_once(ej.causal_mask(x, query_axis=1, key_axis=-1))
    with pytest.raises(ej.TensorError, match="offset must be an int or a static symbol"):
        ej.causal_mask(x, query_axis=0, key_axis=1, offset=1.5)


def test_masked_entries_never_reach_the_exponential_and_far_out_scores_change_nothing():
    """Masked scores of any size (here 1e6 above the kept ones) leave the kept weights and
    their gradients as NumPy computes them without those entries; the exponential is taken of
    0 at masked entries (`masked_softmax` in masks.py), never of -1e30."""
    rng = np.random.default_rng(3)
    x_np, w = rng.standard_normal((B, T, H, S)), rng.standard_normal((B, T, H, S))
    keep = causal_keep(0)
    x_np = np.where(keep, x_np, 1e6)
    sc = scores_of(x_np)
    p = ej.masked_softmax(sc, ej.causal_mask(sc, query_axis=1, key_axis=-1), axis=-1).hosted()
    loss = ej.sum(p * ej.ndarray(w, batch_axes=2), "...|...->... => 0", label="loss")
    train.init_params(loss)
    step = train.to_routine(train.grad_update(loss), name="far_masked_softmax")
    step()
    want_p, want_grad = reference(x_np, keep, w)
    np.testing.assert_allclose(p.value.numpy(), want_p, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(sc.grad.numpy(), want_grad, rtol=1e-12, atol=1e-14)
    assert (p.value.numpy()[~keep] == 0.0).all()
    fresh = scores_of(x_np)
    again = ej.masked_softmax(fresh, ej.causal_mask(fresh, query_axis=1, key_axis=-1), axis=-1)
    train.init_params(again)
    opt = optimize_proc(asg.to_low_level(train.forward(again)), name="exp_of_kept")
    exps = [sc for st in ll.iter_stmts(opt.llc) if isinstance(st, ll.Set) for sc in ll.iter_scalars(st.llsc)
            if isinstance(sc, ll.Unop) and sc.op is ops.Unop.EXP]
    assert exps and all(isinstance(e.arg, ll.Ternop) and e.arg.op is ops.Ternop.WHERE for e in exps)
