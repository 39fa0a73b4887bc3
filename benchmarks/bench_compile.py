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
    args = ap.parse_args()
    previous = None
    for n in args.chains:
        t = statistics.median(chain_seconds(n) for _ in range(args.repeats))
        growth = f"  ({t / previous[1]:.1f}x the time for {n / previous[0]:.0f}x the nodes)" if previous else ""
        print(f"optimizer, chain of {n:5d} virtual nodes  {t * 1e3:8.1f} ms{growth}")
        previous = (n, t)
    for label, snippet in STEPS.items():
        runs = [cold_compile_seconds(snippet) for _ in range(args.repeats)]
        walls = [w for w, _, _ in runs]
        print(f"cold compile, {label:32s} {statistics.median(walls) * 1e3:8.1f} ms "
              f"(min {min(walls) * 1e3:.1f}, max {max(walls) * 1e3:.1f}); CPU: Python "
              f"{statistics.median(p for _, p, _ in runs):.2f} s, gcc {statistics.median(g for _, _, g in runs):.2f} s")


if __name__ == "__main__":
    main()
