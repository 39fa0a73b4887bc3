"""Hugging Face GPT-2 checkpoints (`config.json` + `model.safetensors`) into `models.GPT`.

The mapping, per block `N` (names with or without the `transformer.` prefix that
`GPT2LMHeadModel.save_pretrained` writes):

    h.N.ln_1 / ln_2 .weight .bias      -> hN.ln1 / ln2 .gamma .beta
    h.N.attn.c_attn.weight  [D, 3D]    -> hN.attn.{q,k,v}.w  [H, Dh, D]   (Conv1D is x @ W: transposed,
    h.N.attn.c_attn.bias    [3D]       -> hN.attn.{q,k,v}.b  [H, Dh]       the fused columns split in 3)
    h.N.attn.c_proj.weight  [D, D]     -> hN.attn.out.w      [D, H, Dh]
    h.N.mlp.c_fc / c_proj   [in, out]  -> hN.mlp.fc / proj .w [out, in]
    wte [V, D], wpe [P, D], ln_f       -> wte, wpe, ln_f
    lm_head.weight                     -> tied to wte (checked equal when the file has it)

Everything is checked before anything is written: a missing or misshapen tensor names the
file, the Hugging Face name and both shapes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from einjit.models.gpt import GPT, GPTConfig
from einjit.training.checkpoint import CheckpointError, read

_ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}


def read_config(path: str | os.PathLike) -> GPTConfig:
    """The `GPTConfig` of a Hugging Face GPT-2 directory's `config.json`."""
    file = Path(path) / "config.json"
    try:
        cfg = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"einjit: cannot read the GPT-2 config {file}: {e}") from None
    act = cfg.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"einjit: {file}: activation_function {act!r} is not one of {sorted(_ACTIVATIONS)}")
    try:
        return GPTConfig(vocab_size=int(cfg["vocab_size"]), block_size=int(cfg.get("n_positions", cfg.get("n_ctx"))),
                         n_layer=int(cfg["n_layer"]), n_head=int(cfg["n_head"]), d_model=int(cfg["n_embd"]),
                         tied=bool(cfg.get("tie_word_embeddings", True)), approximate=_ACTIVATIONS[act],
                         eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
                         mlp_ratio=int(cfg.get("n_inner") or 4 * int(cfg["n_embd"])) // int(cfg["n_embd"]))
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"einjit: {file} lacks GPT-2 field {e}") from None


def _hf_arrays(path: Path) -> dict[str, np.ndarray]:
    file = path / "model.safetensors"
    if not file.exists():
        raise CheckpointError(f"einjit: {path} has no model.safetensors (only safetensors checkpoints are read)")
    return {name.removeprefix("transformer."): arr for name, arr in read(file).items()}


