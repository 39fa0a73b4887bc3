"""Projection inference, checked by running the projections with a loop evaluator against NumPy."""

import string

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from einjit import shape as sh
from einjit.ir.indexing import Affine, FixedIdx, Iterator, get_static_symbol
from einjit.shape import ShapeError
from shape_eval import run

RNG = np.random.default_rng(0)


def rand(dims):
    return RNG.standard_normal(dims)


def known(name="", batch=(), inp=(), out=()):
    return sh.Shape.make(batch_dims=list(batch), input_dims=list(inp), output_dims=list(out), debug_name=name)


def solve_step(cur, logic):
    step = sh.UpdateStep(cur, logic)
    sh.propagate_shapes(step)
    sh.finish_inference()
    return sh.derive_projections(step)


def broadcast_batches(draw, n: int):
    """`n` batch shapes that broadcast NumPy-style, and their broadcast."""
    full = draw(st.lists(st.integers(2, 3), max_size=2))
    batches = []
    for _ in range(n):
        keep = draw(st.integers(0, len(full)))
        suffix = full[len(full) - keep:]
        batches.append([d if draw(st.booleans()) else 1 for d in suffix])
    return batches, list(np.broadcast_shapes(*(tuple(b) for b in batches)))


# ------------------------------------------------------------------ einsum vs numpy.einsum

@st.composite
def einsum_cases(draw):
    n_labels = draw(st.integers(1, 4))
    letters = string.ascii_lowercase[:n_labels]
    size = {c: draw(st.integers(1, 3)) for c in letters}
    operands = []
    for _ in range(2):
        axes = draw(st.lists(st.sampled_from(letters), max_size=3))
        split = draw(st.integers(0, len(axes)))
        dims = [size[c] if draw(st.integers(0, 3)) else 1 for c in axes]
        operands.append((axes[:split], axes[split:], dims[:split], dims[split:]))
    used = sorted({c for op in operands for c in op[0] + op[1]})
    out = draw(st.permutations(used).map(lambda p: list(p[:draw(st.integers(0, len(p)))])))
    split = draw(st.integers(0, len(out)))
    batches, full_batch = broadcast_batches(draw, 2)
    return operands, (out[:split], out[split:]), batches, full_batch, draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(einsum_cases())
def test_einsum_matches_numpy(case):
    operands, (res_in, res_out), batches, full_batch, multi = case
    sep = ", " if multi else ""     # multi-character mode: a comma anywhere
    slots = [f"...|{sep.join(i)}->{sep.join(o)}" for i, o, _, _ in operands]
    spec = f"{slots[0]};{slots[1]}=>...|{sep.join(res_in)}->{sep.join(res_out)}" + ("," if multi else "")
    shapes = [known(f"r{k}", batch=b, inp=di, out=do)
              for k, ((_, _, di, do), b) in enumerate(zip(operands, batches, strict=True))]
    lhs = sh.Shape.make(debug_name="lhs")
    proj = solve_step(lhs, sh.Broadcast(sh.Einsum(spec), *shapes))
    # NumPy: broadcast the dimension-1 labelled axes explicitly, then einsum (layout: batch, output, input).
    full = {}
    for i, o, di, do in operands:
        for c, d in zip(i + o, di + do, strict=True):
            full[c] = max(full.get(c, 1), d)
    arrays, np_specs = [], []
    for (i, o, di, do), b in zip(operands, batches, strict=True):
        a = rand(tuple(b + do + di))
        arrays.append(a)
        np_specs.append("..." + "".join(o + i))
    expanded = [np.broadcast_to(a, a.shape[:len(b)] + tuple(full[c] for c in s[3:]))
                for a, b, s in zip(arrays, batches, np_specs, strict=True)]
    expected = np.einsum(f"{np_specs[0]},{np_specs[1]}->...{''.join(res_out + res_in)}", *expanded)
    expected = np.broadcast_to(expected, tuple(full_batch) + expected.shape[expected.ndim - len(res_out + res_in):])
    assert sh.to_dims(lhs) == expected.shape
    assert np.allclose(run(proj, arrays), expected)


