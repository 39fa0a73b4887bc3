"""The textual `%cd` notation: its grammar, parsed once per text and cached.

    code   := item (';' item)* ';'?
    item   := '~~' '(' STRING ';' code ')'                      block comment
            | '~fused' '(' lhs ASGN expr option* (';' ...)* ')'   one loop nest, no intermediates
            | lhs ASGN expr option*                             one assignment
    lhs    := ref | STRING                                      a string declares a new tensor
    ASGN   := '=' [':'] [accum]     accum one of + - * / ** ?/ ^^ vv && ||   ('=:' alone assigns)
    expr   := the usual precedence over  || && (< == <>) (+ -) (* / % -?/ -?^) (**) prefix
    prefix := '-' prefix | '!/' prefix | atom                    negation; `!/` is ReLU (seed 004)
    atom   := ref | NUMBER | LABEL-PREFIXED NUMBER ("'q' 2.0") | NAME '(' expr, ... ')' | '(' expr ')'
            | literal
    literal:= '[' elems ']' | '(' elems ')' | '[|' elems '|]'    output, input, batch axis
    elems  := elem ((',' | ';') elem)*    elem := ['-'] NUMBER | literal    (a tuple needs 2+)
    ref    := NAME ('.' ('grad' | 'value' | 'merge'))?  |  NAME '.grad.merge'
    option := '~logic:' STRING | '~projections:' NAME

`*.`, `/.`, `+.` and `-.` are the seed's non-operator binary form (`p =+ lr *. p.grad`): the
product (sum, ...) becomes an intermediate tensor, and the assignment copies it (`Accum_unop`
with `Identity`). Inside `~fused( ... )` nothing becomes an intermediate tensor except those
non-operator forms: each assignment keeps its whole right-hand side as one expression, and the
group's assignments update each cell in one loop nest (`assignments.Fused`; pointwise only).
N-d array literals share `%op`'s syntax: a list level is an output axis, a
tuple level an input axis, an array level (`[| |]`) a batch axis.

The outermost operator of the right-hand side decides the assignment's kind (binary, unary,
ternary); any deeper sub-expression becomes a new non-differentiable tensor, as in the seed.
Errors are `CdSyntaxError`s that quote the text and point at the 1-based column.

The parser is recursive, so nesting is bounded (`MAX_NESTING`, `MAX_DEPTH`): a deeply nested
text gets a `CdSyntaxError`, never Python's `RecursionError` here or in the later passes that
walk the expression tree.
"""

from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass

from einjit.errors import EinjitError
from einjit.ir import ops


class CdSyntaxError(EinjitError, ValueError):
    pass


MAX_NESTING = 64
"""How deep parentheses, function calls, prefix minus, `**` chains and `~~` blocks may nest."""
MAX_DEPTH = 256
"""How deep an expression's operation tree may be: `a + b + c` is two levels, one per operator."""


ACCUM_SPELLINGS: dict[str, ops.Binop] = {
    "+": ops.Binop.ADD, "-": ops.Binop.SUB, "*": ops.Binop.MUL, "/": ops.Binop.DIV, "**": ops.Binop.TO_POW_OF,
    "?/": ops.Binop.RELU_GATE, "^^": ops.Binop.MAX, "vv": ops.Binop.MIN, "&&": ops.Binop.AND, "||": ops.Binop.OR,
}

_INFIX_LEVELS: list[dict[str, ops.Binop]] = [
    {"||": ops.Binop.OR},
    {"&&": ops.Binop.AND},
    {"<": ops.Binop.CMPLT, "==": ops.Binop.CMPEQ, "<>": ops.Binop.CMPNE},
    {"+": ops.Binop.ADD, "-": ops.Binop.SUB},
    {"*": ops.Binop.MUL, "/": ops.Binop.DIV, "%": ops.Binop.MOD, "-?/": ops.Binop.RELU_GATE,
     "-?^": ops.Binop.SATUR01_GATE},
]
_POW = "**"

#: The non-operator binary forms, by infix level (the level of the operator they spell).
_INTERMEDIATE = {"+.": ops.Binop.ADD, "-.": ops.Binop.SUB, "*.": ops.Binop.MUL, "/.": ops.Binop.DIV}
_LITERAL_CLOSE = {"[": ("]", "output"), "(": (")", "input"), "[|": ("|]", "batch")}

