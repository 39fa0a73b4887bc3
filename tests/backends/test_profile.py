"""The nest profiler (`backends/profile.py`): one row per top-level loop nest, positive times,
and the instrumented variant computes the same values as the routine."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from einjit import train
from einjit.backends import parallel_loops
from einjit.backends.cc import toolchain as cc
from einjit.backends.interface import lower_assignments
from einjit.backends.profile import NestInfo, ProfileReport, ThreadScaling, instrument, profiling_syntax, report
from einjit.ir import assignments as asg
from einjit.ir import interpret, optimize
from einjit.ir import low_level as ll
from einjit.ir.optimize import VirtualizeSettings
from test_openmp_threads import REGION, _functions, _pragmas, inputs_for, options, region_program, run_c
from test_outline import residual_model

HERE = Path(__file__).resolve().parent


def step_of(loss):
    return train.to_routine([train.grad_update(loss), train.sgd_update(loss, 0.1)], name="step")


def params(loss) -> dict[str, np.ndarray]:
    return {p.label_str: p.value_tn.host_array().copy() for p in train._params_of(loss)}


def test_profile_rows_match_the_nests_and_values_are_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path))
    plain_loss, profiled_loss = residual_model(1), residual_model(1)
    plain, profiled = step_of(plain_loss), step_of(profiled_loss)
    for _ in range(3):
        plain()
    report = profiled.profile(3)
    for name, value in params(plain_loss).items():
        np.testing.assert_array_equal(params(profiled_loss)[name], value, err_msg=name)

    loss = residual_model(1)
    _, lowered = lower_assignments((), asg.sequence(train.grad_update(loss), train.sgd_update(loss, 0.1)), "step")
    nests = [s for s in ll.flatten(lowered.llc) if isinstance(s, ll.ForLoop)]
    rows = report.rows()
    assert report.calls == 3 and len(rows) == len(nests) == len(report.nests)
    assert all(r["seconds"] > 0 for r in rows)
    assert abs(sum(r["share"] for r in rows) - 1.0) < 1e-9
    assert any("wq0.grad" in r["writes"] for r in rows)
    table = str(report)
    assert table.startswith(f"profile of step: {len(nests)} nests") and len(table.splitlines()) == len(nests) + 2
    assert profiled.profile(2).calls == 2


def test_flop_counts_of_a_contraction(monkeypatch):
    # one nest per node: fused, this small model's forward is one loop over its batch of 2
    monkeypatch.setattr(optimize, "virtualize_settings", VirtualizeSettings(fuse=False))
    loss = residual_model(1)
    _, lowered = lower_assignments((), train.grad_update(loss), "step")
    _, _, infos = instrument(lowered.llc, "step")
    # q0 = a @ wq0 over batch 2 x seq 4, 8 -> 2 x 4 features: 2*4*8*8 multiply-adds.
    q = [i for i in infos if i.writes == ("q0",)]
    assert q and max(i.flops for i in q) == 2 * (2 * 4 * 8 * 8)


def test_einjit_profile_env_prints_the_table_at_exit(tmp_path):
    script = ("import sys; sys.path.insert(0, %r)\n"
              "from test_profile import step_of\nfrom test_outline import residual_model\n"
              "r = step_of(residual_model(1)); r(); r()\n" % str(HERE))
    env = {"EINJIT_PROFILE": "1", "EINJIT_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(HERE.parents[1] / "src"),
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "profile of step:" in done.stderr and "over 2 calls" in done.stderr


def test_timers_in_a_shared_region_read_the_clock_after_a_barrier():
    """At 2 threads the instrumented variant keeps the routine's shared region (its clock reads
    do not end it, so it pays the fork-joins the routine pays), and each clock read in it is
    the master thread's after a barrier: a nest run as `omp for nowait` is charged until every
    thread is done with it, not until the master is done with its share. The values and the
    counters are right at 1 and 2 threads."""
    code, ins_nodes, outs = region_program()
    timed, prof, infos = instrument(code, "timed")
    assert [i.writes for i in infos] == [("a",), ("b",), ("c",)]
    top = list(ll.flatten(parallel_loops.thread_nests(timed, 2, 1)))
    [region] = parallel_loops.shared_regions(top)
    assert [(u.role, u.nowait) for u in region.units] == [
        ("for", True), ("timer", True), ("timer", True), ("for", True), ("timer", True), ("single", True),
        ("timer", True), ("for", True)]
    ins = inputs_for(*ins_nodes)
    want = interpret.run(code, {tn: v.copy() for tn, v in ins.items()})
    for threads in (1, 2):
        opts = options(threads)
        opts = replace(opts, syntax=profiling_syntax(opts.syntax))
        ctx = run_c(timed, ins, opts, f"timed{threads}")
        for out in outs:
            np.testing.assert_array_equal(ctx.array(out), want[out], err_msg=f"{out.name} at {threads} threads")
        counters = report("timed", ctx.array(prof), infos)
        assert counters.calls == 1 and all(s > 0 for s in counters.seconds)
        assert counters.routine_seconds >= sum(counters.seconds) and counters.outside() >= 0
    opts = options(2)
    body = _functions(cc.compile_proc(timed, name="timed", options=replace(
        opts, syntax=profiling_syntax(opts.syntax))).source, "timed")["timed"]
    assert _pragmas(body) == [REGION] + ["#pragma omp barrier", "#pragma omp master"] * 3 + [
        "#pragma omp single nowait", "#pragma omp barrier", "#pragma omp master"]
    lines = [line.strip() for line in body.splitlines()]
    start, after = lines.index(REGION), next(k for k, line in enumerate(lines) if "timed_profile[2]" in line)
    assert lines[after - 1] == "}"  # the last nest's time is read after the region's end
    inside = [k for k in range(start, after) if parallel_loops.NEST_TIMER in lines[k]]
    assert len(inside) == 4 and all(lines[k - 2:k] == ["#pragma omp barrier", "#pragma omp master"] for k in inside)


def test_thread_scaling_table_compares_nest_by_nest():
    nests = (NestInfo(0, ("a",), 0, 0), NestInfo(1, ("b", "c"), 0, 0))
    one = ProfileReport("step", nests, (4e-3, 1e-3), 2, 7e-3)  # seconds over 2 calls
    many = ProfileReport("step", nests, (2.5e-3, 1e-3), 2, 4.5e-3)
    scaling = ThreadScaling(one, many, 2)
    rows = scaling.rows()
    assert [r["speedup"] for r in rows] == [1.6, 1.0]
    assert one.outside() == pytest.approx(1e-3) and many.outside() == pytest.approx(0.5e-3)
    table = str(scaling).splitlines()
    assert table[0] == "step: 3.500 ms at 1 thread, 2.250 ms at 2 (1.56x)"
    assert table[2].split() == ["0", "a", "2.0000", "1.2500", "1.60x"]
    assert table[3].split() == ["1", "b,", "c", "0.5000", "0.5000", "1.00x"]
    assert table[4].split() == ["(outside", "nests)", "1.0000", "0.5000"]
    split = (nests[0], NestInfo(1, ("d",), 0, 0), NestInfo(2, ("b", "c"), 0, 0))  # nest "d" split off at 2
    paired = ThreadScaling(one, ProfileReport("step", split, (2e-3, 1e-3, 1e-3), 2, 4e-3), 2).rows()
    assert [(r["nest"], r["one"], r["many"], r["speedup"]) for r in paired] == [
        (0, 2e-3, 1e-3, 2.0), ("+1", 0.0, 0.5e-3, None), (1, 0.5e-3, 0.5e-3, 1.0)]
