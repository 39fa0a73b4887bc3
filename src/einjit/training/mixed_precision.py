"""Mixed-precision training steps (`grad_update(loss, mixed_precision="bf16")`, also through
`fit.train_step`): the forward and backward passes read bf16 copies of the parameters and
store activations in bf16, while the parameters themselves (the master weights), their
gradients and the optimizer's state stay float32, and updates compute in float32.

What becomes bf16, and why:
- every float32 parameter gets a bf16 copy, rounded once per step before the forward pass
  and kept in memory (not inlined into its readers, which would round it at every read of
  a contraction's kernel; where its readers only pack or widen it, they round the parameter
  themselves instead, `ir/sched/bf16_fold.py`). Kept in the context rather than local to the
  routine: gcc 12 did not vectorize a pointwise nest reading a bias copy from a local
  (stack) array, and the MLP's bias-and-ReLU nests ran 40x slower;
  the forward and backprop code read the copy instead of the parameter (`_with_reads`), so a
  layer's contraction multiplies bf16 by bf16 into float32 accumulators (AMX tiles on CPUs
  with AMX, `ir/sched/amx_tiles.py`; `vdpbf16ps` on CPUs with AVX512_BF16 alone,
  `ir/sched/bf16_pairs.py`);
- an activation that a contraction with a parameter reads (the input of a linear layer, a
  convolution, the language-model head) is stored as bf16, when plain assignments (`=:`)
  compute it: the contraction then has two bf16 operands and accumulates in float32. Not a
  max pooling's result: its backprop routes the gradient to the inputs *equal* to it, which a
  rounded maximum no longer is (the convnet's loss drifted by 8% in 30 steps);
- a float32 operand that a contraction multiplies with a bf16 one (the gradient `y.grad` in
  `x.grad =+ y.grad * w` and `w.grad =+ x * y.grad`; a host input `x` of the first layer; an
  activation a contraction accumulates, as attention's output read by its projection) is
  rounded to a bf16 copy once it is complete, and the contractions read the copy: they then
  multiply bf16 by bf16 into float32 accumulators, as under PyTorch's autocast (which casts
  every matmul's inputs), at the bf16 dot product's rate (`vdpbf16ps` runs at twice the float
  FMA's), where a float32 operand kept them on the float kernel: two thirds of a transformer
  step's multiply-adds are backprop's. The copies spread: once `x` has one, `x`'s weight
  gradient rounds `y.grad` too. The node itself, what its other readers see and what
  contractions accumulate into, stays float32 (the final losses moved 0.02-0.6% from float32's
  instead of 0.005-0.14%, over the MLP test's five seeds and the three models);
- everything else stays float32, as PyTorch's autocast keeps it: what accumulates (a sum
  stored in bf16 would round at every term), the softmax, normalization and loss arithmetic
  between contractions (with those stored in bf16 too, the convnet's final loss moved 1-2.5%
  from float32's, 0.1-0.9% without), gradients, inputs, the loss and other tensors with host
  values.

An activation the optimizer inlines into its consumer (virtual) is rounded there, as if stored.

The user's graph is left as it is: the step's code writes and reads a bf16 twin of each such
activation (a node of the same label and shape) and bf16 copies of the parameters, so a
prediction step or a float32 training step compiled over the same tensors afterwards computes
in float32 as before.
"""

from __future__ import annotations

import dataclasses
from typing import cast

from einjit import shape as sh
from einjit.ir import assignments as asg
from einjit.ir import ops
from einjit.ir.indexing import Iterator, Projections, get_symbol
from einjit.ir.provenance import MIXED_PRECISION_COPY, MIXED_PRECISION_OPERAND
from einjit.ir.tnode import MATERIALIZED, NEVER_VIRTUAL, Tnode
from einjit.shape.einsum import ConvAxis, parse_einsum
from einjit.tensor.operation import copy_value
from einjit.tensor.tensor import Tensor, TensorError, consume_forward_code

__all__ = ["MODES", "bf16_activations", "bf16_operands", "check_mode", "parameter_copies"]

MODES = ("bf16",)


def check_mode(mode: str | None) -> ops.Prec | None:
    """The storage precision `mode` names, None for full precision; an error for anything else."""
    if mode is None:
        return None
    if mode not in MODES:
        raise TensorError(f"einjit: mixed_precision must be None or one of {', '.join(map(repr, MODES))}, "
                          f"got {mode!r}")
    return ops.bf16


def parameter_copies(loss: Tensor, code: asg.Asgns) -> asg.Asgns:
    """`code` (the forward and backprop code of `loss`) reading a bf16 copy of every float32
    parameter, preceded by the code computing the copies."""
    copies: dict[int, Tensor] = {}
    for p in loss.params():
        if p.value_tn.prec is ops.single:
            copy = copy_value(p, label=[*p.path, "bf16"], prec=ops.bf16)
            copy.value_tn.update_memory_mode(MATERIALIZED, MIXED_PRECISION_COPY)
            copies[p.value_tn.id] = copy
    if not copies:
        return code
    rounding = asg.sequence(*[consume_forward_code(c) for c in copies.values()])
    reads = {k: c.value_tn for k, c in copies.items()}
    return asg.sequence(asg.BlockComment("bf16 copies of the parameters", rounding),
                        _with_nodes(code, reads, writes=False))


