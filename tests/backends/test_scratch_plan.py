"""The scratch planner (`backends/scratch_plan.py`): the interval allocator never overlaps two
arrays live at once (a property test), zeroing moves to first use, and training steps give the
same bits with the planner on and off (the C is the same; only the scratch addresses differ)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import einjit as ej
from einjit import fit, memory, nn, train
from einjit.backends import c_syntax, scratch_plan
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend
from einjit.backends.scratch_plan import ALIGN, Interval, assign, sink_zero_outs
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import FixedIdx, Iterator, get_symbol
from einjit.ir.tnode import LOCAL, Tnode

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12), st.integers(1, 5000)), max_size=40))
def test_no_two_arrays_live_at_once_share_a_byte(raw):
    buffers = [Interval(first, first + span, nbytes) for first, span, nbytes in raw]
    offsets, size = assign(buffers)
    assert len(offsets) == len(buffers)
    spans = [(o, o + b.nbytes) for o, b in zip(offsets, buffers, strict=True)]
    for k, (a, sa) in enumerate(zip(buffers, spans, strict=True)):
        assert sa[0] % ALIGN == 0 and sa[1] <= size
        for b, sb in zip(buffers[k + 1:], spans[k + 1:], strict=True):
            if a.meets(b):
                assert not _overlap(sa, sb), (a, b, sa, sb)
    assert size <= sum(-(-b.nbytes // ALIGN) * ALIGN for b in buffers)
    peak = max((sum(b.nbytes for b in buffers if b.first <= t <= b.last) for t in range(43)), default=0)
    assert size >= peak                                                    # no plan beats the peak of live bytes


def _assign_pairwise(buffers: list[Interval]) -> tuple[tuple[int, ...], int]:
    """`assign` as it was written before it was vectorized: every placed buffer checked in
    Python, the gaps walked in order of their start."""
    order = sorted(range(len(buffers)), key=lambda k: (-buffers[k].nbytes, buffers[k].first, k))
    offsets: dict[int, int] = {}
    size = 0
    for k in order:
        need = -(-buffers[k].nbytes // ALIGN) * ALIGN
        busy = sorted((o, o + -(-buffers[j].nbytes // ALIGN) * ALIGN) for j, o in offsets.items()
                      if buffers[j].meets(buffers[k]))
        best: tuple[int, int] | None = None
        at = 0
        for lo, hi in busy:
            if lo - at >= need and (best is None or lo - at - need < best[0]):
                best = (lo - at - need, at)
            at = max(at, hi)
        offsets[k] = best[1] if best is not None else at
        size = max(size, offsets[k] + need)
    return tuple(offsets[k] for k in range(len(buffers))), size


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12), st.integers(1, 5000)), max_size=60))
def test_vectorized_plan_is_the_pairwise_one(raw):
    buffers = [Interval(first, first + span, nbytes) for first, span, nbytes in raw]
    assert assign(buffers) == _assign_pairwise(buffers)


def test_disjoint_lifetimes_share_bytes_and_meeting_ones_do_not():
    offsets, size = assign([Interval(0, 1, 1000), Interval(2, 3, 1000), Interval(1, 2, 100)])
    assert offsets[0] == offsets[1] == 0 and offsets[2] == 1024 and size == 1024 + 128
    offsets, size = assign([Interval(0, 4, 64), Interval(4, 5, 64)])       # both live in statement 4
    assert offsets == (0, 64) and size == 128


def _node(label: str, n: int) -> Tnode:
    return Tnode(label, (n,), memory_mode=LOCAL)


def _fill(tn: Tnode, value: float) -> ll.LLStmt:
    i = get_symbol()
    return ll.ForLoop(i, 0, tn.dims[0] - 1, ll.Set(tn, (Iterator(i),), ll.Constant(value)))


def test_zeroing_moves_to_the_first_use_and_the_others_keep_their_order():
    a, b, c = _node("a", 8), _node("b", 8), _node("c", 8)
    out = Tnode("out", (1,))
    code = ll.seq(ll.ZeroOut(a), ll.ZeroOut(b), ll.ZeroOut(c), _fill(c, 1.0), _fill(a, 2.0),
                  ll.Set(out, (FixedIdx(0),), ll.Get(a, (FixedIdx(0),))), _fill(b, 3.0))
    moved = list(ll.flatten(sink_zero_outs(code, {a, b})))
    assert [type(s).__name__ + ("" if not isinstance(s, ll.ZeroOut) else s.tn.label[0]) for s in moved] == [
        "ZeroOutc", "ForLoop", "ZeroOuta", "ForLoop", "Set", "ZeroOutb", "ForLoop"]
    assert sink_zero_outs(code, set()) is code
    first_use = scratch_plan.live_intervals(sink_zero_outs(code, {a, b}), [a, b, c])
    assert [(iv.first, iv.last) for iv in first_use] == [(2, 4), (5, 6), (0, 1)]


def test_an_array_read_before_any_write_shares_with_nothing():
    a, b = _node("a", 8), _node("b", 8)
    out = Tnode("out", (1,))
    code = ll.seq(ll.Set(out, (FixedIdx(0),), ll.Get(a, (FixedIdx(0),))), _fill(b, 1.0), _fill(b, 2.0))
    [ia, ib] = scratch_plan.live_intervals(code, [a, b])
    assert (ia.first, ia.last) == (0, 2) and ia.meets(ib)


def test_a_compiler_barrier_separates_arrays_that_share_bytes():
    a, b, c = _node("a", 8192), _node("b", 8192), _node("c", 64)                # 32 KiB: scratch, not stack
    out = Tnode("out", (1,))
    read = ll.Set(out, (FixedIdx(0),), ll.Get(a, (FixedIdx(0),)))
    code = ll.seq(_fill(a, 1.0), read, ll.ZeroOut(b), _fill(c, 2.0), _fill(b, 3.0),
                  ll.Set(out, (FixedIdx(0),), ll.Get(b, (FixedIdx(0),))))
    placed, plan = scratch_plan.place(code, c_syntax.C_SYNTAX)
    assert plan is not None and plan.offsets == (0, 0) and plan.size == 8192 * 4   # c sits on the stack
    stmts = list(ll.flatten(placed))
    barrier = next(k for k, s in enumerate(stmts) if isinstance(s, ll.StagedCompilation))
    assert [type(s).__name__ for s in stmts[barrier - 2:barrier + 3]] == [
        "Set", "ForLoop", "StagedCompilation", "ZeroOut", "ForLoop"]           # b's zeroing sunk past c's loop
    source = c_syntax.render_routine("shared_bytes", placed).code
    assert source.count(scratch_plan.BARRIER) == 1
    assert source.index(f"{out.name}[0] = {a.name}[0]") < source.index(scratch_plan.BARRIER) \
        < source.index(f"memset({b.name}")
    alone, plan = scratch_plan.place(ll.seq(_fill(a, 1.0), read), c_syntax.C_SYNTAX)
    assert plan is not None and not any(isinstance(s, ll.StagedCompilation) for s in ll.flatten(alone))


def test_a_larger_plan_under_the_same_name_gets_another_arena_and_the_first_stays(monkeypatch):
    monkeypatch.setenv("EINJIT_SCRATCH_PLAN", "1")
    backend = CcBackend()
    context = backend.init("arenas", share_host_arrays=True)
    routines = []
    for n in (8192, 4 * 8192, 8192):
        a = _node(f"a{n}", n)
        out = Tnode(f"out{n}", (1,))
        j = get_symbol()
        total = ll.ForLoop(j, 0, n - 1, ll.Set(out, (FixedIdx(0),), ll.Binop(
            ops.Binop.ADD, ll.Get(out, (FixedIdx(0),)), ll.Get(a, (Iterator(j),)))))
        code = ll.seq(ll.ZeroOut(a), _fill(a, 0.5), ll.ZeroOut(out), total)
        routines.append((n, out, backend.link(context, backend.compile((), code, shared=True, name="grow"))))
    assert [a.nbytes for a in context.arenas["grow"]] == [4 * 8192, 16 * 8192]   # the third reuses the first
    assert memory.report(context).scratch_bytes == 20 * 8192
    for _ in range(2):
        for n, out, routine in routines:                                 # each still writes its own arena
            routine()
            assert context.array(out)[0] == 0.5 * n


# ---------------------------------------------------------------- planner on and off, bit for bit


def _mlp(tag: str):
    rng = np.random.default_rng(1)
    x = ej.ndarray(rng.standard_normal((64, 48)).astype(np.float32), batch_axes=1, label=f"{tag}_x")
    y = ej.ndarray(np.sign(rng.standard_normal((64, 10))).astype(np.float32), batch_axes=1, label=f"{tag}_y")
    h = x
    for k, width in enumerate((96, 96, 10)):
        w = ej.param(f"{tag}_w{k}", output_dims=[width])
        h = ej.param(f"{tag}_b{k}", output_dims=[width], init="zeros") + w @ h
        if k < 2:
            h = ej.relu(h)
    loss = ej.div(ej.sum(ej.relu(1 - y * h), "...|... => 0"), 64)
    return loss, [train.sgd_update(loss, 0.05, momentum=0.9)], ()


def _convnet(tag: str):
    rng = np.random.default_rng(2)
    x = ej.ndarray(rng.standard_normal((8, 14, 14, 1)).astype(np.float32), batch_axes=1, label=f"{tag}_img")
    y = ej.ndarray(np.sign(rng.standard_normal((8, 10))).astype(np.float32), batch_axes=1, label=f"{tag}_y")
    k1 = ej.param(f"{tag}_k1", input_dims=[3, 3, 1], output_dims=[8])
    h = ej.relu(ej.einsum("...|oh+kh, ow+kw, ci; kh, kw, ci -> co => ...|oh, ow, co", x, k1))
    k2 = ej.param(f"{tag}_k2", input_dims=[3, 3, 8], output_dims=[16])
    h = ej.relu(ej.einsum("...|2*oh+kh, 2*ow+kw, ci; kh, kw, ci -> co => ...|oh, ow, co", h, k2))
    w = ej.param(f"{tag}_w", output_dims=[10])
    out = ej.einsum("...|oh, ow, co; oh, ow, co -> o => ...|o", h, w)
    loss = ej.div(ej.sum(ej.relu(1 - y * out), "...|... => 0"), 8)
    return loss, [train.sgd_update(loss, 0.05, momentum=0.9)], ()


def _gpt(tag: str):
    from einjit.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=24, block_size=32, n_layer=2, n_head=4, d_model=64), label=tag)
    x = ej.input(f"{tag}_tokens", batch_dims=[4, 32], prec="int32")
    y = ej.input(f"{tag}_targets", batch_dims=[4, 32], prec="int32")
    loss = nn.cross_entropy(model(x), y)
    ids = np.random.default_rng(3).integers(0, 24, (4, 33)).astype(np.int32)
    return loss, [nn.AdamW(model.params(), 1e-2).update()], ((x, y), (ids[:, :-1].copy(), ids[:, 1:].copy()))


def _train(build, tag: str, threads: int, planned: bool, monkeypatch) -> tuple[list[np.ndarray], object]:
    monkeypatch.setenv("EINJIT_SCRATCH_PLAN", "1" if planned else "0")
    loss, updates, feed = build(tag)
    train.init_params(loss, seed=0)
    backend = CcBackend(cc.CcOptions(threads=threads))
    context = backend.init(f"{tag}_{planned}", share_host_arrays=True)
    inputs, batch = feed if feed else ((), ())
    step = fit.train_step(loss, updates, inputs=list(inputs), name=f"{tag}_step", backend=backend, context=context)
    values = []
    for _ in range(3):
        step(*batch)
        values.append(np.array(loss.numpy(), copy=True))
    values += [np.array(p.numpy(), copy=True) for p in loss.params()]
    return values, step.routine


@pytest.mark.parametrize("machine", ["avx2", "avx512"])
@pytest.mark.parametrize("build", [_mlp, _convnet], ids=["mlp", "convnet"])
def test_steps_scheduled_for_either_machine_give_the_same_bits_planned(build, machine, monkeypatch):
    monkeypatch.setenv("EINJIT_MACHINE", machine)                        # other register blocks and panels
    tag = f"sp_{build.__name__[1:]}_{machine}"
    on, planned = _train(build, tag, 1, True, monkeypatch)
    off, _ = _train(build, tag, 1, False, monkeypatch)
    assert planned.scratch_plan.size < planned.scratch_plan.parts_bytes
    for a, b in zip(on, off, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("build", [_mlp, _convnet, _gpt], ids=["mlp", "convnet", "gpt"])
def test_steps_give_the_same_bits_with_the_planner_on_and_off(build, threads, monkeypatch):
    tag = f"sp_{build.__name__[1:]}_{threads}"
    on, planned = _train(build, tag, threads, True, monkeypatch)
    off, unplanned = _train(build, tag, threads, False, monkeypatch)
    plan = planned.scratch_plan
    assert plan is not None and plan.size < plan.parts_bytes                 # arrays do share bytes
    assert unplanned.scratch_plan is None
    assert planned.memory.scratch_bytes == plan.size < unplanned.memory.scratch_bytes
    assert len(on) == len(off) > 3
    for a, b in zip(on, off, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert np.isfinite(on[2]).all() and not np.array_equal(on[0], on[2])  # it trained
    report = planned.memory
    assert ("scratch arena", "Scratch arena", plan.size) in report.arrays
    assert f"scratch {memory.human(plan.size)} (one arena for {memory.human(report.scratch_parts_bytes)}" in str(report)
    if build is _gpt:
        assert report.scratch_parts_bytes > 2 * report.scratch_bytes      # most activations die within a few nests




_CACHED = """
import json, sys
sys.path.insert(0, {here!r})
import numpy as np
from einjit import train
from einjit.backends.cc import program_cache
from test_scratch_plan import _mlp
loss, updates, _ = _mlp("sp_cached")
train.init_params(loss, seed=0)
step = train.to_routine([train.grad_update(loss), *updates], name="sp_cached_step")
for _ in range(3):
    step()
plan = step.scratch_plan
print(json.dumps({{"hits": program_cache.stats.hits, "offsets": plan.offsets, "size": plan.size,
                  "loss": float(np.asarray(loss.numpy()).ravel()[0])}}))
"""


def test_a_program_cache_hit_links_by_the_recorded_plan(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, "EINJIT_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(here.parents[1] / "src"),
           "EINJIT_SCRATCH_PLAN": "1"}
    for var in ("EINJIT_DUMP_DIR", "EINJIT_DEBUG", "EINJIT_PROFILE"):
        env.pop(var, None)
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _CACHED.format(here=str(here))], env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert (first["hits"], second["hits"]) == (0, 1)
    assert (second["offsets"], second["size"], second["loss"]) == (first["offsets"], first["size"], first["loss"])
