"""Software prefetch in register-blocked kernels (`optimize_proc`'s "prefetch" stage, the last):
each sweep asks for the lines its next block will read, and each tile for the lines the next
tile will store.

Reads. A weight gradient `w.grad[n, k] += sum_r dy[r, n] * x[r, k]` read in place
(`unpacked_panel`) sweeps all 1024 rows `r` for every 8 x 32 block of its result, and each sweep
reads a column strip of each operand: 8 cells of `dy` per row, rows 2 KiB apart, and 32 of
`x`, rows 512 bytes apart. The hardware prefetcher follows a strip once a sweep has started,
but cannot know where the next block's strip begins, so the first sweep over each new strip
waits for its lines row after row. In a training step that strip is not in the L2: `x` is an
activation the forward stored long before, `dy` the previous nest's 2 MiB output. So each
iteration of the sweep asks for the lines the next block reads at the same row (the strip's
next line along the innermost block loop that moves it). On this Zen 4 the MLP fc's 512 x 128
over 1024 rows, compiled alone with the caches flushed before each call, took 1.71 ms without
and 1.25 ms with the next line of `dy` requested; asking instead for the current strip's lines
8 rows ahead (what the hardware already does) gave 1.52 ms, and cost 18 extra instructions per
iteration once the request's address was clamped into the array. In cache the requests cost
nothing measurable (1.17-1.20 ms either way).

Stores. A product's result is often the first touch of its lines in the step (scratch another
node used before, long evicted), and a store to a line not in the cache waits for the line to
be read first. The fc's forward (1024 x 128 @ 128 x 512 into 2 MiB), alone: 1.155 ms with its
result in cache, 1.245 ms with it cold, 1.20 ms cold when each 8 x 32 tile first asks, with
intent to write, for the 16 lines the next tile stores (two tiles ahead: 1.22 ms).

A kernel's sweep is found as a loop whose body is only fully unrolled loops (the block's rows
and vectors) accumulating into a register block; the loops around it whose body is the next
loop alone sum too (rows split into batch and time), and the first loop out from those that
moves a read is its block loop. A read gets requests when one iteration of the sweep moves it
by a line or more without reading the whole step (a packed panel is a dense stream, which the
hardware follows across blocks too). The tile loop is the one whose body holds the sweep beside
the block's fill and store; its requests go at the top of each iteration, for the stores of the
next iteration of the innermost loop that moves them. A short sweep's reads (attention's 32-64
keys or head features, operands in the L1 or L2) get none; its stores do (`MIN_STORE_SWEEP`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from einjit.ir import low_level as ll
from einjit.ir import provenance
from einjit.ir.indexing import FixedIdx, Symbol, subst_index
from einjit.ir.tnode import Tnode

__all__ = ["LINE_BYTES", "prefetch_kernels"]

LINE_BYTES = 64

MAX_LINES = 2
"""Requests per read and iteration at most: one block row of 8 or 32 floats spans 1-2 lines."""

MAX_STORE_LINES = 32
"""Requests per tile's store at most: an 8 x 32 float block spans 16 lines."""

MIN_SWEEP = 128
"""Iterations a sweep runs at least for its reads to get requests: the products of the GPT
step's projections and MLP sum 128-1024 rows or columns; attention's 32-64 do not (their
operands are in the L1 or L2, and the requests would be a few percent more instructions)."""

MIN_STORE_SWEEP = 16
"""Iterations a sweep runs at least for its tile's stores to get requests (16 for an 8 x 32
block, one per 16 FMAs at this length). Attention's products, which sum 32-64 features or
keys, write 1 MiB of scores or weights per block: their requests made the 4-block GPT step's
scores 0.76 -> 0.66 ms, `P v` 0.51 -> 0.46, `dY vᵀ` 0.94 -> 0.88 (all blocks, per-nest profile)."""

MAX_CELLS = 4096
"""Cells of one read per iteration at most, each counted: a kernel's block reads a few dozen."""


def prefetch_kernels(llc: ll.LLStmt) -> ll.LLStmt:
    """`llc` with prefetch requests on the sweeps and tiles of its register-blocked kernels."""
    return _visit(llc, ())


