"""The Python forms of `%cd` (assignments) and `%op` (tensor construction).

`cd("c =:+ a * b ~logic:'@'", c=c, a=a, b=b)` builds assignments from the seed's own syntax
(see `cd_syntax` for the grammar). Operation definitions use the same text as *templates*:
`Template("g1 =+ g * t2")` is parsed once and instantiated per tensor with the slot fillers
`t t1 t2 t3` (values), `g g1 g2 g3` (gradients), `v v1 v2 v3` (values again) and the
operation's projections, which are re-targeted per assignment by slot (lhs, rhs1, ...), as
the seed's "advanced note" describes.

A sub-expression that is not the outermost operation of a right-hand side becomes a new
non-differentiable tensor (its forward code is placed before the assignment). Inside an
operation definition such a tensor takes the projection slot of its arguments: the slot they
all share, or the result's slot `t` when they mix slots (a pointwise combination of
arguments broadcasts to the result's shape).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Union, cast

from einjit import shape as sh
from einjit.errors import EinjitError
from einjit.ir import assignments as asg
from einjit.ir import expr as ex
from einjit.ir import ops
from einjit.ir.indexing import FixedIdx, Projections
from einjit.ir.tnode import Tnode
from einjit.tensor import cd_syntax as syn
from einjit.tensor.tensor import (
    GradSpec,
    NodeView,
    Tensor,
    consume_forward_code,
    default_prec,
    is_forward_root,
    make_node,
    needs_grad,
    new_label,
    register,
)

SLOT_NAMES = ("t", "t1", "t2", "t3")
NUMBER_SLOT = "number"


class CdError(EinjitError, ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Operand:
    """A tensor node in an assignment, with the shape that governs its axes and its slot."""

    tn: Tnode
    shape: sh.Shape
    slot: str | None
    merge: bool = False

    def buffer(self) -> asg.Buffer:
        return asg.MergeBuffer(self.tn) if self.merge else asg.Node(self.tn)


@dataclass
class Code:
    """The result of `cd`: assignments plus the tensors declared inline (by name)."""

    asgns: asg.Asgns
    decls: dict[str, Tensor] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self.decls[name]
        except KeyError:
            raise AttributeError(f"no tensor {name!r} was declared in this code") from None

    def __getitem__(self, name: str) -> Tensor:
        return self.decls[name]

    def __str__(self) -> str:
        return asg.to_doc(self.asgns)


def as_asgns(code: "Code | asg.Asgns") -> asg.Asgns:
    return code.asgns if isinstance(code, Code) else code


# ------------------------------------------------------------------ shape logic

#: A `~logic` string, a function building the shape logic from the argument shapes, or None for pointwise.
LogicSpec = Union[str, Callable[[list[sh.Shape]], sh.Logic], None]


def logic_of(kind: str | None, arity: int, shapes: list[sh.Shape], where: str) -> sh.Logic:
    """Shape logic for a `~logic` string (or the pointwise default when `kind` is None)."""
    if arity == 1:
        match kind:
            case None | ".":
                return sh.Transpose(sh.PointwiseUn(), shapes[0])
            case "T":
                return sh.Transpose(sh.TransposeIO(), shapes[0])
            case "@":
                raise CdError(f"{where}: ~logic:\"@\" needs two arguments")
            case spec:
                return sh.Transpose(sh.Permute(spec), shapes[0])
    match kind:
        case None | ".":
            return sh.Broadcast(sh.PointwiseBin(), shapes[0], shapes[1])
        case "@":
            return sh.Broadcast(sh.Compose(), shapes[0], shapes[1])
        case "T":
            raise CdError(f"{where}: ~logic:\"T\" takes one argument")
        case spec:
            return sh.Broadcast(sh.Einsum(spec), shapes[0], shapes[1])


def infer_projections(lhs: sh.Shape, kind: LogicSpec, shapes: list[sh.Shape], where: str) -> asg.Lazy:
    """Add the shape constraints of one operation and return its (lazy) projections.

    Operations of three or more arguments (ternary ones, fused expressions) are pointwise
    only: one binary step per further argument, all sharing the lhs and the first argument,
    and each further argument's projection re-expressed in the first step's iterators.
    """
    if len(shapes) >= 3:
        if kind not in (None, "."):
            raise CdError(f"{where}: an operation of {len(shapes)} arguments supports only pointwise logic")
        steps = [sh.UpdateStep(lhs, sh.Broadcast(sh.PointwiseBin(), shapes[0], s)) for s in shapes[1:]]
        for step in steps:
            sh.propagate_shapes(step)
        label = "ternary" if len(shapes) == 3 else f"pointwise {len(shapes)}"
        return asg.Lazy(lambda: merge_pointwise([sh.derive_projections(s) for s in steps]),
                        key=lambda: _all_known(label, *[sh.projections_key(s) for s in steps]))
    logic = kind(shapes) if callable(kind) else logic_of(kind, len(shapes), shapes, where)
    step = sh.UpdateStep(lhs, logic)
    sh.propagate_shapes(step)
    return asg.Lazy(lambda: sh.derive_projections(step), key=lambda: sh.projections_key(step))


def _all_known(*parts: object) -> tuple | None:
    """A key made of `parts`, or None if one of them is unknown."""
    return None if any(p is None for p in parts) else parts


def merge_pointwise(steps: list[Projections]) -> Projections:
    """One projections for the arguments of several binary pointwise steps over the same lhs
    and first argument: each step's second argument indexed by the first step's iterators."""
    from einjit.ir.indexing import Iterator, subst_index
    first = steps[0]
    dims, idcs = list(first.rhs_dims), list(first.project_rhs)
    for p in steps[1:]:
        env = {a.symbol: b for a, b in zip(p.project_lhs, first.project_lhs, strict=True) if isinstance(a, Iterator)}
        dims.append(p.rhs_dims[1])
        idcs.append(tuple(subst_index(env, i) for i in p.project_rhs[1]))
    return Projections(first.product_space, first.product_iterators, first.lhs_dims, tuple(dims), first.project_lhs,
                       tuple(idcs), first.debug_info)


def retarget(proj: asg.Lazy, lhs_slot: str, rhs_slots: list[str], where: str) -> asg.Lazy:
    """The operation's projections seen from an assignment whose positions hold other slots."""

    def pick(p: Projections, slot: str):
        if slot == "t":
            return p.lhs_dims, p.project_lhs
        if slot == NUMBER_SLOT:
            return (1,), (FixedIdx(0),)
        k = int(slot[1]) - 1
        if k >= len(p.project_rhs):
            raise CdError(f"{where}: slot {slot} is not an argument of this operation")
        return p.rhs_dims[k], p.project_rhs[k]

    def build() -> Projections:
        p = proj.force()
        ld, lp = pick(p, lhs_slot)
        picked = [pick(p, s) for s in rhs_slots]
        return Projections(p.product_space, p.product_iterators, ld, tuple(d for d, _ in picked), lp,
                           tuple(i for _, i in picked), f"{p.debug_info} [{lhs_slot} <- {', '.join(rhs_slots)}]")

    return asg.Lazy(build, key=lambda: _all_known("retarget", proj.key(), lhs_slot, tuple(rhs_slots)))


