"""The copy propagation stage (`ir/sched/copies.py`): a nest that only copies an array is
dropped and its readers read the source, bit for bit the same values under the interpreter
and gcc; copies whose source changes later, whose destination is a result, is written again
or may not be routine-local stay."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from einjit.ir import interpret, ops, optimize
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.sched import nests
from einjit.ir.sched.copies import propagate_copies
from einjit.ir.tnode import LOCAL, MATERIALIZED, Tnode
from test_schedule import run_c

N, M = 5, 7


def nest(out, body_of, dims=(N, M)):
    """`out[i, j] = body_of(i, j)` over fresh loop symbols."""
    syms = [get_symbol(c) for c in "ij"[:len(dims)]]
    body = ll.Set(out, tuple(Iterator(s) for s in syms), body_of(*syms))
    for s, n in reversed(list(zip(syms, dims, strict=True))):
        body = ll.ForLoop(s, 0, n - 1, body)
    return body


def get(tn, i, j):
    return ll.Get(tn, (Iterator(i), Iterator(j)))


def copy(dst, src):
    return nest(dst, lambda i, j: get(src, i, j))


def scaled(out, src, c):
    return nest(out, lambda i, j: ll.Binop(ops.Binop.MUL, get(src, i, j), ll.Constant(c)))


def nodes(*names, mode=MATERIALIZED):
    return [Tnode(name, (N, M), memory_mode=mode) for name in names]


def written(code):
    return {x.tn.label[0] for x in ll.deep_parts(code) if isinstance(x, ll.Set)}


def check_same(code, new, inputs, outs):
    """`new` computes what `code` does: the interpreter on both, and gcc on `new`."""
    want = interpret.run(code, {tn: v.copy() for tn, v in inputs.items()})
    got = interpret.run(new, {tn: v.copy() for tn, v in inputs.items()})
    for out in outs:
        np.testing.assert_array_equal(got[out], want[out])
        np.testing.assert_array_equal(run_c(new, inputs, out), want[out])
    return want


def test_a_copy_is_dropped_and_its_readers_read_the_source():
    x, a, y = nodes("x", "a", "y")
    (b,) = nodes("b", mode=LOCAL)
    code = ll.seq(scaled(a, x, 2.0), copy(b, a), scaled(y, b, 3.0))
    new = propagate_copies(code)
    assert written(new) == {"a", "y"} and b not in ll.nodes_of(new)
    v = np.random.default_rng(0).standard_normal((N, M)).astype(np.float32)
    want = check_same(code, new, {x: v}, [y])
    np.testing.assert_allclose(want[y], v * 6, rtol=1e-6)


def test_a_chain_of_copies_collapses():
    x, a, y = nodes("x", "a", "y")
    b, c = nodes("b", "c", mode=LOCAL)
    code = ll.seq(scaled(a, x, 2.0), copy(b, a), copy(c, b), scaled(y, c, 1.5), scaled(y, b, 0.5))
    new = propagate_copies(code)
    assert written(new) == {"a", "y"}
    v = np.random.default_rng(1).standard_normal((N, M)).astype(np.float32)
    check_same(code, new, {x: v}, [y])


def test_a_source_written_after_the_copy_keeps_it():
    x, a, y = nodes("x", "a", "y")
    (b,) = nodes("b", mode=LOCAL)
    code = ll.seq(scaled(a, x, 2.0), copy(b, a), scaled(a, x, 5.0), scaled(y, b, 3.0))
    assert propagate_copies(code) == code


@pytest.mark.parametrize("case", ["result", "written again", "materialized", "read before", "off"])
def test_copies_that_must_stay(case):
    x, a, y = nodes("x", "a", "y")
    (b,) = nodes("b", mode=MATERIALIZED if case == "materialized" else LOCAL)
    steps = [scaled(a, x, 2.0), copy(b, a)]
    if case == "read before":
        steps.insert(0, scaled(y, b, 1.0))
    if case == "written again":
        steps.append(nest(b, lambda i, j: ll.Binop(ops.Binop.ADD, get(b, i, j), get(x, i, j))))
    if case != "result":
        steps.append(scaled(y, b, 3.0))
    code = ll.seq(*steps)
    assert propagate_copies(code, local_storage=case != "off") == code


def test_a_copy_of_part_of_an_array_or_another_shape_stays():
    x, a, y = nodes("x", "a", "y")
    b = Tnode("b", (N, M - 1), memory_mode=LOCAL)
    part = nest(b, lambda i, j: get(a, i, j), (N, M - 1))
    code = ll.seq(scaled(a, x, 2.0), part, nest(y, lambda i, j: get(b, i, j), (N, M - 1)))
    assert propagate_copies(code) == code


def _residual_mlp_grads(with_copies: bool, threads: int, monkeypatch):
    """Gradients of `sum(r * y2)`, `y2 = y1 + gelu(fc2(y1))`, `y1 = h + gelu(fc1(h))`,
    `h = x * s`: backprop through the additions (the residual stream's and the biases') copies
    a sum's gradient into each addend's, and the stream's gradient is added to again by the
    block below (the copies the stage coalesces)."""
    import einjit as ej
    from einjit import nn, train
    from einjit.backends.cc import toolchain as cc

    dropped = []
    if with_copies:
        def counted(code, **kw):
            new = propagate_copies(code, **kw)
            dropped.append(len(list(ll.flatten(code))) - len(list(ll.flatten(new))))
            return new
        monkeypatch.setattr(optimize, "propagate_copies", counted)
    else:
        monkeypatch.setattr(optimize, "STAGES", tuple(s for s in optimize.STAGES if s.name != "copies"))
    rng = np.random.default_rng(3)
    tag = f"{'on' if with_copies else 'off'}{threads}"
    xv, rv = (rng.standard_normal((6, 16)).astype(np.float32) for _ in range(2))
    s = ej.param(f"copies_{tag}_s", (rng.standard_normal(16) * 0.5 + 1).astype(np.float32))
    fc1, fc2 = nn.Linear(16, 16, label=f"copies_{tag}_fc1"), nn.Linear(16, 16, label=f"copies_{tag}_fc2")
    h = ej.ndarray(xv, batch_axes=1, label=f"copies_{tag}_x") * s
    y1 = h + ej.gelu(fc1(h), "tanh")
    y2 = y1 + ej.gelu(fc2(y1), "tanh")
    loss = ej.sum(y2 * ej.ndarray(rv, batch_axes=1, label=f"copies_{tag}_r"), label=f"copies_{tag}_loss")
    train.init_params(loss, seed=0)
    params = [s, *fc1.params(), *fc2.params()]
    values = [p.value.numpy().copy() for p in params]
    train.to_routine(train.grad_update(loss), name=f"copies_{tag}", options=cc.CcOptions(threads=threads))()
    monkeypatch.undo()
    return [p.grad.numpy().copy() for p in params], values, (xv, rv), sum(dropped)


@pytest.mark.parametrize("threads", [1, 2])
def test_residual_and_bias_gradients_are_the_same_with_and_without_the_stage(threads, monkeypatch):
    """Differential through the whole optimizer and gcc, at one and two threads: bit-identical
    gradients with and without the stage (which drops copies here), and PyTorch's."""
    on, values, (xv, rv), dropped = _residual_mlp_grads(True, threads, monkeypatch)
    off, values_off, _, _ = _residual_mlp_grads(False, threads, monkeypatch)
    assert dropped >= 3  # 2 without coalescing
    for a, b in zip(values, values_off, strict=True):
        np.testing.assert_array_equal(a, b)
    for got, want in zip(on, off, strict=True):
        np.testing.assert_array_equal(got, want)
    torch = pytest.importorskip("torch")
    ts, tw1, tb1, tw2, tb2 = (torch.tensor(v, requires_grad=True) for v in values)
    h = torch.tensor(xv) * ts
    y1 = h + torch.nn.functional.gelu(h @ tw1.T + tb1, approximate="tanh")
    y2 = y1 + torch.nn.functional.gelu(y1 @ tw2.T + tb2, approximate="tanh")
    (y2 * torch.tensor(rv)).sum().backward()
    for got, t in zip(on, (ts, tw1, tb1, tw2, tb2), strict=True):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-4, atol=1e-5)


