"""Compile speed (issue 13 item 6): the optimizer on long chains of virtual nodes, and cold
compiles of whole training steps in fresh processes.

    python benchmarks/bench_compile.py [--repeats N]

Chains: `t[k+1] = relu(t[k])` over n nodes of 8 cells, every intermediate virtual, timed in
`optimize_proc` alone; near-linear growth is what matters (a quadratic optimizer takes 16x the
time for 4x the nodes). Cold compiles: each in a new Python process with an empty private
cache, timing graph-to-routine (lowering, optimizer, C rendering, gcc) as the step benchmarks
report it; medians of `--repeats` processes. gcc's share is fixed by the size of the C code.

Recorded on the shared 2-core machine (six engineers' jobs beside it, so wall times swing 2x;
CPU seconds from `os.times`, medians of 3, before -> after issue 13 item 6):
- chain of 400 nodes: 2.2 s -> 0.063 s CPU (wall 1.8 s quiet -> 0.06-0.14 s); chain of 100:
  0.094 s -> 0.013 s; the copying work grows 4.0x from 100 to 400 nodes (16x before);
- convnet step (einsum): Python 0.29 s -> 0.19 s (tracing 0.26 -> 0.15 s), gcc 0.40 s;
  wall 0.70 s on a quiet moment, 1.4-1.6 s under load;
- convnet step (nn layers): Python 0.53 s -> 0.39 s, gcc 0.51 s;
- moons step: Python 0.06 s, gcc 0.08 s; wall 0.14-0.38 s depending on load (a fresh process
  also compiles einjit's own sources when PYTHONDONTWRITEBYTECODE is set, about 0.15 s).
Later (medians of 5, load about 1 on the 2 cores; CPU seconds of the whole process, so Python's
include the imports): the nn convnet step went from 1.72 s wall (Python 0.43 s, gcc 1.45 s) to
0.91 s (Python 0.34 s, gcc 0.74 s): small contractions with tails no longer unroll their
blocks, gcc runs without its PRE pass (`cc.CcOptions`), tracing's nest limit went from 125 to
25 iterations. The einsum convnet: 0.98 -> 0.65 s; the moons step: 0.15 -> 0.14 s.

GPT-like steps (`gpt_step`, cold: empty cache; warm: a second fresh process on that cache),
CPU seconds because the wall clock measured a load of 9-11 on the 2 cores (issue 21):
- before (the issue's figures): one C function per step; the 2-block step took gcc 9.9 s, 4 blocks 32 s (3.2x the
  time for 2x the layers), the warm compile 1.8 s (einjit's passes ran again);
- outlined (one function per nest, 448 nests of the 4-block step as 84 functions, spread over
  one unit per core): a 1-block d=32 step's gcc time 5.75 -> 2.56 s; 2 blocks: einjit 2.2 s,
  gcc 3.9 s; 4 blocks: einjit 3.6-4.3 s, gcc 4.9-5.8 s; 12 blocks at d=768, T=128: einjit
  10.7-12.5 s, gcc 7.0-7.2 s (gcc per block 1.95 -> 1.2 -> 0.6 s, einjit's about 1 s); the
  4-block step as one function (`CcOptions(outline_min_nests=0)`) took gcc 123.6 s CPU here;
- warm, with the program cache: the 4-block `to_routine` 0.4-0.6 s CPU (0.2 s of it the
  projections the key needs), 2.5 s wall under that load;
- `-O1` instead of `-O2` on the outlined 2-block step: gcc 2.34 instead of 3.54 s, but the
  step ran 611 instead of 130 ms (no vectorization), so `-O2` stays; the outlined step ran
  73.4 ms against 70.9 ms as one function, side by side.

Compile time linear in depth (issue 21 item 1; CPU seconds, load 7-12 on the 2 cores, so
wall times were 3-10x these):
- tracing executes each top-level statement once per structure and replays the events for
  the same nest in other blocks (127 executions for the 1150 statements of the 4-block step);
  projections are derived once per operation shape; shape inference applies each operation
  in place (a 4x larger graph: 4x the calls, was 16x the copying); a nest's own locals are
  placed by that nest's stack (the later blocks' register blocks had become scratch
  parameters and their nests separate functions: 70 -> 63 functions for 4 blocks);
- 4-block step cold: einjit 4.8 -> 2.0 s, gcc 4.3 -> 3.2 s (three units, about 1.6 s of wall
  on two cores), so about 3.6 s on a quiet machine; warm 0.26 -> 0.12 s (the key no longer
  derives projections);
- GPT-2 small shape (`GPT2_ROWS`, gathered vocab 50257): 2 blocks einjit 1.2 s, gcc 2.4 s;
  12 blocks einjit 7.1 -> 5.6-6.2 s, gcc 6.0-6.5 s, about 9 s on a quiet machine: 0.45 s of
  einjit and 0.4 s of gcc per block beyond the second (the routine's own unit, calls and
  memsets, grows with depth). Warm: `models.GPT` steps were never recorded (a gather's ids
  are named only inside its projections); now recorded, 4 blocks warm in 0.17-0.25 s.

Where a cold compile's time went next (per-phase timers and per-unit gcc CPU, load 3-11 on the
2 cores, so CPU seconds; issue 21 item 1):
- `<immintrin.h>`, included for the register blocks' vector FMA, took gcc 0.4 s to parse per
  translation unit under `-march=native` (an empty unit with the prelude: 0.44 s, without the
  header 0.05 s): 1.2 of the 4-block step's 4.5 s of gcc. The helpers call the builtins the
  header wraps (`c_vectors._INTRINSICS`): gcc 4.46 -> 3.30 s, the routine's unit 0.98 -> 0.46 s.
- The routine's own unit (a call per nest, memsets, barriers) grows with depth, the nest units
  do not (63 nest functions for 1, 2 and 4 blocks alike): in the 12-block GPT-2 step it took
  4.2 s against 1.25 s for each nest unit, and the other core waited. Without gcc's points-to
  analysis and dead-store elimination there (`CcOptions.routine_unit_flags`): 2.6 s, same
  instructions.
- Warm: the program key (12 blocks) took 0.45 s, 0.26 s of it the projection keys' row
  tuples and `to_doc` plus a second walk for the graph's nodes; a shape now remembers its
  solved rows (`Shape.solved_rows`, projection keys 0.26 -> 0.03 s) and one walk gives the
  text and the nodes: 0.23 s on the first call (naming 3,400 nodes and their dims, which the
  lowering would need anyway), 0.08 s after.
- `bench_gpt.py`'s 4-block row (9.2 s against 3.9 s here) times more: `opt.update()` builds
  AdamW's graph inside the timed region (68 parameters, ~16 operations each under shape
  inference: 0.8 s), and AdamW adds 408 assignments to the step (lowering 0.28 -> 0.80 s,
  tracing, virtualizing and cleanup 0.97 -> 1.56 s, rendering 0.54 -> 0.66 s, the routine's
  unit 58 -> 115 kB); its d=128, B=16 nests cost about what d=64, B=4 ones do. Its cache is
  `/tmp/einjit-bench-cache` unless `EINJIT_CACHE_DIR` is set, so a second run is warm.

einjit's own time, session 7 (issue 21 item 1; CPU seconds of `to_routine` without gcc, base
and new run alternately in fresh processes at a load of 8-14 on the 2 cores, so +-20%):
- rendering rendered every nest before the outline compared texts (the 12-block GPT-2 step:
  946 nests, 74 functions). A nest of the structure of one rendered before (`ir/structure.py`:
  its code up to renaming nodes and symbols, each node's dims, precision, memory mode,
  provenance and placement, the order of their ids, the static symbols, its parallel region)
  is not rendered: it calls the first one's function (`c_outline.Copy`), and asks the program's
  names in the order rendering would have (`naming.Names.requests`), so the C is byte for
  byte what it was (compared on the 4-block d=64 step, bench_gpt's 4-block AdamW step and the
  12-block GPT-2 step). Render: 4 blocks 0.76-1.04 -> 0.49 s, 12 blocks 2.6-3.0 -> 1.0-1.6 s;
- `nodes_of` is answered once per statement inside a `compile_code` (`ll.remembered_nodes`:
  local storage, scratch planning, layout, rendering and the program cache walked the same
  code nine times); the scratch planner's pairwise interval tests are vectorized (1052 scratch
  arrays in the 12-block step: 0.5-1.0 -> 0.06-0.3 s); tracing's recorder walks each
  expression's reads and each block's statements once;
- totals: the 4-block d=64 step 3.15-3.77 -> 2.54-2.88 s (gcc 3.7 s CPU beside it, three
  units); the 12-block GPT-2 step 9.5-10.6 -> 7.6-8.7 s (gcc 5.6-6.9 s); bench_gpt's 4-block
  AdamW step 7.4-7.7 -> 7.5 s: its cost is AdamW's 2,400 small operations, spread over every
  pass (building the update 1.3 s, of which 0.6 s the 341 `=:`/`=-` statements: the
  parameter's known rows close a chain of about 30 row variables of the intermediates, 37
  row inequalities per statement; lowering 1.2 s, forcing their projections; tracing 1.4 s
  over 3,548 top-level statements). Warm compiles unchanged (0.09-0.14 s CPU for 4 blocks).
- then Python's cyclic collector paused during a compile and while an optimizer builds its
  update (`memory.collector_paused`): 500 collections walked the live graph during the 4-block
  step's compile for a few thousand cycles. Its einjit CPU 2.7 -> 1.8 s alone (gc off against
  on, same code); bench_gpt's AdamW step 8.1 -> 6.3 s; the 12-block GPT-2 step 6.3 s.
  This script's rows at the end (load 12-14, so wall 5-10x CPU): 4 blocks d=64 einjit 1.84 s,
  gcc 3.23 s (issue's start: 3.6-4.3 / 4.3-5.8 s); GPT-2 shape 12 blocks einjit 6.62 s, gcc
  6.04 s (session start 9.7 s and about 7 s); warm 0.08 s (4 blocks) and 0.49 s (12 blocks,
  0.35 s in the run before at the same load: the program key, not changed here).
Session 8 (issue 21 item 1; CPU seconds, main and this branch alternately in fresh processes
at a load of 10-13 on the 2 cores, so +-25%; the generated C byte-identical on the 4-block,
12-block and bench_gpt 4-block AdamW steps for the first two changes):
- the 4-block step's einjit time had grown 1.8 -> 2.7-3.2 s with last session's merges; the
  fusion stage was most of it (0.44-0.57 s): each nest joining a group re-walked the whole
  group for its accesses, plainness and inner loops (up to 16 nests, at every loop level).
  Those facts are now composed from the parts' and answered once per statement (fusion
  0.44 -> 0.15 s, min of 5 in one process); interchange returns nests already in order as
  they are instead of rebuilding every loop (0.11 -> 0.04 s);
- 4 blocks d=64 cold, einjit 2.0-3.4 s (median 2.95) -> 2.2-2.7 s (median 2.3), gcc 3.6-4.3 s
  both (three units: the routine's 0.4 s and two of 1.4-1.9 s, so gcc's wall is about half of
  its CPU on two cores); warm 0.07-0.11 s both. The 40 nest functions are the same for 2 and
  4 blocks: the structure sharing catches every repeated block, forward and backward;
- 12 blocks GPT-2 shape: einjit 8.6 -> 6.8 s, gcc 5.3 s both, warm 0.31-0.32 s both;
- AdamW: the scalars of the update (betas, 1 - beta, bias corrections, eps, weight decay)
  are computed once per update, not once per parameter: 33 -> 15 assignments per parameter
  (2,246 -> 1,044 for bench_gpt's 68 parameters), bit-identical parameters, `pow` called 5
  times per step instead of 29. bench_gpt's 4-block step: building the update 1.3-1.5 ->
  0.8-1.0 s, compiling it 5.7 -> 4.7-4.8 s einjit CPU; gcc unchanged (4.7-5.2 s). This
  script's AdamW row (4 blocks d=64, the update built in the timed region): einjit 4.5-4.8 ->
  3.2-3.5 s, gcc 3.3-4.1 s both; its warm row 1.0 -> 0.6-0.8 s is the update's graph, built
  again in the new process before the program cache answers.
Session 9 (issue 21 item 1; CPU seconds, main and this branch in one `--repeats 1` run each at a
load of 7-12 on the 2 cores, so walls are 3-10x CPU; the generated C byte-identical on the
4-block, AdamW and 12-block steps):
- the warm 12-block compile's CPU went 0.39 -> 0.28 s here (`to_routine` alone, best of three
  alternating processes at load 9-10: 0.24 -> 0.19 s): the program key describes the
  assignment kinds of every model field by field instead of asking each value's kind (the
  same text, tested), a node base is remembered per label and a base's next free name taken
  without the candidate generator, and `to_dims` reads each row once. What a hit still spends: the key 0.10-0.13 s
  (projection keys 25%, their reprs 20%, naming 3,400 nodes, dims), decoding the record
  0.03 s, linking 0.05 s (400 arrays allocated, 1,400 pointers), the collection after the
  collector pause 0.02 s;
- the key now also covers what changed the passes' output without changing it: the machine
  description the scheduler prices for (`EINJIT_MACHINE` on one host gave a false hit), the
  optimizer's stages (one left out or replaced) and `EINJIT_SEARCH`;
- cold compiles change only by the key (0.05-0.1 s), inside this load's noise: 4 blocks einjit
  2.82 / 2.31 s (main / branch), gcc 2.75 / 2.92 s (units 0.30, 1.08, 1.22 s: balanced); 12
  blocks einjit 7.42 / 6.28 s, gcc 5.62 / 4.94 s. Tracing replays 196k events for the
  4-block step (54k recorded), its reads nearly all of distinct nodes between two writes, so
  grouping them per node gained nothing (tried, not kept).
Session 9, AdamW (adamw9; CPU seconds, main and this branch alternately in fresh processes at
a load of 6-10 on the 2 cores, walls meaningless): the update is one `~fused` group per
parameter (`assignments.Fused`: three whole-expression assignments, moments then parameter,
in one loop nest), not fifteen one-operation assignments; the C does the same arithmetic
(parameters bit-identical), one loop per parameter instead of three. This script's AdamW row:
einjit 3.39-3.60 -> 2.58-2.82 s cold (gcc 2.8-3.7 s both, noise); warm 0.57-0.67 -> 0.25-0.39 s
(building the update 0.27-0.33 s of it, mostly the shape inference of the groups' arguments).
Session 11 (issue 21 item 1; CPU seconds, main and this branch alternately in fresh processes at
a load of 4-7 on the 2 cores, walls 2.5-3.5x CPU; generated C byte-identical on the 4-block,
2-block AdamW and 12-block GPT-2 steps):
- the collection after the collector pause walked 151k young objects, half of them garbage
  cycles of recursive closures (fusion's renaming, virtualize's walk and computation check,
  structure's walk, `nests.retarget`, tracing's write templates: one cycle per call); without
  them 77k, the collection 0.13-0.155 -> 0.045 s; the extrema stage rebuilt every loop it did
  not split (0.038 -> 0.018 s);
- 4 blocks d=64 cold, einjit 1.97-3.23 s (median 2.8) -> 1.88-2.58 s (median 2.1) at load 4-7,
  2.07-2.90 -> 2.22-2.72 s at load 1.5-2 (inside the noise), gcc 3.0-4.1 s both; best of three
  in-process per-phase runs at load 1.7: 2.10 -> 1.74 s (collection 0.20 -> 0.07, fusion 0.17 ->
  0.11, rendering 0.30 -> 0.24, virtualize 0.105 -> 0.07, extrema 0.039 -> 0.018); 12 blocks
  GPT-2 shape einjit 7.5 -> 6.7 s (one run each). gcc's units: 0.29 s (the
  routine's) and 1.02 / 1.08 s (the nests'), so its two jobs are even; `-ftime-report` on a nest
  unit: induction-variable optimization 17%, complete unrolling 13%, IPA 10%, parsing 4%.
- where the rest goes (4 blocks, CPU): tracing 0.4 s (replaying 302k events: 190k reads, 75k
  writes, 36k skipped-write boxes), rendering 0.3 s (a quarter of it the nests' structure
  keys), lowering 0.13-0.19 s, fusion 0.11 s, scheduling 0.1 s; 12 blocks of `models.GPT` also
  spend ~9% of their passes in the causal clipping's analysis (its iota mask; the einsum mask
  of `gpt_step` skips it).
Session 12 (issue 21 item 1; load 4-8 on the 2 cores all session, so whole compiles in fresh
processes were noise: walls 9-28 s for the 4-block step; the figures are in-process A/Bs and
single gcc runs; generated C byte-identical on the 4-block, AdamW, 2-thread 4-block,
`models.GPT` and 12-block GPT-2 steps):
- the thread team's library and entries live in the compiled-object cache: a second process
  running a cached 2-thread program took 1.5-1.9 s (gcc 0.75-0.93 s CPU on `team.c`) and now
  0.05-0.07 s;
- the routine's own unit also without RTL dead-store elimination (`-fno-dse`, same
  instructions): the 12-block GPT-2 step's unit 2.3-3.2 -> 1.7-2.1 s of gcc. Before, it was
  that step's critical path: 2.9 s against 1.5 + 1.4 s for the nest units, and three jobs
  sharing two cores leave it alone on one core at the end (about 3.6 s of wall, 2.9 s ideal);
- gcc's jobs on the 4-block step are even: units 0.28 (routine), 1.41 and 1.56 s, link
  0.02 s, 45 nest functions of at most 0.20 s each (no one function is a critical path; a
  finer split cannot beat 3.25 s / 2 cores). `-ftime-report` on a nest unit: induction-variable
  optimization 24%, complete unrolling 13%. `-fno-ivopts` cut gcc 10-20% but the 2-block d=128
  step ran 90 -> 108 ms (best of 15 x 5 calls, same process), so it stays on;
- `index_type` walks the code once (was twice: 0.021 -> 0.014 s for 4 blocks), `structure`
  reads an `Iterator`'s symbol directly (tracing's keys 0.025 -> 0.020 s). Tried in tracing's
  replay, not kept: traced arrays looked up once per statement and a statement's reads of a
  node it does not write folded per cell (302k -> 239k events) made the replay 0.08 s faster,
  but converting the recorded events cost 0.03-0.06 s: the pass was 0-4% faster in 44
  alternating runs, inside the noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise

HERE = os.path.dirname(os.path.abspath(__file__))

GPT_ROWS = {
    "GPT step, 2 blocks (d=64)": dict(blocks=2, d=64, heads=4, seq=64, batch=4, vocab=256),
    "GPT step, 4 blocks (d=64)": dict(blocks=4, d=64, heads=4, seq=64, batch=4, vocab=256),
    "GPT step, 4 blocks (d=64), AdamW": dict(blocks=4, d=64, heads=4, seq=64, batch=4, vocab=256, optimizer="adamw"),
}
"""GPT-like training steps built by hand (`gpt_step`) for the compile-time-per-depth rows; SGD
unless `optimizer` says AdamW (whose update is built inside the timed region, as
`bench_gpt.py`'s step rows time it)."""

GPT2_ROWS = {
    "GPT-2 small shape, 2 blocks": dict(blocks=2),
    "GPT-2 small shape, 4 blocks": dict(blocks=4),
    "GPT-2 small shape, 12 blocks": dict(blocks=12),
}
"""`einjit.models.GPT` training steps of GPT-2 small's shape (d=768, 12 heads, T=128, vocab
50257, token and position rows gathered by id, tied head), batch 1: compile time per block
from 2 to 12 blocks."""

STEPS = {
    "moons step (B=10)": "import bench_train; print(bench_train.einjit_step_time(10, 1, {cache!r})[1])",
    "convnet step, einsum (B=64)": "import bench_train; print(bench_train.convnet_step()[1])",
    "convnet step, nn layers (B=64)": "import bench_convnet; print(bench_convnet.einjit_step({cache!r})[1])",
}
_TIMES = "import os; t = os.times(); print(t.user + t.system, t.children_user + t.children_system)"


def chain_seconds(n: int) -> float:
    from einjit.ir import low_level as ll
    from einjit.ir import ops
    from einjit.ir.indexing import Iterator, get_symbol
    from einjit.ir.optimize import optimize_proc
    from einjit.ir.tnode import Tnode, hosted

    nodes = [Tnode(f"t{k}", (8,)) for k in range(n + 1)]
    for end in (nodes[0], nodes[-1]):
        end.update_memory_mode(hosted(), 0)
    stmts = []
    for src, dst in pairwise(nodes):
        i = get_symbol()
        relu = ll.Unop(ops.Unop.RELU, ll.Get(src, (Iterator(i),)))
        stmts.append(ll.ForLoop(i, 0, 7, ll.Set(dst, (Iterator(i),), relu)))
    code = ll.seq(*stmts)
    start = time.perf_counter()
    optimize_proc(code, name="chain")
    return time.perf_counter() - start


def gpt_step(blocks: int, d: int, heads: int, seq: int, batch: int, vocab: int):
    """The loss of a GPT-like model on one batch: token embedding (one-hot contraction, tied
    with the LM head), `blocks` pre-LayerNorm blocks of causal multi-head attention (heads
    as an einsum axis, the causal mask a constant) and a GELU MLP, cross-entropy on the next
    token. Built by hand from einsum and `einjit.nn` pieces: what a transformer layer
    library would produce, with shapes only this function knows."""
    import numpy as np

    import einjit as ej
    from einjit import train
    from einjit.nn import LayerNorm
    from einjit.nn.losses import cross_entropy

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (batch, seq))
    eye = np.eye(vocab, dtype=np.float32)
    x = ej.ndarray(eye[tokens], batch_axes=2, label="tokens")
    y = ej.ndarray(eye[np.roll(tokens, -1, axis=1)], batch_axes=2, label="targets")
    mask = ej.ndarray(np.triu(np.full((seq, seq), -1e9, np.float32), 1), label="causal")
    e = d // heads
    wte = ej.param("wte", input_dims=[vocab], output_dims=[d])
    h = ej.einsum("b, t | -> v; v -> d => b, t | -> d", x, wte, label="embed")
    for k in range(blocks):
        a = LayerNorm(d, label=f"ln1_{k}")(h)
        q, kk, v = (ej.einsum("b, t | -> d; d -> h, e => b, t | -> h, e", a,
                              ej.param(f"w{n}{k}", input_dims=[d], output_dims=[heads, e]), label=f"{n}{k}")
                    for n in "qkv")
        s = ej.einsum("b, t | -> h, e; b, s | -> h, e => b | -> h, t, s", q, kk, label=f"scores{k}")
        s = ej.einsum("b | -> h, t, s; t, s => b | -> h, t, s", s * (1.0 / np.sqrt(e)), mask, label=f"masked{k}")
        o = ej.einsum("b | -> h, t, s; b, s | -> h, e => b, t | -> h, e", ej.softmax(s, -1), v, label=f"att{k}")
        wo = ej.param(f"wo{k}", input_dims=[heads, e], output_dims=[d])
        h = h + ej.einsum("b, t | -> h, e; h, e -> d => b, t | -> d", o, wo, label=f"proj{k}")
        m = LayerNorm(d, label=f"ln2_{k}")(h)
        w1 = ej.param(f"fc{k}", input_dims=[d], output_dims=[4 * d])
        w2 = ej.param(f"out{k}", input_dims=[4 * d], output_dims=[d])
        h = h + w2 @ ej.gelu(w1 @ m)
    logits = ej.einsum("b, t | -> d; v -> d => b, t | -> v", LayerNorm(d, label="lnf")(h), wte, label="logits")
    loss = cross_entropy(logits, y)
    train.init_params(loss)
    return loss