# ------------------------------------------------------------------ instantiation


class _Scope:
    def __init__(self, text: str, slots: Mapping[str, Operand | None], env: Mapping[str, object],
                 projections: asg.Lazy | None, decls: dict[str, Tensor]):
        self.text = text
        self.slots = slots
        self.env = env
        self.projections = projections
        self.decls = decls
        self.pre: list[asg.Asgns] = []

    def error(self, col: int, msg: str) -> CdError:
        return CdError(f'cd "{self.text}": column {col}: {msg}')

    def resolve(self, ref: syn.Ref) -> Operand | None:
        name, fld = ref.name, ref.field
        if name in self.slots or (name in ("g", "g1", "g2", "g3", "v", "v1", "v2", "v3") and self.slots):
            key = name
            if name.startswith("v"):
                key = "t" + name[1:]
            if fld in ("grad", "grad.merge"):
                if not name.startswith("t"):
                    raise self.error(ref.col, f"{name}.grad: only value slots (t, t1, ...) have gradients")
                key = "g" + name[1:]
            op = self.slots.get(key)
            if op is not None and fld in ("merge", "grad.merge"):
                op = Operand(op.tn, op.shape, op.slot, merge=True)
            return op
        if name in self.decls:
            return self.tensor_operand(self.decls[name], fld, ref)
        if name not in self.env:
            raise self.error(ref.col, f"unknown name {name!r}: pass it as a keyword argument of cd")
        val = self.env[name]
        if isinstance(val, Tensor):
            return self.tensor_operand(val, fld, ref)
        if isinstance(val, NodeView):
            if fld in ("grad", "grad.merge"):
                raise self.error(ref.col, f"{name} is already a node; .grad applies to tensors")
            return Operand(val.tn, val.shape, None, merge=(fld == "merge"))
        if isinstance(val, (int, float)) and fld is None:
            return self.number(float(val), None)
        raise self.error(ref.col, f"{name!r} is a {type(val).__name__}, not a tensor")

    def tensor_operand(self, t: Tensor, fld: str | None, ref: syn.Ref) -> Operand | None:
        if is_forward_root(t):
            self.pre.append(consume_forward_code(t))
        if fld in ("grad", "grad.merge"):
            if t.grad_tn is None:
                raise self.error(ref.col, f"tensor {t.label_str} ({ref.name}) is not differentiable: it has no .grad")
            return Operand(t.grad_tn, t.shape, None, merge=(fld == "grad.merge"))
        return Operand(t.value_tn, t.shape, None, merge=(fld == "merge"))

    def number(self, value: float, label: str | None) -> Operand:
        from einjit.tensor.operation import number
        t = number(value, label=label, grad_spec=GradSpec.PROHIBIT_GRAD)
        self.pre.append(consume_forward_code(t))
        return Operand(t.value_tn, t.shape, NUMBER_SLOT)

    def literal(self, lit: syn.Literal) -> Operand:
        """An N-d array literal: a constant tensor, as `%op`'s (shared syntax, seed 004)."""
        from einjit.tensor.operation import ndarray
        t = ndarray(_literal_values(lit), label="literal")
        self.pre.append(consume_forward_code(t))
        return Operand(t.value_tn, t.shape, NUMBER_SLOT if self.projections is not None else None)

    def operand(self, e: syn.Expr) -> Operand | None:
        match e:
            case syn.Ref():
                return self.resolve(e)
            case syn.Num(value, label, _):
                return self.number(value, label)
            case syn.Literal():
                return self.literal(e)
            case syn.Apply(op, args, col):
                operands = [self.operand(a) for a in args]
                present = [o for o in operands if o is not None]
                if len(present) != len(operands):
                    raise self.error(col, "a sub-expression uses a gradient that does not exist")
                return self.nested(op, present, col)
        raise TypeError(e)

    def nested(self, op, args: list[Operand], col: int) -> Operand:
        slots = {a.slot for a in args if a.slot not in (None, NUMBER_SLOT)}
        if self.projections is not None:
            slot = slots.pop() if len(slots) == 1 else ("t" if slots else NUMBER_SLOT)
        else:
            slot = None
        t = pointwise_tensor(op, args, where=f'cd "{self.text}": column {col}')
        self.pre.append(consume_forward_code(t))
        return Operand(t.value_tn, t.shape, slot)

    def stmt(self, st: syn.Stmt) -> asg.Asgns:
        where = f'cd "{self.text}": column {st.col}'
        lhs: Operand | None
        if isinstance(st.lhs, syn.Decl):
            lhs = self.declare(st.lhs)
        else:
            lhs = self.resolve(st.lhs)
            if lhs is None:
                return asg.Noop()
        if lhs.merge:
            raise self.error(st.lhs.col, "cannot assign to a merge buffer")
        if isinstance(st.rhs, syn.Num) and st.accum is ops.Binop.ARG2 and st.logic is None:
            if isinstance(st.lhs, syn.Decl):
                self.shape_from_number(lhs.shape, st.rhs, where)
            return asg.Fetch(lhs.tn, asg.FetchConstant(st.rhs.value))
        if isinstance(st.rhs, syn.Apply) and not st.rhs.intermediate:
            op, maybe_args = st.rhs.op, [self.operand(a) for a in st.rhs.args]
        else:
            op, maybe_args = ops.Unop.IDENTITY, [self.operand(st.rhs)]
        args = [a for a in maybe_args if a is not None]
        if len(args) != len(maybe_args):
            return asg.Noop()
        if isinstance(st.lhs, syn.Decl):
            self.label_from_rhs(self.decls[st.lhs.name], st.rhs)
        proj = self.projections_for(st, lhs, args, where)
        bufs = [a.buffer() for a in args]
        match op:
            case ops.Unop():
                return asg.AccumUnop(st.initialize_neutral, st.accum, op, lhs.tn, bufs[0], proj)
            case ops.Binop():
                return asg.AccumBinop(st.initialize_neutral, st.accum, op, lhs.tn, bufs[0], bufs[1], proj)
            case ops.Ternop():
                return asg.AccumTernop(st.initialize_neutral, st.accum, op, lhs.tn, bufs[0], bufs[1], bufs[2], proj)
        raise TypeError(op)

    def fused_stmt(self, st: syn.Stmt) -> asg.AccumExpr | None:
        """One assignment of a `~fused(...)` group: its right-hand side kept whole
        (`expr.Expr`), each distinct tensor it names one argument; None (as `stmt`'s `Noop`)
        when it uses a gradient that does not exist."""
        where = f'cd "{self.text}": column {st.col}'
        if st.projections is not None or st.logic not in (None, "."):
            raise self.error(st.col, "a ~fused assignment is pointwise: it takes no ~logic or ~projections")
        lhs = self.declare(st.lhs) if isinstance(st.lhs, syn.Decl) else self.resolve(st.lhs)
        if lhs is None:
            return None
        if lhs.merge:
            raise self.error(st.lhs.col, "cannot assign to a merge buffer")
        args: dict[tuple[int, bool], int] = {}
        operands: list[Operand] = []

        def leaf(o: Operand) -> ex.Expr:
            k = args.setdefault((o.tn.id, o.merge), len(operands))
            if k == len(operands):
                operands.append(o)
            return ex.Arg(k)

        def tree(e: syn.Expr) -> ex.Expr | None:
            match e:
                case syn.Num(value, _, _):
                    return ex.Const(value)
                case syn.Ref(name, None, _) if (name not in self.decls and name not in self.slots
                                                 and isinstance(self.env.get(name), (int, float))):
                    return ex.Const(float(cast(float, self.env[name])))
                case syn.Apply(op, sub, _, False):
                    parts = [tree(a) for a in sub]
                    if any(p is None for p in parts):
                        return None
                    match op, parts:
                        case ops.Unop(), [a]:
                            return ex.Un(op, cast(ex.Expr, a))
                        case ops.Binop(), [a, b]:
                            return ex.Bin(op, cast(ex.Expr, a), cast(ex.Expr, b))
                        case ops.Ternop(), [a, b, c]:
                            return ex.Tern(op, cast(ex.Expr, a), cast(ex.Expr, b), cast(ex.Expr, c))
                    raise TypeError(op)
            o = self.operand(e)
            return None if o is None else leaf(o)

        rhs = tree(st.rhs)
        if rhs is None:
            return None
        if not operands:
            raise self.error(st.col, "a ~fused assignment needs a tensor on its right-hand side")
        if isinstance(st.lhs, syn.Decl):
            self.label_from_rhs(self.decls[st.lhs.name], st.rhs)
        # `lhs >= lhs` constrains nothing: the lhs read where it is written (an optimizer's
        # moment or parameter, a quarter of the group's arguments) costs no shape inference
        own = [o.shape is lhs.shape for o in operands]
        shaped = [o.shape for o, mine in zip(operands, own, strict=True) if not mine] or [lhs.shape]
        try:
            proj = infer_projections(lhs.shape, None, shaped, where)
        except sh.ShapeError as e:
            raise sh.ShapeError(f"{where}: {e}") from None
        if len(shaped) < len(operands):
            proj = _with_lhs_reads(proj, own)
        return asg.AccumExpr(st.initialize_neutral, st.accum, lhs.tn, rhs, tuple(o.buffer() for o in operands), proj)

    def projections_for(self, st: syn.Stmt, lhs: Operand, args: list[Operand], where: str) -> asg.Lazy:
        if st.projections is not None:
            proj = self.env.get(st.projections)
            if not isinstance(proj, (asg.Lazy, Projections)):
                raise CdError(f"{where}: ~projections:{st.projections} must name Projections passed to cd")
            return proj if isinstance(proj, asg.Lazy) else asg.Lazy.of(proj)
        if st.logic is None and self.projections is not None:
            missing = [a for a in [lhs] + args if a.slot is None]
            if missing:
                raise CdError(f"{where}: {missing[0].tn.debug_name()} has no slot in the operation's "
                              f"projections; give ~logic")
            lhs_slot, *rhs_slots = [a.slot for a in [lhs] + args if a.slot is not None]  # none is missing
            return retarget(self.projections, lhs_slot, rhs_slots, where)
        try:
            return infer_projections(lhs.shape, st.logic, [a.shape for a in args], where)
        except sh.ShapeError as e:
            raise sh.ShapeError(f"{where}: {e}") from None

    def shape_from_number(self, shape: sh.Shape, num: syn.Num, where: str) -> None:
        """`"z" =: 2.0`: the declared tensor meets the number pointwise, so it takes the number's
        shape (one output axis of dimension 1, labelled as the number is) unless another
        assignment gives it more."""
        axes = [(num.label, 1)] if num.label else None
        number_shape = sh.Shape.make(batch_dims=[], input_dims=[], output_dims=None if axes else [1],
                                     output_axes=axes, debug_name=repr(num.value))
        try:
            sh.propagate_shapes(sh.UpdateStep(shape, sh.Transpose(sh.PointwiseUn(), number_shape)))
        except sh.ShapeError as e:
            raise sh.ShapeError(f"{where}: {e}") from None

    def declare(self, decl: syn.Decl) -> Operand:
        if decl.name in self.decls or decl.name in self.env:
            raise self.error(decl.col, f"{decl.name!r} is already defined")
        shape = sh.Shape.make(debug_name=decl.name)
        sh.track(shape)
        t = Tensor(label=[decl.name], op_label="decl", shape=shape, update_step=None, children=(),
                   value_tn=make_node([decl.name], shape, default_prec()), grad_tn=None, projections=None)
        t._fwd_done = True
        self.decls[decl.name] = t
        return Operand(t.value_tn, shape, None)

    def label_from_rhs(self, t: Tensor, rhs: syn.Expr) -> None:
        """Seed 004: a declared tensor's label starts with its name; the first tensor named on
        the right-hand side gives it further label information (`"s" =:+ x` is labelled `s.x`)."""
        for ref in _refs(rhs):
            source = self.decls.get(ref.name) if ref.name in self.decls else self.env.get(ref.name)
            if isinstance(source, NodeView):
                source = source.tensor
            if isinstance(source, Tensor) and source is not t:
                t.relabel(t.label[:1] + list(source.label))
                return

    def items(self, items: tuple[syn.Item, ...]) -> asg.Asgns:
        out: list[asg.Asgns] = []
        for it in items:
            match it:
                case syn.Block(comment, body):
                    out.append(asg.BlockComment(comment, self.items(body)))
                case syn.FusedGroup(body):
                    members = [m for m in (self.fused_stmt(st) for st in body) if m is not None]
                    out.extend(self.pre)
                    self.pre = []
                    if members:
                        out.append(asg.Fused(tuple(members)))
                case syn.Stmt():
                    a = self.stmt(it)
                    out.extend(self.pre)
                    self.pre = []
                    out.append(a)
        return asg.sequence(*out)