FUNCTIONS: dict[str, ops.Unop | ops.Binop | ops.Ternop] = {
    **{u.symbol: u for u in ops.Unop},
    **{b.symbol: b for b in ops.Binop},
    **{t.symbol: t for t in ops.Ternop},
}
FUNCTION_ARITY = {name: (1 if isinstance(op, ops.Unop) else 2 if isinstance(op, ops.Binop) else 3)
                  for name, op in FUNCTIONS.items()}


@dataclass(frozen=True, slots=True)
class Ref:
    name: str
    field: str | None
    col: int


@dataclass(frozen=True, slots=True)
class Decl:
    name: str
    col: int


@dataclass(frozen=True, slots=True)
class Num:
    value: float
    label: str | None
    col: int


@dataclass(frozen=True, slots=True)
class Apply:
    """An operation applied to arguments: infix, prefix minus, or a function call.
    `intermediate`: the non-operator form (`*.`), always computed into a tensor of its own."""

    op: ops.Unop | ops.Binop | ops.Ternop
    args: tuple["Expr", ...]
    col: int
    intermediate: bool = False


@dataclass(frozen=True, slots=True)
class Literal:
    """An N-d array literal: `kind` ("output", "input" or "batch") is its outermost axis;
    `items` are numbers or literals of the next axis, all of one shape."""

    kind: str
    items: tuple
    col: int


Expr = Ref | Num | Apply | Literal


@dataclass(frozen=True, slots=True)
class Stmt:
    lhs: Ref | Decl
    initialize_neutral: bool
    accum: ops.Binop
    rhs: Expr
    logic: str | None
    projections: str | None
    col: int


@dataclass(frozen=True, slots=True)
class Block:
    comment: str
    body: tuple["Item", ...]


@dataclass(frozen=True, slots=True)
class FusedGroup:
    body: tuple[Stmt, ...]
    col: int


Item = Stmt | Block | FusedGroup

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<string>"[^"]*"|'[^']*')
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op>~~|~fused|~logic:|~projections:|!/|-\?/|-\?\^|\*\*|[-+*/]\.(?!\d)|\[\||\|\]|==|<>|&&|\|\||\?/|\^\^
          |[-+*/%<=:;(),.\[\]])
