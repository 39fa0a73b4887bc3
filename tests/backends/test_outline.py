"""Outlined nests (`backends/c_outline.py`): a large routine as one C function per loop nest,
repeated blocks sharing their functions, spread over translation units; the values must be
bit for bit those of the routine compiled as one function."""

from __future__ import annotations

import re

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.backends import c_syntax
from einjit.backends.c_syntax import UNIT_MARK
from einjit.backends.cc import toolchain as cc
from einjit.backends.interface import lower_assignments
from einjit.ir import optimize
from einjit.ir.optimize import VirtualizeSettings
from einjit.nn import LayerNorm
from einjit.nn.losses import cross_entropy


def residual_model(blocks: int, seed: int = 0):
    """A small transformer-like stack: `blocks` identical blocks (LayerNorm, a two-head
    attention written with einsum and a causal mask, a tanh MLP), softmax cross-entropy."""
    rng = np.random.default_rng(seed)
    batch, seq, d, heads, vocab = 2, 4, 8, 2, 6
    tokens = rng.integers(0, vocab, (batch, seq))
    eye = np.eye(vocab, dtype=np.float32)
    x = ej.ndarray(eye[tokens], batch_axes=2, label="tokens")
    y = ej.ndarray(eye[np.roll(tokens, -1, axis=1)], batch_axes=2, label="targets")
    mask = ej.ndarray(np.triu(np.full((seq, seq), -1e9, np.float32), 1), label="causal")
    wte = ej.param("wte", input_dims=[vocab], output_dims=[d])
    h = ej.einsum("b, t | -> v; v -> d => b, t | -> d", x, wte, label="embed")
    for k in range(blocks):
        a = LayerNorm(d, label=f"ln{k}")(h)
        q = ej.einsum("b, t | -> d; d -> h, e => b, t | -> h, e", a,
                      ej.param(f"wq{k}", input_dims=[d], output_dims=[heads, d // heads]), label=f"q{k}")
        s = ej.einsum("b, t | -> h, e; b, s | -> h, e => b | -> h, t, s", q, q, label=f"scores{k}")
        s = ej.einsum("b | -> h, t, s; t, s => b | -> h, t, s", s, mask, label=f"masked{k}")
        o = ej.einsum("b | -> h, t, s; b, s | -> h, e => b, t | -> h, e", ej.softmax(s, -1), q, label=f"att{k}")
        wo = ej.param(f"wo{k}", input_dims=[heads, d // heads], output_dims=[d])
        h = h + ej.tanh(ej.einsum("b, t | -> h, e; h, e -> d => b, t | -> d", o, wo, label=f"proj{k}"))
    loss = cross_entropy(ej.einsum("b, t | -> d; v -> d => b, t | -> v", h, wte, label="logits"), y)
    train.init_params(loss)
    return loss


def trained(blocks: int, options: cc.CcOptions, steps: int = 3) -> dict[str, np.ndarray]:
    loss = residual_model(blocks)
    step = train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.1)], name="step", options=options)
    losses = []
    for _ in range(steps):
        step()
        losses.append(float(loss.value_tn.host_array().reshape(-1)[0]))
    out = {p.label_str: p.value_tn.host_array().copy() for p in train._params_of(loss)}
    out["losses"] = np.array(losses)
    return out


def rendered_step(blocks: int, syntax: c_syntax.CSyntax) -> c_syntax.CProgram:
    loss = residual_model(blocks)
    _, lowered = lower_assignments((), train.grad_update(loss), "step")
    return c_syntax.render_program([("step", lowered.llc)], (), syntax)


@pytest.mark.parametrize(("blocks", "threads"), [(1, 1), (3, 1), (5, 1), (3, 2)])
def test_outlined_and_split_step_is_bit_identical_to_one_function(blocks, threads, tmp_path, monkeypatch):
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path))
    whole = trained(blocks, cc.CcOptions(threads=threads, outline_min_nests=0))
    outlined = trained(blocks, cc.CcOptions(threads=threads, outline_min_nests=1, jobs=1))
    split = trained(blocks, cc.CcOptions(threads=threads, outline_min_nests=1, jobs=3))
    assert whole["losses"][-1] < whole["losses"][0]
    for name, value in whole.items():
        np.testing.assert_array_equal(outlined[name], value, err_msg=name)
        np.testing.assert_array_equal(split[name], value, err_msg=name)


