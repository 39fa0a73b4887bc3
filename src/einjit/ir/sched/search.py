"""Measured tile choice (`EINJIT_SEARCH=1`), in the manner of tinygrad's BEAM search.

The cost model (`cost_model.py`) prices code for a description of the kind of machine at
hand (`machine.py`), not its exact timings. With `EINJIT_SEARCH=1`, the scheduling stage
instead times candidates on the machine at hand: for each contraction of at least
`SEARCH_MIN_WORK` multiply-adds, the cost model's `EINJIT_SEARCH_CANDIDATES` (default 6)
cheapest tiles (the cheapest of each width first), plus the best one with the summed loop
cut into 256-step chunks (panel in L1 rather than L2), each timed as a stand-alone contraction
of the same shape and precision on random data. The fastest tile wins. The timing is the
backend layer's: the C backend installs its timer (`backends/cc/timer.py`) with `set_timer`
when it loads, so this module imports no backend.

Winners are stored on disk in the compiled-object cache, `<cache>/search/<key>.json`, beside
`<cache>/cc/`, keyed by the shape, the candidates, the compiler, its flags and the host CPU.
A later compile of the same shape — in this process or another — reads the winner and
searches nothing, so the generated C (and its cached object) is the same again. A record is
believed only when its tile is one of the candidates the shape has now: one edited or planted
in the cache directory can pick among tiles the schedule would have timed anyway, never a tile
no candidate list holds. `stats`
counts searches and cache answers. Without `EINJIT_SEARCH` nothing here runs: the default
schedule is deterministic, the same model giving byte-identical C on every machine of a kind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from einjit import config
from einjit.errors import EinjitError
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.passes.tracing import VirtualizeSettings
from einjit.ir.sched import cost_model
from einjit.ir.sched.cost_model import Shape, Tile
from einjit.ir.sched.schedule import Blocking, choose_tile, schedule_llc
from einjit.ir.tnode import Tnode, hosted

__all__ = ["SEARCH_MIN_WORK", "SearchStats", "Timer", "enabled", "set_timer", "stats", "tile_for"]

SEARCH_MIN_WORK = 1 << 20
"""Contractions of fewer multiply-adds keep the cost model's tile: timing them is noise."""

_VERSION = "1"


@dataclass
class SearchStats:
    searches: int = 0
    cache_hits: int = 0


stats = SearchStats()


class Timer(Protocol):
    """What the backend layer gives the search: `timer(code, inputs)` compiles the stand-alone
    routine `code`, fills `inputs` with random values and returns its best time in seconds;
    `identity()` names what the times depend on (compiler, flags, host CPU), part of the key
    under which winners are kept."""

    def __call__(self, code: ll.LLStmt, inputs: Sequence[Tnode]) -> float: ...

    def identity(self) -> str: ...


_timer: Timer | None = None


def set_timer(timer: Timer) -> None:
    """Install the timer the search measures candidates with (the C backend's, when it loads)."""
    global _timer
    _timer = timer


def enabled() -> bool:
    """Whether `EINJIT_SEARCH` asks for measured tiles ("1"; "0" or unset: the cost model)."""
    value = os.environ.get("EINJIT_SEARCH", "").strip()
    if value not in ("", "0", "1"):
        raise EinjitError(f"einjit: EINJIT_SEARCH must be 0 or 1, got {value!r}")
    return value == "1"


def _candidate_count() -> int:
    value = os.environ.get("EINJIT_SEARCH_CANDIDATES", "6").strip()
    if not value.isdigit() or int(value) < 1:
        raise EinjitError(f"einjit: EINJIT_SEARCH_CANDIDATES must be a positive integer, got {value!r}")
    return int(value)


def candidates(shape: Shape, blocking: Blocking) -> list[Tile]:
    """The tiles to time, the cost model's cheapest first."""
    found = cost_model.candidates(shape, blocking.nb_choices, blocking.mb_max, blocking.machine)
    found.sort(key=lambda t: cost_model.cycles(shape, t, blocking.machine))
    # the best tile of each width first, so that a few candidates still differ in shape
    widths = {t.nb: t for t in reversed(found)}
    ordered = sorted(widths.values(), key=found.index) + [t for t in found if widths[t.nb] != t]
    chosen = ordered[:_candidate_count()]
    if chosen and shape.outer_depth > 512 and chosen[0].kc > 256:
        chosen.append(replace(chosen[0], kc=256))
    return chosen


