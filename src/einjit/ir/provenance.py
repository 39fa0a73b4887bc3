"""Provenance codes: which decision gave a node its memory mode, in one table.

A node's `provenance` is the code of the last decision that narrowed its memory mode. Error
messages print `describe(code)`, so a user reading "not hosted (memory mode Virtual,
provenance 15: ...)" learns what made it so without reading the source. The optimizer's
`NonVirtual` codes (seed 001's diagnostics) are provenances too: a node that could not be
virtualized becomes `Never_virtual` with the failing check's code.
"""

from __future__ import annotations

UNSET = 0
TOO_MANY_VISITS = 1
COMPLEX_COMPUTATION = 2
INLINED = 15
RUN_TIME_INDEX = 16
KEPT = 17
CONSTANT_TENSOR = 30
PARAM_VALUE = 31
PARAM_GRAD = 32
RECURRENT_NODE = 36
READ_ONLY = 37
HOSTED_FOR_HOST_ACCESS = 38
HOSTED_VALUE = 60
HOSTED_GRAD = 61
MATERIALIZE_CALL = 62
VIRTUAL_CALL = 63
ON_DEVICE_CALL = 64
HOSTED_BY_WRITE = 70
INPUT = 80
STATE = 81
SCHEDULED_LOCAL = 90
ROUTINE_LOCAL = 91
REGISTER_BLOCK = 92
MIXED_PRECISION_COPY = 93
MIXED_PRECISION_OPERAND = 94

NON_VIRTUAL_REASONS: dict[int, str] = {
    4: "its computation accesses it with inconsistent index patterns",
    5: "one loop symbol indexes several of its axes",
    51: "an affine index of it has several loop symbols (e.g. a convolution); not supported yet",
    6: "its computation contains a loop that is not traced",
    7: "a write in its computation uses a loop symbol bound outside the computation",
    8: "its computation contains backend-staged code",
    9: "a read in its computation uses a loop symbol bound outside the computation",
    10: "an index embedded in its computation uses a loop symbol bound outside the computation",
    11: "its memory mode already excludes virtualization",
    12: "the code block computing it does not write it",
    13: "the indices of a read cannot be substituted into its computation",
    14: "it has no computation to inline at a read",
    KEPT: "it is still read where its computation could not be inlined",
    131: "a node its computation reads is overwritten before the node is read",
    132: "its computation sits in a loop of another computation, which repeats it",
    133: "inlining it would nest more than MAX_INLINE_DEPTH inlined computations in one expression",
    140: "vector assignments cannot be inlined as scalars",
    RUN_TIME_INDEX: "it is accessed at an index read at run time (gather / scatter), or holds such indices",
}
"""The optimizer's `NonVirtual` diagnostics (seed 001): why a node could not be virtual."""

PROVENANCES: dict[int, str] = {
    **{code: f"kept: {reason}" for code, reason in NON_VIRTUAL_REASONS.items()},
    UNSET: "set when the node was made, or by the ATL front end (hosted arguments and result)",
    TOO_MANY_VISITS: "kept: its cells are visited more often than VirtualizeSettings.max_visits allows",
    COMPLEX_COMPUTATION: "kept: its computation is complex and inline_complex_computations is off",
    INLINED: "virtual: the optimizer inlined its computation at every read",
    CONSTANT_TENSOR: "hosted constant: a tensor made from given values",
    PARAM_VALUE: "hosted: the value of a parameter",
    PARAM_GRAD: "hosted: the gradient of a parameter",
    RECURRENT_NODE: "materialized: the routine reads it before writing it, its values are inputs",
    READ_ONLY: "materialized: the routine only reads it",
    HOSTED_FOR_HOST_ACCESS: "hosted: its value is read from the host",
    HOSTED_VALUE: "hosted: tensor.hosted() (train.forward and grad_update call it for the result)",
    HOSTED_GRAD: "hosted: tensor.hosted() on a tensor with a gradient",
    MATERIALIZE_CALL: "materialized: tensor.materialize()",
    VIRTUAL_CALL: "virtual: tensor.virtual()",
    ON_DEVICE_CALL: "on device: tensor.on_device()",
    HOSTED_BY_WRITE: "hosted: its values were written from the host (set_values) before it was compiled",
    INPUT: "hosted volatile: an input (ej.input / ej.scalar), written from the host between runs",
    STATE: "hosted: a state tensor (random-number counter, running statistics) that routines update in place",
    SCHEDULED_LOCAL: "local: a packed panel or edge buffer the loop scheduler made for one routine",
    REGISTER_BLOCK: "local: a block of accumulators the loop scheduler made for one routine, its last axis one "
                    "vector (the C backend declares it as an array of vectors)",
    ROUTINE_LOCAL: "local: one routine writes it before reading it and no other routine compiled so far uses it, so "
                   "its values live only during a call (VirtualizeSettings.local_storage)",
    MIXED_PRECISION_COPY: "materialized: the bf16 copy of a parameter that a mixed-precision step rounds at its "
                          "start and only that step reads (ir/sched/bf16_fold.py may fold it into its readers)",
    MIXED_PRECISION_OPERAND: "never virtual: the bf16 copy of a float32 operand (an input, an accumulated "
                             "activation, a gradient) that a mixed-precision step's contractions read, and only "
                             "that step (ir/sched/bf16_fold.py may fold it into its readers)",
}
"""Every provenance code: the one table error messages and the optimizer's log read."""


TENSOR_CALLS: dict[int, str] = {HOSTED_VALUE: "hosted()", HOSTED_GRAD: "hosted() (its gradient)",
                                 MATERIALIZE_CALL: "materialize()", VIRTUAL_CALL: "virtual()",
                                 ON_DEVICE_CALL: "on_device()"}
"""The tensor-level memory-mode calls (seed 001: modes set explicitly by the user), by provenance."""


def describe(code: int) -> str:
    """`provenance N: what decided it`, for error messages."""
    return f"provenance {code}: {PROVENANCES.get(code, 'an unnamed decision')}"
