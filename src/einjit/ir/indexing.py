"""Symbols, axis indices and projections: how loops index into arrays.

Projections are the meeting point of shape inference (which derives them) and the compiler
(which lowers them to loops), so this module is the only one of `ir/` that `shape/` imports.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterable

from einjit.errors import EinjitError
from einjit.ir import naming
from einjit.ir.tnode import Tnode

_symbol_counter = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Symbol:
    """A loop or static index variable. Identity is its `id`; `name` is only for printing."""

    id: int
    name: str = "i"

    def __repr__(self) -> str:
        names = naming.current()
        return names.symbol(self) if names is not None else f"{self.name}{self.id}"


def get_symbol(name: str = "i") -> Symbol:
    """A fresh symbol, distinct from every symbol made before."""
    return Symbol(next(_symbol_counter), name)


@dataclass(frozen=True, slots=True)
class StaticSymbol:
    """A symbol whose value is fixed for one call of a routine and passed as an argument.

    `static_range` is the number of values it ranges over, when known (e.g. the number of
    batches when it slices a dataset). A symbol created without one gets it from the axis it
    indexes (`infer_range`, called by `batch_slice`), so no value can index outside
    that axis. The range is not part of equality or the hash: it is filled in after the symbol
    may already be a key of a bindings mapping.
    """

    symbol: Symbol
    static_range: int | None = field(default=None, compare=False)

    def infer_range(self, n: int) -> None:
        """Record the size of the axis this symbol indexes as its range, if it has none; a
        symbol indexing axes of different sizes keeps the smallest, so it is valid for all."""
        if self.static_range is None or n < self.static_range:
            object.__setattr__(self, "static_range", n)

    def __repr__(self) -> str:
        return f"{self.symbol!r}" + ("" if self.static_range is None else f"<{self.static_range}>")


class StaticSymbolError(EinjitError, ValueError):
    pass


class IndexingError(EinjitError, ValueError):
    pass


def get_static_symbol(static_range: int | None = None, name: str = "s") -> StaticSymbol:
    """A new static symbol; `static_range` (the number of values, at least 1) or None."""
    if static_range is not None and (isinstance(static_range, bool) or not isinstance(static_range, int)
                                     or static_range < 1):
        raise StaticSymbolError(f"einjit: get_static_symbol: the range must be None or an int at least 1, got "
                                f"{static_range!r}")
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise StaticSymbolError(f"einjit: get_static_symbol: the name must be an identifier, got {name!r}")
    return StaticSymbol(get_symbol(name), static_range)


@dataclass(slots=True)
class IntRef:
    """A mutable integer cell: the current value of a static symbol seen by routines."""

    value: int = 0


@dataclass(frozen=True, slots=True)
class FixedIdx:
    index: int

    def __repr__(self) -> str:
        return str(self.index)


@dataclass(frozen=True, slots=True)
class Iterator:
    symbol: Symbol

    def __repr__(self) -> str:
        return repr(self.symbol)


@dataclass(frozen=True, slots=True)
class Affine:
    """`sum(coeff * symbol) + offset`; convolutions use `[(stride, i), (dilation, j)]`, `-padding`."""

    symbols: tuple[tuple[int, Symbol], ...]
    offset: int = 0

    def __repr__(self) -> str:
        terms = [f"{s!r}" if c == 1 else f"{c}*{s!r}" for c, s in self.symbols]
        if self.offset or not terms:
            terms.append(str(self.offset))
        return "+".join(terms).replace("+-", "-")


@dataclass(frozen=True, slots=True)
class SubAxis:
    """Part of a multi-axis vectorized access: the position is covered by a vector op."""

    def __repr__(self) -> str:
        return "_"


@dataclass(frozen=True, slots=True)
class GatherIdx:
    """An index read at run time from an integer array: `ids[idcs]`, clamped into `[0, size)`.

    A gather reads `table[.., GatherIdx(ids, ..), ..]` and its gradient scatter-adds through
    the same index. The value is data, not an affine function of loop symbols, so no pass
    can reason about which cell it names: tracing counts it as cell 0, the nodes indexed
    through it and `ids` stay stored (`NonVirtual` code 15), and a loop is parallel only over
    the other axes. Clamping keeps every access inside the array whatever the data holds
    (the interpreter and every backend clamp alike); the tensor-level `take` documents it.
    `index_symbols` are the symbols of `idcs`: what the index depends on."""

    ids: Tnode
    idcs: tuple["AxisIndex", ...]
    size: int

    def __repr__(self) -> str:
        return f"{self.ids.name}[{', '.join(repr(i) for i in self.idcs)}]<{self.size}>"


AxisIndex = FixedIdx | Iterator | Affine | SubAxis | GatherIdx


def index_symbols(idx: AxisIndex) -> tuple[Symbol, ...]:
    match idx:
        case Iterator(s):
            return (s,)
        case Affine(symbols, _):
            return tuple(s for _, s in symbols)
        case GatherIdx(_, idcs, _):
            return tuple(s for i in idcs for s in index_symbols(i))
        case _:
            return ()


def gather_indices(idcs: tuple[AxisIndex, ...]) -> tuple[GatherIdx, ...]:
    """The run-time indices among `idcs`, nested ones included (ids read through ids)."""
    out: list[GatherIdx] = []
    stack = list(idcs)
    while stack:
        idx = stack.pop()
        if isinstance(idx, GatherIdx):
            out.append(idx)
            stack.extend(idx.idcs)
    return tuple(out)


def make_affine(terms: Iterable[tuple[int, Symbol]], offset: int = 0) -> AxisIndex:
    """Normalize an affine combination: merge repeated symbols, drop zero terms, and return
    the simplest index variant that represents it."""
    merged: dict[Symbol, int] = {}
    for c, s in terms:
        merged[s] = merged.get(s, 0) + c
    kept = tuple((c, s) for s, c in merged.items() if c != 0)
    if not kept:
        return FixedIdx(offset)
    if len(kept) == 1 and kept[0][0] == 1 and offset == 0:
        return Iterator(kept[0][1])
    return Affine(kept, offset)


def subst_index(env: dict[Symbol, AxisIndex], idx: AxisIndex) -> AxisIndex:
    """Substitute symbols by indices, expanding nested affine indices and folding fixed ones."""
    match idx:
        case Iterator(s) if s in env:
            return env[s]
        case Affine(symbols, offset):
            terms: list[tuple[int, Symbol]] = []
            for c, s in symbols:
                match env.get(s):
                    case None:
                        terms.append((c, s))
                    case Iterator(new_s):
                        terms.append((c, new_s))
                    case FixedIdx(i):
                        offset += c * i
                    case Affine(inner, inner_off):
                        terms.extend((c * ic, s2) for ic, s2 in inner)
                        offset += c * inner_off
                    case SubAxis():
                        pass
                    case GatherIdx():
                        raise IndexingError(f"einjit: a run-time index cannot replace {s!r} in the affine "
                                         f"index {idx!r}")
            return make_affine(terms, offset)
        case GatherIdx(ids, idcs, size):
            return GatherIdx(ids, tuple(subst_index(env, i) for i in idcs), size)
        case _:
            return idx


@dataclass(frozen=True, slots=True)
class Projections:
    """How one assignment's loops index its arguments.

    `product_space[k]` is the trip count of the loop over `product_iterators[k]`;
    `project_lhs` / `project_rhs[j]` give, per axis of the assigned-to / j-th argument array,
    its index in terms of the product iterators. `lhs_dims` / `rhs_dims` are the arrays' dims.
    """

    product_space: tuple[int, ...]
    product_iterators: tuple[Symbol, ...]
    lhs_dims: tuple[int, ...]
    rhs_dims: tuple[tuple[int, ...], ...]
    project_lhs: tuple[AxisIndex, ...]
    project_rhs: tuple[tuple[AxisIndex, ...], ...]
    debug_info: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if len(self.product_space) != len(self.product_iterators):
            raise ValueError(
                f"Projections {self.debug_info!r}: product space {self.product_space} and "
                f"iterators {self.product_iterators} differ in length")
        if len(self.project_lhs) != len(self.lhs_dims):
            raise ValueError(
                f"Projections {self.debug_info!r}: {len(self.project_lhs)} lhs indices for "
                f"lhs dims {self.lhs_dims}")
        for j, (p, d) in enumerate(zip(self.project_rhs, self.rhs_dims, strict=True)):
            if len(p) != len(d):
                raise ValueError(
                    f"Projections {self.debug_info!r}: {len(p)} indices for rhs{j + 1} dims {d}")

    def iterator_dims(self) -> dict[Symbol, int]:
        return dict(zip(self.product_iterators, self.product_space, strict=True))

    def is_surjective(self) -> bool:
        """Every cell of the lhs is written: each lhs axis is swept by its own full-range loop."""
        dims = self.iterator_dims()
        for idx, d in zip(self.project_lhs, self.lhs_dims, strict=True):
            match idx:
                case Iterator(s) if dims.get(s) == d:
                    continue
                case FixedIdx(0) if d == 1:
                    continue
                case _:
                    return False
        seen = [s for idx in self.project_lhs for s in index_symbols(idx)]
        return len(seen) == len(set(seen))

    def is_injective(self) -> bool:
        """Each lhs cell is written at most once: no loop of trip count > 1 is a reduction."""
        lhs_syms = {s for idx in self.project_lhs for s in index_symbols(idx)}
        for s, d in zip(self.product_iterators, self.product_space, strict=True):
            if d > 1 and s not in lhs_syms:
                return False
        for idx in self.project_lhs:
            if isinstance(idx, (Affine, GatherIdx)):
                return False
        return True
