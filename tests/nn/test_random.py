"""The in-graph random number operation: `Set_vec_unop` fed by a seeded, self-incrementing counter."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import shape as sh
from einjit import train
from einjit.ir import assignments as asg
from einjit.ir import interpret, ops
from einjit.ir import low_level as ll
from einjit.tensor import random as rnd


def _hash_block(counter: int, dims) -> np.ndarray:
    return np.array(ops.uniform_hash(counter, int(np.prod(dims)))).reshape(dims)


def test_uniform_values_follow_the_counter_and_differ_between_runs():
    with ej.default_precision("double"):
        x = ej.ndarray(np.zeros((4, 3, 5)), batch_axes=1, label="x")
        u = rnd.uniform(x, seed=3)
        routine = train.to_routine(train.forward(u), name="draw")
        routine()
        first = u.value.numpy()
        routine()
        second = u.value.numpy()
    base = rnd.stream_base(3, 0)
    np.testing.assert_array_equal(first, _hash_block(base, (4, 3, 5)))
    np.testing.assert_array_equal(second, _hash_block(base + 1, (4, 3, 5)))
    assert rnd.counter(u).value.numpy()[0] == base + 2
    assert 0.0 <= first.min() and first.max() < 1.0


def test_the_routine_contains_a_vector_assignment():
    x = ej.ndarray(np.zeros((2, 8), np.float32), batch_axes=1)
    u = rnd.uniform(x, seed=0)
    code = train.forward(u)
    sh.finish_inference()
    llc = asg.to_low_level(code)
    assert [s.vec_unop for s in ll.iter_stmts(llc) if isinstance(s, ll.SetFromVec)] == [ops.VecUnop.UNIFORM_HASH]


def test_compiled_c_matches_the_interpreter():
    x = ej.ndarray(np.zeros((3, 4), np.float32), batch_axes=1)
    u = rnd.uniform(x, seed=9)
    code = train.forward(u)
    sh.finish_inference()
    start = rnd.counter(u).value.numpy().copy()
    ref = interpret.run(asg.to_low_level(code), {rnd.counter(u).value_tn: start})
    routine = train.to_routine(code, name="draw_c")
    routine()
    np.testing.assert_array_equal(u.value.numpy(), ref[u.value_tn])


def test_same_seed_reproduces_and_draws_in_one_program_differ():
    def draw():
        x = ej.ndarray(np.zeros((2, 6), np.float32), batch_axes=1)
        a, b = rnd.uniform(x, seed=11).hosted(), rnd.uniform(x, seed=11).hosted()
        out = a - b
        routine = train.to_routine(train.forward(out))
        routine()
        return a.value.numpy(), b.value.numpy()

    rnd.reset_streams()
    a1, b1 = draw()
    rnd.reset_streams()
    a2, b2 = draw()
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(b1, b2)
    assert not np.array_equal(a1, b1)


def test_uniform_statistics_and_normal_moments():
    with ej.default_precision("double"):
        x = ej.ndarray(np.zeros((200, 500)), batch_axes=1)
        u = rnd.uniform(x, seed=5)
        n = rnd.normal(ej.ndarray(np.zeros((200, 500)), batch_axes=1), seed=5)
        routine = train.to_routine([train.forward(u), train.forward(n)])
        routine()
    uv, nv = u.value.numpy(), n.value.numpy()
    assert abs(uv.mean() - 0.5) < 0.005 and abs(uv.var() - 1 / 12) < 0.002
    assert abs(nv.mean()) < 0.01 and abs(nv.std() - 1.0) < 0.01


def test_counter_of_a_plain_tensor_is_an_error():
    with pytest.raises(ej.TensorError, match="not a random tensor"):
        rnd.counter(ej.number(1.0))