def _visit(stmt: ll.LLStmt, around: tuple[ll.ForLoop, ...]) -> ll.LLStmt:
    """`stmt` with its requests; the same object where it gets none (later passes cache by
    identity)."""
    match stmt:
        case ll.Seq(a, b):
            first, second = _visit(a, around), _visit(b, around)
            return stmt if first is a and second is b else ll.Seq(first, second)
        case ll.ForLoop(body=body) if not stmt.unroll:
            inside = _sweep(stmt)
            if inside is not None:
                requests = _read_requests(stmt, inside, around)
                return dataclasses.replace(stmt, prefetch=requests) if requests else stmt
            inner = _visit(body, (*around, stmt))
            loop = stmt if inner is body else dataclasses.replace(stmt, body=inner)
            requests = _store_requests(loop, around)
            return dataclasses.replace(loop, prefetch=requests) if requests else loop
        case _:
            return stmt


def _sweep(loop: ll.ForLoop) -> dict[Symbol, range] | None:
    """The ranges of the loops inside `loop` if it is a kernel's sweep: a body of fully
    unrolled loops only (the block's rows and vectors, around its lanes) setting a register
    block."""
    inner = [s for s in ll.flatten(loop.body) if not isinstance(s, ll.Comment)]
    if not inner or not all(isinstance(s, ll.ForLoop) and s.unroll for s in inner):
        return None
    inside: dict[Symbol, range] = {}
    blocks = False
    for s in ll.iter_stmts(loop.body):
        match s:
            case ll.ForLoop(index, from_, to_, start=None, stop=None):
                inside[index] = range(from_, to_ + 1)
            case ll.ForLoop():
                return None
            case ll.Set(tn) if tn.provenance == provenance.REGISTER_BLOCK:
                blocks = True
    return inside if blocks else None


def _chain(around: tuple[ll.ForLoop, ...]) -> tuple[list[ll.ForLoop], list[ll.ForLoop]]:
    """The loops around a sweep split into those that sum with it (each the next loop alone:
    the rows split into batch and time), innermost first, and the block loops outside them."""
    outer = list(reversed(around))
    summing: list[ll.ForLoop] = []
    while outer and _only_loop(outer[0]):
        summing.append(outer.pop(0))
    return summing, outer


def _read_requests(loop: ll.ForLoop, inside: dict[Symbol, range],
                   around: tuple[ll.ForLoop, ...]) -> tuple[ll.Prefetch, ...]:
    """For each strided operand the sweep `loop` reads, its next block's lines at this row."""
    summing, block_loops = _chain(around)
    if _iterations(loop, *summing) < MIN_SWEEP:
        return ()
    requests: list[ll.Prefetch] = []
    seen: set[tuple[Tnode, tuple]] = set()
    for x in ll.deep_parts(loop.body):
        if not isinstance(x, ll.Get) or x.tn.provenance == provenance.REGISTER_BLOCK or (x.tn, x.idcs) in seen:
            continue
        seen.add((x.tn, x.idcs))
        requests += _next_block(x, loop.index, inside, [b.index for b in block_loops])
    return tuple(requests)


def _store_requests(tile: ll.ForLoop, around: tuple[ll.ForLoop, ...]) -> tuple[ll.Prefetch, ...]:
    """For a tile loop (its body a kernel's sweep beside the block's fill and store), the lines
    the next tile stores, asked for with intent to write: the store is the first touch of its
    lines this step, and a cold line waits for its read before the write."""
    items = [s for s in ll.flatten(tile.body) if not isinstance(s, ll.Comment)]
    chains = [chain for s in items if isinstance(s, ll.ForLoop) and (chain := _sweep_chain(s))]
    if len(chains) != 1 or len(items) < 2 or _iterations(*chains[0]) < MIN_STORE_SWEEP:
        return ()
    sweep = chains[0][0]
    inside = {s.index: range(s.from_, s.to_ + 1) for item in items if item is not sweep
              for s in ll.iter_stmts(item) if isinstance(s, ll.ForLoop)}
    moving = [tile.index, *(b.index for b in reversed(around))]
    requests: list[ll.Prefetch] = []
    seen: set[tuple[Tnode, tuple]] = set()
    for item in items:
        if item is sweep:
            continue
        for x in ll.iter_stmts(item):
            if (isinstance(x, ll.Set) and x.tn.provenance != provenance.REGISTER_BLOCK
                    and (x.tn, x.idcs) not in seen and _reads_block(x)):
                seen.add((x.tn, x.idcs))
                coeffs = ll.flat_coefficients(x.tn, x.idcs)
                offsets = None if coeffs is None else _offsets(coeffs, inside)
                if coeffs is not None and offsets is not None:
                    requests += _lines(x.tn, x.idcs, coeffs, offsets, moving, write=True, most=MAX_STORE_LINES)
    return tuple(requests)


