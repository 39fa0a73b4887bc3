"""Attention masks generated from indices, and a softmax that ignores masked entries.

`causal_mask(scores, query_axis=, key_axis=, offset=)` is 1 where a key position is at most
the query position plus `offset`, else 0. Its code compares loop indices (`CausalMask`, a
fetch of the assignments IR), so the optimizer inlines it into the `where` that reads it: no
`T x T` constant is built or stored. For decoding with a KV cache, `offset` is a static symbol
(the position of the first query in the cache), bound per call like the cache's write
position, so query `t` attends keys `s <= t + offset` with one compiled routine for all
positions.

`masked_softmax(scores, mask, axis=)` is the numerically stable softmax over the entries
where `mask` is non-zero: the maximum it subtracts is taken over those entries only (masked
ones are set to -1e30 before the maximum), masked entries come out exactly 0, and a row with
every entry masked is all zeros — never NaN, in the values or in the gradients (no infinity
is ever formed). `scaled_dot_product_attention` (`nn`) builds on these two.
"""

from __future__ import annotations

from einjit import shape as sh
from einjit.ir import assignments as asg
from einjit.ir.indexing import StaticSymbol
from einjit.tensor import reductions
from einjit.tensor.notation import infer_projections
from einjit.tensor.operation import Like, as_tensor, einsum, exp, maximum, where
from einjit.tensor.tensor import Tensor, TensorError, default_prec, make_node, new_label, register

MASKED = -1e30
"""What masked scores become before the row maximum: below any real score, finite in single
precision, so `x - max` and its gradient stay finite even for a fully masked row."""


def causal_mask(like: Like, *, query_axis: int, key_axis: int, offset: "int | StaticSymbol" = 0,
                label=None) -> Tensor:
    """A non-differentiable tensor shaped like `like`: 1 where the index along `key_axis` is at
    most the index along `query_axis` plus `offset`, else 0. Axes count `like`'s dims in memory
    order (batch, output, input), negative from the end; `offset` is an int or a static symbol
    (a run-time position, e.g. the number of tokens already in a KV cache)."""
    x = as_tensor(like)
    for name, axis in (("query_axis", query_axis), ("key_axis", key_axis)):
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TensorError(f"einjit: causal_mask: {name} must be an int, got {axis!r}")
    if isinstance(offset, StaticSymbol):
        shift, sym = 0, offset
    elif isinstance(offset, int) and not isinstance(offset, bool):
        shift, sym = offset, None
    else:
        raise TensorError(f"einjit: causal_mask: offset must be an int or a static symbol, got {offset!r}")
    lbl = new_label(label, "causal_mask")
    shape = sh.Shape.make(debug_name=".".join(lbl))
    proj = infer_projections(shape, None, [x.shape], f"causal_mask ({'.'.join(lbl)})")
    t = Tensor(label=lbl, op_label="causal_mask", shape=shape, update_step=None, children=(x,),
               value_tn=make_node(lbl, shape, default_prec()), grad_tn=None, projections=proj)
    t.own_forward = asg.Fetch(t.value_tn, asg.CausalMask(query_axis, key_axis, shift, sym))
    register(t)
    return t


def causal_mask_fill(scores: Like, *, query_axis: int, key_axis: int, offset: "int | StaticSymbol" = 0,
                     value: float = MASKED, label=None) -> Tensor:
    """`scores` where the causal mask keeps them, `value` elsewhere (see `causal_mask`)."""
    x = as_tensor(scores)
    keep = causal_mask(x, query_axis=query_axis, key_axis=key_axis, offset=offset)
    return where(keep, x, value, label=label or "causal_fill")


def masked_softmax(scores: Like, mask: Like | None = None, *, axis: int = -1, label=None) -> Tensor:
    """Softmax along `axis` over the entries where `mask` (broadcast pointwise to `scores`) is
    non-zero; masked entries are 0 and a fully masked row is all zeros (see the module
    docstring). Without a mask it equals `softmax`."""
    x = as_tensor(scores)
    if mask is None:
        return reductions.softmax(x, axis, label=label)
    keep = as_tensor(mask)
    kept = where(keep, x, MASKED, label="masked_scores")
    shifted, spec, bspec = reductions.stable_parts(kept, axis)
    # exp sees 0, not -1e30, at masked entries: libmvec's vector exp (double precision's)
    # leaves its fast path for a whole vector when one lane is far out of range (a causal row
    # mask made it 2x slower); einjit's single-precision exp takes one path for all inputs.
    e = where(keep, exp(where(keep, shifted, 0.0)), 0.0, label="masked_exp")
    # Every row with a kept entry sums to at least 1 (its maximum gives exp(0)); a fully
    # masked row sums to 0 and is divided by 1.
    total = maximum(einsum(spec, e), 1.0)
    return reductions.broadcast_op("/", e, total, bspec, label=label or "masked_softmax")
