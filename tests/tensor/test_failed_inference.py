"""Bad input leaves the framework usable (issue 24): a shape conflict, found when an operation
is added or only when shapes are closed at compile time, and a spec that does not parse, raise
an einjit error and leave global shape inference working for every tensor they do not concern,
built before or after them. No state is reset between the steps of these tests: that is the
point."""

from __future__ import annotations

import numpy as np
import pytest

import einjit as ej
from einjit import shape as sh
from einjit import train


@pytest.fixture(autouse=True)
def float64():
    with ej.default_precision("double"):
        yield


def _model_matches_numpy() -> None:
    """An unrelated model, built now, compiles and computes what NumPy does."""
    rng = np.random.default_rng(7)
    a_np, w_np, b_np = rng.standard_normal((2, 3)), rng.standard_normal((3, 4)), rng.standard_normal(4)
    a, w, b = ej.ndarray(a_np, label="a"), ej.ndarray(w_np, label="w"), ej.ndarray(b_np, label="b")
    y = ej.relu(ej.einsum("ij;jk=>ik", a, w) + b)
    np.testing.assert_allclose(train.forward_once(y), np.maximum(a_np @ w_np + b_np, 0.0), rtol=1e-12)


def _file_of_six(tmp_path) -> str:
    path = tmp_path / "six.bin"
    np.arange(6, dtype=np.float64).tofile(path)
    return str(path)


def _closing_conflict(path: str) -> ej.Tensor:
    """A file of 6 values with an unknown output row plus 4 values: each is fine alone, and
    adding them is fine too until closing gives the file's row its one axis of 6."""
    f = ej.file_mapped(path, prec="double", label="f6")
    return f + ej.ndarray(np.array([1.0, 2.0, 3.0, 4.0]), label="v4")


def test_a_conflict_when_adding_an_operation_leaves_later_models_working():
    x, v = ej.ndarray(np.array([1.0, 2.0, 3.0]), label="x3"), ej.ndarray(np.array([1.0, 2.0]), label="v2")
    with pytest.raises(sh.ShapeError, match="dimension mismatch"):
        _ = x + v
    _model_matches_numpy()
    np.testing.assert_array_equal(train.forward_once(x * 2.0), [2.0, 4.0, 6.0])


def test_a_conflict_found_when_closing_at_compile_time_leaves_later_models_working(tmp_path):
    y = _closing_conflict(_file_of_six(tmp_path))
    with pytest.raises(sh.ShapeError, match="4 .* vs 6"):
        train.to_routine(train.forward(y))
    _model_matches_numpy()
    with pytest.raises(sh.ShapeError, match="4 .* vs 6"):  # the conflicting tensor still says why
        train.forward_once(y + 1.0)
    _model_matches_numpy()


def test_a_conflict_does_not_poison_tensors_built_before_or_beside_it(tmp_path):
    path = _file_of_six(tmp_path)
    f = ej.file_mapped(path, prec="double", label="f")
    doubled = f * 2.0  # consistent, still open: closing will give f its 6 elements
    p = ej.ndarray(np.array([1.0, -2.0]), label="p")
    shifted = p + 1.0
    y = f + ej.ndarray(np.array([1.0, 2.0, 3.0, 4.0]), label="v4")
    beside = ej.ndarray(np.array([3.0, 4.0, 5.0]), label="q") * 10.0  # built after, unrelated
    with pytest.raises(sh.ShapeError, match="4 .* vs 6"):
        train.to_routine(train.forward(y))
    np.testing.assert_array_equal(train.forward_once(doubled), 2.0 * np.arange(6.0))
    np.testing.assert_array_equal(train.forward_once(shifted), [2.0, -1.0])
    np.testing.assert_array_equal(train.forward_once(beside), [30.0, 40.0, 50.0])


def test_a_conflict_found_by_a_provisional_closing_is_withdrawn(tmp_path):
    """`provisional_row` (a layer sizing itself while building) closes too: a conflict there
    must not stay behind for the next compile."""
    y = _closing_conflict(_file_of_six(tmp_path))
    with pytest.raises(sh.ShapeError, match="4 .* vs 6"):
        sh.inference.provisional_row(y.shape, sh.Kind.OUTPUT)
    _model_matches_numpy()


@pytest.mark.parametrize("spec", ["ij;jk=>ik=>x", "o+k; k => o", "i..j;jk=>ik", "ij;jk"])
def test_an_einsum_spec_that_does_not_parse_leaves_later_models_working(spec):
    a = ej.ndarray(np.ones((2, 2)), label="m")
    with pytest.raises(ej.errors.EinjitError):
        ej.einsum(spec, a, a)
    _model_matches_numpy()


@pytest.mark.parametrize("text", ['"z" =: x +* 1', '"z" =: x + 1.0; "w" =: z + q', '"z" =: x + y'])
def test_a_bad_cd_block_leaves_later_models_working(text):
    """A syntax error, an unknown name after a first statement succeeded, and a shape conflict
    inside `%cd`."""
    x, y = ej.ndarray(np.array([1.0, 2.0, 3.0]), label="x"), ej.ndarray(np.array([1.0, 2.0]), label="y")
    with pytest.raises(ej.errors.EinjitError):
        ej.cd(text, x=x, y=y)
    _model_matches_numpy()
    code = ej.cd('"s" =: x * 2.0', x=x)
    code.s.hosted()
    train.run(train.to_routine(code))
    np.testing.assert_array_equal(code.s.value.numpy(), [2.0, 4.0, 6.0])
