"""The copy propagation stage (`ir/sched/copies.py`): a nest that only copies an array is
dropped and its readers read the source, bit for bit the same values under the interpreter
and gcc; copies whose source changes later, whose destination is a result, is written again
or may not be routine-local stay."""

from __future__ import annotations

import numpy as np
import pytest

from einjit.ir import interpret, ops, optimize
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol
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


def _residual_mlp_grads(with_copies: bool, monkeypatch):
    """Gradients of `sum(r * (h + gelu(linear(h))))`, `h = x * s`: backprop through both
    additions (the residual's and the bias's) copies the sum's gradient into an addend's."""
    import einjit as ej
    from einjit import nn, train

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
    tag = "on" if with_copies else "off"
    xv, rv = (rng.standard_normal((6, 16)).astype(np.float32) for _ in range(2))
    s = ej.param(f"copies_{tag}_s", (rng.standard_normal(16) * 0.5 + 1).astype(np.float32))
    lin = nn.Linear(16, 16, label=f"copies_{tag}_fc")
    h = ej.ndarray(xv, batch_axes=1, label=f"copies_{tag}_x") * s
    y = h + ej.gelu(lin(h), "tanh")
    loss = ej.sum(y * ej.ndarray(rv, batch_axes=1, label=f"copies_{tag}_r"), label=f"copies_{tag}_loss")
    train.init_params(loss, seed=0)
    params = [s, *lin.params()]
    values = [p.value.numpy().copy() for p in params]
    train.to_routine(train.grad_update(loss), name=f"copies_{tag}")()
    monkeypatch.undo()
    return [p.grad.numpy().copy() for p in params], values, (xv, rv), sum(dropped)


def test_residual_and_bias_gradients_are_the_same_with_and_without_the_stage(monkeypatch):
    """Differential through the whole optimizer and gcc: bit-identical gradients with and
    without the stage (which drops copies here), and PyTorch's."""
    on, values, (xv, rv), dropped = _residual_mlp_grads(True, monkeypatch)
    off, values_off, _, _ = _residual_mlp_grads(False, monkeypatch)
    assert dropped >= 1
    for a, b in zip(values, values_off, strict=True):
        np.testing.assert_array_equal(a, b)
    for got, want in zip(on, off, strict=True):
        np.testing.assert_array_equal(got, want)
    torch = pytest.importorskip("torch")
    ts, tw, tb = (torch.tensor(v, requires_grad=True) for v in values)
    h = torch.tensor(xv) * ts
    y = h + torch.nn.functional.gelu(h @ tw.T + tb, approximate="tanh")
    (y * torch.tensor(rv)).sum().backward()
    for got, t in zip(on, (ts, tw, tb), strict=True):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-4, atol=1e-5)