def tile_for(shape: Shape, blocking: Blocking) -> Tile | None:
    """The measured best tile for `shape` (from the disk cache when searched before)."""
    if shape.rows * shape.cols * shape.depth < SEARCH_MIN_WORK:
        return choose_tile(shape, blocking)
    tiles = candidates(shape, blocking)
    if len(tiles) < 2:
        return tiles[0] if tiles else None
    if _timer is None:
        raise EinjitError("einjit: EINJIT_SEARCH=1 needs a timer from the backend layer; load the C backend "
                          "(`einjit.backends.get('cc')`) before compiling")
    timer = _timer
    key = config.cache_key("search", _VERSION, timer.identity(), repr(shape), repr(tiles),
                           repr(blocking.parallel_min_work))
    path = config.cache_dir() / "search" / f"{key}.json"
    try:
        won = Tile(**json.loads(path.read_text())["tile"])
    except (OSError, ValueError, KeyError, TypeError):
        won = None
    if won in tiles:
        stats.cache_hits += 1
        return won
    if won is not None:
        config.debug(1, f"search: {path} names {won}, not one of the candidates for {shape}: searching again")
    stats.searches += 1
    times = {t: _time(shape, t, blocking, timer) for t in tiles}
    best = min(tiles, key=lambda t: times[t])
    config.debug(1, f"search: {shape}: " + ", ".join(f"{t.mb}x{t.nb}/{t.kc}: {times[t] * 1e3:.3f} ms"
                                                     for t in tiles))
    config.usable_dir(path.parent, "EINJIT_CACHE_DIR")
    record = {"shape": shape.__dict__, "tile": best.__dict__,
              "seconds": {f"{t.mb}x{t.nb}/{t.kc}": times[t] for t in tiles}}
    try:
        config.atomic_write(path, json.dumps(record, indent=1).encode())
    except OSError as e:
        raise config.ConfigError(f"einjit: cannot write the measured tile choice {str(path)!r} "
                                 f"(EINJIT_CACHE_DIR): {e.strerror or e}") from e
    return best


def _time(shape: Shape, tile: Tile, blocking: Blocking, timer: Timer) -> float:
    """`timer`'s time of `C[rows, cols] = A[rows, depth] @ B[depth, cols]` scheduled with `tile`
    (`A[depth, rows]ᵀ` for a shape with strided rows)."""
    prec = ops.double if shape.itemsize == 8 else ops.single
    # with strided rows, A is stored summed-axis first (`aᵀ @ b`, a weight gradient's `xᵀ·dy`)
    a_dims = (shape.depth, shape.rows) if shape.strided_rows else (shape.rows, shape.depth)
    a, b, c = (Tnode(n, d, prec) for n, d in (("a", a_dims), ("b", (shape.depth, shape.cols)),
                                                ("c", (shape.rows, shape.cols))))
    for tn in (a, b, c):
        tn.update_memory_mode(hosted(), 0)
    i, j, k = get_symbol("i"), get_symbol("j"), get_symbol("k")
    a_at = (Iterator(k), Iterator(i)) if shape.strided_rows else (Iterator(i), Iterator(k))
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, a_at), ll.Get(b, (Iterator(k), Iterator(j))),
                    ll.Get(c, (Iterator(i), Iterator(j))))
    nest = ll.ForLoop(i, 0, shape.rows - 1, ll.ForLoop(j, 0, shape.cols - 1, ll.ForLoop(
        k, 0, shape.depth - 1, ll.Set(c, (Iterator(i), Iterator(j)), fma))))
    # the stand-alone nest has one summed loop: a chunk of the real outermost one is `kc` of it
    chunk = replace(tile, kc=tile.kc * (shape.depth // shape.outer_depth))
    code = schedule_llc(ll.seq(ll.ZeroOut(c), nest), VirtualizeSettings(),
                        replace(blocking, min_work=1, tile=chunk), tile_for=choose_tile)
    return timer(code, (a, b))
