"""A NumPy GPT-2 forward on Hugging Face arrays (Conv1D `x @ W + b`, fused `c_attn`), written
from the GPT-2 paper and the `transformers` layout, independent of einjit: the oracle of the
loader when `transformers` is not installed. Also writes such arrays as a GPT-2 directory."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

CONFIG = {"vocab_size": 61, "n_positions": 12, "n_embd": 16, "n_layer": 2, "n_head": 4,
          "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
          "model_type": "gpt2"}


def random_gpt2(cfg: dict = CONFIG, seed: int = 0) -> dict[str, np.ndarray]:
    """GPT-2 arrays under `transformer.` names, float32, with non-trivial LayerNorm weights."""
    rng = np.random.default_rng(seed)
    d, v, p = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]

    def r(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {"transformer.wte.weight": r(v, d), "transformer.wpe.weight": r(p, d),
           "transformer.ln_f.weight": 1 + r(d), "transformer.ln_f.bias": r(d)}
    for k in range(cfg["n_layer"]):
        h = f"transformer.h.{k}."
        out.update({h + "ln_1.weight": 1 + r(d), h + "ln_1.bias": r(d), h + "ln_2.weight": 1 + r(d),
                    h + "ln_2.bias": r(d), h + "attn.c_attn.weight": r(d, 3 * d), h + "attn.c_attn.bias": r(3 * d),
                    h + "attn.c_proj.weight": r(d, d), h + "attn.c_proj.bias": r(d),
                    h + "mlp.c_fc.weight": r(d, 4 * d), h + "mlp.c_fc.bias": r(4 * d),
                    h + "mlp.c_proj.weight": r(4 * d, d), h + "mlp.c_proj.bias": r(d)})
    return out


def write_dir(path: Path, arrays: dict[str, np.ndarray], cfg: dict = CONFIG) -> Path:
    """`config.json` and `model.safetensors` (the format written by hand, as the spec says)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    header, offset, blobs = {}, 0, []
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def _ln(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _gelu_new(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def forward(arrays: dict[str, np.ndarray], ids: np.ndarray, cfg: dict = CONFIG) -> np.ndarray:
    """Logits `(batch, time, vocab)` of token ids `(batch, time)`, in float64."""
    a = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in arrays.items()}
    eps, n_head = cfg["layer_norm_epsilon"], cfg["n_head"]
    b, t = ids.shape
    x = a["wte.weight"][ids] + a["wpe.weight"][:t]
    mask = np.tril(np.ones((t, t), bool))
    for k in range(cfg["n_layer"]):
        h = f"h.{k}."
        y = _ln(x, a[h + "ln_1.weight"], a[h + "ln_1.bias"], eps) @ a[h + "attn.c_attn.weight"]
        y = y + a[h + "attn.c_attn.bias"]
        q, kk, v = (z.reshape(b, t, n_head, -1).transpose(0, 2, 1, 3) for z in np.split(y, 3, axis=-1))
        s = q @ kk.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
        s = np.where(mask, s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        o = (w @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
        x = x + o @ a[h + "attn.c_proj.weight"] + a[h + "attn.c_proj.bias"]
        m = _gelu_new(_ln(x, a[h + "ln_2.weight"], a[h + "ln_2.bias"], eps) @ a[h + "mlp.c_fc.weight"]
                      + a[h + "mlp.c_fc.bias"])
        x = x + m @ a[h + "mlp.c_proj.weight"] + a[h + "mlp.c_proj.bias"]
    return _ln(x, a["ln_f.weight"], a["ln_f.bias"], eps) @ a["wte.weight"].T