# ------------------------------------------------------------------ compose vs a generalized matmul

@st.composite
def compose_cases(draw):
    k = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    kx = k[len(k) - draw(st.integers(0, len(k))):]
    kx = [d if draw(st.integers(0, 3)) else 1 for d in kx]
    o = draw(st.lists(st.integers(1, 3), max_size=2))
    i = draw(st.lists(st.integers(1, 3), max_size=2))
    batches, full_batch = broadcast_batches(draw, 2)
    return k, kx, o, i, batches, full_batch


@settings(max_examples=60, deadline=None)
@given(compose_cases())
def test_compose_is_generalized_matmul(case):
    k, kx, o, i, (bw, bx), full_batch = case
    w, x = known("w", batch=bw, inp=k, out=o), known("x", batch=bx, inp=i, out=kx)
    y = sh.Shape.make(debug_name="y")
    proj = solve_step(y, sh.Broadcast(sh.Compose(), w, x))
    W, X = rand(tuple(bw + o + k)), rand(tuple(bx + kx + i))
    # x's output axes broadcast into w's input axes (leading missing axes, and dimension 1).
    Xk = X.reshape(tuple(bx) + (1,) * (len(k) - len(kx)) + tuple(kx) + tuple(i))
    Xk = np.broadcast_to(Xk, tuple(bx) + tuple(k) + tuple(i))
    lo, lk, li = (string.ascii_letters[n:n + len(s)] for n, s in ((0, o), (10, k), (20, i)))
    expected = np.einsum(f"...{lo}{lk},...{lk}{li}->...{lo}{li}", W, Xk)
    expected = np.broadcast_to(expected, tuple(full_batch) + tuple(o) + tuple(i))
    assert sh.to_dims(y) == expected.shape
    assert np.allclose(run(proj, [W, X]), expected)
    contracted = {s for s, d in zip(proj.product_iterators, proj.product_space, strict=True)} - {
        idx.symbol for idx in proj.project_lhs if isinstance(idx, Iterator)}
    assert len(contracted) == sum(1 for d in k if d > 1)


# ------------------------------------------------------------------ pointwise vs NumPy broadcasting

@st.composite
def pointwise_cases(draw):
    rows = []
    for _ in range(3):
        full = draw(st.lists(st.integers(2, 3), max_size=2))
        pair = []
        for _ in range(2):
            keep = draw(st.integers(0, len(full)))
            pair.append([d if draw(st.booleans()) else 1 for d in full[len(full) - keep:]])
        rows.append(pair)
    return rows


def pad(dims, n):
    return [1] * (n - len(dims)) + dims


@settings(max_examples=60, deadline=None)
@given(pointwise_cases())
def test_pointwise_is_numpy_broadcasting_per_row(rows):
    (ba, bb), (ia, ib), (oa, ob) = rows
    a, b = known("a", batch=ba, inp=ia, out=oa), known("b", batch=bb, inp=ib, out=ob)
    c = sh.Shape.make(debug_name="c")
    proj = solve_step(c, sh.Broadcast(sh.PointwiseBin(), a, b))
    A, B = rand(tuple(ba + oa + ia)), rand(tuple(bb + ob + ib))
    nb, ni, no = (max(len(x), len(y)) for x, y in rows)
    Ap = A.reshape(tuple(pad(ba, nb) + pad(oa, no) + pad(ia, ni)))
    Bp = B.reshape(tuple(pad(bb, nb) + pad(ob, no) + pad(ib, ni)))
    expected = Ap * Bp
    assert sh.to_dims(c) == expected.shape
    assert np.allclose(run(proj, [A, B]), expected)
    assert proj.is_injective() and proj.is_surjective()


# ------------------------------------------------------------------ the cases projections encode

