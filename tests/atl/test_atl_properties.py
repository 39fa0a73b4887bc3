"""Random well-typed programs: every pass, the normal form and Halide agree with the
interpreter on the original program, and the passes are fixed points."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atl_programs import SIGNATURE, programs, random_inputs
from einjit.atl import Func
from einjit.atl.gens import gen_normalize
from einjit.atl.interpret import interpret
from einjit.atl.lets import lift_lets
from einjit.atl.normalize import normal_form_of, normalize
from einjit.atl.pairs import eliminate_pairs
from einjit.atl.rewrite import alpha_equal
from einjit.atl.values import to_python

TOL = dict(rtol=1e-11, atol=1e-11)


def check_passes(f: Func, seed: int):
    values = [to_python(t, v) for t, v in zip(f.arg_types, random_inputs(seed), strict=True)]
    expected = interpret(f.typed, values)
    tf = f.typed
    for p in (eliminate_pairs, lift_lets, gen_normalize):
        tf = p(tf)
        np.testing.assert_allclose(interpret(tf, values), expected, **TOL, err_msg=p.__name__)
    nf = normal_form_of(f.typed)
    np.testing.assert_allclose(interpret(nf.to_typed_func(), values), expected, **TOL)
    for p in (eliminate_pairs, lift_lets, gen_normalize, normalize):
        assert alpha_equal(p(tf).body, tf.body), p.__name__
    return expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**31))
def test_passes_preserve_values(program, seed):
    _, e = program
    check_passes(Func(SIGNATURE, e), seed)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(max_depth=3), st.integers(0, 2**31))
def test_halide_agrees_with_the_interpreter(program, seed):
    pytest.importorskip("halide", reason="the Halide backend needs the optional extra "
                                         "einjit[halide]")
    _, e = program
    f = Func(SIGNATURE, e)
    expected = check_passes(f, seed)
    got = f.jit_exec(*random_inputs(seed))
    np.testing.assert_allclose(got, expected, **TOL)