def _with_nodes(code: asg.Asgns, nodes: dict[int, Tnode], *, writes: bool) -> asg.Asgns:
    """`code` with every read of a node in `nodes` (by id) a read of its replacement, and
    with `writes` every write too."""
    def buf(b: asg.Buffer) -> asg.Buffer:
        return asg.Node(nodes[b.tn.id]) if isinstance(b, asg.Node) and b.tn.id in nodes else b

    def lhs(tn: Tnode) -> Tnode:
        return nodes.get(tn.id, tn) if writes else tn

    match code:
        case asg.Seq(first, second):
            return asg.Seq(_with_nodes(first, nodes, writes=writes), _with_nodes(second, nodes, writes=writes))
        case asg.BlockComment(message, body):
            return asg.BlockComment(message, _with_nodes(body, nodes, writes=writes))
        case asg.AccumBinop(lhs=out, rhs1=r1, rhs2=r2):
            return dataclasses.replace(code, lhs=lhs(out), rhs1=buf(r1), rhs2=buf(r2))
        case asg.AccumUnop(lhs=out, rhs=r) | asg.SetVecUnop(lhs=out, rhs=r):
            return dataclasses.replace(code, lhs=lhs(out), rhs=buf(r))
        case asg.AccumTernop(lhs=out, rhs1=r1, rhs2=r2, rhs3=r3):
            return dataclasses.replace(code, lhs=lhs(out), rhs1=buf(r1), rhs2=buf(r2), rhs3=buf(r3))
        case asg.AccumExpr(lhs=out, args=args):
            return dataclasses.replace(code, lhs=lhs(out), args=tuple(buf(b) for b in args))
        case asg.Fused(members):
            return asg.Fused(tuple(cast(asg.AccumExpr, _with_nodes(m, nodes, writes=writes)) for m in members))
        case asg.Fetch(array=out):
            return dataclasses.replace(code, array=lhs(out))
    return code


def bf16_activations(loss: Tensor, code: asg.Asgns) -> asg.Asgns:
    """`code` storing in bf16 the values of the tensors under `loss` that a contraction with a
    parameter reads and that `code` computes by plain assignments alone (see the module
    docstring): each such tensor's node is replaced, where `code` writes and reads it, by a
    bf16 twin of the same label and shape. The tensors' own nodes are left as they are."""
    params = {p.value_tn.id for p in loss.params()}
    writes: dict[int, list[asg.Asgns]] = {}
    operands: set[int] = set()
    for a in asg.flatten_with_comments(code):
        for lhs in asg.lhs_nodes(a):
            writes.setdefault(lhs.id, []).append(a)
        read = [b.tn.id for b in asg.rhs_buffers(a)]
        if not _plain(a) and any(k in params for k in read):
            operands.update(read)
    twins: dict[int, Tnode] = {}
    for t in loss.subtree():
        tn = t.value_tn
        if t is loss or t.is_param or tn.id not in operands or tn.prec is not ops.single or tn.array is not None \
                or tn.is_hosted():
            continue
        found = writes.get(tn.id)
        if found and all(_plain(a) for a in found):
            twins[tn.id] = _twin(tn)
    return _with_nodes(code, twins, writes=True) if twins else code


def bf16_operands(loss: Tensor, code: asg.Asgns) -> asg.Asgns:
    """`code` (after `bf16_activations`) with each contraction that multiplies a float32 node
    of a tensor under `loss` (its value or gradient; not a parameter's, which
    `parameter_copies` replaces) by a bf16 node, a parameter or another such copy reading a
    bf16 copy of the float32 node instead (see the module docstring). The copy is rounded right
    before the first such contraction after the node's last write; a contraction before that
    write keeps the float32 node. Convolutions (forward and backprop) keep their float32
    operands: they run the float kernels of
    `ir/sched/schedule_conv.py`, which would only widen the copies again (the convnet step ran
    3% slower with them)."""
    params = {p.value_tn.id for p in loss.params()}
    floats = {tn.id for t in loss.subtree() if not t.is_param for tn in (t.value_tn, t.grad_tn) if tn is not None}
    flat = asg.flatten_with_comments(code)
    last_write: dict[int, int] = {}
    for pos, a in enumerate(flat):
        for tn in asg.lhs_nodes(a):
            last_write[tn.id] = pos
    convolved = {id(a) for a in flat if _convolution(a)}
    copies: dict[int, Tnode] = {}
    readers: dict[int, list[Tnode]] = {}

    def bf16_at(tn: Tnode, pos: int) -> bool:
        return tn.prec is ops.bf16 or tn.id in params or (tn.id in copies and last_write.get(tn.id, -1) < pos)

    changed = True
    while changed:
        changed = False
        for pos, a in enumerate(flat):
            if id(a) in convolved:
                continue
            for x, other in _operands(a):
                if x.id in floats and x.prec is ops.single and last_write.get(x.id, -1) < pos \
                        and bf16_at(other, pos) and x not in readers.get(id(a), []):
                    readers.setdefault(id(a), []).append(x)
                    copies.setdefault(x.id, _bf16_copy(x))
                    changed = True
    if not copies:
        return code
    return _rounded_reads(code, copies, readers, set())


