"""Routine names that are C keywords or library names, `init_params` over several tensors, and
`@einjit.op` under a profiler (a Python hook and cProfile)."""

from __future__ import annotations

import cProfile
import pstats
import sys

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.backends import c_syntax
from einjit.backends.cc.backend import CcBackend
from einjit.backends.gpu import cuda_syntax
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.c_names import c_name
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.tnode import Tnode

NAMES = ["exp", "expf", "sqrtl", "int", "float", "class", "new", "free", "malloc", "main", "memcpy", "abort",
         "min", "_x", "__y", "_Z", "einjit_uniform01", "EINJIT_CLAMP", "NAN"]


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


@pytest.mark.parametrize("name", NAMES)
def test_reserved_routine_names_compile_and_run(name):
    x = ej.ndarray(np.array([1.5, -2.0, 3.0]))
    y = ej.relu(x) * 2.0
    routine = train.to_routine(train.forward(y), name=name)
    routine()
    np.testing.assert_array_equal(y.value.numpy(), [3.0, 0.0, 6.0])
    assert routine.name == c_name(name) != name


@pytest.mark.parametrize("name", ["exp", "_x", "free"])
def test_reserved_names_through_the_context_specialized_backend(name):
    """The C backend's specialized entry points (`NAME` calling `NAME_body`) mangle too."""
    a, out = Tnode("a", (3,), prec=ops.double), Tnode("out", (3,), prec=ops.double)
    i = get_symbol()
    code = ll.ForLoop(i, 0, 2, ll.Set(out, (Iterator(i),), ll.Unop(ops.Unop.NEG, ll.Get(a, (Iterator(i),)))))
    backend = CcBackend()
    ctx = backend.init("cpu")
    a.host_array()[...] = [1.0, -4.0, 0.5]
    backend.from_host(ctx, a)
    backend.link(ctx, backend.compile((), code, name=name))()
    backend.to_host(ctx, out)
    np.testing.assert_array_equal(out.host_array(), [-1.0, 4.0, -0.5])


def test_plain_names_are_kept_and_mangled_names_cannot_collide():
    assert [c_name(n) for n in ("step", "train_step", "exp2_", "r_x")] == ["step", "train_step", "exp2_", "r_x"]
    assert [c_name(n) for n in ("exp", "_x", "while")] == ["exp_", "r_x", "while_"]
    i = get_symbol()
    out = Tnode("o", (2,))
    code = ll.ForLoop(i, 0, 1, ll.Set(out, (Iterator(i),), ll.Constant(1.0)))
    with pytest.raises(c_syntax.RenderError,
                       match=r"routine names must be distinct in one program once mangled, repeated: \['exp_'\]"):
        c_syntax.render_program([("exp", code), ("exp_", code)])
    with pytest.raises(c_syntax.RenderError, match="not a C identifier"):
        c_syntax.render_program([("x-y", code)])
    kernel = cuda_syntax.render_program([("sin", code)])
    assert kernel.kernels[0].name == "sin_" and 'extern "C" __global__ void sin_(' in kernel.source


def test_init_params_over_a_list_of_tensors():
    p = ej.param("p", output_dims=[3])
    q = ej.param("q", output_dims=[2], init="uniform")
    t1, t2 = ej.relu(p), q * 2.0
    train.init_params([t1, t2], seed=3)
    rng = np.random.default_rng(3)
    want_p = rng.standard_normal(3) * np.sqrt(2.0)
    want_q = rng.uniform(-1.0, 1.0, 2)
    np.testing.assert_allclose(p.value.numpy(), want_p, rtol=1e-12)
    np.testing.assert_allclose(q.value.numpy(), want_q, rtol=1e-12)
    train.init_params([p], seed=5)
    np.testing.assert_allclose(p.value.numpy(), np.random.default_rng(5).standard_normal(3) * np.sqrt(2.0),
                               rtol=1e-12)


@ej.op
def layer(x):
    hidden = ej.relu(ej.param("w", output_dims=[2]) @ x)
    return hidden + ej.param("b", output_dims=[2], init="zeros")


def labels_of(t):
    return {".".join(s.label) for s in t.subtree()}


def test_op_label_capture_chains_to_a_python_profile_hook():
    seen = []

    def hook(frame, event, arg):
        seen.append((frame.f_code.co_name, event))

    sys.setprofile(hook)
    try:
        out = layer(ej.ndarray(np.ones(3)), label="hooked")
    finally:
        sys.setprofile(None)
    assert ("layer", "call") in seen and ("layer", "return") in seen
    assert seen.count(("relu", "call")) == 1
    assert "hooked.hidden" in labels_of(out)


def test_op_runs_under_cprofile():
    prof = cProfile.Profile()
    prof.enable()
    try:
        out = layer(ej.ndarray(np.ones(3)), label="profiled")
        value = train.forward_once(out)
        assert sys.getprofile() is not None
    finally:
        prof.disable()
    stats = pstats.Stats(prof)
    assert any(name == "layer" for _, _, name in stats.stats)
    assert value.shape == (2,)
    assert "profiled.w" in labels_of(out)