def _block_arrays(hf: dict[str, np.ndarray], k: int, c: GPTConfig, take) -> dict[str, np.ndarray]:
    d, h = c.d_model, c.n_head
    out = {f"h{k}.ln1.gamma": take(f"h.{k}.ln_1.weight", (d,)), f"h{k}.ln1.beta": take(f"h.{k}.ln_1.bias", (d,)),
           f"h{k}.ln2.gamma": take(f"h.{k}.ln_2.weight", (d,)), f"h{k}.ln2.beta": take(f"h.{k}.ln_2.bias", (d,))}
    w_attn, b_attn = take(f"h.{k}.attn.c_attn.weight", (d, 3 * d)), take(f"h.{k}.attn.c_attn.bias", (3 * d,))
    for j, name in enumerate("qkv"):
        out[f"h{k}.attn.{name}.w"] = w_attn[:, j * d:(j + 1) * d].T.reshape(h, d // h, d)
        out[f"h{k}.attn.{name}.b"] = b_attn[j * d:(j + 1) * d].reshape(h, d // h)
    out[f"h{k}.attn.out.w"] = take(f"h.{k}.attn.c_proj.weight", (d, d)).T.reshape(d, h, d // h)
    out[f"h{k}.attn.out.b"] = take(f"h.{k}.attn.c_proj.bias", (d,))
    hidden = c.mlp_ratio * d
    out[f"h{k}.mlp.fc.w"] = take(f"h.{k}.mlp.c_fc.weight", (d, hidden)).T
    out[f"h{k}.mlp.fc.b"] = take(f"h.{k}.mlp.c_fc.bias", (hidden,))
    out[f"h{k}.mlp.proj.w"] = take(f"h.{k}.mlp.c_proj.weight", (hidden, d)).T
    out[f"h{k}.mlp.proj.b"] = take(f"h.{k}.mlp.c_proj.bias", (d,))
    return out


def gpt2_arrays(hf: dict[str, np.ndarray], c: GPTConfig, where: str = "the checkpoint") -> dict[str, np.ndarray]:
    """Hugging Face GPT-2 arrays (prefix removed) as `GPT.named_params()` arrays."""
    problems: list[str] = []

    def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
        arr = hf.get(name)
        if arr is None:
            problems.append(f"missing {name!r} (expected {list(shape)})")
            return np.zeros(shape)
        if arr.shape != shape:
            problems.append(f"{name!r} is {list(arr.shape)}, the config needs {list(shape)}")
            return np.zeros(shape)
        return arr

    out = {"wte": take("wte.weight", (c.vocab_size, c.d_model)), "wpe": take("wpe.weight", (c.block_size, c.d_model)),
           "ln_f.gamma": take("ln_f.weight", (c.d_model,)), "ln_f.beta": take("ln_f.bias", (c.d_model,))}
    for k in range(c.n_layer):
        out.update(_block_arrays(hf, k, c, take))
    head = hf.get("lm_head.weight")
    if c.tied:
        if head is not None and not np.array_equal(head, out["wte"]):
            problems.append("'lm_head.weight' differs from 'wte.weight' but the config ties them")
    else:
        out["lm_head"] = take("lm_head.weight", (c.vocab_size, c.d_model))
    if problems:
        raise CheckpointError(f"einjit: {where} is not the GPT-2 its config describes (nothing was loaded):\n  "
                              + "\n  ".join(problems))
    return out


def load_weights(model: GPT, arrays: dict[str, np.ndarray]) -> None:
    """Write `GPT.named_params()`-named arrays into `model` (all names checked first)."""
    named = model.named_params()
    missing = sorted(set(named) - set(arrays))
    extra = sorted(set(arrays) - set(named))
    bad = [f"{n}: {list(arrays[n].shape)} for {list(named[n].dims)}" for n in sorted(set(named) & set(arrays))
           if tuple(arrays[n].shape) != tuple(named[n].dims)]
    if missing or extra or bad:
        raise CheckpointError(f"einjit: weights do not fit GPT {model.label}: missing {missing}, unknown {extra}, "
                              f"misshapen {bad}")
    for name, p in named.items():
        p.set_values(arrays[name].astype(p.value_tn.prec.dtype))


def from_pretrained(path: str | os.PathLike, *, dropout: float = 0.0, label: str = "gpt") -> GPT:
    """A `GPT` holding the weights of a Hugging Face GPT-2 directory (no download: a local
    directory such as `save_pretrained` writes)."""
    path = Path(path)
    c = read_config(path)
    if dropout:
        c = GPTConfig(**{**c.__dict__, "dropout": dropout})
    model = GPT(c, label=label)
    load_weights(model, gpt2_arrays(_hf_arrays(path), c, str(path / "model.safetensors")))
    return model


def tokenizer(path: str | os.PathLike):
    """The `tokenizers.Tokenizer` of the directory's `tokenizer.json`, or None when there is no
    such file or the `tokenizers` package is not installed (then give token ids directly)."""
    file = Path(path) / "tokenizer.json"
    if not file.exists():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    return Tokenizer.from_file(str(file))
