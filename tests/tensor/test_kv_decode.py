"""The ops pieces composed as a decoder uses them: each step writes one token's keys and
values into KV caches at `pos` (`write_at`) and attends over the cache with a causal mask
offset by `pos` (`causal_mask`, `masked_softmax`) — one compiled routine for every step,
against NumPy attention recomputed from scratch."""

from __future__ import annotations

import numpy as np

import einjit as ej
from einjit import train

B, TM, H, E = 2, 6, 2, 4


def test_decoding_with_kv_caches_matches_full_attention_at_every_step():
    rng = np.random.default_rng(0)
    with ej.default_precision("double"):
        k_cache = ej.buffer("k_cache", batch_dims=[B], output_dims=[TM, H, E])
        v_cache = ej.buffer("v_cache", batch_dims=[B], output_dims=[TM, H, E])
        q, k, v = (ej.input(n, batch_dims=[B], output_dims=[1, H, E]) for n in ("q", "k", "v"))
        pos = ej.get_static_symbol(name="pos")
        keys = ej.write_at(k_cache, k, pos, axis=1)
        values = ej.write_at(v_cache, v, pos, axis=1)
        scores = ej.einsum("b|->t,h,e; b|->s,h,e => b|->t,h,s", q, keys) * (1 / np.sqrt(E))
        mask = ej.causal_mask(scores, query_axis=1, key_axis=3, offset=pos)
        att = ej.masked_softmax(scores, mask, axis=3)
        out = ej.einsum("b|->t,h,s; b|->s,h,e => b|->t,h,e", att, values)
    ref = ej.IntRef(0)
    step = train.to_routine(train.forward(out), bindings={pos: ref}, name="decode_attention")
    ks, vs = rng.standard_normal((B, TM, H, E)), rng.standard_normal((B, TM, H, E))
    for t in range(TM):
        qt = rng.standard_normal((B, 1, H, E))
        q.set_values(qt)
        k.set_values(ks[:, t:t + 1])
        v.set_values(vs[:, t:t + 1])
        ref.value = t
        step()
        s = np.einsum("bthe,bshe->bths", qt, ks[:, :t + 1]) / np.sqrt(E)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(out.value.numpy(), np.einsum("bths,bshe->bthe", p, vs[:, :t + 1]), rtol=1e-12)
    np.testing.assert_array_equal(k_cache.value.numpy(), ks)
    np.testing.assert_array_equal(v_cache.value.numpy(), vs)
