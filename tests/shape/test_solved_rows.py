"""`Shape.solved_rows`: what keys an operation's projections (`projections_key`) and a
program (the program cache), remembered per shape for the rows it was taken of. Inference
replaces rows as it learns, so a remembered answer must follow the replacement."""

from __future__ import annotations

import dataclasses

import einjit as ej
from einjit import shape as sh
from einjit.shape.row import Dim, Kind


def test_an_unsolved_shape_has_no_solved_rows_until_inference_solves_it():
    x = ej.ndarray([[1.0, 2.0, 3.0]], batch_axes=1, label="x")
    w = ej.param("w", output_dims=[2])
    w @ x  # w's input row is unknown until inference closes it
    shape = w.shape
    assert not shape.is_solved() and shape.solved_rows() is None
    sh.finish_inference()
    rows = shape.solved_rows()
    assert shape.is_solved() and rows is not None
    assert [dims for _, dims in rows] == [
        tuple((d.d, d.label) for d in shape.row(kind).dims) for kind in (Kind.BATCH, Kind.INPUT, Kind.OUTPUT)]
    assert (rows[1][1][-1][0], [d for d, _ in rows[2][1]]) == (3, [2])  # x's 3 values in, 2 out
    assert shape.solved_rows() is rows  # remembered


def test_a_replaced_row_is_read_again():
    x = ej.ndarray([[1.0, 2.0]], batch_axes=1, label="x")
    sh.finish_inference()
    shape = x.shape
    before = shape.solved_rows()
    assert before is not None
    shape.output = dataclasses.replace(shape.output, dims=(Dim(5, None),))
    after = shape.solved_rows()
    assert after is not None and after != before and after[2][1] == ((5, None),)
