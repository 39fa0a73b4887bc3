"""AMX tile contractions (`ir/sched/amx_tiles.py`, `backends/amx_tiles.py`).

The tiled nest is checked in the interpreter bit for bit against the unscheduled nest (same
products, same order per cell), every edge case of the tiling: rows, columns and depth that
16 and 32 do not divide, an odd depth, one tile or several, one block or several, batch
loops, a result accumulated onto (loaded) or freshly zeroed. Its C, compiled on this machine
with `amx_emulation.h` (plain-C tile intrinsics following Intel's pseudo-code, per-thread
tile state), is bit-identical too: the pseudo-code adds a pair's products in the plain
loop's order, and products of bf16 numbers are exact in float. The emulation flushes
subnormal inputs to zero like the hardware, which tells its result from the plain loop's:
the tests use it to show the tile code, not the fallback, ran.

Where the CPU has AMX (`amx_bf16` among the flags, Sapphire Rapids and later), the same
contractions run the real instructions: their results are held to the float32 accumulation
bound (`depth * 2**-24` of the sum of the products' magnitudes, for any order of the additions)
against float64; elsewhere those tests skip.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess

import numpy as np
import pytest

from einjit.backends import c_syntax
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.backends.cc.toolchain import CcOptions
from einjit.ir import bf16, interpret, ops
from einjit.ir import low_level as ll
from einjit.ir.indexing import Iterator, get_symbol
from einjit.ir.optimize import VirtualizeSettings
from einjit.ir.sched.machine import MACHINES, kind_of_flags
from einjit.ir.sched.schedule import Blocking, schedule_llc
from einjit.ir.tnode import Tnode, hosted

ON = VirtualizeSettings()
RNG = np.random.default_rng(10)
EMULATION = os.path.join(os.path.dirname(__file__), "..", "backends", "amx_emulation.h")
AMX = Blocking(machine=MACHINES["amx"], min_work=1)


@functools.cache
def cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        return False
    return kind_of_flags(frozenset(flags)) == "amx"


needs_amx = pytest.mark.skipif(not cpu_has_amx(), reason="needs a CPU with AMX (amx_bf16, amx_tile)")
needs_no_amx = pytest.mark.skipif(cpu_has_amx(), reason="the emulation replaces real AMX instructions")


def it(*syms):
    return tuple(Iterator(s) for s in syms)


def contraction(n, m, p, transposed=False, batch=1, zeroed=True, b_prec=ops.bf16, out=ops.single):
    """`c[b, i, j] (+)= sum_k a[b, i, k] * b[b, k, j]` (`b[b, j, k]` when `transposed`),
    bf16 `a`, the batch axis dropped when `batch` is 1."""
    lead = (batch,) if batch > 1 else ()
    a, c = Tnode("a", (*lead, n, m), ops.bf16), Tnode("c", (*lead, n, p), out)
    b = Tnode("b", (*lead, p, m) if transposed else (*lead, m, p), b_prec)
    s, i, j, k = get_symbol("s"), get_symbol("i"), get_symbol("j"), get_symbol("k")
    pre = (s,) if batch > 1 else ()
    b_at = it(*pre, j, k) if transposed else it(*pre, k, j)
    fma = ll.Ternop(ops.Ternop.FMA, ll.Get(a, it(*pre, i, k)), ll.Get(b, b_at), ll.Get(c, it(*pre, i, j)))
    nest: ll.LLStmt = ll.ForLoop(i, 0, n - 1, ll.ForLoop(j, 0, p - 1, ll.ForLoop(k, 0, m - 1,
                                                                                ll.Set(c, it(*pre, i, j), fma))))
    if batch > 1:
        nest = ll.ForLoop(s, 0, batch - 1, nest)
    for tn in (a, b, c):
        tn.update_memory_mode(hosted(), 0)
    return (ll.seq(ll.ZeroOut(c), nest) if zeroed else nest), a, b, c


def operands(a, b, c):
    ins = {t: bf16.to_bits(RNG.standard_normal(t.dims).astype(np.float32)) for t in (a, b)}
    start = RNG.standard_normal(c.dims).astype(np.float32)
    ins[c] = bf16.to_bits(start) if c.prec is ops.bf16 else start
    return ins


def interpreted(code, ins):
    return interpret.run(code, {tn: v.copy() for tn, v in ins.items()})


def emulated(code, ins, name, *defines, threads=1):
    flags = (*CcOptions().flags, "-include", os.path.abspath(EMULATION), *(f"-D{d}" for d in defines))
    options = CcOptions(flags=flags, threads=threads)
    return run_once(code, ins, name=name, options=options, context=CcBackend(options).init(name))


def bound(ins, a, b, transposed, depth):
    av, bv = (bf16.from_bits(ins[t]).astype(np.float64) for t in (a, b))
    bt = np.swapaxes(bv, -1, -2) if transposed else bv
    return av @ bt, depth * 2.0**-24 * (np.abs(av) @ np.abs(bt))


CASES = [  # n, m, p, transposed, batch, zeroed: tails everywhere, odd depth, 1 x 1 and 2 x 2 tiles, 2 blocks
    (17, 35, 18, False, 1, True),
    (5, 3, 7, True, 1, False),
    (20, 6, 40, True, 1, False),
    (3, 40, 20, False, 2, True),
]


def test_flags_pick_amx():
    spr = frozenset("avx2 fma avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8".split())
    assert kind_of_flags(spr) == "amx"
    assert kind_of_flags(spr - {"amx_tile"}) == "avx512_bf16"
    assert MACHINES["amx"].amx_tiles and not MACHINES["amx"].bf16_dot
    assert not any(MACHINES[k].amx_tiles for k in MACHINES if k != "amx")


@pytest.mark.parametrize("n,m,p,transposed,batch,zeroed", CASES)
def test_tiles_in_the_interpreter_equal_the_plain_nest(n, m, p, transposed, batch, zeroed):
    code, a, b, c = contraction(n, m, p, transposed, batch, zeroed)
    sched = schedule_llc(code, ON, AMX)
    locals_ = {tn.label[0]: tn for tn in ll.nodes_of(sched) if tn.is_local()}
    assert locals_["apack"].prec is ops.bf16 and locals_["bpack"].prec is ops.bf16
    assert locals_["ctile"].prec is ops.single
    ins = operands(a, b, c)
    want = interpreted(code, ins)[c]
    np.testing.assert_array_equal(interpreted(sched, ins)[c], want)
    ref, err = bound(ins, a, b, transposed, m)
    start = 0 if zeroed else ins[c]
    assert np.all(np.abs(want - (ref + start)) <= err + (m + 1) * 2.0**-24 * np.abs(start))


def test_bf16_result_sums_in_float_and_rounds_once_like_float_panels():
    """A bf16 result accumulates in the float tiles and rounds once per cell, as the float
    panels' register blocks do: the two schedules give the same bits."""
    code, a, b, c = contraction(20, 70, 18, zeroed=False, out=ops.bf16)
    ins = operands(a, b, c)
    panels = schedule_llc(code, ON, Blocking(machine=MACHINES["avx512"], min_work=1))
    want = interpreted(panels, ins)[c]
    assert not np.array_equal(want, interpreted(code, ins)[c])  # the plain nest rounds at every step
    np.testing.assert_array_equal(interpreted(schedule_llc(code, ON, AMX), ins)[c], want)