def _rounded_reads(code: asg.Asgns, copies: dict[int, Tnode], readers: dict[int, list[Tnode]],
                   rounded: set[int]) -> asg.Asgns:
    """`code` with the contractions in `readers` (by object id) reading the `copies` of their
    float32 operands, each copy's rounding placed before its first reader (`rounded`: the
    copies placed so far, in program order)."""
    match code:
        case asg.Seq(first, second):
            head = _rounded_reads(first, copies, readers, rounded)
            return asg.Seq(head, _rounded_reads(second, copies, readers, rounded))
        case asg.BlockComment(message, body):
            return asg.BlockComment(message, _rounded_reads(body, copies, readers, rounded))
    nodes = readers.get(id(code))
    if not nodes:
        return code
    roundings = []
    for x in nodes:
        if x.id not in rounded:
            rounded.add(x.id)
            roundings.append(_rounding(copies[x.id], x))
    reads = _with_nodes(code, {x.id: copies[x.id] for x in nodes}, writes=False)
    return asg.sequence(*roundings, reads)


def _bf16_copy(g: Tnode) -> Tnode:
    """Never virtual: inlined into a contraction, the copy would be no plain bf16 read (no pair
    kernel), and every multiply-add would round the operand again. Where its readers only
    copy it (a float kernel's pack: a convolution, a narrow output), `ir/sched/bf16_fold.py`
    folds the rounding into them."""
    return Tnode([*g.label, "bf16"], lambda: g.dims, ops.bf16, memory_mode=NEVER_VIRTUAL,
                 provenance=MIXED_PRECISION_OPERAND)


def _rounding(copy: Tnode, g: Tnode) -> asg.Asgns:
    """`copy =: g`, cell by cell."""
    def projections() -> Projections:
        its = tuple(get_symbol(f"r{d}") for d in range(len(g.dims)))
        at = tuple(Iterator(s) for s in its)
        return Projections(g.dims, its, g.dims, (g.dims,), at, (at,), "bf16 copy of an operand")

    return asg.AccumUnop(False, ops.Binop.ARG2, ops.Unop.IDENTITY, copy, asg.Node(g),
                         asg.Lazy(projections, key=lambda: ("bf16 copy of an operand", g.dims)))


def _convolution(a: asg.Asgns) -> bool:
    """Whether `a` is a contraction along an affine (convolution) axis: its projections' key
    (known once the shapes are solved, without deriving the projections) holds its einsum. With
    a shape unsolved it counts as none: its operands are copied, which is correct, only slower."""
    match a:
        case asg.AccumBinop(projections=projections):
            return _has_conv_einsum(projections.key())
    return False


def _has_conv_einsum(key: object) -> bool:
    match key:
        case sh.Einsum(spec):
            parsed = parse_einsum(spec)
            return any(isinstance(axis, ConvAxis) for slot in (*parsed.rhs, parsed.lhs)
                       for kind in ("batch", "input", "output") for axis in slot.row(kind).axes)
        case tuple():
            return any(_has_conv_einsum(part) for part in key)
    return False


def _operands(a: asg.Asgns) -> list[tuple[Tnode, Tnode]]:
    """For a contraction `=+ x * y`, `(x, y)` and `(y, x)`; nothing for anything else."""
    match a:
        case asg.AccumBinop(accum=ops.Binop.ADD, op=ops.Binop.MUL, rhs1=asg.Node(x), rhs2=asg.Node(y)):
            return [(x, y), (y, x)]
    return []


def _twin(tn: Tnode) -> Tnode:
    """A bf16 node standing for `tn` in one step's code: its label, its dims (once shape
    inference has fixed them) and its memory mode so far."""
    return Tnode(tn.label, lambda: tn.dims, ops.bf16, memory_mode=tn.memory_mode, provenance=tn.provenance)


def _plain(a: asg.Asgns) -> bool:
    """An assignment `=:`: one value per cell, nothing accumulated."""
    match a:
        case asg.AccumBinop(accum=acc) | asg.AccumUnop(accum=acc) | asg.AccumTernop(accum=acc) \
                | asg.AccumExpr(accum=acc):
            return acc is ops.Binop.ARG2
        case asg.Fused(members):
            return all(m.accum is ops.Binop.ARG2 for m in members)
    return False
