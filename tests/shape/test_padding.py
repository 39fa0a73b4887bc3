"""Padding in the einsum notation: a negative constant in a convolution axis (`2*o+k-1`) reads
zeros past both ends of the argument, and the gradient never writes there. Forward values and
gradients against NumPy references (explicitly padded arrays), in 1-D and 2-D, with stride and
dilation; the compiled C and the IR interpreter agree."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.ir import assignments as asg
from einjit.ir import interpret
from einjit.ir import low_level as ll


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def ends(pad: int | tuple[int, int]) -> tuple[int, int]:
    """Padding before and after: one number pads both ends alike."""
    return (pad, pad) if isinstance(pad, int) else pad


def conv_axis(stride: int, out: str, dil: int, ker: str, pad: int | tuple[int, int]) -> str:
    left, right = ends(pad)
    before = f"-{left}" if left or right else ""
    return f"{stride}*{out}+{dil}*{ker}{before}" + (f":{right}" if right != left else "")


def out_size(n: int, k: int, stride: int, dil: int, pad: int | tuple[int, int]) -> int:
    return (n + sum(ends(pad)) - dil * (k - 1) - 1) // stride + 1


def conv1d_ref(x, k, w, stride, dil, pad):
    """Forward and the gradients of `sum(conv * w)` by explicit padding."""
    left, _ = ends(pad)
    xp = np.pad(x, ends(pad))
    n_out = out_size(len(x), len(k), stride, dil, pad)
    taps = np.array([[stride * o + dil * j for j in range(len(k))] for o in range(n_out)])
    out = (xp[taps] * k).sum(axis=1)
    gxp = np.zeros_like(xp)
    np.add.at(gxp, taps, w[:, None] * k[None, :])
    gk = (xp[taps] * w[:, None]).sum(axis=0)
    return out, gxp[left:left + len(x)], gk


def run_both(loss, params, watched):
    """Run the gradient step in the IR interpreter and compiled (C), from the given host values
    of `params` (the interpreter does not see host data: it gets them as arrays)."""
    asgns = train.grad_update(loss)
    arrays = interpret.run(asg.to_low_level(asgns), {p.value_tn: np.array(v) for p, v in params})
    interpreted = [arrays[x.tensor.grad_tn if x.is_grad else x.tensor.value_tn] for x in watched]
    routine = train.to_routine(asgns, name="padded")
    for p, v in params:
        p.value_tn.host_array()[...] = v
    routine()
    return [np.array(x.numpy()) for x in watched], interpreted


CASES_1D = [  # n, kernel, stride, dilation, padding
    (7, 3, 1, 1, 1),
    (8, 3, 2, 1, 1),
    (9, 3, 2, 2, 2),
    (6, 2, 3, 1, 1),
    (5, 3, 1, 1, 0),
    (10, 4, 2, 1, 3),
    (6, 2, 1, 1, (0, 1)),   # "same" for an even kernel, as PyTorch pads it
    (6, 4, 1, 1, (1, 2)),   # "same" for a 4-tap kernel
    (9, 3, 2, 1, (0, 2)),   # strided, padded after only
    (9, 3, 2, 2, (3, 1)),   # strided and dilated, more before
    (7, 3, 1, 2, (2, 0)),   # dilated, padded before only
]


def with_strategies(cases: list[tuple[int, ...]], large: list[tuple[int, ...]]) -> list[tuple[object, ...]]:
    """Both ways of writing a gradient through padding for small kernels: one narrowed copy
    per kernel position ("peeled"), or the written cell as the loop with a validity condition
    ("substituted", what kernels beyond `MAX_PEELED` positions always get)."""
    return [(*c, st) for c in cases for st in ("peeled", "substituted")] + [(*c, "default") for c in large]


@pytest.fixture
def strategy(request, monkeypatch):
    if request.param == "substituted":
        monkeypatch.setattr(asg, "MAX_PEELED", 0)
    return request.param


@pytest.mark.parametrize("n, ks, stride, dil, pad, strategy",
                         with_strategies(CASES_1D, [
                             (120, 100, 1, 1, 49),
                             (130, 100, 2, 1, 50),
                             (210, 100, 2, 2, 99),  # no unit coefficient: 100 peeled copies
                         ]),
                         indirect=["strategy"])
def test_conv1d_forward_and_gradient(n, ks, stride, dil, pad, strategy):
    rng = np.random.default_rng(n * 100 + ks * 10 + sum(ends(pad)))
    xv, kv = rng.standard_normal(n), rng.standard_normal(ks)
    n_out = out_size(n, ks, stride, dil, pad)
    wv = rng.standard_normal(n_out)
    x = ej.param("x", values=xv, output_dims=[n])
    k = ej.param("k", values=kv, output_dims=[ks])
    conv = ej.einsum(f"{conv_axis(stride, 'o', dil, 'k', pad)}, ; k, => o,", x, k).hosted()
    w = ej.ndarray(wv, label="w")
    loss = ej.sum(conv * w, "o, => ")
    (c_out, c_gx, c_gk), (i_out, i_gx, i_gk) = run_both(
        loss, [(x, xv), (k, kv), (w, wv)], [conv.value, x.grad, k.grad])
    ref_out, ref_gx, ref_gk = conv1d_ref(xv, kv, wv, stride, dil, pad)
    assert c_out.shape == (n_out,)
    np.testing.assert_allclose(c_out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(c_gx, ref_gx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(c_gk, ref_gk, rtol=1e-12, atol=1e-12)
    for got, want in zip((i_out, i_gx, i_gk), (c_out, c_gx, c_gk), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def plane_pads(pad) -> tuple[tuple[int, int], tuple[int, int]]:
    """Padding of the two axes of a plane: one number for all four sides, else (rows, columns)."""
    return (ends(pad), ends(pad)) if isinstance(pad, int) else (ends(pad[0]), ends(pad[1]))


def conv2d_ref(x, k, w, stride, dil, pad):
    """x: (H, W, C); k: (F, KH, KW, C) (output row f, input row kh, kw, c); w: (OH, OW, F)."""
    (top, bottom), (left, right) = plane_pads(pad)
    xp = np.pad(x, ((top, bottom), (left, right), (0, 0)))
    f, kh, kw, _ = k.shape
    oh = out_size(x.shape[0], kh, stride, dil, (top, bottom))
    ow = out_size(x.shape[1], kw, stride, dil, (left, right))
    out = np.zeros((oh, ow, f))
    gxp, gk = np.zeros_like(xp), np.zeros_like(k)
    for i in range(oh):
        for j in range(ow):
            rows = stride * i + dil * np.arange(kh)
            cols = stride * j + dil * np.arange(kw)
            patch = xp[np.ix_(rows, cols)]  # (KH, KW, C)
            out[i, j] = np.einsum("hwc,fhwc->f", patch, k)
            gxp[np.ix_(rows, cols)] += np.einsum("f,fhwc->hwc", w[i, j], k)
            gk += np.einsum("f,hwc->fhwc", w[i, j], patch)
    return out, gxp[top:top + x.shape[0], left:left + x.shape[1]], gk


@pytest.mark.parametrize("h, w_, ks, stride, dil, pad, strategy", with_strategies([
    (5, 5, 3, 1, 1, 1),   # "same"
    (6, 7, 3, 2, 1, 1),   # strided, as PyTorch's Conv2d(3, stride=2, padding=1)
    (7, 6, 2, 1, 2, 1),   # dilated
    (6, 6, 2, 1, 1, ((0, 1), (0, 1))),  # "same" for a 2x2 kernel (PyTorch pads after)
    (7, 8, 3, 2, 1, ((1, 0), (0, 2))),  # strided, each axis padded differently
    (8, 7, 3, 2, 2, ((2, 1), (1, 3))),  # strided and dilated
], [
    (9, 8, 9, 1, 1, 4),  # 81 kernel positions, "same"
    (10, 9, 9, 2, 1, 3),  # 81 kernel positions, strided
]), indirect=["strategy"])
def test_conv2d_forward_and_gradient(h, w_, ks, stride, dil, pad, strategy):
    rng = np.random.default_rng(h * 10 + w_ + stride)
    c, f = 2, 3
    xv, kv = rng.standard_normal((h, w_, c)), rng.standard_normal((f, ks, ks, c))
    pad_h, pad_w = plane_pads(pad)
    oh, ow = out_size(h, ks, stride, dil, pad_h), out_size(w_, ks, stride, dil, pad_w)
    wv = rng.standard_normal((oh, ow, f))
    x = ej.param("x", values=xv.ravel(), output_dims=[h, w_, c])
    k = ej.param("k", values=kv.ravel(), output_dims=[f], input_dims=[ks, ks, c])
    spec = (f"{conv_axis(stride, 'oh', dil, 'kh', pad_h)}, {conv_axis(stride, 'ow', dil, 'kw', pad_w)}, c; "
            "kh, kw, c -> f => oh, ow, f")
    conv = ej.einsum(spec, x, k).hosted()
    w = ej.ndarray(wv, label="w")
    loss = ej.sum(conv * w, "...|...->... => 0")
    (c_out, c_gx, c_gk), (i_out, i_gx, i_gk) = run_both(
        loss, [(x, xv), (k, kv), (w, wv)], [conv.value, x.grad, k.grad])
    ref_out, ref_gx, ref_gk = conv2d_ref(xv, kv, wv, stride, dil, pad)
    np.testing.assert_allclose(c_out, ref_out, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(c_gx, ref_gx, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(c_gk, ref_gk, rtol=1e-11, atol=1e-11)
    for got, want in zip((i_out, i_gx, i_gk), (c_out, c_gx, c_gk), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


def test_padded_strided_convolution_then_strided_pooling():
    """The issue's max-pool trap with padding: conv 3x3 same → pool 2 via `2*p+0`."""
    xv = np.arange(1.0, 9.0)
    x = ej.ndarray(xv, label="x")
    conv = ej.einsum("o+k-1, ; k, => o,", x, ej.ndarray(np.ones(3), label="k"))
    pooled = ej.maximum(ej.einsum("2*p+0, => p,", conv), ej.einsum("2*p+1, => p,", conv))
    ref = np.convolve(xv, np.ones(3), mode="same")
    np.testing.assert_array_equal(train.forward_once(pooled), ref.reshape(4, 2).max(axis=1))