def test_reduced_axis_is_iterated_but_not_in_the_lhs():
    x = known("x", out=[4, 5])
    y = sh.Shape.make(debug_name="y")
    proj = solve_step(y, sh.Transpose(sh.Permute("ij=>i"), x))
    assert proj.product_space == (4, 5)
    i, j = proj.product_iterators
    assert proj.project_lhs == (Iterator(i),)
    assert proj.project_rhs == ((Iterator(i), Iterator(j)),)
    X = rand((4, 5))
    assert np.allclose(run(proj, [X]), X.sum(axis=1))
    assert not proj.is_injective()


def test_broadcast_axes_of_dimension_one_are_fixed_at_zero():
    a, b = known("a", out=[3, 1]), known("b", out=[4])
    proj = solve_step(sh.Shape.make(), sh.Broadcast(sh.PointwiseBin(), a, b))
    i, j = proj.product_iterators
    assert proj.project_rhs == ((Iterator(i), FixedIdx(0)), (Iterator(j),))


def test_fixed_indices_in_the_spec():
    x = known("x", out=[4, 5])
    y = sh.Shape.make(debug_name="y")
    proj = solve_step(y, sh.Transpose(sh.Permute("i2=>i"), x))
    (i,) = proj.product_iterators
    assert proj.project_rhs == ((Iterator(i), FixedIdx(2)),)
    X = rand((4, 5))
    assert np.allclose(run(proj, [X]), X[:, 2])


def test_reduce_everything_into_a_fixed_lhs_index():
    x = known("x", batch=[2], inp=[3], out=[4])
    y = sh.Shape.make(debug_name="total")
    proj = solve_step(y, sh.Transpose(sh.Permute("...|...->... => 0"), x))
    assert sh.to_dims(y) == (1,) and proj.project_lhs == (FixedIdx(0),)
    X = rand((2, 4, 3))
    assert np.allclose(run(proj, [X]), X.sum())


def test_diagonal_shares_one_iterator():
    x = known("x", out=[3, 3])
    proj = solve_step(sh.Shape.make(), sh.Transpose(sh.Permute("ii=>i"), x))
    (i,) = proj.product_iterators
    assert proj.project_rhs == ((Iterator(i), Iterator(i)),)


def test_batch_slice_indexes_with_the_static_symbol():
    sym = get_static_symbol(3)
    data = known("data", batch=[3, 7], out=[2])
    s = sh.Shape.make(debug_name="slice")
    proj = solve_step(s, sh.Transpose(sh.BatchSlice(sym), data))
    assert sh.to_dims(s) == (7, 2)
    assert sym.symbol not in proj.product_iterators
    assert proj.project_rhs[0][0] == Iterator(sym.symbol)
    D = rand((3, 7, 2))
    assert np.allclose(run(proj, [D], statics={sym.symbol: 2}), D[2])


def test_strided_dilated_convolution():
    x = known("x", batch=[2], out=[11, 3])
    kernel = known("kernel", inp=[3, 3], out=[4])
    y = sh.Shape.make(debug_name="y")
    proj = solve_step(y, sh.Broadcast(sh.Einsum("...|2*o+2*k, ci; k, ci -> co => ...|o, co"), x, kernel))
    assert sh.to_dims(y) == (2, 4, 4)      # o = (11 - 1 - 2*(3-1)) // 2 + 1
    conv = proj.project_rhs[0][1]
    assert isinstance(conv, Affine) and sorted(c for c, _ in conv.symbols) == [2, 2]
    X, K = rand((2, 11, 3)), rand((4, 3, 3))
    expected = np.zeros((2, 4, 4))
    for o in range(4):
        window = X[:, 2 * o + 2 * np.arange(3), :]             # (batch, k, ci)
        expected[:, o, :] = np.einsum("bkc,okc->bo", window, K)
    assert np.allclose(run(proj, [X, K]), expected)


def test_convolution_with_offset_and_known_output():
    x = known("x", out=[10])
    k = known("k", out=[3])
    y = known("y", out=[6])
    proj = solve_step(y, sh.Broadcast(sh.Einsum("o+k+1, ; k, => o,"), x, k))
    X, Kk = rand(10), rand(3)
    expected = np.array([sum(X[o + j + 1] * Kk[j] for j in range(3)) for o in range(6)])
    assert np.allclose(run(proj, [X, Kk]), expected)


