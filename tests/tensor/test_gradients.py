"""Every operation's gradient against central finite differences, in float64, through one
compiled routine; plus the micrograd example of the issue."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_gradients

import einjit as ej
from einjit import train
from einjit.tensor import operation


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def test_micrograd_example():
    a = ej.param("a", values=[-4.0])
    b = ej.param("b", values=[2.0])
    c = a + b
    d = a * b + b ** 3
    c = c + c + 1
    c = c + 1 + c + (-a)
    d = d + d * 2 + ej.relu(b + a)
    d = d + 3 * d + ej.relu(b - a)
    e = c - d
    f = e ** 2
    g = f / 2 + 10.0 / f
    train.init_params(g)
    routine = train.to_routine(train.grad_update(g), name="micrograd")
    routine()
    assert g.value.numpy()[0] == pytest.approx(24.7041, abs=1e-4)
    assert a.grad.numpy()[0] == pytest.approx(138.8338, abs=1e-4)
    assert b.grad.numpy()[0] == pytest.approx(645.5773, abs=1e-4)


def fd_check(build, specs, *, positive=False, seed=0, rtol=1e-5, atol=1e-6, weight_dims=None):
    rng = np.random.default_rng(seed)
    params = []
    for k, (out_dims, in_dims) in enumerate(specs):
        vals = rng.uniform(0.5, 1.5, tuple(out_dims) + tuple(in_dims))
        if not positive:
            vals *= rng.choice([-1.0, 1.0], vals.shape)
        params.append(ej.param(f"p{k}", values=vals.ravel(), output_dims=list(out_dims), input_dims=list(in_dims)))
    result = build(*params)
    r = ej.ndarray(rng.standard_normal(weight_dims), label="r") if weight_dims is not None else 1.0
    loss = ej.sum(result * r, "...|...->... => 0", label="loss")
    train.init_params(loss, seed=seed)
    check_gradients(loss, params, rtol=rtol, atol=atol)
    return result


BINARY = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "max": ej.maximum,
    "min": ej.minimum,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shapes", [([2, 3], [2, 3]), ([2, 3], [3]), ([2, 3], [1, 3]), ([1], [2, 3])],
                         ids=["same", "prepend-axis", "dim1", "scalar"])
def test_binary_gradients(name, shapes):
    positive = name == "div"
    out = fd_check(BINARY[name], [(shapes[0], []), (shapes[1], [])], positive=positive, weight_dims=(2, 3))
    assert out.dims == (2, 3)


def test_pow_gradient_both_sides():
    fd_check(lambda x, y: x ** y, [([2, 3], []), ([3], [])], positive=True, weight_dims=(2, 3))


def test_pow_by_constant():
    fd_check(lambda x: x ** 3, [([4], [])], weight_dims=(4,))


# Every unary operation of the library, by its API name: a new one is checked automatically.
UNARY = {name: getattr(ej, name) for name in operation._UNARY}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_gradients(name):
    fd_check(UNARY[name], [([2, 3], [])], positive=name in ("log", "sqrt", "recip"), weight_dims=(2, 3))


def test_compose_gradient():
    out = fd_check(lambda w, x: w @ x, [([3], [4]), ([4], [])], weight_dims=(3,))
    assert out.dims == (3,)


def test_compose_multi_axis():
    out = fd_check(lambda w, x: w @ x, [([2], [3, 2]), ([3, 2], [])], weight_dims=(2,))
    assert out.dims == (2,)


def test_binary_einsum_gradient():
    fd_check(lambda a, b: ej.einsum("ij;jk=>ik", a, b), [([2, 3], []), ([3, 4], [])], weight_dims=(2, 4))


def test_unary_einsum_gradient():
    fd_check(lambda a: ej.einsum("ij=>ji", a), [([2, 3], [])], weight_dims=(3, 2))


def test_sum_and_mean_gradients():
    fd_check(lambda a: ej.sum(a, "ij=>i") + ej.mean(a, "ij=>i"), [([2, 3], [])], weight_dims=(2,))


def test_transpose_gradient():
    out = fd_check(lambda a: a.T, [([2], [3])])
    assert out.dims == (2, 3) or out.dims == (3, 2)


def test_where_gradient():
    cond = ej.ndarray(np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]))
    fd_check(lambda a, b: ej.where(cond, a, b), [([2, 3], []), ([2, 3], [])], weight_dims=(2, 3))


def test_strided_convolution_gradient():
    out = fd_check(lambda x, w: ej.einsum("2*o+k,;k,=>o,", x, w), [([9], []), ([3], [])], weight_dims=(4,))
    assert out.dims == (4,)

