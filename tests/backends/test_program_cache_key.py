"""The program cache's key (`backends/cc/program_cache.key`) is taken from the graph without
deriving projections, and must still change with anything that changes the compiled
program: shapes, operations, einsum specs, precisions, constants, optimizer settings,
compiler options, the routine's name and einjit's own source."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import einjit as ej
from einjit import backends, train
from einjit import shape as sh
from einjit.backends.cc import program_cache
from einjit.backends.cc import toolchain as cc
from einjit.ir import assignments as asg
from einjit.ir import ops, optimize
from einjit.ir.indexing import StaticSymbol, get_symbol
from einjit.ir.naming import stable_names
from einjit.ir.optimize import VirtualizeSettings
from einjit.ir.tnode import Tnode
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


def test_the_machine_the_scheduler_prices_for_is_part_of_the_key(monkeypatch):
    """`EINJIT_MACHINE` changes the register blocks, not the compiler's flags (`-march=native`
    stays): a program scheduled for one description must not be replayed for another."""
    keys = []
    for machine in ("avx512", "avx2", "generic"):
        monkeypatch.setenv("EINJIT_MACHINE", machine)
        keys.append(key_of())
    assert len(set(keys)) == 3


def test_the_optimizer_stages_are_part_of_the_key(monkeypatch):
    """A stage left out, or replaced by another function under its name, changes the C."""
    base = key_of()
    stages = optimize.STAGES
    monkeypatch.setattr(optimize, "STAGES", tuple(s for s in stages if s.name != "fuse"))
    without_fuse = key_of()
    monkeypatch.setattr(optimize, "STAGES", tuple(dataclasses.replace(s, run=lambda run, code: code)
                                                  if s.name == "fuse" else s for s in stages))
    replaced = key_of()
    assert len({base, without_fuse, replaced}) == 3
    monkeypatch.setattr(optimize, "STAGES", stages)
    assert key_of() == base


def test_measured_tiles_are_part_of_the_key(monkeypatch):
    base = key_of()
    monkeypatch.setenv("EINJIT_SEARCH", "1")
    searched = key_of()
    monkeypatch.setenv("EINJIT_SEARCH_CANDIDATES", "2")
    assert len({base, searched, key_of()}) == 3


def varied_program() -> asg.Asgns:
    """Every assignment kind: a small `models.GPT` step (gathers by id, ternary operations,
    constant fetches), a batch slice, and hand-built ones: a sum reading a merge buffer, a
    slice fetch."""
    from einjit import nn
    from einjit.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=2, d_model=8), label="tiny")
    tokens = ej.input("tokens", batch_dims=[2, 4], prec="int32")
    loss = nn.cross_entropy(model(tokens), ej.input("targets", batch_dims=[2, 4], prec="int32"))
    train.init_params(loss, seed=0)
    batch = StaticSymbol(get_symbol("b"))
    data = ej.ndarray(np.arange(12, dtype=np.float32).reshape(3, 4), batch_axes=1, label="data")
    sliced = ej.where(ej.batch_slice(data, batch) - 5.0, data, 1.0)
    a, b, c, d = (Tnode([n], (3,)) for n in "abcd")
    merged = asg.AccumBinop(True, ops.Binop.ADD, ops.Binop.MUL, c, asg.Node(a), asg.MergeBuffer(b),
                            asg.Lazy(lambda: None, key=lambda: ("merged", 3)))  # type: ignore[arg-type, return-value]  # never forced
    code = [train.grad_update(loss), train.sgd_update(loss, 0.1), sliced]
    return asg.sequence(*[as_asgns(x) for x in code],
                        asg.BlockComment("hand-built", asg.sequence(merged, asg.Fetch(d, asg.Slice(batch, a)))))


def test_each_assignment_kinds_text_is_the_generic_text():
    """The key's walk describes the common assignment kinds field by field (`_ASSIGNMENT_TEXTS`):
    each text must be what the generic walk over the dataclass gives, and the nodes those
    walks collect must be `asg.guessed_nodes` in its order."""
    asgns = varied_program()
    with stable_names():
        sh.finish_inference()
        walk, generic = program_cache._Walk(), program_cache._Walk()
        texts = walk.program(asgns)
        flat = asg.flatten_with_comments(asgns)
        kinds = {type(a) for a in flat}
        assert {asg.AccumBinop, asg.AccumUnop, asg.AccumTernop, asg.Fetch} <= kinds
        assert any(isinstance(a, asg.Fetch) and isinstance(a.fetch_op, asg.Slice) for a in flat)
        assert [t for t in texts if not t.startswith("#") and t != "]"] == [generic.text(a) for a in flat]
        assert list(walk.nodes) == asg.guessed_nodes(asgns)
