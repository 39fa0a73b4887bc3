"""NumPy's NaN semantics for relu, maximum, minimum, the max/min reductions and where: the
interpreter, gcc-compiled C and the CUDA rendering all agree with NumPy on NaN and ±inf."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import einjit as ej
from einjit import train
from einjit.backends.c_syntax import symbol_name
from einjit.backends.gpu import cuda_syntax
from einjit.ir import low_level as ll
from einjit.ir import naming, ops
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.tnode import Tnode
from safety_helpers import run_c, run_interpreter

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.5, 2.0]
PAIRS = np.array(list(itertools.product(SPECIAL, SPECIAL))).T   # every ordered pair, 64 columns
PRECS = [ops.half, ops.single, ops.double]


@pytest.fixture
def float64():
    with ej.default_precision("double"):
        yield


def assert_same(got, want):
    """Equal values, NaN where NumPy has NaN (and nowhere else), the same infinities."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got, want)


def pointwise(prec, n_args, make):
    """out[i] = make(arg_1[i], ...); returns the program and its nodes."""
    args = [Tnode(f"a{k}", (PAIRS.shape[1],), prec=prec) for k in range(n_args)]
    out = Tnode("out", (PAIRS.shape[1],), prec=prec)
    i = get_symbol()
    code = ll.ForLoop(i, 0, PAIRS.shape[1] - 1, ll.Set(out, (Iterator(i),), make(*[
        ll.Get(a, (Iterator(i),)) for a in args])))
    return code, args, out


def check_everywhere(code, inputs, out, want):
    assert_same(run_interpreter(code, inputs)[out], want)
    assert_same(run_c(code, inputs).array(out), want)


@pytest.mark.parametrize("prec", PRECS, ids=str)
def test_relu(prec):
    code, (a,), out = pointwise(prec, 1, lambda x: ll.Unop(ops.Unop.RELU, x))
    x = PAIRS[0].astype(prec.dtype)
    check_everywhere(code, {a: x}, out, np.maximum(x, 0))
    assert np.isnan(ops.apply_unop(ops.Unop.RELU, np.float32(np.nan)))


@pytest.mark.parametrize("prec", PRECS, ids=str)
@pytest.mark.parametrize("op,np_op", [(ops.Binop.MAX, np.maximum), (ops.Binop.MIN, np.minimum)], ids=str)
def test_maximum_minimum(prec, op, np_op):
    code, (a, b), out = pointwise(prec, 2, lambda x, y: ll.Binop(op, x, y))
    x, y = (PAIRS[k].astype(prec.dtype) for k in range(2))
    check_everywhere(code, {a: x, b: y}, out, np_op(x, y))