def add_into(out, src):
    """`out[i, j] := out[i, j] + src[i, j]` (the block input's gradient adding LayerNorm's)."""
    return nest(out, lambda i, j: ll.Binop(ops.Binop.ADD, get(out, i, j), get(src, i, j)))


def test_a_copy_into_a_node_written_again_is_coalesced_into_the_source_writers():
    """The residual stream's gradient: `a` is copied into `b`, which is added to later, so
    `b`'s readers cannot read `a`; `a`'s writers write `b` instead and its readers read `b`,
    under the interpreter and gcc."""
    x, b, y = nodes("x", "b", "y")
    (a,) = nodes("a", mode=LOCAL)
    code = ll.seq(scaled(a, x, 2.0), add_into(a, x), copy(b, a), scaled(y, a, 3.0), add_into(b, y))
    new = propagate_copies(code)
    assert written(new) == {"b", "y"} and a not in ll.nodes_of(new)
    assert len(list(ll.flatten(new))) == 4
    v = np.random.default_rng(4).standard_normal((N, M)).astype(np.float32)
    want = check_same(code, new, {x: v}, [b, y])
    np.testing.assert_array_equal(want[b], (v * 2 + v) + (v * 2 + v) * 3)


def test_coalesced_chains_end_in_the_last_copy():
    """`a := 2x; b := a; b += x; c := b; c += x`, `a` and `b` local: all of it is `c`'s."""
    x, c, y = nodes("x", "c", "y")
    a, b = nodes("a", "b", mode=LOCAL)
    code = ll.seq(scaled(a, x, 2.0), copy(b, a), scaled(y, a, 1.0), add_into(b, x), copy(c, b),
                  add_into(y, b), add_into(c, x))
    new = propagate_copies(code)
    assert written(new) == {"c", "y"}
    v = np.random.default_rng(5).standard_normal((N, M)).astype(np.float32)
    check_same(code, new, {x: v}, [c, y])