def _refs(e: syn.Expr) -> list[syn.Ref]:
    """The tensor references of an expression, left to right."""
    match e:
        case syn.Ref():
            return [e]
        case syn.Apply(_, args, _, _):
            return [r for a in args for r in _refs(a)]
    return []


def _literal_values(lit: syn.Literal):
    """The nested Python sequences `ndarray` reads: a list level is an output axis, a tuple
    level an input axis, a `Batch` level a batch axis."""
    from einjit.tensor.operation import Batch
    items = [_literal_values(i) if isinstance(i, syn.Literal) else i for i in lit.items]
    match lit.kind:
        case "input":
            return tuple(items)
        case "batch":
            return Batch(items)
    return items


class Template:
    """`%cd` text parsed once, instantiated for each tensor of an operation."""

    def __init__(self, text: str):
        self.text = text
        self.items = syn.parse(text)

    def instantiate(self, slots: Mapping[str, Operand | None], projections: asg.Lazy | None,
                    env: Mapping[str, object] | None = None) -> asg.Asgns:
        return _Scope(self.text, slots, env or {}, projections, {}).items(self.items)


def cd(text: str, **env: object) -> Code:
    """Assignments in the seed's `%cd` syntax; keyword arguments bind the names used."""
    items = syn.parse(text)
    decls: dict[str, Tensor] = {}
    scope = _Scope(text, {}, env, None, decls)
    return Code(scope.items(items), decls)