@pytest.mark.parametrize("op", [ops.Binop.MAX, ops.Binop.MIN], ids=str)
@pytest.mark.parametrize("n", [1, 64], ids=["scalar", "vectorized"])
def test_maximum_minimum_bits(op, n):
    """Bit for bit `(a >= b || a != a) ? a : b` (`<=` for the minimum), signed zeros and NaN
    payloads included: a NaN on one side is the result, the first of two NaNs, the first of
    two equal zeros (NumPy's `maximum` gives the second of two zeros: the interpreter's value
    is equal, its zero's sign may differ); one cell alone (gcc's scalar `maxss` behind a NaN
    test) and a loop gcc vectorizes (compares and blends)."""
    nans = np.array([0x7FC00001, 0xFFC00002], dtype=np.uint32).view(np.float32)
    special = [nans[0], nans[1], 0.0, -0.0, 1.0, -np.inf]
    pairs = np.array(list(itertools.product(special, special)), dtype=np.float32).T
    a, b, out = Tnode("a", (n,)), Tnode("b", (n,)), Tnode("out", (n,))
    i = get_symbol()
    code = ll.ForLoop(i, 0, n - 1, ll.Set(out, (Iterator(i),), ll.Binop(op, ll.Get(a, (Iterator(i),)),
                                                                         ll.Get(b, (Iterator(i),)))))
    for start in range(0, pairs.shape[1], n):
        x, y = (np.resize(pairs[k, start:start + n], n).astype(np.float32) for k in range(2))
        first = (x >= y) if op is ops.Binop.MAX else (x <= y)
        want = np.where(first | np.isnan(x), x, y)
        np.testing.assert_array_equal(run_c(code, {a: x, b: y}).array(out).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("prec", PRECS, ids=str)
def test_where(prec):
    code, (c, a, b), out = pointwise(prec, 3, lambda x, y, z: ll.Ternop(ops.Ternop.WHERE, x, y, z))
    cond = PAIRS[0].astype(prec.dtype)
    x, y = PAIRS[1].astype(prec.dtype), (PAIRS[1] * -3).astype(prec.dtype)
    check_everywhere(code, {c: cond, a: x, b: y}, out, np.where(cond, x, y))


@pytest.mark.parametrize("prec", PRECS, ids=str)
@pytest.mark.parametrize("op,np_op", [(ops.Binop.MAX, np.max), (ops.Binop.MIN, np.min)], ids=str)
def test_max_min_reductions(prec, op, np_op):
    """Each row of `a` reduced with the op's neutral element as the start: a NaN anywhere in
    the row gives NaN, ±inf survive, a row of only -inf (for max) stays -inf."""
    rows = np.array([[1.0, np.nan, 3.0, -1.0], [np.nan, 2.0, 5.0, 0.0], [1.0, 2.0, 3.0, np.nan],
                     [-np.inf, -np.inf, -np.inf, -np.inf], [np.inf, -np.inf, 0.0, 1.0],
                     [np.inf, np.inf, np.inf, np.inf], [-2.0, -0.0, 0.0, -7.5]], dtype=prec.dtype)
    a, out = Tnode("a", rows.shape, prec=prec), Tnode("out", (rows.shape[0],), prec=prec)
    i, k = get_symbol(), get_symbol()
    acc = ll.fresh_scope_id(out)
    reduce_row = ll.LocalScope(acc, ll.seq(
        ll.SetLocal(acc, ll.Constant(op.neutral)),
        ll.ForLoop(k, 0, rows.shape[1] - 1, ll.SetLocal(acc, ll.Binop(op, ll.GetLocal(acc), ll.Get(
            a, (Iterator(i), Iterator(k))))))), (Iterator(i),))
    code = ll.ForLoop(i, 0, rows.shape[0] - 1, ll.Set(out, (Iterator(i),), reduce_row))
    check_everywhere(code, {a: rows}, out, np_op(rows, axis=1))


@pytest.mark.parametrize("accum,np_op", [("^^", np.max), ("vv", np.min)])
def test_max_min_reductions_through_cd(float64, accum, np_op):
    """The `%cd` accumulating forms `=:^^` and `=:vv`, compiled, against NumPy."""
    data = np.array([[1.0, np.nan, 3.0], [4.0, -np.inf, 6.0], [np.inf, 2.0, np.nan]])
    a = ej.ndarray(data)
    code = ej.cd(f'"r" =:{accum} a ~logic:"ij=>i"; "c" =:{accum} a ~logic:"ij=>j"', a=a)
    code.r.hosted()
    code.c.hosted()
    train.to_routine(code, name="nan_reduce")()
    assert_same(code.r.value.numpy(), np_op(data, axis=1))
    assert_same(code.c.value.numpy(), np_op(data, axis=0))


@pytest.mark.parametrize("make,np_op", [
    (lambda x, y: ej.relu(x), lambda x, y: np.maximum(x, 0)),
    (ej.maximum, np.maximum),
    (ej.minimum, np.minimum),
    (lambda x, y: ej.where(x, y, x), lambda x, y: np.where(x, y, x)),
], ids=["relu", "maximum", "minimum", "where"])
def test_public_operations(float64, make, np_op):
    x, y = PAIRS
    out = make(ej.ndarray(x), ej.ndarray(y))
    assert_same(train.forward_once(out), np_op(x, y))


def test_cuda_rendering_propagates_nan():
    """No GPU here: the rendered kernel must use the NaN-propagating forms, never fmaxf/fminf
    (which drop a NaN) nor a `> 0` relu (which maps NaN to 0)."""
    n = 8
    a, b = Tnode("a", (n,), prec=ops.single), Tnode("b", (n,), prec=ops.single)
    o1, o2, o3 = (Tnode(name, (n,), prec=ops.single) for name in ("o_max", "o_min", "o_relu"))
    i = get_symbol()
    ga, gb = ll.Get(a, (Iterator(i),)), ll.Get(b, (Iterator(i),))
    code = ll.ForLoop(i, 0, n - 1, ll.seq(
        ll.Set(o1, (Iterator(i),), ll.Binop(ops.Binop.MAX, ga, gb)),
        ll.Set(o2, (Iterator(i),), ll.Binop(ops.Binop.MIN, ga, gb)),
        ll.Set(o3, (Iterator(i),), ll.Unop(ops.Unop.RELU, ga))))
    with naming.stable_names():
        # the renderer names nodes and symbols inside the program's stable names (`o_max`, `i0`);
        # asking for the names inside the same scope gives the names it printed
        src = cuda_syntax.render_program([("nan_ops", code)]).source
        names = [o.name for o in (o1, o2, o3)]
        at = f"[{symbol_name(i)}] = "
    assert names == ["o_max", "o_min", "o_relu"]
    assert "fmax" not in src and "fmin" not in src
    assert " > 0 ?" not in src
    body = src[src.index("void nan_ops"):]
    assert f"{names[0]}{at}((t2_ != t2_ && t1_ == t1_) ? t2_ : (t2_ > t1_ ? t2_ : t1_));" in body
    assert f"{names[1]}{at}((t4_ != t4_ && t3_ == t3_) ? t4_ : (t4_ < t3_ ? t4_ : t3_));" in body
    assert f"{names[2]}{at}(t5_ < 0 ? 0 : t5_);" in body