def test_a_sum_gradient_copied_into_both_branches_loses_both_copies():
    """The residual stream's gradient `a` goes to the block's branch `b` (read only) and to the
    stream `s` (added to later): `b`'s readers read `a` first, then `a` is coalesced into `s`.
    Coalescing first would have written `s` where `b := s` still needed `a`'s cells."""
    x, s, y = nodes("x", "s", "y")
    a, b = nodes("a", "b", mode=LOCAL)
    code = ll.seq(scaled(a, x, 2.0), copy(s, a), copy(b, a), scaled(y, b, 3.0), add_into(s, x))
    new = propagate_copies(code)
    assert written(new) == {"s", "y"} and len(list(ll.flatten(new))) == 3
    v = np.random.default_rng(7).standard_normal((N, M)).astype(np.float32)
    check_same(code, new, {x: v}, [s, y])


@pytest.mark.parametrize("case", ["read after the target's rewrite", "source written after", "target read between",
                                  "source read first", "source materialized"])
def test_copies_that_cannot_be_coalesced(case):
    x, b, y = nodes("x", "b", "y")
    (a,) = nodes("a", mode=MATERIALIZED if case == "source materialized" else LOCAL)
    steps = [scaled(a, x, 2.0), copy(b, a), add_into(b, x)]
    if case == "read after the target's rewrite":
        steps.append(scaled(y, a, 3.0))
    if case == "source written after":
        steps.append(add_into(a, x))
    if case == "target read between":
        steps.insert(1, scaled(y, b, 1.0))
    if case == "source read first":
        steps[0] = add_into(a, x)
    code = ll.seq(*steps)
    assert propagate_copies(code) == code


def test_comments_name_the_node_the_statement_now_reads():
    """A dropped copy's readers read its source, and their comments say so (the generated C's
    comments named a node that no longer exists)."""
    x, a, y = nodes("x", "a", "y")
    (b,) = nodes("b", mode=LOCAL)
    i, j = get_symbol("i"), get_symbol("j")
    at = (Iterator(i), Iterator(j))
    use = ll.ForLoop(i, 0, N - 1, ll.ForLoop(j, 0, M - 1, ll.Set(
        y, at, ll.Binop(ops.Binop.MUL, ll.Get(b, at), ll.Constant(3.0)), f"{y.name} := {b.name} * 3")))
    new = propagate_copies(ll.seq(scaled(a, x, 2.0), copy(b, a), use))
    assert [s.debug for s in ll.iter_stmts(new) if isinstance(s, ll.Set) and s.tn is y] == [f"{y.name} := {a.name} * 3"]


