"""The causal softmax's `exp(where(mask, s - max, 0))` loop is vectorized by gcc under the C
backend's flags: with jump threading on, gcc gave the masked path its own copy of the body (the
inline `exp` of 0 folds to 1), the store got two addresses and neither path was vectorized
(`CcOptions.flags`: `-fno-thread-jumps`). Read from gcc's own vectorization report."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.backends import c_syntax
from einjit.backends.cc import toolchain as cc
from einjit.ir import assignments as asg
from einjit.ir.optimize import optimize_proc
from einjit.shape import finish_inference


def _causal_step_source() -> str:
    """The training step of a causal softmax laid out as an attention's (batch, query, head,
    key), whose forward stores its `exp`s for the backward."""
    rng = np.random.default_rng(0)
    scores = ej.param("vec_scores", values=rng.standard_normal((2, 64, 2, 64)).astype(np.float32),
                      output_dims=[2, 64, 2, 64])
    keep = ej.causal_mask(scores, query_axis=-3, key_axis=-1)
    loss = ej.sum(ej.masked_softmax(scores, keep) * ej.ndarray(rng.standard_normal((2, 64, 2, 64))))
    code = train.grad_update(loss)
    finish_inference()
    train.init_params(loss)
    llc = optimize_proc(asg.to_low_level(code), name="masked_exp").llc
    return c_syntax.render_program([("masked_exp", llc)]).source


def test_the_masked_exp_loop_is_vectorized(tmp_path):
    options = cc.CcOptions()
    if shutil.which(options.compiler) is None or "gcc" not in options.compiler:
        pytest.skip("the report read here is gcc's")
    source = _causal_step_source()
    lines = source.splitlines()
    at = next(k for k, line in enumerate(lines) if re.search(r"\] = einjit_expf\(.*\? ", line))
    loop = max(k for k in range(at) if lines[k].lstrip().startswith("for ("))
    path = tmp_path / "masked_exp.c"
    path.write_text(source)
    flags = [f for f in options.flags if f not in ("-shared", "-fPIC")]
    report = subprocess.run([options.compiler, *flags, "-fopt-info-vec-optimized", "-c", "-o", str(tmp_path / "m.o"),
                             str(path)], capture_output=True, text=True, check=True).stderr
    assert re.search(rf"masked_exp\.c:{loop + 1}:\d+: optimized: loop vectorized", report), report
