"""Generation: sampling rules, the greedy tokens of a loaded GPT-2 against `transformers`, and
no compiler run while generating."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit.backends.cc import toolchain as cc
from einjit.models import GPT, GPTConfig, gpt2
from einjit.models.generate import Generator, sample_next
from np_gpt2 import CONFIG, forward, random_gpt2, write_dir


def _compiles() -> tuple[int, int, int]:
    return cc.stats.compiler_invocations, cc.stats.cache_hits, cc.stats.rebuilds


def test_sample_next_greedy_top_k_and_temperature():
    logits = np.array([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(sample_next(logits, 0.0, None, rng), [1, 0])
    draws = np.array([sample_next(logits, 1.0, 2, rng) for _ in range(300)])
    assert set(draws[:, 0]) == {1, 3} and set(draws[:, 1]) <= {0, 1, 2, 3}
    hot = np.array([sample_next(logits, 0.05, None, rng) for _ in range(50)])
    assert (hot[:, 0] == 1).all()


def test_greedy_generation_matches_the_numpy_reference_without_compiling(tmp_path):
    arrays = random_gpt2()
    model = gpt2.from_pretrained(write_dir(tmp_path / "g", arrays))
    gen = Generator(model, batch_size=2)
    before = _compiles()
    prompts = [np.array([[3, 1, 4], [1, 5, 9]]), np.array([[2, 7], [1, 8]])]
    for prompt in prompts:
        out = gen.generate(prompt, CONFIG["n_positions"] - prompt.shape[1] + 3, temperature=0.0)
        ids = prompt.copy()
        for _ in range(out.shape[1] - prompt.shape[1]):  # the reference, token by token
            ctx = ids[:, -CONFIG["n_positions"]:]
            ids = np.concatenate([ids, forward(arrays, ctx)[:, -1].argmax(-1)[:, None]], axis=1)
        np.testing.assert_array_equal(out, ids)
    assert _compiles() == before


def test_sampling_is_reproducible_by_seed():
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=8), label="tiny")
    from einjit import train
    train.init_params(model.params(), seed=1)
    gen = Generator(model)
    a = gen.generate([[1, 2]], 6, temperature=1.0, top_k=5, seed=3)
    b = gen.generate([[1, 2]], 6, temperature=1.0, top_k=5, seed=3)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (1, 8) and a.max() < 11


def test_bad_generation_arguments_are_named():
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=8), label="tiny2")
    from einjit import train
    train.init_params(model.params(), seed=1)
    gen = Generator(model)
    with pytest.raises(ej.TensorError, match=r"token ids must be integers in 0..10"):
        gen.generate([[1, 11]], 2)
    with pytest.raises(ej.TensorError, match=r"ids must be \(1, n >= 1\)"):
        gen.generate([[1], [2]], 2)
    with pytest.raises(ej.TensorError, match="top_k"):
        gen.generate([[1]], 2, top_k=0)


def test_greedy_tokens_match_transformers(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed")
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=53, n_positions=16, n_embd=32, n_layer=2, n_head=4)).eval()
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    gen = Generator(gpt2.from_pretrained(tmp_path / "hf"))
    prompt = np.array([[5, 17, 3]])
    got = gen.generate(prompt, 10, temperature=0.0)
    with torch.no_grad():
        want = hf.generate(torch.tensor(prompt), max_new_tokens=10, do_sample=False, pad_token_id=0).numpy()
    np.testing.assert_array_equal(got, want)


def test_a_short_prompt_through_the_decode_routine_gives_the_prefills_logits(monkeypatch):
    """`prompt_logits` runs a prompt of at most a quarter block through the decode routine one
    position at a time: the logits and the caches it leaves equal the prefill's."""
    from einjit import train
    model = GPT(GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=2, d_model=8), label="short")
    train.init_params(model.params(), seed=4)
    gen = Generator(model)
    prompt = np.array([[3, 1, 4, 1]])
    with monkeypatch.context() as m:
        m.setattr(gen, "logits", lambda ids: pytest.fail("a 4-token prompt in a 16-token block was prefilled"))
        stepped = gen.prompt_logits(prompt)
    after_steps = gen.next_logits(np.array([5]), 4)
    prefilled = gen.logits(prompt)
    np.testing.assert_allclose(stepped, prefilled, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gen.next_logits(np.array([5]), 4), after_steps, rtol=1e-5, atol=1e-6)
    long_prompt = np.arange(8)[None, :] % 13
    np.testing.assert_array_equal(gen.prompt_logits(long_prompt), gen.logits(long_prompt))