def gpt_compile(blocks: int, d: int, heads: int, seq: int, batch: int, vocab: int, optimizer: str = "sgd"
                ) -> tuple[float, float, float, float]:
    """Wall seconds to build the GPT step's graph (with its parameters' initial values), wall
    seconds to compile it (`to_routine`: einjit's passes, gcc, linking; with AdamW, building
    its update too), and the Python and gcc CPU seconds of the compile."""
    from einjit import nn, train

    t0 = time.perf_counter()
    loss = gpt_step(blocks, d, heads, seq, batch, vocab)
    code = [train.grad_update(loss)] + ([train.sgd_update(loss, 0.01)] if optimizer == "sgd" else [])
    t1, c1 = time.perf_counter(), os.times()
    if optimizer == "adamw":
        code.append(nn.AdamW(loss.params(), 1e-3).update())
    train.to_routine(code, name=f"gpt{blocks}" + ("" if optimizer == "sgd" else optimizer))
    t2, c2 = time.perf_counter(), os.times()
    return t1 - t0, t2 - t1, c2.user + c2.system - c1.user - c1.system, \
        c2.children_user + c2.children_system - c1.children_user - c1.children_system


def gpt2_compile(blocks: int) -> tuple[float, float, float, float]:
    """`gpt_compile` for the `einjit.models.GPT` step of GPT-2 small's shape with `blocks`
    blocks (SGD update, batch 1)."""
    import einjit as ej
    from einjit import nn, train
    from einjit.models import GPT, GPTConfig

    t0 = time.perf_counter()
    model = GPT(GPTConfig(vocab_size=50257, block_size=128, n_layer=blocks, n_head=12, d_model=768),
                label=f"gpt2_{blocks}")
    x = ej.input("tokens", batch_dims=[1, 128], prec="int32")
    y = ej.input("targets", batch_dims=[1, 128], prec="int32")
    loss = nn.cross_entropy(model(x), y)
    train.init_params(loss, seed=0)
    code = [train.grad_update(loss), train.sgd_update(loss, 0.01)]
    t1, c1 = time.perf_counter(), os.times()
    train.to_routine(code, name=f"gpt2_{blocks}")
    t2, c2 = time.perf_counter(), os.times()
    return t1 - t0, t2 - t1, c2.user + c2.system - c1.user - c1.system, \
        c2.children_user + c2.children_system - c1.children_user - c1.children_system


