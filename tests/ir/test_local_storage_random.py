"""Random programs with routine-local storage: gcc against the interpreter, local storage on
and off. Virtualization is off, so every intermediate is stored and the ones the routine
consumes become local (`ir/passes/local_storage.py`)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, Phase, find, given, settings

from einjit.backends.cc.backend import CcBackend, run_once
from einjit.ir import interpret
from einjit.ir import low_level as ll
from einjit.ir.optimize import optimize_proc
from einjit.ir.passes.local_storage import is_routine_local
from einjit.ir.passes.tracing import VirtualizeSettings
from test_random_programs import _scale, build, programs

STORED = VirtualizeSettings(virtualize=False)
LOCAL_OFF = VirtualizeSettings(virtualize=False, local_storage=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs())
def test_local_storage_agrees_with_the_interpreter_and_with_local_storage_off(program):
    llc, tns, inputs = build(program)
    want = interpret.run(llc, {tn: v.copy() for tn, v in inputs.items()})
    results = []
    for opt_settings in (STORED, LOCAL_OFF):
        llc, tns, inputs = build(program)
        code = optimize_proc(llc, settings=opt_settings)
        ctx = run_once(code, inputs, name="local_random", context=CcBackend().init("local_random"))
        results.append({tn_k: ctx.array(tn) for tn_k, (tn, spec) in enumerate(zip(tns, program.nodes, strict=True))
                        if spec.host and tn in want})
        atol = 1e-9 * (1.0 + _scale([want.get(tn) for tn in tns]))
        for k, got in results[-1].items():
            np.testing.assert_allclose(got, want[tns[k]], rtol=1e-9, atol=atol, equal_nan=True,
                                       err_msg=tns[k].debug_name())
    on, off = results
    assert on.keys() == off.keys()
    for k in on:
        np.testing.assert_array_equal(on[k], off[k])


def test_the_random_programs_reach_local_storage():
    """The generator does produce programs with routine-local nodes, so the property above
    exercises them (the same optimization and localization as `run_once`, without gcc)."""

    def has_local(program) -> bool:
        llc, _, _ = build(program)
        code = optimize_proc(llc, settings=STORED)
        CcBackend().compile((), code, name="reach")   # not shared: localizes, compiles nothing yet
        return any(is_routine_local(tn) for tn in ll.nodes_of(code.llc))

    find(programs(), has_local, settings=settings(max_examples=200, database=None, phases=[Phase.generate]))