def test_repeated_blocks_share_their_nest_functions(monkeypatch):
    # one nest per node: fused, this small model's blocks are one loop over its batch of 2
    monkeypatch.setattr(optimize, "virtualize_settings", VirtualizeSettings(fuse=False))
    syntax = c_syntax.CSyntax(outline_min_nests=1)
    counts = {}
    for blocks in (2, 4):
        source = rendered_step(blocks, syntax).source
        functions = set(re.findall(r"^static __attribute__\(\(noinline\)\) void (step_nest\d+)\(", source, re.M))
        calls = re.findall(r"^  (step_nest\d+)\(", source, re.M)
        assert functions == set(calls)
        counts[blocks] = (len(functions), len(calls))
    # Two more blocks add their calls but no new function: every block's nests are the first's.
    assert counts[4][0] == counts[2][0]
    assert counts[4][1] > counts[2][1] > counts[2][0]


def test_outlined_source_is_stable_and_small_routines_are_not_outlined():
    syntax = c_syntax.CSyntax(outline_min_nests=1, units=2)
    first, second = rendered_step(2, syntax).source, rendered_step(2, syntax).source
    assert first == second
    units = first.split(UNIT_MARK)
    # The routine with the prototypes, then the nest functions spread over two more units.
    assert len(units) == 3 and "void step(" in units[0] and all("void step(" not in u for u in units[1:])
    hidden = r'^__attribute__\(\(visibility\("hidden"\)\)\) void step_nest0\('
    assert re.search(hidden + r".*\);$", units[0], re.M)
    assert sum(bool(re.search(hidden + r".*\{$", u, re.M)) for u in units[1:]) == 1
    w = ej.param("w", input_dims=[3], output_dims=[2])
    x = ej.ndarray(np.ones((4, 3), np.float32), batch_axes=1, label="x")
    loss = ej.sum(ej.relu(w @ x))
    train.init_params(loss)
    _, lowered = lower_assignments((), train.grad_update(loss), "small")
    default = c_syntax.CSyntax(outline_min_nests=cc.CcOptions().outline_min_nests)
    source = c_syntax.render_program([("small", lowered.llc)], (), default).source
    assert source == c_syntax.render_program([("small", lowered.llc)], (), c_syntax.C_SYNTAX).source
    assert "_nest" not in source and UNIT_MARK not in source


def test_a_nests_own_locals_count_against_that_nests_stack_alone():
    """Four nests each with a 4 KiB local of its own and one local they share: by the
    routine's total (12 KiB allowed) the last nests' locals would go to scratch parameters,
    and those nests would no longer be calls of one function; each nest's function holds its
    own local only while it runs."""
    from einjit.ir import low_level as ll
    from einjit.ir.indexing import Iterator, get_symbol
    from einjit.ir.tnode import LOCAL, Tnode

    shared = Tnode("shared", (1024,), memory_mode=LOCAL)
    top: list[ll.LLStmt] = []
    own = []
    for k in range(4):
        tn = Tnode(f"own{k}", (1024,), memory_mode=LOCAL)
        i = get_symbol()
        top.append(ll.ForLoop(i, 0, 1023, ll.Set(tn, (Iterator(i),), ll.Get(shared, (Iterator(i),)))))
        own.append(tn)
    syntax = c_syntax.CSyntax(stack_limit_bytes=4096, stack_total_bytes=3 * 4096)
    assert c_syntax.local_placement([shared, *own], syntax).on_stack == {shared, own[0], own[1]}
    assert c_syntax.outlined_placement(top, [shared, *own], syntax).on_stack == {shared, *own}
    # A nest whose own locals exceed what the shared ones leave puts the excess in scratch.
    big = c_syntax.CSyntax(stack_limit_bytes=4096, stack_total_bytes=4096)
    assert c_syntax.outlined_placement(top, [shared, *own], big).on_stack == {shared}


def test_units_of_a_threaded_program_are_compiled_for_openmp(tmp_path, monkeypatch):
    """Each translation unit of a split program is compiled with `-fopenmp` when the program
    runs on several threads: without it gcc ignores the pragmas of an outlined nest and the
    whole routine runs on one thread (the results stay right, only the speed is lost)."""
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path))
    team = ("int team(void) {\n  int n = 0;\n  #pragma omp parallel num_threads(2)\n  {\n"
            "    #pragma omp atomic\n    n += 1;\n  }\n  return n;\n}\n")
    source = "int team(void);\nint run(void) { return team(); }\n" + UNIT_MARK + team
    for threads, want in [(1, 1), (2, 2)]:
        options = cc.CcOptions(threads=threads)
        lib = cc.load_library(cc.compile_source(source, label=f"team{threads}", options=options))
        assert lib.run() == want


