"""einjit's thread team (`backends/cc/team.c`, linked by `thread_team`): the OpenMP constructs
gcc lowers einjit's pragmas to run on it as on libgomp; programs compiled for 2 threads bind
their OpenMP calls to their own copy (libgomp's on request) and compute what 1 thread computes,
bit for bit, over many calls in a row, from two Python threads at once and in a forked child."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from einjit.backends.cc import openmp_env, thread_team
from einjit.backends.cc import toolchain as cc
from einjit.backends.cc.backend import CcBackend, run_once
from einjit.backends.interface import load_inputs
from test_openmp_threads import inputs_for, options, region_program

SRC = Path(__file__).resolve().parents[2] / "src"

_CONSTRUCTS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#define N 1000
static long a[N], b[N], c[20][N], singles, total, orphaned[N];
static int nested, ids;

/* Orphaned constructs, as einjit's outlined nests have them: called inside a region and from
   serial code. */
static void orphan(long add) {
  #pragma omp for schedule(dynamic, 5)
  for (int i = 0; i < N; ++i) orphaned[i] += add;
  #pragma omp single
  orphaned[0] += 1;
  #pragma omp barrier
}

int main(int argc, char **argv) {
  int rounds = atoi(argv[1]);
  for (int r = 0; r < rounds; ++r) {
    singles = total = 0;
    ids = 0;
    #pragma omp parallel num_threads(2)
    {
      #pragma omp for schedule(dynamic, 3) nowait
      for (int i = 0; i < N; ++i) a[i] = i + r;
      #pragma omp for schedule(dynamic) nowait
      for (int i = 0; i < N; ++i) b[i] = 2 * i;
      #pragma omp barrier
      for (int s = 0; s < 20; ++s) {  /* more constructs in flight than the team has slots */
        #pragma omp single nowait
        singles += 1;
        #pragma omp for schedule(dynamic, 7) nowait
        for (int i = N - 1; i >= 0; --i) c[s][i] = a[i] + b[i] + s;
      }
      #pragma omp barrier
      #pragma omp single
      singles += 100;
      #pragma omp for schedule(dynamic)
      for (int i = 0; i < 10; ++i) {
        #pragma omp critical
        total += c[19][i * 100];
      }
      #pragma omp critical
      ids += 1 + 10 * omp_get_thread_num() + 100 * omp_get_num_threads();
      #pragma omp master
      {
        #pragma omp parallel num_threads(2)
        nested = omp_get_num_threads();
      }
      orphan(2);
    }
    orphan(3);
    #pragma omp parallel for schedule(dynamic, 2) num_threads(2)
    for (int i = 9; i >= 5; --i) a[i] = -i;
    long want = 0;
    for (int i = 0; i < 10; ++i) want += 3 * (i * 100) + r + 19;
    for (int s = 0; s < 20; ++s)
      for (int i = 0; i < N; ++i)
        if (c[s][i] != 3 * i + r + s || (i >= 5 && i < 10 && a[i] != -i)) {
          printf("round %d: c[%d][%d] = %ld\n", r, s, i, c[s][i]);
          return 1;
        }
    for (int i = 0; i < N; ++i)
      if (orphaned[i] != 5L * (r + 1) + (i ? 0 : 2L * (r + 1))) {
        printf("round %d: orphaned[%d] = %ld\n", r, i, orphaned[i]);
        return 1;
      }
    if (singles != 120 || total != want || nested != 1 || ids != 412) {
      printf("round %d: singles %ld, total %ld (want %ld), nested team %d, ids %d\n", r, singles, total, want, nested,
             ids);
      return 1;
    }
  }
  puts("ok");
  return 0;
}
"""


def _gcc() -> str:
    compiler = cc.CcOptions().compiler
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler {compiler!r}")
    return compiler


def _undefined(path: Path) -> str:
    if shutil.which("nm") is None:
        pytest.skip("no nm to list the object's symbols")
    return subprocess.run(["nm", "-u", "-D", str(path)], capture_output=True, text=True, check=True).stdout


