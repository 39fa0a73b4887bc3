"""GPT with learned positions on sequences shorter than `block_size`: without `positions=` the
tokens take the first T rows of `wpe`, as PyTorch and Hugging Face index `wpe[:T]` (training
against PyTorch at T < block_size: `test_gpt.test_training_steps_match_pytorch`)."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import fit, train
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

