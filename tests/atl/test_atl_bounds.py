"""Typecheck proves, from the guards around an access, that an affine index stays inside its
tensor (issue 14: bounds are static in ATL). Accepted programs compute the NumPy value in the
interpreter and through einjit; refused ones name the access."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.atl import B, Eq, Func, Gen, Idx, Ne, R, Rel, Sum, TCError, TTensor, Var
from einjit.atl.bounds import implied, stays_inside
from einjit.atl.ir import IConst, IVar, Lt

i, j = Idx("i"), Idx("j")
x = Var("x")
N = 6
XV = np.arange(1.0, N + 1.0) ** 2


def shifted(k: int, lo: int = 0, hi: int = N) -> np.ndarray:
    """`x[i+k]` where `lo <= i+k < hi` (and inside x), else 0."""
    return np.array([XV[m + k] if lo <= m + k < hi and 0 <= m + k < N else 0.0 for m in range(N)])


ACCEPTED = {
    "shift right under i+1 < N": (Gen(i, N, (i + 1 < N) * x[i + 1]), shifted(1)),
    "shift left under i >= 1": (Gen(i, N, (i >= 1) * x[i - 1]), shifted(-1)),
    "both under a conjunction": (Gen(i, N, ((i >= 1) & (i + 1 < N)) * (x[i - 1] + x[i + 1])),
                                 np.where((np.arange(N) >= 1) & (np.arange(N) + 1 < N), shifted(-1) + shifted(1), 0)),
    "padded convolution, nested guards": (
        Gen(i, N, Sum(j, 3, (i + j - 1 >= 0) * ((i + j - 1 < N) * x[i + j - 1]))),
        np.convolve(XV, np.ones(3), mode="same")),
    "stride 2 (integer bound)": (Gen(i, N, (2 * i < N) * x[2 * i]),
                                 np.array([XV[2 * m] if 2 * m < N else 0.0 for m in range(N)])),
    "a disjunction both of whose cases are safe": (Gen(i, N, ((i < 2) | (i + 1 < N)) * x[i + 1]), shifted(1)),
    "a negated comparison": (Gen(i, N, ~(i + 1 >= N) * x[i + 1]), shifted(1)),
    "an equality with another bound variable": (Gen(i, N, Sum(j, N, Eq(i + 1, j) * x[i + 1])), shifted(1)),
}


@pytest.mark.parametrize("name", ACCEPTED)
def test_guards_that_keep_the_index_inside_are_accepted(name):
    body, want = ACCEPTED[name]
    f = Func([("x", TTensor(N, R))], body)
    np.testing.assert_allclose(f.interpret(XV), want, rtol=0, atol=0)
    np.testing.assert_allclose(f.jit_exec(XV, backend="einjit"), want, rtol=1e-15)


def test_a_relation_of_the_tensors_extent_bounds_its_indices():
    f = Func([("M", TTensor(N, B)), ("x", TTensor(N, R))], Gen(i, N, Rel("M", i + 1) * x[i + 1]))
    mv = np.array([True, False, True, True, False, True])
    want = np.array([XV[m + 1] if m + 1 < N and mv[m + 1] else 0.0 for m in range(N)])
    np.testing.assert_array_equal(f.interpret(mv, XV), want)
    np.testing.assert_array_equal(f.jit_exec(mv, XV, backend="einjit"), want)


REFUSED = {
    "guard on the other side": (Gen(i, N, (i >= 1) * x[i + 1]), "x[i+1]"),
    "off by one": (Gen(i, N, (i + 1 <= N) * x[i + 1]), "x[i+1]"),
    "one unsafe case of a disjunction": (Gen(i, N, ((i < 2) | (i < N)) * x[i + 1]), "x[i+1]"),
    "a guard that mentions i but bounds nothing": (Gen(i, N, Ne(i, 2) * x[i + 1]), "x[i+1]"),
    "stride 2 bounded by the wrong extent": (Gen(i, N, (i < N) * x[2 * i]), "x[2*i]"),
    "the guard of another access": (Gen(i, N, (i + 1 < N) * x[i + 1] + x[i + 2]), "x[i+2]"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_guards_that_do_not_keep_the_index_inside_are_refused_naming_the_access(name):
    body, access = REFUSED[name]
    with pytest.raises(TCError) as err:
        Func([("x", TTensor(N, R))], body)
    assert len(err.value.errors) == 1
    assert f": {access};" in err.value.errors[0] and f"outside the extent {N}" in err.value.errors[0]


def test_the_message_says_the_guards_do_not_suffice():
    with pytest.raises(TCError) as err:
        Func([("x", TTensor(N, R))], Gen(i, N, (i >= 1) * x[i + 1]))
    assert err.value.errors == [f"index i+1 ranges over [1, {N}], outside the extent {N} of the tensor it reads, "
                                f"and the enclosing guards do not keep it inside [0, {N - 1}]: x[i+1]; "
                                f"guard it, e.g. (i+1 < {N}) * ..."]


def test_a_relation_wider_than_the_tensor_does_not_bound_it():
    with pytest.raises(TCError, match=r"do not keep it inside \[0, 5\]: x\[i\+1\]"):
        Func([("M", TTensor(N + 1, B)), ("x", TTensor(N, R))], Gen(i, N, Rel("M", i + 1) * x[i + 1]))


def test_proof_by_hand_built_inequalities():
    """`bounds` alone: `i < 3` keeps `2*i+1` (at most 5) inside 6 cells but not inside 5."""
    iv = IVar("i")
    guard = implied(Lt(iv, IConst(3)), {})
    ix = 2 * iv + 1
    assert stays_inside(ix, 6, [guard], {"i": 10})
    assert not stays_inside(ix, 5, [guard], {"i": 10})
    assert not stays_inside(ix, 6, [], {"i": 10})
    assert stays_inside(ix, 6, [], {"i": 3})
    assert stays_inside(ix, 1, [implied(Lt(iv, IConst(0)), {})], {"i": 10})  # no i satisfies the guard