def test_the_openmp_constructs_einjit_uses_run_on_the_team(tmp_path):
    """Dynamic loops (chunked, counting down, nowait), singles, barriers, critical sections,
    thread numbers, a combined `parallel for`, a region nested in one (run by its thread
    alone), orphaned constructs in a region and outside, 200 regions in a row."""
    compiler = _gcc()
    source = tmp_path / "constructs.c"
    source.write_text(_CONSTRUCTS)
    exe = tmp_path / "constructs"
    entries, library = thread_team.link_inputs(compiler)
    shutil.copy(library, tmp_path / thread_team.soname())  # where the executable's loader finds it by name
    subprocess.run([compiler, "-O2", "-fopenmp", "-o", str(exe), str(source), entries, library,
                    f"-Wl,-rpath,{tmp_path}"], check=True, capture_output=True)
    done = subprocess.run([str(exe), "200"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "ok\n")
    undefined = _undefined(exe)
    assert "GOMP_" not in undefined and "einjit_team_parallel" in undefined


@pytest.mark.parametrize("team", ["einjit", "gomp"])
def test_programs_bind_their_openmp_calls_to_the_team_or_libgomp(monkeypatch, team):
    monkeypatch.setenv("EINJIT_THREAD_TEAM", team)
    code, ins_nodes, outs = region_program()
    ins = inputs_for(*ins_nodes)
    want = run_once(code, ins, options=options(1), name="team_bind")
    proc = cc.compile_proc(code, name="team_bind", options=options(2))
    assert "#pragma omp parallel num_threads(2)" in proc.source
    assert ("GOMP_parallel" in _undefined(proc.so_path)) == (team == "gomp")
    got = run_once(code, ins, options=options(2), name="team_bind")
    for out in outs:
        np.testing.assert_array_equal(got.array(out), want.array(out), err_msg=out.name)


_GUIDED = r"""
#include <omp.h>
void fill(int *ids, int n) {
  #pragma omp parallel for schedule(guided) num_threads(2)
  for (int i = 0; i < n; ++i) ids[i] = omp_get_thread_num() + 1;
}
"""


def test_a_construct_the_team_lacks_links_the_program_on_libgomp(monkeypatch):
    """`schedule(guided)` lowers to a libgomp entry `team.c` does not define: linked with the
    team, the program would run libgomp's loop inside the team's region. It is linked on
    libgomp alone instead (its thread numbers come from libgomp too), and runs."""
    _gcc()
    monkeypatch.delenv("EINJIT_THREAD_TEAM", raising=False)
    for var in openmp_env.USER_SETTINGS:
        monkeypatch.delenv(var, raising=False)
    built = cc.compile_source(_GUIDED, label="team_lacks_guided", options=options(2))
    undefined = _undefined(built.path)
    assert "GOMP_loop_nonmonotonic_guided_next" in undefined and "GOMP_loop_end_nowait" in undefined
    assert "omp_get_thread_num" in undefined
    fill = cc.load_library(built).fill
    ids = np.zeros(1000, dtype=np.int32)
    fill(ids.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(ids.size))
    assert set(np.unique(ids)) <= {1, 2} and ids.all()


def test_unbound_calls_lists_the_runtime_entries_left_to_the_loader(tmp_path):
    """Only OpenMP runtime entries count; a program without `nm` to list them counts as unbound."""
    compiler = _gcc()
    source = tmp_path / "calls.c"
    source.write_text("#include <math.h>\n#include <omp.h>\n"
                      "double f(double x) { return sin(x) + omp_get_num_threads() + omp_get_thread_num(); }\n")
    so = tmp_path / "calls.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-fopenmp", "-o", str(so), str(source), "-lm"], check=True)
    if shutil.which("nm") is None:
        assert thread_team.unbound_calls(so) == ("(nm not found)",)
    else:
        assert thread_team.unbound_calls(so) == ("omp_get_num_threads", "omp_get_thread_num")


def test_a_wrong_team_setting_is_an_einjit_error(monkeypatch):
    monkeypatch.setenv("EINJIT_THREAD_TEAM", "tbb")
    with pytest.raises(thread_team.ThreadTeamError, match="EINJIT_THREAD_TEAM must be 'einjit' or 'gomp', got 'tbb'"):
        cc.compile_proc(region_program()[0], name="team_wrong", options=options(2))


def test_a_user_wait_policy_links_libgomp(monkeypatch):
    monkeypatch.delenv("EINJIT_THREAD_TEAM", raising=False)
    assert thread_team.enabled()
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert not thread_team.enabled()


