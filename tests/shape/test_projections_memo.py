"""`derive_projections` derives once per `projections_key`: the same operation on tensors of
the same shapes gets a copy with loop symbols of its own, equal to what deriving gives."""

from __future__ import annotations

import numpy as np

import einjit as ej
from einjit import shape as sh
from einjit.ir.indexing import Iterator, Projections, subst_index
from einjit.shape import projections


def contraction(d: int, label: str) -> ej.Tensor:
    x = ej.ndarray(np.ones((2, 3, d), np.float32), batch_axes=2, label=f"x{label}")
    w = ej.param(f"w{label}", input_dims=[d], output_dims=[4, 5])
    return ej.einsum("b, t | -> d; d -> h, e => b, t | -> h, e", x, w, label=f"y{label}")


def same_up_to_symbols(p: Projections, q: Projections) -> bool:
    """Whether `q` is `p` with other product iterators."""
    if p.product_space != q.product_space:
        return False
    rename = {s: Iterator(t) for s, t in zip(q.product_iterators, p.product_iterators, strict=True)}
    return (p.lhs_dims == q.lhs_dims and p.rhs_dims == q.rhs_dims
            and p.project_lhs == tuple(subst_index(rename, i) for i in q.project_lhs)
            and p.project_rhs == tuple(tuple(subst_index(rename, i) for i in r) for r in q.project_rhs))


def test_a_repeated_operation_is_derived_once_with_its_own_loop_symbols(monkeypatch):
    monkeypatch.setattr(projections, "_derived", {})
    a, b, c = contraction(6, "a"), contraction(6, "b"), contraction(7, "c")
    sh.finish_inference()
    built = []
    original = projections._Builder.build
    monkeypatch.setattr(projections._Builder, "build", lambda self, *args: built.append(1) or original(self, *args))
    pa, pb, pc = (t.projections.force() for t in (a, b, c))
    assert len(built) == 2  # b's is a's with fresh symbols; c's dims differ
    assert not set(pa.product_iterators) & set(pb.product_iterators)
    assert same_up_to_symbols(pa, pb)
    assert pa.product_space == (2, 3, 4, 5, 6) and pc.product_space == (2, 3, 4, 5, 7)
    monkeypatch.setattr(projections, "_derived", {})
    d = contraction(6, "d")
    sh.finish_inference()
    fresh = d.projections.force()
    assert len(built) == 3 and same_up_to_symbols(fresh, pb)  # derived, it is what the copy was
