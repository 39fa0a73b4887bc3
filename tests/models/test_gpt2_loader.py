"""The GPT-2 loader: a NumPy reference forward always, `transformers` when installed."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import fit
from einjit.models import gpt2
from np_gpt2 import CONFIG, forward, random_gpt2, write_dir


def einjit_logits(model, ids: np.ndarray) -> np.ndarray:
    tokens = ej.input("tokens", batch_dims=list(ids.shape), prec="int32")
    step = fit.forward_step(model(tokens), inputs=[tokens], name="gpt2_logits")
    return step(ids.astype(np.int32))


def test_loader_matches_the_numpy_reference(tmp_path):
    arrays = random_gpt2()
    path = write_dir(tmp_path / "gpt2", arrays)
    model = gpt2.from_pretrained(path)
    assert model.config.d_model == 16 and model.config.approximate == "tanh"
    ids = np.random.default_rng(1).integers(0, CONFIG["vocab_size"], (2, CONFIG["n_positions"]))
    got = einjit_logits(model, ids)
    want = forward(arrays, ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.abs(want).max() > 1.0


def test_loader_names_a_missing_or_misshapen_tensor(tmp_path):
    arrays = random_gpt2()
    del arrays["transformer.h.1.mlp.c_fc.bias"]
    arrays["transformer.h.0.attn.c_attn.weight"] = arrays["transformer.h.0.attn.c_attn.weight"][:, :-1]
    path = write_dir(tmp_path / "bad", arrays)
    with pytest.raises(ej.CheckpointError, match=r"'h.0.attn.c_attn.weight' is \[16, 47\], the config needs "
                                                  r"\[16, 48\]\n  missing 'h.1.mlp.c_fc.bias' \(expected \[64\]\)"):
        gpt2.from_pretrained(path)


def test_loader_refuses_a_directory_without_weights(tmp_path):
    write_dir(tmp_path / "g", random_gpt2())
    (tmp_path / "g" / "model.safetensors").unlink()
    with pytest.raises(ej.CheckpointError, match="has no model.safetensors"):
        gpt2.from_pretrained(tmp_path / "g")


def test_random_transformers_gpt2_gives_the_same_logits(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed: the NumPy reference checks the loader")
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=97, n_positions=16, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    hf = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # LayerNorms away from their (1, 0) start, so their mapping is checked too
        for name, p in hf.named_parameters():
            if ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    model = gpt2.from_pretrained(tmp_path / "hf")
    ids = np.random.default_rng(2).integers(0, 97, (2, 16))
    got = einjit_logits(model, ids)
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_tokenizer_of_a_directory(tmp_path):
    write_dir(tmp_path / "g", random_gpt2())
    assert gpt2.tokenizer(tmp_path / "g") is None  # no tokenizer.json: ids in, ids out
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "g" / "tokenizer.json"))
    loaded = gpt2.tokenizer(tmp_path / "g")
    assert loaded.encode("hello world again").ids == [1, 2, 0]
    assert loaded.decode([2, 1]) == "world hello"
