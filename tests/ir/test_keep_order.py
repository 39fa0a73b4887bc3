"""`ForLoop.keep_order`: a nest whose loop order the scheduling stage fixed. Interchange and
the scheduler leave it alone, both printers show it, and it computes what an unmarked nest
computes (interpreter and gcc)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from einjit.ir import interpret
from einjit.ir import low_level as ll
from einjit.ir.sched.interchange import interchange_loops
from einjit.ir.sched.schedule import schedule_llc
from test_schedule import ANY_SIZE, ON, inputs_for, matmul, run_c


def _loop_order(code):
    return [s.index.name for s in ll.iter_stmts(code) if isinstance(s, ll.ForLoop)]


def _marked(code):
    """`code` (a zero fill, then a nest) with its nest marked `keep_order`."""
    fill, nest = ll.flatten(code)
    return ll.seq(fill, dataclasses.replace(nest, keep_order=True))


def test_interchange_reorders_an_unmarked_nest_and_leaves_a_marked_one_alone():
    code, a, b, c = matmul(6, 5, 7, False)
    assert _loop_order(interchange_loops(code)) == ["i", "k", "j"]   # c[i, j], b[k, j]: j innermost
    marked = _marked(code)
    assert interchange_loops(marked) == marked
    assert _loop_order(marked) == ["i", "j", "k"]


def test_the_scheduler_leaves_a_marked_nest_alone():
    code, *_ = matmul(64, 32, 64, True)
    assert schedule_llc(code, ON, ANY_SIZE) != code
    marked = _marked(code)
    assert schedule_llc(marked, ON, ANY_SIZE) == marked


def test_both_printers_show_the_mark():
    code, *_ = matmul(2, 3, 4, False)
    marked = _marked(code)
    assert re.search(r"\nfor (i\d*) = 0 to 1 \(order kept\) \{\n  for j\d* = 0 to 3 \{\n", ll.to_doc(marked))
    assert re.search(r"\nfor \(int (i\d*) = 0; \1 <= 1; \+\+\1\) \{ /\* order kept \*/\n  for \(int j",
                     ll.to_doc_cstyle(marked))
    assert "order kept" not in ll.to_doc(code) + ll.to_doc_cstyle(code)


def test_a_marked_nest_computes_what_the_unmarked_one_does_in_c_and_the_interpreter():
    code, a, b, c = matmul(6, 5, 7, False)
    ins = inputs_for(a, b, seed=2)
    want = ins[a].astype(np.float64) @ ins[b].astype(np.float64)
    results = []
    for variant in (code, _marked(code), interchange_loops(_marked(code))):
        got = interpret.run(variant, {tn: v.copy() for tn, v in ins.items()})[c]
        np.testing.assert_array_equal(run_c(variant, ins, c), got)
        results.append(got)
    np.testing.assert_array_equal(results[1], results[0])
    np.testing.assert_array_equal(results[2], results[0])
    np.testing.assert_allclose(results[0], want, rtol=1e-5, atol=1e-5)