def test_padding_too_small_for_the_result_is_an_error():
    x = ej.ndarray(np.ones(4), label="x")
    conv = ej.einsum("o+k-1, ; k, => o,", x, ej.ndarray(np.ones(3), label="k"))
    with pytest.raises(ej.ShapeError, match=r"indexed up to 5, but has size 4 .*with padding 1"):
        train.forward_once(conv + ej.ndarray(np.zeros(5), label="z"))


def test_large_kernels_write_on_one_loop_nest_not_one_copy_per_position():
    """A 9x9 kernel's gradient is one nest over the written cells (not 81 peeled copies); a
    3-tap kernel keeps its three narrowed copies."""
    def input_grad_nests(ks: int, pad: int) -> int:
        x = ej.param("x", values=np.zeros(12 * 12), output_dims=[12, 12])
        k = ej.param("k", values=np.zeros(ks * ks), output_dims=[ks, ks])
        conv = ej.einsum(f"oh+kh-{pad}, ow+kw-{pad}; kh, kw => oh, ow", x, k)
        lowered = asg.to_low_level(train.grad_update(ej.sum(conv, "...|... => 0")))
        return sum(isinstance(st, ll.Set) and st.tn is x.grad_tn for st in ll.iter_stmts(lowered))
    assert input_grad_nests(9, 4) < input_grad_nests(3, 1) == 9