def test_many_calls_from_two_python_threads_compute_what_one_thread_does():
    """Two contexts linked to one 2-thread program, each called 150 times from its own Python
    thread with new inputs each time (so both threads start regions at once: one runs on a
    second team, or alone)."""
    code, ins_nodes, outs = region_program()
    rounds = [inputs_for(*ins_nodes, seed=s) for s in range(6)]
    wants = [run_once(code, ins, options=options(1), name="team_calls_1") for ins in rounds]
    backend = CcBackend(options(2))
    compiled = backend.compile((), code, shared=True, name="team_calls")
    errors: list[str] = []

    def calls(label: str) -> None:
        ctx = backend.init(label)
        for tn, value in rounds[0].items():
            ctx.array(tn)[...] = value
        load_inputs(ctx, compiled.inputs)
        routine = backend.link(ctx, compiled)
        for k in range(150):
            ins, want = rounds[k % len(rounds)], wants[k % len(rounds)]
            for tn, value in ins.items():
                ctx.array(tn)[...] = value
            for out in outs:
                ctx.array(out)[...] = np.nan
            routine()
            errors.extend(f"{label} call {k}: {out.name}" for out in outs
                          if not np.array_equal(ctx.array(out), want.array(out)))

    threads = [threading.Thread(target=calls, args=(f"team_calls_{t}",)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def _threads_of_process() -> int:
    return len(os.listdir("/proc/self/task"))


def test_the_programs_of_a_process_share_one_team(monkeypatch):
    """Five distinct 2-thread programs called in turn, 30 rounds, compute what 1 thread does
    and add one worker to the process at most (the first team's, if no test before made it);
    each program used to start its own, kept for the process's life."""
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc/self/task to count the process's threads")
    monkeypatch.delenv("EINJIT_THREAD_TEAM", raising=False)
    for var in openmp_env.USER_SETTINGS:
        monkeypatch.delenv(var, raising=False)
    code, ins_nodes, outs = region_program()
    rounds = [inputs_for(*ins_nodes, seed=s) for s in range(3)]
    wants = [run_once(code, ins, options=options(1), name="team_shared_1") for ins in rounds]
    before = _threads_of_process()
    backend = CcBackend(options(2))
    programs, objects = [], set()
    for k in range(5):
        ctx = backend.init(f"team_shared_{k}")
        compiled = backend.compile((), code, shared=True, name=f"team_shared_{k}")
        objects.add(compiled.procedure.procedure.so_path)
        load_inputs(ctx, compiled.inputs)
        programs.append((ctx, backend.link(ctx, compiled)))
    assert len(objects) == 5
    for k in range(30):
        ctx, routine = programs[k % 5]
        for tn, value in rounds[k % 3].items():
            ctx.array(tn)[...] = value
        routine()
        for out in outs:
            np.testing.assert_array_equal(ctx.array(out), wants[k % 3].array(out), err_msg=f"call {k}: {out.name}")
    assert _threads_of_process() - before <= 1


_FORK = textwrap.dedent("""
    import os, sys, warnings
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_openmp_threads import inputs_for, options, region_program
    from einjit.backends.cc.backend import run_once
    warnings.simplefilter("ignore", DeprecationWarning)  # fork beside the team's sleeping worker
    code, ins_nodes, outs = region_program()
    ins = inputs_for(*ins_nodes)
    want = run_once(code, ins, options=options(1), name="team_fork")
    def same():
        got = run_once(code, ins, options=options(2), name="team_fork")
        return all(np.array_equal(got.array(o), want.array(o)) for o in outs)
    assert same()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if same() and same() else 1)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), "parent", same())
""")


def test_a_forked_child_starts_its_own_team(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(SRC), EINJIT_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", _FORK, str(Path(__file__).parent)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "child 0 parent True", done.stderr


_CACHED = textwrap.dedent("""
    import hashlib, sys
    sys.path.insert(0, sys.argv[1])
    from test_openmp_threads import inputs_for, options, region_program
    from einjit.backends.cc import thread_team
    from einjit.backends.cc import toolchain as cc
    from einjit.backends.cc.backend import run_once
    code, ins_nodes, outs = region_program()
    got = run_once(code, inputs_for(*ins_nodes), options=options(2), name="team_cached")
    digest = hashlib.sha256(b"".join(got.array(o).tobytes() for o in outs)).hexdigest()
    print(thread_team.stats.compiler_invocations, thread_team.stats.cache_hits, cc.stats.compiler_invocations, digest)
""")


def test_a_second_process_takes_the_team_from_the_cache(tmp_path):
    """The first process compiles the team's entries and library into the compiled-object cache
    beside its program; a second process on that cache runs no compiler at all (it loads the
    cached library; nothing links, so the entries are not asked for), and its 2-thread
    program computes the bits the first one did."""
    _gcc()
    env = dict(os.environ, PYTHONPATH=str(SRC), EINJIT_CACHE_DIR=str(tmp_path / "cache"))
    for var in ("EINJIT_THREAD_TEAM", *openmp_env.USER_SETTINGS):
        env.pop(var, None)
    runs = [subprocess.run([sys.executable, "-c", _CACHED, str(Path(__file__).parent)], env=env, capture_output=True,
                           text=True, timeout=120) for _ in range(2)]
    (first, second) = (r.stdout.split() for r in runs)
    assert first[:3] == ["2", "0", "1"] and second[:3] == ["0", "1", "0"], runs[0].stderr + runs[1].stderr
    assert first[3] == second[3]