def _sweep_chain(loop: ll.ForLoop) -> list[ll.ForLoop]:
    """`loop` and the loops it holds alone down to a kernel's sweep (the rows split into batch
    and time, then the sweep), if they end in one; empty otherwise."""
    chain = [loop]
    while _only_loop(chain[-1]):
        chain.append(next(s for s in ll.flatten(chain[-1].body) if isinstance(s, ll.ForLoop)))
    return chain if not chain[-1].unroll and _sweep(chain[-1]) is not None else []


def _reads_block(st: ll.Set) -> bool:
    return any(isinstance(x, ll.Get) and x.tn.provenance == provenance.REGISTER_BLOCK
               for x in ll.iter_scalars(st.llsc))


def _iterations(*loops: ll.ForLoop) -> int:
    return math.prod(loop.to_ - loop.from_ + 1 for loop in loops)


def _only_loop(loop: ll.ForLoop) -> bool:
    """Whether `loop`'s body is one loop alone, itself not unrolled (not a block's row)."""
    body = [s for s in ll.flatten(loop.body) if not isinstance(s, ll.Comment)]
    return len(body) == 1 and isinstance(body[0], ll.ForLoop) and not body[0].unroll


def _next_block(get: ll.Get, k: Symbol, inside: dict[Symbol, range], block_loops: list[Symbol]) -> list[ll.Prefetch]:
    """The lines `get` will read at this row in the next iteration of its block loop, if the
    sweep `k` steps it by a line or more and its cells in one iteration (over the loops
    `inside` it: the block's rows, vectors and lanes) are not the whole step (a dense stream)."""
    coeffs = ll.flat_coefficients(get.tn, get.idcs)
    if coeffs is None or abs(coeffs.get(k, 0)) * get.tn.prec.itemsize < LINE_BYTES:
        return []
    offsets = _offsets(coeffs, inside)
    if offsets is None or max(offsets) - min(offsets) + 1 >= abs(coeffs[k]):
        return []
    return _lines(get.tn, get.idcs, coeffs, offsets, block_loops, write=False, most=MAX_LINES)


def _lines(tn: Tnode, idcs: tuple, coeffs: dict[Symbol, int], offsets: dict[int, dict[Symbol, int]],
           moving: list[Symbol], *, write: bool, most: int) -> list[ll.Prefetch]:
    """One request per cache line the access `tn[idcs]` (its offset's `coeffs`) touches at the
    `offsets` of the loops inside, one iteration of the first loop of `moving` that moves it on
    (at least a line on: a block narrower than a line asks for the line after its own); none
    past `most` lines."""
    size = tn.prec.itemsize
    step = next((coeffs[b] for b in moving if coeffs.get(b, 0) > 0), None)
    if step is None:
        return []
    ahead = step * -(-LINE_BYTES // (step * size))
    line = LINE_BYTES // size
    picked: list[int] = []
    for off in sorted(offsets):
        if not picked or off - picked[-1] >= line:
            picked.append(off)
    if len(picked) > most:
        return []
    return [ll.Prefetch(tn, tuple(subst_index({s: FixedIdx(v) for s, v in offsets[off].items()}, idx)
                                  for idx in idcs), ahead, write)
            for off in picked]


def _offsets(coeffs: dict[Symbol, int], inside: dict[Symbol, range]) -> dict[int, dict[Symbol, int]] | None:
    """Each offset the access reaches over the loops `inside` it, with the values reaching it."""
    symbols = [s for s in coeffs if s in inside]
    if math.prod(len(inside[s]) for s in symbols) > MAX_CELLS:
        return None
    offsets: dict[int, dict[Symbol, int]] = {}
    for values in itertools.product(*(inside[s] for s in symbols)):
        at = dict(zip(symbols, values, strict=True))
        offsets.setdefault(sum(coeffs[s] * v for s, v in at.items()), at)
    return offsets
