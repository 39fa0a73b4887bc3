"""The program cache's key (`backends/cc/program_cache.key`) is taken from the graph without
deriving projections, and must still change with anything that changes the compiled
program: shapes, operations, einsum specs, precisions, constants, optimizer settings,
compiler options, the routine's name and einjit's own source."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import backends, train
from einjit import shape as sh
from einjit.backends.cc import program_cache
from einjit.backends.cc import toolchain as cc
from einjit.ir import assignments as asg
from einjit.ir import ops
from einjit.ir.naming import stable_names
from einjit.ir.optimize import VirtualizeSettings
from einjit.tensor.notation import as_asgns

BASE = dict(d=4, act="relu", spec="b | -> i; i -> o => b | -> o", prec=None, lr=0.1)


def model_code(d: int, act: str, spec: str, prec: ops.Prec | None, lr: float):
    """A two-layer step: an einsum with a square weight (so a transposed spec has the same
    shapes), an activation, a matmul, a sum."""
    x = ej.ndarray(np.linspace(-1, 1, 2 * d, dtype=np.float32).reshape(2, d), batch_axes=1, label="x")
    w = ej.param("w", input_dims=[d], output_dims=[d], prec=prec)
    v = ej.param("v", input_dims=[d], output_dims=[3])
    h = getattr(ej, act)(ej.einsum(spec, x, w, label="h"))
    loss = ej.sum(v @ h)
    train.init_params(loss)
    return [train.grad_update(loss), train.sgd_update(loss, lr)]


def key_of(settings: VirtualizeSettings | None = None, options: cc.CcOptions | None = None, name: str = "step",
           **changes: object) -> str:
    code = model_code(**{**BASE, **changes})  # type: ignore[arg-type]  # the test's own keywords
    compiler = backends.with_options(backends.resolve("cc"), options or cc.CcOptions())
    asgns = asg.sequence(*[as_asgns(c) for c in code])
    with stable_names():
        sh.finish_inference()
        key = program_cache.key(asgns, (), name, settings, compiler)
    assert key is not None
    return key


@pytest.fixture(autouse=True)
def _plain_compile(monkeypatch):
    for var in ("EINJIT_DUMP_DIR", "EINJIT_DEBUG", "EINJIT_PROFILE"):
        monkeypatch.delenv(var, raising=False)


def test_the_same_model_built_again_has_the_same_key():
    assert key_of() == key_of()


@pytest.mark.parametrize("change", [
    dict(d=5),
    dict(act="tanh"),
    dict(spec="b | -> i; o -> i => b | -> o"),  # the transposed weight: same shapes, other loops
    dict(prec=ops.as_prec("double")),
    dict(lr=0.05),
    dict(settings=VirtualizeSettings(max_visits=2)),
    dict(settings=VirtualizeSettings(reassociate=False)),
    dict(options=cc.CcOptions(threads=cc.CcOptions().threads + 1)),
    dict(options=cc.CcOptions(outline_min_nests=1)),
    dict(options=cc.CcOptions(flags=(*cc.CcOptions().flags, "-fno-unroll-loops"))),
    dict(options=cc.CcOptions(routine_unit_flags=())),
    dict(name="other"),
], ids=lambda c: ",".join(c))
def test_a_change_to_the_program_changes_the_key(change):
    assert key_of(**change) != key_of()


def test_a_change_to_einjits_source_changes_the_key(monkeypatch):
    base = key_of()
    monkeypatch.setattr(program_cache, "_einjit_fingerprint", lambda: "another einjit")
    assert key_of() != base


def test_the_key_derives_no_projections(monkeypatch):
    """The projections cost a local shape inference per operation, most of a warm compile:
    the key describes them by the operation's logic and solved rows instead."""
    derived = []
    original = sh.derive_projections
    monkeypatch.setattr(sh, "derive_projections", lambda step: derived.append(step) or original(step))
    key_of()
    assert derived == []


def commented_key(make) -> str:
    """The key of `model_code`'s step with its two parts arranged by `make(grad, update)`."""
    grad, update = (as_asgns(c) for c in model_code(**BASE))  # type: ignore[arg-type]  # the test's own keywords
    compiler = backends.with_options(backends.resolve("cc"), cc.CcOptions())
    with stable_names():
        sh.finish_inference()
        key = program_cache.key(make(grad, update), (), "step", None, compiler)
    assert key is not None
    return key


def test_block_comments_and_their_extent_are_part_of_the_key():
    """A block comment's message is a comment of the generated C, and which assignments it
    spans decides where: either change must miss."""
    keys = [commented_key(lambda g, u: asg.BlockComment("step", asg.sequence(g, u))),
            commented_key(lambda g, u: asg.BlockComment("other", asg.sequence(g, u))),
            commented_key(lambda g, u: asg.sequence(asg.BlockComment("step", g), u)),
            commented_key(lambda g, u: asg.sequence(g, u))]
    assert len(set(keys)) == 4
    assert commented_key(lambda g, u: asg.BlockComment("step", asg.sequence(g, u))) == keys[0]