def test_other_contractions_keep_float_panels():
    """A float operand takes the float panels of "avx512"; two bf16 ones take tiles."""
    def local_labels(code):
        return {tn.label[0] for tn in ll.nodes_of(schedule_llc(code, ON, AMX)) if tn.is_local()}

    assert {"apack", "bpack", "ctile"} <= local_labels(contraction(16, 32, 32)[0])
    labels = local_labels(contraction(16, 32, 32, b_prec=ops.single)[0])
    assert "pack" in labels and not {"apack", "bpack", "ctile"} & labels


@needs_no_amx
@pytest.mark.parametrize("n,m,p,transposed,batch,zeroed", CASES)
def test_emulated_tiles_in_c_equal_the_interpreter(n, m, p, transposed, batch, zeroed):
    code, a, b, c = contraction(n, m, p, transposed, batch, zeroed)
    sched = schedule_llc(code, ON, AMX)
    ins = operands(a, b, c)
    want = interpreted(code, ins)[c]
    np.testing.assert_array_equal(emulated(sched, ins, "amx_emu").array(c), want)


def _subnormal_case(n=20, m=40, p=24):
    """Operands where only tile code flushes: `a[0, 0]` a bf16 subnormal, `b[0, 0]` 2^120,
    their product 2^-13 (the rest of row 0 of `b` and column 0 of `a` zero), so `c[0, 0]`
    loses 2^-13 when the subnormal reads as zero."""
    code, a, b, c = contraction(n, m, p)
    ins = operands(a, b, c)
    av, bv = bf16.from_bits(ins[a]).copy(), bf16.from_bits(ins[b]).copy()
    av[:, 0], bv[0, :] = 0, 0
    av[0, 0], bv[0, 0] = np.float32(2.0**-133), np.float32(2.0**120)
    ins[a], ins[b] = bf16.to_bits(av), bf16.to_bits(bv)
    flushed = dict(ins)
    flushed[a] = ins[a].copy()
    flushed[a][0, 0] = 0
    return code, a, b, c, ins, flushed