def test_convolution_too_short_input_is_an_error():
    x, k, y = known("x", out=[5]), known("k", out=[3]), known("y", out=[4])
    with pytest.raises(ShapeError, match=r'convolution axis einsum .* for "x" .* is indexed up to 5, but has size 5'):
        sh.propagate_shapes(sh.UpdateStep(y, sh.Broadcast(sh.Einsum("o+k, ; k, => o,"), x, k)))
    sh.reset_state()
    x2 = sh.Shape.make(batch_dims=[], input_dims=[], output_dims=[None], debug_name="x2")
    with pytest.raises(ShapeError, match=r"is indexed up to 5, but has size 5"):
        sh.propagate_shapes(sh.UpdateStep(known("y2", out=[4]), sh.Broadcast(sh.Einsum("o+k, ; k, => o,"), x2, k)))
        sh.propagate_shapes(sh.UpdateStep(x2, sh.Transpose(sh.PointwiseUn(), known("x5", out=[5]))))
        sh.finish_inference()


def test_compose_contracted_axis_is_reduced():
    w, x = known("w", inp=[3], out=[4]), known("x", batch=[5], out=[3])
    proj = solve_step(sh.Shape.make(), sh.Broadcast(sh.Compose(), w, x))
    assert proj.product_space == (5, 4, 3)
    b, o, k = proj.product_iterators
    assert proj.project_lhs == (Iterator(b), Iterator(o))
    assert proj.project_rhs == ((Iterator(o), Iterator(k)), (Iterator(b), Iterator(k)))


def test_transpose_projections():
    x = known("x", inp=[2], out=[3])
    y = sh.Shape.make()
    proj = solve_step(y, sh.Transpose(sh.TransposeIO(), x))
    X = rand((3, 2))
    assert sh.to_dims(y) == (2, 3)
    assert np.allclose(run(proj, [X]), X.T)


def test_terminal_projections_iterate_the_whole_shape():
    s = sh.Shape.make(debug_name="lit")
    step = sh.UpdateStep(s, sh.Terminal(sh.ConstantFill(6)))
    sh.propagate_shapes(step)
    proj = sh.derive_projections(step)         # finishes inference on demand
    assert proj.product_space == (6,) and proj.lhs_dims == (6,) and proj.rhs_dims == ()


def test_same_tensor_twice_gets_separate_instances():
    x = known("x", out=[3])
    proj = solve_step(sh.Shape.make(), sh.Broadcast(sh.PointwiseBin(), x, x))
    (i,) = proj.product_iterators
    assert proj.project_rhs == ((Iterator(i),), (Iterator(i),))
    outer = solve_step(sh.Shape.make(), sh.Broadcast(sh.Einsum("i;j=>ij"), x, x))
    i, j = outer.product_iterators
    assert outer.project_rhs == ((Iterator(i),), (Iterator(j),))


def test_no_contamination_across_operations():
    """Axes that global inference made one variable (here input = output of `x`) keep separate
    iterators in an operation that does not relate them."""
    x = sh.Shape.make(batch_dims=[], input_dims=[None], output_dims=[None], deduced=sh.InputEqualsOutput(),
                      debug_name="x")
    sh.propagate_shapes(sh.UpdateStep(x, sh.Transpose(sh.PointwiseUn(), known("k", inp=[3], out=[1]))))
    copy = sh.UpdateStep(sh.Shape.make(debug_name="y"), sh.Transpose(sh.PointwiseUn(), x))
    sh.propagate_shapes(copy)
    sh.finish_inference()
    assert str(x) == "3->3"
    proj = sh.derive_projections(copy)
    i, j = proj.product_iterators
    assert proj.project_lhs == (Iterator(i), Iterator(j))
    X = rand((3, 3))
    assert np.allclose(run(proj, [X]), X)
