"""The micrograd example in einjit: forward and backprop in one compiled C routine.

    python examples/micrograd.py
"""

import einjit as ej
from einjit import train

with ej.default_precision("double"):
    a = ej.param("a", values=[-4.0])
    b = ej.param("b", values=[2.0])
    c = a + b
    d = a * b + b ** 3
    c = c + c + 1
    c = c + 1 + c + (-a)
    d = d + d * 2 + ej.relu(b + a)
    d = d + 3 * d + ej.relu(b - a)
    e = c - d
    f = e ** 2
    g = f / 2 + 10.0 / f
    train.init_params(g)
    train.to_routine(train.grad_update(g), name="micrograd")()
    print(f"g = {g.value.numpy()[0]:.4f}")            # 24.7041
    print(f"dg/da = {a.grad.numpy()[0]:.4f}")        # 138.8338
    print(f"dg/db = {b.grad.numpy()[0]:.4f}")        # 645.5773
