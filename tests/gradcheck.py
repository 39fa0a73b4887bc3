"""Gradients of a compiled step against central finite differences of the same routine."""

from __future__ import annotations

import numpy as np

import einjit as ej
from einjit import train


def weighted_loss(result: ej.Tensor, rng: np.random.Generator) -> ej.Tensor:
    """`sum(result * r)` for a random `r` of result's dims, so every output cell matters."""
    from einjit import shape as sh
    sh.finish_inference()
    r = ej.ndarray(rng.standard_normal(result.dims), batch_axes=len(result.shape.batch.dims),
                   input_axes=len(result.shape.input.dims), label="r")
    return ej.sum(result * r, label="loss")


def check_gradients(loss: ej.Tensor, params: list[ej.Tensor], *, h: float = 1e-6, rtol: float = 1e-5,
                    atol: float = 1e-7) -> None:
    routine = train.to_routine(train.grad_update(loss), name="gradcheck")
    routine()
    grads = [p.grad.numpy() for p in params]
    for p, g in zip(params, grads, strict=True):
        host = p.value_tn.array
        fd = np.zeros_like(g)
        for idx in np.ndindex(host.shape):
            orig = host[idx]
            host[idx] = orig + h
            routine()
            up = float(loss.value.numpy().ravel()[0])
            host[idx] = orig - h
            routine()
            down = float(loss.value.numpy().ravel()[0])
            host[idx] = orig
            fd[idx] = (up - down) / (2 * h)
        np.testing.assert_allclose(g, fd, rtol=rtol, atol=atol, err_msg=f"gradient of {p.label_str}")