@needs_no_amx
def test_emulation_shows_the_tile_code_ran_and_refusal_runs_the_fallback():
    """With the permission granted the C flushes the subnormal (tile code, equal to the
    interpreter on the flushed operands); refused, it runs the plain loop, equal to the
    interpreter on the operands as given (a tile instruction without a configuration would
    abort the emulation)."""
    code, a, b, c, ins, flushed = _subnormal_case()
    sched = schedule_llc(code, ON, AMX)
    plain, tiles = interpreted(code, ins)[c], interpreted(code, flushed)[c]
    assert plain[0, 0] - tiles[0, 0] == pytest.approx(2.0**-13, rel=1e-3)
    np.testing.assert_array_equal(emulated(sched, ins, "amx_ran").array(c), tiles)
    np.testing.assert_array_equal(emulated(sched, ins, "amx_refused", "EINJIT_AMX_EMULATE_REFUSAL").array(c), plain)


@needs_no_amx
def test_emulated_tiles_on_two_threads():
    """The row blocks on threads: each thread loads its own tile configuration (the
    emulation's tile state is per thread and aborts without one)."""
    code, a, b, c = contraction(70, 40, 40)
    sched = schedule_llc(code, ON, dataclasses.replace(AMX, parallel_min_work=1))
    assert any(isinstance(s, ll.ForLoop) and s.parallel for s in ll.iter_stmts(sched))
    ins = operands(a, b, c)
    want = run_once(code, ins, name="amx_plain", context=CcBackend().init("amx_plain")).array(c)
    np.testing.assert_array_equal(emulated(sched, ins, "amx_two", threads=2).array(c), want)


def test_c_source_has_the_tile_kernel_and_the_plain_fallback():
    code, *_ = contraction(40, 64, 40)
    source = c_syntax.render_program([("amx_mm", schedule_llc(code, ON, AMX))]).source
    # 2 x 2 tiles per block, in the 4 kinds of block: full, tail rows, tail columns, both
    assert source.count("_tile_dpbf16ps(") == 4 * 4
    assert "einjit_amx_start()" in source and "#if defined(__AMX_TILE__) && defined(__AMX_BF16__)" in source
    assert "_tile_loadd(0, &ctile[0], 128);" in source and "_tile_stored(3, &ctile[528], 128);" in source


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_compiles_to_tile_instructions_for_sapphire_rapids(tmp_path):
    code, *_ = contraction(40, 64, 40)
    src = tmp_path / "k.c"
    src.write_text(c_syntax.render_program([("amx_mm", schedule_llc(code, ON, AMX))]).source)
    asm = {}
    for march in ("sapphirerapids", "x86-64-v3"):
        done = subprocess.run(["gcc", "-O2", f"-march={march}", "-S", "-o", "-", str(src)], capture_output=True,
                              text=True)
        if done.returncode and "bad value" in done.stderr:
            pytest.skip(f"gcc does not know -march={march}")
        assert done.returncode == 0, done.stderr
        asm[march] = done.stdout
    spr = [ln.split() for ln in asm["sapphirerapids"].splitlines() if ln.strip()]
    mnemonics = {word[0] for word in spr}
    # 16 in the source (4 kinds of block); gcc may unroll the step loop
    assert sum(word[0] == "tdpbf16ps" for word in spr) >= 16
    assert {"ldtilecfg", "tileloadd", "tilestored"} <= mnemonics
    assert "tdpbf16ps" not in asm["x86-64-v3"] and "ldtilecfg" not in asm["x86-64-v3"]


