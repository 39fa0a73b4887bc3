/* The part of libgomp's interface that gcc's `-fopenmp` lowering of einjit's generated C calls,
 * linked into each multithreaded program with hidden visibility: the program's calls bind
 * here (nothing else in the process sees these definitions, and no other OpenMP runtime the
 * process loaded can take them), and each passes its call on to the process's one thread team
 * (`team.c`), a shared library the program needs by its soname. */

#include "team.h"

#define ENTRY __attribute__((visibility("hidden")))

ENTRY void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
  (void)flags;
  einjit_team_parallel(fn, data, num_threads);
}

ENTRY void GOMP_parallel_loop_nonmonotonic_dynamic(void (*fn)(void *), void *data, unsigned num_threads, long start,
                                                   long end, long incr, long chunk, unsigned flags) {
  (void)flags;
  einjit_team_parallel_loop(fn, data, num_threads, start, end, incr, chunk);
}

ENTRY bool GOMP_loop_nonmonotonic_dynamic_start(long start, long end, long incr, long chunk, long *istart,
                                                long *iend) {
  return einjit_team_loop_start(start, end, incr, chunk, istart, iend);
}

ENTRY bool GOMP_loop_nonmonotonic_dynamic_next(long *istart, long *iend) { return einjit_team_loop_next(istart, iend); }

ENTRY void GOMP_loop_end_nowait(void) { einjit_team_loop_end(false); }

ENTRY void GOMP_loop_end(void) { einjit_team_loop_end(true); }

ENTRY bool GOMP_single_start(void) { return einjit_team_single_start(); }

ENTRY void GOMP_barrier(void) { einjit_team_barrier(); }

ENTRY void GOMP_critical_start(void) { einjit_team_critical(true); }

ENTRY void GOMP_critical_end(void) { einjit_team_critical(false); }

ENTRY int omp_get_thread_num(void) { return einjit_team_thread_num(); }

ENTRY int omp_get_num_threads(void) { return einjit_team_num_threads(); }