def test_too_short_with_asymmetric_padding_names_both_ends():
    x = ej.ndarray(np.ones(4), label="x")
    conv = ej.einsum("o+k-0:1, ; k, => o,", x, ej.ndarray(np.ones(2), label="k"))
    with pytest.raises(ej.ShapeError, match=r"indexed up to 6, but has size 4 .*with padding 0:1"):
        train.forward_once(conv + ej.ndarray(np.zeros(6), label="z"))


@pytest.mark.parametrize("right", [1, 2])
def test_window_padded_after_its_end_only_reads_zeros(right):
    """`o-0:r` projects to a plain loop index that runs `r` cells past the argument: the read
    is guarded (zeros, as `np.pad`), and the gradient writes only inside `x`."""
    xv, rng = np.arange(1.0, 7.0), np.random.default_rng(right)
    wv = rng.standard_normal(6 + right)
    x = ej.param("x", values=xv, output_dims=[6])
    window = ej.einsum(f"o-0:{right}, => o,", x).hosted()
    w = ej.ndarray(wv, label="w")
    loss = ej.sum(window * w, "...|...->... => 0")
    (c_out, c_gx), (i_out, i_gx) = run_both(loss, [(x, xv), (w, wv)], [window.value, x.grad])
    np.testing.assert_array_equal(c_out, np.pad(xv, (0, right)))
    np.testing.assert_array_equal(c_gx, wv[:6])
    np.testing.assert_array_equal(i_out, c_out)
    np.testing.assert_array_equal(i_gx, c_gx)


def test_window_padded_after_its_end_inside_a_padded_convolution():
    """Inlined under the outer convolution's guard, the inner window's read past `x` must still
    give 0 (it used to be clamped to the last cell of `x`)."""
    xv, kv = np.arange(1.0, 7.0), np.array([1.0, 10.0, 100.0])
    inner = ej.einsum("o-0:1, => o,", ej.ndarray(xv, label="x"))
    outer = ej.einsum("o+k-1, ; k, => o,", inner, ej.ndarray(kv, label="k"))
    xp = np.pad(xv, (1, 2))
    np.testing.assert_array_equal(train.forward_once(outer), [xp[o:o + 3] @ kv for o in range(7)])
