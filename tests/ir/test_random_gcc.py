"""Differential testing of the C backend: random lowered programs, optimized and compiled by
gcc, compute what the reference interpreter computes on the unoptimized program. (Two gcc 12
vectorizer miscompilations were found this way; see `cc.CcOptions`.)"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import interpret
from einjit.ir.optimize import optimize_proc
from test_random_programs import SETTINGS, _scale, build, programs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(), opt_settings=st.sampled_from(SETTINGS), optimize=st.booleans())
def test_gcc_agrees_with_the_interpreter(program, opt_settings, optimize):
    llc, tns, inputs = build(program)
    want = interpret.run(llc, {tn: v.copy() for tn, v in inputs.items()})
    llc, tns, inputs = build(program)
    code = optimize_proc(llc, settings=opt_settings) if optimize else llc
    ctx = run_once(code, inputs, name="random_program", context=CcBackend().init("random"))
    atol = 1e-9 * (1.0 + _scale([want.get(tn) for tn in tns]))
    for tn, spec in zip(tns, program.nodes, strict=True):
        if spec.host and tn in want:
            np.testing.assert_allclose(ctx.array(tn), want[tn], rtol=1e-9, atol=atol, equal_nan=True,
                                       err_msg=tn.debug_name())