# ------------------------------------------------------------------ building tensors


def slots_for(t: Tensor, children: list[Operand]) -> dict[str, Operand | None]:
    slots: dict[str, Operand | None] = {"t": Operand(t.value_tn, t.shape, "t"),
                                        "g": None if t.grad_tn is None else Operand(t.grad_tn, t.shape, "t")}
    for k, c in enumerate(children, start=1):
        slots[f"t{k}"] = Operand(c.tn, c.shape, f"t{k}", c.merge)
    return slots


def _with_numbers(proj: asg.Lazy, is_number: list[bool]) -> asg.Lazy:
    """Projections inferred from the shaped arguments only, with each number read at its one
    cell: a number must not lend its output axis to a result whose arguments have none."""

    def build() -> Projections:
        p = proj.force()
        shaped = iter(zip(p.rhs_dims, p.project_rhs, strict=True))
        picked = [((1,), (FixedIdx(0),)) if num else next(shaped) for num in is_number]
        return Projections(p.product_space, p.product_iterators, p.lhs_dims, tuple(d for d, _ in picked),
                           p.project_lhs, tuple(i for _, i in picked), p.debug_info)

    return asg.Lazy(build, key=lambda: _all_known("with numbers", proj.key(), tuple(is_number)))


def _with_lhs_reads(proj: asg.Lazy, is_lhs: list[bool]) -> asg.Lazy:
    """Projections inferred from the arguments other than the lhs, with the lhs read where it
    is written."""

    def build() -> Projections:
        p = proj.force()
        others = iter(zip(p.rhs_dims, p.project_rhs, strict=True))
        picked = [(p.lhs_dims, p.project_lhs) if mine else next(others) for mine in is_lhs]
        return Projections(p.product_space, p.product_iterators, p.lhs_dims, tuple(d for d, _ in picked),
                           p.project_lhs, tuple(i for _, i in picked), p.debug_info)

    return asg.Lazy(build, key=lambda: _all_known("with lhs reads", proj.key(), tuple(is_lhs)))


