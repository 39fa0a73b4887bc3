"""Mixed-precision training (`mixed_precision="bf16"`, `training/mixed_precision.py`): bf16
parameter copies and activations in the forward and backward passes, bf16 copies of the other
float32 operands of their contractions, float32 master weights, gradients and optimizer state.

Tolerance: the MLP, the convnet and a small GPT, trained a fixed number of steps from the same
initial weights on the same data, end within 1% of the float32 run's final loss (bf16 keeps 8
significant bits; measured here 0.01-0.6%, every contraction's operands bf16). The compiled
step computes exactly what the interpreter computes from the same optimized code, bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import einjit as ej
from einjit import fit, nn, train
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.backends.interface import low_level_of, lower_assignments
from einjit.ir import assignments as asg
from einjit.ir import interpret, ops, provenance
from einjit.ir import low_level as ll
from einjit.models import GPT, GPTConfig


def _stored_bf16(build):
    """The labels of the nodes a mixed-precision step of a fresh `build()` writes in bf16,
    parameter copies (labelled `.., bf16`) left out: the activations' bf16 twins. The graph's
    own nodes keep their precision, and the step writes none of those it twinned."""
    _, _, _, loss, _ = build()
    train.init_params(loss, seed=1)
    before = {t.value_tn: t.value_tn.prec for t in loss.subtree()}
    code = train.grad_update(loss, mixed_precision="bf16")
    assert all(tn.prec is prec for tn, prec in before.items())
    written = {asg.lhs_of(a) for a in asg.flatten_with_comments(code)} - {None}
    twins = [tn for tn in written if tn.prec is ops.bf16 and tn.label[-1] != "bf16"]
    assert all(tn not in before for tn in twins)
    touched = written | {b.tn for a in asg.flatten_with_comments(code) for b in asg.rhs_buffers(a)}
    replaced = [tn for tn in before if tn not in touched and not tn.is_hosted()]
    assert sorted((tn.label, tn.dims) for tn in replaced) == sorted((tn.label, tn.dims) for tn in twins)
    return sorted(".".join(tn.label) for tn in twins)


def _mlp(batch, sizes, seed=0):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    ys = np.argmax(xs @ rng.standard_normal((sizes[0], sizes[-1])), axis=1).astype(np.int32)
    layers = []
    for k, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        layers += [nn.Linear(a, b, label=f"fc{k + 1}"), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    x = ej.input("x", batch_dims=[batch], output_dims=[sizes[0]])
    y = ej.input("y", batch_dims=[batch], prec="int32")
    return model, x, y, nn.cross_entropy(model(x), y), (xs, ys)


def _train(build, steps, mixed, optimizer):
    model, x, y, loss, data = build()
    opt = optimizer(model.params())
    train.init_params(loss, seed=1)
    step = fit.train_step(loss, opt.update(), inputs=[x, y], mixed_precision=mixed)
    losses = []
    for _ in range(steps):
        opt.step()
        step(*data)
        losses.append(step.loss_value())
    return losses, loss, model, opt


def _compare(build, steps, optimizer, activations):
    """Final losses within 1%; `activations` are the tensors stored in bf16."""
    full, _, _, _ = _train(build, steps, None, optimizer)
    mixed, loss, model, opt = _train(build, steps, "bf16", optimizer)
    assert _stored_bf16(build) == sorted(activations)
    assert all(t.value_tn.prec is not ops.bf16 for t in loss.subtree())
    assert full[-1] < 0.8 * full[0]  # it trained
    assert abs(mixed[-1] - full[-1]) <= 0.01 * full[-1], (full[-1], mixed[-1])
    assert mixed != full  # bf16 changed the arithmetic
    for p in model.params():
        assert p.value_tn.prec is ops.single and p.grad_tn.prec is ops.single
        assert p.numpy().dtype == np.float32
    for t in opt.state_tensors().values():
        assert t.value_tn.prec in (ops.single, ops.double)


def test_mlp_within_one_percent_of_float32():
    _compare(lambda: _mlp(64, (32, 64, 64, 10)), 30, lambda ps: nn.SGD(ps, 0.1), {"fc2.x", "fc3.x"})


def test_forward_and_backprop_read_bf16_copies_of_the_parameters():
    """Every float32 parameter has a bf16 copy, computed first and stored; the forward and
    backprop code read only the copies, the update (float32) only the parameters."""
    model, _, _, loss, _ = _mlp(4, (2, 3, 2))
    train.init_params(loss, seed=0)
    grad = train.grad_update(loss, mixed_precision="bf16")
    params = {p.value_tn for p in model.params()}
    flat = asg.flatten_with_comments(grad)
    copies = [asg.lhs_of(a) for a in flat[:len(params)]]
    assert sorted(tn.label[:-1] for tn in copies) == sorted(p.path for p in model.params())
    assert all(tn.prec is ops.bf16 and tn.label[-1] == "bf16" and not tn.is_virtual() for tn in copies)
    reads = {b.tn for a in flat[len(params):] for b in asg.rhs_buffers(a)}
    assert not params & reads and set(copies) <= reads
    update = train.sgd_update(loss, 0.1)
    assert params <= {b.tn for a in asg.flatten_with_comments(update) for b in asg.rhs_buffers(a)}


def test_contractions_read_bf16_copies_of_their_float32_operands():
    """A contraction multiplying a float32 node (the input `x`, a gradient) by a bf16 operand (a
    parameter's copy, an activation's twin, another such copy) reads a bf16 copy of it, rounded
    once after the node's last write and before its first such reader, never virtual; the
    copies spread (fc1's weight gradient meets `x`'s copy, so it reads a copy of fc1's output
    gradient too), until every contraction with a bf16 operand has two. The nodes themselves
    stay float32."""
    _, x, _, loss, _ = _mlp(8, (4, 6, 6, 2))
    train.init_params(loss, seed=0)
    flat = asg.flatten_with_comments(train.grad_update(loss, mixed_precision="bf16"))
    copies = {a.lhs: a for a in flat if isinstance(a, asg.AccumUnop) and a.lhs.label[-1] == "bf16"
              and a.lhs.provenance == provenance.MIXED_PRECISION_OPERAND}
    assert sorted(".".join(c.rhs.tn.label) for c in copies.values()) == ["fc1.y.grad", "fc2.y.grad", "fc3.y.grad",
                                                                         "x"]
    assert copies and all(c.rhs.tn.prec is ops.single for c in copies.values())
    contractions = {}
    for pos, a in enumerate(flat):
        if not (isinstance(a, asg.AccumBinop) and a.op is ops.Binop.MUL and a.accum is ops.Binop.ADD):
            continue
        operands = [a.rhs1.tn, a.rhs2.tn]
        if any(tn.prec is ops.bf16 for tn in operands):
            contractions[".".join(a.lhs.label)] = {".".join(tn.label) for tn in operands}
            assert all(tn.prec is ops.bf16 for tn in operands), a
        for tn in (tn for tn in operands if tn in copies):
            source, rounded = copies[tn].rhs.tn, flat.index(copies[tn])
            assert max((q for q, b in enumerate(flat) if asg.lhs_of(b) is source), default=-1) < rounded < pos
            assert not tn.is_virtual()
    assert contractions["fc1.y"] == {"fc1.w.bf16", "x.bf16"}
    assert contractions["fc1.w.grad"] == {"fc1.y.grad.bf16", "x.bf16"}
    assert contractions["fc2.x.grad"] == {"fc2.w.bf16", "fc2.y.grad.bf16"}
    assert len(contractions) == 3 + 3 + 2  # forward, weight gradients, fc2's and fc3's input gradients


def _convnet():
    n = 32
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((n, 1, 12, 12)).astype(np.float32)
    ys = np.argmax(xs.reshape(n, -1) @ rng.standard_normal((144, 10)), axis=1).astype(np.int32)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, label="c1"), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, label="c2"), nn.ReLU(), nn.Linear(16 * 3 * 3, 10, label="fc"))
    x = ej.input("x", batch_dims=[n], output_dims=[1, 12, 12])
    y = ej.input("y", batch_dims=[n], prec="int32")
    return model, x, y, nn.cross_entropy(model(x), y), (xs, ys)


def test_convolutions_keep_their_float32_operands():
    """A convolution runs float kernels (`ir/sched/schedule_conv.py`): its contractions, forward
    and backprop, read no bf16 copies of their float32 operands (the input, the pooled
    activation, the convolutions' gradients), which they would only widen again; the linear
    layer's still do."""
    _, x, _, loss, _ = _convnet()
    train.init_params(loss, seed=0)
    flat = asg.flatten_with_comments(train.grad_update(loss, mixed_precision="bf16"))
    copied = {".".join(a.rhs.tn.label) for a in flat if isinstance(a, asg.AccumUnop)
              and a.lhs.provenance == provenance.MIXED_PRECISION_OPERAND}
    assert copied == {"fc.y.grad"}
    reads = {".".join(a.lhs.label): {(".".join(b.tn.label), b.tn.prec) for b in (a.rhs1, a.rhs2)} for a in flat
             if isinstance(a, asg.AccumBinop) and a.op is ops.Binop.MUL and a.accum is ops.Binop.ADD}
    assert reads["c1.w.grad"] == {("x", ops.single), ("conv.grad", ops.single)}
    pooled = [label for label, prec in reads["c2.w.grad"] if label.startswith("maxpool2d")]
    assert len(pooled) == 1 and all(prec is ops.single for _, prec in reads["c2.w.grad"])
    assert reads["fc.x.grad"] == {("fc.w.bf16", ops.bf16), ("fc.y.grad.bf16", ops.bf16)}


def test_convnet_within_one_percent_of_float32():
    """The max pooling's result stays float32 (its backprop compares it with its inputs); the
    final ReLU, read by the linear layer, is bf16."""
    _compare(_convnet, 30, lambda ps: nn.SGD(ps, 0.02), {"fc.x"})


def _gpt():
    cfg = GPTConfig(vocab_size=23, block_size=8, n_layer=1, n_head=2, d_model=16)
    model = GPT(cfg, label="g")
    x = ej.input("x", batch_dims=[4, 8], prec="int32")
    y = ej.input("y", batch_dims=[4, 8], prec="int32")
    ids = np.random.default_rng(4).integers(0, cfg.vocab_size, (4, 9)).astype(np.int32)
    return model, x, y, nn.cross_entropy(model(x), y), (ids[:, :-1], ids[:, 1:])


def test_gpt_within_one_percent_of_float32():
    """AdamW's moments stay float32; the LayerNorm outputs feeding the attention and MLP
    projections and the tied head, and the GELU output feeding the MLP's projection, are bf16."""
    full, _, _, _ = _train(_gpt, 20, None, lambda ps: nn.AdamW(ps, 1e-2))
    mixed, loss, _, opt = _train(_gpt, 20, "bf16", lambda ps: nn.AdamW(ps, 1e-2))
    # ln_1, ln_2, ln_f (`gamma * x + beta`), the GELU
    assert _stored_bf16(_gpt) == ["+", "+", "+", "gelu"]
    assert all(t.value_tn.prec is not ops.bf16 for t in loss.subtree())
    moments = [t for k, t in opt.state_tensors().items() if "adam_" in k]
    assert len(moments) == 2 * len(opt.params) and all(t.value_tn.prec is ops.single for t in moments)
    assert full[-1] < 0.8 * full[0]
    assert abs(mixed[-1] - full[-1]) <= 0.01 * full[-1], (full[-1], mixed[-1])


def test_compiled_step_matches_the_interpreter_bit_for_bit():
    """A mean-squared-error step: no `exp` or `log`, whose C library and NumPy versions may
    differ in the last bit whatever the precision."""
    rng = np.random.default_rng(5)
    model = nn.Sequential(nn.Linear(4, 16, label="fc1"), nn.ReLU(), nn.Linear(16, 16, label="fc2"), nn.ReLU(),
                          nn.Linear(16, 3, label="fc3"))
    x = ej.input("x", batch_dims=[8], output_dims=[4])
    y = ej.input("y", batch_dims=[8], output_dims=[3])
    loss = nn.mse(model(x), y)
    train.init_params(loss, seed=3)
    x.set_values(rng.standard_normal((8, 4)).astype(np.float32))
    y.set_values(rng.standard_normal((8, 3)).astype(np.float32))
    code = asg.sequence(train.grad_update(loss, mixed_precision="bf16"), train.sgd_update(loss, 0.1))
    _, lowered = lower_assignments((), code, "mixed_step")
    llc = low_level_of(lowered)
    assert any(tn.prec is ops.bf16 for tn in ll.nodes_of(llc))
    hosted = {tn: tn.array.copy() for tn in ll.nodes_of(llc) if tn.array is not None}
    want = interpret.run(llc, {tn: a.copy() for tn, a in hosted.items()})
    ctx = run_once(llc, hosted, name="mixed_step", context=CcBackend().init("mixed_step"))
    for t in loss.subtree():
        for tn in (t.value_tn, t.grad_tn):
            if tn in want and not tn.is_virtual():
                np.testing.assert_array_equal(ctx.array(tn), want[tn], err_msg=tn.debug_name())
    assert not np.array_equal(want[model.params()[0].value_tn], hosted[model.params()[0].value_tn])


def test_weight_copies_folded_into_the_packs_change_no_bit(monkeypatch, tmp_path):
    """`ir/sched/bf16_fold.py` drops the rounding passes of the weights that the step only
    packs (here fc1.w, fc2.w: on AVX2, no bf16 dot product) and the packs round the weights:
    three steps end with the same parameters, bit for bit, as with the copies stored."""
    from einjit.ir import optimize
    from einjit.ir.sched import bf16_fold

    monkeypatch.setenv("EINJIT_MACHINE", "avx2")
    folded: list[int] = []

    def fold(code):
        out = bf16_fold.fold_rounded_copies(code)
        folded.append(len(list(ll.flatten(code))) - len(list(ll.flatten(out))))
        return out

    results = []
    for stages in ([dataclasses.replace(st, run=lambda run, code: fold(code)) if st.name == "bf16" else st
                    for st in optimize.STAGES], [st for st in optimize.STAGES if st.name != "bf16"]):
        monkeypatch.setattr(optimize, "STAGES", tuple(stages))
        monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path / str(len(results))))
        _, _, model, _ = _train(lambda: _mlp(64, (96, 64, 64, 10)), 3, "bf16", lambda ps: nn.SGD(ps, 0.1))
        results.append([p.numpy() for p in model.params()])
    assert folded and max(folded) >= 2
    for with_fold, without in zip(*results, strict=True):
        np.testing.assert_array_equal(with_fold, without)


def test_unknown_mode_is_refused():
    _, _, _, loss, _ = _mlp(4, (2, 3, 2))
    with pytest.raises(ej.EinjitError, match="mixed_precision.*'bf16'.*'fp16'"):
        train.grad_update(loss, mixed_precision="fp16")
