"""The processor the scheduler prices code for: the cost model's register blocks must fit the
register file of the CPU the C backend compiles for (`-march=native`, the CPU at hand), or
gcc spills the accumulators and the block runs at a fraction of the speed.

Five descriptions (`MACHINES`): "avx512" (64-byte vectors, 32 registers: the development
machine, `cost_model.Machine()`), "avx512_bf16" (the same with AVX512_BF16's bf16 dot
product, `vdpbf16ps`: Cooper Lake, Zen 4), "amx" (AVX-512 with AMX tiles for bf16
contractions: Sapphire Rapids and later), "avx2" (32-byte vectors, 16 registers) and "generic"
(SSE and anything else: 16-byte vectors, 16 registers). `host_machine` reads the CPU's feature
flags from `/proc/cpuinfo` once per process; `EINJIT_MACHINE=avx512|avx512_bf16|amx|avx2|generic` names one
instead, to reproduce another machine's schedule (the golden tests pin "avx512" so that
their bytes do not depend on the CPU running them). The description, not the CPU model,
decides the schedule, so the same model gives byte-identical C on every machine of a kind.
"""

from __future__ import annotations

import functools
import os

from einjit.errors import EinjitError
from einjit.ir.sched.cost_model import Machine

__all__ = ["MACHINES", "host_machine", "kind_of_flags"]

MACHINES: dict[str, Machine] = {
    "avx512": Machine(),
    "avx512_bf16": Machine(bf16_dot=True),
    # AMX's tdpbf16ps for the bf16 contractions it takes (`amx_tiles`); the others keep float
    # panels, not vdpbf16ps's pairs, which run at half the float FMA rate there (below)
    "amx": Machine(amx_tiles=True),
    # a 4x16 float block (8 accumulators, 2 FMAs a cycle for 4 cycles of latency on paper) ran
    # at two thirds of a 6x16 block's speed at n=256 and a quarter at n=512 on znver3: the
    # FMA chain needs more than latency x throughput accumulators, so the model prices more
    # and its L2 is 512 KiB (Zen 2-3; Intel client cores have less): the weight gradients' chunks
    # are sized for it (`cost_model.k_chunk`)
    "avx2": Machine(vector_bytes=32, vector_registers=16, fma_latency=6, l2_bytes=512 << 10, row_pack=True),
    "generic": Machine(vector_bytes=16, vector_registers=16, row_pack=True),
}


def kind_of_flags(flags: frozenset[str]) -> str:
    """The description for a CPU with these `/proc/cpuinfo` flags. AVX2 without FMA (a few
    early VIA and Intel parts) still has 16 registers of 32 bytes. CPUs with AMX (Sapphire
    Rapids and later) run `vdpbf16ps` at half the rate of float FMAs (one core of an H200
    host's Xeon: 90-93 against 171-198 GFLOP/s; a bf16 `a @ b` at n=256 ran at 89 GFLOP/s with
    pair panels, 171 with float panels): they take AMX tiles ("amx") for bf16 contractions and
    the float panels of "avx512" for the rest."""
    if "avx512f" in flags:
        if "amx_bf16" in flags and "amx_tile" in flags:
            return "amx"
        return "avx512_bf16" if "avx512_bf16" in flags else "avx512"
    if "avx2" in flags:
        return "avx2"
    return "generic"


def host_machine() -> Machine:
    """The description `EINJIT_MACHINE` names, else the one of the CPU at hand."""
    value = os.environ.get("EINJIT_MACHINE", "").strip()
    if not value:
        return MACHINES[_host_kind()]
    if value not in MACHINES:
        raise EinjitError(f"einjit: EINJIT_MACHINE must be one of {', '.join(MACHINES)}, got {value!r}")
    return MACHINES[value]


@functools.cache
def _host_kind() -> str:
    """Read once: the flags do not change while the process runs. Without `/proc/cpuinfo`
    (not Linux) the generic description is the safe one: its blocks fit every register file."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        line = ""
    return kind_of_flags(frozenset(line.partition(":")[2].split()))
