"""Shape and projection inference with the generalized einsum notation.

Shapes have batch, input and output rows of axes (`batch|input->output`, laid out in memory as
batch, output, input). Operations relate shapes through their logic (`Broadcast`, `Transpose`,
`Terminal`); `propagate_shapes` solves the constraints incrementally and order-independently,
`finish_inference` closes what is left, and `derive_projections` tells the compiler how each
operation's loops index its arrays.
"""

from einjit.shape.einsum import EinsumSpec, parse_einsum, parse_shape_spec
from einjit.shape.errors import ShapeError
from einjit.shape.inference import finish_inference, propagate_shapes, reset_state, to_dims, track
from einjit.shape.projections import derive_projections, projections_key
from einjit.shape.row import (
    Bounds,
    Broadcastable,
    Dim,
    DimEq,
    DimIneq,
    Env,
    Kind,
    Row,
    RowEq,
    RowId,
    RowIneq,
    RowVar,
    Solved,
    TotalElems,
    Unconstrained,
    Var,
)
from einjit.shape.shape import (
    BatchSlice,
    Broadcast,
    Compose,
    ComposeType,
    Constant,
    ConstantFill,
    Deduced,
    Einsum,
    FileMapped,
    Init,
    InputEqualsOutput,
    Logic,
    NotConstrained,
    Permute,
    PointwiseBin,
    PointwiseUn,
    RangeOverOffsets,
    Shape,
    Terminal,
    Transpose,
    TransposeIO,
    TransposeType,
    UpdateStep,
    logic_args,
    logic_to_spec,
)

__all__ = [
    "BatchSlice", "Bounds", "Broadcast", "Broadcastable", "Compose", "ComposeType", "Constant", "ConstantFill",
    "Deduced", "Dim", "DimEq", "DimIneq", "Einsum", "EinsumSpec", "Env", "FileMapped", "Init",
    "InputEqualsOutput", "Kind", "Logic", "NotConstrained", "Permute", "PointwiseBin", "PointwiseUn",
    "RangeOverOffsets", "Row", "RowEq", "RowId", "RowIneq", "RowVar", "ShapeError", "Shape", "Solved",
    "Terminal", "TotalElems", "Transpose", "TransposeIO", "TransposeType", "Unconstrained", "UpdateStep",
    "Var", "derive_projections", "finish_inference", "logic_args", "logic_to_spec", "parse_einsum", "projections_key",
    "parse_shape_spec", "propagate_shapes", "reset_state", "to_dims", "track",
]
