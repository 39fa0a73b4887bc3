"""Per-argument precision (seed 000: `scalar_arg = scalar_t * prec`): each argument of an
operation keeps its own precision, so an expression is combined in the widest floating
precision among what it reads and the precision asked of it, and rounded once, where it is
stored. Double inputs to a single-precision result are therefore not rounded before they are
combined; single inputs to a double result are widened exactly, as before.
"""

from __future__ import annotations

from einjit.ir import low_level as ll
from einjit.ir import ops


def read_precisions(sc: ll.LLScalar) -> list[ops.Prec]:
    """The precisions of the cells an expression reads (a local scope counts as one cell)."""
    out: list[ops.Prec] = []
    stack = [sc]
    while stack:
        match stack.pop():
            case ll.Get(tn, _) | ll.GetMergeBuffer(tn, _):
                out.append(tn.prec)
            case ll.GetLocal(sid) | ll.LocalScope(sid, _, _):
                out.append(sid.tn.prec)
            case ll.Unop(_, a):
                stack.append(a)
            case ll.Binop(_, a, b):
                stack += [a, b]
            case ll.Ternop(_, a, b, c):
                stack += [a, b, c]
    return out


def combine_prec(asked: ops.Prec, sc: ll.LLScalar) -> ops.Prec:
    """The precision to compute the operation `sc` in when its result is wanted in `asked`."""
    if not asked.is_float or not isinstance(sc, (ll.Unop, ll.Binop, ll.Ternop)):
        return asked
    wider = [p for p in read_precisions(sc) if p.is_float and p.itemsize > asked.itemsize]
    return max(wider, key=lambda p: p.itemsize) if wider else asked
