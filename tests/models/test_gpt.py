"""The GPT model: config checks, the KV-cache decode against the full forward, and training
step for step with PyTorch from the same weights (when installed)."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import fit, nn, train
from einjit.models import GPT, GPTConfig
from einjit.models.generate import Generator
from einjit.models.gpt2 import gpt2_arrays
from np_gpt2 import forward

CFG = GPTConfig(vocab_size=23, block_size=8, n_layer=2, n_head=2, d_model=8)


def hf_arrays(model: GPT) -> dict[str, np.ndarray]:
    """The model's weights in Hugging Face GPT-2 layout (the inverse of the loader's mapping)."""
    w = {k: v.value.numpy().astype(np.float64) for k, v in model.named_params().items()}
    c = model.config
    d = c.d_model
    out = {"wte.weight": w["wte"], "wpe.weight": w["wpe"], "ln_f.weight": w["ln_f.gamma"], "ln_f.bias": w["ln_f.beta"]}
    for k in range(c.n_layer):
        h, g = f"h.{k}.", f"h{k}."
        out |= {h + "ln_1.weight": w[g + "ln1.gamma"], h + "ln_1.bias": w[g + "ln1.beta"],
                h + "ln_2.weight": w[g + "ln2.gamma"], h + "ln_2.bias": w[g + "ln2.beta"],
                h + "attn.c_attn.weight": np.concatenate([w[g + f"attn.{n}.w"].reshape(d, d).T for n in "qkv"], 1),
                h + "attn.c_attn.bias": np.concatenate([w[g + f"attn.{n}.b"].reshape(d) for n in "qkv"]),
                h + "attn.c_proj.weight": w[g + "attn.out.w"].reshape(d, d).T,
                h + "attn.c_proj.bias": w[g + "attn.out.b"],
                h + "mlp.c_fc.weight": w[g + "mlp.fc.w"].T, h + "mlp.c_fc.bias": w[g + "mlp.fc.b"],
                h + "mlp.c_proj.weight": w[g + "mlp.proj.w"].T, h + "mlp.c_proj.bias": w[g + "mlp.proj.b"]}
    return out


def np_config(c: GPTConfig) -> dict:
    return {"n_layer": c.n_layer, "n_head": c.n_head, "layer_norm_epsilon": c.eps}


def test_config_is_checked():
    with pytest.raises(ej.ShapeError, match="n_head=3 must divide d_model=8"):
        GPTConfig(vocab_size=5, block_size=4, n_head=3, d_model=8)
    with pytest.raises(ej.TensorError, match="positions must be one of"):
        GPTConfig(vocab_size=5, block_size=4, positions="rotary")
    with pytest.raises(ej.TensorError, match="block_size must be a positive integer"):
        GPTConfig(vocab_size=5, block_size=0)


def test_loader_mapping_round_trips():
    model = GPT(CFG, label="rt")
    train.init_params(model.params(), seed=3)
    arrays = gpt2_arrays(hf_arrays(model), CFG)
    for name, p in model.named_params().items():
        np.testing.assert_array_equal(arrays[name], p.value.numpy(), err_msg=name)


def test_kv_cache_decode_equals_the_full_forward():
    """Prefill 3 tokens, then decode 5 one by one: each step's logits are the reference
    forward's at that position (the caches hold exactly the earlier keys and values)."""
    model = GPT(CFG, label="kv")
    train.init_params(model.params(), seed=5)
    ref = hf_arrays(model)
    gen = Generator(model, batch_size=2)
    ids = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 8))
    want = forward(ref, ids, np_config(CFG))
    np.testing.assert_allclose(gen.logits(ids[:, :3]), want[:, 2], rtol=1e-4, atol=1e-5)
    for pos in range(3, 8):
        np.testing.assert_allclose(gen.next_logits(ids[:, pos], pos), want[:, pos], rtol=1e-4, atol=1e-5)
    cache_k = next(iter(gen.decode.routine.bindings))  # the decode position is bound per call
    assert gen.decode.routine.bindings[cache_k].value == 7
    with pytest.raises(ej.EinjitError, match="pos"):
        gen.next_logits(ids[:, 0], 8)


def test_sinusoidal_positions_decode_too():
    cfg = GPTConfig(vocab_size=13, block_size=6, n_layer=1, n_head=2, d_model=8, positions="sinusoidal")
    model = GPT(cfg, label="sin")
    train.init_params(model.params(), seed=1)
    gen = Generator(model)
    ids = np.array([[1, 2, 3, 4, 5, 6]])
    full = gen.prefill(ids.astype(np.int32))[0]
    gen.logits(ids[:, :2])
    for pos in range(2, 6):
        np.testing.assert_allclose(gen.next_logits(ids[:, pos], pos)[0], full[pos], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("t", [8, 5])
def test_training_steps_match_pytorch(t):
    """Five AdamW steps as PyTorch's, on whole blocks and on shorter sequences (which read the
    first `t` rows of the position table, `wpe[:t]`)."""
    torch = pytest.importorskip("torch")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_gpt import torch_gpt

    with ej.default_precision("double"):
        model = GPT(CFG, label="tt")
        x = ej.input("x", batch_dims=[4, t], prec="int32")
        y = ej.input("y", batch_dims=[4, t], prec="int32")
        loss = nn.cross_entropy(model(x), y)
        opt = nn.AdamW(model.params(), 1e-2)
        train.init_params(loss, seed=2)
        net = torch_gpt(model).double()
        step = fit.train_step(loss, opt.update(), inputs=[x, y])
    topt = torch.optim.AdamW(net.parameters(), 1e-2)
    rng = np.random.default_rng(4)
    for _ in range(5):
        ids = rng.integers(0, CFG.vocab_size, (4, t + 1)).astype(np.int32)
        opt.step()
        step(ids[:, :-1], ids[:, 1:])
        topt.zero_grad()
        tl = torch.nn.functional.cross_entropy(net(torch.tensor(ids[:, :-1], dtype=torch.long)).reshape(-1, 23),
                                               torch.tensor(ids[:, 1:], dtype=torch.long).reshape(-1))
        tl.backward()
        topt.step()
        np.testing.assert_allclose(step.loss_value(), tl.item(), rtol=1e-9)
    np.testing.assert_allclose(model.wte.value.numpy(), net.wte.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(model.wpe.value.numpy(), net.wpe.detach().numpy(), rtol=1e-6, atol=1e-7)