# ---------------------------------------------------------------- on a CPU with AMX


@needs_amx
@pytest.mark.parametrize("n,m,p,transposed", [(17, 35, 18, False), (96, 200, 80, True), (256, 256, 256, False)])
@pytest.mark.parametrize("threads", [1, 2])
def test_hardware_tiles_within_the_float32_bound(n, m, p, transposed, threads):
    code, a, b, c = contraction(n, m, p, transposed)
    sched = schedule_llc(code, ON, dataclasses.replace(AMX, parallel_min_work=1 if threads > 1 else 1 << 22))
    ins = operands(a, b, c)
    options = CcOptions(threads=threads)
    got = run_once(sched, ins, name="amx_hw", options=options, context=CcBackend(options).init("amx_hw")).array(c)
    ref, err = bound(ins, a, b, transposed, m)
    assert np.all(np.abs(got - ref) <= err)


@needs_amx
def test_hardware_runs_the_tile_code():
    """`tdpbf16ps` flushes subnormal inputs: the tile code ran (the fallback would not)."""
    code, a, b, c, ins, flushed = _subnormal_case()
    sched = schedule_llc(code, ON, AMX)
    got = run_once(sched, ins, name="amx_hw_ran", context=CcBackend().init("amx_hw_ran")).array(c)
    ref, err = bound(flushed, a, b, False, 40)
    assert abs(got[0, 0] - ref[0, 0]) <= err[0, 0], "the plain loop ran: was the AMX permission refused?"
    assert np.all(np.abs(got - ref) <= err)


# ---------------------------------------------------------------- through the optimizer


def _mixed_mlp_params(steps):
    """The parameters of a mixed-precision MLP trained `steps` SGD steps."""
    import einjit as ej
    from einjit import fit, nn, train

    rng = np.random.default_rng(5)
    model = nn.Sequential(nn.Linear(40, 64, label="fc1"), nn.ReLU(), nn.Linear(64, 48, label="fc2"))
    x = ej.input("x", batch_dims=[40], output_dims=[40])
    y = ej.input("y", batch_dims=[40], output_dims=[48])
    loss = nn.mse(model(x), y)
    opt = nn.SGD(model.params(), 0.05)
    train.init_params(loss, seed=3)
    step = fit.train_step(loss, opt.update(), inputs=[x, y], mixed_precision="bf16")
    data = rng.standard_normal((40, 40)).astype(np.float32), rng.standard_normal((40, 48)).astype(np.float32)
    for _ in range(steps):
        opt.step()
        step(*data)
    return [p.numpy().copy() for p in model.params()]


def test_mixed_precision_training_with_tiles_equals_float_panels(monkeypatch, tmp_path):
    """Three mixed-precision steps optimized for "amx" (every stage after scheduling runs on
    the tiled nests; on this CPU the C runs the plain loops, or the tiles where it has AMX)
    end with the parameters of "avx512"'s float panels: bit for bit (the same products in the
    same order), or within bf16 training's noise where `tdpbf16ps` ran."""
    results = {}
    for kind in ("avx512", "amx"):
        monkeypatch.setenv("EINJIT_MACHINE", kind)
        monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path / kind))
        results[kind] = _mixed_mlp_params(3)
        sources = "".join(f.read_text(errors="replace") for f in (tmp_path / kind).rglob("*.json"))  # cached C
        # fc2 forward: bf16 activations x bf16 weights
        assert ("_tile_dpbf16ps" in sources) == (kind == "amx"), sorted((tmp_path / kind).rglob("*"))
    for got, want in zip(results["amx"], results["avx512"], strict=True):
        if cpu_has_amx():
            np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3)
        else:
            np.testing.assert_array_equal(got, want)