def small_gpt_step_code(n_layer: int):
    """A `models.GPT` step (gathered token rows, tied head) with AdamW: the nests of a real
    training step, repeated per block and per parameter."""
    from einjit import nn
    from einjit.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=n_layer, n_head=2, d_model=8), label="tiny")
    x = ej.input("tokens", batch_dims=[2, 4], prec="int32")
    y = ej.input("targets", batch_dims=[2, 4], prec="int32")
    loss = nn.cross_entropy(model(x), y)
    opt = nn.AdamW(model.params(), 1e-3)
    train.init_params(loss)
    return [train.grad_update(loss), opt.update()]


@pytest.mark.parametrize(("model", "threads"), [("residual", 1), ("gpt", 1), ("gpt", 2)])
def test_nests_copied_by_structure_render_the_same_source(model, threads, monkeypatch):
    """Nests of a structure rendered before are not rendered (`c_outline.Copy`); the program
    must be byte for byte the one rendered nest by nest, names included."""
    from einjit.backends import c_outline
    from einjit.ir import assignments as asg

    if model == "residual":  # one nest per node: fused, its blocks are one loop over the batch
        monkeypatch.setattr(optimize, "virtualize_settings", VirtualizeSettings(fuse=False))
    syntax = c_syntax.CSyntax(outline_min_nests=1, units=2, num_threads=threads)
    code = train.grad_update(residual_model(3)) if model == "residual" else asg.sequence(
        *[c.asgns if hasattr(c, "asgns") else c for c in small_gpt_step_code(2)])
    _, lowered = lower_assignments((), code, "step")
    shared = []
    share = c_outline.share
    monkeypatch.setattr(c_outline, "share", lambda routine, nests, *rest: shared.append(nests) or share(
        routine, nests, *rest))
    copied = c_syntax.render_program([("step", lowered.llc)], (), syntax).source
    monkeypatch.setattr(c_outline, "SHARE_BY_STRUCTURE", False)
    rendered = c_syntax.render_program([("step", lowered.llc)], (), syntax).source
    assert copied == rendered
    copies = sum(isinstance(n, c_outline.Copy) for n in shared[0])
    assert copies > len(shared[0]) // 3 and not any(isinstance(n, c_outline.Copy) for n in shared[1])


def test_nests_alike_but_for_precision_dims_or_placement_are_not_copies():
    """Five nests of one loop structure: equal but for their nodes' precision, dims and
    placement (stack or scratch), each rendered as its own function; the one truly equal to the
    first calls the first's. Copying by a structure that ignored any of these would call a
    float function with double arrays (or the wrong bounds): the sources would differ."""
    from einjit.backends import c_outline
    from einjit.ir import low_level as ll
    from einjit.ir import ops
    from einjit.ir.indexing import Iterator, get_symbol
    from einjit.ir.tnode import LOCAL, Tnode, hosted

    def nest(n: int, prec: ops.Prec = ops.single, mode=None) -> tuple[ll.LLStmt, Tnode]:
        src = Tnode("src", (n,), prec, memory_mode=hosted())
        dst = Tnode("dst", (n,), prec, memory_mode=mode or hosted())
        i = get_symbol()
        loop = ll.ForLoop(i, 0, n - 1, ll.Set(dst, (Iterator(i),), ll.Binop(
            ops.Binop.MUL, ll.Get(src, (Iterator(i),)), ll.Constant(2.0))))
        return loop, dst

    nests = [nest(8), nest(8), nest(8, ops.double), nest(16), nest(8, mode=LOCAL)]
    reads = [ll.ForLoop(i, 0, 7, ll.Set(out, (Iterator(i),), ll.Get(nests[4][1], (Iterator(i),))))
             for i in [get_symbol()] for out in [Tnode("out", (8,), memory_mode=hosted())]]
    code = ll.seq(*[loop for loop, _ in nests], *reads)
    syntax = c_syntax.CSyntax(outline_min_nests=1, stack_limit_bytes=16)   # the local goes to scratch
    shared = []
    share = c_outline.share
    try:
        c_outline.share = lambda routine, nests, *rest: shared.append(nests) or share(routine, nests, *rest)
        copied = c_syntax.render_program([("alike", code)], (), syntax).source
        c_outline.SHARE_BY_STRUCTURE = False
        rendered = c_syntax.render_program([("alike", code)], (), syntax).source
    finally:
        c_outline.share, c_outline.SHARE_BY_STRUCTURE = share, True
    assert copied == rendered
    assert [type(n).__name__ for n in shared[0]] == ["Nest", "Copy", "Nest", "Nest", "Nest", "Nest"]
    # rendered, the scratch nest's text is the first's (a pointer either way): one function for
    # those three, one each for the double and the longer nest, one for the reading nest
    functions = re.findall(r"^static __attribute__\(\(noinline\)\) void (alike_nest\d+)\(", copied, re.M)
    assert len(functions) == 4 and "double" in copied
