"""Property tests of projection inference against NumPy for what issue 14 added: fixed indices
on both sides of a spec (the result side keeps a dimension-1 axis, or `index + 1` cells), and
padded, strided, dilated convolution axes."""

import string

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from einjit import shape as sh
from shape_eval import run

RNG = np.random.default_rng(1)


def known(name="", out=()):
    return sh.Shape.make(batch_dims=[], input_dims=[], output_dims=list(out), debug_name=name)


def solve_step(cur, logic):
    step = sh.UpdateStep(cur, logic)
    sh.propagate_shapes(step)
    sh.finish_inference()
    return sh.derive_projections(step)


@st.composite
def fixed_cases(draw):
    """A unary spec over distinct labels where some argument axes are fixed indices and the
    result mixes labels with fixed indices."""
    n = draw(st.integers(1, 4))
    dims = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    fixed = {a: draw(st.integers(0, dims[a] - 1)) for a in range(n) if draw(st.booleans())}
    labels = [string.ascii_lowercase[a] for a in range(n) if a not in fixed]
    kept = draw(st.permutations(labels).map(lambda p: list(p[:draw(st.integers(0, len(p)))])))
    result = list(kept)
    for _ in range(draw(st.integers(0, 2))):
        result.insert(draw(st.integers(0, len(result))), draw(st.integers(0, 2)))
    return dims, fixed, result


@settings(max_examples=80, deadline=None)
@given(fixed_cases())
def test_fixed_indices_on_both_sides_match_numpy(case):
    dims, fixed, result = case
    rhs = [str(fixed[a]) if a in fixed else string.ascii_lowercase[a] for a in range(len(dims))]
    spec = f"{', '.join(rhs)}, => {', '.join(str(e) for e in result)},"
    x = known("x", out=dims)
    y = sh.Shape.make(debug_name="y")
    proj = solve_step(y, sh.Transpose(sh.Permute(spec), x))
    # NumPy: slice the fixed argument axes, sum the labels the result drops, and place the
    # sum at the result's fixed positions in an axis of `index + 1` cells.
    X = RNG.standard_normal(tuple(dims))
    sliced = X[tuple(fixed.get(a, slice(None)) for a in range(len(dims)))]
    free = [string.ascii_lowercase[a] for a in range(len(dims)) if a not in fixed]
    kept = [e for e in result if isinstance(e, str)]
    summed = np.einsum(f"{''.join(free)}->{''.join(kept)}", sliced)
    out_dims = tuple(dims[ord(e) - ord("a")] if isinstance(e, str) else e + 1 for e in result)
    expected = np.zeros(out_dims)
    at = tuple(slice(None) if isinstance(e, str) else e for e in result)
    expected[at] = summed
    assert sh.to_dims(y) == out_dims
    np.testing.assert_allclose(run(proj, [X]), expected, rtol=1e-12, atol=1e-12)


@st.composite
def conv_cases(draw):
    k = draw(st.integers(1, 4))
    dil = draw(st.integers(1, 3))
    stride = draw(st.integers(1, 3))
    left = draw(st.integers(0, dil * (k - 1)))
    right = draw(st.one_of(st.just(left), st.integers(0, dil * (k - 1))))  # symmetric or not
    n = draw(st.integers(max(1, dil * (k - 1) + 1 - left - right), 12))
    return n, k, stride, dil, (left, right), draw(st.booleans())


@settings(max_examples=80, deadline=None)
@given(conv_cases())
def test_padded_convolutions_match_numpy(case):
    n, k, stride, dil, (left, right), with_channels = case
    axis = f"{stride}*o+{dil}*k" + (f"-{left}" if left or right else "") + (f":{right}" if right != left else "")
    spec = f"{axis}, c; k, c -> f => o, f" if with_channels else f"{axis}, ; k, => o,"
    c, f = (2, 3) if with_channels else (1, 1)
    x = known("x", out=[n, c] if with_channels else [n])
    kern = (sh.Shape.make(batch_dims=[], input_dims=[k, c], output_dims=[f], debug_name="k") if with_channels
            else known("k", out=[k]))
    y = sh.Shape.make(debug_name="y")
    proj = solve_step(y, sh.Broadcast(sh.Einsum(spec), x, kern))
    n_out = (n + left + right - dil * (k - 1) - 1) // stride + 1
    X = RNG.standard_normal((n, c))
    K = RNG.standard_normal((f, k, c))
    Xp = np.pad(X, ((left, right), (0, 0)))
    taps = stride * np.arange(n_out)[:, None] + dil * np.arange(k)[None, :]
    expected = np.einsum("okc,fkc->of", Xp[taps], K)
    if with_channels:
        assert sh.to_dims(y) == (n_out, f)
        np.testing.assert_allclose(run(proj, [X, K]), expected, rtol=1e-12, atol=1e-12)
    else:
        assert sh.to_dims(y) == (n_out,)
        np.testing.assert_allclose(run(proj, [X[:, 0], K[0, :, 0]]), expected[:, 0], rtol=1e-12, atol=1e-12)
