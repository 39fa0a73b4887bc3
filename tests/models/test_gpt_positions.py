"""GPT with learned positions on sequences shorter than `block_size`: without `positions=` the
tokens take the first T rows of `wpe`, as PyTorch and Hugging Face index `wpe[:T]`."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import einjit as ej
from einjit import fit, nn, train
from einjit.models import GPT, GPTConfig
from np_gpt2 import forward
from test_gpt import hf_arrays, np_config

CFG = GPTConfig(vocab_size=23, block_size=8, n_layer=2, n_head=2, d_model=8)


@pytest.mark.parametrize("t", [1, 5, 8])
def test_a_shorter_sequence_reads_the_first_position_rows(t):
    model = GPT(CFG, label=f"short{t}")
    x = ej.input("x", batch_dims=[3, t], prec="int32")
    logits = model(x)
    train.init_params(logits, seed=7)
    step = fit.forward_step(logits, inputs=[x], name=f"short{t}")
    ids = np.random.default_rng(t).integers(0, CFG.vocab_size, (3, t)).astype(np.int32)
    got = step(ids).reshape(3, t, CFG.vocab_size)
    want = forward(hf_arrays(model), ids, np_config(CFG))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_sequence_longer_than_the_block_is_refused():
    model = GPT(CFG, label="long")
    with pytest.raises(ej.ShapeError, match="9 tokens does not fit block_size=8"):
        model(ej.input("x", batch_dims=[1, 9], prec="int32"))


def test_training_on_short_sequences_matches_pytorch():
    """Five AdamW steps on T=5 of block_size 8: the losses, the token table and the whole
    position table (its unread rows only decayed) as PyTorch's."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_gpt import torch_gpt

    with ej.default_precision("double"):
        model = GPT(CFG, label="ts")
        x = ej.input("x", batch_dims=[4, 5], prec="int32")
        y = ej.input("y", batch_dims=[4, 5], prec="int32")
        loss = nn.cross_entropy(model(x), y)
        opt = nn.AdamW(model.params(), 1e-2)
        train.init_params(loss, seed=2)
        net = torch_gpt(model).double()
        step = fit.train_step(loss, opt.update(), inputs=[x, y])
    topt = torch.optim.AdamW(net.parameters(), 1e-2)
    rng = np.random.default_rng(4)
    for _ in range(5):
        ids = rng.integers(0, CFG.vocab_size, (4, 6)).astype(np.int32)
        opt.step()
        step(ids[:, :-1], ids[:, 1:])
        topt.zero_grad()
        tl = torch.nn.functional.cross_entropy(
            net(torch.tensor(ids[:, :-1], dtype=torch.long)).reshape(-1, CFG.vocab_size),
            torch.tensor(ids[:, 1:], dtype=torch.long).reshape(-1))
        tl.backward()
        topt.step()
        np.testing.assert_allclose(step.loss_value(), tl.item(), rtol=1e-9)
    wpe, want = model.wpe.value.numpy(), net.wpe.detach().numpy()
    np.testing.assert_allclose(wpe, want, rtol=1e-6, atol=1e-7)  # Adam divides by the gradients' size
    np.testing.assert_allclose(model.wte.value.numpy(), net.wte.detach().numpy(), rtol=1e-6, atol=1e-7)
