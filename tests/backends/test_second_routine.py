"""A second routine compiled from a graph an earlier routine used compiles to the same code.

The CPU stages drop nodes the portable code still has (the softmax's gradient becomes a row
buffer, a copy's source or target goes away), each only where the node may be routine-local.
`localize` used to keep such a node in the context because the final code no longer consumed
it: a second compile of the same graph then found it kept, left it whole and passed it as a
parameter (the GPT step's masked scores and exponentials, 1 MiB each per block), and a later
routine reading it got a context array nobody had written. It is routine-local now.
"""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.backends.cc.backend import CcBackend
from einjit.backends.interface import read_first
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.optimize import optimize_proc
from einjit.ir.passes.local_storage import LocalNodeError, kept_in_context, local_to
from einjit.ir.tnode import Tnode, hosted
from einjit.training.step import compile_code

X = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)


def softmax_step(tag: str):
    """`sum(softmax(w @ x)²)` and its SGD step; returns the code, the softmax and the weight."""
    x = ej.ndarray(X, batch_axes=1, label=f"{tag}_x")
    w = ej.param(f"{tag}_w", input_dims=[16], output_dims=[32])
    p = ej.softmax(w @ x, -1, label=f"{tag}_p")
    loss = ej.sum(ej.mul(p, p), "...|...->... => 0", label=f"{tag}_loss")
    train.init_params(loss, seed=1)
    return [train.grad_update(loss), train.sgd_update(loss, 0.5)], p, w


def removed_by_cpu_stages(program) -> set[Tnode]:
    lowered = program.lowered()
    return set(ll.nodes_of(lowered.portable_llc)) - set(ll.nodes_of(lowered.llc))


def test_compiling_a_graph_again_gives_the_same_code_and_values():
    code, p, w = softmax_step("again")
    first = compile_code(code, name="again_step", use_program_cache=False)
    removed = removed_by_cpu_stages(first)
    assert p.grad_tn in removed   # the case under test: a CPU stage took the softmax's gradient away
    for tn in removed:
        assert local_to(tn) == "again_step" and not kept_in_context(tn)
    second = compile_code(code, name="again_step", use_program_cache=False)
    source = first.compiled.procedure.procedure.source
    assert second.compiled.procedure.procedure.source == source
    assert removed_by_cpu_stages(second) == removed
    params = [q for q in first.compiled.procedure.procedure.params if q.tn is not None]
    assert not any(q.tn in removed for q in params)

    backend = CcBackend()
    start = w.value_tn.host_array().copy()
    stepped = []
    for program in (first, second):
        w.value_tn.host_array()[...] = start
        context = backend.init("again", share_host_arrays=True)
        backend.link(context, program.compiled)()
        stepped.append(w.value_tn.host_array().copy())
    np.testing.assert_array_equal(stepped[0], stepped[1])
    logits = X.astype(np.float64) @ start.astype(np.float64).reshape(32, 16).T
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    q = e / e.sum(axis=1, keepdims=True)
    g_logits = q * (2 * q - (2 * q * q).sum(axis=1, keepdims=True))
    want = start.astype(np.float64) - 0.5 * (g_logits.T @ X).reshape(start.shape)
    np.testing.assert_allclose(stepped[0], want, rtol=1e-4, atol=1e-6)


def test_a_later_routine_reading_a_removed_node_first_is_refused_by_name():
    code, p, _ = softmax_step("late")
    compile_code(code, name="late_step", use_program_cache=False)
    out = Tnode("late_out", p.grad_tn.dims, ops.single, memory_mode=hosted())
    syms = [get_symbol() for _ in p.grad_tn.dims]
    idcs = tuple(Iterator(s) for s in syms)
    body: ll.LLStmt = ll.Set(out, idcs, ll.Get(p.grad_tn, idcs))
    for s, d in reversed(list(zip(syms, p.grad_tn.dims, strict=True))):
        body = ll.ForLoop(s, 0, d - 1, body)
    opt = optimize_proc(body, name="late_reader")
    assert p.grad_tn in read_first(opt)
    backend = CcBackend()
    with pytest.raises(LocalNodeError, match="late_step"):
        backend.compile((), opt, shared=True, name="late_reader")