""", re.VERBOSE | re.ASCII)


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    col: int


def _tokenize(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise CdSyntaxError(f'cd "{text}": column {pos + 1}: unexpected character {text[pos]!r}')
        assert m.lastgroup is not None  # every alternative of _TOKEN is a named group
        if m.lastgroup != "ws":
            out.append(_Tok(m.lastgroup, m.group(), pos + 1))
        pos = m.end()
    out.append(_Tok("end", "", len(text) + 1))
    return out


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.nest = 0
        self.depths: dict[int, int] = {}

    def error(self, tok: _Tok, msg: str) -> CdSyntaxError:
        return CdSyntaxError(f'cd "{self.text}": column {tok.col}: {msg}')

    @contextlib.contextmanager
    def nested(self, tok: _Tok):
        """One more level of syntactic nesting, refused past `MAX_NESTING`."""
        self.nest += 1
        if self.nest > MAX_NESTING:
            raise self.error(tok, f"nested more than {MAX_NESTING} levels deep; split the expression into "
                                  f"several assignments, declaring the parts inline (\"part\" =: ...)")
        try:
            yield
        finally:
            self.nest -= 1

    def apply(self, op: ops.Unop | ops.Binop | ops.Ternop, args: tuple[Expr, ...], tok: _Tok, *,
              intermediate: bool = False) -> Apply:
        """An `Apply` node, refused when its tree would be deeper than `MAX_DEPTH`."""
        depth = 1 + max(self.depths.get(id(a), 0) for a in args)
        if depth > MAX_DEPTH:
            raise self.error(tok, f"expression more than {MAX_DEPTH} operations deep; split it into several "
                                  f"assignments, declaring the parts inline (\"part\" =: ...)")
        node = Apply(op, args, tok.col, intermediate)
        self.depths[id(node)] = depth
        return node

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def at(self, text: str) -> bool:
        return self.tok.kind == "op" and self.tok.text == text

    def take(self) -> _Tok:
        t = self.tok
        self.i += 1
        return t

    def expect(self, text: str) -> _Tok:
        if not self.at(text):
            raise self.error(self.tok, f"expected {text!r}, found {self.tok.text or 'end of text'!r}")
        return self.take()

    def code(self, closing: str | None) -> tuple[Item, ...]:
        items: list[Item] = []
        while True:
            while self.at(";"):
                self.take()
            if self.tok.kind == "end" or (closing and self.at(closing)):
                break
            items.append(self.item())
            if not (self.at(";") or self.tok.kind == "end" or (closing and self.at(closing))):
                raise self.error(self.tok, f"expected ';' between assignments, found {self.tok.text!r}")
        return tuple(items)

    def item(self) -> Item:
        if self.at("~~"):
            with self.nested(self.take()):
                self.expect("(")
                if self.tok.kind != "string":
                    raise self.error(self.tok, "a block comment starts with a string: ~~(\"comment\"; ...)")
                comment = self.take().text[1:-1]
                self.expect(";")
                body = self.code(")")
                self.expect(")")
            return Block(comment, body)
        if self.at("~fused"):
            start = self.take()
            self.expect("(")
            stmts = [self.stmt()]
            while self.at(";"):
                self.take()
                if not self.at(")"):
                    stmts.append(self.stmt())
            self.expect(")")
            return FusedGroup(tuple(stmts), start.col)
        return self.stmt()

    def stmt(self) -> Stmt:
        start = self.tok
        if self.tok.kind == "string":
            tok = self.take()
            name = tok.text[1:-1]
            if not name.isidentifier():
                raise self.error(tok, f"an inline declaration needs an identifier, got {name!r}")
            lhs: Ref | Decl = Decl(name, tok.col)
        elif self.tok.kind == "name":
            lhs = self.ref()
        else:
            raise self.error(self.tok, f"an assignment starts with the assigned-to tensor, found {self.tok.text!r}")
        init, accum = self.asgn_op()
        rhs = self.expr(0)
        logic = projections = None
        while self.at("~logic:") or self.at("~projections:"):
            opt = self.take()
            if opt.text == "~logic:":
                if self.tok.kind != "string":
                    raise self.error(self.tok, "~logic: takes a string, e.g. ~logic:\"@\"")
                logic = self.take().text[1:-1]
            else:
                if self.tok.kind != "name":
                    raise self.error(self.tok, "~projections: takes a name")
                projections = self.take().text
        return Stmt(lhs, init, accum, rhs, logic, projections, start.col)

    def asgn_op(self) -> tuple[bool, ops.Binop]:
        tok = self.tok
        if not self.at("="):
            raise self.error(tok, f"expected an assignment operator such as '=:' or '=+', found {tok.text!r}")
        self.take()
        init = False
        if self.at(":"):
            self.take()
            init = True
        nxt = self.tok
        adjacent = nxt.col == tok.col + 1 + int(init)
        if adjacent and nxt.kind == "op" and nxt.text in ACCUM_SPELLINGS:
            self.take()
            return init, ACCUM_SPELLINGS[nxt.text]
        if adjacent and nxt.kind == "name" and nxt.text == "vv":
            self.take()
            return init, ops.Binop.MIN
        if not init:
            raise self.error(tok, "'=' must be followed by ':' or an accumulation operator (=: =+ =:+ =- =* ...)")
        return False, ops.Binop.ARG2

    def expr(self, level: int) -> Expr:
        if level == len(_INFIX_LEVELS):
            return self.power()
        left = self.expr(level + 1)
        while self.tok.kind == "op" and (self.tok.text in _INFIX_LEVELS[level] or self._intermediate_at(level)):
            tok = self.take()
            right = self.expr(level + 1)
            if tok.text in _INTERMEDIATE:
                left = self.apply(_INTERMEDIATE[tok.text], (left, right), tok, intermediate=True)
            else:
                left = self.apply(_INFIX_LEVELS[level][tok.text], (left, right), tok)
        return left

    def _intermediate_at(self, level: int) -> bool:
        op = _INTERMEDIATE.get(self.tok.text)
        return op is not None and op.infix in _INFIX_LEVELS[level]

    def power(self) -> Expr:
        base = self.unary()
        if self.at(_POW):
            tok = self.take()
            with self.nested(tok):
                exponent = self.power()
            return self.apply(ops.Binop.TO_POW_OF, (base, exponent), tok)
        return base

    def unary(self) -> Expr:
        if self.at("!/"):
            tok = self.take()
            with self.nested(tok):
                operand = self.unary()
            return self.apply(ops.Unop.RELU, (operand,), tok)
        if self.at("-"):
            tok = self.take()
            with self.nested(tok):
                operand = self.unary()
            if isinstance(operand, Num):
                return Num(-operand.value, operand.label, tok.col)
            return self.apply(ops.Unop.NEG, (operand,), tok)
        return self.atom()

    def atom(self) -> Expr:
        tok = self.tok
        if self.at("[") or self.at("[|"):
            return self.literal()
        if self.at("("):
            if self._tuple_ahead():
                return self.literal()
            with self.nested(self.take()):
                inner = self.expr(0)
            self.expect(")")
            return inner
        if tok.kind == "number":
            self.take()
            return Num(float(tok.text), None, tok.col)
        if tok.kind == "string":
            self.take()
            if self.tok.kind != "number":
                raise self.error(self.tok, "a quoted label must prefix a number, e.g. 'q' 2.0")
            return Num(float(self.take().text), tok.text[1:-1], tok.col)
        if tok.kind == "name":
            if self.toks[self.i + 1].kind == "op" and self.toks[self.i + 1].text == "(":
                return self.call()
            return self.ref()
        raise self.error(tok, f"expected a tensor, a number or '(', found {tok.text or 'end of text'!r}")

    def _tuple_ahead(self) -> bool:
        """Whether the parenthesis opens a tuple literal: a separator at its own depth."""
        depth = 0
        for t in self.toks[self.i:]:
            if t.kind == "op" and t.text in ("(", "[", "[|"):
                depth += 1
            elif t.kind == "op" and t.text in (")", "]", "|]"):
                depth -= 1
                if depth == 0:
                    return False
            elif depth == 1 and t.kind == "op" and t.text in (",", ";"):
                return True
            elif t.kind == "end":
                return False
        return False

    def literal(self) -> Literal:
        open_ = self.take()
        close, kind = _LITERAL_CLOSE[open_.text]
        items = [self.literal_elem()]
        while self.at(",") or self.at(";"):
            self.take()
            if self.at(close):
                break
            items.append(self.literal_elem())
        self.expect(close)
        if kind == "input" and len(items) < 2:
            raise self.error(open_, "a tuple literal (an input axis) needs at least two elements")
        first = items[0]
        for item in items[1:]:
            if _literal_shape(item) != _literal_shape(first):
                raise self.error(open_, "an array literal is ragged: every element of a level must have the "
                                        "same axes and sizes")
        return Literal(kind, tuple(items), open_.col)

    def literal_elem(self) -> "float | Literal":
        if self.at("[") or self.at("[|") or self.at("("):
            return self.literal()
        sign = -1.0 if self.at("-") else 1.0
        if sign < 0:
            self.take()
        if self.tok.kind != "number":
            raise self.error(self.tok, f"an array literal holds numbers or nested literals, found "
                                       f"{self.tok.text or 'end of text'!r}")
        return sign * float(self.take().text)

    def call(self) -> Expr:
        tok = self.take()
        if tok.text not in FUNCTIONS:
            raise self.error(tok, f"unknown operation {tok.text!r}; known: {', '.join(sorted(FUNCTIONS))}")
        self.expect("(")
        with self.nested(tok):
            args = [self.expr(0)]
            while self.at(","):
                self.take()
                args.append(self.expr(0))
        self.expect(")")
        if len(args) != FUNCTION_ARITY[tok.text]:
            raise self.error(tok, f"{tok.text} takes {FUNCTION_ARITY[tok.text]} argument(s), got {len(args)}")
        return self.apply(FUNCTIONS[tok.text], tuple(args), tok)

    def ref(self) -> Ref:
        tok = self.take()
        field = None
        if self.at("."):
            self.take()
            f = self.tok
            if f.kind != "name" or f.text not in ("grad", "value", "merge"):
                raise self.error(f, f"after '.', expected grad, value or merge, found {f.text!r}")
            field = self.take().text
            if field == "grad" and self.at(".") and self.toks[self.i + 1].text == "merge":
                self.take()
                self.take()
                field = "grad.merge"
        return Ref(tok.text, field, tok.col)


def _literal_shape(item: "float | Literal") -> tuple:
    if isinstance(item, Literal):
        return ((item.kind, len(item.items)), *_literal_shape(item.items[0]))
    return ()


def parse(text: str) -> tuple[Item, ...]:
    """Parse `%cd` text once; the result is cached by text."""
    if not isinstance(text, str):
        raise CdSyntaxError(f"cd: the code must be a str in the %cd notation, got {type(text).__name__} "
                            f"{_preview(text)}")
    return _parse_text(text)


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.lru_cache(maxsize=1024)
def _parse_text(text: str) -> tuple[Item, ...]:
    p = _Parser(text)
    items = p.code(None)
    if p.tok.kind != "end":
        raise p.error(p.tok, f"unexpected {p.tok.text!r}")
    if not items:
        raise CdSyntaxError(f'cd "{text}": column 1: no assignment')
    return items