def pointwise_tensor(op, args: list[Operand], *, where: str) -> Tensor:
    """A non-differentiable tensor `t =: op(args)` with pointwise broadcasting; numbers take
    no part in the shape."""
    name = op.symbol
    shape = sh.Shape.make(debug_name=name)
    is_number = [a.slot == NUMBER_SLOT for a in args]
    shaped = [a.shape for a, num in zip(args, is_number, strict=True) if not num] or [a.shape for a in args]
    try:
        proj = infer_projections(shape, None, shaped, where)
    except sh.ShapeError as e:
        raise sh.ShapeError(f"{where}: {e}") from None
    if len(shaped) < len(args):
        proj = _with_numbers(proj, is_number)
    t = Tensor(label=[name], op_label=name, shape=shape, update_step=None, children=(),
               value_tn=make_node([name], shape, default_prec()), grad_tn=None, projections=proj)
    bufs = [a.buffer() for a in args]
    match op:
        case ops.Unop():
            t.own_forward = asg.AccumUnop(False, ops.Binop.ARG2, op, t.value_tn, bufs[0], proj)
        case ops.Binop():
            t.own_forward = asg.AccumBinop(False, ops.Binop.ARG2, op, t.value_tn, bufs[0], bufs[1], proj)
        case ops.Ternop():
            t.own_forward = asg.AccumTernop(False, ops.Binop.ARG2, op, t.value_tn, bufs[0], bufs[1], bufs[2], proj)
    register(t)
    return t


