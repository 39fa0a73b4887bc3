"""Bytes a training step keeps between calls, with routine-local storage on and off, and the
GPT step's bytes against PyTorch's with the scratch planner.

    python benchmarks/bench_memory.py [--json] [--rounds N]

For the moons MLP step (2→16→16→1, B=10), the MLP 784→256→256→10 step (B=256) and the
MNIST-size convnet step (B=64) of `bench_train.py`, each built twice in one process — with
`VirtualizeSettings(local_storage=False)` (every stored intermediate and gradient is a context
array, as before local storage) and with the default — it prints the step's kept bytes
(`routine.kept_bytes`), its routine-local bytes on the stack and in scratch arrays (allocated
once per context; their values are not needed between calls), and the time per step of
both, measured side by side (calls interleaved round by round; medians of the rounds). One
thread (`EINJIT_NUM_THREADS`, default 1).

The GPT row (`gpt_memory_row`: 2 blocks, d=128, 4 heads, T=64, B=16, V=96, AdamW, the step of
`bench_gpt.py`) counts what einjit's memory report says the step holds — context arrays
(parameters, gradients, AdamW moments, inputs), stack locals and the scratch arena, where
intermediates whose lifetimes do not meet share bytes (`backends/scratch_plan.py`) — against
PyTorch's parameters, gradients, AdamW state and the tensors autograd saves for backprop
(`bench_gpt.torch_step_bytes`), and what einjit would hold with one array per intermediate
(`EINJIT_SCRATCH_PLAN=0`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from threads_env import shared_cache


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    return ap.parse_args()


def median_times(fns, rounds: int = 15, min_time: float = 0.4) -> list[float]:
    """Median per-call time of each function over `rounds` rounds, the functions interleaved
    within each round, so a busy moment on a shared machine slows them alike."""
    pers = []
    for fn in fns:
        fn()
        t = time.perf_counter()
        fn()
        pers.append(max(1, int(min_time / rounds / max(time.perf_counter() - t, 1e-7))))
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for k, (fn, per) in enumerate(zip(fns, pers, strict=True)):
            t = time.perf_counter()
            for _ in range(per):
                fn()
            samples[k].append((time.perf_counter() - t) / per)
    return [statistics.median(s) for s in samples]


MOONS = "moons MLP 2→16→16→1 step, B=10"
MLP = "MLP 784→256→256→10 step, B=256"
CONVNET = "MNIST-size convnet step, B=64"


def steps(local_storage: bool, names: tuple[str, ...]):
    """The named steps built with local storage on or off: `{name: routine}`."""
    from bench_train import convnet_step, mlp_step
    from einjit.ir import optimize
    from einjit.ir.passes.tracing import VirtualizeSettings

    builders = {MOONS: lambda: mlp_step((2, 16, 16, 1), 10), MLP: lambda: mlp_step((784, 256, 256, 10), 256),
                CONVNET: lambda: convnet_step()[0]}
    saved = optimize.virtualize_settings
    optimize.virtualize_settings = VirtualizeSettings(local_storage=local_storage)
    try:
        return {name: builders[name]() for name in names}
    finally:
        optimize.virtualize_settings = saved


def memory_rows(rounds: int = 15, names: tuple[str, ...] = (MOONS, MLP, CONVNET)) -> list[dict]:
    before, after = steps(False, names), steps(True, names)
    rows = []
    for name, off in before.items():
        on = after[name]
        t_off, t_on = median_times([off, on], rounds)
        rows.append({"workload": name, "kept_bytes_before": off.kept_bytes, "kept_bytes_after": on.kept_bytes,
                     "stack_bytes_after": on.memory.local_bytes, "scratch_bytes_after": on.memory.scratch_bytes,
                     "step_s_before": t_off, "step_s_after": t_on, "speedup": t_off / t_on})
    return rows


def run_row() -> dict:
    """The row of `run.py`: the MLP 784→256→256→10 step with local storage, against itself
    without (`vs_local_off` > 1: local storage is faster), with both kept byte counts."""
    [r] = memory_rows(names=(MLP,))
    return {"workload": f"{r['workload']}, routine-local storage (kept {r['kept_bytes_after']} bytes, "
                        f"{r['kept_bytes_before']} without)",
            "einjit_s": r["step_s_after"], "local_off_s": r["step_s_before"], "vs_local_off": r["speedup"]}


def gpt_memory_row(n_layer: int = 2) -> dict:
    """The GPT step's bytes (einjit's memory report) against PyTorch's for the same step."""
    import bench_gpt

    model, step, (ids, xb, yb), _ = bench_gpt.einjit_train_step(n_layer)
    step(xb, yb)
    report = step.routine.memory
    held = report.kept_bytes + report.local_bytes
    ej_bytes = held + report.scratch_bytes
    torch_bytes = bench_gpt.torch_step_bytes(model, ids) if bench_gpt._torch() is not None else None
    return {"workload": f"GPT {n_layer} blocks d={bench_gpt.D} T={bench_gpt.T} B={bench_gpt.B} train step memory",
            "einjit_bytes": ej_bytes, "einjit_kept": report.kept_bytes, "einjit_stack": report.local_bytes,
            "einjit_arena": report.scratch_bytes, "einjit_scratch_arrays": report.scratch_parts_bytes,
            "einjit_unplanned_bytes": held + (report.scratch_parts_bytes or 0), "torch_bytes": torch_bytes,
            "einjit_over_torch": None if torch_bytes is None else ej_bytes / torch_bytes}


def describe_bytes(r: dict) -> str:
    """A memory row in words: einjit's bytes, its arena, and the ratio to PyTorch's."""
    from einjit.memory import human

    text = (f"einjit {human(r['einjit_bytes'])} (scratch arena {human(r['einjit_arena'])} for "
            f"{human(r['einjit_scratch_arrays'])} of arrays; {human(r['einjit_unplanned_bytes'])} without the planner)")
    if r["torch_bytes"] is None:
        return text + " | torch not installed"
    return text + f" | torch {human(r['torch_bytes'])} (einjit / torch {r['einjit_over_torch']:.2f}x)"


def main() -> None:
    args = _parse()
    os.environ.setdefault("EINJIT_NUM_THREADS", "1")
    shared_cache()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from einjit.memory import human

    rows = memory_rows(args.rounds)
    gpt = gpt_memory_row()
    if args.json:
        print(json.dumps([*rows, gpt], indent=1))
        return
    print(f"{'workload':<34} {'kept before':>12} {'kept after':>12} {'stack':>10} {'scratch':>10} "
          f"{'step before':>12} {'step after':>12} {'speed-up':>8}")
    for r in rows:
        print(f"{r['workload']:<34} {human(r['kept_bytes_before']):>12} {human(r['kept_bytes_after']):>12} "
              f"{human(r['stack_bytes_after']):>10} {human(r['scratch_bytes_after']):>10} "
              f"{_fmt(r['step_s_before']):>12} {_fmt(r['step_s_after']):>12} {r['speedup']:>7.2f}×")
    print(f"{gpt['workload']}: {describe_bytes(gpt)}")


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


if __name__ == "__main__":
    main()
