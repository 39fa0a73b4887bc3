"""Where the second thread's time goes: the GPT training step (`bench_gpt`'s shape, 2 blocks)
or the convnet step (`bench_convnet`, einjit.nn) profiled nest by nest at 1 and at N threads
(`Routine.profile`), as one table of per-nest times and speed-ups
(`backends.profile.ThreadScaling`), slowest at N threads first.

    python benchmarks/profile_threads.py [--model gpt|convnet] [--threads N] [--layers L] [--runs R]

The instrumented variants time each nest between barriers of the threads, so their totals are
a little above the plain step's; compare shares and speed-ups, then confirm with
`bench_gpt.py --only step` at 1 and N threads. The CPU time of the N-thread runs is printed
beside their wall time: on a machine other processes keep busy, a thread waiting for a core
shows as wall time without CPU time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from threads_env import set_threads, shared_cache  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("gpt", "convnet"), default="gpt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    set_threads(args.threads, also=("EINJIT_NUM_THREADS",))
    shared_cache()
    from bench_parallel import convnet_pair, gpt_pair
    from einjit.backends.profile import ThreadScaling

    one, many = gpt_pair(args.threads, args.layers) if args.model == "gpt" else convnet_pair(args.threads)
    reports = []
    for routine in (one, many):
        routine.profile(2)
        wall, cpu = time.perf_counter(), time.process_time()
        reports.append(routine.profile(args.runs))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{routine.name}: {1e3 * wall / args.runs:.2f} ms wall, {1e3 * cpu / args.runs:.2f} ms CPU per call")
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(ThreadScaling(reports[0], reports[1], args.threads))


if __name__ == "__main__":
    main()