def make_op(op_label: str, children: list[Tensor], *, logic: LogicSpec, forward: Template,
            backprop: Template | None, grad_spec: GradSpec = GradSpec.IF_NEEDED, label=None,
            batch_dims=None, input_dims=None, output_dims=None, prec: ops.Prec | None = None) -> Tensor:
    """The `%op` building block: shape logic, nodes, forward and backprop code of one tensor.

    `logic` is a `~logic` string: None/"." pointwise, "@" compose, "T" transpose, or an
    einsum spec (binary `a;b=>c` for two children, unary `a=>c` for one).
    """
    lbl = new_label(label, op_label)
    shape = sh.Shape.make(batch_dims=batch_dims, input_dims=input_dims, output_dims=output_dims,
                          debug_name=".".join(lbl))
    where = f"operation {op_label!r} ({'.'.join(lbl)})"
    proj = infer_projections(shape, logic, [c.shape for c in children], where)
    p = prec or default_prec()
    diff = needs_grad(grad_spec, children)
    t = Tensor(label=lbl, op_label=op_label, shape=shape, update_step=None, children=tuple(children),
               value_tn=make_node(lbl, shape, p), grad_tn=make_node(lbl + ["grad"], shape, p) if diff else None,
               projections=proj)
    slots = slots_for(t, [Operand(c.value_tn, c.shape, None) for c in children])
    for k, c in enumerate(children, start=1):
        slots[f"g{k}"] = None if c.grad_tn is None else Operand(c.grad_tn, c.shape, f"t{k}")
    t.own_forward = forward.instantiate(slots, proj)
    if diff and backprop is not None:
        t.own_backprop = backprop.instantiate(slots, proj)
    register(t)
    return t