@st.composite
def programs(draw):
    """Straight-line programs over two inputs (3, 4) and three nodes (0 and 1 local or not, 2
    not): one or two copies `d := s`, `s` written first, with scalings, accumulations and
    copies before (mostly of `s` and the third node `o`) and after (reading `d` or `s`) — copies
    the stage drops, coalesces or keeps."""
    local = [*draw(st.lists(st.booleans(), min_size=2, max_size=2)), False]
    steps: list[tuple[str, int, int, float]] = []
    scale = st.sampled_from([0.5, 2.0, -1.5])
    kinds = st.sampled_from(["scale", "add", "copy"])
    for _ in range(draw(st.integers(1, 2))):
        s = draw(st.sampled_from([0, 1]))
        d = draw(st.sampled_from([1 - s, 2]))
        o = 3 - s - d
        steps.append((draw(st.sampled_from(["scale", "scale", "add"])), s, draw(st.sampled_from([3, 4, d])),
                      draw(scale)))
        for _ in range(draw(st.integers(0, 2))):
            steps.append((draw(kinds), draw(st.sampled_from([s, o, o, d])), draw(st.integers(0, 3)), draw(scale)))
        steps.append(("copy", d, s, 1.0))
        for _ in range(draw(st.integers(0, 3))):
            steps.append((draw(kinds), draw(st.sampled_from([o, o, o, d, s])), draw(st.sampled_from([d, s, 3])),
                          draw(scale)))
    return local, steps


def _build(local, steps):
    x = nodes("x0", "x1")
    ns = [Tnode(f"n{k}", (N, M), memory_mode=LOCAL if loc else MATERIALIZED) for k, loc in enumerate(local)]
    operands = [*ns, *x]
    code = []
    for kind, out, src, c in steps:
        dst, s = ns[out], operands[src]
        if s is dst:
            s = x[1]
        code.append(scaled(dst, s, c) if kind == "scale" else add_into(dst, s) if kind == "add" else copy(dst, s))
    return ll.seq(*code), x, ns


@settings(max_examples=250, deadline=None)
@given(program=programs())
def test_random_programs_keep_every_value_that_outlives_the_routine(program):
    """The stage on random programs: every input and non-local node ends bit-identical under
    the interpreter (locals may go: nobody outside the routine looks at them)."""
    code, x, ns = _build(*program)
    rng = np.random.default_rng(6)
    inputs = {tn: rng.standard_normal((N, M)).astype(np.float32) for tn in [*x, *ns] if not tn.is_local()}
    want = interpret.run(code, {tn: v.copy() for tn, v in inputs.items()})
    got = interpret.run(propagate_copies(code), {tn: v.copy() for tn, v in inputs.items()})
    for tn in inputs:
        np.testing.assert_array_equal(got[tn], want[tn], err_msg=tn.label[0])


def test_random_programs_reach_both_rewrites():
    """The generator makes programs where the stage drops a copy whose readers read its source,
    and programs where it coalesces one into its source's writers (the property above covers
    both): programs of one copy, which goes, leaving its source or its target."""
    def leaves(program, kept):
        code, _, _ = _build(*program)
        copies = [c for c in map(nests.identity_copy, ll.flatten(code)) if c is not None]
        if len(copies) != 1:
            return False
        left = set(ll.nodes_of(propagate_copies(code)))
        dst, src = copies[0]
        return {dst, src} & left == {kept(dst, src)}

    quick = settings(max_examples=600, database=None, derandomize=True, phases=[Phase.generate])
    find(programs(), lambda p: leaves(p, lambda dst, src: src), settings=quick)
    find(programs(), lambda p: leaves(p, lambda dst, src: dst), settings=quick)
