"""The extrema stage (`ir/sched/extrema.py`): max and min reductions split over lanes compute
what the original nests compute — bit for bit, NaNs included — under the interpreter and gcc."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einjit.backends.c_syntax import render_routine
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.optimize import STAGES, optimize_proc
from einjit.ir.sched.extrema import split_extrema
from einjit.ir.tnode import Tnode
from test_schedule import OFF, ON, local_nodes, run_c


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def row_extrema(n, h, m, op, prec=ops.single, own_first=True):
    """`r[i, j] = op over k of x[i, j, k]` the way lowering writes softmax's max: a fill with
    the neutral element, then i-j-k loops around one accumulation."""
    x, r = Tnode("x", (n, h, m), prec), Tnode("r", (n, h), prec)
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    own, term = ll.Get(r, it(i, j)), ll.Get(x, it(i, j, k))
    step = ll.Binop(op, own, term) if own_first else ll.Binop(op, term, own)
    fill = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, h - 1, ll.Set(r, it(i, j), ll.Constant(op.neutral))))
    nest = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, h - 1, ll.ForLoop(k, 0, m - 1, ll.Set(r, it(i, j), step))))
    return ll.seq(fill, nest), x, r


def reference(op, x):
    return (np.max if op is ops.Binop.MAX else np.min)(x, axis=-1)


@pytest.mark.parametrize("op", [ops.Binop.MAX, ops.Binop.MIN])
@pytest.mark.parametrize("own_first", [True, False])
@pytest.mark.parametrize("vector_bytes", [32, 64])
def test_split_extrema_are_bit_identical(op, own_first, vector_bytes):
    code, x, r = row_extrema(16, 4, 64, op, own_first=own_first)
    split = split_extrema(code, ON, vector_bytes)
    assert local_nodes(split) == {"lanes"}
    assert re.search(rf"float lanes_\d+\[{vector_bytes // 4}\]", render_routine("extrema", split).code)
    v = np.random.default_rng(1).standard_normal(x.dims).astype(np.float32)
    want = interpret.run(code, {x: v.copy()})[r]
    np.testing.assert_array_equal(want, reference(op, v))
    np.testing.assert_array_equal(interpret.run(split, {x: v.copy()})[r], want)
    np.testing.assert_array_equal(run_c(split, {x: v}, r), want)
    np.testing.assert_array_equal(run_c(code, {x: v}, r), want)


def test_a_nan_anywhere_in_a_row_makes_its_maximum_nan():
    code, x, r = row_extrema(16, 4, 64, ops.Binop.MAX)
    v = np.random.default_rng(2).standard_normal(x.dims).astype(np.float32)
    v[3, 1, 0] = v[5, 2, 63] = v[7, 0, 17] = np.nan
    v[8, 3, :] = -np.inf
    got = run_c(split_extrema(code, ON, 32), {x: v}, r)
    np.testing.assert_array_equal(got, np.max(v, axis=-1))
    assert np.isnan(got[3, 1]) and np.isnan(got[5, 2]) and np.isnan(got[7, 0])
    assert got[8, 3] == -math.inf


def test_integer_extrema_are_left_alone():
    code, *_ = row_extrema(16, 4, 64, ops.Binop.MAX, ops.int32)
    assert split_extrema(code, ON, 32) == code


def test_float_extrema_stay_sequential_without_reassociation():
    code, *_ = row_extrema(16, 4, 64, ops.Binop.MAX)
    assert split_extrema(code, OFF, 32) == code


@pytest.mark.parametrize("n,h,m", [(1, 2, 64), (16, 4, 60), (16, 4, 4)])
def test_small_or_uneven_reductions_are_left_alone(n, h, m):
    code, *_ = row_extrema(n, h, m, ops.Binop.MAX)
    assert split_extrema(code, ON, 32) == code


def test_a_reduction_over_two_loops_keeps_one_set_of_lanes():
    """`r[i] = max over j, k of x[i, j, k]`: the lhs loop moves out, both summed loops inside."""
    x, r = Tnode("x", (32, 4, 32)), Tnode("r", (32,))
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    step = ll.Binop(ops.Binop.MAX, ll.Get(r, it(i)), ll.Get(x, it(i, j, k)))
    fill = ll.ForLoop(i, 0, 31, ll.Set(r, it(i), ll.Constant(-math.inf)))
    code = ll.seq(fill, ll.ForLoop(i, 0, 31, ll.ForLoop(j, 0, 3, ll.ForLoop(k, 0, 31, ll.Set(r, it(i), step)))))
    split = split_extrema(code, ON, 32)
    assert split != code
    v = np.random.default_rng(4).standard_normal(x.dims).astype(np.float32)
    np.testing.assert_array_equal(run_c(split, {x: v}, r), v.max(axis=(1, 2)))
    np.testing.assert_array_equal(interpret.run(split, {x: v.copy()})[r], v.max(axis=(1, 2)))


def test_the_stage_runs_after_scheduling_and_before_interchange():
    names = [s.name for s in STAGES]
    assert names.index("schedule") < names.index("extrema") < names.index("interchange")
    code, x, r = row_extrema(16, 4, 64, ops.Binop.MAX)
    assert local_nodes(optimize_proc(code, name="softmax_max").llc) == {"lanes"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 5), h=st.integers(1, 3), m=st.sampled_from([8, 16, 24, 64]),
       op=st.sampled_from([ops.Binop.MAX, ops.Binop.MIN]), own_first=st.booleans(), seed=st.integers(0, 2**16),
       nans=st.integers(0, 3))
def test_random_extrema_match_numpy(n, h, m, op, own_first, seed, nans):
    code, x, r = row_extrema(n, h, m, op, own_first=own_first)
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(x.dims).astype(np.float32)
    for _ in range(nans):
        v[tuple(rng.integers(0, d) for d in x.dims)] = np.nan
    split = split_extrema(code, ON, 32)
    want = interpret.run(code, {x: v.copy()})[r]
    np.testing.assert_array_equal(want, reference(op, v))
    np.testing.assert_array_equal(interpret.run(split, {x: v.copy()})[r], want)
