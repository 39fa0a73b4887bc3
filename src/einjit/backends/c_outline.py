"""Outlined loop nests: a large routine as one C function per top-level nest, nests that are
the same computation on other arrays as one function (regional compilation).

gcc's time on one function grows faster than the function (register allocation, liveness
and induction-variable passes): a GPT training step rendered as one function of a few
hundred nests took gcc 3.2x the time for twice the layers. As one function per nest, each
compiled on its own, gcc's time grows with the code; and the blocks of a transformer are the
same nests on other arrays, so most nests of a deep model are calls of a function already
compiled. Two nests are the same computation when their C text is equal once the names they
bind or receive (arrays, loop counters, scalar locals, temporaries) are renamed in order of
first appearance, and their parameters have the same types: the text is what gcc compiles,
so equal texts are equal functions. Comments are left out of the comparison (they name the
tensors of one instance); the function keeps those of the first nest that uses it.

The renderer (`c_syntax.render_routine`) renders the nests; this module only compares texts,
writes the functions and their calls. A nest whose code has the structure of one rendered
before is not rendered at all: the renderer hands over a `Copy` of the first, with its own
arrays (`SHARE_BY_STRUCTURE`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CALL_MARK = "@einjit-nest-call "
"""Stands for a nest's call in the routine's body until the calls are known."""

SHARE_BY_STRUCTURE = True
"""Whether the renderer copies nests of a structure rendered before instead of rendering
them; off, every nest is rendered and compared as text (the tests compare the two)."""

_COMMENT = re.compile(r"/\*.*?\*/")
_TOKEN = re.compile(r"\b[A-Za-z_]\w*")
_TEMP = re.compile(r"t\d+_\Z")


@dataclass(frozen=True, slots=True)
class Arg:
    """An array a nest function receives: its C name, element type, whether it writes it."""

    name: str
    c_type: str
    written: bool


@dataclass(frozen=True, slots=True)
class Nest:
    """One rendered nest: the arrays it receives, its own local declarations, its body lines
    (indented for a function body) and the names it binds (renamed when comparing nests)."""

    args: list[Arg]
    decls: list[str]
    lines: list[str]
    bound: list[str]


@dataclass(frozen=True, slots=True)
class Copy:
    """A nest of the same structure as `nests[of]`: its `args` stand at the positions of the
    first nest's `Nest.args`."""

    of: int
    args: list[Arg]


def _canonical(nest: Nest) -> tuple[str, list[Arg]]:
    """The text two nests must share to be one function, and the arguments in the order of
    their first appearance in the code (the parameter order of the function)."""
    code = _COMMENT.sub("", "\n".join(["  " + d for d in nest.decls] + nest.lines))
    by_name = {a.name: a for a in nest.args}
    renamed = set(by_name) | set(nest.bound)
    names: dict[str, str] = {}
    order: list[Arg] = []

    def rename(m: re.Match) -> str:
        token = m.group(0)
        if token not in renamed and not _TEMP.match(token):
            return token
        if token not in names:
            names[token] = f"@{len(names)}"
            if token in by_name:
                order.append(by_name[token])
        return names[token]

    text = _TOKEN.sub(rename, code)
    missing = [a for a in nest.args if a.name not in names]
    order += missing
    signature = ",".join(f"{'' if a.written else 'const '}{a.c_type}" for a in order)
    return f"{signature}\n{text}", order


def share(routine: str, nests: list[Nest | Copy], statics: list[tuple[str, str]], restrict: str
          ) -> tuple[tuple[str, ...], list[str]]:
    """The nest functions of `routine` (definitions, without storage class) and the call of
    each nest in order (a `Copy` calls the function of the nest it copies). `statics` are the
    routine's static symbols (name, C type), passed on to every function."""
    functions: list[str] = []
    known: dict[str, tuple[str, list[Arg]]] = {}
    calls = []
    static_args = [name for name, _ in statics]
    called: list[tuple[str, list[int]]] = []
    """Per nest: its function and the positions in its `args` of the function's parameters."""
    for nest in nests:
        if isinstance(nest, Copy):
            fname, positions = called[nest.of]
            called.append((fname, positions))
            calls.append(f"  {fname}({', '.join([nest.args[p].name for p in positions] + static_args)});")
            continue
        key, order = _canonical(nest)
        if key not in known:
            fname = f"{routine}_nest{len(functions)}"
            params = [f"{'' if a.written else 'const '}{a.c_type} *{restrict} {a.name}" for a in order]
            params += [f"{t} {name}" for name, t in statics]
            body = ["  " + d for d in nest.decls] + nest.lines
            functions.append("\n".join([f"void {fname}({', '.join(params) or 'void'}) {{", *body, "}"]) + "\n")
            known[key] = (fname, order)
        fname, _ = known[key]
        index = {a.name: k for k, a in enumerate(nest.args)}
        called.append((fname, [index[a.name] for a in order]))
        calls.append(f"  {fname}({', '.join([a.name for a in order] + static_args)});")
    return tuple(functions), calls
