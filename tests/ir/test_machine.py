"""The machine descriptions the scheduler prices code for (`ir/sched/machine.py`): detection
from CPU flags, the `EINJIT_MACHINE` override, and register blocks that fit each register file."""

from __future__ import annotations

import pytest

from einjit.errors import EinjitError
from einjit.ir import low_level as ll
from einjit.ir.optimize import VirtualizeSettings
from einjit.ir.sched import cost_model
from einjit.ir.sched.cost_model import Shape, Tile
from einjit.ir.sched.machine import MACHINES, host_machine, kind_of_flags
from einjit.ir.sched.schedule import Blocking, schedule_llc
from test_schedule import matmul

EPYC_FLAGS = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2".split())


def test_flags_pick_the_widest_description():
    assert kind_of_flags(EPYC_FLAGS) == "avx2"
    assert kind_of_flags(EPYC_FLAGS | {"avx512f", "avx512bw"}) == "avx512"
    assert kind_of_flags(EPYC_FLAGS | {"avx512f", "avx512bw", "avx512_bf16"}) == "avx512_bf16"
    # Sapphire Rapids: AMX tiles for bf16 contractions, float panels (not vdpbf16ps, at half the
    # float FMA rate there) for the rest
    assert kind_of_flags(EPYC_FLAGS | {"avx512f", "avx512bw", "avx512_bf16", "amx_bf16", "amx_tile"}) == "amx"
    assert MACHINES["avx512_bf16"].bf16_dot and not MACHINES["avx512"].bf16_dot
    assert kind_of_flags(frozenset({"fpu", "sse", "sse2"})) == "generic"
    assert kind_of_flags(frozenset()) == "generic"
    assert (MACHINES["avx2"].vector_bytes, MACHINES["avx2"].vector_registers) == (32, 16)
    assert (MACHINES["avx512"].vector_bytes, MACHINES["avx512"].vector_registers) == (64, 32)
    assert (MACHINES["generic"].vector_bytes, MACHINES["generic"].vector_registers) == (16, 16)


def test_einjit_machine_overrides_the_detected_cpu(monkeypatch):
    for kind, machine in MACHINES.items():
        monkeypatch.setenv("EINJIT_MACHINE", kind)
        assert host_machine() is machine
    monkeypatch.setenv("EINJIT_MACHINE", "avx3")
    with pytest.raises(EinjitError, match="EINJIT_MACHINE.*avx3"):
        host_machine()
    monkeypatch.delenv("EINJIT_MACHINE")
    assert host_machine() in MACHINES.values()


@pytest.mark.parametrize("kind,itemsize,want", [
    ("avx512", 4, Tile(8, 32, 512)), ("avx512", 8, Tile(8, 16, 512)),
    ("avx2", 4, Tile(6, 16, 512)), ("avx2", 8, Tile(6, 8, 512)),
    ("generic", 4, Tile(6, 8, 512)), ("generic", 8, Tile(6, 4, 512))])
def test_cost_model_blocks_fit_the_register_file(kind, itemsize, want):
    """Accumulators, the panel row's vectors and a broadcast fit the registers: 8x32 floats
    would need 32 AVX2 accumulators alone."""
    machine, blocking = MACHINES[kind], Blocking()
    shape = Shape(480, 512, 512, 512, itemsize)  # 6 and 8 divide 480
    assert cost_model.choose(shape, blocking.nb_choices, blocking.mb_max, machine) == want
    lanes = machine.vector_bytes // itemsize
    for t in cost_model.candidates(shape, blocking.nb_choices, 16, machine):
        vectors = -(-t.nb // lanes)
        assert t.mb * vectors + vectors + 1 <= machine.vector_registers
    assert not cost_model.fits(8, 32, 4, MACHINES["avx2"])


def test_default_schedule_follows_the_machine(monkeypatch):
    """`schedule_llc` without a blocking schedules for `EINJIT_MACHINE` (else the CPU)."""
    code, _, _, _ = matmul(48, 64, 64, False)
    settings = VirtualizeSettings()
    docs = {}
    for kind in MACHINES:
        monkeypatch.setenv("EINJIT_MACHINE", kind)
        docs[kind] = ll.to_doc(schedule_llc(code, settings))
    assert "register-blocked 8x32 contraction" in docs["avx512"]
    assert "register-blocked 6x16 contraction" in docs["avx2"]
    assert "register-blocked 6x8 contraction" in docs["generic"]
