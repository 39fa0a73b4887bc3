"""Shape inference at work: parameter shapes inferred from use, einsum specs, a strided
convolution, and the `%cd` notation.

    python examples/shapes_and_einsum.py
"""

import numpy as np

import einjit as ej
from einjit import train

x = ej.ndarray(np.random.default_rng(0).standard_normal((8, 5)), batch_axes=1, label="x")  # 8 | -> 5
w = ej.param("w", output_dims=[3])          # input axes unknown: inferred from `w @ x`
y = ej.relu(w @ x, label="y")
train.init_params(y)
print("y:", y.shape, "  w:", w.shape)       # y: 8|3   w: 5->3
print(train.forward_once(y).shape)

signal = ej.ndarray(np.arange(12.0), label="signal")
kernel = ej.ndarray(np.array([1.0, 0.0, -1.0]), label="kernel")
conv = ej.einsum("2*o+k,;k,=>o,", signal, kernel)   # stride 2, valid convolution
print("strided convolution:", train.forward_once(conv))

a = ej.ndarray([(1.0, 2.0), (3.0, 4.0)], label="a")  # a list of tuples: output 2, input 2
code = ej.cd('"at" =: a ~logic:"T"; "sq" =:+ a * at ~logic:"@"', a=a)
for t in (code.at, code.sq):
    t.hosted()
train.to_routine(code)()
print(code.sq)