def gpt_compile_seconds(cfg: dict, cache: str, function: str = "gpt_compile") -> tuple[float, float, float, float]:
    """`gpt_compile` (or another `function` of this module) in a fresh process on the cache
    directory `cache`."""
    env = {**os.environ, "EINJIT_CACHE_DIR": cache, "EINJIT_NUM_THREADS": "1"}
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import bench_compile; "
            f"print(*bench_compile.{function}(**{cfg!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    build, wall, python_s, gcc_s = map(float, out.stdout.split()[-4:])
    return build, wall, python_s, gcc_s


def cold_compile_seconds(snippet: str) -> tuple[float, float, float]:
    """Wall seconds of graph-to-routine, and the whole process's Python and gcc CPU seconds
    (Python's include the imports)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "EINJIT_CACHE_DIR": cache, "EINJIT_NUM_THREADS": "1"}
        code = f"import sys; sys.path.insert(0, {HERE!r}); " + snippet.format(cache=cache) + "; " + _TIMES
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    *_, wall, cpu = out.stdout.strip().splitlines()
    python_s, gcc_s = map(float, cpu.split())
    return float(wall), python_s, gcc_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per row (the median is printed)")
    ap.add_argument("--chains", type=int, nargs="*", default=[100, 400, 1600], help="chain lengths")
    ap.add_argument("--max-blocks", type=int, default=12, help="leave out GPT rows deeper than this")
    args = ap.parse_args()
    previous = None
    for n in args.chains:
        t = statistics.median(chain_seconds(n) for _ in range(args.repeats))
        growth = f"  ({t / previous[1]:.1f}x the time for {n / previous[0]:.0f}x the nodes)" if previous else ""
        print(f"optimizer, chain of {n:5d} virtual nodes  {t * 1e3:8.1f} ms{growth}")
        previous = (n, t)
    rows = [(label, cfg, "gpt_compile") for label, cfg in GPT_ROWS.items()]
    rows += [(label, cfg, "gpt2_compile") for label, cfg in GPT2_ROWS.items()]
    for label, cfg, function in rows:
        if cfg["blocks"] > args.max_blocks:
            continue
        with tempfile.TemporaryDirectory() as cache:
            for kind in ("cold", "warm"):
                build, wall, python_s, gcc_s = gpt_compile_seconds(cfg, cache, function)
                print(f"{kind} compile, {label:34s} {wall:7.2f} s; CPU: einjit {python_s:.2f} s, gcc {gcc_s:.2f} s; "
                      f"{wall / cfg['blocks']:.2f} s per block (graph built in {build:.2f} s before)", flush=True)
    for label, snippet in STEPS.items():
        runs = [cold_compile_seconds(snippet) for _ in range(args.repeats)]
        walls = [w for w, _, _ in runs]
        print(f"cold compile, {label:32s} {statistics.median(walls) * 1e3:8.1f} ms "
              f"(min {min(walls) * 1e3:.1f}, max {max(walls) * 1e3:.1f}); CPU: Python "
              f"{statistics.median(p for _, p, _ in runs):.2f} s, gcc {statistics.median(g for _, _, g in runs):.2f} s")


if __name__ == "__main__":
    main()
